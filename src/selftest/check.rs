//! The per-op check interface, the comparison metric and helpers shared by the checks.

use rand::rngs::StdRng;
use rand::Rng;

use crate::backend::cuda::{CudaDevice, CudaError};
use crate::kernels::{KernelKey, KernelSpec};

/// Checks one op family's instances against the CPU reference (`crate::ops`).
///
/// Register an implementation in `src/selftest/checks/mod.rs::all()`.
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

/// GPU output vs reference.
///
/// Per element, `rel = |got - want| / max(|want|, rms(want))`: relative error for elements of
/// typical size or larger, error relative to the RMS of the reference for elements near zero
/// (where a pure relative error is meaningless). `max_rel_err` is the maximum over elements.
/// `unwritten` counts outputs that are still NaN (outputs are poisoned with NaN before the
/// launch) where the reference is not NaN; any such element fails the check.
#[derive(Debug, Clone, Copy, Default)]
pub struct Comparison {
    pub max_rel_err: f64,
    pub unwritten: usize,
    pub elements: usize,
}

impl Comparison {
    pub fn new(got: &[f32], want: &[f32]) -> Comparison {
        let mut c = Comparison {
            elements: want.len(),
            ..Default::default()
        };
        if got.len() != want.len() {
            c.max_rel_err = f64::INFINITY;
            return c;
        }
        let n = want.len().max(1) as f64;
        let rms = (want
            .iter()
            .filter(|v| v.is_finite())
            .map(|&v| (v as f64) * (v as f64))
            .sum::<f64>()
            / n)
            .sqrt();
        let floor = rms.max(1e-30);
        for (&g, &w) in got.iter().zip(want) {
            if w.is_nan() {
                continue;
            }
            if g.is_nan() {
                c.unwritten += 1;
                continue;
            }
            let err = if g == w {
                0.0
            } else {
                ((g as f64) - (w as f64)).abs() / (w.abs() as f64).max(floor)
            };
            let err = if err.is_nan() { f64::INFINITY } else { err };
            c.max_rel_err = c.max_rel_err.max(err);
        }
        c
    }

    /// `got` against `want` bit for bit (NaN payloads included): error 0 when every value
    /// has the same bits, 1 (an O(1) error, failing any bound below it) when one differs or
    /// the lengths differ. For outputs that must equal another kernel's exactly.
    pub fn identical(got: &[f32], want: &[f32]) -> Comparison {
        let same = got.len() == want.len()
            && got
                .iter()
                .zip(want)
                .all(|(g, w)| g.to_bits() == w.to_bits());
        Comparison {
            max_rel_err: if same { 0.0 } else { 1.0 },
            unwritten: 0,
            elements: want.len(),
        }
    }

    /// Fold another sub-case in.
    pub fn merge(self, o: Comparison) -> Comparison {
        Comparison {
            max_rel_err: self.max_rel_err.max(o.max_rel_err),
            unwritten: self.unwritten + o.unwritten,
            elements: self.elements + o.elements,
        }
    }

    pub fn passes(&self, bound: f64) -> bool {
        self.unwritten == 0
            && self.max_rel_err.is_finite()
            && self.max_rel_err <= bound
            && self.elements > 0
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric() {
        let want = [1.0f32, -2.0, 0.0, 4.0];
        assert_eq!(Comparison::new(&want, &want).max_rel_err, 0.0);
        let c = Comparison::new(&[1.0, -2.0, f32::NAN, 4.0], &want);
        assert_eq!(c.unwritten, 1);
        assert!(!c.passes(1.0));
        // near-zero element judged against rms (= sqrt(21/4) ~ 2.29)
        let c = Comparison::new(&[1.0, -2.0, 0.01, 4.0], &want);
        assert!((c.max_rel_err - 0.01 / (21.0f64 / 4.0).sqrt()).abs() < 1e-9);
        let c = Comparison::new(&[1.0, -2.0, 0.0, 4.4], &want);
        assert!((c.max_rel_err - 0.1).abs() < 1e-6 && c.passes(0.11) && !c.passes(0.09));
        assert!(!Comparison::new(&[1.0], &want).passes(1e9));
        let inf = Comparison::new(&[f32::INFINITY, -2.0, 0.0, 4.0], &want);
        assert!(!inf.passes(1e9));
        assert!(Comparison::identical(&want, &want).passes(0.0));
        assert!(!Comparison::identical(&[1.0, -2.0, -0.0, 4.0], &want).passes(0.5));
        assert!(!Comparison::identical(&want[..3], &want).passes(0.5));
    }
}
