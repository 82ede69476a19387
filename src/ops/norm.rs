//! RMSNorm in the three forms the supported models use.

/// How the normalised value is scaled.
#[derive(Debug, Clone, Copy)]
pub enum NormWeight<'a> {
    /// x_hat * w (Gemma 4, Qwen3, GGUF files with the +1 folded in).
    Plain(&'a [f32]),
    /// x_hat * (1 + w) (Gemma 3 and Qwen3.5 in HF safetensors).
    OnePlus(&'a [f32]),
    /// x_hat alone (Gemma 4's v-norm).
    None,
}

/// RMSNorm over rows of length `dim`: out = x / sqrt(mean(x^2) + eps) * weight.
/// `x` and `out` hold `rows * dim` values; the weight (if any) has `dim` values.
/// The sum of squares is accumulated in f64 so the reference is not the noisiest side of a
/// comparison.
pub fn rms_norm(x: &[f32], weight: NormWeight<'_>, eps: f32, dim: usize, out: &mut [f32]) {
    assert_eq!(x.len(), out.len());
    assert!(
        dim > 0 && x.len() % dim == 0,
        "rms_norm: len {} not a multiple of {dim}",
        x.len()
    );
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let ss: f64 = xr.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let inv = 1.0 / ((ss / dim as f64) as f32 + eps).sqrt();
        match weight {
            NormWeight::Plain(w) => {
                for i in 0..dim {
                    or[i] = xr[i] * inv * w[i];
                }
            }
            NormWeight::OnePlus(w) => {
                for i in 0..dim {
                    or[i] = xr[i] * inv * (1.0 + w[i]);
                }
            }
            NormWeight::None => {
                for i in 0..dim {
                    or[i] = xr[i] * inv;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        let x = [3.0f32, 4.0];
        let mut o = [0f32; 2];
        rms_norm(&x, NormWeight::None, 0.0, 2, &mut o);
        let r = (12.5f32).sqrt();
        assert!((o[0] - 3.0 / r).abs() < 1e-6);
        rms_norm(&x, NormWeight::Plain(&[2.0, 0.0]), 0.0, 2, &mut o);
        assert!((o[0] - 6.0 / r).abs() < 1e-6 && o[1] == 0.0);
        rms_norm(&x, NormWeight::OnePlus(&[1.0, -1.0]), 0.0, 2, &mut o);
        assert!((o[0] - 6.0 / r).abs() < 1e-6 && o[1] == 0.0);
    }
}
