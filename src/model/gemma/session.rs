//! One sequence on a Gemma model: a KV cache per layer that owns one, the pass over new tokens
//! (prompt chunks, or one replayed decode step) and rewinds.
//!
//! Sliding-window layers keep a ring (`KvShape::ring`) of [`ring_slots`] positions when that is
//! shorter than the context: the window plus one pass's chunk, since a pass writes its K/V
//! before its queries read them. A ring forgets positions more than its size behind the newest
//! write, so the session tracks the oldest position every ring still holds (`held_from`): a
//! rewind that would need an older one is refused (`ModelError::Rewind`), and the caller
//! re-prefills. Rewinds of up to one chunk (8192 tokens by default) stay exact.

use std::sync::Arc;

use super::decoder::GemmaModel;
use super::weights::me;
use crate::backend::{Backend, KvShape};
use crate::model::common::replay::StepReplay;
use crate::model::{
    host_forward_sample, BackendSampler, CausalLm, Logits, ModelError, ModelInfo, Session,
    TokenSampler,
};
use crate::sampling::SamplingParams;

/// Positions a sliding-window layer's ring keeps for a `window` and passes of up to `chunk`
/// tokens: the `window - 1` positions before a pass's first query plus the pass itself, rounded
/// up to whole 64-position pages (what the CUDA cache allocates in any case).
pub fn ring_slots(window: usize, chunk: usize) -> usize {
    (window.saturating_sub(1) + chunk.max(1)).div_ceil(64) * 64
}

impl<B: Backend> GemmaModel<B> {
    /// The ring size of the sliding layers' caches: `Some` when a sliding layer owns a cache
    /// and [`ring_slots`] is below the context, else every layer keeps the whole context.
    pub fn ring(&self) -> Option<usize> {
        let spec = &self.spec;
        let slots = ring_slots(spec.window, self.pass_chunk);
        let sliding = spec
            .layers
            .iter()
            .any(|l| l.sliding && l.kv_source.is_none());
        (self.rings && sliding && spec.window > 0 && slots < spec.max_context).then_some(slots)
    }

    /// A fresh session with its own caches.
    pub fn session(self: &Arc<Self>) -> Result<GemmaSession<B>, ModelError> {
        let ring = self.ring();
        let mut caches = Vec::with_capacity(self.spec.n_layers());
        for l in &self.spec.layers {
            caches.push(match l.kv_source {
                Some(_) => None,
                None => Some(
                    self.backend
                        .kv_cache(KvShape {
                            n_kv_heads: l.n_kv_heads,
                            head_dim: l.head_dim,
                            capacity: self.spec.max_context,
                            ring: if l.sliding { ring } else { None },
                        })
                        .map_err(me)?,
                ),
            });
        }
        Ok(GemmaSession {
            model: Arc::clone(self),
            caches,
            len: 0,
            held_from: 0,
            hidden: None,
            graph: StepReplay::default(),
        })
    }
}

impl<B: Backend> CausalLm for GemmaModel<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_session(self: Arc<Self>) -> Box<dyn Session> {
        match self.session() {
            Ok(s) => Box::new(s),
            Err(e) => Box::new(FailedSession(e.to_string())),
        }
    }
}

/// A session whose caches could not be allocated: every call reports why.
struct FailedSession(String);

impl Session for FailedSession {
    fn forward(&mut self, _: &[u32], _: bool) -> Result<Logits, ModelError> {
        Err(ModelError::Other(format!(
            "session unavailable: {}",
            self.0
        )))
    }
    fn len(&self) -> usize {
        0
    }
    fn rewind(&mut self, _: usize) -> Result<(), ModelError> {
        Err(ModelError::Other(format!(
            "session unavailable: {}",
            self.0
        )))
    }
}

/// One sequence on a Gemma model: a KV cache per layer that owns one.
pub struct GemmaSession<B: Backend> {
    pub model: Arc<GemmaModel<B>>,
    pub caches: Vec<Option<B::KvCache>>,
    len: usize,
    /// Oldest position the sliding layers' rings still hold (0 without rings).
    held_from: usize,
    /// Final-normed hidden state of the last position (what the Gemma 4 MTP head reads).
    hidden: Option<B::Tensor>,
    /// Decode-step replay (CUDA graph).
    graph: StepReplay<B>,
}

impl<B: Backend> GemmaSession<B> {
    /// Post-final-norm hidden state of the last token processed (`[1, hidden]`).
    pub fn last_hidden(&self) -> Option<&B::Tensor> {
        self.hidden.as_ref()
    }
}

impl<B: Backend> GemmaSession<B> {
    /// Checks, then the layers over `tokens`: returns the logits tensor (every row when `all`,
    /// else the last) and keeps the last row's hidden state. A one-token step is recorded once and
    /// then replayed (`StepReplay`). A failure drops whatever the step wrote, so the session
    /// stays usable.
    fn pass(&mut self, tokens: &[u32], all: bool) -> Result<B::Tensor, ModelError> {
        self.graph.forget_inflight();
        let end = self.check_pass(tokens)?;
        let model = Arc::clone(&self.model);
        let m = &*model;
        let pos0 = self.len;
        let ring = m.ring();
        if all && ring.is_some() && tokens.len() > m.pass_chunk {
            return Err(ModelError::Other(format!(
                "every row's logits of {} tokens in one pass: the sliding-window rings hold \
                 passes of at most {} (forward splits them)",
                tokens.len(),
                m.pass_chunk
            )));
        }
        // the rings lose what this pass overwrites, even if it fails part way
        self.note_written(end);
        let caches = &mut self.caches;
        let mut run = || -> Result<Vec<B::Tensor>, ModelError> {
            // Long prompts run in chunks (bounded activation memory and the rings' size); only
            // the last chunk's rows reach the head. `all` keeps one pass: every row's logits are
            // asked for (at most one chunk of them on a model with rings).
            let chunk = if all { tokens.len() } else { m.pass_chunk };
            let mut at = pos0;
            let mut h = None;
            for c in tokens.chunks(chunk.max(1)) {
                h = Some(m.hidden_states(c, at, caches)?);
                at += c.len();
            }
            let h = h.ok_or(ModelError::Empty)?;
            if m.backend.dims(&h).0 == 1 {
                // one row is its own last row (and keeps the int8 side-car the final norm
                // wrote, which the head's GEMV reads)
                let logits = m.logits_tensor(&h)?;
                return Ok(vec![logits, h]);
            }
            let last = m.last_row(&h)?;
            let logits = m.logits_tensor(if all { &h } else { &last })?;
            Ok(vec![logits, last])
        };
        let r = if tokens.len() == 1 && !all {
            self.graph.step_many(&*m.backend, tokens, pos0, run)
        } else {
            run()
        };
        match r {
            Ok(mut v) if v.len() == 2 => {
                let last = v.pop().expect("two outputs");
                let logits = v.pop().expect("two outputs");
                self.hidden = Some(last);
                self.len = end;
                Ok(logits)
            }
            Ok(_) => Err(ModelError::Other("forward pass lost its outputs".into())),
            Err(e) => {
                let keep = self.len;
                for c in self.caches.iter_mut().flatten() {
                    let _ = self.model.backend.kv_truncate(c, keep);
                }
                Err(e)
            }
        }
    }
}

impl<B: Backend> GemmaSession<B> {
    /// Record that positions up to `end` (exclusive) were written: a ring of `s` slots then
    /// holds nothing before `end - s`.
    fn note_written(&mut self, end: usize) {
        if let Some(s) = self.model.ring() {
            self.held_from = self.held_from.max(end.saturating_sub(s));
        }
    }

    /// Whether the rings still hold what a query at position `n` sees (its window before it).
    fn can_resume_at(&self, n: usize) -> bool {
        n == 0 || (n + 1).saturating_sub(self.model.spec.window) >= self.held_from
    }

    /// What a pass over `tokens` needs: some tokens, all in the vocabulary, room in the
    /// context. Returns the length after it.
    fn check_pass(&self, tokens: &[u32]) -> Result<usize, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        let spec = &self.model.spec;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= spec.vocab) {
            return Err(ModelError::BadToken {
                id,
                vocab: spec.vocab,
            });
        }
        let end = self.len + tokens.len();
        if end > spec.max_context {
            return Err(ModelError::ContextOverflow {
                len: end,
                max: spec.max_context,
            });
        }
        Ok(end)
    }

    /// `pass` of one token and the draw from its logits, pipelined: the next step is queued
    /// fed with the drawn id before the host waits for it (`StepReplay::step_sampled`; every
    /// per-step state here is a K/V row, rewritten before it is read).
    fn pass_sampled(
        &mut self,
        token: u32,
        s: &mut BackendSampler<B>,
        banned: &[u32],
    ) -> Result<u32, ModelError> {
        self.check_pass(&[token])?;
        let model = Arc::clone(&self.model);
        let m = &*model;
        let max = m.spec.max_context;
        let pos0 = self.len;
        let next = (pos0 + 2 <= max).then_some(pos0 + 1);
        // the queued next step writes its K/V row too (whether or not it is taken)
        self.note_written(next.map_or(pos0 + 1, |p| p + 1));
        let caches = &mut self.caches;
        let run = || -> Result<Vec<B::Tensor>, ModelError> {
            let h = m.hidden_states(&[token], pos0, caches)?;
            // one row keeps the final norm's int8 side-car for the head's GEMV
            let logits = m.logits_tensor(&h)?;
            Ok(vec![logits, h])
        };
        let r = self
            .graph
            .step_sampled(&*m.backend, token, pos0, next, s.state_mut(), banned, run);
        match r {
            Ok(mut st) => {
                self.hidden = st.rest.pop();
                self.len += 1;
                Ok(st.token)
            }
            Err(e) => {
                let keep = self.len;
                for c in self.caches.iter_mut().flatten() {
                    let _ = self.model.backend.kv_truncate(c, keep);
                }
                Err(e)
            }
        }
    }
}

impl<B: Backend> Session for GemmaSession<B> {
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Logits, ModelError> {
        let be = Arc::clone(&self.model.backend);
        if !(all && self.model.ring().is_some() && tokens.len() > self.model.pass_chunk) {
            let l = self.pass(tokens, all)?;
            let (rows, vocab) = be.dims(&l);
            return Ok(Logits {
                rows,
                vocab,
                data: be.to_host(&l).map_err(me)?,
            });
        }
        // every row's logits through rings: one pass per chunk, gathered on the host; a failure
        // leaves the session as it was before the call
        let start = self.len;
        let mut out = Logits {
            rows: 0,
            vocab: self.model.spec.vocab,
            data: Vec::new(),
        };
        for c in tokens.chunks(self.model.pass_chunk) {
            let r = self.pass(c, true).and_then(|l| be.to_host(&l).map_err(me));
            match r {
                Ok(d) => {
                    out.rows += c.len();
                    out.data.extend(d);
                }
                Err(e) => {
                    for c in self.caches.iter_mut().flatten() {
                        let _ = be.kv_truncate(c, start);
                    }
                    self.len = start;
                    self.hidden = None;
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn sampler(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<Box<dyn TokenSampler>, ModelError> {
        BackendSampler::boxed(&self.model.backend, params, prompt, vocab)
    }

    fn forward_sample(
        &mut self,
        tokens: &[u32],
        sampler: &mut dyn TokenSampler,
        banned: &[u32],
    ) -> Result<u32, ModelError> {
        match sampler.as_any_mut().downcast_mut::<BackendSampler<B>>() {
            Some(s) if tokens.len() == 1 => self.pass_sampled(tokens[0], s, banned),
            Some(s) => {
                let l = self.pass(tokens, false)?;
                s.sample(l, banned)
            }
            None => host_forward_sample(self, tokens, sampler, banned),
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn rewind(&mut self, n: usize) -> Result<(), ModelError> {
        self.graph.forget_inflight();
        if n > self.len {
            return Err(ModelError::Rewind {
                to: n,
                why: format!("only {} tokens held", self.len),
            });
        }
        if n == 0 {
            self.held_from = 0;
        } else if n < self.len && !self.can_resume_at(n) {
            return Err(ModelError::Rewind {
                to: n,
                why: format!(
                    "the sliding-window layers keep the last {} positions and no longer hold \
                     positions before {}; re-prefill",
                    self.model.ring().unwrap_or(0),
                    self.held_from
                ),
            });
        }
        for c in self.caches.iter_mut().flatten() {
            self.model.backend.kv_truncate(c, n).map_err(me)?;
        }
        self.len = n;
        self.hidden = None;
        Ok(())
    }
}
