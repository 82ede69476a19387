//! Request metrics and the Prometheus text exposition of `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::engine::MetricsSnapshot;

/// Bucket upper bounds in seconds.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A fixed-bucket histogram (cumulative on output).
#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut acc = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            acc += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        acc += self.counts[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {acc}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 * 1e-6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {acc}");
    }
}

/// HTTP-side counters.
#[derive(Debug, Default)]
pub struct HttpMetrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    pub latency: Histogram,
    pub ttft: Histogram,
}

impl HttpMetrics {
    pub fn record(&self, route: &'static str, status: u16, took: Duration) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((route, status)).or_insert(0) += 1;
        }
        if route.starts_with("/v1/") {
            self.latency.observe(took);
        }
    }

    /// Prometheus text format (version 0.0.4).
    pub fn render(
        &self,
        e: &MetricsSnapshot,
        in_flight: usize,
        max_concurrent: usize,
        ready: bool,
    ) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP fucina_requests_total HTTP requests by route and status.\n# TYPE fucina_requests_total counter");
        let reqs = self.requests.lock().map(|m| m.clone()).unwrap_or_default();
        let mut errors: BTreeMap<(&str, u16), u64> = BTreeMap::new();
        for ((route, status), n) in &reqs {
            let _ = writeln!(
                out,
                "fucina_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
            if *status >= 400 {
                errors.insert((route, *status), *n);
            }
        }
        let _ = writeln!(out, "# HELP fucina_request_errors_total HTTP responses with status >= 400 by route and status.\n# TYPE fucina_request_errors_total counter");
        for ((route, status), n) in &errors {
            let _ = writeln!(
                out,
                "fucina_request_errors_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        self.latency.render(
            "fucina_request_duration_seconds",
            "Latency of /v1 requests (to the end of the response).",
            &mut out,
        );
        self.ttft.render(
            "fucina_time_to_first_token_seconds",
            "Time from request to the first generated token.",
            &mut out,
        );
        let gauges: [(&str, &str, f64); 18] = [
            (
                "fucina_ready",
                "1 when the model is loaded.",
                f64::from(u8::from(ready)),
            ),
            (
                "fucina_in_flight_requests",
                "Generations holding an admission slot.",
                in_flight as f64,
            ),
            (
                "fucina_max_concurrent_requests",
                "Admission limit.",
                max_concurrent as f64,
            ),
            (
                "fucina_queue_depth",
                "Requests waiting for the scheduler.",
                e.queue_depth as f64,
            ),
            (
                "fucina_running_sequences",
                "Sequences the scheduler is running.",
                e.running as f64,
            ),
            (
                "fucina_waiting_sequences",
                "Admitted sequences waiting for KV blocks or a step (new or preempted).",
                e.waiting as f64,
            ),
            (
                "fucina_prefill_tokens_per_second",
                "Prefill throughput since start.",
                e.prefill_tps(),
            ),
            (
                "fucina_decode_tokens_per_second",
                "Decode throughput since start.",
                e.decode_tps(),
            ),
            (
                "fucina_kv_cache_utilization",
                "Fraction of the KV cache in use.",
                e.kv_utilization(),
            ),
            (
                "fucina_kv_cache_tokens",
                "Tokens held in the KV cache.",
                e.kv_tokens as f64,
            ),
            (
                "fucina_prefix_cache_hit_rate",
                "Fraction of prompt tokens reused from the prefix cache.",
                e.prefix_hit_rate(),
            ),
            (
                "fucina_prefix_cache_hit_tokens_total",
                "Prompt tokens reused from the prefix cache.",
                e.prefix_hit_tokens as f64,
            ),
            (
                "fucina_prompt_tokens_total",
                "Prompt tokens received by the engine.",
                e.prompt_tokens as f64,
            ),
            (
                "fucina_prefill_tokens_total",
                "Prompt tokens computed.",
                e.prefill_tokens as f64,
            ),
            (
                "fucina_decode_tokens_total",
                "Tokens generated.",
                e.decode_tokens as f64,
            ),
            (
                "fucina_kv_blocks_used",
                "KV blocks held by running sequences.",
                e.kv_blocks_used as f64,
            ),
            (
                "fucina_kv_blocks_free",
                "KV blocks free.",
                e.kv_blocks_total.saturating_sub(e.kv_blocks_used) as f64,
            ),
            (
                "fucina_preemptions_total",
                "Sequences preempted (their KV blocks taken back; recomputed later).",
                e.preemptions as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let kind = if name.ends_with("_total") {
                "counter"
            } else {
                "gauge"
            };
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
        let _ = writeln!(out, "# HELP fucina_batch_size Sequences per engine step.\n# TYPE fucina_batch_size histogram");
        let mut cum = 0;
        for (i, n) in e.batch_steps.iter().enumerate() {
            cum += n;
            let le = crate::engine::metrics::BATCH_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |u| u.to_string());
            let _ = writeln!(out, "fucina_batch_size_bucket{{le=\"{le}\"}} {cum}");
        }
        let _ = writeln!(out, "fucina_batch_size_sum {}", e.batch_seqs);
        let _ = writeln!(out, "fucina_batch_size_count {cum}");
        let _ = writeln!(out, "# HELP fucina_generations_finished_total Generations finished (cancelled included).\n# TYPE fucina_generations_finished_total counter\nfucina_generations_finished_total {}", e.requests_finished);
        let _ = writeln!(out, "# HELP fucina_generations_cancelled_total Generations cancelled by a client going away.\n# TYPE fucina_generations_cancelled_total counter\nfucina_generations_cancelled_total {}", e.requests_cancelled);
        out
    }
}
