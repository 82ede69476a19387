//! `Checkpoint`: one model's tensors, whatever the file layout (see `paths::resolve`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::formats::{self, Raw};
use super::paths::{self, Resolved};
use super::safetensors::SafetensorsFile;
use super::{TensorRef, WeightsError};
use crate::gguf::GgufFile;

/// An opened checkpoint: a GGUF file or a set of safetensors shards (+ config.json).
#[derive(Debug)]
pub struct Checkpoint {
    source: Source,
    dir: PathBuf,
    config: Option<serde_json::Value>,
    hook: TensorHook,
}

/// Called with the data bytes of every tensor `Checkpoint::tensor` hands out (what a loading
/// progress bar counts; backend-independent).
#[derive(Default)]
struct TensorHook(std::sync::Mutex<Option<HookFn>>);

pub type HookFn = Box<dyn Fn(usize) + Send + Sync>;

impl std::fmt::Debug for TensorHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorHook")
    }
}

#[derive(Debug)]
enum Source {
    /// One file, or the parts of a split GGUF (metadata in the first).
    Gguf {
        parts: Vec<GgufFile>,
        index: HashMap<String, usize>,
    },
    St(StStore),
}

#[derive(Debug)]
struct StStore {
    shards: Vec<SafetensorsFile>,
    /// raw tensor name -> (shard, index in shard)
    raw: HashMap<String, (usize, usize)>,
    /// names `tensor()` is meant to be asked for: raw names minus consumed scale siblings, with
    /// `X.weight_packed` listed as `X.weight`. Sorted.
    logical: Vec<String>,
    logical_set: HashSet<String>,
    /// FP8 `weight_block_size` from config.json's quantization_config.
    block: Option<(usize, usize)>,
}

impl StStore {
    fn raw(&self, name: &str) -> Option<Raw<'_>> {
        let &(s, i) = self.raw.get(name)?;
        let shard = &self.shards[s];
        let t = &shard.tensors()[i];
        Some(Raw {
            dtype: &t.dtype,
            shape: &t.shape,
            data: shard.data(t),
        })
    }
}

impl Checkpoint {
    /// Open a GGUF file, a safetensors file, a folder of them (plain, `--local-dir`, HF cache
    /// snapshot) or a `models--org--name` cache parent.
    pub fn open(path: &Path) -> Result<Self, WeightsError> {
        match paths::resolve(path)? {
            Resolved::Gguf { files, dir } => {
                let (parts, index) = open_gguf_parts(&files)?;
                Ok(Self {
                    source: Source::Gguf { parts, index },
                    dir,
                    config: None,
                    hook: TensorHook::default(),
                })
            }
            Resolved::Safetensors { files, index, dir } => {
                let config = read_config(&dir)?;
                let store = open_shards(&files, index.as_deref(), config.as_ref())?;
                Ok(Self {
                    source: Source::St(store),
                    dir,
                    config,
                    hook: TensorHook::default(),
                })
            }
        }
    }

    /// The tensor `name` with its scale siblings attached (safetensors) or its GGML blocks.
    pub fn tensor(&self, name: &str) -> Result<TensorRef<'_>, WeightsError> {
        let t = self.tensor_unhooked(name)?;
        if let Ok(h) = self.hook.0.lock() {
            if let Some(f) = h.as_ref() {
                f(t.data.len());
            }
        }
        Ok(t)
    }

    /// Install (or clear) a function called with the data bytes of every tensor handed out from
    /// now on (the model loaders fetch each weight once to upload it: a loading progress bar).
    pub fn set_tensor_hook(&self, hook: Option<HookFn>) {
        if let Ok(mut h) = self.hook.0.lock() {
            *h = hook;
        }
    }

    /// Data bytes of every tensor (what loading reads; the total of a progress bar).
    pub fn total_tensor_bytes(&self) -> u64 {
        self.tensor_names()
            .iter()
            .filter_map(|n| self.tensor_unhooked(n).ok())
            .map(|t| t.data.len() as u64)
            .sum()
    }

    fn tensor_unhooked(&self, name: &str) -> Result<TensorRef<'_>, WeightsError> {
        match &self.source {
            Source::Gguf { parts, index } => index
                .get(name)
                .and_then(|&i| parts[i].tensor(name))
                .ok_or_else(|| WeightsError::Missing(name.to_string())),
            Source::St(s) => formats::tensor_ref(name, &|n| s.raw(n), s.block),
        }
    }

    /// Whether some tensor is stored in a format `pred` accepts (nothing is handed out: the
    /// tensor hook is not called).
    pub fn any_tensor(&self, pred: impl Fn(super::TensorFormat) -> bool) -> bool {
        self.tensor_names()
            .iter()
            .filter_map(|n| self.tensor_unhooked(n).ok())
            .any(|t| pred(t.format))
    }

    pub fn has(&self, name: &str) -> bool {
        match &self.source {
            Source::Gguf { index, .. } => index.contains_key(name),
            Source::St(s) => s.logical_set.contains(name) || s.raw.contains_key(name),
        }
    }

    /// Names `tensor()` accepts: GGUF tensor names, or safetensors names without the scale
    /// siblings that are attached to their weight (and `weight_packed` listed as `weight`).
    pub fn tensor_names(&self) -> Vec<&str> {
        match &self.source {
            Source::Gguf { parts, .. } => parts
                .iter()
                .flat_map(|g| g.tensor_infos())
                .map(|t| t.name.as_str())
                .collect(),
            Source::St(s) => s.logical.iter().map(String::as_str).collect(),
        }
    }

    /// The GGUF file (the first part of a split GGUF, which holds the metadata).
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.source {
            Source::Gguf { parts, .. } => parts.first(),
            Source::St(_) => None,
        }
    }

    /// config.json beside safetensors weights.
    pub fn config(&self) -> Option<&serde_json::Value> {
        self.config.as_ref()
    }

    /// `quantization_config.quant_method` from config.json ("fp8", "modelopt",
    /// "compressed-tensors", ...). Informational: formats are decided per tensor.
    pub fn quant_method(&self) -> Option<&str> {
        self.config
            .as_ref()?
            .get("quantization_config")?
            .get("quant_method")?
            .as_str()
    }

    /// The folder holding the weights (and the tokenizer files, if any).
    pub fn dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    /// The weight files: safetensors shards or GGUF parts.
    pub fn files(&self) -> Vec<&Path> {
        match &self.source {
            Source::Gguf { parts, .. } => parts.iter().filter_map(|g| g.path()).collect(),
            Source::St(s) => s.shards.iter().map(|f| f.path()).collect(),
        }
    }
}

type GgufParts = (Vec<GgufFile>, HashMap<String, usize>);

/// Open every part of a (possibly split) GGUF; a tensor may appear in only one part.
fn open_gguf_parts(files: &[PathBuf]) -> Result<GgufParts, WeightsError> {
    let mut parts = Vec::with_capacity(files.len());
    let mut index = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        let g = GgufFile::open(f)?;
        if let Some(n) = g.get_u64("split.count") {
            if n != files.len() as u64 {
                return Err(WeightsError::Layout {
                    path: f.clone(),
                    detail: format!("split.count is {n} but {} parts were found", files.len()),
                });
            }
        }
        for t in g.tensor_infos() {
            if index.insert(t.name.clone(), i).is_some() {
                return Err(WeightsError::Layout {
                    path: f.clone(),
                    detail: format!("tensor {} is in more than one part", t.name),
                });
            }
        }
        parts.push(g);
    }
    Ok((parts, index))
}

fn read_config(dir: &Path) -> Result<Option<serde_json::Value>, WeightsError> {
    let p = dir.join("config.json");
    if !p.is_file() {
        return Ok(None);
    }
    let bytes = std::fs::read(&p).map_err(|source| WeightsError::Io {
        path: p.clone(),
        source,
    })?;
    let v = serde_json::from_slice(&bytes).map_err(|e| WeightsError::Json {
        path: p.clone(),
        detail: e.to_string(),
    })?;
    Ok(Some(v))
}

fn block_size(config: Option<&serde_json::Value>) -> Option<(usize, usize)> {
    let q = config?.get("quantization_config")?;
    let b = q.get("weight_block_size")?.as_array()?;
    match b.as_slice() {
        [r, c] => Some((r.as_u64()? as usize, c.as_u64()? as usize)),
        _ => None,
    }
}

fn open_shards(
    files: &[PathBuf],
    index: Option<&Path>,
    config: Option<&serde_json::Value>,
) -> Result<StStore, WeightsError> {
    let mut shards = Vec::with_capacity(files.len());
    let mut raw = HashMap::new();
    for (si, f) in files.iter().enumerate() {
        let sf = SafetensorsFile::open(f)?;
        for (ti, t) in sf.tensors().iter().enumerate() {
            if raw.insert(t.name.clone(), (si, ti)).is_some() {
                return Err(WeightsError::Layout {
                    path: f.clone(),
                    detail: format!("tensor {} is in more than one shard", t.name),
                });
            }
        }
        shards.push(sf);
    }
    if let Some(index) = index {
        for (name, file) in paths::read_weight_map(index)? {
            let ok = raw
                .get(&name)
                .is_some_and(|&(s, _)| shards[s].path().ends_with(&file));
            if !ok {
                return Err(WeightsError::Layout {
                    path: index.to_path_buf(),
                    detail: format!("weight_map puts {name} in {file}, which does not hold it"),
                });
            }
        }
    }
    let has = |n: &str| raw.contains_key(n);
    let mut logical: Vec<String> = raw
        .keys()
        .filter(|n| !formats::is_consumed_scale(n, &has))
        .map(|n| match n.strip_suffix("weight_packed") {
            Some(stem) if stem.is_empty() || stem.ends_with('.') => format!("{stem}weight"),
            _ => n.clone(),
        })
        .collect();
    logical.sort();
    logical.dedup();
    let logical_set = logical.iter().cloned().collect();
    Ok(StStore {
        shards,
        raw,
        logical,
        logical_set,
        block: block_size(config),
    })
}
