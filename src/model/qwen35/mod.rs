//! Qwen3.5 / Qwen3.6 hybrid models, dense and MoE (GGUF `qwen35` / `qwen35moe`, HF `qwen3_5`,
//! `qwen3_5_moe` and their `*_text` forms): Gated DeltaNet layers with one gated full-attention
//! layer every `full_attention_interval`, partial RoPE, zero-centred norms, and (MoE) routed
//! experts plus a sigmoid-gated shared expert. The decoder is shared in `crate::model::qwen`.

use std::sync::Arc;

use crate::arch::{Arch, Detected};
use crate::backend::Backend;
use crate::model::qwen::{load::load_variant, Variant};
use crate::model::registry::LoadOptions;
use crate::model::{CausalLm, ModelError};
use crate::weights::Checkpoint;

pub fn load<B: Backend>(
    ckpt: &Checkpoint,
    det: &Detected,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<dyn CausalLm>, ModelError> {
    let v = match det.arch {
        Arch::Qwen35 => Variant::Qwen35,
        Arch::Qwen35Moe => Variant::Qwen35Moe,
        other => {
            return Err(ModelError::Other(format!(
                "qwen35 loader given {}",
                other.name()
            )))
        }
    };
    load_variant(v, ckpt, det, backend, opts)
}
