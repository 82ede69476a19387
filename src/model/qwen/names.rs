//! Tensor names of the Qwen families in the two layouts: HF safetensors (under a text prefix such
//! as `model.` or `model.language_model.`) and llama.cpp GGUF.

/// Role of a tensor inside a layer (or the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    AttnNorm,
    PostAttnNorm,
    Q,
    K,
    V,
    O,
    QNorm,
    KNorm,
    Gate,
    Up,
    Down,
    Router,
    SharedGate,
    SharedUp,
    SharedDown,
    SharedRouter,
    GdnQkv,
    GdnZ,
    GdnA,
    GdnB,
    GdnConv,
    GdnALog,
    GdnDtBias,
    GdnNorm,
    GdnOut,
}

#[derive(Debug, Clone)]
pub enum Names {
    Hf {
        prefix: String,
    },
    /// `post_ffn` is the GGUF name of the post-attention norm ("ffn_norm" for qwen3/qwen3moe,
    /// "post_attention_norm" for qwen35/qwen35moe).
    Gguf {
        post_norm: &'static str,
    },
}

impl Names {
    pub fn is_gguf(&self) -> bool {
        matches!(self, Names::Gguf { .. })
    }
    pub fn embed(&self) -> String {
        match self {
            Names::Hf { prefix } => format!("{prefix}embed_tokens.weight"),
            Names::Gguf { .. } => "token_embd.weight".into(),
        }
    }
    pub fn final_norm(&self) -> String {
        match self {
            Names::Hf { prefix } => format!("{prefix}norm.weight"),
            Names::Gguf { .. } => "output_norm.weight".into(),
        }
    }
    pub fn lm_head(&self) -> String {
        match self {
            Names::Hf { .. } => "lm_head.weight".into(),
            Names::Gguf { .. } => "output.weight".into(),
        }
    }

    pub fn layer(&self, i: usize, r: Role) -> String {
        use Role::*;
        match self {
            Names::Hf { prefix } => {
                let s = match r {
                    AttnNorm => "input_layernorm.weight",
                    PostAttnNorm => "post_attention_layernorm.weight",
                    Q => "self_attn.q_proj.weight",
                    K => "self_attn.k_proj.weight",
                    V => "self_attn.v_proj.weight",
                    O => "self_attn.o_proj.weight",
                    QNorm => "self_attn.q_norm.weight",
                    KNorm => "self_attn.k_norm.weight",
                    Gate => "mlp.gate_proj.weight",
                    Up => "mlp.up_proj.weight",
                    Down => "mlp.down_proj.weight",
                    Router => "mlp.gate.weight",
                    SharedGate => "mlp.shared_expert.gate_proj.weight",
                    SharedUp => "mlp.shared_expert.up_proj.weight",
                    SharedDown => "mlp.shared_expert.down_proj.weight",
                    SharedRouter => "mlp.shared_expert_gate.weight",
                    GdnQkv => "linear_attn.in_proj_qkv.weight",
                    GdnZ => "linear_attn.in_proj_z.weight",
                    GdnA => "linear_attn.in_proj_a.weight",
                    GdnB => "linear_attn.in_proj_b.weight",
                    GdnConv => "linear_attn.conv1d.weight",
                    GdnALog => "linear_attn.A_log",
                    GdnDtBias => "linear_attn.dt_bias",
                    GdnNorm => "linear_attn.norm.weight",
                    GdnOut => "linear_attn.out_proj.weight",
                };
                format!("{prefix}layers.{i}.{s}")
            }
            Names::Gguf { post_norm } => {
                let s = match r {
                    AttnNorm => "attn_norm.weight",
                    PostAttnNorm => return format!("blk.{i}.{post_norm}.weight"),
                    Q => "attn_q.weight",
                    K => "attn_k.weight",
                    V => "attn_v.weight",
                    O => "attn_output.weight",
                    QNorm => "attn_q_norm.weight",
                    KNorm => "attn_k_norm.weight",
                    Gate => "ffn_gate.weight",
                    Up => "ffn_up.weight",
                    Down => "ffn_down.weight",
                    Router => "ffn_gate_inp.weight",
                    SharedGate => "ffn_gate_shexp.weight",
                    SharedUp => "ffn_up_shexp.weight",
                    SharedDown => "ffn_down_shexp.weight",
                    SharedRouter => "ffn_gate_inp_shexp.weight",
                    GdnQkv => "attn_qkv.weight",
                    GdnZ => "attn_gate.weight",
                    GdnA => "ssm_alpha.weight",
                    GdnB => "ssm_beta.weight",
                    GdnConv => "ssm_conv1d.weight",
                    // llama.cpp stores -exp(A_log) here
                    GdnALog => "ssm_a",
                    GdnDtBias => "ssm_dt.bias",
                    GdnNorm => "ssm_norm.weight",
                    GdnOut => "ssm_out.weight",
                };
                format!("blk.{i}.{s}")
            }
        }
    }

    /// Per-expert tensor names (HF) for projection `proj` in gate/up/down.
    pub fn hf_expert(&self, i: usize, e: usize, proj: &str) -> Option<String> {
        match self {
            Names::Hf { prefix } => Some(format!(
                "{prefix}layers.{i}.mlp.experts.{e}.{proj}_proj.weight"
            )),
            Names::Gguf { .. } => None,
        }
    }

    /// Stacked or fused expert bank names: (gate, up, down, fused gate_up).
    pub fn banks(&self, i: usize) -> (String, String, String, String) {
        match self {
            Names::Hf { prefix } => {
                let b = format!("{prefix}layers.{i}.mlp.experts.");
                (
                    format!("{b}gate_proj"),
                    format!("{b}up_proj"),
                    format!("{b}down_proj"),
                    format!("{b}gate_up_proj"),
                )
            }
            Names::Gguf { .. } => (
                format!("blk.{i}.ffn_gate_exps.weight"),
                format!("blk.{i}.ffn_up_exps.weight"),
                format!("blk.{i}.ffn_down_exps.weight"),
                format!("blk.{i}.ffn_gate_up_exps.weight"),
            ),
        }
    }
}
