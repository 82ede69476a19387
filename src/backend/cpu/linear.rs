//! Matrix products against weights kept in their checkpoint format.
//!
//! `x @ w[row0 .. row0 + n_out]^T`: parallel over output rows with rayon; each task dequantises
//! one weight row at a time into a scratch buffer and dots it with every activation row, so a
//! weight is read once per call whatever the number of tokens.

use rayon::prelude::*;

use super::weight::{dot, CpuWeight};
use super::CpuTensor;
use crate::backend::{BackendError, Result};

/// Output rows handled by one rayon task.
const ROWS_PER_TASK: usize = 16;

/// `x @ w[row0 .. row0 + n_out]^T` -> `[x.rows, n_out]`.
pub fn matmul_rows(x: &CpuTensor, w: &CpuWeight, row0: usize, n_out: usize) -> Result<CpuTensor> {
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
    // Transposed result [n_out, n]: each task owns whole output rows.
    let mut out_t = vec![0f32; n_out * n];
    out_t
        .par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .try_for_each_init(
            || vec![0f32; k],
            |scratch, (ci, chunk)| -> Result<()> {
                for (j, orow) in chunk.chunks_exact_mut(n).enumerate() {
                    let r = row0 + ci * ROWS_PER_TASK + j;
                    let wrow: &[f32] = match w.f32_data() {
                        Some(f) => &f[r * k..(r + 1) * k],
                        None => {
                            w.dequant_row(r, scratch)?;
                            scratch
                        }
                    };
                    for (t, o) in orow.iter_mut().enumerate() {
                        *o = dot(&x.data[t * k..(t + 1) * k], wrow);
                    }
                }
                Ok(())
            },
        )?;
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
