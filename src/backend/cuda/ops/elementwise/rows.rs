//! Launches of the multi-row (prefill) entries of elementwise and norm kernels: extra entries
//! `<name>__<suffix>` of the same instances, so the decode launches keep their kernels.
//!
//! - `rmsnorm__warp{4,8,16,32}`: one warp per group of `dim <= 32 M` values (per-head norms of
//!   many rows), bit-identical to the one-block-per-group main entry;
//! - `geglu__vec` / `swiglu__vec`: 4 columns per thread (float4), optionally also the bf16 copy
//!   of the output (the prefill GEMM's A operand: [`crate::backend::cuda::runtime::types::Bf16Side`]);
//! - `attn_prep__rows{4,8,16}`: see `../attention/prep.rs` (`attn_prep_rows_ptr`).
//!
//! Shapes are validated against the pointers (errors, never panics); each launch states the
//! kernel signature it matches.

use crate::kernels::Entry;
use cudarc::driver::LaunchConfig;

use super::launch::NormWeightPtr;
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::KernEntry;
use crate::backend::cuda::runtime::kern::{expect, grid, int, invalid};
use crate::backend::cuda::CudaDevice;
use crate::kernels::Op;

/// Rows from which the backend takes the multi-row entries (fewer: the decode kernels, whose
/// results these equal bit for bit where stated).
pub const PREFILL_MIN_ROWS: usize = 9;

/// Groups per block of the warp-per-group entries (256 threads).
const WARPS_PER_BLOCK: usize = 8;

/// The `rmsnorm__warp<M>` entry for groups of `dim` values (None: dim > 1024, use the block
/// per group main entry).
pub fn rms_norm_rows_suffix(dim: usize) -> Option<Entry> {
    match dim {
        1..=128 => Some(Entry::Warp4),
        129..=256 => Some(Entry::Warp8),
        257..=512 => Some(Entry::Warp16),
        513..=1024 => Some(Entry::Warp32),
        _ => None,
    }
}

/// The `attn_prep__rows<M>` entry for head dim `d` (None: d > 512).
pub fn attn_prep_rows_suffix(d: usize) -> Option<Entry> {
    match d {
        1..=128 => Some(Entry::Rows4),
        129..=256 => Some(Entry::Rows8),
        257..=512 => Some(Entry::Rows16),
        _ => None,
    }
}

/// Whether the float4 GLU entry takes these operands: `cols % 4 == 0`, row strides (elements)
/// multiples of 4, f32 pointers 16-byte aligned (so every row start is).
pub fn glu_vec_ok(
    gate: DevPtr<f32>,
    up: DevPtr<f32>,
    out: DevPtr<f32>,
    cols: usize,
    strides: [usize; 3],
) -> bool {
    cols % 4 == 0
        && strides.iter().all(|s| s % 4 == 0)
        && [gate.raw(), up.raw(), out.raw()]
            .iter()
            .all(|p| p % 16 == 0)
}

impl CudaDevice {
    /// RMSNorm over groups of `dim <= 1024` values, one warp per group (`rmsnorm__warp<M>`):
    /// the main entry's results bit for bit. `x` and `y` the same length (may alias).
    pub fn rms_norm_rows_ptr(
        &self,
        e: &KernEntry,
        x: DevPtr<f32>,
        w: NormWeightPtr,
        y: DevPtr<f32>,
        eps: f32,
        dim: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "rms_norm rows";
        expect(&e.kern, &[Op::RmsNorm], OP)?;
        if rms_norm_rows_suffix(dim) != Some(e.entry) {
            return Err(invalid(
                OP,
                format!("entry __{} for groups of {dim}", e.entry),
            ));
        }
        if x.len() % dim != 0 || x.len() != y.len() || x.is_empty() {
            return Err(invalid(
                OP,
                format!("x {} / y {} not groups of {dim}", x.len(), y.len()),
            ));
        }
        let (mode, wp) = match w {
            NormWeightPtr::Plain(w) => (0i32, w),
            NormWeightPtr::OnePlus(w) => (1, w),
            NormWeightPtr::None => (2, DevPtr::null()),
        };
        if mode != 2 && wp.len() != dim {
            return Err(invalid(
                OP,
                format!("weight of {} values for dim {dim}", wp.len()),
            ));
        }
        let groups = x.len() / dim;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, groups.div_ceil(WARPS_PER_BLOCK))?, 1, 1),
            block_dim: (32 * WARPS_PER_BLOCK as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, wp, yp, d, g) = (
            x.raw(),
            wp.raw(),
            y.raw(),
            int(OP, "dim", dim)?,
            groups as i64,
        );
        // (const float* x, const float* w, float* y, int dim, int mode, float eps,
        //  long long groups); x and y hold groups * dim floats, w dim (or null for mode 2).
        self.go(&e.kern, cfg, &[&xp, &wp, &yp, &d, &mode, &eps, &g])
    }

    /// `out = act(gate) * up` over `rows x cols` with row strides `[gate, up, out]`, 4 columns per
    /// thread (`<glu>__vec`; see [`glu_vec_ok`]), and with `out16` also the bf16 copy of out
    /// (contiguous `[rows][cols]`, 8-byte aligned).
    #[allow(clippy::too_many_arguments)]
    pub fn glu_vec_ptr(
        &self,
        e: &KernEntry,
        gate: DevPtr<f32>,
        up: DevPtr<f32>,
        out: DevPtr<f32>,
        out16: Option<DevPtr<u16>>,
        rows: usize,
        cols: usize,
        strides: [usize; 3],
    ) -> Result<(), CudaError> {
        const OP: &str = "glu vec";
        expect(&e.kern, &[Op::Geglu, Op::Swiglu], OP)?;
        if e.entry != Entry::Vec {
            return Err(invalid(OP, format!("entry __{}", e.entry)));
        }
        let span = |st: usize| if rows == 0 { 0 } else { (rows - 1) * st + cols };
        if strides.iter().any(|&st| st < cols)
            || gate.len() < span(strides[0])
            || up.len() < span(strides[1])
            || out.len() < span(strides[2])
        {
            return Err(invalid(OP, format!("buffers too small for {rows}x{cols}")));
        }
        if !glu_vec_ok(gate, up, out, cols, strides) {
            return Err(invalid(
                OP,
                format!("{cols} columns / strides {strides:?} / alignment not float4"),
            ));
        }
        if let Some(o) = out16 {
            if o.len() < rows * cols || o.raw() % 8 != 0 {
                return Err(invalid(
                    OP,
                    format!("bf16 copy of {} values for {rows}x{cols}", o.len()),
                ));
            }
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let threads = e.kern.spec.param_u32("threads").unwrap_or(256);
        let cfg = LaunchConfig {
            grid_dim: (
                grid(OP, (cols / 4).div_ceil(threads as usize))?,
                rows.min(65_535) as u32,
                1,
            ),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (gp, upp, op) = (gate.raw(), up.raw(), out.raw());
        let o16 = out16.map_or(0, |o| o.raw());
        let (r, c) = (int(OP, "rows", rows)?, int(OP, "cols", cols)?);
        let [sg, su, so] = strides.map(|v| v as i64);
        // (const float* gate, const float* up, float* out, u16* out16, int rows, int cols,
        //  long long gate_stride, long long up_stride, long long out_stride); spans checked
        //  above, out16 null or rows * cols values.
        self.go(&e.kern, cfg, &[&gp, &upp, &op, &o16, &r, &c, &sg, &su, &so])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_by_size() {
        assert_eq!(rms_norm_rows_suffix(0), None);
        assert_eq!(rms_norm_rows_suffix(16), Some(Entry::Warp4));
        assert_eq!(rms_norm_rows_suffix(128), Some(Entry::Warp4));
        assert_eq!(rms_norm_rows_suffix(129), Some(Entry::Warp8));
        assert_eq!(rms_norm_rows_suffix(512), Some(Entry::Warp16));
        assert_eq!(rms_norm_rows_suffix(1024), Some(Entry::Warp32));
        assert_eq!(rms_norm_rows_suffix(1025), None);
        assert_eq!(attn_prep_rows_suffix(64), Some(Entry::Rows4));
        assert_eq!(attn_prep_rows_suffix(256), Some(Entry::Rows8));
        assert_eq!(attn_prep_rows_suffix(512), Some(Entry::Rows16));
        assert_eq!(attn_prep_rows_suffix(514), None);
    }

    #[test]
    fn glu_vec_needs_float4_rows() {
        // SAFETY: never dereferenced or launched; only the addresses are inspected.
        let p = |raw: u64| unsafe { DevPtr::<f32>::from_raw(raw, 1 << 20) };
        let (a, b) = (p(0x1000), p(0x2000));
        assert!(glu_vec_ok(a, b, a, 12_288, [24_576, 24_576, 12_288]));
        assert!(!glu_vec_ok(a, b, a, 1000 + 2, [1002, 1002, 1002]));
        assert!(!glu_vec_ok(a, p(0x2004), a, 64, [64, 64, 64]));
        assert!(!glu_vec_ok(a, b, a, 64, [66, 64, 64]));
    }
}
