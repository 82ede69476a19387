//! Sliding-window rings (`KvShape::ring`) through whole models: golden Gemma models whose
//! sliding layers keep rings of 64 positions (passes of 8 tokens, window 4) on the backend under
//! test, against the same files keeping the whole context on the reference backend. A 100-token
//! prompt and 80 greedy steps wrap each ring about three times; every row's logits of the prompt
//! come through one pass per chunk. The session's own sampler (on the GPU: pipelined steps) must
//! draw the same tokens; a rewind inside the rings' reach must give the logits of the first pass
//! again, and one past it must be refused.

use std::path::Path;
use std::sync::Arc;

use super::synth::session_greedy;
use super::{compare_greedy, golden_root, greedy_verdict, Bounds, ModelRow};
use crate::arch::{self, Arch};
use crate::backend::Backend;
use crate::model::gemma::GemmaModel;
use crate::model::registry::LoadOptions;
use crate::model::{CausalLm, ModelError};
use crate::weights::Checkpoint;

/// Golden cases run with rings (Gemma 3, Gemma 4, Gemma 4 with layers sharing K/V).
pub const RING_CASES: [&str; 3] = ["gemma3_gguf", "gemma4", "gemma4_e4b"];
/// Tokens per pass on the ring model: rings of `ring_slots(4, 8)` = 64 positions.
const CHUNK: usize = 8;
const PROMPT_LEN: usize = 100;
const STEPS: usize = 80;

/// A Gemma file loaded with `rings` on or off, passes of [`CHUNK`] tokens.
pub fn load_gemma<B: Backend>(
    path: &Path,
    b: Arc<B>,
    rings: bool,
) -> Result<Arc<GemmaModel<B>>, String> {
    let e = |x: &dyn std::fmt::Display| format!("{}: {x}", path.display());
    let ckpt = Checkpoint::open(path).map_err(|x| e(&x))?;
    let det = arch::detect(&ckpt).map_err(|x| e(&x))?;
    let opts = LoadOptions {
        max_context: 512,
        ..Default::default()
    };
    let mut m = match det.arch {
        Arch::Gemma3 => crate::model::gemma3::load_model(&ckpt, &det, b, &opts),
        Arch::Gemma4 => crate::model::gemma4::load_model(&ckpt, &det, b, &opts),
        a => return Err(e(&format!("{a:?} is not a Gemma text model"))),
    }
    .map_err(|x| e(&x))?;
    let mm = Arc::get_mut(&mut m).ok_or_else(|| e(&"model shared at load"))?;
    mm.set_passes(CHUNK, rings);
    if rings && mm.ring().is_none() {
        return Err(e(&"no sliding layer keeps a ring"));
    }
    Ok(m)
}

/// One row per case in [`RING_CASES`].
pub fn ring_rows<T: Backend, R: Backend>(test: &Arc<T>, reference: &Arc<R>) -> Vec<ModelRow> {
    RING_CASES
        .iter()
        .map(|case| {
            let name = format!("{case}/gguf rings vs {} whole", reference.name());
            let path = golden_root().join(case).join("model.gguf");
            match ring_row(&path, test, reference) {
                Ok(r) => ModelRow { name, ..r },
                Err(e) => ModelRow::failed(name, e),
            }
        })
        .collect()
}

fn ring_row<T: Backend, R: Backend>(
    path: &Path,
    test: &Arc<T>,
    reference: &Arc<R>,
) -> Result<ModelRow, String> {
    let mt = load_gemma(path, test.clone(), true)?;
    let mr = load_gemma(path, reference.clone(), false)?;
    let vocab = mt.spec.vocab as u32;
    let prompt: Vec<u32> = (0..PROMPT_LEN as u32)
        .map(|i| (i * 131 + 7) % vocab)
        .collect();
    let (dt, dr): (Arc<dyn CausalLm>, Arc<dyn CausalLm>) = (mt.clone(), mr);
    let c = compare_greedy(&dt, &dr, &prompt, STEPS)?;
    let bound = Bounds::for_case(&mt.info.arch).vs_ref;
    let (pass, tie) = greedy_verdict(&c, bound);
    let drawn = session_greedy(&dt, &prompt, STEPS)?;
    if let Some(i) = (0..drawn.len()).find(|&i| drawn.get(i) != c.test.get(i)) {
        return Err(format!(
            "session-sampled greedy token {i} is {:?}, the logits' argmax {:?}",
            drawn.get(i),
            c.test.get(i)
        ));
    }
    let rewind = check_rewind(&dt, &prompt)?;
    let note = match tie {
        None => format!("{} tokens equal", c.test.len()),
        Some((step, gap, excused)) => format!(
            "equal for {step} tokens, then {} (reference top-2 gap {gap:.3})",
            if excused {
                "a near-tie"
            } else {
                "a difference"
            }
        ),
    };
    Ok(ModelRow {
        name: String::new(),
        max_abs: c.err.abs,
        max_rel: c.err.rel,
        bound,
        pass: pass && rewind.0 <= bound,
        note: format!(
            "{note}; {} session-sampled tokens equal; rewind by 20: rel err {:.1e}, by 90: refused",
            drawn.len(),
            rewind.0
        ),
    })
}

/// Prefill `prompt`, rewind 20 tokens and prefill them again: the relative error of the last
/// logits against the first pass's (same chunks, so 0 on a deterministic backend). A rewind of
/// 90 (past the rings' reach) must be refused with `ModelError::Rewind`, leaving the session
/// usable.
fn check_rewind(m: &Arc<dyn CausalLm>, prompt: &[u32]) -> Result<(f64,), String> {
    let mut s = m.clone().new_session();
    let first = s.forward(prompt, false).map_err(|e| e.to_string())?;
    let n = prompt.len();
    s.rewind(n - 20)
        .map_err(|e| format!("rewind by 20 refused: {e}"))?;
    let again = s
        .forward(&prompt[n - 20..], false)
        .map_err(|e| e.to_string())?;
    let scale = first
        .last()
        .iter()
        .fold(0f32, |a, v| a.max(v.abs()))
        .max(1e-30);
    let err = first
        .last()
        .iter()
        .zip(again.last())
        .map(|(a, b)| (a - b).abs())
        .fold(
            0f32,
            |a, v| if v.is_nan() { f32::INFINITY } else { a.max(v) },
        );
    match s.rewind(n - 90) {
        Err(ModelError::Rewind { .. }) => {}
        Ok(()) => return Err("a rewind by 90 past the rings was accepted".into()),
        Err(e) => return Err(format!("a rewind by 90: {e}")),
    }
    // still usable after the refusal
    s.forward(&[1], false)
        .map_err(|e| format!("after a refused rewind: {e}"))?;
    Ok(((err / scale) as f64,))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    /// On the CPU, rings against the whole context: the same logits (same chunks, same keys in
    /// the same order), the same tokens, exact rewinds.
    #[test]
    fn cpu_rings_equal_the_whole_context() {
        let cpu = Arc::new(CpuBackend::new());
        let rows = ring_rows(&cpu, &cpu.clone());
        let t = super::super::format_rows(&rows);
        eprintln!("{t}");
        assert_eq!(rows.len(), RING_CASES.len());
        for r in &rows {
            assert!(r.pass, "{t}");
            assert!(r.max_rel < 1e-5, "{t}");
            assert!(r.note.contains("rel err 0.0e0"), "{t}");
        }
    }

    #[test]
    fn ring_models_have_rings_and_whole_ones_do_not() {
        let cpu = Arc::new(CpuBackend::new());
        let p = golden_root().join("gemma4/model.gguf");
        let r = load_gemma(&p, cpu.clone(), true).unwrap();
        assert_eq!(r.ring(), Some(64));
        assert_eq!(r.info.kv_fixed_elems % 64, 0);
        assert!(r.info.kv_fixed_elems > 0);
        let w = load_gemma(&p, cpu, false).unwrap();
        assert_eq!(w.ring(), None);
    }
}
