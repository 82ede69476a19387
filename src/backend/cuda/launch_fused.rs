//! Launches of the fused decode kernels: `add_rmsnorm` (residual add + RMSNorm of the sum, with
//! an optional int8 side-car), `norm_add_rmsnorm` (the same with an RMSNorm of the added branch
//! and a scale on the sum) and `attn_prep` (per-head q/k/v norms, RoPE, K/V into the paged
//! cache; its multi-row entries `__rows<M>` for prefill). Like `launch_ptr.rs`: raw device
//! pointers, shapes validated against their lengths
//! (errors, never panics), the kernel signature stated at each launch.

use crate::kernels::Entry;
use cudarc::driver::LaunchConfig;

use super::buf::DevPtr;
use super::error::CudaError;
use super::launch_attn::kv_elem_bytes;
use super::launch_attn::KvLayout;
use super::launch_prefill::{attn_prep_rows_suffix, KernEntry};
use super::launch_ptr::{expect, grid, int, invalid, q8_args, Kern, NormWeightPtr};
use super::types::Q8Ptrs;
use super::CudaDevice;
use crate::kernels::Op;
use crate::ops::RopeLayout;

/// Largest head dim `attn_prep` takes (its shared staging buffer).
pub const ATTN_PREP_MAX_HEAD_DIM: usize = 512;

/// The kernels' `(mode, w)` of an optional norm: -1 none, 0 plain, 1 one-plus, 2 weightless.
fn norm_mode(
    op: &'static str,
    n: Option<NormWeightPtr>,
    dim: usize,
) -> Result<(i32, u64), CudaError> {
    let (mode, w) = match n {
        None => return Ok((-1, 0)),
        Some(NormWeightPtr::None) => return Ok((2, 0)),
        Some(NormWeightPtr::Plain(w)) => (0, w),
        Some(NormWeightPtr::OnePlus(w)) => (1, w),
    };
    if w.len() != dim {
        return Err(invalid(
            op,
            format!("norm weight of {} values for groups of {dim}", w.len()),
        ));
    }
    Ok((mode, w.raw()))
}

/// The checks attn_prep's inputs share with the q|k|v GEMV that makes them (`launch_qkvp`):
/// enough RoPE frequency divisors; then the `(mode, pointer)` arguments
/// of the q, k and v norms (weights of `d` values).
pub(crate) fn prep_factors(
    op: &'static str,
    p: &AttnPrepLaunch,
    bufs: &AttnPrepBufs,
    d: usize,
) -> Result<[(i32, u64); 3], CudaError> {
    if bufs.freq_factors.is_some_and(|f| f.len() < p.rot_dims / 2) {
        return Err(invalid(
            op,
            format!("fewer than {} freq factors", p.rot_dims / 2),
        ));
    }
    Ok([
        norm_mode(op, bufs.q_norm, d)?,
        norm_mode(op, bufs.k_norm, d)?,
        norm_mode(op, bufs.v_norm, d)?,
    ])
}

/// The kernel arguments `(mode, pointer)` of a norm weight (0 plain, 1 one-plus, 2 none),
/// checked to hold `dim` values.
pub(crate) fn norm_mode_ptr(
    op: &'static str,
    n: NormWeightPtr,
    dim: usize,
) -> Result<(i32, u64), CudaError> {
    norm_mode(op, Some(n), dim)
}

/// The weights of a `norm_add_rmsnorm` launch: the norm of the branch output (None: no norm)
/// and the norm of the sum.
#[derive(Debug, Clone, Copy)]
pub struct NormAddWeights {
    pub post: Option<NormWeightPtr>,
    pub norm: NormWeightPtr,
}

/// Blocks per group of a `norm_add_rmsnorm` launch of `groups` groups of `dim` values at
/// `threads` threads: one group (a decode row) held in registers is split over one block per
/// `threads` values (each block stores its share; see the template), anything else takes one
/// block per group. `FUCINA_NORM_ADD_SPLIT=0` keeps one block per group (to measure the split;
/// the results are the same bits either way).
pub fn norm_add_chunks(groups: usize, dim: usize, threads: usize) -> usize {
    const REG: usize = 4; // the template's REG
    let t = crate::tuning::get();
    // FUCINA_NORM_ADD_CHUNKS=N: at most N blocks (to measure the split's width)
    let (split, max) = (t.norm_add_split, t.norm_add_chunks.unwrap_or(REG).max(1));
    let per = dim.div_ceil(threads.max(1));
    if split && groups == 1 && (2..=REG).contains(&per) {
        per.min(max)
    } else {
        1
    }
}

/// Shape and parameters of one `attn_prep` launch.
#[derive(Debug, Clone, Copy)]
pub struct AttnPrepLaunch {
    pub rows: usize,
    pub n_heads: usize,
    pub rot_dims: usize,
    pub freq_base_dims: usize,
    pub layout: RopeLayout,
    pub theta: f32,
    pub eps: f32,
}

/// The buffers of one `attn_prep` launch.
#[derive(Debug, Clone, Copy)]
pub struct AttnPrepBufs {
    /// f32 `[rows, n_heads * d]`, `[rows, hkv * d]`, `[rows, hkv * d]`.
    pub q: DevPtr<f32>,
    pub k: DevPtr<f32>,
    pub v: DevPtr<f32>,
    /// Position of each row (device memory).
    pub pos: DevPtr<i32>,
    /// `rot_dims / 2` RoPE frequency divisors, or None.
    pub freq_factors: Option<DevPtr<f32>>,
    /// Per-head norms (weights of `d` values); None: no norm.
    pub q_norm: Option<NormWeightPtr>,
    pub k_norm: Option<NormWeightPtr>,
    pub v_norm: Option<NormWeightPtr>,
    /// The rotated q, f32 `[rows, n_heads * d]`.
    pub q_out: DevPtr<f32>,
    pub k_cache: DevPtr<u8>,
    pub v_cache: DevPtr<u8>,
    /// An FP8 cache's row scales (written with the rows), null for f16.
    pub scales: super::launch_attn::KvScales,
}

/// The common length of the four buffers `a`, `b`, `s`, `y` of an add + norm launch, when it is
/// a nonzero whole number of `dim`-value groups.
fn same_groups(op: &'static str, [a, b, s, y]: [usize; 4], dim: usize) -> Result<usize, CudaError> {
    if dim == 0 || a == 0 || a % dim != 0 || b != a || s != a || y != a {
        return Err(invalid(
            op,
            format!("a {a} / b {b} / s {s} / y {y} not groups of {dim}"),
        ));
    }
    Ok(a)
}

impl CudaDevice {
    /// `s = a + b`, `y = rms_norm(s)` over groups of `dim` values (all four the same length),
    /// plus the int8 side-car of `y` when `q8` is given (`dim % 32 == 0`).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm_ptr(
        &self,
        k: &Kern,
        a: DevPtr<f32>,
        b: DevPtr<f32>,
        s: DevPtr<f32>,
        w: NormWeightPtr,
        y: DevPtr<f32>,
        eps: f32,
        dim: usize,
        q8: Option<Q8Ptrs>,
    ) -> Result<(), CudaError> {
        self.add_rms_norm_go(k, a, b, s, w, y, eps, dim, q8, None)
    }

    /// [`Self::add_rms_norm_ptr`] without a side-car but writing `y16`, the bf16 copy of `y`
    /// (`y.len()` values; the `add_rmsnorm__bf16` entry `e`), for a prefill GEMM to read.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm_bf16_ptr(
        &self,
        e: &KernEntry,
        a: DevPtr<f32>,
        b: DevPtr<f32>,
        s: DevPtr<f32>,
        w: NormWeightPtr,
        y: DevPtr<f32>,
        eps: f32,
        dim: usize,
        y16: DevPtr<u16>,
    ) -> Result<(), CudaError> {
        if e.entry != Entry::Bf16 {
            return Err(invalid("add_rms_norm bf16", format!("entry __{}", e.entry)));
        }
        self.add_rms_norm_go(&e.kern, a, b, s, w, y, eps, dim, None, Some(y16))
    }

    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm_go(
        &self,
        k: &Kern,
        a: DevPtr<f32>,
        b: DevPtr<f32>,
        s: DevPtr<f32>,
        w: NormWeightPtr,
        y: DevPtr<f32>,
        eps: f32,
        dim: usize,
        q8: Option<Q8Ptrs>,
        y16: Option<DevPtr<u16>>,
    ) -> Result<(), CudaError> {
        const OP: &str = "add_rms_norm";
        expect(k, &[Op::AddRmsNorm], OP)?;
        let n = same_groups(OP, [a.len(), b.len(), s.len(), y.len()], dim)?;
        let (mode, wp) = norm_mode(OP, Some(w), dim)?;
        let (qp, dp) = q8_args(OP, q8, n, dim)?;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, n / dim)?, 1, 1),
            block_dim: (super::launch::norm_block_threads(k.spec, dim), 1, 1),
            shared_mem_bytes: 0,
        };
        let (ap, bp, sp, yp, d) = (a.raw(), b.raw(), s.raw(), y.raw(), int(OP, "dim", dim)?);
        match y16 {
            // (const float* a, const float* b, float* s, const float* w, float* y, int dim,
            //  int mode, float eps, signed char* xq, float2* xds)
            None => self.go(
                k,
                cfg,
                &[&ap, &bp, &sp, &wp, &yp, &d, &mode, &eps, &qp, &dp],
            ),
            // __bf16: (..., float eps, uint16_t* y16); y16 holds n values
            Some(o) => {
                if o.len() < n {
                    return Err(invalid(OP, format!("bf16 copy of {} for {n}", o.len())));
                }
                let op = o.raw();
                self.go(k, cfg, &[&ap, &bp, &sp, &wp, &yp, &d, &mode, &eps, &op])
            }
        }
    }

    /// `s = (a + rms_norm(b, w.post)) * scale`, `y = rms_norm(s, w.norm)` over groups of `dim`
    /// values (all four the same length, none aliasing another), plus the int8 side-car of `y`
    /// when `q8` is given (`dim % 32 == 0`).
    #[allow(clippy::too_many_arguments)]
    pub fn norm_add_rms_norm_ptr(
        &self,
        k: &Kern,
        a: DevPtr<f32>,
        b: DevPtr<f32>,
        s: DevPtr<f32>,
        w: NormAddWeights,
        scale: f32,
        y: DevPtr<f32>,
        eps: f32,
        dim: usize,
        q8: Option<Q8Ptrs>,
        chunks: Option<usize>,
    ) -> Result<(), CudaError> {
        const OP: &str = "norm_add_rms_norm";
        expect(k, &[Op::NormAddRmsNorm], OP)?;
        let n = same_groups(OP, [a.len(), b.len(), s.len(), y.len()], dim)?;
        // every buffer holds n floats: two overlap when their starts are closer than that
        let span = |p: DevPtr<f32>| (p.raw(), p.raw() + 4 * n as u64);
        let overlap = |p: DevPtr<f32>, q: DevPtr<f32>| {
            let ((p0, p1), (q0, q1)) = (span(p), span(q));
            p0 < q1 && q0 < p1
        };
        if [a, b, y].into_iter().any(|o| overlap(s, o)) || overlap(y, a) || overlap(y, b) {
            return Err(invalid(OP, "an output overlaps another buffer".into()));
        }
        let (outs, ins) = ([s.raw(), y.raw()], [a.raw(), b.raw()]);
        if !scale.is_finite() {
            return Err(invalid(OP, format!("scale {scale}")));
        }
        let (bmode, bw) = norm_mode(OP, w.post, dim)?;
        let (mode, wp) = norm_mode(OP, Some(w.norm), dim)?;
        let (qp, dp) = q8_args(OP, q8, n, dim)?;
        // rmsnorm's block size for this dim: the same reduction order, the same bits
        let threads = super::launch::norm_block_threads(k.spec, dim);
        // chunks: the caller's (at most the values per thread: each chunk stores whole rows of
        // blockDim.x values), else the default split
        let per = dim.div_ceil(threads as usize);
        let chunks = match chunks {
            Some(c) if n == dim => c.clamp(1, per.clamp(1, 4)),
            _ => norm_add_chunks(n / dim, dim, threads as usize),
        };
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, n / dim)?, grid(OP, chunks)?, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let d = int(OP, "dim", dim)?;
        // (const float* a, const float* b, float* s, const float* wb, int b_mode, float scale,
        //  const float* w, int mode, float* y, int dim, float eps, signed char* xq,
        //  float2* xds); lengths checked above, chunks <= 4 (grid y)
        self.go(
            k,
            cfg,
            &[
                &ins[0], &ins[1], &outs[0], &bw, &bmode, &scale, &wp, &mode, &outs[1], &d, &eps,
                &qp, &dp,
            ],
        )
    }

    /// Per-head norms of q / k / v, RoPE of q and k at `pos`, q to `q_out`, k and v into the
    /// paged cache of `layout` (the instance's quant is the cache type) exactly as `kv_write`
    /// stores them; rows at positions outside `[0, capacity)` write no K/V.
    pub fn attn_prep_ptr(
        &self,
        kn: &Kern,
        p: &AttnPrepLaunch,
        layout: &KvLayout,
        bufs: &AttnPrepBufs,
    ) -> Result<(), CudaError> {
        self.attn_prep_go(kn, false, p, layout, bufs)
    }

    /// [`Self::attn_prep_ptr`] through the multi-row entry `attn_prep__rows<M>` (one warp per
    /// (row, head), each row's RoPE angles once per block; `e` from
    /// [`attn_prep_rows_suffix`] of the head dim): the same outputs bit for bit.
    pub fn attn_prep_rows_ptr(
        &self,
        e: &KernEntry,
        p: &AttnPrepLaunch,
        layout: &KvLayout,
        bufs: &AttnPrepBufs,
    ) -> Result<(), CudaError> {
        if attn_prep_rows_suffix(layout.head_dim) != Some(e.entry) {
            return Err(invalid(
                "attn_prep rows",
                format!("entry __{} for head dim {}", e.entry, layout.head_dim),
            ));
        }
        self.attn_prep_go(&e.kern, true, p, layout, bufs)
    }

    /// `kn`: the main entry (`rows_entry` false) or a `__rows<M>` entry of an attn_prep
    /// instance; the same arguments, different grids.
    fn attn_prep_go(
        &self,
        kn: &Kern,
        rows_entry: bool,
        p: &AttnPrepLaunch,
        layout: &KvLayout,
        bufs: &AttnPrepBufs,
    ) -> Result<(), CudaError> {
        const OP: &str = "attn_prep";
        expect(kn, &[Op::AttnPrep], OP)?;
        let kvb = kv_elem_bytes(kn.spec.key.quant)
            .ok_or_else(|| invalid(OP, format!("no cache layout for {}", kn.spec.key.quant)))?;
        if kvb != layout.elem_bytes {
            return Err(invalid(
                OP,
                format!(
                    "{} into a cache of {}-byte elements",
                    kn.spec.name, layout.elem_bytes
                ),
            ));
        }
        layout.check(OP, bufs.k_cache, bufs.v_cache)?;
        let d = layout.head_dim;
        let (qw, kvw) = (p.n_heads * d, layout.hkv * d);
        if p.n_heads == 0
            || d % 2 != 0
            || d > ATTN_PREP_MAX_HEAD_DIM
            || p.rot_dims % 2 != 0
            || p.rot_dims > d
            || p.freq_base_dims == 0
        {
            return Err(invalid(
                OP,
                format!("{} heads x {d}, rot_dims {}", p.n_heads, p.rot_dims),
            ));
        }
        if p.rows == 0 {
            return Ok(());
        }
        if bufs.q.len() < p.rows * qw
            || bufs.q_out.len() < p.rows * qw
            || bufs.k.len() < p.rows * kvw
            || bufs.v.len() < p.rows * kvw
            || bufs.pos.len() < p.rows
        {
            return Err(invalid(
                OP,
                format!(
                    "{} rows of {qw} / {kvw}: q {} q_out {} k {} v {} pos {}",
                    p.rows,
                    bufs.q.len(),
                    bufs.q_out.len(),
                    bufs.k.len(),
                    bufs.v.len(),
                    bufs.pos.len()
                ),
            ));
        }
        let [(qm, qwp), (km, kwp), (vm, vwp)] = prep_factors(OP, p, bufs, d)?;
        let heads = p.n_heads + layout.hkv;
        if heads > 65535 {
            return Err(invalid(OP, format!("{heads} heads exceed the grid's y")));
        }
        let cfg = if rows_entry {
            // one warp per task (q heads, K heads, V heads), 8 per 256-thread block
            LaunchConfig {
                grid_dim: (
                    grid(OP, p.rows)?,
                    (p.n_heads + 2 * layout.hkv).div_ceil(8) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            }
        } else {
            LaunchConfig {
                grid_dim: (grid(OP, p.rows)?, heads as u32, 1),
                block_dim: (kn.spec.param_u32("threads").unwrap_or(256), 1, 1),
                shared_mem_bytes: 0,
            }
        };
        let ints = [
            int(OP, "n_heads", p.n_heads)?,
            int(OP, "hkv", layout.hkv)?,
            int(OP, "head_dim", d)?,
            int(OP, "rot_dims", p.rot_dims)?,
            int(OP, "freq_base_dims", p.freq_base_dims)?,
            match p.layout {
                RopeLayout::Neox => 0,
                RopeLayout::Interleaved => 1,
            },
        ];
        let (pg, cap, ring) = (
            int(OP, "page_size", layout.page_size)?,
            int(OP, "capacity", layout.capacity)?,
            int(OP, "ring_pages", layout.ring_pages)?,
        );
        bufs.scales.check(OP, layout)?;
        let (ik, iv) = bufs.scales.raw();
        let ptrs = [
            bufs.q.raw(),
            bufs.k.raw(),
            bufs.v.raw(),
            bufs.pos.raw(),
            bufs.freq_factors.map_or(0, |f| f.raw()),
            qwp,
            kwp,
            vwp,
        ];
        let outs = [bufs.q_out.raw(), bufs.k_cache.raw(), bufs.v_cache.raw()];
        // (const float* q, k, v, const int* pos, const float* freq_factors, const float* qw, kw,
        //  vw, int q_mode, k_mode, v_mode, float eps, float* q_out, kv_t* k_cache, v_cache,
        //  int n_heads, hkv, d, rot_dims, freq_base_dims, layout, float theta, int page_size,
        //  capacity, ring_pages, u16* k_scales, v_scales); sizes checked above, the caches hold
        //  `layout.bytes()` (ring_pages pages) and an FP8 cache's scales a value per row, and the
        //  kernel skips positions outside [0, capacity) and takes page indices modulo ring_pages.
        self.go(
            kn,
            cfg,
            &[
                &ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3], &ptrs[4], &ptrs[5], &ptrs[6], &ptrs[7],
                &qm, &km, &vm, &p.eps, &outs[0], &outs[1], &outs[2], &ints[0], &ints[1], &ints[2],
                &ints[3], &ints[4], &ints[5], &p.theta, &pg, &cap, &ring, &ik, &iv,
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn add_norm_buffers_are_whole_equal_groups() {
        use super::same_groups;
        assert_eq!(same_groups("t", [8, 8, 8, 8], 4).unwrap(), 8);
        assert!(same_groups("t", [8, 8, 8, 8], 0).is_err());
        assert!(same_groups("t", [0, 0, 0, 0], 4).is_err());
        assert!(same_groups("t", [8, 8, 8, 8], 3).is_err());
        for i in 0..4 {
            let mut v = [8; 4];
            v[i] = 12;
            assert!(same_groups("t", v, 4).is_err(), "{v:?}");
        }
    }

    use super::norm_add_chunks;

    #[test]
    fn one_decode_row_in_registers_is_split() {
        if !crate::tuning::get().norm_add_split {
            return; // split turned off for this process
        }
        // Gemma 4 12B hidden at 1024 threads: 4 blocks of 1024 values; Gemma 3 1B: 2
        assert_eq!(norm_add_chunks(1, 3840, 1024), 4);
        assert_eq!(norm_add_chunks(1, 1152, 1024), 2);
        // one block's worth, the loop path (past 4 x 1024), several groups: not split
        assert_eq!(norm_add_chunks(1, 256, 256), 1);
        assert_eq!(norm_add_chunks(1, 1024, 1024), 1);
        assert_eq!(norm_add_chunks(1, 5376, 1024), 1);
        assert_eq!(norm_add_chunks(7, 3840, 1024), 1);
        assert_eq!(norm_add_chunks(16, 128, 256), 1);
    }
}
