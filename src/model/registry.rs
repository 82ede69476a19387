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
    /// Bytes one session's KV cache may take, asked once the weights are uploaded (None = no
    /// cap): each family caps its context with [`LoadOptions::cap_context`].
    pub kv_budget: Option<KvBudget>,
}

/// A KV byte budget measured when asked (after the weights are on the device); the first
/// answer is kept and can be read back for the log line.
#[derive(Clone)]
pub struct KvBudget {
    measure: Arc<dyn Fn() -> u64 + Send + Sync>,
    value: Arc<std::sync::OnceLock<u64>>,
}

impl KvBudget {
    pub fn new(measure: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self {
            measure: Arc::new(measure),
            value: Arc::new(std::sync::OnceLock::new()),
        }
    }
    /// The budget in bytes (measured on the first call).
    pub fn bytes(&self) -> u64 {
        *self.value.get_or_init(|| (self.measure)())
    }
    /// The budget if it was measured.
    pub fn measured(&self) -> Option<u64> {
        self.value.get().copied()
    }
}

impl std::fmt::Debug for KvBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvBudget({:?})", self.measured())
    }
}

impl LoadOptions {
    /// The context a model may allocate: `own` (its limit after `max_context`), capped by the
    /// KV budget at `per_token` bytes a token (measured now: call it after the weights are
    /// uploaded; the bytes come from [`crate::backend::Backend::kv_bytes`]).
    pub fn cap_context(&self, own: usize, per_token: u64) -> Result<usize, ModelError> {
        match &self.kv_budget {
            None => Ok(own),
            Some(b) => context_cap(own, per_token, b.bytes()),
        }
    }

    /// [`Self::cap_context`] for a model whose sliding-window layers keep rings of `slots`
    /// positions (`ring_bytes` per position over those layers) beside layers of `full_bytes`
    /// per token: the rings come out of the budget first, and the rest caps the context. Where
    /// the context would not exceed the rings (they would hold it whole), every layer counts per
    /// token, as a session then allocates them.
    pub fn cap_context_ring(
        &self,
        own: usize,
        full_bytes: u64,
        ring_bytes: u64,
        slots: usize,
    ) -> Result<usize, ModelError> {
        let Some(b) = &self.kv_budget else {
            return Ok(own);
        };
        let budget = b.bytes();
        if ring_bytes > 0 && slots < own {
            let fixed = ring_bytes.saturating_mul(slots as u64);
            if let Some(rest) = budget.checked_sub(fixed) {
                let fits = rest
                    .checked_div(full_bytes)
                    .map_or(own, |f| usize::try_from(f).unwrap_or(usize::MAX).min(own));
                if fits > slots {
                    return Ok(fits);
                }
            }
        }
        context_cap(own, full_bytes + ring_bytes, budget)
    }
}

/// `own` capped to the tokens `budget` bytes hold at `per_token` bytes each; an error when not
/// even one token fits (`per_token == 0`: no cap).
pub fn context_cap(own: usize, per_token: u64, budget: u64) -> Result<usize, ModelError> {
    if per_token == 0 {
        return Ok(own);
    }
    let fits = usize::try_from(budget / per_token).unwrap_or(usize::MAX);
    if fits == 0 {
        return Err(ModelError::Other(format!(
            "the KV cache budget of {budget} bytes does not hold one token ({per_token} bytes \
             per token): raise --gpu-mem-util, use --kv-type fp8 or a smaller model"
        )));
    }
    Ok(own.min(fits))
}

/// Architectures `load_model` can build today as stand-alone causal LMs. The others are
/// detected but refused with a clear error.
pub fn loadable(arch: Arch) -> bool {
    matches!(
        arch,
        Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe | Arch::Gemma3 | Arch::Gemma4
    )
}

/// Architectures with a reference forward: the loadable ones plus draft heads, which run
/// attached to a target model (`model::gemma4::assistant`). Each needs a golden case.
pub fn has_forward(arch: Arch) -> bool {
    loadable(arch) || arch == Arch::Gemma4Assistant
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
    use crate::backend::Need;
    let mut needs = Vec::new();
    if matches!(det.arch, Arch::Qwen35 | Arch::Qwen35Moe) {
        needs.push(Need::GatedDeltaNet);
    }
    if ckpt.any_tensor(|f| f == crate::weights::TensorFormat::NvFp4) {
        needs.push(Need::Nvfp4Weights);
    }
    for need in needs {
        if let Some(what) = backend.lacks(need) {
            return Err(ModelError::Unsupported {
                backend: backend.name(),
                what,
            });
        }
    }
    match det.arch {
        Arch::Qwen3 | Arch::Qwen3Moe => crate::model::qwen3::load(ckpt, det, backend, opts),
        Arch::Qwen35 | Arch::Qwen35Moe => crate::model::qwen35::load(ckpt, det, backend, opts),
        Arch::Gemma3 => crate::model::gemma3::load(ckpt, det, backend, opts),
        Arch::Gemma4 => crate::model::gemma4::load(ckpt, det, backend, opts),
        Arch::Gemma4Assistant => Err(ModelError::Other(
            "gemma4-assistant is an MTP draft head, not a stand-alone model: it runs attached to \
             a Gemma 4 target (--assistant)"
                .into(),
        )),
        Arch::DiffusionGemma => Err(ModelError::Other(
            "diffusion-gemma is detected, but the text-diffusion engine is not implemented yet; \
             supported: gemma3, gemma4, qwen3, qwen3moe, qwen35, qwen35moe"
                .into(),
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(budget: u64) -> LoadOptions {
        LoadOptions {
            max_context: 0,
            kv_budget: Some(KvBudget::new(move || budget)),
        }
    }

    /// Gemma 4 12B's layers over an FP8 cache (a byte an element, scales left out): 8 global
    /// layers of 1 x 512 (8192 K and V bytes a token), 40 sliding ones of 8 x 256 (163840) in
    /// rings of 9216 positions.
    #[test]
    fn rings_come_out_of_the_budget_before_the_context() {
        const GIB: u64 = 1 << 30;
        let (full, sliding, slots) = (8192u64, 163_840u64, 9216usize);
        let ring_bytes = sliding * slots as u64;
        // 20 GiB: the rings take 1.4 GiB, the rest holds the whole 262144-token context
        let o = opts(20 * GIB);
        assert_eq!(
            o.cap_context_ring(262_144, full, sliding, slots).unwrap(),
            262_144
        );
        // without rings it would hold 124830 tokens
        assert_eq!(o.cap_context(262_144, full + sliding).unwrap(), 124_830);
        // 2 GiB: the rest after the rings caps the context
        let o = opts(2 * GIB);
        assert_eq!(
            o.cap_context_ring(262_144, full, sliding, slots).unwrap(),
            ((2 * GIB - ring_bytes) / full) as usize
        );
        // 1 GiB: the rings alone do not fit; every layer per token, below the rings' size
        let o = opts(GIB);
        let c = o.cap_context_ring(262_144, full, sliding, slots).unwrap();
        assert_eq!(c, (GIB / (full + sliding)) as usize);
        assert!(c <= slots);
        // no budget: the model's own context
        assert_eq!(
            LoadOptions::default()
                .cap_context_ring(4096, full, sliding, slots)
                .unwrap(),
            4096
        );
    }
}
