//! Backend-level GPU checks of `linear_add_rms_norm_then`: a decode row's output projection,
//! residual add and next RMSNorm, handed over deferred to the projections that read it (the
//! batch-1 repacked GEMV's `__res` entry, then `__glu` or `__rs`).
//!
//! The deferred consumers read the int8 blocks of s * w (times rstd on their dots), where the
//! composition quantises s * rstd * w: a value can round the other way where the two quotients
//! straddle a half, and one such value moves a GLU output by up to ~1e-2 of the outputs' RMS
//! (one case's random row did). So the references run the consumers over the row
//! the deferred path reads ([`deferred_row`], from its own s), not over the composition's.
//!
//! Bounds:
//! - the deferred path (`CudaBackend::deferred_norm`, which must take the case) against the
//!   composition on the same device (`linear`, `add_rms_norm`; the consumers over the deferred
//!   row): 2e-4. The sum s is the same bits; rstd multiplies the dots instead of the values;
//! - against the int8 CPU backend (its `linear_add_rms_norm_then` for s; its consumers over the
//!   GPU's row: the deferred row where the GPU's policy defers, else the GPU's `add_rms_norm`):
//!   1e-3, as the other block-format GEMV rows.

use crate::backend::cuda::{CudaBackend, GpuTensor, GpuWeight};
use crate::backend::{
    linear_add_rms_norm_then_composed, norm_next_apply, Activation, Backend, Norm, NormNext,
};
use crate::backend::{Fused, Ops, Runtime};
use crate::ops::qdot::{dequantize_q8_1, quantize_q8_1, random_weights};
use crate::quant::GgmlType;
use crate::selftest::backend_ops::{host, tref, Ctx};
use crate::selftest::check::uniform;
use crate::weights::TensorRef;

/// The consumer of one case: a fused gate|up of `ff` rows each, or projections of these rows.
enum Next {
    Glu(GgmlType, usize, Activation),
    Linear(GgmlType, &'static [usize]),
}

/// How the norm weight applies in a case.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Plain,
    OnePlus,
    Weightless,
}

fn norm<T>(mode: Mode, w: &T) -> Norm<'_, T> {
    match mode {
        Mode::Plain => Norm::Plain(w),
        Mode::OnePlus => Norm::OnePlus(w),
        Mode::Weightless => Norm::None,
    }
}

pub(in crate::selftest) fn linear_res_cases(cx: &mut Ctx) {
    use GgmlType::{Q4K, Q4_0, Q6K, Q8_0};
    // (producer format, k, n, norm, consumer)
    let cases = [
        (
            Q4_0,
            4096usize,
            1024usize,
            Mode::Plain,
            Next::Glu(Q4_0, 512, Activation::Silu),
        ),
        (
            Q4_0,
            4096,
            1024,
            Mode::Plain,
            Next::Linear(Q4_0, &[512, 128, 128]),
        ),
        (
            Q8_0,
            2048,
            1024,
            Mode::OnePlus,
            Next::Glu(Q8_0, 384, Activation::GeluTanh),
        ),
        (
            Q8_0,
            2048,
            1024,
            Mode::Weightless,
            Next::Linear(Q8_0, &[768]),
        ),
        (
            Q4K,
            2048,
            1536,
            Mode::Plain,
            Next::Glu(Q4K, 256, Activation::Silu),
        ),
        (Q4K, 4096, 1024, Mode::Plain, Next::Linear(Q4K, &[512, 256])),
        // q6_kr producers (Q4_K_M's Q6_K down projections) and consumers
        (Q6K, 4096, 1024, Mode::Plain, Next::Linear(Q4K, &[512, 256])),
        // q6_kr consumers of 256 rows (`__rs2`) and 4096 (`__rs`)
        (
            Q6K,
            4096,
            2048,
            Mode::OnePlus,
            Next::Linear(Q6K, &[256, 4096]),
        ),
        // a gate|up of 32 GLU groups after a q6_kr producer (`__rsglu`'s counters)
        (
            Q6K,
            2048,
            1024,
            Mode::Plain,
            Next::Glu(Q4K, 1024, Activation::Silu),
        ),
        (
            Q4_0,
            1024,
            1024,
            Mode::OnePlus,
            Next::Glu(Q8_0, 256, Activation::Silu),
        ),
    ];
    for (ty, k, n, mode, next) in cases {
        let Ok(wb) = random_weights(ty, n, k, &mut cx.rng) else {
            continue;
        };
        let wr = tref("proj", ty, vec![n, k], &wb);
        // the consumers' weights as (rows, bytes)
        let (cty, rows): (GgmlType, Vec<usize>) = match &next {
            Next::Glu(t, ff, _) => (*t, vec![2 * ff]),
            Next::Linear(t, r) => (*t, r.to_vec()),
        };
        let mut cw = Vec::new();
        for &r in &rows {
            match random_weights(cty, r, n, &mut cx.rng) {
                Ok(b) => cw.push(b),
                Err(_) => break,
            }
        }
        if cw.len() != rows.len() {
            continue;
        }
        let crefs: Vec<_> = rows
            .iter()
            .zip(&cw)
            .map(|(&r, b)| tref("next", cty, vec![r, n], b))
            .collect();
        let x = uniform(&mut cx.rng, k, -2.0, 2.0);
        let h = uniform(&mut cx.rng, n, -3.0, 3.0);
        let nw = uniform(&mut cx.rng, n, -1.0, 1.5);
        let eps = 1e-6f32;
        let what = match &next {
            Next::Glu(t, ff, a) => format!("{} gate|up {ff} {a:?}", t.name()),
            Next::Linear(t, r) => format!("{} {r:?}", t.name()),
        };
        let label = format!("{} 1x{k} -> {n} {mode:?} -> {what}", ty.name());
        let act = match &next {
            Next::Glu(_, _, a) => Some(*a),
            Next::Linear(..) => None,
        };
        cx.case(
            format!("linear_add_rms_norm_then {label} deferred == composed (its int8 row)"),
            2e-4,
            |cx| {
                let g = Loaded::new(&cx.gpu, (&wr, &crefs), (&x, &h, &nw))?;
                let wrefs: Vec<&GpuWeight> = g.ws.iter().collect();
                let nx = next_of(&wrefs, act);
                let deferred = cx
                    .gpu
                    .deferred_norm(&g.x, &g.w, &g.h, &norm(mode, &g.nw), eps, &nx)?
                    .ok_or_else(|| anyhow::anyhow!("the deferred path did not take the case"))?;
                let (s, _) = linear_add_rms_norm_then_composed(
                    &cx.gpu,
                    &g.x,
                    &g.w,
                    &g.h,
                    norm(mode, &g.nw),
                    eps,
                    &nx,
                )?;
                let row = deferred_row(&host(&cx.gpu, &deferred.0)?, &nw, mode, eps)?;
                let row = cx.gpu.tensor(&row, 1, row.len())?;
                let outs = norm_next_apply(&cx.gpu, &row, &nx)?;
                Ok((flat(&cx.gpu, deferred)?, flat(&cx.gpu, (s, outs))?))
            },
        );
        if let Next::Glu(_, ff, _) = &next {
            // the GLU output's int8 side-car (written by `__rsglu` or the GLU kernel) is what
            // quantize_q8 makes of it: a GEMV from it equals one from a plain copy, bit for bit
            let ff = *ff;
            let Ok(db) = random_weights(Q8_0, 256, ff, &mut cx.rng) else {
                continue;
            };
            let dr = tref("down", Q8_0, vec![256, ff], &db);
            cx.case(
                format!("linear_add_rms_norm_then {label} deferred: GLU side-car == quantize_q8"),
                0.0,
                |cx| {
                    let g = Loaded::new(&cx.gpu, (&wr, &crefs), (&x, &h, &nw))?;
                    let wrefs: Vec<&GpuWeight> = g.ws.iter().collect();
                    let (_, outs) = cx
                        .gpu
                        .deferred_norm(
                            &g.x,
                            &g.w,
                            &g.h,
                            &norm(mode, &g.nw),
                            eps,
                            &next_of(&wrefs, act),
                        )?
                        .ok_or_else(|| {
                            anyhow::anyhow!("the deferred path did not take the case")
                        })?;
                    let hg = &outs[0];
                    anyhow::ensure!(hg.q8.is_some(), "the deferred GLU wrote no side-car");
                    let dw = cx.gpu.upload(&dr)?;
                    let plain = cx.gpu.tensor(&host(&cx.gpu, hg)?, 1, ff)?;
                    Ok((
                        host(&cx.gpu, &cx.gpu.linear(hg, &dw)?)?,
                        host(&cx.gpu, &cx.gpu.linear(&plain, &dw)?)?,
                    ))
                },
            );
        }
        cx.case(
            format!("linear_add_rms_norm_then {label} vs CPU int8"),
            1e-3,
            |cx| against_cpu8(cx, (&wr, &crefs), (&x, &h, &nw), mode, eps, act),
        );
    }
}

/// A Q4_K_M layer's deferred q|k (Q4_K) and v (Q6_K) projections: the one `__rsqv` launch
/// against the two `__rs` / `__rs2` launches (bound 0: the same rows dotted in the same order),
/// and against the int8 CPU backend (1e-3).
pub(in crate::selftest) fn rsqv_cases(cx: &mut Ctx) {
    use GgmlType::{Q4K, Q6K};
    // (producer format, k, n, q|k rows, v rows)
    // (a short v of 256 rows, and Qwen3-8B's q|k and v)
    let cases = [
        (Q4K, 1024usize, 2048usize, 1280usize, 256usize),
        (Q6K, 2048, 4096, 5120, 1024),
    ];
    let dev = cx.gpu.dev.clone();
    for (ty, k, n, qk, v) in cases {
        let (Ok(wb), Ok(qb), Ok(vb)) = (
            random_weights(ty, n, k, &mut cx.rng),
            random_weights(Q4K, qk, n, &mut cx.rng),
            random_weights(Q6K, v, n, &mut cx.rng),
        ) else {
            continue;
        };
        let wr = tref("proj", ty, vec![n, k], &wb);
        let crefs = [
            tref("qk", Q4K, vec![qk, n], &qb),
            tref("v", Q6K, vec![v, n], &vb),
        ];
        let x = uniform(&mut cx.rng, k, -2.0, 2.0);
        let h = uniform(&mut cx.rng, n, -3.0, 3.0);
        let nw = uniform(&mut cx.rng, n, -1.0, 1.5);
        let eps = 1e-6f32;
        let label = format!("{} 1x{k} -> {n} -> Q4_K {qk} + Q6_K {v}", ty.name());
        let run = |be: &CudaBackend, one: bool| -> anyhow::Result<Vec<f32>> {
            let g = Loaded::new(be, (&wr, &crefs), (&x, &h, &nw))?;
            let wrefs: Vec<&GpuWeight> = g.ws.iter().collect();
            anyhow::ensure!(
                be.takes_rsqv(&wrefs)? == one,
                "the backend does not run the two projections as {} launch(es)",
                if one { "one" } else { "two" }
            );
            g.deferred_linear(be, eps)
        };
        cx.case(
            format!("linear_add_rms_norm_then {label} deferred: one __rsqv launch == two __rs"),
            0.0,
            |_| {
                let with = |on| {
                    CudaBackend::with_device(dev.clone(), crate::backend::cuda::KvType::Fp8E4m3)
                        .map(|b| b.with_rsqv(on))
                };
                Ok((run(&with(true)?, true)?, run(&with(false)?, false)?))
            },
        );
        cx.case(
            format!("linear_add_rms_norm_then {label} vs CPU int8"),
            1e-3,
            |cx| against_cpu8(cx, (&wr, &crefs), (&x, &h, &nw), Mode::Plain, eps, None),
        );
    }
}

/// A case's `linear_add_rms_norm_then` on the GPU (its default path) and on the int8 CPU
/// backend: (got, want), s then the consumers' outputs. The CPU's consumers run over the GPU's
/// row: its deferred row ([`deferred_row`]) where it defers the norm, else its `add_rms_norm`.
fn against_cpu8(
    cx: &mut Ctx,
    (wr, crefs): (&TensorRef<'_>, &[TensorRef<'_>]),
    (x, h, nw): (&[f32], &[f32], &[f32]),
    mode: Mode,
    eps: f32,
    act: Option<Activation>,
) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
    let g = Loaded::new(&cx.gpu, (wr, crefs), (x, h, nw))?;
    let wrefs: Vec<&GpuWeight> = g.ws.iter().collect();
    let got = cx.gpu.linear_add_rms_norm_then(
        &g.x,
        &g.w,
        &g.h,
        norm(mode, &g.nw),
        eps,
        &next_of(&wrefs, act),
    )?;
    let deferred = cx.gpu.defers_norm(&g.w, &next_of(&wrefs, act))?;
    let c = Loaded::new(&cx.cpu8, (wr, crefs), (x, h, nw))?;
    let crefs: Vec<_> = c.ws.iter().collect();
    let cnext = next_of(&crefs, act);
    let (s, _) =
        cx.cpu8
            .linear_add_rms_norm_then(&c.x, &c.w, &c.h, norm(mode, &c.nw), eps, &cnext)?;
    // the consumers over the GPU's own normed row: two backends' norms can put an int8 value on
    // either side of a half as well
    let row = if deferred {
        deferred_row(&host(&cx.gpu, &got.0)?, nw, mode, eps)?
    } else {
        let y = cx.gpu.linear(&g.x, &g.w)?;
        let (_, n) = cx
            .gpu
            .add_rms_norm(&g.h, &y, norm(mode, &g.nw), eps, h.len())?;
        host(&cx.gpu, &n)?
    };
    let outs = norm_next_apply(&cx.cpu8, &cx.cpu8.tensor(&row, 1, row.len())?, &cnext)?;
    let mut want = s.data;
    for o in outs {
        want.extend(o.data);
    }
    Ok((flat(&cx.gpu, got)?, want))
}

/// The row a deferred norm's consumers read, from its sum `s`: the int8 blocks of s * w' that
/// `__res` writes (`quantize_q8_1`: q8_group's IEEE steps on the host) dequantised, times the
/// rstd of s. An int8 GEMV over it quantises each block back to the same integers (its values
/// q d rstd, their amax 127 d rstd: every quotient within a few ulps of an integer), so a
/// reference from it dots what the deferred consumers dot.
fn deferred_row(s: &[f32], nw: &[f32], mode: Mode, eps: f32) -> anyhow::Result<Vec<f32>> {
    let ss: f64 = s.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let rstd = (1.0 / (ss / s.len().max(1) as f64 + f64::from(eps)).sqrt()) as f32;
    let v: Vec<f32> = s
        .iter()
        .zip(nw)
        .map(|(&x, &w)| match mode {
            Mode::Plain => x * w,
            Mode::OnePlus => x * (1.0 + w),
            Mode::Weightless => x,
        })
        .collect();
    let z = dequantize_q8_1(&quantize_q8_1(&v)?);
    Ok(z.into_iter().map(|x| x * rstd).collect())
}

/// Every output of one path, concatenated: s, then the consumers'.
fn flat(be: &CudaBackend, (s, outs): (GpuTensor, Vec<GpuTensor>)) -> anyhow::Result<Vec<f32>> {
    let mut v = host(be, &s)?;
    for o in &outs {
        v.extend(host(be, o)?);
    }
    Ok(v)
}

/// The consumer of a case over weights already on a backend.
fn next_of<'a, W>(ws: &'a [&'a W], act: Option<Activation>) -> NormNext<'a, W> {
    match act {
        Some(a) => NormNext::Glu(ws[0], a),
        None => NormNext::Linear(ws),
    }
}

/// One case's weights and inputs on a backend.
pub(in crate::selftest) struct Loaded<B: Backend> {
    pub(in crate::selftest) w: B::Weight,
    pub(in crate::selftest) ws: Vec<B::Weight>,
    pub(in crate::selftest) x: B::Tensor,
    pub(in crate::selftest) h: B::Tensor,
    pub(in crate::selftest) nw: B::Tensor,
}

impl Loaded<CudaBackend> {
    /// The deferred path (`deferred_norm`, a plain norm weight, the consumers as linears) of
    /// this case on `be`, its outputs concatenated; an error where the path does not take it.
    pub(in crate::selftest) fn deferred_linear(
        &self,
        be: &CudaBackend,
        eps: f32,
    ) -> anyhow::Result<Vec<f32>> {
        let wrefs: Vec<&GpuWeight> = self.ws.iter().collect();
        let r = be
            .deferred_norm(
                &self.x,
                &self.w,
                &self.h,
                &Norm::Plain(&self.nw),
                eps,
                &NormNext::Linear(&wrefs),
            )?
            .ok_or_else(|| anyhow::anyhow!("the deferred path did not take the case"))?;
        flat(be, r)
    }
}

impl<B: Backend> Loaded<B> {
    pub(in crate::selftest) fn new(
        be: &B,
        (w, ws): (&TensorRef<'_>, &[TensorRef<'_>]),
        (x, h, nw): (&[f32], &[f32], &[f32]),
    ) -> anyhow::Result<Self> {
        Ok(Loaded {
            w: be.upload(w)?,
            ws: ws.iter().map(|r| be.upload(r)).collect::<Result<_, _>>()?,
            x: be.tensor(x, 1, x.len())?,
            h: be.tensor(h, 1, h.len())?,
            nw: be.tensor(nw, 1, nw.len())?,
        })
    }
}
