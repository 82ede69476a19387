//! Checkpoint tensors in their stored format, and their reference dequantisation.
//!
//! A `TensorRef` borrows bytes from a memory-mapped checkpoint (GGUF or safetensors) together
//! with whatever scale tensors its format needs. Shapes are in PyTorch order: a matrix is
//! `[rows, cols]` = `[out, in]`, and quantisation blocks run along the last (contiguous) axis.

use std::path::PathBuf;

use crate::quant::{self, GgmlType, QuantError};

pub mod checkpoint;
mod formats;
pub mod paths;
pub mod safetensors;

pub use checkpoint::Checkpoint;

/// How a tensor's bytes encode its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorFormat {
    /// A GGML type (F32, F16, BF16 and the block quants) as stored in GGUF.
    Ggml(GgmlType),
    /// safetensors F32 / F16 / BF16 are expressed as `Ggml(F32 | F16 | BF16)`.
    /// FP8 E4M3 with a scale per `[block_rows, block_cols]` block (`weight_scale_inv`, f32
    /// `[ceil(rows/br), ceil(cols/bc)]`). Per-tensor FP8 is a 1x1 grid covering everything;
    /// per-row FP8 is blocks of `[1, cols]`.
    Fp8 {
        block_rows: usize,
        block_cols: usize,
    },
    /// NVFP4: packed E2M1 pairs (low nibble first), an E4M3 scale per 16 elements along a row,
    /// and one f32 global multiplier.
    NvFp4,
}

/// Scale tensors that accompany a quantised weight.
#[derive(Debug, Clone, Copy, Default)]
pub struct Scales<'a> {
    /// FP8: f32 block scales, row-major over the block grid.
    /// NVFP4: E4M3 bytes, `[rows, cols/16]`.
    pub block: Option<ScaleData<'a>>,
    /// NVFP4 global multiplier (already inverted if the checkpoint stores a reciprocal).
    pub global: Option<f32>,
}

/// Raw scale bytes and their element type.
#[derive(Debug, Clone, Copy)]
pub enum ScaleData<'a> {
    F32(&'a [u8]),
    Bf16(&'a [u8]),
    F16(&'a [u8]),
    E4m3(&'a [u8]),
}

impl ScaleData<'_> {
    pub fn get(&self, i: usize) -> f32 {
        match self {
            ScaleData::F32(b) => {
                f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }
            ScaleData::Bf16(b) => quant::bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])),
            ScaleData::F16(b) => quant::f16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])),
            ScaleData::E4m3(b) => quant::e4m3_to_f32(b[i]),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            ScaleData::F32(b) => b.len() / 4,
            ScaleData::Bf16(b) | ScaleData::F16(b) => b.len() / 2,
            ScaleData::E4m3(b) => b.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tensor in a checkpoint, borrowed.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    pub name: String,
    /// PyTorch order, outermost first. A vector is `[n]`.
    pub shape: Vec<usize>,
    pub format: TensorFormat,
    pub data: &'a [u8],
    pub scales: Scales<'a>,
}

/// Errors reading tensors.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("tensor {name}: {source}")]
    Quant { name: String, source: QuantError },
    #[error("tensor {name}: {detail}")]
    Invalid { name: String, detail: String },
    #[error("tensor {0} not found")]
    Missing(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("{path}: not a valid safetensors file: {detail}")]
    Safetensors { path: PathBuf, detail: String },
    #[error("{path}: {detail}")]
    Json { path: PathBuf, detail: String },
    #[error("{path}: {detail}")]
    Layout { path: PathBuf, detail: String },
}

impl<'a> TensorRef<'a> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Length of the contiguous last axis.
    pub fn cols(&self) -> usize {
        *self.shape.last().unwrap_or(&1)
    }
    /// Number of rows when viewed as `[numel / cols, cols]`.
    pub fn rows(&self) -> usize {
        self.numel().checked_div(self.cols()).unwrap_or(0)
    }

    fn invalid(&self, detail: impl Into<String>) -> WeightsError {
        WeightsError::Invalid {
            name: self.name.clone(),
            detail: detail.into(),
        }
    }

    /// Dequantise rows `[row0, row0 + n)` of the `[rows, cols]` view into `out` (`n * cols`).
    pub fn dequantize_rows(
        &self,
        row0: usize,
        n: usize,
        out: &mut [f32],
    ) -> Result<(), WeightsError> {
        let (rows, cols) = (self.rows(), self.cols());
        if row0 + n > rows || out.len() != n * cols {
            return Err(self.invalid(format!(
                "row range {row0}+{n} of {rows}x{cols} into buffer of {}",
                out.len()
            )));
        }
        match self.format {
            TensorFormat::Ggml(ty) => {
                let rb = ty.row_bytes(cols).map_err(|source| WeightsError::Quant {
                    name: self.name.clone(),
                    source,
                })?;
                let need = rb * rows;
                if self.data.len() < need {
                    return Err(self.invalid(format!("{} bytes, need {need}", self.data.len())));
                }
                let src = &self.data[row0 * rb..(row0 + n) * rb];
                quant::dequantize(ty, src, out).map_err(|source| WeightsError::Quant {
                    name: self.name.clone(),
                    source,
                })
            }
            TensorFormat::Fp8 {
                block_rows,
                block_cols,
            } => {
                if self.data.len() < rows * cols || block_rows == 0 || block_cols == 0 {
                    return Err(self.invalid("FP8 data shorter than its shape"));
                }
                let sc = self
                    .scales
                    .block
                    .ok_or_else(|| self.invalid("FP8 weight without scales"))?;
                let gc = cols.div_ceil(block_cols);
                let gr = rows.div_ceil(block_rows);
                if sc.len() < gr * gc {
                    return Err(self.invalid(format!("{} FP8 scales, need {}", sc.len(), gr * gc)));
                }
                for r in 0..n {
                    let row = row0 + r;
                    for c in 0..cols {
                        let s = sc.get((row / block_rows) * gc + c / block_cols);
                        out[r * cols + c] = quant::e4m3_to_f32(self.data[row * cols + c]) * s;
                    }
                }
                Ok(())
            }
            TensorFormat::NvFp4 => {
                if cols % 16 != 0 || self.data.len() < rows * cols / 2 {
                    return Err(self.invalid("NVFP4 data does not match its shape"));
                }
                let sc = self
                    .scales
                    .block
                    .ok_or_else(|| self.invalid("NVFP4 weight without scales"))?;
                if sc.len() < rows * cols / 16 {
                    return Err(self.invalid("NVFP4 scales shorter than the shape needs"));
                }
                let g = self.scales.global.unwrap_or(1.0);
                for r in 0..n {
                    let row = row0 + r;
                    for c in 0..cols {
                        let byte = self.data[(row * cols + c) / 2];
                        let nib = if c % 2 == 0 { byte & 0x0f } else { byte >> 4 };
                        let s = sc.get(row * (cols / 16) + c / 16);
                        out[r * cols + c] = quant::e2m1_to_f32(nib) * s * g;
                    }
                }
                Ok(())
            }
        }
    }

    /// The whole tensor as f32 (for vectors and tests; models keep matrices quantised).
    pub fn to_f32(&self) -> Result<Vec<f32>, WeightsError> {
        let mut out = vec![0f32; self.numel()];
        self.dequantize_rows(0, self.rows(), &mut out)?;
        Ok(out)
    }
}
