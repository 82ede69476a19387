//! Architecture detection: GGUF `general.architecture`, else config.json's `model_type` (top
//! level, then `text_config`), else its `architectures` class names; the tensor layout from the
//! names present.

use super::{supported_list, Arch, ArchError, Detected, Layout};
use crate::weights::Checkpoint;

/// Text-model prefixes, most specific first.
const PREFIXES: [&str; 5] = [
    "model.language_model.",
    "model.encoder.language_model.",
    "language_model.model.",
    "model.",
    "",
];

/// Detect the architecture and tensor layout of a checkpoint.
pub fn detect(ckpt: &Checkpoint) -> Result<Detected, ArchError> {
    if let Some(g) = ckpt.gguf() {
        let name = g.architecture().ok_or_else(|| {
            ArchError::Unknown("the GGUF file has no general.architecture".into())
        })?;
        let arch = Arch::from_gguf(name)
            .ok_or_else(|| unsupported(format!("GGUF general.architecture {name:?}")))?;
        return Ok(Detected {
            arch,
            layout: Layout::Gguf,
            text_prefix: String::new(),
        });
    }
    let cfg = ckpt.config().ok_or_else(|| {
        ArchError::Unknown("no config.json beside the safetensors weights".into())
    })?;
    let arch = from_config(cfg)?;
    let names = ckpt.tensor_names();
    let text_prefix = text_prefix(&names).unwrap_or_else(|| {
        if cfg.get("text_config").is_some() {
            "model.language_model."
        } else {
            "model."
        }
        .to_string()
    });
    let layout = if text_prefix.contains("language_model") {
        Layout::HfMultimodal
    } else {
        Layout::HfText
    };
    Ok(Detected {
        arch,
        layout,
        text_prefix,
    })
}

fn unsupported(found: String) -> ArchError {
    ArchError::Unsupported {
        found,
        supported: supported_list(),
    }
}

fn from_config(cfg: &serde_json::Value) -> Result<Arch, ArchError> {
    let top = cfg.get("model_type").and_then(|v| v.as_str());
    let text = cfg
        .get("text_config")
        .and_then(|t| t.get("model_type"))
        .and_then(|v| v.as_str());
    for mt in [top, text].into_iter().flatten() {
        if let Some(a) = Arch::from_model_type(mt) {
            return Ok(a);
        }
    }
    let classes: Vec<&str> = cfg
        .get("architectures")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    if let Some(a) = classes.iter().find_map(|c| Arch::from_hf_class(c)) {
        return Ok(a);
    }
    let mut found = Vec::new();
    if let Some(t) = top {
        found.push(format!("model_type {t:?}"));
    }
    if let Some(t) = text {
        found.push(format!("text_config.model_type {t:?}"));
    }
    if !classes.is_empty() {
        found.push(format!("architectures {classes:?}"));
    }
    if found.is_empty() {
        return Err(ArchError::Unknown(
            "config.json has no model_type or architectures".into(),
        ));
    }
    Err(unsupported(format!("config.json {}", found.join(", "))))
}

/// The prefix under which the text model's `layers.N.` (or `embed_tokens`) tensors live.
pub fn text_prefix(names: &[&str]) -> Option<String> {
    PREFIXES
        .iter()
        .find(|p| {
            let layers = format!("{p}layers.");
            let embed = format!("{p}embed_tokens.");
            names
                .iter()
                .any(|n| n.starts_with(&layers) || n.starts_with(&embed))
        })
        .map(|p| p.to_string())
}
