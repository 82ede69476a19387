//! Bounds-checked parsing of a GGUF header (metadata + tensor infos) from a byte slice.
//!
//! Every count read from the file is checked against the bytes that remain before anything is
//! allocated for it, every offset and size is computed with checked arithmetic, and nesting of
//! arrays is limited, so a hostile file costs at most memory proportional to its own size.

use std::collections::{BTreeMap, HashMap};

use super::value::{GgufValue, GgufValueType};
use super::{GgufError, GgufTensorInfo};
use crate::quant::GgmlType;

/// "GGUF" read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML_MAX_DIMS.
pub const MAX_DIMS: u32 = 4;
/// Deepest array-of-array nesting accepted in metadata.
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Most metadata values (array elements included) accepted in one file: real files hold a few
/// million at most (vocabularies, merges); the cap bounds memory to ~512 MiB for hostile ones.
pub const MAX_METADATA_VALUES: u64 = 1 << 24;
/// Largest accepted `general.alignment` (1 GiB).
const MAX_ALIGNMENT: u64 = 1 << 30;

/// What `parse` extracts from a file.
pub struct Parsed {
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    pub by_name: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// metadata values read so far
    values: u64,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.pos as u64,
                need: n,
                what,
            });
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn arr<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    /// A count of items each needing at least `min_each` bytes; rejected when the rest of the
    /// file cannot hold that many.
    fn count(&mut self, min_each: u64, what: &'static str) -> Result<u64, GgufError> {
        let offset = self.pos as u64;
        let n = self.u64(what)?;
        let need = n.checked_mul(min_each);
        match need {
            Some(need) if need <= self.remaining() => Ok(n),
            _ => Err(GgufError::CountTooLarge {
                what,
                count: n,
                offset,
                remaining: self.remaining(),
            }),
        }
    }

    fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let offset = self.pos as u64;
        let len = self.count(1, what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadString { offset, what })
    }

    fn value(
        &mut self,
        key: &str,
        ty: GgufValueType,
        depth: usize,
    ) -> Result<GgufValue, GgufError> {
        use GgufValueType as T;
        self.values += 1;
        if self.values > MAX_METADATA_VALUES {
            return Err(GgufError::TooManyValues {
                max: MAX_METADATA_VALUES,
            });
        }
        Ok(match ty {
            T::U8 => GgufValue::U8(self.arr::<1>("u8 value")?[0]),
            T::I8 => GgufValue::I8(self.arr::<1>("i8 value")?[0] as i8),
            T::U16 => GgufValue::U16(u16::from_le_bytes(self.arr("u16 value")?)),
            T::I16 => GgufValue::I16(i16::from_le_bytes(self.arr("i16 value")?)),
            T::U32 => GgufValue::U32(self.u32("u32 value")?),
            T::I32 => GgufValue::I32(i32::from_le_bytes(self.arr("i32 value")?)),
            T::F32 => GgufValue::F32(f32::from_le_bytes(self.arr("f32 value")?)),
            T::U64 => GgufValue::U64(self.u64("u64 value")?),
            T::I64 => GgufValue::I64(i64::from_le_bytes(self.arr("i64 value")?)),
            T::F64 => GgufValue::F64(f64::from_le_bytes(self.arr("f64 value")?)),
            T::Bool => {
                let offset = self.pos as u64;
                match self.arr::<1>("bool value")?[0] {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    byte => {
                        return Err(GgufError::BadBool {
                            key: key.to_string(),
                            offset,
                            byte,
                        })
                    }
                }
            }
            T::String => GgufValue::String(self.string("string value")?),
            T::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::ArrayTooDeep {
                        key: key.to_string(),
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let et = self.value_type(key)?;
                let n = self.count(et.min_size(), "array length")?;
                if self.values.saturating_add(n) > MAX_METADATA_VALUES {
                    return Err(GgufError::TooManyValues {
                        max: MAX_METADATA_VALUES,
                    });
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(key, et, depth + 1)?);
                }
                GgufValue::Array(items)
            }
        })
    }

    fn value_type(&mut self, key: &str) -> Result<GgufValueType, GgufError> {
        let offset = self.pos as u64;
        let id = self.u32("value type")?;
        GgufValueType::from_id(id).ok_or(GgufError::UnknownValueType {
            key: key.to_string(),
            id,
            offset,
        })
    }
}

/// Parse the header of a GGUF file held in `buf` and validate every tensor's data range.
pub fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor {
        buf,
        pos: 0,
        values: 0,
    };
    let magic = c.u32("magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic.to_le_bytes()));
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    // a tensor info is at least name length + n_dims + type + offset
    let n_tensors = c.count(8 + 4 + 4 + 8, "tensor count")?;
    // a key/value pair is at least key length + type + a one-byte value
    let n_kv = c.count(8 + 4 + 1, "metadata count")?;

    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let ty = c.value_type(&key)?;
        let v = c.value(&key, ty, 0)?;
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        metadata.insert(key, v);
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
            _ => return Err(GgufError::BadAlignment(v.to_string())),
        },
    };

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut by_name = HashMap::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let name = c.string("tensor name")?;
        let n_dims = c.u32("tensor dimension count")?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooManyDims { name, n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64("tensor dimension")?);
        }
        let type_id = c.u32("tensor type")?;
        let offset = c.u64("tensor offset")?;
        let ty = GgmlType::from_id(type_id).map_err(|_| GgufError::UnknownTensorType {
            name: name.clone(),
            id: type_id,
        })?;
        let n_bytes = tensor_bytes(&name, ty, &dims)?;
        if offset % alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                name,
                offset,
                alignment,
            });
        }
        if by_name.insert(name.clone(), tensors.len()).is_some() {
            return Err(GgufError::DuplicateTensor(name));
        }
        tensors.push(GgufTensorInfo {
            name,
            dims,
            ty,
            offset,
            n_bytes,
            abs_offset: 0,
        });
    }

    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let file_len = buf.len() as u64;
    for t in &mut tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len || t.n_bytes == 0 => t.abs_offset = s,
            _ => {
                return Err(GgufError::TensorOutOfRange {
                    name: t.name.clone(),
                    offset: t.offset,
                    n_bytes: t.n_bytes,
                    data_offset,
                    file_len,
                })
            }
        }
    }
    check_overlaps(&tensors)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        by_name,
        alignment,
        data_offset,
    })
}

/// Bytes of a tensor with GGML dims `ne` (innermost first), with every product checked.
fn tensor_bytes(name: &str, ty: GgmlType, ne: &[u64]) -> Result<u64, GgufError> {
    let overflow = || GgufError::ShapeOverflow {
        name: name.to_string(),
        dims: ne.to_vec(),
    };
    let (be, bb) = ty.block();
    let ne0 = ne.first().copied().unwrap_or(1);
    if ne0 % be as u64 != 0 {
        return Err(GgufError::MisalignedRow {
            name: name.to_string(),
            ty,
            ne0,
            block: be,
        });
    }
    let mut bytes = (ne0 / be as u64)
        .checked_mul(bb as u64)
        .ok_or_else(overflow)?;
    for &d in ne.iter().skip(1) {
        bytes = bytes.checked_mul(d).ok_or_else(overflow)?;
    }
    // the element count must fit too (numel is computed as a usize product later)
    let mut numel: u64 = 1;
    for &d in ne {
        numel = numel.checked_mul(d).ok_or_else(overflow)?;
    }
    if numel > isize::MAX as u64 || bytes > isize::MAX as u64 {
        return Err(overflow());
    }
    Ok(bytes)
}

fn check_overlaps(tensors: &[GgufTensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.abs_offset);
    for w in order.windows(2) {
        if w[0].abs_offset + w[0].n_bytes > w[1].abs_offset {
            return Err(GgufError::TensorOverlap {
                first: w[0].name.clone(),
                second: w[1].name.clone(),
            });
        }
    }
    Ok(())
}
