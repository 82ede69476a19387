//! The Gemma decoder forward pass, written once over the `Backend` trait.
//!
//! Per layer (HF `Gemma3DecoderLayer` / `Gemma4TextDecoderLayer`):
//! ```text
//! h = attn_norm(x); q = rope(q_norm(Wq h)); k = rope(k_norm(Wk h)); v = [v_norm](Wv h | Wk h)
//! x = x + post_attn_norm(Wo attention(q, KV))
//! f = gelu_tanh(Wg ffn_norm(x)) * Wu ffn_norm(x) -> Wd     (+ MoE: post_norm_1(f) + experts)
//! x = x + post_ffn_norm(f)
//! [PLE]  x = x + ple_post_norm(Wp (gelu_tanh(Wgate x) * pli[layer]))
//! [G4]   x = x * layer_scalar
//! ```
//! then `final_norm`, the (tied) head and the optional final soft-cap.
//!
//! Fused as the backend allows: q, k, v in one projection (`QkvProj`); the q/k/v norms, RoPE and
//! the cache write as one `attn_prep`; each residual add with the norm of the branch before it,
//! the layer scalar and the norm of the sum after it (the next `ffn_norm`, `attn_norm` or
//! `final_norm`) as one `norm_add_rms_norm`. A one-row step feeds the final-normed row to the
//! head as it is (no row copy, so the norm's int8 side-car reaches the head's GEMV).

use std::sync::Arc;

use crate::model::common::prefill_chunk;
use crate::model::common::replay::StepReplay;

use super::layers::{GemmaWeights, Layer};
use super::spec::{GemmaSpec, NormForm};
use super::weights::me;
use crate::backend::{Activation, AttnParams, AttnPrep, Backend, KvShape, Norm, PostNorm};
use crate::engine::SamplingParams;
use crate::model::{
    host_forward_sample, BackendSampler, CausalLm, Logits, ModelError, ModelInfo, Session,
    TokenSampler,
};

/// A residual add still pending: the branch output `y`, the norm it takes before the add (None:
/// added as it is) and the multiplier on the sum (the layer scalar).
struct Pending<'w, B: Backend> {
    y: B::Tensor,
    post: Option<&'w B::Tensor>,
    scale: Option<f32>,
}

/// The residual stream between layers: `x`, or `(x + post(y)) * scale` while an add is pending
/// (so that it runs fused with the norm that reads the sum).
struct Resid<'w, B: Backend> {
    x: B::Tensor,
    y: Option<Pending<'w, B>>,
}

pub struct GemmaModel<B: Backend> {
    pub spec: GemmaSpec,
    pub weights: GemmaWeights<B>,
    pub backend: Arc<B>,
    pub info: ModelInfo,
}

impl<B: Backend> GemmaModel<B> {
    pub fn new(spec: GemmaSpec, weights: GemmaWeights<B>, backend: Arc<B>) -> Self {
        let info = ModelInfo {
            arch: spec.arch.to_string(),
            vocab_size: spec.vocab,
            hidden_size: spec.hidden,
            max_context: spec.max_context,
            kv_elems_per_token: spec.kv_elems_per_token(),
        };
        GemmaModel {
            spec,
            weights,
            backend,
            info,
        }
    }

    /// The norm form for a stored weight.
    pub fn norm<'t>(&self, w: &'t B::Tensor) -> Norm<'t, B::Tensor> {
        match self.spec.norm {
            NormForm::OnePlus => Norm::OnePlus(w),
            NormForm::Plain => Norm::Plain(w),
        }
    }

    pub fn rms(&self, x: &B::Tensor, w: &B::Tensor) -> Result<B::Tensor, ModelError> {
        self.backend
            .rms_norm(x, self.norm(w), self.spec.eps, self.spec.hidden)
            .map_err(me)
    }

    /// A fresh session with its own caches.
    pub fn session(self: &Arc<Self>) -> Result<GemmaSession<B>, ModelError> {
        let mut caches = Vec::with_capacity(self.spec.n_layers());
        for l in &self.spec.layers {
            caches.push(match l.kv_source {
                Some(_) => None,
                None => Some(
                    self.backend
                        .kv_cache(KvShape {
                            n_kv_heads: l.n_kv_heads,
                            head_dim: l.head_dim,
                            capacity: self.spec.max_context,
                        })
                        .map_err(me)?,
                ),
            });
        }
        Ok(GemmaSession {
            model: Arc::clone(self),
            caches,
            len: 0,
            hidden: None,
            graph: StepReplay::default(),
        })
    }

    /// Per-layer inputs for `ids` (`[n, n_layers * ple_dim]`), given the scaled embeddings.
    fn ple_inputs(&self, ids: &[u32], x: &B::Tensor) -> Result<Option<B::Tensor>, ModelError> {
        let (Some(ple), p) = (&self.weights.ple, self.spec.ple_dim) else {
            return Ok(None);
        };
        let be = &*self.backend;
        let tok = be.embed(&ple.embed, ids, (p as f32).sqrt()).map_err(me)?;
        let proj = be.linear(x, &ple.model_proj).map_err(me)?;
        let proj = be
            .scale(&proj, (self.spec.hidden as f32).powf(-0.5))
            .map_err(me)?;
        let proj = be
            .rms_norm(&proj, self.norm(&ple.proj_norm), self.spec.eps, p)
            .map_err(me)?;
        let sum = be.add(&proj, &tok).map_err(me)?;
        Ok(Some(
            be.scale(&sum, std::f32::consts::FRAC_1_SQRT_2)
                .map_err(me)?,
        ))
    }

    /// The hidden state `r` with its pending add done and `w`'s norm of it: one fused op
    /// (`norm_add_rms_norm`) when an add is pending.
    fn norm_resid(
        &self,
        r: Resid<'_, B>,
        w: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor), ModelError> {
        match r.y {
            Some(p) => {
                let post = PostNorm {
                    norm: p.post.map(|t| self.norm(t)),
                    scale: p.scale,
                };
                self.backend
                    .norm_add_rms_norm(
                        &r.x,
                        &p.y,
                        &post,
                        self.norm(w),
                        self.spec.eps,
                        self.spec.hidden,
                    )
                    .map_err(me)
            }
            None => {
                let n = self.rms(&r.x, w)?;
                Ok((r.x, n))
            }
        }
    }

    /// One decoder layer over the hidden state `r` (`[n, hidden]`, rows at positions `pos0..`).
    /// Every residual add runs fused with the norm of the branch before it and the norm of the
    /// sum after it (`norm_add_rms_norm`): the post-attention norm, add and `ffn_norm`; and
    /// (no PLE) the post-FFN norm, add and layer scalar with the next layer's `attn_norm` or the
    /// final norm, returned pending in `y`.
    fn layer<'w>(
        &'w self,
        i: usize,
        r: Resid<'w, B>,
        pos0: usize,
        caches: &mut [Option<B::KvCache>],
        pli: Option<&B::Tensor>,
    ) -> Result<Resid<'w, B>, ModelError> {
        let be = &*self.backend;
        let ls = &self.spec.layers[i];
        let w = &self.weights.layers[i];
        let (x, h) = self.norm_resid(r, &w.attn_norm)?;
        let q = if ls.kv_source.is_none() {
            let cache = caches[i]
                .as_mut()
                .ok_or_else(|| ModelError::Other(format!("layer {i} has no cache")))?;
            self.prep_qkv(i, &h, pos0, cache)?
        } else {
            self.query(i, &h, pos0)?
        };
        let src = ls.kv_source.unwrap_or(i);
        let cache = caches[src]
            .as_ref()
            .ok_or_else(|| ModelError::Other(format!("layer {src} has no cache")))?;
        let o = self.attn_out(i, &q, cache, pos0, ls.n_kv_heads)?;
        let attn = Pending {
            y: o,
            post: Some(&w.post_attn_norm),
            scale: None,
        };
        let (x, h) = self.norm_resid(Resid { x, y: Some(attn) }, &w.ffn_norm)?;
        let (f, post) = self.ffn_out(i, &x, &h)?;
        if w.ple.is_none() {
            return Ok(Resid {
                x,
                y: Some(Pending {
                    y: f,
                    post,
                    scale: w.scalar,
                }),
            });
        }
        let y = match post {
            Some(p) => self.rms(&f, p)?,
            None => f,
        };
        let x = be.add(&x, &y).map_err(me)?;
        Ok(Resid {
            x: self.ffn_tail(i, x, pli)?,
            y: None,
        })
    }

    /// Own-KV layers: the q, k, v projections of `h`, then q/k norms, RoPE and the cache write
    /// of k and v (v-normed where the model says so; V = raw K on K=V layers) as one
    /// `attn_prep`. Returns the rotated q.
    fn prep_qkv(
        &self,
        i: usize,
        h: &B::Tensor,
        pos0: usize,
        cache: &mut B::KvCache,
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let (ls, w) = (&self.spec.layers[i], &self.weights.layers[i]);
        let (q, k, v) = w.qkv.forward(be, h)?;
        let (Some(k), Some(kn)) = (k, &w.k_norm) else {
            return Err(ModelError::Other(format!("layer {i} has no K projection")));
        };
        if ls.rope.head_dim != ls.head_dim {
            // not the shape attn_prep takes: the ops one by one
            let q = self.rope_query(i, &q, pos0)?;
            self.write_kv(i, &k, v.as_ref(), pos0, cache)?;
            return Ok(q);
        }
        let p = AttnPrep {
            n_heads: self.spec.n_heads,
            n_kv_heads: ls.n_kv_heads,
            q_norm: Some(self.norm(&w.q_norm)),
            k_norm: Some(self.norm(kn)),
            v_norm: self.spec.v_norm.then_some(Norm::None),
            eps: self.spec.eps,
            rope: &ls.rope,
        };
        // K=V layers: V is the raw K projection (before k_norm and RoPE)
        be.attn_prep(&q, &k, v.as_ref().unwrap_or(&k), cache, pos0, &p)
            .map_err(me)
    }

    /// `rope(q_norm(Wq h))` for rows at positions `pos0..`.
    pub fn query(&self, i: usize, h: &B::Tensor, pos0: usize) -> Result<B::Tensor, ModelError> {
        let (q, _, _) = self.weights.layers[i].qkv.forward(&*self.backend, h)?;
        self.rope_query(i, &q, pos0)
    }

    /// `rope(q_norm(q))` of the q projection for rows at positions `pos0..`.
    fn rope_query(&self, i: usize, q: &B::Tensor, pos0: usize) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let (ls, w) = (&self.spec.layers[i], &self.weights.layers[i]);
        let q = be
            .rms_norm(q, self.norm(&w.q_norm), self.spec.eps, ls.head_dim)
            .map_err(me)?;
        be.rope(&q, self.spec.n_heads, pos0, &ls.rope).map_err(me)
    }

    /// Norm, rotate and write this layer's K and V projections at `pos0..` (`v` None on K=V
    /// layers: V is the raw K projection, before k_norm and RoPE).
    fn write_kv(
        &self,
        i: usize,
        k_raw: &B::Tensor,
        v: Option<&B::Tensor>,
        pos0: usize,
        cache: &mut B::KvCache,
    ) -> Result<(), ModelError> {
        let be = &*self.backend;
        let (ls, w) = (&self.spec.layers[i], &self.weights.layers[i]);
        let (hd, eps) = (ls.head_dim, self.spec.eps);
        let Some(kn) = &w.k_norm else {
            return Err(ModelError::Other(format!("layer {i} has no K norm")));
        };
        let v = v.unwrap_or(k_raw);
        let vn = if self.spec.v_norm {
            Some(be.rms_norm(v, Norm::None, eps, hd).map_err(me)?)
        } else {
            None
        };
        let v = vn.as_ref().unwrap_or(v);
        let k = be.rms_norm(k_raw, self.norm(kn), eps, hd).map_err(me)?;
        let k = be.rope(&k, ls.n_kv_heads, pos0, &ls.rope).map_err(me)?;
        be.kv_write(cache, pos0, &k, v).map_err(me)
    }

    /// `x + post_attn_norm(Wo attention(q, cache))`; the queries see the cache up to position
    /// `pos0 + row` (limited by the window on sliding layers).
    pub fn attend(
        &self,
        i: usize,
        x: &B::Tensor,
        q: &B::Tensor,
        cache: &B::KvCache,
        pos0: usize,
        n_kv_heads: usize,
    ) -> Result<B::Tensor, ModelError> {
        let y = self.attn_branch(i, q, cache, pos0, n_kv_heads)?;
        self.backend.add(x, &y).map_err(me)
    }

    /// `post_attn_norm(Wo attention(q, cache))`: what the residual adds after attention.
    fn attn_branch(
        &self,
        i: usize,
        q: &B::Tensor,
        cache: &B::KvCache,
        pos0: usize,
        n_kv_heads: usize,
    ) -> Result<B::Tensor, ModelError> {
        let o = self.attn_out(i, q, cache, pos0, n_kv_heads)?;
        self.rms(&o, &self.weights.layers[i].post_attn_norm)
    }

    /// `Wo attention(q, cache)`, before the post-attention norm.
    fn attn_out(
        &self,
        i: usize,
        q: &B::Tensor,
        cache: &B::KvCache,
        pos0: usize,
        n_kv_heads: usize,
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let (ls, w) = (&self.spec.layers[i], &self.weights.layers[i]);
        let p = AttnParams {
            n_heads: self.spec.n_heads,
            n_kv_heads,
            head_dim: ls.head_dim,
            scale: self.spec.attn_scale,
            window: if ls.sliding {
                Some(self.spec.window)
            } else {
                None
            },
            softcap: None,
        };
        let a = be.attention(q, cache, pos0, &p).map_err(me)?;
        be.linear(&a, &w.o).map_err(me)
    }

    /// The feed-forward half of layer `i` (+ MoE, + PLE, times the layer scalar).
    pub fn ffn(
        &self,
        i: usize,
        x: &B::Tensor,
        pli: Option<&B::Tensor>,
    ) -> Result<B::Tensor, ModelError> {
        let h = self.rms(x, &self.weights.layers[i].ffn_norm)?;
        let y = self.ffn_branch(i, x, &h)?;
        let x = self.backend.add(x, &y).map_err(me)?;
        self.ffn_tail(i, x, pli)
    }

    /// `post_ffn_norm(mlp(h) [+ MoE])` for the residual `x` and its `ffn_norm` `h`: what the
    /// residual adds after the feed-forward block.
    fn ffn_branch(&self, i: usize, x: &B::Tensor, h: &B::Tensor) -> Result<B::Tensor, ModelError> {
        match self.ffn_out(i, x, h)? {
            (f, Some(post)) => self.rms(&f, post),
            (f, None) => Ok(f),
        }
    }

    /// The feed-forward output and the norm it still takes before the residual add: the dense
    /// MLP's down projection and `post_ffn_norm`, or (MoE layers) the normed sum and None.
    fn ffn_out(
        &self,
        i: usize,
        x: &B::Tensor,
        h: &B::Tensor,
    ) -> Result<(B::Tensor, Option<&B::Tensor>), ModelError> {
        let be = &*self.backend;
        let w: &Layer<B> = &self.weights.layers[i];
        let gu = w.mlp.gate_up.forward(be, h, Activation::GeluTanh)?;
        let f = be.linear(&gu, &w.mlp.down).map_err(me)?;
        match &w.moe {
            Some(moe) => {
                let f1 = self.rms(&f, &moe.post_norm_1)?;
                let f2 = moe.forward(be, x, self.spec.eps, |t| self.norm(t))?;
                // post_ffn_norm(f1 + f2) in one op (the sum itself is not needed)
                let (_, n) = be
                    .add_rms_norm(
                        &f1,
                        &f2,
                        self.norm(&w.post_ffn_norm),
                        self.spec.eps,
                        self.spec.hidden,
                    )
                    .map_err(me)?;
                Ok((n, None))
            }
            None => Ok((f, Some(&w.post_ffn_norm))),
        }
    }

    /// After the feed-forward residual add: the per-layer embedding and the layer scalar.
    fn ffn_tail(
        &self,
        i: usize,
        mut x: B::Tensor,
        pli: Option<&B::Tensor>,
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let w: &Layer<B> = &self.weights.layers[i];
        if let (Some(ple), Some(pli)) = (&w.ple, pli) {
            let pd = self.spec.ple_dim;
            let mine = be.slice_cols(pli, i * pd, pd).map_err(me)?;
            let g = be.linear(&x, &ple.gate).map_err(me)?;
            let g = be.glu(&g, &mine, Activation::GeluTanh).map_err(me)?;
            let p = be.linear(&g, &ple.proj).map_err(me)?;
            x = be.add(&x, &self.rms(&p, &ple.post_norm)?).map_err(me)?;
        }
        if let Some(s) = w.scalar {
            x = be.scale(&x, s).map_err(me)?;
        }
        Ok(x)
    }

    /// Run `ids` at positions `pos0..` through every layer; returns the final-normed hidden
    /// states `[n, hidden]`.
    pub fn hidden_states(
        &self,
        ids: &[u32],
        pos0: usize,
        caches: &mut [Option<B::KvCache>],
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        be.begin_forward(ids, pos0).map_err(me)?;
        let x = be
            .embed(&self.weights.embed, ids, self.spec.embed_scale)
            .map_err(me)?;
        let pli = self.ple_inputs(ids, &x)?;
        let mut r = Resid { x, y: None };
        for i in 0..self.spec.n_layers() {
            r = self.layer(i, r, pos0, caches, pli.as_ref())?;
        }
        Ok(self.norm_resid(r, &self.weights.final_norm)?.1)
    }

    /// Logits of the rows of `h` (`[n, hidden]`), soft-capped if the model says so.
    pub fn logits(&self, h: &B::Tensor) -> Result<Logits, ModelError> {
        let be = &*self.backend;
        let l = self.logits_tensor(h)?;
        let (rows, vocab) = be.dims(&l);
        Ok(Logits {
            rows,
            vocab,
            data: be.to_host(&l).map_err(me)?,
        })
    }

    /// [`Self::logits`] left on the backend.
    pub fn logits_tensor(&self, h: &B::Tensor) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let mut l = be.linear(h, self.weights.head()).map_err(me)?;
        if let Some(cap) = self.spec.final_softcap {
            l = be.softcap(&l, cap).map_err(me)?;
        }
        Ok(l)
    }

    /// The last row of `h` as its own tensor.
    pub fn last_row(&self, h: &B::Tensor) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let (n, _) = be.dims(h);
        be.slice_rows(h, n.saturating_sub(1), 1).map_err(me)
    }
}

impl<B: Backend> CausalLm for GemmaModel<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_session(self: Arc<Self>) -> Box<dyn Session> {
        match self.session() {
            Ok(s) => Box::new(s),
            Err(e) => Box::new(FailedSession(e.to_string())),
        }
    }
}

/// A session whose caches could not be allocated: every call reports why.
struct FailedSession(String);

impl Session for FailedSession {
    fn forward(&mut self, _: &[u32], _: bool) -> Result<Logits, ModelError> {
        Err(ModelError::Other(format!(
            "session unavailable: {}",
            self.0
        )))
    }
    fn len(&self) -> usize {
        0
    }
    fn rewind(&mut self, _: usize) -> Result<(), ModelError> {
        Err(ModelError::Other(format!(
            "session unavailable: {}",
            self.0
        )))
    }
}

/// One sequence on a Gemma model: a KV cache per layer that owns one.
pub struct GemmaSession<B: Backend> {
    pub model: Arc<GemmaModel<B>>,
    pub caches: Vec<Option<B::KvCache>>,
    len: usize,
    /// Final-normed hidden state of the last position (what the Gemma 4 MTP head reads).
    hidden: Option<B::Tensor>,
    /// Decode-step replay (CUDA graph).
    graph: StepReplay<B>,
}

impl<B: Backend> GemmaSession<B> {
    /// Post-final-norm hidden state of the last token processed (`[1, hidden]`).
    pub fn last_hidden(&self) -> Option<&B::Tensor> {
        self.hidden.as_ref()
    }
}

impl<B: Backend> GemmaSession<B> {
    /// Checks, then the layers over `tokens`: returns the logits tensor (every row when `all`,
    /// else the last) and keeps the last row's hidden state. A one-token step is recorded once and
    /// then replayed (`StepReplay`). A failure drops whatever the step wrote, so the session
    /// stays usable.
    fn pass(&mut self, tokens: &[u32], all: bool) -> Result<B::Tensor, ModelError> {
        self.graph.forget_inflight();
        let end = self.check_pass(tokens)?;
        let model = Arc::clone(&self.model);
        let m = &*model;
        let pos0 = self.len;
        let caches = &mut self.caches;
        let mut run = || -> Result<Vec<B::Tensor>, ModelError> {
            // Long prompts run in chunks (bounded activation memory); only the last chunk's
            // rows reach the head. `all` keeps one pass: every row's logits are asked for.
            let chunk = if all { tokens.len() } else { prefill_chunk() };
            let mut at = pos0;
            let mut h = None;
            for c in tokens.chunks(chunk.max(1)) {
                h = Some(m.hidden_states(c, at, caches)?);
                at += c.len();
            }
            let h = h.ok_or(ModelError::Empty)?;
            if m.backend.dims(&h).0 == 1 {
                // one row is its own last row (and keeps the int8 side-car the final norm
                // wrote, which the head's GEMV reads)
                let logits = m.logits_tensor(&h)?;
                return Ok(vec![logits, h]);
            }
            let last = m.last_row(&h)?;
            let logits = m.logits_tensor(if all { &h } else { &last })?;
            Ok(vec![logits, last])
        };
        let r = if tokens.len() == 1 && !all {
            self.graph.step_many(&*m.backend, tokens, pos0, run)
        } else {
            run()
        };
        match r {
            Ok(mut v) if v.len() == 2 => {
                let last = v.pop().expect("two outputs");
                let logits = v.pop().expect("two outputs");
                self.hidden = Some(last);
                self.len = end;
                Ok(logits)
            }
            Ok(_) => Err(ModelError::Other("forward pass lost its outputs".into())),
            Err(e) => {
                let keep = self.len;
                for c in self.caches.iter_mut().flatten() {
                    let _ = self.model.backend.kv_truncate(c, keep);
                }
                Err(e)
            }
        }
    }
}

impl<B: Backend> GemmaSession<B> {
    /// What a pass over `tokens` needs: some tokens, all in the vocabulary, room in the
    /// context. Returns the length after it.
    fn check_pass(&self, tokens: &[u32]) -> Result<usize, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        let spec = &self.model.spec;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= spec.vocab) {
            return Err(ModelError::BadToken {
                id,
                vocab: spec.vocab,
            });
        }
        let end = self.len + tokens.len();
        if end > spec.max_context {
            return Err(ModelError::ContextOverflow {
                len: end,
                max: spec.max_context,
            });
        }
        Ok(end)
    }

    /// `pass` of one token and the draw from its logits, pipelined: the next step is queued
    /// fed with the drawn id before the host waits for it (`StepReplay::step_sampled`; every
    /// per-step state here is a K/V row, rewritten before it is read).
    fn pass_sampled(
        &mut self,
        token: u32,
        s: &mut BackendSampler<B>,
        banned: &[u32],
    ) -> Result<u32, ModelError> {
        self.check_pass(&[token])?;
        let model = Arc::clone(&self.model);
        let m = &*model;
        let max = m.spec.max_context;
        let pos0 = self.len;
        let next = (pos0 + 2 <= max).then_some(pos0 + 1);
        let caches = &mut self.caches;
        let run = || -> Result<Vec<B::Tensor>, ModelError> {
            let h = m.hidden_states(&[token], pos0, caches)?;
            // one row keeps the final norm's int8 side-car for the head's GEMV
            let logits = m.logits_tensor(&h)?;
            Ok(vec![logits, h])
        };
        let r = self
            .graph
            .step_sampled(&*m.backend, token, pos0, next, s.state_mut(), banned, run);
        match r {
            Ok(mut st) => {
                self.hidden = st.rest.pop();
                self.len += 1;
                Ok(st.token)
            }
            Err(e) => {
                let keep = self.len;
                for c in self.caches.iter_mut().flatten() {
                    let _ = self.model.backend.kv_truncate(c, keep);
                }
                Err(e)
            }
        }
    }
}

impl<B: Backend> Session for GemmaSession<B> {
    fn forward(&mut self, tokens: &[u32], all: bool) -> Result<Logits, ModelError> {
        let l = self.pass(tokens, all)?;
        let be = &*self.model.backend;
        let (rows, vocab) = be.dims(&l);
        Ok(Logits {
            rows,
            vocab,
            data: be.to_host(&l).map_err(me)?,
        })
    }

    fn sampler(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<Box<dyn TokenSampler>, ModelError> {
        Ok(Box::new(BackendSampler::new(
            self.model.backend.clone(),
            params,
            prompt,
            vocab,
        )?))
    }

    fn forward_sample(
        &mut self,
        tokens: &[u32],
        sampler: &mut dyn TokenSampler,
        banned: &[u32],
    ) -> Result<u32, ModelError> {
        match sampler.as_any_mut().downcast_mut::<BackendSampler<B>>() {
            Some(s) if tokens.len() == 1 => self.pass_sampled(tokens[0], s, banned),
            Some(s) => {
                let l = self.pass(tokens, false)?;
                s.sample(l, banned)
            }
            None => host_forward_sample(self, tokens, sampler, banned),
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn rewind(&mut self, n: usize) -> Result<(), ModelError> {
        self.graph.forget_inflight();
        if n > self.len {
            return Err(ModelError::Rewind {
                to: n,
                why: format!("only {} tokens held", self.len),
            });
        }
        for c in self.caches.iter_mut().flatten() {
            self.model.backend.kv_truncate(c, n).map_err(me)?;
        }
        self.len = n;
        self.hidden = None;
        Ok(())
    }
}
