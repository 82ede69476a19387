//! Mixture of experts on the GPU:
//! - `moe_route` vs `backend::cpu::route` (expert ids exact, weights relative), E = 16 / 128 /
//!   256, top-k 1..16, with and without renormalisation, plus an all -inf row and a row of equal
//!   logits (the lower index wins ties); its `__order` kernel (a permutation of the pairs with
//!   non-decreasing experts);
//! - `moe_gemv` of every format vs `ops::qdot::gemv_ref` per (token, slot) pair: gate + up in one
//!   launch (token rows, interleaved outputs), down (pair rows, launched in reverse order through
//!   `perm`), and out-of-range ids (zeros);
//! - `moe_combine` vs an f64 weighted sum, and end to end `CudaDevice::moe` for n = 1, 4 (grouped
//!   GEMV), 37 (GEMV, pairs ordered by expert) and 70 (tensor-core GEMMs: grouped on the device,
//!   or by expert with a host round trip for gate/up formats without a grouped GEMM), E = 16,
//!   top-4 over random banks (gate/up Q4_K + down Q8_0 with SwiGLU and renormalisation; gate/up
//!   Q8_0 + down Q4_K with GeGLU, no renormalisation; gate/up Q5_0 + down Q6_K, SwiGLU, the
//!   host-grouped GEMM at n = 70): against a host model of the
//!   path's arithmetic (same routing; int8 activations for the GEMV, bf16 activations and
//!   weights for the GEMM) within the check's bound, and against the CPU backend's `moe` (f32)
//!   within [`E2E_CPU_BOUND`] (an error otherwise).

use crate::backend::{Ops, Runtime};
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::Rng;

use crate::backend::cpu::{route, CpuBackend};
use crate::backend::cuda::ops::moe::pipeline::{moe_dims, moe_path, MoePath};
use crate::backend::cuda::{CudaError, DevPtr, GpuWeight, MoeGemvArgs, Pool};
use crate::backend::{Activation, MoeParams};
use crate::kernels::{BatchBucket, HeadDim, KernelKey, KernelSpec, Op, Quant};
use crate::ops::qdot::{dequantize_q8_1, gemv_ref, quantize_q8_1, random_weights};
use crate::quant::GgmlType;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};
use crate::weights::{Scales, TensorFormat, TensorRef};

pub struct MoeRouteCheck;
pub struct MoeGemvCheck;
pub struct MoeCombineCheck;

/// GPU `moe` (int8 or bf16 activations) vs the CPU backend's `moe` (f32 activations): the
/// quantisation of x and of the GLU output makes the difference. The host models of the GPU
/// arithmetic are 3.4e-2 .. 8.9e-2 (int8) and 1.4e-2 .. 3.2e-2 (bf16) (worst element, relative to
/// the output RMS) from the CPU backend on these random banks, and 1e-6 without the quantisation
/// (unit test below); a wrong expert or row is O(1).
pub const E2E_CPU_BOUND: f64 = 0.2;

fn invalid(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "selftest",
        detail,
    }
}

fn qerr(e: impl std::fmt::Display) -> CudaError {
    invalid(e.to_string())
}

pub(in crate::selftest) fn ggml(q: Quant) -> Option<GgmlType> {
    Some(match q {
        Quant::F32 => GgmlType::F32,
        Quant::F16 => GgmlType::F16,
        Quant::Bf16 => GgmlType::BF16,
        Quant::Q8_0 => GgmlType::Q8_0,
        Quant::Q4_0 => GgmlType::Q4_0,
        Quant::Q5_0 => GgmlType::Q5_0,
        Quant::Q4K => GgmlType::Q4K,
        Quant::Q6K => GgmlType::Q6K,
        _ => return None,
    })
}

pub(in crate::selftest) fn ptr<T>(
    buf: &crate::backend::cuda::DevBuf,
    len: usize,
) -> Result<DevPtr<T>, CudaError> {
    buf.ptr::<T>()
        .slice(0, len)
        .ok_or_else(|| invalid(format!("buffer of {} bytes for {len} values", buf.bytes())))
}

pub(in crate::selftest) fn pool(cx: &CheckCtx<'_>) -> Arc<Pool> {
    Pool::new(cx.dev.stream().clone())
}

impl KernelCheck for MoeRouteCheck {
    fn name(&self) -> &'static str {
        "moe_route"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeRoute
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        // f32 softmax (f32 sum) vs the CPU's f64 sum; ids compared exactly (a wrong id is O(1))
        2e-5
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let pool = pool(cx);
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (ci, &(n, e, k, norm)) in [
            (37usize, 128usize, 8usize, true),
            (37, 16, 4, false),
            (5, 256, 16, true),
            (9, 60, 1, false),
            (3, 16, 16, true),
        ]
        .iter()
        .enumerate()
        {
            let mut logits = uniform(&mut cx.rng, n * e, -4.0, 4.0);
            // an all -inf row (zeros, experts 0..k) and an all-equal row (ties)
            logits[..e].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
            if n > 1 {
                logits[e..2 * e].iter_mut().for_each(|v| *v = 0.5);
            }
            let (mut want_i, mut want_w) = (Vec::new(), Vec::new());
            for t in 0..n {
                for (ex, w) in route(&logits[t * e..(t + 1) * e], k, norm) {
                    want_i.push(ex as f32);
                    want_w.push(w);
                }
            }
            let lb = pool.upload(&logits)?;
            let ib = pool.alloc(n * k * 4)?;
            let wb = pool.alloc(n * k * 4)?;
            ib.fill_bytes(0xff)?;
            wb.fill_bytes(0xff)?; // NaN
            let (l, i, w) = (
                ptr::<f32>(&lb, n * e)?,
                ptr::<i32>(&ib, n * k)?,
                ptr::<f32>(&wb, n * k)?,
            );
            cx.dev.moe_route(spec, l, i, w, n, e, k, norm)?;
            let got_i: Vec<f32> = ib.read::<i32>(n * k)?.iter().map(|&v| v as f32).collect();
            let got_w = wb.read::<f32>(n * k)?;
            cmp = cmp.merge(Comparison::new(&got_i, &want_i));
            cmp = cmp.merge(Comparison::new(&got_w, &want_w));
            // the __order kernel: a permutation of the pairs with non-decreasing experts
            let pairs = n * k;
            let pb = pool.alloc(pairs * 4)?;
            pb.fill_bytes(0xff)?;
            let perm = ptr::<i32>(&pb, pairs)?;
            cx.dev.moe_order(spec, i, perm, pairs, e)?;
            let got_p = pb.read::<i32>(pairs)?;
            let mut seen = vec![false; pairs];
            for &q in &got_p {
                match usize::try_from(q).ok().filter(|&q| q < pairs) {
                    Some(q) if !seen[q] => seen[q] = true,
                    _ => {
                        return Err(invalid(format!(
                            "moe_order: {got_p:?} is not a permutation"
                        )))
                    }
                }
            }
            let ordered: Vec<f32> = got_p.iter().map(|&q| got_i[q as usize]).collect();
            let mut sorted = want_i.clone();
            sorted.sort_by(f32::total_cmp);
            cmp = cmp.merge(Comparison::new(&ordered, &sorted));
            if ci == 0 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || {
                    dev.moe_route(spec, l, i, w, n, e, k, norm)
                })?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}

/// Quantised activation rows as uploaded: int8 values and {d, d*sum} per 32.
type Int8Rows = (Vec<i8>, Vec<f32>);

/// The activations a `moe_gemv` of format `ty` sees for rows `x` (`k` each): the values
/// themselves (float formats) or their int8 quantisation (block formats, as uploaded).
fn act_ref(ty: GgmlType, x: &[f32]) -> Result<(Vec<f32>, Option<Int8Rows>), CudaError> {
    if ty.block().0 == 1 {
        return Ok((x.to_vec(), None));
    }
    let a = quantize_q8_1(x).map_err(qerr)?;
    let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
    Ok((dequantize_q8_1(&a), Some((a.qs, ds))))
}

fn random_ids(rng: &mut StdRng, pairs: usize, e: usize) -> Vec<i32> {
    (0..pairs).map(|_| rng.random_range(0..e as i32)).collect()
}

impl KernelCheck for MoeGemvCheck {
    fn name(&self) -> &'static str {
        "moe_gemv"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeGemv
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        // as the dense gemv: f32 accumulation vs an f64 reference over the same activations
        2e-4
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let q = spec.key.quant;
        let ty = ggml(q).ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
        let float_w = ty.block().0 == 1;
        let shapes: &[(usize, usize)] = match ty {
            // odd row counts: expert starts off 16-byte alignment (except Q4_K, 144-byte
            // blocks); the second shape needs several staged chunks per row
            GgmlType::Q4K | GgmlType::Q6K => &[(201, 1024), (72, 5120)],
            _ if float_w => &[(137, 320), (40, 75)],
            _ => &[(137, 1184), (40, 8192)],
        };
        let pool = pool(cx);
        let e = 6usize;
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (si, &(n, k)) in shapes.iter().enumerate() {
            let rb = ty.row_bytes(k).map_err(qerr)?;
            let eb = n * rb;
            let banks = [
                random_weights(ty, e * n, k, &mut cx.rng).map_err(qerr)?,
                random_weights(ty, e * n, k, &mut cx.rng).map_err(qerr)?,
            ];
            let dbanks = [pool.upload(&banks[0])?, pool.upload(&banks[1])?];
            let wp = [
                ptr::<u8>(&dbanks[0], e * eb)?,
                ptr::<u8>(&dbanks[1], e * eb)?,
            ];
            // (x_div, pairs, two matrices, poison one id)
            for &(x_div, pairs, two, bad_id) in
                &[(2usize, 6usize, true, false), (1, 5, false, true)]
            {
                let rows = (pairs - 1) / x_div + 1;
                let x = uniform(&mut cx.rng, rows * k, -2.0, 2.0);
                let (xr, xq) = act_ref(ty, &x)?;
                let mut ids = random_ids(&mut cx.rng, pairs, e);
                if bad_id {
                    ids[1] = e as i32;
                    ids[3] = -1;
                }
                let mats_n = if two { 2 } else { 1 };
                let ldy = if two { 2 * n + 3 } else { n };
                let mut want = vec![f32::NAN; pairs * ldy];
                for p in 0..pairs {
                    for (m, bank) in banks.iter().enumerate().take(mats_n) {
                        let off = p * ldy + if m == 1 { n + 3 } else { 0 };
                        let ex = ids[p];
                        let y = if ex < 0 || ex as usize >= e {
                            vec![0.0; n]
                        } else {
                            let ex = ex as usize;
                            gemv_ref(
                                ty,
                                &bank[ex * eb..(ex + 1) * eb],
                                n,
                                k,
                                &xr[(p / x_div) * k..][..k],
                            )
                            .map_err(qerr)?
                        };
                        want[off..off + n].copy_from_slice(&y);
                    }
                }
                let xb = pool.upload(&x)?;
                let ib = pool.upload(&ids)?;
                // the down-style case runs the pairs in reverse order
                let pb = if two {
                    None
                } else {
                    Some(pool.upload(&(0..pairs as i32).rev().collect::<Vec<i32>>())?)
                };
                let (qb, db) = match &xq {
                    Some((qs, ds)) => (Some(pool.upload(qs)?), Some(pool.upload(ds)?)),
                    None => (None, None),
                };
                let yb = pool.alloc(pairs * ldy * 4)?;
                yb.fill_bytes(0xff)?;
                let y = ptr::<f32>(&yb, pairs * ldy)?;
                let y_up = y.slice(n + 3, pairs * ldy - n - 3).unwrap_or(y);
                let mats = [(wp[0], y), (wp[1], y_up)];
                let args = MoeGemvArgs {
                    mats: &mats[..mats_n],
                    n_experts: e,
                    ids: ptr(&ib, pairs)?,
                    perm: match &pb {
                        Some(b) => ptr(b, pairs)?,
                        None => DevPtr::null(),
                    },
                    pairs,
                    x: ptr(&xb, rows * k)?,
                    xq: match &qb {
                        Some(b) => ptr(b, rows * k)?,
                        None => DevPtr::null(),
                    },
                    xds: match &db {
                        Some(b) => ptr(b, rows * k / 16)?,
                        None => DevPtr::null(),
                    },
                    x_div,
                    n,
                    k,
                    ldy,
                };
                cx.dev.moe_gemv(spec, &args)?;
                let got = yb.read::<f32>(pairs * ldy)?;
                // the gap columns between the two halves stay NaN in both
                cmp = cmp.merge(Comparison::new(&got, &want));
                if si == 0 && two {
                    let dev = cx.dev;
                    micros = time_us(dev, cx.iters, || dev.moe_gemv(spec, &args))?;
                }
            }
        }
        Ok(Measured { cmp, micros })
    }
}

/// An expert bank `[e, rows, cols]` of `ty` with random contents.
pub(in crate::selftest) struct Bank {
    pub ty: GgmlType,
    pub q: Quant,
    pub e: usize,
    pub rows: usize,
    pub cols: usize,
    pub bytes: Vec<u8>,
}

impl Bank {
    pub fn random(
        q: Quant,
        e: usize,
        rows: usize,
        cols: usize,
        rng: &mut StdRng,
    ) -> Result<Bank, CudaError> {
        let ty = ggml(q).ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
        let bytes = random_weights(ty, e * rows, cols, rng).map_err(qerr)?;
        Ok(Bank {
            ty,
            q,
            e,
            rows,
            cols,
            bytes,
        })
    }
    pub fn tensor_ref(&self, name: &str) -> TensorRef<'_> {
        TensorRef {
            name: name.into(),
            shape: vec![self.e, self.rows, self.cols],
            format: TensorFormat::Ggml(self.ty),
            data: &self.bytes,
            scales: Scales::default(),
        }
    }
    pub fn expert(&self, ex: usize) -> &[u8] {
        let eb = self.bytes.len() / self.e;
        &self.bytes[ex * eb..(ex + 1) * eb]
    }
    fn to_gpu(&self, pool: &Arc<Pool>) -> Result<GpuWeight, CudaError> {
        Ok(GpuWeight {
            data: pool.upload_persistent(&self.bytes)?,
            quant: self.q,
            shape: vec![self.e, self.rows, self.cols],
            scales: None,
            fp8_block: (0, 0),
            f32: None,
        })
    }
}

/// One end-to-end case: random x, logits and banks.
pub(in crate::selftest) struct Case {
    pub n: usize,
    pub hidden: usize,
    pub x: Vec<f32>,
    pub logits: Vec<f32>,
    pub gate: Bank,
    pub up: Bank,
    pub down: Bank,
    pub p: MoeParams,
}

/// The shapes and formats of a random MoE case.
#[derive(Debug, Clone, Copy)]
pub(in crate::selftest) struct CaseSpec {
    pub e: usize,
    pub k: usize,
    pub hidden: usize,
    pub ff: usize,
    pub q_gate_up: Quant,
    pub q_down: Quant,
    pub act: Activation,
    pub norm: bool,
}

/// Variants of the end-to-end check: (gate/up, down, activation, renormalise).
const VARIANTS: [(Quant, Quant, Activation, bool); 3] = [
    (Quant::Q4K, Quant::Q8_0, Activation::Silu, true),
    (Quant::Q8_0, Quant::Q4K, Activation::GeluTanh, false),
    // no grouped GEMM for Q5_0: the host-grouped per-expert GEMMs at n = 70
    (Quant::Q5_0, Quant::Q6K, Activation::Silu, true),
];

fn make_case(rng: &mut StdRng, n: usize, variant: usize) -> Result<Case, CudaError> {
    let (q_gate_up, q_down, act, norm) = VARIANTS[variant];
    make_case_with(
        rng,
        n,
        &CaseSpec {
            e: 16,
            k: 4,
            hidden: 512,
            ff: 256,
            q_gate_up,
            q_down,
            act,
            norm,
        },
    )
}

/// Random x, router logits and banks of `s` for `n` tokens.
pub(in crate::selftest) fn make_case_with(
    rng: &mut StdRng,
    n: usize,
    s: &CaseSpec,
) -> Result<Case, CudaError> {
    let (e, hidden, ff) = (s.e, s.hidden, s.ff);
    Ok(Case {
        n,
        hidden,
        x: uniform(rng, n * hidden, -1.0, 1.0),
        logits: uniform(rng, n * e, -3.0, 3.0),
        gate: Bank::random(s.q_gate_up, e, ff, hidden, rng)?,
        up: Bank::random(s.q_gate_up, e, ff, hidden, rng)?,
        down: Bank::random(s.q_down, e, hidden, ff, rng)?,
        p: MoeParams {
            n_experts: e,
            top_k: s.k,
            norm_topk: s.norm,
            act: s.act,
        },
    })
}

/// The activation arithmetic a `moe` path uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::selftest) enum Mode {
    /// Grouped GEMV: int8 activations per 32 for block formats.
    Int8,
    /// By-expert GEMM: bf16 activations and weights dequantised then rounded to bf16.
    Bf16,
    /// Plain f32 (the CPU backend; the unit test).
    #[cfg_attr(not(test), allow(dead_code))]
    F32,
}

pub(in crate::selftest) fn bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// One expert's `[rows, cols]` product with `x` under `mode`, f64 accumulation.
fn expert_dot(b: &Bank, ex: usize, x: &[f32], mode: Mode) -> Result<Vec<f32>, CudaError> {
    let (rows, cols) = (b.rows, b.cols);
    match mode {
        Mode::F32 => gemv_ref(b.ty, b.expert(ex), rows, cols, x).map_err(qerr),
        Mode::Int8 => gemv_ref(b.ty, b.expert(ex), rows, cols, &act_ref(b.ty, x)?.0).map_err(qerr),
        Mode::Bf16 => {
            let rb = b.ty.row_bytes(cols).map_err(qerr)?;
            let xb: Vec<f32> = x.iter().map(|&v| bf16(v)).collect();
            let mut row = vec![0f32; cols];
            (0..rows)
                .map(|r| {
                    crate::quant::dequantize(b.ty, &b.expert(ex)[r * rb..(r + 1) * rb], &mut row)
                        .map_err(qerr)?;
                    Ok(row
                        .iter()
                        .zip(&xb)
                        .map(|(&w, &v)| bf16(w) as f64 * v as f64)
                        .sum::<f64>() as f32)
                })
                .collect()
        }
    }
}

/// Host model of a GPU path: the CPU router, the path's activation arithmetic before each
/// projection, f64 dot products, slots summed in routing order.
pub(in crate::selftest) fn gpu_model(c: &Case, mode: Mode) -> Result<Vec<f32>, CudaError> {
    let (h, e, ff) = (c.hidden, c.p.n_experts, c.gate.rows);
    let mut out = vec![0f32; c.n * c.down.rows];
    for t in 0..c.n {
        let xr = &c.x[t * h..(t + 1) * h];
        let mut acc = vec![0f32; c.down.rows];
        for (ex, w) in route(&c.logits[t * e..(t + 1) * e], c.p.top_k, c.p.norm_topk) {
            let g = expert_dot(&c.gate, ex, xr, mode)?;
            let u = expert_dot(&c.up, ex, xr, mode)?;
            let mut hm = vec![0f32; ff];
            match c.p.act {
                Activation::Silu => crate::ops::swiglu(&g, &u, &mut hm),
                Activation::GeluTanh => crate::ops::geglu(&g, &u, &mut hm),
            }
            let d = expert_dot(&c.down, ex, &hm, mode)?;
            acc.iter_mut().zip(&d).for_each(|(a, v)| *a += w * v);
        }
        out[t * c.down.rows..(t + 1) * c.down.rows].copy_from_slice(&acc);
    }
    Ok(out)
}

/// The CPU backend's `moe` (f32 activations).
pub(in crate::selftest) fn cpu_moe(c: &Case) -> Result<Vec<f32>, CudaError> {
    let be = CpuBackend::new();
    let x = be.tensor(&c.x, c.n, c.hidden).map_err(qerr)?;
    let l = be.tensor(&c.logits, c.n, c.p.n_experts).map_err(qerr)?;
    let g = be.upload(&c.gate.tensor_ref("gate_exps")).map_err(qerr)?;
    let u = be.upload(&c.up.tensor_ref("up_exps")).map_err(qerr)?;
    let d = be.upload(&c.down.tensor_ref("down_exps")).map_err(qerr)?;
    let y = be.moe(&x, &l, &g, &u, &d, &c.p).map_err(qerr)?;
    be.to_host(&y).map_err(qerr)
}

impl KernelCheck for MoeCombineCheck {
    fn name(&self) -> &'static str {
        "moe_combine"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::MoeCombine
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        // combine alone ~1e-7; end to end vs the host model: f32 accumulations vs f64 (~1e-6),
        // and the rare int8 rounding flip of a GLU value the GPU computed a few ulp apart from
        // the model (one step of amax/127 in one term of a 256-term dot product: up to ~7e-3 of
        // the output RMS for these heavy-tailed random banks; a bf16 flip on the GEMM path moves
        // a term by 2^-8 of itself, less); an indexing bug is O(1)
        3e-2
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let pool = pool(cx);
        let mut cmp = Comparison::default();
        // combine alone: 37 tokens x 1000 columns, top-8
        let (n, cols, k) = (37usize, 1000usize, 8usize);
        let d = uniform(&mut cx.rng, n * k * cols, -2.0, 2.0);
        let w = uniform(&mut cx.rng, n * k, 0.0, 1.0);
        let want: Vec<f32> = (0..n * cols)
            .map(|i| {
                let (t, c) = (i / cols, i % cols);
                (0..k)
                    .map(|j| w[t * k + j] as f64 * d[(t * k + j) * cols + c] as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let (db, wb, ob) = (
            pool.upload(&d)?,
            pool.upload(&w)?,
            pool.alloc(n * cols * 4)?,
        );
        ob.fill_bytes(0xff)?;
        let (dp, wp, op) = (ptr(&db, d.len())?, ptr(&wb, w.len())?, ptr(&ob, n * cols)?);
        cx.dev.moe_combine(spec, dp, wp, op, n, cols, k)?;
        cmp = cmp.merge(Comparison::new(&ob.read::<f32>(n * cols)?, &want));
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.moe_combine(spec, dp, wp, op, n, cols, k)
        })?;

        // end to end (needs every MoE instance of this arch family)
        let have = |op: Op, q: Quant| {
            cx.dev
                .resolve(op, q, HeadDim::Any, BatchBucket::Any)
                .is_ok()
        };
        if ![Quant::Q4K, Quant::Q8_0, Quant::Q5_0, Quant::Q6K]
            .iter()
            .all(|&q| have(Op::MoeGemv, q))
        {
            return Err(invalid(
                "moe_gemv q4_k / q8_0 / q5_0 / q6_k missing for this device".into(),
            ));
        }
        let mut vs_cpu = Comparison::default();
        let mut paths = Vec::new();
        for variant in 0..VARIANTS.len() {
            // decode (grouped GEMV), ordered GEMV (37), by-expert GEMM (70)
            for n in [1usize, 4, 37, 70] {
                let c = make_case(&mut cx.rng, n, variant)?;
                let (g, u, dn) = (
                    c.gate.to_gpu(&pool)?,
                    c.up.to_gpu(&pool)?,
                    c.down.to_gpu(&pool)?,
                );
                let xb = pool.upload(&c.x)?;
                let lb = pool.upload(&c.logits)?;
                let x = ptr(&xb, c.x.len())?;
                let l = ptr(&lb, c.logits.len())?;
                let out = cx.dev.moe(&pool, x, n, l, &g, &u, &dn, &c.p)?;
                let got = out.read::<f32>(n * c.down.rows)?;
                let dims = moe_dims(
                    n,
                    c.x.len(),
                    c.logits.len(),
                    (&g.shape, g.quant),
                    (&u.shape, u.quant),
                    (&dn.shape, dn.quant),
                    &c.p,
                )?;
                let path = moe_path(n, &dims, [g.quant, u.quant, dn.quant]);
                let mode = match path {
                    MoePath::Gemm | MoePath::Grouped => Mode::Bf16,
                    MoePath::Gemv | MoePath::GemvOrdered => Mode::Int8,
                };
                paths.push((n, mode, path));
                cmp = cmp.merge(Comparison::new(&got, &gpu_model(&c, mode)?));
                vs_cpu = vs_cpu.merge(Comparison::new(&got, &cpu_moe(&c)?));
            }
        }
        let gemm_on = crate::backend::cuda::ops::moe::pipeline::prefill_gemm_enabled();
        let grouped_on = crate::backend::cuda::ops::moe::pipeline::prefill_grouped_enabled();
        if paths.iter().any(|p| p.1 == Mode::Bf16) != gemm_on
            || !paths.iter().any(|p| p.1 == Mode::Int8)
            || (gemm_on && !paths.iter().any(|p| p.2 == MoePath::Gemm))
            || paths.iter().any(|p| p.2 == MoePath::Grouped) != (gemm_on && grouped_on)
        {
            return Err(invalid(format!("moe paths not all covered: {paths:?}")));
        }
        if !vs_cpu.passes(E2E_CPU_BOUND) {
            return Err(invalid(format!(
                "CudaDevice::moe vs the CPU backend: max rel err {:.3e} (unwritten {}) > {E2E_CPU_BOUND:e}",
                vs_cpu.max_rel_err, vs_cpu.unwritten
            )));
        }
        Ok(Measured { cmp, micros })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// The host model of the GPU arithmetic stays within E2E_CPU_BOUND of the CPU backend (so
    /// the GPU check's second bound is about quantisation, not luck), and is not trivially equal.
    #[test]
    fn gpu_model_vs_cpu_backend() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut worst: f64 = 0.0;
        for variant in 0..VARIANTS.len() {
            for n in [1usize, 4, 37] {
                let c = make_case(&mut rng, n, variant).unwrap();
                let a = gpu_model(&c, Mode::Int8).unwrap();
                let b = cpu_moe(&c).unwrap();
                let cmp = Comparison::new(&a, &b);
                assert_eq!(cmp.unwritten, 0);
                worst = worst.max(cmp.max_rel_err);
                // without the int8 activations the model is the CPU backend up to rounding
                let f = Comparison::new(&gpu_model(&c, Mode::F32).unwrap(), &b);
                let h = Comparison::new(&gpu_model(&c, Mode::Bf16).unwrap(), &b);
                eprintln!(
                    "variant {variant} n {n}: int8 {:.3e}, bf16 {:.3e}, f32 {:.3e}",
                    cmp.max_rel_err, h.max_rel_err, f.max_rel_err
                );
                assert!(f.passes(1e-4), "{f:?}");
                assert!(h.passes(E2E_CPU_BOUND / 2.0), "{h:?}");
            }
        }
        eprintln!("host model of the GPU moe vs CPU backend: max rel err {worst:.3e}");
        assert!(worst > 0.0 && worst < E2E_CPU_BOUND / 2.0, "{worst}");
    }
}
