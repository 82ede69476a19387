//! Backend-level GPU checks of the multi-row (prefill, n >= `PREFILL_MIN_ROWS`) paths: rows of
//! the backend table after the fused decode ops (`backend_fused.rs` holds the multi-row
//! `attn_prep` cases beside the decode ones).
//!
//! Bounds:
//! - rms_norm of many rows in small groups (one warp per group) vs CpuBackend: 1e-4 (as the other
//!   norm rows); vs the same rows normed 8 at a time (the one-block-per-group kernel): 0 (the
//!   warp form adds the squares in the block's order);
//! - add_rms_norm of many rows (whole-row norms: the `__bf16` entry) vs CpuBackend: 1e-4, the
//!   sums exact; vs the CUDA add + rms_norm: 0; its bf16 side-car vs `cast_bf16`: 0 (finite
//!   values; the entry rounds with cvt.rn.bf16.f32); `linear` reading it vs without: 0;
//! - glu / glu_fused of many rows (the float4 entry) vs CpuBackend: 1e-4 (as the other GLU
//!   rows); its bf16 side-car vs the `cast_bf16` kernel on the f32 output: 0; `linear` (n > 8,
//!   the prefill GEMM) of a tensor carrying the side-car vs the same values without one: 0
//!   (the GEMM reads the same bf16 bits), and vs the f32 CPU backend: 3e-2 (as the other
//!   prefill GEMM rows).

use crate::backend::cuda::{CudaBackend, GpuTensor};
use crate::backend::{Activation, Norm};
use crate::backend::{Fused, Ops, Runtime};
use crate::kernels::{BatchBucket, Op, Quant};
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;
use crate::selftest::backend_ops::{host, tref, Ctx, Pair, R};
use crate::selftest::check::uniform;

/// The bf16 side-car of `t` against the `cast_bf16` kernel run on `t`'s f32 values, as f32.
fn bf16_side_vs_cast(gpu: &CudaBackend, t: &GpuTensor) -> R<Pair> {
    let s = t
        .bf16
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the output carries no bf16 side-car"))?;
    let st = gpu.pool.stream();
    let got: Vec<u16> = crate::backend::cuda::runtime::buf::read_ptr(st, s.ptr(), s.len)?;
    let n = t.len();
    let b = gpu.pool.alloc(n * 2)?;
    let a16 = b
        .ptr::<u16>()
        .slice(0, n)
        .ok_or_else(|| anyhow::anyhow!("cast buffer"))?;
    let k = gpu.kern(Op::CastBf16, Quant::F32, BatchBucket::Any)?;
    gpu.dev.cast_bf16_ptr(&k, t.ptr(), a16)?;
    let want: Vec<u16> = crate::backend::cuda::runtime::buf::read_ptr(st, a16, n)?;
    let f = |v: Vec<u16>| v.into_iter().map(crate::quant::bf16_to_f32).collect();
    Ok((f(got), f(want)))
}

pub(in crate::selftest) fn prefill_cases(cx: &mut Ctx) {
    norm_cases(cx);
    add_norm_cases(cx);
    glu_cases(cx);
}

fn add_norm_cases(cx: &mut Ctx) {
    let (n, d) = (16usize, 4096usize);
    let a = uniform(&mut cx.rng, n * d, -40.0, 40.0);
    let b = uniform(&mut cx.rng, n * d, -6.0, 6.0);
    let w = uniform(&mut cx.rng, d, -1.0, 1.5);
    let label = format!("add_rms_norm [{n}, {d}] (prefill, bf16 side-car)");
    cx.case(format!("{label} vs CPU"), 1e-4, |cx| {
        let (ga, ca) = cx.t2(&a, n, d)?;
        let (gb, cb) = cx.t2(&b, n, d)?;
        let (gw, cw) = cx.t2(&w, 1, d)?;
        let (gs, gy) = cx.gpu.add_rms_norm(&ga, &gb, Norm::Plain(&gw), 1e-6, d)?;
        let (cs, cy) = cx.cpu.add_rms_norm(&ca, &cb, Norm::Plain(&cw), 1e-6, d)?;
        let mut got = host(&cx.gpu, &gy)?;
        let mut want = cy.data;
        // the sums must agree exactly: any difference folds in as an O(1) error
        got.push(if host(&cx.gpu, &gs)? == cs.data {
            0.0
        } else {
            1.0
        });
        want.push(0.0);
        Ok((got, want))
    });
    cx.case(format!("{label} == CUDA add + rms_norm"), 0.0, |cx| {
        let (ga, gb) = (cx.gpu.tensor(&a, n, d)?, cx.gpu.tensor(&b, n, d)?);
        let gw = cx.gpu.tensor(&w, 1, d)?;
        let (_, gy) = cx.gpu.add_rms_norm(&ga, &gb, Norm::Plain(&gw), 1e-6, d)?;
        let s = cx.gpu.add(&ga, &gb)?;
        let y = cx.gpu.rms_norm(&s, Norm::Plain(&gw), 1e-6, d)?;
        Ok((host(&cx.gpu, &gy)?, host(&cx.gpu, &y)?))
    });
    cx.case(format!("{label} side-car == cast_bf16"), 0.0, |cx| {
        let (ga, gb) = (cx.gpu.tensor(&a, n, d)?, cx.gpu.tensor(&b, n, d)?);
        let gw = cx.gpu.tensor(&w, 1, d)?;
        let (_, gy) = cx.gpu.add_rms_norm(&ga, &gb, Norm::Plain(&gw), 1e-6, d)?;
        bf16_side_vs_cast(&cx.gpu, &gy)
    });
    let out = 256usize;
    if let Ok(wb) = random_weights(GgmlType::Q4_0, out, d, &mut cx.rng) {
        cx.case(
            format!("add_rms_norm -> linear q4_0 n={n} from the bf16 side-car == without"),
            0.0,
            |cx| {
                let gl = cx
                    .gpu
                    .upload(&tref("w", GgmlType::Q4_0, vec![out, d], &wb))?;
                let (ga, gb) = (cx.gpu.tensor(&a, n, d)?, cx.gpu.tensor(&b, n, d)?);
                let gw = cx.gpu.tensor(&w, 1, d)?;
                let (_, gy) = cx.gpu.add_rms_norm(&ga, &gb, Norm::Plain(&gw), 1e-6, d)?;
                anyhow::ensure!(gy.bf16.is_some(), "add_rms_norm wrote no bf16 side-car");
                let got = host(&cx.gpu, &cx.gpu.linear(&gy, &gl)?)?;
                let plain = cx.gpu.tensor(&host(&cx.gpu, &gy)?, n, d)?;
                Ok((got, host(&cx.gpu, &cx.gpu.linear(&plain, &gl)?)?))
            },
        );
    }
}

fn norm_cases(cx: &mut Ctx) {
    // (rows, groups per row, dim, mode): Qwen3 per-head q norm, Gemma per-head 256 with 1+w,
    // weightless 512, a small model's whole-row norm (1000: a partly filled warp)
    for (rows, heads, dim, mode) in [
        (24usize, 32usize, 128usize, 0u8),
        (16, 8, 256, 1),
        (10, 2, 512, 2),
        (12, 1, 1000, 0),
    ] {
        let cols = heads * dim;
        let x = uniform(&mut cx.rng, rows * cols, -3.0, 3.0);
        let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
        let label = format!("rms_norm [{rows}, {cols}] groups of {dim} mode {mode} (warp/group)");
        cx.case(format!("{label} vs CPU"), 1e-4, |cx| {
            let (g, h) = cx.t2(&x, rows, cols)?;
            let (gw, cw) = cx.t2(&w, 1, dim)?;
            let (gn, cn) = match mode {
                0 => (Norm::Plain(&gw), Norm::Plain(&cw)),
                1 => (Norm::OnePlus(&gw), Norm::OnePlus(&cw)),
                _ => (Norm::None, Norm::None),
            };
            Ok((
                host(&cx.gpu, &cx.gpu.rms_norm(&g, gn, 1e-6, dim)?)?,
                cx.cpu.rms_norm(&h, cn, 1e-6, dim)?.data,
            ))
        });
        cx.case(format!("{label} == 8 rows at a time"), 0.0, |cx| {
            let gw = cx.gpu.tensor(&w, 1, dim)?;
            let n = || match mode {
                0 => Norm::Plain(&gw),
                1 => Norm::OnePlus(&gw),
                _ => Norm::None,
            };
            let all = host(
                &cx.gpu,
                &cx.gpu
                    .rms_norm(&cx.gpu.tensor(&x, rows, cols)?, n(), 1e-6, dim)?,
            )?;
            let mut parts = Vec::with_capacity(all.len());
            for chunk in x.chunks(8 * cols) {
                let t = cx.gpu.tensor(chunk, chunk.len() / cols, cols)?;
                parts.extend(host(&cx.gpu, &cx.gpu.rms_norm(&t, n(), 1e-6, dim)?)?);
            }
            Ok((all, parts))
        });
    }
}

fn glu_cases(cx: &mut Ctx) {
    let (n, ff) = (16usize, 3072usize);
    let x2 = uniform(&mut cx.rng, n * 2 * ff, -6.0, 6.0);
    let (g, u) = (
        uniform(&mut cx.rng, 12 * 1000, -6.0, 6.0),
        uniform(&mut cx.rng, 12 * 1000, -2.0, 2.0),
    );
    for (label, act) in [
        ("silu", Activation::Silu),
        ("gelu_tanh", Activation::GeluTanh),
    ] {
        cx.case(
            format!("glu_fused {label} [{n}, 2x{ff}] vs CPU"),
            1e-4,
            |cx| {
                let (gx, cxt) = cx.t2(&x2, n, 2 * ff)?;
                Ok((
                    host(&cx.gpu, &cx.gpu.glu_fused(&gx, act)?)?,
                    cx.cpu.glu_fused(&cxt, act)?.data,
                ))
            },
        );
        cx.case(format!("glu {label} [12, 1000] vs CPU"), 1e-4, |cx| {
            let (ga, ca) = cx.t2(&g, 12, 1000)?;
            let (gb, cb) = cx.t2(&u, 12, 1000)?;
            Ok((
                host(&cx.gpu, &cx.gpu.glu(&ga, &gb, act)?)?,
                cx.cpu.glu(&ca, &cb, act)?.data,
            ))
        });
        cx.case(
            format!("glu_fused {label} [{n}, 2x{ff}] bf16 side-car == cast_bf16"),
            0.0,
            |cx| {
                let y = cx.gpu.glu_fused(&cx.gpu.tensor(&x2, n, 2 * ff)?, act)?;
                bf16_side_vs_cast(&cx.gpu, &y)
            },
        );
    }
    cx.case(
        "glu silu [12, 1000] bf16 side-car == cast_bf16".into(),
        0.0,
        |cx| {
            let ga = cx.gpu.tensor(&g, 12, 1000)?;
            let gb = cx.gpu.tensor(&u, 12, 1000)?;
            let y = cx.gpu.glu(&ga, &gb, Activation::Silu)?;
            bf16_side_vs_cast(&cx.gpu, &y)
        },
    );
    // the prefill GEMM reads the side-car: the same output as casting, and the CPU reference
    let out = 512usize;
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::BF16] {
        let Ok(wb) = random_weights(ty, out, ff, &mut cx.rng) else {
            continue;
        };
        cx.case(
            format!(
                "linear {} n={n} from a GLU's bf16 side-car == without",
                ty.name()
            ),
            0.0,
            |cx| {
                let gw = cx.gpu.upload(&tref("w", ty, vec![out, ff], &wb))?;
                let y = cx
                    .gpu
                    .glu_fused(&cx.gpu.tensor(&x2, n, 2 * ff)?, Activation::Silu)?;
                anyhow::ensure!(y.bf16.is_some(), "glu_fused wrote no bf16 side-car");
                let got = host(&cx.gpu, &cx.gpu.linear(&y, &gw)?)?;
                let plain = cx.gpu.tensor(&host(&cx.gpu, &y)?, n, ff)?;
                Ok((got, host(&cx.gpu, &cx.gpu.linear(&plain, &gw)?)?))
            },
        );
        cx.case(
            format!(
                "glu_fused -> linear {} n={n} (bf16 side-car) vs CPU",
                ty.name()
            ),
            3e-2,
            |cx| {
                let r = tref("w", ty, vec![out, ff], &wb);
                let (gw, cw) = (cx.gpu.upload(&r)?, cx.cpu.upload(&r)?);
                let y = cx
                    .gpu
                    .glu_fused(&cx.gpu.tensor(&x2, n, 2 * ff)?, Activation::Silu)?;
                let cy = cx.cpu.tensor(&host(&cx.gpu, &y)?, n, ff)?;
                Ok((
                    host(&cx.gpu, &cx.gpu.linear(&y, &gw)?)?,
                    cx.cpu.linear(&cy, &cw)?.data,
                ))
            },
        );
    }
}
