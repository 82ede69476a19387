//! The device runtime under every op: driver probe, device context and module loading, the
//! memory pool and its buffers, CUDA graphs, the tensor / weight / KV-cache types, a resolved
//! kernel and its launch, and the background read of a sampled id.

pub mod buf;
#[cfg(feature = "profiling")]
pub(crate) mod dev_defines;
pub(crate) mod device;
pub(crate) mod error;
pub mod graph;
#[cfg(feature = "profiling")]
pub(crate) mod graph_ablate;
pub(crate) mod kern;
pub(crate) mod probe;
pub(crate) mod readback;
pub mod types;
