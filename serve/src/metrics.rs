//! Server metrics, rendered as Prometheus text on `GET /metrics`.
//!
//! Why hand-rolled: the server needs three histograms, a few gauges and a
//! few counters, all written by one engine thread and read by the HTTP
//! side; a mutex-protected snapshot is simpler than a metrics framework and
//! keeps the exposition format in one visible place.

use std::fmt::Write as _;
use std::sync::Mutex;

/// Bucket upper bounds (seconds) of the latency histograms: 1 ms to 2 min,
/// wide enough for a GPU's decode steps and the CPU reference's prefill.
const BUCKETS_S: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 120.0,
];

/// A cumulative Prometheus histogram over [`BUCKETS_S`].
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    /// Observations at or below each bound (not yet cumulative).
    counts: Vec<u64>,
    /// Observations above the last bound.
    over: u64,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// Record one observation, in seconds.
    pub fn observe(&mut self, secs: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS_S.len()];
        }
        match BUCKETS_S.iter().position(|&b| secs <= b) {
            Some(i) => self.counts[i] += 1,
            None => self.over += 1,
        }
        self.sum += secs;
        self.count += 1;
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0u64;
        for (i, b) in BUCKETS_S.iter().enumerate() {
            cum += self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", cum + self.over);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// Everything `/metrics` shows, as last written by the engine.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Time to first token, from the request's arrival (seconds).
    pub ttft: Histogram,
    /// Time between consecutive tokens of a request (seconds; the tokens of
    /// one multi-token speculative commit share the step's interval).
    pub itl: Histogram,
    /// Arrival to last token (seconds).
    pub e2e: Histogram,
    /// Requests in the scheduler's running set.
    pub running: usize,
    /// Requests queued in the scheduler (admitted by HTTP, not yet running).
    pub waiting: usize,
    /// KV blocks held by live sequences (idle prefix-cache blocks excluded).
    pub kv_blocks_used: usize,
    /// KV blocks in the pool.
    pub kv_blocks_total: usize,
    pub preemptions: u64,
    /// Prompt tokens served from the prefix cache instead of computed.
    pub prefix_cache_hit_tokens: u64,
    /// Prompt (and recompute) tokens computed.
    pub prefill_tokens: u64,
    pub generation_tokens: u64,
    pub spec_proposed: u64,
    pub spec_accepted: u64,
    pub requests_finished: u64,
    /// Requests dropped because their client went away.
    pub requests_aborted: u64,
    /// Steps the engine ran.
    pub steps: u64,
}

/// Shared metrics: the engine writes, `/metrics` reads.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Snapshot>,
}

impl Metrics {
    /// Run `f` on the snapshot (a poisoned lock is recovered: metrics are
    /// best-effort and must never take the server down).
    pub fn update<R>(&self, f: impl FnOnce(&mut Snapshot) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// A copy of the current values.
    pub fn snapshot(&self) -> Snapshot {
        self.update(|s| s.clone())
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let s = self.snapshot();
        let mut out = String::new();
        s.ttft.render(
            &mut out,
            "m3_time_to_first_token_seconds",
            "Time from request arrival to its first generated token.",
        );
        s.itl.render(
            &mut out,
            "m3_inter_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
        );
        s.e2e.render(
            &mut out,
            "m3_e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
        );
        let gauges: [(&str, &str, usize); 4] = [
            (
                "m3_num_requests_running",
                "Requests in the running batch.",
                s.running,
            ),
            (
                "m3_num_requests_waiting",
                "Requests queued for admission.",
                s.waiting,
            ),
            (
                "m3_kv_blocks_used",
                "KV cache blocks held by live requests.",
                s.kv_blocks_used,
            ),
            (
                "m3_kv_blocks_total",
                "KV cache blocks in the pool.",
                s.kv_blocks_total,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let counters: [(&str, &str, u64); 9] = [
            (
                "m3_num_preemptions_total",
                "Sequences preempted (freed and recomputed later).",
                s.preemptions,
            ),
            (
                "m3_prefix_cache_hit_tokens_total",
                "Prompt tokens served from the prefix cache.",
                s.prefix_cache_hit_tokens,
            ),
            (
                "m3_prompt_tokens_computed_total",
                "Prompt and recompute tokens computed.",
                s.prefill_tokens,
            ),
            (
                "m3_generation_tokens_total",
                "Tokens generated.",
                s.generation_tokens,
            ),
            (
                "m3_spec_decode_draft_tokens_total",
                "Speculative draft tokens verified.",
                s.spec_proposed,
            ),
            (
                "m3_spec_decode_accepted_tokens_total",
                "Speculative draft tokens accepted.",
                s.spec_accepted,
            ),
            (
                "m3_requests_finished_total",
                "Requests that finished.",
                s.requests_finished,
            ),
            (
                "m3_requests_aborted_total",
                "Requests aborted because the client went away.",
                s.requests_aborted,
            ),
            ("m3_engine_steps_total", "Engine steps run.", s.steps),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let acc = if s.spec_proposed > 0 {
            s.spec_accepted as f64 / s.spec_proposed as f64
        } else {
            0.0
        };
        let _ = writeln!(
            out,
            "# HELP m3_spec_decode_acceptance_rate Accepted over verified draft tokens (0 before any).\n# TYPE m3_spec_decode_acceptance_rate gauge\nm3_spec_decode_acceptance_rate {acc}"
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.update(|s| {
            s.ttft.observe(0.003);
            s.ttft.observe(0.2);
            s.ttft.observe(500.0);
            s.kv_blocks_used = 7;
        });
        let text = m.render();
        assert!(text.contains("m3_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("m3_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"));
        assert!(text.contains("m3_time_to_first_token_seconds_bucket{le=\"120\"} 2\n"));
        assert!(text.contains("m3_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("m3_time_to_first_token_seconds_count 3\n"));
        assert!(text.contains("\nm3_kv_blocks_used 7\n"));
    }
}
