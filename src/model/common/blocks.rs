//! Decoder building blocks over the Backend trait: RMSNorm weights, the gated MLP, the
//! mixture-of-experts block (optionally with a sigmoid-gated shared expert) and a grouped-query
//! attention layer (q/k norms, partial RoPE, optional per-head output gate).

use crate::backend::{
    can_concat, norm_next_apply, Activation, AttnParams, AttnPrep, Backend, MoeParams, Norm,
    NormNext, Rope, StepOf,
};
use crate::bk;
use crate::model::common::seqs::SeqSteps;
use crate::model::ModelError;
use crate::weights::TensorRef;

type R<T> = Result<T, ModelError>;

/// An RMSNorm: its weight as an f32 vector tensor, and how it applies.
pub struct NormW<B: Backend> {
    pub w: B::Tensor,
    /// x_hat * (1 + w) (HF zero-centred norms) instead of x_hat * w.
    pub one_plus: bool,
    pub eps: f32,
    /// Group size: hidden for a whole-row norm, head_dim for per-head norms.
    pub dim: usize,
}

impl<B: Backend> NormW<B> {
    pub fn new(be: &B, w: &B::Weight, one_plus: bool, eps: f32, dim: usize) -> R<Self> {
        Ok(NormW {
            w: bk!(be.weight_vector(w))?,
            one_plus,
            eps,
            dim,
        })
    }
    /// How the weight applies, as the backend takes it.
    pub fn norm(&self) -> Norm<'_, B::Tensor> {
        if self.one_plus {
            Norm::OnePlus(&self.w)
        } else {
            Norm::Plain(&self.w)
        }
    }
    pub fn apply(&self, be: &B, x: &B::Tensor) -> R<B::Tensor> {
        bk!(be.rms_norm(x, self.norm(), self.eps, self.dim))
    }
    /// `s = h + x w^T` (a branch's output projection and the residual add), this norm of s and
    /// `next` on the normed row: `(s, next(norm(s)))`, one backend op for a whole-row norm.
    pub fn linear_add_then(
        &self,
        be: &B,
        (x, w): (&B::Tensor, &B::Weight),
        h: &B::Tensor,
        next: &NormNext<'_, B::Weight>,
    ) -> R<(B::Tensor, Vec<B::Tensor>)> {
        if be.dims(h).1 == self.dim {
            return bk!(be.linear_add_rms_norm_then(x, w, h, self.norm(), self.eps, next));
        }
        let y = bk!(be.linear(x, w))?;
        let (s, n) = self.add_apply(be, h, &y)?;
        Ok((s, bk!(norm_next_apply(be, &n, next))?))
    }
    /// The residual add `h + y` and this norm of the sum: `(h + y, norm(h + y))`.
    pub fn add_apply(&self, be: &B, h: &B::Tensor, y: &B::Tensor) -> R<(B::Tensor, B::Tensor)> {
        bk!(be.add_rms_norm(h, y, self.norm(), self.eps, self.dim))
    }
}

/// The gate and up projections of a gated MLP: one fused `[2 ff, in]` weight when the
/// checkpoint stores both in one GGML format (one GEMV / GEMM and one pass over the activations
/// instead of two), else the two weights.
pub enum GateUp<B: Backend> {
    Fused(B::Weight),
    Split { gate: B::Weight, up: B::Weight },
}

impl<B: Backend> GateUp<B> {
    pub fn load(be: &B, gate: &TensorRef<'_>, up: &TensorRef<'_>) -> R<Self> {
        if gate.shape == up.shape && can_concat(&[gate.clone(), up.clone()]) {
            let name = format!("{}+{}", gate.name, up.name);
            return Ok(GateUp::Fused(bk!(
                be.upload_concat(&name, &[gate.clone(), up.clone()])
            )?));
        }
        Ok(GateUp::Split {
            gate: bk!(be.upload(gate))?,
            up: bk!(be.upload(up))?,
        })
    }

    /// act(gate x) * up x.
    pub fn forward(&self, be: &B, x: &B::Tensor, act: Activation) -> R<B::Tensor> {
        match self {
            GateUp::Fused(w) => bk!(be.linear_glu(x, w, act)),
            GateUp::Split { gate, up } => {
                let g = bk!(be.linear(x, gate))?;
                let u = bk!(be.linear(x, up))?;
                bk!(be.glu(&g, &u, act))
            }
        }
    }
}

/// down(act(gate x) * up x).
pub struct Dense<B: Backend> {
    pub gate_up: GateUp<B>,
    pub down: B::Weight,
    pub act: Activation,
}

impl<B: Backend> Dense<B> {
    pub fn forward(&self, be: &B, x: &B::Tensor) -> R<B::Tensor> {
        let h = self.gate_up.forward(be, x, self.act)?;
        bk!(be.linear(&h, &self.down))
    }
}

/// Narrowest input for which q and k are fused apart from v ([`Qkv::QkFused`]). Measured on the
/// H200 (decode A/B, three runs each): Qwen3-8B Q4_K_M (inputs of 4096) 475.2 ->
/// 478.7 tok/s (+0.7%), Qwen3-30B-A3B Q4_K_M (inputs of 2048) 500.8 -> 498.3 (-0.5%), so the
/// 30B keeps three launches.
const QK_FUSE_MIN_COLS: usize = 4096;

/// The Q, K and V projections of an attention layer: one fused weight when the three share a
/// GGML format, q|k and v where only q and k do (inputs of [`QK_FUSE_MIN_COLS`] or more), else
/// three.
pub enum Qkv<B: Backend> {
    /// `[q_out + k_out + v_out, in]` and the three widths.
    Fused(B::Weight, [usize; 3]),
    /// `[q_out + k_out, in]` and the two widths, then v apart: where v's format differs from
    /// q's and k's (Q4_K_M files' Q6_K `attn_v` on the layers that get more bits) and the input
    /// is at least [`QK_FUSE_MIN_COLS`] wide, two GEMV launches instead of three.
    QkFused(B::Weight, [usize; 2], B::Weight),
    Split {
        q: B::Weight,
        k: B::Weight,
        v: B::Weight,
    },
}

impl<B: Backend> Qkv<B> {
    pub fn load(be: &B, q: &TensorRef<'_>, k: &TensorRef<'_>, v: &TensorRef<'_>) -> R<Self> {
        let parts = [q.clone(), k.clone(), v.clone()];
        if can_concat(&parts) {
            let name = format!("{}+{}+{}", q.name, k.name, v.name);
            let w = bk!(be.upload_concat(&name, &parts))?;
            return Ok(Qkv::Fused(w, [q.rows(), k.rows(), v.rows()]));
        }
        let qk = [q.clone(), k.clone()];
        if q.cols() >= QK_FUSE_MIN_COLS && can_concat(&qk) {
            let name = format!("{}+{}", q.name, k.name);
            let w = bk!(be.upload_concat(&name, &qk))?;
            return Ok(Qkv::QkFused(w, [q.rows(), k.rows()], bk!(be.upload(v))?));
        }
        Ok(Qkv::Split {
            q: bk!(be.upload(q))?,
            k: bk!(be.upload(k))?,
            v: bk!(be.upload(v))?,
        })
    }

    /// (q, k, v) projections of `x`.
    pub fn forward(&self, be: &B, x: &B::Tensor) -> R<(B::Tensor, B::Tensor, B::Tensor)> {
        let outs = self
            .weights()
            .into_iter()
            .map(|w| bk!(be.linear(x, w)))
            .collect::<R<Vec<_>>>()?;
        self.split(be, outs)
    }

    /// The weights whose outputs [`Qkv::split`] takes: the fused one, or q, k and v.
    pub fn weights(&self) -> Vec<&B::Weight> {
        match self {
            Qkv::Fused(w, _) => vec![w],
            Qkv::QkFused(qk, _, v) => vec![qk, v],
            Qkv::Split { q, k, v } => vec![q, k, v],
        }
    }

    /// (q, k, v) from the projections by [`Qkv::weights`], in that order.
    pub fn split(&self, be: &B, outs: Vec<B::Tensor>) -> R<(B::Tensor, B::Tensor, B::Tensor)> {
        let n = outs.len();
        let mut it = outs.into_iter();
        match (self, it.next(), it.next(), it.next()) {
            (Qkv::Fused(_, [nq, nk, nv]), Some(y), None, None) => Ok((
                bk!(be.slice_cols(&y, 0, *nq))?,
                bk!(be.slice_cols(&y, *nq, *nk))?,
                bk!(be.slice_cols(&y, nq + nk, *nv))?,
            )),
            (Qkv::QkFused(_, [nq, nk], _), Some(y), Some(v), None) => Ok((
                bk!(be.slice_cols(&y, 0, *nq))?,
                bk!(be.slice_cols(&y, *nq, *nk))?,
                v,
            )),
            (Qkv::Split { .. }, Some(q), Some(k), Some(v)) => Ok((q, k, v)),
            _ => Err(ModelError::Other(format!(
                "{n} projections for {} q/k/v weights",
                self.weights().len()
            ))),
        }
    }
}

/// Routed experts plus an optional shared expert scaled by sigmoid(shared_gate x).
pub struct MoeBlock<B: Backend> {
    pub router: B::Weight,
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
    pub params: MoeParams,
    pub shared: Option<(Dense<B>, B::Weight)>,
}

impl<B: Backend> MoeBlock<B> {
    /// `norm.add_apply(h, y)` and `forward` of the normed rows as one backend op
    /// (`Backend::add_rms_norm_moe_routed`): `(h + y, forward(norm(h + y)))`, or None when the
    /// backend does not fuse them for these inputs (or the block has a shared expert, which
    /// reads the normed rows too).
    pub fn add_norm_forward(
        &self,
        be: &B,
        norm: &NormW<B>,
        h: &B::Tensor,
        y: &B::Tensor,
    ) -> R<Option<(B::Tensor, B::Tensor)>> {
        if self.shared.is_some() || be.dims(h).1 != norm.dim {
            return Ok(None);
        }
        Ok(bk!(be.add_rms_norm_moe_routed(
            h,
            y,
            norm.norm(),
            norm.eps,
            &self.router,
            &self.gate,
            &self.up,
            &self.down,
            &self.params
        ))?)
    }

    pub fn forward(&self, be: &B, x: &B::Tensor) -> R<B::Tensor> {
        let routed = bk!(be.moe_routed(
            x,
            &self.router,
            &self.gate,
            &self.up,
            &self.down,
            &self.params
        ))?;
        match &self.shared {
            None => Ok(routed),
            Some((mlp, gate_w)) => {
                let s = mlp.forward(be, x)?;
                let g = bk!(be.linear(x, gate_w))?;
                let s = bk!(be.sigmoid_gate(&s, &g))?;
                bk!(be.add(&routed, &s))
            }
        }
    }
}

/// Grouped-query attention with per-head q/k RMSNorm and RoPE. With `gated`, `q_proj` yields
/// per head `[q | gate]` and the attention output is multiplied by sigmoid(gate) before `o_proj`.
pub struct AttentionLayer<B: Backend> {
    pub qkv: Qkv<B>,
    pub o: B::Weight,
    pub q_norm: Option<NormW<B>>,
    pub k_norm: Option<NormW<B>>,
    pub rope: Rope,
    pub params: AttnParams,
    pub gated: bool,
}

impl<B: Backend> AttentionLayer<B> {
    /// The eps of the q/k norms when [`Backend::attn_prep`] can do them: per-head groups of
    /// the RoPE head dim and one eps for both (else None: the ops one by one).
    fn prep_eps(&self) -> Option<f32> {
        let hd = self.rope.head_dim;
        let norms: Vec<&NormW<B>> = [&self.q_norm, &self.k_norm].into_iter().flatten().collect();
        if norms.iter().any(|n| n.dim != hd || n.eps != norms[0].eps) {
            return None;
        }
        Some(norms.first().map_or(0.0, |n| n.eps))
    }

    /// What [`Backend::attn_prep`] does for this layer (its q/k norms at `eps`, its RoPE).
    fn prep(&self, eps: f32) -> AttnPrep<'_, B::Tensor> {
        AttnPrep {
            n_heads: self.params.n_heads,
            n_kv_heads: self.params.n_kv_heads,
            q_norm: self.q_norm.as_ref().map(NormW::norm),
            k_norm: self.k_norm.as_ref().map(NormW::norm),
            v_norm: None,
            eps,
            rope: &self.rope,
        }
    }

    /// Whether [`Self::attend_fused`] can apply (a fused q|k|v weight, no output gate, norms
    /// [`Backend::attn_prep`] takes); the backend may still decline.
    pub fn may_fuse_prep(&self) -> bool {
        matches!(self.qkv, Qkv::Fused(..)) && !self.gated && self.prep_eps().is_some()
    }

    /// The layer from its input row `x` to the input of `o_proj` where the backend runs the
    /// q|k|v projection and the attention input as one op ([`Backend::linear_attn_prep`]: a
    /// fused q|k|v weight, no output gate, norms [`Backend::attn_prep`] takes), then the
    /// attention; None where it does not (the caller runs [`Qkv::forward`] and
    /// [`Self::attend`]), having computed nothing.
    pub fn attend_fused(
        &self,
        be: &B,
        x: &B::Tensor,
        cache: &mut B::KvCache,
        step: &StepOf<B>,
    ) -> R<Option<B::Tensor>> {
        let (Qkv::Fused(w, _), false, Some(eps)) = (&self.qkv, self.gated, self.prep_eps()) else {
            return Ok(None);
        };
        let p = &self.params;
        match bk!(be.linear_attn_prep(x, w, cache, step, &self.prep(eps)))? {
            Some(q) => Ok(Some(bk!(be.attention(&q, cache, step, p))?)),
            None => Ok(None),
        }
    }

    /// The layer from its q/k/v projections ([`Qkv`]) to the input of `o_proj`: q/k norms,
    /// RoPE, the cache write, attention and the output gate. The decoder applies `o` (with the
    /// residual add and the next norm: `NormW::linear_add_then`).
    pub fn attend(
        &self,
        be: &B,
        (qf, mut k, v): (B::Tensor, B::Tensor, B::Tensor),
        cache: &mut B::KvCache,
        step: &StepOf<B>,
    ) -> R<B::Tensor> {
        let p = &self.params;
        let (q, gate) = self.split_gate(be, qf)?;
        let mut a = match self.prep_eps() {
            // q/k norms, RoPE, the cache write and the attention as one op (on the GPU one or
            // two kernels)
            Some(eps) => {
                let q = bk!(be.attn_prep(&q, &k, &v, cache, step, &self.prep(eps)))?;
                bk!(be.attention(&q, cache, step, p))?
            }
            None => {
                let q = match &self.q_norm {
                    Some(n) => n.apply(be, &q)?,
                    None => q,
                };
                if let Some(n) = &self.k_norm {
                    k = n.apply(be, &k)?;
                }
                let q = bk!(be.rope(&q, p.n_heads, step, &self.rope))?;
                let k = bk!(be.rope(&k, p.n_kv_heads, step, &self.rope))?;
                bk!(be.kv_write(cache, step, &k, &v))?;
                bk!(be.attention(&q, cache, step, p))?
            }
        };
        if let Some(g) = gate {
            a = bk!(be.sigmoid_gate(&a, &g))?;
        }
        Ok(a)
    }

    /// `q_proj`'s rows as (q, output gate): the gate is every head's second half on gated
    /// layers, else None.
    fn split_gate(&self, be: &B, qf: B::Tensor) -> R<(B::Tensor, Option<B::Tensor>)> {
        if !self.gated {
            return Ok((qf, None));
        }
        let hd = self.params.head_dim;
        let mut parts = bk!(be.split_heads(&qf, self.params.n_heads, &[hd, hd]))?;
        let g = parts.pop();
        Ok((parts.pop().expect("two parts"), g))
    }

    /// [`Self::attend`] for a step of several sequences (`caches[j]`: sequence j's) from the
    /// q/k/v projections of all its rows: the attention input and the attention over the step
    /// where the backend runs them so ([`SeqSteps::attn_prep`], [`SeqSteps::attention`]), else
    /// the layer per sequence.
    pub fn attend_seqs(
        &self,
        be: &B,
        (qf, k, v): (B::Tensor, B::Tensor, B::Tensor),
        caches: &mut [&mut B::KvCache],
        seqs: &SeqSteps<'_, B>,
    ) -> R<B::Tensor> {
        let Some(eps) = self.prep_eps() else {
            return seqs.each(be, vec![qf, k, v], |j, t, step| {
                let [q, k, v]: [B::Tensor; 3] = t
                    .try_into()
                    .map_err(|_| ModelError::Other("q, k and v of a sequence".into()))?;
                let c = caches
                    .get_mut(j)
                    .ok_or_else(|| ModelError::Other(format!("no KV cache for sequence {j}")))?;
                self.attend(be, (q, k, v), c, step)
            });
        };
        let (q, gate) = self.split_gate(be, qf)?;
        let q = seqs.attn_prep(be, (&q, &k, &v), caches, &self.prep(eps))?;
        let refs: Vec<&B::KvCache> = caches.iter().map(|c| &**c).collect();
        let a = seqs.attention(be, q, &refs, &self.params)?;
        match gate {
            Some(g) => bk!(be.sigmoid_gate(&a, &g)),
            None => Ok(a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Ops, Runtime};
    use crate::ops::qdot::random_weights;
    use crate::quant::GgmlType;
    use crate::weights::{Scales, TensorFormat, TensorRef};
    use rand::{Rng, SeedableRng};

    fn tref<'a>(name: &str, ty: GgmlType, rows: usize, cols: usize, d: &'a [u8]) -> TensorRef<'a> {
        TensorRef {
            name: name.into(),
            shape: vec![rows, cols],
            format: TensorFormat::Ggml(ty),
            data: d,
            scales: Scales::default(),
        }
    }

    /// A Q4_K_M layer's q / k (Q4_K) and v (Q6_K): q|k fused apart from v at inputs of
    /// QK_FUSE_MIN_COLS, the same projections as three separate ones; narrower inputs keep three.
    #[test]
    fn qk_fused_apart_from_v_gives_the_three_projections() {
        let be = CpuBackend::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for (cols, fused) in [(QK_FUSE_MIN_COLS, true), (QK_FUSE_MIN_COLS / 2, false)] {
            let wq = random_weights(GgmlType::Q4K, 64, cols, &mut rng).unwrap();
            let wk = random_weights(GgmlType::Q4K, 32, cols, &mut rng).unwrap();
            let wv = random_weights(GgmlType::Q6K, 32, cols, &mut rng).unwrap();
            let q = tref("q", GgmlType::Q4K, 64, cols, &wq);
            let k = tref("k", GgmlType::Q4K, 32, cols, &wk);
            let v = tref("v", GgmlType::Q6K, 32, cols, &wv);
            let qkv = Qkv::load(&be, &q, &k, &v).unwrap();
            assert_eq!(matches!(qkv, Qkv::QkFused(_, [64, 32], _)), fused);
            assert_eq!(qkv.weights().len(), if fused { 2 } else { 3 });
            let xs: Vec<f32> = (0..2 * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
            let x = be.tensor(&xs, 2, cols).unwrap();
            let (yq, yk, yv) = qkv.forward(&be, &x).unwrap();
            for (y, w, rows) in [(yq, &q, 64), (yk, &k, 32), (yv, &v, 32)] {
                let want = be.linear(&x, &be.upload(w).unwrap()).unwrap();
                assert_eq!(be.dims(&y), (2, rows));
                assert_eq!(be.to_host(&y).unwrap(), be.to_host(&want).unwrap());
            }
        }
    }
}
