//! Mixture-of-experts on the device: routing (softmax, top-k, optional renormalisation) and the
//! selected experts' gated MLPs, summed with their routing weights.
//!
//! Small batches (decode) route and run the experts without a host round trip, so the step can
//! be captured as a CUDA graph; large batches (prefill) may group tokens per expert.

use std::sync::Arc;

use super::buf::{DevBuf, DevPtr, Pool};
use super::error::CudaError;
use super::types::GpuWeight;
use super::CudaDevice;
use crate::backend::MoeParams;

impl CudaDevice {
    /// `x` f32 `[n, hidden]`, `router_logits` f32 `[n, n_experts]`; `gate`, `up` banks
    /// `[E, ff, hidden]`, `down` `[E, hidden, ff]`. Returns `[n, hidden]` f32 from `pool`:
    /// `sum_k p_k * down_k(act(gate_k x) * up_k x)`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe(
        &self,
        pool: &Arc<Pool>,
        x: DevPtr<f32>,
        n: usize,
        router_logits: DevPtr<f32>,
        gate: &GpuWeight,
        up: &GpuWeight,
        down: &GpuWeight,
        p: &MoeParams,
    ) -> Result<DevBuf, CudaError> {
        let _ = (pool, x, n, router_logits, gate, up, down, p);
        Err(CudaError::Invalid {
            op: "moe",
            detail: "not implemented on the CUDA backend yet".into(),
        })
    }
}
