//! Counters the scheduler updates and `/metrics` reads. Lock-free atomics; a snapshot is a plain
//! struct so front ends never see the atomics.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// Live engine counters.
#[derive(Debug, Default)]
pub struct EngineMetrics {
    queue_depth: AtomicI64,
    running: AtomicI64,
    waiting: AtomicI64,
    prefill_tokens: AtomicU64,
    prefill_nanos: AtomicU64,
    decode_tokens: AtomicU64,
    decode_nanos: AtomicU64,
    prefix_lookups: AtomicU64,
    prefix_hit_tokens: AtomicU64,
    prompt_tokens: AtomicU64,
    kv_tokens: AtomicU64,
    kv_capacity: AtomicU64,
    requests_finished: AtomicU64,
    requests_cancelled: AtomicU64,
    preemptions: AtomicU64,
    kv_blocks_used: AtomicU64,
    kv_blocks_total: AtomicU64,
    /// Steps by the number of sequences they ran, bucketed by [`BATCH_BUCKETS`] (the last
    /// bucket: more).
    batch_steps: [AtomicU64; BATCH_BUCKETS.len() + 1],
    /// Sequences over all steps (the histogram's sum).
    batch_seqs: AtomicU64,
}

/// Upper bounds of the batch-size histogram's buckets (sequences per step).
pub const BATCH_BUCKETS: [u64; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// A point-in-time copy of [`EngineMetrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub queue_depth: i64,
    pub running: i64,
    /// Admitted sequences waiting for a step (new, or preempted).
    pub waiting: i64,
    pub prefill_tokens: u64,
    pub prefill_seconds: f64,
    pub decode_tokens: u64,
    pub decode_seconds: f64,
    pub prefix_lookups: u64,
    /// Prompt tokens served from the reused prefix.
    pub prefix_hit_tokens: u64,
    /// Prompt tokens seen (denominator of the prefix hit rate).
    pub prompt_tokens: u64,
    pub kv_tokens: u64,
    pub kv_capacity: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    /// Sequences preempted (their KV blocks taken back, recomputed later).
    pub preemptions: u64,
    pub kv_blocks_used: u64,
    pub kv_blocks_total: u64,
    /// Steps per batch-size bucket ([`BATCH_BUCKETS`], then more), not cumulative.
    pub batch_steps: [u64; BATCH_BUCKETS.len() + 1],
    /// Sequences summed over all steps.
    pub batch_seqs: u64,
}

impl MetricsSnapshot {
    /// Steps that ran more than one sequence.
    pub fn batched_steps(&self) -> u64 {
        self.batch_steps[1..].iter().sum()
    }
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_seconds)
    }
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_tokens, self.decode_seconds)
    }
    /// Fraction of prompt tokens whose KV was reused.
    pub fn prefix_hit_rate(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.prefix_hit_tokens as f64 / self.prompt_tokens as f64
        }
    }
    pub fn kv_utilization(&self) -> f64 {
        if self.kv_capacity == 0 {
            0.0
        } else {
            self.kv_tokens as f64 / self.kv_capacity as f64
        }
    }
}

fn rate(n: u64, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

impl EngineMetrics {
    pub fn queued(&self, delta: i64) {
        self.queue_depth.fetch_add(delta, Ordering::Relaxed);
    }
    /// Sequences running and waiting in the scheduler now.
    pub fn sequences(&self, running: usize, waiting: usize) {
        self.running.store(running as i64, Ordering::Relaxed);
        self.waiting.store(waiting as i64, Ordering::Relaxed);
    }
    pub fn prefill(&self, tokens: usize, nanos: u64) {
        self.prefill_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
        self.prefill_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
    pub fn decode(&self, tokens: usize, nanos: u64) {
        self.decode_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
        self.decode_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
    pub fn prefix(&self, prompt: usize, reused: usize) {
        self.prefix_lookups.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.prefix_hit_tokens
            .fetch_add(reused as u64, Ordering::Relaxed);
    }
    pub fn kv(&self, tokens: usize, capacity: usize) {
        self.kv_tokens.store(tokens as u64, Ordering::Relaxed);
        self.kv_capacity.store(capacity as u64, Ordering::Relaxed);
    }
    /// A step ran `seqs` sequences.
    pub fn step(&self, seqs: usize) {
        let b = BATCH_BUCKETS
            .iter()
            .position(|&u| seqs as u64 <= u)
            .unwrap_or(BATCH_BUCKETS.len());
        self.batch_steps[b].fetch_add(1, Ordering::Relaxed);
        self.batch_seqs.fetch_add(seqs as u64, Ordering::Relaxed);
    }
    pub fn preempted(&self, n: usize) {
        self.preemptions.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub fn kv_blocks(&self, used: usize, total: usize) {
        self.kv_blocks_used.store(used as u64, Ordering::Relaxed);
        self.kv_blocks_total.store(total as u64, Ordering::Relaxed);
    }
    pub fn finished(&self, cancelled: bool) {
        self.requests_finished.fetch_add(1, Ordering::Relaxed);
        if cancelled {
            self.requests_cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> MetricsSnapshot {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MetricsSnapshot {
            queue_depth: self.queue_depth.load(Ordering::Relaxed).max(0),
            running: self.running.load(Ordering::Relaxed).max(0),
            waiting: self.waiting.load(Ordering::Relaxed).max(0),
            prefill_tokens: r(&self.prefill_tokens),
            prefill_seconds: r(&self.prefill_nanos) as f64 * 1e-9,
            decode_tokens: r(&self.decode_tokens),
            decode_seconds: r(&self.decode_nanos) as f64 * 1e-9,
            prefix_lookups: r(&self.prefix_lookups),
            prefix_hit_tokens: r(&self.prefix_hit_tokens),
            prompt_tokens: r(&self.prompt_tokens),
            kv_tokens: r(&self.kv_tokens),
            kv_capacity: r(&self.kv_capacity),
            requests_finished: r(&self.requests_finished),
            requests_cancelled: r(&self.requests_cancelled),
            preemptions: r(&self.preemptions),
            kv_blocks_used: r(&self.kv_blocks_used),
            kv_blocks_total: r(&self.kv_blocks_total),
            batch_steps: std::array::from_fn(|i| r(&self.batch_steps[i])),
            batch_seqs: r(&self.batch_seqs),
        }
    }
}
