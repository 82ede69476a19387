//! `fucina bench`: prefill, time to first token, batch-1 decode at several depths, memory, and
//! decode against the read roofline, on a GGUF or on a random-weight GGUF written at a real
//! model's shape (`--synth NAME --quant Q`); batched decode (`--batch`); or, with `--serve URL`,
//! a load generator against a running server.

pub mod cuda;
pub mod gguf_write;
pub mod measure;
pub mod presets;
pub mod roofline;
pub mod serve;
pub mod synth;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use crate::backend::cpu::CpuBackend;
use measure::{Plan, Report};

/// Arguments of `fucina bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// GGUF file to measure.
    #[arg(long, short = 'm', conflicts_with = "synth")]
    pub model: Option<PathBuf>,
    /// Write (or reuse) a random-weight GGUF at this shape: qwen3-8b, qwen3-30b-a3b,
    /// gemma4-12b (tiny-qwen3, tiny-qwen3moe, tiny-gemma4 for quick runs).
    #[arg(long)]
    pub synth: Option<String>,
    /// Weight format of the synthesised file: q4_0, q4_k_m, q8_0.
    #[arg(long, default_value = "q4_0")]
    pub quant: String,
    /// Where the synthesised file goes (reused when present); default `NAME-QUANT.gguf`.
    #[arg(long = "synth-out")]
    pub synth_out: Option<PathBuf>,
    /// GGUF whose tokenizer.* keys the synthesised file copies (default: Gemma presets take the
    /// Gemma 3 270M file, fetched if absent; Qwen presets make up a byte-level vocabulary).
    #[arg(long)]
    pub vocab: Option<PathBuf>,
    /// Override the preset's layer count (quick runs; Gemma 4 keeps its last layer global).
    #[arg(long)]
    pub layers: Option<usize>,
    /// Only write the synthesised file, measure nothing.
    #[arg(long = "synth-only")]
    pub synth_only: bool,
    /// Seed of the random weights and token ids.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// auto: the GPU when a CUDA driver is present, else the CPU.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: crate::backend::Device,
    #[arg(long = "cuda-device", default_value_t = 0)]
    pub cuda_device: usize,
    /// KV cache type on CUDA: f16 (the engine's default) or fp8.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: crate::backend::KvType,
    /// Prompt lengths to prefill.
    #[arg(
        long = "prompt-lens",
        value_delimiter = ',',
        default_value = "512,4096"
    )]
    pub prompt_lens: Vec<usize>,
    /// Tokens decoded per depth.
    #[arg(long = "decode-tokens", default_value_t = 128)]
    pub decode_tokens: usize,
    /// Cache depths at which decode is timed.
    #[arg(long, value_delimiter = ',', default_value = "0,4096")]
    pub depths: Vec<usize>,
    /// Bytes read by the bandwidth probe (CUDA reads at least 1 GiB).
    #[arg(long = "bw-bytes", default_value_t = 1 << 30)]
    pub bw_bytes: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Wait this many milliseconds before each decode measurement.
    #[arg(long = "pause-ms", default_value_t = 0)]
    pub pause_ms: u64,
    /// Log a summary of every timed decode step's host time (quantiles, slowest steps).
    #[arg(long = "step-times")]
    pub step_times: bool,
    /// Batched decode: for each B, B sequences of --batch-prompt tokens prefilled, then
    /// --decode-tokens steps of all of them at once (aggregate tok/s). Every sequence's cache
    /// is sized for the plan's longest context: lower --depths to fit many.
    #[arg(long, value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Prompt tokens of each sequence of a --batch row.
    #[arg(long = "batch-prompt", default_value_t = 128)]
    pub batch_prompt: usize,
    /// Drive a running server instead (`http://host:port`): for each --clients N, N concurrent
    /// streaming completions of --batch-prompt random prompt ids and --decode-tokens outputs.
    #[arg(long, conflicts_with_all = ["model", "synth"])]
    pub serve: Option<String>,
    /// Concurrent clients per --serve level.
    #[arg(long, value_delimiter = ',', default_value = "1,8")]
    pub clients: Vec<usize>,
    /// --serve: the server's API key.
    #[arg(long = "api-key", env = "FUCINA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// The file to measure: `--model`, or the synthesised one (written unless present).
pub fn model_path(a: &BenchArgs, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    if let Some(m) = &a.model {
        return Ok(m.clone());
    }
    let Some(name) = &a.synth else {
        bail!("fucina bench: give --model FILE.gguf or --synth NAME --quant Q");
    };
    let mut p = presets::find(name)
        .with_context(|| {
            format!(
                "--synth {name}: unknown shape (known: {})",
                presets::names().join(", ")
            )
        })?
        .clone();
    if let Some(l) = a.layers {
        if l == 0 {
            bail!("--layers must be at least 1");
        }
        p.n_layer = l;
    }
    let p = &p;
    let q = synth::FileQuant::parse(&a.quant)
        .with_context(|| format!("--quant {}: expected q4_0, q4_k_m or q8_0", a.quant))?;
    let out = a.synth_out.clone().unwrap_or_else(|| match a.layers {
        Some(l) => PathBuf::from(format!("{name}-L{l}-{}.gguf", q.name())),
        None => PathBuf::from(format!("{name}-{}.gguf", q.name())),
    });
    if out.exists() {
        log(&format!("reusing {}", out.display()));
        return Ok(out);
    }
    let donor = match (&a.vocab, p.family) {
        (Some(v), _) => Some(v.clone()),
        (None, presets::Family::Gemma4) if p.n_vocab.is_some() => Some(
            crate::assets::default_model_path()
                .context("fetching the Gemma 3 270M file whose tokenizer the Gemma shapes copy")?,
        ),
        _ => None,
    };
    log(&format!(
        "writing {} ({} {})",
        out.display(),
        p.key,
        q.name()
    ));
    let w = synth::write(p, q, donor.as_deref(), &out, a.seed)?;
    log(&format!(
        "wrote {} tensors, {:.2} GB in {:.1}s ({:.2} GB/s), vocab {}",
        w.tensors,
        w.bytes as f64 / 1e9,
        w.seconds,
        w.bytes as f64 / 1e9 / w.seconds.max(1e-9),
        w.n_vocab
    ));
    Ok(out)
}

/// `fucina bench`.
pub fn run(a: &BenchArgs) -> Result<Option<Report>> {
    let mut log = |s: &str| eprintln!("bench: {s}");
    if let Some(url) = &a.serve {
        let url = url.trim_end_matches('/');
        let mut rows = Vec::new();
        for &n in a.clients.iter().filter(|&&n| n > 0) {
            let r = serve::load(
                url,
                a.api_key.as_deref().filter(|k| !k.is_empty()),
                n,
                a.batch_prompt.max(1),
                a.decode_tokens.max(1),
                a.seed,
            )?;
            log(&format!(
                "{n} clients: {:.1} tok/s, TTFT p50 {:.0} ms, {} errors",
                r.tok_s, r.ttft_p50_ms, r.errors
            ));
            rows.push(r);
        }
        println!("{}", serve::table(&rows));
        if let Some(j) = &a.json {
            std::fs::write(j, serde_json::to_string_pretty(&rows)?)
                .with_context(|| format!("writing {}", j.display()))?;
        }
        return Ok(None);
    }
    let path = model_path(a, &mut log)?;
    if a.synth_only {
        return Ok(None);
    }
    let plan = Plan {
        prompt_lens: a.prompt_lens.clone(),
        decode_tokens: a.decode_tokens.max(1),
        depths: a.depths.clone(),
        bw_bytes: a.bw_bytes,
        seed: a.seed,
        pause_ms: a.pause_ms,
        step_times: a.step_times,
        batch: a.batch.clone(),
        batch_prompt: a.batch_prompt.max(1),
    };
    log(&crate::tuning::get().to_string());
    use crate::backend::Device;
    let device = match a.device {
        Device::Auto if crate::backend::cuda::cuda_available() => Device::Cuda,
        Device::Auto => {
            log("no CUDA driver found: benchmarking the CPU backend");
            Device::Cpu
        }
        d => d,
    };
    let report = match device {
        Device::Auto | Device::Cpu => measure::run(
            &path,
            Arc::new(CpuBackend::new()),
            &measure::CpuProbe,
            &plan,
            &mut log,
        )?,
        Device::Cuda => {
            let kv = a.kv_type;
            if !crate::backend::cuda::cuda_available() {
                bail!("--device cuda: no CUDA driver or GPU found");
            }
            cuda::run(&path, a.cuda_device, kv, &plan, &mut log)?
        }
    };
    println!("{}", table(&report));
    println!("{}", crate::tuning::get());
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", j.display()))?;
    }
    Ok(Some(report))
}

fn gb(b: u64) -> String {
    format!("{:.3} GB", b as f64 / 1e9)
}

/// The report as a text table.
pub fn table(r: &Report) -> String {
    let mut s = format!(
        "model {} ({}, {}): file {}, tensors {}, resident weights {}, load {:.1}s\n\
         read bandwidth {:.1} GB/s; weight bytes per decode token {}\n",
        r.model,
        r.arch,
        r.backend,
        gb(r.file_bytes),
        gb(r.tensor_bytes),
        r.resident_weight_bytes.map_or("-".into(), |b| format!(
            "{} ({:+.2}% of the file)",
            gb(b),
            100.0 * (b as f64 / r.file_bytes as f64 - 1.0)
        )),
        r.load_seconds,
        r.bandwidth_gbs,
        gb(r.weight_bytes_per_token),
    );
    s.push_str("| test | tokens | tok/s | TTFT ms | bytes/token | roofline tok/s | % roofline |\n");
    s.push_str("|---|---|---|---|---|---|---|\n");
    for p in &r.prefill {
        s.push_str(&format!(
            "| prefill pp{} | {} | {:.1} | {:.1} | | | |\n",
            p.tokens, p.tokens, p.tok_s, p.ttft_ms
        ));
    }
    for d in &r.decode {
        s.push_str(&format!(
            "| decode tg{} @ depth {} | {} | {:.1} | | {} | {:.1} | {:.1}% |\n",
            d.tokens,
            d.depth,
            d.tokens,
            d.tok_s,
            gb(d.roofline.bytes_per_token),
            d.roofline.roofline_tok_s,
            d.roofline.percent
        ));
    }
    for b in &r.batched {
        s.push_str(&format!(
            "| decode B={} (pp{} + tg{} each) | {} | {:.1} | | | | |\n",
            b.batch,
            b.prompt,
            b.tokens,
            b.batch * b.tokens,
            b.tok_s
        ));
    }
    if let (Some(p), Some(u)) = (r.pool_peak_bytes, r.driver_used_bytes) {
        s.push_str(&format!(
            "peak GPU memory: pool {} ; driver used {}\n",
            gb(p),
            gb(u)
        ));
    }
    s
}

#[cfg(test)]
mod tests;
