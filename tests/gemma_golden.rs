//! Gemma golden cases (golden/models/{gemma3,gemma4,gemma4-assistant}/*, made by
//! golden/gemma_cases.py with HF transformers 5.17): tiny random models, every parameter
//! randomised, in the HF text layout, the multimodal wrapper layout and llama.cpp's GGUF layout.
//! The CPU backend must match the reference logits (relative error <= the case's tolerance) for
//! whole sequences, and reproduce the reference greedy continuation decoding token by token
//! (which exercises the KV cache, sliding windows, KV sharing and rewinds).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fucina::arch::{self, Arch};
use fucina::backend::cpu::CpuBackend;
use fucina::backend::Backend;
use fucina::model::gemma::GemmaModel;
use fucina::model::gemma4::assistant::Gemma4Assistant;
use fucina::model::registry::LoadOptions;
use fucina::model::{gemma3, gemma4, Session};
use fucina::weights::Checkpoint;
use serde_json::Value;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/models")
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// max |a - b| / max |b|
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let num = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let den = b.iter().map(|y| y.abs()).fold(0f32, f32::max).max(1e-6);
    num / den
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn load(path: &Path) -> Arc<GemmaModel<CpuBackend>> {
    let ckpt = Checkpoint::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let det = arch::detect(&ckpt).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let be = Arc::new(CpuBackend::new());
    let opts = LoadOptions { max_context: 64 };
    let m = match det.arch {
        Arch::Gemma3 => gemma3::load_model(&ckpt, &det, be, &opts),
        Arch::Gemma4 => gemma4::load_model(&ckpt, &det, be, &opts),
        other => panic!("{}: detected {other:?}", path.display()),
    };
    m.unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Check one case; returns the largest relative error seen.
fn check_case(dir: &Path) -> f32 {
    let doc = read_json(&dir.join("reference.json"));
    let tol = doc["tolerance"].as_f64().unwrap_or(1e-3) as f32;
    let model = load(&dir.join(doc["checkpoint"].as_str().expect("checkpoint")));
    let mut worst = 0f32;
    for seq in doc["sequences"].as_array().expect("sequences") {
        let prompt = ids(&seq["ids"]);
        let want: Vec<Vec<f32>> = seq["logits"]
            .as_array()
            .expect("logits")
            .iter()
            .map(floats)
            .collect();

        // whole sequence at once
        let mut s = model.session().expect("session");
        let got = s.forward(&prompt, true).expect("forward");
        assert_eq!(got.rows, prompt.len());
        for (r, w) in want.iter().enumerate() {
            let e = rel_err(got.row(r), w);
            worst = worst.max(e);
            assert!(
                e <= tol,
                "{}: position {r}: relative error {e} > {tol}",
                dir.display()
            );
        }

        // greedy continuation, one token at a time, after a split prefill
        let greedy = ids(&seq["greedy"]);
        let mut s = model.session().expect("session");
        let split = prompt.len() / 2;
        s.forward(&prompt[..split], false).expect("prefill 1");
        // rewind and redo part of it: the cache must come back exactly
        s.rewind(split - 1).expect("rewind");
        s.forward(&prompt[split - 1..split], false)
            .expect("re-prefill");
        let mut last = s.forward(&prompt[split..], false).expect("prefill 2");
        let mut out = Vec::new();
        for _ in 0..greedy.len() {
            let t = argmax(last.last());
            out.push(t);
            last = s.forward(&[t], false).expect("decode");
        }
        assert_eq!(
            out,
            greedy,
            "{}: greedy continuation of {prompt:?}",
            dir.display()
        );
    }
    worst
}

fn case_dirs(arch: &str) -> Vec<PathBuf> {
    let root = golden_dir().join(arch);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.join("reference.json").exists())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no golden cases under {}", root.display());
    v
}

fn run_arch(arch: &str) {
    for dir in case_dirs(arch) {
        let e = check_case(&dir);
        println!(
            "{}: max relative error {e:.2e}",
            dir.strip_prefix(golden_dir()).unwrap_or(&dir).display()
        );
    }
}

#[test]
fn gemma3_golden() {
    run_arch("gemma3");
}

#[test]
fn gemma4_golden() {
    run_arch("gemma4");
}

#[test]
fn gemma4_assistant_golden() {
    for dir in case_dirs("gemma4-assistant") {
        let doc = read_json(&dir.join("reference.json"));
        let tol = doc["tolerance"].as_f64().unwrap_or(1e-3) as f32;
        let target = load(&dir.join(doc["target"].as_str().expect("target")));
        let apath = dir.join(doc["checkpoint"].as_str().expect("checkpoint"));
        let ckpt = Checkpoint::open(&apath).expect("assistant checkpoint");
        let det = arch::detect(&ckpt).expect("detect assistant");
        assert_eq!(det.arch, Arch::Gemma4Assistant);
        let asst = Gemma4Assistant::load(&ckpt, &det, Arc::clone(&target.backend), &target.spec)
            .expect("load assistant");
        let be = &*target.backend;
        let mut worst = 0f32;
        for seq in doc["sequences"].as_array().expect("sequences") {
            let prompt = ids(&seq["ids"]);
            let mut s = target.session().expect("session");
            let l = s.forward(&prompt, false).expect("target forward");
            let e = rel_err(l.last(), &floats(&seq["target_last_logits"]));
            assert!(e <= tol, "target logits: relative error {e}");
            let mut hidden = be
                .slice_rows(s.last_hidden().expect("hidden"), 0, 1)
                .expect("copy");
            for (k, step) in seq["draft_steps"]
                .as_array()
                .expect("steps")
                .iter()
                .enumerate()
            {
                let tok = step["token"].as_u64().expect("token") as u32;
                let pos = step["position"].as_u64().expect("position") as usize;
                let d = asst.draft(&s, tok, &hidden, pos).expect("draft");
                let el = rel_err(d.logits.last(), &floats(&step["logits"]));
                let eh = rel_err(
                    &be.to_host(&d.hidden).expect("host"),
                    &floats(&step["hidden"]),
                );
                worst = worst.max(el).max(eh);
                assert!(
                    el <= tol && eh <= tol,
                    "draft step {k}: logits {el}, hidden {eh} (tol {tol})"
                );
                hidden = d.hidden;
            }
        }
        println!("{}: max relative error {worst:.2e}", dir.display());
    }
}

/// Every registered Gemma architecture has at least one golden case.
#[test]
fn gemma_golden_coverage() {
    for a in ["gemma3", "gemma4", "gemma4-assistant"] {
        assert!(!case_dirs(a).is_empty());
    }
}
