//! The architectures fucina runs, and their detection from a checkpoint (never from a flag).

mod detect;

pub use detect::{detect, text_prefix};

/// A supported model architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    Gemma3,
    Gemma4,
    Gemma4Assistant,
    Qwen3,
    Qwen3Moe,
    Qwen35,
    Qwen35Moe,
    DiffusionGemma,
}

impl Arch {
    pub const ALL: [Arch; 8] = [
        Arch::Gemma3,
        Arch::Gemma4,
        Arch::Gemma4Assistant,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Qwen35,
        Arch::Qwen35Moe,
        Arch::DiffusionGemma,
    ];

    /// The GGUF `general.architecture` name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Gemma4 => "gemma4",
            Arch::Gemma4Assistant => "gemma4-assistant",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::DiffusionGemma => "diffusion-gemma",
        }
    }

    /// The HF transformers `model_type` of the text model (what text-only checkpoints carry).
    pub fn hf_model_type(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3_text",
            Arch::Gemma4 => "gemma4_text",
            Arch::Gemma4Assistant => "gemma4_assistant",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Qwen35 => "qwen3_5_text",
            Arch::Qwen35Moe => "qwen3_5_moe_text",
            Arch::DiffusionGemma => "diffusion_gemma",
        }
    }

    /// From a GGUF `general.architecture` value.
    pub fn from_gguf(s: &str) -> Option<Arch> {
        Some(match s {
            "gemma3" => Arch::Gemma3,
            "gemma4" => Arch::Gemma4,
            "gemma4-assistant" | "gemma4_assistant" => Arch::Gemma4Assistant,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "qwen35" => Arch::Qwen35,
            "qwen35moe" => Arch::Qwen35Moe,
            "diffusion-gemma" | "diffusion_gemma" => Arch::DiffusionGemma,
            _ => return None,
        })
    }

    /// From an HF `model_type` (wrapper or `*_text`).
    pub fn from_model_type(s: &str) -> Option<Arch> {
        Some(match s {
            "gemma3" | "gemma3_text" => Arch::Gemma3,
            "gemma4" | "gemma4_text" => Arch::Gemma4,
            "gemma4_assistant" | "gemma4-assistant" => Arch::Gemma4Assistant,
            "qwen3" => Arch::Qwen3,
            "qwen3_moe" => Arch::Qwen3Moe,
            "qwen3_5" | "qwen3_5_text" => Arch::Qwen35,
            "qwen3_5_moe" | "qwen3_5_moe_text" => Arch::Qwen35Moe,
            "diffusion_gemma" | "diffusion_gemma_text" => Arch::DiffusionGemma,
            _ => return None,
        })
    }

    /// From an HF `architectures` class name.
    pub fn from_hf_class(s: &str) -> Option<Arch> {
        Some(match s {
            "Gemma3ForCausalLM" | "Gemma3ForConditionalGeneration" | "Gemma3TextModel" => {
                Arch::Gemma3
            }
            "Gemma4ForCausalLM" | "Gemma4ForConditionalGeneration" | "Gemma4TextModel" => {
                Arch::Gemma4
            }
            "Gemma4AssistantForCausalLM" => Arch::Gemma4Assistant,
            "Qwen3ForCausalLM" => Arch::Qwen3,
            "Qwen3MoeForCausalLM" => Arch::Qwen3Moe,
            "Qwen3_5ForCausalLM" | "Qwen3_5ForConditionalGeneration" => Arch::Qwen35,
            "Qwen3_5MoeForCausalLM" | "Qwen3_5MoeForConditionalGeneration" => Arch::Qwen35Moe,
            "DiffusionGemmaForBlockDiffusion" => Arch::DiffusionGemma,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a checkpoint names its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// llama.cpp names (`blk.N.attn_q.weight`, `token_embd.weight`).
    Gguf,
    /// transformers text-only checkpoint: `model.layers.N...`.
    HfText,
    /// transformers multimodal wrapper: `model.language_model.layers.N...`.
    HfMultimodal,
}

/// What `detect` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub arch: Arch,
    pub layout: Layout,
    /// Prefix of the text model's tensors: `""` (GGUF), `"model."`, `"model.language_model."`.
    pub text_prefix: String,
}

/// Why a checkpoint's architecture could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum ArchError {
    #[error("unsupported architecture: {found} (supported: {supported})")]
    Unsupported { found: String, supported: String },
    #[error("cannot tell the architecture: {0}")]
    Unknown(String),
}

/// "gemma3, gemma4, ..." for messages.
pub fn supported_list() -> String {
    Arch::ALL
        .iter()
        .map(|a| format!("{} ({})", a.name(), a.hf_model_type()))
        .collect::<Vec<_>>()
        .join(", ")
}
