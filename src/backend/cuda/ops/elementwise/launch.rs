//! Launches of the elementwise, norm, RoPE, GLU, embedding and cast kernels on raw device
//! pointers ([`DevPtr`]), what the CUDA backend uses. Each validates its shapes against the
//! pointers' lengths (an error, never a panic) and states the kernel signature it matches; the
//! `CudaSlice` launches in `slice.rs` (the per-kernel selftest's) are their twins.

use cudarc::driver::LaunchConfig;

use super::slice::RopeLaunch;
use crate::backend::cuda::runtime::buf::DevPtr;
use crate::backend::cuda::runtime::error::CudaError;
use crate::backend::cuda::runtime::kern::{
    expect, grid, int, invalid, q8_args, weight_block, Kern, KernQ8,
};
use crate::backend::cuda::runtime::types::Q8Ptrs;
use crate::backend::cuda::CudaDevice;
use crate::kernels::Op;
use crate::ops::RopeLayout;
/// Mode of the `ewise` kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EwiseMode {
    /// a + b
    Add = 0,
    /// a * b
    Mul = 1,
    /// a * sigmoid(b)
    SigmoidGate = 2,
    /// a * s
    Scale = 3,
    /// s * tanh(a / s)
    Softcap = 4,
}

/// The `b` operand of an `ewise` launch: `b[r * row_stride + c * col_stride]`.
#[derive(Debug, Clone, Copy)]
pub struct Broadcast {
    pub ptr: DevPtr<f32>,
    pub row_stride: usize,
    pub col_stride: usize,
}

/// How the RMSNorm kernel applies its weight.
#[derive(Debug, Clone, Copy)]
pub enum NormWeightPtr {
    Plain(DevPtr<f32>),
    OnePlus(DevPtr<f32>),
    None,
}

fn same_instance(k: &Kern, q: &KernQ8, op: &'static str) -> Result<(), CudaError> {
    if k.spec.key == q.kern().spec.key {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!(
                "side-car entry of {} with {}",
                q.kern().spec.name,
                k.spec.name
            ),
        ))
    }
}
/// Blocks of a grid-stride elementwise launch over `n` values (enough to fill a large GPU).
fn stride_grid(n: usize, threads: usize) -> u32 {
    n.div_ceil(threads).clamp(1, 65_536) as u32
}

impl CudaDevice {
    /// RMSNorm over groups of `dim` values of `x` into `y` (same length; may alias).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_ptr(
        &self,
        k: &Kern,
        x: DevPtr<f32>,
        w: NormWeightPtr,
        y: DevPtr<f32>,
        eps: f32,
        dim: usize,
        q8: Option<(&KernQ8, Q8Ptrs)>,
    ) -> Result<(), CudaError> {
        const OP: &str = "rms_norm";
        expect(k, &[Op::RmsNorm], OP)?;
        if dim == 0 || x.len() % dim != 0 || x.len() != y.len() || x.is_empty() {
            return Err(invalid(
                OP,
                format!("x {} / y {} not groups of {dim}", x.len(), y.len()),
            ));
        }
        let (qp, dp) = q8_args(OP, q8.map(|(_, p)| p), x.len(), dim)?;
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
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, x.len() / dim)?, 1, 1),
            block_dim: (super::slice::norm_block_threads(k.spec, dim), 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, wp, yp, d) = (x.raw(), wp.raw(), y.raw(), int(OP, "dim", dim)?);
        match q8 {
            // (const float* x, const float* w, float* y, int dim, int mode, float eps)
            None => self.go(k, cfg, &[&xp, &wp, &yp, &d, &mode, &eps]),
            // __q8: (..., float eps, signed char* xq, float2* xds)
            Some((kq, _)) => {
                same_instance(k, kq, OP)?;
                self.go(kq.kern(), cfg, &[&xp, &wp, &yp, &d, &mode, &eps, &qp, &dp])
            }
        }
    }

    /// L2 norm over groups of `dim` values of `x` into `y`.
    pub fn l2_norm_ptr(
        &self,
        k: &Kern,
        x: DevPtr<f32>,
        y: DevPtr<f32>,
        eps: f32,
        dim: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "l2_norm";
        expect(k, &[Op::L2Norm], OP)?;
        if dim == 0 || x.len() % dim != 0 || x.len() != y.len() || x.is_empty() {
            return Err(invalid(
                OP,
                format!("x {} / y {} not groups of {dim}", x.len(), y.len()),
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, x.len() / dim)?, 1, 1),
            block_dim: (k.spec.param_u32("threads").unwrap_or(256), 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, yp, d) = (x.raw(), y.raw(), int(OP, "dim", dim)?);
        // (const float* x, float* y, int dim, float eps)
        self.go(k, cfg, &[&xp, &yp, &d, &eps])
    }

    /// RoPE of `p.rows` contiguous rows; `pos[r]` is row r's position (device memory).
    pub fn rope_ptr(
        &self,
        k: &Kern,
        x: DevPtr<f32>,
        y: DevPtr<f32>,
        pos: DevPtr<i32>,
        freq_factors: Option<DevPtr<f32>>,
        p: &RopeLaunch,
    ) -> Result<(), CudaError> {
        const OP: &str = "rope";
        expect(k, &[Op::Rope], OP)?;
        let row = p.n_heads * p.head_dim;
        let need = p.rows * row;
        if p.rot_dims % 2 != 0
            || p.rot_dims > p.head_dim
            || p.head_dim % 2 != 0
            || p.freq_base_dims == 0
            || need == 0
        {
            return Err(invalid(OP, format!("bad dims {p:?}")));
        }
        if x.len() < need || y.len() < need || pos.len() < p.rows {
            return Err(invalid(
                OP,
                format!(
                    "x {} / y {} / pos {} too small for {p:?}",
                    x.len(),
                    y.len(),
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
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, p.rows * p.n_heads)?, 1, 1),
            block_dim: (k.spec.param_u32("threads").unwrap_or(128), 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, yp, pp) = (x.raw(), y.raw(), pos.raw());
        let ff = freq_factors.map_or(0, |f| f.raw());
        let (nh, hd, rd, fb) = (
            int(OP, "n_heads", p.n_heads)?,
            int(OP, "head_dim", p.head_dim)?,
            int(OP, "rot_dims", p.rot_dims)?,
            int(OP, "freq_base_dims", p.freq_base_dims)?,
        );
        let layout: i32 = match p.layout {
            RopeLayout::Neox => 0,
            RopeLayout::Interleaved => 1,
        };
        let stride = row as i64;
        // (const float* x, float* y, const int* pos, const float* ff, int n_heads, int head_dim,
        //  int rot_dims, int freq_base_dims, int layout, float theta, long long stride_x,
        //  long long stride_y)
        self.go(
            k,
            cfg,
            &[
                &xp, &yp, &pp, &ff, &nh, &hd, &rd, &fb, &layout, &p.theta, &stride, &stride,
            ],
        )
    }

    /// `out = act(gate) * up` over `rows x cols` contiguous values.
    #[allow(clippy::too_many_arguments)]
    pub fn glu_ptr(
        &self,
        k: &Kern,
        gate: DevPtr<f32>,
        up: DevPtr<f32>,
        out: DevPtr<f32>,
        rows: usize,
        cols: usize,
        q8: Option<(&KernQ8, Q8Ptrs)>,
    ) -> Result<(), CudaError> {
        self.glu_strided_ptr(k, gate, up, out, rows, cols, [cols; 3], q8)
    }

    /// GLU with row strides `[gate, up, out]` in elements (gate and up may be the two halves
    /// of one fused `[rows, 2 cols]` projection). `q8`: also the int8 side-car of the output
    /// (contiguous output, `cols % 32 == 0`).
    #[allow(clippy::too_many_arguments)]
    pub fn glu_strided_ptr(
        &self,
        k: &Kern,
        gate: DevPtr<f32>,
        up: DevPtr<f32>,
        out: DevPtr<f32>,
        rows: usize,
        cols: usize,
        strides: [usize; 3],
        q8: Option<(&KernQ8, Q8Ptrs)>,
    ) -> Result<(), CudaError> {
        const OP: &str = "glu";
        expect(k, &[Op::Geglu, Op::Swiglu], OP)?;
        let n = rows * cols;
        let span = |st: usize| if rows == 0 { 0 } else { (rows - 1) * st + cols };
        if strides.iter().any(|&st| st < cols)
            || gate.len() < span(strides[0])
            || up.len() < span(strides[1])
            || out.len() < span(strides[2])
        {
            return Err(invalid(OP, format!("buffers too small for {rows}x{cols}")));
        }
        if q8.is_some() && strides[2] != cols {
            return Err(invalid(OP, "a side-car needs a contiguous output".into()));
        }
        if n == 0 {
            return Ok(());
        }
        let (qp, dp) = q8_args(OP, q8.map(|(_, p)| p), n, cols)?;
        let threads = k.spec.param_u32("threads").unwrap_or(256);
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, n.div_ceil(threads as usize))?, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (gp, upp, op) = (gate.raw(), up.raw(), out.raw());
        let (r, c) = (int(OP, "rows", rows)?, int(OP, "cols", cols)?);
        let [sg, su, so] = strides.map(|v| v as i64);
        match q8 {
            // (const float* gate, const float* up, float* out, int rows, int cols,
            //  long long gate_stride, long long up_stride, long long out_stride)
            None => self.go(k, cfg, &[&gp, &upp, &op, &r, &c, &sg, &su, &so]),
            // __q8: (..., long long out_stride, signed char* xq, float2* xds)
            Some((kq, _)) => {
                same_instance(k, kq, OP)?;
                self.go(
                    kq.kern(),
                    cfg,
                    &[&gp, &upp, &op, &r, &c, &sg, &su, &so, &qp, &dp],
                )
            }
        }
    }

    /// `y = f(a, b)` over `rows x cols` (see [`EwiseMode`]); `b` is required by the binary modes.
    #[allow(clippy::too_many_arguments)]
    pub fn ewise_ptr(
        &self,
        k: &Kern,
        mode: EwiseMode,
        a: DevPtr<f32>,
        b: Option<Broadcast>,
        y: DevPtr<f32>,
        rows: usize,
        cols: usize,
        s: f32,
    ) -> Result<(), CudaError> {
        const OP: &str = "ewise";
        expect(k, &[Op::Ewise], OP)?;
        let n = rows * cols;
        if a.len() < n || y.len() < n {
            return Err(invalid(
                OP,
                format!("a {} / y {} for {rows}x{cols}", a.len(), y.len()),
            ));
        }
        let binary = matches!(
            mode,
            EwiseMode::Add | EwiseMode::Mul | EwiseMode::SigmoidGate
        );
        let (bp, rs, cs) = match (binary, b) {
            (true, Some(b)) => {
                let last = if n == 0 {
                    0
                } else {
                    (rows - 1) * b.row_stride + (cols - 1) * b.col_stride + 1
                };
                if b.ptr.len() < last {
                    return Err(invalid(
                        OP,
                        format!("b holds {} values, the broadcast reads {last}", b.ptr.len()),
                    ));
                }
                (b.ptr.raw(), b.row_stride as i64, b.col_stride as i64)
            }
            (true, None) => return Err(invalid(OP, format!("{mode:?} needs a second operand"))),
            (false, _) => (0u64, 0i64, 0i64),
        };
        if n == 0 {
            return Ok(());
        }
        let threads = k.spec.param_u32("threads").unwrap_or(256);
        let cfg = LaunchConfig {
            grid_dim: (stride_grid(n, threads as usize), 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ap, yp) = (a.raw(), y.raw());
        let (r, c, m) = (int(OP, "rows", rows)?, int(OP, "cols", cols)?, mode as i32);
        // (const float* a, const float* b, float* y, int rows, int cols, long long b_rs,
        //  long long b_cs, int mode, float s)
        self.go(k, cfg, &[&ap, &bp, &yp, &r, &c, &rs, &cs, &m, &s])
    }

    /// `out[i] = dequant(table[ids[i]]) * scale` for `ids.len()` rows of `cols`; `table` holds
    /// `vocab` rows of `row_bytes` in the GGUF layout of the kernel's quant.
    #[allow(clippy::too_many_arguments)]
    pub fn embed_ptr(
        &self,
        k: &Kern,
        table: DevPtr<u8>,
        vocab: usize,
        cols: usize,
        ids: DevPtr<i32>,
        out: DevPtr<f32>,
        scale: f32,
    ) -> Result<(), CudaError> {
        const OP: &str = "embed";
        expect(k, &[Op::Embed], OP)?;
        let q = k.spec.key.quant;
        let (be, bb) = weight_block(q).ok_or_else(|| invalid(OP, format!("no embed for {q}")))?;
        if cols == 0 || cols % be != 0 {
            return Err(invalid(OP, format!("{cols} columns of {q}")));
        }
        let row_bytes = cols / be * bb;
        let rows = ids.len();
        if table.len() < vocab * row_bytes || out.len() < rows * cols {
            return Err(invalid(
                OP,
                format!(
                    "table {} bytes for {vocab} x {cols} {q}, out {} for {rows} rows",
                    table.len(),
                    out.len()
                ),
            ));
        }
        if rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (
                grid(OP, rows)?,
                grid(OP, cols.div_ceil(256))?.min(65_535),
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        if cols.div_ceil(256) > 65_535 {
            return Err(invalid(OP, format!("{cols} columns exceed the grid")));
        }
        let (tp, ip, op) = (table.raw(), ids.raw(), out.raw());
        let (v, c, rb) = (
            int(OP, "vocab", vocab)?,
            int(OP, "cols", cols)?,
            row_bytes as i64,
        );
        // (const u8* table, const int* ids, float* out, int vocab, int cols, long long row_bytes,
        //  float scale)
        self.go(k, cfg, &[&tp, &ip, &op, &v, &c, &rb, &scale])
    }

    /// `y = bf16(x)` (bits), `x.len()` values.
    pub fn cast_bf16_ptr(&self, k: &Kern, x: DevPtr<f32>, y: DevPtr<u16>) -> Result<(), CudaError> {
        const OP: &str = "cast_bf16";
        expect(k, &[Op::CastBf16], OP)?;
        if y.len() < x.len() {
            return Err(invalid(OP, format!("{} values into {}", x.len(), y.len())));
        }
        if x.is_empty() {
            return Ok(());
        }
        // 8 values per thread per step on aligned operands (the kernel's float4 path); any grid
        // is correct (grid-stride loops)
        let cfg = LaunchConfig {
            grid_dim: (stride_grid(x.len().div_ceil(8), 256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, yp, n) = (x.raw(), y.raw(), x.len() as i64);
        // (const float* x, u16* y, long long n)
        self.go(k, cfg, &[&xp, &yp, &n])
    }

    /// `x` (`rows` rows of `cols`) to f16 rows `y` with a power-of-two scale per row into `rs`
    /// (`ops/cast_f16`: the f16 gemm_pipe's A operand and its row scales).
    pub fn cast_f16_ptr(
        &self,
        k: &Kern,
        x: DevPtr<f32>,
        y: DevPtr<u16>,
        rs: DevPtr<f32>,
        (rows, cols): (usize, usize),
    ) -> Result<(), CudaError> {
        const OP: &str = "cast_f16";
        expect(k, &[Op::CastF16], OP)?;
        if x.len() < rows * cols || y.len() < rows * cols || rs.len() < rows {
            return Err(invalid(
                OP,
                format!(
                    "{rows} x {cols}: x {} y {} rs {}",
                    x.len(),
                    y.len(),
                    rs.len()
                ),
            ));
        }
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (
                u32::try_from(rows).map_err(|_| invalid(OP, "rows".into()))?,
                1,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, yp, rp, c) = (x.raw(), y.raw(), rs.raw(), int(OP, "cols", cols)?);
        // (const float* x, u16* y, float* rs, int cols): sizes checked above
        self.go(k, cfg, &[&xp, &yp, &rp, &c])
    }

    /// Quantise `x` (a multiple of 32 values) into `xq` (int8) and `xds` (2 floats per 32).
    pub fn quantize_q8_ptr(
        &self,
        k: &Kern,
        x: DevPtr<f32>,
        xq: DevPtr<i8>,
        xds: DevPtr<f32>,
    ) -> Result<(), CudaError> {
        const OP: &str = "quantize_q8";
        expect(k, &[Op::QuantizeQ8], OP)?;
        let len = x.len();
        if len == 0 || len % 32 != 0 || xq.len() < len || xds.len() < len / 16 {
            return Err(invalid(
                OP,
                format!("x {len} / xq {} / xds {}", xq.len(), xds.len()),
            ));
        }
        let groups = int(OP, "groups", len / 32)?;
        let cfg = LaunchConfig {
            grid_dim: (((len / 32).div_ceil(8)).min(65535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, qp, dp) = (x.raw(), xq.raw(), xds.raw());
        // (const float* x, i8* xq, float2* xds, int n_groups)
        self.go(k, cfg, &[&xp, &qp, &dp, &groups])
    }
}
