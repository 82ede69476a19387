//! Weight upload: checkpoint tensors to the device in their stored format (GGUF blocks and
//! F32/F16/BF16 elements as they are), with host conversion only where no kernel reads the
//! format: other GGML block types become F16, block-scaled FP8 becomes BF16 (no FP8 GEMV yet),
//! 1-D weights (norms, scalars) become f32, BF16 matrices whose values fit f16's range become F16
//! (the prefill GEMM then keeps 11 significant bits of each activation: `gemm_pipe` f16). NVFP4
//! is refused. Q8_0 / Q4_0 / Q4_K matrices whose rows
//! are whole 256-element groups (Q6_K: 2048, and at most 65536 rows) are repacked within each row on the way (`q8_0r`,
//! `q4_0r`, `q4_kr`, `q6_kr`, src/quant/repack.rs: the same bytes, so no second copy;
//! `FUCINA_REPACK=0` keeps the GGUF layout).

use std::sync::atomic::Ordering;

use cudarc::driver::result;

use super::CudaBackend;
use crate::backend::cuda::runtime::buf::{DevBuf, DevPtr};
use crate::backend::cuda::runtime::error::{drv, CudaError};
use crate::backend::cuda::runtime::types::GpuWeight;
use crate::backend::{BackendError, Result};
use crate::kernels::Quant;
use crate::quant::repack::{repacked_of, source_of};
use crate::quant::GgmlType;
use crate::weights::{TensorFormat, TensorRef};

/// How a checkpoint tensor is stored on the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Bytes as they are, read by kernels of this format.
    AsIs(Quant),
    /// GGUF block rows repacked on the host into this repacked format (`q8_0r`, `q4_0r`, `q4_kr`,
    /// `q6_kr`: same length, src/quant/repack.rs), slab by slab.
    Repack(Quant),
    /// Dequantised on the host, stored as F16 (GGML types without kernels).
    ToF16,
    /// Dequantised on the host, stored as BF16 (block-scaled FP8: no FP8 GEMV path yet).
    ToBf16,
    /// A 1-D weight: stored as f32 (what `weight_vector` returns).
    Vector,
    /// Not supported on the CUDA backend.
    Unsupported(String),
}

/// The kernel format of a GGML type stored as it is, if any.
pub(crate) fn ggml_quant(ty: GgmlType) -> Option<Quant> {
    Some(match ty {
        GgmlType::F32 => Quant::F32,
        GgmlType::F16 => Quant::F16,
        GgmlType::BF16 => Quant::Bf16,
        GgmlType::Q8_0 => Quant::Q8_0,
        GgmlType::Q4_0 => Quant::Q4_0,
        GgmlType::Q5_0 => Quant::Q5_0,
        GgmlType::Q4K => Quant::Q4K,
        GgmlType::Q6K => Quant::Q6K,
        _ => return None,
    })
}

/// Whether Q4_0 matrices are repacked at upload (unless `FUCINA_REPACK=0`).
pub(crate) fn repack_enabled() -> bool {
    crate::tuning::get().repack
}

/// Whether Q6_K matrices are repacked (`q6_kr`) when the others are, unless
/// `FUCINA_REPACK_Q6K=0` (for A/B runs).
fn repack_q6k() -> bool {
    crate::tuning::get().repack_q6k
}

/// Most rows of a Q6_K matrix that is repacked. An LM head (151936 rows) keeps the GGUF layout:
/// the staged `q6_k` GEMV streams it at ~3.7 TB/s on the H200, and the register-direct one
/// measured 1-2% slower there; again later (Qwen3-8B decode, prompt 16, two
/// runs each, the head repacked through a temporary row-limit knob): Q4_K_M 513.6 / 515.1 ->
/// 505.6 / 506.6 tok/s, Q4_0 588.4 / 588.8 -> 574.9 / 575.6, the same greedy text.
const Q6K_REPACK_MAX_ROWS: usize = 65536;

/// The storage plan of a tensor of `format` and `shape`; `repack`: Q8_0 / Q4_0 / Q4_K / Q6_K
/// matrices (2-D, rows of whole 256-element groups; 2048 for Q6_K) become `q8_0r` / `q4_0r` /
/// `q4_kr` / `q6_kr`. Expert banks (3-D) keep their layout: the MoE
/// kernels read GGUF blocks.
pub(crate) fn plan(format: TensorFormat, shape: &[usize], repack: bool) -> Plan {
    if format == TensorFormat::NvFp4 {
        return Plan::Unsupported(
            "NVFP4 weights have no kernels on the CUDA backend yet (use --device cpu)".into(),
        );
    }
    if shape.len() <= 1 {
        return Plan::Vector;
    }
    match format {
        TensorFormat::Ggml(ty) => match ggml_quant(ty) {
            Some(q)
                if repack
                    && shape.len() == 2
                    && (q != Quant::Q6K || (repack_q6k() && shape[0] <= Q6K_REPACK_MAX_ROWS)) =>
            {
                match repacked_of(q) {
                    Some((r, split)) if split.fits(shape[1]) => Plan::Repack(r),
                    _ => Plan::AsIs(q),
                }
            }
            Some(q) => Plan::AsIs(q),
            None if ty.can_dequantize() => Plan::ToF16,
            None => Plan::Unsupported(format!("GGML type {} cannot be dequantised", ty.name())),
        },
        TensorFormat::Fp8 { .. } => Plan::ToBf16,
        TensorFormat::NvFp4 => unreachable!("handled above"),
    }
}

/// Whether every value of the BF16 elements `data` is finite and at most f16's largest (65504)
/// in magnitude, so that the matrix converts to f16 exactly (8 significant bits in 11) but for
/// values under 2^-14, which round to f16's subnormal grid (an absolute error of at most 2^-25).
fn bf16_fits_f16(data: &[u8]) -> bool {
    // |b| <= 0x477f (65280, the largest bf16 value below 65504): exponent and mantissa bits
    data.chunks_exact(2)
        .all(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7fff <= 0x477f)
}

/// Token-embedding tables (GGUF `token_embd`, `per_layer_token_embd`; HF `embed_tokens`,
/// `embed_tokens_per_layer`) stay BF16: a gather reads them as they are, so f16 would only
/// round their smallest values to its subnormal grid. (A tied table is also the LM head, which
/// a prefill runs on its last rows only, through the GEMV.)
fn is_embedding_table(name: &str) -> bool {
    name.contains("token_embd") || name.contains("embed_tokens")
}

/// Bytes of `w` stored as `q`: whole blocks per row, and the tensor's data long enough.
fn stored_bytes(w: &TensorRef<'_>, q: Quant) -> Result<usize> {
    let (be, bb) = crate::backend::cuda::weight_block(q)
        .ok_or_else(|| unsupported(&w.name, format!("no kernels for {q}")))?;
    let cols = w.cols();
    if cols % be != 0 {
        return Err(BackendError::Shape {
            op: "upload",
            detail: format!("{}: {cols} columns is not whole {q} blocks", w.name),
        });
    }
    let bytes = w.rows() * (cols / be) * bb;
    if w.data.len() < bytes {
        return Err(BackendError::Shape {
            op: "upload",
            detail: format!(
                "{}: {} bytes for shape {:?} of {q}, need {bytes}",
                w.name,
                w.data.len(),
                w.shape
            ),
        });
    }
    Ok(bytes)
}

fn unsupported(name: &str, detail: String) -> BackendError {
    BackendError::Unsupported {
        op: "upload",
        backend: "cuda",
        detail: format!("{name}: {detail}"),
    }
}

fn werr(e: crate::weights::WeightsError) -> BackendError {
    BackendError::Device(e.to_string())
}

/// Bytes per host->device copy (the progress counter advances by these).
const CHUNK: usize = 64 << 20;

impl CudaBackend {
    /// Copy `data` to `dst` (device) in chunks, counting uploaded bytes.
    fn write_counted(&self, dst: DevPtr<u8>, data: &[u8]) -> Result<()> {
        if data.len() > dst.len() {
            return Err(CudaError::Invalid {
                op: "upload",
                detail: format!("{} bytes into {}", data.len(), dst.len()),
            }
            .into());
        }
        let stream = self.pool.stream();
        crate::backend::cuda::runtime::buf::bind(stream)?;
        for (i, c) in data.chunks(CHUNK).enumerate() {
            let at = dst.raw() + (i * CHUNK) as u64;
            // SAFETY: `dst` addresses data.len() bytes (checked); a pageable source is staged
            // before the call returns.
            unsafe { result::memcpy_htod_async(at, c, stream.cu_stream()) }
                .map_err(drv("uploading weights"))?;
            self.progress.fetch_add(c.len(), Ordering::Relaxed);
        }
        Ok(())
    }

    fn alloc_weight(&self, bytes: usize) -> Result<DevBuf> {
        Ok(self.pool.alloc_persistent(bytes)?)
    }

    /// Dequantise `w` on the host a slab of rows at a time, convert each value with `enc`
    /// (2 bytes per element) and upload.
    fn upload_converted(&self, w: &TensorRef<'_>, enc: fn(f32) -> u16) -> Result<DevBuf> {
        let (rows, cols) = (w.rows(), w.cols());
        let buf = self.alloc_weight(rows * cols * 2)?;
        let slab = (CHUNK / 8 / cols.max(1)).max(1);
        let mut f = Vec::new();
        let mut bytes = Vec::new();
        let mut r = 0;
        while r < rows {
            let n = slab.min(rows - r);
            f.resize(n * cols, 0f32);
            w.dequantize_rows(r, n, &mut f).map_err(werr)?;
            bytes.clear();
            bytes.extend(f.iter().flat_map(|&v| enc(v).to_le_bytes()));
            let dst = buf.u8().slice(r * cols * 2, n * cols * 2).ok_or_else(|| {
                BackendError::Device(format!("{}: converted slab out of range", w.name))
            })?;
            self.write_counted(dst, &bytes)?;
            r += n;
        }
        Ok(buf)
    }

    /// A GGUF block matrix repacked on the host into `to` a slab of rows at a time (one slab of
    /// host memory) and uploaded: the same number of bytes as the file's.
    fn upload_repacked(&self, w: &TensorRef<'_>, to: Quant) -> Result<DevBuf> {
        let (_, split) =
            source_of(to).ok_or_else(|| unsupported(&w.name, format!("{to} is not repacked")))?;
        let bytes = stored_bytes(w, to)?;
        let (rows, cols) = (w.rows(), w.cols());
        if !split.fits(cols) {
            return Err(unsupported(
                &w.name,
                format!("{cols} columns cannot be {to}"),
            ));
        }
        let row = bytes / rows.max(1);
        let buf = self.alloc_weight(bytes)?;
        let slab = (CHUNK / row.max(1)).max(1);
        let mut host = Vec::new();
        let mut r = 0;
        while r < rows {
            let n = slab.min(rows - r);
            let src = &w.data[r * row..(r + n) * row];
            host.resize(src.len(), 0u8);
            split
                .repack(src, cols, &mut host)
                .map_err(|e| unsupported(&w.name, e))?;
            let dst = buf.u8().slice(r * row, n * row).ok_or_else(|| {
                BackendError::Device(format!("{}: repacked slab out of range", w.name))
            })?;
            self.write_counted(dst, &host)?;
            r += n;
        }
        Ok(buf)
    }

    pub(super) fn upload_weight(&self, w: &TensorRef<'_>) -> Result<GpuWeight> {
        let g = self.upload_weight_as(w)?;
        // what the kernels of this model read (`CudaBackend::precompile_model`): the stored
        // format and, for a repacked one, its source's (embedding rows, say)
        let mut q = super::lock(&self.weight_quants);
        q.insert(g.quant);
        q.extend(source_of(g.quant).map(|(src, _)| src));
        Ok(g)
    }

    fn upload_weight_as(&self, w: &TensorRef<'_>) -> Result<GpuWeight> {
        let shape = w.shape.clone();
        let numel = w.numel();
        let weight = |data: DevBuf, quant: Quant, f32: Option<DevBuf>| GpuWeight {
            data,
            quant,
            shape: shape.clone(),
            scales: None,
            fp8_block: (0, 0),
            f32,
        };
        match plan(w.format, &w.shape, repack_enabled()) {
            Plan::Unsupported(d) => Err(unsupported(&w.name, d)),
            Plan::Repack(r) => {
                let buf = self.upload_repacked(w, r)?;
                Ok(weight(buf, r, None))
            }
            Plan::AsIs(Quant::Bf16)
                if w.shape.len() == 2
                    && !is_embedding_table(&w.name)
                    && bf16_fits_f16(&w.data[..(2 * numel).min(w.data.len())]) =>
            {
                let buf = self.upload_converted(w, |v| half::f16::from_f32(v).to_bits())?;
                Ok(weight(buf, Quant::F16, None))
            }
            Plan::AsIs(q) => {
                let bytes = stored_bytes(w, q)?;
                let buf = self.alloc_weight(bytes)?;
                self.write_counted(buf.u8(), &w.data[..bytes])?;
                Ok(weight(buf, q, None))
            }
            Plan::ToF16 => {
                tracing::debug!(
                    "{}: {:?} has no CUDA kernels; stored as F16 (dequantised on the host)",
                    w.name,
                    w.format
                );
                let buf = self.upload_converted(w, |v| half::f16::from_f32(v).to_bits())?;
                Ok(weight(buf, Quant::F16, None))
            }
            Plan::ToBf16 => {
                tracing::debug!(
                    "{}: block-scaled FP8 has no CUDA GEMV yet; stored as BF16",
                    w.name
                );
                let buf = self.upload_converted(w, |v| half::bf16::from_f32(v).to_bits())?;
                Ok(weight(buf, Quant::Bf16, None))
            }
            Plan::Vector => {
                let mut f = vec![0f32; numel];
                if numel > 0 {
                    w.dequantize_rows(0, w.rows(), &mut f).map_err(werr)?;
                }
                let bytes: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
                let data = self.alloc_weight(bytes.len())?;
                self.write_counted(data.u8(), &bytes)?;
                let copy = self.alloc_weight(bytes.len())?;
                crate::backend::cuda::runtime::buf::copy(self.pool.stream(), copy.u8(), data.u8())?;
                Ok(weight(data, Quant::F32, Some(copy)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedding_tables_by_name() {
        for n in [
            "token_embd.weight",
            "per_layer_token_embd.weight",
            "model.embed_tokens.weight",
            "model.language_model.embed_tokens_per_layer.weight",
        ] {
            assert!(is_embedding_table(n), "{n}");
        }
        for n in ["output.weight", "lm_head.weight", "blk.0.attn_q.weight"] {
            assert!(!is_embedding_table(n), "{n}");
        }
    }

    #[test]
    fn bf16_matrices_within_f16_range_convert() {
        let bytes = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
                .collect()
        };
        assert!(bf16_fits_f16(&bytes(&[
            0.0, -0.0, 1e-9, -3.5, 65280.0, -65280.0
        ])));
        // 65536 is the next bf16 value: past f16's 65504
        assert!(!bf16_fits_f16(&bytes(&[1.0, 65536.0])));
        assert!(!bf16_fits_f16(&bytes(&[f32::INFINITY])));
        assert!(!bf16_fits_f16(&bytes(&[f32::NAN])));
        // every value in range converts exactly when at least 2^-14
        for b in 0u16..=0x477f {
            let v = half::bf16::from_bits(b).to_f32();
            if v >= 2f32.powi(-14) {
                assert_eq!(half::f16::from_f32(v).to_f32(), v, "{b:#x}");
            }
        }
    }

    #[test]
    fn storage_plans() {
        let m = [4usize, 64];
        for (ty, q) in [
            (GgmlType::F32, Quant::F32),
            (GgmlType::F16, Quant::F16),
            (GgmlType::BF16, Quant::Bf16),
            (GgmlType::Q8_0, Quant::Q8_0),
            (GgmlType::Q4_0, Quant::Q4_0),
            (GgmlType::Q5_0, Quant::Q5_0),
            (GgmlType::Q4K, Quant::Q4K),
            (GgmlType::Q6K, Quant::Q6K),
        ] {
            assert_eq!(
                plan(TensorFormat::Ggml(ty), &m, false),
                Plan::AsIs(q),
                "{ty:?}"
            );
        }
        for ty in [GgmlType::Q4_1, GgmlType::Q5_1, GgmlType::Q5K] {
            assert_eq!(
                plan(TensorFormat::Ggml(ty), &m, true),
                Plan::ToF16,
                "{ty:?}"
            );
        }
        assert_eq!(
            plan(TensorFormat::Ggml(GgmlType::Q4_0), &[64], true),
            Plan::Vector
        );
        assert_eq!(
            plan(TensorFormat::Ggml(GgmlType::F32), &[1], true),
            Plan::Vector
        );
        let fp8 = TensorFormat::Fp8 {
            block_rows: 128,
            block_cols: 128,
        };
        assert_eq!(plan(fp8, &m, true), Plan::ToBf16);
        assert!(matches!(
            plan(TensorFormat::NvFp4, &m, true),
            Plan::Unsupported(_)
        ));
        assert!(matches!(
            plan(TensorFormat::Ggml(GgmlType::I32), &m, true),
            Plan::Unsupported(_)
        ));
        // 3-D expert banks keep their format
        assert_eq!(
            plan(TensorFormat::Ggml(GgmlType::Q4K), &[8, 4, 256], true),
            Plan::AsIs(Quant::Q4K)
        );
        // Q4_0 matrices of whole 256-element rows repack; short rows and banks do not
        let q4 = TensorFormat::Ggml(GgmlType::Q4_0);
        assert_eq!(plan(q4, &[4, 256], true), Plan::Repack(Quant::Q4_0R));
        let q8 = TensorFormat::Ggml(GgmlType::Q8_0);
        let qk = TensorFormat::Ggml(GgmlType::Q4K);
        assert_eq!(plan(qk, &[4, 4096], true), Plan::Repack(Quant::Q4KR));
        assert_eq!(plan(q8, &[4, 3840], true), Plan::Repack(Quant::Q8_0R));
        assert_eq!(plan(q8, &[4, 96], true), Plan::AsIs(Quant::Q8_0));
        assert_eq!(plan(q4, &[4, 256], false), Plan::AsIs(Quant::Q4_0));
        assert_eq!(plan(q4, &[4, 640], true), Plan::AsIs(Quant::Q4_0));
        assert_eq!(plan(q4, &[8, 4, 256], true), Plan::AsIs(Quant::Q4_0));
        // Q6_K: rows of 2048-value multiples (210-byte blocks, 16-byte aligned rows)
        let q6 = TensorFormat::Ggml(GgmlType::Q6K);
        assert_eq!(plan(q6, &[4, 4096], true), Plan::Repack(Quant::Q6KR));
        assert_eq!(plan(q6, &[4, 3840], true), Plan::AsIs(Quant::Q6K));
        assert_eq!(plan(q6, &[8, 4, 4096], true), Plan::AsIs(Quant::Q6K));
        // an LM head keeps the staged kernel's layout
        assert_eq!(plan(q6, &[65536, 4096], true), Plan::Repack(Quant::Q6KR));
        assert_eq!(plan(q6, &[151936, 4096], true), Plan::AsIs(Quant::Q6K));
    }
}
