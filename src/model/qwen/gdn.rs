//! Qwen3.5's Gated DeltaNet token mixer ("linear_attention" layers).
//!
//! Per token: qkv = in_proj_qkv x -> causal depthwise conv (kernel 4) + SiLU -> split q | k | v;
//! q, k L2-normalised per key head, q scaled by 1/sqrt(d_k), both expanded to the value heads;
//! g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); the gated delta rule updates the
//! recurrent state; out = out_proj(RMSNorm(o) * w * SiLU(z)).
//!
//! Key-head sharing differs by layout: HF repeat-interleaves (value head h uses key head
//! h / (n_v / n_k)); llama.cpp's converter re-orders the value heads so that value head h uses
//! key head h % n_k (all value-head tensors are permuted consistently, so nothing else changes).

use crate::backend::{Activation, Backend};
use crate::bk;
use crate::model::common::NormW;
use crate::model::ModelError;

use super::config::GdnDims;

type R<T> = Result<T, ModelError>;

pub struct GdnLayer<B: Backend> {
    pub qkv: B::Weight,
    pub z: B::Weight,
    pub a: B::Weight,
    pub b: B::Weight,
    pub conv: B::Weight,
    pub out: B::Weight,
    /// -exp(A_log), `[1, n_v]`.
    pub neg_a: B::Tensor,
    pub dt_bias: B::Tensor,
    /// The gated output norm (plain weight in both layouts).
    pub norm: NormW<B>,
    pub dims: GdnDims,
    /// GGUF value-head order (key head = h % n_k) instead of HF's (h / ratio).
    pub tiled: bool,
}

/// Per-sequence state of one GDN layer.
pub struct GdnState<B: Backend> {
    /// Last `kernel - 1` conv inputs, `[kernel - 1, conv_dim]`.
    pub conv: B::Tensor,
    /// Recurrent state, `[n_v, d_k * d_v]`.
    pub rec: B::Tensor,
}

impl<B: Backend> GdnLayer<B> {
    pub fn conv_dim(&self) -> usize {
        let d = &self.dims;
        2 * d.n_k_heads * d.k_dim + d.n_v_heads * d.v_dim
    }

    pub fn new_state(&self, be: &B) -> R<GdnState<B>> {
        let d = &self.dims;
        let cd = self.conv_dim();
        let conv = bk!(be.tensor(&vec![0.0; (d.kernel - 1) * cd], d.kernel - 1, cd))?;
        let rec = bk!(be.tensor(
            &vec![0.0; d.n_v_heads * d.k_dim * d.v_dim],
            d.n_v_heads,
            d.k_dim * d.v_dim
        ))?;
        Ok(GdnState { conv, rec })
    }

    /// Expand `[n, n_k * d_k]` to `[n, n_v * d_k]` in this layout's key-head order.
    fn expand(&self, be: &B, t: B::Tensor) -> R<B::Tensor> {
        let d = &self.dims;
        let ratio = d.n_v_heads / d.n_k_heads;
        if ratio == 1 {
            return Ok(t);
        }
        if self.tiled {
            let parts: Vec<&B::Tensor> = std::iter::repeat_n(&t, ratio).collect();
            return bk!(be.concat_cols(&parts));
        }
        let heads = (0..d.n_k_heads)
            .map(|h| bk!(be.slice_cols(&t, h * d.k_dim, d.k_dim)))
            .collect::<R<Vec<_>>>()?;
        let parts: Vec<&B::Tensor> = heads
            .iter()
            .flat_map(|h| std::iter::repeat_n(h, ratio))
            .collect();
        bk!(be.concat_cols(&parts))
    }

    pub fn forward(&self, be: &B, x: &B::Tensor, st: &mut GdnState<B>) -> R<B::Tensor> {
        let d = &self.dims;
        let kd = d.n_k_heads * d.k_dim;
        let vd = d.n_v_heads * d.v_dim;
        let mixed = bk!(be.linear(x, &self.qkv))?;
        let mixed = bk!(be.causal_conv1d_silu(&mixed, &self.conv, &mut st.conv))?;
        let q = bk!(be.slice_cols(&mixed, 0, kd))?;
        let k = bk!(be.slice_cols(&mixed, kd, kd))?;
        let v = bk!(be.slice_cols(&mixed, 2 * kd, vd))?;
        let q = bk!(be.l2_norm(&q, 1e-6, d.k_dim))?;
        let q = bk!(be.scale(&q, 1.0 / (d.k_dim as f32).sqrt()))?;
        let k = bk!(be.l2_norm(&k, 1e-6, d.k_dim))?;
        let q = self.expand(be, q)?;
        let k = self.expand(be, k)?;
        let a = bk!(be.linear(x, &self.a))?;
        let b = bk!(be.linear(x, &self.b))?;
        let (g, beta) = bk!(be.gdn_gates(&a, &b, &self.neg_a, &self.dt_bias))?;
        let o = bk!(be.gated_delta_rule(&q, &k, &v, &g, &beta, &mut st.rec, d.k_dim, d.v_dim))?;
        let o = self.norm.apply(be, &o)?;
        let z = bk!(be.linear(x, &self.z))?;
        let o = bk!(be.glu(&z, &o, Activation::Silu))?;
        bk!(be.linear(&o, &self.out))
    }
}
