//! Backend-level GPU checks of `attn_prep_attention` on a decode row: the CUDA backend's one
//! launch (ops/attn_decode `__mma_prep`, turned on with `CudaBackend::with_fused_attn_prep`,
//! which must take the case: `CudaBackend::prep_fusable`)
//! against the two ops it replaces on the same device (attn_prep, then attention of its q).
//!
//! Bound 0: the attention output and every byte of the K / V caches equal. The fused entry
//! norms with lib/rmsnorm's warp path in the 256-thread block order and rotates with lib/rope's
//! pinned roundings, as attn_prep does, and the attention is the `__mma` code on the same q.
//! Both runs first fill positions 0 .. pos0 with the same rows (attn_prep over a prefill), so
//! the decode row attends over a live cache; each case runs with the step's position
//! registered (as in a recorded decode step) and uploaded.
//!
//! `recorded_cases`: attn_prep then attention of a decode row recorded once as a step (a CUDA
//! graph, programmatic launches on sm_90+) and replayed, against the same ops run directly.
//! Before every run the new position's K / V rows hold NaN: the attention kernel may load the
//! cache before its programmatic-launch wait, but not that row, which attn_prep writes. Bound 0.

use super::backend_fused::{prep_of, prep_weights, with_cache};
use super::backend_ops::{host, Ctx, Pair, R};
use super::check::uniform;
use crate::backend::cuda::kv::kv_layout;
use crate::backend::cuda::{CudaBackend, KvType};
use crate::backend::{attn_prep_attention_composed, AttnParams, Backend, KvShape, Rope};
use crate::ops::RopeLayout;

/// One decode case: heads, RoPE, norms (q, k, v: None / 0 plain / 1 1+w / 2 none), position.
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) heads: usize,
    pub(super) hkv: usize,
    pub(super) rope: Rope,
    pub(super) modes: [Option<u8>; 3],
    pub(super) pos0: usize,
}

/// A head-dim-128 RoPE rotating `rot` dims (theta 1e6), with the given frequency divisors.
fn rope128(rot: usize, layout: RopeLayout, ff: Option<Vec<f32>>) -> Rope {
    Rope {
        head_dim: 128,
        rot_dims: rot,
        theta: 1_000_000.0,
        layout,
        freq_factors: ff,
        freq_base_dims: rot,
    }
}

/// 32 frequency divisors 1..=5 (a partial RoPE of 64 dims).
fn freq_factors32() -> Vec<f32> {
    (0..32).map(|i| 1.0 + (i % 5) as f32).collect()
}

/// Decode attention parameters of `heads` / `hkv` heads of `hd` (no window, no softcap).
fn params(heads: usize, hkv: usize, hd: usize) -> AttnParams {
    AttnParams {
        n_heads: heads,
        n_kv_heads: hkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window: None,
        softcap: None,
    }
}

pub(super) fn cases() -> Vec<Case> {
    let rope = rope128;
    let ff = freq_factors32();
    vec![
        Case {
            name: "qwen3-8b heads (32 / 8, q/k norm)",
            heads: 32,
            hkv: 8,
            rope: rope(128, RopeLayout::Neox, None),
            modes: [Some(0), Some(0), None],
            pos0: 37,
        },
        Case {
            name: "qwen3-30b heads (32 / 4, q/k norm), first position",
            heads: 32,
            hkv: 4,
            rope: rope(128, RopeLayout::Neox, None),
            modes: [Some(0), Some(0), None],
            pos0: 0,
        },
        Case {
            name: "group 2, 1+w norms, past one page and one split",
            heads: 4,
            hkv: 2,
            rope: rope(128, RopeLayout::Neox, None),
            modes: [Some(1), Some(1), None],
            pos0: 300,
        },
        Case {
            name: "interleaved partial RoPE, freq factors, v-norm, no q norm",
            heads: 8,
            hkv: 1,
            rope: rope(64, RopeLayout::Interleaved, Some(ff)),
            modes: [None, Some(0), Some(2)],
            pos0: 129,
        },
    ]
}

pub(super) fn attend_cases(cx: &mut Ctx) {
    recorded_cases(cx);
    let fused =
        |kv| CudaBackend::with_device(cx.gpu.dev.clone(), kv).map(|b| b.with_fused_attn_prep(true));
    let (fp8, f16) = (fused(KvType::Fp8E4m3), fused(KvType::F16));
    for c in cases() {
        let hd = c.rope.head_dim;
        let (qw, kw) = (c.heads * hd, c.hkv * hd);
        let n = c.pos0 + 1;
        let q = uniform(&mut cx.rng, n * qw, -3.0, 3.0);
        let k = uniform(&mut cx.rng, n * kw, -3.0, 3.0);
        let v = uniform(&mut cx.rng, n * kw, -3.0, 3.0);
        let w: Vec<Vec<f32>> = (0..3)
            .map(|_| uniform(&mut cx.rng, hd, -1.0, 1.5))
            .collect();
        let mut rows_out: Vec<(String, R<Pair>)> = Vec::new();
        for kv in [KvType::Fp8E4m3, KvType::F16] {
            let gpu = match if kv == KvType::F16 { &f16 } else { &fp8 } {
                Ok(b) => b,
                Err(e) => {
                    rows_out.push((
                        format!("attn_prep_attention {} {kv:?}", c.name),
                        Err(anyhow::anyhow!(
                            "backend with the fused attention input: {e}"
                        )),
                    ));
                    continue;
                }
            };
            let shape = KvShape::full(c.hkv, hd, 512);
            let params = params(c.heads, c.hkv, hd);
            // the attention output, then the K / V cache bytes; `fused`: the backend's op
            let run = |fused: bool, registered: bool| -> R<Vec<f32>> {
                let gw = prep_weights(gpu, &w, hd)?;
                let prep = prep_of(&gw, c.modes, (c.heads, c.hkv), &c.rope);
                let mut cache = gpu.kv_cache(shape)?;
                let rows = |x: &[f32], r0: usize, r1: usize, cols: usize| {
                    gpu.tensor(&x[r0 * cols..r1 * cols], r1 - r0, cols)
                };
                if c.pos0 > 0 {
                    let ids: Vec<u32> = (0..c.pos0 as u32).collect();
                    gpu.begin_forward(&ids, 0)?;
                    let (pq, pk, pv) = (
                        rows(&q, 0, c.pos0, qw)?,
                        rows(&k, 0, c.pos0, kw)?,
                        rows(&v, 0, c.pos0, kw)?,
                    );
                    gpu.attn_prep(&pq, &pk, &pv, &mut cache, 0, &prep)?;
                }
                gpu.begin_forward(&[0], if registered { c.pos0 } else { 10_000 })?;
                let (dq, dk, dv) = (
                    rows(&q, c.pos0, n, qw)?,
                    rows(&k, c.pos0, n, kw)?,
                    rows(&v, c.pos0, n, kw)?,
                );
                let out = if fused {
                    if !gpu.prep_fusable((&dq, &dk, &dv), &cache, &prep, &params)? {
                        anyhow::bail!("the backend does not fuse this case");
                    }
                    gpu.attn_prep_attention(&dq, &dk, &dv, &mut cache, c.pos0, &prep, &params)?
                } else {
                    attn_prep_attention_composed(
                        gpu, &dq, &dk, &dv, &mut cache, c.pos0, &prep, &params,
                    )?
                };
                with_cache(host(gpu, &out)?, &cache)
            };
            let kvn = if kv == KvType::F16 { "f16" } else { "fp8" };
            for registered in [true, false] {
                let same =
                    (|| -> R<Pair> { Ok((run(true, registered)?, run(false, registered)?)) })();
                let how = if registered { "step" } else { "uploaded" };
                rows_out.push((
                    format!(
                        "attn_prep_attention {} {kvn} at {} ({how}) == attn_prep + attention",
                        c.name, c.pos0
                    ),
                    same,
                ));
            }
        }
        for (name, r) in rows_out {
            cx.case(name, 0.0, |_| r);
        }
    }
}

/// Overwrite position `pos`'s K and V rows (every KV head) with NaN of the cache type.
fn poison_row(cache: &crate::backend::cuda::GpuKvCache, pos: usize) -> R<()> {
    let lay = kv_layout(&cache.shape, cache.kv_type);
    let eb = lay.elem_bytes;
    let nan: &[u8] = if cache.kv_type == KvType::F16 {
        &[0x00, 0x7e]
    } else {
        &[0x7f]
    };
    for buf in [&cache.k, &cache.v] {
        let mut b = buf.read::<u8>(lay.bytes())?;
        for h in 0..lay.hkv {
            let o = lay.elem_offset(pos, h) * eb;
            for (i, x) in b[o..o + lay.head_dim * eb].iter_mut().enumerate() {
                *x = nan[i % eb];
            }
        }
        buf.write(&b)?;
    }
    Ok(())
}

/// attn_prep + attention of a decode row at `pos0` recorded as a step and replayed three times
/// (new inputs each time) == the same ops run directly, output and cache bytes; the row at pos0
/// poisoned before each run (see the module header).
fn recorded_cases(cx: &mut Ctx) {
    for c in cases().into_iter().take(3) {
        for kv in [KvType::Fp8E4m3, KvType::F16] {
            let kvn = if kv == KvType::F16 { "f16" } else { "fp8" };
            let name = format!(
                "attn_prep + attention {} {kvn} at {}: recorded step, 3 replays == direct (new row NaN before)",
                c.name, c.pos0
            );
            let r = recorded_case(cx, &c, kv);
            cx.case(name, 0.0, |_| r);
        }
    }
}

fn recorded_case(cx: &mut Ctx, c: &Case, kv: KvType) -> R<Pair> {
    let gpu = CudaBackend::with_device(cx.gpu.dev.clone(), kv)
        .map_err(|e| anyhow::anyhow!("backend: {e}"))?
        .with_fused_attn_prep(false);
    let hd = c.rope.head_dim;
    let (qw, kw) = (c.heads * hd, c.hkv * hd);
    let w: Vec<Vec<f32>> = (0..3)
        .map(|_| uniform(&mut cx.rng, hd, -1.0, 1.5))
        .collect();
    let gw = prep_weights(&gpu, &w, hd)?;
    let prep = prep_of(&gw, c.modes, (c.heads, c.hkv), &c.rope);
    let params = params(c.heads, c.hkv, hd);
    let shape = KvShape::full(c.hkv, hd, 512);
    // a cache holding positions 0 .. pos0 (the same rows for both paths)
    let prefill: Vec<Vec<f32>> = [qw, kw, kw]
        .iter()
        .map(|&cols| uniform(&mut cx.rng, c.pos0.max(1) * cols, -3.0, 3.0))
        .collect();
    let filled = || -> R<crate::backend::cuda::GpuKvCache> {
        let mut cache = gpu.kv_cache(shape)?;
        if c.pos0 > 0 {
            let ids: Vec<u32> = (0..c.pos0 as u32).collect();
            gpu.begin_forward(&ids, 0)?;
            let t = |i: usize, cols: usize| gpu.tensor(&prefill[i], c.pos0, cols);
            gpu.attn_prep(&t(0, qw)?, &t(1, kw)?, &t(2, kw)?, &mut cache, 0, &prep)?;
        }
        Ok(cache)
    };
    let (mut rec_cache, mut direct_cache) = (filled()?, filled()?);
    // the decode row's inputs: rewritten before each replay
    let (dq, dk, dv) = (
        gpu.tensor(&vec![0.0; qw], 1, qw)?,
        gpu.tensor(&vec![0.0; kw], 1, kw)?,
        gpu.tensor(&vec![0.0; kw], 1, kw)?,
    );
    gpu.begin_forward(&[0], c.pos0)?;
    if !gpu.record_begin()? {
        anyhow::bail!("the backend does not record steps (FUCINA_NO_GRAPHS is set)");
    }
    let out = match attn_prep_attention_composed(
        &gpu,
        &dq,
        &dk,
        &dv,
        &mut rec_cache,
        c.pos0,
        &prep,
        &params,
    ) {
        Ok(o) => o,
        Err(e) => {
            gpu.record_abort();
            return Err(e.into());
        }
    };
    let step = gpu.record_end()?;
    let (mut got, mut want) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let (q, k, v) = (
            uniform(&mut cx.rng, qw, -3.0, 3.0),
            uniform(&mut cx.rng, kw, -3.0, 3.0),
            uniform(&mut cx.rng, kw, -3.0, 3.0),
        );
        dq.buf.write(&q)?;
        dk.buf.write(&k)?;
        dv.buf.write(&v)?;
        poison_row(&rec_cache, c.pos0)?;
        gpu.begin_forward(&[0], c.pos0)?;
        gpu.replay(&step)?;
        got.extend(with_cache(host(&gpu, &out)?, &rec_cache)?);
        poison_row(&direct_cache, c.pos0)?;
        gpu.begin_forward(&[0], c.pos0)?;
        let o = attn_prep_attention_composed(
            &gpu,
            &dq,
            &dk,
            &dv,
            &mut direct_cache,
            c.pos0,
            &prep,
            &params,
        )?;
        want.extend(with_cache(host(&gpu, &o)?, &direct_cache)?);
    }
    Ok((got, want))
}
