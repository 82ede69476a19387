//! Backend-level GPU checks of a decode row's attention from its projections, and the decode
//! cases `backend_qkv_prep` reuses.
//!
//! `recorded_cases`: attn_prep then attention of a decode row recorded once as a step (a CUDA
//! graph, programmatic launches on sm_90+) and replayed, against the same ops run directly.
//! Before every run the new position's K / V rows hold NaN: the attention kernel may load the
//! cache before its programmatic-launch wait, but not that row, which attn_prep writes. Bound 0.

use crate::backend::cuda::ops::attention::kv::kv_layout;
use crate::backend::cuda::{CudaBackend, KvType};
use crate::backend::{step_at, AttnParams, KvShape, Rope, StepOf};
use crate::backend::{Fused, Ops, Runtime};
use crate::ops::RopeLayout;
use crate::selftest::backend_fused::{prep_of, prep_weights, with_cache};
use crate::selftest::backend_ops::{host, Ctx, Pair, R};
use crate::selftest::check::uniform;

/// One decode case: heads, RoPE, norms (q, k, v: None / 0 plain / 1 1+w / 2 none), position.
pub(in crate::selftest) struct Case {
    pub(in crate::selftest) name: &'static str,
    pub(in crate::selftest) heads: usize,
    pub(in crate::selftest) hkv: usize,
    pub(in crate::selftest) rope: Rope,
    pub(in crate::selftest) modes: [Option<u8>; 3],
    pub(in crate::selftest) pos0: usize,
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

pub(in crate::selftest) fn cases() -> Vec<Case> {
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

pub(in crate::selftest) fn attend_cases(cx: &mut Ctx) {
    recorded_cases(cx);
}

/// attn_prep, then attention of its q: a decode layer's attention from its projections.
#[allow(clippy::too_many_arguments)]
fn prep_then_attend(
    gpu: &CudaBackend,
    q: &crate::backend::cuda::GpuTensor,
    k: &crate::backend::cuda::GpuTensor,
    v: &crate::backend::cuda::GpuTensor,
    cache: &mut crate::backend::cuda::GpuKvCache,
    step: &StepOf<CudaBackend>,
    prep: &crate::backend::AttnPrep<'_, crate::backend::cuda::GpuTensor>,
    params: &AttnParams,
) -> crate::backend::Result<crate::backend::cuda::GpuTensor> {
    let q = gpu.attn_prep(q, k, v, cache, step, prep)?;
    gpu.attention(&q, cache, step, params)
}

/// Overwrite position `pos`'s K and V rows (every KV head) with NaN of the cache type.
fn poison_row(
    stream: &cudarc::driver::CudaStream,
    cache: &crate::backend::cuda::GpuKvCache,
    pos: usize,
) -> R<()> {
    let lay = kv_layout(&cache.shape, cache.kv_type);
    let eb = lay.elem_bytes;
    let nan: &[u8] = if cache.kv_type == KvType::F16 {
        &[0x00, 0x7e]
    } else {
        &[0x7f]
    };
    let (mut k, mut v, _, _) = cache.read_back(stream)?;
    for b in [&mut k, &mut v] {
        for h in 0..lay.hkv {
            let o = lay.elem_offset(pos, h) * eb;
            for (i, x) in b[o..o + lay.head_dim * eb].iter_mut().enumerate() {
                *x = nan[i % eb];
            }
        }
    }
    cache.write_back(stream, &k, &v)?;
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
        .map_err(|e| anyhow::anyhow!("backend: {e}"))?;
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
            let step = step_at(&gpu, 0, c.pos0)?;
            let t = |i: usize, cols: usize| gpu.tensor(&prefill[i], c.pos0, cols);
            gpu.attn_prep(&t(0, qw)?, &t(1, kw)?, &t(2, kw)?, &mut cache, &step, &prep)?;
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
    let step = step_at(&gpu, c.pos0, 1)?;
    if !gpu.record_begin(&step)? {
        anyhow::bail!("the backend does not record steps (--no-graphs is set)");
    }
    let out = match prep_then_attend(&gpu, &dq, &dk, &dv, &mut rec_cache, &step, &prep, &params) {
        Ok(o) => o,
        Err(e) => {
            gpu.record_abort();
            return Err(e.into());
        }
    };
    let rec = gpu.record_end(&step)?;
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
        poison_row(gpu.pool.stream(), &rec_cache, c.pos0)?;
        gpu.replay(&rec, &step)?;
        got.extend(with_cache(&gpu, host(&gpu, &out)?, &rec_cache)?);
        poison_row(gpu.pool.stream(), &direct_cache, c.pos0)?;
        let o = prep_then_attend(
            &gpu,
            &dq,
            &dk,
            &dv,
            &mut direct_cache,
            &step,
            &prep,
            &params,
        )?;
        want.extend(with_cache(&gpu, host(&gpu, &o)?, &direct_cache)?);
    }
    Ok((got, want))
}
