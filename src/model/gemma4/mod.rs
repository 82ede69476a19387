//! Gemma 4 text (GGUF `gemma4`; HF `gemma4_text` / `Gemma4ForCausalLM`, and the text part of
//! `Gemma4ForConditionalGeneration`), and its MTP assistant head (`assistant`).
//!
//! Facts this module resolves (HF transformers 5.17 `modeling_gemma4.py`; llama.cpp for GGUF):
//! - Per-layer geometry: sliding layers use `head_dim` and `num_key_value_heads`; full layers use
//!   `global_head_dim` and, with `attention_k_eq_v`, `num_global_key_value_heads` (saved configs
//!   may instead carry `per_layer_config` overrides). GGUF: `attention.key_length[_swa]`, the
//!   per-layer `attention.head_count_kv` array, `attention.sliding_window_pattern`.
//! - RoPE NEOX; sliding layers the default RoPE (theta 1e4); full layers HF's "proportional"
//!   RoPE: the first `partial_rotary_factor * head_dim / 2` frequency pairs of the FULL head turn,
//!   the rest stay (GGUF: `rope_freqs` divisors of 1 and 1e30 over `rope.dimension_count`).
//! - K=V global layers (`attention_k_eq_v`, no `v_proj`): V is the raw K projection; V always
//!   gets a weightless RMSNorm; attention scale 1.0; plain `x_hat * w` norms everywhere.
//! - `layer_scalar` multiplies each layer's output; final logit soft-cap.
//! - MoE block (`enable_moe_block`): dense MLP and experts side by side (see `gemma::moe`).
//! - E-series: per-layer embeddings (`hidden_size_per_layer_input`) and KV sharing: the last
//!   `num_kv_shared_layers` layers reuse the KV of the last non-shared layer of their type.

pub mod assistant;

use std::sync::Arc;

use serde_json::Value;

use crate::arch::{Detected, Layout};
use crate::backend::{Backend, Rope};
use crate::model::gemma::config::{self, bad, GgufMeta};
use crate::model::gemma::spec::{
    context_limit, embed_scale, proportional_freq_factors, GemmaSpec, LayerSpec, MoeSpec, Naming,
    NormForm,
};
use crate::model::gemma::weights::{global_name, layer_name, me};
use crate::model::gemma::{build_with, decoder::GemmaModel};
use crate::model::registry::LoadOptions;
use crate::model::{CausalLm, ModelError};
use crate::weights::Checkpoint;

const ARCH: &str = "gemma4";

/// Load a Gemma 4 text checkpoint onto `backend`.
pub fn load<B: Backend>(
    ckpt: &Checkpoint,
    det: &Detected,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<dyn CausalLm>, ModelError> {
    Ok(load_model(ckpt, det, backend, opts)?)
}

/// As `load`, keeping the concrete type (the MTP head reads the session's caches).
pub fn load_model<B: Backend>(
    ckpt: &Checkpoint,
    det: &Detected,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<GemmaModel<B>>, ModelError> {
    build_with(ckpt, spec(ckpt, det, opts.max_context)?, backend, opts)
}

pub fn naming(det: &Detected) -> Naming {
    match det.layout {
        Layout::Gguf => Naming::Gguf,
        _ => Naming::Hf {
            prefix: det.text_prefix.clone(),
        },
    }
}

pub fn spec(
    ckpt: &Checkpoint,
    det: &Detected,
    max_context: usize,
) -> Result<GemmaSpec, ModelError> {
    let naming = naming(det);
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
            from_gguf(ckpt, &GgufMeta { g, arch: ARCH }, vocab, max_context, ARCH)?
        }
        _ => {
            let cfg = ckpt
                .config()
                .ok_or_else(|| bad(ARCH, "no config.json beside the weights"))?;
            from_hf(ckpt, cfg, naming, vocab, max_context, ARCH)?
        }
    };
    spec.validate()?;
    Ok(spec)
}

/// The layer each KV-shared layer reads: the last non-shared layer of the same type.
pub fn kv_sources(sliding: &[bool], n_shared: usize) -> Result<Vec<Option<usize>>, ModelError> {
    let n = sliding.len();
    if n_shared > n {
        return Err(bad(ARCH, format!("{n_shared} KV-shared layers of {n}")));
    }
    let first = n - n_shared;
    (0..n)
        .map(|i| {
            if i < first {
                return Ok(None);
            }
            (0..first)
                .rev()
                .find(|&j| sliding[j] == sliding[i])
                .map(Some)
                .ok_or_else(|| {
                    bad(
                        ARCH,
                        format!("layer {i} shares KV but no earlier layer has its type"),
                    )
                })
        })
        .collect()
}

pub(crate) fn from_gguf(
    ckpt: &Checkpoint,
    m: &GgufMeta<'_>,
    vocab: usize,
    max_context: usize,
    arch: &'static str,
) -> Result<GemmaSpec, ModelError> {
    let n = m.req_u("block_count")?;
    let hidden = m.req_u("embedding_length")?;
    let n_heads = m.req_u("attention.head_count")?;
    let kv = m
        .u_per_layer("attention.head_count_kv", n)?
        .unwrap_or_else(|| vec![n_heads; n]);
    let sliding = m
        .bool_per_layer("attention.sliding_window_pattern", n)?
        .ok_or_else(|| bad(arch, "attention.sliding_window_pattern missing"))?;
    let hd_full = m.req_u("attention.key_length")?;
    let hd_swa = m.u("attention.key_length_swa").unwrap_or(hd_full);
    let rot_full = m.u("rope.dimension_count").unwrap_or(hd_full);
    let rot_swa = m.u("rope.dimension_count_swa").unwrap_or(hd_swa);
    let theta_full = m.f("rope.freq_base").unwrap_or(1_000_000.0);
    let theta_swa = m.f("rope.freq_base_swa").unwrap_or(10_000.0);
    let freqs = if ckpt.has("rope_freqs.weight") {
        Some(
            ckpt.tensor("rope_freqs.weight")
                .map_err(me)?
                .to_f32()
                .map_err(me)?,
        )
    } else {
        None
    };
    if let Some(f) = &freqs {
        if f.len() != rot_full / 2 {
            return Err(bad(
                arch,
                format!(
                    "rope_freqs has {} values for {rot_full} rotary dims",
                    f.len()
                ),
            ));
        }
    }
    let shared = m.u("attention.shared_kv_layers").unwrap_or(0);
    let sources = kv_sources(&sliding, shared)?;
    let naming = Naming::Gguf;
    let mut layers = Vec::with_capacity(n);
    let mut any_moe = false;
    for i in 0..n {
        let hd = if sliding[i] { hd_swa } else { hd_full };
        let rope = if sliding[i] {
            config::neox(hd, rot_swa, theta_swa, None)
        } else {
            config::neox(hd, rot_full, theta_full, freqs.clone())
        };
        let own = sources[i].is_none();
        let moe = ckpt.has(&layer_name(&naming, i, "router"));
        any_moe |= moe;
        layers.push(LayerSpec {
            sliding: sliding[i],
            head_dim: hd,
            n_kv_heads: kv[i],
            rope,
            k_eq_v: own && !ckpt.has(&layer_name(&naming, i, "v")),
            kv_source: sources[i],
            moe,
        });
    }
    let moe = if any_moe {
        Some(MoeSpec {
            n_experts: m.req_u("expert_count")?,
            top_k: m.req_u("expert_used_count")?,
        })
    } else {
        None
    };
    Ok(GemmaSpec {
        arch,
        naming,
        hidden,
        n_heads,
        vocab,
        eps: m.f("attention.layer_norm_rms_epsilon").unwrap_or(1e-6),
        norm: NormForm::Plain,
        v_norm: true,
        attn_scale: 1.0,
        window: m.u("attention.sliding_window").unwrap_or(usize::MAX),
        final_softcap: m.f("final_logit_softcapping").filter(|&c| c > 0.0),
        embed_scale: embed_scale(hidden, None),
        ple_dim: m.u("embedding_length_per_layer_input").unwrap_or(0),
        moe,
        layer_scalar: true,
        layers,
        max_context: context_limit(max_context, m.u("context_length")),
    })
}

/// One layer type's RoPE from HF `rope_parameters`.
fn hf_rope(arch: &str, c: &Value, sliding: bool, hd: usize) -> Result<Rope, ModelError> {
    let key = if sliding {
        "sliding_attention"
    } else {
        "full_attention"
    };
    let p = c.get("rope_parameters").and_then(|p| p.get(key));
    let default_theta = if sliding { 10_000.0 } else { 1_000_000.0 };
    let Some(p) = p else {
        // HF's defaults: sliding default RoPE, full proportional with factor 0.25.
        return Ok(if sliding {
            config::neox(hd, hd, default_theta, None)
        } else {
            config::neox(
                hd,
                hd,
                default_theta,
                Some(proportional_freq_factors(hd, hd / 8, 1.0)),
            )
        });
    };
    let theta = config::jf(p, "rope_theta").unwrap_or(default_theta);
    let factor = config::jf(p, "factor").unwrap_or(1.0);
    let ty = p
        .get("rope_type")
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    match ty {
        "default" => Ok(config::neox(hd, hd, theta, None)),
        "linear" => Ok(config::neox(hd, hd, theta, Some(vec![factor; hd / 2]))),
        "proportional" => {
            let prf = config::jf(p, "partial_rotary_factor").unwrap_or(1.0) as f64;
            // HF: int(partial_rotary_factor * head_dim // 2)
            let rotated = ((prf * hd as f64) / 2.0).floor() as usize;
            Ok(config::neox(
                hd,
                hd,
                theta,
                Some(proportional_freq_factors(hd, rotated, factor)),
            ))
        }
        other => Err(bad(arch, format!("unsupported rope type {other:?}"))),
    }
}

pub(crate) fn from_hf(
    ckpt: &Checkpoint,
    cfg: &Value,
    naming: Naming,
    vocab: usize,
    max_context: usize,
    arch: &'static str,
) -> Result<GemmaSpec, ModelError> {
    let c = config::text_config(cfg);
    let n = config::req_ju(arch, c, "num_hidden_layers")?;
    let hidden = config::req_ju(arch, c, "hidden_size")?;
    let n_heads = config::req_ju(arch, c, "num_attention_heads")?;
    if c.get("use_bidirectional_attention")
        .and_then(|v| v.as_str())
        == Some("all")
    {
        return Err(bad(arch, "bidirectional attention is not supported"));
    }
    let mut sliding = config::layer_types(arch, c, n, 6)?;
    if let Some(last) = sliding.last_mut() {
        *last = false; // HF forces the last layer to full attention
    }
    let k_eq_v = config::jb(c, "attention_k_eq_v").unwrap_or(false);
    let hd_swa = config::ju(c, "head_dim").unwrap_or(256);
    let kv_swa = config::ju(c, "num_key_value_heads").unwrap_or(4); // HF Gemma4TextConfig default
    let hd_full_default = config::ju(c, "global_head_dim").unwrap_or(512);
    let kv_full_default = match config::ju(c, "num_global_key_value_heads") {
        Some(k) if k_eq_v => k,
        _ => kv_swa,
    };
    let per_layer = c.get("per_layer_config").and_then(|v| v.as_object());
    let shared = config::ju(c, "num_kv_shared_layers").unwrap_or(0);
    // The assistant's layers all read the target's KV: its loader sets their sources.
    let sources = if arch == "gemma4-assistant" {
        vec![None; n]
    } else {
        kv_sources(&sliding, shared)?
    };
    let moe_on = config::jb(c, "enable_moe_block").unwrap_or(false);
    let mut layers = Vec::with_capacity(n);
    for i in 0..n {
        let (mut hd, mut kv) = if sliding[i] {
            (hd_swa, kv_swa)
        } else {
            (hd_full_default, kv_full_default)
        };
        if let Some(pl) = per_layer {
            // Saved configs: overrides keyed by zero-padded layer index, replacing the defaults.
            let over = pl
                .iter()
                .find(|(k, _)| k.parse::<usize>().ok() == Some(i))
                .map(|(_, v)| v);
            (hd, kv) = (hd_swa, kv_swa);
            if let Some(o) = over {
                hd = config::ju(o, "head_dim").unwrap_or(hd);
                kv = config::ju(o, "num_key_value_heads").unwrap_or(kv);
            }
        }
        let own = sources[i].is_none();
        layers.push(LayerSpec {
            sliding: sliding[i],
            head_dim: hd,
            n_kv_heads: kv,
            rope: hf_rope(arch, c, sliding[i], hd)?,
            k_eq_v: own && k_eq_v && !sliding[i],
            kv_source: sources[i],
            moe: moe_on,
        });
    }
    // The shared layers' geometry is that of their source.
    for i in 0..n {
        if let Some(j) = layers[i].kv_source {
            layers[i].n_kv_heads = layers[j].n_kv_heads;
        }
    }
    let moe = if moe_on {
        Some(MoeSpec {
            n_experts: config::req_ju(arch, c, "num_experts")?,
            top_k: config::req_ju(arch, c, "top_k_experts")?,
        })
    } else {
        None
    };
    // HF's default is 256; checkpoints without PLE say 0 (or null).
    let ple_dim = match c.get("hidden_size_per_layer_input") {
        None => 256,
        Some(v) => v.as_u64().unwrap_or(0) as usize,
    };
    let ple_dim = if ple_dim > 0 && !ckpt.has(&global_name(&naming, "ple_embed")) {
        0
    } else {
        ple_dim
    };
    Ok(GemmaSpec {
        arch,
        naming,
        hidden,
        n_heads,
        vocab,
        eps: config::jf(c, "rms_norm_eps").unwrap_or(1e-6),
        norm: NormForm::Plain,
        v_norm: true,
        attn_scale: 1.0,
        window: config::ju(c, "sliding_window").unwrap_or(512),
        final_softcap: config::jf(c, "final_logit_softcapping"),
        embed_scale: embed_scale(hidden, config::dtype(cfg)),
        ple_dim,
        moe,
        layer_scalar: true,
        layers,
        max_context: context_limit(max_context, config::ju(c, "max_position_embeddings")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_sharing_reads_the_last_unshared_layer_of_the_same_type() {
        // s s f s s f s f with the last 3 shared: 5 (f) -> 2, 6 (s) -> 4, 7 (f) -> 2
        let sliding = [true, true, false, true, true, false, true, false];
        let src = kv_sources(&sliding, 3).unwrap();
        assert_eq!(
            src,
            vec![None, None, None, None, None, Some(2), Some(4), Some(2)]
        );
        assert_eq!(kv_sources(&sliding, 0).unwrap(), vec![None; 8]);
        // a shared full layer with no full layer before the shared block
        assert!(kv_sources(&[true, false], 1).is_err());
        assert!(kv_sources(&[true], 2).is_err());
    }
}
