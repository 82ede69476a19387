//! Gemma parameters: their names in both layouts, and loading them onto a backend.
//!
//! Matrices stay in their checkpoint format (`Backend::upload`); norm weights become `[1, n]`
//! tensors; scalars (layer output scale, router scales) are read to the host once.

use super::spec::{GemmaSpec, Naming};
use crate::backend::Backend;
use crate::model::common::GateUp;
use crate::model::ModelError;
use crate::weights::{Checkpoint, TensorFormat, TensorRef};

/// Map a backend / weights error to `ModelError`.
pub(crate) fn me<E: std::fmt::Display>(e: E) -> ModelError {
    ModelError::Other(e.to_string())
}

/// Logical per-layer tensors: (GGUF suffix, HF suffix).
const LAYER_NAMES: &[(&str, &str, &str)] = &[
    ("attn_norm", "attn_norm.weight", "input_layernorm.weight"),
    ("q", "attn_q.weight", "self_attn.q_proj.weight"),
    ("k", "attn_k.weight", "self_attn.k_proj.weight"),
    ("v", "attn_v.weight", "self_attn.v_proj.weight"),
    ("o", "attn_output.weight", "self_attn.o_proj.weight"),
    ("q_norm", "attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("k_norm", "attn_k_norm.weight", "self_attn.k_norm.weight"),
    (
        "post_attn_norm",
        "post_attention_norm.weight",
        "post_attention_layernorm.weight",
    ),
    (
        "ffn_norm",
        "ffn_norm.weight",
        "pre_feedforward_layernorm.weight",
    ),
    ("gate", "ffn_gate.weight", "mlp.gate_proj.weight"),
    ("up", "ffn_up.weight", "mlp.up_proj.weight"),
    ("down", "ffn_down.weight", "mlp.down_proj.weight"),
    (
        "post_ffn_norm",
        "post_ffw_norm.weight",
        "post_feedforward_layernorm.weight",
    ),
    ("layer_scalar", "layer_output_scale.weight", "layer_scalar"),
    ("ple_gate", "inp_gate.weight", "per_layer_input_gate.weight"),
    ("ple_proj", "proj.weight", "per_layer_projection.weight"),
    (
        "ple_post_norm",
        "post_norm.weight",
        "post_per_layer_input_norm.weight",
    ),
    ("router", "ffn_gate_inp.weight", "router.proj.weight"),
    ("router_scale", "ffn_gate_inp.scale", "router.scale"),
    (
        "expert_scale",
        "ffn_down_exps.scale",
        "router.per_expert_scale",
    ),
    (
        "gate_up_exps",
        "ffn_gate_up_exps.weight",
        "experts.gate_up_proj",
    ),
    ("gate_exps", "ffn_gate_exps.weight", "experts.gate_proj"),
    ("up_exps", "ffn_up_exps.weight", "experts.up_proj"),
    ("down_exps", "ffn_down_exps.weight", "experts.down_proj"),
    (
        "pre_ffn_norm_2",
        "pre_ffw_norm_2.weight",
        "pre_feedforward_layernorm_2.weight",
    ),
    (
        "post_ffn_norm_1",
        "post_ffw_norm_1.weight",
        "post_feedforward_layernorm_1.weight",
    ),
    (
        "post_ffn_norm_2",
        "post_ffw_norm_2.weight",
        "post_feedforward_layernorm_2.weight",
    ),
];

/// Logical model-level tensors: (GGUF name, HF suffix after the text prefix; `lm_head` is
/// outside the prefix).
const GLOBAL_NAMES: &[(&str, &str, &str)] = &[
    ("embed", "token_embd.weight", "embed_tokens.weight"),
    ("final_norm", "output_norm.weight", "norm.weight"),
    ("output", "output.weight", "lm_head.weight"),
    (
        "ple_embed",
        "per_layer_token_embd.weight",
        "embed_tokens_per_layer.weight",
    ),
    (
        "ple_model_proj",
        "per_layer_model_proj.weight",
        "per_layer_model_projection.weight",
    ),
    (
        "ple_proj_norm",
        "per_layer_proj_norm.weight",
        "per_layer_projection_norm.weight",
    ),
    ("rope_freqs", "rope_freqs.weight", "rope_freqs"),
];

/// Checkpoint name of layer `i`'s logical tensor `key`.
pub fn layer_name(naming: &Naming, i: usize, key: &str) -> String {
    let (_, g, h) = LAYER_NAMES
        .iter()
        .find(|(k, _, _)| *k == key)
        .copied()
        .unwrap_or((key, key, key));
    match naming {
        Naming::Gguf => format!("blk.{i}.{g}"),
        Naming::Hf { prefix } => format!("{prefix}layers.{i}.{h}"),
    }
}

/// Checkpoint name of the model-level logical tensor `key`.
pub fn global_name(naming: &Naming, key: &str) -> String {
    let (_, g, h) = GLOBAL_NAMES
        .iter()
        .find(|(k, _, _)| *k == key)
        .copied()
        .unwrap_or((key, key, key));
    match naming {
        Naming::Gguf => g.to_string(),
        Naming::Hf { .. } if key == "output" => h.to_string(),
        Naming::Hf { prefix } => format!("{prefix}{h}"),
    }
}

/// Rows `[row0, row0 + n)` of a tensor viewed as `[rows, cols]` (the last axis contiguous), as a
/// tensor of its own: used to take one expert (or its gate / up half) out of a packed bank.
pub fn slice_rows<'a>(
    t: &TensorRef<'a>,
    row0: usize,
    n: usize,
) -> Result<TensorRef<'a>, ModelError> {
    let cols = t.cols();
    let TensorFormat::Ggml(ty) = t.format else {
        return Err(ModelError::Other(format!(
            "{}: slicing experts out of {:?} banks is not supported",
            t.name, t.format
        )));
    };
    let rb = ty.row_bytes(cols).map_err(me)?;
    if row0 + n > t.rows() || t.data.len() < (row0 + n) * rb {
        return Err(ModelError::Other(format!(
            "{}: rows {row0}+{n} outside {} rows",
            t.name,
            t.rows()
        )));
    }
    Ok(TensorRef {
        name: format!("{}[{row0}..{}]", t.name, row0 + n),
        shape: vec![n, cols],
        format: t.format,
        data: &t.data[row0 * rb..(row0 + n) * rb],
        scales: t.scales,
    })
}

/// Reads tensors of one checkpoint onto one backend.
pub struct Loader<'a, B: Backend> {
    pub ckpt: &'a Checkpoint,
    pub backend: &'a B,
    pub naming: Naming,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub fn has_layer(&self, i: usize, key: &str) -> bool {
        self.ckpt.has(&layer_name(&self.naming, i, key))
    }
    pub fn has_global(&self, key: &str) -> bool {
        self.ckpt.has(&global_name(&self.naming, key))
    }

    pub fn tensor_ref(&self, name: &str) -> Result<TensorRef<'a>, ModelError> {
        self.ckpt.tensor(name).map_err(me)
    }

    fn check_shape(t: &TensorRef<'_>, shape: &[usize]) -> Result<(), ModelError> {
        if t.shape != shape {
            return Err(ModelError::Other(format!(
                "tensor {}: shape {:?}, expected {shape:?}",
                t.name, t.shape
            )));
        }
        Ok(())
    }

    /// A matrix `[out, in]` in its stored format.
    pub fn matrix(&self, name: &str, out: usize, inp: usize) -> Result<B::Weight, ModelError> {
        let t = self.tensor_ref(name)?;
        Self::check_shape(&t, &[out, inp])?;
        self.backend
            .upload(&t)
            .map_err(|e| ModelError::Other(format!("{name}: {e}")))
    }

    /// A vector of `n` values as a `[1, n]` tensor (norm weights).
    pub fn vector(&self, name: &str, n: usize) -> Result<B::Tensor, ModelError> {
        let v = self.host_vector(name, n)?;
        self.backend.tensor(&v, 1, n).map_err(me)
    }

    /// A small vector read to the host (scalars, router scales).
    pub fn host_vector(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.tensor_ref(name)?;
        if t.numel() != n {
            return Err(ModelError::Other(format!(
                "tensor {name}: {} values, expected {n}",
                t.numel()
            )));
        }
        t.to_f32().map_err(me)
    }

    pub fn layer_matrix(
        &self,
        i: usize,
        key: &str,
        out: usize,
        inp: usize,
    ) -> Result<B::Weight, ModelError> {
        self.matrix(&layer_name(&self.naming, i, key), out, inp)
    }
    /// The gate and up matrices `[ffn, hidden]` of layer `i`, fused when their formats allow.
    pub fn layer_gate_up(
        &self,
        i: usize,
        ffn: usize,
        hidden: usize,
    ) -> Result<GateUp<B>, ModelError> {
        let g = self.tensor_ref(&layer_name(&self.naming, i, "gate"))?;
        let u = self.tensor_ref(&layer_name(&self.naming, i, "up"))?;
        Self::check_shape(&g, &[ffn, hidden])?;
        Self::check_shape(&u, &[ffn, hidden])?;
        GateUp::load(self.backend, &g, &u)
    }
    pub fn layer_vector(&self, i: usize, key: &str, n: usize) -> Result<B::Tensor, ModelError> {
        self.vector(&layer_name(&self.naming, i, key), n)
    }
}

/// Check a spec's tensors for the fields that only the weights tell (FFN width).
pub fn ffn_width(ckpt: &Checkpoint, spec: &GemmaSpec, i: usize) -> Result<usize, ModelError> {
    let name = layer_name(&spec.naming, i, "gate");
    let t = ckpt.tensor(&name).map_err(me)?;
    if t.shape.len() != 2 || t.shape[1] != spec.hidden {
        return Err(ModelError::Other(format!(
            "tensor {name}: shape {:?}",
            t.shape
        )));
    }
    Ok(t.shape[0])
}
