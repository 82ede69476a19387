//! `fucina selftest`: every kernel instance built for the device's arch, on fresh random inputs
//! (outputs poisoned with NaN first), against the CPU reference with a per-op error bound.
//! Prints one table (instance, max rel err, bound, pass/fail, microseconds) and returns
//! `Ok(false)` on any failure. Per-op checks implement [`KernelCheck`] and are registered in
//! `registry.rs` (each in its op family's folder); an instance without a check fails.

mod attention;
mod backend_fused;
mod backend_ops;
mod check;
mod elementwise;
mod linear;
pub mod models;
mod moe;
mod registry;
mod sample;

pub use check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};

use rand::SeedableRng;

use crate::backend::cuda::{cuda_available, CudaDevice};
use crate::kernels::{self, KernelSpec};

/// Arguments of `fucina selftest`.
#[derive(Debug, Clone, clap::Args)]
pub struct SelftestArgs {
    /// Only instances whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Timed launches per instance.
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
    /// Also run the generic (sm_80/sm_89) instances the device can run, not only its own arch.
    #[arg(long)]
    pub generic: bool,
    /// Fail on any run-time kernel compile (the PTX cache must be complete). The environment
    /// variable FUCINA_STRICT_KERNELS=1 does the same (read by the PTX cache configuration).
    #[arg(long)]
    pub strict_kernels: bool,
    /// Skip the whole-model checks (golden models and Gemma 3 270M, GPU against CPU).
    #[arg(long)]
    pub skip_models: bool,
    /// The golden model cases (default: the source tree's golden/models, else ./golden/models).
    #[arg(long = "golden-dir", env = "FUCINA_GOLDEN_DIR")]
    pub golden_dir: Option<std::path::PathBuf>,
    /// A folder holding the Gemma 3 270M GGUF (default: the model cache, fetched when absent).
    #[arg(long = "assets-dir", env = "FUCINA_TEST_ASSETS")]
    pub assets_dir: Option<std::path::PathBuf>,
    /// Instead of the tables: run this model op by op on the GPU and the CPU at once and report
    /// where their outputs depart (a checkpoint, or a `golden/fidelity/<case>` folder, whose
    /// longest prompt and HF greedy tokens are then used).
    #[arg(long, value_name = "MODEL")]
    pub bisect: Option<std::path::PathBuf>,
    /// Prompt token ids for --bisect (comma-separated; default: the fidelity case's).
    #[arg(long, value_delimiter = ',')]
    pub bisect_tokens: Vec<u32>,
    /// Decode steps after the prompt for --bisect.
    #[arg(long, default_value_t = 3)]
    pub bisect_steps: usize,
    /// --bisect: run every op on the reference's inputs (each op's own error).
    #[arg(long)]
    pub bisect_resync: bool,
    /// --bisect: print ops whose relative error is at least this.
    #[arg(long, default_value_t = 1e-3)]
    pub bisect_threshold: f64,
    /// --bisect: KV cache type of the GPU backend (fp8 or f16).
    #[arg(long, default_value = "f16")]
    pub bisect_kv: crate::backend::cuda::KvType,
}

impl Default for SelftestArgs {
    fn default() -> Self {
        SelftestArgs {
            filter: None,
            seed: 0x5eed,
            device: 0,
            iters: 20,
            generic: false,
            strict_kernels: false,
            skip_models: false,
            golden_dir: None,
            assets_dir: None,
            bisect: None,
            bisect_tokens: Vec::new(),
            bisect_steps: 3,
            bisect_resync: false,
            bisect_threshold: 1e-3,
            bisect_kv: crate::backend::cuda::KvType::F16,
        }
    }
}

/// One table row.
#[derive(Debug, Clone)]
pub struct Row {
    pub instance: &'static str,
    pub max_rel_err: Option<f64>,
    pub bound: Option<f64>,
    pub unwritten: usize,
    pub micros: Option<f64>,
    pub pass: bool,
    pub note: String,
}

/// Run the selftest; prints the table to stdout. `Ok(false)` when any instance fails.
pub fn run(args: &SelftestArgs) -> anyhow::Result<bool> {
    models::set_dirs(args.golden_dir.clone(), args.assets_dir.clone());
    if !cuda_available() {
        anyhow::bail!("no CUDA driver or GPU found (libcuda.so.1 not loadable, or no device): selftest needs a GPU");
    }
    if let Some(model) = &args.bisect {
        let plan = models::bisect::BisectPlan {
            model: model.clone(),
            tokens: args.bisect_tokens.clone(),
            steps: args.bisect_steps,
            resync: args.bisect_resync,
            threshold: args.bisect_threshold,
        };
        return models::bisect::run_gpu(args.device, args.bisect_kv, &plan);
    }
    let mut cache = codegen::ptx::CacheConfig::from_env()?;
    cache.strict |= args.strict_kernels;
    let dev = CudaDevice::with_cache(args.device, cache)?;
    let (major, minor) = dev.compute_capability();
    let arches: Vec<_> = if args.generic {
        dev.runnable_arches().to_vec()
    } else {
        vec![dev.arch()]
    };
    let nvrtc = codegen::ptx::nvrtc_version()
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|e| format!("unavailable ({e})"));
    println!(
        "fucina selftest: {} (sm {major}.{minor}), instances for {}, NVRTC {nvrtc}, PTX cache {}{}",
        dev.name(),
        arches
            .iter()
            .map(|a| a.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        dev.ptx_cache().config().root.display(),
        if dev.ptx_cache().config().strict {
            " (strict)"
        } else {
            ""
        }
    );
    {
        use std::io::IsTerminal;
        // A failure here shows again, per instance, in the table.
        if let Err(e) = dev.precompile(std::io::stderr().is_terminal()) {
            eprintln!("precompiling kernels: {e}");
        }
    }
    let specs: Vec<&'static KernelSpec> = kernels::KERNELS
        .iter()
        .filter(|s| arches.contains(&s.key.arch))
        .filter(|s| args.filter.as_deref().is_none_or(|f| s.name.contains(f)))
        .collect();
    let section = |name: &str| {
        args.filter
            .as_deref()
            .is_none_or(|f| name.contains(f) || f.contains(name))
    };
    if specs.is_empty() && !(section("backend") || section("fidelity") || section("models")) {
        anyhow::bail!(
            "no kernel instance matches (arch {:?}, filter {:?})",
            arches,
            args.filter
        );
    }
    let mut rows = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let seed = args.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        rows.push(check_one(&dev, spec, seed, args.iters));
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    if !rows.is_empty() {
        print_table(&rows);
        println!(
            "{} instances, {} passed, {failed} failed; NVRTC compiles this run: {}, cache hits: {}",
            rows.len(),
            rows.len() - failed,
            dev.ptx_cache().compiles(),
            dev.ptx_cache().hits()
        );
    }
    let backend_failed = if section("backend") {
        run_backend_ops(args, dev.ptx_cache().config().clone())
    } else {
        0
    };
    let mut model_failed = 0;
    if !args.skip_models && section("fidelity") {
        let (text, failed) = models::fidelity::run_gpu(args.device);
        print!("{text}");
        model_failed += failed;
    }
    if !args.skip_models && section("models") {
        let mrows = models::run_gpu(args.device);
        print!("{}", models::format_rows(&mrows));
        let mfailed = mrows.iter().filter(|r| !r.pass).count();
        model_failed += mfailed;
        println!(
            "{} model checks, {} passed, {mfailed} failed",
            mrows.len(),
            mrows.len() - mfailed
        );
    }
    Ok(failed == 0 && backend_failed == 0 && model_failed == 0)
}

/// The backend-level table (`backend_ops`): every CUDA backend op against the CPU backend.
/// Returns the number of failed rows.
fn run_backend_ops(args: &SelftestArgs, cache: codegen::ptx::CacheConfig) -> usize {
    let rows = CudaDevice::with_cache(args.device, cache)
        .map_err(anyhow::Error::from)
        .and_then(|d| backend_ops::run(std::sync::Arc::new(d), args.seed));
    match rows {
        Ok(rows) => {
            print!("{}", backend_ops::format_rows(&rows));
            let failed = rows.iter().filter(|r| !r.pass).count();
            println!(
                "{} backend op checks, {} passed, {failed} failed",
                rows.len(),
                rows.len() - failed
            );
            failed
        }
        Err(e) => {
            println!("backend op checks: error: {e}");
            1
        }
    }
}

fn check_one(dev: &CudaDevice, spec: &'static KernelSpec, seed: u64, iters: usize) -> Row {
    let mut row = Row {
        instance: spec.name,
        max_rel_err: None,
        bound: None,
        unwritten: 0,
        micros: None,
        pass: false,
        note: String::new(),
    };
    let Some(check) = registry::for_key(&spec.key) else {
        row.note = "no check registered (src/selftest/registry.rs)".into();
        return row;
    };
    let bound = check.bound(&spec.key);
    row.bound = Some(bound);
    let mut cx = CheckCtx {
        dev,
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        iters,
    };
    match check.run(&mut cx, spec) {
        Ok(m) => {
            row.max_rel_err = Some(m.cmp.max_rel_err);
            row.unwritten = m.cmp.unwritten;
            row.micros = Some(m.micros);
            row.pass = m.cmp.passes(bound);
            if m.cmp.unwritten > 0 {
                row.note = format!("{} outputs unwritten (still NaN)", m.cmp.unwritten);
            }
        }
        Err(e) => row.note = format!("error: {e}"),
    }
    row
}

/// Render the table as text.
pub fn format_table(rows: &[Row]) -> String {
    let w = rows
        .iter()
        .map(|r| r.instance.len())
        .max()
        .unwrap_or(8)
        .max(8);
    let mut s = format!(
        "{:<w$}  {:>12}  {:>8}  {:>4}  {:>10}  note\n",
        "instance",
        "max rel err",
        "bound",
        "pass",
        "us",
        w = w
    );
    for r in rows {
        let f = |v: Option<f64>, p: usize| {
            v.map_or("-".to_string(), |v| {
                if p == 0 {
                    format!("{v:.3e}")
                } else {
                    format!("{v:.1}")
                }
            })
        };
        s.push_str(&format!(
            "{:<w$}  {:>12}  {:>8}  {:>4}  {:>10}  {}\n",
            r.instance,
            f(r.max_rel_err, 0),
            r.bound.map_or("-".into(), |b| format!("{b:.0e}")),
            if r.pass { "PASS" } else { "FAIL" },
            f(r.micros, 1),
            r.note,
            w = w
        ));
    }
    s
}

fn print_table(rows: &[Row]) {
    print!("{}", format_table(rows));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instance_has_a_check() {
        for s in kernels::KERNELS {
            assert!(
                registry::for_key(&s.key).is_some(),
                "{} has no selftest check",
                s.name
            );
        }
    }

    #[test]
    fn table_format() {
        let rows = [Row {
            instance: "rmsnorm_f32_sm_90a",
            max_rel_err: Some(1.5e-7),
            bound: Some(2e-5),
            unwritten: 0,
            micros: Some(3.25),
            pass: true,
            note: String::new(),
        }];
        let t = format_table(&rows);
        assert!(
            t.contains("rmsnorm_f32_sm_90a")
                && t.contains("1.500e-7")
                && t.contains("PASS")
                && t.contains("3.2"),
            "{t}"
        );
    }

    #[test]
    fn without_gpu_run_is_an_error_not_a_panic() {
        if !cuda_available() {
            assert!(run(&SelftestArgs::default()).is_err());
        }
    }
}
