//! f32 -> bf16 cast vs `half::bf16::from_f32` (round to nearest even): exact, over values of
//! every magnitude, ties, and an odd length; aligned (float4 path) and unaligned operands.
//! Timed on 512 x 12288 values.

use crate::backend::cuda::{CudaError, DevPtr, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::quant::bf16_to_f32;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct CastBf16Check;

impl KernelCheck for CastBf16Check {
    fn name(&self) -> &'static str {
        "cast_bf16"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::CastBf16
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let n = 100_003usize;
        let mut x = uniform(&mut cx.rng, n, -1.0, 1.0);
        let e = uniform(&mut cx.rng, n, -40.0, 40.0);
        x.iter_mut().zip(&e).for_each(|(v, &e)| *v *= e.exp2());
        // exact ties (lower 16 bits 0x8000) and zeros
        for (i, v) in x.iter_mut().enumerate().take(64) {
            *v = f32::from_bits(0x3f80_8000 + ((i as u32) << 16));
        }
        x[64] = 0.0;
        x[65] = -0.0;
        let want: Vec<f32> = x
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect();
        let dx = cx.dev.upload(&x)?;
        let out = cx.dev.upload(&vec![0x7fc0u16; n])?;
        let (px, po) = (DevPtr::of(&dx), DevPtr::of(&out));
        cx.dev.cast_bf16_ptr(&kern, px, po)?;
        let got: Vec<f32> = cx
            .dev
            .download(&out)?
            .into_iter()
            .map(bf16_to_f32)
            .collect();
        let mut cmp = Comparison::new(&got, &want);
        // unaligned operands (the one-value path): x from value 1 (4-byte aligned), y from
        // value 3 (2-byte aligned)
        let bad = || CudaError::Invalid {
            op: "cast_bf16 check",
            detail: "slices".into(),
        };
        let out2 = cx.dev.upload(&vec![0x7fc0u16; n])?;
        let (px1, po3) = (
            px.slice(1, n - 4).ok_or_else(bad)?,
            DevPtr::of(&out2).slice(3, n - 4).ok_or_else(bad)?,
        );
        cx.dev.cast_bf16_ptr(&kern, px1, po3)?;
        let got2: Vec<f32> = cx.dev.download(&out2)?[3..n - 1]
            .iter()
            .map(|&b| bf16_to_f32(b))
            .collect();
        cmp = cmp.merge(Comparison::new(&got2, &want[1..n - 3]));
        // Timing: a Qwen3-8B prefill's down-projection input, 512 x 12288.
        let m = 512 * 12_288;
        let dx = cx.dev.upload(&uniform(&mut cx.rng, m, -3.0, 3.0))?;
        let dy = cx.dev.upload(&vec![0u16; m])?;
        let (tx, ty) = (DevPtr::of(&dx), DevPtr::of(&dy));
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || dev.cast_bf16_ptr(&kern, tx, ty))?;
        Ok(Measured { cmp, micros })
    }
}
