//! Backend-level GPU checks of the fused decode ops (rows of the backend table, after the plain
//! ops of `backend_ops.rs`).
//!
//! Bounds:
//! - int8 side-car (rms_norm / add_rms_norm / glu of one row): every byte and scale equal to
//!   what the `quantize_q8` kernel makes of the same f32 output (0); `linear` of a tensor
//!   carrying one equals `linear` of the same values without one (0), and the int8 CPU
//!   reference (1e-3, as the other block-format GEMV rows);
//! - add_rms_norm vs CpuBackend (its default: add, then rms_norm): sum 0, norm 1e-4; vs the
//!   CUDA add + rms_norm: 0 (same norm code, same block size);
//! - norm_add_rms_norm vs CpuBackend (its default: rms_norm, add, scale, rms_norm): sum and
//!   norm 1e-4 (the sum carries the branch norm's rounding); vs the CUDA rms_norm, add, scale
//!   and rms_norm kernels: 0 (same norm code, same block size); its side-car == quantize_q8: 0;
//! - attn_prep vs CpuBackend's rms_norm + rope (q) and the cache encoding of kv_write applied to
//!   its k / v (every cache byte, exact up to rounding ties; see `checks::attn_prep`): 1e-4;
//!   vs `attn_prep_composed` on the same device (rms_norm, rope, kv_write kernels): 0, also
//!   for the multi-row cases (rows >= 9: attn_prep's one-warp-per-head entry against the
//!   one-warp-per-group rms_norm, both adding squares in the block kernel's order).

use crate::backend::cuda::ops::attention::cache::CacheContents;
use crate::backend::cuda::ops::attention::kv::{kv_layout, kv_quant};
use crate::backend::cuda::{CudaBackend, GpuKvCache, GpuTensor, KvType};
use crate::backend::{
    attn_prep_composed, step_at, Activation, AttnPrep, KvShape, Norm, PostNorm, Rope,
};
use crate::backend::{Fused, Ops, Runtime};
use crate::kernels::{BatchBucket, Op, Quant};
use crate::ops::qdot::random_weights;
use crate::ops::RopeLayout;
use crate::quant::GgmlType;
use crate::selftest::attention::attn_prep::cache_expect;
use crate::selftest::backend_ops::{host, tref, Ctx, Pair, R};
use crate::selftest::check::uniform;
use crate::selftest::elementwise::add_rmsnorm::side_car_cmp;

/// The side-car of `t` (an error when it has none) as `(q, ds)` host values.
pub(in crate::selftest) fn side_car(gpu: &CudaBackend, t: &GpuTensor) -> R<(Vec<i8>, Vec<f32>)> {
    let s =
        t.q8.as_ref()
            .ok_or_else(|| anyhow::anyhow!("the output carries no int8 side-car"))?;
    let st = gpu.pool.stream();
    Ok((
        crate::backend::cuda::runtime::buf::read_ptr(st, s.q(), s.len)?,
        crate::backend::cuda::runtime::buf::read_ptr(st, s.ds(), s.len / 16)?,
    ))
}

/// `t`'s side-car against the `quantize_q8` kernel run on `t`'s values: (got, want) as f32
/// (int8 values, then the scale pairs).
fn side_car_vs_kernel(gpu: &CudaBackend, t: &GpuTensor) -> R<Pair> {
    let (q, ds) = side_car(gpu, t)?;
    let n = t.len();
    let qb = gpu.pool.alloc(n)?;
    let db = gpu.pool.alloc(n / 16 * 4)?;
    let (xq, xds) = (qb.ptr::<i8>(), db.f32());
    let k = gpu.kern(Op::QuantizeQ8, Quant::F32, BatchBucket::Any)?;
    gpu.dev.quantize_q8_ptr(&k, t.ptr(), xq, xds)?;
    let st = gpu.pool.stream();
    let wq = crate::backend::cuda::runtime::buf::read_ptr(st, xq, n)?;
    let wd = crate::backend::cuda::runtime::buf::read_ptr(st, xds, n / 16)?;
    let mut got: Vec<f32> = q.iter().map(|&v| v as f32).collect();
    got.extend(ds);
    let mut want: Vec<f32> = wq.iter().map(|&v| v as f32).collect();
    want.extend(wd);
    Ok((got, want))
}

pub(in crate::selftest) fn side_car_cases(cx: &mut Ctx) {
    let w4096 = uniform(&mut cx.rng, 4096, -1.0, 1.5);
    let w5120 = uniform(&mut cx.rng, 5120, -1.0, 1.5);
    for (name, dim, one_plus) in [
        ("rms_norm 1x4096 side-car == quantize_q8", 4096usize, false),
        ("rms_norm 1x5120 1+w side-car == quantize_q8", 5120, true),
    ] {
        let x = uniform(&mut cx.rng, dim, -3.0, 3.0);
        let w = if dim == 4096 { &w4096 } else { &w5120 };
        cx.case(name.into(), 0.0, |cx| {
            let g = cx.gpu.tensor(&x, 1, dim)?;
            let gw = cx.gpu.tensor(w, 1, dim)?;
            let n = if one_plus {
                Norm::OnePlus(&gw)
            } else {
                Norm::Plain(&gw)
            };
            let y = cx.gpu.rms_norm(&g, n, 1e-6, dim)?;
            let mut pair = side_car_vs_kernel(&cx.gpu, &y)?;
            // and the CPU encoding of the same f32 values (bit-identical by construction)
            let (q, ds) = side_car(&cx.gpu, &y)?;
            let c = side_car_cmp(&host(&cx.gpu, &y)?, &q, &ds);
            pair.0.push(c.max_rel_err as f32);
            pair.1.push(0.0);
            Ok(pair)
        });
    }
    let (ff, x2) = (3072usize, uniform(&mut cx.rng, 2 * 3072, -6.0, 6.0));
    for (name, act, fused) in [
        (
            "glu_fused silu 1x3072 side-car == quantize_q8",
            Activation::Silu,
            true,
        ),
        (
            "glu gelu_tanh 1x3072 side-car == quantize_q8",
            Activation::GeluTanh,
            false,
        ),
    ] {
        cx.case(name.into(), 0.0, |cx| {
            let y = if fused {
                cx.gpu.glu_fused(&cx.gpu.tensor(&x2, 1, 2 * ff)?, act)?
            } else {
                let g = cx.gpu.tensor(&x2[..ff], 1, ff)?;
                let u = cx.gpu.tensor(&x2[ff..], 1, ff)?;
                cx.gpu.glu(&g, &u, act)?
            };
            side_car_vs_kernel(&cx.gpu, &y)
        });
    }
    let (a, b) = (
        uniform(&mut cx.rng, 4096, -3.0, 3.0),
        uniform(&mut cx.rng, 4096, -3.0, 3.0),
    );
    cx.case(
        "add_rms_norm 1x4096 side-car == quantize_q8".into(),
        0.0,
        |cx| {
            let (ga, gb) = (cx.gpu.tensor(&a, 1, 4096)?, cx.gpu.tensor(&b, 1, 4096)?);
            let gw = cx.gpu.tensor(&w4096, 1, 4096)?;
            let (_, y) = cx
                .gpu
                .add_rms_norm(&ga, &gb, Norm::Plain(&gw), 1e-6, 4096)?;
            side_car_vs_kernel(&cx.gpu, &y)
        },
    );
    // linear reads the side-car: the same result as quantising in linear, and the CPU reference
    let (out, k) = (512usize, 4096usize);
    for ty in [GgmlType::Q4_0, GgmlType::Q6K] {
        let Ok(wb) = random_weights(ty, out, k, &mut cx.rng) else {
            continue;
        };
        let r = tref("w", ty, vec![out, k], &wb);
        let x = uniform(&mut cx.rng, k, -3.0, 3.0);
        cx.case(
            format!("linear {} n=1 from a side-car == without", ty.name()),
            0.0,
            |cx| {
                let gw = cx.gpu.upload(&r)?;
                let g = cx.gpu.tensor(&x, 1, k)?;
                let nw = cx.gpu.tensor(&w4096, 1, k)?;
                let y = cx.gpu.rms_norm(&g, Norm::Plain(&nw), 1e-6, k)?;
                anyhow::ensure!(y.q8.is_some(), "rms_norm wrote no side-car");
                let got = host(&cx.gpu, &cx.gpu.linear(&y, &gw)?)?;
                let plain = cx.gpu.tensor(&host(&cx.gpu, &y)?, 1, k)?;
                Ok((got, host(&cx.gpu, &cx.gpu.linear(&plain, &gw)?)?))
            },
        );
        cx.case(
            format!(
                "rms_norm -> linear {} n=1 (side-car) vs CPU int8",
                ty.name()
            ),
            1e-3,
            |cx| {
                let (gw, cw) = (cx.gpu.upload(&r)?, cx.cpu8.upload(&r)?);
                let g = cx.gpu.tensor(&x, 1, k)?;
                let gn = cx.gpu.tensor(&w4096, 1, k)?;
                let gy = cx.gpu.rms_norm(&g, Norm::Plain(&gn), 1e-6, k)?;
                // the CPU GEMV of the very values the GPU norm wrote (same int8 activations)
                let cy = cx.cpu8.tensor(&host(&cx.gpu, &gy)?, 1, k)?;
                Ok((
                    host(&cx.gpu, &cx.gpu.linear(&gy, &gw)?)?,
                    cx.cpu8.linear(&cy, &cw)?.data,
                ))
            },
        );
    }
}

pub(in crate::selftest) fn add_rms_norm_cases(cx: &mut Ctx) {
    // (rows, cols, dim, mode): a decode row, a prefill block with 1+w, per-head weightless
    for (rows, cols, dim, mode) in [
        (1usize, 4096usize, 4096usize, 0u8),
        (5, 2560, 2560, 1),
        (3, 512, 128, 2),
    ] {
        let a = uniform(&mut cx.rng, rows * cols, -40.0, 40.0);
        let b = uniform(&mut cx.rng, rows * cols, -6.0, 6.0);
        let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
        let label = format!("add_rms_norm [{rows}, {cols}] groups of {dim} mode {mode}");
        cx.case(format!("{label} vs CPU"), 1e-4, |cx| {
            let (ga, ca) = cx.t2(&a, rows, cols)?;
            let (gb, cb) = cx.t2(&b, rows, cols)?;
            let (gw, cw) = cx.t2(&w, 1, dim)?;
            let (gn, cn) = match mode {
                0 => (Norm::Plain(&gw), Norm::Plain(&cw)),
                1 => (Norm::OnePlus(&gw), Norm::OnePlus(&cw)),
                _ => (Norm::None, Norm::None),
            };
            let (gs, gy) = cx.gpu.add_rms_norm(&ga, &gb, gn, 1e-6, dim)?;
            let (cs, cy) = cx.cpu.add_rms_norm(&ca, &cb, cn, 1e-6, dim)?;
            // the sums must agree exactly: fold any difference in as an O(1) error
            let (gsum, csum) = (host(&cx.gpu, &gs)?, cs.data);
            let mut got = host(&cx.gpu, &gy)?;
            let mut want = cy.data;
            got.push(if gsum == csum { 0.0 } else { 1.0 });
            want.push(0.0);
            Ok((got, want))
        });
        cx.case(format!("{label} == CUDA add + rms_norm"), 0.0, |cx| {
            let ga = cx.gpu.tensor(&a, rows, cols)?;
            let gb = cx.gpu.tensor(&b, rows, cols)?;
            let gw = cx.gpu.tensor(&w, 1, dim)?;
            let n = || match mode {
                0 => Norm::Plain(&gw),
                1 => Norm::OnePlus(&gw),
                _ => Norm::None,
            };
            let (gs, gy) = cx.gpu.add_rms_norm(&ga, &gb, n(), 1e-6, dim)?;
            let s = cx.gpu.add(&ga, &gb)?;
            let y = cx.gpu.rms_norm(&s, n(), 1e-6, dim)?;
            let mut got = host(&cx.gpu, &gs)?;
            got.extend(host(&cx.gpu, &gy)?);
            let mut want = host(&cx.gpu, &s)?;
            want.extend(host(&cx.gpu, &y)?);
            Ok((got, want))
        });
    }
}

/// One norm_add_rms_norm case: rows, cols, group size, the branch norm's mode (None: no norm;
/// 0 plain, 1 1+w, 2 weightless), the sum's norm mode, the scale.
type NormAddCase = (usize, usize, usize, Option<u8>, u8, Option<f32>);

/// The norm of `mode` (0 plain, 1 1+w, else weightless) with weight `w`.
fn norm<T>(mode: u8, w: &T) -> Norm<'_, T> {
    match mode {
        0 => Norm::Plain(w),
        1 => Norm::OnePlus(w),
        _ => Norm::None,
    }
}

pub(in crate::selftest) fn norm_add_rms_norm_cases(cx: &mut Ctx) {
    let cases: [NormAddCase; 5] = [
        // Gemma 4 12B decode: post-FFN norm, layer scalar, next attn_norm (4 blocks + side-car)
        (1, 3840, 3840, Some(0), 0, Some(0.6)),
        // post-attention norm, add, ffn_norm (no scale)
        (1, 3840, 3840, Some(0), 0, None),
        // MoE layer end: the branch already normed, scalar only
        (1, 2816, 2816, None, 0, Some(1.5)),
        // Gemma 3 prefill block with 1+w norms, on the loop path
        (5, 5376, 5376, Some(1), 1, None),
        // per-head weightless groups
        (3, 512, 128, Some(2), 2, Some(0.5)),
    ];
    for (rows, cols, dim, bmode, mode, scale) in cases {
        let a = uniform(&mut cx.rng, rows * cols, -40.0, 40.0);
        let b = uniform(&mut cx.rng, rows * cols, -6.0, 6.0);
        let wb = uniform(&mut cx.rng, dim, -1.0, 1.5);
        let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
        let label = format!(
            "norm_add_rms_norm [{rows}, {cols}] groups of {dim} post {bmode:?} mode {mode} scale {scale:?}"
        );
        cx.case(format!("{label} vs CPU"), 1e-4, |cx| {
            let (ga, ca) = cx.t2(&a, rows, cols)?;
            let (gb, cb) = cx.t2(&b, rows, cols)?;
            let (gwb, cwb) = cx.t2(&wb, 1, dim)?;
            let (gw, cw) = cx.t2(&w, 1, dim)?;
            let gp = PostNorm {
                norm: bmode.map(|m| norm(m, &gwb)),
                scale,
            };
            let cp = PostNorm {
                norm: bmode.map(|m| norm(m, &cwb)),
                scale,
            };
            let (gs, gy) = cx
                .gpu
                .norm_add_rms_norm(&ga, &gb, &gp, norm(mode, &gw), 1e-6, dim)?;
            let (cs, cy) = cx
                .cpu
                .norm_add_rms_norm(&ca, &cb, &cp, norm(mode, &cw), 1e-6, dim)?;
            let mut got = host(&cx.gpu, &gs)?;
            got.extend(host(&cx.gpu, &gy)?);
            let mut want = cs.data;
            want.extend(cy.data);
            Ok((got, want))
        });
        cx.case(
            format!("{label} == CUDA rms_norm + add + scale + rms_norm"),
            0.0,
            |cx| {
                let ga = cx.gpu.tensor(&a, rows, cols)?;
                let gb = cx.gpu.tensor(&b, rows, cols)?;
                let gwb = cx.gpu.tensor(&wb, 1, dim)?;
                let gw = cx.gpu.tensor(&w, 1, dim)?;
                let p = PostNorm {
                    norm: bmode.map(|m| norm(m, &gwb)),
                    scale,
                };
                let (gs, gy) =
                    cx.gpu
                        .norm_add_rms_norm(&ga, &gb, &p, norm(mode, &gw), 1e-6, dim)?;
                let gpu = &cx.gpu;
                let u = match bmode {
                    Some(m) => gpu.rms_norm(&gb, norm(m, &gwb), 1e-6, dim)?,
                    None => gpu.scale(&gb, 1.0)?,
                };
                let s = gpu.add(&ga, &u)?;
                let s = match scale {
                    Some(c) => gpu.scale(&s, c)?,
                    None => s,
                };
                let y = gpu.rms_norm(&s, norm(mode, &gw), 1e-6, dim)?;
                let mut got = host(gpu, &gs)?;
                got.extend(host(gpu, &gy)?);
                let mut want = host(gpu, &s)?;
                want.extend(host(gpu, &y)?);
                Ok((got, want))
            },
        );
        if rows == 1 && dim == cols {
            cx.case(format!("{label} side-car == quantize_q8"), 0.0, |cx| {
                let ga = cx.gpu.tensor(&a, rows, cols)?;
                let gb = cx.gpu.tensor(&b, rows, cols)?;
                let gwb = cx.gpu.tensor(&wb, 1, dim)?;
                let gw = cx.gpu.tensor(&w, 1, dim)?;
                let p = PostNorm {
                    norm: bmode.map(|m| norm(m, &gwb)),
                    scale,
                };
                let (_, gy) = cx
                    .gpu
                    .norm_add_rms_norm(&ga, &gb, &p, norm(mode, &gw), 1e-6, dim)?;
                side_car_vs_kernel(&cx.gpu, &gy)
            });
        }
    }
}

/// One attn_prep case: shape, RoPE and which norms (q, k, v: None / 0 plain / 1 1+w / 2 none).
struct PrepCase {
    name: &'static str,
    rows: usize,
    pos0: usize,
    heads: usize,
    hkv: usize,
    rope: Rope,
    modes: [Option<u8>; 3],
}

fn prep_cases() -> Vec<PrepCase> {
    let rope = |hd: usize, rot: usize, fbd: usize, layout, ff: Option<Vec<f32>>| Rope {
        head_dim: hd,
        rot_dims: rot,
        theta: 1_000_000.0,
        layout,
        freq_factors: ff,
        freq_base_dims: fbd,
    };
    let ff: Vec<f32> = (0..64).map(|i| 1.0 + (i % 7) as f32).collect();
    vec![
        PrepCase {
            name: "qwen3 decode (q/k norm)",
            rows: 1,
            pos0: 37,
            heads: 8,
            hkv: 2,
            rope: rope(128, 128, 128, RopeLayout::Neox, None),
            modes: [Some(0), Some(0), None],
        },
        PrepCase {
            name: "prefill 6 rows (1+w norms)",
            rows: 6,
            pos0: 0,
            heads: 4,
            hkv: 2,
            rope: rope(128, 128, 128, RopeLayout::Neox, None),
            modes: [Some(1), Some(1), None],
        },
        PrepCase {
            name: "gemma4 global decode (hd 512, p-RoPE, v-norm)",
            rows: 1,
            pos0: 3,
            heads: 4,
            hkv: 1,
            rope: rope(512, 128, 512, RopeLayout::Neox, Some(ff[..64].to_vec())),
            modes: [Some(0), Some(0), Some(2)],
        },
        PrepCase {
            name: "no norms, interleaved partial",
            rows: 2,
            pos0: 60,
            heads: 4,
            hkv: 4,
            rope: rope(256, 64, 64, RopeLayout::Interleaved, None),
            modes: [None, None, None],
        },
        // multi-row (prefill) entries: one warp per (row, head)
        PrepCase {
            name: "qwen3 prefill 24 rows (q/k norm, warp/head)",
            rows: 24,
            pos0: 5,
            heads: 8,
            hkv: 2,
            rope: rope(128, 128, 128, RopeLayout::Neox, None),
            modes: [Some(0), Some(0), None],
        },
        PrepCase {
            name: "gemma4 global prefill 12 rows (hd 512, p-RoPE, v-norm, warp/head)",
            rows: 12,
            pos0: 100,
            heads: 4,
            hkv: 1,
            rope: rope(512, 128, 512, RopeLayout::Neox, Some(ff[..64].to_vec())),
            modes: [Some(0), Some(0), Some(2)],
        },
        PrepCase {
            name: "prefill 16 rows hd 256 interleaved partial (1+w, warp/head)",
            rows: 16,
            pos0: 0,
            heads: 4,
            hkv: 2,
            rope: rope(256, 64, 64, RopeLayout::Interleaved, None),
            modes: [Some(1), Some(1), None],
        },
    ]
}

/// The q / k / v norm weights of a prep case on `gpu` (`hd` values each).
pub(in crate::selftest) fn prep_weights(
    gpu: &CudaBackend,
    w: &[Vec<f32>],
    hd: usize,
) -> R<Vec<GpuTensor>> {
    Ok(w.iter()
        .map(|x| gpu.tensor(x, 1, hd))
        .collect::<Result<_, _>>()?)
}

/// The attn_prep of a case: norms of q, k, v by `modes` (None / 0 plain / 1 1+w / 2 none) with
/// the weights `gw`, eps 1e-6, (query heads, KV heads), `rope`.
pub(in crate::selftest) fn prep_of<'a>(
    gw: &'a [GpuTensor],
    modes: [Option<u8>; 3],
    (heads, hkv): (usize, usize),
    rope: &'a Rope,
) -> AttnPrep<'a, GpuTensor> {
    let norm = |i: usize| {
        modes[i].map(|m| match m {
            0 => Norm::Plain(&gw[i]),
            1 => Norm::OnePlus(&gw[i]),
            _ => Norm::None,
        })
    };
    AttnPrep {
        n_heads: heads,
        n_kv_heads: hkv,
        q_norm: norm(0),
        k_norm: norm(1),
        v_norm: norm(2),
        eps: 1e-6,
        rope,
    }
}

/// The cache bytes of `c` (K then V).
/// Every byte of `c`'s K and V caches and, for FP8, its K and V row scales.
fn cache_bytes(gpu: &CudaBackend, c: &GpuKvCache) -> R<CacheContents> {
    Ok(c.read_back(gpu.pool.stream())?)
}

/// `vals` followed by every byte of `c`'s K then V cache and its row scales, as f32: one vector
/// to compare.
pub(in crate::selftest) fn with_cache(
    gpu: &CudaBackend,
    mut vals: Vec<f32>,
    c: &GpuKvCache,
) -> R<Vec<f32>> {
    let (k, v, ks, vs) = cache_bytes(gpu, c)?;
    vals.extend(k.into_iter().map(f32::from));
    vals.extend(v.into_iter().map(f32::from));
    vals.extend(ks.into_iter().chain(vs).map(f32::from));
    Ok(vals)
}

pub(in crate::selftest) fn attn_prep_cases(cx: &mut Ctx) {
    let f16 = match CudaBackend::with_device(cx.gpu.dev.clone(), KvType::F16) {
        Ok(b) => Some(b),
        Err(e) => {
            cx.case("attn_prep (F16 cache backend)".into(), 0.0, |_| {
                Err(anyhow::anyhow!("{e}"))
            });
            None
        }
    };
    for c in prep_cases() {
        let hd = c.rope.head_dim;
        let (qw, kw) = (c.heads * hd, c.hkv * hd);
        let q = uniform(&mut cx.rng, c.rows * qw, -3.0, 3.0);
        let k = uniform(&mut cx.rng, c.rows * kw, -3.0, 3.0);
        let v = uniform(&mut cx.rng, c.rows * kw, -3.0, 3.0);
        let w: Vec<Vec<f32>> = (0..3)
            .map(|_| uniform(&mut cx.rng, hd, -1.0, 1.5))
            .collect();
        for kv in [KvType::Fp8E4m3, KvType::F16] {
            let Some(gpu) = (if kv == KvType::F16 {
                f16.as_ref()
            } else {
                Some(&cx.gpu)
            }) else {
                continue;
            };
            let shape = KvShape::full(c.hkv, hd, 128);
            type Run = (Vec<f32>, Vec<u8>, Vec<u8>, Vec<u16>, Vec<u16>);
            let run = |composed: bool| -> R<Run> {
                let step = step_at(gpu, c.pos0, c.rows)?;
                let (gq, gk, gv) = (
                    gpu.tensor(&q, c.rows, qw)?,
                    gpu.tensor(&k, c.rows, kw)?,
                    gpu.tensor(&v, c.rows, kw)?,
                );
                let gw = prep_weights(gpu, &w, hd)?;
                let p = prep_of(&gw, c.modes, (c.heads, c.hkv), &c.rope);
                let mut cache = gpu.kv_cache(shape)?;
                let out = if composed {
                    attn_prep_composed(gpu, &gq, &gk, &gv, &mut cache, &step, &p)?
                } else {
                    gpu.attn_prep(&gq, &gk, &gv, &mut cache, &step, &p)?
                };
                let (kb, vb, ks, vs) = cache_bytes(gpu, &cache)?;
                Ok((host(gpu, &out)?, kb, vb, ks, vs))
            };
            let kvn = if kv == KvType::F16 { "f16" } else { "fp8" };
            let label = format!("attn_prep {} {kvn}", c.name);
            let cpu = &cx.cpu;
            let reference = || -> R<Pair> {
                let (gq, kb, vb, ks, vs) = run(false)?;
                // CPU: the same composition on CpuBackend tensors
                let t = |x: &[f32], cols| cpu.tensor(x, c.rows, cols);
                let cw: Vec<_> = w
                    .iter()
                    .map(|x| cpu.tensor(x, 1, hd))
                    .collect::<Result<_, _>>()?;
                let normed = |x: crate::backend::cpu::CpuTensor, i: usize| -> R<_> {
                    Ok(match c.modes[i] {
                        None => x,
                        Some(0) => cpu.rms_norm(&x, Norm::Plain(&cw[i]), 1e-6, hd)?,
                        Some(1) => cpu.rms_norm(&x, Norm::OnePlus(&cw[i]), 1e-6, hd)?,
                        Some(_) => cpu.rms_norm(&x, Norm::None, 1e-6, hd)?,
                    })
                };
                let cs = step_at(cpu, c.pos0, c.rows)?;
                let cq = cpu.rope(&normed(t(&q, qw)?, 0)?, c.heads, &cs, &c.rope)?;
                let ck = cpu.rope(&normed(t(&k, kw)?, 1)?, c.hkv, &cs, &c.rope)?;
                let cv = normed(t(&v, kw)?, 2)?;
                let layout = kv_layout(&shape, kv);
                let elems = layout.bytes() / layout.elem_bytes;
                let (mut wk, mut wv) = (vec![0f32; elems], vec![0f32; elems]);
                for r in 0..c.rows {
                    for h in 0..c.hkv {
                        let (dst, src) = (layout.elem_offset(c.pos0 + r, h), r * kw + h * hd);
                        wk[dst..dst + hd].copy_from_slice(&ck.data[src..src + hd]);
                        wv[dst..dst + hd].copy_from_slice(&cv.data[src..src + hd]);
                    }
                }
                let quant = kv_quant(kv);
                let (gk, ek) = cache_expect(quant, &kb, &ks, &wk, hd);
                let (gv, ev) = cache_expect(quant, &vb, &vs, &wv, hd);
                let mut got = gq;
                got.extend(gk);
                got.extend(gv);
                let mut want = cq.data;
                want.extend(ek);
                want.extend(ev);
                Ok((got, want))
            };
            let r = reference();
            let same = (|| -> R<Pair> {
                let (fq, fk, fv, fks, fvs) = run(false)?;
                let (cq, ck, cv, cks, cvs) = run(true)?;
                let bytes = |b: Vec<u8>| b.into_iter().map(|x| x as f32).collect::<Vec<_>>();
                let halves = |b: Vec<u16>| b.into_iter().map(|x| x as f32).collect::<Vec<_>>();
                let mut got = fq;
                got.extend(bytes(fk));
                got.extend(bytes(fv));
                got.extend(halves(fks));
                got.extend(halves(fvs));
                let mut want = cq;
                want.extend(bytes(ck));
                want.extend(bytes(cv));
                want.extend(halves(cks));
                want.extend(halves(cvs));
                Ok((got, want))
            })();
            cx.case(format!("{label} vs CPU"), 1e-4, |_| r);
            cx.case(
                format!("{label} == rms_norm + rope + kv_write"),
                0.0,
                |_| same,
            );
        }
    }
}
