//! `linear` for n > 8 rows through `gemm_pipe` (multi-stage bf16 mma.sync GEMM):
//!
//! - activations to bf16 (`cast_bf16`), unless x carries the bf16 copy its producer wrote
//!   (`GpuTensor::bf16`: the multi-row GLU), which is the same bits;
//! - BF16 weights: the GEMM reads them in place;
//! - GGUF block weights (Q8_0 Q4_0 Q5_0 Q4_K Q6_K): `dequant_bf16` turns a chunk of output rows
//!   into a pooled bf16 scratch, then the GEMM writes that chunk's columns of the output (row
//!   stride = all outputs). Chunks split the rows evenly so that the scratch stays within
//!   [`gemm_scratch_bytes`] (256 MiB: Qwen3-8B's 24576 x 4096 gate|up and Gemma 4 12B's 30720 x 3840
//!   run whole, as one GEMM on the wide tile; an LM head of 151936 x 4096 runs as 5 chunks, not one
//!   1.2 GB copy). Scratch requests above 1/16 of the cap take the whole cap, so one pooled buffer
//!   serves every large weight of a model.
//!
//! Weight values are the CPU dequantiser's rounded to bf16 (round to nearest even), exactly as
//! the older per-tile `gemm` loader rounds them. Shapes the kernel does not take (k not a
//! multiple of 8, an odd number of outputs, unaligned weights, other formats) return None and
//! the caller falls back to `gemm` / the GEMV.

use super::linear::{slice, sub};
use super::CudaBackend;
use crate::backend::cuda::ops::linear::gemm_pipe::{chunk_rows, GemmPipe, GEMM_PIPE_BK};
use crate::backend::cuda::runtime::buf::{DevBuf, DevPtr};
use crate::backend::cuda::runtime::types::{GpuTensor, WeightView};
use crate::backend::cuda::weight_block;
use crate::backend::{BackendError, Result};
use crate::kernels::{BatchBucket, Op, Quant};

/// Whether `q` has a `gemm_pipe` path (bf16 or f16 in place, or through `dequant_bf16`).
pub(crate) fn has_pipe(q: Quant) -> bool {
    matches!(
        q,
        Quant::Bf16
            | Quant::F16
            | Quant::Q8_0
            | Quant::Q8_0R
            | Quant::Q4_0
            | Quant::Q4_0R
            | Quant::Q5_0
            | Quant::Q4K
            | Quant::Q4KR
            | Quant::Q6K
            | Quant::Q6KR
    )
}

impl CudaBackend {
    /// The `gemm_pipe` kernels of this device, loaded once (None when the device has no
    /// instance or none of its tiles fits).
    pub(crate) fn gemm_pipe(&self) -> Option<&GemmPipe> {
        self.gemm_pipe
            .get_or_init(|| self.dev.gemm_pipe_kernels().ok())
            .as_ref()
    }

    /// The f16 `gemm_pipe` kernels (f16 weights), loaded once.
    pub(crate) fn gemm_pipe_f16(&self) -> Option<&GemmPipe> {
        self.gemm_pipe_f16
            .get_or_init(|| self.dev.gemm_pipe_kernels_of(Quant::F16).ok())
            .as_ref()
    }

    /// `x @ w^T` through `gemm_pipe` with at most `scratch_cap` bytes of bf16 weight scratch, or
    /// None when this weight / shape has no such path (the caller falls back).
    pub(super) fn linear_pipe(
        &self,
        x: &GpuTensor,
        v: &WeightView,
        scratch_cap: usize,
    ) -> Result<Option<GpuTensor>> {
        let (n, k, out) = (x.rows, x.cols, v.rows);
        if !has_pipe(v.quant) || n == 0 || k % 8 != 0 || out % 2 != 0 || v.data.raw() % 16 != 0 {
            return Ok(None);
        }
        let g = if v.quant == Quant::F16 {
            self.gemm_pipe_f16()
        } else {
            self.gemm_pipe()
        };
        let Some(g) = g else {
            return Ok(None);
        };
        let deq = if matches!(v.quant, Quant::Bf16 | Quant::F16) {
            None
        } else {
            match self.kern(Op::DequantBf16, v.quant, BatchBucket::Any) {
                Ok(kd) => Some(kd),
                Err(_) => return Ok(None),
            }
        };
        let (be, bb) = weight_block(v.quant).ok_or_else(|| shape(format!("{}", v.quant)))?;
        if k % be != 0 {
            return Ok(None);
        }
        // activations to bf16 (or the copy their producer wrote); f16 with row scales for f16
        // weights
        let (_a, a16, rs) = if v.quant == Quant::F16 {
            let (a, rs, a16) = self.f16_activations(x)?;
            (Some(a), a16, Some(rs))
        } else {
            let (a, a16) = self.bf16_activations(x)?;
            (a, a16, None)
        };
        let rsp = rs.as_ref().map(|r| r.f32());
        let c = self.pool.alloc(n * out * 4)?;
        let call = slice(c.f32(), n * out)?;
        let launch = |w16: DevPtr<u16>, c0: usize, rows: usize| -> Result<()> {
            let tile = g
                .pick(n, rows)
                .ok_or_else(|| BackendError::Device("gemm_pipe: no usable tile".into()))?;
            let cp = sub(call, c0, (n - 1) * out + rows)?;
            self.dev
                .gemm_pipe_ptr(g, tile, a16, w16, cp, (n, rows, k), out, rsp)?;
            Ok(())
        };
        match deq {
            None => {
                let w16 = slice(v.data.cast::<u16>(), out * k)?;
                launch(w16, 0, out)?;
            }
            Some(kd) => {
                let rows_per = chunk_rows(out, k, scratch_cap);
                let need = rows_per.min(out) * k * 2;
                let bytes = if need > scratch_cap / 16 {
                    need.max(scratch_cap)
                } else {
                    need
                };
                let scratch = self.pool.alloc(bytes)?;
                let row_bytes = k / be * bb;
                let mut r0 = 0;
                while r0 < out {
                    let rows = rows_per.min(out - r0);
                    let w16 = slice(scratch.ptr::<u16>(), rows * k)?;
                    let wq = sub(v.data, r0 * row_bytes, rows * row_bytes)?;
                    self.dev.dequant_bf16_ptr(&kd, wq, w16, (rows, k))?;
                    launch(w16, r0, rows)?;
                    r0 += rows;
                }
            }
        }
        Ok(Some(GpuTensor::new(c, n, out)))
    }

    /// The f16 form of `x` (`[n][k]`, `cast_f16`): the f16 rows, their scales, and a pointer to
    /// the rows.
    pub(super) fn f16_activations(&self, x: &GpuTensor) -> Result<(DevBuf, DevBuf, DevPtr<u16>)> {
        let len = x.rows * x.cols;
        let a = self.pool.alloc(len * 2)?;
        let rs = self.pool.alloc(x.rows * 4)?;
        let a16 = slice(a.ptr::<u16>(), len)?;
        let cast = self.kern(Op::CastF16, Quant::F32, BatchBucket::Any)?;
        self.dev
            .cast_f16_ptr(&cast, x.ptr(), a16, rs.f32(), (x.rows, x.cols))?;
        Ok((a, rs, a16))
    }

    /// The bf16 form of `x` (`[n][k]`): its side-car when it carries one, else a `cast_bf16`
    /// into a pooled buffer (returned with the pointer, to keep it alive).
    pub(super) fn bf16_activations(&self, x: &GpuTensor) -> Result<(Option<DevBuf>, DevPtr<u16>)> {
        let len = x.rows * x.cols;
        if let Some(s) = x.bf16.as_ref().filter(|s| s.len == len) {
            return Ok((None, s.ptr()));
        }
        let a = self.pool.alloc(len * 2)?;
        let a16 = slice(a.ptr::<u16>(), len)?;
        let cast = self.kern(Op::CastBf16, Quant::F32, BatchBucket::Any)?;
        self.dev.cast_bf16_ptr(&cast, x.ptr(), a16)?;
        Ok((Some(a), a16))
    }

    /// `x @ w^T` through `gemm_pipe` (n > 8 rows), with `scratch_cap` bytes of weight scratch at
    /// most: an error where that path does not apply. For checks and benchmarks; models call
    /// `linear`, which takes this path for n > 8 with [`gemm_scratch_bytes`].
    #[doc(hidden)]
    pub fn linear_gemm_pipe(
        &self,
        x: &GpuTensor,
        w: &crate::backend::cuda::runtime::types::GpuWeight,
        scratch_cap: usize,
    ) -> Result<GpuTensor> {
        let v = w.matrix()?;
        if x.cols != v.cols {
            return Err(shape(format!(
                "x [{}, {}] against weight {:?}",
                x.rows, x.cols, w.shape
            )));
        }
        self.linear_pipe(x, &v, scratch_cap)?.ok_or_else(|| {
            shape(format!(
                "no gemm_pipe path for {} weight {:?} (k % {} / alignment / device)",
                v.quant, w.shape, GEMM_PIPE_BK
            ))
        })
    }
}

fn shape(detail: String) -> BackendError {
    BackendError::Shape {
        op: "linear",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stay_under_the_cap_and_split_evenly() {
        let cap = 128 << 20;
        // LM head 151936 x 4096: 10 chunks of 15232 rows
        let r = chunk_rows(151_936, 4096, cap);
        assert!(r * 4096 * 2 <= cap && r % 128 == 0);
        assert_eq!(151_936usize.div_ceil(r), 10);
        // gate|up 24576 x 4096 (192 MiB): two even chunks
        assert_eq!(chunk_rows(24_576, 4096, cap), 12_288);
        // fits whole: one chunk covering every row
        assert!(chunk_rows(6144, 4096, cap) >= 6144);
        assert!(chunk_rows(1000, 64, cap) >= 1000);
        // a tiny cap still makes progress (128 rows)
        assert_eq!(chunk_rows(1000, 4096, 1), 128);
        // chunking a small cap: 512 rows of 1024 per 1 MiB
        let r = chunk_rows(1000, 1024, 1 << 20);
        assert!(r % 128 == 0 && r * 1024 * 2 <= 1 << 20 && 1000usize.div_ceil(r) == 2);
        assert!(has_pipe(Quant::Q4K) && has_pipe(Quant::Bf16) && has_pipe(Quant::F16));
        assert!(!has_pipe(Quant::F32));
    }
}
