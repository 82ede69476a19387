//! Backend-level GPU check of the KV arena (`ops/attention/arena.rs`): a step of three
//! sequences whose caches are slots of one arena writes K/V with one `attn_prep_seqs` launch and
//! attends with one `attention_seqs` launch; the same sequences with caches of their own, each
//! through `attn_prep` and `attention` on a step of its own, must give the same rotated q, the
//! same attention output and the same cache bytes, bit for bit (bound 0: the batched launches run
//! each sequence through the kernels and splits it runs alone). The sequences sit in the second
//! layer of two (the arena's second ordinal), at different depths (one past a page and a split),
//! after prompts written through the one-sequence path.

use crate::backend::cuda::{CudaBackend, GpuKvCache, GpuTensor, KvType};
use crate::backend::{AttnParams, KvShape, LogitRows, Rope, StepPlan};
use crate::backend::{Fused, Ops, Runtime};
use crate::ops::RopeLayout;
use crate::selftest::backend_fused::{prep_of, prep_weights};
use crate::selftest::backend_ops::{host, Ctx, Pair, R};
use crate::selftest::check::uniform;

/// Prompt lengths of the three sequences (the decode row goes at that position).
const LENS: [usize; 3] = [37, 5, 300];

pub(in crate::selftest) fn arena_cases(cx: &mut Ctx) {
    // (query heads, KV heads, head dim, sliding window): Qwen3-8B-like (the tensor-core entry),
    // and a Gemma-like ring of head dim 256
    let shapes: [(usize, usize, usize, Option<usize>); 2] =
        [(32, 8, 128, None), (4, 2, 256, Some(160))];
    for kv in [KvType::F16, KvType::Fp8E4m3] {
        for &(heads, hkv, hd, window) in &shapes {
            let name = format!(
                "kv arena {kv:?} {heads}/{hkv} x {hd}{}: batched attn_prep + attention == per sequence",
                window.map_or(String::new(), |w| format!(" window {w}"))
            );
            let r = run(cx, kv, (heads, hkv, hd, window));
            cx.case(name, 0.0, |_| r);
        }
    }
}

fn run(
    cx: &mut Ctx,
    kv: KvType,
    (heads, hkv, hd, window): (usize, usize, usize, Option<usize>),
) -> R<Pair> {
    let dev = cx.gpu.dev.clone();
    let arena = CudaBackend::with_device(dev.clone(), kv)?;
    arena.reserve_kv_slots(4);
    let own = CudaBackend::with_device(dev, kv)?;
    let cap = 512;
    let shape = KvShape {
        n_kv_heads: hkv,
        head_dim: hd,
        capacity: cap,
        ring: window.map(|w| w + 64),
    };
    let rope = Rope {
        head_dim: hd,
        rot_dims: hd,
        theta: 1_000_000.0,
        layout: RopeLayout::Neox,
        freq_factors: None,
        freq_base_dims: hd,
    };
    let p = AttnParams {
        n_heads: heads,
        n_kv_heads: hkv,
        head_dim: hd,
        scale: 1.0 / (hd as f32).sqrt(),
        window,
        softcap: None,
    };
    let w: Vec<Vec<f32>> = (0..3).map(|_| uniform(&mut cx.rng, hd, 0.5, 1.5)).collect();
    let (qw, kw) = (heads * hd, hkv * hd);
    // each sequence's prompt rows and its decode row: q, k, v
    let rows: Vec<[Vec<f32>; 3]> = LENS
        .iter()
        .map(|&n| [qw, kw, kw].map(|width| uniform(&mut cx.rng, (n + 1) * width, -2.0, 2.0)))
        .collect();
    let mut outs = Vec::new();
    for be in [&arena, &own] {
        let gw = prep_weights(be, &w, hd)?;
        let prep = prep_of(&gw, [Some(0), Some(0), None], (heads, hkv), &rope);
        // two layers per sequence: the checked one is the second (ordinal 1)
        let mut caches: Vec<GpuKvCache> = Vec::new();
        for _ in LENS {
            let mut two = be.kv_caches(&[shape, shape])?;
            caches.push(two.pop().expect("two caches"));
        }
        let in_arena = caches.iter().all(|c| c.slot().is_some());
        if std::ptr::eq(be, &arena) != in_arena {
            anyhow::bail!("caches in the arena: {in_arena}");
        }
        // the prompts, one sequence at a time
        let t = |d: &[f32], at: usize, n: usize, width: usize| -> R<GpuTensor> {
            Ok(be.tensor(&d[at * width..(at + n) * width], n, width)?)
        };
        for ((c, r), &n) in caches.iter_mut().zip(&rows).zip(&LENS) {
            let step = be.step(StepPlan::single(&vec![0; n], 0, LogitRows::None)?)?;
            be.attn_prep(
                &t(&r[0], 0, n, qw)?,
                &t(&r[1], 0, n, kw)?,
                &t(&r[2], 0, n, kw)?,
                c,
                &step,
                &prep,
            )?;
        }
        // the decode rows
        let (q, o) = if std::ptr::eq(be, &arena) {
            let cat = |i: usize, width: usize| -> R<GpuTensor> {
                let parts = rows
                    .iter()
                    .zip(&LENS)
                    .map(|(r, &n)| t(&r[i], n, 1, width))
                    .collect::<R<Vec<_>>>()?;
                let refs: Vec<&GpuTensor> = parts.iter().collect();
                Ok(be.concat_rows(&refs)?)
            };
            let ids = [0u32];
            let seqs: Vec<(&[u32], usize)> = LENS.iter().map(|&n| (&ids[..], n)).collect();
            let step = be.step(StepPlan::batch(&seqs, LogitRows::All)?)?;
            let mut refs: Vec<&mut GpuKvCache> = caches.iter_mut().collect();
            let q = be
                .attn_prep_seqs(
                    &cat(0, qw)?,
                    &cat(1, kw)?,
                    &cat(2, kw)?,
                    &mut refs,
                    &step,
                    &prep,
                )?
                .ok_or_else(|| anyhow::anyhow!("attn_prep_seqs did not take the arena's caches"))?;
            let refs: Vec<&GpuKvCache> = caches.iter().collect();
            let o = be
                .attention_seqs(&q, &refs, &step, &p)?
                .ok_or_else(|| anyhow::anyhow!("attention_seqs did not take the arena's caches"))?;
            (host(be, &q)?, host(be, &o)?)
        } else {
            let (mut q, mut o) = (Vec::new(), Vec::new());
            for ((c, r), &n) in caches.iter_mut().zip(&rows).zip(&LENS) {
                let step = be.step(StepPlan::single(&[0], n, LogitRows::All)?)?;
                let qr = be.attn_prep(
                    &t(&r[0], n, 1, qw)?,
                    &t(&r[1], n, 1, kw)?,
                    &t(&r[2], n, 1, kw)?,
                    c,
                    &step,
                    &prep,
                )?;
                let a = be.attention(&qr, c, &step, &p)?;
                q.extend(host(be, &qr)?);
                o.extend(host(be, &a)?);
            }
            (q, o)
        };
        let mut all = q;
        all.extend(o);
        for c in &caches {
            let (k, v, ks, vs) = c.read_back(be.pool.stream())?;
            all.extend(k.into_iter().chain(v).map(f32::from));
            all.extend(ks.into_iter().chain(vs).map(f32::from));
        }
        outs.push(all);
    }
    let want = outs.pop().expect("two runs");
    Ok((outs.pop().expect("two runs"), want))
}
