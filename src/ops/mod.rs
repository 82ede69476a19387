//! Reference operators: plain f32 Rust, written to be obviously right.
//!
//! These are the oracle every CUDA kernel and every whole model is checked against. Each function
//! works on slices in row-major order; nothing here allocates on behalf of the caller except where
//! a return value is documented. Performance matters only in so far as the CPU backend must stay
//! usable; clarity wins every tie.

pub mod activation;
pub mod compare;
pub mod norm;
pub mod rope;
pub mod softmax;

pub use activation::{geglu, gelu_tanh, sigmoid, silu, softcap, softplus, swiglu};
pub use norm::{rms_norm, NormWeight};
pub use rope::{rope, RopeLayout, RopeSpec};
pub use softmax::{log_softmax, softmax};
pub mod attention_ref;
pub mod gemm_ref;
pub mod penalties;
pub mod qdot;
pub mod sample;
