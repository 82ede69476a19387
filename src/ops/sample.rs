//! Reference sampler, the CPU twin of the `sample` kernel (same filters, same integer weights,
//! same random stream), so a GPU draw can be checked token for token.
//!
//! Order of filters (as in transformers' logits warpers): temperature (x = logit * (1/T), both
//! roundings to nearest), top-k, top-p (over the top-k survivors), min-p. Weights are `floor(exp(x - max) * 2^32)` so sums are exact.

/// Per-row sampling parameters; `#[repr(C)]` matches the kernel's `SampleParams`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
pub struct SampleParams {
    /// <= 0 means greedy.
    pub temperature: f32,
    /// 0 (or >= vocabulary) disables.
    pub top_k: i32,
    /// >= 1 disables.
    pub top_p: f32,
    /// <= 0 disables.
    pub min_p: f32,
    pub seed: u64,
}

/// The kernel's counter-based random stream: a uniform in [0, 1) for (seed, counter).
pub fn uniform(seed: u64, counter: u32) -> f64 {
    (splitmix64(seed ^ splitmix64(counter as u64)) >> 11) as f64 * (1.0 / 9007199254740992.0)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Lowest index among the maxima, NaN never one of them (as the kernel's arg-max, which starts
/// from -inf); 0 when no logit is above -inf ([`has_finite_max`] tells that case apart).
pub fn argmax(logits: &[f32]) -> usize {
    let (mut best, mut bv) = (0, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > bv {
            best = i;
            bv = v;
        }
    }
    best
}

/// Whether some logit is above -inf (NaN is not): the case where the kernel's arg-max finds
/// an id.
pub fn has_finite_max(logits: &[f32]) -> bool {
    logits.iter().any(|&v| v > f32::NEG_INFINITY)
}

fn weight(x: f32, m: f32) -> u64 {
    ((x - m).exp() * 4294967296.0f32) as u64
}

/// Which tokens survive the filters (`None` when greedy), with their integer weights.
pub fn kept(logits: &[f32], p: &SampleParams) -> Option<Vec<u64>> {
    if p.temperature.is_nan() || p.temperature <= 0.0 || p.top_k == 1 || logits.is_empty() {
        return None;
    }
    let inv = 1.0 / p.temperature;
    let x: Vec<f32> = logits.iter().map(|&l| l * inv).collect();
    let m = x[argmax(logits)];
    let mut sorted = x.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut floor = f32::NEG_INFINITY;
    if p.top_k > 0 && (p.top_k as usize) < x.len() {
        floor = sorted[p.top_k as usize - 1];
    }
    if p.top_p < 1.0 {
        let surv: Vec<f32> = sorted.iter().cloned().filter(|&v| v >= floor).collect();
        let z: u64 = surv.iter().map(|&v| weight(v, m)).sum();
        let need = (p.top_p as f64 * z as f64) as u64;
        // boundary: first value (descending) whose inclusive cumulative weight reaches `need`,
        // among values with non-zero weight; ties are summed together
        let mut above = 0u64;
        let mut i = 0;
        while i < surv.len() {
            let v = surv[i];
            let mut j = i;
            let mut h = 0u64;
            while j < surv.len() && surv[j] == v {
                h += weight(surv[j], m);
                j += 1;
            }
            if h > 0 && above + h >= need {
                floor = floor.max(v);
                break;
            }
            above += h;
            i = j;
        }
    }
    Some(
        x.iter()
            .map(|&v| {
                let keep = v >= floor && (p.min_p <= 0.0 || (v - m).exp() >= p.min_p);
                if keep {
                    weight(v, m)
                } else {
                    0
                }
            })
            .collect(),
    )
}

/// The token the kernel draws for `logits` with `p` at stream position `counter`.
pub fn sample(logits: &[f32], p: &SampleParams, counter: u32) -> usize {
    match kept(logits, p) {
        Some(w) => draw(&w, p.seed, counter).unwrap_or_else(|| argmax(logits)),
        None => argmax(logits),
    }
}

/// The draw of [`sample`] from precomputed [`kept`] weights; `None` when nothing is kept.
pub fn draw(w: &[u64], seed: u64, counter: u32) -> Option<usize> {
    let total: u64 = w.iter().sum();
    let r = (uniform(seed, counter) * total as f64) as u64;
    let mut acc = 0u64;
    for (i, &wi) in w.iter().enumerate() {
        acc += wi;
        if wi > 0 && acc > r {
            return Some(i);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NaN is never the arg-max, wherever it stands; without a logit above -inf the arg-max
    /// falls back to 0 and `has_finite_max` says so.
    #[test]
    fn argmax_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 2.0]), 2);
        assert_eq!(argmax(&[0.5, f32::NAN, 0.25]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::INFINITY]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert!(has_finite_max(&[f32::NAN, -1e30]));
        assert!(!has_finite_max(&[f32::NAN, f32::NEG_INFINITY]));
        assert!(!has_finite_max(&[]));
    }

    fn params(t: f32, k: i32, tp: f32, mp: f32) -> SampleParams {
        SampleParams {
            temperature: t,
            top_k: k,
            top_p: tp,
            min_p: mp,
            seed: 7,
        }
    }

    #[test]
    fn greedy_takes_first_max() {
        assert_eq!(
            sample(&[1.0, 3.0, 3.0, 2.0], &params(0.0, 0, 1.0, 0.0), 0),
            1
        );
    }

    #[test]
    fn top_k_keeps_ties() {
        let w = kept(&[1.0, 3.0, 2.0, 2.0, 0.0], &params(1.0, 2, 1.0, 0.0)).unwrap();
        let k: Vec<bool> = w.iter().map(|&x| x > 0).collect();
        assert_eq!(k, vec![false, true, true, true, false]);
    }

    #[test]
    fn top_p_keeps_smallest_prefix() {
        // probabilities ~ 0.64, 0.24, 0.09, 0.03: top_p 0.7 keeps the first two
        let l = [3.0f32, 2.0, 1.0, 0.0];
        let w = kept(&l, &params(1.0, 0, 0.7, 0.0)).unwrap();
        assert_eq!(
            w.iter().map(|&x| x > 0).collect::<Vec<_>>(),
            vec![true, true, false, false]
        );
        let w = kept(&l, &params(1.0, 0, 0.5, 0.0)).unwrap();
        assert_eq!(w.iter().filter(|&&x| x > 0).count(), 1);
    }

    #[test]
    fn min_p_is_relative_to_max() {
        let l = [0.0f32, (0.2f32).ln(), (0.05f32).ln()];
        let w = kept(&l, &params(1.0, 0, 1.0, 0.1)).unwrap();
        assert_eq!(
            w.iter().map(|&x| x > 0).collect::<Vec<_>>(),
            vec![true, true, false]
        );
    }

    #[test]
    fn draws_follow_the_distribution_and_are_reproducible() {
        let l = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let p = params(1.0, 0, 1.0, 0.0);
        let ones = (0..4000).filter(|&c| sample(&l, &p, c) == 1).count();
        assert!((2850..3150).contains(&ones), "{ones}");
        assert_eq!(sample(&l, &p, 11), sample(&l, &p, 11));
    }
}
