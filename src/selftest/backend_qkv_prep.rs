//! Backend-level GPU checks of `linear_attn_prep`: one decode row's fused q|k|v projection and
//! attn_prep as one launch (the q4_0r GEMV's `__qkvp` entry, one thread-block cluster per
//! head; `CudaBackend::with_qkv_prep`, which must take the case) against `linear` then
//! `attn_prep` on the same device.
//!
//! Bound 0: the rotated q and every byte of the K / V caches equal. The entry's dots are the
//! GEMV main entry's (the same rows_dot and warp_sum), its norm lib/rmsnorm's warp path in
//! attn_prep's 256-thread block order and its rotation lib/rope's, as attn_decode's
//! `__mma_prep` does (whose rows check that order against attn_prep). Both runs first fill
//! positions 0 .. pos0 with the same rows, and run with the step's position registered.

use super::backend_fused::{prep_of, prep_weights};
use super::backend_ops::{host, tref, Ctx, Pair, R};
use super::check::uniform;
use crate::backend::cuda::kv::kv_layout;
use crate::backend::cuda::{CudaBackend, KvType};
use crate::backend::{Backend, KvShape, Norm, Rope};
use crate::ops::qdot::random_weights;
use crate::ops::RopeLayout;
use crate::quant::GgmlType;

/// One case: input width, heads, RoPE, norms (q, k, v: None / 0 plain / 1 1+w / 2 none),
/// position.
struct Case {
    name: &'static str,
    k: usize,
    heads: usize,
    hkv: usize,
    rope: Rope,
    modes: [Option<u8>; 3],
    pos0: usize,
}

fn cases() -> Vec<Case> {
    let rope = |rot: usize, layout, ff: Option<Vec<f32>>| Rope {
        head_dim: 128,
        rot_dims: rot,
        theta: 1_000_000.0,
        layout,
        freq_factors: ff,
        freq_base_dims: rot,
    };
    let ff: Vec<f32> = (0..32).map(|i| 1.0 + (i % 5) as f32).collect();
    vec![
        Case {
            name: "qwen3-8b (4096 -> 32 / 8 heads, q/k norm)",
            k: 4096,
            heads: 32,
            hkv: 8,
            rope: rope(128, RopeLayout::Neox, None),
            modes: [Some(0), Some(0), None],
            pos0: 37,
        },
        Case {
            name: "1024 -> 4 / 2 heads, 1+w norms, past one page",
            k: 1024,
            heads: 4,
            hkv: 2,
            rope: rope(128, RopeLayout::Neox, None),
            modes: [Some(1), Some(1), None],
            pos0: 300,
        },
        Case {
            name: "2048 -> 8 / 1 heads, interleaved partial RoPE, freq factors, v-norm, no q norm",
            k: 2048,
            heads: 8,
            hkv: 1,
            rope: rope(64, RopeLayout::Interleaved, Some(ff)),
            modes: [None, Some(0), Some(2)],
            pos0: 0,
        },
    ]
}

pub(super) fn qkv_prep_cases(cx: &mut Ctx) {
    for c in cases() {
        let hd = c.rope.head_dim;
        let rows = (c.heads + 2 * c.hkv) * hd;
        let Ok(wb) = random_weights(GgmlType::Q4_0, rows, c.k, &mut cx.rng) else {
            continue;
        };
        let wr = tref("qkv", GgmlType::Q4_0, vec![rows, c.k], &wb);
        let w: Vec<Vec<f32>> = (0..3)
            .map(|_| uniform(&mut cx.rng, hd, -1.0, 1.5))
            .collect();
        let nw = uniform(&mut cx.rng, c.k, -1.0, 1.5);
        let x = uniform(&mut cx.rng, c.k, -3.0, 3.0);
        // the cache's earlier positions: K and V rows written through attn_prep
        let pre: Vec<Vec<f32>> = [c.heads, c.hkv, c.hkv]
            .iter()
            .map(|&h| uniform(&mut cx.rng, c.pos0.max(1) * h * hd, -3.0, 3.0))
            .collect();
        for kv in [KvType::Fp8E4m3, KvType::F16] {
            let kvn = if kv == KvType::F16 { "f16" } else { "fp8" };
            let r = one_case(cx, &c, kv, &wr, &w, &nw, &x, &pre);
            cx.case(
                format!(
                    "linear_attn_prep Q4_0 {} {kvn} at {}: one launch == linear + attn_prep",
                    c.name, c.pos0
                ),
                0.0,
                |_| r,
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn one_case(
    cx: &Ctx,
    c: &Case,
    kv: KvType,
    wr: &crate::weights::TensorRef<'_>,
    w: &[Vec<f32>],
    nw: &[f32],
    x: &[f32],
    pre: &[Vec<f32>],
) -> R<Pair> {
    let hd = c.rope.head_dim;
    let (qw, kw) = (c.heads * hd, c.hkv * hd);
    let shape = KvShape::full(c.hkv, hd, 512);
    // (rotated q, K cache bytes, V cache bytes), each path on its own backend
    let run = |fused: bool| -> R<(Vec<f32>, Vec<u8>, Vec<u8>)> {
        let be = CudaBackend::with_device(cx.gpu.dev.clone(), kv)
            .map_err(|e| anyhow::anyhow!("backend: {e}"))?
            .with_qkv_prep(fused);
        let gw = be.upload(wr)?;
        let pw = prep_weights(&be, w, hd)?;
        let prep = prep_of(&pw, c.modes, (c.heads, c.hkv), &c.rope);
        let mut cache = be.kv_cache(shape)?;
        if c.pos0 > 0 {
            let ids: Vec<u32> = (0..c.pos0 as u32).collect();
            be.begin_forward(&ids, 0)?;
            let t = |i: usize, cols: usize| be.tensor(&pre[i], c.pos0, cols);
            be.attn_prep(&t(0, qw)?, &t(1, kw)?, &t(2, kw)?, &mut cache, 0, &prep)?;
        }
        be.begin_forward(&[0], c.pos0)?;
        // the decode input: a norm's output with its int8 side-car
        let (xt, nwt) = (be.tensor(x, 1, c.k)?, be.tensor(nw, 1, c.k)?);
        let xn = be.rms_norm(&xt, Norm::Plain(&nwt), 1e-6, c.k)?;
        let q = if fused {
            be.linear_attn_prep(&xn, &gw, &mut cache, c.pos0, &prep)?
                .ok_or_else(|| anyhow::anyhow!("the one-launch path did not take the case"))?
        } else {
            let y = be.linear(&xn, &gw)?;
            let (q, k, v) = (
                be.slice_cols(&y, 0, qw)?,
                be.slice_cols(&y, qw, kw)?,
                be.slice_cols(&y, qw + kw, kw)?,
            );
            be.attn_prep(&q, &k, &v, &mut cache, c.pos0, &prep)?
        };
        let bytes = kv_layout(&cache.shape, cache.kv_type).bytes();
        Ok((
            host(&be, &q)?,
            cache.k.read::<u8>(bytes)?,
            cache.v.read::<u8>(bytes)?,
        ))
    };
    let (fq, fk, fv) = run(true)?;
    let (pq, pk, pv) = run(false)?;
    let bytes = |b: Vec<u8>| b.into_iter().map(f32::from).collect::<Vec<_>>();
    let mut got = fq;
    got.extend(bytes(fk));
    got.extend(bytes(fv));
    let mut want = pq;
    want.extend(bytes(pk));
    want.extend(bytes(pv));
    Ok((got, want))
}
