//! A step of several sequences as the decoders run it. Every op of a layer runs once over all
//! the step's rows (one GEMM reads each weight once for every sequence), except the ones that
//! read or write one sequence's own state: the KV cache write and attention, the recurrent
//! state of a Gated DeltaNet layer. Those run per sequence over its rows, with the sequence's
//! rows as a step of their own ([`SeqSteps`], made once per pass), and their outputs are stacked
//! back in the step's row order.
//!
//! A step of one sequence has no parts: the decoders take their one-sequence path (fused ops,
//! recorded CUDA graphs), unchanged.

use crate::backend::{AttnParams, AttnPrep, Backend, LogitRows, StepOf, StepPlan};
use crate::bk;
use crate::model::ModelError;

type R<T> = Result<T, ModelError>;

/// A step and, when it holds several sequences, each of them as a step of its own.
pub struct SeqSteps<'s, B: Backend> {
    pub step: &'s StepOf<B>,
    /// One step per sequence, in the step's order, made at the first op that runs per sequence
    /// (on CUDA one small upload per sequence; none where every such op runs over the step).
    parts: std::cell::OnceCell<Vec<StepOf<B>>>,
    /// The leading one-row sequences as a step of their own (`decode_step`).
    decodes: std::cell::OnceCell<StepOf<B>>,
}

impl<'s, B: Backend> SeqSteps<'s, B> {
    /// The sequences of `step` (their own steps are made when first needed, once per pass).
    pub fn new(_be: &B, step: &'s StepOf<B>) -> R<Self> {
        Ok(SeqSteps {
            step,
            parts: std::cell::OnceCell::new(),
            decodes: std::cell::OnceCell::new(),
        })
    }

    /// Each sequence as a step of its own.
    fn parts(&self, be: &B) -> R<&[StepOf<B>]> {
        if let Some(p) = self.parts.get() {
            return Ok(p);
        }
        let plan = self.step.plan();
        let ids = bk!(plan.host_ids("step"))?;
        let mut parts = Vec::with_capacity(plan.seqs().len());
        for s in plan.seqs() {
            let p = bk!(StepPlan::single(
                &ids[s.row0..s.row0 + s.rows],
                s.pos0,
                LogitRows::All
            ))?;
            parts.push(bk!(be.step(p))?);
        }
        Ok(self.parts.get_or_init(|| parts))
    }

    /// Whether the step holds several sequences (then ops with per-sequence state run per
    /// sequence, or over the step where the backend addresses every sequence's state at once).
    pub fn many(&self) -> bool {
        self.count() > 1
    }

    /// Sequences in the step.
    pub fn count(&self) -> usize {
        self.step.plan().seqs().len()
    }

    /// `f(j, rows of xs that are sequence j's, sequence j's step)` for each sequence, the
    /// outputs stacked by rows in the step's order. On a one-sequence step `f` gets the tensors
    /// whole and the step itself.
    pub fn each(
        &self,
        be: &B,
        xs: Vec<B::Tensor>,
        mut f: impl FnMut(usize, Vec<B::Tensor>, &StepOf<B>) -> R<B::Tensor>,
    ) -> R<B::Tensor> {
        if !self.many() {
            return f(0, xs, self.step);
        }
        let refs: Vec<&B::Tensor> = xs.iter().collect();
        self.each_part(be, &refs, f)
    }

    /// [`Self::each`] of a step of several sequences, the tensors borrowed.
    fn each_part(
        &self,
        be: &B,
        xs: &[&B::Tensor],
        mut f: impl FnMut(usize, Vec<B::Tensor>, &StepOf<B>) -> R<B::Tensor>,
    ) -> R<B::Tensor> {
        let parts = self.parts(be)?;
        let mut outs = Vec::with_capacity(parts.len());
        for (j, (s, part)) in self.step.plan().seqs().iter().zip(parts).enumerate() {
            let rows = xs
                .iter()
                .map(|x| bk!(be.slice_rows(x, s.row0, s.rows)))
                .collect::<R<Vec<_>>>()?;
            outs.push(f(j, rows, part)?);
        }
        let refs: Vec<&B::Tensor> = outs.iter().collect();
        bk!(be.concat_rows(&refs))
    }

    /// `n` caches, one per sequence, or an error naming `what`.
    fn check_caches(&self, n: usize, what: &str) -> R<()> {
        if n == self.count() {
            return Ok(());
        }
        Err(ModelError::Other(format!(
            "{n} {what} caches for a step of {} sequences",
            self.count()
        )))
    }

    /// The attention input of every row ([`crate::backend::Fused::attn_prep`]: q/k norms, RoPE,
    /// K and V into the row's own sequence's cache, `caches[j]` sequence j's): one op over the
    /// step where the backend has it, else per sequence. Returns the rotated q of every row.
    pub fn attn_prep(
        &self,
        be: &B,
        (q, k, v): (&B::Tensor, &B::Tensor, &B::Tensor),
        caches: &mut [&mut B::KvCache],
        p: &AttnPrep<'_, B::Tensor>,
    ) -> R<B::Tensor> {
        self.check_caches(caches.len(), "attn_prep")?;
        if !self.many() {
            return bk!(be.attn_prep(q, k, v, &mut *caches[0], self.step, p));
        }
        if let Some(q) = bk!(be.attn_prep_seqs(q, k, v, caches, self.step, p))? {
            return Ok(q);
        }
        self.each_part(be, &[q, k, v], |j, t, st| {
            bk!(be.attn_prep(&t[0], &t[1], &t[2], &mut *caches[j], st, p))
        })
    }

    /// Attention of every row of `q` over its own sequence's cache (`caches[j]` sequence j's):
    /// one op over the step where the backend has it, else per sequence.
    pub fn attention(
        &self,
        be: &B,
        q: B::Tensor,
        caches: &[&B::KvCache],
        p: &AttnParams,
    ) -> R<B::Tensor> {
        self.check_caches(caches.len(), "attention")?;
        if !self.many() {
            return bk!(be.attention(&q, caches[0], self.step, p));
        }
        if let Some(a) = bk!(be.attention_seqs(&q, caches, self.step, p))? {
            return Ok(a);
        }
        // the leading one-row sequences (decodes: the scheduler puts running sequences first)
        // over the step where the backend takes them, the others per sequence
        let k = self.decode_prefix();
        if k >= 2 && k < self.count() {
            let (dec, n) = self.decode_step(be)?;
            let qd = bk!(be.slice_rows(&q, 0, n))?;
            if let Some(a) = bk!(be.attention_seqs(&qd, &caches[..k], dec, p))? {
                let parts = self.parts(be)?;
                let mut outs = vec![a];
                for (j, s) in self.step.plan().seqs().iter().enumerate().skip(k) {
                    let qj = bk!(be.slice_rows(&q, s.row0, s.rows))?;
                    outs.push(bk!(be.attention(&qj, caches[j], &parts[j], p))?);
                }
                let refs: Vec<&B::Tensor> = outs.iter().collect();
                return bk!(be.concat_rows(&refs));
            }
        }
        self.each(be, vec![q], |j, t, st| {
            bk!(be.attention(&t[0], caches[j], st, p))
        })
    }

    /// How many of the step's sequences, from the first, have one row each.
    fn decode_prefix(&self) -> usize {
        self.step
            .plan()
            .seqs()
            .iter()
            .take_while(|s| s.rows == 1)
            .count()
    }

    /// The leading one-row sequences ([`Self::decode_prefix`]) as a step of their own, made
    /// once per pass, and its rows.
    fn decode_step(&self, be: &B) -> R<(&StepOf<B>, usize)> {
        let k = self.decode_prefix();
        if let Some(d) = self.decodes.get() {
            return Ok((d, k));
        }
        let plan = self.step.plan();
        let ids = bk!(plan.host_ids("step"))?;
        let seqs: Vec<(&[u32], usize)> = plan.seqs()[..k]
            .iter()
            .map(|s| (&ids[s.row0..s.row0 + 1], s.pos0))
            .collect();
        let d = bk!(be.step(bk!(StepPlan::batch(&seqs, LogitRows::All))?))?;
        Ok((self.decodes.get_or_init(|| d), k))
    }

    /// The rows of `x` (one per step row) that reach the LM head for `rows`: all of them, or the
    /// last of each sequence; None for [`LogitRows::None`]. `x` itself where that is every row.
    pub fn logit_rows(&self, be: &B, x: B::Tensor, rows: LogitRows) -> R<Option<B::Tensor>> {
        let plan = self.step.plan();
        let n = be.dims(&x).0;
        match rows {
            LogitRows::None => Ok(None),
            LogitRows::All => Ok(Some(x)),
            LogitRows::Last if n == plan.seqs().len() => Ok(Some(x)),
            LogitRows::Last => {
                let last = plan
                    .seqs()
                    .iter()
                    .map(|s| bk!(be.slice_rows(&x, s.row0 + s.rows - 1, 1)))
                    .collect::<R<Vec<_>>>()?;
                if last.len() == 1 {
                    return Ok(last.into_iter().next());
                }
                let refs: Vec<&B::Tensor> = last.iter().collect();
                Ok(Some(bk!(be.concat_rows(&refs))?))
            }
        }
    }
}

/// Each state's `pick` (a layer's cache, say), in the step's sequence order; an error naming
/// `what` where a state does not have one.
pub fn pick_each<'a, S, T: 'a>(
    states: &'a mut [&mut S],
    mut pick: impl FnMut(&'a mut S) -> Option<&'a mut T>,
    what: &str,
) -> R<Vec<&'a mut T>> {
    states
        .iter_mut()
        .map(|s| pick(&mut **s).ok_or_else(|| ModelError::Other(format!("no {what}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::backend::{Ops, Runtime};

    #[test]
    fn parts_follow_the_sequences() {
        let be = CpuBackend::new();
        let plan = StepPlan::batch(&[(&[1, 2, 3], 10), (&[4], 0)], LogitRows::Last).unwrap();
        let step = be.step(plan).unwrap();
        let s = SeqSteps::new(&be, &step).unwrap();
        assert!(s.many());
        assert_eq!(s.count(), 2);
        let x = be
            .tensor(&(0..8).map(|v| v as f32).collect::<Vec<_>>(), 4, 2)
            .unwrap();
        // each sequence sees its rows and its positions; outputs come back in row order
        let mut seen = Vec::new();
        let y = s
            .each(&be, vec![x.clone()], |j, xs, st| {
                seen.push((j, be.dims(&xs[0]).0, st.plan().positions()));
                bk!(be.scale(&xs[0], (j + 1) as f32))
            })
            .map_err(|e| e.to_string())
            .unwrap();
        assert_eq!(seen, vec![(0, 3, vec![10, 11, 12]), (1, 1, vec![0])]);
        assert_eq!(y.data, vec![0., 1., 2., 3., 4., 5., 12., 14.]);
        let last = s.logit_rows(&be, x, LogitRows::Last).unwrap().unwrap();
        assert_eq!(last.data, vec![4., 5., 6., 7.]);
    }

    #[test]
    fn one_sequence_has_no_parts() {
        let be = CpuBackend::new();
        let step = be
            .step(StepPlan::single(&[1, 2], 0, LogitRows::Last).unwrap())
            .unwrap();
        let s = SeqSteps::new(&be, &step).unwrap();
        assert!(!s.many());
        let x = be.tensor(&[1., 2., 3., 4.], 2, 2).unwrap();
        let last = s.logit_rows(&be, x, LogitRows::Last).unwrap().unwrap();
        assert_eq!(last.data, vec![3., 4.]);
    }
}
