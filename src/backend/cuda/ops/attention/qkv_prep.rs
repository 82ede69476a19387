//! Typed launch of the batch-1 q4_0r GEMV's `__qkvp` entry: one decode row's fused q|k|v
//! projection and attn_prep's work (q / k norms, RoPE, the K / V row into the cache) in one
//! launch on thread-block clusters, one cluster per head (lib/gemv_repacked).

use crate::kernels::Entry;
use cudarc::driver::LaunchConfig;

use super::launch::KvLayout;
use super::prep::{prep_factors, AttnPrepBufs, AttnPrepLaunch};
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::expect;
use crate::backend::cuda::runtime::kern::KernEntry;
use crate::backend::cuda::CudaDevice;
use crate::kernels::Op;
use crate::ops::RopeLayout;

/// Head dim the entry takes (its clusters own 128 rows).
pub const QKVP_HEAD_DIM: usize = 128;
/// Warps per block and blocks per cluster (ops' QP_W, QP_CL at 2 rows a warp).
const QKVP_WARPS: u32 = 8;
const QKVP_CLUSTER: u32 = 8;

/// One `__qkvp` launch: the fused weight (`(n_heads + 2 hkv) * 128` rows of `k`), the input
/// row's int8 side-car, and attn_prep's launch, buffers (their q / k / v are unused: the
/// projections stay on chip) and cache layout.
pub struct QkvPrepArgs<'a> {
    pub w: DevPtr<u8>,
    pub xq: DevPtr<i8>,
    pub xds: DevPtr<f32>,
    pub k: usize,
    pub n_kv_heads: usize,
    pub launch: &'a AttnPrepLaunch,
    pub bufs: &'a AttnPrepBufs,
    pub layout: &'a KvLayout,
}

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

impl CudaDevice {
    /// The rotated q of one row into `a.bufs.q_out` and its K / V rows into the cache at
    /// `a.bufs.pos[0]`, from `a.w` against the row's side-car.
    pub fn gemv_qkvp_ptr(&self, e: &KernEntry, a: &QkvPrepArgs<'_>) -> Result<(), CudaError> {
        const OP: &str = "gemv_qkvp";
        let (p, b, l) = (a.launch, a.bufs, a.layout);
        expect(&e.kern, &[Op::Gemv], OP)?;
        if e.entry() != Entry::Qkvp {
            return Err(invalid(
                OP,
                format!("{}__{} is not a __qkvp entry", e.spec().name, e.entry()),
            ));
        }
        let d = QKVP_HEAD_DIM;
        let heads = p.n_heads + 2 * a.n_kv_heads;
        let row = a.k / 32 * 18;
        if p.rows != 1
            || l.head_dim != d
            || l.hkv != a.n_kv_heads
            || a.k == 0
            || a.k % 256 != 0
            || a.w.raw() % 16 != 0
            || a.w.len() < heads * d * row
            || a.xq.len() < a.k
            || a.xds.len() < a.k / 16
            || b.q_out.len() < p.n_heads * d
            || b.pos.is_empty()
            || p.rot_dims % 2 != 0
            || p.rot_dims > d
            || p.freq_base_dims == 0
            || !(l.elem_bytes == 1 || l.elem_bytes == 2)
        {
            return Err(invalid(
                OP,
                format!(
                    "{} rows, {heads} heads x {d} of k {}, layout {l:?}, rot_dims {}",
                    p.rows, a.k, p.rot_dims
                ),
            ));
        }
        let [(qm, qw), (km, kw), (vm, vw)] = prep_factors(OP, p, b, d)?;
        let int = |what: &str, v: usize| {
            i32::try_from(v).map_err(|_| invalid(OP, format!("{what} {v} exceeds i32")))
        };
        let (k32, nh, hkv) = (
            int("k", a.k)?,
            int("heads", p.n_heads)?,
            int("hkv", a.n_kv_heads)?,
        );
        let (rot, fbd) = (
            int("rot_dims", p.rot_dims)?,
            int("freq_base_dims", p.freq_base_dims)?,
        );
        let (pg, cap, ring) = (
            int("page_size", l.page_size)?,
            int("capacity", l.capacity)?,
            int("ring_pages", l.ring_pages)?,
        );
        let layout: i32 = match p.layout {
            RopeLayout::Neox => 0,
            RopeLayout::Interleaved => 1,
        };
        let kv_f16 = i32::from(l.elem_bytes == 2);
        b.scales.check(OP, l)?;
        let (ksp, vsp) = b.scales.raw();
        let blocks = heads as u32 * QKVP_CLUSTER;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (32 * QKVP_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (wp, qp, dp, posp) = (a.w.raw(), a.xq.raw(), a.xds.raw(), b.pos.raw());
        let ff = b.freq_factors.map_or(0, |f| f.raw());
        let (qo, kc, vc) = (b.q_out.raw(), b.k_cache.raw(), b.v_cache.raw());
        // (const u8* w, const i8* xq, const float2* xds, int k, const int* pos,
        //  const float* freq_factors, const float* qw, kw, vw, int q_mode, k_mode, v_mode,
        //  float eps, float* q_out, u8* k_cache, u8* v_cache, int kv_f16, int n_heads, int hkv,
        //  int rot_dims, int freq_base_dims, int layout, float theta, int page_size,
        //  int capacity, int ring_pages, u16* k_scales, u16* v_scales); the grid is whole
        //  clusters (the entry's __cluster_dims__), shapes and buffers (an FP8 cache's scales
        //  too) checked above
        self.go(
            &e.kern,
            cfg,
            &[
                &wp, &qp, &dp, &k32, &posp, &ff, &qw, &kw, &vw, &qm, &km, &vm, &p.eps, &qo, &kc,
                &vc, &kv_f16, &nh, &hkv, &rot, &fbd, &layout, &p.theta, &pg, &cap, &ring, &ksp,
                &vsp,
            ],
        )
    }
}
