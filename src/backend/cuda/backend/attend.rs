//! Attention of the CUDA backend: `attention` (prefill and split-K decode over the paged
//! cache).

use super::{attn_q8_enabled, CudaBackend};
use crate::backend::cuda::ops::attention::cache::GpuKvCache;
use crate::backend::cuda::runtime::types::{GpuTensor, Q8Side};
use crate::backend::{AttnParams, BackendError, Result, StepOf};

impl CudaBackend {
    /// [`crate::backend::Backend::attention`].
    pub(super) fn attention_impl(
        &self,
        q: &GpuTensor,
        cache: &GpuKvCache,
        step: &StepOf<Self>,
        p: &AttnParams,
    ) -> Result<GpuTensor> {
        let width = p.n_heads * p.head_dim;
        if q.cols != width {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!(
                    "q has {} columns, {} heads x {}",
                    q.cols, p.n_heads, p.head_dim
                ),
            });
        }
        if q.rows == 0 {
            return self.alloc_tensor(0, width);
        }
        let seq = step.plan().seq_of("attention", q.rows)?;
        let pos = step.dev().positions("attention", q.rows)?;
        let max_pos = seq.pos0 + q.rows - 1;
        // a decode row's int8 side-car, written by the attention kernel: the O projection
        // then needs no quantize launch
        let q8 = if p.head_dim % 128 == 0 && attn_q8_enabled() {
            self.q8_side(q.rows, width)?
        } else {
            None
        };
        let buf = self.dev.attention(
            &self.pool,
            q.ptr(),
            q.rows,
            cache,
            pos,
            max_pos,
            p,
            q8.as_ref().map(Q8Side::ptrs),
        )?;
        if buf.bytes() < q.rows * width * 4 {
            return Err(BackendError::Device(format!(
                "attention returned {} bytes for [{}, {width}]",
                buf.bytes(),
                q.rows
            )));
        }
        Ok(GpuTensor::new(buf, q.rows, width).with_q8(q8))
    }
}
