//! Rotary position embedding.
//!
//! Two pairings exist: NEOX (HF's `rotate_half`: element i pairs with i + rot/2) and
//! interleaved (GPT-J / llama.cpp's "normal" mode: element 2i pairs with 2i + 1). Partial rotary
//! rotates only the first `rot_dims` dimensions of each head. Frequencies are
//! `pos * theta^(-2i/rot_dims) / factor[i]`, where `freq_factors` (GGUF `rope_freqs`) divides
//! per pair when present.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    Neox,
    Interleaved,
}

#[derive(Debug, Clone, Copy)]
pub struct RopeSpec<'a> {
    pub head_dim: usize,
    /// Number of leading dimensions rotated (even, <= head_dim).
    pub rot_dims: usize,
    pub theta: f32,
    pub layout: RopeLayout,
    /// Optional per-pair divisors (length rot_dims / 2).
    pub freq_factors: Option<&'a [f32]>,
    /// The dimension the exponent is normalised by; usually `rot_dims`. HF's "proportional"
    /// partial rotary (Gemma 4 global layers) uses head_dim here with rot_dims < head_dim.
    pub freq_base_dims: usize,
}

impl RopeSpec<'_> {
    /// Inverse frequency of pair `i` (computed in f64, rounded once).
    pub fn inv_freq(&self, i: usize) -> f32 {
        let f = (self.theta as f64).powf(-(2.0 * i as f64) / self.freq_base_dims as f64);
        let f = match self.freq_factors {
            Some(ff) => f / ff[i] as f64,
            None => f,
        };
        f as f32
    }
}

/// Rotate `x` in place: `x` holds `n_heads` heads of `head_dim` for ONE position `pos`.
pub fn rope(x: &mut [f32], n_heads: usize, pos: usize, spec: &RopeSpec<'_>) {
    let hd = spec.head_dim;
    assert_eq!(x.len(), n_heads * hd);
    assert!(spec.rot_dims % 2 == 0 && spec.rot_dims <= hd);
    let half = spec.rot_dims / 2;
    for h in 0..n_heads {
        let v = &mut x[h * hd..(h + 1) * hd];
        for i in 0..half {
            let ang = pos as f64 * spec.inv_freq(i) as f64;
            let (s, c) = (ang.sin() as f32, ang.cos() as f32);
            let (a, b) = match spec.layout {
                RopeLayout::Neox => (i, i + half),
                RopeLayout::Interleaved => (2 * i, 2 * i + 1),
            };
            let (x0, x1) = (v[a], v[b]);
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_preserved() {
        let spec = RopeSpec {
            head_dim: 8,
            rot_dims: 4,
            theta: 10000.0,
            layout: RopeLayout::Neox,
            freq_factors: None,
            freq_base_dims: 4,
        };
        let x0: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
        let mut x = x0.clone();
        rope(&mut x, 2, 0, &spec);
        assert_eq!(x, x0);
        rope(&mut x, 2, 7, &spec);
        let n0: f32 = x0.iter().map(|v| v * v).sum();
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        // unrotated tail untouched
        assert_eq!(&x[4..8], &x0[4..8]);
    }
}
