//! `norm_add_rmsnorm` instances vs `crate::ops::rms_norm` of the branch, the add, the scale
//! and `crate::ops::rms_norm` of the sum: plain, 1+w, weightless and no branch norm; a Gemma 4
//! 12B decode row (split over 4 blocks), split rows of 3 and 2 blocks, a row on the loop path,
//! two rows with a side-car (unsplit, 4 groups per warp), a prefill block, per-head groups, an
//! odd dim; the int8 side-car vs `crate::ops::qdot::quantize_q8_1` of the kernel's
//! own output (bytes and scales exact). Unwritten values stay NaN and fail, so a block split
//! that skips a chunk cannot pass.

use super::add_rmsnorm::side_car_cmp;
use crate::backend::cuda::{CudaError, DevPtr, Kern, NormAddWeights, NormWeightPtr};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::{rms_norm, NormWeight};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct NormAddRmsNormCheck;

/// One case: groups x dim, the branch norm's mode (None: no norm), the sum's norm mode, the
/// scale, whether a side-car is written.
type Case = (usize, usize, Option<u8>, u8, f32, bool);

fn nw(mode: u8, w: &[f32]) -> NormWeight<'_> {
    match mode {
        0 => NormWeight::Plain(w),
        1 => NormWeight::OnePlus(w),
        _ => NormWeight::None,
    }
}

fn nwp(mode: u8, w: DevPtr<f32>) -> NormWeightPtr {
    match mode {
        0 => NormWeightPtr::Plain(w),
        1 => NormWeightPtr::OnePlus(w),
        _ => NormWeightPtr::None,
    }
}

impl KernelCheck for NormAddRmsNormCheck {
    fn name(&self) -> &'static str {
        "norm_add_rmsnorm"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::NormAddRmsNorm
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        5e-5 // two norms in a row (rmsnorm's 2e-5 each; the sum carries the first one's error)
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let cases: [Case; 9] = [
            (1, 3840, Some(0), 0, 0.73, true),
            (2, 4096, Some(0), 1, 0.9, true),
            (1, 5376, Some(1), 1, 1.0, true),
            (7, 3840, Some(0), 0, 0.5, false),
            (1, 2560, None, 0, 0.25, true),
            (1, 1152, Some(2), 0, 1.0, true),
            (16, 128, Some(2), 2, 1.0, true),
            (3, 3000, Some(0), 1, 1.0, false),
            (1, 256, Some(0), 0, 2.0, true),
        ];
        let eps = 1e-6f32;
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (ci, &(groups, dim, bmode, mode, scale, side)) in cases.iter().enumerate() {
            let n = groups * dim;
            let a = uniform(&mut cx.rng, n, -20.0, 20.0);
            let b = uniform(&mut cx.rng, n, -3.0, 3.0);
            let wb = uniform(&mut cx.rng, dim, -1.0, 1.5);
            let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
            let mut u = b.clone();
            if let Some(m) = bmode {
                rms_norm(&b, nw(m, &wb), eps, dim, &mut u);
            }
            let sum: Vec<f32> = a.iter().zip(&u).map(|(x, y)| (x + y) * scale).collect();
            let mut want = vec![0f32; n];
            rms_norm(&sum, nw(mode, &w), eps, dim, &mut want);
            let (da, db) = (cx.dev.upload(&a)?, cx.dev.upload(&b)?);
            let (dwb, dw) = (cx.dev.upload(&wb)?, cx.dev.upload(&w)?);
            let ds = cx.dev.filled_f32(n, f32::NAN)?;
            let dy = cx.dev.filled_f32(n, f32::NAN)?;
            let dq = cx.dev.upload(&vec![0x7fi8; n])?;
            let dd = cx.dev.filled_f32(n / 16 + 1, f32::NAN)?;
            let weights = NormAddWeights {
                post: bmode.map(|m| nwp(m, DevPtr::of(&dwb))),
                norm: nwp(mode, DevPtr::of(&dw)),
            };
            let q8 = side.then(|| (DevPtr::of(&dq), DevPtr::of(&dd)));
            let dev = cx.dev;
            let launch = || {
                dev.norm_add_rms_norm_ptr(
                    &kern,
                    DevPtr::of(&da),
                    DevPtr::of(&db),
                    DevPtr::of(&ds),
                    weights,
                    scale,
                    DevPtr::of(&dy),
                    eps,
                    dim,
                    q8,
                    None,
                )
            };
            launch()?;
            let y = dev.download(&dy)?;
            cmp = cmp
                .merge(Comparison::new(&dev.download(&ds)?, &sum))
                .merge(Comparison::new(&y, &want));
            if side {
                let q = dev.download(&dq)?;
                let d = dev.download(&dd)?;
                cmp = cmp.merge(side_car_cmp(&y, &q, &d[..n / 16]));
            }
            if ci == 0 {
                micros = time_us(dev, cx.iters, launch)?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
