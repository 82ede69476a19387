//! What a Gemma decoder looks like, resolved from a checkpoint's configuration.
//!
//! Gemma 3 and Gemma 4 share one block diagram (pre/post norms around attention and the FFN,
//! q/k norms, GeGLU, scaled embeddings, tied head). The differences are data, held here:
//! how norm weights apply (HF Gemma 3 stores `w` for `x_hat * (1 + w)`, GGUF files fold the +1;
//! Gemma 4 multiplies by `w`), the per-layer attention geometry (head dim, KV heads, RoPE,
//! window), whether V is the K projection, whether a layer reuses another layer's KV, the
//! attention scale, the final soft-cap, Gemma 4's per-layer embeddings (PLE) and MoE block.

use crate::backend::Rope;
use crate::model::ModelError;

/// How a stored RMSNorm weight scales the normalised value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormForm {
    /// `x_hat * (1 + w)` (Gemma 3, HF safetensors).
    OnePlus,
    /// `x_hat * w` (Gemma 4; GGUF Gemma 3 with the +1 folded in by llama.cpp's converter).
    Plain,
}

/// Where a checkpoint keeps its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Naming {
    /// llama.cpp names (`blk.N.attn_q.weight`).
    Gguf,
    /// HF names under a prefix (`model.` or `model.language_model.`).
    Hf { prefix: String },
}

/// One decoder layer's attention geometry.
#[derive(Debug, Clone)]
pub struct LayerSpec {
    pub sliding: bool,
    pub head_dim: usize,
    pub n_kv_heads: usize,
    pub rope: Rope,
    /// V is the raw K projection (Gemma 4 global layers with `attention_k_eq_v`).
    pub k_eq_v: bool,
    /// `Some(j)`: no K/V of its own; attends over layer `j`'s cache (Gemma 4 KV sharing).
    pub kv_source: Option<usize>,
    /// The layer has the MoE block beside its dense MLP.
    pub moe: bool,
}

/// Routing facts of Gemma 4's MoE block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeSpec {
    pub n_experts: usize,
    pub top_k: usize,
}

/// A whole Gemma decoder.
#[derive(Debug, Clone)]
pub struct GemmaSpec {
    /// Registry name ("gemma3", "gemma4", "gemma4-assistant").
    pub arch: &'static str,
    pub naming: Naming,
    pub hidden: usize,
    pub n_heads: usize,
    pub vocab: usize,
    pub eps: f32,
    pub norm: NormForm,
    /// Weightless RMSNorm on V (Gemma 4).
    pub v_norm: bool,
    /// Multiplier on q.k.
    pub attn_scale: f32,
    pub window: usize,
    /// `cap * tanh(logits / cap)` on the output logits.
    pub final_softcap: Option<f32>,
    /// Multiplier on embedding rows (sqrt(hidden), see `embed_scale`).
    pub embed_scale: f32,
    /// Per-layer embedding width (0: no PLE).
    pub ple_dim: usize,
    pub moe: Option<MoeSpec>,
    /// Multiply each layer's output by its stored scalar (Gemma 4 `layer_scalar`).
    pub layer_scalar: bool,
    pub layers: Vec<LayerSpec>,
    pub max_context: usize,
}

impl GemmaSpec {
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// K and V elements one token occupies over the layers that own a cache.
    pub fn kv_elems_per_token(&self) -> usize {
        let (full, sliding) = self.kv_elems_split();
        full + sliding
    }

    /// [`Self::kv_elems_per_token`] split into (the other layers, the sliding-window layers).
    pub fn kv_elems_split(&self) -> (usize, usize) {
        let mut split = (0, 0);
        for l in self.layers.iter().filter(|l| l.kv_source.is_none()) {
            let e = 2 * l.n_kv_heads * l.head_dim;
            if l.sliding {
                split.1 += e;
            } else {
                split.0 += e;
            }
        }
        split
    }

    /// Basic consistency checks, so a malformed config fails at load with a message.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Other(format!("{} config: {m}", self.arch)));
        if self.hidden == 0 || self.n_heads == 0 || self.vocab == 0 || self.layers.is_empty() {
            return bad("hidden size, heads, vocabulary and layers must be non-zero".into());
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.head_dim == 0 || l.head_dim % 2 != 0 {
                return bad(format!(
                    "layer {i}: head dim {} must be even and non-zero",
                    l.head_dim
                ));
            }
            if l.n_kv_heads == 0 || self.n_heads % l.n_kv_heads != 0 {
                return bad(format!(
                    "layer {i}: {} heads not a multiple of {} KV heads",
                    self.n_heads, l.n_kv_heads
                ));
            }
            if l.rope.rot_dims > l.head_dim || l.rope.rot_dims % 2 != 0 {
                return bad(format!(
                    "layer {i}: rotary dims {} invalid for head dim {}",
                    l.rope.rot_dims, l.head_dim
                ));
            }
            if let Some(j) = l.kv_source {
                let src = self.layers.get(j);
                match src {
                    Some(s)
                        if j < i
                            && s.kv_source.is_none()
                            && s.head_dim == l.head_dim
                            && s.n_kv_heads == l.n_kv_heads => {}
                    _ => return bad(format!("layer {i}: cannot share the KV of layer {j}")),
                }
            }
        }
        if let Some(m) = self.moe {
            if m.top_k == 0 || m.top_k > m.n_experts {
                return bad(format!("top-{} of {} experts", m.top_k, m.n_experts));
            }
        }
        Ok(())
    }
}

/// The context a session may hold: the caller's cap (0 = none), within the model's own limit,
/// and 8192 when neither says.
pub fn context_limit(requested: usize, model: Option<usize>) -> usize {
    match (requested, model) {
        (0, Some(m)) => m,
        (0, None) => 8192,
        (r, Some(m)) => r.min(m),
        (r, None) => r,
    }
}

/// `sqrt(hidden)` as HF computes it for a model stored in `dtype`: the scale is a tensor cast to
/// the embedding dtype before multiplying (so bf16 checkpoints use sqrt(hidden) rounded to bf16,
/// e.g. sqrt(3072) = 55.4256 becomes 55.5). GGUF files (llama.cpp multiplies by the f32 value)
/// and f32 checkpoints use the exact value.
pub fn embed_scale(hidden: usize, dtype: Option<&str>) -> f32 {
    let s = (hidden as f32).sqrt();
    match dtype {
        Some("bfloat16") => crate::quant::bf16_to_f32(f32_to_bf16_round(s)),
        Some("float16") => half::f16::from_f32(s).to_f32(),
        _ => s,
    }
}

/// Round-to-nearest-even f32 -> bf16 bits (torch's cast).
fn f32_to_bf16_round(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// Per-pair RoPE divisors for HF's "proportional" RoPE (Gemma 4 global layers): the first
/// `rotated` of `head_dim / 2` pairs turn at the usual frequencies, the rest not at all (an
/// infinite divisor gives frequency 0, i.e. the identity), all over the FULL head with
/// rotate_half pairing (i, i + head_dim/2). `factor` divides every frequency.
pub fn proportional_freq_factors(head_dim: usize, rotated: usize, factor: f32) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| if i < rotated { factor } else { f32::INFINITY })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_embed_scale_matches_hf_note() {
        // transformers' comment: sqrt(3072) = 55.4256 becomes 55.5 in bfloat16.
        assert_eq!(embed_scale(3072, Some("bfloat16")), 55.5);
        assert!((embed_scale(3072, Some("float32")) - 55.425_625).abs() < 1e-4);
    }

    #[test]
    fn proportional_factors() {
        let f = proportional_freq_factors(8, 1, 1.0);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!(f[1..].iter().all(|v| v.is_infinite()));
    }
}
