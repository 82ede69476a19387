//! The dependency picture of `src/`: each top-level module uses only modules of its own layer or
//! below (a `crate::x` path anywhere in its files, tests included). Lowest first:
//!
//! | layer | modules |
//! |---|---|
//! | 0 | `kernels` (the generated registry), `tuning`, `assets` |
//! | 1 | `quant`, `gguf`, `weights`, `ops` (formats and reference math) |
//! | 2 | `sampling`, `arch`, `tokenizer` |
//! | 3 | `backend` |
//! | 4 | `model` |
//! | 5 | `engine` |
//! | 6 | `chat` |
//! | 7 | `server` |
//! | 8 | `bench`, `selftest` |
//! | 9 | `cli` |
//!
//! So the backend imports nothing above it, the engine sits above the model, and only the CLI
//! knows the commands. A new module gets a layer here.

use std::collections::BTreeMap;
use std::path::Path;

const LAYERS: &[(&str, u32)] = &[
    ("kernels", 0),
    ("tuning", 0),
    ("assets", 0),
    ("quant", 1),
    ("gguf", 1),
    ("weights", 1),
    ("ops", 1),
    ("sampling", 2),
    ("arch", 2),
    ("tokenizer", 2),
    ("backend", 3),
    ("model", 4),
    ("engine", 5),
    ("chat", 6),
    ("server", 7),
    ("bench", 8),
    ("selftest", 8),
    ("cli", 9),
];

fn layer(m: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _)| *n == m).map(|&(_, l)| l)
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level modules `text` names as `crate::x` (macros, `crate::x!`, left out).
fn crate_refs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `my_crate::`
        }
        let rest = &text[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && !rest[name.len()..].starts_with('!') {
            out.push(name);
        }
    }
    out
}

#[test]
fn modules_use_only_their_layer_and_below() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = BTreeMap::new();
    let mut unknown = Vec::new();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if matches!(name.as_str(), "lib" | "main") {
            continue;
        }
        let Some(own) = layer(&name) else {
            unknown.push(name);
            continue;
        };
        let mut files = Vec::new();
        if p.is_dir() {
            rust_files(&p, &mut files);
        } else {
            files.push(p.clone());
        }
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for r in crate_refs(&text) {
                match layer(&r) {
                    Some(l) if l > own => {
                        let rel = f.strip_prefix(&src).unwrap().display().to_string();
                        violations
                            .entry(format!("{name} (layer {own}) -> {r} (layer {l})"))
                            .or_insert_with(Vec::new)
                            .push(rel);
                    }
                    Some(_) => {}
                    // crate-root items (macros re-exported as paths, `crate::Error`...)
                    None => {}
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "top-level modules without a layer in tests/layering.rs: {unknown:?}"
    );
    assert!(
        violations.is_empty(),
        "imports against the layering:\n{}",
        violations
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                v.dedup();
                format!("  {k}: {}", v.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn crate_paths_are_found() {
    assert_eq!(
        crate_refs("use crate::backend::{A, B};\nlet x = crate::bk!(y); $crate::ops::f"),
        vec!["backend".to_string()]
    );
}

/// Every `.rs` file under `dir` (recursively) with its module path relative to `dir`
/// (`ops::attention::kv`; a folder's `mod.rs` is the folder's path).
fn module_files(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        let path = if prefix.is_empty() {
            stem.clone()
        } else {
            format!("{prefix}::{stem}")
        };
        if p.is_dir() {
            module_files(&p, &path, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let key = if stem == "mod" {
                prefix.to_string()
            } else {
                path
            };
            let text = std::fs::read_to_string(&p).unwrap();
            out.entry(key).or_default().push_str(&text);
        }
    }
}

/// The modules of `modules` (paths below `src/backend/cuda`) that `text`, the text of module
/// `me`, names: `crate::backend::cuda::<path>` or `super::<path>` (resolved against `me`; a
/// `super::` inside a `mod tests` is the file itself and names nothing new). A path names the
/// longest known module it starts with.
fn module_refs(me: &str, text: &str, modules: &[String]) -> Vec<String> {
    let code = match text.find("mod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let parent: Vec<&str> = me.split("::").filter(|s| !s.is_empty()).collect();
    let parent = &parent[..parent.len().saturating_sub(1)];
    let mut out = Vec::new();
    for pat in ["crate::backend::cuda::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(pat) {
            let tail = &rest[at + pat.len()..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let mut segs: Vec<String> = if pat == "super::" {
                // `super::super::x` climbs twice
                let mut base: Vec<&str> = parent.to_vec();
                let mut path = &tail[..end];
                while let Some(p) = path.strip_prefix("super::") {
                    base.pop();
                    path = p;
                }
                base.iter()
                    .map(|s| s.to_string())
                    .chain(path.split("::").map(String::from))
                    .collect()
            } else {
                tail[..end].split("::").map(String::from).collect()
            };
            while !segs.is_empty() {
                let cand = segs.join("::");
                if modules.contains(&cand) {
                    if cand != me && !out.contains(&cand) {
                        out.push(cand);
                    }
                    break;
                }
                segs.pop();
            }
            rest = &tail[end..];
        }
    }
    out
}

/// The CUDA backend's modules import each other without a loop and only downwards: `runtime`
/// (device, memory, graphs, tensor types, a resolved kernel) names nothing of `ops` or
/// `backend`, `ops` (one folder per op family) nothing of `backend`, and the graph of module
/// references between the files of `src/backend/cuda` is acyclic, so each can be read (and
/// moved) on its own.
#[test]
fn cuda_modules_have_no_import_loops() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/cuda");
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    module_files(&dir, "", &mut files);
    files.remove(""); // cuda/mod.rs: re-exports only
    let modules: Vec<String> = files.keys().cloned().collect();
    let graph: BTreeMap<String, Vec<String>> = files
        .iter()
        .map(|(m, text)| {
            // a folder's mod.rs declares its children: not a use of them
            let refs = module_refs(m, text, &modules)
                .into_iter()
                .filter(|r| !r.starts_with(&format!("{m}::")))
                .collect();
            (m.clone(), refs)
        })
        .collect();
    let rank = |m: &str| match m.split("::").next() {
        Some("runtime") => 0,
        Some("ops") => 1,
        _ => 2,
    };
    for (m, refs) in &graph {
        for r in refs {
            assert!(
                rank(r) <= rank(m),
                "src/backend/cuda: {m} names {r}, a module above it (runtime < ops < backend)"
            );
        }
    }
    // depth-first search; a grey node reached again closes a loop
    fn visit(
        m: &str,
        g: &BTreeMap<String, Vec<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for n in g.get(m).into_iter().flatten() {
            match state.get(n) {
                Some(1) => {
                    let at = path.iter().position(|p| p == n).unwrap();
                    let mut cycle = path[at..].to_vec();
                    cycle.push(n.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(n, g, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in graph.keys() {
        if state.contains_key(m) {
            continue;
        }
        if let Some(c) = visit(m, &graph, &mut state, &mut Vec::new()) {
            panic!("import loop in src/backend/cuda: {}", c.join(" -> "));
        }
    }
}

#[test]
fn module_paths_are_found() {
    let m: Vec<String> = [
        "runtime::buf",
        "ops::attention::kv",
        "ops::attention::launch",
        "backend",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        module_refs(
            "ops::attention::decode",
            "use super::kv::X; use crate::backend::cuda::runtime::buf::DevBuf; super::super::super::CudaDevice",
            &m
        ),
        vec!["runtime::buf".to_string(), "ops::attention::kv".to_string()]
    );
    // inside the file's tests, super:: is the file
    assert!(module_refs(
        "ops::attention::kv",
        "mod tests { use super::launch::Y; }",
        &m
    )
    .is_empty());
}
