//! `Backend::linear_attn_prep` on the CUDA backend: one decode row's fused q|k|v projection
//! and attn_prep as one launch (the q4_0r GEMV's `__qkvp` entry, thread-block clusters of one
//! head each: `ops/attention/qkv_prep.rs`). On by default (`FUCINA_QKV_PREP=0` or
//! `CudaBackend::with_qkv_prep(false)` turn it off); everything it does not take returns None
//! and the caller runs `linear` then `attn_prep`.
//!
//! Measured on the H200 (Qwen3-8B Q4_0 decode at prompt 16, three interleaved runs
//! each): 595.6 / 594.2 / 594.0 tok/s with two launches, 601.7 / 601.7 / 601.5 with one; the
//! same 48-token greedy text (`--raw`).

use super::CudaBackend;
use crate::backend::cuda::ops::attention::cache::GpuKvCache;
use crate::backend::cuda::ops::attention::kv::{check_kv_positions, kv_layout};
use crate::backend::cuda::ops::attention::qkv_prep::{QkvPrepArgs, QKVP_HEAD_DIM};
use crate::backend::cuda::runtime::types::{GpuTensor, GpuWeight};
use crate::backend::{AttnPrep, Result, StepOf};
use crate::kernels::Entry;
use crate::kernels::{BatchBucket, Op, Quant};

impl CudaBackend {
    /// Whether the one-launch q|k|v + attn_prep is on: [`Self::with_qkv_prep`], else not
    /// `FUCINA_QKV_PREP=0` (on by default).
    pub(super) fn qkv_prep_on(&self) -> bool {
        self.qkv_prep.unwrap_or(crate::tuning::get().qkv_prep)
    }

    /// See [`crate::backend::Backend::linear_attn_prep`]: Some where the `__qkvp` entry takes
    /// the inputs (one row, a q4_0r weight of `(n_heads + 2 n_kv_heads) * 128` rows, head dim
    /// 128, a RoPE shape attn_prep takes), else None.
    pub(super) fn linear_attn_prep_impl(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        cache: &mut GpuKvCache,
        step: &StepOf<Self>,
        p: &AttnPrep<'_, GpuTensor>,
    ) -> Result<Option<GpuTensor>> {
        if !self.qkv_prep_on() || x.rows != 1 {
            return Ok(None);
        }
        let v = w.matrix()?;
        let (r, hd) = (p.rope, p.rope.head_dim);
        let heads = p.n_heads + 2 * p.n_kv_heads;
        let ff_ok = r
            .freq_factors
            .as_ref()
            .is_none_or(|f| f.len() >= r.rot_dims / 2);
        if v.quant != Quant::Q4_0R
            || hd != QKVP_HEAD_DIM
            || v.rows != heads * hd
            || v.cols != x.cols
            || cache.shape.head_dim != hd
            || cache.shape.n_kv_heads != p.n_kv_heads
            || r.rot_dims % 2 != 0
            || r.rot_dims > hd
            || r.freq_base_dims == 0
            || !ff_ok
        {
            return Ok(None);
        }
        // loaded once; an instance without the entry (before sm_90) fails to load it
        let Ok(e) = self.kern_entry_at(Op::Gemv, Quant::Q4_0R, BatchBucket::B1, Entry::Qkvp) else {
            return Ok(None);
        };
        let pos0 = step.plan().seq_of("linear_attn_prep", 1)?.pos0;
        check_kv_positions(cache, pos0, 1)?;
        let mut own = None;
        let (xq, xds) = self.row_side_car(x, &mut own)?;
        let pos = step.dev().positions("linear_attn_prep", 1)?;
        let q_out = self.alloc_tensor(1, p.n_heads * hd)?;
        // attn_prep's launch and buffers; their q / k / v stay unused (the projections never
        // leave the chip), so x stands in for them
        let (launch, bufs) = self.prep_parts((x, x, x), cache, p, pos, q_out.ptr())?;
        let layout = kv_layout(&cache.shape, cache.kv_type);
        self.dev.gemv_qkvp_ptr(
            &e,
            &QkvPrepArgs {
                w: v.data,
                xq,
                xds,
                k: x.cols,
                n_kv_heads: p.n_kv_heads,
                launch: &launch,
                bufs: &bufs,
                layout: &layout,
            },
        )?;
        cache.len = cache.len.max(pos0 + 1);
        Ok(Some(q_out))
    }
}
