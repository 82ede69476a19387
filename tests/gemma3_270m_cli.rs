//! The one-shot CLI on the real Gemma 3 270M Q4_K_M GGUF, CPU backend:
//! `fucina -m <gguf> --device cpu --raw -p "<text>" -n 16 --temp 0` prints the same greedy
//! continuation as the independent numpy oracle (`golden/gemma3_270m/oracle.py`, whose ids are
//! in `reference.json`), compared up to each prompt's first near-tied step.
//!
//! The GGUF comes from `scripts/fetch-assets.sh` into `$FUCINA_TEST_ASSETS` (default
//! `.cache/assets`); when it is absent the test fails and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use fucina::tokenizer::Tokenizer;
use fucina::weights::Checkpoint;
use serde_json::Value;

/// Steps whose reference top-2 logit gap is below this are not compared (nor anything after).
const NEAR_TIE: f64 = 0.05;

fn asset() -> PathBuf {
    let dir = std::env::var_os("FUCINA_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/assets"));
    let p = dir.join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.exists(),
        "{} is missing: run scripts/fetch-assets.sh (or point FUCINA_TEST_ASSETS at its output)",
        p.display()
    );
    p
}

#[test]
fn cli_greedy_text_matches_the_oracle() {
    let gguf = asset();
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/gemma3_270m/reference.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let ckpt = Checkpoint::open(&gguf).unwrap();
    let tok = Tokenizer::from_gguf(ckpt.gguf().unwrap()).unwrap();
    let mut compared = 0;
    for case in reference["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let greedy: Vec<u32> = case["greedy_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let margins: Vec<f64> = case["top2_margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let trusted = margins.iter().take_while(|&&m| m >= NEAR_TIE).count();
        if trusted == 0 {
            continue;
        }
        let want = tok.decode(&greedy[..trusted], false).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_fucina"))
            .arg("-m")
            .arg(&gguf)
            .args([
                "--device", "cpu", "--raw", "-p", text, "-n", "16", "--temp", "0",
            ])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text:?}: exit {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.starts_with(&want),
            "{text:?}: CLI printed {stdout:?}, oracle's first {trusted} greedy tokens are {want:?}"
        );
        compared += trusted;
    }
    assert!(compared >= 40, "only {compared} steps were comparable");
}
