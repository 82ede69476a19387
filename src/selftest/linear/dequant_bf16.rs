//! Weight matrix -> bf16 (`dequant_bf16`) vs `ops::gemm_ref::dequant_bf16` (the CPU dequantiser
//! rounded to nearest even): bit-exact over every element, on a small odd-row matrix, one with
//! hand-placed rounding ties (f32) and a 4096 x 4096 one (timed).

use crate::backend::cuda::{CudaError, DevPtr, Kern};
use crate::kernels::{KernelKey, KernelSpec, Op, Quant};
use crate::ops::gemm_ref::dequant_bf16;
use crate::ops::qdot::random_weights;
use crate::quant::{bf16_to_f32, GgmlType};
use crate::selftest::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};

pub struct DequantBf16Check;

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
        let q = spec.key.quant;
        let (ty, _) = crate::selftest::registry::source_type(q)
            .ok_or_else(|| bad(format!("no GGUF type for {q}")))?;
        let kern = Kern {
            spec,
            f: cx.dev.function(spec)?,
        };
        let mut cmp = Comparison::default();
        let mut micros = 0.0;
        // (q6_kr: rows of 210-byte blocks are 16-byte aligned from 2048 values)
        let shapes: [(usize, usize); 3] = if q == Quant::Q6KR {
            [(37, 2048), (3, 6144), (4096, 4096)]
        } else {
            [(37, 512), (3, 256), (4096, 4096)]
        };
        for (rows, k) in shapes {
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
            let wb = crate::selftest::registry::device_layout(q, wb, k).map_err(bad)?;
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

#[cfg(test)]
mod tests {
    //! A line-by-line model of `ops/dequant_bf16.cu.tera` (one group of 8 elements per call,
    //! the same byte offsets and f32 operations) checked against the CPU dequantiser: the
    //! kernel's index math, verified without a GPU.
    use super::*;
    use crate::quant::f16_to_f32;
    use crate::quant::repack::{self, Split};
    use rand::SeedableRng;

    fn u16_at(w: &[u8], p: usize) -> u32 {
        u16::from_le_bytes([w[p], w[p + 1]]) as u32
    }
    fn ld8(w: &[u8], p: usize) -> [u32; 8] {
        std::array::from_fn(|i| w[p + i] as u32)
    }
    fn h(w: &[u8], p: usize) -> f32 {
        f16_to_f32(u16_at(w, p) as u16)
    }

    fn group(ty: GgmlType, w: &[u8], g: usize) -> [f32; 8] {
        let mut v = [0f32; 8];
        match ty {
            GgmlType::Q8_0 => {
                let b = (g >> 2) * 34;
                let q = g & 3;
                let d = h(w, b);
                let x = ld8(w, b + 2 + q * 8);
                for i in 0..8 {
                    v[i] = d * (x[i] as u8 as i8) as f32;
                }
            }
            GgmlType::Q4_0 => {
                let b = (g >> 2) * 18;
                let q = g & 3;
                let d = h(w, b);
                let x = ld8(w, b + 2 + (q & 1) * 8);
                let sh = (q >> 1) * 4;
                for i in 0..8 {
                    v[i] = d * (((x[i] >> sh) & 15) as i32 - 8) as f32;
                }
            }
            GgmlType::Q5_0 => {
                let b = (g >> 2) * 22;
                let q = g & 3;
                let d = h(w, b);
                let qh = u16_at(w, b + 2) | (u16_at(w, b + 4) << 16);
                let x = ld8(w, b + 6 + (q & 1) * 8);
                let sh = (q >> 1) * 4;
                for i in 0..8 {
                    let j = q * 8 + i;
                    let e = ((x[i] >> sh) & 15) | (((qh >> j) & 1) << 4);
                    v[i] = d * (e as i32 - 16) as f32;
                }
            }
            GgmlType::Q4K => {
                let b = (g >> 5) * 144;
                v = q4k_group(w, b, b + 16, g & 31);
            }
            GgmlType::Q6K => {
                let b = (g >> 5) * 210;
                v = q6k_group(w, b, b + 192, g & 31);
            }
            GgmlType::F16 => {
                for (i, o) in v.iter_mut().enumerate() {
                    *o = h(w, g * 16 + 2 * i);
                }
            }
            GgmlType::F32 => {
                for (i, o) in v.iter_mut().enumerate() {
                    let p = g * 32 + 4 * i;
                    *o = f32::from_le_bytes([w[p], w[p + 1], w[p + 2], w[p + 3]]);
                }
            }
            other => panic!("no kernel for {other:?}"),
        }
        v
    }

    #[test]
    fn kernel_model_matches_the_cpu_dequantiser_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::F16,
            GgmlType::F32,
        ] {
            let (rows, k) = (5usize, 512usize);
            let w = random_weights(ty, rows, k, &mut rng).unwrap();
            let want = dequant_bf16(ty, &w, rows * k).unwrap();
            let got: Vec<u16> = (0..rows * k / 8)
                .flat_map(|g| group(ty, &w, g))
                .map(|v| half::bf16::from_f32(v).to_bits())
                .collect();
            assert_eq!(got, want, "{ty:?}");
        }
        // q8_0r / q4_0r / q4_kr / q6_kr: the kernel's row / block arithmetic over the repacked bytes
        type Model = fn(&[u8], usize, usize) -> [f32; 8];
        type Shapes = [(usize, usize); 2];
        let repacked: [(GgmlType, Split, Model, Shapes); 4] = [
            (
                GgmlType::Q8_0,
                repack::Q8_0,
                group_q8_0r,
                [(5, 512), (3, 3840)],
            ),
            (
                GgmlType::Q4_0,
                repack::Q4_0,
                group_q4_0r,
                [(5, 512), (3, 3840)],
            ),
            (
                GgmlType::Q4K,
                repack::Q4_K,
                group_q4_kr,
                [(5, 512), (3, 3840)],
            ),
            (
                GgmlType::Q6K,
                repack::Q6_K,
                group_q6_kr,
                [(5, 2048), (3, 6144)],
            ),
        ];
        for (ty, split, model, shapes) in repacked {
            for (rows, k) in shapes {
                let w = random_weights(ty, rows, k, &mut rng).unwrap();
                let want = dequant_bf16(ty, &w, rows * k).unwrap();
                let r = split.repacked(&w, k).unwrap();
                let got: Vec<u16> = (0..rows * k / 8)
                    .flat_map(|g| model(&r, k, g))
                    .map(|v| half::bf16::from_f32(v).to_bits())
                    .collect();
                assert_eq!(got, want, "{ty:?} repacked {rows}x{k}");
            }
        }
        // every format the op has an instance for maps to a GGUF type
        for spec in crate::kernels::KERNELS
            .iter()
            .filter(|s| s.key.op == Op::DequantBf16)
        {
            assert!(
                crate::selftest::registry::source_type(spec.key.quant).is_some(),
                "{}",
                spec.name
            );
        }
    }

    /// Group `r` (0..31) of a Q4_K block whose head is at `b` and body at `body`.
    fn q4k_group(w: &[u8], b: usize, body: usize, r: usize) -> [f32; 8] {
        let (s, q) = (r >> 2, r & 3);
        let sc = |i: usize| w[b + 4 + i] as u32;
        let (a, m) = if s < 4 {
            (sc(s) & 63, sc(s + 4) & 63)
        } else {
            (
                (sc(s + 4) & 15) | ((sc(s - 4) >> 6) << 4),
                (sc(s + 4) >> 4) | ((sc(s) >> 6) << 4),
            )
        };
        let dl = h(w, b) * a as f32;
        let ml = h(w, b + 2) * m as f32;
        let x = ld8(w, body + (s >> 1) * 32 + q * 8);
        let sh = (s & 1) * 4;
        std::array::from_fn(|i| dl * ((x[i] >> sh) & 15) as f32 - ml)
    }

    /// Group `r` (0..31) of a Q6_K block whose body (ql, qh) is at `body` and head (scales, d)
    /// at `hd`.
    fn q6k_group(w: &[u8], body: usize, hd: usize, r: usize) -> [f32; 8] {
        let e0 = r * 8;
        let (hf, k, l0) = (e0 >> 7, (e0 >> 5) & 3, e0 & 31);
        let lo = ld8(w, body + hf * 64 + (k & 1) * 32 + l0);
        let hi = ld8(w, body + 128 + hf * 32 + l0);
        let ds = h(w, hd + 16) * (w[hd + (e0 >> 4)] as i8) as f32;
        let sh = (k >> 1) * 4;
        std::array::from_fn(|i| {
            let x = ((lo[i] >> sh) & 15) | (((hi[i] >> (2 * k)) & 3) << 4);
            ds * (x as i32 - 32) as f32
        })
    }

    /// The q6_kr branch of the kernel: group `g` of a repacked matrix of `cols`-value rows.
    fn group_q6_kr(w: &[u8], cols: usize, g: usize) -> [f32; 8] {
        let nb = cols >> 8;
        let blk = g >> 5;
        let (rw, bi) = (blk / nb, blk % nb);
        let row = rw * nb * 210;
        q6k_group(w, row + 192 * bi, row + 192 * nb + 18 * bi, g & 31)
    }

    /// The q4_kr branch of the kernel: group `g` of a repacked matrix of `cols`-value rows.
    fn group_q4_kr(w: &[u8], cols: usize, g: usize) -> [f32; 8] {
        let nb = cols >> 8;
        let blk = g >> 5;
        let (rw, bi) = (blk / nb, blk % nb);
        let row = rw * nb * 144;
        q4k_group(w, row + 128 * nb + 16 * bi, row + 128 * bi, g & 31)
    }

    /// The q8_0r branch of the kernel: group `g` of a repacked matrix of `cols`-value rows.
    fn group_q8_0r(w: &[u8], cols: usize, g: usize) -> [f32; 8] {
        let nb = cols >> 5;
        let blk = g >> 2;
        let (r, bi) = (blk / nb, blk % nb);
        let rp = r * nb * 34;
        let d = h(w, rp + 32 * nb + 2 * bi);
        let x = ld8(w, rp + 32 * bi + (g & 3) * 8);
        std::array::from_fn(|i| d * (x[i] as u8 as i8) as f32)
    }

    /// The q4_0r branch of the kernel: group `g` of a repacked matrix of `cols`-value rows.
    fn group_q4_0r(w: &[u8], cols: usize, g: usize) -> [f32; 8] {
        let nb = cols >> 5;
        let blk = g >> 2;
        let (r, bi) = (blk / nb, blk % nb);
        let rp = r * nb * 18;
        let q = g & 3;
        let d = h(w, rp + 16 * nb + 2 * bi);
        let x = ld8(w, rp + 16 * bi + (q & 1) * 8);
        let sh = (q >> 1) * 4;
        std::array::from_fn(|i| d * (((x[i] >> sh) & 15) as i32 - 8) as f32)
    }
}
