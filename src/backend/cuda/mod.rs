//! CUDA runtime: driver probe, device context, module loading from PTX (through the on-disk
//! cache of `codegen::ptx`), and typed launch helpers for the generated kernels.
//!
//! cudarc loads libcuda lazily and panics when it is missing, so everything here goes through
//! [`cuda_available`] first, which probes the driver with a plain `dlopen` and never touches
//! cudarc when the driver is absent.

mod device;
mod error;
mod launch;
mod launch_decode;
mod launch_linear;
mod probe;

pub use device::CudaDevice;
pub use error::CudaError;
pub use launch::{GluShape, RopeLaunch};
pub use launch_decode::{AttnDecodeLaunch, AttnScratch};
pub use launch_linear::{gemv_default_grid, weight_block, Q8Activations};
pub use probe::cuda_available;

pub use cudarc::driver::{CudaSlice, CudaView};
