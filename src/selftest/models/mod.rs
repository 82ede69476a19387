//! Whole-model checks of `fucina selftest`: a backend under test against the golden HF logits
//! (golden/models/*, made by golden/make_golden.py) and against a reference backend (the CPU),
//! and the real Gemma 3 270M's greedy text on both. Generic over the two backends, so a
//! CPU-against-CPU run proves the harness on a machine without a GPU.
//!
//! Metric (as the golden tests): per position, max_i |got_i - want_i| / max_i |want_i| over the
//! vocabulary; a row reports the maximum over positions and sequences, and the max abs error.

mod batch;
pub mod bisect;
pub mod fidelity;
mod ring;
mod synth;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::backend::Backend;
use crate::model::registry::{load_model, LoadOptions};
use crate::model::{CausalLm, Logits};
use crate::ops::compare::PeakErr;
use crate::weights::Checkpoint;

/// Greedy steps the backend under test must reproduce from the reference backend.
pub const GREEDY_STEPS: usize = 32;

/// Bounds on the relative logit error (see the module doc) of the backend under test.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Against the HF golden logits.
    pub vs_hf: f64,
    /// Against the reference backend.
    pub vs_ref: f64,
}

impl Bounds {
    /// The bounds for a GPU backend (int8-quantised activations in block-format GEMVs, f16/fp8
    /// KV, f32 accumulation): 5e-2 relative for attention models; the tiny random Qwen3.5
    /// hybrids amplify perturbations ~10x through the delta rule (tests/golden_models.rs
    /// measures 0.2 for int8 activations alone), so 0.25 there.
    pub fn for_case(arch: &str) -> Bounds {
        if arch.starts_with("qwen35") {
            Bounds {
                vs_hf: 0.25,
                vs_ref: 0.25,
            }
        } else {
            Bounds {
                vs_hf: 5e-2,
                vs_ref: 5e-2,
            }
        }
    }
}

/// One table row.
#[derive(Debug, Clone)]
pub struct ModelRow {
    pub name: String,
    pub max_abs: f64,
    pub max_rel: f64,
    pub bound: f64,
    pub pass: bool,
    pub note: String,
}

impl ModelRow {
    pub(in crate::selftest) fn failed(name: String, note: String) -> ModelRow {
        ModelRow {
            name,
            max_abs: f64::NAN,
            max_rel: f64::NAN,
            bound: f64::NAN,
            pass: false,
            note,
        }
    }
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

/// Gap between the two largest values.
fn top2_gap(x: &[f32]) -> f64 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in x {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    (a - b) as f64
}

pub(in crate::selftest) fn load<B: Backend>(
    path: &Path,
    b: Arc<B>,
    ctx: usize,
) -> Result<Arc<dyn CausalLm>, String> {
    let ckpt = Checkpoint::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    load_model(
        &ckpt,
        b,
        &LoadOptions {
            max_context: ctx,
            ..Default::default()
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))
}

/// Prefill `prompt` on both models, then decode greedily `steps` tokens on each (each feeding
/// its own choice). Returns the errors of `test` against `reference` over the prefill and the
/// steps where both still agree, both token lists, and the reference's top-2 gap at the first
/// divergence.
pub struct GreedyCmp {
    pub err: PeakErr,
    pub test: Vec<u32>,
    pub reference: Vec<u32>,
    pub gap_at_divergence: Option<(usize, f64, f64)>,
}

pub fn compare_greedy(
    test: &Arc<dyn CausalLm>,
    reference: &Arc<dyn CausalLm>,
    prompt: &[u32],
    steps: usize,
) -> Result<GreedyCmp, String> {
    let mut st = test.clone().new_session();
    let mut sr = reference.clone().new_session();
    let e = |w: &str, x: crate::model::ModelError| format!("{w}: {x}");
    let lt = st.forward(prompt, true).map_err(|x| e("test prefill", x))?;
    let lr = sr
        .forward(prompt, true)
        .map_err(|x| e("reference prefill", x))?;
    let mut err = PeakErr::default();
    for p in 0..lr.rows {
        err.add(lt.row(p), lr.row(p).iter().map(|&v| v as f64));
    }
    let (mut out_t, mut out_r) = (Vec::new(), Vec::new());
    let (mut last_t, mut last_r): (Logits, Logits) = (lt, lr);
    let mut gap = None;
    for step in 0..steps {
        let (nt, nr) = (argmax(last_t.last()), argmax(last_r.last()));
        out_t.push(nt);
        out_r.push(nr);
        if nt != nr && gap.is_none() {
            let scale = last_r.last().iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            gap = Some((step, top2_gap(last_r.last()), scale));
        }
        if step + 1 == steps {
            break;
        }
        last_t = st.forward(&[nt], false).map_err(|x| e("test decode", x))?;
        last_r = sr
            .forward(&[nr], false)
            .map_err(|x| e("reference decode", x))?;
        if gap.is_none() {
            err.add(last_t.last(), last_r.last().iter().map(|&v| v as f64));
        }
    }
    Ok(GreedyCmp {
        err,
        test: out_t,
        reference: out_r,
        gap_at_divergence: gap,
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_u64())
                .map(|t| t as u32)
                .collect()
        })
        .unwrap_or_default()
}

/// Rows for one golden case: for each checkpoint form (HF folder, GGUF, Q8_0 GGUF), the backend
/// under test against HF's logits (and HF's greedy tokens, a near-tie in HF excusing a
/// different pick), and against the reference backend (logits, and identical greedy tokens for
/// [`GREEDY_STEPS`] steps from each sequence).
pub fn check_case<T: Backend, R: Backend>(
    name: &str,
    dir: &Path,
    json: &Value,
    test: &Arc<T>,
    reference: &Arc<R>,
) -> Vec<ModelRow> {
    let arch = json["arch"].as_str().unwrap_or("");
    let bounds = Bounds::for_case(arch);
    let mut forms: Vec<(&str, PathBuf, &str)> = vec![("hf", dir.join("hf"), "logits")];
    if let Some(g) = json["gguf"].as_str() {
        forms.push(("gguf", dir.join(g), "logits"));
    }
    if let Some(g) = json["gguf_q8_0"].as_str() {
        forms.push(("q8_0", dir.join(g), "logits_q8_0"));
    }
    let seqs = json["sequences"].as_array().cloned().unwrap_or_default();
    let mut rows = Vec::new();
    for (form, path, key) in forms {
        let label = format!("{name}/{form}");
        let (mt, mr) = match (
            load(&path, test.clone(), 256),
            load(&path, reference.clone(), 256),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                rows.push(ModelRow::failed(format!("{label} load"), e));
                continue;
            }
        };
        // against HF
        let mut hf = PeakErr::default();
        let mut note = String::new();
        let mut ok = true;
        let mut vs_ref = PeakErr::default();
        let mut greedy_note = Vec::new();
        let mut greedy_ok = true;
        let mut compared = 0usize;
        for (si, seq) in seqs.iter().enumerate() {
            let toks = ids(&seq["tokens"]);
            let Some(want) = seq[key].as_array().or_else(|| seq["logits"].as_array()) else {
                continue;
            };
            let mut s = mt.clone().new_session();
            let got = match s.forward(&toks, true) {
                Ok(g) => g,
                Err(e) => {
                    ok = false;
                    note = format!("seq {si}: {e}");
                    break;
                }
            };
            for (p, w) in want.iter().enumerate().take(got.rows) {
                let w: Vec<f64> = w
                    .as_array()
                    .map(|r| r.iter().filter_map(|v| v.as_f64()).collect())
                    .unwrap_or_default();
                if w.len() != got.vocab {
                    ok = false;
                    note = format!("seq {si}: vocab {} vs golden {}", got.vocab, w.len());
                    break;
                }
                hf.add(got.row(p), w.iter().copied());
            }
            if let (Some(g), "logits") = (seq.get("greedy"), key) {
                let want_t = ids(&g["tokens"]);
                let gaps: Vec<f64> = g["top2_gap"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
                    .unwrap_or_default();
                let scale = want.last().and_then(|r| r.as_array()).map_or(1.0, |r| {
                    r.iter()
                        .filter_map(|v| v.as_f64())
                        .fold(0f64, |m, v| m.max(v.abs()))
                });
                let mut next = argmax(got.last());
                for (step, &w) in want_t.iter().enumerate() {
                    if next != w {
                        if gaps.get(step).copied().unwrap_or(0.0) < 2.0 * bounds.vs_hf * scale {
                            break; // a near-tie in HF
                        }
                        ok = false;
                        note = format!("seq {si} HF greedy step {step}: got {next}, HF {w}");
                        break;
                    }
                    match s.forward(&[next], false) {
                        Ok(l) => next = argmax(l.last()),
                        Err(e) => {
                            ok = false;
                            note = format!("seq {si} decode: {e}");
                            break;
                        }
                    }
                }
            }
            // against the reference backend
            match compare_greedy(&mt, &mr, &toks, GREEDY_STEPS) {
                Ok(c) => {
                    compared += 1;
                    vs_ref.rel = vs_ref.rel.max(c.err.rel);
                    vs_ref.abs = vs_ref.abs.max(c.err.abs);
                    if let Some((step, gap, _)) = c.gap_at_divergence {
                        greedy_ok = false;
                        greedy_note.push(format!("seq {si}: greedy differs at step {step} (reference top-2 gap {gap:.2e})"));
                    }
                }
                Err(e) => {
                    greedy_ok = false;
                    greedy_note.push(format!("seq {si}: {e}"));
                }
            }
        }
        let hf_pass = ok && hf.rel <= bounds.vs_hf;
        rows.push(ModelRow {
            name: format!("{label} vs HF"),
            max_abs: hf.abs,
            max_rel: hf.rel,
            bound: bounds.vs_hf,
            pass: hf_pass,
            note: note.clone(),
        });
        if compared == 0 && greedy_note.is_empty() {
            greedy_note.push(if note.is_empty() {
                "no sequence compared".into()
            } else {
                format!("not compared: {note}")
            });
        }
        let ref_pass = greedy_ok && compared > 0 && vs_ref.rel <= bounds.vs_ref;
        rows.push(ModelRow {
            name: format!(
                "{label} vs {} ({GREEDY_STEPS} greedy)",
                reference_name(reference)
            ),
            max_abs: vs_ref.abs,
            max_rel: vs_ref.rel,
            bound: bounds.vs_ref,
            pass: ref_pass,
            note: greedy_note.join("; "),
        });
    }
    rows
}

fn reference_name<R: Backend>(r: &Arc<R>) -> &'static str {
    r.name()
}

/// `selftest --golden-dir` and `--assets-dir` (set once, before the checks run).
static DIRS: std::sync::OnceLock<(Option<PathBuf>, Option<PathBuf>)> = std::sync::OnceLock::new();

/// Where [`golden_root`] and [`gemma3_270m_path`] look first.
pub fn set_dirs(golden: Option<PathBuf>, assets: Option<PathBuf>) {
    let _ = DIRS.set((golden, assets));
}

/// The golden cases: `--golden-dir`, else the source tree's golden/models, else
/// ./golden/models.
pub fn golden_root() -> PathBuf {
    if let Some(d) = DIRS.get().and_then(|d| d.0.clone()) {
        return d;
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/models");
    if built.is_dir() {
        built
    } else {
        PathBuf::from("golden/models")
    }
}

/// Every golden case of kind causal_lm: (name, dir, json). Others (the MTP assistant) are
/// returned as skipped names.
pub fn golden_cases(root: &Path) -> (Vec<(String, PathBuf, Value)>, Vec<String>) {
    let (mut out, mut skipped) = (Vec::new(), Vec::new());
    let Ok(rd) = std::fs::read_dir(root) else {
        return (out, skipped);
    };
    for e in rd.flatten() {
        let dir = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(json) = std::fs::read_to_string(dir.join("golden.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        else {
            continue;
        };
        if json["kind"].as_str().unwrap_or("causal_lm") == "causal_lm" {
            out.push((name, dir, json));
        } else {
            skipped.push(name);
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    (out, skipped)
}

/// Logit bound of the Gemma 3 270M rows whose test backend keeps its KV cache in FP8 E4M3
/// (the reference's is f32). E4M3 keeps 3 mantissa bits (up to 6.25% rounding error per cached
/// value), so on top of the f16-cache drift (3.3-3.6% on the H200) the logits move by a few
/// percent more: measured 4.3% and 5.1% with two decode-attention kernels of different
/// summation order, both with equal (or near-tie-excused) text.
pub const FP8_KV_270M_BOUND: f64 = 1e-1;

/// Whether a greedy comparison passes at `bound`, and its first divergence (step, reference
/// top-2 gap, excused). Two backends with different arithmetic (int8/bf16 activations, f16/FP8
/// KV, summation order) agree on the tokens until a step where the reference's top two logits
/// are closer than the logit error measured up to there: there either pick is right. Such a step
/// is reported and excused; any other difference fails.
pub(in crate::selftest) fn greedy_verdict(
    c: &GreedyCmp,
    bound: f64,
) -> (bool, Option<(usize, f64, bool)>) {
    let tie = c
        .gap_at_divergence
        .map(|(step, gap, _)| (step, gap, gap < 2.0 * c.err.abs));
    let equal = c.test == c.reference;
    (
        c.err.rel <= bound && (equal || tie.is_some_and(|t| t.2)),
        tie,
    )
}

/// The real Gemma 3 270M: greedy text of the backend under test equals the reference's for
/// [`GREEDY_STEPS`] tokens, logits within `bound` (None: the golden Gemma 3 bound).
pub fn check_gemma3_270m<T: Backend, R: Backend>(
    path: &Path,
    test: &Arc<T>,
    reference: &Arc<R>,
    bound: Option<f64>,
) -> ModelRow {
    let name = "gemma-3-270m greedy text".to_string();
    let run = || -> Result<ModelRow, String> {
        let ckpt = Checkpoint::open(path).map_err(|e| e.to_string())?;
        let tok = crate::tokenizer::load_for_checkpoint(&ckpt, None).map_err(|e| e.to_string())?;
        let prompt = tok
            .encode("The capital of France is", true)
            .map_err(|e| e.to_string())?;
        let mt = load(path, test.clone(), 512)?;
        let mr = load(path, reference.clone(), 512)?;
        let c = compare_greedy(&mt, &mr, &prompt, GREEDY_STEPS)?;
        let tt = tok.decode(&c.test, false).map_err(|e| e.to_string())?;
        let tr = tok.decode(&c.reference, false).map_err(|e| e.to_string())?;
        let bound = bound.unwrap_or(Bounds::for_case("gemma3").vs_ref);
        let (pass, tie) = greedy_verdict(&c, bound);
        let equal = tt == tr;
        // the same text from different token ids also passes
        let pass = pass || (equal && c.err.rel <= bound);
        let note = match (equal, tie) {
            (true, _) => format!("{tt:?}"),
            (false, Some((step, gap, true))) => format!(
                "equal for {step} tokens, then a near-tie (reference top-2 gap {gap:.3} < 2 x max abs err {:.3}): test {tt:?} / reference {tr:?}",
                c.err.abs
            ),
            (false, Some((step, gap, false))) => format!(
                "differs at token {step} (reference top-2 gap {gap:.3}): test {tt:?} != reference {tr:?}"
            ),
            (false, None) => format!("test {tt:?} != reference {tr:?}"),
        };
        Ok(ModelRow {
            name: name.clone(),
            max_abs: c.err.abs,
            max_rel: c.err.rel,
            bound,
            pass,
            note,
        })
    };
    run().unwrap_or_else(|e| ModelRow::failed(name.clone(), e))
}

/// The Gemma 3 270M file: in `--assets-dir` if there, else the default model (fetched).
pub fn gemma3_270m_path() -> Result<PathBuf, String> {
    if let Some(d) = DIRS.get().and_then(|d| d.1.clone()) {
        let p = d.join(crate::assets::DEFAULT_MODEL_FILE);
        if p.is_file() {
            return Ok(p);
        }
    }
    crate::assets::default_model_path().map_err(|e| e.to_string())
}

/// Every model row for `test` against `reference`.
pub fn check_all<T: Backend, R: Backend>(test: &Arc<T>, reference: &Arc<R>) -> Vec<ModelRow> {
    let mut rows = check_all_except(test, reference, &[], "");
    rows.push(gemma3_270m_row(test, reference, None));
    rows
}

fn gemma3_270m_row<T: Backend, R: Backend>(
    test: &Arc<T>,
    reference: &Arc<R>,
    bound: Option<f64>,
) -> ModelRow {
    match gemma3_270m_path() {
        Ok(p) => check_gemma3_270m(&p, test, reference, bound),
        Err(e) => ModelRow::failed(
            "gemma-3-270m greedy text".into(),
            format!("no model file: {e}"),
        ),
    }
}

/// [`check_all`] without the cases whose architecture is in `except` (told on stderr with
/// `why`).
pub fn check_all_except<T: Backend, R: Backend>(
    test: &Arc<T>,
    reference: &Arc<R>,
    except: &[&str],
    why: &str,
) -> Vec<ModelRow> {
    let root = golden_root();
    let (mut cases, skipped) = golden_cases(&root);
    cases.retain(|(name, _, json)| {
        let arch = json["arch"].as_str().unwrap_or("");
        let keep = !except.contains(&arch);
        if !keep {
            eprintln!("selftest models: {name} ({arch}) not checked here: {why}");
        }
        keep
    });
    let mut rows = Vec::new();
    if cases.is_empty() {
        rows.push(ModelRow::failed(
            "golden cases".into(),
            format!("none under {}", root.display()),
        ));
    }
    for (name, dir, json) in &cases {
        rows.extend(check_case(name, dir, json, test, reference));
    }
    for s in skipped {
        eprintln!("selftest models: {s}: not a stand-alone causal LM, checked by its own test");
    }
    rows
}

/// The model table, in the kernel table's style.
pub fn format_rows(rows: &[ModelRow]) -> String {
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(8).max(8);
    let mut s = format!(
        "{:<w$}  {:>12}  {:>12}  {:>8}  {:>4}  note\n",
        "model check", "max abs err", "max rel err", "bound", "pass"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<w$}  {:>12.3e}  {:>12.3e}  {:>8.1e}  {:>4}  {}\n",
            r.name,
            r.max_abs,
            r.max_rel,
            r.bound,
            if r.pass { "PASS" } else { "FAIL" },
            r.note
        ));
    }
    s
}

/// The GPU run, the only place that names the CUDA backend: with an F16 KV cache, every golden
/// case and the Gemma 3 270M text against the CPU backend (the bounds of [`Bounds`]); then with
/// the default FP8 E4M3 cache, the Gemma 3 270M text again (a differing text there is reported,
/// with the logit error, as its own row).
pub fn run_gpu(ordinal: usize) -> Vec<ModelRow> {
    use crate::backend::cuda::{CudaBackend, KvType};
    let cpu = Arc::new(crate::backend::cpu::CpuBackend::new());
    let cpu_int8 = Arc::new(crate::backend::cpu::CpuBackend::int8());
    let mut rows = Vec::new();
    for kv in [KvType::F16, KvType::Fp8E4m3] {
        let tag = format!("kv {kv}");
        let gpu = match CudaBackend::new(ordinal, kv) {
            Ok(g) => Arc::new(g),
            Err(e) => {
                rows.push(ModelRow::failed(
                    format!("[{tag}] cuda backend"),
                    e.to_string(),
                ));
                continue;
            }
        };
        // The real Q4_K_M model against the CPU backend with the GPU's GEMV numerics (int8
        // activations per 32, as llama.cpp): the f32 reference drifts by ~3e-2 relative on
        // this file and a near-tie then changes the greedy text (measured on the H200).
        let mut part = if kv == KvType::F16 {
            check_all_except(
                &gpu,
                &cpu,
                &["qwen35", "qwen35moe"],
                "Gated DeltaNet layers do not run on the CUDA backend yet (CPU: tests/golden_models.rs)",
            )
        } else {
            Vec::new()
        };
        if kv == KvType::F16 {
            // whole models whose Q4_0 / Q4_K weights are repacked at upload
            part.extend(synth::check_synth(&gpu, &cpu_int8));
            // the same files' decode with every norm deferred that the kernels take
            match CudaBackend::new(ordinal, kv) {
                Ok(g) => part.extend(synth::check_deferred(
                    &Arc::new(g.with_defer_norm(true)),
                    &cpu_int8,
                )),
                Err(e) => part.push(ModelRow::failed(
                    "deferred-norm backend".into(),
                    e.to_string(),
                )),
            }
            // head dim 128 files (the decode attention's tensor-core entries)
            part.extend(synth::check_hd128(&gpu, &cpu_int8));
            // sliding-window rings wrapped several times, against the whole context
            part.extend(ring::ring_rows(&gpu, &cpu));
            // steps of several sequences (prompts and decodes mixed): caches of their own (a
            // launch per sequence), then in a KV arena (a layer's K/V writes and decode
            // attention of every sequence in one launch each)
            part.extend(batch::batch_rows(|| Ok(gpu.clone()), &cpu, "own caches"));
            part.extend(batch::batch_rows(
                || {
                    let g = CudaBackend::new(ordinal, kv).map_err(|e| e.to_string())?;
                    g.reserve_kv_slots(4);
                    Ok(Arc::new(g))
                },
                &cpu,
                "kv arena",
            ));
        }
        let bound = (kv == KvType::Fp8E4m3).then_some(FP8_KV_270M_BOUND);
        part.push(gemma3_270m_row(&gpu, &cpu_int8, bound));
        rows.extend(part.into_iter().map(|mut r| {
            r.name = format!("[{tag}] {}", r.name);
            r
        }));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;

    /// The harness on CPU against CPU: every golden case passes with zero error, and the
    /// comparison catches a model that differs.
    #[test]
    fn cpu_against_cpu_passes_every_golden_case() {
        let a = Arc::new(CpuBackend::new());
        let b = Arc::new(CpuBackend::new());
        let (cases, _) = golden_cases(&golden_root());
        assert!(cases.len() >= 10, "golden cases found: {}", cases.len());
        let mut rows = Vec::new();
        for (name, dir, json) in cases.iter().filter(|c| c.0 == "qwen3" || c.0 == "gemma4") {
            rows.extend(check_case(name, dir, json, &a, &b));
        }
        let t = format_rows(&rows);
        eprintln!("{t}");
        assert_eq!(rows.len(), 2 * 3 + 2 * 2, "{t}");
        for r in &rows {
            assert!(r.pass, "{t}");
            if r.name.contains("vs cpu") {
                assert_eq!(r.max_abs, 0.0, "{t}");
            }
        }
    }

    #[test]
    fn greedy_comparison_sees_a_different_model() {
        let root = golden_root();
        let cpu = Arc::new(CpuBackend::new());
        let a = load(&root.join("qwen3/model.gguf"), cpu.clone(), 256).unwrap();
        let b = load(&root.join("qwen3/model.q8_0.gguf"), cpu, 256).unwrap();
        let same = compare_greedy(&a, &a, &[1, 2, 3, 4], GREEDY_STEPS).unwrap();
        assert_eq!(same.test.len(), GREEDY_STEPS);
        assert_eq!(same.test, same.reference);
        assert_eq!(same.err.abs, 0.0);
        let diff = compare_greedy(&a, &b, &[1, 2, 3, 4], GREEDY_STEPS).unwrap();
        assert!(diff.err.rel > 0.0);
    }

    #[test]
    fn errors_follow_the_golden_metric() {
        let mut e = PeakErr::default();
        e.add(&[1.0, 2.0, 4.5], [1.0, 2.0, 4.0].into_iter());
        assert!((e.abs - 0.5).abs() < 1e-12 && (e.rel - 0.125).abs() < 1e-12);
        e.add(&[f32::NAN], [1.0].into_iter());
        assert!(e.rel.is_infinite(), "NaN counts as an infinite error");
        assert_eq!(top2_gap(&[0.5, 3.0, 2.0]), 1.0);
        assert_eq!(argmax(&[0.5, 3.0, 2.0]), 1);
    }
}
