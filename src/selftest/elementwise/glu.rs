//! GeGLU / SwiGLU instances vs `crate::ops::{geglu, swiglu}`: contiguous operands, and gate/up
//! as the two halves of one fused `[rows, 2 * cols]` projection (strided views); the `__q8`
//! entry on one fused row (int8 side-car: bytes and scales exactly `quantize_q8_1` of out); the
//! multi-row `__vec` entry (float4), its bf16 copy exactly bf16(out). Timed: `__vec` with the
//! bf16 copy on a Qwen3-8B prefill (512 x 12288 from the fused gate|up).

use super::add_rmsnorm::side_car_cmp;
use crate::backend::cuda::{CudaError, DevPtr, GluShape, Kern};
use crate::kernels::Entry;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::{geglu, swiglu};
use crate::quant::bf16_to_f32;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

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

        // The multi-row entry (`__vec`, float4): contiguous operands with and without the bf16
        // copy, and the fused [rows, 2 * cols] halves; out against the reference, the bf16
        // copy exactly bf16(out) (round to nearest even, as cast_bf16).
        let ve = cx.dev.kern_entry(&kern, Entry::Vec)?;
        for &(rows, cols, fused, with16) in &[
            (12usize, 15_360usize, false, true),
            (9, 1000, true, true),
            (10, 64, false, false),
        ] {
            let w = if fused { 2 * cols } else { cols };
            let g_all = uniform(&mut cx.rng, rows * w, -6.0, 6.0);
            let u_all = if fused {
                Vec::new()
            } else {
                uniform(&mut cx.rng, rows * cols, -2.0, 2.0)
            };
            let (gate, up): (Vec<f32>, Vec<f32>) = if fused {
                (
                    g_all
                        .chunks_exact(w)
                        .flat_map(|r| r[..cols].to_vec())
                        .collect(),
                    g_all
                        .chunks_exact(w)
                        .flat_map(|r| r[cols..].to_vec())
                        .collect(),
                )
            } else {
                (g_all.clone(), u_all.clone())
            };
            let want = reference(op, &gate, &up);
            let dg = cx.dev.upload(&g_all)?;
            let du = if fused {
                None
            } else {
                Some(cx.dev.upload(&u_all)?)
            };
            let pg = DevPtr::of(&dg);
            let (gp, upp) = match &du {
                Some(u) => (pg, DevPtr::of(u)),
                None => (
                    pg,
                    pg.slice(cols, pg.len() - cols)
                        .ok_or_else(|| CudaError::Invalid {
                            op: "glu check",
                            detail: "fused rows".into(),
                        })?,
                ),
            };
            let dout = cx.dev.filled_f32(rows * cols, f32::NAN)?;
            let d16 = cx.dev.upload(&vec![0x7fc0u16; rows * cols])?;
            cx.dev.glu_vec_ptr(
                &ve,
                gp,
                upp,
                DevPtr::of(&dout),
                with16.then(|| DevPtr::of(&d16)),
                rows,
                cols,
                [w, w, cols],
            )?;
            let y = cx.dev.download(&dout)?;
            cmp = cmp.merge(Comparison::new(&y, &want));
            if with16 {
                let got: Vec<f32> = cx
                    .dev
                    .download(&d16)?
                    .into_iter()
                    .map(bf16_to_f32)
                    .collect();
                let exp: Vec<f32> = y
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect();
                cmp = cmp.merge(Comparison::identical(&got, &exp));
            }
        }

        // Timing: the multi-row entry on a Qwen3-8B prefill, 512 rows of the fused [512, 2 x
        // 12288] gate|up, writing out and its bf16 copy.
        let (rows, ff) = (512usize, 12_288usize);
        let dx = cx
            .dev
            .upload(&uniform(&mut cx.rng, rows * 2 * ff, -6.0, 6.0))?;
        let out = cx.dev.filled_f32(rows * ff, f32::NAN)?;
        let o16 = cx.dev.upload(&vec![0u16; rows * ff])?;
        let all = DevPtr::of(&dx);
        let up = all
            .slice(ff, all.len() - ff)
            .ok_or_else(|| CudaError::Invalid {
                op: "glu check",
                detail: "fused rows".into(),
            })?;
        let dev = cx.dev;
        let (po, p16) = (DevPtr::of(&out), DevPtr::of(&o16));
        let micros = time_us(dev, cx.iters, || {
            dev.glu_vec_ptr(&ve, all, up, po, Some(p16), rows, ff, [2 * ff, 2 * ff, ff])
        })?;
        Ok(Measured { cmp, micros })
    }
}
