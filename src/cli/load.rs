//! Loading the model, tokenizer and chat format named by the flags, and starting the engine.

use std::sync::Arc;

use anyhow::{bail, Context, Result};

use super::args::{Device, RunArgs};
use crate::chat::{source, ChatFormat, Dialect};
use crate::engine::scheduler::{self, SchedulerConfig};
use crate::engine::EngineHandle;
use crate::model::CausalLm;
use crate::tokenizer::Tokenizer;

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
        // WIRE-AT-MERGE (wt-a): `if crate::backend::cuda::cuda_available() { return Ok(()) }`
        // and construct the CUDA backend in `load_model` below.
        Device::Cuda => bail!(
            "--device cuda: the CUDA backend is not available in this build (no CUDA driver probe compiled in); use --device cpu"
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
    // WIRE-AT-MERGE (wt-b, wt-c, wt-d/wt-g): the body is
    //   let path = match &a.model { Some(p) => p.clone(), None => crate::assets::default_model_path()? };
    //   let ckpt = crate::weights::Checkpoint::open(&path)?;
    //   let tok = crate::tokenizer::load_for_checkpoint(&ckpt, a.tokenizer.as_deref())?;
    //   let mut files = match ckpt.dir() { Some(d) => source::from_dir(d)?, None => Default::default() };
    //   if files.source.is_none() { files.source = ckpt.gguf().and_then(|g| g.get_str("tokenizer.chat_template")).map(str::to_string); }
    //   let model = crate::model::registry::load_model(&ckpt, Arc::new(CpuBackend::new()), &LoadOptions { max_context: a.ctx })?;
    let _ = (&a.model, &a.tokenizer, a.ctx);
    bail!(
        "loading checkpoints is not wired into this build yet (needs the checkpoint, tokenizer and model-registry modules)"
    )
}
