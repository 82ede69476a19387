//! Softmax instances vs `crate::ops::softmax`: a vocabulary-sized row, many short rows with a
//! scale, and an all -inf row (must become zeros).

use crate::backend::cuda::CudaError;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::softmax;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct SoftmaxCheck;

impl KernelCheck for SoftmaxCheck {
    fn name(&self) -> &'static str {
        "softmax"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Softmax
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        2e-5
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let mut cmp = Comparison::default();
        for &(rows, cols, scale) in &[(2usize, 262_144usize, 1.0f32), (16, 128, 0.5), (3, 77, 1.0)]
        {
            let mut x = uniform(&mut cx.rng, rows * cols, -8.0, 8.0);
            if cols == 77 {
                x[cols..2 * cols].fill(f32::NEG_INFINITY); // row 1 all masked
                x[2 * cols + 5] = f32::NEG_INFINITY; // one masked entry
            }
            let mut want: Vec<f32> = x.iter().map(|v| v * scale).collect();
            want.chunks_exact_mut(cols).for_each(softmax);
            let dx = cx.dev.upload(&x)?;
            let mut out = cx.dev.filled_f32(x.len(), f32::NAN)?;
            cx.dev.softmax(spec, &dx, &mut out, cols, scale)?;
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
        }
        let (rows, cols) = (8usize, 262_144usize);
        let dx = cx
            .dev
            .upload(&uniform(&mut cx.rng, rows * cols, -8.0, 8.0))?;
        let mut out = cx.dev.filled_f32(rows * cols, f32::NAN)?;
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.softmax(spec, &dx, &mut out, cols, 1.0)
        })?;
        Ok(Measured { cmp, micros })
    }
}
