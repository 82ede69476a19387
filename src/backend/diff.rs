//! A backend that runs every op on two backends and records how far apart their outputs are:
//! `DiffBackend<R, T>` with `R` the reference (the CPU) and `T` the backend under test. A model
//! loaded on it runs its real op sequence (the fused ops are the test backend's own choices:
//! `defers_norm` and the `Option`-returning fusions ask `T`, and `R` runs their composition), so
//! the first op whose output departs from the reference's is where a deviation starts
//! (`fucina selftest --bisect`).
//!
//! With `resync`, every output of the backend under test is replaced by the reference's values
//! after the comparison, so each record is the op's own (local) error on the reference's inputs,
//! not the error accumulated before it. KV caches are not resynced: a cache holds what each
//! backend wrote from the (resynced) inputs, so its rounding (f16, FP8) shows in the attention
//! that reads it.
//!
//! Metric per output (the golden tests'): `max |t - r| / max |r|`; NaN counts as infinite.

use std::sync::Mutex;

use super::{
    Activation, AttnParams, AttnPrep, Backend, BackendError, Fused, KvShape, MoeParams, Need, Norm,
    NormNext, Ops, PostNorm, RecordedStep, Result, Rope, Runtime, Sampling, Step, StepOf, StepPlan,
};
use crate::sampling::SamplingParams;
use crate::weights::TensorRef;

/// One compared output.
#[derive(Debug, Clone)]
pub struct OpRecord {
    /// Forward pass (one per step made or rewritten), from 0.
    pub pass: usize,
    /// Attention ops completed in this pass before this op (the layer, for attention models).
    pub attn: usize,
    pub op: &'static str,
    /// Which output of a multi-output op.
    pub out: usize,
    pub rows: usize,
    pub cols: usize,
    pub max_abs: f64,
    /// `max |r|`.
    pub max_ref: f64,
}

impl OpRecord {
    /// `max_abs / max_ref` (infinite for NaN).
    pub fn rel(&self) -> f64 {
        if self.max_abs.is_nan() {
            f64::INFINITY
        } else {
            self.max_abs / self.max_ref.max(1e-30)
        }
    }
}

/// An activation on both backends.
pub struct DiffTensor<R: Backend, T: Backend> {
    pub r: R::Tensor,
    pub t: T::Tensor,
}

/// A weight on both backends.
pub struct DiffWeight<R: Backend, T: Backend> {
    pub r: R::Weight,
    pub t: T::Weight,
}

/// A KV cache on both backends.
pub struct DiffKv<R: Backend, T: Backend> {
    pub r: R::KvCache,
    pub t: T::KvCache,
}

/// See the module doc.
pub struct DiffBackend<R: Backend, T: Backend> {
    pub reference: R,
    pub test: T,
    resync: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pass: usize,
    attn: usize,
    /// Outputs compared in the current pass.
    in_pass: usize,
    records: Vec<OpRecord>,
}

type D<R, T> = DiffTensor<R, T>;

fn err_of(t: &[f32], r: &[f32]) -> (f64, f64) {
    let scale = r.iter().fold(0f64, |m, v| m.max((*v as f64).abs()));
    let abs = t.iter().zip(r).fold(0f64, |m, (a, b)| {
        let d = (*a as f64 - *b as f64).abs();
        if d.is_nan() {
            f64::NAN
        } else if m.is_nan() {
            m
        } else {
            m.max(d)
        }
    });
    (abs, scale)
}

fn norm_r<'a, R: Backend, T: Backend>(n: &Norm<'a, D<R, T>>) -> Norm<'a, R::Tensor> {
    match *n {
        Norm::Plain(w) => Norm::Plain(&w.r),
        Norm::OnePlus(w) => Norm::OnePlus(&w.r),
        Norm::None => Norm::None,
    }
}

fn norm_t<'a, R: Backend, T: Backend>(n: &Norm<'a, D<R, T>>) -> Norm<'a, T::Tensor> {
    match *n {
        Norm::Plain(w) => Norm::Plain(&w.t),
        Norm::OnePlus(w) => Norm::OnePlus(&w.t),
        Norm::None => Norm::None,
    }
}

fn prep_r<'a, R: Backend, T: Backend>(p: &AttnPrep<'a, D<R, T>>) -> AttnPrep<'a, R::Tensor> {
    AttnPrep {
        n_heads: p.n_heads,
        n_kv_heads: p.n_kv_heads,
        q_norm: p.q_norm.as_ref().map(norm_r),
        k_norm: p.k_norm.as_ref().map(norm_r),
        v_norm: p.v_norm.as_ref().map(norm_r),
        eps: p.eps,
        rope: p.rope,
    }
}

fn prep_t<'a, R: Backend, T: Backend>(p: &AttnPrep<'a, D<R, T>>) -> AttnPrep<'a, T::Tensor> {
    AttnPrep {
        n_heads: p.n_heads,
        n_kv_heads: p.n_kv_heads,
        q_norm: p.q_norm.as_ref().map(norm_t),
        k_norm: p.k_norm.as_ref().map(norm_t),
        v_norm: p.v_norm.as_ref().map(norm_t),
        eps: p.eps,
        rope: p.rope,
    }
}

/// The two sides of a `NormNext` (the weights of `Linear` collected into the vectors given).
fn next_parts<'a, R: Backend, T: Backend>(
    next: &NormNext<'a, DiffWeight<R, T>>,
    rw: &'a mut Vec<&'a R::Weight>,
    tw: &'a mut Vec<&'a T::Weight>,
) -> (NormNext<'a, R::Weight>, NormNext<'a, T::Weight>) {
    match next {
        NormNext::Glu(w, act) => (NormNext::Glu(&w.r, *act), NormNext::Glu(&w.t, *act)),
        NormNext::Linear(ws) => {
            rw.extend(ws.iter().map(|w| &w.r));
            tw.extend(ws.iter().map(|w| &w.t));
            (
                NormNext::Linear(rw.as_slice()),
                NormNext::Linear(tw.as_slice()),
            )
        }
    }
}

impl<R: Backend, T: Backend> DiffBackend<R, T> {
    pub fn new(reference: R, test: T, resync: bool) -> Self {
        DiffBackend {
            reference,
            test,
            resync,
            state: Mutex::new(State::default()),
        }
    }

    /// The records so far (and forget them).
    pub fn take_records(&self) -> Vec<OpRecord> {
        std::mem::take(&mut self.lock().records)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compare the outputs of `op` (one pair per output) and return them, the test side
    /// replaced by the reference's values under `resync`.
    fn cmp(&self, op: &'static str, outs: Vec<(R::Tensor, T::Tensor)>) -> Result<Vec<D<R, T>>> {
        let mut res = Vec::with_capacity(outs.len());
        for (i, (r, t)) in outs.into_iter().enumerate() {
            let (rows, cols) = self.reference.dims(&r);
            let rh = self.reference.to_host(&r)?;
            let th = self.test.to_host(&t)?;
            let (max_abs, max_ref) = if rh.len() == th.len() {
                err_of(&th, &rh)
            } else {
                (f64::NAN, 0.0)
            };
            {
                let mut s = self.lock();
                let rec = OpRecord {
                    pass: s.pass,
                    attn: s.attn,
                    op,
                    out: i,
                    rows,
                    cols,
                    max_abs,
                    max_ref,
                };
                s.records.push(rec);
                s.in_pass += 1;
            }
            let t = if self.resync {
                self.test.tensor(&rh, rows, cols)?
            } else {
                t
            };
            res.push(DiffTensor { r, t });
        }
        Ok(res)
    }

    fn one(&self, op: &'static str, r: R::Tensor, t: T::Tensor) -> Result<D<R, T>> {
        Ok(self.cmp(op, vec![(r, t)])?.pop().expect("one output"))
    }

    fn two(
        &self,
        op: &'static str,
        a: (R::Tensor, T::Tensor),
        b: (R::Tensor, T::Tensor),
    ) -> Result<(D<R, T>, D<R, T>)> {
        let mut v = self.cmp(op, vec![a, b])?;
        let b = v.pop().expect("two outputs");
        let a = v.pop().expect("two outputs");
        Ok((a, b))
    }

    fn many(&self, op: &'static str, r: Vec<R::Tensor>, t: Vec<T::Tensor>) -> Result<Vec<D<R, T>>> {
        if r.len() != t.len() {
            return Err(BackendError::Shape {
                op,
                detail: format!("{} reference outputs, {} under test", r.len(), t.len()),
            });
        }
        self.cmp(op, r.into_iter().zip(t).collect())
    }

    /// A new forward pass begins (a pass that compared nothing yet, a step made twice for
    /// one pass, is not a new one).
    fn new_pass(&self) {
        let mut s = self.lock();
        if s.in_pass > 0 {
            s.pass += 1;
        }
        s.in_pass = 0;
        s.attn = 0;
    }

    fn attention_done(&self) {
        self.lock().attn += 1;
    }
}

impl<R: Backend, T: Backend> Runtime for DiffBackend<R, T> {
    type Tensor = DiffTensor<R, T>;

    type Weight = DiffWeight<R, T>;

    type KvCache = DiffKv<R, T>;

    type StepData = (StepOf<R>, StepOf<T>);

    fn name(&self) -> &'static str {
        "diff"
    }

    fn lacks(&self, need: Need) -> Option<String> {
        self.reference.lacks(need).or_else(|| self.test.lacks(need))
    }

    fn kv_bytes(&self, elems: usize) -> u64 {
        self.reference.kv_bytes(elems) + self.test.kv_bytes(elems)
    }

    fn free_memory(&self) -> Option<u64> {
        self.test.free_memory()
    }

    fn step(&self, plan: StepPlan) -> Result<StepOf<Self>> {
        self.new_pass();
        let r = self.reference.step(plan.clone())?;
        let t = self.test.step(plan.clone())?;
        Ok(Step::new(plan, (r, t)))
    }

    fn step_set(&self, step: &mut StepOf<Self>, plan: StepPlan) -> Result<()> {
        self.new_pass();
        let (p, (r, t)) = step.parts_mut();
        self.reference.step_set(r, plan.clone())?;
        self.test.step_set(t, plan.clone())?;
        *p = plan;
        Ok(())
    }

    fn record_begin(&self, _step: &StepOf<Self>) -> Result<bool> {
        Ok(false)
    }

    fn record_end(&self, _step: &StepOf<Self>) -> Result<RecordedStep> {
        Err(BackendError::Unsupported {
            op: "record_end",
            backend: "diff",
            detail: "the diff backend runs every op directly".into(),
        })
    }

    fn upload(&self, w: &TensorRef<'_>) -> Result<Self::Weight> {
        Ok(DiffWeight {
            r: self.reference.upload(w)?,
            t: self.test.upload(w)?,
        })
    }

    fn tensor(&self, data: &[f32], rows: usize, cols: usize) -> Result<Self::Tensor> {
        Ok(DiffTensor {
            r: self.reference.tensor(data, rows, cols)?,
            t: self.test.tensor(data, rows, cols)?,
        })
    }

    fn upload_concat(&self, name: &str, parts: &[TensorRef<'_>]) -> Result<Self::Weight> {
        Ok(DiffWeight {
            r: self.reference.upload_concat(name, parts)?,
            t: self.test.upload_concat(name, parts)?,
        })
    }

    /// The test backend's values (what a user of it sees).
    fn to_host(&self, t: &Self::Tensor) -> Result<Vec<f32>> {
        self.test.to_host(&t.t)
    }

    fn dims(&self, t: &Self::Tensor) -> (usize, usize) {
        self.reference.dims(&t.r)
    }

    fn weight_vector(&self, w: &Self::Weight) -> Result<Self::Tensor> {
        Ok(DiffTensor {
            r: self.reference.weight_vector(&w.r)?,
            t: self.test.weight_vector(&w.t)?,
        })
    }

    fn kv_cache(&self, shape: KvShape) -> Result<Self::KvCache> {
        Ok(DiffKv {
            r: self.reference.kv_cache(shape)?,
            t: self.test.kv_cache(shape)?,
        })
    }

    fn kv_truncate(&self, cache: &mut Self::KvCache, len: usize) -> Result<()> {
        self.reference.kv_truncate(&mut cache.r, len)?;
        self.test.kv_truncate(&mut cache.t, len)
    }
}

impl<R: Backend, T: Backend> Ops for DiffBackend<R, T> {
    fn embed(&self, table: &Self::Weight, step: &StepOf<Self>, scale: f32) -> Result<Self::Tensor> {
        let (sr, st) = step.dev();
        let r = self.reference.embed(&table.r, sr, scale)?;
        let t = self.test.embed(&table.t, st, scale)?;
        self.one("embed", r, t)
    }

    fn linear(&self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor> {
        let r = self.reference.linear(&x.r, &w.r)?;
        let t = self.test.linear(&x.t, &w.t)?;
        self.one("linear", r, t)
    }

    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor> {
        let r = self.reference.add(&a.r, &b.r)?;
        let t = self.test.add(&a.t, &b.t)?;
        self.one("add", r, t)
    }

    fn mul(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor> {
        let r = self.reference.mul(&a.r, &b.r)?;
        let t = self.test.mul(&a.t, &b.t)?;
        self.one("mul", r, t)
    }

    fn scale(&self, a: &Self::Tensor, s: f32) -> Result<Self::Tensor> {
        let r = self.reference.scale(&a.r, s)?;
        let t = self.test.scale(&a.t, s)?;
        self.one("scale", r, t)
    }

    fn glu(&self, gate: &Self::Tensor, up: &Self::Tensor, act: Activation) -> Result<Self::Tensor> {
        let r = self.reference.glu(&gate.r, &up.r, act)?;
        let t = self.test.glu(&gate.t, &up.t, act)?;
        self.one("glu", r, t)
    }

    fn sigmoid_gate(&self, x: &Self::Tensor, gate: &Self::Tensor) -> Result<Self::Tensor> {
        let r = self.reference.sigmoid_gate(&x.r, &gate.r)?;
        let t = self.test.sigmoid_gate(&x.t, &gate.t)?;
        self.one("sigmoid_gate", r, t)
    }

    fn softcap(&self, x: &Self::Tensor, cap: f32) -> Result<Self::Tensor> {
        let r = self.reference.softcap(&x.r, cap)?;
        let t = self.test.softcap(&x.t, cap)?;
        self.one("softcap", r, t)
    }

    fn slice_cols(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor> {
        let r = self.reference.slice_cols(&x.r, start, len)?;
        let t = self.test.slice_cols(&x.t, start, len)?;
        self.one("slice_cols", r, t)
    }

    fn slice_rows(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor> {
        let r = self.reference.slice_rows(&x.r, start, len)?;
        let t = self.test.slice_rows(&x.t, start, len)?;
        self.one("slice_rows", r, t)
    }

    fn concat_cols(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor> {
        let rp: Vec<_> = parts.iter().map(|p| &p.r).collect();
        let tp: Vec<_> = parts.iter().map(|p| &p.t).collect();
        let r = self.reference.concat_cols(&rp)?;
        let t = self.test.concat_cols(&tp)?;
        self.one("concat_cols", r, t)
    }

    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Result<Self::Tensor> {
        let rp: Vec<_> = parts.iter().map(|p| &p.r).collect();
        let tp: Vec<_> = parts.iter().map(|p| &p.t).collect();
        let r = self.reference.concat_rows(&rp)?;
        let t = self.test.concat_rows(&tp)?;
        self.one("concat_rows", r, t)
    }

    fn split_heads(
        &self,
        x: &Self::Tensor,
        n_heads: usize,
        sizes: &[usize],
    ) -> Result<Vec<Self::Tensor>> {
        let r = self.reference.split_heads(&x.r, n_heads, sizes)?;
        let t = self.test.split_heads(&x.t, n_heads, sizes)?;
        self.many("split_heads", r, t)
    }

    fn rms_norm(
        &self,
        x: &Self::Tensor,
        w: Norm<'_, Self::Tensor>,
        eps: f32,
        dim: usize,
    ) -> Result<Self::Tensor> {
        let r = self.reference.rms_norm(&x.r, norm_r(&w), eps, dim)?;
        let t = self.test.rms_norm(&x.t, norm_t(&w), eps, dim)?;
        self.one("rms_norm", r, t)
    }

    fn l2_norm(&self, x: &Self::Tensor, eps: f32, dim: usize) -> Result<Self::Tensor> {
        let r = self.reference.l2_norm(&x.r, eps, dim)?;
        let t = self.test.l2_norm(&x.t, eps, dim)?;
        self.one("l2_norm", r, t)
    }

    fn rope(
        &self,
        x: &Self::Tensor,
        n_heads: usize,
        step: &StepOf<Self>,
        rope: &Rope,
    ) -> Result<Self::Tensor> {
        let (sr, st) = step.dev();
        let r = self.reference.rope(&x.r, n_heads, sr, rope)?;
        let t = self.test.rope(&x.t, n_heads, st, rope)?;
        self.one("rope", r, t)
    }

    fn kv_write(
        &self,
        cache: &mut Self::KvCache,
        step: &StepOf<Self>,
        k: &Self::Tensor,
        v: &Self::Tensor,
    ) -> Result<()> {
        let (sr, st) = step.dev();
        self.reference.kv_write(&mut cache.r, sr, &k.r, &v.r)?;
        self.test.kv_write(&mut cache.t, st, &k.t, &v.t)
    }

    fn attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        step: &StepOf<Self>,
        p: &AttnParams,
    ) -> Result<Self::Tensor> {
        let (sr, st) = step.dev();
        let r = self.reference.attention(&q.r, &cache.r, sr, p)?;
        let t = self.test.attention(&q.t, &cache.t, st, p)?;
        let o = self.one("attention", r, t);
        self.attention_done();
        o
    }

    fn moe(
        &self,
        x: &Self::Tensor,
        router_logits: &Self::Tensor,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        p: &MoeParams,
    ) -> Result<Self::Tensor> {
        let r = self
            .reference
            .moe(&x.r, &router_logits.r, &gate.r, &up.r, &down.r, p)?;
        let t = self
            .test
            .moe(&x.t, &router_logits.t, &gate.t, &up.t, &down.t, p)?;
        self.one("moe", r, t)
    }

    fn causal_conv1d_silu(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        state: &mut Self::Tensor,
    ) -> Result<Self::Tensor> {
        let r = self
            .reference
            .causal_conv1d_silu(&x.r, &w.r, &mut state.r)?;
        let t = self.test.causal_conv1d_silu(&x.t, &w.t, &mut state.t)?;
        self.one("causal_conv1d_silu", r, t)
    }

    fn gdn_gates(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        neg_a: &Self::Tensor,
        dt_bias: &Self::Tensor,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let r = self.reference.gdn_gates(&a.r, &b.r, &neg_a.r, &dt_bias.r)?;
        let t = self.test.gdn_gates(&a.t, &b.t, &neg_a.t, &dt_bias.t)?;
        self.two("gdn_gates", (r.0, t.0), (r.1, t.1))
    }

    fn gated_delta_rule(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        g: &Self::Tensor,
        beta: &Self::Tensor,
        state: &mut Self::Tensor,
        dk: usize,
        dv: usize,
    ) -> Result<Self::Tensor> {
        let r = self.reference.gated_delta_rule(
            &q.r,
            &k.r,
            &v.r,
            &g.r,
            &beta.r,
            &mut state.r,
            dk,
            dv,
        )?;
        let t =
            self.test
                .gated_delta_rule(&q.t, &k.t, &v.t, &g.t, &beta.t, &mut state.t, dk, dv)?;
        self.one("gated_delta_rule", r, t)
    }
}

impl<R: Backend, T: Backend> Fused for DiffBackend<R, T> {
    fn glu_fused(&self, x: &Self::Tensor, act: Activation) -> Result<Self::Tensor> {
        let r = self.reference.glu_fused(&x.r, act)?;
        let t = self.test.glu_fused(&x.t, act)?;
        self.one("glu_fused", r, t)
    }

    fn linear_glu(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        act: Activation,
    ) -> Result<Self::Tensor> {
        let r = self.reference.linear_glu(&x.r, &w.r, act)?;
        let t = self.test.linear_glu(&x.t, &w.t, act)?;
        self.one("linear_glu", r, t)
    }

    fn add_rms_norm(
        &self,
        h: &Self::Tensor,
        y: &Self::Tensor,
        w: Norm<'_, Self::Tensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let r = self
            .reference
            .add_rms_norm(&h.r, &y.r, norm_r(&w), eps, dim)?;
        let t = self.test.add_rms_norm(&h.t, &y.t, norm_t(&w), eps, dim)?;
        self.two("add_rms_norm", (r.0, t.0), (r.1, t.1))
    }

    fn linear_add_rms_norm_then(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        h: &Self::Tensor,
        norm: Norm<'_, Self::Tensor>,
        eps: f32,
        next: &NormNext<'_, Self::Weight>,
    ) -> Result<(Self::Tensor, Vec<Self::Tensor>)> {
        let (mut rw, mut tw) = (Vec::new(), Vec::new());
        let (nr, nt) = next_parts(next, &mut rw, &mut tw);
        let (rs, ro) =
            self.reference
                .linear_add_rms_norm_then(&x.r, &w.r, &h.r, norm_r(&norm), eps, &nr)?;
        let (ts, to) =
            self.test
                .linear_add_rms_norm_then(&x.t, &w.t, &h.t, norm_t(&norm), eps, &nt)?;
        let s = self.one("linear_add_rms_norm_then", rs, ts)?;
        Ok((s, self.many("linear_add_rms_norm_then", ro, to)?))
    }

    fn defers_norm(&self, w: &Self::Weight, next: &NormNext<'_, Self::Weight>) -> Result<bool> {
        let (mut rw, mut tw) = (Vec::new(), Vec::new());
        let (_, nt) = next_parts(next, &mut rw, &mut tw);
        self.test.defers_norm(&w.t, &nt)
    }

    fn norm_add_rms_norm(
        &self,
        h: &Self::Tensor,
        y: &Self::Tensor,
        post: &PostNorm<'_, Self::Tensor>,
        w: Norm<'_, Self::Tensor>,
        eps: f32,
        dim: usize,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let pr = PostNorm {
            norm: post.norm.as_ref().map(norm_r),
            scale: post.scale,
        };
        let pt = PostNorm {
            norm: post.norm.as_ref().map(norm_t),
            scale: post.scale,
        };
        let r = self
            .reference
            .norm_add_rms_norm(&h.r, &y.r, &pr, norm_r(&w), eps, dim)?;
        let t = self
            .test
            .norm_add_rms_norm(&h.t, &y.t, &pt, norm_t(&w), eps, dim)?;
        self.two("norm_add_rms_norm", (r.0, t.0), (r.1, t.1))
    }

    fn attn_prep(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        cache: &mut Self::KvCache,
        step: &StepOf<Self>,
        p: &AttnPrep<'_, Self::Tensor>,
    ) -> Result<Self::Tensor> {
        let (sr, st) = step.dev();
        let r = self
            .reference
            .attn_prep(&q.r, &k.r, &v.r, &mut cache.r, sr, &prep_r(p))?;
        let t = self
            .test
            .attn_prep(&q.t, &k.t, &v.t, &mut cache.t, st, &prep_t(p))?;
        self.one("attn_prep", r, t)
    }

    fn linear_attn_prep(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        cache: &mut Self::KvCache,
        step: &StepOf<Self>,
        p: &AttnPrep<'_, Self::Tensor>,
    ) -> Result<Option<Self::Tensor>> {
        let (sr, st) = step.dev();
        let Some(t) = self
            .test
            .linear_attn_prep(&x.t, &w.t, &mut cache.t, st, &prep_t(p))?
        else {
            return Ok(None);
        };
        // the reference's composition: the stacked q|k|v projection, split, attn_prep
        let be = &self.reference;
        let hd = p.rope.head_dim;
        let qkv = be.linear(&x.r, &w.r)?;
        let (nq, nk) = (p.n_heads * hd, p.n_kv_heads * hd);
        let q = be.slice_cols(&qkv, 0, nq)?;
        let k = be.slice_cols(&qkv, nq, nk)?;
        let v = be.slice_cols(&qkv, nq + nk, nk)?;
        let r = be.attn_prep(&q, &k, &v, &mut cache.r, sr, &prep_r(p))?;
        Ok(Some(self.one("linear_attn_prep", r, t)?))
    }

    fn add_rms_norm_moe_routed(
        &self,
        h: &Self::Tensor,
        y: &Self::Tensor,
        w: Norm<'_, Self::Tensor>,
        eps: f32,
        router: &Self::Weight,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        p: &MoeParams,
    ) -> Result<Option<(Self::Tensor, Self::Tensor)>> {
        let Some(t) = self.test.add_rms_norm_moe_routed(
            &h.t,
            &y.t,
            norm_t(&w),
            eps,
            &router.t,
            &gate.t,
            &up.t,
            &down.t,
            p,
        )?
        else {
            return Ok(None);
        };
        let be = &self.reference;
        let dim = be.dims(&h.r).1;
        let (s, n) = be.add_rms_norm(&h.r, &y.r, norm_r(&w), eps, dim)?;
        let m = be.moe_routed(&n, &router.r, &gate.r, &up.r, &down.r, p)?;
        Ok(Some(self.two(
            "add_rms_norm_moe_routed",
            (s, t.0),
            (m, t.1),
        )?))
    }

    fn moe_routed(
        &self,
        x: &Self::Tensor,
        router: &Self::Weight,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        p: &MoeParams,
    ) -> Result<Self::Tensor> {
        let r = self
            .reference
            .moe_routed(&x.r, &router.r, &gate.r, &up.r, &down.r, p)?;
        let t = self
            .test
            .moe_routed(&x.t, &router.t, &gate.t, &up.t, &down.t, p)?;
        self.one("moe_routed", r, t)
    }
}

impl<R: Backend, T: Backend> Sampling for DiffBackend<R, T> {
    type SamplerState = (R::SamplerState, T::SamplerState);

    fn sampler_new(
        &self,
        params: &SamplingParams,
        prompt: &[u32],
        vocab: usize,
    ) -> Result<Self::SamplerState> {
        Ok((
            self.reference.sampler_new(params, prompt, vocab)?,
            self.test.sampler_new(params, prompt, vocab)?,
        ))
    }

    fn sampler_accept(&self, state: &mut Self::SamplerState, id: u32) -> Result<()> {
        self.reference.sampler_accept(&mut state.0, id)?;
        self.test.sampler_accept(&mut state.1, id)
    }

    /// The test backend's draw (the reference's sampler sees the same id as accepted).
    fn sample(
        &self,
        logits: Self::Tensor,
        state: &mut Self::SamplerState,
        banned: &[u32],
    ) -> Result<u32> {
        let id = self.test.sample(logits.t, &mut state.1, banned)?;
        self.reference.sampler_accept(&mut state.0, id)?;
        Ok(id)
    }
}

/// The records as a table: every row whose relative error is at least `threshold`, then per
/// pass the op with the largest error.
pub fn format_records(records: &[OpRecord], threshold: f64) -> String {
    let mut s = format!(
        "{:>4}  {:>4}  {:<26}  {:>3}  {:>11}  {:>11}  {:>11}  {:>10}\n",
        "pass", "attn", "op", "out", "shape", "max abs", "max |ref|", "rel"
    );
    for r in records.iter().filter(|r| r.rel() >= threshold) {
        s.push_str(&format!(
            "{:>4}  {:>4}  {:<26}  {:>3}  {:>11}  {:>11.3e}  {:>11.3e}  {:>10.3e}\n",
            r.pass,
            r.attn,
            r.op,
            r.out,
            format!("{}x{}", r.rows, r.cols),
            r.max_abs,
            r.max_ref,
            r.rel()
        ));
    }
    let passes = records.iter().map(|r| r.pass).max().map_or(0, |p| p + 1);
    for p in 0..passes {
        // the first of the largest (an op that only passes an error on ties with its source)
        let worst =
            records
                .iter()
                .filter(|r| r.pass == p)
                .fold(None::<&OpRecord>, |w, r| match w {
                    Some(w) if w.rel() >= r.rel() => Some(w),
                    _ => Some(r),
                });
        if let Some(w) = worst {
            s.push_str(&format!(
                "pass {p}: largest error at op {} ({}, attention ops before it: {}): rel {:.3e}\n",
                w.op,
                format_args!("output {}", w.out),
                w.attn,
                w.rel()
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    fn tensor<B: Backend>(be: &B, data: &[f32], rows: usize, cols: usize) -> B::Tensor {
        be.tensor(data, rows, cols).unwrap()
    }

    #[test]
    fn equal_backends_record_zero_error() {
        let d = DiffBackend::new(CpuBackend::new(), CpuBackend::new(), false);
        let a = tensor(&d, &[1.0, -2.0, 3.0, 0.5], 2, 2);
        let b = tensor(&d, &[0.25, 2.0, -1.0, 4.0], 2, 2);
        let s = d.add(&a, &b).unwrap();
        let n = d.rms_norm(&s, Norm::None, 1e-6, 2).unwrap();
        assert_eq!(d.to_host(&n).unwrap().len(), 4);
        let recs = d.take_records();
        assert_eq!(
            recs.iter().map(|r| r.op).collect::<Vec<_>>(),
            ["add", "rms_norm"]
        );
        assert!(recs.iter().all(|r| r.max_abs == 0.0 && r.max_ref > 0.0));
        assert!(d.take_records().is_empty(), "taken");
    }

    #[test]
    fn a_departing_op_is_named_and_resync_keeps_errors_local() {
        use crate::weights::{TensorFormat, TensorRef};
        // A Q8_0 weight: the int8-activation CPU backend departs from the f32 one in `linear`
        // only; the `add` after it is exact on its own inputs.
        let (out, k) = (4, 32);
        // Q8_0 blocks: an f16 scale, then 32 int8 values
        let mut bytes = Vec::new();
        for b in 0..out * k / 32 {
            bytes.extend_from_slice(
                &half::f16::from_f32(0.01 + b as f32 * 0.003)
                    .to_bits()
                    .to_le_bytes(),
            );
            bytes.extend((0..32).map(|i| ((i * 37 + b * 11) % 255) as u8));
        }
        let w = TensorRef {
            name: "w".into(),
            shape: vec![out, k],
            format: TensorFormat::Ggml(crate::quant::ggml::GgmlType::Q8_0),
            data: &bytes,
            scales: Default::default(),
        };
        for resync in [false, true] {
            let d = DiffBackend::new(CpuBackend::new(), CpuBackend::int8(), resync);
            let wt = d.upload(&w).unwrap();
            let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
            let x = tensor(&d, &x, 1, k);
            let y = d.linear(&x, &wt).unwrap();
            let z = d.add(&y, &y).unwrap();
            let recs = d.take_records();
            assert_eq!(recs[0].op, "linear");
            assert!(recs[0].max_abs > 0.0, "int8 activations round: {recs:?}");
            // without resync the add inherits the linear's error; with it, the add is exact
            assert_eq!(recs[1].max_abs == 0.0, resync, "{recs:?}");
            let t = format_records(&recs, 0.0);
            assert!(t.contains("largest error at op linear"), "{t}");
            let _ = z;
        }
    }
}
