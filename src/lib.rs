//! fucina: an LLM inference engine for Gemma and Qwen with build-time generated CUDA kernels.
//!
//! Layers, top to bottom: `server`/`cli` -> `chat` -> `engine` -> `model` (one forward per
//! architecture over the `backend` trait) -> `backend::{cpu, cuda}` -> generated kernels.
//! Weights come from `gguf` / `safetensors` through `weights`, decoded by `quant`.

pub mod chat;
pub mod cli;
pub mod engine;
pub mod model;
pub mod ops;
pub mod quant;
pub mod tokenizer;
pub mod backend;
pub mod arch;
pub mod gguf;
pub mod selftest;
pub mod kernels;
pub mod weights;
pub mod assets;
pub mod server;
