//! The CUDA backend's tensor, weight and KV-cache types, shared by its op modules.

use std::sync::Arc;

use super::buf::{DevBuf, DevPtr};
use super::error::CudaError;
use crate::kernels::Quant;

/// The int8 quantisation of a tensor's values in `quantize_q8`'s layout (what the block-format
/// GEMV reads): `len` int8 values, then `len / 32` f32 pairs `{d, d * sum(q)}`, in one pooled
/// buffer. Written by the kernel that wrote the tensor (rmsnorm, add_rmsnorm, glu) with the same
/// rounding code as `quantize_q8` (`lib/q8.cuh.tera`), so `linear` can skip that launch.
#[derive(Debug)]
pub struct Q8Side {
    pub buf: DevBuf,
    /// Values covered: the tensor's `rows * cols`, a multiple of 32.
    pub len: usize,
}

impl Q8Side {
    /// Bytes of the side-car of `len` values.
    pub fn bytes(len: usize) -> usize {
        len + len / 32 * 8
    }

    /// The int8 values (`len`).
    pub fn q(&self) -> DevPtr<i8> {
        self.buf
            .ptr::<i8>()
            .slice(0, self.len)
            .expect("a side-car buffer holds Q8Side::bytes(len) bytes")
    }

    /// The `{d, d * sum}` pairs as `len / 16` floats.
    pub fn ds(&self) -> DevPtr<f32> {
        self.buf
            .u8()
            .slice(self.len, self.len / 4)
            .expect("a side-car buffer holds Q8Side::bytes(len) bytes")
            .cast()
    }

    /// `(q, ds)`, what the launch helpers of the producing kernels take.
    pub fn ptrs(&self) -> Q8Ptrs {
        (self.q(), self.ds())
    }
}

/// A bf16 copy of a tensor's values (round to nearest even: what `cast_bf16` makes of them, bit
/// for bit for every non-NaN value), contiguous `[rows][cols]` in one pooled buffer: written
/// beside the f32 output by the multi-row GLU and the multi-row whole-row `add_rms_norm`
/// (n >= `PREFILL_MIN_ROWS`), read by the prefill GEMM of `linear` instead of casting the
/// activations again.
#[derive(Debug)]
pub struct Bf16Side {
    pub buf: DevBuf,
    /// Values covered: the tensor's `rows * cols`.
    pub len: usize,
}

impl Bf16Side {
    /// The bf16 values (`len`).
    pub fn ptr(&self) -> DevPtr<u16> {
        self.buf
            .ptr::<u16>()
            .slice(0, self.len)
            .expect("a bf16 side-car buffer holds 2 * len bytes")
    }
}

/// Where a kernel writes an int8 side-car: `len` int8 values and `len / 16` floats of pairs.
pub type Q8Ptrs = (DevPtr<i8>, DevPtr<f32>);

/// An activation tensor: row-major f32 `[rows, cols]` in a pooled buffer, from float `off` on.
/// Several tensors may share a buffer (a one-row column slice is a view, not a copy); no op
/// writes into its inputs, so sharing is safe (and so is a side-car: the values it quantises
/// never change after the kernel that wrote both).
#[derive(Debug)]
pub struct GpuTensor {
    pub buf: Arc<DevBuf>,
    pub off: usize,
    pub rows: usize,
    pub cols: usize,
    /// The int8 side-car of the values, when the producing kernel wrote one (views carry none).
    pub q8: Option<Q8Side>,
    /// The bf16 copy of the values, when the producing kernel wrote one (views carry none).
    pub bf16: Option<Bf16Side>,
}

impl GpuTensor {
    /// A tensor owning `buf` (which holds at least `rows * cols` floats).
    pub fn new(buf: DevBuf, rows: usize, cols: usize) -> GpuTensor {
        GpuTensor {
            buf: Arc::new(buf),
            off: 0,
            rows,
            cols,
            q8: None,
            bf16: None,
        }
    }

    /// The same tensor carrying `q8` (the side-car of exactly its `rows * cols` values).
    pub fn with_q8(mut self, q8: Option<Q8Side>) -> GpuTensor {
        self.q8 = q8.filter(|s| s.len == self.rows * self.cols);
        self
    }

    /// The same tensor carrying `bf16` (the bf16 copy of exactly its `rows * cols` values).
    pub fn with_bf16(mut self, bf16: Option<Bf16Side>) -> GpuTensor {
        self.bf16 = bf16.filter(|s| s.len == self.rows * self.cols);
        self
    }

    /// `len` floats of this tensor's buffer from `start` (relative to the tensor) as a
    /// `[1, len]` view sharing the buffer, or None when out of range.
    pub fn row_view(&self, start: usize, len: usize) -> Option<GpuTensor> {
        (self.rows == 1 && start.checked_add(len)? <= self.cols).then(|| GpuTensor {
            buf: self.buf.clone(),
            off: self.off + start,
            rows: 1,
            cols: len,
            q8: None,
            bf16: None,
        })
    }

    /// Exactly `rows * cols` floats.
    pub fn ptr(&self) -> DevPtr<f32> {
        self.buf
            .f32()
            .slice(self.off, self.rows * self.cols)
            .expect("a GpuTensor's buffer holds off + rows * cols floats")
    }
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A parameter on the device, in its checkpoint format.
#[derive(Debug)]
pub struct GpuWeight {
    /// The checkpoint bytes as they are (GGUF blocks, F32/F16/BF16 elements, FP8 E4M3 bytes).
    pub data: DevBuf,
    pub quant: Quant,
    /// PyTorch order: `[n]`, `[rows, cols]` or `[experts, rows, cols]`.
    pub shape: Vec<usize>,
    /// FP8: f32 block scales `[ceil(rows/br)][ceil(cols/bc)]` per expert (dequant multiplier).
    pub scales: Option<DevBuf>,
    /// FP8 scale block `(br, bc)`.
    pub fp8_block: (usize, usize),
    /// An f32 copy for 1-D weights (norm weights, biases): what `weight_vector` returns.
    pub f32: Option<DevBuf>,
}

/// One matrix of a weight (the whole of a 2-D weight, or one expert of a bank).
#[derive(Debug, Clone, Copy)]
pub struct WeightView {
    pub data: DevPtr<u8>,
    pub quant: Quant,
    pub rows: usize,
    pub cols: usize,
    pub scales: Option<DevPtr<f32>>,
    pub fp8_block: (usize, usize),
}

/// Bytes of `rows x cols` elements of `q` (None when `cols` does not fill whole blocks).
pub fn matrix_bytes(q: Quant, rows: usize, cols: usize) -> Option<usize> {
    let (be, bb) = crate::backend::cuda::weight_block(q)?;
    (cols % be == 0).then(|| rows * (cols / be) * bb)
}

impl GpuWeight {
    fn bad(&self, what: &str) -> CudaError {
        CudaError::Invalid {
            op: "weight",
            detail: format!("{what}: weight of shape {:?} ({})", self.shape, self.quant),
        }
    }

    /// The weight as one `[rows, cols]` matrix (2-D weights only).
    pub fn matrix(&self) -> Result<WeightView, CudaError> {
        match self.shape[..] {
            [rows, cols] => self.view(0, rows, cols, 1),
            _ => Err(self.bad("not a matrix")),
        }
    }

    /// Expert `e` of an `[experts, rows, cols]` bank.
    pub fn expert(&self, e: usize) -> Result<WeightView, CudaError> {
        match self.shape[..] {
            [n, rows, cols] if e < n => self.view(e, rows, cols, n),
            _ => Err(self.bad(&format!("no expert {e}"))),
        }
    }

    fn view(&self, e: usize, rows: usize, cols: usize, n: usize) -> Result<WeightView, CudaError> {
        let per = matrix_bytes(self.quant, rows, cols).ok_or_else(|| self.bad("partial blocks"))?;
        let data = self
            .data
            .u8()
            .slice(e * per, per)
            .ok_or_else(|| self.bad("data shorter than its shape"))?;
        let scales = match &self.scales {
            None => None,
            Some(s) => {
                let (br, bc) = self.fp8_block;
                let per_s = rows.div_ceil(br.max(1)) * cols.div_ceil(bc.max(1));
                let all = s.f32();
                if all.len() < per_s * n {
                    return Err(self.bad("scales shorter than the block grid"));
                }
                all.slice(e * per_s, per_s)
            }
        };
        Ok(WeightView {
            data,
            quant: self.quant,
            rows,
            cols,
            scales,
            fp8_block: self.fp8_block,
        })
    }
}

/// Element type of the KV cache (the backend-wide type; the CUDA backend keeps f16 or FP8).
pub use crate::backend::KvType;
