//! RMSNorm instances vs `crate::ops::rms_norm`: plain, 1+w and weightless; whole rows and
//! per-head groups; a dim that is not a multiple of the block size; the `__q8` entry (int8
//! side-car: bytes and scales exactly `quantize_q8_1` of the output); the one-warp-per-group
//! entries (`__warp<M>`) against the reference and the main entry bit for bit, and in place.

use super::add_rmsnorm::side_car_cmp;
use crate::backend::cuda::{rms_norm_rows_suffix, CudaError, DevPtr, Kern, NormWeightPtr};
use crate::backend::Norm;
use crate::kernels::Entry;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::{rms_norm, NormWeight};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct RmsNormCheck;

impl KernelCheck for RmsNormCheck {
    fn name(&self) -> &'static str {
        "rmsnorm"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::RmsNorm
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        2e-5
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        // (groups, dim, mode): whole-row Gemma 4 12B, per-head q-norm (16 heads x 2 tokens),
        // weightless v-norm with an odd dim, exactly 16 values per thread (4096), and a row wider
        // than the register path (5120: the loop path).
        let cases = [
            (7usize, 3840usize, 0u8),
            (32, 128, 1u8),
            (3, 3000, 2u8),
            (2, 4096, 1u8),
            (2, 5120, 0u8),
        ];
        let eps = 1e-6f32;
        let mut cmp = Comparison::default();
        for &(groups, dim, mode) in &cases {
            let x = uniform(&mut cx.rng, groups * dim, -3.0, 3.0);
            let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
            let mut want = vec![0f32; x.len()];
            let nw = match mode {
                0 => NormWeight::Plain(&w),
                1 => NormWeight::OnePlus(&w),
                _ => NormWeight::None,
            };
            rms_norm(&x, nw, eps, dim, &mut want);
            let dx = cx.dev.upload(&x)?;
            let dw = cx.dev.upload(&w)?;
            let mut out = cx.dev.filled_f32(x.len(), f32::NAN)?;
            let dn = match mode {
                0 => Norm::Plain(&dw),
                1 => Norm::OnePlus(&dw),
                _ => Norm::None,
            };
            cx.dev.rms_norm(spec, &dx, dn, eps, dim, &mut out)?;
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
        }
        // The side-car entry (`__q8`): one decode row, register and loop paths, and per-head
        // groups; y as above, the int8 bytes and scales exactly quantize_q8_1(y).
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let kq = cx.dev.kern_q8(&kern)?;
        for &(groups, dim, mode) in &[(1usize, 4096usize, 0u8), (1, 5120, 1), (8, 128, 2)] {
            let n = groups * dim;
            let x = uniform(&mut cx.rng, n, -3.0, 3.0);
            let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
            let mut want = vec![0f32; n];
            let nw = match mode {
                0 => NormWeight::Plain(&w),
                1 => NormWeight::OnePlus(&w),
                _ => NormWeight::None,
            };
            rms_norm(&x, nw, eps, dim, &mut want);
            let (dx, dw) = (cx.dev.upload(&x)?, cx.dev.upload(&w)?);
            let dy = cx.dev.filled_f32(n, f32::NAN)?;
            let dq = cx.dev.upload(&vec![0x7fi8; n])?;
            let dd = cx.dev.filled_f32(n / 16, f32::NAN)?;
            let wp = match mode {
                0 => NormWeightPtr::Plain(DevPtr::of(&dw)),
                1 => NormWeightPtr::OnePlus(DevPtr::of(&dw)),
                _ => NormWeightPtr::None,
            };
            let q8 = (DevPtr::of(&dq), DevPtr::of(&dd));
            cx.dev.rms_norm_ptr(
                &kern,
                DevPtr::of(&dx),
                wp,
                DevPtr::of(&dy),
                eps,
                dim,
                Some((&kq, q8)),
            )?;
            let y = cx.dev.download(&dy)?;
            cmp = cmp.merge(Comparison::new(&y, &want)).merge(side_car_cmp(
                &y,
                &cx.dev.download(&dq)?,
                &cx.dev.download(&dd)?,
            ));
        }
        // The one-warp-per-group entries (`__warp4/8/16/32`, prefill per-head norms): the
        // reference, and the main entry's output bit for bit. Groups of 16 (golden models), 96,
        // 128, 256, 512, a partly filled warp32 (1000) and 1024.
        for &(groups, dim, mode) in &[
            (33usize, 16usize, 1u8),
            (17, 96, 0),
            (300, 128, 0),
            (40, 256, 1),
            (9, 512, 2),
            (10, 1000, 0),
            (3, 1024, 1),
        ] {
            let n = groups * dim;
            let x = uniform(&mut cx.rng, n, -3.0, 3.0);
            let w = uniform(&mut cx.rng, dim, -1.0, 1.5);
            let mut want = vec![0f32; n];
            let nw = match mode {
                0 => NormWeight::Plain(&w),
                1 => NormWeight::OnePlus(&w),
                _ => NormWeight::None,
            };
            rms_norm(&x, nw, eps, dim, &mut want);
            let (dx, dw) = (cx.dev.upload(&x)?, cx.dev.upload(&w)?);
            let wp = match mode {
                0 => NormWeightPtr::Plain(DevPtr::of(&dw)),
                1 => NormWeightPtr::OnePlus(DevPtr::of(&dw)),
                _ => NormWeightPtr::None,
            };
            let (dmain, drows) = (
                cx.dev.filled_f32(n, f32::NAN)?,
                cx.dev.filled_f32(n, f32::NAN)?,
            );
            cx.dev.rms_norm_ptr(
                &kern,
                DevPtr::of(&dx),
                wp,
                DevPtr::of(&dmain),
                eps,
                dim,
                None,
            )?;
            let sfx = rms_norm_rows_suffix(dim).ok_or_else(|| CudaError::Invalid {
                op: "rmsnorm check",
                detail: format!("no warp entry for {dim}"),
            })?;
            let e = cx.dev.kern_entry(&kern, sfx)?;
            cx.dev
                .rms_norm_rows_ptr(&e, DevPtr::of(&dx), wp, DevPtr::of(&drows), eps, dim)?;
            let (ym, yr) = (cx.dev.download(&dmain)?, cx.dev.download(&drows)?);
            cmp = cmp
                .merge(Comparison::new(&yr, &want))
                .merge(Comparison::identical(&yr, &ym));
        }
        // in place (x == y) through a warp entry
        {
            let (groups, dim) = (24usize, 128usize);
            let x = uniform(&mut cx.rng, groups * dim, -3.0, 3.0);
            let mut want = vec![0f32; x.len()];
            rms_norm(&x, NormWeight::None, eps, dim, &mut want);
            let dx = cx.dev.upload(&x)?;
            let e = cx.dev.kern_entry(&kern, Entry::Warp4)?;
            let px = DevPtr::of(&dx);
            cx.dev
                .rms_norm_rows_ptr(&e, px, NormWeightPtr::None, px, eps, dim)?;
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&dx)?, &want));
        }
        // Timing: one decode-sized batch of 32 rows x 4096.
        let (groups, dim) = (32usize, 4096usize);
        let dx = cx
            .dev
            .upload(&uniform(&mut cx.rng, groups * dim, -3.0, 3.0))?;
        let dw = cx.dev.upload(&uniform(&mut cx.rng, dim, -1.0, 1.0))?;
        let mut out = cx.dev.filled_f32(groups * dim, f32::NAN)?;
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.rms_norm(spec, &dx, Norm::Plain(&dw), eps, dim, &mut out)
        })?;
        Ok(Measured { cmp, micros })
    }
}
