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
