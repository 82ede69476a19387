//! Reading configuration values from GGUF metadata and HF `config.json`.

use serde_json::Value;

use crate::backend::Rope;
use crate::gguf::GgufFile;
use crate::model::ModelError;
use crate::ops::RopeLayout;

pub fn bad(arch: &str, m: impl std::fmt::Display) -> ModelError {
    ModelError::Other(format!("{arch} checkpoint: {m}"))
}

/// GGUF metadata under `{arch}.`.
pub struct GgufMeta<'a> {
    pub g: &'a GgufFile,
    pub arch: &'a str,
}

impl GgufMeta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub fn u(&self, k: &str) -> Option<usize> {
        self.g
            .get(&self.key(k))
            .and_then(|v| v.as_u64())
            .map(|v| v as usize)
    }
    pub fn f(&self, k: &str) -> Option<f32> {
        self.g.get(&self.key(k)).and_then(|v| v.as_f32())
    }
    pub fn s(&self, k: &str) -> Option<&str> {
        self.g.get(&self.key(k)).and_then(|v| v.as_str())
    }
    pub fn req_u(&self, k: &str) -> Result<usize, ModelError> {
        self.u(k)
            .ok_or_else(|| bad(self.arch, format!("metadata {} missing", self.key(k))))
    }
    /// A per-layer integer: an array of `n` values or one scalar for all layers.
    pub fn u_per_layer(&self, k: &str, n: usize) -> Result<Option<Vec<usize>>, ModelError> {
        let Some(v) = self.g.get(&self.key(k)) else {
            return Ok(None);
        };
        if let Some(x) = v.as_u64() {
            return Ok(Some(vec![x as usize; n]));
        }
        let arr = v.as_array().ok_or_else(|| {
            bad(
                self.arch,
                format!("{} is not a number or array", self.key(k)),
            )
        })?;
        let out: Option<Vec<usize>> = arr.iter().map(|x| x.as_u64().map(|x| x as usize)).collect();
        match out {
            Some(o) if o.len() == n => Ok(Some(o)),
            _ => Err(bad(
                self.arch,
                format!("{} must hold {n} integers", self.key(k)),
            )),
        }
    }
    /// A per-layer boolean array of `n` values.
    pub fn bool_per_layer(&self, k: &str, n: usize) -> Result<Option<Vec<bool>>, ModelError> {
        let Some(v) = self.g.get(&self.key(k)) else {
            return Ok(None);
        };
        let arr = v
            .as_array()
            .ok_or_else(|| bad(self.arch, format!("{} is not an array", self.key(k))))?;
        let out: Option<Vec<bool>> = arr.iter().map(|x| x.as_bool()).collect();
        match out {
            Some(o) if o.len() == n => Ok(Some(o)),
            _ => Err(bad(
                self.arch,
                format!("{} must hold {n} booleans", self.key(k)),
            )),
        }
    }
}

/// The text part of an HF config (`text_config` of the multimodal wrapper, or the config itself).
pub fn text_config(cfg: &Value) -> &Value {
    match cfg.get("text_config") {
        Some(t) if t.is_object() => t,
        _ => cfg,
    }
}

pub fn ju(c: &Value, k: &str) -> Option<usize> {
    c.get(k).and_then(|v| v.as_u64()).map(|v| v as usize)
}
pub fn jf(c: &Value, k: &str) -> Option<f32> {
    c.get(k).and_then(|v| v.as_f64()).map(|v| v as f32)
}
pub fn jb(c: &Value, k: &str) -> Option<bool> {
    c.get(k).and_then(|v| v.as_bool())
}
pub fn req_ju(arch: &str, c: &Value, k: &str) -> Result<usize, ModelError> {
    ju(c, k).ok_or_else(|| bad(arch, format!("config.json lacks {k}")))
}

/// `layer_types` from the config, or HF's default pattern (every `pattern`-th layer global).
pub fn layer_types(
    arch: &str,
    c: &Value,
    n: usize,
    pattern: usize,
) -> Result<Vec<bool>, ModelError> {
    match c.get("layer_types").and_then(|v| v.as_array()) {
        Some(a) => {
            if a.len() != n {
                return Err(bad(
                    arch,
                    format!("layer_types has {} entries for {n} layers", a.len()),
                ));
            }
            a.iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    other => Err(bad(arch, format!("unsupported layer type {other:?}"))),
                })
                .collect()
        }
        None => Ok((0..n).map(|i| (i + 1) % pattern.max(1) != 0).collect()),
    }
}

/// The torch dtype a config declares (`dtype` in transformers 5, `torch_dtype` before).
pub fn dtype(cfg: &Value) -> Option<&str> {
    let t = text_config(cfg);
    for c in [t, cfg] {
        for k in ["dtype", "torch_dtype"] {
            if let Some(s) = c.get(k).and_then(|v| v.as_str()) {
                return Some(s);
            }
        }
    }
    None
}

/// A NEOX rope over the first `rot_dims` of `head_dim`, optionally with per-pair divisors.
pub fn neox(head_dim: usize, rot_dims: usize, theta: f32, factors: Option<Vec<f32>>) -> Rope {
    Rope {
        head_dim,
        rot_dims,
        theta,
        layout: RopeLayout::Neox,
        freq_factors: factors,
        freq_base_dims: rot_dims,
    }
}
