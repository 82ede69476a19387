//! L2 norm over head-sized and row-sized groups vs the CPU backend's `l2_norm`
//! (x / sqrt(sum(x^2) + eps), the sum in f64 there, f32 on the GPU).

use crate::backend::cuda::{CudaError, DevPtr, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct L2NormCheck;

fn reference(x: &[f32], dim: usize, eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    for g in out.chunks_exact_mut(dim) {
        let ss: f64 = g.iter().map(|&v| v as f64 * v as f64).sum();
        let inv = 1.0 / (ss as f32 + eps).sqrt();
        g.iter_mut().for_each(|v| *v *= inv);
    }
    out
}

impl KernelCheck for L2NormCheck {
    fn name(&self) -> &'static str {
        "l2_norm"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::L2Norm
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        2e-5
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (i, (groups, dim)) in [(3 * 16usize, 128usize), (3, 4096), (5, 100)]
            .into_iter()
            .enumerate()
        {
            let x = uniform(&mut cx.rng, groups * dim, -3.0, 3.0);
            let want = reference(&x, dim, 1e-6);
            let dx = cx.dev.upload(&x)?;
            let out = cx.dev.filled_f32(x.len(), f32::NAN)?;
            let (px, po) = (DevPtr::of(&dx), DevPtr::of(&out));
            cx.dev.l2_norm_ptr(&kern, px, po, 1e-6, dim)?;
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
            if i == 0 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || dev.l2_norm_ptr(&kern, px, po, 1e-6, dim))?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
