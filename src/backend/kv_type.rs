//! What a KV cache stores per element, and the rounding every backend applies when it writes a
//! row (one position of one KV head, `head_dim` values). The CUDA kernels and the CPU
//! reference implement the same arithmetic, so a CPU backend with the same `KvType` is the
//! reference for a GPU cache of that type.
//!
//! FP8 is scaled per row: the scale `s` is `amax / 448` (E4M3FN's largest finite value is 448)
//! rounded up to an f16 and at least 2^-14 (f16's smallest normal), each value is stored as
//! `e4m3(x * (1 / s))` (round to nearest even, saturating) and read back as `e4m3 * s`. The
//! scales live beside the rows they describe (one f16 for K and one for V per position and KV
//! head): every row uses E4M3's whole range whatever its magnitude, so small values keep their 3
//! mantissa bits instead of falling into the subnormals and large ones are never clamped; an f16
//! scale times an E4M3 value is exact in f32, and a normal f16 scale keeps `e4m3 * s` (which
//! the tensor-core attention rounds to f16) as precise as an f16 cache.

use crate::quant::fp::{e4m3_to_f32, f32_to_e4m3};

/// Element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half (the default): the model's values to 11 significant bits.
    #[default]
    F16,
    /// FP8 E4M3 with one f16 scale per row (position x KV head): about half the bytes of f16.
    Fp8E4m3,
    /// f32: the values as computed (the CPU reference's cache).
    F32,
}

/// Largest finite FP8 E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;

impl KvType {
    /// Bytes of one cached element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::Fp8E4m3 => 1,
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }

    /// Bytes `elems` elements take in rows of at least 64 (the smallest head dimension a cache
    /// holds), scales included: an FP8 row keeps a 2-byte scale per row.
    pub fn bytes_for(self, elems: usize) -> u64 {
        let e = elems as u64;
        match self {
            KvType::Fp8E4m3 => e + e.div_ceil(64) * 2,
            t => e * t.bytes() as u64,
        }
    }

    /// Bytes a row of `head_dim` elements takes, its scale included.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        head_dim * self.bytes() + if self == KvType::Fp8E4m3 { 2 } else { 0 }
    }

    /// The name `--kv-type` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvType::Fp8E4m3 => "fp8",
            KvType::F16 => "f16",
            KvType::F32 => "f32",
        }
    }

    /// The values a cache of this type gives back for `row` (one position of one KV head),
    /// written in place.
    pub fn round_row(self, row: &mut [f32]) {
        match self {
            KvType::F32 => {}
            KvType::F16 => {
                for x in row.iter_mut() {
                    *x = half::f16::from_f32(*x).to_f32();
                }
            }
            KvType::Fp8E4m3 => {
                let s = fp8_row_scale(row);
                let (sf, inv) = (s.to_f32(), 1.0 / s.to_f32());
                for x in row.iter_mut() {
                    *x = e4m3_to_f32(f32_to_e4m3(*x * inv)) * sf;
                }
            }
        }
    }
}

/// Smallest normal f16, the least FP8 row scale.
pub const FP8_MIN_SCALE: f32 = 6.103_515_6e-5;

/// The scale of an FP8 row (see the module doc): `max(amax / 448, 2^-14)` rounded up to an f16;
/// NaN values are ignored (they stay NaN in the row).
pub fn fp8_row_scale(row: &[f32]) -> half::f16 {
    let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
    f16_round_up((amax / E4M3_MAX).max(FP8_MIN_SCALE))
}

/// The least f16 at or above a positive finite `x` (inf past f16's range).
pub fn f16_round_up(x: f32) -> half::f16 {
    let h = half::f16::from_f32(x);
    if h.to_f32() < x {
        half::f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "fp8" | "fp8_e4m3" | "e4m3" | "f8" => Ok(KvType::Fp8E4m3),
            "f16" | "fp16" | "half" => Ok(KvType::F16),
            "f32" | "fp32" | "float" => Ok(KvType::F32),
            o => Err(format!("unknown KV type {o:?} (expected fp8, f16 or f32)")),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_rows_use_the_whole_range_whatever_their_magnitude() {
        for mag in [1e-4f32, 1.0, 3e3] {
            let row: Vec<f32> = (0..128).map(|i| ((i as f32 * 0.7).sin()) * mag).collect();
            let mut r = row.clone();
            KvType::Fp8E4m3.round_row(&mut r);
            for (a, b) in row.iter().zip(&r) {
                // 3 mantissa bits: within 1/16 of the value, or of 2^-6 of the row's amax for
                // the subnormals of the scaled range
                assert!(
                    (a - b).abs() <= a.abs() / 16.0 + mag * 2f32.powi(-6) / 16.0 * 1.01,
                    "{a} {b}"
                );
            }
            let amax = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            let rmax = r.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(
                (rmax - amax).abs() <= amax / 16.0,
                "the largest value survives: {amax} {rmax}"
            );
            let s = fp8_row_scale(&row).to_f32();
            assert!(
                s * E4M3_MAX >= amax && (mag < 1e-3 || s * E4M3_MAX <= amax * 1.001),
                "{s} {amax}"
            );
        }
    }

    #[test]
    fn zero_rows_and_f16_and_parse() {
        let mut z = vec![0.0f32; 8];
        KvType::Fp8E4m3.round_row(&mut z);
        assert!(z.iter().all(|v| *v == 0.0));
        let mut h = vec![1.0f32 + 1e-4, 65504.0];
        KvType::F16.round_row(&mut h);
        assert_eq!(h, vec![1.0, 65504.0]);
        assert_eq!("fp8".parse::<KvType>().unwrap(), KvType::Fp8E4m3);
        assert_eq!("F16".parse::<KvType>().unwrap(), KvType::F16);
        assert!("int4".parse::<KvType>().is_err());
        assert_eq!(KvType::default(), KvType::F16);
        assert_eq!(KvType::Fp8E4m3.row_bytes(128), 130);
        assert_eq!(f16_round_up(1.0).to_f32(), 1.0);
        assert!(f16_round_up(1.0 + 1e-4).to_f32() > 1.0);
    }
}
