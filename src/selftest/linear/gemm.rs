//! Tensor-core GEMM (bf16; FP8 E4M3 with 128x128 weight block scales) vs an f64 CPU product of
//! the same decoded operands. Odd M/N/K tails, a partial last K block, and one large case
//! checked on 24 spread rows.

use crate::backend::cuda::CudaError;
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::ops::qdot::random_weights;
use crate::quant::{bf16_to_f32, dequantize, e4m3_to_f32, f32_to_e4m3, GgmlType};
use crate::selftest::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};
use rand::Rng;

pub struct GemmCheck;

fn reference(a: &[f32], w: &[f32], n: usize, k: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * n);
    for &r in rows {
        let ar = &a[r * k..(r + 1) * k];
        for j in 0..n {
            let wr = &w[j * k..(j + 1) * k];
            out.push(
                ar.iter()
                    .zip(wr)
                    .map(|(&x, &y)| x as f64 * y as f64)
                    .sum::<f64>() as f32,
            );
        }
    }
    out
}

impl KernelCheck for GemmCheck {
    fn name(&self) -> &'static str {
        "gemm"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Gemm
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        1e-4 // f32 accumulation of exact products (measured <= 6e-6 max-abs/max-ref on H200)
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let fp8 = spec.key.quant == Quant::Fp8E4m3;
        // block-format weights: dequantised on the GPU to bf16 tiles; the reference rounds the
        // CPU dequantisation to bf16 the same way (round to nearest even)
        let block_ty = match spec.key.quant {
            Quant::Q8_0 => Some(GgmlType::Q8_0),
            Quant::Q4_0 => Some(GgmlType::Q4_0),
            Quant::Q5_0 => Some(GgmlType::Q5_0),
            Quant::Q4K => Some(GgmlType::Q4K),
            Quant::Q6K => Some(GgmlType::Q6K),
            _ => None,
        };
        let shapes: [(usize, usize, usize); 3] = match block_ty {
            Some(GgmlType::Q4K) | Some(GgmlType::Q6K) => {
                [(200, 300, 512), (130, 200, 256), (512, 4096, 4096)]
            }
            Some(_) => [(200, 300, 544), (130, 200, 320), (512, 4096, 4096)],
            None => [(200, 300, 528), (130, 200, 320), (512, 4096, 4096)],
        };
        let bad = |e: String| CudaError::Invalid {
            op: "selftest",
            detail: e,
        };
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        for (m, n, k) in shapes {
            let rng = &mut cx.rng;
            let (ab, wb, adec, wdec, ws, asc);
            if let Some(ty) = block_ty {
                let a16: Vec<u16> = (0..m * k)
                    .map(|_| half::bf16::from_f32(rng.random::<f32>() - 0.5).to_bits())
                    .collect();
                adec = a16.iter().map(|&b| bf16_to_f32(b)).collect::<Vec<f32>>();
                ab = a16
                    .iter()
                    .flat_map(|b| b.to_le_bytes())
                    .collect::<Vec<u8>>();
                wb = random_weights(ty, n, k, rng).map_err(|e| bad(e.to_string()))?;
                let mut wf = vec![0f32; n * k];
                dequantize(ty, &wb, &mut wf).map_err(|e| bad(e.to_string()))?;
                wdec = wf
                    .iter()
                    .map(|&v| half::bf16::from_f32(v).to_f32())
                    .collect::<Vec<f32>>();
                ws = vec![0f32];
                asc = vec![0f32];
            } else if fp8 {
                let a_scale = 0.02f32;
                let (nb, kb) = (n.div_ceil(128), k.div_ceil(128));
                let s: Vec<f32> = (0..nb * kb)
                    .map(|_| 1e-3 * (0.5 + rng.random::<f32>()))
                    .collect();
                ab = (0..m * k)
                    .map(|_| f32_to_e4m3((rng.random::<f32>() - 0.5) * 200.0))
                    .collect::<Vec<u8>>();
                wb = (0..n * k)
                    .map(|_| f32_to_e4m3((rng.random::<f32>() - 0.5) * 200.0))
                    .collect::<Vec<u8>>();
                adec = ab
                    .iter()
                    .map(|&b| e4m3_to_f32(b) * a_scale)
                    .collect::<Vec<f32>>();
                wdec = (0..n * k)
                    .map(|i| e4m3_to_f32(wb[i]) * s[(i / k / 128) * kb + (i % k) / 128])
                    .collect::<Vec<f32>>();
                ws = s;
                asc = vec![a_scale];
            } else {
                let a16: Vec<u16> = (0..m * k)
                    .map(|_| half::bf16::from_f32(rng.random::<f32>() - 0.5).to_bits())
                    .collect();
                let w16: Vec<u16> = (0..n * k)
                    .map(|_| half::bf16::from_f32(rng.random::<f32>() - 0.5).to_bits())
                    .collect();
                adec = a16.iter().map(|&b| bf16_to_f32(b)).collect();
                wdec = w16.iter().map(|&b| bf16_to_f32(b)).collect();
                ab = a16.iter().flat_map(|b| b.to_le_bytes()).collect();
                wb = w16.iter().flat_map(|b| b.to_le_bytes()).collect();
                ws = vec![0f32];
                asc = vec![0f32];
            }
            let (da, dw, dws, das) = (
                cx.dev.upload(&ab)?,
                cx.dev.upload(&wb)?,
                cx.dev.upload(&ws)?,
                cx.dev.upload(&asc)?,
            );
            let mut c = cx.dev.filled_f32(m * n, f32::NAN)?;
            cx.dev.gemm(spec, &da, &dw, &mut c, (m, n, k), &dws, &das)?;
            let got = cx.dev.download(&c)?;
            let rows: Vec<usize> = if m * n * k <= 1 << 28 {
                (0..m).collect()
            } else {
                (0..24).map(|i| i * (m - 1) / 23).collect()
            };
            let want = reference(&adec, &wdec, n, k, &rows);
            let got_rows: Vec<f32> = rows
                .iter()
                .flat_map(|&r| got[r * n..(r + 1) * n].to_vec())
                .collect();
            cmp = cmp.merge(Comparison::new(&got_rows, &want));
            // every output written (rows outside the checked subset too)
            let unwritten = got.iter().filter(|v| v.is_nan()).count();
            cmp = cmp.merge(Comparison {
                unwritten,
                ..Default::default()
            });
            if m == 512 {
                let dev = cx.dev;
                micros = time_us(dev, cx.iters, || {
                    dev.gemm(spec, &da, &dw, &mut c, (m, n, k), &dws, &das)
                })?;
            }
        }
        Ok(Measured { cmp, micros })
    }
}
