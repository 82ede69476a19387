//! Attention of the CUDA backend: `attention` (prefill and split-K decode over the paged
//! cache) and `attn_prep_attention`, which on a decode row runs attn_prep's work inside the
//! decode attention kernel (ops/attn_decode `__mma_prep`): one launch a layer instead of two,
//! with the same values (the selftest's `attn_prep_attention` rows compare the bytes).

use super::super::buf::DevPtr;
use super::super::kv::kv_layout;
use super::super::launch_decode_prep::DecodePrep;
use super::super::types::{GpuKvCache, GpuTensor, Q8Side};
use super::{attn_q8_enabled, CudaBackend};
use crate::backend::{attn_prep_attention_composed, AttnParams, AttnPrep, BackendError, Result};

impl CudaBackend {
    /// [`crate::backend::Backend::attention`]; with `prep` (one row) `q` is the unnormed projection and the
    /// decode kernel makes its own input (see [`Self::attn_prep_attention_impl`]).
    pub(super) fn attention_impl(
        &self,
        q: &GpuTensor,
        cache: &GpuKvCache,
        pos0: usize,
        p: &AttnParams,
        prep: Option<&DecodePrep<'_>>,
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
        let pos = self.positions(pos0, q.rows)?;
        let max_pos = pos0 + q.rows - 1;
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
            pos.ptr,
            max_pos,
            p,
            q8.as_ref().map(Q8Side::ptrs),
            prep,
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

    /// [`crate::backend::Backend::attn_prep_attention`]: where [`Self::prep_fusable`] takes the inputs, one
    /// `__mma_prep` launch (the new K / V row written as attn_prep writes it, the attention
    /// output as attention of attn_prep's q); else attn_prep, then attention.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attn_prep_attention_impl(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        cache: &mut GpuKvCache,
        pos0: usize,
        prep: &AttnPrep<'_, GpuTensor>,
        p: &AttnParams,
    ) -> Result<GpuTensor> {
        if !self.prep_fusable((q, k, v), cache, prep, p)? {
            return attn_prep_attention_composed(self, q, k, v, cache, pos0, prep, p);
        }
        // pos and q_out are unused by the fused entry (it reads the attention's q_pos; the
        // rotated q stays on chip)
        let (launch, bufs) =
            self.prep_parts((q, k, v), cache, prep, DevPtr::null(), DevPtr::null())?;
        let layout = kv_layout(&cache.shape, cache.kv_type);
        let dp = DecodePrep {
            launch: &launch,
            layout: &layout,
            bufs: &bufs,
        };
        let out = self.attention_impl(q, cache, pos0, p, Some(&dp))?;
        cache.len = cache.len.max(pos0 + 1);
        Ok(out)
    }
}
