//! The fused MoE decode kernels (`backend::cuda::ops::moe::decode`), each against a host reference
//! built from the CPU primitives:
//! - `moe_router` (F32 / F16 / BF16 / Q8_0 routers, Q8_0 also repacked): logits vs `ops::qdot::gemv_ref` (f64) over
//!   the f32 activations (the int8 side-car's values for Q8_0); expert ids (exact) and weights vs
//!   `backend::cpu::route` of the kernel's own logits (so a near-tie cannot make the check
//!   flaky); the arrival counters are zero after the launch, and a second launch routes again.
//!   Qwen3-30B-A3B's router (E 128, 2048 inputs, top-8), E 16 / 256 / 60, 1 to 3 tokens, with and
//!   without renormalisation.
//! - `moe_gate_up`: the GLU output vs `act(gemv_ref(gate)) * gemv_ref(up)` over the int8
//!   activations (`ops::swiglu` / `ops::geglu`), its side-car exactly `quantize_q8_1` of the
//!   kernel's own output (0 error, as the other side-car writers), out-of-range expert ids
//!   giving zeros; rows of one staged chunk and of several (5120 inputs).
//! - `moe_down`: `sum_s w_s * gemv_ref(down_{e_s}, h_s)` (f64, h_s the side-car's values) per
//!   token; an output count that is not a whole number of row blocks, top-16, out-of-range ids.
//!
//! Bound 2e-4 for all three (as `moe_gemv`: f32 accumulation vs an f64 reference over the same
//! int8 activations); a wrong id, row, slot or side-car byte is >= 1e-2.

use crate::kernels::Entry;
use rand::rngs::StdRng;
use rand::Rng;

use super::pipeline::{ggml, pool, ptr};
use crate::backend::cpu::route;
use crate::backend::cuda::runtime::buf::read_ptr;
use crate::backend::cuda::{
    CudaError, DevPtr, Kern, MoeDownArgs, MoeGateUpArgs, MoeRouterArgs, NormWeightPtr, RouterNorm,
};
use crate::backend::Activation;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::qdot::{dequantize_q8_1, gemv_ref, quantize_q8_1, random_weights};
use crate::quant::GgmlType;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};
use crate::selftest::elementwise::add_rmsnorm::side_car_cmp;

pub struct MoeRouterCheck;
pub struct MoeGateUpCheck;
pub struct MoeDownCheck;

/// f32 accumulation vs f64 over the same activations, as `moe_gemv`.
const BOUND: f64 = 2e-4;

fn invalid(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "selftest",
        detail,
    }
}

fn qerr(e: impl std::fmt::Display) -> CudaError {
    invalid(e.to_string())
}

fn kern(cx: &CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Kern, CudaError> {
    Ok(Kern {
        spec,
        f: cx.dev.function(spec)?,
    })
}

/// `x`'s int8 side-car as uploaded (`q`, then `{d, d*sum}` pairs) and the values it stands for.
type Side = (Vec<i8>, Vec<f32>, Vec<f32>);

fn side_car(x: &[f32]) -> Result<Side, CudaError> {
    let a = quantize_q8_1(x).map_err(qerr)?;
    let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
    let vals = dequantize_q8_1(&a);
    Ok((a.qs, ds, vals))
}

/// Expert ids in `0..e`; with `bad`, two of them out of range (the kernels write zeros).
fn ids_with(rng: &mut StdRng, pairs: usize, e: usize, bad: bool) -> Vec<i32> {
    let mut ids: Vec<i32> = (0..pairs).map(|_| rng.random_range(0..e as i32)).collect();
    if bad && pairs >= 2 {
        ids[1] = e as i32;
        ids[pairs - 1] = -1;
    }
    ids
}

fn valid(id: i32, e: usize) -> Option<usize> {
    usize::try_from(id).ok().filter(|&v| v < e)
}

/// One expert's rows of a bank (`rows x cols` of `ty` per expert) against `x`, f64.
fn expert_ref(
    ty: GgmlType,
    bank: &[u8],
    ex: usize,
    rows: usize,
    cols: usize,
    x: &[f32],
) -> Result<Vec<f32>, CudaError> {
    let eb = rows * ty.row_bytes(cols).map_err(qerr)?;
    gemv_ref(ty, &bank[ex * eb..(ex + 1) * eb], rows, cols, x).map_err(qerr)
}

impl KernelCheck for MoeRouterCheck {
    fn name(&self) -> &'static str {
        "moe_router"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeRouter
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        BOUND
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let q = spec.key.quant;
        // q8_0r: Q8_0 weights, repacked as the upload does (rows of whole 256-element groups)
        let (ty, _) = crate::selftest::registry::source_type(q)
            .ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
        let int8 = ty.block().0 > 1;
        let kn = kern(cx, spec)?;
        let pool = pool(cx);
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        // (tokens, experts, inputs, top-k, renormalise)
        let cases = [
            (1usize, 128usize, 2048usize, 8usize, true),
            (3, 16, 512, 4, false),
            (2, 256, 256, 16, true),
            (1, 60, 1024, 1, false),
        ];
        for (ci, &(n, e, k, top_k, norm)) in cases.iter().enumerate() {
            let w = random_weights(ty, e, k, &mut cx.rng).map_err(qerr)?;
            let x = uniform(&mut cx.rng, n * k, -1.0, 1.0);
            let (xq, xds, xv) = side_car(&x)?;
            let want_logits = gemv_ref(ty, &w, e, k, if int8 { &xv } else { &x }).map_err(qerr)?;
            let w = crate::selftest::registry::device_layout(q, w, k).map_err(invalid)?;
            let (bw, bx, bq, bd) = (
                pool.upload(&w)?,
                pool.upload(&x)?,
                pool.upload(&xq)?,
                pool.upload(&xds)?,
            );
            let (bl, bi, bwt) = (
                pool.alloc(n * e * 4)?,
                pool.alloc(n * top_k * 4)?,
                pool.alloc(n * top_k * 4)?,
            );
            let bc = pool.upload(&vec![0u32; n])?;
            let args = MoeRouterArgs {
                w: ptr(&bw, w.len())?,
                x: ptr(&bx, x.len())?,
                xq: ptr(&bq, xq.len())?,
                xds: ptr(&bd, xds.len())?,
                logits: ptr(&bl, n * e)?,
                ids: ptr(&bi, n * top_k)?,
                wts: ptr(&bwt, n * top_k)?,
                counters: ptr(&bc, n)?,
                n,
                e,
                k,
                top_k,
                norm,
            };
            // twice, outputs poisoned before each: the second launch must route again (the
            // first one's last blocks reset the counters)
            for _ in 0..2 {
                for b in [&bl, &bi, &bwt] {
                    b.fill_bytes(0xff)?; // NaN / -1
                }
                cx.dev.moe_router(&kn, &args)?;
                let logits = bl.read::<f32>(n * e)?;
                let ids = bi.read::<i32>(n * top_k)?;
                let wts = bwt.read::<f32>(n * top_k)?;
                let counters = bc.read::<u32>(n)?;
                let (mut want_i, mut want_w) = (Vec::new(), Vec::new());
                for t in 0..n {
                    for (ex, wt) in route(&logits[t * e..(t + 1) * e], top_k, norm) {
                        want_i.push(ex as f32);
                        want_w.push(wt);
                    }
                }
                let got_i: Vec<f32> = ids.iter().map(|&v| v as f32).collect();
                if counters.iter().any(|&c| c != 0) {
                    return Err(invalid(format!(
                        "moe_router left its arrival counters at {counters:?}"
                    )));
                }
                cmp = cmp
                    .merge(Comparison::new(&logits, &want_logits))
                    .merge(Comparison::new(&got_i, &want_i))
                    .merge(Comparison::new(&wts, &want_w));
            }
            if ci == 0 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || dev.moe_router(&kn, &args))?;
            }
            if n == 1 && !int8 {
                cmp = cmp.merge(router_norm_case(cx, spec, &w, &args, ci == 3)?);
            }
        }
        Ok(Measured { cmp, micros })
    }
}

/// The `__norm` entry of a float router on one token: from a and b, the sum (exact), the logits
/// of the normed row (vs f64 over `rms_norm(a + b) * w'`), the routing of its own logits, and
/// the side-car of the normed row (each value within half a step of its group's scale of the
/// f64 row: a rounding flip of the kernel's f32 norm is allowed, a wrong value is not).
fn router_norm_case(
    cx: &mut CheckCtx<'_>,
    spec: &'static KernelSpec,
    w: &[u8],
    args: &MoeRouterArgs,
    one_plus: bool,
) -> Result<Comparison, CudaError> {
    let q = spec.key.quant;
    let ty = ggml(q).ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
    let (e, k, top_k) = (args.e, args.k, args.top_k);
    let pool = pool(cx);
    let kn = Kern {
        spec,
        f: cx.dev.function_entry(spec, Entry::Norm)?,
    };
    let a = uniform(&mut cx.rng, k, -2.0, 2.0);
    let b = uniform(&mut cx.rng, k, -1.0, 1.0);
    let nw = uniform(&mut cx.rng, k, 0.5, 1.5);
    let eps = 1e-6f32;
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let ms = sum.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / k as f64;
    let inv = 1.0 / (ms + eps as f64).sqrt();
    let y: Vec<f32> = sum
        .iter()
        .zip(&nw)
        .map(|(&v, &g)| (v as f64 * inv * if one_plus { 1.0 + g as f64 } else { g as f64 }) as f32)
        .collect();
    let want_logits = gemv_ref(ty, w, e, k, &y).map_err(qerr)?;
    let (ba, bb, bn) = (pool.upload(&a)?, pool.upload(&b)?, pool.upload(&nw)?);
    let (bs, bq, bd) = (pool.alloc(k * 4)?, pool.alloc(k)?, pool.alloc(k / 16 * 4)?);
    for buf in [&bs, &bq, &bd] {
        buf.fill_bytes(0xff)?;
    }
    let nwp = ptr(&bn, k)?;
    let nm = RouterNorm {
        a: ptr(&ba, k)?,
        b: ptr(&bb, k)?,
        s: ptr(&bs, k)?,
        w: if one_plus {
            NormWeightPtr::OnePlus(nwp)
        } else {
            NormWeightPtr::Plain(nwp)
        },
        eps,
        xq: ptr(&bq, k)?,
        xds: ptr(&bd, k / 16)?,
    };
    cx.dev.moe_router_norm(&kn, args, &nm)?;
    let rd = |p: DevPtr<f32>, n: usize| read_ptr(cx.dev.stream(), p, n);
    let logits = rd(args.logits, e)?;
    let ids = read_ptr(cx.dev.stream(), args.ids, top_k)?;
    let wts = rd(args.wts, top_k)?;
    let (mut want_i, mut want_w) = (Vec::new(), Vec::new());
    for (ex, wt) in route(&logits, top_k, args.norm) {
        want_i.push(ex as f32);
        want_w.push(wt);
    }
    let got_i: Vec<f32> = ids.iter().map(|&v| v as f32).collect();
    let s_got = bs.read::<f32>(k)?;
    let xq = bq.read::<i8>(k)?;
    let ds = bd.read::<f32>(k / 16)?;
    for g in 0..k / 32 {
        let d = ds[2 * g];
        for i in 32 * g..32 * (g + 1) {
            let off = (xq[i] as f32 * d - y[i]).abs();
            if off > 0.5 * d * 1.001 + 1e-6 {
                return Err(invalid(format!(
                    "moe_router__norm side-car value {i}: {} * {d} for {} (more than half a step)",
                    xq[i], y[i]
                )));
            }
        }
    }
    Ok(Comparison::new(&logits, &want_logits)
        .merge(Comparison::new(&got_i, &want_i))
        .merge(Comparison::new(&wts, &want_w))
        .merge(Comparison::new(&s_got, &sum)))
}

impl KernelCheck for MoeGateUpCheck {
    fn name(&self) -> &'static str {
        "moe_gate_up"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeGateUp
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        BOUND
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let q = spec.key.quant;
        let ty = ggml(q).ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
        let kn = kern(cx, spec)?;
        let pool = pool(cx);
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        // (experts, ff, inputs, tokens, top-k, activation, out-of-range ids): a Qwen3-30B-A3B
        // token (2048 inputs, top-8), three tokens with GeGLU, rows of several staged chunks
        let cases = [
            (
                8usize,
                256usize,
                2048usize,
                1usize,
                8usize,
                Activation::Silu,
                false,
            ),
            (6, 96, 512, 3, 2, Activation::GeluTanh, true),
            (4, 64, 5120, 1, 2, Activation::Silu, false),
        ];
        for (ci, &(e, ff, k, n, top_k, act, bad)) in cases.iter().enumerate() {
            let pairs = n * top_k;
            let gate = random_weights(ty, e * ff, k, &mut cx.rng).map_err(qerr)?;
            let up = random_weights(ty, e * ff, k, &mut cx.rng).map_err(qerr)?;
            let x = uniform(&mut cx.rng, n * k, -2.0, 2.0);
            let (xq, xds, xv) = side_car(&x)?;
            let ids = ids_with(&mut cx.rng, pairs, e, bad);
            let mut want = vec![0f32; pairs * ff];
            for (pi, &id) in ids.iter().enumerate() {
                let Some(ex) = valid(id, e) else { continue };
                let xr = &xv[(pi / top_k) * k..][..k];
                let g = expert_ref(ty, &gate, ex, ff, k, xr)?;
                let u = expert_ref(ty, &up, ex, ff, k, xr)?;
                let h = &mut want[pi * ff..(pi + 1) * ff];
                match act {
                    Activation::Silu => crate::ops::swiglu(&g, &u, h),
                    Activation::GeluTanh => crate::ops::geglu(&g, &u, h),
                }
            }
            let (bg, bu, bq, bd, bi) = (
                pool.upload(&gate)?,
                pool.upload(&up)?,
                pool.upload(&xq)?,
                pool.upload(&xds)?,
                pool.upload(&ids)?,
            );
            let (bh, bhq, bhd) = (
                pool.alloc(pairs * ff * 4)?,
                pool.alloc(pairs * ff)?,
                pool.alloc(pairs * ff / 16 * 4)?,
            );
            for b in [&bh, &bhq, &bhd] {
                b.fill_bytes(0xff)?;
            }
            let args = MoeGateUpArgs {
                gate: ptr(&bg, gate.len())?,
                up: ptr(&bu, up.len())?,
                n_experts: e,
                ids: ptr(&bi, pairs)?,
                pairs,
                x_div: top_k,
                xq: ptr(&bq, xq.len())?,
                xds: ptr(&bd, xds.len())?,
                k,
                ff,
                act,
                h: ptr(&bh, pairs * ff)?,
                hq: ptr(&bhq, pairs * ff)?,
                hds: ptr(&bhd, pairs * ff / 16)?,
            };
            cx.dev.moe_gate_up(&kn, &args)?;
            let h = bh.read::<f32>(pairs * ff)?;
            let hq = bhq.read::<i8>(pairs * ff)?;
            let hds = bhd.read::<f32>(pairs * ff / 16)?;
            cmp = cmp
                .merge(Comparison::new(&h, &want))
                .merge(side_car_cmp(&h, &hq, &hds));
            if ci == 0 {
                let dev = cx.dev;
                // as the decode path runs it: no f32 output
                let a = MoeGateUpArgs {
                    h: DevPtr::null(),
                    ..args
                };
                micros = time_us(dev, cx.iters, || dev.moe_gate_up(&kn, &a))?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}

impl KernelCheck for MoeDownCheck {
    fn name(&self) -> &'static str {
        "moe_down"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeDown
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        BOUND
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let q = spec.key.quant;
        let ty = ggml(q).ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
        let kn = kern(cx, spec)?;
        let pool = pool(cx);
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        // (experts, out, ff, tokens, top-k, out-of-range ids): a Qwen3-30B-A3B token (768 ->
        // 2048, top-8), 100 outputs (a partial row block) over three tokens, top-16 over rows of
        // several staged chunks
        let cases = [
            (8usize, 2048usize, 768usize, 1usize, 8usize, false),
            (6, 100, 256, 3, 2, true),
            (4, 64, 2560, 2, 16, false),
        ];
        for (ci, &(e, out, ff, n, top_k, bad)) in cases.iter().enumerate() {
            let pairs = n * top_k;
            let down = random_weights(ty, e * out, ff, &mut cx.rng).map_err(qerr)?;
            let h = uniform(&mut cx.rng, pairs * ff, -1.0, 1.0);
            let (hq, hds, hv) = side_car(&h)?;
            let ids = ids_with(&mut cx.rng, pairs, e, bad);
            let wts = uniform(&mut cx.rng, pairs, 0.0, 1.0);
            let mut acc = vec![0f64; n * out];
            for (pi, &id) in ids.iter().enumerate() {
                let Some(ex) = valid(id, e) else { continue };
                let d = expert_ref(ty, &down, ex, out, ff, &hv[pi * ff..(pi + 1) * ff])?;
                let t = pi / top_k;
                for (a, &v) in acc[t * out..(t + 1) * out].iter_mut().zip(&d) {
                    *a += wts[pi] as f64 * v as f64;
                }
            }
            let want: Vec<f32> = acc.iter().map(|&v| v as f32).collect();
            let (bw, bq, bd, bi, bwt) = (
                pool.upload(&down)?,
                pool.upload(&hq)?,
                pool.upload(&hds)?,
                pool.upload(&ids)?,
                pool.upload(&wts)?,
            );
            let by = pool.alloc(n * out * 4)?;
            let mut args = MoeDownArgs {
                down: ptr(&bw, down.len())?,
                n_experts: e,
                ids: ptr(&bi, pairs)?,
                wts: ptr(&bwt, pairs)?,
                n,
                top_k,
                hq: ptr(&bq, hq.len())?,
                hds: ptr(&bd, hds.len())?,
                ff,
                out,
                y: ptr(&by, n * out)?,
                ids_early: false,
            };
            // both orders of the ids read and the programmatic-launch wait (the early one also
            // requests the rows into L2)
            for early in [false, true] {
                by.fill_bytes(0xff)?;
                args.ids_early = early;
                cx.dev.moe_down(&kn, &args)?;
                cmp = cmp.merge(Comparison::new(&by.read::<f32>(n * out)?, &want));
            }
            if ci == 0 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || dev.moe_down(&kn, &args))?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
