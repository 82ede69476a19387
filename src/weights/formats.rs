//! How safetensors tensors and their scale siblings become a `TensorRef`.
//!
//! - F32 / F16 / BF16 -> `Ggml(F32 | F16 | BF16)`.
//! - F8_E4M3 `weight` + `weight_scale_inv` (block grid) -> `Fp8 { 128, 128 }` (or the config's
//!   `weight_block_size`).
//! - F8_E4M3 `weight` + `weight_scale`: a scalar (ModelOpt per-tensor) -> one block covering the
//!   tensor; `[rows, 1]` (compressed-tensors per-row) -> `[1, cols]` blocks; a 2-D grid -> blocks.
//! - U8 `weight` [out, in/2] + E4M3 `weight_scale` [out, in/16] + `weight_scale_2` (ModelOpt
//!   NVFP4) -> `NvFp4` with global = `weight_scale_2`.
//! - U8 `weight_packed` + `weight_scale` + `weight_global_scale` (compressed-tensors NVFP4),
//!   requested as `weight` -> `NvFp4` with global = 1 / `weight_global_scale`.

use super::safetensors::Dtype;
use super::{ScaleData, Scales, TensorFormat, TensorRef, WeightsError};
use crate::quant::GgmlType;

/// A raw safetensors tensor.
#[derive(Clone, Copy)]
pub(crate) struct Raw<'a> {
    pub dtype: &'a Dtype,
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

/// Sibling suffixes that are consumed as scales of a `weight` and hidden from tensor listings.
pub(crate) const SCALE_SUFFIXES: [&str; 4] = [
    "weight_scale_inv",
    "weight_scale",
    "weight_scale_2",
    "weight_global_scale",
];

/// f32 1.0, the scale of an FP8 tensor stored without one.
static ONE_F32: [u8; 4] = [0x00, 0x00, 0x80, 0x3f];

fn invalid(name: &str, detail: impl Into<String>) -> WeightsError {
    WeightsError::Invalid {
        name: name.to_string(),
        detail: detail.into(),
    }
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The `[rows, cols]` view of a shape (rows = everything but the last axis).
fn rows_cols(shape: &[usize]) -> (usize, usize) {
    let cols = shape.last().copied().unwrap_or(1);
    let rows = numel(shape).checked_div(cols).unwrap_or(0);
    (rows, cols)
}

fn scale_data<'a>(name: &str, r: Raw<'a>) -> Result<ScaleData<'a>, WeightsError> {
    Ok(match r.dtype {
        Dtype::F32 => ScaleData::F32(r.data),
        Dtype::BF16 => ScaleData::Bf16(r.data),
        Dtype::F16 => ScaleData::F16(r.data),
        Dtype::F8E4M3 => ScaleData::E4m3(r.data),
        other => {
            return Err(invalid(
                name,
                format!("scale dtype {other:?} is not F32/BF16/F16/F8_E4M3"),
            ))
        }
    })
}

/// A one-element scale tensor as f32.
fn scalar(name: &str, r: Raw<'_>) -> Result<f32, WeightsError> {
    let s = scale_data(name, r)?;
    if s.len() != 1 {
        return Err(invalid(
            name,
            format!("expected a single value, shape {:?}", r.shape),
        ));
    }
    Ok(s.get(0))
}

/// Build the `TensorRef` for `name` from raw tensors reachable through `get`.
/// `block` is the config's `weight_block_size` for FP8 block scales, if any.
pub(crate) fn tensor_ref<'a>(
    name: &str,
    get: &dyn Fn(&str) -> Option<Raw<'a>>,
    block: Option<(usize, usize)>,
) -> Result<TensorRef<'a>, WeightsError> {
    let stem = name.strip_suffix("weight");
    let sib = |suffix: &str| stem.and_then(|s| get(&format!("{s}{suffix}")));
    let Some(raw) = get(name) else {
        // compressed-tensors NVFP4 stores the weight as `weight_packed`
        if let Some(packed) = sib("weight_packed") {
            let global = sib("weight_global_scale")
                .ok_or_else(|| invalid(name, "weight_packed without weight_global_scale"))?;
            let g = scalar(name, global)?;
            return nvfp4(name, packed, sib("weight_scale"), 1.0 / g);
        }
        return Err(WeightsError::Missing(name.to_string()));
    };
    let plain = |ty: GgmlType| TensorRef {
        name: name.to_string(),
        shape: raw.shape.to_vec(),
        format: TensorFormat::Ggml(ty),
        data: raw.data,
        scales: Scales::default(),
    };
    match raw.dtype {
        Dtype::F32 => Ok(plain(GgmlType::F32)),
        Dtype::F16 => Ok(plain(GgmlType::F16)),
        Dtype::BF16 => Ok(plain(GgmlType::BF16)),
        Dtype::F8E4M3 => fp8(
            name,
            raw,
            sib("weight_scale_inv"),
            sib("weight_scale"),
            block,
        ),
        Dtype::U8 | Dtype::F4 if sib("weight_scale").is_some() => {
            let g = match sib("weight_scale_2") {
                Some(s) => scalar(name, s)?,
                None => return Err(invalid(name, "NVFP4 weight_scale without weight_scale_2")),
            };
            nvfp4(name, raw, sib("weight_scale"), g)
        }
        other => Err(invalid(
            name,
            format!("dtype {other:?} is not a weight format fucina reads"),
        )),
    }
}

fn fp8<'a>(
    name: &str,
    w: Raw<'a>,
    scale_inv: Option<Raw<'a>>,
    scale: Option<Raw<'a>>,
    cfg_block: Option<(usize, usize)>,
) -> Result<TensorRef<'a>, WeightsError> {
    let (rows, cols) = rows_cols(w.shape);
    let mk = |br: usize, bc: usize, sd: ScaleData<'a>| TensorRef {
        name: name.to_string(),
        shape: w.shape.to_vec(),
        format: TensorFormat::Fp8 {
            block_rows: br.max(1),
            block_cols: bc.max(1),
        },
        data: w.data,
        scales: Scales {
            block: Some(sd),
            global: None,
        },
    };
    let Some(s) = scale_inv.or(scale) else {
        return Ok(mk(rows, cols, ScaleData::F32(&ONE_F32)));
    };
    let sd = scale_data(name, s)?;
    let sn = numel(s.shape);
    if sn != sd.len() {
        return Err(invalid(name, "scale byte length does not match its shape"));
    }
    if sn == 1 && scale_inv.is_none() {
        return Ok(mk(rows, cols, sd)); // per-tensor
    }
    if scale_inv.is_none() && sn == rows && matches!(s.shape, [_] | [_, 1]) {
        return Ok(mk(1, cols, sd)); // per output row
    }
    let (sr, sc) = rows_cols(s.shape);
    let mut candidates = vec![(128, 128)];
    if let Some(b) = cfg_block {
        candidates.insert(0, b);
    }
    if sr > 0 && sc > 0 && rows % sr == 0 && cols % sc == 0 {
        candidates.push((rows / sr, cols / sc));
    }
    for (br, bc) in candidates {
        if br > 0 && bc > 0 && rows.div_ceil(br) == sr && cols.div_ceil(bc) == sc {
            return Ok(mk(br, bc, sd));
        }
    }
    Err(invalid(
        name,
        format!(
            "FP8 weight {:?} with a scale grid {:?} that fits no block size",
            w.shape, s.shape
        ),
    ))
}

fn nvfp4<'a>(
    name: &str,
    w: Raw<'a>,
    scale: Option<Raw<'a>>,
    global: f32,
) -> Result<TensorRef<'a>, WeightsError> {
    let scale = scale.ok_or_else(|| invalid(name, "NVFP4 weight without weight_scale"))?;
    if *scale.dtype != Dtype::F8E4M3 {
        return Err(invalid(
            name,
            format!("NVFP4 weight_scale is {:?}, expected F8_E4M3", scale.dtype),
        ));
    }
    let mut shape = w.shape.to_vec();
    if *w.dtype == Dtype::U8 {
        // two E2M1 values per byte along the last axis
        match shape.last_mut() {
            Some(c) => *c *= 2,
            None => return Err(invalid(name, "NVFP4 weight is a scalar")),
        }
    }
    let (rows, cols) = rows_cols(&shape);
    if cols % 16 != 0 || numel(scale.shape) != rows * (cols / 16) {
        return Err(invalid(
            name,
            format!(
                "NVFP4 weight {shape:?} with weight_scale {:?} (need one per 16 values)",
                scale.shape
            ),
        ));
    }
    if !global.is_finite() {
        return Err(invalid(
            name,
            format!("NVFP4 global scale {global} is not finite"),
        ));
    }
    Ok(TensorRef {
        name: name.to_string(),
        shape,
        format: TensorFormat::NvFp4,
        data: w.data,
        scales: Scales {
            block: Some(ScaleData::E4m3(scale.data)),
            global: Some(global),
        },
    })
}

/// Whether a raw tensor name is a scale consumed by a sibling weight present in `has`.
pub(crate) fn is_consumed_scale(name: &str, has: &dyn Fn(&str) -> bool) -> bool {
    for suf in SCALE_SUFFIXES {
        if let Some(stem) = name.strip_suffix(suf) {
            if stem.is_empty() || stem.ends_with('.') {
                return has(&format!("{stem}weight")) || has(&format!("{stem}weight_packed"));
            }
        }
    }
    false
}
