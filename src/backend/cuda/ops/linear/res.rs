//! Typed launches of the deferred-norm GEMV entries of the batch-1 repacked GEMV
//! (`lib/gemv_repacked`): `__res` (the producer: a projection, the residual add, the next norm's
//! weight applied and quantised, and the sum of squares in partial sums) and `__rs` (a
//! consumer: the main entry scaling its dots by that norm's rstd). The `__glu` entry takes the
//! same [`RsArgs`] (`gemv_glu_ptr`). Shapes are validated against the buffers (errors, never
//! panics).

use crate::kernels::Entry;
use cudarc::driver::LaunchConfig;

use super::launch::gemv_default_grid;
use crate::backend::cuda::ops::elementwise::launch::NormWeightPtr;
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::KernEntry;
use crate::backend::cuda::runtime::kern::{expect, int, invalid};
use crate::backend::cuda::CudaDevice;
use crate::kernels::{KernelSpec, Op, Quant};

/// A norm handed over deferred: the partial sums of squares its `__res` launch wrote (one per
/// 32 values of the row) and its eps.
#[derive(Debug, Clone, Copy)]
pub struct RsArgs {
    pub part: DevPtr<f32>,
    pub eps: f32,
}

impl RsArgs {
    /// The row length the partial sums cover.
    pub fn dim(&self) -> usize {
        32 * self.part.len()
    }
}

/// Pointers of one [`CudaDevice::gemv_res_ptr`] launch: `w` `[n, k]` repacked, the input's int8
/// side-car, the residual `hres` and the sum `s` (`[n]`), the norm weight, and the deferred norm
/// (`zq` / `zds`: the int8 side-car of s times the weight; `part`: n / 32 sums of squares).
pub struct GemvResArgs {
    pub w: DevPtr<u8>,
    pub xq: DevPtr<i8>,
    pub xds: DevPtr<f32>,
    pub hres: DevPtr<f32>,
    pub s: DevPtr<f32>,
    pub norm: NormWeightPtr,
    pub zq: DevPtr<i8>,
    pub zds: DevPtr<f32>,
    pub part: DevPtr<f32>,
    pub n: usize,
    pub k: usize,
}

/// Most warps a block of `spec`'s `__res` entry takes (`RES_THREADS`): 24 at 2 rows a warp
/// step, 16 at 4.
pub fn res_max_warps(spec: &KernelSpec) -> u32 {
    if spec.param_u32("rows").unwrap_or(1) <= 2 {
        24
    } else {
        16
    }
}

/// Warps per block of a `__res` launch of `spec` (32 rows a block): 24 at R = 2 (16 row steps
/// times the row's load batches, one task each: Qwen3-8B Q8_0 decode with the norm deferred
/// after its down projections ran 377.5 tok/s at 16 warps, 396.3 at 24, on the H200, session
/// 24), 16 at R = 4 (8 steps over 2 warps each, the k range split; q4_kr's 97 and q6_kr's 125
/// registers a thread leave no room for more: held to 80 registers for 24 warps, they spilled and
/// ran Qwen3-8B Q4_K_M 5% slower).
/// `FUCINA_RES_WARPS=N` (1 up to [`res_max_warps`]) overrides it, for tuning.
pub fn res_warps(spec: &KernelSpec) -> u32 {
    crate::tuning::get()
        .res_warps
        .filter(|w| (1..=res_max_warps(spec)).contains(w))
        .unwrap_or(res_max_warps(spec))
}

/// Warp tasks of a `__res` block of `spec` over rows of `k` in `res_body`'s task form (at most
/// 2 rows a warp step): its 32 / R row steps times the row's load batches (at most 16). None
/// for 4 rows a step, whose extra warps split k instead.
pub fn res_tasks(spec: &KernelSpec, k: usize) -> Option<u32> {
    let r = spec.param_u32("rows").unwrap_or(1).max(1);
    if r > 2 {
        return None;
    }
    let unroll = spec.param_u32("unroll").unwrap_or(1).max(1) as usize;
    // rows_dot's load units per row: 32-value blocks (q4_0r, q8_0r), 16-byte words (q4_kr:
    // 8 per 256 values), 64-value units (q6_kr: 4 per 256)
    let units = match spec.key.quant {
        Quant::Q4_0R | Quant::Q8_0R => k / 32,
        Quant::Q4KR => k / 256 * 8,
        _ => k / 256 * 4,
    };
    let batches = units.div_ceil(32 * unroll).clamp(1, 16) as u32;
    Some(32 / r * batches)
}

/// Warps of a `__res` launch of `spec` over rows of `k`: [`res_warps`], but no more than the
/// block has tasks ([`res_tasks`]). A warp without a task would still hold its registers, and
/// 24 warps of q4_0r's take nearly all of an SM's, so the block could only start on an empty
/// SM (Qwen3-8B's o projection: 16 tasks). `FUCINA_RES_TASK_WARPS=0` launches [`res_warps`]
/// whatever the tasks (for A/B runs).
pub fn res_launch_warps(spec: &KernelSpec, k: usize) -> u32 {
    let on = crate::tuning::get().res_task_warps;
    let w = res_warps(spec);
    match res_tasks(spec, k) {
        Some(t) if on => w.min(t),
        _ => w,
    }
}

/// Blocks of a q4_kr `__rsqv` / `__rsqvw` launch (`spec`: the q4_kr instance) over `n6` Q6_K
/// rows then `n` Q4_K rows, R-row steps of 4 warps each.
pub fn rsqv_blocks(spec: &KernelSpec, n6: usize, n: usize) -> usize {
    let step = 4 * spec.param_u32("rows").unwrap_or(1).max(1) as usize;
    n6.div_ceil(step) + n.div_ceil(step)
}

/// The consumer entry of a deferred norm for `rows` rows of a batch-1 `spec` on `sms`
/// multiprocessors: `__rs`, or q6_kr's `__rs2` (2 rows a warp step) where `__rs` at the
/// instance's rows would give fewer blocks than a third of the multiprocessors. Measured on the
/// H200 (two runs each): Qwen3-30B-A3B, whose 512-row V projections give 32 blocks
/// at 4 rows a step, 499.1 tok/s without `__rs2` and 501.9 with it; Qwen3-8B Q4_K_M (1024-row V,
/// 64 blocks) 494.4 and 493.1 with `__rs2` there too. Leaving the 8B's to `__rs` (the third)
/// measured within noise of that (493.7 against 493.4, three runs each).
pub fn rs_suffix(spec: &KernelSpec, rows: usize, sms: u32) -> Entry {
    let r = spec.param_u32("rows").unwrap_or(1).max(1) as usize;
    if spec.key.quant == Quant::Q6KR && r > 2 && 3 * rows.div_ceil(4 * r) < sms as usize {
        Entry::Rs2
    } else {
        Entry::Rs
    }
}

/// Whether `e` is the `suffix` entry of a batch-1 repacked GEMV whose rows of `k` it takes, and
/// `w` holds `rows` of them, 16-byte aligned.
fn check_weights(
    op: &'static str,
    e: &KernEntry,
    suffix: Entry,
    w: DevPtr<u8>,
    (rows, k): (usize, usize),
) -> Result<(), CudaError> {
    let spec = e.spec();
    expect(&e.kern, &[Op::Gemv], op)?;
    if e.entry() != suffix || spec.key.batch.value() != Some(1) {
        return Err(invalid(
            op,
            format!(
                "{}__{} is not a batch-1 __{suffix} entry",
                spec.name,
                e.entry()
            ),
        ));
    }
    let q = spec.key.quant;
    let (_, split) = crate::quant::repack::source_of(q)
        .ok_or_else(|| invalid(op, format!("{q} has no __{suffix} entry")))?;
    if rows == 0 || !split.fits(k) || w.raw() % 16 != 0 {
        return Err(invalid(
            op,
            format!(
                "{rows} rows of {k} for {q}: need whole 256-element rows, 16-byte aligned weights"
            ),
        ));
    }
    let row = k / split.elems * (split.head + split.body);
    if w.len() < rows * row {
        return Err(invalid(
            op,
            format!("{} weight bytes for {rows} rows of {k}", w.len()),
        ));
    }
    Ok(())
}

impl CudaDevice {
    /// `s = hres + x w^T` and the deferred RMSNorm of s (its weight applied, quantised to int8
    /// per 32, the sums of squares per 32) through the `__res` entry: n / 32 blocks of `warps`
    /// warps.
    pub fn gemv_res_ptr(
        &self,
        e: &KernEntry,
        a: &GemvResArgs,
        warps: u32,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemv_res";
        let (n, k) = (a.n, a.k);
        check_weights(OP, e, Entry::Res, a.w, (n, k))?;
        if n % 32 != 0 || !(1..=res_max_warps(e.kern.spec)).contains(&warps) {
            return Err(invalid(
                OP,
                format!("n={n} (need n % 32 == 0), {warps} warps"),
            ));
        }
        let (mode, nw) = match a.norm {
            NormWeightPtr::Plain(w) => (0i32, w),
            NormWeightPtr::OnePlus(w) => (1, w),
            NormWeightPtr::None => (2, DevPtr::null()),
        };
        if a.xq.len() < k
            || a.xds.len() < k / 16
            || a.hres.len() < n
            || a.s.len() < n
            || (mode != 2 && nw.len() != n)
            || a.zq.len() < n
            || a.zds.len() < n / 16
            || a.part.len() < n / 32
        {
            return Err(invalid(OP, format!("buffers too small for n={n} k={k}")));
        }
        let cfg = LaunchConfig {
            grid_dim: ((n / 32) as u32, 1, 1),
            block_dim: (32 * warps, 1, 1),
            shared_mem_bytes: 0,
        };
        let (n32, k32) = (int(OP, "n", n)?, int(OP, "k", k)?);
        let (wp, qp, dp) = (a.w.raw(), a.xq.raw(), a.xds.raw());
        let (hp, sp, nwp) = (a.hres.raw(), a.s.raw(), nw.raw());
        let (zqp, zdp, pp) = (a.zq.raw(), a.zds.raw(), a.part.raw());
        // (const u8* w, const i8* xq, const float2* xds, const float* hres, float* s,
        //  const float* nw, int nmode, i8* zq, float2* zds, float* part, int n, int k)
        self.go(
            &e.kern,
            cfg,
            &[
                &wp, &qp, &dp, &hp, &sp, &nwp, &mode, &zqp, &zdp, &pp, &n32, &k32,
            ],
        )
    }

    /// `y = rstd * (z w^T)` through the `__rs` entry: a GEMV over a deferred norm's int8
    /// side-car (`xq` / `xds`), scaled by its rstd; the main entry's grid (`__rs2`, q6_kr's
    /// 2-row form: one 2-row step a warp).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_rs_ptr(
        &self,
        e: &KernEntry,
        w: DevPtr<u8>,
        (xq, xds): (DevPtr<i8>, DevPtr<f32>),
        y: DevPtr<f32>,
        (n, k): (usize, usize),
        rs: &RsArgs,
        sms: u32,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemv_rs";
        // `__rs2` (q6_kr): one 2-row step a warp whatever the instance's rows
        let (suffix, grid) = match e.entry() {
            Entry::Rs2 => (Entry::Rs2, n.div_ceil(8).min(u32::MAX as usize) as u32),
            s => (
                if s == Entry::Rsw {
                    Entry::Rsw
                } else {
                    Entry::Rs
                },
                gemv_default_grid(e.spec(), n, sms),
            ),
        };
        check_weights(OP, e, suffix, w, (n, k))?;
        if xq.len() < k || xds.len() < k / 16 || y.len() < n || rs.dim() != k {
            return Err(invalid(
                OP,
                format!(
                    "n={n} k={k}: activations {} / outputs {} / a norm of {} values",
                    xq.len(),
                    y.len(),
                    rs.dim()
                ),
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.max(1), 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (n32, k32) = (int(OP, "n", n)?, int(OP, "k", k)?);
        let parts = int(OP, "partial sums", rs.part.len())?;
        let (wp, qp, dp, yp, pp) = (w.raw(), xq.raw(), xds.raw(), y.raw(), rs.part.raw());
        // (const u8* w, const i8* xq, const float2* xds, float* y, int n, int k,
        //  const float* rs_part, int rs_n, float eps)
        self.go(
            &e.kern,
            cfg,
            &[&wp, &qp, &dp, &yp, &n32, &k32, &pp, &parts, &rs.eps],
        )
    }
}

/// One weight of a [`CudaDevice::gemv_rsqv_ptr`] launch: repacked rows and their outputs.
#[derive(Debug, Clone, Copy)]
pub struct RsPart {
    pub w: DevPtr<u8>,
    pub y: DevPtr<f32>,
    pub n: usize,
}

impl CudaDevice {
    /// `__rs` of a Q6_K-repacked weight `v6` and the q4_kr weight `v` of `e`'s instance (its
    /// `__rsqv` entry) in one launch, both over the deferred norm `rs` of the int8 row
    /// `(xq, xds)` of `k` values: the v and q|k projections of a Q4_K_M layer.
    pub fn gemv_rsqv_ptr(
        &self,
        e: &KernEntry,
        v6: RsPart,
        v: RsPart,
        (xq, xds): (DevPtr<i8>, DevPtr<f32>),
        k: usize,
        rs: &RsArgs,
    ) -> Result<(), CudaError> {
        const OP: &str = "gemv_rsqv";
        let suffix = if e.entry() == Entry::Rsqvw {
            Entry::Rsqvw
        } else {
            Entry::Rsqv
        };
        check_weights(OP, e, suffix, v.w, (v.n, k))?;
        let (_, s6) = crate::quant::repack::source_of(Quant::Q6KR)
            .ok_or_else(|| invalid(OP, "no Q6_K repacking".into()))?;
        let row6 = k / s6.elems * (s6.head + s6.body);
        if v6.n == 0 || !s6.fits(k) || v6.w.raw() % 16 != 0 || v6.w.len() < v6.n * row6 {
            return Err(invalid(
                OP,
                format!("{} Q6_K rows of {k} in {} bytes", v6.n, v6.w.len()),
            ));
        }
        if xq.len() < k
            || xds.len() < k / 16
            || v.y.len() < v.n
            || v6.y.len() < v6.n
            || rs.dim() != k
        {
            return Err(invalid(
                OP,
                format!(
                    "k={k}: activations {}, outputs {} / {} for {} / {} rows, a norm of {} values",
                    xq.len(),
                    v6.y.len(),
                    v.y.len(),
                    v6.n,
                    v.n,
                    rs.dim()
                ),
            ));
        }
        let blocks = rsqv_blocks(e.spec(), v6.n, v.n);
        let cfg = LaunchConfig {
            grid_dim: (int(OP, "blocks", blocks)? as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (n6, n, k32) = (int(OP, "n6", v6.n)?, int(OP, "n", v.n)?, int(OP, "k", k)?);
        let parts = int(OP, "partial sums", rs.part.len())?;
        let (w6p, wp, qp, dp) = (v6.w.raw(), v.w.raw(), xq.raw(), xds.raw());
        let (y6p, yp, pp) = (v6.y.raw(), v.y.raw(), rs.part.raw());
        // (const u8* w6, const u8* w, const i8* xq, const float2* xds, float* y6, float* y,
        //  int n6, int n, int k, const float* rs_part, int rs_n, float eps)
        self.go(
            &e.kern,
            cfg,
            &[
                &w6p, &wp, &qp, &dp, &y6p, &yp, &n6, &n, &k32, &pp, &parts, &rs.eps,
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::launch::bs1;
    use super::*;

    /// `__rs2` only for q6_kr matrices whose `__rs` grid would fill fewer than a third of the
    /// SMs: the 30B's 512-row V projections (32 blocks of 4 x 4 rows on 132 SMs), not the 8B's
    /// 1024-row ones (64 blocks) nor a gate|up; never for other formats.
    #[test]
    fn rs2_only_for_short_q6_kr() {
        let q6 = bs1(Quant::Q6KR);
        assert_eq!(q6.param_u32("rows"), Some(4));
        assert_eq!(rs_suffix(q6, 512, 132), Entry::Rs2);
        assert_eq!(rs_suffix(q6, 1024, 132), Entry::Rs);
        assert_eq!(rs_suffix(q6, 24576, 132), Entry::Rs);
        assert_eq!(rs_suffix(q6, 512, 16), Entry::Rs);
        for q in [Quant::Q4KR, Quant::Q4_0R, Quant::Q8_0R] {
            assert_eq!(rs_suffix(bs1(q), 512, 132), Entry::Rs);
        }
    }

    /// Qwen3-8B's shapes: the o projection (k 4096) has 16 tasks at q4_0r (one load batch of
    /// 128 blocks a row), the down projection (k 12288) 48; q8_0r's batches are half as long.
    #[test]
    fn res_tasks_count_steps_times_batches() {
        assert_eq!(res_tasks(bs1(Quant::Q4_0R), 4096), Some(16));
        assert_eq!(res_tasks(bs1(Quant::Q4_0R), 12288), Some(48));
        assert_eq!(res_tasks(bs1(Quant::Q8_0R), 4096), Some(32));
        assert_eq!(res_tasks(bs1(Quant::Q4KR), 4096), None);
        let t = crate::tuning::get();
        if t.res_task_warps && t.res_warps.is_none() {
            assert_eq!(res_launch_warps(bs1(Quant::Q4_0R), 4096), 16);
            assert_eq!(res_launch_warps(bs1(Quant::Q4_0R), 12288), 24);
            assert_eq!(res_launch_warps(bs1(Quant::Q8_0R), 4096), 24);
            assert_eq!(res_launch_warps(bs1(Quant::Q4KR), 4096), 16);
        }
    }

    /// `__res` blocks: 24 warps at 2 rows a warp step (q4_0r / q8_0r, whose `__res` is compiled
    /// for 768 threads), 16 at 4 (q4_kr / q6_kr, 512); the default is the most.
    #[test]
    fn res_warps_follow_the_rows() {
        for (q, w) in [
            (Quant::Q4_0R, 24),
            (Quant::Q8_0R, 24),
            (Quant::Q4KR, 16),
            (Quant::Q6KR, 16),
        ] {
            let spec = bs1(q);
            assert_eq!(res_max_warps(spec), w, "{q}");
            if crate::tuning::get().res_warps.is_none() {
                assert_eq!(res_warps(spec), w, "{q}");
            }
        }
    }
}
