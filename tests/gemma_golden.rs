//! Gemma golden cases (golden/models/gemma*/, made by golden/gemma_cases.py through
//! golden/make_golden.py with HF transformers 5.17): tiny random models, every parameter
//! randomised, in the HF text layout, the multimodal wrapper layout and llama.cpp's GGUF layout.
//! The CPU backend must match the reference logits (relative error <= the case's tolerance) for
//! whole sequences, and reproduce the reference greedy continuation decoding token by token after
//! a prefill split by a rewind (KV cache, sliding windows, KV sharing). The MTP assistant case
//! checks the draft head's logits and projected hidden state over the target's cache.

use fucina::backend::{Ops, Runtime};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fucina::arch::{self, Arch};
use fucina::backend::cpu::CpuBackend;
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

/// max |a - b| / max |b| (the selftest's golden metric).
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    fucina::ops::compare::PeakErr::of(a, b).rel as f32
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
    let opts = LoadOptions {
        max_context: 64,
        ..Default::default()
    };
    let m = match det.arch {
        Arch::Gemma3 => gemma3::load_model(&ckpt, &det, be, &opts),
        Arch::Gemma4 => gemma4::load_model(&ckpt, &det, be, &opts),
        other => panic!("{}: detected {other:?}", path.display()),
    };
    m.unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Check one checkpoint form of a case; returns the largest relative error seen.
fn check_form(doc: &Value, path: &Path) -> f32 {
    let tol = doc["tolerance"].as_f64().unwrap_or(1e-3) as f32;
    let model = load(path);
    assert_eq!(
        model.info.arch,
        doc["arch"].as_str().expect("arch"),
        "{}",
        path.display()
    );
    let mut worst = 0f32;
    for seq in doc["sequences"].as_array().expect("sequences") {
        let prompt = ids(&seq["tokens"]);
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
                path.display()
            );
        }

        // greedy continuation, one token at a time, after a prefill split by a rewind
        let Some(g) = seq.get("greedy") else { continue };
        let greedy = ids(&g["tokens"]);
        let gaps = floats(&g["top2_gap"]);
        let scale = want
            .last()
            .map_or(1.0, |r| r.iter().fold(0f32, |m, v| m.max(v.abs())));
        let mut s = model.session().expect("session");
        let mut last = if prompt.len() >= 4 {
            let split = prompt.len() / 2;
            s.forward(&prompt[..split], false).expect("prefill 1");
            s.rewind(split - 1).expect("rewind");
            s.forward(&prompt[split - 1..split], false)
                .expect("re-prefill");
            s.forward(&prompt[split..], false).expect("prefill 2")
        } else {
            s.forward(&prompt, false).expect("prefill")
        };
        for (step, &w) in greedy.iter().enumerate() {
            let t = argmax(last.last());
            if t != w {
                // only a near tie in the reference excuses a different choice
                assert!(
                    gaps[step] < 2.0 * tol * scale,
                    "{}: greedy step {step} of {prompt:?}: got {t}, HF {w} (gap {})",
                    path.display(),
                    gaps[step]
                );
                break;
            }
            last = s.forward(&[t], false).expect("decode");
        }
    }
    worst
}

/// The Gemma cases of the given architecture (golden/models/gemma*/golden.json).
fn cases(arch: &str) -> Vec<(PathBuf, Value)> {
    let root = golden_dir();
    let mut v: Vec<(PathBuf, Value)> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("gemma"))
        })
        .filter(|p| p.join("golden.json").exists())
        .map(|p| {
            let doc = read_json(&p.join("golden.json"));
            (p, doc)
        })
        .filter(|(_, d)| d["arch"].as_str() == Some(arch))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        !v.is_empty(),
        "no {arch} golden case under {}",
        root.display()
    );
    v
}

fn run_arch(arch: &str) {
    for (dir, doc) in cases(arch) {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let e = check_form(&doc, &dir.join("hf"));
        println!("{name} hf: max relative error {e:.2e}");
        if let Some(g) = doc["gguf"].as_str() {
            let e = check_form(&doc, &dir.join(g));
            println!("{name} gguf: max relative error {e:.2e}");
        }
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
    for (dir, doc) in cases("gemma4-assistant") {
        let tol = doc["tolerance"].as_f64().unwrap_or(1e-3) as f32;
        let target = load(&dir.join(doc["target"].as_str().expect("target")));
        let apath = dir.join("hf");
        let ckpt = Checkpoint::open(&apath).expect("assistant checkpoint");
        let det = arch::detect(&ckpt).expect("detect assistant");
        assert_eq!(det.arch, Arch::Gemma4Assistant);
        let asst = Gemma4Assistant::load(&ckpt, &det, Arc::clone(&target.backend), &target.spec)
            .expect("load assistant");
        let be = &*target.backend;
        let mut worst = 0f32;
        for seq in doc["sequences"].as_array().expect("sequences") {
            let prompt = ids(&seq["tokens"]);
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
        assert!(!cases(a).is_empty());
    }
}
