//! Launches of the fused residual-add + norm kernels: `add_rmsnorm` (residual add + RMSNorm of
//! the sum, with an optional int8 side-car) and `norm_add_rmsnorm` (the same with an RMSNorm of
//! the added branch and a scale on the sum), on raw device pointers, shapes validated against
//! their lengths (errors, never panics), the kernel signature stated at each launch.

use crate::kernels::Entry;
use cudarc::driver::LaunchConfig;

use super::launch::NormWeightPtr;
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::KernEntry;
use crate::backend::cuda::runtime::kern::{expect, grid, int, invalid, q8_args, Kern};
use crate::backend::cuda::runtime::types::Q8Ptrs;
use crate::backend::cuda::CudaDevice;
use crate::kernels::Op;

/// The kernels' `(mode, w)` of an optional norm: -1 none, 0 plain, 1 one-plus, 2 weightless.
pub(crate) fn norm_mode(
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
            block_dim: (super::slice::norm_block_threads(k.spec, dim), 1, 1),
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
        let threads = super::slice::norm_block_threads(k.spec, dim);
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
