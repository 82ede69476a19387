//! Backend rows of the fused MoE decode path: `CudaBackend::moe_routed` on a one-row input that
//! carries an int8 side-car (an RMSNorm output, as in a decode step) runs `moe_router`,
//! `moe_gate_up`, `moe_down`. Per shape (Qwen3-30B-A3B's mix: F32 router, E 128, top-8, Q4_K
//! gate/up, Q6_K down; a Q8_0 router with Q8_0 / Q4_0 banks and GeGLU; a BF16 router with Q5_0 /
//! Q8_0 banks):
//! - vs `CpuBackend::int8()` (the same int8 activations of x and of the GLU output):
//!   [`FUSED_INT8_BOUND`]; vs `CpuBackend` (f32 activations): `checks::moe::E2E_CPU_BOUND`;
//! - vs the composed ops on the GPU (router `linear`, then `moe`: `gemv`, `moe_route`,
//!   `quantize_q8`, `moe_gemv`, GLU, `moe_combine`): [`FUSED_INT8_BOUND`];
//! - `moe_routed` equals the fused call it makes (0);
//! - a recorded step (CUDA graph: rmsnorm + the fused MoE) replayed three times with new inputs
//!   equals the same ops run directly (0): the router's arrival counters are back at zero after
//!   every replay, and the routing follows the inputs.
//!
//! Inputs whose CPU router logits have a near-tie at the top-k boundary (gap < 1e-3) are drawn
//! again, so a last-ulp difference of the logits cannot swap an expert.

use crate::backend::{Fused, Ops, Runtime};
use rand::rngs::StdRng;

use super::pipeline::E2E_CPU_BOUND;
use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::{CudaBackend, GpuTensor, GpuWeight};
use crate::backend::{Activation, Backend, MoeParams, Norm};
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;
use crate::selftest::backend_ops::{host, Ctx, Pair, R};
use crate::selftest::check::uniform;
#[cfg(test)]
use crate::selftest::check::Comparison;
use crate::weights::{Scales, TensorFormat, TensorRef};

/// Fused GPU vs an int8-activation reference (the CPU's, or the unfused GPU kernels): the same
/// arithmetic up to f32 summation order, except that a GLU value a few ulp apart can round to the
/// neighbouring int8 step (one step of amax/127 in one term of a down dot product: up to ~7e-3 of
/// the output RMS on these heavy-tailed random banks, as `checks::moe::MoeCombineCheck`); a wrong
/// expert, row or slot is O(1).
pub const FUSED_INT8_BOUND: f64 = 3e-2;

/// Smallest gap between the k-th and (k+1)-th largest CPU router logit of a drawn input.
const MIN_TOPK_GAP: f32 = 1e-3;

#[derive(Debug, Clone, Copy)]
struct Spec {
    e: usize,
    top_k: usize,
    hidden: usize,
    ff: usize,
    router: GgmlType,
    gate_up: GgmlType,
    down: GgmlType,
    act: Activation,
    norm: bool,
}

fn specs() -> [Spec; 3] {
    [
        Spec {
            e: 128,
            top_k: 8,
            hidden: 512,
            ff: 256,
            router: GgmlType::F32,
            gate_up: GgmlType::Q4K,
            down: GgmlType::Q6K,
            act: Activation::Silu,
            norm: true,
        },
        Spec {
            e: 16,
            top_k: 4,
            hidden: 512,
            ff: 256,
            router: GgmlType::Q8_0,
            gate_up: GgmlType::Q8_0,
            down: GgmlType::Q4_0,
            act: Activation::GeluTanh,
            norm: false,
        },
        Spec {
            e: 32,
            top_k: 8,
            hidden: 256,
            ff: 128,
            router: GgmlType::BF16,
            gate_up: GgmlType::Q5_0,
            down: GgmlType::Q8_0,
            act: Activation::Silu,
            norm: true,
        },
    ]
}

/// The weights of one spec as GGUF bytes.
struct Weights {
    router: Vec<u8>,
    gate: Vec<u8>,
    up: Vec<u8>,
    down: Vec<u8>,
}

fn tref<'a>(name: &str, ty: GgmlType, shape: Vec<usize>, data: &'a [u8]) -> TensorRef<'a> {
    TensorRef {
        name: name.into(),
        shape,
        format: TensorFormat::Ggml(ty),
        data,
        scales: Scales::default(),
    }
}

impl Spec {
    fn name(&self) -> String {
        format!(
            "{} router, {}/{} E={} top-{}",
            self.router.name(),
            self.gate_up.name(),
            self.down.name(),
            self.e,
            self.top_k
        )
    }
    fn params(&self) -> MoeParams {
        MoeParams {
            n_experts: self.e,
            top_k: self.top_k,
            norm_topk: self.norm,
            act: self.act,
        }
    }
    fn weights(&self, rng: &mut StdRng) -> R<Weights> {
        let (e, h, f) = (self.e, self.hidden, self.ff);
        Ok(Weights {
            router: random_weights(self.router, e, h, rng)?,
            gate: random_weights(self.gate_up, e * f, h, rng)?,
            up: random_weights(self.gate_up, e * f, h, rng)?,
            down: random_weights(self.down, e * h, f, rng)?,
        })
    }
    fn refs<'a>(&self, w: &'a Weights) -> [TensorRef<'a>; 4] {
        let (e, h, f) = (self.e, self.hidden, self.ff);
        [
            tref("router", self.router, vec![e, h], &w.router),
            tref("gate_exps", self.gate_up, vec![e, f, h], &w.gate),
            tref("up_exps", self.gate_up, vec![e, f, h], &w.up),
            tref("down_exps", self.down, vec![e, h, f], &w.down),
        ]
    }
}

/// The four weights on one backend.
fn upload<B: Backend>(be: &B, r: &[TensorRef<'_>; 4]) -> R<[B::Weight; 4]> {
    Ok([
        be.upload(&r[0])?,
        be.upload(&r[1])?,
        be.upload(&r[2])?,
        be.upload(&r[3])?,
    ])
}

/// `x` normalised on the GPU (a one-row RMSNorm: it carries the int8 side-car), and its values.
fn normed(gpu: &CudaBackend, x: &[f32], w: &[f32]) -> R<(GpuTensor, Vec<f32>)> {
    let h = x.len();
    let gx = gpu.tensor(x, 1, h)?;
    let gw = gpu.tensor(w, 1, h)?;
    let y = gpu.rms_norm(&gx, Norm::Plain(&gw), 1e-6, h)?;
    if y.q8.is_none() {
        anyhow::bail!("the one-row RMSNorm output carries no int8 side-car");
    }
    let v = host(gpu, &y)?;
    Ok((y, v))
}

/// The top-k experts of `x` under `be`'s router logits (sorted) when the k-th and (k+1)-th
/// logits are at least `MIN_TOPK_GAP` apart, else None.
fn topk_set(
    be: &CpuBackend,
    router: &<CpuBackend as Runtime>::Weight,
    x: &[f32],
    k: usize,
) -> R<Option<Vec<usize>>> {
    let t = be.tensor(x, 1, x.len())?;
    let l = be.to_host(&be.linear(&t, router)?)?;
    let mut idx: Vec<usize> = (0..l.len()).collect();
    idx.sort_by(|&a, &b| l[b].total_cmp(&l[a]));
    if k < l.len() && l[idx[k - 1]] - l[idx[k]] < MIN_TOPK_GAP {
        return Ok(None);
    }
    let mut set = idx[..k.min(l.len())].to_vec();
    set.sort_unstable();
    Ok(Some(set))
}

/// Whether `x` has a clear top-k under both CPU references (f32 activations, and the int8
/// ones a Q8_0 router sees), the same experts in both: then neither reference nor the GPU can
/// route it differently.
fn clear_topk(
    cpu: &CpuBackend,
    cpu8: &CpuBackend,
    router: &<CpuBackend as Runtime>::Weight,
    router8: &<CpuBackend as Runtime>::Weight,
    x: &[f32],
    k: usize,
) -> R<bool> {
    let a = topk_set(cpu, router, x, k)?;
    let b = topk_set(cpu8, router8, x, k)?;
    Ok(a.is_some() && a == b)
}

/// The fused call (an error when the backend does not take the fused path for it).
fn fused(gpu: &CudaBackend, x: &GpuTensor, w: &[GpuWeight; 4], p: &MoeParams) -> R<GpuTensor> {
    gpu.moe_routed_fused(x, &w[0], &w[1], &w[2], &w[3], p)?
        .ok_or_else(|| anyhow::anyhow!("the fused MoE decode path was not taken"))
}

pub(in crate::selftest) fn moe_fused_cases(cx: &mut Ctx) {
    for (si, s) in specs().into_iter().enumerate() {
        let name = s.name();
        let p = s.params();
        // weights and an input with a clear top-k (drawn again on a near-tie)
        let setup = (|| -> R<_> {
            let w = s.weights(&mut cx.rng)?;
            let nw = uniform(&mut cx.rng, s.hidden, 0.5, 1.5);
            let cr = cx.cpu.upload(&s.refs(&w)[0])?;
            let cr8 = cx.cpu8.upload(&s.refs(&w)[0])?;
            for _ in 0..20 {
                let x0 = uniform(&mut cx.rng, s.hidden, -1.0, 1.0);
                let (gx, xv) = normed(&cx.gpu, &x0, &nw)?;
                if clear_topk(&cx.cpu, &cx.cpu8, &cr, &cr8, &xv, s.top_k)? {
                    return Ok((w, nw, gx, xv));
                }
            }
            anyhow::bail!("no input with a clear top-{} in 20 draws", s.top_k)
        })();
        let (w, nw, gx, xv) = match setup {
            Ok(v) => v,
            Err(e) => {
                let msg = e.to_string();
                cx.case(format!("moe_routed fused {name}"), 0.0, |_| {
                    Err(anyhow::anyhow!("{msg}"))
                });
                continue;
            }
        };
        let refs = s.refs(&w);
        let h = s.hidden;
        let mut got_fused: Option<Vec<f32>> = None;
        cx.case(
            format!("moe_routed fused {name} n=1 vs CPU int8"),
            FUSED_INT8_BOUND,
            |cx| {
                let gw = upload(&cx.gpu, &refs)?;
                let got = host(&cx.gpu, &fused(&cx.gpu, &gx, &gw, &p)?)?;
                let cw = upload(&cx.cpu8, &refs)?;
                let cx8 = cx.cpu8.tensor(&xv, 1, h)?;
                let want = cx
                    .cpu8
                    .moe_routed(&cx8, &cw[0], &cw[1], &cw[2], &cw[3], &p)?;
                got_fused = Some(got.clone());
                Ok((got, cx.cpu8.to_host(&want)?))
            },
        );
        let fused_vals = got_fused.unwrap_or_default();
        cx.case(
            format!("moe_routed fused {name} n=1 vs CPU f32"),
            E2E_CPU_BOUND,
            |cx| {
                let cw = upload(&cx.cpu, &refs)?;
                let cxf = cx.cpu.tensor(&xv, 1, h)?;
                let want = cx
                    .cpu
                    .moe_routed(&cxf, &cw[0], &cw[1], &cw[2], &cw[3], &p)?;
                Ok((fused_vals.clone(), cx.cpu.to_host(&want)?))
            },
        );
        cx.case(
            format!("moe_routed fused {name} n=1 vs GPU linear + moe"),
            FUSED_INT8_BOUND,
            |cx| {
                let gw = upload(&cx.gpu, &refs)?;
                let l = cx.gpu.linear(&gx, &gw[0])?;
                let want = cx.gpu.moe(&gx, &l, &gw[1], &gw[2], &gw[3], &p)?;
                Ok((fused_vals.clone(), host(&cx.gpu, &want)?))
            },
        );
        cx.case(
            format!("moe_routed {name} n=1 == the fused call"),
            0.0,
            |cx| {
                let gw = upload(&cx.gpu, &refs)?;
                let y = cx.gpu.moe_routed(&gx, &gw[0], &gw[1], &gw[2], &gw[3], &p)?;
                Ok((host(&cx.gpu, &y)?, fused_vals.clone()))
            },
        );
        if si == 0 {
            cx.case(
                format!("moe_routed fused {name}: recorded step, 3 replays == direct"),
                0.0,
                |cx| replay_case(cx, &s, &refs, &nw),
            );
        }
    }
}

/// rmsnorm + the fused MoE recorded once (a CUDA graph), replayed with three new inputs, each
/// result against the same ops run directly on that input.
fn replay_case(cx: &mut Ctx, s: &Spec, refs: &[TensorRef<'_>; 4], nw: &[f32]) -> R<Pair> {
    let (gpu, h, p) = (&cx.gpu, s.hidden, s.params());
    let gw = upload(gpu, refs)?;
    let x0 = gpu.tensor(&uniform(&mut cx.rng, h, -1.0, 1.0), 1, h)?;
    let nwt = gpu.tensor(nw, 1, h)?;
    let run = |gpu: &CudaBackend| -> R<GpuTensor> {
        let x = gpu.rms_norm(&x0, Norm::Plain(&nwt), 1e-6, h)?;
        fused(gpu, &x, &gw, &p)
    };
    // the step a recording is tied to (these ops read no ids or positions)
    let step = crate::backend::step_at(gpu, 0, 1)?;
    if !gpu.record_begin(&step)? {
        anyhow::bail!("the backend does not record steps (--no-graphs is set)");
    }
    let y = match run(gpu) {
        Ok(y) => y,
        Err(e) => {
            gpu.record_abort();
            return Err(e);
        }
    };
    let rec = gpu.record_end(&step)?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        x0.buf.write(&uniform(&mut cx.rng, h, -1.0, 1.0))?;
        gpu.replay(&rec, &step)?;
        got.extend(host(gpu, &y)?);
        want.extend(host(gpu, &run(gpu)?)?);
    }
    Ok((got, want))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// On the rows' shapes, the int8-activation CPU reference stays well inside E2E_CPU_BOUND of
    /// the f32 one (so the "vs CPU f32" rows are about quantisation, not luck), and differs from
    /// it (the int8 path is really taken).
    #[test]
    fn int8_reference_within_f32_bound() {
        let mut rng = StdRng::seed_from_u64(11);
        let (cpu, cpu8) = (CpuBackend::new(), CpuBackend::int8());
        for s in specs() {
            let w = s.weights(&mut rng).unwrap();
            let refs = s.refs(&w);
            let (cw, cw8) = (upload(&cpu, &refs).unwrap(), upload(&cpu8, &refs).unwrap());
            let p = s.params();
            let (mut worst, mut drawn): (f64, usize) = (0.0, 0);
            for _ in 0..8 {
                let x = uniform(&mut rng, s.hidden, -1.0, 1.0);
                if !clear_topk(&cpu, &cpu8, &cw[0], &cw8[0], &x, s.top_k).unwrap() {
                    continue;
                }
                let run = |be: &CpuBackend, w: &[crate::backend::cpu::CpuWeight; 4]| {
                    let t = be.tensor(&x, 1, s.hidden).unwrap();
                    let y = be.moe_routed(&t, &w[0], &w[1], &w[2], &w[3], &p).unwrap();
                    be.to_host(&y).unwrap()
                };
                let c = Comparison::new(&run(&cpu8, &cw8), &run(&cpu, &cw));
                assert_eq!(c.unwritten, 0);
                worst = worst.max(c.max_rel_err);
                drawn += 1;
            }
            eprintln!(
                "{}: int8 vs f32 CPU {worst:.3e} ({drawn} of 8 draws clear)",
                s.name()
            );
            assert!(drawn >= 2, "{drawn}");
            assert!(worst > 0.0 && worst < E2E_CPU_BOUND / 2.0, "{worst}");
        }
    }
}
