//! The fused decode ops of the CUDA backend: `add_rms_norm` (residual add + the next RMSNorm,
//! one launch, with the int8 side-car of a one-row output), `norm_add_rms_norm` (the same with
//! Gemma's post-norm of the added branch and the layer scalar on the sum) and `attn_prep`
//! (per-head q/k/v norms, RoPE, K/V into the cache: one launch instead of up to six). All read
//! and write
//! only pooled or cache memory and take positions from the step, so they sit in a
//! recorded decode step like the ops they replace. With many rows (prefill) `attn_prep` takes
//! the kernel's multi-row entry (one warp per (row, head)), whose bytes equal the decode form's.

use super::CudaBackend;
use crate::backend::cuda::ops::attention::cache::GpuKvCache;
use crate::backend::cuda::ops::attention::kv::{kv_layout, kv_quant};
use crate::backend::cuda::ops::attention::prep::{
    AttnPrepBufs, AttnPrepLaunch, ATTN_PREP_MAX_HEAD_DIM,
};
use crate::backend::cuda::ops::elementwise::add_norm::NormAddWeights;
use crate::backend::cuda::ops::elementwise::launch::NormWeightPtr;
use crate::backend::cuda::ops::elementwise::rows::{attn_prep_rows_suffix, PREFILL_MIN_ROWS};
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::types::{Bf16Side, GpuTensor, Q8Side};
use crate::backend::{attn_prep_composed, AttnPrep, BackendError, Norm, PostNorm, Result, StepOf};
use crate::kernels::Entry;
use crate::kernels::{BatchBucket, Op, Quant};

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// The pointer form of a norm weight, checked to hold `dim` values.
pub(super) fn norm_ptr(
    op: &'static str,
    n: &Norm<'_, GpuTensor>,
    dim: usize,
) -> Result<NormWeightPtr> {
    let p = match n {
        Norm::Plain(t) => NormWeightPtr::Plain(t.ptr()),
        Norm::OnePlus(t) => NormWeightPtr::OnePlus(t.ptr()),
        Norm::None => return Ok(NormWeightPtr::None),
    };
    if let NormWeightPtr::Plain(w) | NormWeightPtr::OnePlus(w) = p {
        if w.len() != dim {
            return Err(shape(
                op,
                format!("norm weight of {} values for groups of {dim}", w.len()),
            ));
        }
    }
    Ok(p)
}

/// The blocks a one-row `add_rms_norm` of `dim` values spreads over through the
/// `norm_add_rmsnorm` kernel (the same bits), or None for the one-block `add_rmsnorm` kernel.
/// Measured on the H200: rows of 1025..=2048 values (two per thread at 1024
/// threads) gain from two blocks (Qwen3-30B-A3B decode +3%), 4096-value rows from none (one to
/// four blocks within 0.5%). `FUCINA_ADD_NORM_CHUNKS=N` overrides (0: the one-block kernel).
fn add_norm_chunks(dim: usize) -> Option<usize> {
    chunks_for(dim, crate::tuning::get().add_norm_chunks)
}

/// [`add_norm_chunks`] with the override `env`.
fn chunks_for(dim: usize, env: Option<usize>) -> Option<usize> {
    match env {
        Some(0) => None,
        Some(c) => Some(c),
        None => (1025..=2048).contains(&dim).then_some(2),
    }
}

impl CudaBackend {
    pub(super) fn add_rms_norm_impl(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(GpuTensor, GpuTensor)> {
        const OP: &str = "add_rms_norm";
        if h.rows != y.rows || h.cols != y.cols {
            return Err(shape(
                OP,
                format!("[{}, {}] vs [{}, {}]", h.rows, h.cols, y.rows, y.cols),
            ));
        }
        if dim == 0 || h.cols % dim != 0 {
            return Err(shape(OP, format!("{} columns in groups of {dim}", h.cols)));
        }
        let wp = norm_ptr(OP, &w, dim)?;
        let s = self.alloc_tensor(h.rows, h.cols)?;
        let n = self.alloc_tensor(h.rows, h.cols)?;
        if h.is_empty() {
            return Ok((s, n));
        }
        // a whole-row norm of one row feeds a GEMV: write its int8 side-car too
        let q8 = if dim == h.cols {
            self.q8_side(h.rows, h.cols)?
        } else {
            None
        };
        // many rows of a whole-row norm feed a prefill GEMM: write their bf16 copy too
        if h.rows >= PREFILL_MIN_ROWS && dim == h.cols {
            let e = self.kern_entry(Op::AddRmsNorm, Quant::F32, Entry::Bf16)?;
            let side = Bf16Side {
                buf: self.pool.alloc(h.len() * 2)?,
                len: h.len(),
            };
            self.dev.add_rms_norm_bf16_ptr(
                &e,
                h.ptr(),
                y.ptr(),
                s.ptr(),
                wp,
                n.ptr(),
                eps,
                dim,
                side.ptr(),
            )?;
            return Ok((s, n.with_bf16(Some(side))));
        }
        if let Some(chunks) = add_norm_chunks(dim).filter(|_| h.rows == 1 && dim == h.cols) {
            // one decode row: the chunked kernel (its blocks share the row's stores and
            // side-car; the same bits as add_rmsnorm, see norm_add_rmsnorm.cu.tera)
            let w = NormAddWeights {
                post: None,
                norm: wp,
            };
            return self.norm_add_launch((h, y), (s, n), w, 1.0, eps, dim, q8, Some(chunks));
        }
        let k = self.kern(Op::AddRmsNorm, Quant::F32, BatchBucket::Any)?;
        self.dev.add_rms_norm_ptr(
            &k,
            h.ptr(),
            y.ptr(),
            s.ptr(),
            wp,
            n.ptr(),
            eps,
            dim,
            q8.as_ref().map(Q8Side::ptrs),
        )?;
        Ok((s, n.with_q8(q8)))
    }

    /// `s = (h + rms_norm(y, post.norm)) * post.scale` and `rms_norm(s, w)` in one launch
    /// (`add_rms_norm` when `post` does nothing).
    pub(super) fn norm_add_rms_norm_impl(
        &self,
        h: &GpuTensor,
        y: &GpuTensor,
        post: &PostNorm<'_, GpuTensor>,
        w: Norm<'_, GpuTensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(GpuTensor, GpuTensor)> {
        const OP: &str = "norm_add_rms_norm";
        if post.norm.is_none() && post.scale.is_none() {
            return self.add_rms_norm_impl(h, y, w, eps, dim);
        }
        if h.rows != y.rows || h.cols != y.cols {
            return Err(shape(
                OP,
                format!("[{}, {}] vs [{}, {}]", h.rows, h.cols, y.rows, y.cols),
            ));
        }
        if dim == 0 || h.cols % dim != 0 {
            return Err(shape(OP, format!("{} columns in groups of {dim}", h.cols)));
        }
        let scale = post.scale.unwrap_or(1.0);
        if !scale.is_finite() {
            return Err(shape(OP, format!("scale {scale} is not finite")));
        }
        let weights = NormAddWeights {
            post: post
                .norm
                .as_ref()
                .map(|n| norm_ptr(OP, n, dim))
                .transpose()?,
            norm: norm_ptr(OP, &w, dim)?,
        };
        let s = self.alloc_tensor(h.rows, h.cols)?;
        let n = self.alloc_tensor(h.rows, h.cols)?;
        if h.is_empty() {
            return Ok((s, n));
        }
        // a whole-row norm of one row feeds a GEMV: write its int8 side-car too
        let q8 = if dim == h.cols {
            self.q8_side(h.rows, h.cols)?
        } else {
            None
        };
        self.norm_add_launch((h, y), (s, n), weights, scale, eps, dim, q8, None)
    }

    /// One `norm_add_rmsnorm` launch from `h` and `y` into the sum `s` and the normed `n`
    /// (carrying `q8`, its side-car, when given); `chunks` as `norm_add_rms_norm_ptr`.
    #[allow(clippy::too_many_arguments)]
    fn norm_add_launch(
        &self,
        (h, y): (&GpuTensor, &GpuTensor),
        (s, n): (GpuTensor, GpuTensor),
        weights: NormAddWeights,
        scale: f32,
        eps: f32,
        dim: usize,
        q8: Option<Q8Side>,
        chunks: Option<usize>,
    ) -> Result<(GpuTensor, GpuTensor)> {
        let k = self.kern(Op::NormAddRmsNorm, Quant::F32, BatchBucket::Any)?;
        self.dev.norm_add_rms_norm_ptr(
            &k,
            h.ptr(),
            y.ptr(),
            s.ptr(),
            weights,
            scale,
            n.ptr(),
            eps,
            dim,
            q8.as_ref().map(Q8Side::ptrs),
            chunks,
        )?;
        Ok((s, n.with_q8(q8)))
    }

    /// Whether the attn_prep kernel takes these inputs (an error where they do not fit each
    /// other or the cache; false where the kernel does not take the head or RoPE shape).
    pub(super) fn prep_fits(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        cache: &GpuKvCache,
        p: &AttnPrep<'_, GpuTensor>,
    ) -> Result<bool> {
        const OP: &str = "attn_prep";
        let r = p.rope;
        let hd = r.head_dim;
        if hd != cache.shape.head_dim || p.n_kv_heads != cache.shape.n_kv_heads {
            return Err(shape(
                OP,
                format!(
                    "{} KV heads x {hd} for a cache of {} x {}",
                    p.n_kv_heads, cache.shape.n_kv_heads, cache.shape.head_dim
                ),
            ));
        }
        let kvw = p.n_kv_heads * hd;
        if q.cols != p.n_heads * hd
            || k.cols != kvw
            || v.cols != kvw
            || k.rows != q.rows
            || v.rows != q.rows
        {
            return Err(shape(
                OP,
                format!(
                    "q [{}, {}] k [{}, {}] v [{}, {}] for {} / {} heads x {hd}",
                    q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, p.n_heads, p.n_kv_heads
                ),
            ));
        }
        let ff_ok = r
            .freq_factors
            .as_ref()
            .is_none_or(|f| f.len() >= r.rot_dims / 2);
        Ok(hd % 2 == 0
            && hd <= ATTN_PREP_MAX_HEAD_DIM
            && r.rot_dims % 2 == 0
            && r.rot_dims <= hd
            && r.freq_base_dims > 0
            && ff_ok)
    }

    /// attn_prep's launch and buffers for inputs [`Self::prep_fits`] took, rows at `pos`, the
    /// rotated q to `q_out`.
    pub(super) fn prep_parts(
        &self,
        (q, k, v): (&GpuTensor, &GpuTensor, &GpuTensor),
        cache: &GpuKvCache,
        p: &AttnPrep<'_, GpuTensor>,
        pos: DevPtr<i32>,
        q_out: DevPtr<f32>,
    ) -> Result<(AttnPrepLaunch, AttnPrepBufs)> {
        const OP: &str = "attn_prep";
        let r = p.rope;
        let hd = r.head_dim;
        let norm = |n: &Option<Norm<'_, GpuTensor>>| -> Result<Option<NormWeightPtr>> {
            n.as_ref().map(|n| norm_ptr(OP, n, hd)).transpose()
        };
        let (qn, kn, vn) = (norm(&p.q_norm)?, norm(&p.k_norm)?, norm(&p.v_norm)?);
        let ff = match &r.freq_factors {
            Some(f) => Some(self.freq_factors(f)?),
            None => None,
        };
        let (k_cache, v_cache, scales) = cache.memory()?;
        let launch = AttnPrepLaunch {
            rows: q.rows,
            n_heads: p.n_heads,
            rot_dims: r.rot_dims,
            freq_base_dims: r.freq_base_dims,
            layout: r.layout,
            theta: r.theta,
            eps: p.eps,
        };
        let bufs = AttnPrepBufs {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            pos,
            freq_factors: ff,
            q_norm: qn,
            k_norm: kn,
            v_norm: vn,
            q_out,
            k_cache,
            v_cache,
            scales,
            page0: None,
        };
        Ok((launch, bufs))
    }

    pub(super) fn attn_prep_impl(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        cache: &mut GpuKvCache,
        step: &StepOf<Self>,
        p: &AttnPrep<'_, GpuTensor>,
    ) -> Result<GpuTensor> {
        if !self.prep_fits(q, k, v, cache, p)? || q.rows == 0 {
            // shapes the kernel does not take: the plain ops (which report what is wrong)
            return attn_prep_composed(self, q, k, v, cache, step, p);
        }
        let hd = p.rope.head_dim;
        let seq = step.plan().seq_of("attn_prep", q.rows)?;
        let pos = step.dev().positions("attn_prep", q.rows)?;
        let q_out = self.alloc_tensor(q.rows, q.cols)?;
        let (launch, bufs) = self.prep_parts((q, k, v), cache, p, pos, q_out.ptr())?;
        let kern = self.kern(Op::AttnPrep, kv_quant(cache.kv_type), BatchBucket::Any)?;
        let layout = kv_layout(&cache.shape, cache.kv_type);
        // Many rows: one warp per (row, head), the same bytes as the main entry. Not the decode
        // step: there one warp's norm runs the 8 butterflies of the 256-thread block order in
        // series (measured on the H200, decode tok/s main -> warp entry: Qwen3-8B Q4_0 553.2 /
        // 555.7 -> 542.1 / 543.3, Gemma 4 12B 353.2 / 353.1 -> 349.3 / 349.4).
        match attn_prep_rows_suffix(hd).filter(|_| q.rows >= PREFILL_MIN_ROWS) {
            Some(sfx) => {
                let e = self.kern_entry(Op::AttnPrep, kv_quant(cache.kv_type), sfx)?;
                self.dev.attn_prep_rows_ptr(&e, &launch, &layout, &bufs)?;
            }
            None => self.dev.attn_prep_ptr(&kern, &launch, &layout, &bufs)?,
        }
        cache.len = cache.len.max(seq.pos0 + q.rows);
        Ok(q_out)
    }
}

#[cfg(test)]
mod tests {
    use super::chunks_for;

    #[test]
    fn add_norm_split_rule() {
        // Qwen3-30B-A3B's 2048-value rows take two blocks; Qwen3-8B's 4096 and small rows one
        assert_eq!(chunks_for(2048, None), Some(2));
        assert_eq!(chunks_for(1536, None), Some(2));
        assert_eq!(chunks_for(4096, None), None);
        assert_eq!(chunks_for(1024, None), None);
        // the override: 0 keeps the one-block kernel, N asks N blocks
        assert_eq!(chunks_for(2048, Some(0)), None);
        assert_eq!(chunks_for(4096, Some(3)), Some(3));
    }
}
