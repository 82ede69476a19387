//! GGML block types (as stored in GGUF) and their reference dequantisation to f32.
//!
//! Layouts (bytes per block / elements per block):
//! Q4_0 18/32, Q4_1 20/32, Q5_0 22/32, Q5_1 24/32, Q8_0 34/32, Q4_K 144/256, Q5_K 176/256,
//! Q6_K 210/256. Arithmetic order follows gguf-py's `quants.py` so results are bit-identical.

use super::fp::{bf16_to_f32, f16_to_f32};
use super::QuantError;

/// GGML tensor element types. Discriminants are the on-disk ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    BF16 = 30,
}

const SUPPORTED: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

impl GgmlType {
    pub fn from_id(id: u32) -> Result<Self, QuantError> {
        use GgmlType::*;
        Ok(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            other => return Err(QuantError::UnknownType(other)),
        })
    }

    /// llama.cpp's name for the type ("Q4_K", "BF16", ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            BF16 => "BF16",
        }
    }

    /// (elements per block, bytes per block).
    pub fn block(self) -> (usize, usize) {
        use GgmlType::*;
        match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Q8K => (256, 292),
        }
    }

    /// Bytes needed for `elements` values, or an error when not a whole number of blocks.
    pub fn row_bytes(self, elements: usize) -> Result<usize, QuantError> {
        let (be, bb) = self.block();
        if elements % be != 0 {
            return Err(QuantError::Misaligned {
                ty: self,
                elements,
                block: be,
            });
        }
        Ok(elements / be * bb)
    }

    /// Whether `dequantize` handles this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4K | Q5K | Q6K
        )
    }
}

#[inline]
fn h(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Dequantise `out.len()` elements from `data` (which must hold exactly whole blocks for them).
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    if !ty.can_dequantize() {
        return Err(QuantError::Unsupported(ty, SUPPORTED));
    }
    let need = ty.row_bytes(out.len())?;
    if data.len() < need {
        return Err(QuantError::ShortData {
            ty,
            elements: out.len(),
            need,
            got: data.len(),
        });
    }
    dequantize_row(ty, &data[..need], out);
    Ok(())
}

/// Unchecked core of [`dequantize`]: `data` holds exactly the blocks for `out`.
/// Panics only on a caller bug (length mismatch), never on data values.
pub fn dequantize_row(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    use GgmlType::*;
    let (be, bb) = ty.block();
    match ty {
        F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        BF16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        _ => {
            for (o, b) in out.chunks_exact_mut(be).zip(data.chunks_exact(bb)) {
                match ty {
                    Q4_0 => q4_0(b, o),
                    Q4_1 => q4_1(b, o),
                    Q5_0 => q5_0(b, o),
                    Q5_1 => q5_1(b, o),
                    Q8_0 => q8_0(b, o),
                    Q4K => q4_k(b, o),
                    Q5K => q5_k(b, o),
                    Q6K => q6_k(b, o),
                    _ => unreachable!("checked by can_dequantize"),
                }
            }
        }
    }
}

fn q4_0(b: &[u8], o: &mut [f32]) {
    let d = h(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        o[j] = d * ((qs[j] & 0x0f) as i32 - 8) as f32;
        o[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

fn q4_1(b: &[u8], o: &mut [f32]) {
    let d = h(b, 0);
    let m = h(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        o[j] = d * (qs[j] & 0x0f) as f32 + m;
        o[j + 16] = d * (qs[j] >> 4) as f32 + m;
    }
}

fn q5_0(b: &[u8], o: &mut [f32]) {
    let d = h(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let lo = (qs[j] & 0x0f) as u32 | (((qh >> j) & 1) << 4);
        let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
        o[j] = d * (lo as i32 - 16) as f32;
        o[j + 16] = d * (hi as i32 - 16) as f32;
    }
}

fn q5_1(b: &[u8], o: &mut [f32]) {
    let d = h(b, 0);
    let m = h(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let lo = (qs[j] & 0x0f) as u32 | (((qh >> j) & 1) << 4);
        let hi = (qs[j] >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4);
        o[j] = d * lo as f32 + m;
        o[j + 16] = d * hi as f32 + m;
    }
}

fn q8_0(b: &[u8], o: &mut [f32]) {
    let d = h(b, 0);
    for j in 0..32 {
        o[j] = d * (b[2 + j] as i8) as f32;
    }
}

/// The 8 (scale, min) 6-bit pairs of a Q4_K / Q5_K super-block.
#[inline]
pub fn k_scale_min(scales: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let sc = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

fn q4_k(b: &[u8], o: &mut [f32]) {
    let d = h(b, 0);
    let dmin = h(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    // 4 chunks of 64: low nibbles -> sub-block 2c, high nibbles -> sub-block 2c+1
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        for half in 0..2 {
            let (sc, m) = k_scale_min(scales, 2 * c + half);
            let dl = d * sc as f32;
            let ml = dmin * m as f32;
            for l in 0..32 {
                let v = if half == 0 { q[l] & 0x0f } else { q[l] >> 4 };
                o[c * 64 + half * 32 + l] = dl * v as f32 - ml;
            }
        }
    }
}

fn q5_k(b: &[u8], o: &mut [f32]) {
    let d = h(b, 0);
    let dmin = h(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for c in 0..4 {
        let q = &qs[c * 32..c * 32 + 32];
        for half in 0..2 {
            let sub = 2 * c + half;
            let (sc, m) = k_scale_min(scales, sub);
            let dl = d * sc as f32;
            let ml = dmin * m as f32;
            for l in 0..32 {
                let lo = if half == 0 { q[l] & 0x0f } else { q[l] >> 4 };
                let hi = (qh[l] >> sub) & 1;
                o[c * 64 + half * 32 + l] = dl * (lo | (hi << 4)) as f32 - ml;
            }
        }
    }
}

fn q6_k(b: &[u8], o: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let sc = &b[192..208];
    let d = h(b, 208);
    // two halves of 128 elements; each uses 64 bytes of ql and 32 bytes of qh
    for half in 0..2 {
        let ql = &ql[half * 64..half * 64 + 64];
        let qh = &qh[half * 32..half * 32 + 32];
        for l in 0..32 {
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            let base = half * 128;
            for (k, q) in [q1, q2, q3, q4].into_iter().enumerate() {
                let idx = base + k * 32 + l;
                let s = sc[idx / 16] as i8 as f32;
                o[idx] = (d * s) * q as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_simple_block() {
        let mut b = vec![0u8; 18];
        b[0..2].copy_from_slice(&half::f16::from_f32(0.5).to_bits().to_le_bytes());
        for j in 0..16 {
            b[2 + j] = (j as u8) | (((15 - j) as u8) << 4);
        }
        let mut o = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut o).unwrap();
        assert_eq!(o[0], -4.0);
        assert_eq!(o[15], 3.5);
        assert_eq!(o[16], 3.5);
    }

    #[test]
    fn errors_are_typed() {
        let mut o = [0f32; 31];
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 34], &mut o),
            Err(QuantError::Misaligned { .. })
        ));
        let mut o = [0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 10], &mut o),
            Err(QuantError::ShortData { .. })
        ));
        assert!(GgmlType::from_id(99).is_err());
    }
}
