//! `m3 bench-serve`: a serving benchmark client. Sends `--num-prompts`
//! streaming `/v1/completions` requests, `--concurrency` at a time, each
//! with `--input-len` prompt tokens (ids, so the length is exact) and
//! `--output-len` generated tokens (`ignore_eos`, greedy), to a running
//! OpenAI-compatible server (`m3 serve`, or vLLM with the same extensions),
//! and reports time to first token, inter-token latency, end-to-end latency
//! (mean and p50 / p90 / p99, milliseconds) and throughput.
//!
//! Tokens are counted from each chunk's `token_ids` (vLLM's
//! `return_token_ids` extension), falling back to one token per non-empty
//! chunk when a server does not send them. Inter-token latency is the gap
//! between token-carrying chunks divided by the tokens the later one
//! carries. The JSON report is written to a temporary file and renamed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use m3_core::checkpoint::writer::write_file_atomic;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct Args {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Model name to send (default: the first of `GET /v1/models`).
    #[arg(long)]
    pub model: Option<String>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Requests in total (default: 4 x --concurrency).
    #[arg(long)]
    pub num_prompts: Option<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 64)]
    pub output_len: usize,
    /// Prompt token ids are drawn below this (keep it under the model's
    /// vocabulary).
    #[arg(long, default_value_t = 256)]
    pub id_range: u32,
    /// Seed of the prompts (each request's prompt differs, so the prefix
    /// cache does not serve them). Default: from the clock, so a second run
    /// against the same server does not hit the first run's cached
    /// prompts; the report records the seed used.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Bearer token for a server started with --api-key.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Write the JSON report here (also printed).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_s: u64,
}

/// One request's measurements.
#[derive(Clone, Debug, Default)]
struct Sample {
    ttft: f64,
    itl: Vec<f64>,
    e2e: f64,
    tokens: usize,
}

/// Percentile `q` (0..=100) by nearest rank of sorted `v`.
fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((q / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Mean and p50 / p90 / p99 in milliseconds of `secs`.
fn summary(mut secs: Vec<f64>) -> Value {
    secs.retain(|x| x.is_finite());
    secs.sort_by(f64::total_cmp);
    let ms = |x: f64| (x * 1e3 * 1000.0).round() / 1000.0;
    let mean = if secs.is_empty() {
        f64::NAN
    } else {
        secs.iter().sum::<f64>() / secs.len() as f64
    };
    json!({
        "count": secs.len(),
        "mean": ms(mean),
        "p50": ms(percentile(&secs, 50.0)),
        "p90": ms(percentile(&secs, 90.0)),
        "p99": ms(percentile(&secs, 99.0)),
    })
}

/// Deterministic prompt ids of request `i`.
fn prompt(seed: u64, i: usize, len: usize, range: u32) -> Vec<u32> {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % u64::from(range.max(1))) as u32
        })
        .collect()
}

async fn one(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    body: Value,
) -> Result<Sample> {
    let t0 = Instant::now();
    let mut req = client.post(url).json(&body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.context("sending the request")?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        bail!("HTTP {status}: {text}");
    }
    let mut s = Sample::default();
    let mut last: Option<Instant> = None;
    let mut buf = Vec::<u8>::new();
    let mut stream = resp.bytes_stream();
    let mut done = false;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("reading the stream")?;
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(data)
                .with_context(|| format!("a stream chunk is not JSON: {data}"))?;
            if let Some(e) = v.get("error") {
                bail!("server error in the stream: {e}");
            }
            let Some(c) = v["choices"].get(0) else {
                continue;
            };
            let n = match c.get("token_ids").and_then(Value::as_array) {
                Some(ids) => ids.len(),
                None => usize::from(c["text"].as_str().is_some_and(|t| !t.is_empty())),
            };
            if n == 0 {
                continue;
            }
            let now = Instant::now();
            match last {
                None => s.ttft = now.duration_since(t0).as_secs_f64(),
                Some(p) => {
                    let dt = now.duration_since(p).as_secs_f64() / n as f64;
                    s.itl.extend(std::iter::repeat_n(dt, n));
                }
            }
            last = Some(now);
            s.tokens += n;
        }
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    s.e2e = t0.elapsed().as_secs_f64();
    Ok(s)
}

pub fn run(a: Args) -> Result<()> {
    if a.concurrency == 0 || a.input_len == 0 || a.output_len == 0 {
        bail!("--concurrency, --input-len and --output-len must be at least 1");
    }
    let total = a.num_prompts.unwrap_or(4 * a.concurrency);
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let base = a.url.trim_end_matches('/').to_string();
    let report = rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(a.timeout_s))
            .pool_max_idle_per_host(a.concurrency)
            .build()
            .context("building the HTTP client")?;
        let model = match &a.model {
            Some(m) => m.clone(),
            None => {
                let mut r = client.get(format!("{base}/v1/models"));
                if let Some(k) = &a.api_key {
                    r = r.bearer_auth(k);
                }
                let v: Value = r
                    .send()
                    .await
                    .with_context(|| format!("GET {base}/v1/models (is the server running?)"))?
                    .json()
                    .await
                    .context("reading /v1/models")?;
                v["data"][0]["id"]
                    .as_str()
                    .ok_or_else(|| anyhow!("/v1/models lists no model: {v}"))?
                    .to_string()
            }
        };
        let next = Arc::new(AtomicUsize::new(0));
        let url = format!("{base}/v1/completions");
        let t0 = Instant::now();
        let mut workers = Vec::new();
        for _ in 0..a.concurrency.min(total) {
            let (client, next, url, model) =
                (client.clone(), Arc::clone(&next), url.clone(), model.clone());
            let key = a.api_key.clone();
            let (il, ol, range) = (a.input_len, a.output_len, a.id_range);
            workers.push(tokio::spawn(async move {
                let mut out: Vec<Result<Sample>> = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let body = json!({
                        "model": model,
                        "prompt": prompt(seed, i, il, range),
                        "max_tokens": ol,
                        "temperature": 0,
                        "ignore_eos": true,
                        "stream": true,
                        "stream_options": {"include_usage": true},
                        "return_token_ids": true,
                    });
                    out.push(one(&client, &url, key.as_deref(), body).await);
                }
                out
            }));
        }
        let mut samples = Vec::new();
        let mut errors = Vec::new();
        for w in workers {
            for r in w.await.map_err(|e| anyhow!("a client task failed: {e}"))? {
                match r {
                    Ok(s) => samples.push(s),
                    Err(e) => errors.push(format!("{e:#}")),
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let out_tokens: usize = samples.iter().map(|s| s.tokens).sum();
        let short = samples.iter().filter(|s| s.tokens != a.output_len).count();
        Ok::<_, anyhow::Error>(json!({
            "url": base,
            "model": model,
            "concurrency": a.concurrency,
            "seed": seed,
            "requests": total,
            "completed": samples.len(),
            "failed": errors.len(),
            "errors": errors.iter().take(5).collect::<Vec<_>>(),
            "short_outputs": short,
            "input_len": a.input_len,
            "output_len": a.output_len,
            "duration_s": (secs * 1000.0).round() / 1000.0,
            "requests_per_s": samples.len() as f64 / secs.max(1e-9),
            "output_tokens_per_s": out_tokens as f64 / secs.max(1e-9),
            "total_tokens_per_s": (out_tokens + samples.len() * a.input_len) as f64 / secs.max(1e-9),
            "ttft_ms": summary(samples.iter().map(|s| s.ttft).collect()),
            "itl_ms": summary(samples.iter().flat_map(|s| s.itl.iter().copied()).collect()),
            "e2e_ms": summary(samples.iter().map(|s| s.e2e).collect()),
        }))
    })?;
    let text = serde_json::to_string_pretty(&report).context("serializing the report")?;
    println!("{text}");
    if let Some(p) = &a.output {
        write_file_atomic(p, format!("{text}\n").as_bytes())
            .with_context(|| format!("writing --output {}", p.display()))?;
    }
    if report["completed"].as_u64() == Some(0) {
        bail!("no request completed: {}", report["errors"]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 90.0), 90.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
        let s = summary(vec![0.001, 0.002, 0.003]);
        assert_eq!(s["p50"], 2.0);
        assert_eq!(s["count"], 3);
    }

    #[test]
    fn prompts_are_deterministic_and_distinct() {
        assert_eq!(prompt(1, 2, 8, 256), prompt(1, 2, 8, 256));
        assert_ne!(prompt(1, 2, 8, 256), prompt(1, 3, 8, 256));
        assert!(prompt(0, 0, 64, 10).iter().all(|&t| t < 10));
    }
}
