//! Projections: activation quantisation, the decode GEMVs (with their fused GLU and
//! deferred-norm entries), the tensor-core GEMMs of prefill.

pub mod gemm_pipe;
pub mod glu;
pub mod launch;
pub mod res;
