//! Embedding lookup of every table format vs the CPU dequantiser (`crate::quant::dequantize`)
//! times the scale: ids from device memory, first and last rows, repeated ids, a row wider than
//! one 256-thread block. The kernel dequantises in the CPU's operation order, so the bound is
//! exact up to nothing (0 measured is expected; 1e-6 leaves room for nothing but rounding).

use crate::backend::cuda::{CudaError, DevPtr, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::qdot::random_weights;
use crate::quant::dequantize;
use crate::selftest::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};
use rand::Rng;

pub struct EmbedCheck;

fn bad(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "selftest",
        detail,
    }
}

impl KernelCheck for EmbedCheck {
    fn name(&self) -> &'static str {
        "embed"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Embed
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        1e-6
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let q = spec.key.quant;
        let (ty, repacked) = crate::selftest::registry::source_type(q)
            .ok_or_else(|| bad(format!("no GGML type for {q}")))?;
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let block = ty.block().0;
        let shapes: [(usize, usize, f32); 2] = if block == 256 || repacked {
            [(301, 1280, 2.5), (17, 256, 1.0)]
        } else {
            [(301, 1184, 2.5), (17, 96, 1.0)]
        };
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (i, (vocab, cols, scale)) in shapes.into_iter().enumerate() {
            let w = random_weights(ty, vocab, cols, &mut cx.rng).map_err(|e| bad(e.to_string()))?;
            let rb = ty.row_bytes(cols).map_err(|e| bad(e.to_string()))?;
            let mut ids: Vec<i32> = vec![0, vocab as i32 - 1, 3, 3];
            ids.extend((0..5).map(|_| cx.rng.random_range(0..vocab as i32)));
            let mut want = vec![0f32; ids.len() * cols];
            for (r, &id) in ids.iter().enumerate() {
                let row = &w[id as usize * rb..(id as usize + 1) * rb];
                let o = &mut want[r * cols..(r + 1) * cols];
                dequantize(ty, row, o).map_err(|e| bad(e.to_string()))?;
                o.iter_mut().for_each(|v| *v *= scale);
            }
            let w = crate::selftest::registry::device_layout(q, w, cols).map_err(bad)?;
            let (dw, di) = (cx.dev.upload(&w)?, cx.dev.upload(&ids)?);
            let out = cx.dev.filled_f32(ids.len() * cols, f32::NAN)?;
            let (pw, pi, po): (DevPtr<u8>, DevPtr<i32>, DevPtr<f32>) =
                (DevPtr::of(&dw), DevPtr::of(&di), DevPtr::of(&out));
            cx.dev.embed_ptr(&kern, pw, vocab, cols, pi, po, scale)?;
            cmp = cmp.merge(Comparison::new(&cx.dev.download(&out)?, &want));
            if i == 0 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || {
                    dev.embed_ptr(&kern, pw, vocab, cols, pi, po, scale)
                })?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
