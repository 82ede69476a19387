//! `Fused::attn_prep_seqs` and `Fused::attention_seqs` on the CUDA backend: a layer of a step of
//! several sequences whose caches are slots of the KV arena (`ops/attention/arena.rs`) writes
//! every sequence's K and V in one `attn_prep` launch (each row's first page from its
//! sequence's slot) and attends every sequence's query row in one `attn_decode` launch (a block
//! table row per sequence). Anything else (caches of their own, of other layers or arenas,
//! sequences of several rows for the attention) returns None: the caller runs the one-sequence
//! ops per sequence.

use super::CudaBackend;
use crate::backend::cuda::ops::attention::arena::CacheSlot;
use crate::backend::cuda::ops::attention::cache::GpuKvCache;
use crate::backend::cuda::ops::attention::kv::{check_attention, check_kv_positions, kv_quant};
use crate::backend::cuda::ops::attention::prep::RowPages;
use crate::backend::cuda::ops::elementwise::rows::{attn_prep_rows_suffix, PREFILL_MIN_ROWS};
use crate::backend::cuda::runtime::types::GpuTensor;
use crate::backend::{AttnParams, AttnPrep, BackendError, Result, StepOf};
use crate::kernels::{BatchBucket, Op};

fn shape(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// The slot of the first cache and every cache's slot number, where all of `caches` are one
/// layer's caches in one arena (one launch over that layer's base addresses them all).
fn one_layer<'c>(
    mut caches: impl Iterator<Item = &'c GpuKvCache>,
) -> Option<(CacheSlot, Vec<usize>)> {
    let first = caches.next()?.slot()?.clone();
    let mut slots = vec![first.slot()];
    for c in caches {
        let s = c.slot().filter(|s| s.same_layer(&first))?;
        slots.push(s.slot());
    }
    Some((first, slots))
}

impl CudaBackend {
    /// See [`crate::backend::Fused::attn_prep_seqs`].
    pub(super) fn attn_prep_seqs_impl(
        &self,
        q: &GpuTensor,
        k: &GpuTensor,
        v: &GpuTensor,
        caches: &mut [&mut GpuKvCache],
        step: &StepOf<Self>,
        p: &AttnPrep<'_, GpuTensor>,
    ) -> Result<Option<GpuTensor>> {
        const OP: &str = "attn_prep";
        let Some((first, slots)) = one_layer(caches.iter().map(|c| &**c)) else {
            return Ok(None);
        };
        if q.rows == 0 || !self.prep_fits(q, k, v, caches[0], p)? {
            return Ok(None);
        }
        let plan = step.plan();
        let seqs = plan.seqs();
        if seqs.len() != caches.len() || plan.rows() != q.rows {
            return Err(shape(
                OP,
                format!(
                    "{} caches, {} rows for a step of {} sequences of {} rows",
                    caches.len(),
                    q.rows,
                    seqs.len(),
                    plan.rows()
                ),
            ));
        }
        for (s, c) in seqs.iter().zip(caches.iter()) {
            check_kv_positions(c, s.pos0, s.rows)?;
        }
        let kind = first.kind();
        let per_seq: Vec<(usize, usize)> =
            slots.iter().zip(seqs).map(|(&s, q)| (s, q.rows)).collect();
        let (pages, max) = kind.row_pages(&self.pool, &per_seq)?;
        let pos = step.dev().positions(OP, q.rows)?;
        let q_out = self.alloc_tensor(q.rows, q.cols)?;
        let (launch, mut bufs) = self.prep_parts((q, k, v), caches[0], p, pos, q_out.ptr())?;
        let (kc, vc, scales) = kind
            .base(first.ordinal(), first.plan().slots())
            .ok_or_else(|| shape(OP, "a cache past the arena".into()))?;
        bufs.k_cache = kc;
        bufs.v_cache = vc;
        bufs.scales = scales;
        bufs.page0 = Some(RowPages { pages, max });
        let quant = kv_quant(kind.kv_type);
        match attn_prep_rows_suffix(p.rope.head_dim).filter(|_| q.rows >= PREFILL_MIN_ROWS) {
            Some(sfx) => {
                let e = self.kern_entry(Op::AttnPrep, quant, sfx)?;
                self.dev
                    .attn_prep_rows_ptr(&e, &launch, &kind.layout, &bufs)?;
            }
            None => {
                let kern = self.kern(Op::AttnPrep, quant, BatchBucket::Any)?;
                self.dev
                    .attn_prep_ptr(&kern, &launch, &kind.layout, &bufs)?;
            }
        }
        for (s, c) in seqs.iter().zip(caches.iter_mut()) {
            c.len = c.len.max(s.pos0 + s.rows);
        }
        Ok(Some(q_out))
    }

    /// See [`crate::backend::Fused::attention_seqs`]: sequences of one row each.
    pub(super) fn attention_seqs_impl(
        &self,
        q: &GpuTensor,
        caches: &[&GpuKvCache],
        step: &StepOf<Self>,
        p: &AttnParams,
    ) -> Result<Option<GpuTensor>> {
        const OP: &str = "attention";
        let Some((first, slots)) = one_layer(caches.iter().copied()) else {
            return Ok(None);
        };
        let plan = step.plan();
        let seqs = plan.seqs();
        if seqs.iter().any(|s| s.rows != 1) {
            return Ok(None);
        }
        let width = p.n_heads * p.head_dim;
        if seqs.len() != caches.len() || q.rows != seqs.len() || q.cols != width {
            return Err(shape(
                OP,
                format!(
                    "q [{}, {}] over {} caches for {} sequences of {} heads x {}",
                    q.rows,
                    q.cols,
                    caches.len(),
                    seqs.len(),
                    p.n_heads,
                    p.head_dim
                ),
            ));
        }
        for (s, c) in seqs.iter().zip(caches) {
            check_attention(c, 1, s.pos0, p)?;
        }
        let pos = step.dev().positions(OP, q.rows)?;
        let buf = self.dev.attention_slots(
            &self.pool,
            q.ptr(),
            first.kind(),
            (first.ordinal(), first.plan().slots()),
            &slots,
            pos,
            p,
        )?;
        Ok(Some(GpuTensor::new(buf, q.rows, width)))
    }
}
