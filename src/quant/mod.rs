//! Weight storage formats and their reference (CPU, f32) dequantisation.
//!
//! `GgmlType` covers the GGUF block types; `fp8`/`fp4` hold the scalar float codecs used by
//! safetensors checkpoints. Every dequantiser follows the operation order of the `gguf` Python
//! package so results are bit-exact against it (see `tests/quant_reference.rs`).

pub mod fp;
pub mod ggml;
pub mod repack;

pub use fp::{bf16_to_f32, e2m1_to_f32, e4m3_to_f32, f16_to_f32, f32_to_e4m3};
pub use ggml::{dequantize, dequantize_row, GgmlType};

/// Errors from decoding quantised data.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("unknown GGML tensor type id {0}")]
    UnknownType(u32),
    #[error("GGML type {0:?} is not supported (supported: {1})")]
    Unsupported(GgmlType, &'static str),
    #[error("{ty:?}: {elements} elements is not a multiple of the block size {block}")]
    Misaligned {
        ty: GgmlType,
        elements: usize,
        block: usize,
    },
    #[error("{ty:?}: need {need} bytes for {elements} elements, got {got}")]
    ShortData {
        ty: GgmlType,
        elements: usize,
        need: usize,
        got: usize,
    },
}
