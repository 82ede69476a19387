//! The Qwen families (Qwen3 dense, Qwen3-MoE, Qwen3.5/3.6 hybrid dense and MoE): one decoder
//! written over the Backend trait, configured per variant and layout.

pub mod config;
pub mod gdn;
pub mod load;
pub mod model;
pub mod names;

pub use config::{QwenConfig, Variant};
pub use model::{QwenModel, QwenSession};
pub use names::Names;
