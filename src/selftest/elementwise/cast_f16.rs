//! f32 -> f16 rows with a power-of-two scale per row (`cast_f16`) vs the same rule on the CPU
//! (`half::f16::from_f32`, round to nearest even): exact, values and scales, over rows of every
//! magnitude (2^-60 to 2^60), a row of zeros, a row whose maximum is exactly 2^14, one holding
//! an infinity, and a length that is not a multiple of the block. Timed on 512 x 12288 values.

use crate::backend::cuda::{CudaError, DevPtr, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::quant::f16_to_f32;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct CastF16Check;

/// The row scale `cast_f16` must pick: 2^(e - 13) for a maximum magnitude in [2^e, 2^(e+1)),
/// at least 2^-126; 1 for a zero / subnormal / infinite maximum.
fn row_scale(row: &[f32]) -> f32 {
    let a = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    let eb = (a.to_bits() >> 23) & 0xff;
    if eb == 0 || eb == 255 {
        1.0
    } else {
        f32::from_bits(eb.saturating_sub(13).max(1) << 23)
    }
}

impl KernelCheck for CastF16Check {
    fn name(&self) -> &'static str {
        "cast_f16"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::CastF16
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let (rows, cols) = (64usize, 1001usize);
        let mut x = uniform(&mut cx.rng, rows * cols, -1.0, 1.0);
        for (r, row) in x.chunks_mut(cols).enumerate() {
            let e = (r as i32 - 32) * 2; // 2^-64 .. 2^62
            row.iter_mut().for_each(|v| *v *= (e as f32).exp2());
        }
        x[..cols].iter_mut().for_each(|v| *v = 0.0);
        x[cols..2 * cols].iter_mut().for_each(|v| *v *= 1e4);
        x[cols + 7] = 16384.0;
        x[2 * cols + 5] = f32::INFINITY;
        let mut want = Vec::with_capacity(x.len());
        let mut want_rs = Vec::with_capacity(rows);
        for row in x.chunks(cols) {
            let s = row_scale(row);
            want_rs.push(s);
            want.extend(row.iter().map(|&v| half::f16::from_f32(v / s).to_f32() * s));
        }
        let dx = cx.dev.upload(&x)?;
        let dy = cx.dev.upload(&vec![0x7e00u16; rows * cols])?;
        let drs = cx.dev.filled_f32(rows, f32::NAN)?;
        let (px, py, prs) = (DevPtr::of(&dx), DevPtr::of(&dy), DevPtr::of(&drs));
        cx.dev.cast_f16_ptr(&kern, px, py, prs, (rows, cols))?;
        let got_rs = cx.dev.download(&drs)?;
        let got: Vec<f32> = cx
            .dev
            .download(&dy)?
            .into_iter()
            .enumerate()
            .map(|(i, h)| f16_to_f32(h) * got_rs[i / cols])
            .collect();
        // values row by row (the rows' magnitudes span 2^126)
        let mut cmp = Comparison::default();
        for (g, w) in got.chunks(cols).zip(want.chunks(cols)).skip(3) {
            cmp = cmp.merge(Comparison::new(g, w));
        }
        // the scales, the zero row, the 2^14 row and the row with an infinity: bit for bit
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
        if !same(&got_rs, &want_rs) || !same(&got[..3 * cols], &want[..3 * cols]) {
            cmp = cmp.merge(Comparison {
                max_rel_err: f64::INFINITY,
                unwritten: 0,
                elements: rows + 3 * cols,
            });
        }
        // Timing: a Qwen3-8B prefill's down-projection input, 512 x 12288.
        let (tr, tc) = (512usize, 12_288usize);
        let dx = cx.dev.upload(&uniform(&mut cx.rng, tr * tc, -3.0, 3.0))?;
        let dy = cx.dev.upload(&vec![0u16; tr * tc])?;
        let drs = cx.dev.upload(&vec![0f32; tr])?;
        let (tx, ty, trs) = (DevPtr::of(&dx), DevPtr::of(&dy), DevPtr::of(&drs));
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.cast_f16_ptr(&kern, tx, ty, trs, (tr, tc))
        })?;
        Ok(Measured { cmp, micros })
    }
}
