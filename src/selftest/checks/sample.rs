//! GPU sampler vs its CPU twin `ops::sample`: 64 rows of a 262144-token vocabulary under mixed
//! settings (greedy, temperature, top-k, top-p, min-p and combinations), 4 draws each. Every
//! token must be in the CPU's kept set, at most 2% of draws may differ from the CPU draw (an
//! exp() rounding can move a boundary), and a second run must repeat every token exactly.
//! The reported error is the number of violations.

use super::super::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};
use crate::backend::cuda::CudaError;
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::sample::{argmax, draw, kept, SampleParams};
use rand::Rng;

pub struct SampleCheck;

impl KernelCheck for SampleCheck {
    fn name(&self) -> &'static str {
        "sample"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Sample
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let v = 262_144usize;
        let sp = |temperature, top_k, top_p, min_p| SampleParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 0,
        };
        let settings = [
            sp(0.0, 0, 1.0, 0.0),
            sp(1.0, 0, 1.0, 0.0),
            sp(0.7, 40, 1.0, 0.0),
            sp(0.8, 0, 0.9, 0.0),
            sp(1.0, 0, 1.0, 0.05),
            sp(0.6, 20, 0.95, 0.0),
            sp(1.5, 64, 0.8, 0.02),
            sp(1.0, 1, 1.0, 0.0),
        ];
        let rows = 64usize;
        let params: Vec<SampleParams> = (0..rows)
            .map(|i| SampleParams {
                seed: 1000 + i as u64,
                ..settings[i % settings.len()]
            })
            .collect();
        let logits: Vec<f32> = (0..rows * v)
            .map(|_| (cx.rng.random::<f32>() - 0.5) * 12.0)
            .collect();
        let kept_w: Vec<Option<Vec<u64>>> = (0..rows)
            .map(|r| kept(&logits[r * v..(r + 1) * v], &params[r]))
            .collect();
        let (dl, dp) = (cx.dev.upload(&logits)?, cx.dev.upload(&params)?);
        let steps = 4u32;
        let (mut mismatch, mut outside, mut irreproducible) = (0usize, 0usize, 0usize);
        let mut first: Vec<i32> = Vec::new();
        for rep in 0..2 {
            let mut counters = cx.dev.upload(&vec![0u32; rows])?;
            let mut out = cx.dev.upload(&vec![-1i32; rows])?;
            let mut all = Vec::new();
            for step in 0..steps {
                cx.dev.sample(spec, &dl, v, &dp, &mut counters, &mut out)?;
                let got = cx.dev.download(&out)?;
                if rep == 0 {
                    for (r, &t) in got.iter().enumerate() {
                        if t < 0 || t as usize >= v {
                            outside += 1;
                            continue;
                        }
                        let want = match &kept_w[r] {
                            Some(w) => draw(w, params[r].seed, step).unwrap_or(usize::MAX),
                            None => argmax(&logits[r * v..(r + 1) * v]),
                        };
                        mismatch += usize::from(want != t as usize);
                        if let Some(w) = &kept_w[r] {
                            outside += usize::from(w[t as usize] == 0);
                        }
                    }
                }
                all.extend(got);
            }
            if rep == 0 {
                first = all;
            } else {
                irreproducible = first.iter().zip(&all).filter(|(a, b)| a != b).count();
            }
        }
        let draws = rows * steps as usize;
        let excess = mismatch.saturating_sub(draws / 50);
        let violations = (outside + excess + irreproducible) as f64;
        let cmp = Comparison {
            max_rel_err: violations,
            unwritten: 0,
            elements: draws,
        };
        let mut counters = cx.dev.upload(&vec![0u32; rows])?;
        let mut out = cx.dev.upload(&vec![-1i32; rows])?;
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters.min(5), || {
            dev.sample(spec, &dl, v, &dp, &mut counters, &mut out)
        })?;
        Ok(Measured { cmp, micros })
    }
}
