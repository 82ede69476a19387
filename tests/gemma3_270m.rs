//! Real model end to end: the Gemma 3 270M Q4_K_M GGUF on the CPU backend must continue five
//! prompts greedily exactly as the independent numpy oracle (golden/gemma3_270m/oracle.py, float64
//! over the `gguf` package's dequantiser) did, up to the first step where the oracle's top-2
//! logits are near-tied.
//!
//! The GGUF comes from `scripts/fetch-assets.sh` into `$FUCINA_TEST_ASSETS` (default
//! `.cache/assets`); when it is absent the test fails and says so.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use fucina::arch;
use fucina::backend::cpu::CpuBackend;
use fucina::model::gemma::GemmaModel;
use fucina::model::registry::LoadOptions;
use fucina::model::{gemma3, Session};
use fucina::weights::Checkpoint;
use serde_json::Value;

const FILE: &str = "gemma-3-270m-q4_k_m.gguf";
/// Steps whose oracle top-1/top-2 gap is below this are treated as ties (f32 vs f64).
const NEAR_TIE: f64 = 0.05;

fn asset() -> PathBuf {
    let dir = std::env::var_os("FUCINA_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/assets"));
    let p = dir.join(FILE);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/fetch-assets.sh (or point FUCINA_TEST_ASSETS at its output)",
        p.display()
    );
    p
}

fn reference() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/gemma3_270m/reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).expect("reference.json")).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
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

fn load() -> Arc<GemmaModel<CpuBackend>> {
    let path = asset();
    let ckpt = Checkpoint::open(&path).expect("open GGUF");
    let det = arch::detect(&ckpt).expect("detect");
    assert_eq!(det.arch, arch::Arch::Gemma3);
    gemma3::load_model(
        &ckpt,
        &det,
        Arc::new(CpuBackend::new()),
        &LoadOptions {
            max_context: 256,
            ..Default::default()
        },
    )
    .expect("load")
}

#[test]
fn gemma3_270m_greedy_matches_oracle() {
    let doc = reference();
    let model = load();
    let mut compared = 0;
    for case in doc["cases"].as_array().expect("cases") {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let margins: Vec<f64> = case["top2_margins"]
            .as_array()
            .expect("margins")
            .iter()
            .map(|m| m.as_f64().expect("margin"))
            .collect();
        // Compare up to (not including) the first near-tied step.
        let upto = margins
            .iter()
            .position(|&m| m < NEAR_TIE)
            .unwrap_or(want.len());
        let mut s = model.session().expect("session");
        let mut logits = s.forward(&prompt, false).expect("prefill");
        let mut got = Vec::new();
        for _ in 0..upto {
            let t = argmax(logits.last());
            got.push(t);
            logits = s.forward(&[t], false).expect("decode");
        }
        assert_eq!(
            got,
            want[..upto],
            "{:?}: greedy ids differ from the oracle",
            case["text"]
        );
        compared += upto;
    }
    // The prompts were chosen so most steps are decisive; a vacuous pass is a failure.
    assert!(compared >= 40, "only {compared} steps were compared");
}

/// The oracle tokenised its prompts by whole-word lookup; the GGUF's own tokenizer must agree
/// (so the CLI's `-p "<text>"` reaches the same ids), and decode the continuations back to text.
#[test]
fn gemma3_270m_prompt_ids_match_the_gguf_tokenizer() {
    let ckpt = Checkpoint::open(&asset()).expect("open GGUF");
    let tok =
        fucina::tokenizer::Tokenizer::from_gguf(ckpt.gguf().expect("gguf")).expect("tokenizer");
    for case in reference()["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        assert_eq!(
            tok.encode(text, true).expect("encode"),
            ids(&case["prompt_ids"]),
            "{text:?}"
        );
    }
}

/// Decode speed on the CPU backend (run with `cargo test --release --test gemma3_270m -- --ignored
/// --nocapture`); prints tokens per second for 32 greedy steps after a short prompt.
#[test]
#[ignore]
fn gemma3_270m_decode_speed() {
    let model = load();
    let mut s = model.session().expect("session");
    let mut logits = s
        .forward(&[2, 818, 5279, 529, 7001, 563], false)
        .expect("prefill");
    let steps = 32;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    for _ in 0..steps {
        let t = argmax(logits.last());
        logits = s.forward(&[t], false).expect("decode");
    }
    let dt = t0.elapsed().as_secs_f64();
    println!(
        "gemma3 270M Q4_K_M CPU decode: {:.2} tok/s ({steps} steps in {dt:.2} s)",
        steps as f64 / dt
    );
    if let (Some(c0), Some(c1)) = (cpu0, cpu_seconds()) {
        // On a shared machine wall time understates the speed; CPU time per token does not.
        println!(
            "  CPU time {:.3} s per token (all threads)",
            (c1 - c0) / steps as f64
        );
    }
}

/// This process's user + system CPU time (Linux `/proc/self/stat`, clock ticks of 1/100 s).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The selftest's whole-model check of this file (`fucina::selftest::models::check_gemma3_270m`,
/// greedy text and logits) passes with the CPU backend on both sides.
#[test]
fn selftest_text_check_passes_on_cpu_against_cpu() {
    let a = Arc::new(CpuBackend::new());
    let r = fucina::selftest::models::check_gemma3_270m(&asset(), &a, &a.clone(), None);
    let rows = std::slice::from_ref(&r);
    assert!(r.pass, "{}", fucina::selftest::models::format_rows(rows));
    assert!(r.note.len() > 10, "{}", r.note);
}
