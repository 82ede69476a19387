//! A streaming GGUF (version 3) writer: metadata and tensor infos first, then each tensor's data
//! in declaration order, padded to the alignment, as gguf-py's `GGUFWriter` lays a file out.

use std::io::{self, Write};

use crate::gguf::{GgufValue, GgufValueType};
use crate::quant::GgmlType;

/// The alignment gguf-py writes by default (no `general.alignment` key).
pub const ALIGNMENT: u64 = 32;

/// One tensor's header entry.
#[derive(Debug, Clone)]
pub struct TensorDecl {
    pub name: String,
    /// PyTorch order (outermost first); written reversed as GGML's `ne`.
    pub shape: Vec<usize>,
    pub ty: GgmlType,
}

impl TensorDecl {
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
    /// Bytes of data (rows of `shape.last()` elements).
    pub fn n_bytes(&self) -> io::Result<usize> {
        let inner = *self.shape.last().unwrap_or(&1);
        let rows = self.elements() / inner.max(1);
        let rb = self.ty.row_bytes(inner).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {e}", self.name))
        })?;
        Ok(rb * rows)
    }
}

fn pad(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_of(v: &GgufValue) -> GgufValueType {
    use GgufValue as V;
    match v {
        V::U8(_) => GgufValueType::U8,
        V::I8(_) => GgufValueType::I8,
        V::U16(_) => GgufValueType::U16,
        V::I16(_) => GgufValueType::I16,
        V::U32(_) => GgufValueType::U32,
        V::I32(_) => GgufValueType::I32,
        V::F32(_) => GgufValueType::F32,
        V::Bool(_) => GgufValueType::Bool,
        V::String(_) => GgufValueType::String,
        V::Array(_) => GgufValueType::Array,
        V::U64(_) => GgufValueType::U64,
        V::I64(_) => GgufValueType::I64,
        V::F64(_) => GgufValueType::F64,
    }
}

/// Serialise one value (without its type id).
fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    use GgufValue as V;
    match v {
        V::U8(x) => out.push(*x),
        V::I8(x) => out.push(*x as u8),
        V::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::Bool(x) => out.push(*x as u8),
        V::String(s) => put_str(out, s),
        V::Array(a) => {
            // an empty array keeps a string element type (what an empty merges list is)
            let et = a.first().map(type_of).unwrap_or(GgufValueType::String);
            out.extend_from_slice(&(et as u32).to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                put_value(out, e);
            }
        }
        V::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        V::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// The header: magic, version, counts, metadata, tensor infos, padding to the data section.
/// Returns the header bytes and every tensor's data size.
pub fn header(
    kv: &[(String, GgufValue)],
    tensors: &[TensorDecl],
) -> io::Result<(Vec<u8>, Vec<usize>)> {
    let mut out = Vec::with_capacity(1 << 20);
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        put_str(&mut out, k);
        out.extend_from_slice(&(type_of(v) as u32).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0u64;
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        let n = t.n_bytes()?;
        put_str(&mut out, &t.name);
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            out.extend_from_slice(&(d as u64).to_le_bytes());
        }
        out.extend_from_slice(&(t.ty as u32).to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        offset = pad(offset + n as u64);
        sizes.push(n);
    }
    let len = out.len() as u64;
    out.resize(pad(len) as usize, 0);
    Ok((out, sizes))
}

/// Total file size for a header of `header_len` bytes and tensors of `sizes` bytes.
pub fn file_size(header_len: usize, sizes: &[usize]) -> u64 {
    header_len as u64 + sizes.iter().map(|&n| pad(n as u64)).sum::<u64>()
}

/// Zero bytes after a tensor of `n` bytes up to the alignment.
pub fn write_padding(w: &mut impl Write, n: usize) -> io::Result<()> {
    let p = (pad(n as u64) - n as u64) as usize;
    w.write_all(&[0u8; ALIGNMENT as usize][..p])
}
