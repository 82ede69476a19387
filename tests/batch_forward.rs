//! Batch invariance on the CPU: a sequence run in a step together with other sequences (of other
//! lengths, some in their prompt, some decoding) gets exactly the logits it gets alone, for
//! every golden architecture (attention, sliding-window rings, KV sharing, MoE, Gated DeltaNet).
//! Every op of a step either works row by row or runs per sequence, so the equality is bitwise.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fucina::model::{CausalLm, Session};
use serde_json::Value;

const DECODE: usize = 4;

fn load(dir: &Path) -> Arc<dyn CausalLm> {
    let rel = dir
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .expect("under the tree");
    common::cpu_model(&rel.join("hf").to_string_lossy())
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// Three prompts of different lengths from the case's first sequence.
fn prompts(json: &Value) -> Vec<Vec<u32>> {
    let toks: Vec<u32> = json["sequences"][0]["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect();
    assert!(toks.len() >= 4, "a golden sequence of at least 4 tokens");
    let mut b: Vec<u32> = toks[..toks.len() / 2].to_vec();
    b.reverse();
    vec![toks.clone(), b, toks[1..].to_vec()]
}

/// Logits of the last prompt token and of `DECODE` greedy steps, for `p` alone.
fn alone(model: &Arc<dyn CausalLm>, p: &[u32]) -> Vec<Vec<f32>> {
    let mut s = model.clone().new_session();
    let mut out = vec![s.forward(p, false).unwrap().last().to_vec()];
    for _ in 0..DECODE {
        let next = argmax(out.last().unwrap());
        out.push(s.forward(&[next], false).unwrap().last().to_vec());
    }
    out
}

/// The same sequences batched, staggered: sequence `j` starts at step `j`, so steps mix prompts
/// and decodes; returns each sequence's logits in order.
fn batched(model: &Arc<dyn CausalLm>, ps: &[Vec<u32>]) -> (Vec<Vec<Vec<f32>>>, usize) {
    let mut sessions: Vec<Box<dyn Session>> =
        ps.iter().map(|_| model.clone().new_session()).collect();
    let mut out: Vec<Vec<Vec<f32>>> = vec![Vec::new(); ps.len()];
    let mut widest = 0;
    for step in 0..ps.len() + DECODE {
        let mut idx = Vec::new();
        let mut toks: Vec<Vec<u32>> = Vec::new();
        for (j, p) in ps.iter().enumerate() {
            if step < j || out[j].len() > DECODE {
                continue;
            }
            idx.push(j);
            toks.push(match out[j].last() {
                None => p.clone(),
                Some(l) => vec![argmax(l)],
            });
        }
        widest = widest.max(idx.len());
        let mut refs: Vec<&mut dyn Session> = Vec::new();
        for (j, s) in sessions.iter_mut().enumerate() {
            if idx.contains(&j) {
                refs.push(&mut **s);
            }
        }
        let t: Vec<&[u32]> = toks.iter().map(|t| t.as_slice()).collect();
        let r = model.forward_batch(&mut refs, &t);
        for (&j, l) in idx.iter().zip(r) {
            let l = l.unwrap_or_else(|e| panic!("sequence {j} at step {step}: {e}"));
            assert_eq!(l.rows, 1);
            out[j].push(l.last().to_vec());
        }
    }
    (out, widest)
}

#[test]
fn a_sequence_in_a_batch_computes_what_it_computes_alone() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/models");
    let mut checked = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let Ok(text) = std::fs::read_to_string(dir.join("golden.json")) else {
            continue;
        };
        let json: Value = serde_json::from_str(&text).unwrap();
        if json["kind"].as_str().unwrap_or("causal_lm") != "causal_lm" || !dir.join("hf").exists() {
            continue;
        }
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let model = load(&dir);
        let ps = prompts(&json);
        let want: Vec<_> = ps.iter().map(|p| alone(&model, p)).collect();
        let (got, widest) = batched(&model, &ps);
        assert_eq!(widest, ps.len(), "{name}: every sequence shares a step");
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{name} sequence {j}");
            for (t, (a, b)) in g.iter().zip(w).enumerate() {
                assert!(
                    a == b,
                    "{name} sequence {j} step {t}: batched logits differ from alone (max diff {})",
                    a.iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max)
                );
            }
        }
        checked.push(name);
    }
    for must in [
        "qwen3",
        "qwen3moe",
        "qwen35",
        "gemma3",
        "gemma4",
        "gemma4_e4b",
    ] {
        assert!(
            checked.iter().any(|c| c == must),
            "{must} was not checked: {checked:?}"
        );
    }
}

#[test]
fn a_bad_sequence_fails_alone() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/models/qwen3");
    let model = load(&root);
    let vocab = model.info().vocab_size as u32;
    let mut a = model.clone().new_session();
    let mut b = model.clone().new_session();
    let mut c = model.clone().new_session();
    let want = model
        .clone()
        .new_session()
        .forward(&[1, 2, 3], false)
        .unwrap();
    let mut refs: Vec<&mut dyn Session> = vec![&mut *a, &mut *b, &mut *c];
    let r = model.forward_batch(&mut refs, &[&[1, 2, 3], &[vocab], &[]]);
    assert_eq!(r[0].as_ref().unwrap().data, want.data);
    assert!(r[1]
        .as_ref()
        .unwrap_err()
        .to_string()
        .contains("outside the vocabulary"));
    assert!(r[2].is_err());
    assert_eq!((a.len(), b.len(), c.len()), (3, 0, 0));
    // a token list per session
    let mut refs: Vec<&mut dyn Session> = vec![&mut *b, &mut *c];
    assert!(model
        .forward_batch(&mut refs, &[&[1]])
        .iter()
        .all(|r| r.is_err()));
}
