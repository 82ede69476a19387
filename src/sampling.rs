//! Sampling, below both the engine and the backends: the parameters of a request, the host
//! sampler (the CPU backend's, and the reference of the CUDA one) and the log-probs it reports.
//!
//! CPU sampling: penalties, temperature, top-k, top-p, min-p, a seeded RNG, logprobs.
//!
//! Order (the one vLLM and HF transformers share): repetition penalty (over prompt and output),
//! presence / frequency penalties (over output), EOS masking (`min_tokens`, `ignore_eos`),
//! logprobs taken here, then temperature, top-k, top-p, min-p, draw. Temperature 0 is greedy
//! (lowest id wins ties), bit-reproducible.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Log-probability of one token (natural log, of the model's distribution after penalties and
/// before temperature / truncation).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// Logprobs reported for one sampled token.
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobInfo {
    pub chosen: TokenLogprob,
    /// The `top_logprobs` most likely alternatives, most likely first.
    pub top: Vec<TokenLogprob>,
}

/// Sampling settings of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    pub seed: Option<u64>,
    /// HF-style multiplicative penalty over prompt and output tokens; 1 = off.
    pub repetition_penalty: f32,
    /// OpenAI-style additive penalties over output tokens; 0 = off.
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
        }
    }
}

/// Tokens below `max - CANDIDATE_WINDOW` (in logit units, after temperature) carry less than
/// e^-30 of the mass of the best one; they are left out of the sort for top-p / min-p.
const CANDIDATE_WINDOW: f32 = 30.0;

/// Per-request sampler state (RNG, output token counts).
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Counts of generated tokens (presence / frequency penalties).
    output_counts: HashMap<u32, u32>,
    /// Every token seen (prompt + output), for the repetition penalty.
    seen: Vec<bool>,
    scratch: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32], vocab: usize) -> Self {
        let seed = params.seed.unwrap_or_else(|| rand::rng().random());
        let mut seen = vec![false; vocab];
        if params.repetition_penalty != 1.0 {
            for &t in prompt {
                if let Some(s) = seen.get_mut(t as usize) {
                    *s = true;
                }
            }
        }
        Self {
            params,
            rng: StdRng::seed_from_u64(seed),
            output_counts: HashMap::new(),
            seen,
            scratch: Vec::new(),
        }
    }

    /// Record a token as generated (sampled or forced).
    pub fn accept(&mut self, id: u32) {
        *self.output_counts.entry(id).or_insert(0) += 1;
        if let Some(s) = self.seen.get_mut(id as usize) {
            *s = true;
        }
    }

    /// Pick the next token from `logits` (modified in place). `masked` ids are never chosen.
    /// Returns the id and, when `logprobs` is `Some(k)`, its logprob and the top `k`.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        masked: &[u32],
        logprobs: Option<usize>,
    ) -> (u32, Option<LogprobInfo>) {
        self.apply_penalties(logits);
        for &m in masked {
            if let Some(l) = logits.get_mut(m as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        let id = if self.params.temperature <= 0.0 {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        let info = logprobs.map(|k| logprob_info(logits, id, k));
        (id, info)
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 && p.repetition_penalty > 0.0 {
            for (l, &seen) in logits.iter_mut().zip(&self.seen) {
                if seen {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &n) in &self.output_counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return argmax(logits);
        }
        // Candidates within the window, scaled by temperature, best first.
        let cut = max - CANDIDATE_WINDOW * p.temperature.max(1.0);
        let c = &mut self.scratch;
        c.clear();
        c.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, &l)| l >= cut)
                .map(|(i, &l)| (i as u32, (l - max) * inv_t)),
        );
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, cmp_desc);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(cmp_desc);
        // Softmax over candidates.
        let mut sum = 0.0f32;
        for e in c.iter_mut() {
            e.1 = e.1.exp();
            sum += e.1;
        }
        for e in c.iter_mut() {
            e.1 /= sum;
        }
        if p.top_p < 1.0 && p.top_p > 0.0 {
            let mut acc = 0.0;
            let mut keep = c.len();
            for (i, e) in c.iter().enumerate() {
                acc += e.1;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = c[0].1 * p.min_p;
            c.retain(|e| e.1 >= floor);
        }
        let total: f32 = c.iter().map(|e| e.1).sum();
        let mut u = self.rng.random::<f32>() * total;
        for e in c.iter() {
            if u < e.1 {
                return e.0;
            }
            u -= e.1;
        }
        c.last().map(|e| e.0).unwrap_or(0)
    }
}

fn cmp_desc(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Index of the largest value; the lowest index wins ties, NaN never (`ops::sample::argmax`).
pub fn argmax(xs: &[f32]) -> u32 {
    crate::ops::sample::argmax(xs) as u32
}

/// log_softmax of `logits` at `id`, plus the `k` most likely tokens.
fn logprob_info(logits: &[f32], id: u32, k: usize) -> LogprobInfo {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
    let lp = |i: u32| logits[i as usize] - lse;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k);
    if k > 0 {
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let k = k.min(all.len());
        all.select_nth_unstable_by(k - 1, cmp_desc);
        all.truncate(k);
        all.sort_unstable_by(cmp_desc);
        top = all;
    }
    LogprobInfo {
        chosen: TokenLogprob {
            id,
            logprob: lp(id),
        },
        top: top
            .into_iter()
            .map(|(i, _)| TokenLogprob {
                id: i,
                logprob: lp(i),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(t: f32) -> SamplingParams {
        SamplingParams {
            temperature: t,
            seed: Some(7),
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_argmax_lowest_on_tie() {
        let mut s = Sampler::new(params(0.0), &[], 4);
        let (id, _) = s.sample(&mut [1.0, 3.0, 3.0, 0.0], &[], None);
        assert_eq!(id, 1);
    }

    #[test]
    fn masked_tokens_never_chosen() {
        let mut s = Sampler::new(params(0.0), &[], 3);
        let (id, _) = s.sample(&mut [5.0, 1.0, 0.0], &[0], None);
        assert_eq!(id, 1);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_distribution() {
        let logits = [0.0f32, (3.0f32).ln(), f32::NEG_INFINITY];
        let run = |seed| {
            let mut s = Sampler::new(
                SamplingParams {
                    seed: Some(seed),
                    ..params(1.0)
                },
                &[],
                3,
            );
            (0..4000)
                .map(|_| s.sample(&mut logits.clone(), &[], None).0)
                .collect::<Vec<_>>()
        };
        let a = run(1);
        assert_eq!(a, run(1));
        assert_ne!(a, run(2));
        let ones = a.iter().filter(|&&x| x == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "p(1) = {ones}");
        assert!(!a.contains(&2));
    }

    #[test]
    fn top_k_top_p_min_p_truncate() {
        // probabilities 0.5, 0.25, 0.125, 0.125
        let logits = [3.0f32, 2.0, 1.0, 1.0].map(|x| x * std::f32::consts::LN_2);
        let seen = |p: SamplingParams| {
            let mut s = Sampler::new(p, &[], 4);
            let mut v: Vec<u32> = (0..2000)
                .map(|_| s.sample(&mut logits.clone(), &[], None).0)
                .collect();
            v.sort();
            v.dedup();
            v
        };
        assert_eq!(
            seen(SamplingParams {
                top_k: 2,
                ..params(1.0)
            }),
            vec![0, 1]
        );
        assert_eq!(
            seen(SamplingParams {
                top_p: 0.7,
                ..params(1.0)
            }),
            vec![0, 1]
        );
        assert_eq!(
            seen(SamplingParams {
                top_p: 0.5,
                ..params(1.0)
            }),
            vec![0]
        );
        assert_eq!(
            seen(SamplingParams {
                min_p: 0.3,
                ..params(1.0)
            }),
            vec![0, 1]
        );
        assert_eq!(seen(params(1.0)), vec![0, 1, 2, 3]);
    }

    #[test]
    fn penalties_follow_hf_and_openai_definitions() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            ..params(0.0)
        };
        let mut s = Sampler::new(p, &[0, 1], 4);
        s.accept(2);
        s.accept(2);
        let mut l = [4.0f32, -4.0, 1.0, 1.0];
        s.apply_penalties(&mut l);
        // 0 and 1 seen in the prompt: 4/2, -4*2; 2 generated twice: 1/2 - 0.5 - 0.5.
        assert_eq!(l, [2.0, -8.0, -0.5, 1.0]);
    }

    #[test]
    fn logprobs_are_log_softmax_with_top_k() {
        let mut s = Sampler::new(params(0.0), &[], 3);
        let (id, info) = s.sample(&mut [0.0, (3.0f32).ln(), f32::NEG_INFINITY], &[], Some(2));
        let info = info.unwrap();
        assert_eq!(id, 1);
        assert!((info.chosen.logprob - 0.75f32.ln()).abs() < 1e-6);
        assert_eq!(info.top.len(), 2);
        assert_eq!(info.top[1].id, 0);
        assert!((info.top[1].logprob - 0.25f32.ln()).abs() < 1e-6);
    }

    /// `ops::penalties` (the GPU kernel's reference, over a count array) is bit-identical to
    /// the sampler's penalties + mask on random logits and histories.
    #[test]
    fn count_array_penalties_match_the_sampler() {
        use crate::ops::penalties::{apply, count, initial_counts, Penalties};
        let mut rng = StdRng::seed_from_u64(11);
        let vocab = 500;
        for case in 0..40 {
            let p = SamplingParams {
                repetition_penalty: [1.0, 1.3, 0.8, 2.0][case % 4],
                presence_penalty: [0.0, 0.5, -0.3][case % 3],
                frequency_penalty: [0.0, 0.25, 1.1, -0.2][case % 4],
                ..params(0.0)
            };
            let pen = Penalties {
                repetition: p.repetition_penalty,
                presence: p.presence_penalty,
                frequency: p.frequency_penalty,
            };
            let prompt: Vec<u32> = (0..30).map(|_| rng.random_range(0..vocab as u32)).collect();
            let mut s = Sampler::new(p, &prompt, vocab);
            let mut c = initial_counts(&prompt, vocab, &pen);
            for _ in 0..50 {
                let t = rng.random_range(0..vocab as u32 / 4);
                s.accept(t);
                count(&mut c, t);
            }
            let logits: Vec<f32> = (0..vocab)
                .map(|_| rng.random::<f32>() * 20.0 - 10.0)
                .collect();
            let banned = [3u32, 77, 9999];
            let mut a = logits.clone();
            s.apply_penalties(&mut a);
            for &b in &banned {
                if let Some(l) = a.get_mut(b as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            let mut b = logits.clone();
            apply(&mut b, &c, &pen, &banned);
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "case {case}");
        }
    }
}
