//! `linear` (`x @ w^T`) on the device.
//!
//! - n <= 8 rows: the decode GEMV of the smallest batch bucket >= n (1, 2, 4, 8); block formats
//!   first quantise the activations to int8 per 32 (`quantize_q8`), unless x is one row that
//!   carries the int8 side-car its producer wrote (rmsnorm, add_rmsnorm, glu: same bytes). When n is not a bucket the
//!   rows are padded with zeros (the GEMV reads `bucket` rows of x, `[bucket][k]`, and writes
//!   `bucket` rows of y; the tensor returned is the first n rows of that buffer).
//! - n > 8, bf16 weights of at most [`ROUTER_MAX_OUT`] outputs: `gemm_f32` (f32 activations).
//! - n > 8: activations to bf16 (`cast_bf16`, or the bf16 copy x carries) and the tensor-core GEMM: `gemm_pipe` over bf16
//!   weights, or over GGUF block weights dequantised to bf16 chunk by chunk (`linear_pipe.rs`);
//!   shapes it does not take go to the per-format `gemm` (dequantising tiles in its loader);
//!   formats without a GEMM (F32, F16) run the batch-8 GEMV over chunks of 8 rows.
//!
//! The n = 1 path allocates only from the pool and copies nothing from the host.

use super::CudaBackend;
use crate::backend::cuda::runtime::buf::{memset, DevBuf, DevPtr};
use crate::backend::cuda::runtime::types::{GpuTensor, GpuWeight, Q8Ptrs, Q8Side};
use crate::backend::cuda::weight_block;
use crate::backend::{BackendError, Result};
use crate::kernels::Entry;
use crate::kernels::{BatchBucket, Op, Quant};

/// Most outputs of a bf16 projection that prefill runs on CUDA cores in f32 (`gemm_f32`) instead
/// of the tensor-core GEMM over bf16-rounded activations: MoE routers (up to 256 experts). A
/// top-k taken on logits computed from rounded activations picks another expert wherever two
/// are within that rounding (measured on a Qwen3-MoE fidelity case: one prompt position's MoE
/// output 32% away from the reference's, `fucina selftest --bisect`); the work is small.
pub(crate) const ROUTER_MAX_OUT: usize = 256;

/// The GEMV bucket for `n` rows (n in 1..=8).
pub(crate) fn gemv_bucket(n: usize) -> Option<(BatchBucket, usize)> {
    match n {
        1 => Some((BatchBucket::B1, 1)),
        2 => Some((BatchBucket::B2, 2)),
        3..=4 => Some((BatchBucket::B4, 4)),
        5..=8 => Some((BatchBucket::B8, 8)),
        _ => None,
    }
}

/// Whether decode runs a fused gate|up GEMV through its `__glu` entry, unless
/// `FUCINA_GEMV_GLU=0` (read once; for A/B runs) keeps the GEMV and the GLU kernel apart.
fn gemv_glu_enabled() -> bool {
    crate::tuning::get().gemv_glu
}

/// Whether the weight format has a tensor-core GEMM instance taking bf16 activations.
pub(crate) fn has_gemm(q: Quant) -> bool {
    matches!(
        q,
        Quant::Bf16 | Quant::Q8_0 | Quant::Q4_0 | Quant::Q5_0 | Quant::Q4K | Quant::Q6K
    )
}

fn shape(detail: String) -> BackendError {
    BackendError::Shape {
        op: "linear",
        detail,
    }
}

impl CudaBackend {
    pub(super) fn linear_impl(&self, x: &GpuTensor, w: &GpuWeight) -> Result<GpuTensor> {
        let v = w.matrix()?;
        let (n, k, out) = (x.rows, x.cols, v.rows);
        if k != v.cols {
            return Err(shape(format!(
                "x [{n}, {k}] against weight {:?} (in = {})",
                w.shape, v.cols
            )));
        }
        if n == 0 {
            return Ok(GpuTensor::new(self.pool.alloc(0)?, 0, out));
        }
        let (be, _) = weight_block(v.quant)
            .ok_or_else(|| shape(format!("no kernels for weight format {}", v.quant)))?;
        if be > 1 && k % 32 != 0 {
            return Err(shape(format!("{k} inputs is not whole 32-value blocks")));
        }
        if n <= 8 {
            // one row with the int8 side-car its producer wrote: no quantize_q8 launch
            let q8 =
                x.q8.as_ref()
                    .filter(|s| n == 1 && s.len == k)
                    .map(|s| s.ptrs());
            return self.gemv_rows(x.ptr(), n, v.data, v.quant, (out, k), q8);
        }
        // narrow float projections (MoE routers) in f32: see ROUTER_MAX_OUT
        let exact = out <= ROUTER_MAX_OUT && matches!(v.quant, Quant::Bf16 | Quant::F16);
        if !exact {
            if let Some(y) = self.linear_pipe(x, &v, crate::tuning::get().gemm_scratch_bytes)? {
                return Ok(y);
            }
        }
        if has_gemm(v.quant) && k % 8 == 0 && !exact {
            if let Ok(g) = self.kern(Op::Gemm, v.quant, BatchBucket::Any) {
                let (_a, a16) = self.bf16_activations(x)?;
                let c = self.pool.alloc(n * out * 4)?;
                self.dev
                    .gemm_ptr(&g, a16, v.data, slice(c.f32(), n * out)?, (n, out, k))?;
                return Ok(GpuTensor::new(c, n, out));
            }
        }
        if exact || matches!(v.quant, Quant::F32 | Quant::F16) {
            if let Ok(g) = self.kern(Op::GemmF32, v.quant, BatchBucket::Any) {
                let c = self.pool.alloc(n * out * 4)?;
                self.dev.gemm_f32_ptr(
                    &g,
                    x.ptr(),
                    v.data,
                    slice(c.f32(), n * out)?,
                    (n, out, k),
                )?;
                return Ok(GpuTensor::new(c, n, out));
            }
        }
        // chunks of 8 rows through the batch-8 GEMV (output rows rounded up to 8)
        let chunks = n.div_ceil(8);
        let y = self.pool.alloc(chunks * 8 * out * 4)?;
        let xp = x.ptr();
        for c in 0..chunks {
            let rows = 8.min(n - 8 * c);
            let xs = sub(xp, 8 * c * k, rows * k)?;
            let part = self.gemv_rows(xs, rows, v.data, v.quant, (out, k), None)?;
            let dst = sub(y.f32(), 8 * c * out, rows * out)?;
            crate::backend::cuda::runtime::buf::copy(self.pool.stream(), dst, part.ptr())?;
        }
        Ok(GpuTensor::new(y, n, out))
    }

    /// `act(x Wg^T) * (x Wu^T)` of a fused gate|up weight. One row against a repacked Q8_0 /
    /// Q4_0 / Q4_K weight (q8_0r / q4_0r / q4_kr, `2 ff` rows, ff a multiple of 32) whose ff / 32 blocks fit
    /// the GPU at once runs the batch-1 GEMV's `__glu` entry: the GEMV, the GLU and the int8
    /// side-car of h in one launch, the same values as `linear` then `glu_fused`. Anything else
    /// (or `FUCINA_GEMV_GLU=0`) runs those two.
    pub(super) fn linear_glu_impl(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        act: crate::backend::Activation,
    ) -> Result<GpuTensor> {
        if let Some(h) = self.gemv_glu(x, w, act)? {
            return Ok(h);
        }
        let y = self.linear_impl(x, w)?;
        self.glu_fused_impl(&y, act)
    }

    /// Whether a one-row `linear` over `w` (`[n, k]` in `quant`) splits each row's k range over
    /// several warps (the GEMV's `__ks` entry: the same dots, summed in another order).
    pub(crate) fn gemv_splits_k(&self, quant: Quant, n: usize, k: usize) -> bool {
        self.kern(Op::Gemv, quant, BatchBucket::B1).is_ok_and(|kn| {
            crate::backend::cuda::ops::linear::launch::gemv_ks(kn.spec, n, k).is_some()
        })
    }

    /// The one-launch form of [`Self::linear_glu_impl`], None where it does not apply.
    pub(crate) fn gemv_glu(
        &self,
        x: &GpuTensor,
        w: &GpuWeight,
        act: crate::backend::Activation,
    ) -> Result<Option<GpuTensor>> {
        let v = w.matrix()?;
        let k = x.cols;
        if x.rows != 1 {
            return Ok(None);
        }
        let Some(e) = self.glu_entry(k, &v) else {
            return Ok(None);
        };
        let mut own = None;
        let xs = self.row_side_car(x, &mut own)?;
        self.glu_launch(&e, &v, xs, act, None).map(Some)
    }

    /// One `__glu` (rs None) or `__glurs` launch `e` of the fused gate|up `v` over a row's
    /// int8 side-car `(xq, xds)`: h and its own side-car.
    pub(super) fn glu_launch(
        &self,
        e: &crate::backend::cuda::runtime::kern::KernEntry,
        v: &crate::backend::cuda::runtime::types::WeightView,
        (xq, xds): Q8Ptrs,
        act: crate::backend::Activation,
        rs: Option<crate::backend::cuda::ops::linear::res::RsArgs>,
    ) -> Result<GpuTensor> {
        let ff = v.rows / 2;
        let h = self.alloc_tensor(1, ff)?;
        let side = self
            .q8_side(1, ff)?
            .ok_or_else(|| shape(format!("no side-car for {ff} values")))?;
        self.dev.gemv_glu_ptr(
            e,
            &crate::backend::cuda::GemvGluArgs {
                w: v.data,
                xq,
                xds,
                h: h.ptr(),
                hq: side.q(),
                hds: side.ds(),
                ff,
                k: v.cols,
                act,
                rs,
            },
            self.sms,
        )?;
        Ok(h.with_q8(Some(side)))
    }

    /// The int8 side-car of the one-row `x`: the one its producer wrote, or quantised here into
    /// `own` (which the caller keeps until the launch reading it is queued).
    pub(super) fn row_side_car(&self, x: &GpuTensor, own: &mut Option<Q8Side>) -> Result<Q8Ptrs> {
        let k = x.cols;
        if let Some(s) = x.q8.as_ref().filter(|s| x.rows == 1 && s.len == k) {
            return Ok(s.ptrs());
        }
        let side = self
            .q8_side(1, k)?
            .ok_or_else(|| shape(format!("no side-car for {k} values")))?;
        let qk = self.kern(Op::QuantizeQ8, Quant::F32, BatchBucket::Any)?;
        self.dev
            .quantize_q8_ptr(&qk, x.ptr(), side.q(), side.ds())?;
        Ok(own.insert(side).ptrs())
    }

    /// The `__glu` entry a one-row input of `k` values against the fused gate|up weight `v`
    /// runs through, None where [`Self::gemv_glu`] does not apply (not a repacked format of
    /// whole rows of `k`, ff not a multiple of 32, its ff / 32 blocks not all resident at once,
    /// or `FUCINA_GEMV_GLU=0`).
    pub(super) fn glu_entry(
        &self,
        k: usize,
        v: &crate::backend::cuda::runtime::types::WeightView,
    ) -> Option<crate::backend::cuda::runtime::kern::KernEntry> {
        let ff = v.rows / 2;
        let fits = crate::quant::repack::source_of(v.quant).is_some_and(|(_, s)| s.fits(k));
        if v.cols != k || v.rows % 2 != 0 || ff % 32 != 0 || ff == 0 || !fits {
            return None;
        }
        if !gemv_glu_enabled() {
            return None;
        }
        let e = self
            .kern_entry_at(Op::Gemv, v.quant, BatchBucket::B1, Entry::Glu)
            .ok()?;
        self.dev
            .gemv_glu_warps(&e, (ff / 32) as u32, self.sms)
            .map(|_| e)
    }

    /// `rows` (1..=8) rows of `x` against `w` (`[out, k]` of `q`) through the GEMV bucket.
    /// `q8`: the int8 side-car of exactly `x` (used by block formats when `rows` is a bucket).
    fn gemv_rows(
        &self,
        x: DevPtr<f32>,
        rows: usize,
        w: DevPtr<u8>,
        q: Quant,
        (out, k): (usize, usize),
        q8: Option<Q8Ptrs>,
    ) -> Result<GpuTensor> {
        let (bucket, b) = gemv_bucket(rows).ok_or_else(|| shape(format!("{rows} GEMV rows")))?;
        let kn = self.kern(Op::Gemv, q, bucket)?;
        // x padded to `b` rows with zeros when rows is not a bucket
        let padded: Option<DevBuf> = if rows == b {
            None
        } else {
            let p = self.pool.alloc(b * k * 4)?;
            let all = slice(p.f32(), b * k)?;
            memset(self.pool.stream(), all, 0)?;
            crate::backend::cuda::runtime::buf::copy(self.pool.stream(), slice(all, rows * k)?, x)?;
            Some(p)
        };
        let xb = match &padded {
            Some(p) => slice(p.f32(), b * k)?,
            None => x,
        };
        let block = weight_block(q).is_some_and(|(be, _)| be > 1);
        let (qbuf, dbuf);
        let side = q8
            .filter(|(sq, sds)| block && rows == b && sq.len() >= b * k && sds.len() >= b * k / 16);
        let (xq, xds) = if let Some(s) = side {
            s
        } else if block {
            qbuf = self.pool.alloc(b * k)?;
            dbuf = self.pool.alloc(b * k / 16 * 4)?;
            let (xq, xds) = (
                slice(qbuf.ptr::<i8>(), b * k)?,
                slice(dbuf.f32(), b * k / 16)?,
            );
            let qk = self.kern(Op::QuantizeQ8, Quant::F32, BatchBucket::Any)?;
            self.dev.quantize_q8_ptr(&qk, xb, xq, xds)?;
            (xq, xds)
        } else {
            (DevPtr::null(), DevPtr::null())
        };
        let y = self.pool.alloc(b * out * 4)?;
        self.dev.gemv_ptr(
            &kn,
            w,
            xb,
            xq,
            xds,
            slice(y.f32(), b * out)?,
            (out, k),
            self.sms,
        )?;
        Ok(GpuTensor::new(y, rows, out))
    }
}

/// The first `len` values of `p` (an error when shorter).
pub(crate) fn slice<T>(p: DevPtr<T>, len: usize) -> Result<DevPtr<T>> {
    sub(p, 0, len)
}

/// Values `[start, start + len)` of `p` (an error when out of range).
pub(crate) fn sub<T>(p: DevPtr<T>, start: usize, len: usize) -> Result<DevPtr<T>> {
    p.slice(start, len).ok_or_else(|| {
        BackendError::Device(format!(
            "values [{start}, {start}+{len}) of a device buffer of {}",
            p.len()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_small_batches() {
        assert_eq!(gemv_bucket(1), Some((BatchBucket::B1, 1)));
        assert_eq!(gemv_bucket(2), Some((BatchBucket::B2, 2)));
        assert_eq!(gemv_bucket(3), Some((BatchBucket::B4, 4)));
        assert_eq!(gemv_bucket(5), Some((BatchBucket::B8, 8)));
        assert_eq!(gemv_bucket(8), Some((BatchBucket::B8, 8)));
        assert_eq!(gemv_bucket(0), None);
        assert_eq!(gemv_bucket(9), None);
        assert!(has_gemm(Quant::Q4K) && has_gemm(Quant::Bf16));
        assert!(!has_gemm(Quant::F16) && !has_gemm(Quant::F32) && !has_gemm(Quant::Fp8E4m3));
    }
}
