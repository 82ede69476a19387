//! Launches on raw device pointers ([`DevPtr`]), what the CUDA backend uses: every kernel the
//! model ops need, resolved once into a [`Kern`] (spec + loaded function, so a launch does no
//! lookup and no string work), plus strided 2-D copies. Each helper validates its shapes against
//! the pointers' lengths (an error, never a panic) and states the kernel signature it matches.
//!
//! The `CudaSlice` helpers in `launch.rs` / `launch_linear.rs` (used by the per-kernel selftest)
//! launch the same kernels; these are their pointer twins.

use crate::kernels::Entry;
use cudarc::driver::{sys, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

use super::buf::DevPtr;
use super::error::{drv, CudaError};
use super::launch::RopeLaunch;
use super::types::Q8Ptrs;
use super::CudaDevice;
use crate::kernels::{KernelSpec, Op, Quant};
use crate::ops::RopeLayout;

/// A resolved kernel instance: its spec and its loaded main function.
#[derive(Debug, Clone)]
pub struct Kern {
    pub spec: &'static KernelSpec,
    pub f: CudaFunction,
}

/// The `<name>__q8` entry of an rmsnorm / glu instance: the same kernel that also writes the
/// int8 side-car of its output (extra `signed char* xq, float2* xds` arguments). Only
/// [`CudaDevice::kern_q8`] makes one, so a launch can never pair the wrong argument list with
/// the wrong entry.
#[derive(Debug, Clone)]
pub struct KernQ8(Kern);

impl KernQ8 {
    pub fn spec(&self) -> &'static KernelSpec {
        self.0.spec
    }
}

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

pub(super) fn invalid(op: &'static str, detail: String) -> CudaError {
    CudaError::Invalid { op, detail }
}

pub(super) fn int(op: &'static str, what: &str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| invalid(op, format!("{what} = {v} exceeds i32")))
}

pub(super) fn grid(op: &'static str, n: usize) -> Result<u32, CudaError> {
    u32::try_from(n)
        .ok()
        .filter(|&b| b > 0 && b < (1u32 << 31))
        .ok_or_else(|| invalid(op, format!("grid of {n} blocks is out of range")))
}

pub(super) fn expect(k: &Kern, ops: &[Op], op: &'static str) -> Result<(), CudaError> {
    if ops.contains(&k.spec.key.op) {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!("instance {} is not a {op} kernel", k.spec.name),
        ))
    }
}

fn same_instance(k: &Kern, q: &KernQ8, op: &'static str) -> Result<(), CudaError> {
    if k.spec.key == q.0.spec.key {
        Ok(())
    } else {
        Err(invalid(
            op,
            format!("side-car entry of {} with {}", q.0.spec.name, k.spec.name),
        ))
    }
}

/// The raw `(xq, xds)` kernel arguments of an optional int8 side-car over `len` values written
/// in groups of 32 that never straddle a `unit` (a norm group or an output row): null pointers
/// without one; with one, `unit % 32 == 0` and room for `len` int8 values and `len / 32` pairs.
pub(crate) fn q8_args(
    op: &'static str,
    q8: Option<Q8Ptrs>,
    len: usize,
    unit: usize,
) -> Result<(u64, u64), CudaError> {
    let Some((q, ds)) = q8 else {
        return Ok((0, 0));
    };
    if unit == 0 || unit % 32 != 0 || len % unit != 0 || q.len() < len || ds.len() < len / 16 {
        return Err(invalid(
            op,
            format!(
                "side-car of {} int8 / {} floats for {len} values in groups of {unit}",
                q.len(),
                ds.len()
            ),
        ));
    }
    Ok((q.raw(), ds.raw()))
}

/// Blocks of a grid-stride elementwise launch over `n` values (enough to fill a large GPU).
fn stride_grid(n: usize, threads: usize) -> u32 {
    n.div_ceil(threads).clamp(1, 65_536) as u32
}

impl CudaDevice {
    /// Resolve and load the best instance of `(op, quant, batch)` for this device.
    pub fn kern(
        &self,
        op: Op,
        quant: Quant,
        batch: crate::kernels::BatchBucket,
    ) -> Result<Kern, CudaError> {
        let spec = self.resolve(op, quant, crate::kernels::HeadDim::Any, batch)?;
        Ok(Kern {
            spec,
            f: self.function(spec)?,
        })
    }

    /// The side-car entry (`__q8`) of `k`, an rmsnorm or glu instance.
    pub fn kern_q8(&self, k: &Kern) -> Result<KernQ8, CudaError> {
        expect(k, &[Op::RmsNorm, Op::Geglu, Op::Swiglu], "kern_q8")?;
        Ok(KernQ8(Kern {
            spec: k.spec,
            f: self.function_entry(k.spec, Entry::Q8)?,
        }))
    }

    pub(super) fn go(
        &self,
        k: &Kern,
        cfg: LaunchConfig,
        args: &[&dyn ArgPush],
    ) -> Result<(), CudaError> {
        let mut b = self.stream().launch_builder(&k.f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: every caller passes the argument list of its kernel's signature (stated at the
        // call) and has checked that each pointer addresses what the kernel reads and writes.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {}", k.spec.name)))?;
        Ok(())
    }

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
            block_dim: (super::launch::norm_block_threads(k.spec, dim), 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, wp, yp, d) = (x.raw(), wp.raw(), y.raw(), int(OP, "dim", dim)?);
        match q8 {
            // (const float* x, const float* w, float* y, int dim, int mode, float eps)
            None => self.go(k, cfg, &[&xp, &wp, &yp, &d, &mode, &eps]),
            // __q8: (..., float eps, signed char* xq, float2* xds)
            Some((kq, _)) => {
                same_instance(k, kq, OP)?;
                self.go(&kq.0, cfg, &[&xp, &wp, &yp, &d, &mode, &eps, &qp, &dp])
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
                    &kq.0,
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

    /// `c[m][n] = a[m][k] . w[n][k]^T` with `a` bf16 bits, `w` in the instance's format
    /// (bf16 or a GGUF block format; not fp8, whose scales this helper does not take).
    pub fn gemm_ptr(
        &self,
        kn: &Kern,
        a: DevPtr<u16>,
        w: DevPtr<u8>,
        c: DevPtr<f32>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), CudaError> {
        const OP: &str = "gemm";
        expect(kn, &[Op::Gemm], OP)?;
        let q = kn.spec.key.quant;
        if q == Quant::Fp8E4m3 {
            return Err(invalid(
                OP,
                "fp8 gemm needs scales: not through gemm_ptr".into(),
            ));
        }
        let (be, bb) = weight_block(q).ok_or_else(|| invalid(OP, format!("no gemm for {q}")))?;
        if m == 0 || n == 0 || k == 0 || (k * 2) % 16 != 0 || k % be != 0 {
            return Err(invalid(
                OP,
                format!("m={m} n={n} k={k}: k must be a multiple of 8 and of {be}"),
            ));
        }
        if a.len() < m * k || w.len() < n * (k / be) * bb || c.len() < m * n {
            return Err(invalid(
                OP,
                format!("a {} / w {} / c {} too small", a.len(), w.len(), c.len()),
            ));
        }
        let tile = kn.spec.param_u32("tile").unwrap_or(64) as usize;
        let cfg = LaunchConfig {
            grid_dim: (grid(OP, n.div_ceil(tile))?, grid(OP, m.div_ceil(tile))?, 1),
            block_dim: ((64 * tile / 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ap, wp, cp) = (a.raw(), w.raw(), c.raw());
        let (mi, ni, ki, kb) = (
            int(OP, "m", m)?,
            int(OP, "n", n)?,
            int(OP, "k", k)?,
            k.div_ceil(128) as i32,
        );
        let null = 0u64;
        // (const u8* A, const u8* W, float* C, int M, int N, int K, const float* w_scale,
        //  const float* a_scale, int ws_cols); the scales are read only by fp8 instances
        self.go(kn, cfg, &[&ap, &wp, &cp, &mi, &ni, &ki, &null, &null, &kb])
    }
}

/// One kernel argument (a pointer as `u64`, or a scalar).
pub(super) trait ArgPush {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
}
macro_rules! arg_push {
    ($($t:ty),*) => {$(
        impl ArgPush for $t {
            fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
                b.arg(self);
            }
        }
    )*};
}
arg_push!(u64, i64, i32, f32);

/// Copy `height` rows of `width` values from `src` (row pitch `src_pitch` values) to `dst` (row
/// pitch `dst_pitch`): stream-ordered and capturable (a memcpy node in a CUDA graph).
pub fn copy_2d(
    stream: &CudaStream,
    dst: DevPtr<f32>,
    dst_pitch: usize,
    src: DevPtr<f32>,
    src_pitch: usize,
    width: usize,
    height: usize,
) -> Result<(), CudaError> {
    const OP: &str = "copy_2d";
    if width == 0 || height == 0 {
        return Ok(());
    }
    let span = |pitch: usize| (height - 1) * pitch + width;
    if width > src_pitch
        || width > dst_pitch
        || src.len() < span(src_pitch)
        || dst.len() < span(dst_pitch)
    {
        return Err(invalid(
            OP,
            format!(
                "{height} rows of {width} from {} (pitch {src_pitch}) into {} (pitch {dst_pitch})",
                src.len(),
                dst.len()
            ),
        ));
    }
    const F: usize = std::mem::size_of::<f32>();
    let cp = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src.raw(),
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch * F,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst.raw(),
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch * F,
        WidthInBytes: width * F,
        Height: height,
    };
    super::buf::bind(stream)?;
    // SAFETY: both pointers address the spans checked above (their contract); the descriptor
    // is read by the driver during the call.
    unsafe { sys::cuMemcpy2DAsync_v2(&cp, stream.cu_stream()) }
        .result()
        .map_err(drv("strided device->device copy"))
}

/// (elements, bytes) of one block of a GEMV/GEMM weight format.
pub fn weight_block(q: Quant) -> Option<(usize, usize)> {
    Some(match q {
        Quant::F32 => (1, 4),
        Quant::F16 | Quant::Bf16 => (1, 2),
        Quant::Fp8E4m3 => (1, 1),
        Quant::Q8_0 | Quant::Q8_0R => (32, 34),
        Quant::Q4_0 | Quant::Q4_0R => (32, 18),
        Quant::Q5_0 => (32, 22),
        Quant::Q4K | Quant::Q4KR => (256, 144),
        Quant::Q6K | Quant::Q6KR => (256, 210),
        Quant::NvFp4 => return None,
    })
}
