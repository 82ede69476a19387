//! From a checkpoint (GGUF or HF safetensors, either text layout) to a Qwen model.

use std::sync::Arc;

use crate::arch::{Detected, Layout};
use crate::backend::Backend;
use crate::model::common::config::GgufKeys;
use crate::model::common::JsonConfig;
use crate::model::registry::LoadOptions;
use crate::model::{CausalLm, ModelError};
use crate::weights::Checkpoint;

use super::{Names, QwenConfig, QwenModel, Variant};

/// Parse the config and naming for `variant` from `ckpt`, then build the model.
pub fn load_variant<B: Backend>(
    variant: Variant,
    ckpt: &Checkpoint,
    det: &Detected,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<dyn CausalLm>, ModelError> {
    let (cfg, names) = match det.layout {
        Layout::Gguf => {
            let g = ckpt
                .gguf()
                .ok_or_else(|| ModelError::Other("GGUF layout without a GGUF file".into()))?;
            let arch = g.architecture().unwrap_or(variant.name()).to_string();
            let cfg = QwenConfig::from_gguf(
                variant,
                &GgufKeys {
                    meta: g,
                    arch: &arch,
                },
            )?;
            let post_norm = if variant.hybrid() {
                "post_attention_norm"
            } else {
                "ffn_norm"
            };
            (cfg, Names::Gguf { post_norm })
        }
        Layout::HfText | Layout::HfMultimodal => {
            let json = ckpt.config().ok_or_else(|| {
                ModelError::Other("safetensors checkpoint without config.json".into())
            })?;
            let cfg = QwenConfig::from_json(variant, &JsonConfig::new(json))?;
            (
                cfg,
                Names::Hf {
                    prefix: det.text_prefix.clone(),
                },
            )
        }
    };
    let model: Arc<dyn CausalLm> = QwenModel::load(ckpt, names, cfg, backend, opts)?;
    Ok(model)
}
