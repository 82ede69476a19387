//! CPU weights: an owned copy of the checkpoint bytes in their stored format, dequantised a row
//! at a time when used.
//!
//! `upload` copies the tensor's bytes (and scale bytes) out of the memory map into a `Vec<u8>`:
//! the `TensorRef` only borrows the map, and the `Backend::Weight` type must be `'static`. The
//! copy is the size of the checkpoint tensor (no f32 expansion), except for F32 tensors, which
//! are stored as `Vec<f32>` (same size) so they can be read without conversion.

use crate::backend::{BackendError, Result};
use crate::quant::{self, GgmlType};
use crate::weights::{ScaleData, Scales, TensorFormat, TensorRef};

/// Owned scale bytes (see `crate::weights::ScaleData`).
#[derive(Debug, Clone)]
pub enum OwnedScale {
    F32(Vec<u8>),
    Bf16(Vec<u8>),
    F16(Vec<u8>),
    E4m3(Vec<u8>),
}

impl OwnedScale {
    fn from_ref(s: &ScaleData<'_>) -> Self {
        match s {
            ScaleData::F32(b) => OwnedScale::F32(b.to_vec()),
            ScaleData::Bf16(b) => OwnedScale::Bf16(b.to_vec()),
            ScaleData::F16(b) => OwnedScale::F16(b.to_vec()),
            ScaleData::E4m3(b) => OwnedScale::E4m3(b.to_vec()),
        }
    }
    fn as_ref(&self) -> ScaleData<'_> {
        match self {
            OwnedScale::F32(b) => ScaleData::F32(b),
            OwnedScale::Bf16(b) => ScaleData::Bf16(b),
            OwnedScale::F16(b) => ScaleData::F16(b),
            OwnedScale::E4m3(b) => ScaleData::E4m3(b),
        }
    }
}

#[derive(Debug)]
enum Storage {
    /// F32 tensors, decoded once at upload (same size as the checkpoint bytes).
    F32(Vec<f32>),
    /// Any other format, byte for byte as in the checkpoint.
    Bytes(Vec<u8>),
}

/// A parameter on the CPU backend.
#[derive(Debug)]
pub struct CpuWeight {
    pub name: String,
    pub shape: Vec<usize>,
    pub format: TensorFormat,
    storage: Storage,
    scale_block: Option<OwnedScale>,
    scale_global: Option<f32>,
    rows: usize,
    cols: usize,
    /// Bytes per row for GGML formats.
    row_bytes: usize,
}

impl CpuWeight {
    pub fn from_ref(t: &TensorRef<'_>) -> Result<Self> {
        let (rows, cols) = (t.rows(), t.cols());
        let bad = |detail: String| BackendError::Shape {
            op: "upload",
            detail: format!("{}: {detail}", t.name),
        };
        let mut row_bytes = 0;
        let storage = match t.format {
            TensorFormat::Ggml(GgmlType::F32) => {
                if t.data.len() < rows * cols * 4 {
                    return Err(bad(format!("{} bytes for {rows}x{cols} f32", t.data.len())));
                }
                Storage::F32(
                    t.data[..rows * cols * 4]
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
            }
            TensorFormat::Ggml(ty) => {
                if !ty.can_dequantize() {
                    return Err(BackendError::Unsupported {
                        op: "upload",
                        backend: "cpu",
                        detail: format!("{}: GGML type {}", t.name, ty.name()),
                    });
                }
                row_bytes = ty.row_bytes(cols)?;
                if t.data.len() < rows * row_bytes {
                    return Err(bad(format!(
                        "{} bytes, need {}",
                        t.data.len(),
                        rows * row_bytes
                    )));
                }
                Storage::Bytes(t.data[..rows * row_bytes].to_vec())
            }
            TensorFormat::Fp8 { .. } | TensorFormat::NvFp4 => {
                // Validate once through the reference dequantiser (row 0), then keep the bytes.
                if rows > 0 {
                    let mut probe = vec![0f32; cols];
                    t.dequantize_rows(0, 1, &mut probe)
                        .map_err(|e| BackendError::Device(e.to_string()))?;
                }
                Storage::Bytes(t.data.to_vec())
            }
        };
        Ok(CpuWeight {
            name: t.name.clone(),
            shape: t.shape.clone(),
            format: t.format,
            storage,
            scale_block: t.scales.block.as_ref().map(OwnedScale::from_ref),
            scale_global: t.scales.global,
            rows,
            cols,
            row_bytes,
        })
    }

    /// Rows of the `[numel / cols, cols]` view.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Length of the contiguous last axis.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The f32 values when the weight is stored as F32.
    pub fn f32_data(&self) -> Option<&[f32]> {
        match &self.storage {
            Storage::F32(v) => Some(v),
            Storage::Bytes(_) => None,
        }
    }

    /// The stored bytes of row `r` for GGML block formats.
    pub fn ggml_row(&self, r: usize) -> Option<(GgmlType, &[u8])> {
        match (&self.storage, self.format) {
            (Storage::Bytes(b), TensorFormat::Ggml(ty)) => {
                Some((ty, &b[r * self.row_bytes..(r + 1) * self.row_bytes]))
            }
            _ => None,
        }
    }

    /// Dequantise row `r` (of the `[rows, cols]` view) into `out` (`cols` values).
    /// Callers guarantee `r < rows` and `out.len() == cols`.
    pub fn dequant_row(&self, r: usize, out: &mut [f32]) -> Result<()> {
        debug_assert!(r < self.rows && out.len() == self.cols);
        match &self.storage {
            Storage::F32(v) => {
                out.copy_from_slice(&v[r * self.cols..(r + 1) * self.cols]);
                Ok(())
            }
            Storage::Bytes(b) => match self.format {
                TensorFormat::Ggml(ty) => {
                    quant::dequantize_row(
                        ty,
                        &b[r * self.row_bytes..(r + 1) * self.row_bytes],
                        out,
                    );
                    Ok(())
                }
                _ => {
                    let view = TensorRef {
                        name: String::new(),
                        shape: self.shape.clone(),
                        format: self.format,
                        data: b,
                        scales: Scales {
                            block: self.scale_block.as_ref().map(|s| s.as_ref()),
                            global: self.scale_global,
                        },
                    };
                    view.dequantize_rows(r, 1, out)
                        .map_err(|e| BackendError::Device(format!("{}: {e}", self.name)))
                }
            },
        }
    }

    /// The whole tensor as f32 (vectors, tests).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (r, o) in out.chunks_exact_mut(self.cols).enumerate() {
                self.dequant_row(r, o)?;
            }
        }
        Ok(out)
    }
}

/// f32 dot product with several accumulators so the compiler vectorises it.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}
