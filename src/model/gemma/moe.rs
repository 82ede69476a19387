//! Gemma 4's mixture-of-experts block (beside the dense MLP in MoE layers).
//!
//! Router (HF `Gemma4TextRouter`): `logits = proj(rms_norm(x) * scale * hidden^-0.5)`, softmax
//! over all experts, top-k, renormalise the k probabilities, then multiply each by the chosen
//! expert's `per_expert_scale`. Experts are GeGLU with a packed `gate_up_proj` `[E, 2I, H]`
//! (gate rows first) and `down_proj` `[E, H, I]`.
//!
//! The per-expert scale after renormalisation has no place in `Backend::moe`, so routing runs on
//! the host here and each selected expert runs as ordinary `linear` calls over the rows routed to
//! it; every expert is uploaded as its own `[I, H]` / `[H, I]` weights (a slice of the bank, no
//! copy beyond what `upload` makes). Clear, and exact; a fused GPU path would want a `moe` op that
//! takes the per-expert scale.

use super::spec::MoeSpec;
use super::weights::{layer_name, me, slice_rows, Loader};
use crate::backend::{Activation, Backend, Norm};
use crate::model::ModelError;

/// Softmax over all `e` experts, top-k (highest first; the lower index wins a tie, as
/// torch.topk does), renormalise the k probabilities, multiply by the expert's scale.
pub fn route_rows(logits: &[f32], e: usize, k: usize, scale: &[f32]) -> Vec<Vec<(usize, f32)>> {
    logits
        .chunks_exact(e)
        .map(|row| {
            let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let ex: Vec<f32> = row.iter().map(|v| (v - m).exp()).collect();
            let z: f32 = ex.iter().sum();
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| {
                ex[b]
                    .partial_cmp(&ex[a])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(&b))
            });
            idx.truncate(k);
            let sel: f32 = idx.iter().map(|&i| ex[i] / z).sum();
            idx.into_iter()
                .map(|i| (i, ex[i] / z / sel * scale[i]))
                .collect()
        })
        .collect()
}

pub struct Expert<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

pub struct MoeBlock<B: Backend> {
    pub spec: MoeSpec,
    /// `[E, hidden]`
    pub router: B::Weight,
    /// `router.scale * hidden^-0.5`, `[1, hidden]`
    pub router_scale: B::Tensor,
    /// Multiplier on each expert's routing weight.
    pub expert_scale: Vec<f32>,
    pub experts: Vec<Expert<B>>,
    pub pre_norm_2: B::Tensor,
    pub post_norm_1: B::Tensor,
    pub post_norm_2: B::Tensor,
}

impl<B: Backend> MoeBlock<B> {
    pub fn load(
        ld: &Loader<'_, B>,
        i: usize,
        hidden: usize,
        spec: MoeSpec,
    ) -> Result<Self, ModelError> {
        let e = spec.n_experts;
        let name = |k: &str| layer_name(&ld.naming, i, k);
        let router = ld.layer_matrix(i, "router", e, hidden)?;
        let rs = ld.host_vector(&name("router_scale"), hidden)?;
        let f = (hidden as f32).powf(-0.5);
        let rs: Vec<f32> = rs.iter().map(|v| v * f).collect();
        let router_scale = ld.backend.tensor(&rs, 1, hidden).map_err(me)?;
        let expert_scale = if ld.has_layer(i, "expert_scale") {
            ld.host_vector(&name("expert_scale"), e)?
        } else {
            vec![1.0; e]
        };
        let down = ld.tensor_ref(&name("down_exps"))?;
        if down.shape.len() != 3 || down.shape[0] != e || down.shape[1] != hidden {
            return Err(ModelError::Other(format!(
                "tensor {}: shape {:?}",
                down.name, down.shape
            )));
        }
        let inter = down.shape[2];
        let packed = ld.has_layer(i, "gate_up_exps");
        let (gu, g, u) = if packed {
            (Some(ld.tensor_ref(&name("gate_up_exps"))?), None, None)
        } else {
            (
                None,
                Some(ld.tensor_ref(&name("gate_exps"))?),
                Some(ld.tensor_ref(&name("up_exps"))?),
            )
        };
        for t in [&gu, &g, &u].into_iter().flatten() {
            let rows = if packed { 2 * inter } else { inter };
            if t.shape != [e, rows, hidden] {
                return Err(ModelError::Other(format!(
                    "tensor {}: shape {:?}",
                    t.name, t.shape
                )));
            }
        }
        let up_load = |t: &crate::weights::TensorRef<'_>| ld.backend.upload(t).map_err(me);
        let mut experts = Vec::with_capacity(e);
        for x in 0..e {
            let (gate, up) = match (&gu, &g, &u) {
                (Some(gu), _, _) => (
                    slice_rows(gu, x * 2 * inter, inter)?,
                    slice_rows(gu, x * 2 * inter + inter, inter)?,
                ),
                (None, Some(g), Some(u)) => (
                    slice_rows(g, x * inter, inter)?,
                    slice_rows(u, x * inter, inter)?,
                ),
                _ => unreachable!("one of the two expert layouts was loaded above"),
            };
            let dn = slice_rows(&down, x * hidden, hidden)?;
            experts.push(Expert {
                gate: up_load(&gate)?,
                up: up_load(&up)?,
                down: up_load(&dn)?,
            });
        }
        Ok(MoeBlock {
            spec,
            router,
            router_scale,
            expert_scale,
            experts,
            pre_norm_2: ld.layer_vector(i, "pre_ffn_norm_2", hidden)?,
            post_norm_1: ld.layer_vector(i, "post_ffn_norm_1", hidden)?,
            post_norm_2: ld.layer_vector(i, "post_ffn_norm_2", hidden)?,
        })
    }

    /// Routing weights per token: `(expert, weight)` pairs, k per row of `logits` (`[n, E]`).
    pub fn route(&self, logits: &[f32]) -> Vec<Vec<(usize, f32)>> {
        route_rows(
            logits,
            self.spec.n_experts,
            self.spec.top_k,
            &self.expert_scale,
        )
    }

    /// The expert half of the block for `x` (the FFN input residual, `[n, hidden]`); returns
    /// `post_norm_2(experts(pre_norm_2(x)))`. `norm` builds the norm form of the checkpoint.
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        eps: f32,
        norm: impl Fn(&B::Tensor) -> Norm<'_, B::Tensor>,
    ) -> Result<B::Tensor, ModelError> {
        let (n, hidden) = be.dims(x);
        let rn = be.rms_norm(x, Norm::None, eps, hidden).map_err(me)?;
        let rn = be.mul(&rn, &self.router_scale).map_err(me)?;
        let logits = be
            .to_host(&be.linear(&rn, &self.router).map_err(me)?)
            .map_err(me)?;
        let routes = self.route(&logits);

        let h2 = be
            .rms_norm(x, norm(&self.pre_norm_2), eps, hidden)
            .map_err(me)?;
        let h2 = be.to_host(&h2).map_err(me)?;
        let mut out = vec![0f32; n * hidden];
        for (e, ex) in self.experts.iter().enumerate() {
            let rows: Vec<(usize, f32)> = routes
                .iter()
                .enumerate()
                .filter_map(|(t, r)| r.iter().find(|(i, _)| *i == e).map(|&(_, w)| (t, w)))
                .collect();
            if rows.is_empty() {
                continue;
            }
            let mut xe = Vec::with_capacity(rows.len() * hidden);
            for &(t, _) in &rows {
                xe.extend_from_slice(&h2[t * hidden..(t + 1) * hidden]);
            }
            let xe = be.tensor(&xe, rows.len(), hidden).map_err(me)?;
            let g = be.linear(&xe, &ex.gate).map_err(me)?;
            let u = be.linear(&xe, &ex.up).map_err(me)?;
            let a = be.glu(&g, &u, Activation::GeluTanh).map_err(me)?;
            let d = be
                .to_host(&be.linear(&a, &ex.down).map_err(me)?)
                .map_err(me)?;
            for (r, &(t, w)) in rows.iter().enumerate() {
                for c in 0..hidden {
                    out[t * hidden + c] += w * d[r * hidden + c];
                }
            }
        }
        let out = be.tensor(&out, n, hidden).map_err(me)?;
        be.rms_norm(&out, norm(&self.post_norm_2), eps, hidden)
            .map_err(me)
    }
}

#[cfg(test)]
mod tests {
    /// The routing rule alone (softmax over all experts, top-k, renormalise, per-expert scale),
    /// checked on numbers worked by hand.
    #[test]
    fn routing_weights() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), f32::NEG_INFINITY];
        // probabilities 1/6, 2/6, 3/6, 0 -> top-2 = experts 2, 1 -> renormalised 3/5, 2/5
        let scale = [1.0f32, 10.0, 0.5, 1.0];
        let r = super::route_rows(&logits, 4, 2, &scale);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0][0].0, 2);
        assert!((r[0][0].1 - 0.6 * 0.5).abs() < 1e-6);
        assert_eq!(r[0][1].0, 1);
        assert!((r[0][1].1 - 0.4 * 10.0).abs() < 1e-6);
    }
}
