//! Counters behind `/metrics` (Prometheus text format, llama-server's metric names under
//! llama-server's `llamacpp:` prefix, so its dashboards work unchanged). The engine thread and the HTTP handlers update them lock-free.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub prompt_tokens_total: AtomicU64,
    /// Prompt tokens whose KV cells were reused (they cost no decode).
    pub prompt_tokens_cached_total: AtomicU64,
    /// The most tokens one decode step held.
    pub n_tokens_max: AtomicU64,
    /// Microseconds spent on prompts.
    pub prompt_us_total: AtomicU64,
    pub tokens_predicted_total: AtomicU64,
    /// Microseconds spent generating.
    pub predicted_us_total: AtomicU64,
    pub n_decode_total: AtomicU64,
    /// Sum over decode steps of the slots in that step's batch.
    pub n_busy_slots_total: AtomicU64,
    pub requests_total: AtomicU64,
    pub requests_rejected_total: AtomicU64,
    pub requests_cancelled_total: AtomicU64,
    pub requests_processing: AtomicU64,
    pub requests_deferred: AtomicU64,
    /// (prompt tokens, prompt µs, predicted tokens, predicted µs) at the last scrape: the
    /// throughput gauges cover what happened since (llama-server's metric buckets).
    last_scrape: std::sync::Mutex<[u64; 4]>,
}

impl Metrics {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, v: u64) {
        gauge.store(v, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let decodes = get(&self.n_decode_total);
        let busy = get(&self.n_busy_slots_total);
        let prompt_us = get(&self.prompt_us_total);
        let predicted_us = get(&self.predicted_us_total);
        let now = [
            get(&self.prompt_tokens_total),
            prompt_us,
            get(&self.tokens_predicted_total),
            predicted_us,
        ];
        let since = {
            let mut last = self
                .last_scrape
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let d = std::array::from_fn::<u64, 4, _>(|i| now[i].saturating_sub(last[i]));
            *last = now;
            d
        };
        let per_sec = |n: u64, us: u64| {
            if us == 0 {
                0.0
            } else {
                n as f64 * 1e6 / us as f64
            }
        };
        let rows: [(&str, &str, &str, f64); 16] = [
            (
                "prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                get(&self.prompt_tokens_total) as f64,
            ),
            (
                "prompt_tokens_cached_total",
                "counter",
                "Number of prompt tokens taken from the cache.",
                get(&self.prompt_tokens_cached_total) as f64,
            ),
            (
                "n_tokens_max",
                "counter",
                "Largest observed n_tokens.",
                get(&self.n_tokens_max) as f64,
            ),
            // Lamina has no speculative decoding: llama-server's counters, at zero.
            (
                "spec_decode_num_draft_tokens_total",
                "counter",
                "Number of draft tokens.",
                0.0,
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Number of accepted draft tokens.",
                0.0,
            ),
            (
                "spec_decode_num_drafts_total",
                "counter",
                "Number of drafts.",
                0.0,
            ),
            (
                "prompt_seconds_total",
                "counter",
                "Prompt process time.",
                prompt_us as f64 / 1e6,
            ),
            (
                "tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                get(&self.tokens_predicted_total) as f64,
            ),
            (
                "tokens_predicted_seconds_total",
                "counter",
                "Predict process time.",
                predicted_us as f64 / 1e6,
            ),
            (
                "n_decode_total",
                "counter",
                "Total number of decode calls.",
                decodes as f64,
            ),
            (
                "n_busy_slots_per_decode",
                "gauge",
                "Average number of busy slots per decode call.",
                if decodes == 0 {
                    0.0
                } else {
                    busy as f64 / decodes as f64
                },
            ),
            (
                "requests_total",
                "counter",
                "Generation requests accepted.",
                get(&self.requests_total) as f64,
            ),
            (
                "requests_rejected_total",
                "counter",
                "Requests refused with 503 because the wait queue was full.",
                get(&self.requests_rejected_total) as f64,
            ),
            (
                "requests_cancelled_total",
                "counter",
                "Requests whose client went away before the end.",
                get(&self.requests_cancelled_total) as f64,
            ),
            (
                "requests_processing",
                "gauge",
                "Number of requests processing.",
                get(&self.requests_processing) as f64,
            ),
            (
                "requests_deferred",
                "gauge",
                "Number of requests deferred.",
                get(&self.requests_deferred) as f64,
            ),
        ];
        let mut out = String::new();
        for (name, kind, help, value) in rows {
            let _ = writeln!(out, "# HELP llamacpp:{name} {help}");
            let _ = writeln!(out, "# TYPE llamacpp:{name} {kind}");
            let _ = writeln!(out, "llamacpp:{name} {value}");
        }
        let _ = writeln!(
            out,
            "# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s."
        );
        let _ = writeln!(out, "# TYPE llamacpp:prompt_tokens_seconds gauge");
        let _ = writeln!(
            out,
            "llamacpp:prompt_tokens_seconds {}",
            per_sec(since[0], since[1])
        );
        let _ = writeln!(
            out,
            "# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s."
        );
        let _ = writeln!(out, "# TYPE llamacpp:predicted_tokens_seconds gauge");
        let _ = writeln!(
            out,
            "llamacpp:predicted_tokens_seconds {}",
            per_sec(since[2], since[3])
        );
        out
    }
}
