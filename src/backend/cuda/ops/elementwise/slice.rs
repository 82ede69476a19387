//! Typed launch helpers for the simple kernels (rmsnorm, rope, softmax, geglu/swiglu).
//!
//! Each helper validates shapes against the buffers (an error, never a panic), picks the grid
//! from the template's documented launch shape, and launches on the device's stream. The
//! `KernelSpec` is passed explicitly so callers (and the selftest) choose the instance; use
//! `CudaDevice::resolve` for the best one.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, LaunchConfig, PushKernelArg};

use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::CudaDevice;
use crate::backend::{Activation, Norm};
use crate::kernels::{KernelSpec, Op};
use crate::ops::RopeLayout;

/// How RMSNorm applies its weight (the kernel's `mode` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NormMode {
    /// x_hat * w
    Plain = 0,
    /// x_hat * (1 + w)
    OnePlus = 1,
    /// x_hat
    None = 2,
}

/// Shape and parameters of a RoPE launch over contiguous rows of `n_heads * head_dim` floats.
#[derive(Debug, Clone, Copy)]
pub struct RopeLaunch {
    pub rows: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub rot_dims: usize,
    pub freq_base_dims: usize,
    pub layout: RopeLayout,
    pub theta: f32,
}

/// Shape of a GLU launch: `rows x cols` outputs; row strides of each operand in elements.
#[derive(Debug, Clone, Copy)]
pub struct GluShape {
    pub rows: usize,
    pub cols: usize,
    pub gate_stride: usize,
    pub up_stride: usize,
    pub out_stride: usize,
}

impl GluShape {
    /// Three contiguous `[rows, cols]` operands.
    pub fn contiguous(rows: usize, cols: usize) -> GluShape {
        GluShape {
            rows,
            cols,
            gate_stride: cols,
            up_stride: cols,
            out_stride: cols,
        }
    }
}

fn int(op: &'static str, what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| CudaError::Invalid {
        op,
        detail: format!("{what} = {v} exceeds i32"),
    })
}

fn check_op(spec: &KernelSpec, ops: &[Op], op: &'static str) -> Result<(), CudaError> {
    if ops.contains(&spec.key.op) {
        Ok(())
    } else {
        Err(CudaError::Invalid {
            op,
            detail: format!("instance {} is not a {op} kernel", spec.name),
        })
    }
}

fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

fn blocks(op: &'static str, n: usize) -> Result<u32, CudaError> {
    u32::try_from(n)
        .ok()
        .filter(|&b| b > 0 && b < (1u32 << 31))
        .ok_or_else(|| invalid(op, format!("grid of {n} blocks is out of range")))
}

impl CudaDevice {
    fn threads(spec: &KernelSpec, default: u32) -> u32 {
        spec.param_u32("threads").unwrap_or(default)
    }

    /// RMSNorm over groups of `dim` contiguous values of `x` into `out`; the weight (`dim`
    /// values) as in `backend::Norm`: plain `w`, `1 + w`, or none.
    pub fn rms_norm(
        &self,
        spec: &'static KernelSpec,
        x: &CudaSlice<f32>,
        w: Norm<'_, CudaSlice<f32>>,
        eps: f32,
        dim: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "rms_norm";
        check_op(spec, &[Op::RmsNorm], OP)?;
        if dim == 0 || x.len() % dim != 0 || x.len() != out.len() {
            return Err(invalid(
                OP,
                format!("x {} / out {} not groups of dim {dim}", x.len(), out.len()),
            ));
        }
        let groups = blocks(OP, x.len() / dim)?;
        let f = self.function(spec)?;
        let (mode, w) = match w {
            Norm::Plain(w) => (NormMode::Plain, Some(w)),
            Norm::OnePlus(w) => (NormMode::OnePlus, Some(w)),
            Norm::None => (NormMode::None, None),
        };
        let (dim_i, mode_i) = (int(OP, "dim", dim)?, mode as i32);
        let cfg = LaunchConfig {
            grid_dim: (groups, 1, 1),
            block_dim: (norm_block_threads(spec, dim), 1, 1),
            shared_mem_bytes: 0,
        };
        let null = 0u64;
        let mut b = self.stream().launch_builder(&f);
        b.arg(x);
        match (mode, w) {
            (NormMode::None, _) => {
                b.arg(&null);
            }
            (_, Some(w)) if w.len() == dim => {
                b.arg(w);
            }
            (_, w) => {
                return Err(invalid(
                    OP,
                    format!("weight of {:?} values for dim {dim}", w.map(|w| w.len())),
                ))
            }
        }
        b.arg(out).arg(&dim_i).arg(&mode_i).arg(&eps);
        // SAFETY: argument list matches the template signature (const float* x, const float* w,
        // float* y, int dim, int mode, float eps); x/out hold groups*dim floats and w holds dim
        // floats (or is null with mode 2, where the kernel never reads it), checked above.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// RoPE of `p.rows` contiguous rows of `x` into `out`; `pos[r]` is row r's position (device
    /// memory, so graph-capturable); `freq_factors` has `rot_dims / 2` divisors when present.
    pub fn rope(
        &self,
        spec: &'static KernelSpec,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        pos: &CudaSlice<i32>,
        freq_factors: Option<&CudaSlice<f32>>,
        p: &RopeLaunch,
    ) -> Result<(), CudaError> {
        const OP: &str = "rope";
        check_op(spec, &[Op::Rope], OP)?;
        let row = p.n_heads * p.head_dim;
        let need = p.rows * row;
        if p.rot_dims % 2 != 0
            || p.rot_dims > p.head_dim
            || p.head_dim % 2 != 0
            || p.freq_base_dims == 0
        {
            return Err(invalid(OP, format!("bad dims {p:?}")));
        }
        if x.len() < need || out.len() < need || pos.len() < p.rows {
            return Err(invalid(
                OP,
                format!(
                    "x {} / out {} / pos {} too small for {p:?}",
                    x.len(),
                    out.len(),
                    pos.len()
                ),
            ));
        }
        if let Some(ff) = freq_factors {
            if ff.len() < p.rot_dims / 2 {
                return Err(invalid(
                    OP,
                    format!("{} freq factors for {} pairs", ff.len(), p.rot_dims / 2),
                ));
            }
        }
        let grid = blocks(OP, p.rows * p.n_heads)?;
        let f = self.function(spec)?;
        let args = [
            int(OP, "n_heads", p.n_heads)?,
            int(OP, "head_dim", p.head_dim)?,
            int(OP, "rot_dims", p.rot_dims)?,
            int(OP, "freq_base_dims", p.freq_base_dims)?,
            match p.layout {
                RopeLayout::Neox => 0,
                RopeLayout::Interleaved => 1,
            },
        ];
        let stride = row as i64;
        let null = 0u64;
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (Self::threads(spec, 128), 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(out).arg(pos);
        match freq_factors {
            Some(ff) => b.arg(ff),
            None => b.arg(&null),
        };
        for a in &args {
            b.arg(a);
        }
        b.arg(&p.theta).arg(&stride).arg(&stride);
        // SAFETY: matches (const float* x, float* y, const int* pos, const float* ff, int n_heads,
        // int head_dim, int rot_dims, int freq_base_dims, int layout, float theta,
        // long long stride_x, long long stride_y); sizes checked above; ff may be null.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// Row softmax of `softmax(scale * x)` over rows of `cols` values.
    pub fn softmax(
        &self,
        spec: &'static KernelSpec,
        x: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        cols: usize,
        scale: f32,
    ) -> Result<(), CudaError> {
        const OP: &str = "softmax";
        check_op(spec, &[Op::Softmax], OP)?;
        if cols == 0 || x.len() % cols != 0 || x.len() != out.len() {
            return Err(invalid(
                OP,
                format!("x {} / out {} not rows of {cols}", x.len(), out.len()),
            ));
        }
        let rows = blocks(OP, x.len() / cols)?;
        let f = self.function(spec)?;
        let cols_i = int(OP, "cols", cols)?;
        let cfg = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (Self::threads(spec, 256), 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(x).arg(out).arg(&cols_i).arg(&scale);
        // SAFETY: matches (const float* x, float* y, int cols, float scale); both buffers hold
        // rows*cols floats (checked).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// `out[r, c] = act(gate[r, c]) * up[r, c]` over `shape.rows x shape.cols`, each operand
    /// with its own row stride (in elements), so gate and up may be views into one fused
    /// `[rows, 2 * cols]` projection.
    pub fn glu(
        &self,
        spec: &'static KernelSpec,
        gate: &CudaView<'_, f32>,
        up: &CudaView<'_, f32>,
        out: &mut CudaViewMut<'_, f32>,
        shape: &GluShape,
    ) -> Result<(), CudaError> {
        let GluShape {
            rows,
            cols,
            gate_stride,
            up_stride,
            out_stride,
        } = *shape;
        const OP: &str = "glu";
        check_op(spec, &[Op::Geglu, Op::Swiglu], OP)?;
        let span = |stride: usize| {
            if rows == 0 {
                0
            } else {
                (rows - 1) * stride + cols
            }
        };
        if cols == 0
            || gate_stride < cols
            || up_stride < cols
            || out_stride < cols
            || gate.len() < span(gate_stride)
            || up.len() < span(up_stride)
            || out.len() < span(out_stride)
        {
            return Err(invalid(
                OP,
                format!("buffers too small for {rows}x{cols} with strides"),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let threads = Self::threads(spec, 256);
        let grid = blocks(OP, (rows * cols).div_ceil(threads as usize))?;
        let f = self.function(spec)?;
        let (rows_i, cols_i) = (int(OP, "rows", rows)?, int(OP, "cols", cols)?);
        let strides = [gate_stride as i64, up_stride as i64, out_stride as i64];
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream().launch_builder(&f);
        b.arg(gate).arg(up).arg(out).arg(&rows_i).arg(&cols_i);
        for s in &strides {
            b.arg(s);
        }
        // SAFETY: matches (const float* gate, const float* up, float* out, int rows, int cols,
        // long long gate_stride, up_stride, out_stride); every view covers (rows-1)*stride+cols
        // elements (checked above).
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", spec.name)))?;
        Ok(())
    }

    /// The GLU instance for an activation on this device.
    pub fn glu_spec(&self, act: Activation) -> Result<&'static KernelSpec, CudaError> {
        use crate::kernels::{BatchBucket, HeadDim, Quant};
        let op = match act {
            Activation::GeluTanh => Op::Geglu,
            Activation::Silu => Op::Swiglu,
        };
        self.resolve(op, Quant::F32, HeadDim::Any, BatchBucket::Any)
    }
}

/// Threads per block of a norm over groups of `dim` values (`rmsnorm`, `add_rmsnorm`: the two
/// must agree, so fused and unfused results round alike): whole rows wider than 1024 take up
/// to 1024 threads, a handful of values each (a one-row decode norm is a latency chain: fewer
/// values per thread, shorter chain); per-head groups keep 256 (`attn_prep` matches them).
/// Never more than the instance's `threads` (its launch bound).
pub(crate) fn norm_block_threads(spec: &KernelSpec, dim: usize) -> u32 {
    let max = spec.param_u32("threads").unwrap_or(256).max(32);
    // <= 1024 stays 256: the warp-per-group prefill entries (rmsnorm__warp*, up to 1024
    // values) sum in the 256-thread order
    let want = if dim > 1024 { 1024 } else { 256 };
    want.min(max)
}
