//! Pieces shared by the architectures: where tensors and config values come from, weight
//! assembly (expert banks), and the building blocks of a decoder layer written over `Backend`.

pub mod blocks;
pub mod config;
pub mod replay;
pub mod residual;
pub mod seqs;
pub mod session;
pub mod source;

pub use blocks::{AttentionLayer, Dense, GateUp, MoeBlock, NormW, Qkv};
pub use config::{GgufMeta, JsonConfig};
pub use source::{expert_bank, WeightSource};

use crate::backend::BackendError;
use crate::model::ModelError;

/// Prompt tokens per prefill pass: longer prompts run in chunks of this many (bounded
/// activation memory: a 32k-token prompt would otherwise hold several GB of f32 activations per
/// tensor). `FUCINA_PREFILL_CHUNK` overrides the default of 8192 (as vLLM's chunked prefill).
pub fn prefill_chunk() -> usize {
    crate::tuning::get().prefill_chunk
}

/// Backend errors surface to the engine as model errors with the op's message.
pub fn be_err(e: BackendError) -> ModelError {
    ModelError::Other(e.to_string())
}

/// Shorthand: run a backend op, mapping its error.
#[macro_export]
macro_rules! bk {
    ($e:expr) => {
        $e.map_err($crate::model::common::be_err)
    };
}
