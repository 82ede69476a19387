//! Hyper-parameters of the Qwen3 / Qwen3-MoE / Qwen3.5 (hybrid) families, from `config.json` or
//! GGUF metadata.

use crate::model::common::config::GgufKeys;
use crate::model::common::JsonConfig;
use crate::model::ModelError;

/// Which family member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Qwen3,
    Qwen3Moe,
    Qwen35,
    Qwen35Moe,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Qwen3 => "qwen3",
            Variant::Qwen3Moe => "qwen3moe",
            Variant::Qwen35 => "qwen35",
            Variant::Qwen35Moe => "qwen35moe",
        }
    }
    pub fn hybrid(self) -> bool {
        matches!(self, Variant::Qwen35 | Variant::Qwen35Moe)
    }
    pub fn moe(self) -> bool {
        matches!(self, Variant::Qwen3Moe | Variant::Qwen35Moe)
    }
}

/// Token mixer of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    Attention,
    /// Gated DeltaNet (Qwen3.5 "linear_attention").
    Linear,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnDims {
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub kernel: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeDims {
    pub n_experts: usize,
    pub top_k: usize,
    pub ff: usize,
    pub norm_topk: bool,
    /// Width of the sigmoid-gated shared expert (Qwen3.5 MoE).
    pub shared_ff: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct QwenConfig {
    pub variant: Variant,
    pub hidden: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Dense MLP width (layers without experts).
    pub ff: usize,
    pub eps: f32,
    pub rope_theta: f32,
    pub rot_dims: usize,
    pub mixers: Vec<Mixer>,
    /// Per layer: routed experts (true) or dense MLP.
    pub moe_layers: Vec<bool>,
    pub moe: Option<MoeDims>,
    pub gdn: Option<GdnDims>,
    pub max_pos: usize,
}

fn bad(detail: String) -> ModelError {
    ModelError::Other(detail)
}

impl QwenConfig {
    /// From `config.json` (text_config of the multimodal wrapper when present).
    pub fn from_json(variant: Variant, c: &JsonConfig<'_>) -> Result<Self, ModelError> {
        let hidden = c.usize("hidden_size")?;
        let n_layers = c.usize("num_hidden_layers")?;
        let n_heads = c.usize("num_attention_heads")?;
        let n_kv_heads = c.opt_usize("num_key_value_heads").unwrap_or(n_heads);
        let head_dim = c.opt_usize("head_dim").unwrap_or(hidden / n_heads.max(1));
        if c.opt_bool("use_sliding_window") == Some(true) {
            return Err(bad(
                "use_sliding_window = true is not supported for Qwen3 models".into(),
            ));
        }
        if c.opt_bool("attention_bias") == Some(true) {
            return Err(bad(
                "attention_bias = true is not supported for Qwen3 models".into(),
            ));
        }
        let rope_theta =
            c.rope_f32("rope_theta")
                .unwrap_or(if variant.hybrid() { 1e7 } else { 1e6 });
        let partial = c
            .rope_f32("partial_rotary_factor")
            .unwrap_or(if variant.hybrid() { 0.25 } else { 1.0 });
        let rot_dims = ((head_dim as f32 * partial) as usize) & !1;
        let mixers = if variant.hybrid() {
            match c.strings("layer_types") {
                Some(t) => t
                    .iter()
                    .map(|s| match s.as_str() {
                        "full_attention" => Ok(Mixer::Attention),
                        "linear_attention" => Ok(Mixer::Linear),
                        o => Err(bad(format!("unknown layer type {o}"))),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                None => interval_mixers(
                    n_layers,
                    c.opt_usize("full_attention_interval").unwrap_or(4),
                ),
            }
        } else {
            vec![Mixer::Attention; n_layers]
        };
        let gdn = if variant.hybrid() {
            Some(GdnDims {
                n_k_heads: c.usize("linear_num_key_heads")?,
                n_v_heads: c.usize("linear_num_value_heads")?,
                k_dim: c.usize("linear_key_head_dim")?,
                v_dim: c.usize("linear_value_head_dim")?,
                kernel: c.opt_usize("linear_conv_kernel_dim").unwrap_or(4),
            })
        } else {
            None
        };
        let moe = if variant.moe() {
            Some(MoeDims {
                n_experts: c
                    .opt_usize("num_experts")
                    .or(c.opt_usize("num_local_experts"))
                    .ok_or_else(|| bad("config value `num_experts` is missing".into()))?,
                top_k: c.usize("num_experts_per_tok")?,
                ff: c.usize("moe_intermediate_size")?,
                // HF Qwen3-MoE defaults to false; Qwen3.5-MoE always renormalises.
                norm_topk: variant.hybrid() || c.opt_bool("norm_topk_prob").unwrap_or(false),
                shared_ff: if variant.hybrid() {
                    Some(c.usize("shared_expert_intermediate_size")?)
                } else {
                    None
                },
            })
        } else {
            None
        };
        let moe_layers = (0..n_layers)
            .map(|i| {
                if variant == Variant::Qwen3Moe {
                    let only = c.usizes("mlp_only_layers").unwrap_or_default();
                    let step = c.opt_usize("decoder_sparse_step").unwrap_or(1).max(1);
                    !only.contains(&i) && (i + 1) % step == 0
                } else {
                    variant.moe()
                }
            })
            .collect();
        let cfg = QwenConfig {
            variant,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ff: c.opt_usize("intermediate_size").unwrap_or(0),
            eps: c.opt_f32("rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            rot_dims,
            mixers,
            moe_layers,
            moe,
            gdn,
            max_pos: c.opt_usize("max_position_embeddings").unwrap_or(32768),
        };
        cfg.validate()
    }

    /// From GGUF metadata (`{arch}.*` keys as llama.cpp writes them).
    pub fn from_gguf(variant: Variant, k: &GgufKeys<'_>) -> Result<Self, ModelError> {
        let hidden = k.usize("embedding_length")?;
        let n_layers = k.usize("block_count")?;
        let n_heads = k.usize_per_layer_max("attention.head_count")?;
        let n_kv_heads = k
            .usize_per_layer_max("attention.head_count_kv")
            .unwrap_or(n_heads);
        let head_dim = k
            .opt_usize("attention.key_length")
            .unwrap_or(hidden / n_heads.max(1));
        let rot_dims = k.opt_usize("rope.dimension_count").unwrap_or(head_dim);
        let mixers = if variant.hybrid() {
            interval_mixers(
                n_layers,
                k.opt_usize("full_attention_interval").unwrap_or(4),
            )
        } else {
            vec![Mixer::Attention; n_layers]
        };
        let gdn = if variant.hybrid() {
            let nv = k.usize("ssm.time_step_rank")?;
            let inner = k.usize("ssm.inner_size")?;
            Some(GdnDims {
                n_k_heads: k.usize("ssm.group_count")?,
                n_v_heads: nv,
                k_dim: k.usize("ssm.state_size")?,
                v_dim: inner / nv.max(1),
                kernel: k.opt_usize("ssm.conv_kernel").unwrap_or(4),
            })
        } else {
            None
        };
        let moe = if variant.moe() {
            Some(MoeDims {
                n_experts: k.usize("expert_count")?,
                top_k: k.usize("expert_used_count")?,
                ff: k.usize("expert_feed_forward_length")?,
                norm_topk: k.opt_bool("expert_weights_norm").unwrap_or(true),
                shared_ff: if variant.hybrid() {
                    Some(k.usize("expert_shared_feed_forward_length")?)
                } else {
                    None
                },
            })
        } else {
            None
        };
        let cfg = QwenConfig {
            variant,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads,
            head_dim,
            ff: k.opt_usize("feed_forward_length").unwrap_or(0),
            eps: k
                .opt_f32("attention.layer_norm_rms_epsilon")
                .unwrap_or(1e-6),
            rope_theta: k.opt_f32("rope.freq_base").unwrap_or(if variant.hybrid() {
                1e7
            } else {
                1e6
            }),
            rot_dims,
            mixers,
            moe_layers: vec![variant.moe(); n_layers],
            moe,
            gdn,
            max_pos: k.opt_usize("context_length").unwrap_or(32768),
        };
        cfg.validate()
    }

    fn validate(self) -> Result<Self, ModelError> {
        let c = &self;
        let ok = c.hidden > 0
            && c.n_layers > 0
            && c.n_heads > 0
            && c.n_kv_heads > 0
            && c.n_heads % c.n_kv_heads == 0
            && c.head_dim > 0
            && c.rot_dims <= c.head_dim
            && c.rot_dims % 2 == 0
            && c.mixers.len() == c.n_layers
            && c.moe_layers.len() == c.n_layers;
        if !ok {
            return Err(bad(format!(
                "inconsistent {} config: {c:?}",
                c.variant.name()
            )));
        }
        if let Some(g) = &c.gdn {
            if g.n_k_heads == 0
                || g.n_v_heads % g.n_k_heads != 0
                || g.k_dim == 0
                || g.v_dim == 0
                || g.kernel < 2
            {
                return Err(bad(format!("inconsistent Gated DeltaNet dimensions {g:?}")));
            }
        }
        if let Some(m) = &c.moe {
            if m.top_k == 0 || m.top_k > m.n_experts {
                return Err(bad(format!("top-{} of {} experts", m.top_k, m.n_experts)));
            }
        }
        Ok(self)
    }
}

/// Layer i is full attention when (i + 1) % interval == 0, else Gated DeltaNet.
fn interval_mixers(n: usize, interval: usize) -> Vec<Mixer> {
    let iv = interval.max(1);
    (0..n)
        .map(|i| {
            if (i + 1) % iv == 0 {
                Mixer::Attention
            } else {
                Mixer::Linear
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::common::GgufMeta;
    use std::collections::HashMap;

    #[derive(Default)]
    struct Meta(HashMap<String, Vec<u64>>, HashMap<String, f32>);
    impl GgufMeta for Meta {
        fn meta_u64(&self, key: &str) -> Option<u64> {
            self.0.get(key).filter(|v| v.len() == 1).map(|v| v[0])
        }
        fn meta_f32(&self, key: &str) -> Option<f32> {
            self.1.get(key).copied()
        }
        fn meta_u64_array(&self, key: &str) -> Option<Vec<u64>> {
            self.0.get(key).cloned()
        }
        fn meta_bool(&self, _: &str) -> Option<bool> {
            None
        }
    }

    #[test]
    fn qwen35_from_gguf_keys() {
        let mut m = Meta::default();
        for (k, v) in [
            ("block_count", vec![8]),
            ("embedding_length", vec![64]),
            ("feed_forward_length", vec![96]),
            ("attention.head_count", vec![4]),
            // llama.cpp writes 0 KV heads for the recurrent layers
            ("attention.head_count_kv", vec![0, 0, 0, 2, 0, 0, 0, 2]),
            ("attention.key_length", vec![32]),
            ("rope.dimension_count", vec![8]),
            ("ssm.conv_kernel", vec![4]),
            ("ssm.state_size", vec![16]),
            ("ssm.group_count", vec![2]),
            ("ssm.time_step_rank", vec![4]),
            ("ssm.inner_size", vec![64]),
            ("full_attention_interval", vec![4]),
        ] {
            m.0.insert(format!("qwen35.{k}"), v);
        }
        m.1.insert("qwen35.rope.freq_base".into(), 1e7);
        let c = QwenConfig::from_gguf(
            Variant::Qwen35,
            &GgufKeys {
                meta: &m,
                arch: "qwen35",
            },
        )
        .unwrap();
        assert_eq!(
            (c.n_heads, c.n_kv_heads, c.head_dim, c.rot_dims),
            (4, 2, 32, 8)
        );
        use Mixer::*;
        assert_eq!(
            c.mixers,
            vec![Linear, Linear, Linear, Attention, Linear, Linear, Linear, Attention]
        );
        let g = c.gdn.unwrap();
        assert_eq!(
            (g.n_k_heads, g.n_v_heads, g.k_dim, g.v_dim, g.kernel),
            (2, 4, 16, 16, 4)
        );
        // missing required key -> typed error naming it
        m.0.remove("qwen35.ssm.state_size");
        let e = QwenConfig::from_gguf(
            Variant::Qwen35,
            &GgufKeys {
                meta: &m,
                arch: "qwen35",
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("qwen35.ssm.state_size"), "{e}");
    }

    #[test]
    fn inconsistent_configs_are_refused() {
        let j = serde_json::json!({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 3,
            "num_key_value_heads": 2, "head_dim": 16});
        assert!(QwenConfig::from_json(Variant::Qwen3, &JsonConfig::new(&j)).is_err());
        let j = serde_json::json!({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 5,
            "moe_intermediate_size": 32});
        assert!(QwenConfig::from_json(Variant::Qwen3Moe, &JsonConfig::new(&j)).is_err());
        let j = serde_json::json!({"text_config": {"hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}});
        let c = QwenConfig::from_json(Variant::Qwen3, &JsonConfig::new(&j)).unwrap();
        assert_eq!((c.hidden, c.rot_dims), (64, 16));
    }
}
