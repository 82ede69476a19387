//! Reading model hyper-parameters from HF `config.json` or GGUF metadata.

use crate::model::ModelError;

/// GGUF metadata access (implemented for `crate::gguf::GgufFile`; a map in tests).
pub trait GgufMeta {
    fn meta_u64(&self, key: &str) -> Option<u64>;
    fn meta_f32(&self, key: &str) -> Option<f32>;
    fn meta_u64_array(&self, key: &str) -> Option<Vec<u64>>;
    fn meta_bool(&self, key: &str) -> Option<bool>;
}

/// Keyed access to a GGUF architecture's metadata (`{arch}.{key}`).
pub struct GgufKeys<'a> {
    pub meta: &'a dyn GgufMeta,
    pub arch: &'a str,
}

impl GgufKeys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }
    pub fn opt_usize(&self, k: &str) -> Option<usize> {
        self.meta.meta_u64(&self.key(k)).map(|v| v as usize)
    }
    pub fn usize(&self, k: &str) -> Result<usize, ModelError> {
        self.opt_usize(k).ok_or_else(|| missing(&self.key(k)))
    }
    pub fn opt_f32(&self, k: &str) -> Option<f32> {
        self.meta.meta_f32(&self.key(k))
    }
    pub fn f32(&self, k: &str) -> Result<f32, ModelError> {
        self.opt_f32(k).ok_or_else(|| missing(&self.key(k)))
    }
    /// A per-layer value stored either as a scalar or as an array (the largest entry: llama.cpp
    /// writes 0 KV heads for recurrent layers in hybrid models).
    pub fn usize_per_layer_max(&self, k: &str) -> Result<usize, ModelError> {
        if let Some(v) = self.opt_usize(k) {
            return Ok(v);
        }
        self.meta
            .meta_u64_array(&self.key(k))
            .and_then(|a| a.iter().copied().max())
            .map(|v| v as usize)
            .ok_or_else(|| missing(&self.key(k)))
    }
    pub fn opt_bool(&self, k: &str) -> Option<bool> {
        self.meta.meta_bool(&self.key(k))
    }
}

fn missing(k: &str) -> ModelError {
    ModelError::Other(format!("config value `{k}` is missing"))
}

/// A text model's `config.json`: values are looked up in `text_config` first (the multimodal
/// wrapper), then at the top level.
pub struct JsonConfig<'a> {
    pub root: &'a serde_json::Value,
}

impl<'a> JsonConfig<'a> {
    pub fn new(root: &'a serde_json::Value) -> Self {
        JsonConfig { root }
    }
    pub fn get(&self, k: &str) -> Option<&'a serde_json::Value> {
        self.root
            .get("text_config")
            .and_then(|t| t.get(k))
            .or_else(|| self.root.get(k))
    }
    pub fn opt_usize(&self, k: &str) -> Option<usize> {
        self.get(k).and_then(|v| v.as_u64()).map(|v| v as usize)
    }
    pub fn usize(&self, k: &str) -> Result<usize, ModelError> {
        self.opt_usize(k).ok_or_else(|| missing(k))
    }
    pub fn opt_f32(&self, k: &str) -> Option<f32> {
        self.get(k).and_then(|v| v.as_f64()).map(|v| v as f32)
    }
    pub fn opt_bool(&self, k: &str) -> Option<bool> {
        self.get(k).and_then(|v| v.as_bool())
    }
    /// A RoPE parameter: `rope_parameters.{k}` (transformers 5), else `rope_scaling.{k}`, else
    /// top-level `{k}`.
    pub fn rope_f32(&self, k: &str) -> Option<f32> {
        for group in ["rope_parameters", "rope_scaling"] {
            if let Some(v) = self
                .get(group)
                .and_then(|g| g.get(k))
                .and_then(|v| v.as_f64())
            {
                return Some(v as f32);
            }
        }
        self.opt_f32(k)
    }
    /// Strings of an array value (e.g. `layer_types`).
    pub fn strings(&self, k: &str) -> Option<Vec<String>> {
        self.get(k)?.as_array().map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
    }
    pub fn usizes(&self, k: &str) -> Option<Vec<usize>> {
        self.get(k)?.as_array().map(|a| {
            a.iter()
                .filter_map(|v| v.as_u64().map(|x| x as usize))
                .collect()
        })
    }
}
