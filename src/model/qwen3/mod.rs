//! Qwen3 dense and Qwen3-MoE (GGUF `qwen3` / `qwen3moe`, HF `Qwen3ForCausalLM` /
//! `Qwen3MoeForCausalLM`): GQA with q/k RMSNorm, SwiGLU or top-k softmax experts. The decoder
//! itself is shared with Qwen3.5 in `crate::model::qwen`.

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
        Arch::Qwen3 => Variant::Qwen3,
        Arch::Qwen3Moe => Variant::Qwen3Moe,
        other => {
            return Err(ModelError::Other(format!(
                "qwen3 loader given {}",
                other.name()
            )))
        }
    };
    load_variant(v, ckpt, det, backend, opts)
}
