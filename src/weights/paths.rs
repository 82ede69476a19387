//! Where a checkpoint's files are: a GGUF file, a safetensors file, a directory (plain,
//! `--local-dir` download or HF cache snapshot), or a `models--org--name` cache parent.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use super::WeightsError;

/// The sharded-safetensors index file name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// A checkpoint location resolved to concrete files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    Gguf {
        /// One file, or every part of a llama.cpp split (`X-00001-of-00003.gguf`...) in order.
        files: Vec<PathBuf>,
        dir: PathBuf,
    },
    Safetensors {
        /// Shards in a stable order.
        files: Vec<PathBuf>,
        /// `model.safetensors.index.json`, when the checkpoint is sharded through one.
        index: Option<PathBuf>,
        /// The folder holding config.json and the tokenizer files.
        dir: PathBuf,
    },
}

fn layout(path: &Path, detail: impl Into<String>) -> WeightsError {
    WeightsError::Layout {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
    move |source| WeightsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether a file starts with the GGUF magic.
fn is_gguf(path: &Path) -> Result<bool, WeightsError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut magic = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match f.read(&mut magic[got..]).map_err(io(path))? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got == 4 && &magic == b"GGUF")
}

fn parent_dir(file: &Path) -> PathBuf {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Resolve what the user passed as `-m`.
pub fn resolve(path: &Path) -> Result<Resolved, WeightsError> {
    let meta = std::fs::metadata(path).map_err(io(path))?;
    if meta.is_file() {
        let dir = parent_dir(path);
        if is_gguf(path)? {
            let files = gguf_split_set(path)?.unwrap_or_else(|| vec![path.to_path_buf()]);
            return Ok(Resolved::Gguf { files, dir });
        }
        if path.file_name().is_some_and(|n| n == INDEX_FILE) {
            let files = index_shards(path, &dir)?;
            return Ok(Resolved::Safetensors {
                files,
                index: Some(path.to_path_buf()),
                dir,
            });
        }
        return Ok(Resolved::Safetensors {
            files: vec![path.to_path_buf()],
            index: None,
            dir,
        });
    }
    if path.join("snapshots").is_dir() {
        return resolve(&cache_snapshot(path)?);
    }
    if path.file_name().is_some_and(|n| n == "snapshots") {
        if let Some(parent) = path.parent() {
            return resolve(&cache_snapshot(parent)?);
        }
    }
    resolve_dir(path)
}

fn resolve_dir(dir: &Path) -> Result<Resolved, WeightsError> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        let files = index_shards(&index, dir)?;
        return Ok(Resolved::Safetensors {
            files,
            index: Some(index),
            dir: dir.to_path_buf(),
        });
    }
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(Resolved::Safetensors {
            files: vec![single],
            index: None,
            dir: dir.to_path_buf(),
        });
    }
    let mut st = Vec::new();
    let mut gguf = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !e.path().is_file() {
            continue;
        }
        if name.ends_with(".safetensors") {
            st.push(e.path());
        } else if name.ends_with(".gguf") {
            gguf.push(e.path());
        }
    }
    st.sort();
    gguf.sort();
    if !st.is_empty() {
        return Ok(Resolved::Safetensors {
            files: st,
            index: None,
            dir: dir.to_path_buf(),
        });
    }
    if let Some(first) = gguf.first() {
        if let Some(files) = gguf_split_set(first)? {
            if files == gguf {
                return Ok(Resolved::Gguf {
                    files,
                    dir: dir.to_path_buf(),
                });
            }
        }
    }
    match gguf.len() {
        1 => Ok(Resolved::Gguf {
            files: gguf,
            dir: dir.to_path_buf(),
        }),
        0 => Err(layout(
            dir,
            format!("no {INDEX_FILE}, {SINGLE_FILE}, *.safetensors or *.gguf file in this folder"),
        )),
        _ => {
            let names: Vec<String> = gguf
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect();
            Err(layout(
                dir,
                format!(
                    "several GGUF files ({}); pass the one to load",
                    names.join(", ")
                ),
            ))
        }
    }
}

/// `(prefix, part, count)` of a llama.cpp split name `PREFIX-00002-of-00005.gguf`.
fn split_name(name: &str) -> Option<(&str, u32, u32)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, part) = rest.rsplit_once('-')?;
    let num = |s: &str| {
        (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    let (part, count) = (num(part)?, num(count)?);
    (part >= 1 && part <= count).then_some((prefix, part, count))
}

/// Every part of the split GGUF `file` belongs to, in order, each checked to exist; `None` when
/// the name is not a split name.
pub fn gguf_split_set(file: &Path) -> Result<Option<Vec<PathBuf>>, WeightsError> {
    let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
        return Ok(None);
    };
    let Some((prefix, _, count)) = split_name(name) else {
        return Ok(None);
    };
    let dir = parent_dir(file);
    let mut files = Vec::with_capacity(count as usize);
    for i in 1..=count {
        let p = dir.join(format!("{prefix}-{i:05}-of-{count:05}.gguf"));
        if !p.is_file() {
            return Err(layout(
                &p,
                format!("part {i} of the {count}-part split GGUF is missing"),
            ));
        }
        files.push(p);
    }
    Ok(Some(files))
}

/// The snapshot folder of a `models--org--name` cache entry: `refs/main`'s revision, else the
/// only snapshot.
pub fn cache_snapshot(parent: &Path) -> Result<PathBuf, WeightsError> {
    let snaps = parent.join("snapshots");
    let main = parent.join("refs").join("main");
    if main.is_file() {
        let rev = std::fs::read_to_string(&main).map_err(io(&main))?;
        let rev = rev.trim();
        if rev.is_empty() || !is_plain_name(rev) {
            return Err(layout(
                &main,
                format!("revision {rev:?} is not a snapshot name"),
            ));
        }
        let snap = snaps.join(rev);
        if !snap.is_dir() {
            return Err(layout(
                &snap,
                "refs/main names this snapshot but it is missing",
            ));
        }
        return Ok(snap);
    }
    let mut found = Vec::new();
    for e in std::fs::read_dir(&snaps).map_err(io(&snaps))? {
        let e = e.map_err(io(&snaps))?;
        if e.path().is_dir() {
            found.push(e.path());
        }
    }
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(layout(&snaps, "no snapshot in this cache entry")),
        n => Err(layout(
            &snaps,
            format!("{n} snapshots and no refs/main; pass the snapshot folder to load"),
        )),
    }
}

/// A single path component: no separators, not `.`/`..`.
fn is_plain_name(s: &str) -> bool {
    let p = Path::new(s);
    let mut c = p.components();
    matches!((c.next(), c.next()), (Some(Component::Normal(_)), None))
}

/// The shard files named by a sharded index's `weight_map`, each checked to exist.
fn index_shards(index: &Path, dir: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    let map = read_weight_map(index)?;
    let names: BTreeSet<&String> = map.iter().map(|(_, f)| f).collect();
    let mut files = Vec::with_capacity(names.len());
    for n in names {
        let f = dir.join(n);
        if !f.is_file() {
            return Err(layout(
                &f,
                format!("shard named by {INDEX_FILE} is missing (incomplete download?)"),
            ));
        }
        files.push(f);
    }
    if files.is_empty() {
        return Err(layout(index, "weight_map is empty"));
    }
    Ok(files)
}

/// `weight_map` of a sharded index as (tensor, shard file name) pairs. Shard names must be
/// relative paths inside the folder.
pub fn read_weight_map(index: &Path) -> Result<Vec<(String, String)>, WeightsError> {
    let text = std::fs::read(index).map_err(io(index))?;
    let json: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| WeightsError::Json {
            path: index.to_path_buf(),
            detail: e.to_string(),
        })?;
    let wm = json
        .get("weight_map")
        .and_then(|v| v.as_object())
        .ok_or_else(|| WeightsError::Json {
            path: index.to_path_buf(),
            detail: "no weight_map object".into(),
        })?;
    let mut out = Vec::with_capacity(wm.len());
    for (k, v) in wm {
        let f = v.as_str().ok_or_else(|| WeightsError::Json {
            path: index.to_path_buf(),
            detail: format!("weight_map[{k}] is not a string"),
        })?;
        let ok = !f.is_empty()
            && Path::new(f)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
        if !ok {
            return Err(layout(
                index,
                format!("shard name {f:?} leaves the checkpoint folder"),
            ));
        }
        out.push((k.clone(), f.to_string()));
    }
    Ok(out)
}
