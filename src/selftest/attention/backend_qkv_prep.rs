//! Backend-level GPU checks of `linear_attn_prep`: one decode row's fused q|k|v projection and
//! attn_prep as one launch (the q4_0r GEMV's `__qkvp` entry, one thread-block cluster per
//! head; `CudaBackend::with_qkv_prep`, which must take the case) against `linear` then
//! `attn_prep` on the same device.
//!
//! Bound 0: the rotated q and every byte of the K / V caches equal. The entry's dots are the
//! GEMV main entry's (the same rows_dot and warp_sum), its norm lib/rmsnorm's warp path in
//! attn_prep's 256-thread block order and its rotation lib/rope's (lib/prep_warp). Both runs
//! first fill positions 0 .. pos0 with the same rows, and run with the step's position
//! registered.

use super::backend_attend::{cases, Case};
use crate::backend::cuda::{CudaBackend, KvType};
use crate::backend::{step_at, KvShape, Norm};
use crate::backend::{Fused, Ops, Runtime};
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;
use crate::selftest::backend_fused::{prep_of, prep_weights, with_cache};
use crate::selftest::backend_ops::{host, tref, Ctx, Pair, R};
use crate::selftest::check::uniform;

/// The input widths the cases of `backend_attend::cases` get here (each a multiple of 256).
const WIDTHS: [usize; 4] = [4096, 2048, 1024, 2048];

pub(in crate::selftest) fn qkv_prep_cases(cx: &mut Ctx) {
    for (c, &k) in cases().iter().zip(&WIDTHS) {
        let hd = c.rope.head_dim;
        let rows = (c.heads + 2 * c.hkv) * hd;
        let Ok(wb) = random_weights(GgmlType::Q4_0, rows, k, &mut cx.rng) else {
            continue;
        };
        let wr = tref("qkv", GgmlType::Q4_0, vec![rows, k], &wb);
        let w: Vec<Vec<f32>> = (0..3)
            .map(|_| uniform(&mut cx.rng, hd, -1.0, 1.5))
            .collect();
        let nw = uniform(&mut cx.rng, k, -1.0, 1.5);
        let x = uniform(&mut cx.rng, k, -3.0, 3.0);
        // the cache's earlier positions: K and V rows written through attn_prep
        let pre: Vec<Vec<f32>> = [c.heads, c.hkv, c.hkv]
            .iter()
            .map(|&h| uniform(&mut cx.rng, c.pos0.max(1) * h * hd, -3.0, 3.0))
            .collect();
        for kv in [KvType::Fp8E4m3, KvType::F16] {
            let kvn = if kv == KvType::F16 { "f16" } else { "fp8" };
            let r = one_case(cx, c, k, kv, &wr, &w, &nw, &x, &pre);
            cx.case(
                format!(
                    "linear_attn_prep Q4_0 {k} -> {} {kvn} at {}: one launch == linear + attn_prep",
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
    k: usize,
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
    // the rotated q, then the K / V cache bytes; each path on its own backend
    let run = |fused: bool| -> R<Vec<f32>> {
        let be = CudaBackend::with_device(cx.gpu.dev.clone(), kv)
            .map_err(|e| anyhow::anyhow!("backend: {e}"))?
            .with_qkv_prep(fused);
        let gw = be.upload(wr)?;
        let pw = prep_weights(&be, w, hd)?;
        let prep = prep_of(&pw, c.modes, (c.heads, c.hkv), &c.rope);
        let mut cache = be.kv_cache(shape)?;
        if c.pos0 > 0 {
            let pre_step = step_at(&be, 0, c.pos0)?;
            let t = |i: usize, cols: usize| be.tensor(&pre[i], c.pos0, cols);
            be.attn_prep(
                &t(0, qw)?,
                &t(1, kw)?,
                &t(2, kw)?,
                &mut cache,
                &pre_step,
                &prep,
            )?;
        }
        let step = step_at(&be, c.pos0, 1)?;
        // the decode input: a norm's output with its int8 side-car
        let (xt, nwt) = (be.tensor(x, 1, k)?, be.tensor(nw, 1, k)?);
        let xn = be.rms_norm(&xt, Norm::Plain(&nwt), 1e-6, k)?;
        let q = if fused {
            be.linear_attn_prep(&xn, &gw, &mut cache, &step, &prep)?
                .ok_or_else(|| anyhow::anyhow!("the one-launch path did not take the case"))?
        } else {
            let y = be.linear(&xn, &gw)?;
            let (q, k, v) = (
                be.slice_cols(&y, 0, qw)?,
                be.slice_cols(&y, qw, kw)?,
                be.slice_cols(&y, qw + kw, kw)?,
            );
            be.attn_prep(&q, &k, &v, &mut cache, &step, &prep)?
        };
        with_cache(&be, host(&be, &q)?, &cache)
    };
    Ok((run(true)?, run(false)?))
}
