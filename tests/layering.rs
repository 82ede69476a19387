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

/// The modules of one folder (`src/backend/cuda`'s files) that `text` names as
/// `super::<module>` or `crate::backend::cuda::<module>`.
fn sibling_refs(text: &str, modules: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for pat in ["super::", "crate::backend::cuda::"] {
        let mut rest = text;
        while let Some(at) = rest.find(pat) {
            let tail = &rest[at + pat.len()..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            let name = &tail[..end];
            if modules.iter().any(|m| m == name) && !out.iter().any(|o| o == name) {
                out.push(name.to_string());
            }
            rest = &tail[end..];
        }
    }
    out
}

/// The CUDA backend's launch modules import each other without a loop, so each can be read
/// (and moved) on its own: the graph of `super::<module>` references between the files of
/// `src/backend/cuda` is acyclic (`backend/`, the `Backend` implementation on top of them, is
/// one node).
#[test]
fn cuda_modules_have_no_import_loops() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/backend/cuda");
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.extension().is_some_and(|x| x == "rs") && stem != "mod" {
            files.insert(stem, std::fs::read_to_string(&p).unwrap());
        }
    }
    let modules: Vec<String> = files.keys().cloned().collect();
    let graph: BTreeMap<String, Vec<String>> = files
        .iter()
        .map(|(m, text)| {
            let refs = sibling_refs(text, &modules)
                .into_iter()
                .filter(|r| r != m)
                .collect();
            (m.clone(), refs)
        })
        .collect();
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
fn sibling_paths_are_found() {
    let m = vec!["buf".to_string(), "kv".to_string()];
    assert_eq!(
        sibling_refs(
            "use super::buf::DevBuf; super::kv::f(); super::CudaDevice",
            &m
        ),
        vec!["buf".to_string(), "kv".to_string()]
    );
}
