//! Launches of `attn_prep` (per-head q/k/v norms, RoPE, K/V into the paged cache) and its
//! multi-row entries `__rows<M>` for prefill, on raw device pointers, shapes validated against
//! their lengths (errors, never panics), the kernel signature stated at each launch.

use cudarc::driver::LaunchConfig;

use super::launch::kv_elem_bytes;
use super::launch::KvLayout;
use crate::backend::cuda::ops::elementwise::add_norm::norm_mode;
use crate::backend::cuda::ops::elementwise::launch::NormWeightPtr;
use crate::backend::cuda::ops::elementwise::rows::attn_prep_rows_suffix;
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::KernEntry;
use crate::backend::cuda::runtime::kern::{expect, grid, int, invalid, Kern};
use crate::backend::cuda::CudaDevice;
use crate::kernels::Op;
use crate::ops::RopeLayout;

/// Largest head dim `attn_prep` takes (its shared staging buffer).
pub const ATTN_PREP_MAX_HEAD_DIM: usize = 512;

/// The checks attn_prep's inputs share with the q|k|v GEMV that makes them (`qkv_prep.rs`):
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
    pub scales: super::launch::KvScales,
    /// Each row's first page in `k_cache` / `v_cache` (rows of several sequences whose caches
    /// are slots of one allocation) and the largest of them; None: page 0 for every row.
    pub page0: Option<RowPages>,
}

/// The first page of each row's cache ([`AttnPrepBufs::page0`]): i32 per row on the device,
/// and the largest value (host-known, for the bounds check).
#[derive(Debug, Clone, Copy)]
pub struct RowPages {
    pub pages: DevPtr<i32>,
    pub max: usize,
}
impl CudaDevice {
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
        if let Some(rp) = bufs.page0 {
            // every row's pages within the caches (and their scales)
            let pages = rp.max + layout.ring_pages;
            let page_bytes = layout.bytes() / layout.ring_pages.max(1);
            let page_rows = layout.rows() / layout.ring_pages.max(1);
            let fp8_short = layout.elem_bytes == 1
                && (bufs.scales.k.len() < pages * page_rows
                    || bufs.scales.v.len() < pages * page_rows);
            if rp.pages.len() < p.rows
                || bufs.k_cache.len() < pages * page_bytes
                || bufs.v_cache.len() < pages * page_bytes
                || fp8_short
            {
                return Err(invalid(
                    OP,
                    format!(
                        "{} rows' first pages (up to {}) past caches of {} bytes",
                        p.rows,
                        rp.max,
                        bufs.k_cache.len()
                    ),
                ));
            }
        }
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
        let page0 = bufs.page0.map_or(0, |r| r.pages.raw());
        // (const float* q, k, v, const int* pos, const float* freq_factors, const float* qw, kw,
        //  vw, int q_mode, k_mode, v_mode, float eps, float* q_out, kv_t* k_cache, v_cache,
        //  int n_heads, hkv, d, rot_dims, freq_base_dims, layout, float theta, int page_size,
        //  capacity, ring_pages, u16* k_scales, v_scales, const int* page0); sizes checked
        //  above, the caches hold `layout.bytes()` (ring_pages pages) past every row's first page
        //  and an FP8 cache's scales a value per row, and the kernel skips positions outside
        //  [0, capacity) and takes page indices modulo ring_pages.
        self.go(
            kn,
            cfg,
            &[
                &ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3], &ptrs[4], &ptrs[5], &ptrs[6], &ptrs[7],
                &qm, &km, &vm, &p.eps, &outs[0], &outs[1], &outs[2], &ints[0], &ints[1], &ints[2],
                &ints[3], &ints[4], &ints[5], &p.theta, &pg, &cap, &ring, &ik, &iv, &page0,
            ],
        )
    }
}
