//! The forward pass of one step, described once: which tokens run, at which positions, in which
//! sequences, and which rows produce logits. A model builds a [`StepPlan`], the backend turns it
//! into a [`Step`] (the CUDA backend uploads ids and positions to device memory once, so every
//! op of the pass and a recorded CUDA graph read them there), and every op that needs token ids
//! or positions (`embed`, `rope`, `kv_write`, `attn_prep`, `attention`) takes the step.
//!
//! A step's rows are the flattened tokens of its sequences, sequence after sequence. The
//! decoders run the ops that touch one sequence's state (the KV write, attention) per sequence,
//! each over a step of its own (`model::common::seqs`); such an op given a step of several
//! sequences says so ([`StepPlan::one_seq`]).

use super::{BackendError, Result};

/// One sequence's rows in a step: rows `row0 .. row0 + rows` of the step's activations are its
/// tokens, at positions `pos0 .. pos0 + rows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqRows {
    pub row0: usize,
    pub rows: usize,
    pub pos0: usize,
}

/// Which rows of a step reach the LM head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// The last row of each sequence (generation).
    Last,
    /// Every row (scoring a prompt, speculative verification).
    All,
    /// No row (a prompt chunk before the last).
    None,
}

/// Host description of one forward pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepPlan {
    /// One id per row; None for a step fed on the device (its one token is the id a pipelined
    /// draw wrote there, see `Backend::sample_begin`): only the device knows it.
    ids: Option<Vec<u32>>,
    rows: usize,
    seqs: Vec<SeqRows>,
    logits: LogitRows,
}

fn bad(detail: String) -> BackendError {
    BackendError::Shape { op: "step", detail }
}

impl StepPlan {
    /// One sequence: `ids` at positions `pos0 ..`.
    pub fn single(ids: &[u32], pos0: usize, logits: LogitRows) -> Result<StepPlan> {
        Self::check_positions(pos0, ids.len())?;
        if ids.is_empty() {
            return Err(bad("a step needs at least one token".into()));
        }
        Ok(StepPlan {
            ids: Some(ids.to_vec()),
            rows: ids.len(),
            seqs: vec![SeqRows {
                row0: 0,
                rows: ids.len(),
                pos0,
            }],
            logits,
        })
    }

    /// `rows` rows of token 0 at positions `pos0 ..` (for ops that read only positions: tests,
    /// checks).
    pub fn at(pos0: usize, rows: usize) -> Result<StepPlan> {
        Self::single(&vec![0; rows], pos0, LogitRows::All)
    }

    /// One token at `pos` whose id only the device holds (a pipelined draw's).
    pub fn fed(pos: usize) -> Result<StepPlan> {
        Self::check_positions(pos, 1)?;
        Ok(StepPlan {
            ids: None,
            rows: 1,
            seqs: vec![SeqRows {
                row0: 0,
                rows: 1,
                pos0: pos,
            }],
            logits: LogitRows::Last,
        })
    }

    /// Several sequences, each `(ids, pos0)`, their rows one after the other.
    pub fn batch(seqs: &[(&[u32], usize)], logits: LogitRows) -> Result<StepPlan> {
        let mut ids = Vec::new();
        let mut out = Vec::with_capacity(seqs.len());
        for &(s, pos0) in seqs {
            if s.is_empty() {
                return Err(bad("a sequence of a step needs at least one token".into()));
            }
            Self::check_positions(pos0, s.len())?;
            out.push(SeqRows {
                row0: ids.len(),
                rows: s.len(),
                pos0,
            });
            ids.extend_from_slice(s);
        }
        if ids.is_empty() {
            return Err(bad("a step needs at least one token".into()));
        }
        Ok(StepPlan {
            rows: ids.len(),
            ids: Some(ids),
            seqs: out,
            logits,
        })
    }

    /// Positions travel as i32 on the device.
    fn check_positions(pos0: usize, n: usize) -> Result<()> {
        if pos0.checked_add(n).is_none_or(|e| e > i32::MAX as usize) {
            return Err(bad(format!("positions {pos0}+{n} exceed i32")));
        }
        Ok(())
    }

    /// Rows (tokens) of the step.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// The token ids, one per row (None: fed on the device).
    pub fn ids(&self) -> Option<&[u32]> {
        self.ids.as_deref()
    }
    pub fn seqs(&self) -> &[SeqRows] {
        &self.seqs
    }
    pub fn logits(&self) -> LogitRows {
        self.logits
    }
    /// The position of every row.
    pub fn positions(&self) -> Vec<usize> {
        self.seqs
            .iter()
            .flat_map(|s| s.pos0..s.pos0 + s.rows)
            .collect()
    }
    /// The step's only sequence, for an op that runs one at a time (`op` names it in the error).
    pub fn one_seq(&self, op: &'static str) -> Result<SeqRows> {
        match self.seqs.as_slice() {
            [s] => Ok(*s),
            v => Err(BackendError::Unsupported {
                op,
                backend: "any",
                detail: format!("a step of {} sequences (one at a time yet)", v.len()),
            }),
        }
    }
    /// [`Self::one_seq`] for an op over `rows` rows: the rows must be the step's.
    pub fn seq_of(&self, op: &'static str, rows: usize) -> Result<SeqRows> {
        let s = self.one_seq(op)?;
        if rows != s.rows {
            return Err(BackendError::Shape {
                op,
                detail: format!("{rows} rows in a step of {}", s.rows),
            });
        }
        Ok(s)
    }
    /// The token ids, or an error naming `op` for a step fed on the device.
    pub fn host_ids(&self, op: &'static str) -> Result<&[u32]> {
        self.ids().ok_or_else(|| BackendError::Unsupported {
            op,
            backend: "any",
            detail: "this step's token is on the device only (a pipelined draw)".into(),
        })
    }
}

/// A step as a backend holds it: the plan and what the backend made of it (`D`: nothing on the
/// CPU, the device buffer of ids and positions on CUDA).
#[derive(Debug)]
pub struct Step<D> {
    plan: StepPlan,
    dev: D,
}

impl<D> Step<D> {
    pub fn new(plan: StepPlan, dev: D) -> Step<D> {
        Step { plan, dev }
    }
    pub fn plan(&self) -> &StepPlan {
        &self.plan
    }
    /// The plan and the backend's part, for a backend rewriting the step in place.
    pub fn parts_mut(&mut self) -> (&mut StepPlan, &mut D) {
        (&mut self.plan, &mut self.dev)
    }
    pub fn dev(&self) -> &D {
        &self.dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_rows_follow_each_other() {
        let p = StepPlan::batch(&[(&[1, 2, 3], 10), (&[4], 0)], LogitRows::Last).unwrap();
        assert_eq!(p.rows(), 4);
        assert_eq!(p.ids(), Some(&[1, 2, 3, 4][..]));
        assert_eq!(p.positions(), vec![10, 11, 12, 0]);
        assert_eq!(p.seqs()[1].row0, 3);
        assert!(p.one_seq("x").is_err());
    }

    #[test]
    fn bad_plans_are_errors() {
        assert!(StepPlan::single(&[], 0, LogitRows::Last).is_err());
        assert!(StepPlan::single(&[1], i32::MAX as usize, LogitRows::Last).is_err());
        assert!(StepPlan::batch(&[(&[1], 0), (&[], 3)], LogitRows::All).is_err());
        let p = StepPlan::single(&[1, 2], 5, LogitRows::All).unwrap();
        assert!(p.seq_of("rope", 3).is_err());
        assert_eq!(p.seq_of("rope", 2).unwrap().pos0, 5);
        let f = StepPlan::fed(7).unwrap();
        assert!(f.host_ids("embed").is_err());
        assert_eq!(f.positions(), vec![7]);
    }
}
