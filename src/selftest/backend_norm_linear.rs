//! `norm_add_linear` on the GPU: for one row over repacked Q4_0 / Q4_K weights the residual
//! add and the norms run inside the GEMV (`<gemv>__norm`). Against the CPU with the GPU's int8
//! activation numerics (the sum exact, the product within the int8 GEMV bound), and against
//! the CUDA backend's own two-launch path (`norm_add_rms_norm`, then `linear`): the sums of
//! squares reduce in another order, so a value on an int8 rounding boundary may round the other
//! way. Shapes: Qwen3-8B's hidden 4096 (plain add), Gemma 4 12B's 3840 (post norm and layer
//! scalar), a 1+w norm, and 8192 (two groups per thread).

use super::backend_ops::{host, Ctx};
use super::check::uniform;
use crate::backend::{Backend, Norm, PostNorm};
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;

/// (weight type, out rows, k, post norm mode, scale, norm mode)
type Case = (GgmlType, usize, usize, Option<u8>, Option<f32>, u8);

fn norm<T>(mode: u8, w: &T) -> Norm<'_, T> {
    match mode {
        0 => Norm::Plain(w),
        1 => Norm::OnePlus(w),
        _ => Norm::None,
    }
}

pub(super) fn norm_add_linear_cases(cx: &mut Ctx) {
    let cases: [Case; 6] = [
        (GgmlType::Q4_0, 768, 4096, None, None, 0),
        (GgmlType::Q4K, 768, 4096, None, None, 0),
        (GgmlType::Q4_0, 640, 3840, Some(0), Some(0.6), 0),
        (GgmlType::Q4K, 512, 3840, Some(2), None, 1),
        (GgmlType::Q4_0, 300, 8192, Some(1), None, 2),
        (GgmlType::Q4K, 257, 2048, None, Some(1.5), 1),
    ];
    for (ty, out, k, pmode, scale, mode) in cases {
        let w = match random_weights(ty, out, k, &mut cx.rng) {
            Ok(w) => w,
            Err(e) => {
                cx.case(
                    format!("norm_add_linear {} (weights)", ty.name()),
                    0.0,
                    |_| Err(anyhow::anyhow!("{e}")),
                );
                continue;
            }
        };
        let h = uniform(&mut cx.rng, k, -40.0, 40.0);
        let y = uniform(&mut cx.rng, k, -6.0, 6.0);
        let pw = uniform(&mut cx.rng, k, -1.0, 1.5);
        let nw = uniform(&mut cx.rng, k, -1.0, 1.5);
        let label = format!(
            "norm_add_linear {} {out}x{k} post {pmode:?} scale {scale:?} mode {mode}",
            ty.name()
        );
        let r = super::backend_ops::tref("w", ty, vec![out, k], &w);
        let (gw, cw) = match (cx.gpu.upload(&r), cx.cpu8.upload(&r)) {
            (Ok(g), Ok(c)) => (g, c),
            (g, c) => {
                let e = format!("{:?} / {:?}", g.err(), c.err());
                cx.case(format!("{label} (upload)"), 0.0, |_| {
                    Err(anyhow::anyhow!(e))
                });
                continue;
            }
        };
        // the sum (exact up to the norm's rounding) and the product (the int8 GEMV bound)
        cx.case(format!("{label} vs CPU int8"), 1e-3, |cx| {
            let (gh, ch) = cx.t2(&h, 1, k)?;
            let (gy, cy) = cx.t2(&y, 1, k)?;
            let (gpw, cpw) = cx.t2(&pw, 1, k)?;
            let (gnw, cnw) = cx.t2(&nw, 1, k)?;
            let gp = PostNorm {
                norm: pmode.map(|m| norm(m, &gpw)),
                scale,
            };
            let cp = PostNorm {
                norm: pmode.map(|m| norm(m, &cpw)),
                scale,
            };
            let (gs, go) = cx
                .gpu
                .norm_add_linear(&gh, &gy, &gp, norm(mode, &gnw), 1e-6, k, &gw)?;
            let (cs, co) =
                cx.cpu8
                    .norm_add_linear(&ch, &cy, &cp, norm(mode, &cnw), 1e-6, k, &cw)?;
            let mut got = host(&cx.gpu, &gs)?;
            got.extend(host(&cx.gpu, &go)?);
            let mut want = cs.data;
            want.extend(co.data);
            Ok((got, want))
        });
        cx.case(format!("{label} vs CUDA norm + linear"), 1e-3, |cx| {
            let gpu = &cx.gpu;
            let (gh, gy) = (gpu.tensor(&h, 1, k)?, gpu.tensor(&y, 1, k)?);
            let (gpw, gnw) = (gpu.tensor(&pw, 1, k)?, gpu.tensor(&nw, 1, k)?);
            let p = PostNorm {
                norm: pmode.map(|m| norm(m, &gpw)),
                scale,
            };
            let (gs, go) = gpu.norm_add_linear(&gh, &gy, &p, norm(mode, &gnw), 1e-6, k, &gw)?;
            let (ws, wn) = gpu.norm_add_rms_norm(&gh, &gy, &p, norm(mode, &gnw), 1e-6, k)?;
            let wo = gpu.linear(&wn, &gw)?;
            let mut got = host(gpu, &gs)?;
            got.extend(host(gpu, &go)?);
            let mut want = host(gpu, &ws)?;
            want.extend(host(gpu, &wo)?);
            Ok((got, want))
        });
    }
}
