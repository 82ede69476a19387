//! Real model shapes for random-weight GGUFs, mirroring the presets of the reference script
//! `synth_gguf.py` (tensor names and order as llama.cpp's converter writes them, metadata keys and
//! value types as gguf-py writes them), plus tiny shapes of the same layouts for CPU tests.

use crate::gguf::GgufValue;

/// What fills a tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fill {
    /// A weight matrix: random blocks of the file's quant type.
    Matrix,
    /// A matrix kept in F32 with random values (the MoE router).
    RandomF32,
    /// Every element this value (norm weights 1.0, layer scalars).
    Const(f32),
    /// Gemma 4's proportional RoPE divisors: 1.0 for the first n pairs, 1e30 for the rest.
    RopeFreqs(usize),
}

/// One tensor of a preset.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    /// PyTorch order (outermost first).
    pub shape: Vec<usize>,
    pub fill: Fill,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen3,
    Gemma4,
}

/// Hyper-parameters of a shape (the fields of synth_gguf.py's PRESETS).
#[derive(Debug, Clone)]
pub struct Preset {
    pub key: &'static str,
    pub arch: &'static str,
    pub family: Family,
    pub name: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub ctx: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub tied: bool,
    /// Rows of token_embd (the real checkpoint's padded vocabulary), when the preset knows it.
    pub n_vocab: Option<usize>,
    /// Token count used when no donor tokenizer is given.
    pub default_vocab: usize,
    // MoE
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    // Gemma 4
    pub n_head_kv_global: usize,
    pub head_dim_global: usize,
    pub k_eq_v: bool,
    pub swa_period: usize,
    pub sliding_window: usize,
    pub rope_theta_swa: f32,
    pub partial_rotary_global: f32,
    pub final_logit_softcap: f32,
}

const BASE: Preset = Preset {
    key: "",
    arch: "qwen3",
    family: Family::Qwen3,
    name: "",
    n_layer: 0,
    n_embd: 0,
    n_head: 0,
    n_head_kv: 0,
    head_dim: 0,
    n_ff: 0,
    ctx: 40960,
    rope_theta: 1e6,
    rms_eps: 1e-6,
    tied: false,
    n_vocab: None,
    default_vocab: 151936,
    n_expert: 0,
    n_expert_used: 0,
    n_ff_exp: 0,
    n_head_kv_global: 0,
    head_dim_global: 0,
    k_eq_v: false,
    swa_period: 0,
    sliding_window: 0,
    rope_theta_swa: 1e4,
    partial_rotary_global: 1.0,
    final_logit_softcap: 0.0,
};

const GEMMA4_12B: Preset = Preset {
    key: "gemma4-12b",
    arch: "gemma4",
    family: Family::Gemma4,
    name: "Gemma-4-12B (random weights)",
    n_layer: 48,
    n_embd: 3840,
    n_head: 16,
    n_head_kv: 8,
    head_dim: 256,
    n_head_kv_global: 1,
    head_dim_global: 512,
    k_eq_v: true,
    n_ff: 15360,
    ctx: 262144,
    swa_period: 6,
    sliding_window: 1024,
    rope_theta: 1e6,
    rope_theta_swa: 1e4,
    partial_rotary_global: 0.25,
    final_logit_softcap: 30.0,
    tied: true,
    n_vocab: Some(262144),
    default_vocab: 262144,
    ..BASE
};

/// Every preset: the real shapes, then the tiny ones (CPU tests).
pub const PRESETS: &[Preset] = &[
    Preset {
        key: "qwen3-8b",
        name: "Qwen3-8B (random weights)",
        n_layer: 36,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 12288,
        ..BASE
    },
    Preset {
        key: "qwen3-30b-a3b",
        arch: "qwen3moe",
        name: "Qwen3-30B-A3B (random weights)",
        n_layer: 48,
        n_embd: 2048,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_ff: 6144,
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 768,
        ..BASE
    },
    GEMMA4_12B,
    Preset {
        key: "tiny-qwen3",
        name: "tiny Qwen3 (random weights)",
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 512,
        default_vocab: 512,
        ..BASE
    },
    // the tiny Qwen3 at Qwen3's head dim (128): the decode attention's tensor-core entries
    Preset {
        key: "tiny-qwen3-hd128",
        name: "tiny Qwen3, head dim 128 (random weights)",
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 128,
        n_ff: 512,
        default_vocab: 512,
        ..BASE
    },
    Preset {
        key: "tiny-qwen3moe",
        arch: "qwen3moe",
        name: "tiny Qwen3-MoE (random weights)",
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 512,
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 256,
        default_vocab: 512,
        ..BASE
    },
    Preset {
        key: "tiny-gemma4",
        name: "tiny Gemma 4 (random weights)",
        n_layer: 6,
        n_embd: 256,
        // 4 query heads: groups of 2 (sliding, 128 wide) and 4 over one 512-wide global KV head
        // (the CUDA decode's whole-group entry in the selftest's synthesised-model rows)
        n_head: 4,
        n_head_kv: 2,
        head_dim: 128,
        n_head_kv_global: 1,
        head_dim_global: 512,
        n_ff: 512,
        ctx: 4096,
        sliding_window: 16,
        n_vocab: None,
        default_vocab: 512,
        ..GEMMA4_12B
    },
];

pub fn find(key: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.key == key)
}

pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.key).collect()
}

impl Preset {
    /// Gemma 4's per-layer is-sliding flags: 5 sliding : 1 full, the last layer always full.
    pub fn swa_layers(&self) -> Vec<bool> {
        let mut swa: Vec<bool> = (0..self.n_layer)
            .map(|i| (i + 1) % self.swa_period != 0)
            .collect();
        if let Some(l) = swa.last_mut() {
            *l = false;
        }
        swa
    }

    /// Tensors in the order llama.cpp's converter writes them.
    pub fn tensors(&self, n_vocab: usize) -> Vec<Spec> {
        let mut v = Vec::new();
        let mut add = |name: String, shape: &[usize], fill: Fill| {
            v.push(Spec {
                name,
                shape: shape.to_vec(),
                fill,
            })
        };
        let one = Fill::Const(1.0);
        let e = self.n_embd;
        match self.family {
            Family::Qwen3 => {
                let d = self.head_dim;
                let (q, kv) = (self.n_head * d, self.n_head_kv * d);
                add("token_embd.weight".into(), &[n_vocab, e], Fill::Matrix);
                for i in 0..self.n_layer {
                    let b = |s: &str| format!("blk.{i}.{s}.weight");
                    add(b("attn_norm"), &[e], one);
                    add(b("attn_q"), &[q, e], Fill::Matrix);
                    add(b("attn_k"), &[kv, e], Fill::Matrix);
                    add(b("attn_v"), &[kv, e], Fill::Matrix);
                    add(b("attn_output"), &[e, q], Fill::Matrix);
                    add(b("attn_q_norm"), &[d], one);
                    add(b("attn_k_norm"), &[d], one);
                    add(b("ffn_norm"), &[e], one);
                    if self.n_expert > 0 {
                        let (x, f) = (self.n_expert, self.n_ff_exp);
                        add(b("ffn_gate_inp"), &[x, e], Fill::RandomF32);
                        add(b("ffn_gate_exps"), &[x, f, e], Fill::Matrix);
                        add(b("ffn_up_exps"), &[x, f, e], Fill::Matrix);
                        add(b("ffn_down_exps"), &[x, e, f], Fill::Matrix);
                    } else {
                        add(b("ffn_gate"), &[self.n_ff, e], Fill::Matrix);
                        add(b("ffn_up"), &[self.n_ff, e], Fill::Matrix);
                        add(b("ffn_down"), &[e, self.n_ff], Fill::Matrix);
                    }
                }
            }
            Family::Gemma4 => {
                let (h, f, dg) = (self.n_head, self.n_ff, self.head_dim_global);
                let pairs = (dg as f32 * self.partial_rotary_global / 2.0) as usize;
                add(
                    "rope_freqs.weight".into(),
                    &[dg / 2],
                    Fill::RopeFreqs(pairs),
                );
                add("token_embd.weight".into(), &[n_vocab, e], Fill::Matrix);
                for (i, swa) in self.swa_layers().into_iter().enumerate() {
                    let d = if swa { self.head_dim } else { dg };
                    let kv = if swa {
                        self.n_head_kv
                    } else {
                        self.n_head_kv_global
                    } * d;
                    let b = |s: &str| format!("blk.{i}.{s}.weight");
                    add(b("attn_norm"), &[e], one);
                    add(b("attn_q"), &[h * d, e], Fill::Matrix);
                    add(b("attn_k"), &[kv, e], Fill::Matrix);
                    if swa || !self.k_eq_v {
                        add(b("attn_v"), &[kv, e], Fill::Matrix);
                    }
                    add(b("attn_output"), &[e, h * d], Fill::Matrix);
                    add(b("attn_q_norm"), &[d], one);
                    add(b("attn_k_norm"), &[d], one);
                    add(b("post_attention_norm"), &[e], one);
                    add(b("layer_output_scale"), &[1], one);
                    add(b("ffn_norm"), &[e], one);
                    add(b("ffn_gate"), &[f, e], Fill::Matrix);
                    add(b("ffn_up"), &[f, e], Fill::Matrix);
                    add(b("ffn_down"), &[e, f], Fill::Matrix);
                    add(b("post_ffw_norm"), &[e], one);
                }
            }
        }
        add("output_norm.weight".into(), &[e], one);
        if !self.tied {
            add("output.weight".into(), &[n_vocab, e], Fill::Matrix);
        }
        v
    }

    /// Architecture metadata as gguf-py writes it (after `general.architecture`).
    pub fn metadata(&self, file_type: u32) -> Vec<(String, GgufValue)> {
        use GgufValue::{Array, Bool, String as S, F32, I32, U32};
        let a = self.arch;
        let mut kv: Vec<(String, GgufValue)> = Vec::new();
        let mut put = |k: &str, v: GgufValue| {
            let key = if k.starts_with("general.") {
                k.to_string()
            } else {
                format!("{a}.{k}")
            };
            kv.push((key, v))
        };
        let u = |x: usize| U32(x as u32);
        put("general.name", S(self.name.into()));
        put("general.file_type", U32(file_type));
        put("context_length", u(self.ctx));
        put("embedding_length", u(self.n_embd));
        match self.family {
            Family::Qwen3 => {
                put("block_count", u(self.n_layer));
                put("feed_forward_length", u(self.n_ff));
                put("attention.head_count", u(self.n_head));
                put("attention.head_count_kv", u(self.n_head_kv));
                put("attention.key_length", u(self.head_dim));
                put("attention.value_length", u(self.head_dim));
                put("rope.dimension_count", u(self.head_dim));
                put("rope.freq_base", F32(self.rope_theta));
                put("attention.layer_norm_rms_epsilon", F32(self.rms_eps));
                if self.n_expert > 0 {
                    put("expert_count", u(self.n_expert));
                    put("expert_used_count", u(self.n_expert_used));
                    put("expert_feed_forward_length", u(self.n_ff_exp));
                }
            }
            Family::Gemma4 => {
                let swa = self.swa_layers();
                put("block_count", u(self.n_layer));
                put("attention.head_count", u(self.n_head));
                put("attention.layer_norm_rms_epsilon", F32(self.rms_eps));
                put("rope.freq_base", F32(self.rope_theta));
                put("feed_forward_length", u(self.n_ff));
                let kvh = swa
                    .iter()
                    .map(|&s| {
                        I32(if s {
                            self.n_head_kv
                        } else {
                            self.n_head_kv_global
                        } as i32)
                    })
                    .collect();
                put("attention.head_count_kv", Array(kvh));
                put("attention.key_length", u(self.head_dim_global));
                put("attention.value_length", u(self.head_dim_global));
                put("attention.key_length_swa", u(self.head_dim));
                put("attention.value_length_swa", u(self.head_dim));
                put("rope.dimension_count", u(self.head_dim_global));
                put("rope.dimension_count_swa", u(self.head_dim));
                put("rope.freq_base_swa", F32(self.rope_theta_swa));
                put("attention.sliding_window", u(self.sliding_window));
                put(
                    "attention.sliding_window_pattern",
                    Array(swa.iter().map(|&s| Bool(s)).collect()),
                );
                put("attention.shared_kv_layers", u(0));
                put("embedding_length_per_layer_input", u(0));
                put("final_logit_softcapping", F32(self.final_logit_softcap));
            }
        }
        kv
    }
}
