//! The first scheduler: one thread, one sequence at a time, FIFO. It keeps the previous
//! request's session and reuses the longest common token prefix (`Session::rewind`), so a chat
//! that resends its history only prefills the new turn.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

use super::stop::{StopCheck, StopMatcher};
use super::{
    EngineError, EngineHandle, EngineInfo, EngineMetrics, Event, FinishReason, Sampler, Submission,
    Usage,
};
use crate::model::{CausalLm, Session};
use crate::tokenizer::{OutputGuard, StreamDecoder, Tokenizer};

/// Settings of the simple scheduler.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub model_id: String,
    /// Decode with special tokens skipped (off: markers such as `<tool_call>` must reach the
    /// chat parsers; end-of-sequence ids are never decoded either way).
    pub skip_special: bool,
    /// Reuse the previous request's KV for a shared prompt prefix.
    pub prefix_reuse: bool,
    /// Prompt tokens per forward pass of a prefill (the model's own chunk,
    /// `model::common::prefill_chunk`, in the server): a request cancelled while its prompt
    /// runs stops at the next chunk.
    pub prefill_chunk: usize,
}

/// Start the scheduler thread; the returned handle is the only way to reach it.
pub fn spawn(
    model: Arc<dyn CausalLm>,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
) -> EngineHandle {
    let info = model.info().clone();
    let metrics = Arc::new(EngineMetrics::default());
    metrics.kv(0, info.max_context);
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
    let worker = Worker {
        model,
        tokenizer,
        cfg,
        metrics,
        slot: None,
    };
    std::thread::Builder::new()
        .name("fucina-scheduler".into())
        .spawn(move || worker.run(rx))
        .expect("spawning the scheduler thread");
    handle
}

struct Worker {
    model: Arc<dyn CausalLm>,
    tokenizer: Arc<Tokenizer>,
    cfg: SchedulerConfig,
    metrics: Arc<EngineMetrics>,
    /// The kept session and the tokens it holds.
    slot: Option<(Box<dyn Session>, Vec<u32>)>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Submission>) {
        while let Ok(sub) = rx.recv() {
            self.metrics.queued(-1);
            if sub.is_cancelled() {
                self.metrics.finished(true);
                continue;
            }
            self.metrics.running(1);
            // A panic inside a model is reported to its request; the scheduler keeps serving.
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.generate(&sub)))
                    .unwrap_or_else(|p| {
                        let what = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        Err(EngineError::Model(format!("the model panicked: {what}")))
                    });
            self.metrics.running(-1);
            match outcome {
                Ok(cancelled) => self.metrics.finished(cancelled),
                Err(e) => {
                    tracing::warn!(request_id = %sub.request.request_id, "generation failed: {e}");
                    self.slot = None; // state unknown after a failed forward
                    self.metrics.finished(false);
                    let _ = sub.events.send(Event::Error(e));
                }
            }
        }
    }

    /// Session positioned at a prefix of `prompt`; returns it, its token mirror and how many
    /// prompt tokens it already holds. At least one prompt token is always left to forward
    /// (its logits are needed).
    fn acquire(&mut self, prompt: &[u32]) -> (Box<dyn Session>, Vec<u32>, usize) {
        if self.cfg.prefix_reuse {
            if let Some((mut s, mut hist)) = self.slot.take() {
                let common = hist.iter().zip(prompt).take_while(|(a, b)| a == b).count();
                let keep = common.min(prompt.len() - 1);
                if s.rewind(keep).is_ok() {
                    hist.truncate(keep);
                    return (s, hist, keep);
                }
            }
        }
        self.slot = None;
        (self.model.clone().new_session(), Vec::new(), 0)
    }

    /// Run one request to completion. `Ok(true)` when it was cancelled.
    fn generate(&mut self, sub: &Submission) -> Result<bool, EngineError> {
        let req = &sub.request;
        let max_ctx = self.model.info().max_context;
        let vocab = self.model.info().vocab_size;
        let model_err = |e: crate::model::ModelError| EngineError::Model(e.to_string());

        let mut eos: Vec<u32> = self.tokenizer.special.eos.clone();
        eos.extend(&req.stop.stop_token_ids);
        // EOS (and stop ids) are masked while fewer than `min_tokens` were generated.
        let banned = |n: usize| -> &[u32] {
            if req.stop.ignore_eos || n < req.stop.min_tokens {
                &eos
            } else {
                &[]
            }
        };

        let (mut session, mut hist, keep) = self.acquire(&req.prompt);
        self.metrics.prefix(req.prompt.len(), keep);
        // Without logprobs the session samples where its logits are (on the GPU only the token
        // id comes back); logprobs need the host logits, so they keep the host sampler.
        let mut on_session = match req.logprobs {
            None => Some(
                session
                    .sampler(&req.sampling, &req.prompt, vocab)
                    .map_err(model_err)?,
            ),
            Some(_) => None,
        };
        let mut sampler = Sampler::new(req.sampling.clone(), &req.prompt, vocab);
        // The token sampled by the last `forward_sample` (session sampling).
        let mut next: Option<u32> = None;
        let mut row: Vec<f32> = Vec::new();
        let mut usage = Usage {
            prompt_tokens: req.prompt.len(),
            completion_tokens: 0,
            cached_tokens: keep,
        };
        let finish = |this: &mut Self, reason, text: String, sess, hist, usage| {
            this.slot = Some((sess, hist));
            let cancelled = reason == FinishReason::Cancelled;
            let _ = sub.events.send(Event::Finished {
                reason,
                usage,
                text,
            });
            Ok(cancelled)
        };
        let t = Instant::now();
        // every chunk but the last: a client gone meanwhile stops the prompt there
        let rest = &req.prompt[keep..];
        let chunk = self.cfg.prefill_chunk.max(1);
        let mut done = 0;
        while rest.len() - done > chunk {
            if sub.is_cancelled() {
                self.metrics.prefill(done, t.elapsed().as_nanos() as u64);
                return finish(
                    self,
                    FinishReason::Cancelled,
                    String::new(),
                    session,
                    hist,
                    usage,
                );
            }
            let part = &rest[done..done + chunk];
            session.forward(part, false).map_err(model_err)?;
            hist.extend_from_slice(part);
            done += chunk;
        }
        let last = &rest[done..];
        match on_session.as_deref_mut() {
            Some(s) => {
                next = Some(
                    session
                        .forward_sample(last, s, banned(0))
                        .map_err(model_err)?,
                );
            }
            None => {
                let logits = session.forward(last, false).map_err(model_err)?;
                row = logits.last().to_vec();
            }
        }
        self.metrics
            .prefill(req.prompt.len() - keep, t.elapsed().as_nanos() as u64);
        hist.extend_from_slice(last);

        let mut detok = StreamDecoder::new(&self.tokenizer, self.cfg.skip_special);
        // control-token strings the model writes as ordinary tokens are marked (consumers drop
        // the mark): the output parsers act only on control tokens
        let mut guard = OutputGuard::new(&self.tokenizer);
        let mut stops = StopMatcher::new(req.stop.stop_strings.clone());
        let mut think = req.think_budget.as_ref().map(|b| ThinkState {
            inside: b.starts_open,
            count: 0,
            forced: Vec::new(),
        });

        loop {
            if sub.is_cancelled() {
                return finish(
                    self,
                    FinishReason::Cancelled,
                    String::new(),
                    session,
                    hist,
                    usage,
                );
            }
            let n = usage.completion_tokens;
            let forced = think.as_mut().and_then(|t| t.forced.pop());
            let (id, lp) = match (forced, on_session.as_deref_mut()) {
                (Some(id), Some(s)) => {
                    s.accept(id).map_err(model_err)?;
                    (id, None)
                }
                (Some(id), None) => {
                    sampler.accept(id);
                    (id, None)
                }
                (None, Some(_)) => match next.take() {
                    Some(id) => (id, None),
                    None => {
                        return Err(EngineError::Model(
                            "no token was sampled by the last forward pass".into(),
                        ))
                    }
                },
                (None, None) => {
                    let (id, lp) = sampler.sample(&mut row, banned(n), req.logprobs);
                    sampler.accept(id);
                    (id, lp)
                }
            };
            usage.completion_tokens += 1;
            if let (Some(st), Some(b)) = (think.as_mut(), req.think_budget.as_ref()) {
                st.observe(id, b, forced.is_some());
            }
            if eos.contains(&id) {
                let text = flush(&mut detok, &mut stops);
                return finish(self, FinishReason::Eos, text, session, hist, usage);
            }
            let piece = guard.piece(id, detok.push(id).ok().flatten().unwrap_or_default());
            match stops.feed(&piece) {
                StopCheck::Stop { text, matched } => {
                    let _ = sub.events.send(Event::Token {
                        id,
                        text,
                        logprobs: lp,
                    });
                    let reason = FinishReason::StopString(matched);
                    return finish(self, reason, String::new(), session, hist, usage);
                }
                StopCheck::Continue(text) => {
                    if sub
                        .events
                        .send(Event::Token {
                            id,
                            text,
                            logprobs: lp,
                        })
                        .is_err()
                    {
                        return finish(
                            self,
                            FinishReason::Cancelled,
                            String::new(),
                            session,
                            hist,
                            usage,
                        );
                    }
                }
            }
            if usage.completion_tokens >= req.stop.max_tokens {
                let text = flush(&mut detok, &mut stops);
                return finish(self, FinishReason::Length, text, session, hist, usage);
            }
            if hist.len() + 1 >= max_ctx {
                let text = flush(&mut detok, &mut stops);
                return finish(self, FinishReason::ContextFull, text, session, hist, usage);
            }
            // A forced token is next: sample nothing now (the random stream and the penalty
            // history advance exactly as on the host path).
            let next_forced = think.as_ref().is_some_and(|t| !t.forced.is_empty());
            let t = Instant::now();
            match on_session.as_deref_mut() {
                Some(s) if !next_forced => {
                    let n = usage.completion_tokens;
                    next = Some(
                        session
                            .forward_sample(&[id], s, banned(n))
                            .map_err(model_err)?,
                    );
                }
                _ => {
                    let logits = session.forward(&[id], false).map_err(model_err)?;
                    row.clear();
                    row.extend_from_slice(logits.last());
                    if row.len() != vocab {
                        return Err(EngineError::Model(format!(
                            "model returned {} logits for a vocabulary of {vocab}",
                            row.len()
                        )));
                    }
                }
            }
            self.metrics.decode(1, t.elapsed().as_nanos() as u64);
            hist.push(id);
            self.metrics.kv(hist.len(), max_ctx);
        }
    }
}

fn flush(detok: &mut StreamDecoder, stops: &mut StopMatcher) -> String {
    let rest = detok.finish().ok().flatten().unwrap_or_default();
    let mut out = match stops.feed(&rest) {
        StopCheck::Continue(t) => t,
        StopCheck::Stop { text, .. } => return text,
    };
    out.push_str(&stops.flush());
    out
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
