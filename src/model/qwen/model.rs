//! The Qwen decoder (Qwen3, Qwen3-MoE, Qwen3.5/3.6 dense and MoE), written once over `Backend`,
//! and its session (KV caches for attention layers, conv + recurrent state for GDN layers).

use std::sync::Arc;

use crate::backend::{Activation, AttnParams, Backend, KvShape, MoeParams, NormNext, Rope};
use crate::bk;
use crate::model::common::prefill_chunk;
use crate::model::common::replay::StepReplay;
use crate::model::common::source::BankSource;
use crate::model::common::{
    expert_bank, AttentionLayer, Dense, GateUp, MoeBlock, NormW, Qkv, WeightSource,
};
use crate::model::registry::LoadOptions;
use crate::model::{
    host_forward_sample, BackendSampler, CausalLm, Logits, ModelError, ModelInfo, Session,
    TokenSampler,
};
use crate::ops::RopeLayout;
use crate::sampling::SamplingParams;

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

/// What the residual stream still has to add.
enum Pending<'w, B: Backend> {
    /// A branch output.
    Y(B::Tensor),
    /// A branch's last input and its output projection (o_proj, down): applied together with
    /// the add and the next norm where that norm feeds projections.
    Proj(B::Tensor, &'w B::Weight),
}

impl<B: Backend> Pending<'_, B> {
    /// The branch output.
    fn output(self, be: &B) -> R<B::Tensor> {
        match self {
            Pending::Y(y) => Ok(y),
            Pending::Proj(x, w) => bk!(be.linear(&x, w)),
        }
    }
}

/// `norm(h + pending)` (h updated to the sum), or `norm(h)` with nothing pending.
fn norm_pending<B: Backend>(
    be: &B,
    norm: &NormW<B>,
    h: &mut B::Tensor,
    pending: Option<Pending<'_, B>>,
) -> R<B::Tensor> {
    match pending {
        None => norm.apply(be, h),
        Some(p) => {
            let y = p.output(be)?;
            let (s, x) = norm.add_apply(be, h, &y)?;
            *h = s;
            Ok(x)
        }
    }
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
        self.layers
            .iter()
            .map(|l| match &l.mixer {
                MixerW::Attn(a) => Ok(LayerState::Kv(bk!(be.kv_cache(KvShape::full(
                    a.params.n_kv_heads,
                    a.params.head_dim,
                    self.info.max_context,
                )))?)),
                MixerW::Gdn(g) => Ok(LayerState::Gdn(g.new_state(be)?)),
            })
            .collect()
    }

    pub fn config(&self) -> &QwenConfig {
        &self.cfg
    }
}

enum LayerState<B: Backend> {
    Kv(B::KvCache),
    Gdn(GdnState<B>),
}

/// One sequence on a Qwen model.
pub struct QwenSession<B: Backend> {
    model: Arc<QwenModel<B>>,
    /// Created on first use (creation can fail; `new_session` cannot).
    states: Option<Vec<LayerState<B>>>,
    len: usize,
    /// Set when a forward failed half-way; only `rewind(0)` recovers.
    broken: bool,
    /// Decode-step replay (CUDA graph) and the logits tensor it writes.
    graph: StepReplay<B>,
}

impl<B: Backend> CausalLm for QwenModel<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }
    fn new_session(self: Arc<Self>) -> Box<dyn Session> {
        Box::new(QwenSession {
            model: self,
            states: None,
            len: 0,
            broken: false,
            graph: StepReplay::default(),
        })
    }
}

impl<B: Backend> QwenSession<B> {
    /// The forward pass; returns the logits tensor (last row, or every row when `all`). A
    /// one-token step is recorded once and then replayed (see `StepReplay`).
    fn run(&mut self, tokens: &[u32], all: bool) -> R<B::Tensor> {
        self.graph.forget_inflight();
        let model = Arc::clone(&self.model);
        let be = &*model.be;
        let chunk = prefill_chunk().max(1);
        if !all && tokens.len() > chunk {
            // Long prompts run in chunks (bounded activation memory); the last chunk's logits
            // are the pass's. `self.len` is restored: `step` advances it on success.
            let start = self.len;
            let mut out = Err(ModelError::Empty);
            for c in tokens.chunks(chunk) {
                out = self.run_ops(c, false);
                if out.is_err() {
                    break;
                }
                self.len += c.len();
            }
            self.len = start;
            return out;
        }
        if tokens.len() != 1 || all {
            return self.run_ops(tokens, all);
        }
        let pos0 = self.len;
        let mut graph = std::mem::take(&mut self.graph);
        let r = graph.step(be, tokens, pos0, || self.run_ops(tokens, false));
        self.graph = graph;
        r
    }

    fn run_ops(&mut self, tokens: &[u32], all: bool) -> R<B::Tensor> {
        let m = &*self.model;
        let be = &*m.be;
        if self.states.is_none() {
            self.states = Some(m.new_states()?);
        }
        let states = self.states.as_mut().expect("created above");
        let pos0 = self.len;
        let n = tokens.len();
        bk!(be.begin_forward(tokens, pos0))?;
        let mut h = bk!(be.embed(&m.embed, tokens, 1.0))?;
        // The residual stream is h + y: every add is fused with the norm that follows it (the
        // post-attention norm, the next layer's input norm, the final norm), and where the
        // branch ends in a projection (o_proj, down) and the norm feeds projections (gate|up,
        // q/k/v), with those too (`Backend::linear_add_rms_norm_then`).
        let mut pending: Option<Pending<'_, B>> = None;
        for (layer, st) in m.layers.iter().zip(states.iter_mut()) {
            let branch = match (&layer.mixer, st) {
                (MixerW::Attn(a), LayerState::Kv(c)) => {
                    let out = match pending.take() {
                        Some(Pending::Proj(xin, w))
                            if !a.may_fuse_prep()
                                || bk!(be.defers_norm(w, &NormNext::Linear(&a.qkv.weights())))? =>
                        {
                            let ws = a.qkv.weights();
                            let (s, outs) = layer.attn_norm.linear_add_then(
                                be,
                                (&xin, w),
                                &h,
                                &NormNext::Linear(&ws),
                            )?;
                            h = s;
                            a.attend(be, a.qkv.split(be, outs)?, c, pos0)?
                        }
                        // where the norm is not deferred, the projection, the add and the norm
                        // run as their ops, so q|k|v can join the attention input
                        p => {
                            let x = norm_pending(be, &layer.attn_norm, &mut h, p)?;
                            // q|k|v and the attention input in one op where the backend has it
                            match a.attend_fused(be, &x, c, pos0)? {
                                Some(out) => out,
                                None => a.attend(be, a.qkv.forward(be, &x)?, c, pos0)?,
                            }
                        }
                    };
                    Pending::Proj(out, &a.o)
                }
                (MixerW::Gdn(g), LayerState::Gdn(s)) => {
                    let x = norm_pending(be, &layer.attn_norm, &mut h, pending.take())?;
                    Pending::Y(g.forward(be, &x, s)?)
                }
                _ => {
                    return Err(ModelError::Other(
                        "layer state does not match its mixer".into(),
                    ))
                }
            };
            let d = match &layer.ffn {
                Ffn::Dense(d) => d,
                Ffn::Moe(moe) => {
                    let y = branch.output(be)?;
                    // a MoE block may take the residual add and its norm into its router (one
                    // launch)
                    if let Some((s, out)) = moe.add_norm_forward(be, &layer.post_norm, &h, &y)? {
                        h = s;
                        pending = Some(Pending::Y(out));
                        continue;
                    }
                    let (s, x) = layer.post_norm.add_apply(be, &h, &y)?;
                    h = s;
                    pending = Some(Pending::Y(moe.forward(be, &x)?));
                    continue;
                }
            };
            let g = match branch {
                Pending::Proj(xin, w) => {
                    let next = match &d.gate_up {
                        GateUp::Fused(gu) => NormNext::Glu(gu, d.act),
                        GateUp::Split { gate, up } => NormNext::Linear(&[gate, up]),
                    };
                    let (s, mut outs) =
                        layer.post_norm.linear_add_then(be, (&xin, w), &h, &next)?;
                    h = s;
                    match (&next, outs.len()) {
                        (NormNext::Glu(..), 1) => outs.pop().expect("one output"),
                        (NormNext::Linear(_), 2) => {
                            let u = outs.pop().expect("two outputs");
                            let gt = outs.pop().expect("two outputs");
                            bk!(be.glu(&gt, &u, d.act))?
                        }
                        (_, n) => {
                            return Err(ModelError::Other(format!(
                                "{n} outputs of the gate/up projections"
                            )))
                        }
                    }
                }
                Pending::Y(y) => {
                    let (s, x) = layer.post_norm.add_apply(be, &h, &y)?;
                    h = s;
                    d.gate_up.forward(be, &x, d.act)?
                }
            };
            pending = Some(Pending::Proj(g, &d.down));
        }
        let pending = pending.map(|p| p.output(be)).transpose()?;
        // only the last row reaches the head unless every row's logits are asked for (rows are
        // independent here: slicing h and y first equals slicing their sum)
        let last = |t: &B::Tensor| -> R<B::Tensor> { Ok(bk!(be.slice_rows(t, n - 1, 1))?) };
        let (h, pending) = if all || n == 1 {
            (h, pending)
        } else {
            (last(&h)?, pending.as_ref().map(last).transpose()?)
        };
        let h = match pending {
            Some(y) => m.norm.add_apply(be, &h, &y)?.1,
            None => m.norm.apply(be, &h)?,
        };
        Ok(bk!(be.linear(&h, m.lm_head.as_ref().unwrap_or(&m.embed)))?)
    }

    /// What a step of `tokens` needs: a usable session, tokens in the vocabulary, room in the
    /// context.
    fn check_step(&self, tokens: &[u32]) -> R<()> {
        if self.broken {
            return Err(ModelError::Other(
                "session state is invalid after a failed step; rewind to 0".into(),
            ));
        }
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        let vocab = self.model.info.vocab_size;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ModelError::BadToken { id, vocab });
        }
        let max = self.model.info.max_context;
        if self.len + tokens.len() > max {
            return Err(ModelError::ContextOverflow {
                len: self.len + tokens.len(),
                max,
            });
        }
        Ok(())
    }

    /// Whether one-token steps may be pipelined (`StepReplay::step_sampled`): every layer's
    /// state is a KV cache (a recurrent state would keep what a step not taken wrote). Decided
    /// by the layers, not by states made yet: a session that starts with one-token steps (no
    /// prompt) records its step on the second call like any other. (Asked of the states, its
    /// first call ran outside the replay and the third was the one recorded; `fucina bench` at
    /// depth 0 timed that capture, ~1.5 ms, in its window.)
    fn pipelinable(&self) -> bool {
        !self.model.has_recurrent()
    }

    /// The checks of `step`, then a pipelined one-token step and draw (the next step queued
    /// fed with the drawn id, see `StepReplay::step_sampled`).
    fn step_pipelined(&mut self, token: u32, s: &mut BackendSampler<B>, banned: &[u32]) -> R<u32> {
        self.check_step(&[token])?;
        let max = self.model.info.max_context;
        let model = Arc::clone(&self.model);
        let pos0 = self.len;
        let next = (pos0 + 2 <= max).then_some(pos0 + 1);
        let mut graph = std::mem::take(&mut self.graph);
        let r = graph.step_sampled(&*model.be, token, pos0, next, s.state_mut(), banned, || {
            Ok(vec![self.run_ops(&[token], false)?])
        });
        self.graph = graph;
        match r {
            Ok(st) => {
                self.len += 1;
                Ok(st.token)
            }
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }

    /// Checks, the forward pass, then `finish` on its logits; a failure marks the session
    /// broken.
    fn step<T>(
        &mut self,
        tokens: &[u32],
        all: bool,
        finish: impl FnOnce(&B, B::Tensor) -> R<T>,
    ) -> R<T> {
        self.check_step(tokens)?;
        let model = Arc::clone(&self.model);
        match self.run(tokens, all).and_then(|l| finish(&model.be, l)) {
            Ok(v) => {
                self.len += tokens.len();
                Ok(v)
            }
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }
}

impl<B: Backend> Session for QwenSession<B> {
    fn forward(&mut self, tokens: &[u32], all: bool) -> R<Logits> {
        self.step(tokens, all, |be, logits| {
            let (rows, vocab) = be.dims(&logits);
            let data = bk!(be.to_host(&logits))?;
            Ok(Logits { rows, vocab, data })
        })
    }

    fn sampler(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> R<Box<dyn TokenSampler>> {
        BackendSampler::boxed(&self.model.be, params, prompt, vocab)
    }

    fn forward_sample(
        &mut self,
        tokens: &[u32],
        sampler: &mut dyn TokenSampler,
        banned: &[u32],
    ) -> R<u32> {
        match sampler.as_any_mut().downcast_mut::<BackendSampler<B>>() {
            Some(s) if tokens.len() == 1 && self.pipelinable() => {
                self.step_pipelined(tokens[0], s, banned)
            }
            Some(s) => self.step(tokens, false, |_, logits| s.sample(logits, banned)),
            None => host_forward_sample(self, tokens, sampler, banned),
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn rewind(&mut self, n: usize) -> R<()> {
        self.graph.forget_inflight();
        if n == 0 {
            // the recorded step points at the caches dropped here
            self.graph = StepReplay::default();
            self.states = None;
            self.len = 0;
            self.broken = false;
            return Ok(());
        }
        if n > self.len {
            return Err(ModelError::Rewind {
                to: n,
                why: format!("only {} tokens held", self.len),
            });
        }
        if n == self.len && !self.broken {
            return Ok(());
        }
        if self.broken || self.model.has_recurrent() {
            return Err(ModelError::Rewind {
                to: n,
                why: "the Gated DeltaNet recurrent state cannot be rewound; re-prefill".into(),
            });
        }
        let be = &*self.model.be;
        if let Some(states) = self.states.as_mut() {
            for st in states.iter_mut() {
                if let LayerState::Kv(c) = st {
                    bk!(be.kv_truncate(c, n))?;
                }
            }
        }
        self.len = n;
        Ok(())
    }
}
