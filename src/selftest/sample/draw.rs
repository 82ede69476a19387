//! GPU sampler vs its CPU twin `ops::sample` and vs its own single-block entry: 64 rows of a
//! 262144-token vocabulary and 24 rows of 151936 (38 blocks, the last one partial; odd rows
//! integer logits, so thousands of ids tie at the top-k boundary, even rows spread over +-60, so
//! the per-block candidates without top-k leave ids out) under mixed settings (greedy,
//! temperature, top-k, top-p, min-p and combinations), 4 draws each. Every token must be in the
//! CPU's kept set, at most 2% of draws may differ from the CPU draw (an exp() rounding can move a
//! boundary), every draw must equal the single-block kernel's (`__one_block`: the same filters
//! over the whole row, where the multi-block kernel walks per-block top-k candidates), and a
//! second run must repeat every token exactly. Both entries' hand-over outputs (the pipelined
//! decode's: the next step's `[id, position]` and a mapped host word) must carry the drawn id,
//! and a hand-over to two rows must be refused. The reported error is the number of violations;
//! the time is one greedy row of 151936 logits (a decode step's sampler).

use crate::backend::cuda::{
    sample_scratch_words, CudaError, DevPtr, SampleHandover, TokenReadback,
};
use crate::kernels::{KernelKey, KernelSpec, Op};
use crate::ops::sample::{argmax, draw, kept, SampleParams};
use crate::selftest::check::{time_us, CheckCtx, Comparison, KernelCheck, Measured};
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
        let mut violations = 0usize;
        let mut draws = 0usize;
        for (v, rows, ties) in [(262_144usize, 64usize, false), (151_936, 24, true)] {
            let (n, d) = vocab_case(cx, spec, v, rows, ties)?;
            violations += n;
            draws += d;
        }
        let (n, d) = handover_case(cx, spec)?;
        violations += n;
        draws += d;
        let cmp = Comparison {
            max_rel_err: violations as f64,
            unwritten: 0,
            elements: draws,
        };
        // one decode step's sampler: greedy over Qwen3's 151936 logits
        let v = 151_936usize;
        let logits: Vec<f32> = (0..v).map(|_| cx.rng.random::<f32>() * 10.0).collect();
        let p = SampleParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        };
        let (dl, dp) = (cx.dev.upload(&logits)?, cx.dev.upload(&[p])?);
        let mut counters = cx.dev.upload(&[0u32])?;
        let mut out = cx.dev.upload(&[-1i32])?;
        let mut scratch = cx.dev.upload(&vec![0u32; sample_scratch_words(v)])?;
        let dev = cx.dev;
        let micros = time_us(dev, cx.iters, || {
            dev.sample(
                spec,
                &dl,
                v,
                &dp,
                &mut counters,
                &mut out,
                Some(&mut scratch),
            )
        })?;
        Ok(Measured { cmp, micros })
    }
}

/// `rows` rows of `v` logits in +-6 (when `ties`: integers on odd rows, +-60 on even rows):
/// (violations, draws).
fn vocab_case(
    cx: &mut CheckCtx<'_>,
    spec: &'static KernelSpec,
    v: usize,
    rows: usize,
    ties: bool,
) -> Result<(usize, usize), CudaError> {
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
        sp(0.9, 1024, 1.0, 0.0),
        sp(1.1, 1025, 0.9, 0.0),
        sp(1.0, 3, 1.0, 0.0),
        sp(0.0, 50, 0.9, 0.1),
    ];
    let params: Vec<SampleParams> = (0..rows)
        .map(|i| SampleParams {
            seed: 1000 + i as u64,
            ..settings[i % settings.len()]
        })
        .collect();
    let mut logits: Vec<f32> = Vec::with_capacity(rows * v);
    for r in 0..rows {
        let (int, wide) = (ties && r % 2 == 1, ties && r % 2 == 0);
        logits.extend((0..v).map(|_| {
            let x = (cx.rng.random::<f32>() - 0.5) * 12.0;
            if int {
                x.round()
            } else if wide {
                x * 10.0
            } else {
                x
            }
        }));
    }
    let kept_w: Vec<Option<Vec<u64>>> = (0..rows)
        .map(|r| kept(&logits[r * v..(r + 1) * v], &params[r]))
        .collect();
    let (dl, dp) = (cx.dev.upload(&logits)?, cx.dev.upload(&params)?);
    let mut scratch = cx.dev.upload(&vec![0u32; rows * sample_scratch_words(v)])?;
    let steps = 4u32;
    let (mut mismatch, mut outside, mut irreproducible, mut differs) = (0, 0, 0, 0usize);
    let mut first: Vec<i32> = Vec::new();
    for rep in 0..2 {
        let mut counters = cx.dev.upload(&vec![0u32; rows])?;
        let mut out = cx.dev.upload(&vec![-1i32; rows])?;
        let mut ref_counters = cx.dev.upload(&vec![0u32; rows])?;
        let mut ref_out = cx.dev.upload(&vec![-1i32; rows])?;
        let mut all = Vec::new();
        for step in 0..steps {
            cx.dev.sample(
                spec,
                &dl,
                v,
                &dp,
                &mut counters,
                &mut out,
                Some(&mut scratch),
            )?;
            let got = cx.dev.download(&out)?;
            if rep == 0 {
                cx.dev
                    .sample(spec, &dl, v, &dp, &mut ref_counters, &mut ref_out, None)?;
                let one = cx.dev.download(&ref_out)?;
                differs += got.iter().zip(&one).filter(|(a, b)| a != b).count();
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
    Ok((outside + excess + irreproducible + differs, draws))
}

/// The hand-over outputs of both entries (greedy and sampled, one row of 151936 logits): the
/// feed must read `[id, 77]` and the mapped host word the id of `out`; a feed for two rows must
/// be refused. (violations, draws).
fn handover_case(
    cx: &mut CheckCtx<'_>,
    spec: &'static KernelSpec,
) -> Result<(usize, usize), CudaError> {
    let v = 151_936usize;
    let logits: Vec<f32> = (0..2 * v).map(|_| cx.rng.random::<f32>() * 8.0).collect();
    let dl = cx.dev.upload(&logits)?;
    let row = DevPtr::of(&dl)
        .slice(0, v)
        .ok_or_else(|| CudaError::Invalid {
            op: "sample",
            detail: "logits".into(),
        })?;
    let scratch = cx.dev.upload(&vec![0u32; 2 * sample_scratch_words(v)])?;
    let mut rb = TokenReadback::new()?;
    let (mut bad, mut draws) = (0usize, 0usize);
    for (temperature, top_k) in [(0.0f32, 0i32), (1.0, 40)] {
        let p = SampleParams {
            temperature,
            top_k,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
        };
        let dp = cx.dev.upload(&[p, p])?;
        for multi in [true, false] {
            let counters = cx.dev.upload(&[0u32, 0])?;
            let out = cx.dev.upload(&[-1i32, -1])?;
            let feed = cx.dev.upload(&[-1i32, -1])?;
            let hand = SampleHandover {
                feed: Some((DevPtr::of(&feed), 77)),
                mirror: Some(rb.device_word()),
            };
            let (pp, cp, op) = (DevPtr::of(&dp), DevPtr::of(&counters), DevPtr::of(&out));
            if multi {
                cx.dev
                    .sample_ptr(spec, row, v, pp, cp, op, DevPtr::of(&scratch), hand)?;
            } else {
                cx.dev
                    .sample_one_block_ptr(spec, row, v, pp, cp, op, hand)?;
            }
            rb.start_mirrored(cx.dev.stream())?;
            let host = rb.finish()?;
            let id = cx.dev.download(&out)?[0];
            let fed = cx.dev.download(&feed)?;
            draws += 1;
            bad += usize::from(id < 0 || id as usize >= v || host != id || fed != [id, 77]);
            // two rows cannot take one feed
            let two = DevPtr::of(&dl);
            let refused = cx
                .dev
                .sample_ptr(spec, two, v, pp, cp, op, DevPtr::of(&scratch), hand)
                .is_err();
            bad += usize::from(!refused);
        }
    }
    Ok((bad, draws))
}
