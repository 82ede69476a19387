//! fucina: an LLM inference engine for Gemma and Qwen with build-time generated CUDA kernels.
//!
//! Layers, top to bottom: `server`/`cli` -> `chat` -> `engine` -> `model` (one forward per
//! architecture over the `backend` trait) -> `backend::{cpu, cuda}` -> generated kernels.
//! Weights come from `gguf` / `safetensors` through `weights`, decoded by `quant`.

pub mod arch;
pub mod assets;
pub mod backend;
pub mod bench;
pub mod chat;
pub mod cli;
pub mod engine;
pub mod gguf;
pub mod kernels;
pub mod model;
pub mod ops;
pub mod quant;
pub mod sampling;
pub mod selftest;
pub mod server;
pub mod tokenizer;
pub mod tuning;
pub mod weights;
