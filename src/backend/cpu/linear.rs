//! Matrix products against weights kept in their checkpoint format.
//!
//! `x @ w[row0 .. row0 + n_out]^T`: parallel over output rows with rayon; each task takes one
//! weight row at a time and dots it with every activation row, so a weight is read once per call
//! whatever the number of tokens. Two inner paths:
//! - reference: dequantise the row to f32 (scratch buffer) and take f32 dot products;
//! - int8 (GGML block weights, `fast`): see `qdot.rs`.
//!
//! Measured on the 2-core build machine (CPU time, one thread): about 0.75 ns per weight for a
//! decode step of Gemma 3 270M Q4_K_M (Q8_0 / Q5_0 / Q4_K / Q6_K), on both paths; compiling the
//! bodies with AVX2 enabled made no measurable difference, so they are plain Rust.

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
                    int8_rows(w, r0, chunk, n, xq);
                    Ok(())
                }
                None => f32_rows(w, r0, chunk, x),
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

#[inline]
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

#[inline]
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
