//! The batched forward on the GPU against the CPU: three sequences of different lengths,
//! staggered (sequence j starts at step j, so steps mix prompts and decodes), run through
//! `CausalLm::forward_batch` on both backends; each step's logits of each sequence are compared
//! with the golden metric, both fed the CPU's greedy tokens (teacher-forced, so a near-tie does
//! not end the comparison). The CPU's batch equals its sequences alone bitwise
//! (tests/batch_forward.rs), so this holds the GPU's batched pass to the reference.

use std::path::Path;
use std::sync::Arc;

use super::{golden_root, load, ModelRow};
use crate::backend::Backend;
use crate::model::{CausalLm, Session};
use crate::ops::compare::PeakErr;

const DECODE: usize = 6;
const BOUND: f64 = 5e-2;

/// The golden cases checked (one per attention layout: plain, MoE, sliding rings, KV sharing).
const CASES: &[&str] = &["qwen3", "qwen3moe", "gemma3", "gemma4", "gemma4_e4b"];

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// One step of the staggered batch over `sessions` (those with `tokens`), each row's logits.
fn step(
    lm: &Arc<dyn CausalLm>,
    sessions: &mut [Box<dyn Session>],
    tokens: &[Option<Vec<u32>>],
) -> Result<Vec<Option<Vec<f32>>>, String> {
    let mut refs: Vec<&mut dyn Session> = Vec::new();
    let mut toks: Vec<&[u32]> = Vec::new();
    for (s, t) in sessions.iter_mut().zip(tokens) {
        if let Some(t) = t {
            refs.push(&mut **s);
            toks.push(t);
        }
    }
    let mut out = lm.forward_batch(&mut refs, &toks).into_iter();
    tokens
        .iter()
        .map(|t| match t {
            None => Ok(None),
            Some(_) => match out.next() {
                Some(Ok(l)) => Ok(Some(l.last().to_vec())),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("a row missing from the batch".into()),
            },
        })
        .collect()
}

fn check_case(
    gpu: &Arc<dyn CausalLm>,
    cpu: &Arc<dyn CausalLm>,
    prompt: &[u32],
) -> Result<PeakErr, String> {
    let mut rev = prompt[..prompt.len() / 2].to_vec();
    rev.reverse();
    let prompts = [prompt.to_vec(), rev, prompt[1..].to_vec()];
    let n = prompts.len();
    let mut sg: Vec<Box<dyn Session>> = (0..n).map(|_| gpu.clone().new_session()).collect();
    let mut sc: Vec<Box<dyn Session>> = (0..n).map(|_| cpu.clone().new_session()).collect();
    let mut fed = vec![0usize; n];
    let mut next: Vec<Option<u32>> = vec![None; n];
    let mut err = PeakErr::default();
    for t in 0..n + DECODE {
        let tokens: Vec<Option<Vec<u32>>> = (0..n)
            .map(|j| {
                if t < j || fed[j] > DECODE {
                    None
                } else {
                    Some(match next[j] {
                        None => prompts[j].clone(),
                        Some(id) => vec![id],
                    })
                }
            })
            .collect();
        let lg = step(gpu, &mut sg, &tokens)?;
        let lc = step(cpu, &mut sc, &tokens)?;
        for j in 0..n {
            if let (Some(g), Some(c)) = (&lg[j], &lc[j]) {
                err.add(g, c.iter().map(|&v| v as f64));
                next[j] = Some(argmax(c));
                fed[j] += 1;
            }
        }
    }
    Ok(err)
}

/// One row per golden case: the GPU's batched pass against the CPU's, each case on a backend
/// from `gpu` (a fresh one per case where the backend lays caches out by the first model's
/// shapes, as the CUDA backend's KV arena does); `how` names the GPU's way in the row.
pub fn batch_rows<G: Backend, C: Backend>(
    gpu: impl Fn() -> Result<Arc<G>, String>,
    cpu: &Arc<C>,
    how: &str,
) -> Vec<ModelRow> {
    let root = golden_root();
    CASES
        .iter()
        .map(|&case| {
            let name = format!("{case} batched (3 staggered, {how}) vs cpu");
            let dir = root.join(case);
            let r = (|| {
                let json: serde_json::Value = serde_json::from_str(
                    &std::fs::read_to_string(dir.join("golden.json")).map_err(|e| e.to_string())?,
                )
                .map_err(|e| e.to_string())?;
                let prompt: Vec<u32> = json["sequences"][0]["tokens"]
                    .as_array()
                    .ok_or("no golden tokens")?
                    .iter()
                    .filter_map(|v| v.as_u64().map(|v| v as u32))
                    .collect();
                let path: &Path = &dir.join("hf");
                let g = load(path, gpu()?, 256)?;
                let c = load(path, cpu.clone(), 256)?;
                check_case(&g, &c, &prompt)
            })();
            match r {
                Ok(e) => ModelRow {
                    name,
                    max_abs: e.abs,
                    max_rel: e.rel,
                    bound: BOUND,
                    pass: e.rel <= BOUND,
                    note: format!("{} rows of 3 sequences, teacher-forced", 3 * (DECODE + 1)),
                },
                Err(e) => ModelRow::failed(name, e),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    /// The CPU against itself: the row machinery runs and reports zero error.
    #[test]
    fn cpu_against_cpu_is_exact() {
        let cpu = Arc::new(CpuBackend::new());
        let rows = batch_rows(|| Ok(cpu.clone()), &cpu, "cpu");
        assert_eq!(rows.len(), CASES.len());
        for r in rows {
            assert!(r.pass && r.max_rel == 0.0, "{} {}", r.name, r.note);
        }
    }
}
