//! Decoder building blocks over the Backend trait: RMSNorm weights, the gated MLP, the
//! mixture-of-experts block (optionally with a sigmoid-gated shared expert) and a grouped-query
//! attention layer (q/k norms, partial RoPE, optional per-head output gate).

use crate::backend::{Activation, AttnParams, Backend, MoeParams, Norm, Rope};
use crate::bk;
use crate::model::ModelError;

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
    pub fn apply(&self, be: &B, x: &B::Tensor) -> R<B::Tensor> {
        let n = if self.one_plus {
            Norm::OnePlus(&self.w)
        } else {
            Norm::Plain(&self.w)
        };
        bk!(be.rms_norm(x, n, self.eps, self.dim))
    }
}

/// down(act(gate x) * up x).
pub struct Dense<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
    pub act: Activation,
}

impl<B: Backend> Dense<B> {
    pub fn forward(&self, be: &B, x: &B::Tensor) -> R<B::Tensor> {
        let g = bk!(be.linear(x, &self.gate))?;
        let u = bk!(be.linear(x, &self.up))?;
        let h = bk!(be.glu(&g, &u, self.act))?;
        bk!(be.linear(&h, &self.down))
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
    pub fn forward(&self, be: &B, x: &B::Tensor) -> R<B::Tensor> {
        let logits = bk!(be.linear(x, &self.router))?;
        let routed = bk!(be.moe(x, &logits, &self.gate, &self.up, &self.down, &self.params))?;
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
    pub q: B::Weight,
    pub k: B::Weight,
    pub v: B::Weight,
    pub o: B::Weight,
    pub q_norm: Option<NormW<B>>,
    pub k_norm: Option<NormW<B>>,
    pub rope: Rope,
    pub params: AttnParams,
    pub gated: bool,
}

impl<B: Backend> AttentionLayer<B> {
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        cache: &mut B::KvCache,
        pos0: usize,
    ) -> R<B::Tensor> {
        let p = &self.params;
        let hd = p.head_dim;
        let qf = bk!(be.linear(x, &self.q))?;
        let (q, gate) = if self.gated {
            let mut parts = bk!(be.split_heads(&qf, p.n_heads, &[hd, hd]))?;
            let g = parts.pop();
            (parts.pop().expect("two parts"), g)
        } else {
            (qf, None)
        };
        let mut k = bk!(be.linear(x, &self.k))?;
        let v = bk!(be.linear(x, &self.v))?;
        let q = match &self.q_norm {
            Some(n) => n.apply(be, &q)?,
            None => q,
        };
        if let Some(n) = &self.k_norm {
            k = n.apply(be, &k)?;
        }
        let q = bk!(be.rope(&q, p.n_heads, pos0, &self.rope))?;
        let k = bk!(be.rope(&k, p.n_kv_heads, pos0, &self.rope))?;
        bk!(be.kv_write(cache, pos0, &k, &v))?;
        let mut a = bk!(be.attention(&q, cache, pos0, p))?;
        if let Some(g) = gate {
            a = bk!(be.sigmoid_gate(&a, &g))?;
        }
        bk!(be.linear(&a, &self.o))
    }
}
