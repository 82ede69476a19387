//! Norms, RoPE, softmax, GLU, elementwise arithmetic, embedding, casts and the fused residual
//! add + norm.

pub mod add_norm;
pub mod launch;
pub mod rows;
pub mod slice;
