//! What the engine sees of a model: a causal LM that owns its weights (on some backend) and hands
//! out per-sequence sessions holding the KV cache / recurrent state.
//!
//! Architecture code (one file per family) lives beside this module; the engine, server and CLI
//! depend only on the traits here.

pub mod common;
pub mod gemma;
pub mod gemma3;
pub mod gemma4;
pub mod qwen;
pub mod qwen3;
pub mod qwen35;
pub mod registry;

use std::any::Any;
use std::sync::Arc;

use crate::backend::Backend;
use crate::sampling::{Sampler, SamplingParams};

/// Static facts about a loaded model the layers above need.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Registry name of the architecture ("gemma3", "qwen3", ...).
    pub arch: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Longest sequence a session can hold (after any memory cap).
    pub max_context: usize,
    /// K and V elements one cached token takes over all layers (0 when unknown); times the
    /// backend's KV element size, the KV bytes per token.
    pub kv_elems_per_token: usize,
    /// K and V elements a session holds whatever its length: the sliding-window layers' rings
    /// (their positions are then not in `kv_elems_per_token`).
    pub kv_fixed_elems: usize,
}

/// Logits for one or more positions, row-major `[rows, vocab]`.
#[derive(Debug, Clone)]
pub struct Logits {
    pub rows: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
    pub fn last(&self) -> &[f32] {
        self.row(self.rows - 1)
    }
}

/// Errors from running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("sequence of {len} tokens exceeds the context of {max}")]
    ContextOverflow { len: usize, max: usize },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("cannot rewind to {to} tokens: {why}")]
    Rewind { to: usize, why: String },
    #[error("empty input")]
    Empty,
    /// The backend cannot run this model (said at load time): `{backend}` and what it lacks.
    #[error("the {backend} backend cannot run this model: {what}")]
    Unsupported { backend: &'static str, what: String },
    #[error("{0}")]
    Other(String),
}

/// A causal language model. Shared between sessions; `Send + Sync`.
pub trait CausalLm: Send + Sync {
    fn info(&self) -> &ModelInfo;
    /// A fresh sequence with an empty cache.
    fn new_session(self: Arc<Self>) -> Box<dyn Session>;

    /// One pass over several of this model's sessions: `tokens[i]` are appended to
    /// `sessions[i]`, and each gets the logits of its last token (one row) or its own error.
    /// Models that batch run them in one step, each weight read once for all; the default runs
    /// each session on its own.
    fn forward_batch(
        &self,
        sessions: &mut [&mut dyn Session],
        tokens: &[&[u32]],
    ) -> Vec<Result<Logits, ModelError>> {
        sessions
            .iter_mut()
            .zip(tokens)
            .map(|(s, t)| s.forward(t, false))
            .collect()
    }
}

/// One sequence's state (KV cache, recurrent state) plus the means to extend it.
pub trait Session: Send {
    /// Append `tokens` and return logits for the last one (`all == false`) or for every
    /// appended position (`all == true`).
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Logits, ModelError>;
    /// Tokens currently held.
    fn len(&self) -> usize;
    /// The session as `Any`, for a model to recognise its own sessions in a batch
    /// ([`CausalLm::forward_batch`]); None: not batchable.
    fn as_any_mut(&mut self) -> Option<&mut dyn Any> {
        None
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keep only the first `n` tokens. Attention-only models rewind exactly; models with
    /// recurrent state rewind to the positions they kept a snapshot of and refuse others
    /// (`ModelError::Rewind`; the caller re-prefills, or asks [`Self::rewind_near`]).
    fn rewind(&mut self, n: usize) -> Result<(), ModelError>;

    /// Keep as many of the first `n` tokens as this session can go back to (a recurrent model:
    /// up to its newest snapshot at or before `n`, else none); returns how many it kept, the
    /// caller runs the rest again. Default: [`Self::rewind`] to `n`.
    fn rewind_near(&mut self, n: usize) -> Result<usize, ModelError> {
        self.rewind(n).map(|_| n)
    }

    /// A sampler for one generation over a vocabulary of `vocab` (`prompt`: the tokens the
    /// repetition penalty counts as observed). Sessions on a backend return one that lives on the
    /// backend (`BackendSampler`); the default samples on the host.
    fn sampler(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<Box<dyn TokenSampler>, ModelError> {
        Ok(Box::new(HostSampler(Sampler::new(
            params.clone(),
            prompt,
            vocab,
        ))))
    }

    /// Append `tokens` and sample the next token with `sampler` (made by [`Session::sampler`]);
    /// `banned` ids are never chosen. The sampled id is recorded by the sampler. Default: the
    /// host path (`forward`, then the sampler on the host logits).
    fn forward_sample(
        &mut self,
        tokens: &[u32],
        sampler: &mut dyn TokenSampler,
        banned: &[u32],
    ) -> Result<u32, ModelError> {
        host_forward_sample(self, tokens, sampler, banned)
    }
}

/// `forward` plus the sampler on the host copy of the last logits row.
pub fn host_forward_sample<S: Session + ?Sized>(
    session: &mut S,
    tokens: &[u32],
    sampler: &mut dyn TokenSampler,
    banned: &[u32],
) -> Result<u32, ModelError> {
    let logits = session.forward(tokens, false)?;
    if logits.rows == 0 {
        return Err(ModelError::Other("the model returned no logits".into()));
    }
    let mut row = logits.last().to_vec();
    sampler.sample_host(&mut row, banned)
}

/// One generation's sampler, made by [`Session::sampler`]. A sampled token is recorded by the
/// call that sampled it; `accept` records a token chosen elsewhere (forced).
pub trait TokenSampler: Send {
    /// Record `id` as generated without sampling it.
    fn accept(&mut self, id: u32) -> Result<(), ModelError>;
    /// Sample from host logits (modified in place: penalties, bans) and record the id.
    fn sample_host(&mut self, logits: &mut [f32], banned: &[u32]) -> Result<u32, ModelError>;
    /// For sessions to recognise their own backend's sampler.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// The engine's CPU sampler as a [`TokenSampler`].
pub struct HostSampler(pub Sampler);

impl TokenSampler for HostSampler {
    fn accept(&mut self, id: u32) -> Result<(), ModelError> {
        self.0.accept(id);
        Ok(())
    }
    fn sample_host(&mut self, logits: &mut [f32], banned: &[u32]) -> Result<u32, ModelError> {
        if logits.is_empty() {
            return Err(ModelError::Other("sampling from empty logits".into()));
        }
        let (id, _) = self.0.sample(logits, banned, None);
        self.0.accept(id);
        Ok(id)
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A sampler whose state lives on backend `B` (`Backend::SamplerState`): the history of
/// observed tokens stays where the logits are, and only sampled ids come back.
pub struct BackendSampler<B: Backend> {
    backend: Arc<B>,
    state: B::SamplerState,
}

impl<B: Backend> BackendSampler<B> {
    pub fn new(
        backend: Arc<B>,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<Self, ModelError> {
        let state = backend
            .sampler_new(params, prompt, vocab)
            .map_err(|e| ModelError::Other(e.to_string()))?;
        Ok(Self { backend, state })
    }

    /// [`Self::new`] as the boxed sampler a session hands out ([`Session::sampler`]).
    pub fn boxed(
        backend: &Arc<B>,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<Box<dyn TokenSampler>, ModelError>
    where
        B: 'static,
    {
        Ok(Box::new(Self::new(backend.clone(), params, prompt, vocab)?))
    }

    /// The backend's sampler state (what a pipelined step draws with).
    pub fn state_mut(&mut self) -> &mut B::SamplerState {
        &mut self.state
    }

    /// Sample from the last row of a logits tensor on the backend (consumed).
    pub fn sample(&mut self, logits: B::Tensor, banned: &[u32]) -> Result<u32, ModelError> {
        self.backend
            .sample(logits, &mut self.state, banned)
            .map_err(|e| ModelError::Other(e.to_string()))
    }
}

impl<B: Backend> TokenSampler for BackendSampler<B> {
    fn accept(&mut self, id: u32) -> Result<(), ModelError> {
        self.backend
            .sampler_accept(&mut self.state, id)
            .map_err(|e| ModelError::Other(e.to_string()))
    }
    fn sample_host(&mut self, logits: &mut [f32], banned: &[u32]) -> Result<u32, ModelError> {
        let t = self
            .backend
            .tensor(logits, 1, logits.len())
            .map_err(|e| ModelError::Other(e.to_string()))?;
        self.sample(t, banned)
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}
