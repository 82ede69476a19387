//! Weight matrix -> bf16 (`dequant_bf16`) vs `ops::gemm_ref::dequant_bf16` (the CPU dequantiser
//! rounded to nearest even): bit-exact over every element, on a small odd-row matrix, one with
//! hand-placed rounding ties (f32) and a 4096 x 4096 one (timed).

use super::super::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};
use crate::backend::cuda::{CudaError, DevPtr, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::ops::gemm_ref::dequant_bf16;
use crate::ops::qdot::random_weights;
use crate::quant::{bf16_to_f32, GgmlType};

pub struct DequantBf16Check;

fn ggml(q: Quant) -> Option<GgmlType> {
    Some(match q {
        Quant::F32 => GgmlType::F32,
        Quant::F16 => GgmlType::F16,
        Quant::Q8_0 => GgmlType::Q8_0,
        Quant::Q4_0 => GgmlType::Q4_0,
        Quant::Q5_0 => GgmlType::Q5_0,
        Quant::Q4K => GgmlType::Q4K,
        Quant::Q6K => GgmlType::Q6K,
        _ => return None,
    })
}

/// Bits equal everywhere: 0; else the value metric, at least 1 (a signed zero or NaN payload
/// that differs still fails).
fn compare_bits(got: &[u16], want: &[u16]) -> Comparison {
    let gf: Vec<f32> = got.iter().map(|&b| bf16_to_f32(b)).collect();
    let wf: Vec<f32> = want.iter().map(|&b| bf16_to_f32(b)).collect();
    let mut c = Comparison::new(&gf, &wf);
    if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| g != w) {
        c.max_rel_err = c.max_rel_err.max(1.0);
    }
    c
}

impl KernelCheck for DequantBf16Check {
    fn name(&self) -> &'static str {
        "dequant_bf16"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::DequantBf16
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let bad = |e: String| CudaError::Invalid {
            op: "selftest",
            detail: e,
        };
        let ty = ggml(spec.key.quant)
            .ok_or_else(|| bad(format!("no GGUF type for {}", spec.key.quant)))?;
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (rows, k) in [(37usize, 512usize), (3, 256), (4096, 4096)] {
            let mut wb =
                random_weights(ty, rows, k, &mut cx.rng).map_err(|e| bad(e.to_string()))?;
            if ty == GgmlType::F32 && rows == 3 {
                // exact ties (low half 0x8000) both ways, and signed zeros
                for (i, c) in wb.chunks_exact_mut(4).enumerate().take(64) {
                    let v = 0x3f80_8000u32 + ((i as u32) << 16);
                    c.copy_from_slice(&v.to_le_bytes());
                }
                wb[64 * 4..65 * 4].copy_from_slice(&(-0.0f32).to_le_bytes());
            }
            let want = dequant_bf16(ty, &wb, rows * k).map_err(|e| bad(e.to_string()))?;
            let dw = cx.dev.upload(&wb)?;
            let out = cx.dev.upload(&vec![0xffffu16; rows * k])?;
            let (pw, po) = (DevPtr::of(&dw), DevPtr::of(&out));
            cx.dev.dequant_bf16_ptr(&kern, pw, po, (rows, k))?;
            let got = cx.dev.download(&out)?;
            cmp = cmp.merge(compare_bits(&got, &want));
            if rows == 4096 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || {
                    dev.dequant_bf16_ptr(&kern, pw, po, (rows, k))
                })?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
