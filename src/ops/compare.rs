//! How an output is judged against its reference: the metrics the CPU tests, the golden tests
//! and `fucina selftest` share.
//!
//! - [`Comparison`]: element by element, each error relative to the element (or to the
//!   reference's RMS near zero); unwritten (NaN) outputs counted. One op's output.
//! - [`PeakErr`]: the largest absolute error relative to the reference's largest magnitude, per
//!   row (the golden metric: logits of a position against HF's).

/// An output against its reference, element by element (what `fucina selftest` and the CPU
/// backend's tests judge an op by).
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

/// The largest absolute error of rows against their references, and that error relative to the
/// row's peak reference magnitude (`max_i |got_i - want_i| / max_i |want_i|`), maximised over
/// the rows folded in with [`PeakErr::add`]. A NaN output makes both infinite.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeakErr {
    pub abs: f64,
    pub rel: f64,
}

impl PeakErr {
    /// The error of one row.
    pub fn of(got: &[f32], want: &[f32]) -> PeakErr {
        let mut e = PeakErr::default();
        e.add(got, want.iter().map(|&w| w as f64));
        e
    }

    /// Fold in one row (`got` against `want`, the same length).
    pub fn add(&mut self, got: &[f32], want: impl Iterator<Item = f64> + Clone) {
        let scale = want.clone().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
        let same_len = want.clone().count() == got.len();
        let abs = got.iter().zip(want).fold(0f64, |m, (g, w)| {
            let d = (*g as f64 - w).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                m.max(d)
            }
        });
        let abs = if same_len { abs } else { f64::INFINITY };
        self.abs = self.abs.max(abs);
        self.rel = self.rel.max(abs / scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_metric() {
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

    #[test]
    fn peak_metric() {
        let e = PeakErr::of(&[1.0, -2.0, 4.5], &[1.0, -2.0, 4.0]);
        assert_eq!(e.abs, 0.5);
        assert_eq!(e.rel, 0.125);
        let mut e = PeakErr::default();
        e.add(&[0.0, 1.0], [0.0, 2.0].into_iter());
        e.add(&[3.0, 3.0], [3.0, 3.0].into_iter());
        assert_eq!(e, PeakErr { abs: 1.0, rel: 0.5 });
        assert!(PeakErr::of(&[f32::NAN], &[1.0]).rel.is_infinite());
        assert!(PeakErr::of(&[1.0], &[1.0, 2.0]).abs.is_infinite());
    }
}
