//! The per-op check interface and helpers shared by the checks. The comparison metric
//! ([`Comparison`]) is `crate::ops::compare`'s, shared with the CPU tests.

use rand::rngs::StdRng;
use rand::Rng;

use crate::backend::cuda::{CudaDevice, CudaError};
use crate::kernels::{KernelKey, KernelSpec};
pub use crate::ops::compare::Comparison;

/// Checks one op family's instances against the CPU reference (`crate::ops`).
///
/// Register an implementation in `src/selftest/registry.rs::all()`.
pub trait KernelCheck: Sync {
    /// Short name for messages.
    fn name(&self) -> &'static str;
    /// Does this check cover `key`? (Usually `key.op == Op::X`.)
    fn covers(&self, key: &KernelKey) -> bool;
    /// Bound on [`Comparison::max_rel_err`] for `key`.
    fn bound(&self, key: &KernelKey) -> f64;
    /// Run `spec` on fresh random inputs from `cx.rng` with NaN-poisoned outputs, compare with
    /// the CPU reference (all sub-cases folded with [`Comparison::merge`]), and time the main
    /// case with [`time_us`].
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError>;
}

/// What a check gets: the device, a seeded RNG and the timing iteration count.
pub struct CheckCtx<'a> {
    pub dev: &'a CudaDevice,
    pub rng: StdRng,
    pub iters: usize,
}

/// A check's result.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub cmp: Comparison,
    /// Mean microseconds per launch of the main case.
    pub micros: f64,
}

/// `n` uniform values in `[lo, hi)`.
pub fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// Mean microseconds per call of `launch` over `iters` calls (after one warm-up), measured
/// with CUDA events on the device's stream.
pub fn time_us(
    dev: &CudaDevice,
    iters: usize,
    mut launch: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    use cudarc::driver::sys::CUevent_flags;
    let drv = |what: &'static str| {
        move |source| CudaError::Driver {
            context: what.into(),
            source,
        }
    };
    launch()?;
    let iters = iters.max(1);
    let start = dev
        .stream()
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(drv("event"))?;
    for _ in 0..iters {
        launch()?;
    }
    let end = dev
        .stream()
        .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(drv("event"))?;
    let ms = start.elapsed_ms(&end).map_err(drv("event timing"))?;
    Ok(ms as f64 * 1000.0 / iters as f64)
}
