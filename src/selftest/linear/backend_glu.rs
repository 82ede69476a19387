//! Backend-level GPU checks of `linear_glu`, the decode gate|up GEMV that also applies the GLU
//! and writes the int8 side-car of its output (the batch-1 repacked GEMV's `__glu` entry).
//!
//! Bounds:
//! - the one-launch path (`CudaBackend::gemv_glu`, which must take the case) against `linear`
//!   then `glu_fused` on the same device: h, its int8 values and its scales all equal (0; the
//!   same dots, sums, activation and `q8_group`) where `linear` runs the GEMV's main entry;
//!   where it splits the rows' k range over warps (`__ks`: the same dots summed in another
//!   order) h and the scales within 1e-5 (not the int8 values: one moves by one wherever the
//!   two sums round to opposite sides of a half);
//! - `linear_glu` vs the int8 CPU backend's (its default: `linear`, then `glu_fused`): 1e-3, as
//!   the other block-format GEMV rows.

use crate::backend::{Activation, Norm};
use crate::backend::{Fused, Ops, Runtime};
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;
use crate::selftest::backend_fused::side_car;
use crate::selftest::backend_ops::{host, tref, Ctx};
use crate::selftest::check::uniform;

pub(in crate::selftest) fn linear_glu_cases(cx: &mut Ctx) {
    // (format, ff, k, activation, input from rms_norm: it carries a side-car)
    for (ty, ff, k, act, normed) in [
        (GgmlType::Q4_0, 512usize, 4096usize, Activation::Silu, true),
        (GgmlType::Q4_0, 96, 1280, Activation::GeluTanh, false),
        (GgmlType::Q4K, 256, 4096, Activation::GeluTanh, true),
        (GgmlType::Q4K, 64, 1280, Activation::Silu, false),
        (GgmlType::Q8_0, 384, 4096, Activation::Silu, true),
    ] {
        let Ok(wb) = random_weights(ty, 2 * ff, k, &mut cx.rng) else {
            continue;
        };
        let r = tref("gate_up", ty, vec![2 * ff, k], &wb);
        let x = uniform(&mut cx.rng, k, -3.0, 3.0);
        let nw = uniform(&mut cx.rng, k, -1.0, 1.5);
        let label = format!("{} 1x{k} -> {ff} {act:?}", ty.name());
        // the decode input: a norm's output with its side-car, or plain values
        let input = |cx: &Ctx| -> anyhow::Result<crate::backend::cuda::GpuTensor> {
            let g = cx.gpu.tensor(&x, 1, k)?;
            if !normed {
                return Ok(g);
            }
            let w = cx.gpu.tensor(&nw, 1, k)?;
            Ok(cx.gpu.rms_norm(&g, Norm::Plain(&w), 1e-6, k)?)
        };
        // whether `linear` takes the k-split entry for this weight (then the sums' order differs)
        let split = cx
            .gpu
            .upload(&r)
            .is_ok_and(|gw| cx.gpu.gemv_splits_k(gw.quant, 2 * ff, k));
        let (name, bound) = if split {
            ("~= linear (k split) + glu_fused: h, scales", 1e-5)
        } else {
            ("== linear + glu_fused", 0.0)
        };
        cx.case(
            format!("linear_glu {label} one launch {name}"),
            bound,
            |cx| {
                let gw = cx.gpu.upload(&r)?;
                let xi = input(cx)?;
                let fused = cx
                    .gpu
                    .gemv_glu(&xi, &gw, act)?
                    .ok_or_else(|| anyhow::anyhow!("the one-launch path did not take the case"))?;
                let plain = cx.gpu.glu_fused(&cx.gpu.linear(&xi, &gw)?, act)?;
                let mut pair = (host(&cx.gpu, &fused)?, host(&cx.gpu, &plain)?);
                for (t, out) in [(&fused, &mut pair.0), (&plain, &mut pair.1)] {
                    let (q, ds) = side_car(&cx.gpu, t)?;
                    if !split {
                        out.extend(q.iter().map(|&v| v as f32));
                    }
                    out.extend(ds);
                }
                Ok(pair)
            },
        );
        cx.case(format!("linear_glu {label} vs CPU int8"), 1e-3, |cx| {
            let (gw, cw) = (cx.gpu.upload(&r)?, cx.cpu8.upload(&r)?);
            let xi = input(cx)?;
            // the CPU's input: the very values the GPU norm wrote (same int8 activations)
            let cx_in = cx.cpu8.tensor(&host(&cx.gpu, &xi)?, 1, k)?;
            Ok((
                host(&cx.gpu, &cx.gpu.linear_glu(&xi, &gw, act)?)?,
                cx.cpu8.linear_glu(&cx_in, &cw, act)?.data,
            ))
        });
    }
}
