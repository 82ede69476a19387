//! Loading the model, tokenizer and chat format named by the flags, and starting the engine.

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

/// Check the device flag.
pub fn check_device(d: Device) -> Result<()> {
    match d {
        Device::Cpu => Ok(()),
        // The kernels run on the GPU (`fucina selftest`), but the CUDA backend does not implement
        // the model-level Backend trait yet: construct it in `load_model` when it does.
        Device::Cuda if crate::backend::cuda::cuda_available() => bail!(
            "--device cuda: a CUDA driver is present, but the CUDA model backend is not wired into this build yet; use --device cpu"
        ),
        Device::Cuda => bail!(
            "--device cuda: no CUDA driver found on this machine (the CUDA backend is not available); use --device cpu"
        ),
    }
}

/// Load weights + tokenizer, pick the chat format, start the scheduler.
pub fn load(a: &RunArgs) -> Result<Ready> {
    check_device(a.device)?;
    let (model, tokenizer, template, model_id) = load_model(a)?;
    let tokenizer = Arc::new(tokenizer);
    let chat = match Dialect::detect(&tokenizer) {
        Some(d) => Some(
            ChatFormat::new(d, template, ChatFormat::special_from_tokenizer(&tokenizer))
                .context("compiling the chat template")?,
        ),
        None => None,
    };
    let engine = scheduler::spawn(
        model,
        tokenizer.clone(),
        SchedulerConfig {
            model_id,
            skip_special: false,
            prefix_reuse: true,
        },
    );
    Ok(Ready {
        engine,
        tokenizer,
        chat,
    })
}

/// The checkpoint, its tokenizer and template files, and the id the API reports.
fn load_model(
    a: &RunArgs,
) -> Result<(Arc<dyn CausalLm>, Tokenizer, source::TemplateFiles, String)> {
    let path = match &a.model {
        Some(p) => p.clone(),
        None => crate::assets::default_model_path().context("fetching the default model")?,
    };
    let ckpt = Checkpoint::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tok = crate::tokenizer::load_for_checkpoint(&ckpt, a.tokenizer.as_deref())
        .context("loading the tokenizer")?;
    let files = template_files(&ckpt, a.tokenizer.as_deref())?;
    let model = load_model_on(&ckpt, Arc::new(CpuBackend::new()), a.ctx)?;
    let id = path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches(".gguf").to_string())
        .unwrap_or_else(|| model.info().arch.clone());
    Ok((model, tok, files, id))
}

fn load_model_on<B: crate::backend::Backend>(
    ckpt: &Checkpoint,
    backend: Arc<B>,
    ctx: usize,
) -> Result<Arc<dyn CausalLm>> {
    let opts = LoadOptions { max_context: ctx };
    Ok(load_model_registry(ckpt, backend, &opts)?)
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
