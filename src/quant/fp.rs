//! Scalar float codecs: f16, bf16, FP8 E4M3 (OCP "fn" variant, no infinities) and FP4 E2M1.

/// IEEE half -> f32 (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// bfloat16 -> f32 (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// FP8 E4M3FN -> f32 (exact). 0x7f / 0xff are NaN; there are no infinities. Max normal 448.
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((b >> 3) & 0x0f) as i32;
    let man = (b & 0x07) as f32;
    if exp == 0x0f && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man * (1.0 / 8.0) * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// f32 -> FP8 E4M3FN, round to nearest even, saturating to +-448 (what `torch.float8_e4m3fn`
/// conversion of a clamped value gives). NaN maps to 0x7f.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(448.0);
    if a < 2f32.powi(-10) {
        // below half of the smallest subnormal (2^-9): rounds to zero (ties-to-even at 2^-10)
        return sign;
    }
    // Choose the binade; subnormals share the exponent of the smallest normal.
    let e = a.log2().floor() as i32;
    let e = e.max(-6);
    let step = 2f32.powi(e - 3); // spacing of representable values in this binade
    let q = (a / step).round_ties_even();
    // q in [8, 16] for normals (16 carries into the next binade), [0, 8) for subnormals
    let bits = if e == -6 && q < 8.0 {
        q as u8
    } else if q >= 16.0 {
        ((e + 8) as u8) << 3 // mantissa 0 of the next binade
    } else {
        (((e + 7) as u8) << 3) | ((q as u8) - 8)
    };
    sign | bits.min(0x7e)
}

/// FP4 E2M1 (low 4 bits) -> f32: values {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign bit 3.
#[inline]
pub fn e2m1_to_f32(n: u8) -> f32 {
    const LUT: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let v = LUT[(n & 7) as usize];
    if n & 8 != 0 {
        -v
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_roundtrip_all_codes() {
        for b in 0u8..=255 {
            let v = e4m3_to_f32(b);
            if v.is_nan() {
                continue;
            }
            let back = f32_to_e4m3(v);
            // +0 / -0 both fine
            assert_eq!(e4m3_to_f32(back), v, "code {b:#x} value {v}");
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f32_to_e4m3(1e9), 0x7e);
        assert_eq!(f32_to_e4m3(-1e9), 0xfe);
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e4m3_rounds_to_nearest() {
        // 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39): ties to even -> 1.0
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        assert_eq!(e4m3_to_f32(f32_to_e4m3(15.5)), 16.0);
    }

    #[test]
    fn e2m1_table() {
        assert_eq!(e2m1_to_f32(0x7), 6.0);
        assert_eq!(e2m1_to_f32(0xf), -6.0);
        assert_eq!(e2m1_to_f32(0x1), 0.5);
    }
}
