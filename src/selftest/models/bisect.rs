//! `fucina selftest --bisect MODEL`: one model run op by op on the backend under test and on the
//! CPU reference at once ([`crate::backend::diff::DiffBackend`]), every op's output compared, so
//! the first op whose output departs is where a deviation starts. With `--bisect-resync` each
//! op runs on the reference's inputs (its own error only). The tokens are a fidelity case's
//! longest prompt and HF's greedy continuation when MODEL is a `golden/fidelity/<case>` folder,
//! else `--bisect-tokens`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::backend::diff::{format_records, DiffBackend, OpRecord};
use crate::backend::Backend;

/// What to run.
#[derive(Debug, Clone)]
pub struct BisectPlan {
    /// A checkpoint (`-m`'s forms) or a fidelity case folder (its `hf/` is loaded).
    pub model: PathBuf,
    /// The prompt; empty: the case's longest sequence.
    pub tokens: Vec<u32>,
    /// One-token decode steps after the prompt.
    pub steps: usize,
    pub resync: bool,
    /// Rows below this relative error are not printed.
    pub threshold: f64,
}

/// The checkpoint, prompt and decode tokens of a plan.
fn inputs(plan: &BisectPlan) -> Result<(PathBuf, Vec<u32>, Vec<u32>), String> {
    let case_json = plan.model.join("golden.json");
    if case_json.is_file() {
        let cases = super::fidelity::load_cases(plan.model.parent().unwrap_or(Path::new(".")))?;
        let name = plan
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let case = cases
            .into_iter()
            .find(|c| Some(&c.name) == name.as_ref())
            .ok_or_else(|| format!("{}: not a fidelity case", plan.model.display()))?;
        let seq = case
            .sequences
            .iter()
            .max_by_key(|s| s.tokens.len())
            .ok_or("a case without sequences")?;
        let prompt = if plan.tokens.is_empty() {
            seq.tokens.clone()
        } else {
            plan.tokens.clone()
        };
        let next: Vec<u32> = seq
            .steps
            .iter()
            .map(|s| s.greedy)
            .take(plan.steps)
            .collect();
        return Ok((case.checkpoint(), prompt, next));
    }
    if plan.tokens.is_empty() {
        return Err("--bisect-tokens is needed for a model that is not a fidelity case".into());
    }
    // decode steps feed the prompt's tokens again, in order
    let next = plan
        .tokens
        .iter()
        .cycle()
        .take(plan.steps)
        .copied()
        .collect();
    Ok((plan.model.clone(), plan.tokens.clone(), next))
}

/// Run the plan on `reference` and `test`; returns every record and the report text.
pub fn run<R: Backend, T: Backend>(
    reference: R,
    test: T,
    plan: &BisectPlan,
) -> Result<(Vec<OpRecord>, String), String> {
    let (ckpt, prompt, next) = inputs(plan)?;
    let diff = Arc::new(DiffBackend::new(reference, test, plan.resync));
    let m = super::load(&ckpt, diff.clone(), prompt.len() + next.len() + 64)?;
    let mut s = m.new_session();
    s.forward(&prompt, false)
        .map_err(|e| format!("prefill: {e}"))?;
    for (i, &t) in next.iter().enumerate() {
        s.forward(&[t], false)
            .map_err(|e| format!("decode step {i}: {e}"))?;
    }
    let recs = diff.take_records();
    let mut text = format!(
        "bisect {}: prompt of {} tokens, {} decode steps, {} ops compared{}\n",
        ckpt.display(),
        prompt.len(),
        next.len(),
        recs.len(),
        if plan.resync {
            " (resynced: each op's own error)"
        } else {
            " (errors accumulate)"
        }
    );
    text.push_str(&format_records(&recs, plan.threshold));
    Ok((recs, text))
}

/// `fucina selftest --bisect` on the GPU: the CUDA backend with `kv` against the CPU.
pub fn run_gpu(
    ordinal: usize,
    kv: crate::backend::cuda::KvType,
    plan: &BisectPlan,
) -> anyhow::Result<bool> {
    let gpu = crate::backend::cuda::CudaBackend::new(ordinal, kv)?;
    let cpu = crate::backend::cpu::CpuBackend::new();
    match run(cpu, gpu, plan) {
        Ok((_, text)) => {
            print!("{text}");
            Ok(true)
        }
        Err(e) => {
            println!("bisect: {e}");
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    #[test]
    fn bisect_names_the_ops_that_depart() {
        // A Q8_0 golden model: the int8-activation CPU backend departs in the projections only.
        let model = super::super::golden_root().join("qwen3/model.q8_0.gguf");
        let plan = BisectPlan {
            model,
            tokens: vec![3, 17, 40, 41],
            steps: 2,
            resync: true,
            threshold: 0.0,
        };
        let (recs, text) = run(CpuBackend::new(), CpuBackend::int8(), &plan).unwrap();
        let passes = recs.iter().map(|r| r.pass).max().unwrap() + 1;
        assert_eq!(passes, 3, "prefill and two decode steps:\n{text}");
        for r in &recs {
            let linear = r.op.contains("linear") || r.op.contains("glu");
            assert!(
                linear || r.max_abs == 0.0,
                "only projections depart when resynced: {r:?}\n{text}"
            );
        }
        assert!(recs.iter().any(|r| r.max_abs > 0.0), "{text}");
        let same = run(CpuBackend::new(), CpuBackend::new(), &plan).unwrap().0;
        assert!(same.iter().all(|r| r.max_abs == 0.0));
    }
}
