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

use std::sync::Arc;

/// Static facts about a loaded model the layers above need.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// Registry name of the architecture ("gemma3", "qwen3", ...).
    pub arch: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Longest sequence a session can hold (after any memory cap).
    pub max_context: usize,
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
    #[error("{0}")]
    Other(String),
}

/// A causal language model. Shared between sessions; `Send + Sync`.
pub trait CausalLm: Send + Sync {
    fn info(&self) -> &ModelInfo;
    /// A fresh sequence with an empty cache.
    fn new_session(self: Arc<Self>) -> Box<dyn Session>;
}

/// One sequence's state (KV cache, recurrent state) plus the means to extend it.
pub trait Session: Send {
    /// Append `tokens` and return logits for the last one (`all == false`) or for every
    /// appended position (`all == true`).
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Logits, ModelError>;
    /// Tokens currently held.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keep only the first `n` tokens. Attention-only models rewind exactly; models with
    /// recurrent state may refuse (`ModelError::Rewind`), and the caller re-prefills.
    fn rewind(&mut self, n: usize) -> Result<(), ModelError>;
}
