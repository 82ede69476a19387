//! The `ewise` kernel in every mode vs the CPU backend's definitions (`crate::ops`): add, mul
//! (same shape and `[1, cols]` broadcast), sigmoid gate (same shape and `[rows, 1]` per row),
//! scale, soft-cap. add/mul/scale are single roundings (exact); sigmoid and tanh differ from
//! Rust's libm by a few ulp.

use crate::backend::cuda::{Broadcast, CudaError, DevPtr, EwiseMode, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct EwiseCheck;

impl KernelCheck for EwiseCheck {
    fn name(&self) -> &'static str {
        "ewise"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Ewise
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        1e-5
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let (rows, cols) = (7usize, 3001usize);
        let a = uniform(&mut cx.rng, rows * cols, -60.0, 60.0);
        let b = uniform(&mut cx.rng, rows * cols, -8.0, 8.0);
        let brow = uniform(&mut cx.rng, cols, -2.0, 2.0);
        let bcol = uniform(&mut cx.rng, rows, -8.0, 8.0);
        let (da, db, dr, dc) = (
            cx.dev.upload(&a)?,
            cx.dev.upload(&b)?,
            cx.dev.upload(&brow)?,
            cx.dev.upload(&bcol)?,
        );
        let full = Broadcast {
            ptr: DevPtr::of(&db),
            row_stride: cols,
            col_stride: 1,
        };
        let row_b = Broadcast {
            ptr: DevPtr::of(&dr),
            row_stride: 0,
            col_stride: 1,
        };
        let col_b = Broadcast {
            ptr: DevPtr::of(&dc),
            row_stride: 1,
            col_stride: 0,
        };
        let idx = |i: usize| (i / cols, i % cols);
        type Case<'a> = (
            EwiseMode,
            Option<Broadcast>,
            f32,
            Box<dyn Fn(usize) -> f32 + 'a>,
        );
        let cases: Vec<Case<'_>> = vec![
            (EwiseMode::Add, Some(full), 0.0, Box::new(|i| a[i] + b[i])),
            (EwiseMode::Mul, Some(full), 0.0, Box::new(|i| a[i] * b[i])),
            (
                EwiseMode::Mul,
                Some(row_b),
                0.0,
                Box::new(|i| a[i] * brow[idx(i).1]),
            ),
            (
                EwiseMode::SigmoidGate,
                Some(full),
                0.0,
                Box::new(|i| a[i] * ops::sigmoid(b[i])),
            ),
            (
                EwiseMode::SigmoidGate,
                Some(col_b),
                0.0,
                Box::new(|i| a[i] * ops::sigmoid(bcol[idx(i).0])),
            ),
            (EwiseMode::Scale, None, 0.37, Box::new(|i| a[i] * 0.37)),
            (
                EwiseMode::Softcap,
                None,
                30.0,
                Box::new(|i| ops::softcap(a[i], 30.0)),
            ),
        ];
        let mut cmp = Comparison::default();
        let pa = DevPtr::of(&da);
        for (mode, bb, s, f) in &cases {
            let out = cx.dev.filled_f32(rows * cols, f32::NAN)?;
            cx.dev
                .ewise_ptr(&kern, *mode, pa, *bb, DevPtr::of(&out), rows, cols, *s)?;
            let want: Vec<f32> = (0..rows * cols).map(f).collect();
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
        }
        let out = cx.dev.filled_f32(rows * cols, f32::NAN)?;
        let po = DevPtr::of(&out);
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.ewise_ptr(&kern, EwiseMode::Add, pa, Some(full), po, rows, cols, 0.0)
        })?;
        Ok(Measured { cmp, micros })
    }
}
