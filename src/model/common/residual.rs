//! The residual stream of a pre-norm decoder (`h = h + branch(norm(h))` per sub-layer), written
//! so that a decoder reads like its block diagram while the backend fuses what it can.
//!
//! A branch's output is not added when it is made: it waits in the stream until the next norm,
//! and the add runs together with that norm (`Fused::add_rms_norm`). Where the branch ends in a
//! projection (o_proj, down) and the next norm feeds projections (q/k/v, gate|up), the
//! projection, the add, the norm and those projections are one request
//! (`Fused::linear_add_rms_norm_then`); a MoE block may take the add and its norm into its
//! router (`Fused::add_rms_norm_moe_routed`). Each of these is a backend op with a plain
//! composition as its default, so which of them run fused is the backend's choice; the stream
//! only asks.

use crate::backend::{Backend, NormNext};
use crate::bk;
use crate::model::ModelError;

use super::blocks::{AttentionLayer, Dense, GateUp, MoeBlock, NormW};
use super::seqs::SeqSteps;

type R<T> = Result<T, ModelError>;

/// What the residual stream still has to add.
enum Pending<'w, B: Backend> {
    /// A branch output.
    Y(B::Tensor),
    /// A branch's last input and its output projection: `x w^T` is the branch output.
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

/// The residual stream `h` and the branch output not yet added to it.
pub struct Residual<'w, B: Backend> {
    h: B::Tensor,
    pending: Option<Pending<'w, B>>,
}

impl<'w, B: Backend> Residual<'w, B> {
    /// The stream at the embedded input rows.
    pub fn new(h: B::Tensor) -> Self {
        Residual { h, pending: None }
    }

    /// Add a branch's output `y` (at the next norm).
    pub fn add(&mut self, y: B::Tensor) {
        self.pending = Some(Pending::Y(y));
    }

    /// Add a branch's output `x w^T` (its output projection runs with the next norm).
    pub fn add_projected(&mut self, x: B::Tensor, w: &'w B::Weight) {
        self.pending = Some(Pending::Proj(x, w));
    }

    /// `norm(h)` after the pending add.
    pub fn norm(&mut self, be: &B, norm: &NormW<B>) -> R<B::Tensor> {
        match self.pending.take() {
            None => norm.apply(be, &self.h),
            Some(p) => {
                let y = p.output(be)?;
                let (s, x) = norm.add_apply(be, &self.h, &y)?;
                self.h = s;
                Ok(x)
            }
        }
    }

    /// The pending add, `norm` and `next` on the normed rows as one request: the outputs of
    /// `next`.
    fn norm_then(
        &mut self,
        be: &B,
        norm: &NormW<B>,
        (x, w): (B::Tensor, &B::Weight),
        next: &NormNext<'_, B::Weight>,
    ) -> R<Vec<B::Tensor>> {
        let (s, outs) = norm.linear_add_then(be, (&x, w), &self.h, next)?;
        self.h = s;
        Ok(outs)
    }

    /// An attention sub-layer from the stream: `norm`, the q/k/v projections, the attention
    /// input (q/k norms, RoPE, the cache write) and the attention; returns the input of `o_proj`
    /// (the caller adds it with [`Self::add_projected`]).
    pub fn attend(
        &mut self,
        be: &B,
        norm: &NormW<B>,
        a: &AttentionLayer<B>,
        caches: &mut [&mut B::KvCache],
        seqs: &SeqSteps<'_, B>,
    ) -> R<B::Tensor> {
        let step = seqs.step;
        if seqs.many() || caches.len() != 1 {
            // several sequences: q, k and v over every row, then each sequence's attention over
            // its own cache
            let x = self.norm(be, norm)?;
            return a.attend_seqs(be, a.qkv.forward(be, &x)?, caches, seqs);
        }
        let cache = &mut *caches[0];
        // The pending o_proj / down, the add, the norm and q/k/v as one request, unless q/k/v
        // could instead join the attention input (`Fused::linear_attn_prep`) and the backend
        // computes the norm as its composition would (then the projection, the add and the
        // norm run as their ops and q/k/v goes with the attention input).
        if let Some(Pending::Proj(x, w)) = self.pending.take_if(|p| matches!(p, Pending::Proj(..)))
        {
            let ws = a.qkv.weights();
            let next = NormNext::Linear(&ws);
            if !a.may_fuse_prep() || bk!(be.defers_norm(w, &next))? {
                let outs = self.norm_then(be, norm, (x, w), &next)?;
                return a.attend(be, a.qkv.split(be, outs)?, cache, step);
            }
            self.pending = Some(Pending::Proj(x, w));
        }
        let x = self.norm(be, norm)?;
        match a.attend_fused(be, &x, cache, step)? {
            Some(out) => Ok(out),
            None => a.attend(be, a.qkv.forward(be, &x)?, cache, step),
        }
    }

    /// A gated MLP's hidden rows from the stream: `act(gate n) * up n` for `n = norm(h)`; the
    /// caller adds `down` with [`Self::add_projected`].
    pub fn gated(&mut self, be: &B, norm: &NormW<B>, d: &Dense<B>) -> R<B::Tensor> {
        let Some(Pending::Proj(x, w)) = self.pending.take_if(|p| matches!(p, Pending::Proj(..)))
        else {
            let n = self.norm(be, norm)?;
            return d.gate_up.forward(be, &n, d.act);
        };
        let next = match &d.gate_up {
            GateUp::Fused(gu) => NormNext::Glu(gu, d.act),
            GateUp::Split { gate, up } => NormNext::Linear(&[gate, up]),
        };
        let mut outs = self.norm_then(be, norm, (x, w), &next)?;
        match (&next, outs.len()) {
            (NormNext::Glu(..), 1) => Ok(outs.pop().expect("one output")),
            (NormNext::Linear(_), 2) => {
                let u = outs.pop().expect("two outputs");
                let g = outs.pop().expect("two outputs");
                bk!(be.glu(&g, &u, d.act))
            }
            (_, n) => Err(ModelError::Other(format!(
                "{n} outputs of the gate/up projections"
            ))),
        }
    }

    /// A mixture-of-experts sub-layer from the stream: the block's output for `norm(h)` (the
    /// caller adds it with [`Self::add`]). The add and the norm go into the block's router where
    /// the backend fuses them.
    pub fn moe(&mut self, be: &B, norm: &NormW<B>, moe: &MoeBlock<B>) -> R<B::Tensor> {
        if let Some(p) = self.pending.take() {
            let y = p.output(be)?;
            if let Some((s, out)) = moe.add_norm_forward(be, norm, &self.h, &y)? {
                self.h = s;
                return Ok(out);
            }
            self.pending = Some(Pending::Y(y));
        }
        let x = self.norm(be, norm)?;
        moe.forward(be, &x)
    }

    /// The rows that reach the LM head: `norm(h)` after the pending add, of the last row of each
    /// sequence unless the step asks for every row; None for a step that wants no logits.
    pub fn finish(self, be: &B, norm: &NormW<B>, seqs: &SeqSteps<'_, B>) -> R<Option<B::Tensor>> {
        let rows = seqs.step.plan().logits();
        // rows are independent here: selecting rows of h and y first equals selecting their sum
        let Some(h) = seqs.logit_rows(be, self.h, rows)? else {
            return Ok(None);
        };
        let pending = match self.pending.map(|p| p.output(be)).transpose()? {
            Some(y) => seqs.logit_rows(be, y, rows)?,
            None => None,
        };
        Ok(Some(match pending {
            Some(y) => norm.add_apply(be, &h, &y)?.1,
            None => norm.apply(be, &h)?,
        }))
    }
}
