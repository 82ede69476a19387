//! The parameters of a Gemma decoder, loaded per the spec.

use super::moe::MoeBlock;
use super::spec::GemmaSpec;
use super::weights::{ffn_width, global_name, layer_name, me, Loader};
use crate::backend::{can_concat, Backend};
use crate::model::common::GateUp;
use crate::model::ModelError;

/// Dense GeGLU MLP.
pub struct Mlp<B: Backend> {
    pub gate_up: GateUp<B>,
    pub down: B::Weight,
}

/// Per-layer embedding (PLE) path of one layer.
pub struct LayerPle<B: Backend> {
    /// `[ple_dim, hidden]`
    pub gate: B::Weight,
    /// `[hidden, ple_dim]`
    pub proj: B::Weight,
    pub post_norm: B::Tensor,
}

/// Model-level PLE tensors.
pub struct ModelPle<B: Backend> {
    /// `[vocab_ple, n_layers * ple_dim]`
    pub embed: B::Weight,
    /// `[n_layers * ple_dim, hidden]`
    pub model_proj: B::Weight,
    /// `[ple_dim]`
    pub proj_norm: B::Tensor,
}

/// The q, k and v projections of one layer.
pub enum QkvProj<B: Backend> {
    /// One weight each; k is absent on KV-shared layers, v on those and on K=V layers.
    Split {
        q: B::Weight,
        k: Option<B::Weight>,
        v: Option<B::Weight>,
    },
    /// `[q | k | v]` (`[q | k]` on K=V layers) in one weight when the parts share a GGML format:
    /// one GEMV at decode instead of three. The widths of the parts (v = 0: none).
    Fused {
        w: B::Weight,
        q: usize,
        k: usize,
        v: usize,
    },
}

/// Projections of one layer's input: `(q, k, v)`, k and v None where the layer has none.
pub type Projected<T> = (T, Option<T>, Option<T>);

impl<B: Backend> QkvProj<B> {
    /// Load layer `i`'s projections (`nq`, `nkv` output rows; k and v only with `own_kv`, v
    /// only without `k_eq_v`), fused when [`can_concat`] allows.
    fn load(
        ld: &Loader<'_, B>,
        i: usize,
        (nq, nkv, h): (usize, usize, usize),
        own_kv: bool,
        k_eq_v: bool,
    ) -> Result<Self, ModelError> {
        if !own_kv {
            return Ok(QkvProj::Split {
                q: ld.layer_matrix(i, "q", nq, h)?,
                k: None,
                v: None,
            });
        }
        let keys: &[&str] = if k_eq_v {
            &["q", "k"]
        } else {
            &["q", "k", "v"]
        };
        let mut parts = Vec::with_capacity(keys.len());
        for (j, key) in keys.iter().enumerate() {
            let t = ld.tensor_ref(&layer_name(&ld.naming, i, key))?;
            let rows = if j == 0 { nq } else { nkv };
            if t.shape != [rows, h] {
                return Err(ModelError::Other(format!(
                    "tensor {}: shape {:?}, expected {:?}",
                    t.name,
                    t.shape,
                    [rows, h]
                )));
            }
            parts.push(t);
        }
        if can_concat(&parts) {
            let name = parts
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join("+");
            return Ok(QkvProj::Fused {
                w: ld.backend.upload_concat(&name, &parts).map_err(me)?,
                q: nq,
                k: nkv,
                v: if k_eq_v { 0 } else { nkv },
            });
        }
        let up = |t: &crate::weights::TensorRef<'_>| {
            ld.backend
                .upload(t)
                .map_err(|e| ModelError::Other(format!("{}: {e}", t.name)))
        };
        Ok(QkvProj::Split {
            q: up(&parts[0])?,
            k: Some(up(&parts[1])?),
            v: parts.get(2).map(up).transpose()?,
        })
    }

    /// The projections of `h` (`[n, hidden]`).
    pub fn forward(&self, be: &B, h: &B::Tensor) -> Result<Projected<B::Tensor>, ModelError> {
        match self {
            QkvProj::Split { q, k, v } => {
                let lin = |w: &B::Weight| be.linear(h, w).map_err(me);
                Ok((
                    lin(q)?,
                    k.as_ref().map(lin).transpose()?,
                    v.as_ref().map(lin).transpose()?,
                ))
            }
            QkvProj::Fused { w, q, k, v } => {
                let y = be.linear(h, w).map_err(me)?;
                let part = |at: usize, n: usize| be.slice_cols(&y, at, n).map_err(me);
                Ok((
                    part(0, *q)?,
                    Some(part(*q, *k)?),
                    if *v > 0 { Some(part(q + k, *v)?) } else { None },
                ))
            }
        }
    }
}

pub struct Layer<B: Backend> {
    pub attn_norm: B::Tensor,
    pub qkv: QkvProj<B>,
    pub q_norm: B::Tensor,
    /// Absent on KV-shared layers.
    pub k_norm: Option<B::Tensor>,
    pub o: B::Weight,
    pub post_attn_norm: B::Tensor,
    pub ffn_norm: B::Tensor,
    pub mlp: Mlp<B>,
    pub post_ffn_norm: B::Tensor,
    pub moe: Option<MoeBlock<B>>,
    pub ple: Option<LayerPle<B>>,
    /// Multiplier on the layer output (Gemma 4 `layer_scalar`).
    pub scalar: Option<f32>,
}

pub struct GemmaWeights<B: Backend> {
    /// `[vocab, hidden]`, also the LM head unless `output` is present.
    pub embed: B::Weight,
    pub output: Option<B::Weight>,
    pub final_norm: B::Tensor,
    pub ple: Option<ModelPle<B>>,
    pub layers: Vec<Layer<B>>,
}

impl<B: Backend> GemmaWeights<B> {
    pub fn load(ld: &Loader<'_, B>, spec: &GemmaSpec) -> Result<Self, ModelError> {
        let h = spec.hidden;
        let embed = ld.matrix(&global_name(&ld.naming, "embed"), spec.vocab, h)?;
        let output = if ld.has_global("output") {
            Some(ld.matrix(&global_name(&ld.naming, "output"), spec.vocab, h)?)
        } else {
            None
        };
        let final_norm = ld.vector(&global_name(&ld.naming, "final_norm"), h)?;
        let n_layers = spec.n_layers();
        let ple = if spec.ple_dim > 0 {
            let width = n_layers * spec.ple_dim;
            let et = ld.tensor_ref(&global_name(&ld.naming, "ple_embed"))?;
            if et.shape.len() != 2 || et.shape[1] != width {
                return Err(ModelError::Other(format!(
                    "tensor {}: shape {:?}",
                    et.name, et.shape
                )));
            }
            Some(ModelPle {
                embed: ld.backend.upload(&et).map_err(super::weights::me)?,
                model_proj: ld.matrix(&global_name(&ld.naming, "ple_model_proj"), width, h)?,
                proj_norm: ld.vector(&global_name(&ld.naming, "ple_proj_norm"), spec.ple_dim)?,
            })
        } else {
            None
        };
        let mut layers = Vec::with_capacity(n_layers);
        for (i, ls) in spec.layers.iter().enumerate() {
            let (hd, nkv) = (ls.head_dim, ls.n_kv_heads);
            let own_kv = ls.kv_source.is_none();
            let ffn = ffn_width(ld.ckpt, spec, i)?;
            let qkv = QkvProj::load(ld, i, (spec.n_heads * hd, nkv * hd, h), own_kv, ls.k_eq_v)?;
            let k_norm = if own_kv {
                Some(ld.layer_vector(i, "k_norm", hd)?)
            } else {
                None
            };
            let moe = if ls.moe {
                let m = spec
                    .moe
                    .ok_or_else(|| ModelError::Other("MoE layer without MoE config".into()))?;
                Some(MoeBlock::load(ld, i, h, m)?)
            } else {
                None
            };
            let ple = if spec.ple_dim > 0 {
                Some(LayerPle {
                    gate: ld.layer_matrix(i, "ple_gate", spec.ple_dim, h)?,
                    proj: ld.layer_matrix(i, "ple_proj", h, spec.ple_dim)?,
                    post_norm: ld.layer_vector(i, "ple_post_norm", h)?,
                })
            } else {
                None
            };
            let scalar = if spec.layer_scalar && ld.has_layer(i, "layer_scalar") {
                let name = super::weights::layer_name(&ld.naming, i, "layer_scalar");
                Some(ld.host_vector(&name, 1)?[0])
            } else {
                None
            };
            layers.push(Layer {
                attn_norm: ld.layer_vector(i, "attn_norm", h)?,
                qkv,
                q_norm: ld.layer_vector(i, "q_norm", hd)?,
                k_norm,
                o: ld.layer_matrix(i, "o", h, spec.n_heads * hd)?,
                post_attn_norm: ld.layer_vector(i, "post_attn_norm", h)?,
                ffn_norm: ld.layer_vector(i, "ffn_norm", h)?,
                mlp: Mlp {
                    gate_up: ld.layer_gate_up(i, ffn, h)?,
                    down: ld.layer_matrix(i, "down", h, ffn)?,
                },
                post_ffn_norm: ld.layer_vector(i, "post_ffn_norm", h)?,
                moe,
                ple,
                scalar,
            });
        }
        Ok(GemmaWeights {
            embed,
            output,
            final_norm,
            ple,
            layers,
        })
    }

    /// The LM head: `output` if stored, else the tied embedding.
    pub fn head(&self) -> &B::Weight {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}
