//! One safetensors file, memory-mapped, with its header validated against the file.
//!
//! Layout: an 8-byte little-endian header length, a JSON object mapping tensor names to
//! `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the end of the header) plus
//! an optional `__metadata__` string map, then the data. Every entry's byte range must lie in the
//! file, match its dtype and shape, and not overlap another.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::WeightsError;

/// Largest header accepted (the same limit as the reference `safetensors` crate).
pub const MAX_HEADER: u64 = 100 * 1024 * 1024;

/// Element types named in safetensors headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E4M3,
    F8E5M2,
    F8E8M0,
    /// FP4 E2M1, two per byte.
    F4,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    I64,
    U64,
    F64,
    /// A dtype string this reader does not know; its tensors cannot be read.
    Other(String),
}

impl Dtype {
    fn parse(s: &str) -> Self {
        use Dtype::*;
        match s {
            "BOOL" => Bool,
            "U8" => U8,
            "I8" => I8,
            "F8_E4M3" => F8E4M3,
            "F8_E5M2" => F8E5M2,
            "F8_E8M0" => F8E8M0,
            "F4" => F4,
            "I16" => I16,
            "U16" => U16,
            "F16" => F16,
            "BF16" => BF16,
            "I32" => I32,
            "U32" => U32,
            "F32" => F32,
            "I64" => I64,
            "U64" => U64,
            "F64" => F64,
            other => Other(other.to_string()),
        }
    }

    /// Bits per element, when known.
    pub fn bits(&self) -> Option<u64> {
        use Dtype::*;
        Some(match self {
            F4 => 4,
            Bool | U8 | I8 | F8E4M3 | F8E5M2 | F8E8M0 => 8,
            I16 | U16 | F16 | BF16 => 16,
            I32 | U32 | F32 => 32,
            I64 | U64 | F64 => 64,
            Other(_) => return None,
        })
    }
}

/// One tensor's header entry; `start..end` is absolute in the file.
#[derive(Debug, Clone)]
pub struct StTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub start: usize,
    pub end: usize,
}

/// A memory-mapped safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    map: memmap2::Mmap,
    tensors: Vec<StTensor>,
    by_name: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self, WeightsError> {
        let io = |source| WeightsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let bad = |detail: String| WeightsError::Safetensors {
            path: path.to_path_buf(),
            detail,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < 8 {
            return Err(bad(format!(
                "{len} bytes, shorter than the 8-byte header length"
            )));
        }
        // SAFETY: read-only private mapping; the file must not be truncated while open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let (tensors, metadata) = parse_header(&map).map_err(bad)?;
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            path: path.to_path_buf(),
            map,
            tensors,
            by_name,
            metadata,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn tensors(&self) -> &[StTensor] {
        &self.tensors
    }
    pub fn get(&self, name: &str) -> Option<&StTensor> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }
    /// The tensor's bytes (validated against the file at open).
    pub fn data(&self, t: &StTensor) -> &[u8] {
        &self.map[t.start..t.end]
    }
    /// `__metadata__` string map.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }
}

type Header = (Vec<StTensor>, BTreeMap<String, String>);

/// Parse and validate the header of a safetensors image (`buf` is the whole file).
pub fn parse_header(buf: &[u8]) -> Result<Header, String> {
    if buf.len() < 8 {
        return Err("shorter than the 8-byte header length".into());
    }
    let n = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    let file_len = buf.len() as u64;
    if n > MAX_HEADER || n > file_len - 8 {
        return Err(format!(
            "header length {n} exceeds the file ({file_len} bytes) or the {MAX_HEADER}-byte limit"
        ));
    }
    let header = &buf[8..8 + n as usize];
    let json: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| format!("header is not valid JSON: {e}"))?;
    let obj = json.as_object().ok_or("header is not a JSON object")?;
    let data_start = 8 + n;
    let data_len = file_len - data_start;
    let mut tensors = Vec::with_capacity(obj.len());
    let mut metadata = BTreeMap::new();
    for (name, entry) in obj {
        if name == "__metadata__" {
            let m = entry.as_object().ok_or("__metadata__ is not an object")?;
            for (k, v) in m {
                let v = v
                    .as_str()
                    .ok_or_else(|| format!("__metadata__.{k} is not a string"))?;
                metadata.insert(k.clone(), v.to_string());
            }
            continue;
        }
        tensors.push(parse_entry(name, entry, data_start, data_len)?);
    }
    let mut order: Vec<&StTensor> = tensors.iter().filter(|t| t.end > t.start).collect();
    order.sort_by_key(|t| t.start);
    for w in order.windows(2) {
        if w[0].end > w[1].start {
            return Err(format!("tensors {} and {} overlap", w[0].name, w[1].name));
        }
    }
    Ok((tensors, metadata))
}

fn parse_entry(
    name: &str,
    e: &serde_json::Value,
    data_start: u64,
    data_len: u64,
) -> Result<StTensor, String> {
    let field = |k: &str| e.get(k).ok_or_else(|| format!("tensor {name}: no {k}"));
    let dtype = Dtype::parse(
        field("dtype")?
            .as_str()
            .ok_or_else(|| format!("tensor {name}: dtype is not a string"))?,
    );
    let shape_v = field("shape")?
        .as_array()
        .ok_or_else(|| format!("tensor {name}: shape is not an array"))?;
    let mut shape = Vec::with_capacity(shape_v.len());
    let mut numel: u64 = 1;
    for d in shape_v {
        let d = d.as_u64().ok_or_else(|| {
            format!("tensor {name}: shape {shape_v:?} is not non-negative integers")
        })?;
        numel = numel
            .checked_mul(d)
            .ok_or_else(|| format!("tensor {name}: shape {shape_v:?} overflows"))?;
        shape.push(
            usize::try_from(d).map_err(|_| format!("tensor {name}: dimension {d} too large"))?,
        );
    }
    let offs = field("data_offsets")?
        .as_array()
        .ok_or_else(|| format!("tensor {name}: data_offsets is not an array"))?;
    let (b, en) = match offs.as_slice() {
        [b, e] => (b.as_u64(), e.as_u64()),
        _ => (None, None),
    };
    let (b, en) = b
        .zip(en)
        .ok_or_else(|| format!("tensor {name}: data_offsets {offs:?} is not two integers"))?;
    if b > en || en > data_len {
        return Err(format!(
            "tensor {name}: data_offsets [{b}, {en}] outside the {data_len}-byte data section"
        ));
    }
    if let Some(bits) = dtype.bits() {
        let need = numel.checked_mul(bits).map(|v| v.div_ceil(8));
        if need != Some(en - b) {
            return Err(format!(
                "tensor {name}: {dtype:?} {shape:?} needs {need:?} bytes, data_offsets give {}",
                en - b
            ));
        }
    }
    Ok(StTensor {
        name: name.to_string(),
        dtype,
        shape,
        start: (data_start + b) as usize,
        end: (data_start + en) as usize,
    })
}
