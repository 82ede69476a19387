//! The generated kernel registry: every instance of `kernel-templates/manifest.toml`, rendered
//! to CUDA C at build time (`build.rs`), looked up by its typed [`KernelKey`].
//!
//! `supports(&key)` / `get(&key)` answer from one table; an instance that was not built is a
//! typed error ([`KernelError::NotInstantiated`]) the caller can fall back from, never an abort.
//! Kernel names come only from `codegen::entry_name` (through [`KernelSpec::name`]); an
//! instance's secondary entries are [`Entry`] variants the registry lists per instance
//! ([`KernelSpec::entry`], [`supports_entry`]).

mod registry;

pub use codegen::entries::Entry;
pub use codegen::key::{entry_name, BatchBucket, HeadDim, KernelKey, Op, Quant, SmArch};
pub use registry::{
    get, instances_for_arch, resolve, supports, supports_entry, KernelSpec, KERNELS,
};

/// Errors of kernel lookup, compilation and launch.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// No instance with this key is in the build set (see `kernel-templates/manifest.toml`).
    #[error("kernel {key} is not instantiated (add it to kernel-templates/manifest.toml)")]
    NotInstantiated { key: KernelKey },
    /// No instance of this op/quant/head_dim/batch for any arch the device can run.
    #[error(
        "no instance of {op} quant={quant} head_dim={head_dim} batch={batch} for compute capability {major}.{minor}"
    )]
    NoVariantForDevice {
        op: Op,
        quant: Quant,
        head_dim: HeadDim,
        batch: BatchBucket,
        major: u32,
        minor: u32,
    },
}
