//! Loading the model, tokenizer and chat format named by the flags, and starting the engine.

use crate::backend::Runtime;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use super::args::{Device, RunArgs};
use crate::backend::cpu::CpuBackend;
use crate::chat::{source, ChatFormat, Dialect};
use crate::engine::scheduler::{self, SchedulerConfig};
use crate::engine::EngineHandle;
use crate::model::registry::{load_model as load_model_registry, LoadOptions};
use crate::model::CausalLm;
use crate::tokenizer::Tokenizer;
use crate::weights::Checkpoint;

/// Everything the front ends need.
pub struct Ready {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub chat: Option<ChatFormat>,
}

/// Flags that are accepted but whose feature has not landed: say so, loudly, once.
pub fn report_unavailable(a: &RunArgs) {
    let spec_on = a.spec.as_deref().is_some_and(|v| v != "false" && v != "0");
    if spec_on || a.draft_k.is_some() || a.assistant.is_some() {
        eprintln!(
            "fucina: speculative decoding (--spec / --draft-k / --assistant) is not yet available in this build; generating without it"
        );
    }
}

/// What `--device` resolves to on this machine.
pub enum Selected<T> {
    Cpu,
    /// The opened CUDA backend.
    Cuda(T),
}

/// Resolve `--device`: `driver` says whether a CUDA driver is present, `open` opens device
/// `ordinal`. `auto` falls back to the CPU and returns the one log line saying why; `cuda`
/// without a driver or a device is an error (never a panic).
pub fn select_device<T, E: std::fmt::Display>(
    device: Device,
    ordinal: usize,
    driver: bool,
    open: impl FnOnce() -> std::result::Result<T, E>,
) -> Result<(Selected<T>, Option<String>)> {
    match device {
        Device::Cpu => Ok((Selected::Cpu, None)),
        Device::Cuda if !driver => bail!(
            "--device cuda: no CUDA driver found on this machine (libcuda could not be loaded); use --device cpu or --device auto"
        ),
        Device::Cuda => match open() {
            Ok(b) => Ok((Selected::Cuda(b), None)),
            Err(e) => bail!("--device cuda: cannot use CUDA device {ordinal}: {e}"),
        },
        Device::Auto if !driver => Ok((
            Selected::Cpu,
            Some("--device auto: no CUDA driver found; running on the CPU backend".into()),
        )),
        Device::Auto => match open() {
            Ok(b) => Ok((Selected::Cuda(b), None)),
            Err(e) => Ok((
                Selected::Cpu,
                Some(format!(
                    "--device auto: CUDA device {ordinal} is not usable ({e}); running on the CPU backend"
                )),
            )),
        },
    }
}

/// Check `--gpu-mem-util`.
pub fn check_mem_util(util: f32) -> Result<f32> {
    if !(util > 0.0 && util <= 1.0) {
        bail!("--gpu-mem-util must be in (0, 1], got {util}");
    }
    Ok(util)
}

/// Device memory kept out of the KV budget for activations, logits and kernel workspaces.
pub const GPU_RESERVE_BYTES: u64 = 1 << 30;

/// The KV cache budget: `free * util - reserve` bytes (`free`: device memory free once the
/// weights are uploaded).
pub fn kv_budget_bytes(free: u64, util: f32, reserve: u64) -> u64 {
    ((free as f64 * util as f64) as u64).saturating_sub(reserve)
}

/// The log line of the context cap, when the budget (not `--ctx` or the model) set the context:
/// `per_token` KV bytes per token beside `fixed` bytes whatever the length (sliding-window rings).
pub fn context_cap_line(
    max_context: usize,
    requested: usize,
    util: f32,
    budget: u64,
    per_token: u64,
    fixed: u64,
) -> Option<String> {
    let rest = budget.saturating_sub(fixed);
    if per_token == 0 || (rest / per_token) as usize > max_context || max_context >= requested {
        return None;
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let total = gib(max_context as u64 * per_token + fixed);
    let rings = if fixed > 0 {
        format!(" + {:.2} GiB of sliding-window rings", gib(fixed))
    } else {
        String::new()
    };
    Some(format!(
        "context capped to {max_context} tokens by --gpu-mem-util {util:.2} (KV cache {total:.2} GiB at {per_token} bytes/token{rings})"
    ))
}

/// Resolve `--device` on this machine (before anything is loaded, so a bad flag fails fast).
fn select(a: &RunArgs) -> Result<Selected<CudaChoice>> {
    check_mem_util(a.gpu_mem_util)?;
    let (sel, note) = select_device(
        a.device,
        a.cuda_device,
        crate::backend::cuda::cuda_available(),
        || open_cuda(a),
    )?;
    if let Some(n) = note {
        tracing::info!("{n}");
    }
    Ok(sel)
}

/// Load on the selected backend.
/// Returns the model and, where device memory bounds it, how many sequences' KV caches fit.
fn load_on_device(
    a: &RunArgs,
    ckpt: &Checkpoint,
    sel: Selected<CudaChoice>,
) -> Result<(Arc<dyn CausalLm>, Option<usize>)> {
    let cpu = || {
        let opts = LoadOptions {
            max_context: a.ctx,
            ..Default::default()
        };
        load_model_on(ckpt, Arc::new(CpuBackend::new()), &opts).map(|m| (m, None))
    };
    match sel {
        Selected::Cpu => cpu(),
        Selected::Cuda(be) => match load_cuda(a, ckpt, be) {
            Err(e) => match (unsupported(&e), a.device) {
                (Some(what), Device::Auto) => {
                    tracing::info!("--device auto: {what}; running on the CPU backend");
                    cpu()
                }
                (Some(what), _) => bail!("--device cuda: {what} (--device cpu runs it)"),
                (None, _) => Err(e),
            },
            ok => ok,
        },
    }
}

/// What a backend said it lacks, when `e` is a load refused for that reason.
fn unsupported(e: &anyhow::Error) -> Option<String> {
    match e.downcast_ref::<crate::model::ModelError>() {
        Some(crate::model::ModelError::Unsupported { backend, what }) => Some(format!(
            "the {backend} backend cannot run this model: {what}"
        )),
        _ => None,
    }
}

type CudaChoice = crate::backend::cuda::CudaBackend;

/// Open the CUDA backend on `--cuda-device`.
fn open_cuda(a: &RunArgs) -> std::result::Result<CudaChoice, String> {
    crate::backend::cuda::CudaBackend::new(a.cuda_device, a.kv_type).map_err(|e| e.to_string())
}

/// Weights onto the GPU with a progress bar, then the context capped by the KV budget. Returns
/// the model and how many sequences' caches (each sized for the whole context) the budget holds.
fn load_cuda(
    a: &RunArgs,
    ckpt: &Checkpoint,
    be: crate::backend::cuda::CudaBackend,
) -> Result<(Arc<dyn CausalLm>, Option<usize>)> {
    use crate::model::registry::KvBudget;
    let util = a.gpu_mem_util;
    tracing::info!(
        "loading on CUDA device {} ({}), KV cache {:?}",
        a.cuda_device,
        be.device_name(),
        a.kv_type
    );
    let be = Arc::new(be);
    let probe = be.clone();
    let budget = KvBudget::new(move || {
        let free = probe.free_memory().unwrap_or(0);
        kv_budget_bytes(free, util, GPU_RESERVE_BYTES)
    });
    let opts = LoadOptions {
        max_context: a.ctx,
        kv_budget: Some(budget.clone()),
    };
    let model = load_model_on(ckpt, be.clone(), &opts)?;
    // the kernels of this model's formats, on several threads with a bar (a cold kernel cache
    // compiles here, not at the first request)
    let t = std::time::Instant::now();
    match be.precompile_model(std::io::IsTerminal::is_terminal(&std::io::stderr())) {
        Ok(n) => tracing::info!(
            "kernels: {n} instances ready in {:.1} s",
            t.elapsed().as_secs_f64()
        ),
        // (each kernel is compiled again when first used, where the error then surfaces)
        Err(e) => tracing::warn!("compiling the kernels ahead: {e}"),
    }
    let info = model.info();
    let per_token = be.kv_bytes(info.kv_elems_per_token);
    let fixed = be.kv_bytes(info.kv_fixed_elems);
    let per_session = info.max_context as u64 * per_token + fixed;
    let sessions = budget
        .measured()
        .map(|b| (b / per_session.max(1)).max(1) as usize);
    if let Some(b) = budget.measured() {
        match context_cap_line(info.max_context, a.ctx, util, b, per_token, fixed) {
            Some(line) => tracing::info!("{line}"),
            None => tracing::info!(
                "context {} tokens; KV budget {:.2} GiB at {per_token} bytes/token{}",
                info.max_context,
                b as f64 / (1u64 << 30) as f64,
                if fixed > 0 {
                    format!(
                        " + {:.2} GiB of sliding-window rings",
                        fixed as f64 / (1u64 << 30) as f64
                    )
                } else {
                    String::new()
                }
            ),
        }
    }
    if let Some(n) = sessions {
        tracing::info!(
            "KV caches of {n} sequences at the full context fit (--ctx lower: more at once)"
        );
        // the running sequences (and the kept one) side by side in a KV arena: a step's
        // sequences write K/V and attend in one launch per layer
        be.reserve_kv_slots(n.min(a.max_concurrent.saturating_add(1)));
    }
    Ok((model, sessions))
}

/// Run a short prompt and a few one-token steps on a throw-away session, so that the kernels the
/// model needs are compiled (NVRTC, on a cold kernel cache) and loaded before a server says it
/// is ready: the first request does not wait for them (on an H100 with a cold cache the first
/// request's first token used to take 8.2 s, the next ones' 5 ms).
fn warm_up(model: &Arc<dyn CausalLm>) -> Result<()> {
    let info = model.info();
    // a prompt long enough for the multi-row (prefill) kernels, short enough for any context
    let n = 64.min(info.max_context.saturating_sub(4)).max(1);
    let vocab = info.vocab_size.max(1) as u32;
    let prompt: Vec<u32> = (0..n as u32).map(|i| i % vocab).collect();
    let t = std::time::Instant::now();
    let mut s = model.clone().new_session();
    s.forward(&prompt, false).context("warming up (a prompt)")?;
    for i in 0..3u32.min(info.max_context.saturating_sub(n) as u32) {
        s.forward(&[i % vocab], false)
            .context("warming up (a decode step)")?;
    }
    tracing::info!(
        "warm-up (kernels compiled and loaded): {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Load weights + tokenizer, pick the chat format, start the scheduler (a server warms the model
/// up first: `warm`).
pub fn load(a: &RunArgs, warm: bool) -> Result<Ready> {
    let (model, tokenizer, template, model_id, sessions) = load_model(a)?;
    if warm {
        warm_up(&model)?;
    }
    let tokenizer = Arc::new(tokenizer);
    let chat = match Dialect::detect(&tokenizer) {
        Some(d) => {
            let f = ChatFormat::new(d, template, ChatFormat::special_from_tokenizer(&tokenizer))
                .context("compiling the chat template")?;
            Some(if a.special_in_content {
                tracing::warn!(
                    "--special-in-content: control-token strings in message content become control tokens"
                );
                f
            } else {
                f.with_text_guard(&tokenizer)
            })
        }
        None => None,
    };
    let engine = scheduler::spawn(
        model,
        tokenizer.clone(),
        SchedulerConfig {
            model_id,
            prefill_chunk: crate::model::common::prefill_chunk(),
            // the kept session (prefix reuse) holds one sequence's cache too
            max_running: a
                .max_concurrent
                .min(sessions.map_or(usize::MAX, |n| n.saturating_sub(1).max(1)))
                .max(1),
            step_tokens: a.max_batch_tokens.max(1),
            ..SchedulerConfig::default()
        },
    );
    Ok(Ready {
        engine,
        tokenizer,
        chat,
    })
}

/// The checkpoint, its tokenizer and template files, and the id the API reports.
#[allow(clippy::type_complexity)]
fn load_model(
    a: &RunArgs,
) -> Result<(
    Arc<dyn CausalLm>,
    Tokenizer,
    source::TemplateFiles,
    String,
    Option<usize>,
)> {
    let sel = select(a)?;
    let path = match &a.model {
        Some(p) => p.clone(),
        None => crate::assets::default_model_path().context("fetching the default model")?,
    };
    let ckpt = Checkpoint::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tok = crate::tokenizer::load_for_checkpoint(&ckpt, a.tokenizer.as_deref())
        .context("loading the tokenizer")?;
    let files = template_files(&ckpt, a.tokenizer.as_deref())?;
    let (model, sessions) = load_on_device(a, &ckpt, sel)?;
    let id = path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| model.info().arch.clone());
    Ok((model, tok, files, id, sessions))
}

/// Build the model on `backend` (any backend), with a progress bar over the weight bytes when
/// stderr is a terminal.
fn load_model_on<B: crate::backend::Backend>(
    ckpt: &Checkpoint,
    backend: Arc<B>,
    opts: &LoadOptions,
) -> Result<Arc<dyn CausalLm>> {
    let total = ckpt.total_tensor_bytes();
    let bar = load_bar(total, backend.name());
    if let Some(bar) = &bar {
        let b = bar.clone();
        ckpt.set_tensor_hook(Some(Box::new(move |n| {
            // a tensor fetched twice (a tied head) must not run the bar past its end
            b.set_position((b.position() + n as u64).min(total))
        })));
    }
    let res = load_model_registry(ckpt, backend, opts);
    ckpt.set_tensor_hook(None);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(res?)
}

fn load_bar(total: u64, backend: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if total == 0 || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "loading weights ({msg}) {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(backend.to_string());
    Some(bar)
}

/// The chat template: files beside the weights (or the tokenizer override), else the GGUF's
/// `tokenizer.chat_template`; none found means the dialect's built-in template.
pub fn template_files(
    ckpt: &Checkpoint,
    tok_override: Option<&Path>,
) -> Result<source::TemplateFiles> {
    let dir = tok_override
        .map(|p| {
            if p.is_dir() {
                p.to_path_buf()
            } else {
                p.parent().map(Path::to_path_buf).unwrap_or_default()
            }
        })
        .or_else(|| ckpt.dir().map(Path::to_path_buf));
    let mut files = match dir {
        Some(d) if d.is_dir() => source::from_dir(&d)?,
        _ => source::TemplateFiles::default(),
    };
    if files.source.is_none() {
        files.source = ckpt
            .gguf()
            .and_then(|g| g.get_str("tokenizer.chat_template"))
            .map(str::to_string);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::KvType;
    use crate::cli::args::Cli;
    use crate::model::registry::context_cap;
    use clap::Parser;

    fn parse(args: &[&str]) -> RunArgs {
        let mut v = vec!["fucina"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap().run
    }

    /// A load the backend refused for what it lacks is recognised (and only that: any other
    /// load error is not a reason to move to the CPU).
    #[test]
    fn refused_loads_are_told_apart() {
        let e: anyhow::Error = crate::model::ModelError::Unsupported {
            backend: "cuda",
            what: "Qwen3.5 / 3.6 Gated DeltaNet layers have no CUDA kernels yet".into(),
        }
        .into();
        let what = unsupported(&e).unwrap();
        assert!(what.contains("cuda backend cannot run this model") && what.contains("DeltaNet"));
        let other: anyhow::Error = crate::model::ModelError::Other("bad file".into()).into();
        assert!(unsupported(&other).is_none());
    }

    #[test]
    fn device_flags_parse() {
        // (the FUCINA_* environment is not set in tests)
        let a = parse(&[]);
        assert_eq!(a.device, Device::Auto);
        assert_eq!(
            a.kv_type,
            KvType::F16,
            "f16 until an FP8 cache meets the fidelity bound"
        );
        assert_eq!(a.gpu_mem_util, 0.90);
        assert_eq!(a.cuda_device, 0);
        let a = parse(&[
            "--device",
            "cuda",
            "--cuda-device",
            "3",
            "--kv-type",
            "fp8",
            "--gpu-mem-util",
            "0.5",
        ]);
        assert_eq!(a.device, Device::Cuda);
        assert_eq!(a.cuda_device, 3);
        assert_eq!(a.kv_type, KvType::Fp8E4m3);
        assert_eq!(a.gpu_mem_util, 0.5);
        assert_eq!(parse(&["--device", "cpu"]).device, Device::Cpu);
        assert_eq!(parse(&["--kv-type", "fp8"]).kv_type, KvType::Fp8E4m3);
        assert!(!a.special_in_content, "content is text unless opted out");
        assert!(parse(&["--special-in-content"]).special_in_content);
        assert!(Cli::try_parse_from(["fucina", "--device", "tpu"]).is_err());
        assert!(Cli::try_parse_from(["fucina", "--kv-type", "int4"]).is_err());
        assert!(check_mem_util(0.0).is_err());
        assert!(check_mem_util(1.5).is_err());
        assert!(check_mem_util(f32::NAN).is_err());
        assert_eq!(check_mem_util(1.0).unwrap(), 1.0);
    }

    fn never() -> std::result::Result<u8, String> {
        panic!("must not open a device")
    }

    #[test]
    fn device_selection_and_fallback() {
        // cpu never touches CUDA
        let (s, note) = select_device(Device::Cpu, 0, true, never).unwrap();
        assert!(matches!(s, Selected::Cpu) && note.is_none());
        // auto without a driver: CPU, one line saying why
        let (s, note) = select_device(Device::Auto, 0, false, never).unwrap();
        assert!(matches!(s, Selected::Cpu));
        assert_eq!(
            note.as_deref(),
            Some("--device auto: no CUDA driver found; running on the CPU backend")
        );
        // auto with a device that fails to open: CPU, the reason in the line
        let (s, note) =
            select_device(Device::Auto, 2, true, || Err::<u8, _>("out of memory")).unwrap();
        assert!(matches!(s, Selected::Cpu));
        let note = note.unwrap();
        assert!(
            note.contains("CUDA device 2") && note.contains("out of memory"),
            "{note}"
        );
        // auto with a device: CUDA, silently
        let (s, note) = select_device(Device::Auto, 0, true, || Ok::<u8, String>(7)).unwrap();
        assert!(matches!(s, Selected::Cuda(7)) && note.is_none());
        // cuda without a driver: a clear error, no panic
        let e = select_device(Device::Cuda, 0, false, never).err().unwrap();
        assert!(e.to_string().contains("no CUDA driver"), "{e}");
        let e = select_device(Device::Cuda, 1, true, || Err::<u8, _>("bad ordinal"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("CUDA device 1: bad ordinal"), "{e}");
    }

    #[test]
    fn cuda_without_driver_fails_cleanly_through_load() {
        if crate::backend::cuda::cuda_available() {
            return; // a GPU machine: covered by the selection test above
        }
        // the device is resolved before the checkpoint is touched
        let a = parse(&["--device", "cuda", "-m", "/nonexistent.gguf"]);
        let e = load(&a, false).err().unwrap().to_string();
        assert!(e.contains("--device cuda: no CUDA driver"), "{e}");
        let a = parse(&["--device", "auto", "-m", "/nonexistent.gguf"]);
        let e = load(&a, false).err().unwrap().to_string();
        assert!(e.contains("nonexistent"), "{e}");
    }

    #[test]
    fn kv_budget_arithmetic() {
        const GIB: u64 = 1 << 30;
        // 100 GiB free, util 0.9, 1 GiB reserve -> 89 GiB
        // (0.9f32 is not 0.9: a few KiB either way)
        assert!(kv_budget_bytes(100 * GIB, 0.9, GIB).abs_diff(89 * GIB) < (1 << 20));
        assert_eq!(kv_budget_bytes(100 * GIB, 0.5, GIB), 49 * GIB);
        assert_eq!(kv_budget_bytes(GIB / 2, 0.9, GIB), 0);
        // Qwen3-8B: 36 layers x 8 kv heads x 128 x 2 (K, V) = 73728 elements per token
        // (a scaled FP8 cache adds a 2-byte scale per row, counted at the smallest head
        // dimension a cache holds, 64)
        let elems = 36 * 8 * 128 * 2;
        assert_eq!(KvType::Fp8E4m3.bytes_for(elems), 73_728 + 2304);
        assert_eq!(KvType::F16.bytes_for(elems), 147_456);
        // 4 GiB hold 58254 fp8 tokens: a 262144 request is capped, a 32768 one is not
        assert_eq!(context_cap(262_144, 73_728, 4 * GIB).unwrap(), 58_254);
        assert_eq!(context_cap(32_768, 73_728, 4 * GIB).unwrap(), 32_768);
        assert!(context_cap(10, 73_728, 1000).is_err());
        assert_eq!(context_cap(10, 0, 0).unwrap(), 10);
        // the budget is measured once, when the family asks (after its uploads)
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = calls.clone();
        let opts = LoadOptions {
            max_context: 0,
            kv_budget: Some(crate::model::registry::KvBudget::new(move || {
                c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                4 * GIB
            })),
        };
        assert_eq!(opts.kv_budget.as_ref().unwrap().measured(), None);
        assert_eq!(opts.cap_context(262_144, 73_728).unwrap(), 58_254);
        assert_eq!(opts.cap_context(262_144, 73_728).unwrap(), 58_254);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        // the log line
        let line = context_cap_line(58_254, 262_144, 0.9, 4 * GIB, 73_728, 0).unwrap();
        assert_eq!(
            line,
            "context capped to 58254 tokens by --gpu-mem-util 0.90 (KV cache 4.00 GiB at 73728 bytes/token)"
        );
        assert!(context_cap_line(32_768, 32_768, 0.9, 4 * GIB, 73_728, 0).is_none());
        // rings come out of the budget first
        let line = context_cap_line(1024, 262_144, 0.9, 5 * GIB, 1 << 20, 4 * GIB).unwrap();
        assert_eq!(
            line,
            "context capped to 1024 tokens by --gpu-mem-util 0.90 (KV cache 5.00 GiB at 1048576 bytes/token + 4.00 GiB of sliding-window rings)"
        );
        assert!(context_cap_line(1024, 262_144, 0.9, 5 * GIB, 1 << 20, 0).is_none());
    }

    #[test]
    fn golden_model_caps_its_context_to_the_budget() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/models/qwen3/hf");
        let ckpt = Checkpoint::open(&p).unwrap();
        let total = ckpt.total_tensor_bytes();
        assert!(total > 0);
        let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let s = seen.clone();
        ckpt.set_tensor_hook(Some(Box::new(move |n| {
            s.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
        })));
        let opts = LoadOptions {
            max_context: 4096,
            kv_budget: Some(crate::model::registry::KvBudget::new(|| 100_000)),
        };
        let m = load_model_registry(&ckpt, Arc::new(CpuBackend::new()), &opts).unwrap();
        ckpt.set_tensor_hook(None);
        let info = m.info();
        assert!(info.kv_elems_per_token > 0);
        // the CPU backend's f32 cache: 4 bytes an element
        let per = 4 * info.kv_elems_per_token as u64;
        assert_eq!(info.max_context as u64, (100_000 / per).min(4096));
        // the weights went past the progress hook
        assert!(seen.load(std::sync::atomic::Ordering::SeqCst) > 0);
    }
}
