//! References of the prefill GEMM path over bf16 / f16 operands (`dequant_bf16`, `gemm_pipe`):
//! a weight matrix dequantised and rounded to bf16, and the product of 16-bit matrices in f64.

use crate::quant::{bf16_to_f32, dequantize, f16_to_f32, GgmlType, QuantError};

/// `elements` values of `data` (stored as `ty`) as bf16 bits: the CPU dequantiser's f32 values
/// rounded to nearest even (NaN stays NaN), what `dequant_bf16` must produce bit for bit.
pub fn dequant_bf16(ty: GgmlType, data: &[u8], elements: usize) -> Result<Vec<u16>, QuantError> {
    let mut f = vec![0f32; elements];
    dequantize(ty, data, &mut f)?;
    Ok(f.iter()
        .map(|&v| half::bf16::from_f32(v).to_bits())
        .collect())
}

/// Rows `rows` of `A . W^T` for bf16 `a` `[m][k]` and `w` `[n][k]`, each dot product summed
/// in f64 (exact products) and rounded once to f32: `[rows.len()][n]`.
pub fn gemm_bf16(a: &[u16], w: &[u16], n: usize, k: usize, rows: &[usize]) -> Vec<f32> {
    gemm_16(a, w, n, k, rows, bf16_to_f32)
}

/// [`gemm_bf16`] over f16 operands.
pub fn gemm_f16(a: &[u16], w: &[u16], n: usize, k: usize, rows: &[usize]) -> Vec<f32> {
    gemm_16(a, w, n, k, rows, f16_to_f32)
}

fn gemm_16(
    a: &[u16],
    w: &[u16],
    n: usize,
    k: usize,
    rows: &[usize],
    to_f32: fn(u16) -> f32,
) -> Vec<f32> {
    let wf: Vec<f64> = w[..n * k].iter().map(|&b| to_f32(b) as f64).collect();
    let mut out = Vec::with_capacity(rows.len() * n);
    for &r in rows {
        let ar: Vec<f64> = a[r * k..(r + 1) * k]
            .iter()
            .map(|&b| to_f32(b) as f64)
            .collect();
        for j in 0..n {
            let wr = &wf[j * k..(j + 1) * k];
            out.push(ar.iter().zip(wr).map(|(x, y)| x * y).sum::<f64>() as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf(v: f32) -> u16 {
        half::bf16::from_f32(v).to_bits()
    }

    #[test]
    fn dequant_rounds_to_nearest_even() {
        // Q8_0 block, d = 1/3 (f16): d * q is not a bf16 value; ties go to even
        let d = half::f16::from_f32(1.0 / 3.0);
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&d.to_bits().to_le_bytes());
        for j in 0..32 {
            b[2 + j] = (j as i8 - 16) as u8;
        }
        let got = dequant_bf16(GgmlType::Q8_0, &b, 32).unwrap();
        for (j, &g) in got.iter().enumerate() {
            let want = d.to_f32() * (j as f32 - 16.0);
            assert_eq!(g, bf(want));
            assert!((bf16_to_f32(g) - want).abs() <= want.abs() / 256.0);
        }
        // F32: an exact tie (0x3f80_8000) rounds to even (0x3f80), 0x3f81_8000 up to 0x3f82
        let x = [f32::from_bits(0x3f80_8000), f32::from_bits(0x3f81_8000)];
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            dequant_bf16(GgmlType::F32, &bytes, 2).unwrap(),
            vec![0x3f80, 0x3f82]
        );
        assert!(dequant_bf16(GgmlType::Q8_0, &b[..20], 32).is_err());
    }

    #[test]
    fn gemm_of_small_matrices() {
        // A = [[1, 2], [3, 4], [0.5, -1]], W = [[1, 0], [0, 1], [1, 1]]
        let a: Vec<u16> = [1.0, 2.0, 3.0, 4.0, 0.5, -1.0].map(bf).to_vec();
        let w: Vec<u16> = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0].map(bf).to_vec();
        let c = gemm_bf16(&a, &w, 3, 2, &[0, 2]);
        assert_eq!(c, vec![1.0, 2.0, 3.0, 0.5, -1.0, -0.5]);
    }
}
