//! Activation quantisation (exact vs `ops::qdot::quantize_q8_1`) and the decode GEMV of every
//! weight format and batch bucket vs `ops::qdot::gemv_ref` (f64 over the dequantised weights
//! and the dequantised int8 activations). Shapes make row starts unaligned to 16 bytes, give
//! multi-chunk rows, and a second launch with only 3 blocks makes each warp walk several rows.

use crate::backend::cuda::{gemv_row_batches, gemv_s2_smem, CudaError, GemvEntry, Q8Activations};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::qdot::{dequantize_q8_1, gemv_ref, quantize_q8_1, random_weights, Q8Act};
use crate::quant::GgmlType;
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

pub struct QuantizeQ8Check;
pub struct GemvCheck;

fn invalid(detail: String) -> CudaError {
    CudaError::Invalid {
        op: "selftest",
        detail,
    }
}

fn qerr(e: impl std::fmt::Display) -> CudaError {
    invalid(e.to_string())
}

/// CPU quantisation uploaded as the kernel's layout.
fn upload_act(cx: &CheckCtx<'_>, a: &Q8Act) -> Result<Q8Activations, CudaError> {
    let ds: Vec<f32> = a.d.iter().zip(&a.s).flat_map(|(&d, &s)| [d, s]).collect();
    Ok(Q8Activations {
        xq: cx.dev.upload(&a.qs)?,
        xds: cx.dev.upload(&ds)?,
    })
}

impl KernelCheck for QuantizeQ8Check {
    fn name(&self) -> &'static str {
        "quantize_q8"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::QuantizeQ8
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0 // bit-identical
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let len = 8 * 4096;
        let x = uniform(&mut cx.rng, len, -4.0, 4.0);
        let want = quantize_q8_1(&x).map_err(qerr)?;
        let dx = cx.dev.upload(&x)?;
        let mut act = cx.dev.q8_activations(len)?;
        cx.dev.quantize_q8(spec, &dx, &mut act)?;
        let (q, ds) = (cx.dev.download(&act.xq)?, cx.dev.download(&act.xds)?);
        // every quantised value, scale and sum, as floats
        let got: Vec<f32> = q
            .iter()
            .map(|&v| v as f32)
            .chain(ds.iter().copied())
            .collect();
        let want_v: Vec<f32> = want
            .qs
            .iter()
            .map(|&v| v as f32)
            .chain(want.d.iter().zip(&want.s).flat_map(|(&d, &s)| [d, s]))
            .collect();
        let cmp = Comparison::new(&got, &want_v);
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || dev.quantize_q8(spec, &dx, &mut act))?;
        Ok(Measured { cmp, micros })
    }
}

impl KernelCheck for GemvCheck {
    fn name(&self) -> &'static str {
        "gemv"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Gemv
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        // f32 accumulation of up to 10240 products against an f64 reference (measured ~1e-7
        // as max|err|/max|ref| on H200); an indexing bug gives O(1)
        2e-4
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let q = spec.key.quant;
        let (ty, repacked) = crate::selftest::registry::source_type(q)
            .ok_or_else(|| invalid(format!("no GGML type for {q}")))?;
        let bs = spec.key.batch.value().unwrap_or(1) as usize;
        let float_w = ty.block().0 == 1;
        let shapes: &[(usize, usize)] = match ty {
            // rows of whole 256-value groups; 40 blocks leave lanes idle, 256 take two batches
            // (Q6_K: 210-byte blocks, rows 16-byte aligned from 2048 values)
            GgmlType::Q6K if repacked => &[(1001, 2048), (67, 8192)],
            _ if repacked => &[(1001, 1280), (67, 8192)],
            GgmlType::Q4K | GgmlType::Q6K => &[(1001, 3840), (64, 10240)],
            _ if float_w => &[(1001, 1184), (77, 1187)],
            _ => &[(1001, 1184), (67, 8192)],
        };
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (i, &(n, k)) in shapes.iter().enumerate() {
            let w = random_weights(ty, n, k, &mut cx.rng).map_err(qerr)?;
            let x = uniform(&mut cx.rng, bs * k, -2.0, 2.0);
            let (act, xref) = if float_w {
                (cx.dev.q8_activations(32)?, x.clone())
            } else {
                let a = quantize_q8_1(&x).map_err(qerr)?;
                (upload_act(cx, &a)?, dequantize_q8_1(&a))
            };
            let want = gemv_ref(ty, &w, n, k, &xref).map_err(qerr)?;
            let w = crate::selftest::registry::device_layout(q, w, k).map_err(invalid)?;
            let (dw, dx) = (cx.dev.upload(&w)?, cx.dev.upload(&x)?);
            // every entry (`__s2` / `__ks` where the instance has it), default and 3-block grids
            let s2 = gemv_s2_smem(spec).is_some();
            let ks = gemv_row_batches(spec, k).is_some();
            for entry in [
                GemvEntry::Main(None),
                GemvEntry::Main(Some(3)),
                GemvEntry::S2(None),
                GemvEntry::S2(Some(3)),
                GemvEntry::Ks(1),
                GemvEntry::Ks(2),
                GemvEntry::Ks(4),
                GemvEntry::Ks(8),
            ] {
                if matches!(entry, GemvEntry::S2(_)) && !s2
                    || matches!(entry, GemvEntry::Ks(_)) && !ks
                {
                    continue;
                }
                let mut y = cx.dev.filled_f32(bs * n, f32::NAN)?;
                cx.dev.gemv(spec, &dw, &dx, &act, &mut y, n, k, entry)?;
                cmp = cmp.merge(Comparison::new(&cx.dev.download(&y)?, &want));
            }
            if i == 0 {
                let mut y = cx.dev.filled_f32(bs * n, f32::NAN)?;
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || {
                    dev.gemv(spec, &dw, &dx, &act, &mut y, n, k, GemvEntry::Auto)
                })?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
