//! The measurements of `fucina bench`, generic over the backend: read bandwidth, prefill,
//! time to first token, batch-1 decode at several depths, memory.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::roofline::{decode_bytes, roofline, Roofline};
use crate::backend::Backend;
use crate::model::registry::{load_model, LoadOptions};
use crate::model::{CausalLm, Logits, Session};
use crate::weights::Checkpoint;

/// `--step-times`: the host time of every timed decode step, summarised as quantiles and the
/// slowest steps, to tell a steady per-step cost from a few slow steps.
struct StepTimes {
    ends: Option<Vec<Instant>>,
}

impl StepTimes {
    fn new(on: bool, n: usize) -> Self {
        StepTimes {
            ends: on.then(|| Vec::with_capacity(n)),
        }
    }

    fn mark(&mut self) {
        if let Some(e) = &mut self.ends {
            e.push(Instant::now());
        }
    }

    fn summary(&self, t0: Instant) -> Option<String> {
        let ends = self.ends.as_ref().filter(|e| !e.is_empty())?;
        let mut prev = t0;
        let mut us: Vec<(f64, usize)> = Vec::with_capacity(ends.len());
        for (i, &e) in ends.iter().enumerate() {
            us.push(((e - prev).as_secs_f64() * 1e6, i));
            prev = e;
        }
        let mut sorted: Vec<f64> = us.iter().map(|u| u.0).collect();
        sorted.sort_by(f64::total_cmp);
        let q = |f: f64| sorted[((sorted.len() - 1) as f64 * f).round() as usize];
        let med = q(0.5);
        let excess: f64 = sorted.iter().map(|u| (u - med).max(0.0)).sum();
        let mut slow = us.clone();
        slow.sort_by(|a, b| b.0.total_cmp(&a.0));
        let worst: Vec<String> = slow
            .iter()
            .take(5)
            .map(|(u, i)| format!("#{i} {u:.1}"))
            .collect();
        Some(format!(
            "step us min {:.1} p10 {:.1} median {med:.1} p90 {:.1} max {:.1}; above the median {excess:.0} us in all; slowest {}",
            sorted[0],
            q(0.1),
            q(0.9),
            sorted[sorted.len() - 1],
            worst.join(", ")
        ))
    }
}

/// Device facts the generic runner cannot get through `Backend`.
pub trait Probe {
    /// Read bandwidth in GB/s, measured over at least `bytes` bytes.
    fn read_bandwidth(&self, bytes: usize) -> Result<f64>;
    /// Device memory now: (pool peak bytes, pool persistent bytes, driver used bytes).
    fn memory(&self) -> Option<(u64, u64, u64)>;
    /// Bytes per cached K or V element.
    fn kv_elem_bytes(&self) -> f64;
    /// Wait until the device has run everything queued, so that a measurement starts from an
    /// idle device: a session that decoded pipelined leaves its next step queued when it ends
    /// (the warm-up's ran into the 512-token prefill once dropping a sampler stopped
    /// synchronising the device).
    fn idle(&self) -> Result<()> {
        Ok(())
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    pub prompt_lens: Vec<usize>,
    pub decode_tokens: usize,
    pub depths: Vec<usize>,
    pub bw_bytes: usize,
    pub seed: u64,
    /// Milliseconds to wait before each decode measurement (`--pause-ms`).
    pub pause_ms: u64,
    /// Log each timed decode step's host time summary (`--step-times`).
    pub step_times: bool,
    /// Sequences per `--batch` row.
    pub batch: Vec<usize>,
    pub batch_prompt: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Prefill {
    pub tokens: usize,
    pub seconds: f64,
    pub tok_s: f64,
    /// Prefill plus picking the first token on the host.
    pub ttft_ms: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Decode {
    pub depth: usize,
    pub tokens: usize,
    pub seconds: f64,
    pub tok_s: f64,
    pub roofline: Roofline,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub model: String,
    pub arch: String,
    pub backend: String,
    pub file_bytes: u64,
    pub tensor_bytes: u64,
    /// Bytes the backend holds persistently after loading (weights), where it can tell.
    pub resident_weight_bytes: Option<u64>,
    pub load_seconds: f64,
    pub bandwidth_gbs: f64,
    pub weight_bytes_per_token: u64,
    pub prefill: Vec<Prefill>,
    pub decode: Vec<Decode>,
    pub batched: Vec<Batched>,
    pub pool_peak_bytes: Option<u64>,
    pub driver_used_bytes: Option<u64>,
}

fn ids(n: usize, vocab: usize, rng: &mut super::synth::Rng) -> Vec<u32> {
    (0..n)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

fn argmax(l: &Logits) -> u32 {
    let r = l.last();
    let mut best = 0;
    for (i, &v) in r.iter().enumerate() {
        if v > r[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill `n` tokens in one forward (the logits of the last come back to the host, which
/// synchronises the device).
fn prefill(s: &mut Box<dyn Session>, toks: &[u32]) -> Result<(f64, f64)> {
    let t0 = Instant::now();
    let l = s.forward(toks, false)?;
    let t1 = t0.elapsed().as_secs_f64();
    let _ = argmax(&l);
    Ok((t1, t0.elapsed().as_secs_f64()))
}

/// Run the plan on `backend`.
pub fn run<B: Backend>(
    path: &std::path::Path,
    backend: Arc<B>,
    probe: &dyn Probe,
    plan: &Plan,
    log: &mut dyn FnMut(&str),
) -> Result<Report> {
    let file_bytes = std::fs::metadata(path)?.len();
    let ckpt = Checkpoint::open(path).with_context(|| format!("opening {}", path.display()))?;
    let g = ckpt
        .gguf()
        .context("fucina bench reads GGUF files (the roofline counts GGUF tensors)")?;
    let db = decode_bytes(g);
    log(&format!(
        "measuring read bandwidth over {} MiB",
        plan.bw_bytes >> 20
    ));
    let bw = probe.read_bandwidth(plan.bw_bytes)?;
    log(&format!("read bandwidth {bw:.1} GB/s"));
    let persistent0 = probe.memory().map(|m| m.1);
    let need = plan
        .prompt_lens
        .iter()
        .copied()
        .chain(plan.depths.iter().map(|d| d + plan.decode_tokens))
        .chain(
            plan.batch
                .iter()
                .take(1)
                .map(|_| plan.batch_prompt + plan.decode_tokens),
        )
        .max()
        .unwrap_or(1)
        + 16;
    let t0 = Instant::now();
    let model: Arc<dyn CausalLm> = load_model(
        &ckpt,
        backend.clone(),
        &LoadOptions {
            max_context: need,
            ..Default::default()
        },
    )?;
    let load_seconds = t0.elapsed().as_secs_f64();
    let resident = match (probe.memory(), persistent0) {
        (Some(m), Some(p0)) => Some(m.1.saturating_sub(p0)),
        _ => None,
    };
    let info = model.info().clone();
    log(&format!(
        "loaded {} in {load_seconds:.1}s (vocab {}, context {})",
        info.arch, info.vocab_size, info.max_context
    ));
    if info.max_context < need {
        anyhow::bail!(
            "the model's context ({}) is shorter than the plan needs ({need})",
            info.max_context
        );
    }
    let mut rng = super::synth::Rng::new(plan.seed);
    // warm-up: kernels loaded (and JIT-compiled by the driver on a machine's first run), pools
    // filled: a prefill as long as the shortest measured prompt (at most 512 tokens: prefill
    // kernels can differ by length) and a few decode steps
    {
        let warm = plan
            .prompt_lens
            .iter()
            .copied()
            .min()
            .unwrap_or(16)
            .clamp(16, 512);
        let mut s = model.clone().new_session();
        let l = s.forward(&ids(warm, info.vocab_size, &mut rng), false)?;
        let mut t = argmax(&l);
        for _ in 0..4 {
            t = argmax(&s.forward(&[t], false)?);
        }
        let greedy = crate::sampling::SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let mut sampler = s.sampler(&greedy, &[], info.vocab_size)?;
        for _ in 0..4 {
            t = s.forward_sample(&[t], sampler.as_mut(), &[])?;
        }
    }
    let mut pre = Vec::new();
    for &n in &plan.prompt_lens {
        probe.idle()?;
        let mut s = model.clone().new_session();
        let toks = ids(n, info.vocab_size, &mut rng);
        let (sec, ttft) = prefill(&mut s, &toks)?;
        log(&format!("prefill {n}: {:.1} tok/s", n as f64 / sec));
        pre.push(Prefill {
            tokens: n,
            seconds: sec,
            tok_s: n as f64 / sec,
            ttft_ms: ttft * 1e3,
        });
    }
    let mut dec = Vec::new();
    for &d in &plan.depths {
        probe.idle()?;
        if plan.pause_ms > 0 {
            // on the H200 a decode at depth 0 measured right after the prefills ran ~1% slower
            // than one measured alone; a 3 s pause recovered 0.7% of it
            std::thread::sleep(std::time::Duration::from_millis(plan.pause_ms));
        }
        let mut s = model.clone().new_session();
        let mut t = if d > 0 {
            let l = s.forward(&ids(d, info.vocab_size, &mut rng), false)?;
            argmax(&l)
        } else {
            (rng.next_u64() % info.vocab_size as u64) as u32
        };
        // greedy on the backend, as the engine decodes: only the token id comes back
        let greedy = crate::sampling::SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let mut sampler = s.sampler(&greedy, &[], info.vocab_size)?;
        // untimed: the first one-token step runs directly, the second is recorded (CUDA graph)
        for _ in 0..2 {
            t = s.forward_sample(&[t], sampler.as_mut(), &[])?;
        }
        let mut steps = StepTimes::new(plan.step_times, plan.decode_tokens);
        let t0 = Instant::now();
        for _ in 0..plan.decode_tokens {
            t = s.forward_sample(&[t], sampler.as_mut(), &[])?;
            steps.mark();
        }
        let sec = t0.elapsed().as_secs_f64();
        if let Some(line) = steps.summary(t0) {
            log(&format!("decode at depth {d}: {line}"));
        }
        let tok_s = plan.decode_tokens as f64 / sec;
        let mid = d + plan.decode_tokens / 2;
        let rl = roofline(db.per_token(mid, probe.kv_elem_bytes()), bw, tok_s);
        log(&format!(
            "decode at depth {d}: {tok_s:.1} tok/s ({:.1}% of the read roofline)",
            rl.percent
        ));
        dec.push(Decode {
            depth: d,
            tokens: plan.decode_tokens,
            seconds: sec,
            tok_s,
            roofline: rl,
        });
    }
    let mut batched_rows = Vec::new();
    for &b in plan.batch.iter().filter(|&&b| b > 0) {
        probe.idle()?;
        let r = batched(
            &model,
            b,
            plan.batch_prompt,
            plan.decode_tokens,
            2048,
            &mut rng,
        )
        .with_context(|| format!("--batch {b}"))?;
        log(&format!(
            "batched decode B={b}: {:.1} tok/s aggregate ({:.1} per sequence)",
            r.tok_s,
            r.tok_s / b as f64
        ));
        batched_rows.push(r);
    }
    let mem = probe.memory();
    Ok(Report {
        model: path.display().to_string(),
        arch: info.arch,
        backend: backend.name().to_string(),
        file_bytes,
        tensor_bytes: db.all_tensors,
        resident_weight_bytes: resident,
        load_seconds,
        bandwidth_gbs: bw,
        weight_bytes_per_token: db.weights,
        prefill: pre,
        decode: dec,
        batched: batched_rows,
        pool_peak_bytes: mem.map(|m| m.0),
        driver_used_bytes: mem.map(|m| m.2),
    })
}

/// The CPU's probe: a memory-read loop over a buffer, no device memory.
pub struct CpuProbe;

impl Probe for CpuProbe {
    fn read_bandwidth(&self, bytes: usize) -> Result<f64> {
        let n = (bytes / 8).max(1 << 16);
        let buf: Vec<u64> = (0..n as u64).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let mut best = f64::INFINITY;
        let mut sink = 0u64;
        for _ in 0..3 {
            let t0 = Instant::now();
            // four independent accumulators so the loop is bound by loads, not the add chain
            let mut a = [0u64; 4];
            for c in buf.chunks_exact(4) {
                a[0] ^= c[0];
                a[1] ^= c[1];
                a[2] ^= c[2];
                a[3] ^= c[3];
            }
            sink ^= std::hint::black_box(a[0] ^ a[1] ^ a[2] ^ a[3]);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        std::hint::black_box(sink);
        Ok((n * 8) as f64 / best / 1e9)
    }
    fn memory(&self) -> Option<(u64, u64, u64)> {
        None
    }
    fn kv_elem_bytes(&self) -> f64 {
        4.0
    }
}
/// One `--batch` row: `batch` sequences of `prompt` tokens prefilled together, then `tokens`
/// decode steps over all of them (one forward pass each).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Batched {
    pub batch: usize,
    pub prompt: usize,
    pub tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Generated tokens of all sequences per second of decode.
    pub tok_s: f64,
}

/// `batch` sequences through the engine's batched pass: prompts in steps of at most
/// `step_tokens` tokens, then `tokens` decode steps of every sequence at once, each feeding the
/// greedy choice of its own logits row (the logits of all rows come to the host, as the
/// scheduler's do).
pub fn batched(
    model: &Arc<dyn CausalLm>,
    batch: usize,
    prompt: usize,
    tokens: usize,
    step_tokens: usize,
    rng: &mut super::synth::Rng,
) -> Result<Batched> {
    let vocab = model.info().vocab_size;
    let mut sessions: Vec<Box<dyn Session>> =
        (0..batch).map(|_| model.clone().new_session()).collect();
    let prompts: Vec<Vec<u32>> = (0..batch).map(|_| ids(prompt, vocab, rng)).collect();
    let per_step = (step_tokens / prompt.max(1)).max(1);
    let mut next = vec![0u32; batch];
    let t0 = Instant::now();
    for lo in (0..batch).step_by(per_step) {
        let hi = (lo + per_step).min(batch);
        let mut refs: Vec<&mut dyn Session> = Vec::with_capacity(hi - lo);
        for s in &mut sessions[lo..hi] {
            refs.push(&mut **s);
        }
        let toks: Vec<&[u32]> = prompts[lo..hi].iter().map(|p| p.as_slice()).collect();
        for (i, l) in model
            .forward_batch(&mut refs, &toks)
            .into_iter()
            .enumerate()
        {
            next[lo + i] = argmax(&l?);
        }
    }
    let prefill_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    for _ in 0..tokens {
        let mut refs: Vec<&mut dyn Session> = Vec::with_capacity(batch);
        for s in &mut sessions {
            refs.push(&mut **s);
        }
        let feed: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
        let toks: Vec<&[u32]> = feed.iter().map(|t| t.as_slice()).collect();
        for (i, l) in model
            .forward_batch(&mut refs, &toks)
            .into_iter()
            .enumerate()
        {
            next[i] = argmax(&l?);
        }
    }
    let decode_seconds = t1.elapsed().as_secs_f64();
    Ok(Batched {
        batch,
        prompt,
        tokens,
        prefill_seconds,
        decode_seconds,
        tok_s: (batch * tokens) as f64 / decode_seconds,
    })
}
