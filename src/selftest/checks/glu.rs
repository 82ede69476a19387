//! GeGLU / SwiGLU instances vs `crate::ops::{geglu, swiglu}`: contiguous operands, and gate/up
//! as the two halves of one fused `[rows, 2 * cols]` projection (strided views); the `__q8`
//! entry on one fused row (int8 side-car: bytes and scales exactly `quantize_q8_1` of out).

use super::super::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};
use super::add_rmsnorm::side_car_cmp;
use crate::backend::cuda::{CudaError, DevPtr, GluShape, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::{geglu, swiglu};

pub struct GluCheck;

fn reference(op: Op, gate: &[f32], up: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; gate.len()];
    if op == Op::Geglu {
        geglu(gate, up, &mut out);
    } else {
        swiglu(gate, up, &mut out);
    }
    out
}

impl KernelCheck for GluCheck {
    fn name(&self) -> &'static str {
        "glu"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        matches!(key.op, Op::Geglu | Op::Swiglu)
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        2e-5
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let op = spec.key.op;
        let mut cmp = Comparison::default();
        // Contiguous: Gemma 4 12B FFN width.
        let (rows, cols) = (5usize, 15_360usize);
        let gate = uniform(&mut cx.rng, rows * cols, -6.0, 6.0);
        let up = uniform(&mut cx.rng, rows * cols, -2.0, 2.0);
        let want = reference(op, &gate, &up);
        let (dg, du) = (cx.dev.upload(&gate)?, cx.dev.upload(&up)?);
        let mut out = cx.dev.filled_f32(rows * cols, f32::NAN)?;
        let shape = GluShape::contiguous(rows, cols);
        cx.dev.glu(
            spec,
            &dg.as_view(),
            &du.as_view(),
            &mut out.as_view_mut(),
            &shape,
        )?;
        cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));

        // Fused [rows, 2*cols]: gate = first half of each row, up = second half.
        let (rows, cols) = (3usize, 1000usize);
        let fused = uniform(&mut cx.rng, rows * 2 * cols, -6.0, 6.0);
        let gate: Vec<f32> = fused
            .chunks_exact(2 * cols)
            .flat_map(|r| r[..cols].to_vec())
            .collect();
        let up: Vec<f32> = fused
            .chunks_exact(2 * cols)
            .flat_map(|r| r[cols..].to_vec())
            .collect();
        let want = reference(op, &gate, &up);
        let df = cx.dev.upload(&fused)?;
        let mut out = cx.dev.filled_f32(rows * cols, f32::NAN)?;
        let (gv, uv) = (df.slice(0..), df.slice(cols..));
        let shape = GluShape {
            rows,
            cols,
            gate_stride: 2 * cols,
            up_stride: 2 * cols,
            out_stride: cols,
        };
        cx.dev.glu(spec, &gv, &uv, &mut out.as_view_mut(), &shape)?;
        cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));

        // The side-car entry (`__q8`) on one fused decode row: out as above, the int8 bytes
        // and scales exactly quantize_q8_1(out).
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let kq = cx.dev.kern_q8(&kern)?;
        let ff = 12_288usize;
        let fused = uniform(&mut cx.rng, 2 * ff, -6.0, 6.0);
        let want = reference(op, &fused[..ff], &fused[ff..]);
        let df = cx.dev.upload(&fused)?;
        let dout = cx.dev.filled_f32(ff, f32::NAN)?;
        let dq = cx.dev.upload(&vec![0x7fi8; ff])?;
        let dd = cx.dev.filled_f32(ff / 16, f32::NAN)?;
        let all = DevPtr::of(&df);
        let up = all.slice(ff, ff).ok_or_else(|| CudaError::Invalid {
            op: "glu check",
            detail: "fused row".into(),
        })?;
        cx.dev.glu_strided_ptr(
            &kern,
            all,
            up,
            DevPtr::of(&dout),
            1,
            ff,
            [2 * ff, 2 * ff, ff],
            Some((&kq, (DevPtr::of(&dq), DevPtr::of(&dd)))),
        )?;
        let y = cx.dev.download(&dout)?;
        cmp = cmp.merge(Comparison::new(&y, &want)).merge(side_car_cmp(
            &y,
            &cx.dev.download(&dq)?,
            &cx.dev.download(&dd)?,
        ));

        // Timing: 32 rows x 15360.
        let (rows, cols) = (32usize, 15_360usize);
        let dg = cx
            .dev
            .upload(&uniform(&mut cx.rng, rows * cols, -6.0, 6.0))?;
        let du = cx
            .dev
            .upload(&uniform(&mut cx.rng, rows * cols, -2.0, 2.0))?;
        let mut out = cx.dev.filled_f32(rows * cols, f32::NAN)?;
        let dev = cx.dev;
        let shape = GluShape::contiguous(rows, cols);
        let micros = time_us(dev, cx.iters, || {
            dev.glu(
                spec,
                &dg.as_view(),
                &du.as_view(),
                &mut out.as_view_mut(),
                &shape,
            )
        })?;
        Ok(Measured { cmp, micros })
    }
}
