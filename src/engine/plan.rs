//! What one step of a continuous-batching engine runs, decided on the host (as vLLM v1's
//! scheduler does): a token budget per step, running sequences first (a decode costs one
//! token, an unfinished prompt a chunk of what the budget leaves), then waiting sequences in
//! arrival order while the budget, the running limit and the free KV blocks allow. A long
//! prompt therefore never holds the other sequences' tokens back by more than one chunk.
//!
//! When the KV pool runs out, the most recently admitted running sequence is preempted: its
//! blocks go back to the pool and it returns to the front of the queue, to be recomputed (its
//! prompt and the tokens it has generated) when there is room; the client sees only a delay. A
//! sequence that cannot get a block even alone is reported starved (its context no longer fits
//! the pool) for the caller to finish.

use std::collections::VecDeque;

use crate::backend::blocks::{BlockPool, BlockStats, BlockTable};

/// A sequence's id, the caller's.
pub type SeqId = u64;

/// One sequence's share of a step: its tokens `start .. start + n` run, and the step's last
/// row of them yields logits when they reach the sequence's end (a decode, or a prompt's last
/// chunk).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub id: SeqId,
    pub start: usize,
    pub n: usize,
    pub logits: bool,
}

/// The decisions of one step.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Planned {
    /// What runs, running sequences first.
    pub runs: Vec<Run>,
    /// Sequences whose blocks were taken back (they wait to be recomputed).
    pub preempted: Vec<SeqId>,
    /// Sequences that cannot continue even alone in the pool (the caller finishes them).
    pub starved: Vec<SeqId>,
}

/// Why a sequence is refused outright.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("a prompt of {tokens} tokens needs {need} KV blocks, the pool has {total}")]
    TooLong {
        tokens: usize,
        need: usize,
        total: usize,
    },
    #[error("sequence {0} is already known")]
    Duplicate(SeqId),
    #[error("sequence {0} is not known")]
    Unknown(SeqId),
}

#[derive(Debug)]
struct Seq {
    id: SeqId,
    /// Tokens of the sequence so far (prompt and generated).
    tokens: usize,
    /// Tokens whose K/V rows are written (the first `computed` of `tokens`).
    computed: usize,
    table: BlockTable,
}

impl Seq {
    fn pending(&self) -> usize {
        self.tokens - self.computed
    }
}

/// Running and waiting sequences, their KV blocks and the step budget.
#[derive(Debug)]
pub struct Planner {
    pool: BlockPool,
    budget: usize,
    max_running: usize,
    /// In admission order.
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
}

impl Planner {
    /// `budget`: tokens per step (at least 1); `max_running`: sequences per step (at least 1).
    pub fn new(pool: BlockPool, budget: usize, max_running: usize) -> Planner {
        Planner {
            pool,
            budget: budget.max(1),
            max_running: max_running.max(1),
            running: Vec::new(),
            waiting: VecDeque::new(),
        }
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn blocks(&self) -> BlockStats {
        self.pool.stats()
    }
    /// The block table of a running sequence (the rows of a step's block table).
    pub fn table(&self, id: SeqId) -> Option<&BlockTable> {
        self.running.iter().find(|s| s.id == id).map(|s| &s.table)
    }

    fn find(&self, id: SeqId) -> bool {
        self.running.iter().any(|s| s.id == id) || self.waiting.iter().any(|s| s.id == id)
    }

    /// Queue a sequence of `prompt` tokens (at least one).
    pub fn add(&mut self, id: SeqId, prompt: usize) -> Result<(), PlanError> {
        self.add_cached(id, prompt, 0)
    }

    /// Queue a sequence of `prompt` tokens whose first `cached` already have K/V rows (a reused
    /// prefix, below `prompt`): only the rest runs. Its blocks are reserved from position 0 on
    /// admission; if it is preempted, it is recomputed from the start.
    pub fn add_cached(&mut self, id: SeqId, prompt: usize, cached: usize) -> Result<(), PlanError> {
        if self.find(id) {
            return Err(PlanError::Duplicate(id));
        }
        let need = self.pool.blocks_for(prompt.max(1));
        if need > self.pool.total() {
            return Err(PlanError::TooLong {
                tokens: prompt,
                need,
                total: self.pool.total(),
            });
        }
        self.waiting.push_back(Seq {
            id,
            tokens: prompt.max(1),
            computed: cached.min(prompt.saturating_sub(1)),
            table: BlockTable::default(),
        });
        Ok(())
    }

    /// A token was sampled for `id` (it runs in a later step).
    pub fn append(&mut self, id: SeqId) -> Result<(), PlanError> {
        let s = self
            .running
            .iter_mut()
            .chain(self.waiting.iter_mut())
            .find(|s| s.id == id)
            .ok_or(PlanError::Unknown(id))?;
        s.tokens += 1;
        Ok(())
    }

    /// `id` is done (finished, cancelled or failed): its blocks go back to the pool.
    pub fn finish(&mut self, id: SeqId) -> Result<(), PlanError> {
        let s = if let Some(i) = self.running.iter().position(|s| s.id == id) {
            self.running.remove(i)
        } else if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i).expect("found")
        } else {
            return Err(PlanError::Unknown(id));
        };
        self.pool.free(s.table);
        Ok(())
    }

    fn preempt(&mut self, i: usize, out: &mut Planned) {
        let mut s = self.running.remove(i);
        self.pool.free(std::mem::take(&mut s.table));
        s.computed = 0;
        out.preempted.push(s.id);
        self.waiting.push_front(s);
    }

    /// The next step: which tokens of which sequences run (their K/V blocks reserved, their
    /// tokens counted as computed).
    pub fn schedule(&mut self) -> Planned {
        let mut out = Planned::default();
        let mut budget = self.budget;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let n = self.running[i].pending().min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let end = self.running[i].computed + n;
            if self.pool.reserve(&mut self.running[i].table, end).is_err() {
                let last = self.running.len() - 1;
                if last == i {
                    if i == 0 {
                        // alone and still short of blocks: it cannot go on
                        let s = self.running.remove(0);
                        out.starved.push(s.id);
                        self.pool.free(s.table);
                    } else {
                        self.preempt(i, &mut out);
                    }
                } else {
                    self.preempt(last, &mut out);
                }
                continue;
            }
            let s = &mut self.running[i];
            out.runs.push(Run {
                id: s.id,
                start: s.computed,
                n,
                logits: end == s.tokens,
            });
            s.computed = end;
            budget -= n;
            i += 1;
        }
        // sequences preempted this step (now at the queue's front) wait for the next one, and
        // nothing behind them goes first
        while budget > 0 && self.running.len() < self.max_running && out.preempted.is_empty() {
            let Some(s) = self.waiting.front_mut() else {
                break;
            };
            let n = s.pending().min(budget);
            let end = s.computed + n;
            if self.pool.reserve(&mut s.table, end).is_err() {
                break;
            }
            let mut s = self.waiting.pop_front().expect("front");
            out.runs.push(Run {
                id: s.id,
                start: s.computed,
                n,
                logits: end == s.tokens,
            });
            s.computed = end;
            budget -= n;
            self.running.push(s);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planner(blocks: usize, budget: usize, max_running: usize) -> Planner {
        Planner::new(BlockPool::new(blocks, 4), budget, max_running)
    }

    /// Run steps until every sequence is done (each generates `gen` tokens), as an engine
    /// would: sample at a logits row, finish after `gen` samples. Returns the steps.
    fn drive(p: &mut Planner, gen: usize, ids: &[SeqId]) -> Vec<Planned> {
        let mut left: std::collections::HashMap<SeqId, usize> =
            ids.iter().map(|&i| (i, gen)).collect();
        let mut steps = Vec::new();
        for _ in 0..1000 {
            if left.is_empty() {
                return steps;
            }
            let s = p.schedule();
            for r in &s.runs {
                if r.logits {
                    let l = left.get_mut(&r.id).unwrap();
                    *l -= 1;
                    if *l == 0 {
                        left.remove(&r.id);
                        p.finish(r.id).unwrap();
                    } else {
                        p.append(r.id).unwrap();
                    }
                }
            }
            for id in &s.starved {
                left.remove(id);
            }
            steps.push(s);
        }
        panic!("did not finish");
    }

    #[test]
    fn decodes_go_first_and_a_long_prompt_runs_in_chunks() {
        let mut p = planner(64, 8, 8);
        p.add(1, 2).unwrap();
        p.add(2, 3).unwrap();
        let s = p.schedule();
        assert_eq!(s.runs.len(), 2);
        assert!(s.runs.iter().all(|r| r.logits));
        p.append(1).unwrap();
        p.append(2).unwrap();
        // a 20-token prompt arrives: each step runs both decodes, then 6 prompt tokens
        p.add(3, 20).unwrap();
        let mut done = 0;
        for step in 0..4 {
            let s = p.schedule();
            assert_eq!(
                s.runs[0],
                Run {
                    id: 1,
                    start: 2 + step,
                    n: 1,
                    logits: true
                }
            );
            assert_eq!(
                s.runs[1],
                Run {
                    id: 2,
                    start: 3 + step,
                    n: 1,
                    logits: true
                }
            );
            let r = s.runs[2];
            assert_eq!((r.id, r.start), (3, done));
            assert_eq!(r.n, 6.min(20 - done));
            done += r.n;
            assert_eq!(r.logits, done == 20);
            p.append(1).unwrap();
            p.append(2).unwrap();
        }
        assert_eq!(done, 20);
        assert_eq!(p.running(), 3);
    }

    #[test]
    fn a_cached_prefix_runs_only_the_rest_but_holds_its_blocks() {
        let mut p = planner(8, 64, 8);
        p.add_cached(1, 10, 7).unwrap();
        // a fully cached prompt still runs its last token (its logits are needed)
        p.add_cached(2, 4, 9).unwrap();
        let s = p.schedule();
        let runs: Vec<_> = s
            .runs
            .iter()
            .map(|r| (r.id, r.start, r.n, r.logits))
            .collect();
        assert_eq!(runs, vec![(1, 7, 3, true), (2, 3, 1, true)]);
        assert_eq!(p.table(1).unwrap().held(), 3);
        assert_eq!(p.blocks().free, 4);
    }

    #[test]
    fn admission_waits_for_blocks_in_arrival_order() {
        // 4 blocks of 4 positions
        let mut p = planner(4, 64, 8);
        p.add(1, 12).unwrap(); // 3 blocks
        p.add(2, 8).unwrap(); // 2 blocks: does not fit beside 1
        p.add(3, 1).unwrap(); // would fit, but waits behind 2
        let s = p.schedule();
        assert_eq!(s.runs.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(p.waiting(), 2);
        p.finish(1).unwrap();
        let s = p.schedule();
        assert_eq!(s.runs.iter().map(|r| r.id).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(p.blocks().free, 1);
    }

    #[test]
    fn a_full_pool_preempts_the_newest_and_everyone_finishes() {
        // 6 blocks of 4: three sequences of 6 prompt tokens generating 8 each need 4 blocks
        // apiece at the end, so they cannot all stay
        let mut p = planner(6, 64, 8);
        for id in 1..=3 {
            p.add(id, 6).unwrap();
        }
        let steps = drive(&mut p, 8, &[1, 2, 3]);
        let preempted: Vec<SeqId> = steps.iter().flat_map(|s| s.preempted.clone()).collect();
        assert!(!preempted.is_empty());
        // the newest running sequence goes first
        assert_eq!(preempted[0], 3);
        assert!(steps.iter().all(|s| s.starved.is_empty()));
        // each sequence's logits rows: 8 samples apiece, whatever was recomputed
        for id in 1..=3u64 {
            let samples = steps
                .iter()
                .flat_map(|s| &s.runs)
                .filter(|r| r.id == id && r.logits)
                .count();
            // a recompute ends in the logits row of the token it had not run yet: no sample
            // is repeated or lost
            assert_eq!(samples, 8, "sequence {id}");
        }
        assert_eq!(p.blocks().free, 6);
        assert_eq!((p.running(), p.waiting()), (0, 0));
    }

    #[test]
    fn a_recomputed_sequence_reruns_its_generated_tokens() {
        let mut p = planner(3, 64, 8);
        p.add(1, 4).unwrap();
        p.add(2, 4).unwrap();
        p.schedule();
        p.append(1).unwrap();
        p.append(2).unwrap();
        // both need a second block for token 5: one is free, 2 is preempted
        let s = p.schedule();
        assert_eq!(s.preempted, vec![2]);
        assert_eq!(
            s.runs,
            vec![Run {
                id: 1,
                start: 4,
                n: 1,
                logits: true
            }]
        );
        p.finish(1).unwrap();
        // 2 comes back with its prompt and its generated token: 5 tokens from the start
        let s = p.schedule();
        assert_eq!(
            s.runs,
            vec![Run {
                id: 2,
                start: 0,
                n: 5,
                logits: true
            }]
        );
    }

    #[test]
    fn the_running_limit_and_the_budget_hold() {
        let mut p = planner(64, 5, 2);
        for id in 1..=3 {
            p.add(id, 4).unwrap();
        }
        let s = p.schedule();
        // 4 tokens of 1, then 1 token of 2's prompt; 3 waits for the running limit
        assert_eq!(
            s.runs,
            vec![
                Run {
                    id: 1,
                    start: 0,
                    n: 4,
                    logits: true
                },
                Run {
                    id: 2,
                    start: 0,
                    n: 1,
                    logits: false
                }
            ]
        );
        assert_eq!((p.running(), p.waiting()), (2, 1));
        let total: usize = s.runs.iter().map(|r| r.n).sum();
        assert!(total <= 5);
    }

    #[test]
    fn what_cannot_fit_is_refused_or_starved() {
        let mut p = planner(2, 64, 8);
        assert_eq!(
            p.add(1, 9),
            Err(PlanError::TooLong {
                tokens: 9,
                need: 3,
                total: 2
            })
        );
        p.add(1, 8).unwrap();
        assert_eq!(p.add(1, 1), Err(PlanError::Duplicate(1)));
        p.schedule();
        p.append(1).unwrap(); // token 9 needs a third block
        let s = p.schedule();
        assert_eq!(s.starved, vec![1]);
        assert_eq!(p.blocks().free, 2);
        assert_eq!(p.finish(1), Err(PlanError::Unknown(1)));
    }
}
