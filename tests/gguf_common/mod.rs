//! A tiny GGUF writer for tests (independent of the reader under test: it follows the format
//! description in ggml's docs/gguf.md).
#![allow(dead_code)]

use fucina::gguf::GgufValue;

pub struct Tensor {
    pub name: String,
    /// GGML order: innermost first.
    pub ne: Vec<u64>,
    pub ty: u32,
    pub data: Vec<u8>,
}

pub struct Writer {
    pub version: u32,
    pub alignment: u64,
    pub kv: Vec<(String, GgufValue)>,
    pub tensors: Vec<Tensor>,
    /// Replace the computed data offsets (hostile-file tests).
    pub offsets: Option<Vec<u64>>,
}

fn type_id(v: &GgufValue) -> u32 {
    v.value_type() as u32
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

pub fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    use GgufValue::*;
    match v {
        U8(x) => out.push(*x),
        I8(x) => out.push(*x as u8),
        U16(x) => out.extend(x.to_le_bytes()),
        I16(x) => out.extend(x.to_le_bytes()),
        U32(x) => out.extend(x.to_le_bytes()),
        I32(x) => out.extend(x.to_le_bytes()),
        F32(x) => out.extend(x.to_le_bytes()),
        Bool(x) => out.push(*x as u8),
        String(s) => put_str(out, s),
        Array(a) => {
            let et = a.first().map(type_id).unwrap_or(0);
            out.extend(et.to_le_bytes());
            out.extend((a.len() as u64).to_le_bytes());
            for x in a {
                put_value(out, x);
            }
        }
        U64(x) => out.extend(x.to_le_bytes()),
        I64(x) => out.extend(x.to_le_bytes()),
        F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl Writer {
    pub fn new(version: u32) -> Self {
        Self {
            version,
            alignment: 32,
            kv: Vec::new(),
            tensors: Vec::new(),
            offsets: None,
        }
    }

    pub fn kv(mut self, k: &str, v: GgufValue) -> Self {
        if k == "general.alignment" {
            if let Some(a) = v.as_u64() {
                self.alignment = a;
            }
        }
        self.kv.push((k.to_string(), v));
        self
    }

    pub fn tensor(mut self, name: &str, ne: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push(Tensor {
            name: name.to_string(),
            ne: ne.to_vec(),
            ty,
            data,
        });
        self
    }

    /// The file image, plus the byte offset where each header field group starts
    /// (for mutation tests): (bytes, offset of the tensor-info section).
    pub fn build(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let al = if self.alignment.is_power_of_two() && self.alignment < (1 << 31) {
            self.alignment
        } else {
            32
        };
        let mut off = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            offsets.push(off);
            off = (off + t.data.len() as u64).next_multiple_of(al);
        }
        let header_offsets = self.offsets.clone().unwrap_or_else(|| offsets.clone());
        for (t, o) in self.tensors.iter().zip(&header_offsets) {
            put_str(&mut out, &t.name);
            out.extend((t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ty.to_le_bytes());
            out.extend(o.to_le_bytes());
        }
        let start = (out.len() as u64).next_multiple_of(al) as usize;
        out.resize(start, 0);
        for (t, o) in self.tensors.iter().zip(&offsets) {
            out.resize(start + *o as usize, 0);
            out.extend(&t.data);
        }
        out
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A small valid file exercising every value type, nested arrays and three tensors.
pub fn sample(version: u32) -> Writer {
    use GgufValue::*;
    let q8: Vec<u8> = (0..2)
        .flat_map(|b| {
            let mut blk = half::f16::from_f32(0.25 * (b + 1) as f32)
                .to_bits()
                .to_le_bytes()
                .to_vec();
            blk.extend((0..32).map(|i| (i as i8 - 16) as u8));
            blk
        })
        .collect();
    Writer::new(version)
        .kv("general.architecture", String("gemma3".into()))
        .kv("general.alignment", U32(64))
        .kv("t.u8", U8(200))
        .kv("t.i8", I8(-5))
        .kv("t.u16", U16(65000))
        .kv("t.i16", I16(-30000))
        .kv("t.u32", U32(4_000_000_000))
        .kv("t.i32", I32(-2_000_000_000))
        .kv("t.f32", F32(1.5))
        .kv("t.bool", Bool(true))
        .kv("t.str", String("héllo ✓".into()))
        .kv("t.u64", U64(u64::MAX - 1))
        .kv("t.i64", I64(i64::MIN + 1))
        .kv("t.f64", F64(-2.25))
        .kv("t.arr", Array(vec![I32(1), I32(-2), I32(3)]))
        .kv(
            "t.strs",
            Array(vec![
                String("a".into()),
                String("".into()),
                String("<s>".into()),
            ]),
        )
        .kv(
            "t.nested",
            Array(vec![
                Array(vec![U8(1), U8(2)]),
                Array(vec![U8(3)]),
                Array(vec![]),
            ]),
        )
        .kv("t.empty", Array(vec![]))
        .tensor("vec", &[5], 0, f32_bytes(&[1.0, -2.0, 3.5, 0.0, 9.0]))
        .tensor(
            "mat",
            &[3, 2],
            0,
            f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        )
        .tensor("q8", &[32, 2], 8, q8)
}
