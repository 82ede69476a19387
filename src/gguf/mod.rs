//! GGUF files (versions 2 and 3), memory-mapped.
//!
//! `GgufFile::open` parses the metadata and tensor infos, validates every tensor's byte range
//! against the file, and keeps the mapping alive so `tensor()` can lend the raw blocks out as a
//! [`TensorRef`] with the shape in PyTorch order (GGML's `ne` reversed: `[out, in]`).

mod reader;
pub mod value;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub use reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_METADATA_VALUES};
pub use value::{GgufValue, GgufValueType};

use crate::quant::GgmlType;
use crate::weights::{Scales, TensorFormat, TensorRef};

/// Errors opening or parsing a GGUF file. Offsets are byte positions in the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic bytes {0:?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("GGUF version {0} is not supported (supported: 2, 3; a big-endian file reads as a huge version)")]
    UnsupportedVersion(u32),
    #[error("file truncated at byte {offset}: {what} needs {need} more bytes")]
    Truncated {
        offset: u64,
        need: u64,
        what: &'static str,
    },
    #[error(
        "{what} {count} at byte {offset} cannot fit in the {remaining} bytes left in the file"
    )]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    BadString { offset: u64, what: &'static str },
    #[error("metadata {key}: unknown value type id {id} at byte {offset}")]
    UnknownValueType { key: String, id: u32, offset: u64 },
    #[error("metadata {key}: bool byte {byte} at byte {offset} is neither 0 nor 1")]
    BadBool { key: String, offset: u64, byte: u8 },
    #[error("metadata {key}: arrays nested deeper than {max}")]
    ArrayTooDeep { key: String, max: usize },
    #[error("more than {max} metadata values")]
    TooManyValues { max: u64 },
    #[error("metadata key {0} appears twice")]
    DuplicateKey(String),
    #[error("general.alignment {0} is not a power of two up to 2^30")]
    BadAlignment(String),
    #[error("tensor {name}: {n_dims} dimensions (at most 4)")]
    TooManyDims { name: String, n_dims: u32 },
    #[error("tensor {name}: GGML type id {id} is unknown to fucina")]
    UnknownTensorType { name: String, id: u32 },
    #[error("tensor {name}: dimensions {dims:?} overflow")]
    ShapeOverflow { name: String, dims: Vec<u64> },
    #[error("tensor {name}: row length {ne0} is not a multiple of the {ty:?} block size {block}")]
    MisalignedRow {
        name: String,
        ty: GgmlType,
        ne0: u64,
        block: usize,
    },
    #[error("tensor {name}: data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {0} appears twice")]
    DuplicateTensor(String),
    #[error("tensor {name}: {n_bytes} bytes at data offset {offset} (data starts at {data_offset}) run past the end of the {file_len}-byte file")]
    TensorOutOfRange {
        name: String,
        offset: u64,
        n_bytes: u64,
        data_offset: u64,
        file_len: u64,
    },
    #[error("tensors {first} and {second} overlap")]
    TensorOverlap { first: String, second: String },
}

/// One tensor's entry in the GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGML order (`ne`): innermost (contiguous) dimension first.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section, as stored.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
    /// Offset from the start of the file.
    pub abs_offset: u64,
}

impl GgufTensorInfo {
    /// Shape in PyTorch order (outermost first): `dims` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file whose tensor data stays in the memory map.
pub struct GgufFile {
    path: Option<PathBuf>,
    storage: Storage,
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse a GGUF file.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let storage = if len == 0 {
            Storage::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private to this process; the file must not be
            // truncated while it is open (the same contract every mmap-based loader has).
            Storage::Mmap(unsafe { memmap2::Mmap::map(&file) }.map_err(io)?)
        };
        let mut g = Self::from_storage(storage)?;
        g.path = Some(path.to_path_buf());
        Ok(g)
    }

    /// Parse a GGUF image held in memory (tests, embedded files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<Self, GgufError> {
        let p = reader::parse(storage.bytes())?;
        Ok(Self {
            path: None,
            storage,
            version: p.version,
            metadata: p.metadata,
            tensors: p.tensors,
            by_name: p.by_name,
            alignment: p.alignment,
            data_offset: p.data_offset,
        })
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// File offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }
    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }
    /// A float value (f32 or f64), or an integer converted.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }
    pub fn get_array(&self, key: &str) -> Option<&[GgufValue]> {
        self.get(key)?.as_array()
    }
    /// An integer array as u64s (None if absent or any element is not a non-negative integer).
    pub fn get_u64_array(&self, key: &str) -> Option<Vec<u64>> {
        self.get_array(key)?.iter().map(GgufValue::as_u64).collect()
    }
    /// A numeric array as f32s.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        self.get_array(key)?.iter().map(GgufValue::as_f32).collect()
    }
    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's raw blocks with its shape in PyTorch order.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        let t = self.tensor_info(name)?;
        let data = if t.n_bytes == 0 {
            &[][..]
        } else {
            // validated at parse time: abs_offset + n_bytes <= file length
            &self.storage.bytes()[t.abs_offset as usize..(t.abs_offset + t.n_bytes) as usize]
        };
        Some(TensorRef {
            name: t.name.clone(),
            shape: t.shape(),
            format: TensorFormat::Ggml(t.ty),
            data,
            scales: Scales::default(),
        })
    }
}
