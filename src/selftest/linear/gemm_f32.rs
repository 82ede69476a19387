//! Float-weight GEMM on CUDA cores (`gemm_f32`: f32, f16 or bf16 weights, f32 activations and sums)
//! vs an f64 CPU product of the same decoded operands: odd M/N/K tails, a K shorter than one
//! tile, and the Qwen3-30B-A3B router at a 512-token prefill (timed).

use crate::backend::cuda::{CudaError, DevPtr, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct GemmF32Check;

fn reference(a: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(m * n);
    for ar in a.chunks_exact(k).take(m) {
        for wr in w.chunks_exact(k).take(n) {
            let s: f64 = ar.iter().zip(wr).map(|(&x, &y)| x as f64 * y as f64).sum();
            out.push(s as f32);
        }
    }
    out
}

impl KernelCheck for GemmF32Check {
    fn name(&self) -> &'static str {
        "gemm_f32"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::GemmF32
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        1e-5 // f32 products and sums of up to 2048 terms against f64
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let q = spec.key.quant;
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (m, n, k) in [(37usize, 50usize, 70usize), (9, 33, 7), (512, 128, 2048)] {
            let a = uniform(&mut cx.rng, m * k, -1.0, 1.0);
            let w32 = uniform(&mut cx.rng, n * k, -1.0, 1.0);
            let (wbytes, wdec): (Vec<u8>, Vec<f32>) = if q == Quant::F16 {
                let h: Vec<half::f16> = w32.iter().map(|&v| half::f16::from_f32(v)).collect();
                (
                    h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                    h.iter().map(|v| v.to_f32()).collect(),
                )
            } else if q == Quant::Bf16 {
                let h: Vec<half::bf16> = w32.iter().map(|&v| half::bf16::from_f32(v)).collect();
                (
                    h.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                    h.iter().map(|v| v.to_f32()).collect(),
                )
            } else {
                (w32.iter().flat_map(|v| v.to_le_bytes()).collect(), w32)
            };
            let want = reference(&a, &wdec, m, n, k);
            let (da, dw) = (cx.dev.upload(&a)?, cx.dev.upload(&wbytes)?);
            let out = cx.dev.filled_f32(m * n, f32::NAN)?;
            let (pa, pw, po) = (DevPtr::of(&da), DevPtr::of(&dw), DevPtr::of(&out));
            cx.dev.gemm_f32_ptr(&kern, pa, pw, po, (m, n, k))?;
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
            if m == 512 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || {
                    dev.gemm_f32_ptr(&kern, pa, pw, po, (m, n, k))
                })?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
