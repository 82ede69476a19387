//! GPU sampler penalties vs the CPU: (1) `penalties` + `__ban` on a 262144-token row under mixed
//! settings must equal `ops::penalties::apply` bit for bit (bound 0: the kernel rounds every
//! operation like the CPU); (2) `__count` from a device id and from an immediate id must equal
//! `ops::penalties::count`; (3) a 24-step generation chain on the device (penalties -> ban ->
//! `sample` -> count of the sampled id, history only on the device) must pick exactly the tokens
//! of `engine::Sampler` for greedy, and for seeded sampling the tokens of the CPU twin chain
//! (`ops::penalties` + `ops::sample`), with at most 2% of draws off by an exp() rounding at a
//! filter boundary. The reported error is the largest relative difference of (1) plus the
//! number of violations of (2) and (3).

use crate::backend::cuda::{kernel_params, sample_scratch_words, CudaError, DevPtr};
use crate::kernels::{BatchBucket, HeadDim, KernelKey, KernelSpec, Op, Quant};
use crate::ops::penalties::{apply, count, initial_counts, Penalties, PROMPT_BIT};
use crate::ops::sample::{kept, sample, SampleParams};
use crate::sampling::{Sampler, SamplingParams};
use crate::selftest::check::{time_us, uniform, CheckCtx, Comparison, KernelCheck, Measured};
use rand::Rng;

pub struct PenaltiesCheck;

const V: usize = 262_144;

impl KernelCheck for PenaltiesCheck {
    fn name(&self) -> &'static str {
        "penalties"
    }
    fn covers(&self, key: &KernelKey) -> bool {
        key.op == Op::Penalties
    }
    fn bound(&self, _: &KernelKey) -> f64 {
        0.0
    }
    fn run(&self, cx: &mut CheckCtx<'_>, spec: &'static KernelSpec) -> Result<Measured, CudaError> {
        let dev = cx.dev;
        // (1) penalties + bans on one row
        let settings = [
            (1.3f32, 0.0f32, 0.0f32),
            (1.0, 0.5, 0.25),
            (0.7, -0.4, 1.1),
            (2.0, 0.6, 0.3),
        ];
        let banned: Vec<u32> = vec![7, 1, 262_143, 300_000, 7];
        let banned_i: Vec<i32> = banned.iter().map(|&b| b as i32).collect();
        let mut cmp = Comparison::default();
        let mut violations = 0usize;
        let mut last = None;
        for &(repetition, presence, frequency) in &settings {
            let p = Penalties {
                repetition,
                presence,
                frequency,
            };
            let logits = uniform(&mut cx.rng, V, -12.0, 12.0);
            let prompt: Vec<u32> = (0..2000)
                .map(|_| cx.rng.random_range(0..V as u32))
                .collect();
            let mut counts = initial_counts(&prompt, V, &p);
            for _ in 0..5000 {
                let t = cx.rng.random_range(0..V as u32 / 8);
                count(&mut counts, t);
            }
            let mut want = logits.clone();
            apply(&mut want, &counts, &p, &banned);
            let dl = dev.upload(&logits)?;
            let dc = dev.upload(&counts)?;
            let db = dev.upload(&banned_i)?;
            dev.penalties(spec, DevPtr::of(&dl), DevPtr::of(&dc), &p)?;
            dev.penalties_ban(spec, DevPtr::of(&dl), DevPtr::of(&db))?;
            let got = dev.download(&dl)?;
            cmp = cmp.merge(Comparison::new(&got, &want));
            last = Some((dl, dc, p));
        }

        // (2) counts from a device id and from an immediate id
        let mut counts = vec![0u32; V];
        counts[5] = PROMPT_BIT;
        let dc = dev.upload(&counts)?;
        let did = dev.upload(&[5i32])?;
        dev.penalties_count(spec, DevPtr::of(&did), 0, DevPtr::of(&dc))?;
        dev.penalties_count(spec, DevPtr::null(), 9, DevPtr::of(&dc))?;
        dev.penalties_count(spec, DevPtr::null(), -3, DevPtr::of(&dc))?;
        dev.penalties_count(spec, DevPtr::null(), V as i32, DevPtr::of(&dc))?;
        count(&mut counts, 5);
        count(&mut counts, 9);
        let got = dev.download(&dc)?;
        violations += got.iter().zip(&counts).filter(|(a, b)| a != b).count();

        // (3) generation chains on the device
        let sample_spec = dev.resolve(Op::Sample, Quant::F32, HeadDim::Any, BatchBucket::Any)?;
        let (mut off, mut draws) = (0usize, 0usize);
        for (temperature, seed) in [(0.0f32, 1u64), (0.9, 2), (1.2, 3)] {
            let sp = SamplingParams {
                temperature,
                top_k: 50,
                top_p: 0.95,
                min_p: 0.0,
                seed: Some(seed),
                repetition_penalty: 1.3,
                presence_penalty: 0.4,
                frequency_penalty: 0.2,
            };
            let pen = Penalties {
                repetition: sp.repetition_penalty,
                presence: sp.presence_penalty,
                frequency: sp.frequency_penalty,
            };
            let kp: SampleParams = kernel_params(&sp, seed);
            let prompt: Vec<u32> = (0..64).map(|_| cx.rng.random_range(0..64u32)).collect();
            let mut cpu_counts = initial_counts(&prompt, V, &pen);
            let mut engine = Sampler::new(sp.clone(), &prompt, V);
            let d_counts = dev.upload(&cpu_counts)?;
            let d_params = dev.upload(&[kp])?;
            let d_counter = dev.upload(&[0u32])?;
            let d_out = dev.upload(&[-1i32])?;
            let d_ban = dev.upload(&[3i32])?;
            let d_scratch = dev.upload(&vec![0u32; sample_scratch_words(V)])?;
            for step in 0..24u32 {
                // a peaked row over a few ids, so penalties and history decide the token
                let mut logits = uniform(&mut cx.rng, V, -8.0, 0.0);
                for l in logits.iter_mut().take(64) {
                    *l += 9.0 + cx.rng.random::<f32>();
                }
                let dl = dev.upload(&logits)?;
                let row = DevPtr::of(&dl);
                dev.penalties(spec, row, DevPtr::of(&d_counts), &pen)?;
                dev.penalties_ban(spec, row, DevPtr::of(&d_ban))?;
                dev.sample_ptr(
                    sample_spec,
                    row,
                    V,
                    DevPtr::of(&d_params),
                    DevPtr::of(&d_counter),
                    DevPtr::of(&d_out),
                    DevPtr::of(&d_scratch),
                    Default::default(),
                )?;
                dev.penalties_count(spec, DevPtr::of(&d_out), 0, DevPtr::of(&d_counts))?;
                let got = dev.download(&d_out)?[0];
                draws += 1;
                let want = if temperature <= 0.0 {
                    let (id, _) = engine.sample(&mut logits.clone(), &[3], None);
                    id as usize
                } else {
                    let mut l = logits.clone();
                    apply(&mut l, &cpu_counts, &pen, &[3]);
                    if let Some(w) = kept(&l, &kp) {
                        if got < 0 || got as usize >= V || w[got as usize] == 0 {
                            violations += 1;
                        }
                    }
                    sample(&l, &kp, step)
                };
                if got < 0 || got as usize >= V {
                    violations += 1;
                    break;
                }
                if temperature <= 0.0 {
                    violations += usize::from(got as usize != want);
                } else {
                    off += usize::from(got as usize != want);
                }
                // both sides continue from the device's token
                engine.accept(got as u32);
                count(&mut cpu_counts, got as u32);
            }
            let gpu_counts = dev.download(&d_counts)?;
            violations += usize::from(gpu_counts != cpu_counts);
        }
        violations += off.saturating_sub(draws / 50);
        cmp.max_rel_err += violations as f64;
        cmp.elements += draws;

        let (dl, dc, p) = last.expect("at least one setting");
        let micros = time_us(dev, cx.iters.min(20), || {
            dev.penalties(spec, DevPtr::of(&dl), DevPtr::of(&dc), &p)
        })?;
        Ok(Measured { cmp, micros })
    }
}
