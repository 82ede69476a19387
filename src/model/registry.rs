//! Loading a model: architecture detection picks the module that builds it.

use std::sync::Arc;

use crate::arch::{self, Arch, Detected};
use crate::backend::Backend;
use crate::gguf::GgufFile;
use crate::model::common::{GgufMeta, WeightSource};
use crate::model::{CausalLm, ModelError};
use crate::weights::{Checkpoint, TensorRef};

/// Options for loading a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Longest sequence a session may hold; 0 = the model's own maximum.
    pub max_context: usize,
}

/// Architectures `load_model` can build today. The others are detected but refused with a
/// clear error until their module lands.
pub fn loadable(arch: Arch) -> bool {
    matches!(
        arch,
        Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe
    )
}

/// Detect the architecture of `ckpt` and build the model on `backend`.
pub fn load_model<B: Backend>(
    ckpt: &Checkpoint,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<dyn CausalLm>, ModelError> {
    let det = arch::detect(ckpt).map_err(|e| ModelError::Other(e.to_string()))?;
    load_detected(ckpt, &det, backend, opts)
}

/// Build the model for an already detected architecture.
pub fn load_detected<B: Backend>(
    ckpt: &Checkpoint,
    det: &Detected,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<dyn CausalLm>, ModelError> {
    match det.arch {
        Arch::Qwen3 | Arch::Qwen3Moe => crate::model::qwen3::load(ckpt, det, backend, opts),
        Arch::Qwen35 | Arch::Qwen35Moe => crate::model::qwen35::load(ckpt, det, backend, opts),
        other => Err(ModelError::Other(format!(
            "architecture {} is detected but not implemented yet",
            other.name()
        ))),
    }
}

impl WeightSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<TensorRef<'_>, ModelError> {
        Checkpoint::tensor(self, name).map_err(|e| ModelError::Other(e.to_string()))
    }
    fn has(&self, name: &str) -> bool {
        Checkpoint::has(self, name)
    }
}

impl GgufMeta for GgufFile {
    fn meta_u64(&self, key: &str) -> Option<u64> {
        self.get_u64(key)
    }
    fn meta_f32(&self, key: &str) -> Option<f32> {
        self.get_f32(key)
    }
    fn meta_u64_array(&self, key: &str) -> Option<Vec<u64>> {
        self.get_u64_array(key)
    }
    fn meta_bool(&self, key: &str) -> Option<bool> {
        self.get_bool(key)
    }
}
