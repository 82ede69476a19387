//! Matrix products against weights kept in their checkpoint format.
//!
//! `x @ w[row0 .. row0 + n_out]^T`: parallel over output rows with rayon; each task takes one
//! weight row at a time and dots it with every activation row, so a weight is read once per call
//! whatever the number of tokens. Two inner paths:
//! - reference: dequantise the row to f32 (scratch buffer) and take f32 dot products;
//! - int8 (GGML block weights, `fast`): see `qdot.rs`.
//!
//! The per-task bodies are compiled twice, plain and with AVX2+FMA enabled (chosen at run time),
//! so the loops vectorise on current x86 CPUs without requiring them.

use rayon::prelude::*;

use super::qdot::{self, QuantRows, Unpacked};
use super::weight::{dot, CpuWeight};
use super::CpuTensor;
use crate::backend::{BackendError, Result};

/// Output rows handled by one rayon task.
const ROWS_PER_TASK: usize = 16;

/// `x @ w[row0 .. row0 + n_out]^T` -> `[x.rows, n_out]`.
pub fn matmul_rows(
    x: &CpuTensor,
    w: &CpuWeight,
    row0: usize,
    n_out: usize,
    fast: bool,
) -> Result<CpuTensor> {
    let (n, k) = (x.rows, x.cols);
    if w.cols() != k {
        return Err(BackendError::Shape {
            op: "linear",
            detail: format!(
                "x is [{n}, {k}] but weight {} has {} columns",
                w.name,
                w.cols()
            ),
        });
    }
    if row0 + n_out > w.rows() {
        return Err(BackendError::Shape {
            op: "linear",
            detail: format!(
                "rows {row0}+{n_out} of weight {} with {} rows",
                w.name,
                w.rows()
            ),
        });
    }
    if n == 0 || n_out == 0 {
        return Ok(CpuTensor::zeros(n, n_out));
    }
    let int8 = fast && w.ggml_row(0).is_some_and(|(ty, _)| qdot::supported(ty)) && k % 32 == 0;
    let xq = if int8 {
        Some(qdot::quantize_rows(&x.data, k))
    } else {
        None
    };
    // Transposed result [n_out, n]: each task owns whole output rows.
    let mut out_t = vec![0f32; n_out * n];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .try_for_each(|(ci, chunk)| -> Result<()> {
            let r0 = row0 + ci * ROWS_PER_TASK;
            match &xq {
                Some(xq) => {
                    with_simd(|| int8_rows(w, r0, chunk, n, xq));
                    Ok(())
                }
                None => with_simd(|| f32_rows(w, r0, chunk, x)),
            }
        })?;
    let mut out = vec![0f32; n * n_out];
    for (o, col) in out_t.chunks_exact(n).enumerate() {
        for (t, v) in col.iter().enumerate() {
            out[t * n_out + o] = *v;
        }
    }
    Ok(CpuTensor {
        rows: n,
        cols: n_out,
        data: out,
    })
}

#[inline(always)]
fn f32_rows(w: &CpuWeight, r0: usize, chunk: &mut [f32], x: &CpuTensor) -> Result<()> {
    let (n, k) = (x.rows, x.cols);
    let mut scratch = Vec::new();
    for (j, orow) in chunk.chunks_exact_mut(n).enumerate() {
        let r = r0 + j;
        let wrow: &[f32] = match w.f32_data() {
            Some(f) => &f[r * k..(r + 1) * k],
            None => {
                scratch.resize(k, 0.0);
                w.dequant_row(r, &mut scratch)?;
                &scratch
            }
        };
        for (t, o) in orow.iter_mut().enumerate() {
            *o = dot(&x.data[t * k..(t + 1) * k], wrow);
        }
    }
    Ok(())
}

#[inline(always)]
fn int8_rows(w: &CpuWeight, r0: usize, chunk: &mut [f32], n: usize, xq: &QuantRows) {
    let mut u = Unpacked::new(xq.k);
    for (j, orow) in chunk.chunks_exact_mut(n).enumerate() {
        let (ty, bytes) = w.ggml_row(r0 + j).expect("checked GGML block weight");
        qdot::unpack_row(ty, bytes, &mut u);
        for (t, o) in orow.iter_mut().enumerate() {
            *o = qdot::dot_row(&u, xq, t);
        }
    }
}

/// Run `f` compiled with AVX2+FMA when the CPU has them.
#[inline(always)]
fn with_simd<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<T>(f: impl FnOnce() -> T) -> T {
            f()
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            return unsafe { avx2(f) };
        }
    }
    f()
}
