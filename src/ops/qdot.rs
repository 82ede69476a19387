//! Reference for the quantized GEMV: activation quantisation to int8 per 32 (Q8_1 style, the
//! input of the GPU block-format GEMVs) and a float64 matrix-vector product over weights kept
//! in their GGUF block layout.
//!
//! `quantize_q8_1` is bit-identical to the `quantize_q8_1` kernel: d = amax / 127 (f32),
//! q = round_ties_even(x / d) clamped to +-127, s = d * sum(q). The GEMV reference dequantises
//! each row with [`crate::quant::dequantize`] and accumulates in f64, so it is independent of
//! how a kernel orders its integer and float arithmetic.

use crate::quant::{dequantize, GgmlType, QuantError};

/// Activations quantised per group of 32: `qs[i]`, and per group `d` (scale) and `s = d*sum(q)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Q8Act {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
}

/// Errors of the reference GEMV.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum QdotError {
    #[error("activation length {0} is not a multiple of 32")]
    Misaligned(usize),
    #[error("shape mismatch: {0}")]
    Shape(String),
    #[error(transparent)]
    Quant(#[from] QuantError),
}

/// Quantise `x` (any number of rows, total length a multiple of 32) to int8 per 32.
pub fn quantize_q8_1(x: &[f32]) -> Result<Q8Act, QdotError> {
    if x.len() % 32 != 0 {
        return Err(QdotError::Misaligned(x.len()));
    }
    let groups = x.len() / 32;
    let mut out = Q8Act {
        qs: vec![0; x.len()],
        d: vec![0.0; groups],
        s: vec![0.0; groups],
    };
    for (g, chunk) in x.chunks_exact(32).enumerate() {
        let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let mut sum = 0i32;
        for (j, &v) in chunk.iter().enumerate() {
            let q = if amax > 0.0 {
                (v / d).round_ties_even().clamp(-127.0, 127.0) as i32
            } else {
                0
            };
            out.qs[g * 32 + j] = q as i8;
            sum += q;
        }
        out.d[g] = d;
        out.s[g] = d * sum as f32;
    }
    Ok(out)
}

/// The values a [`Q8Act`] stands for: `d * q`.
pub fn dequantize_q8_1(a: &Q8Act) -> Vec<f32> {
    a.qs.iter()
        .enumerate()
        .map(|(i, &q)| a.d[i / 32] * q as f32)
        .collect()
}

/// `y[b][r] = sum_j W[r][j] * x[b][j]` in f64, W `n` rows of `k` elements of type `ty` in GGUF
/// layout, `x` holding `batch` rows of `k`. Returns `batch * n` values, batch-major.
pub fn gemv_ref(
    ty: GgmlType,
    w: &[u8],
    n: usize,
    k: usize,
    x: &[f32],
) -> Result<Vec<f32>, QdotError> {
    if k == 0 || x.len() % k != 0 {
        return Err(QdotError::Shape(format!(
            "x has {} values, not a multiple of k={k}",
            x.len()
        )));
    }
    let rb = ty.row_bytes(k)?;
    if w.len() < rb * n {
        return Err(QdotError::Shape(format!(
            "weights hold {} bytes, {n} rows need {}",
            w.len(),
            rb * n
        )));
    }
    let batch = x.len() / k;
    let mut y = vec![0f32; batch * n];
    let mut row = vec![0f32; k];
    for r in 0..n {
        dequantize(ty, &w[r * rb..(r + 1) * rb], &mut row)?;
        for b in 0..batch {
            let xb = &x[b * k..(b + 1) * k];
            let acc: f64 = row.iter().zip(xb).map(|(&a, &c)| a as f64 * c as f64).sum();
            y[b * n + r] = acc as f32;
        }
    }
    Ok(y)
}

/// Random weights of `n` rows x `k` in the GGUF layout of `ty` (test and benchmark data): random
/// quant bytes with sane block scales (f16 scales in +-0.01, K-quant super-scales in 1e-4..1e-3),
/// float formats ~N(0, 0.05). `k` must be a whole number of blocks.
pub fn random_weights(
    ty: GgmlType,
    n: usize,
    k: usize,
    rng: &mut impl rand::Rng,
) -> Result<Vec<u8>, QdotError> {
    let rb = ty.row_bytes(k)?;
    let mut w = vec![0u8; rb * n];
    let normal = |rng: &mut dyn rand::RngCore| -> f32 {
        (0..4)
            .map(|_| (rng.next_u32() >> 8) as f32 / 16_777_216.0)
            .sum::<f32>()
            - 2.0
    };
    let h = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
    match ty {
        GgmlType::F32 => w
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&(normal(rng) * 0.05).to_le_bytes())),
        GgmlType::F16 => w
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&h(normal(rng) * 0.05))),
        GgmlType::BF16 => w.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(
                &half::bf16::from_f32(normal(rng) * 0.05)
                    .to_bits()
                    .to_le_bytes(),
            )
        }),
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q4K | GgmlType::Q6K => {
            rng.fill_bytes(&mut w);
            let (_, bb) = ty.block();
            for b in w.chunks_exact_mut(bb) {
                let mut u =
                    |lo: f32, hi: f32| lo + (hi - lo) * (rng.next_u32() >> 8) as f32 / 16_777_216.0;
                match ty {
                    GgmlType::Q4K => {
                        b[0..2].copy_from_slice(&h(u(1e-4, 1e-3)));
                        b[2..4].copy_from_slice(&h(u(1e-4, 1e-3)));
                    }
                    GgmlType::Q6K => b[208..210].copy_from_slice(&h(u(1e-4, 1e-3))),
                    _ => b[0..2].copy_from_slice(&h(u(-0.01, 0.01))),
                }
            }
        }
        other => {
            return Err(QdotError::Quant(QuantError::Unsupported(
                other,
                "F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q4_K, Q6_K",
            )))
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn quantize_roundtrip_is_close_and_sums_match() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 17) as f32 - 8.0) * 0.3)
            .collect();
        let a = quantize_q8_1(&x).unwrap();
        let back = dequantize_q8_1(&a);
        for g in 0..2 {
            let amax = x[g * 32..g * 32 + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            for j in 0..32 {
                assert!((back[g * 32 + j] - x[g * 32 + j]).abs() <= amax / 254.0 * 1.0001);
            }
            let s: i32 = a.qs[g * 32..g * 32 + 32].iter().map(|&q| q as i32).sum();
            assert_eq!(a.s[g], a.d[g] * s as f32);
        }
        assert_eq!(a.qs.iter().map(|q| q.unsigned_abs()).max(), Some(127));
        assert!(matches!(
            quantize_q8_1(&x[..31]),
            Err(QdotError::Misaligned(31))
        ));
    }

    #[test]
    fn random_weights_dequantise_to_finite_values() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for ty in [
            GgmlType::F16,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
        ] {
            let w = random_weights(ty, 3, 256, &mut rng).unwrap();
            let mut out = vec![0f32; 3 * 256];
            crate::quant::dequantize(ty, &w, &mut out).unwrap();
            assert!(
                out.iter().all(|v| v.is_finite() && v.abs() < 10.0),
                "{ty:?}"
            );
            assert!(out.iter().any(|&v| v != 0.0), "{ty:?}");
        }
    }

    #[test]
    fn zero_group_quantises_to_zero() {
        let a = quantize_q8_1(&[0.0; 32]).unwrap();
        assert!(a.qs.iter().all(|&q| q == 0));
        assert_eq!((a.d[0], a.s[0]), (0.0, 0.0));
    }

    #[test]
    fn gemv_ref_q8_0_matches_hand_computation() {
        // one Q8_0 row: d = 0.5, q = 0..31  ->  w_j = j/2 ; x = 1  ->  y = sum j/2 = 248
        let mut w = vec![0u8; 34];
        w[0..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
        for j in 0..32 {
            w[2 + j] = j as u8;
        }
        let y = gemv_ref(GgmlType::Q8_0, &w, 1, 32, &[1.0; 32]).unwrap();
        assert_eq!(y, vec![248.0]);
        assert!(gemv_ref(GgmlType::Q8_0, &w, 2, 32, &[1.0; 32]).is_err());
    }
}
