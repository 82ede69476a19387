//! Whole random-weight models at the tiny bench shapes (`src/bench/presets.rs`: 256-wide hidden
//! state, 512-wide FFN), written by the bench synthesiser. Their Q4_0 / Q4_K matrices have rows
//! of whole 256-element groups, so the CUDA backend repacks them at upload (`q4_0r` / `q4_kr`)
//! and these rows run the repacked GEMVs, embeddings and fused projections through whole
//! forwards (the golden models' rows are too short to repack). The backend under test against a
//! reference over a 6-token prompt (every linear a GEMV) and [`GREEDY_STEPS`] greedy steps, as
//! the Gemma 3 270M row: logits within the bound, tokens equal or first differing at a near tie.

use std::path::PathBuf;
use std::sync::Arc;

use super::{compare_greedy, greedy_verdict, load, Bounds, ModelRow, GREEDY_STEPS};
use crate::backend::Backend;
use crate::bench::presets;
use crate::bench::synth::{self, FileQuant};
use crate::model::CausalLm;
use crate::sampling::SamplingParams;

/// (preset, file type) of each row.
pub const SYNTH_CASES: [(&str, FileQuant); 4] = [
    ("tiny-qwen3", FileQuant::Q4_0),
    ("tiny-qwen3", FileQuant::Q4KM),
    ("tiny-gemma4", FileQuant::Q4_0),
    // F32 router, Q4_K gate/up, Q4_K and Q6_K down: the fused decode MoE kernels
    ("tiny-qwen3moe", FileQuant::Q4KM),
];

/// The prompt: 6 token ids inside every tiny preset's vocabulary.
const PROMPT: [u32; 6] = [2, 17, 101, 5, 300, 42];

/// A file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// One row per [`SYNTH_CASES`] entry: `test` against `reference`.
pub fn check_synth<T: Backend, R: Backend>(test: &Arc<T>, reference: &Arc<R>) -> Vec<ModelRow> {
    check_cases(&SYNTH_CASES, "", test, reference)
}

/// One row per case, named `synth KEY QUANT greedy` and `suffix`.
fn check_cases<T: Backend, R: Backend>(
    cases: &[(&str, FileQuant)],
    suffix: &str,
    test: &Arc<T>,
    reference: &Arc<R>,
) -> Vec<ModelRow> {
    cases
        .iter()
        .map(|&(key, q)| {
            let name = format!("synth {key} {} greedy{suffix}", q.name());
            check_one(key, q, test, reference)
                .map(|mut r| {
                    r.name = name.clone();
                    r
                })
                .unwrap_or_else(|e| ModelRow::failed(name, e))
        })
        .collect()
}

/// The tiny Qwen3 files whose decode the deferred RMSNorm reaches when forced
/// (`CudaBackend::with_defer_norm`): both sites after q4_0r and q8_0r projections, the gate|up
/// one after Q4_K_M's q4_kr o_proj (its down projections are Q6_K). The default leaves most of
/// these composed, so [`check_synth`] does not cover the deferred path.
pub const DEFERRED_CASES: [(&str, FileQuant); 3] = [
    ("tiny-qwen3", FileQuant::Q4_0),
    ("tiny-qwen3", FileQuant::Q8_0),
    ("tiny-qwen3", FileQuant::Q4KM),
];

/// One row per [`DEFERRED_CASES`] entry: `test` (a backend deferring every norm its kernels
/// take) against `reference`.
pub fn check_deferred<T: Backend, R: Backend>(test: &Arc<T>, reference: &Arc<R>) -> Vec<ModelRow> {
    check_cases(&DEFERRED_CASES, ", deferred norms", test, reference)
}

/// The tiny Qwen3 files at head dim 128 (the decode attention's tensor-core entries).
pub const HD128_CASES: [(&str, FileQuant); 2] = [
    ("tiny-qwen3-hd128", FileQuant::Q4_0),
    ("tiny-qwen3-hd128", FileQuant::Q4KM),
];

/// One row per [`HD128_CASES`] entry: `test` against `reference`.
pub fn check_hd128<T: Backend, R: Backend>(test: &Arc<T>, reference: &Arc<R>) -> Vec<ModelRow> {
    check_cases(&HD128_CASES, "", test, reference)
}

fn check_one<T: Backend, R: Backend>(
    key: &str,
    q: FileQuant,
    test: &Arc<T>,
    reference: &Arc<R>,
) -> Result<ModelRow, String> {
    let p = presets::find(key).ok_or_else(|| format!("no preset {key}"))?;
    let path = std::env::temp_dir().join(format!(
        "fucina-selftest-{}-{key}-{}.gguf",
        std::process::id(),
        q.name()
    ));
    let file = TempFile(path);
    synth::write(p, q, None, &file.0, 11).map_err(|e| e.to_string())?;
    let mt = load(&file.0, test.clone(), 256)?;
    let mr = load(&file.0, reference.clone(), 256)?;
    let c = compare_greedy(&mt, &mr, &PROMPT, GREEDY_STEPS)?;
    // the same greedy steps drawn by the session's own sampler (on the GPU: pipelined, each
    // step queued fed with the id the previous one drew) must pick the host argmax's tokens
    let drawn = session_greedy(&mt, &PROMPT, GREEDY_STEPS)?;
    let bound = Bounds::for_case(p.arch).vs_ref;
    let (pass, tie) = greedy_verdict(&c, bound);
    if let Some(i) = (0..drawn.len()).find(|&i| drawn.get(i) != c.test.get(i)) {
        return Ok(ModelRow {
            name: String::new(),
            max_abs: c.err.abs,
            max_rel: c.err.rel,
            bound,
            pass: false,
            note: format!(
                "session-sampled greedy token {i} is {:?}, the logits' argmax {:?}",
                drawn.get(i),
                c.test.get(i)
            ),
        });
    }
    let note =
        match tie {
            None => format!("{} tokens equal", c.test.len()),
            Some((step, gap, excused)) => format!(
            "equal for {step} tokens, then {} (reference top-2 gap {gap:.3}, max abs err {:.3})",
            if excused { "a near-tie" } else { "a difference" },
            c.err.abs
        ),
        };
    Ok(ModelRow {
        name: String::new(),
        max_abs: c.err.abs,
        max_rel: c.err.rel,
        bound,
        pass,
        note: format!("{note}; {} session-sampled tokens equal", drawn.len()),
    })
}

/// `steps` greedy tokens after `prompt` drawn by the session's sampler (`forward_sample`).
pub(in crate::selftest) fn session_greedy(
    m: &Arc<dyn CausalLm>,
    prompt: &[u32],
    steps: usize,
) -> Result<Vec<u32>, String> {
    let mut s = m.clone().new_session();
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let vocab = m.info().vocab_size;
    let mut sampler = s
        .sampler(&greedy, prompt, vocab)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(steps);
    let mut t = s
        .forward_sample(prompt, sampler.as_mut(), &[])
        .map_err(|e| format!("session prefill: {e}"))?;
    out.push(t);
    while out.len() < steps {
        t = s
            .forward_sample(&[t], sampler.as_mut(), &[])
            .map_err(|e| format!("session decode: {e}"))?;
        out.push(t);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    /// On the CPU against itself every row passes with zero error (the harness, the synthesised
    /// files and their loading; the GPU rows run in `fucina selftest`).
    #[test]
    fn cpu_against_cpu_passes() {
        let a = Arc::new(CpuBackend::int8());
        let rows = check_synth(&a, &a.clone());
        assert_eq!(rows.len(), SYNTH_CASES.len());
        let deferred = check_deferred(&a, &a.clone());
        assert_eq!(deferred.len(), DEFERRED_CASES.len());
        let hd128 = check_hd128(&a, &a.clone());
        assert_eq!(hd128.len(), HD128_CASES.len());
        for r in rows.iter().chain(&deferred).chain(&hd128) {
            assert!(r.pass && r.max_abs == 0.0, "{}: {}", r.name, r.note);
            assert!(r.note.contains("32 tokens equal"), "{}", r.note);
        }
    }
}
