//! The Gemma decoder shared by Gemma 3 and Gemma 4 (and the Gemma 4 MTP head's layers): one
//! forward pass over the `Backend` trait, configured by a resolved `spec::GemmaSpec`. The
//! per-family modules (`model::gemma3`, `model::gemma4`) turn checkpoint metadata into a spec.

pub mod config;
pub mod decoder;
pub mod layers;
pub mod moe;
pub mod spec;
pub mod weights;

pub use decoder::{GemmaModel, GemmaSession};
pub use spec::{GemmaSpec, LayerSpec, MoeSpec, Naming, NormForm};
