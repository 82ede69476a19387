//! `add_rmsnorm` instances vs `a + b` and `crate::ops::rms_norm` of the sum: plain, 1+w and
//! weightless; whole rows (register path and the loop path past 4096), per-head groups and an
//! odd dim; the int8 side-car vs `crate::ops::qdot::quantize_q8_1` of the kernel's own output
//! (bytes and scales exact); the `__bf16` entry (cases without a side-car): s and y equal to
//! the main entry's bit for bit, the bf16 copy exactly bf16(y) (round to nearest even).

use crate::backend::cuda::{CudaError, DevPtr, Kern, NormWeightPtr};
use crate::kernels::Entry;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::qdot::quantize_q8_1;
use crate::ops::{rms_norm, NormWeight};
use crate::quant::bf16_to_f32;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct AddRmsNormCheck;

/// The side-car read back (`q` then `{d, s}` pairs) against `quantize_q8_1(y)`: both as f32
/// for the metric, which is 0 only when every byte and scale matches.
pub(crate) fn side_car_cmp(y: &[f32], q: &[i8], ds: &[f32]) -> Comparison {
    let Ok(want) = quantize_q8_1(y) else {
        return Comparison::new(&[f32::INFINITY], &[0.0]);
    };
    let mut got: Vec<f32> = q.iter().map(|&v| v as f32).collect();
    got.extend_from_slice(ds);
    let mut exp: Vec<f32> = want.qs.iter().map(|&v| v as f32).collect();
    for (d, s) in want.d.iter().zip(&want.s) {
        exp.push(*d);
        exp.push(*s);
    }
    Comparison::new(&got, &exp)
}

impl KernelCheck for AddRmsNormCheck {
    fn name(&self) -> &'static str {
        "add_rmsnorm"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::AddRmsNorm
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        2e-5 // as rmsnorm (the sum itself is exact)
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        // (groups, dim, mode, side-car): a Qwen3-8B decode row, a row on the loop path, a
        // Gemma 4 12B prefill block, per-head groups with a side-car, an odd dim.
        let cases = [
            (1usize, 4096usize, 0u8, true),
            (1, 5120, 1, true),
            (7, 3840, 1, false),
            (16, 128, 2, true),
            (3, 3000, 0, false),
        ];
        let eps = 1e-6f32;
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (ci, &(groups, dim, mode, side)) in cases.iter().enumerate() {
            let n = groups * dim;
            let a = uniform(&mut cx.rng, n, -3.0, 3.0);
            let b = uniform(&mut cx.rng, n, -3.0, 3.0);
            let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
            let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
            let mut want = vec![0f32; n];
            let nw = match mode {
                0 => NormWeight::Plain(&w),
                1 => NormWeight::OnePlus(&w),
                _ => NormWeight::None,
            };
            rms_norm(&sum, nw, eps, dim, &mut want);
            let (da, db, dw) = (cx.dev.upload(&a)?, cx.dev.upload(&b)?, cx.dev.upload(&w)?);
            let ds = cx.dev.filled_f32(n, f32::NAN)?;
            let dy = cx.dev.filled_f32(n, f32::NAN)?;
            let dq = cx.dev.upload(&vec![0x7fi8; n])?;
            let dd = cx.dev.filled_f32(n / 16 + 1, f32::NAN)?;
            let wp = match mode {
                0 => NormWeightPtr::Plain(DevPtr::of(&dw)),
                1 => NormWeightPtr::OnePlus(DevPtr::of(&dw)),
                _ => NormWeightPtr::None,
            };
            let q8 = side.then(|| (DevPtr::of(&dq), DevPtr::of(&dd)));
            let dev = cx.dev;
            let launch = || {
                dev.add_rms_norm_ptr(
                    &kern,
                    DevPtr::of(&da),
                    DevPtr::of(&db),
                    DevPtr::of(&ds),
                    wp,
                    DevPtr::of(&dy),
                    eps,
                    dim,
                    q8,
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
            // the __bf16 entry (prefill: the GEMM's bf16 copy of y) on the same inputs into
            // fresh outputs: s and y bit for bit the main entry's, y16 exactly bf16(y)
            if !side {
                let e = dev.kern_entry(&kern, Entry::Bf16)?;
                let (ds2, dy2) = (dev.filled_f32(n, f32::NAN)?, dev.filled_f32(n, f32::NAN)?);
                let d16 = dev.upload(&vec![0x7fc0u16; n])?;
                dev.add_rms_norm_bf16_ptr(
                    &e,
                    DevPtr::of(&da),
                    DevPtr::of(&db),
                    DevPtr::of(&ds2),
                    wp,
                    DevPtr::of(&dy2),
                    eps,
                    dim,
                    DevPtr::of(&d16),
                )?;
                let y2 = dev.download(&dy2)?;
                let got16: Vec<f32> = dev.download(&d16)?.into_iter().map(bf16_to_f32).collect();
                let want16: Vec<f32> = y2
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect();
                cmp = cmp
                    .merge(Comparison::identical(&y2, &y))
                    .merge(Comparison::identical(
                        &dev.download(&ds2)?,
                        &dev.download(&ds)?,
                    ))
                    .merge(Comparison::identical(&got16, &want16));
            }
        }
        Ok(Measured { cmp, micros })
    }
}
