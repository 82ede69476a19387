//! A small safetensors writer and checkpoint-folder helpers for tests.
#![allow(dead_code)]

use std::path::Path;

pub struct St {
    pub tensors: Vec<(String, String, Vec<usize>, Vec<u8>)>,
}

impl St {
    pub fn new() -> Self {
        Self {
            tensors: Vec::new(),
        }
    }
    pub fn t(mut self, name: &str, dtype: &str, shape: &[usize], data: Vec<u8>) -> Self {
        self.tensors
            .push((name.to_string(), dtype.to_string(), shape.to_vec(), data));
        self
    }
    pub fn f32(self, name: &str, shape: &[usize], v: &[f32]) -> Self {
        self.t(
            name,
            "F32",
            shape,
            v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        )
    }
    pub fn build(&self) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut off = 0usize;
        for (n, d, s, b) in &self.tensors {
            header.insert(
                n.clone(),
                serde_json::json!({"dtype": d, "shape": s, "data_offsets": [off, off + b.len()]}),
            );
            off += b.len();
        }
        let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend(h);
        for (_, _, _, b) in &self.tensors {
            out.extend(b);
        }
        out
    }
    pub fn write(&self, p: &Path) {
        std::fs::write(p, self.build()).unwrap();
    }
}

pub fn write_json(p: &Path, v: serde_json::Value) {
    std::fs::write(p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
pub fn bf16s(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
        .collect()
}
pub fn f16s(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
        .collect()
}
