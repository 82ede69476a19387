//! One sequence on a Gemma model: a KV cache per layer that owns one, and the Gemma decoder as
//! the shared session drives it ([`Decoder`]: the forward pass of a step, rewinds).
//!
//! Sliding-window layers keep a ring (`KvShape::ring`) of [`ring_slots`] positions when that is
//! shorter than the context: the window plus one pass's chunk, since a pass writes its K/V
//! before its queries read them. A ring forgets positions more than its size behind the newest
//! write, so the state tracks the oldest position every ring still holds (`held_from`): a
//! rewind that would need an older one is refused (`ModelError::Rewind`), and the caller
//! re-prefills. Rewinds of up to one chunk (8192 tokens by default) stay exact.

use std::sync::Arc;

use super::decoder::GemmaModel;
use super::weights::me;
use crate::backend::{Backend, KvShape, LogitRows, StepOf};
use crate::model::common::seqs::SeqSteps;
use crate::model::common::session::{Decoder, DecoderSession, StepOutput};
use crate::model::{CausalLm, Logits, ModelError, ModelInfo, Session};

type R<T> = Result<T, ModelError>;

/// Positions a sliding-window layer's ring keeps for a `window` and passes of up to `chunk`
/// tokens: the `window - 1` positions before a pass's first query plus the pass itself, rounded
/// up to whole 64-position pages (what the CUDA cache allocates in any case).
pub fn ring_slots(window: usize, chunk: usize) -> usize {
    (window.saturating_sub(1) + chunk.max(1)).div_ceil(64) * 64
}

/// One Gemma sequence's state.
pub struct GemmaState<B: Backend> {
    /// A KV cache per layer that owns one (None: the layer reads another's).
    pub caches: Vec<Option<B::KvCache>>,
    /// Oldest position the sliding layers' rings still hold (0 without rings).
    held_from: usize,
}

/// One sequence on a Gemma model.
pub type GemmaSession<B> = DecoderSession<GemmaModel<B>>;

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

    /// A fresh session, its caches made now.
    pub fn session(self: &Arc<Self>) -> R<GemmaSession<B>> {
        DecoderSession::with_state(Arc::clone(self))
    }

    /// Whether the rings still hold what a query at position `n` sees (its window before it).
    fn can_resume_at(&self, st: &GemmaState<B>, n: usize) -> bool {
        n == 0 || (n + 1).saturating_sub(self.spec.window) >= st.held_from
    }
}

impl<B: Backend> CausalLm for GemmaModel<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_session(self: Arc<Self>) -> Box<dyn Session> {
        Box::new(DecoderSession::new(self))
    }

    fn forward_batch(
        &self,
        sessions: &mut [&mut dyn Session],
        tokens: &[&[u32]],
    ) -> Vec<R<Logits>> {
        crate::model::common::session::forward_batch::<Self>(sessions, tokens)
    }
}

impl<B: Backend> Decoder for GemmaModel<B> {
    type B = B;
    type State = GemmaState<B>;

    fn backend(&self) -> &Arc<B> {
        &self.backend
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> R<GemmaState<B>> {
        let ring = self.ring();
        // the own-KV layers' caches in one request (the backend may lay them out beside other
        // sequences')
        let shapes: Vec<KvShape> = self
            .spec
            .layers
            .iter()
            .filter(|l| l.kv_source.is_none())
            .map(|l| KvShape {
                n_kv_heads: l.n_kv_heads,
                head_dim: l.head_dim,
                capacity: self.spec.max_context,
                ring: if l.sliding { ring } else { None },
            })
            .collect();
        let mut own = self.backend.kv_caches(&shapes).map_err(me)?.into_iter();
        let mut caches = Vec::with_capacity(self.spec.n_layers());
        for l in &self.spec.layers {
            caches.push(match l.kv_source {
                Some(_) => None,
                None => Some(
                    own.next()
                        .ok_or_else(|| ModelError::Other("fewer KV caches than layers".into()))?,
                ),
            });
        }
        Ok(GemmaState {
            caches,
            held_from: 0,
        })
    }

    fn forward(
        &self,
        step: &StepOf<B>,
        states: &mut [&mut GemmaState<B>],
    ) -> R<StepOutput<B::Tensor>> {
        let seqs = SeqSteps::new(&*self.backend, step)?;
        let h = self.hidden_states(&seqs, states)?;
        if seqs.many() {
            let rows = seqs.logit_rows(&*self.backend, h, step.plan().logits())?;
            return Ok(StepOutput {
                logits: rows.map(|h| self.logits_tensor(&h)).transpose()?,
                hidden: None,
            });
        }
        let one = self.backend.dims(&h).0 == 1;
        Ok(match step.plan().logits() {
            LogitRows::None => StepOutput {
                logits: None,
                hidden: None,
            },
            // one row is its own last row (and keeps the int8 side-car the final norm wrote,
            // which the head's GEMV reads)
            _ if one => StepOutput {
                logits: Some(self.logits_tensor(&h)?),
                hidden: Some(h),
            },
            LogitRows::Last => {
                let last = self.last_row(&h)?;
                StepOutput {
                    logits: Some(self.logits_tensor(&last)?),
                    hidden: Some(last),
                }
            }
            LogitRows::All => StepOutput {
                logits: Some(self.logits_tensor(&h)?),
                hidden: Some(self.last_row(&h)?),
            },
        })
    }

    fn rewind(&self, st: &mut GemmaState<B>, len: usize, n: usize) -> R<()> {
        if n < len && !self.can_resume_at(st, n) {
            return Err(ModelError::Rewind {
                to: n,
                why: format!(
                    "the sliding-window layers keep the last {} positions and no longer hold \
                     positions before {}; re-prefill",
                    self.ring().unwrap_or(0),
                    st.held_from
                ),
            });
        }
        if n == 0 {
            st.held_from = 0;
        }
        for c in st.caches.iter_mut().flatten() {
            self.backend.kv_truncate(c, n).map_err(me)?;
        }
        Ok(())
    }

    fn rewritable(&self) -> bool {
        true
    }

    fn pass_chunk(&self) -> usize {
        self.pass_chunk
    }

    fn max_logit_rows(&self) -> Option<usize> {
        self.ring().map(|_| self.pass_chunk)
    }

    fn written(&self, st: &mut GemmaState<B>, end: usize) {
        if let Some(s) = self.ring() {
            st.held_from = st.held_from.max(end.saturating_sub(s));
        }
    }
}
