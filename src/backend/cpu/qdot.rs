//! Fast path of `linear` for GGML block weights: the activation rows are quantised to int8 per
//! 32 values (a scale per block, as llama.cpp's Q8 activations) and every weight row is unpacked
//! once to int8 with a scale and an offset per 16 values, so the inner loop is an integer dot
//! product. Used by `CpuBackend::int8()`; `CpuBackend::new()` keeps the all-f32 path.
//!
//! A weight value is `ws[g] * q + wm[g]` for the 16-value group `g` it belongs to (the offset is
//! non-zero for Q4_1 / Q5_1 / Q4_K / Q5_K mins), so a group's contribution to a dot product is
//! `dx * (ws[g] * sum(q * qx) + wm[g] * sum(qx))`.

use crate::quant::ggml::k_scale_min;
use crate::quant::{f16_to_f32, GgmlType};

/// Types with an integer fast path.
pub fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q5K | Q6K)
}

/// Activation rows quantised to int8: `q` `[n, k]`, `d` one scale per 32 values, `s` the sum of
/// `q` per 16 values.
pub struct QuantRows {
    pub k: usize,
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<i32>,
}

/// Quantise `x` (`n` rows of `k`, k a multiple of 32).
pub fn quantize_rows(x: &[f32], k: usize) -> QuantRows {
    let nb = x.len() / 32;
    let mut q = vec![0i8; x.len()];
    let mut d = vec![0f32; nb];
    let mut s = vec![0i32; x.len() / 16];
    for b in 0..nb {
        let xs = &x[b * 32..b * 32 + 32];
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        d[b] = scale;
        if scale > 0.0 {
            let inv = 1.0 / scale;
            for (o, v) in q[b * 32..b * 32 + 32].iter_mut().zip(xs) {
                *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
            }
        }
        for h in 0..2 {
            s[2 * b + h] = q[b * 32 + 16 * h..b * 32 + 16 * h + 16]
                .iter()
                .map(|&v| v as i32)
                .sum();
        }
    }
    QuantRows { k, q, d, s }
}

/// A weight row unpacked to int8 values with a scale and offset per 16 values.
pub struct Unpacked {
    pub q: Vec<i8>,
    pub ws: Vec<f32>,
    pub wm: Vec<f32>,
}

impl Unpacked {
    pub fn new(k: usize) -> Self {
        Unpacked {
            q: vec![0; k],
            ws: vec![0.0; k / 16],
            wm: vec![0.0; k / 16],
        }
    }
}

#[inline(always)]
fn h(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Unpack one row of `ty` blocks (callers pass exactly the row's bytes).
#[inline(always)]
pub fn unpack_row(ty: GgmlType, row: &[u8], u: &mut Unpacked) {
    use GgmlType::*;
    let (be, bb) = ty.block();
    for (bi, b) in row.chunks_exact(bb).enumerate() {
        let q = &mut u.q[bi * be..(bi + 1) * be];
        let g0 = bi * be / 16;
        match ty {
            Q8_0 => {
                let d = h(b, 0);
                for (o, &v) in q.iter_mut().zip(&b[2..34]) {
                    *o = v as i8;
                }
                u.ws[g0..g0 + 2].fill(d);
                u.wm[g0..g0 + 2].fill(0.0);
            }
            Q4_0 | Q4_1 => {
                let (d, m, qs, off) = if ty == Q4_0 {
                    (h(b, 0), 0.0, &b[2..18], 8)
                } else {
                    (h(b, 0), h(b, 2), &b[4..20], 0)
                };
                for j in 0..16 {
                    q[j] = ((qs[j] & 0x0f) as i32 - off) as i8;
                    q[j + 16] = ((qs[j] >> 4) as i32 - off) as i8;
                }
                u.ws[g0..g0 + 2].fill(d);
                u.wm[g0..g0 + 2].fill(m);
            }
            Q5_0 | Q5_1 => {
                let (d, m, hb, qs, off) = if ty == Q5_0 {
                    (h(b, 0), 0.0, 2, &b[6..22], 16)
                } else {
                    (h(b, 0), h(b, 2), 4, &b[8..24], 0)
                };
                let qh = u32::from_le_bytes([b[hb], b[hb + 1], b[hb + 2], b[hb + 3]]);
                for j in 0..16 {
                    let lo = (qs[j] & 0x0f) as u32 | (((qh >> j) & 1) << 4);
                    let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
                    q[j] = (lo as i32 - off) as i8;
                    q[j + 16] = (hi as i32 - off) as i8;
                }
                u.ws[g0..g0 + 2].fill(d);
                u.wm[g0..g0 + 2].fill(m);
            }
            Q4K | Q5K => {
                let d = h(b, 0);
                let dmin = h(b, 2);
                let scales = &b[4..16];
                let (qh, qs) = if ty == Q4K {
                    (&b[0..0], &b[16..144])
                } else {
                    (&b[16..48], &b[48..176])
                };
                for c in 0..4 {
                    let src = &qs[c * 32..c * 32 + 32];
                    for half in 0..2 {
                        let sub = 2 * c + half;
                        let (sc, m) = k_scale_min(scales, sub);
                        let dst = &mut q[c * 64 + half * 32..c * 64 + half * 32 + 32];
                        for l in 0..32 {
                            let lo = if half == 0 {
                                src[l] & 0x0f
                            } else {
                                src[l] >> 4
                            };
                            let hi = if ty == Q5K {
                                ((qh[l] >> sub) & 1) << 4
                            } else {
                                0
                            };
                            dst[l] = (lo | hi) as i8;
                        }
                        let g = g0 + 2 * sub;
                        u.ws[g..g + 2].fill(d * sc as f32);
                        u.wm[g..g + 2].fill(-(dmin * m as f32));
                    }
                }
            }
            Q6K => {
                let ql = &b[0..128];
                let qhb = &b[128..192];
                let sc = &b[192..208];
                let d = h(b, 208);
                for half in 0..2 {
                    let ql = &ql[half * 64..half * 64 + 64];
                    let qh = &qhb[half * 32..half * 32 + 32];
                    let base = half * 128;
                    for l in 0..32 {
                        q[base + l] = (((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32) as i8;
                        q[base + 32 + l] =
                            (((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32) as i8;
                        q[base + 64 + l] =
                            (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32) as i8;
                        q[base + 96 + l] =
                            (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32) as i8;
                    }
                }
                for (s, &scale) in sc.iter().enumerate() {
                    u.ws[g0 + s] = d * scale as i8 as f32;
                    u.wm[g0 + s] = 0.0;
                }
            }
            _ => unreachable!("checked by supported()"),
        }
    }
}

/// Dot product of an unpacked weight row with activation row `t` of `x`.
#[inline(always)]
pub fn dot_row(u: &Unpacked, x: &QuantRows, t: usize) -> f32 {
    let k = x.k;
    let xq = &x.q[t * k..(t + 1) * k];
    let xd = &x.d[t * k / 32..(t + 1) * k / 32];
    let xs = &x.s[t * k / 16..(t + 1) * k / 16];
    let mut acc = 0f32;
    for (g, (wq, aq)) in u.q.chunks_exact(16).zip(xq.chunks_exact(16)).enumerate() {
        let mut s = 0i32;
        for i in 0..16 {
            s += wq[i] as i32 * aq[i] as i32;
        }
        acc += xd[g / 2] * (u.ws[g] * s as f32 + u.wm[g] * xs[g] as f32);
    }
    acc
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;

    /// Every supported type: unpacked values equal the reference dequantiser's, and the integer
    /// dot product is within int8-activation rounding of the f32 dot product.
    #[test]
    fn unpack_matches_dequantize_and_dot_is_close() {
        let mut s = 99u64;
        let mut byte = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        };
        use GgmlType::*;
        for ty in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4K, Q5K, Q6K] {
            let k = 512;
            let nbytes = ty.row_bytes(k).unwrap();
            let mut row: Vec<u8> = (0..nbytes).map(|_| byte()).collect();
            let (_, bb) = ty.block();
            let small = half::f16::from_f32(0.02).to_bits().to_le_bytes();
            for b in row.chunks_exact_mut(bb) {
                match ty {
                    Q6K => b[208..210].copy_from_slice(&small),
                    Q4_1 | Q5_1 | Q4K | Q5K => {
                        b[0..2].copy_from_slice(&small);
                        b[2..4].copy_from_slice(&small);
                    }
                    _ => b[0..2].copy_from_slice(&small),
                }
            }
            let mut want = vec![0f32; k];
            crate::quant::dequantize(ty, &row, &mut want).unwrap();
            let mut u = Unpacked::new(k);
            unpack_row(ty, &row, &mut u);
            for i in 0..k {
                let v = u.ws[i / 16] * u.q[i] as f32 + u.wm[i / 16];
                assert!(
                    (v - want[i]).abs() <= 1e-6 * (1.0 + want[i].abs()),
                    "{ty:?} {i}: {v} vs {}",
                    want[i]
                );
            }
            let x: Vec<f32> = (0..k)
                .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
                .collect();
            let xq = quantize_rows(&x, k);
            let got = dot_row(&u, &xq, 0);
            let exact: f64 = x
                .iter()
                .zip(&want)
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum();
            let mag: f64 = x
                .iter()
                .zip(&want)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            assert!(
                (got as f64 - exact).abs() <= 0.01 * mag,
                "{ty:?}: {got} vs {exact} (magnitude {mag})"
            );
        }
    }
}
