//! The Qwen decoder (Qwen3, Qwen3-MoE, Qwen3.5/3.6 dense and MoE), written once over `Backend`,
//! and its per-sequence state (KV caches for attention layers, conv + recurrent state for GDN
//! layers) as the shared session drives it.

use std::sync::Arc;

use crate::backend::{Activation, AttnParams, Backend, KvShape, MoeParams, Rope, StepOf};
use crate::bk;
use crate::model::common::prefill_chunk;
use crate::model::common::residual::Residual;
use crate::model::common::seqs::{pick_each, SeqSteps};
use crate::model::common::session::{Decoder, DecoderSession, StepOutput};
use crate::model::common::source::BankSource;
use crate::model::common::{
    expert_bank, AttentionLayer, Dense, GateUp, MoeBlock, NormW, Qkv, WeightSource,
};
use crate::model::registry::LoadOptions;
use crate::model::{CausalLm, Logits, ModelError, ModelInfo, Session};
use crate::ops::RopeLayout;

use super::config::{Mixer, QwenConfig};
use super::gdn::{GdnLayer, GdnState};
use super::names::{Names, Role};

type R<T> = Result<T, ModelError>;

enum MixerW<B: Backend> {
    Attn(AttentionLayer<B>),
    Gdn(GdnLayer<B>),
}

enum Ffn<B: Backend> {
    Dense(Dense<B>),
    Moe(MoeBlock<B>),
}

struct Layer<B: Backend> {
    attn_norm: NormW<B>,
    mixer: MixerW<B>,
    post_norm: NormW<B>,
    ffn: Ffn<B>,
}

/// A loaded Qwen-family model.
pub struct QwenModel<B: Backend> {
    be: Arc<B>,
    info: ModelInfo,
    cfg: QwenConfig,
    embed: B::Weight,
    /// None: tied to the embedding.
    lm_head: Option<B::Weight>,
    norm: NormW<B>,
    layers: Vec<Layer<B>>,
}

struct Loader<'a, B: Backend> {
    src: &'a dyn WeightSource,
    be: &'a B,
    names: &'a Names,
}

impl<'a, B: Backend> Loader<'a, B> {
    fn w(&self, name: &str) -> R<B::Weight> {
        let t = self.src.tensor(name)?;
        bk!(self.be.upload(&t))
    }
    fn tref(&self, i: usize, r: Role) -> R<crate::weights::TensorRef<'a>> {
        self.src.tensor(&self.names.layer(i, r))
    }
    fn lw(&self, i: usize, r: Role) -> R<B::Weight> {
        self.w(&self.names.layer(i, r))
    }
    fn vec(&self, name: &str) -> R<Vec<f32>> {
        self.src
            .tensor(name)?
            .to_f32()
            .map_err(|e| ModelError::Other(e.to_string()))
    }
    fn norm(&self, name: &str, one_plus: bool, eps: f32, dim: usize) -> R<NormW<B>> {
        let w = self.w(name)?;
        NormW::new(self.be, &w, one_plus, eps, dim)
    }
}

impl<B: Backend> QwenModel<B> {
    /// Build the model from a tensor source, its parsed config and naming scheme.
    pub fn load(
        src: &dyn WeightSource,
        names: Names,
        cfg: QwenConfig,
        backend: Arc<B>,
        opts: &LoadOptions,
    ) -> R<Arc<Self>> {
        let be = &*backend;
        let l = Loader {
            src,
            be,
            names: &names,
        };
        let gguf = names.is_gguf();
        // HF Qwen3.5 norms are zero-centred (x_hat * (1 + w)); llama.cpp folds the +1 in.
        let one_plus = cfg.variant.hybrid() && !gguf;
        let eps = cfg.eps;
        let embed_ref = src.tensor(&names.embed())?;
        let (vocab, hidden) = (embed_ref.rows(), embed_ref.cols());
        if hidden != cfg.hidden {
            return Err(ModelError::Other(format!(
                "embedding width {hidden} but hidden_size {}",
                cfg.hidden
            )));
        }
        let embed = bk!(be.upload(&embed_ref))?;
        let lm_head = if src.has(&names.lm_head()) {
            Some(l.w(&names.lm_head())?)
        } else {
            None
        };
        let norm = l.norm(&names.final_norm(), one_plus, eps, hidden)?;
        let rope = Rope {
            head_dim: cfg.head_dim,
            rot_dims: cfg.rot_dims,
            theta: cfg.rope_theta,
            layout: RopeLayout::Neox,
            freq_factors: None,
            freq_base_dims: cfg.rot_dims,
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let mixer = match cfg.mixers[i] {
                Mixer::Attention => MixerW::Attn(AttentionLayer {
                    qkv: Qkv::load(
                        be,
                        &l.tref(i, Role::Q)?,
                        &l.tref(i, Role::K)?,
                        &l.tref(i, Role::V)?,
                    )?,
                    o: l.lw(i, Role::O)?,
                    q_norm: Some(l.norm(
                        &names.layer(i, Role::QNorm),
                        one_plus,
                        eps,
                        cfg.head_dim,
                    )?),
                    k_norm: Some(l.norm(
                        &names.layer(i, Role::KNorm),
                        one_plus,
                        eps,
                        cfg.head_dim,
                    )?),
                    rope: rope.clone(),
                    params: AttnParams {
                        n_heads: cfg.n_heads,
                        n_kv_heads: cfg.n_kv_heads,
                        head_dim: cfg.head_dim,
                        scale: 1.0 / (cfg.head_dim as f32).sqrt(),
                        window: None,
                        softcap: None,
                    },
                    gated: cfg.variant.hybrid(),
                }),
                Mixer::Linear => MixerW::Gdn(Self::load_gdn(&l, &cfg, i, gguf)?),
            };
            let ffn = if cfg.moe_layers[i] {
                Ffn::Moe(Self::load_moe(&l, &cfg, i)?)
            } else {
                Ffn::Dense(Self::dense(&l, i, false)?)
            };
            layers.push(Layer {
                attn_norm: l.norm(&names.layer(i, Role::AttnNorm), one_plus, eps, hidden)?,
                mixer,
                post_norm: l.norm(&names.layer(i, Role::PostAttnNorm), one_plus, eps, hidden)?,
                ffn,
            });
        }
        let max_context = if opts.max_context > 0 {
            opts.max_context
        } else {
            cfg.max_pos
        };
        let kv_elems_per_token = layers
            .iter()
            .filter(|l| matches!(l.mixer, MixerW::Attn(_)))
            .count()
            * 2
            * cfg.n_kv_heads
            * cfg.head_dim;
        let max_context = opts.cap_context(max_context, be.kv_bytes(kv_elems_per_token))?;
        let info = ModelInfo {
            arch: cfg.variant.name().into(),
            vocab_size: vocab,
            hidden_size: hidden,
            max_context,
            kv_elems_per_token,
            kv_fixed_elems: 0,
        };
        Ok(Arc::new(QwenModel {
            be: backend,
            info,
            cfg,
            embed,
            lm_head,
            norm,
            layers,
        }))
    }

    fn dense(l: &Loader<'_, B>, i: usize, shared: bool) -> R<Dense<B>> {
        let (g, u, d) = if shared {
            (Role::SharedGate, Role::SharedUp, Role::SharedDown)
        } else {
            (Role::Gate, Role::Up, Role::Down)
        };
        Ok(Dense {
            gate_up: GateUp::load(l.be, &l.tref(i, g)?, &l.tref(i, u)?)?,
            down: l.lw(i, d)?,
            act: Activation::Silu,
        })
    }

    fn load_moe(l: &Loader<'_, B>, cfg: &QwenConfig, i: usize) -> R<MoeBlock<B>> {
        let m = cfg
            .moe
            .ok_or_else(|| ModelError::Other("MoE layer without MoE config".into()))?;
        let (gn, un, dn, fused) = l.names.banks(i);
        let bank = |name: &str, proj: &str, label: &str| -> R<B::Weight> {
            // Stacked bank (GGUF), per-expert tensors (HF as saved), or a fused HF parameter.
            if l.src.has(name) {
                return l.w(name);
            }
            let per_expert = l.names.hf_expert(i, 0, proj).is_some_and(|n| l.src.has(&n));
            let src = if per_expert {
                BankSource::PerExpert(
                    (0..m.n_experts)
                        .filter_map(|e| l.names.hf_expert(i, e, proj))
                        .collect(),
                )
            } else if proj == "down" {
                BankSource::Fused {
                    name,
                    row0: 0,
                    rows: cfg.hidden,
                }
            } else {
                let row0 = if proj == "gate" { 0 } else { m.ff };
                BankSource::Fused {
                    name: &fused,
                    row0,
                    rows: m.ff,
                }
            };
            let t = expert_bank(l.src, src, label)?;
            bk!(l.be.upload(&t.as_ref()))
        };
        let gate = bank(&gn, "gate", &format!("layer {i} expert gate bank"))?;
        let up = bank(&un, "up", &format!("layer {i} expert up bank"))?;
        let down = bank(&dn, "down", &format!("layer {i} expert down bank"))?;
        let shared = match m.shared_ff {
            Some(_) => Some((Self::dense(l, i, true)?, l.lw(i, Role::SharedRouter)?)),
            None => None,
        };
        Ok(MoeBlock {
            router: l.lw(i, Role::Router)?,
            gate,
            up,
            down,
            params: MoeParams {
                n_experts: m.n_experts,
                top_k: m.top_k,
                norm_topk: m.norm_topk,
                act: Activation::Silu,
            },
            shared,
        })
    }

    fn load_gdn(l: &Loader<'_, B>, cfg: &QwenConfig, i: usize, gguf: bool) -> R<GdnLayer<B>> {
        let dims = cfg
            .gdn
            .ok_or_else(|| ModelError::Other("linear-attention layer without GDN config".into()))?;
        let nv = dims.n_v_heads;
        let a = l.vec(&l.names.layer(i, Role::GdnALog))?;
        // GGUF stores -exp(A_log) already.
        let neg_a: Vec<f32> = if gguf {
            a
        } else {
            a.iter().map(|v| -v.exp()).collect()
        };
        // llama.cpp names it `ssm_dt.bias`; some converters wrote `ssm_dt.weight` or `ssm_dt`.
        let dt_name = l.names.layer(i, Role::GdnDtBias);
        let dt_name = if gguf && !l.src.has(&dt_name) {
            [format!("blk.{i}.ssm_dt.weight"), format!("blk.{i}.ssm_dt")]
                .into_iter()
                .find(|n| l.src.has(n))
                .unwrap_or(dt_name)
        } else {
            dt_name
        };
        let dt = l.vec(&dt_name)?;
        if neg_a.len() != nv || dt.len() != nv {
            return Err(ModelError::Other(format!(
                "layer {i}: A / dt_bias have {} / {} values for {nv} heads",
                neg_a.len(),
                dt.len()
            )));
        }
        Ok(GdnLayer {
            qkv: l.lw(i, Role::GdnQkv)?,
            z: l.lw(i, Role::GdnZ)?,
            a: l.lw(i, Role::GdnA)?,
            b: l.lw(i, Role::GdnB)?,
            conv: l.lw(i, Role::GdnConv)?,
            out: l.lw(i, Role::GdnOut)?,
            neg_a: bk!(l.be.tensor(&neg_a, 1, nv))?,
            dt_bias: bk!(l.be.tensor(&dt, 1, nv))?,
            norm: l.norm(&l.names.layer(i, Role::GdnNorm), false, cfg.eps, dims.v_dim)?,
            dims,
            tiled: gguf,
        })
    }

    fn has_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l.mixer, MixerW::Gdn(_)))
    }

    fn new_states(&self) -> R<Vec<LayerState<B>>> {
        let be = &*self.be;
        // the attention layers' caches in one request (the backend may lay them out beside
        // other sequences')
        let shapes: Vec<KvShape> = self
            .layers
            .iter()
            .filter_map(|l| match &l.mixer {
                MixerW::Attn(a) => Some(KvShape::full(
                    a.params.n_kv_heads,
                    a.params.head_dim,
                    self.info.max_context,
                )),
                MixerW::Gdn(_) => None,
            })
            .collect();
        let mut caches = bk!(be.kv_caches(&shapes))?.into_iter();
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                MixerW::Attn(_) => caches
                    .next()
                    .map(LayerState::Kv)
                    .ok_or_else(|| ModelError::Other("fewer KV caches than layers".into())),
                MixerW::Gdn(g) => Ok(LayerState::Gdn(g.new_state(be)?)),
            })
            .collect()
    }

    pub fn config(&self) -> &QwenConfig {
        &self.cfg
    }
}

/// One layer's per-sequence state: a KV cache (attention) or a Gated DeltaNet state.
pub enum LayerState<B: Backend> {
    Kv(B::KvCache),
    Gdn(GdnState<B>),
}

/// One sequence on a Qwen model.
pub type QwenSession<B> = DecoderSession<QwenModel<B>>;

impl<B: Backend> CausalLm for QwenModel<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn new_session(self: Arc<Self>) -> Box<dyn Session> {
        Box::new(DecoderSession::new(self))
    }
    fn forward_batch(
        &self,
        sessions: &mut [&mut dyn Session],
        tokens: &[&[u32]],
    ) -> Vec<R<Logits>> {
        crate::model::common::session::forward_batch::<Self>(sessions, tokens)
    }
}

impl<B: Backend> QwenModel<B> {
    /// The forward pass of `step` (sequence `j` is `states[j]`'s): the logits of the rows the
    /// step asks for.
    fn forward_step(
        &self,
        step: &StepOf<B>,
        states: &mut [&mut Vec<LayerState<B>>],
    ) -> R<StepOutput<B::Tensor>> {
        let be = &*self.be;
        let seqs = SeqSteps::new(be, step)?;
        if states.len() != seqs.count() {
            return Err(ModelError::Other(format!(
                "{} states for a step of {} sequences",
                states.len(),
                seqs.count()
            )));
        }
        let mut res = Residual::new(bk!(be.embed(&self.embed, step, 1.0))?);
        for (i, layer) in self.layers.iter().enumerate() {
            match &layer.mixer {
                MixerW::Attn(a) => {
                    let mut caches = pick_each(
                        states,
                        |s| match s.get_mut(i) {
                            Some(LayerState::Kv(c)) => Some(c),
                            _ => None,
                        },
                        "KV cache for an attention layer",
                    )?;
                    let out = res.attend(be, &layer.attn_norm, a, &mut caches, &seqs)?;
                    res.add_projected(out, &a.o);
                }
                MixerW::Gdn(g) => {
                    let mut st = pick_each(
                        states,
                        |s| match s.get_mut(i) {
                            Some(LayerState::Gdn(g)) => Some(g),
                            _ => None,
                        },
                        "recurrent state for a Gated DeltaNet layer",
                    )?;
                    let x = res.norm(be, &layer.attn_norm)?;
                    let y = seqs.each(be, vec![x], |j, x, _| g.forward(be, &x[0], st[j]))?;
                    res.add(y);
                }
            }
            match &layer.ffn {
                Ffn::Dense(d) => {
                    let g = res.gated(be, &layer.post_norm, d)?;
                    res.add_projected(g, &d.down);
                }
                Ffn::Moe(moe) => {
                    let y = res.moe(be, &layer.post_norm, moe)?;
                    res.add(y);
                }
            }
        }
        // a prompt chunk before the last wants no logits: its K/V rows are written
        let logits = match res.finish(be, &self.norm, &seqs)? {
            Some(h) => Some(bk!(
                be.linear(&h, self.lm_head.as_ref().unwrap_or(&self.embed))
            )?),
            None => None,
        };
        Ok(StepOutput {
            logits,
            hidden: None,
        })
    }
}

impl<B: Backend> Decoder for QwenModel<B> {
    type B = B;
    type State = Vec<LayerState<B>>;

    fn backend(&self) -> &Arc<B> {
        &self.be
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_state(&self) -> R<Vec<LayerState<B>>> {
        self.new_states()
    }

    fn forward(
        &self,
        step: &StepOf<B>,
        states: &mut [&mut Vec<LayerState<B>>],
    ) -> R<StepOutput<B::Tensor>> {
        self.forward_step(step, states)
    }

    /// Truncates the KV caches; the Gated DeltaNet layers' state is the session's to put back
    /// (from a snapshot: [`Decoder::recurrent`]).
    fn rewind(&self, states: &mut Vec<LayerState<B>>, _len: usize, n: usize) -> R<()> {
        for st in states.iter_mut() {
            if let LayerState::Kv(c) = st {
                bk!(self.be.kv_truncate(c, n))?;
            }
        }
        Ok(())
    }

    /// Every layer's state is a KV cache (a recurrent state would keep what a step not taken
    /// wrote). Decided by the layers, not by states made yet: a session that starts with
    /// one-token steps (no prompt) records its step on the second call like any other.
    fn rewritable(&self) -> bool {
        !self.has_recurrent()
    }

    fn pass_chunk(&self) -> usize {
        prefill_chunk()
    }

    fn recurrent<'s>(&self, states: &'s mut Vec<LayerState<B>>) -> Vec<&'s mut B::Tensor> {
        states
            .iter_mut()
            .flat_map(|st| match st {
                LayerState::Gdn(g) => vec![&mut g.conv, &mut g.rec],
                LayerState::Kv(_) => Vec::new(),
            })
            .collect()
    }
}
