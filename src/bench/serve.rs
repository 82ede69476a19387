//! `fucina bench --serve URL`: a load generator against a running server. For each client count
//! N, N threads each stream one `/v1/completions` request at once (random prompt ids, greedy,
//! `ignore_eos`, a fixed output length); reported: aggregate generated tokens per second over
//! the wall time, time to first token and inter-token latency (p50 / p99), errors.

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

/// One load level's results.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Load {
    pub clients: usize,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub errors: usize,
    pub tokens: usize,
    pub seconds: f64,
    pub tok_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
}

/// What one streamed request saw.
struct Stream {
    ttft: Duration,
    gaps: Vec<Duration>,
    tokens: usize,
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Stream one completion; every SSE `data:` chunk with a choice counts as a token.
fn one(url: &str, key: Option<&str>, prompt: &[u32], max_tokens: usize) -> Result<Stream> {
    let body = serde_json::json!({
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": true,
        "ignore_eos": true,
        "temperature": 0,
    });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(3600)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut req = agent.post(&format!("{url}/v1/completions"));
    if let Some(k) = key {
        req = req.header("Authorization", &format!("Bearer {k}"));
    }
    let t0 = Instant::now();
    let mut resp = req
        .header("Content-Type", "application/json")
        .send(body.to_string())?;
    let status = resp.status().as_u16();
    if status != 200 {
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        bail!(
            "HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        );
    }
    let reader = BufReader::new(resp.body_mut().as_reader());
    let (mut ttft, mut last, mut gaps, mut tokens) = (None, t0, Vec::new(), 0);
    for line in reader.lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data.trim() == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data)?;
        if let Some(e) = v.get("error") {
            bail!("stream error: {e}");
        }
        if v["choices"].as_array().is_none_or(|c| c.is_empty()) {
            continue;
        }
        let now = Instant::now();
        match ttft {
            None => ttft = Some(now - t0),
            Some(_) => gaps.push(now - last),
        }
        last = now;
        tokens += 1;
    }
    Ok(Stream {
        ttft: ttft.unwrap_or_else(|| t0.elapsed()),
        gaps,
        tokens,
    })
}

/// `clients` concurrent streams of `prompt_tokens` random ids and `max_tokens` outputs.
pub fn load(
    url: &str,
    key: Option<&str>,
    clients: usize,
    prompt_tokens: usize,
    max_tokens: usize,
    seed: u64,
) -> Result<Load> {
    let mut rng = super::synth::Rng::new(seed);
    // ids every supported vocabulary has (no special ranges at the start or the end)
    let prompts: Vec<Vec<u32>> = (0..clients)
        .map(|_| {
            (0..prompt_tokens)
                .map(|_| 1000 + (rng.next_u64() % 20_000) as u32)
                .collect()
        })
        .collect();
    let t0 = Instant::now();
    let results: Vec<Result<Stream>> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || one(url, key, p, max_tokens)))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("client thread panicked")))
            })
            .collect()
    });
    let seconds = t0.elapsed().as_secs_f64();
    let (mut ttft, mut itl) = (Vec::new(), Vec::new());
    let (mut tokens, mut errors) = (0, 0);
    for r in results {
        match r {
            Ok(s) => {
                ttft.push(s.ttft.as_secs_f64() * 1e3);
                itl.extend(s.gaps.iter().map(|g| g.as_secs_f64() * 1e3));
                tokens += s.tokens;
            }
            Err(e) => {
                eprintln!("bench: client error: {e:#}");
                errors += 1;
            }
        }
    }
    Ok(Load {
        clients,
        prompt_tokens,
        max_tokens,
        errors,
        tokens,
        seconds,
        tok_s: tokens as f64 / seconds,
        ttft_p50_ms: quantile(&mut ttft, 0.5),
        ttft_p99_ms: quantile(&mut ttft, 0.99),
        itl_p50_ms: quantile(&mut itl, 0.5),
        itl_p99_ms: quantile(&mut itl, 0.99),
    })
}

/// The load levels as a text table.
pub fn table(rows: &[Load]) -> String {
    let mut s = String::from(
        "| clients | prompt | max tokens | tokens | s | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | errors |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.0} | {:.0} | {:.1} | {:.1} | {} |\n",
            r.clients,
            r.prompt_tokens,
            r.max_tokens,
            r.tokens,
            r.seconds,
            r.tok_s,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.itl_p50_ms,
            r.itl_p99_ms,
            r.errors
        ));
    }
    s
}
