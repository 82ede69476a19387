//! Backend-level GPU checks of the q4_kr deferred-norm consumers that load a row of 4096 in one
//! batch (`__rsw` / `__rsqvw`, `CudaBackend::with_rs_wide`) against `__rs` / `__rsqv`: bound 0,
//! the same words added in the same order. (The default backend's rows in `backend_res` check
//! whichever entries the launch's size picks against the CPU.)

use super::backend_res::Loaded;
use crate::backend::cuda::{CudaBackend, KvType};
use crate::kernels::Quant;
use crate::ops::qdot::random_weights;
use crate::quant::GgmlType;
use crate::selftest::backend_ops::{tref, Ctx};
use crate::selftest::check::uniform;

/// (producer format, k, n, the consumers' formats and rows)
type Case = (GgmlType, usize, usize, &'static [(GgmlType, usize)]);

pub(in crate::selftest) fn wide_cases(cx: &mut Ctx) {
    use GgmlType::{Q4K, Q6K};
    let dev = cx.gpu.dev.clone();
    let make = move |wide: bool| -> anyhow::Result<CudaBackend> {
        Ok(CudaBackend::with_device(dev.clone(), KvType::Fp8E4m3)?.with_rs_wide(wide))
    };
    // (producer format, k, n, consumers): Qwen3-8B's fused q|k|v after its o projection, its q|k
    // (Q4_K) + v (Q6_K), and rows narrower than 4096 and not a whole batch of 32 x 4 words
    let cases: [Case; 3] = [
        (Q4K, 4096, 4096, &[(Q4K, 6144)]),
        (Q4K, 4096, 4096, &[(Q4K, 5120), (Q6K, 1024)]),
        (Q4K, 12288, 2304, &[(Q4K, 776)]),
    ];
    for (ty, k, n, cons) in cases {
        let Ok(wb) = random_weights(ty, n, k, &mut cx.rng) else {
            continue;
        };
        let cbs: Vec<_> = cons
            .iter()
            .map(|&(t, rows)| random_weights(t, rows, n, &mut cx.rng))
            .collect::<Result<_, _>>()
            .unwrap_or_default();
        if cbs.len() != cons.len() {
            continue;
        }
        let wr = tref("proj", ty, vec![n, k], &wb);
        let crefs: Vec<_> = cons
            .iter()
            .zip(&cbs)
            .map(|(&(t, rows), b)| tref("next", t, vec![rows, n], b))
            .collect();
        let x = uniform(&mut cx.rng, k, -2.0, 2.0);
        let h = uniform(&mut cx.rng, n, -3.0, 3.0);
        let nw = uniform(&mut cx.rng, n, -1.0, 1.5);
        let eps = 1e-6f32;
        let label = format!(
            "{} 1x{k} -> {n} -> {}",
            ty.name(),
            cons.iter()
                .map(|(t, r)| format!("{} {r}", t.name()))
                .collect::<Vec<_>>()
                .join(" + ")
        );
        let run = |be: &CudaBackend| -> anyhow::Result<Vec<f32>> {
            Loaded::new(be, (&wr, &crefs), (&x, &h, &nw))?.deferred_linear(be, eps)
        };
        cx.case(
            format!("linear_add_rms_norm_then {label} deferred: wide entries == narrow"),
            0.0,
            |_| {
                let on = make(true)?;
                anyhow::ensure!(on.rs_wide(Quant::Q4KR, n, 1), "wide entry not taken");
                Ok((run(&on)?, run(&make(false)?)?))
            },
        );
    }
}
