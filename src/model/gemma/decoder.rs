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

use super::layers::{GemmaWeights, Layer};
use super::session::GemmaState;
use super::spec::{GemmaSpec, NormForm};
use super::weights::me;
use crate::backend::{Activation, AttnParams, AttnPrep, Backend, Norm, PostNorm, StepOf};
use crate::model::common::seqs::{pick_each, SeqSteps};
use crate::model::{Logits, ModelError, ModelInfo};

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
    /// Tokens per pass over a prompt ([`prefill_chunk`]); on a model with sliding-window rings
    /// also the most positions one pass writes (see `session`).
    pub(crate) pass_chunk: usize,
    /// Sliding-window layers keep rings where those are shorter than the context (false: the
    /// whole context, for comparisons).
    pub(crate) rings: bool,
}

impl<B: Backend> GemmaModel<B> {
    pub fn new(spec: GemmaSpec, weights: GemmaWeights<B>, backend: Arc<B>) -> Self {
        let mut m = GemmaModel {
            info: ModelInfo {
                arch: spec.arch.to_string(),
                vocab_size: spec.vocab,
                hidden_size: spec.hidden,
                max_context: spec.max_context,
                kv_elems_per_token: spec.kv_elems_per_token(),
                kv_fixed_elems: 0,
            },
            spec,
            weights,
            backend,
            pass_chunk: prefill_chunk(),
            rings: true,
        };
        m.note_kv_sizes();
        m
    }

    /// Passes of `chunk` tokens, with (`rings`) or without sliding-window rings (sessions made
    /// before keep what they have).
    pub fn set_passes(&mut self, chunk: usize, rings: bool) {
        self.pass_chunk = chunk.max(1);
        self.rings = rings;
        self.note_kv_sizes();
    }

    /// `info`'s KV sizes as sessions allocate them: with rings, the sliding layers' positions
    /// are a fixed amount, not per token.
    fn note_kv_sizes(&mut self) {
        let (full, sliding) = self.spec.kv_elems_split();
        let slots = self.ring();
        self.info.kv_elems_per_token = full + if slots.is_some() { 0 } else { sliding };
        self.info.kv_fixed_elems = slots.map_or(0, |s| s * sliding);
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

    /// Per-layer inputs for the step's ids (`[n, n_layers * ple_dim]`), given the scaled embeddings.
    fn ple_inputs(&self, step: &StepOf<B>, x: &B::Tensor) -> Result<Option<B::Tensor>, ModelError> {
        let (Some(ple), p) = (&self.weights.ple, self.spec.ple_dim) else {
            return Ok(None);
        };
        let be = &*self.backend;
        let tok = be.embed(&ple.embed, step, (p as f32).sqrt()).map_err(me)?;
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

    /// One decoder layer over the hidden state `r` (`[n, hidden]`, rows at the step's positions).
    /// Every residual add runs fused with the norm of the branch before it and the norm of the
    /// sum after it (`norm_add_rms_norm`): the post-attention norm, add and `ffn_norm`; and
    /// (no PLE) the post-FFN norm, add and layer scalar with the next layer's `attn_norm` or the
    /// final norm, returned pending in `y`.
    fn layer<'w>(
        &'w self,
        i: usize,
        r: Resid<'w, B>,
        seqs: &SeqSteps<'_, B>,
        states: &mut [&mut GemmaState<B>],
        pli: Option<&B::Tensor>,
    ) -> Result<Resid<'w, B>, ModelError> {
        let be = &*self.backend;
        let w = &self.weights.layers[i];
        let (x, h) = self.norm_resid(r, &w.attn_norm)?;
        let o = self.attention_block(i, &h, seqs, states)?;
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

    /// `Wo attention(q, KV)` of layer `i` for the attention norm's rows `h`: q, k and v over
    /// every row, then each sequence's cache write and attention over its own caches (the
    /// layer's own, or on KV-sharing layers the source layer's).
    fn attention_block(
        &self,
        i: usize,
        h: &B::Tensor,
        seqs: &SeqSteps<'_, B>,
        states: &mut [&mut GemmaState<B>],
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let ls = &self.spec.layers[i];
        let src = ls.kv_source.unwrap_or(i);
        let no_cache = |l: usize| ModelError::Other(format!("layer {l} has no cache"));
        if states.len() != seqs.count() {
            return Err(ModelError::Other(format!(
                "{} states for a step of {} sequences",
                states.len(),
                seqs.count()
            )));
        }
        let (q, k, v) = self.weights.layers[i].qkv.forward(be, h)?;
        let q = if ls.kv_source.is_none() {
            let mut caches = pick_each(states, |s| s.caches[i].as_mut(), "KV cache")?;
            self.prep_qkv_seqs(i, (q, k, v), seqs, &mut caches)?
        } else {
            // RoPE at each row's own position: the step's rows together
            self.rope_query(i, &q, seqs.step)?
        };
        let caches = states
            .iter()
            .map(|s| s.caches[src].as_ref().ok_or_else(|| no_cache(src)))
            .collect::<Result<Vec<_>, _>>()?;
        let a = seqs.attention(be, q, &caches, &self.attn_params(i, ls.n_kv_heads))?;
        be.linear(&a, &self.weights.layers[i].o).map_err(me)
    }

    /// Own-KV layers: q/k norms, RoPE and the cache write of k and v of the q, k, v projections
    /// (v-normed where the model says so; V = raw K on K=V layers), sequence j's into
    /// `caches[j]`: one `attn_prep` over the step where the backend has it
    /// ([`SeqSteps::attn_prep`]), else per sequence. Returns the rotated q of every row.
    fn prep_qkv_seqs(
        &self,
        i: usize,
        (q, k, v): (B::Tensor, Option<B::Tensor>, Option<B::Tensor>),
        seqs: &SeqSteps<'_, B>,
        caches: &mut [&mut B::KvCache],
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let (ls, w) = (&self.spec.layers[i], &self.weights.layers[i]);
        let (Some(k), Some(_)) = (k, &w.k_norm) else {
            return Err(ModelError::Other(format!("layer {i} has no K projection")));
        };
        if ls.rope.head_dim != ls.head_dim {
            // not the shape attn_prep takes: the ops one by one, each sequence's K and V into
            // its own cache
            let q = self.rope_query(i, &q, seqs.step)?;
            let mut xs = vec![k];
            xs.extend(v);
            seqs.each(be, xs, |j, t, step| {
                let mut t = t.into_iter();
                let k = t
                    .next()
                    .ok_or_else(|| ModelError::Other("no k rows".into()))?;
                let v = t.next();
                let c = caches
                    .get_mut(j)
                    .ok_or_else(|| ModelError::Other(format!("no KV cache for sequence {j}")))?;
                self.write_kv(i, &k, v.as_ref(), step, c)?;
                // each's output (stacked, then dropped): the rows of k
                Ok(k)
            })?;
            return Ok(q);
        }
        let p = self.prep_params(i);
        // K=V layers: V is the raw K projection (before k_norm and RoPE)
        seqs.attn_prep(be, (&q, &k, v.as_ref().unwrap_or(&k)), caches, &p)
    }

    /// What `attn_prep` does on own-KV layer `i` (q/k norms, v norm where the model has one,
    /// the layer's RoPE).
    fn prep_params(&self, i: usize) -> AttnPrep<'_, B::Tensor> {
        let (ls, w) = (&self.spec.layers[i], &self.weights.layers[i]);
        AttnPrep {
            n_heads: self.spec.n_heads,
            n_kv_heads: ls.n_kv_heads,
            q_norm: Some(self.norm(&w.q_norm)),
            k_norm: w.k_norm.as_ref().map(|n| self.norm(n)),
            v_norm: self.spec.v_norm.then_some(Norm::None),
            eps: self.spec.eps,
            rope: &ls.rope,
        }
    }

    /// `rope(q_norm(Wq h))` for rows at the step's positions.
    pub fn query(
        &self,
        i: usize,
        h: &B::Tensor,
        step: &StepOf<B>,
    ) -> Result<B::Tensor, ModelError> {
        let (q, _, _) = self.weights.layers[i].qkv.forward(&*self.backend, h)?;
        self.rope_query(i, &q, step)
    }

    /// `rope(q_norm(q))` of the q projection for rows at the step's positions.
    fn rope_query(
        &self,
        i: usize,
        q: &B::Tensor,
        step: &StepOf<B>,
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let (ls, w) = (&self.spec.layers[i], &self.weights.layers[i]);
        let q = be
            .rms_norm(q, self.norm(&w.q_norm), self.spec.eps, ls.head_dim)
            .map_err(me)?;
        be.rope(&q, self.spec.n_heads, step, &ls.rope).map_err(me)
    }

    /// Norm, rotate and write this layer's K and V projections at the step's positions (`v` None on K=V
    /// layers: V is the raw K projection, before k_norm and RoPE).
    fn write_kv(
        &self,
        i: usize,
        k_raw: &B::Tensor,
        v: Option<&B::Tensor>,
        step: &StepOf<B>,
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
        let k = be.rope(&k, ls.n_kv_heads, step, &ls.rope).map_err(me)?;
        be.kv_write(cache, step, &k, v).map_err(me)
    }

    /// `x + post_attn_norm(Wo attention(q, cache))`; each query sees the cache up to its row's
    /// position in `step` (limited by the window on sliding layers).
    pub fn attend(
        &self,
        i: usize,
        x: &B::Tensor,
        q: &B::Tensor,
        cache: &B::KvCache,
        step: &StepOf<B>,
        n_kv_heads: usize,
    ) -> Result<B::Tensor, ModelError> {
        let y = self.attn_branch(i, q, cache, step, n_kv_heads)?;
        self.backend.add(x, &y).map_err(me)
    }

    /// `post_attn_norm(Wo attention(q, cache))`: what the residual adds after attention.
    fn attn_branch(
        &self,
        i: usize,
        q: &B::Tensor,
        cache: &B::KvCache,
        step: &StepOf<B>,
        n_kv_heads: usize,
    ) -> Result<B::Tensor, ModelError> {
        let o = self.attn_out(i, q, cache, step, n_kv_heads)?;
        self.rms(&o, &self.weights.layers[i].post_attn_norm)
    }

    /// `Wo attention(q, cache)`, before the post-attention norm.
    fn attn_out(
        &self,
        i: usize,
        q: &B::Tensor,
        cache: &B::KvCache,
        step: &StepOf<B>,
        n_kv_heads: usize,
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let a = be
            .attention(q, cache, step, &self.attn_params(i, n_kv_heads))
            .map_err(me)?;
        be.linear(&a, &self.weights.layers[i].o).map_err(me)
    }

    /// Layer `i`'s attention parameters (with `n_kv_heads` KV heads).
    fn attn_params(&self, i: usize, n_kv_heads: usize) -> AttnParams {
        let ls = &self.spec.layers[i];
        AttnParams {
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
        }
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

    /// Run the step's tokens through every layer (sequence `j` of the step on `states[j]`);
    /// returns the final-normed hidden states `[n, hidden]`.
    pub fn hidden_states(
        &self,
        seqs: &SeqSteps<'_, B>,
        states: &mut [&mut GemmaState<B>],
    ) -> Result<B::Tensor, ModelError> {
        let be = &*self.backend;
        let step = seqs.step;
        let x = be
            .embed(&self.weights.embed, step, self.spec.embed_scale)
            .map_err(me)?;
        let pli = self.ple_inputs(step, &x)?;
        let mut r = Resid { x, y: None };
        for i in 0..self.spec.n_layers() {
            r = self.layer(i, r, seqs, states, pli.as_ref())?;
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
