//! Multi-stage bf16 / f16 GEMM (`gemm_pipe`, every tile entry the device fits) vs an f64 CPU
//! product of the same operands (`ops::gemm_ref::gemm_bf16` / `gemm_f16`), with and without row
//! scales. Edge shapes: M = 1, 17, 129, 300 (partial M tiles), N = 320 / 319 (partial N tiles,
//! an odd N with a wider row stride whose extra columns must stay untouched), K = 1000 (a
//! partial last K step) and 4096; plus 512 x 4096 x 4096 with the tile `GemmPipe::pick`
//! chooses, checked on 24 spread rows and timed.

use crate::backend::cuda::{CudaError, DevPtr, GemmTile};
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::ops::gemm_ref::{gemm_bf16, gemm_f16};
use crate::selftest::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};

use rand::Rng;

pub struct GemmPipeCheck;

/// `n` values in [-0.5, 0.5) as bf16 or f16 bits.
fn operand(rng: &mut impl Rng, n: usize, f16: bool) -> Vec<u16> {
    (0..n)
        .map(|_| {
            let v = rng.random::<f32>() - 0.5;
            if f16 {
                half::f16::from_f32(v).to_bits()
            } else {
                half::bf16::from_f32(v).to_bits()
            }
        })
        .collect()
}

impl KernelCheck for GemmPipeCheck {
    fn name(&self) -> &'static str {
        "gemm_pipe"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::GemmPipe
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        1e-4 // f32 accumulation of exact bf16 products, vs an f64 sum
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let g = cx.dev.gemm_pipe_of(spec)?;
        let f16 = spec.key.quant == Quant::F16;
        let product = if f16 { gemm_f16 } else { gemm_bf16 };
        let mut cmp = Comparison::default();
        // (m, n, k, ldc)
        let shapes: [(usize, usize, usize, usize); 5] = [
            (1, 320, 1000, 320),
            (17, 319, 1000, 322),
            (129, 384, 4096, 384),
            (300, 320, 1000, 320),
            (64, 256, 512, 256),
        ];
        for (i, (m, n, k, ldc)) in shapes.into_iter().enumerate() {
            let a = operand(&mut cx.rng, m * k, f16);
            let w = operand(&mut cx.rng, n * k, f16);
            let rows: Vec<usize> = (0..m).collect();
            let mut want = product(&a, &w, n, k, &rows);
            // every other shape with row scales 2^(r mod 9 - 4) (exact: powers of two)
            let scales: Option<Vec<f32>> =
                (i % 2 == 1).then(|| (0..m).map(|r| ((r % 9) as f32 - 4.0).exp2()).collect());
            if let Some(s) = &scales {
                want.iter_mut()
                    .enumerate()
                    .for_each(|(e, v)| *v *= s[e / n]);
            }
            let drs = scales.as_ref().map(|s| cx.dev.upload(s)).transpose()?;
            let (da, dw) = (cx.dev.upload(&a)?, cx.dev.upload(&w)?);
            for tile in GemmTile::ALL {
                if !g.has(tile) {
                    continue;
                }
                let dc = cx.dev.filled_f32(m * ldc, f32::NAN)?;
                cx.dev.gemm_pipe_ptr(
                    &g,
                    tile,
                    DevPtr::of(&da),
                    DevPtr::of(&dw),
                    DevPtr::of(&dc),
                    (m, n, k),
                    ldc,
                    drs.as_ref().map(DevPtr::of),
                )?;
                let got = cx.dev.download(&dc)?;
                let body: Vec<f32> = (0..m)
                    .flat_map(|r| got[r * ldc..r * ldc + n].to_vec())
                    .collect();
                cmp = cmp.merge(Comparison::new(&body, &want));
                // columns n..ldc of each row are not the GEMM's: still the NaN poison
                let touched = (0..m)
                    .flat_map(|r| got[r * ldc + n..(r + 1) * ldc].to_vec())
                    .filter(|v| !v.is_nan())
                    .count();
                if touched > 0 {
                    cmp = cmp.merge(Comparison {
                        max_rel_err: f64::INFINITY,
                        unwritten: 0,
                        elements: touched,
                    });
                }
            }
        }
        // the prefill shape, with the tile the backend would pick
        let (m, n, k) = (512usize, 4096usize, 4096usize);
        let a = operand(&mut cx.rng, m * k, f16);
        let w = operand(&mut cx.rng, n * k, f16);
        let rows: Vec<usize> = (0..24).map(|i| i * (m - 1) / 23).collect();
        let want = product(&a, &w, n, k, &rows);
        let (da, dw) = (cx.dev.upload(&a)?, cx.dev.upload(&w)?);
        let dc = cx.dev.filled_f32(m * n, f32::NAN)?;
        let tile = g.pick(m, n).ok_or_else(|| CudaError::Invalid {
            op: "selftest",
            detail: "gemm_pipe: no usable tile".into(),
        })?;
        let (pa, pw, pc) = (DevPtr::of(&da), DevPtr::of(&dw), DevPtr::of(&dc));
        cx.dev
            .gemm_pipe_ptr(&g, tile, pa, pw, pc, (m, n, k), n, None)?;
        let got = cx.dev.download(&dc)?;
        let got_rows: Vec<f32> = rows
            .iter()
            .flat_map(|&r| got[r * n..(r + 1) * n].to_vec())
            .collect();
        cmp = cmp.merge(Comparison::new(&got_rows, &want));
        cmp = cmp.merge(Comparison {
            unwritten: got.iter().filter(|v| v.is_nan()).count(),
            ..Default::default()
        });
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.gemm_pipe_ptr(&g, tile, pa, pw, pc, (m, n, k), n, None)
        })?;
        Ok(Measured { cmp, micros })
    }
}
