//! Backend-level GPU checks of a deferred norm's gate|up as one `__glurs` launch
//! (`CudaBackend::with_glurs`) against the `__rs` GEMV followed by the GLU kernel: bound 0, the
//! same dots scaled by the same rstd and the same activation. (The default backend's rows in
//! `backend_res` check whichever the launch picks against the composition and the CPU.)

use super::backend_res::Loaded;
use crate::backend::cuda::{CudaBackend, KvType};
use crate::backend::Runtime;
use crate::backend::{Activation, Norm, NormNext};
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;
use crate::selftest::backend_ops::{tref, Ctx};
use crate::selftest::check::uniform;

pub(in crate::selftest) fn glurs_cases(cx: &mut Ctx) {
    use GgmlType::{Q4K, Q4_0, Q8_0};
    let dev = cx.gpu.dev.clone();
    let make = move |on: bool| -> anyhow::Result<CudaBackend> {
        Ok(CudaBackend::with_device(dev.clone(), KvType::Fp8E4m3)?
            .with_defer_norm(true)
            .with_glurs(on))
    };
    // (producer, k, n, gate|up format, ff, activation): Qwen3-8B's o -> gate|up at a narrower
    // ff (the same 4096-wide rows), Gemma's GeGLU over Q8_0, a Q4_K gate|up
    let cases = [
        (
            Q4_0,
            4096usize,
            4096usize,
            Q4_0,
            1536usize,
            Activation::Silu,
        ),
        (Q8_0, 2048, 1024, Q8_0, 384, Activation::GeluTanh),
        (Q4K, 2048, 1536, Q4K, 256, Activation::Silu),
    ];
    for (ty, k, n, gty, ff, act) in cases {
        let (Ok(wb), Ok(gb)) = (
            random_weights(ty, n, k, &mut cx.rng),
            random_weights(gty, 2 * ff, n, &mut cx.rng),
        ) else {
            continue;
        };
        let wr = tref("proj", ty, vec![n, k], &wb);
        let gr = [tref("gate_up", gty, vec![2 * ff, n], &gb)];
        let x = uniform(&mut cx.rng, k, -2.0, 2.0);
        let h = uniform(&mut cx.rng, n, -3.0, 3.0);
        let nw = uniform(&mut cx.rng, n, -1.0, 1.5);
        let eps = 1e-6f32;
        let run = |be: &CudaBackend, want_glurs: bool| -> anyhow::Result<Vec<f32>> {
            let g = Loaded::new(be, (&wr, &gr), (&x, &h, &nw))?;
            anyhow::ensure!(
                be.takes_glurs(&g.ws[0], n)? == want_glurs,
                "__glurs {} where it should {}",
                if want_glurs { "not taken" } else { "taken" },
                if want_glurs { "be" } else { "not be" }
            );
            let (s, outs) = be
                .deferred_norm(
                    &g.x,
                    &g.w,
                    &g.h,
                    &Norm::Plain(&g.nw),
                    eps,
                    &NormNext::Glu(&g.ws[0], act),
                )?
                .ok_or_else(|| anyhow::anyhow!("the deferred path did not take the case"))?;
            let mut v = be.to_host(&s)?;
            for o in &outs {
                v.extend(be.to_host(o)?);
            }
            Ok(v)
        };
        cx.case(
            format!(
                "linear_add_rms_norm_then {} 1x{k} -> {n} -> {} gate|up {ff} {act:?} deferred: __glurs == __rs + GLU",
                ty.name(),
                gty.name()
            ),
            0.0,
            |_| Ok((run(&make(true)?, true)?, run(&make(false)?, false)?)),
        );
    }
}
