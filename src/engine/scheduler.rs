//! The continuous-batching scheduler: one thread runs steps, each step one forward pass over
//! several sequences ([`CausalLm::forward_batch`]). What a step runs is the [`Planner`]'s
//! decision: the running sequences' next tokens first, then chunks of waiting prompts up to the
//! step's token budget, admission by free KV blocks, preemption (a sequence's session dropped,
//! recomputed later) when the blocks run out. New requests join between steps; a request whose
//! client went away leaves before the next step, whether it waits, is in its prompt or decodes.
//!
//! A step of one sequence that wants a token (a lone decode, a lone prompt's last chunk) samples
//! where the logits are (`Session::forward_sample`: on the GPU a recorded decode step and only
//! the token id back); a step of several brings each sequence's logits row to the host and
//! samples it with that request's own sampler. Either way a request keeps one sampler, so its
//! random stream and penalty history do not depend on what it was batched with.
//!
//! The previous finished request's session is kept: a request whose prompt shares its prefix
//! (a chat resending its history) starts from it and computes only the rest.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use super::plan::{Planner, Run, SeqId};
use super::stop::{StopCheck, StopMatcher};
use super::{
    EngineError, EngineHandle, EngineInfo, EngineMetrics, Event, FinishReason, Sampler, Submission,
    Usage,
};
use crate::backend::blocks::BlockPool;
use crate::model::{CausalLm, ModelError, Session, TokenSampler};
use crate::sampling::LogprobInfo;
use crate::tokenizer::{OutputGuard, StreamDecoder, Tokenizer};

/// Settings of the scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub model_id: String,
    /// Decode with special tokens skipped (off: markers such as `<tool_call>` must reach the
    /// chat parsers; end-of-sequence ids are never decoded either way).
    pub skip_special: bool,
    /// Reuse the previous request's KV for a shared prompt prefix.
    pub prefix_reuse: bool,
    /// Most prompt tokens of one sequence per step (the model's own pass chunk,
    /// `model::common::prefill_chunk`, in the server).
    pub prefill_chunk: usize,
    /// Sequences running at once (sharing each step).
    pub max_running: usize,
    /// Tokens per step: every running decode, then prompt chunks (capped at `prefill_chunk`).
    pub step_tokens: usize,
    /// KV blocks the running sequences may hold (None: enough for `max_running` sequences at
    /// the full context: no preemption).
    pub kv_blocks: Option<usize>,
    /// Positions per KV block.
    pub block_size: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            model_id: String::new(),
            skip_special: false,
            prefix_reuse: true,
            prefill_chunk: 8192,
            max_running: 64,
            step_tokens: 2048,
            kv_blocks: None,
            block_size: 16,
        }
    }
}

/// Start the scheduler thread; the returned handle is the only way to reach it.
pub fn spawn(
    model: Arc<dyn CausalLm>,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
) -> EngineHandle {
    let info = model.info().clone();
    let metrics = Arc::new(EngineMetrics::default());
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = EngineHandle::new(
        tx,
        EngineInfo {
            model_id: cfg.model_id.clone(),
            arch: info.arch.clone(),
            max_context: info.max_context,
            vocab_size: info.vocab_size,
        },
        metrics.clone(),
    );
    let bs = cfg.block_size.max(1);
    let running = cfg.max_running.max(1);
    let blocks = cfg
        .kv_blocks
        .unwrap_or(running * info.max_context.div_ceil(bs));
    let budget = cfg.step_tokens.min(cfg.prefill_chunk).max(1);
    let planner = Planner::new(BlockPool::new(blocks.max(1), bs), budget, running);
    metrics.kv_blocks(0, blocks);
    metrics.kv(0, blocks * bs);
    let worker = Worker {
        model,
        tokenizer,
        cfg,
        metrics,
        planner,
        gens: HashMap::new(),
        next_id: 0,
        kept: None,
    };
    std::thread::Builder::new()
        .name("fucina-scheduler".into())
        .spawn(move || worker.run(rx))
        .expect("spawning the scheduler thread");
    handle
}

/// One request in the engine.
struct Gen {
    sub: Submission,
    /// None until the sequence first runs, and after a preemption.
    session: Option<Box<dyn Session>>,
    /// Prompt and generated tokens: what the session holds, plus the last sampled token.
    toks: Vec<u32>,
    /// The request's sampler where the logits are (None: logprobs asked, the host sampler).
    on_session: Option<Box<dyn TokenSampler>>,
    host: Sampler,
    eos: Vec<u32>,
    usage: Usage,
    detok: StreamDecoder,
    guard: OutputGuard,
    stops: StopMatcher,
    think: Option<ThinkState>,
}

/// What ends a request.
enum End {
    Finish(FinishReason, String),
    Fail(EngineError),
}

impl Gen {
    /// Whether EOS and the stop ids are banned now (`ignore_eos`, or fewer than `min_tokens`
    /// generated); then `eos` is the ban list.
    fn bans(&self) -> bool {
        let s = &self.sub.request.stop;
        s.ignore_eos || self.usage.completion_tokens < s.min_tokens
    }

    /// A forced token (the end of a thinking budget) is next.
    fn forced_next(&self) -> bool {
        self.think.as_ref().is_some_and(|t| !t.forced.is_empty())
    }

    /// The next token from `row` (this sequence's logits), or the forced one.
    fn pick(&mut self, row: &mut [f32]) -> Result<(u32, Option<LogprobInfo>), ModelError> {
        if let Some(id) = self.think.as_mut().and_then(|t| t.forced.pop()) {
            match self.on_session.as_deref_mut() {
                Some(s) => s.accept(id)?,
                None => self.host.accept(id),
            }
            return Ok((id, None));
        }
        let banned: &[u32] = if self.bans() { &self.eos } else { &[] };
        match self.on_session.as_deref_mut() {
            Some(s) => Ok((s.sample_host(row, banned)?, None)),
            None => {
                let (id, lp) = self.host.sample(row, banned, self.sub.request.logprobs);
                self.host.accept(id);
                Ok((id, lp))
            }
        }
    }

    /// Emit token `id`; Some when the request ends with it.
    fn emit(
        &mut self,
        id: u32,
        lp: Option<LogprobInfo>,
        forced: bool,
        max_ctx: usize,
    ) -> Option<End> {
        self.usage.completion_tokens += 1;
        let req = &self.sub.request;
        if let (Some(st), Some(b)) = (self.think.as_mut(), req.think_budget.as_ref()) {
            st.observe(id, b, forced);
        }
        if self.eos.contains(&id) {
            return Some(End::Finish(FinishReason::Eos, self.flush()));
        }
        let piece = self
            .guard
            .piece(id, self.detok.push(id).ok().flatten().unwrap_or_default());
        match self.stops.feed(&piece) {
            StopCheck::Stop { text, matched } => {
                let _ = self.sub.events.send(Event::Token {
                    id,
                    text,
                    logprobs: lp,
                });
                return Some(End::Finish(
                    FinishReason::StopString(matched),
                    String::new(),
                ));
            }
            StopCheck::Continue(text) => {
                let sent = self.sub.events.send(Event::Token {
                    id,
                    text,
                    logprobs: lp,
                });
                if sent.is_err() {
                    return Some(End::Finish(FinishReason::Cancelled, String::new()));
                }
            }
        }
        if self.usage.completion_tokens >= self.sub.request.stop.max_tokens {
            return Some(End::Finish(FinishReason::Length, self.flush()));
        }
        self.toks.push(id);
        if self.toks.len() >= max_ctx {
            return Some(End::Finish(FinishReason::ContextFull, self.flush()));
        }
        None
    }

    fn flush(&mut self) -> String {
        let rest = self.detok.finish().ok().flatten().unwrap_or_default();
        let mut out = match self.stops.feed(&rest) {
            StopCheck::Continue(t) => t,
            StopCheck::Stop { text, .. } => return text,
        };
        out.push_str(&self.stops.flush());
        out
    }
}

struct Worker {
    model: Arc<dyn CausalLm>,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    metrics: Arc<EngineMetrics>,
    planner: Planner,
    gens: HashMap<SeqId, Gen>,
    next_id: SeqId,
    /// The last finished request's session and the tokens it holds.
    kept: Option<(Box<dyn Session>, Vec<u32>)>,
}

fn model_err(e: ModelError) -> EngineError {
    EngineError::Model(e.to_string())
}

/// What a panic carried, as text.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

impl Worker {
    fn run(mut self, rx: Receiver<Submission>) {
        let mut open = true;
        loop {
            if self.gens.is_empty() {
                if !open {
                    return;
                }
                match rx.recv() {
                    Ok(sub) => self.admit(sub),
                    Err(_) => return,
                }
            }
            while open {
                match rx.try_recv() {
                    Ok(sub) => self.admit(sub),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            self.drop_cancelled();
            if self.gens.is_empty() {
                continue;
            }
            // A panic inside a model is reported to the step's requests; the scheduler keeps
            // serving.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step()));
            if let Err(p) = r {
                let e = EngineError::Model(format!("the model panicked: {}", panic_text(p)));
                let ids: Vec<SeqId> = self.gens.keys().copied().collect();
                for id in ids {
                    if self.gens.get(&id).is_some_and(|g| g.session.is_some()) {
                        self.end(id, End::Fail(e.clone()));
                    }
                }
            }
        }
    }

    /// Take a request in (or answer it at once).
    fn admit(&mut self, sub: Submission) {
        self.metrics.queued(-1);
        if sub.is_cancelled() {
            self.metrics.finished(true);
            return;
        }
        let req = &sub.request;
        let vocab = self.model.info().vocab_size;
        let mut eos: Vec<u32> = self.tokenizer.special.eos.clone();
        eos.extend(&req.stop.stop_token_ids);
        // a kept session holding a prefix of this prompt (at least one prompt token is left to
        // run: its logits are needed)
        let mut session = None;
        let mut keep = 0;
        if self.cfg.prefix_reuse {
            if let Some((mut s, hist)) = self.kept.take() {
                let common = hist
                    .iter()
                    .zip(&req.prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                let k = common.min(req.prompt.len().saturating_sub(1));
                // (a recurrent model goes back to its newest snapshot at or before k)
                if let Some(Ok(kept @ 1..)) = (k > 0).then(|| s.rewind_near(k)) {
                    keep = kept;
                    session = Some(s);
                }
            }
        }
        self.metrics.prefix(req.prompt.len(), keep);
        let id = self.next_id;
        self.next_id += 1;
        let sampler = match (&session, req.logprobs) {
            (_, Some(_)) => Ok(None),
            (Some(s), None) => s.sampler(&req.sampling, &req.prompt, vocab).map(Some),
            (None, None) => self
                .model
                .clone()
                .new_session()
                .sampler(&req.sampling, &req.prompt, vocab)
                .map(Some),
        };
        let on_session = match sampler {
            Ok(s) => s,
            Err(e) => return self.refuse(&sub, model_err(e)),
        };
        if let Err(e) = self.planner.add_cached(id, req.prompt.len(), keep) {
            return self.refuse(&sub, EngineError::Model(e.to_string()));
        }
        let g = Gen {
            toks: req.prompt.clone(),
            on_session,
            host: Sampler::new(req.sampling.clone(), &req.prompt, vocab),
            eos,
            usage: Usage {
                prompt_tokens: req.prompt.len(),
                completion_tokens: 0,
                cached_tokens: keep,
            },
            detok: StreamDecoder::new(&self.tokenizer, self.cfg.skip_special),
            guard: OutputGuard::new(&self.tokenizer),
            stops: StopMatcher::new(req.stop.stop_strings.clone()),
            think: req.think_budget.as_ref().map(|b| ThinkState {
                inside: b.starts_open,
                count: 0,
                forced: Vec::new(),
            }),
            session,
            sub,
        };
        self.gens.insert(id, g);
        self.gauges();
    }

    fn gauges(&self) {
        let (r, w) = (self.planner.running(), self.planner.waiting());
        self.metrics.sequences(r, w);
        let stats = self.planner.blocks();
        let bs = self.cfg.block_size.max(1);
        self.metrics
            .kv_blocks(stats.total - stats.free, stats.total);
        self.metrics
            .kv((stats.total - stats.free) * bs, stats.total * bs);
    }

    fn refuse(&self, sub: &Submission, e: EngineError) {
        tracing::warn!(request_id = %sub.request.request_id, "request refused: {e}");
        self.metrics.finished(false);
        let _ = sub.events.send(Event::Error(e));
    }

    /// Requests whose clients went away leave now (waiting, in their prompt or decoding).
    fn drop_cancelled(&mut self) {
        let gone: Vec<SeqId> = self
            .gens
            .iter()
            .filter(|(_, g)| g.sub.is_cancelled())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.end(id, End::Finish(FinishReason::Cancelled, String::new()));
        }
    }

    /// `id` ends: its last event, its blocks back to the pool, its session kept for a prefix.
    fn end(&mut self, id: SeqId, how: End) {
        let Some(mut g) = self.gens.remove(&id) else {
            return;
        };
        let _ = self.planner.finish(id);
        self.gauges();
        match how {
            End::Finish(reason, text) => {
                let cancelled = reason == FinishReason::Cancelled;
                self.metrics.finished(cancelled);
                let _ = g.sub.events.send(Event::Finished {
                    reason,
                    usage: g.usage,
                    text,
                });
                if let Some(s) = g.session.take() {
                    let n = s.len().min(g.toks.len());
                    g.toks.truncate(n);
                    self.kept = Some((s, g.toks));
                }
            }
            End::Fail(e) => {
                tracing::warn!(request_id = %g.sub.request.request_id, "generation failed: {e}");
                self.metrics.finished(false);
                let _ = g.sub.events.send(Event::Error(e));
            }
        }
    }

    /// One step: plan, run, sample, emit.
    fn step(&mut self) {
        let plan = self.planner.schedule();
        self.metrics.preempted(plan.preempted.len());
        for id in &plan.preempted {
            if let Some(g) = self.gens.get_mut(id) {
                g.session = None;
            }
        }
        for id in plan.starved {
            let e = EngineError::Model(
                "the KV cache cannot hold this sequence even alone; shorten the request".into(),
            );
            self.end(id, End::Fail(e));
        }
        self.gauges();
        let runs: Vec<Run> = plan
            .runs
            .into_iter()
            .filter(|r| self.gens.contains_key(&r.id))
            .collect();
        if runs.is_empty() {
            // nothing can run now (every sequence waits for blocks held by none): yield a little
            std::thread::sleep(std::time::Duration::from_millis(1));
            return;
        }
        self.metrics.step(runs.len());
        let t = Instant::now();
        let mut picked: HashMap<SeqId, (u32, Option<LogprobInfo>, bool)> = HashMap::new();
        let mut failed: Vec<(SeqId, EngineError)> = Vec::new();
        // each run's session, positioned at its start
        for r in &runs {
            let g = self.gens.get_mut(&r.id).expect("running");
            let s = g
                .session
                .get_or_insert_with(|| self.model.clone().new_session());
            if s.len() != r.start {
                if let Err(e) = s.rewind(r.start) {
                    failed.push((r.id, model_err(e)));
                }
            }
        }
        let runs: Vec<Run> = runs
            .into_iter()
            .filter(|r| !failed.iter().any(|(id, _)| *id == r.id))
            .collect();
        let lone = match runs.as_slice() {
            [r] => {
                let g = &self.gens[&r.id];
                r.logits && g.on_session.is_some() && !g.forced_next()
            }
            _ => false,
        };
        if lone {
            // one sequence wants a token: sample where the logits are
            let r = runs[0];
            let g = self.gens.get_mut(&r.id).expect("running");
            let banned: &[u32] = if g.bans() { &g.eos } else { &[] };
            let toks = &g.toks[r.start..r.start + r.n];
            let s = g.session.as_mut().expect("session made above");
            let sampler = g.on_session.as_deref_mut().expect("checked");
            match s.forward_sample(toks, sampler, banned) {
                Ok(id) => {
                    picked.insert(r.id, (id, None, false));
                }
                Err(e) => failed.push((r.id, model_err(e))),
            }
        } else if !runs.is_empty() {
            let mut logits = self.run_batch(&runs);
            for (r, l) in runs.iter().zip(logits.iter_mut()) {
                let g = self.gens.get_mut(&r.id).expect("running");
                match l {
                    Err(e) => failed.push((r.id, model_err(ModelError::Other(e.to_string())))),
                    Ok(_) if !r.logits => {}
                    Ok(l) => {
                        let forced = g.forced_next();
                        match g.pick(&mut l.data) {
                            Ok((id, lp)) => {
                                picked.insert(r.id, (id, lp, forced));
                            }
                            Err(e) => failed.push((r.id, model_err(e))),
                        }
                    }
                }
            }
        }
        self.account(&runs, t);
        for (id, e) in failed {
            self.end(id, End::Fail(e));
        }
        let max_ctx = self.model.info().max_context;
        for r in &runs {
            let Some(&(id, ref lp, forced)) = picked.get(&r.id) else {
                continue;
            };
            let Some(g) = self.gens.get_mut(&r.id) else {
                continue;
            };
            match g.emit(id, lp.clone(), forced, max_ctx) {
                Some(end) => self.end(r.id, end),
                None => {
                    let _ = self.planner.append(r.id);
                }
            }
        }
    }

    /// The step's sessions in one pass; each run's logits (one row) or error.
    fn run_batch(&mut self, runs: &[Run]) -> Vec<Result<crate::model::Logits, ModelError>> {
        let mut order: HashMap<SeqId, usize> = HashMap::new();
        for (i, r) in runs.iter().enumerate() {
            order.insert(r.id, i);
        }
        let mut slots: Vec<Option<(&mut dyn Session, &[u32])>> =
            (0..runs.len()).map(|_| None).collect();
        for (id, g) in self.gens.iter_mut() {
            let Some(&i) = order.get(id) else {
                continue;
            };
            let r = runs[i];
            let s = g.session.as_deref_mut().expect("session made above");
            slots[i] = Some((s, &g.toks[r.start..r.start + r.n]));
        }
        let (mut sessions, toks): (Vec<&mut dyn Session>, Vec<&[u32]>) =
            slots.into_iter().map(|s| s.expect("every run")).unzip();
        self.model.forward_batch(&mut sessions, &toks)
    }

    /// Prefill and decode throughput: the step's time split by its prompt and decode tokens.
    fn account(&self, runs: &[Run], t: Instant) {
        let nanos = t.elapsed().as_nanos() as u64;
        let mut prompt = 0;
        let mut decode = 0;
        for r in runs {
            let plen = self
                .gens
                .get(&r.id)
                .map_or(0, |g| g.sub.request.prompt.len());
            let p = plen.saturating_sub(r.start).min(r.n);
            prompt += p;
            decode += r.n - p;
        }
        let all = (prompt + decode).max(1) as u64;
        if prompt > 0 {
            self.metrics.prefill(prompt, nanos * prompt as u64 / all);
        }
        if decode > 0 {
            self.metrics.decode(decode, nanos * decode as u64 / all);
        }
    }
}

/// Thinking-budget bookkeeping.
struct ThinkState {
    inside: bool,
    count: usize,
    /// Forced close tokens, in reverse order (popped from the end).
    forced: Vec<u32>,
}

impl ThinkState {
    fn observe(&mut self, id: u32, b: &super::ThinkBudget, was_forced: bool) {
        if was_forced {
            if self.forced.is_empty() {
                self.inside = false;
            }
            return;
        }
        if id == b.open_id {
            self.inside = true;
            self.count = 0;
            return;
        }
        if !self.inside {
            return;
        }
        if id == b.close_id {
            self.inside = false;
            return;
        }
        self.count += 1;
        if self.count >= b.budget && self.forced.is_empty() {
            self.forced = b.close_ids.iter().rev().copied().collect();
        }
    }
}
