//! Gemma 3 (GGUF `gemma3`; HF `Gemma3ForCausalLM` / `gemma3_text`, and the text part of the
//! multimodal `Gemma3ForConditionalGeneration`).
//!
//! Facts this module resolves (HF transformers 5.17 `modeling_gemma3.py`, llama.cpp for GGUF):
//! - Sliding/global pattern: `layer_types` (HF; default every 6th layer global); GGUF files carry
//!   no pattern, llama.cpp uses every 6th layer global when `attention.sliding_window` is set.
//! - RMSNorm is `x_hat * (1 + w)` in HF; llama.cpp's converter stores `1 + w` in GGUF.
//! - Embeddings are scaled by sqrt(hidden), which HF computes in the embedding dtype (bf16
//!   checkpoints use the bf16-rounded value; see `spec::embed_scale`).
//! - Attention scale `query_pre_attn_scalar^-0.5` (HF). GGUF has no such key: llama.cpp uses
//!   `(hidden / heads)^-0.5` for the 27B (62 layers) and `head_dim^-0.5` otherwise.
//! - RoPE NEOX; local (sliding) base `rope_local_base_freq` / rope_parameters.sliding_attention
//!   (10 000 by default), global base `rope_theta` (1e6) with linear scaling only on global layers
//!   when `rope_scaling` is configured (GGUF: `rope.scaling.type = linear`, `rope.scaling.factor`).
//! - Optional final logit soft-cap.

use std::sync::Arc;

use serde_json::Value;

use crate::arch::{Detected, Layout};
use crate::backend::Backend;
use crate::model::gemma::config::{self, bad, GgufMeta};
use crate::model::gemma::spec::{
    context_limit, embed_scale, GemmaSpec, LayerSpec, Naming, NormForm,
};
use crate::model::gemma::weights::{global_name, me};
use crate::model::gemma::{build_with, decoder::GemmaModel};
use crate::model::registry::LoadOptions;
use crate::model::{CausalLm, ModelError};
use crate::weights::Checkpoint;

const ARCH: &str = "gemma3";

/// Load a Gemma 3 checkpoint onto `backend`.
pub fn load<B: Backend>(
    ckpt: &Checkpoint,
    det: &Detected,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<dyn CausalLm>, ModelError> {
    Ok(load_model(ckpt, det, backend, opts)?)
}

/// As `load`, keeping the concrete type (tests, the MTP head, benchmarks).
pub fn load_model<B: Backend>(
    ckpt: &Checkpoint,
    det: &Detected,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<GemmaModel<B>>, ModelError> {
    build_with(ckpt, spec(ckpt, det, opts.max_context)?, backend, opts)
}

/// Resolve the decoder spec from the checkpoint's metadata.
pub fn spec(
    ckpt: &Checkpoint,
    det: &Detected,
    max_context: usize,
) -> Result<GemmaSpec, ModelError> {
    let naming = match det.layout {
        Layout::Gguf => Naming::Gguf,
        _ => Naming::Hf {
            prefix: det.text_prefix.clone(),
        },
    };
    let embed = ckpt.tensor(&global_name(&naming, "embed")).map_err(me)?;
    if embed.shape.len() != 2 {
        return Err(bad(ARCH, format!("embedding shape {:?}", embed.shape)));
    }
    let vocab = embed.shape[0];
    let spec = match det.layout {
        Layout::Gguf => {
            let g = ckpt
                .gguf()
                .ok_or_else(|| bad(ARCH, "GGUF layout without a GGUF file"))?;
            from_gguf(&GgufMeta { g, arch: ARCH }, vocab, max_context)?
        }
        _ => {
            let cfg = ckpt
                .config()
                .ok_or_else(|| bad(ARCH, "no config.json beside the weights"))?;
            let mut spec = from_hf(cfg, naming, vocab, max_context)?;
            if det.layout == Layout::HfMultimodal {
                // transformers' Gemma3ForConditionalGeneration never applies
                // final_logit_softcapping (only Gemma3ForCausalLM does); real Gemma 3 configs
                // leave it null, so this only matters for checkpoints that set it.
                spec.final_softcap = None;
            }
            spec
        }
    };
    spec.validate()?;
    Ok(spec)
}

fn from_gguf(m: &GgufMeta<'_>, vocab: usize, max_context: usize) -> Result<GemmaSpec, ModelError> {
    let n = m.req_u("block_count")?;
    let hidden = m.req_u("embedding_length")?;
    let n_heads = m.req_u("attention.head_count")?;
    let kv = m
        .u_per_layer("attention.head_count_kv", n)?
        .unwrap_or_else(|| vec![n_heads; n]);
    let hd = m.u("attention.key_length").unwrap_or(hidden / n_heads);
    let window = m.u("attention.sliding_window").unwrap_or(0);
    let sliding: Vec<bool> = match m.bool_per_layer("attention.sliding_window_pattern", n)? {
        Some(p) => p,
        None => (0..n).map(|i| window > 0 && (i + 1) % 6 != 0).collect(),
    };
    let theta_global = m.f("rope.freq_base").unwrap_or(1_000_000.0);
    let theta_local = m.f("rope.freq_base_swa").unwrap_or(10_000.0);
    let factor = match (m.s("rope.scaling.type"), m.f("rope.scaling.factor")) {
        (Some("linear"), Some(f)) if f > 0.0 && f != 1.0 => Some(f),
        (None | Some("none") | Some("linear"), _) => None,
        (Some(t), _) => return Err(bad(ARCH, format!("unsupported rope scaling {t:?}"))),
    };
    let attn_scale = match m.f("attention.scale") {
        Some(s) => s,
        None if n == 62 => ((hidden / n_heads) as f32).powf(-0.5),
        None => (hd as f32).powf(-0.5),
    };
    let layers = (0..n)
        .map(|i| LayerSpec {
            sliding: sliding[i],
            head_dim: hd,
            n_kv_heads: kv[i],
            rope: rope(hd, sliding[i], theta_local, theta_global, factor),
            k_eq_v: false,
            kv_source: None,
            moe: false,
        })
        .collect();
    Ok(GemmaSpec {
        arch: ARCH,
        naming: Naming::Gguf,
        hidden,
        n_heads,
        vocab,
        eps: m.f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        norm: NormForm::Plain,
        v_norm: false,
        attn_scale,
        window,
        final_softcap: m.f("final_logit_softcapping").filter(|&c| c > 0.0),
        embed_scale: embed_scale(hidden, None),
        ple_dim: 0,
        moe: None,
        layer_scalar: false,
        layers,
        max_context: context_limit(max_context, m.u("context_length")),
    })
}

fn rope(
    hd: usize,
    sliding: bool,
    local: f32,
    global: f32,
    factor: Option<f32>,
) -> crate::backend::Rope {
    if sliding {
        config::neox(hd, hd, local, None)
    } else {
        config::neox(hd, hd, global, factor.map(|f| vec![f; hd / 2]))
    }
}

/// (theta, linear factor) of one layer type from `rope_parameters` (transformers 5 format) or
/// the older `rope_theta` / `rope_local_base_freq` / `rope_scaling` keys.
fn hf_rope_params(c: &Value, sliding: bool) -> Result<(f32, Option<f32>), ModelError> {
    let key = if sliding {
        "sliding_attention"
    } else {
        "full_attention"
    };
    let params = c.get("rope_parameters").and_then(|p| p.get(key));
    let (theta, scaling) = match params {
        Some(p) => (config::jf(p, "rope_theta"), Some(p)),
        None => {
            let theta = if sliding {
                config::jf(c, "rope_local_base_freq")
            } else {
                config::jf(c, "rope_theta")
            };
            (
                theta,
                if sliding {
                    None
                } else {
                    c.get("rope_scaling").filter(|v| v.is_object())
                },
            )
        }
    };
    let theta = theta.unwrap_or(if sliding { 10_000.0 } else { 1_000_000.0 });
    let factor = match scaling {
        None => None,
        Some(s) => {
            let ty = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(|v| v.as_str())
                .unwrap_or("default");
            match ty {
                "default" => None,
                "linear" => config::jf(s, "factor").filter(|&f| f != 1.0),
                other => return Err(bad(ARCH, format!("unsupported rope type {other:?}"))),
            }
        }
    };
    Ok((theta, factor))
}

fn from_hf(
    cfg: &Value,
    naming: Naming,
    vocab: usize,
    max_context: usize,
) -> Result<GemmaSpec, ModelError> {
    let c = config::text_config(cfg);
    let n = config::req_ju(ARCH, c, "num_hidden_layers")?;
    let hidden = config::req_ju(ARCH, c, "hidden_size")?;
    let n_heads = config::req_ju(ARCH, c, "num_attention_heads")?;
    let n_kv = config::ju(c, "num_key_value_heads").unwrap_or(4); // HF Gemma3TextConfig defaults
    let hd = config::ju(c, "head_dim").unwrap_or(256);
    if config::jb(c, "use_bidirectional_attention") == Some(true) {
        return Err(bad(
            ARCH,
            "bidirectional attention (embedding models) is not supported",
        ));
    }
    if c.get("attn_logit_softcapping")
        .is_some_and(|v| !v.is_null())
    {
        return Err(bad(
            ARCH,
            "attention logit soft-capping is not a Gemma 3 feature",
        ));
    }
    let pattern = config::ju(c, "sliding_window_pattern").unwrap_or(6);
    let sliding = config::layer_types(ARCH, c, n, pattern)?;
    let (local, _) = hf_rope_params(c, true)?;
    let (global, factor) = hf_rope_params(c, false)?;
    let qpas = config::jf(c, "query_pre_attn_scalar").unwrap_or(256.0);
    let layers = (0..n)
        .map(|i| LayerSpec {
            sliding: sliding[i],
            head_dim: hd,
            n_kv_heads: n_kv,
            rope: rope(hd, sliding[i], local, global, factor),
            k_eq_v: false,
            kv_source: None,
            moe: false,
        })
        .collect();
    Ok(GemmaSpec {
        arch: ARCH,
        naming,
        hidden,
        n_heads,
        vocab,
        eps: config::jf(c, "rms_norm_eps").unwrap_or(1e-6),
        norm: NormForm::OnePlus,
        v_norm: false,
        attn_scale: qpas.powf(-0.5),
        window: config::ju(c, "sliding_window").unwrap_or(4096),
        final_softcap: config::jf(c, "final_logit_softcapping"),
        embed_scale: embed_scale(hidden, config::dtype(cfg)),
        ple_dim: 0,
        moe: None,
        layer_scalar: false,
        layers,
        max_context: context_limit(max_context, config::ju(c, "max_position_embeddings")),
    })
}
