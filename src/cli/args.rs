//! Command-line flags (clap), each with a `FUCINA_*` environment fallback.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "fucina",
    version,
    about = "LLM inference engine for Gemma and Qwen: server (default), one-shot prompt, or REPL"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
    /// Log more: the tuning settings in effect (src/tuning.rs) and debug messages.
    #[arg(short = 'v', long, global = true)]
    pub verbose: bool,
    /// Run every decode step as separate launches instead of replaying a recorded CUDA graph
    /// (slower; to tell a graph problem from a kernel problem).
    #[arg(long = "no-graphs", global = true, env = "FUCINA_NO_GRAPHS")]
    pub no_graphs: bool,
    /// Where downloaded models are kept (default: <cache dir>/fucina/models).
    #[arg(long = "models-dir", global = true, env = "FUCINA_MODELS_DIR")]
    pub models_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Check every kernel variant and whole models against the CPU reference (GPU machine).
    Selftest(crate::selftest::SelftestArgs),
    /// Measure prefill, decode and memory on a GGUF (or a random-weight one at a real shape).
    Bench(crate::bench::BenchArgs),
}

pub use crate::backend::Device;

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// GGUF file, safetensors file or directory, or HF snapshot (default: the pinned Gemma 3 270M).
    #[arg(short = 'm', long = "model", env = "FUCINA_MODEL")]
    pub model: Option<PathBuf>,
    /// tokenizer.json or .gguf to take the vocabulary from (default: next to the weights).
    #[arg(long, env = "FUCINA_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,
    /// Backend to run on: auto (CUDA when available, else CPU), cpu or cuda.
    #[arg(long, value_enum, default_value = "auto", env = "FUCINA_DEVICE")]
    pub device: Device,
    /// KV cache element type on the GPU: f16, or fp8 (E4M3 with a scale per position and KV
    /// head: half the memory, log-probs further from the model's; docs/gpu-backend.md).
    #[arg(long = "kv-type", default_value = "f16", env = "FUCINA_KV_TYPE")]
    pub kv_type: crate::backend::KvType,
    /// Context size in tokens (clamped to the model's maximum).
    #[arg(long, default_value_t = 262144, env = "FUCINA_CTX")]
    pub ctx: usize,
    /// Sampling temperature (0 = greedy).
    #[arg(long, default_value_t = 1.0, env = "FUCINA_TEMP")]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long = "top-k", default_value_t = 64, env = "FUCINA_TOP_K")]
    pub top_k: usize,
    /// Top-p / nucleus (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95, env = "FUCINA_TOP_P")]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long = "min-p", default_value_t = 0.0, env = "FUCINA_MIN_P")]
    pub min_p: f32,
    /// RNG seed (default: random per request).
    #[arg(long, env = "FUCINA_SEED")]
    pub seed: Option<u64>,
    /// Repetition penalty over prompt and output (1 = off).
    #[arg(
        long = "repeat-penalty",
        default_value_t = 1.0,
        env = "FUCINA_REPEAT_PENALTY"
    )]
    pub repeat_penalty: f32,
    /// Default reasoning: off, on, low, mid, high, xhigh.
    #[arg(long, default_value = "off", env = "FUCINA_THINKING")]
    pub thinking: String,
    /// Thinking-token budget (overrides the level's).
    #[arg(long = "think-budget", env = "FUCINA_THINK_BUDGET")]
    pub think_budget: Option<usize>,
    /// System prompt (one-shot and REPL).
    #[arg(short = 's', long, env = "FUCINA_SYSTEM")]
    pub system: Option<String>,
    #[arg(long, default_value = "127.0.0.1", env = "FUCINA_HOST")]
    pub host: String,
    #[arg(long, default_value_t = 8080, env = "FUCINA_PORT")]
    pub port: u16,
    /// Key required on /v1/* (Bearer or x-api-key); empty = auth off.
    #[arg(long = "api-key", env = "FUCINA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Sequences decoding together (each step runs them all); on CUDA at most as many as the
    /// KV budget holds at the full context.
    #[arg(
        long = "max-concurrent",
        default_value_t = 64,
        env = "FUCINA_MAX_CONCURRENT"
    )]
    pub max_concurrent: usize,
    /// Requests that may wait beyond --max-concurrent; more get 503 + Retry-After.
    #[arg(long = "max-queue", default_value_t = 256, env = "FUCINA_MAX_QUEUE")]
    pub max_queue: usize,
    /// Tokens per engine step: every running sequence's next token, then prompt chunks.
    #[arg(
        long = "max-batch-tokens",
        default_value_t = 2048,
        env = "FUCINA_MAX_BATCH_TOKENS"
    )]
    pub max_batch_tokens: usize,
    /// Absolute per-request output-token ceiling (0 = none).
    #[arg(
        long = "max-output-tokens",
        default_value_t = 0,
        env = "FUCINA_MAX_OUTPUT_TOKENS"
    )]
    pub max_output_tokens: usize,
    /// Per-request generation time limit in seconds.
    #[arg(long, env = "FUCINA_TIMEOUT")]
    pub timeout: Option<u64>,
    /// Unsafe opt-out: let control-token strings inside message content, tool results, tool
    /// arguments and documents become control tokens (the behaviour before content was kept
    /// text; anyone who can put text into a conversation can then close a turn or forge a tool
    /// call).
    #[arg(long = "special-in-content", env = "FUCINA_SPECIAL_IN_CONTENT")]
    pub special_in_content: bool,
    /// Fraction of the GPU memory left free after the weights that the KV cache may take (CUDA;
    /// caps the context).
    #[arg(
        long = "gpu-mem-util",
        default_value_t = 0.90,
        env = "FUCINA_GPU_MEM_UTIL"
    )]
    pub gpu_mem_util: f32,
    /// CUDA device ordinal.
    #[arg(long = "cuda-device", default_value_t = 0, env = "FUCINA_CUDA_DEVICE")]
    pub cuda_device: usize,
    /// Directory for saved conversations (REPL /save, /load).
    #[arg(long = "session-dir", env = "FUCINA_SESSION_DIR")]
    pub session_dir: Option<PathBuf>,
    /// Speculative decoding (not yet available).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", env = "FUCINA_SPEC")]
    pub spec: Option<String>,
    /// Max speculative draft length (not yet available).
    #[arg(long = "draft-k", env = "FUCINA_DRAFT_K")]
    pub draft_k: Option<usize>,
    /// Gemma 4 MTP draft-head GGUF (not yet available).
    #[arg(long, env = "FUCINA_ASSISTANT")]
    pub assistant: Option<PathBuf>,
    /// One-shot prompt.
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// One-shot prompt read from a file.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Tokens to generate in one-shot / REPL mode.
    #[arg(
        short = 'n',
        long = "predict",
        default_value_t = 512,
        env = "FUCINA_PREDICT"
    )]
    pub predict: usize,
    /// Send the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Interactive REPL.
    #[arg(short = 'i', long)]
    pub interactive: bool,
}
