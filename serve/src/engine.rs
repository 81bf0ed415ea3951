//! The engine: one thread owns the loaded model and runs the scheduler
//! loop; HTTP handlers talk to it through channels.
//!
//! Why one thread: a [`ModelRunner`](m3_core::backend::ModelRunner) owns
//! device state (a CUDA context, graphs, the KV tensors) and is neither
//! `Send` nor `Sync` in general; the scheduler is a plain state machine
//! that must see every request between two steps. So the caller builds the
//! [`SchedRunner`] *on* the engine thread and hands it to [`run_engine`],
//! which never returns it. Everything else reaches it as a [`Command`] on
//! a `std::sync::mpsc` channel (cheap to send from async code, and the
//! engine can block on it while idle).
//!
//! Per request the engine holds a tokio unbounded sender of
//! [`EngineEvent`]s (new token ids each step, then `Done`). It is the same
//! loop `m3 batch` runs (`SchedRunner::step`: continuous batching, chunked
//! prefill, prefix cache, speculative decoding), stepped one step at a time
//! so requests join and leave between steps:
//! 1. take every pending command (block for one when nothing is running);
//! 2. abort every request whose receiver is gone (the client disconnected:
//!    the HTTP side dropped its stream or its future) — its blocks are freed
//!    before the next step is planned;
//! 3. run one step and send each live request the tokens it committed (and
//!    logprobs for those that asked), then `Done` for the finished ones.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use m3_core::sched::runner::{RunnerError, SchedRunner};
use m3_core::sched::{FinishReason, Request, RequestId};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// Log-probabilities of one generated token (natural log, of the model's
/// raw distribution: softmax of the logits, before temperature / top-k /
/// top-p, as OpenAI reports them).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The `k` most likely tokens with their log-probabilities, most likely
    /// first (`k` as the request asked; may be empty).
    pub top: Vec<(u32, f32)>,
}

/// What the engine sends a request's handler.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// Tokens committed by one step, in order (more than one after an
    /// accepted speculative draft). `logprobs` has one entry per token when
    /// the request asked for them.
    Tokens {
        ids: Vec<u32>,
        logprobs: Option<Vec<TokenLogprob>>,
    },
    /// The request is over (no more events). `Rejected`: it can never fit
    /// the KV cache.
    Done {
        reason: FinishReason,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
    },
    /// The engine failed (a backend error); the request is over.
    Error(String),
}

/// One request handed to the engine.
pub struct Submission {
    /// Its `id` is overwritten with a fresh engine id.
    pub request: Request,
    /// Top log-probabilities to return per token (`Some(0)`: only the
    /// sampled token's), `None` for no logprobs (no logits read back).
    pub logprobs: Option<u32>,
    /// When the HTTP request arrived (TTFT and end-to-end latency).
    pub arrival: Instant,
    pub events: UnboundedSender<EngineEvent>,
}

/// Messages to the engine thread.
pub enum Command {
    Add(Submission),
    /// Finish the running requests, then return (new requests are refused
    /// by the HTTP side before this is sent).
    Shutdown,
}

/// The HTTP side's handle on the engine: submit requests, read metrics.
/// Cheap to share (`Arc`).
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    next_id: AtomicU64,
    /// Requests submitted and not yet dropped by their handler (queued in
    /// the engine, waiting or running): the admission count.
    in_flight: AtomicUsize,
    /// Most requests in flight before new ones are refused (429).
    capacity: usize,
    /// Set when the engine thread has stopped (error or shutdown).
    stopped: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
}

/// Why a submission was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is at capacity ({0} requests running or queued); retry later")]
    Full(usize),
    #[error("the engine is not running")]
    Stopped,
}

/// Held by a handler for as long as its request is in flight; dropping it
/// frees the admission slot.
pub struct Slot<'a> {
    handle: &'a EngineHandle,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.handle.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An owned admission slot (for a streaming task that outlives the handler).
pub struct OwnedSlot {
    handle: Arc<EngineHandle>,
}

impl Drop for OwnedSlot {
    fn drop(&mut self) {
        self.handle.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl EngineHandle {
    /// A handle sending to `tx`; at most `capacity` requests in flight.
    pub fn new(
        tx: mpsc::Sender<Command>,
        capacity: usize,
        metrics: Arc<Metrics>,
        stopped: Arc<AtomicBool>,
    ) -> Self {
        EngineHandle {
            tx,
            next_id: AtomicU64::new(1),
            in_flight: AtomicUsize::new(0),
            capacity,
            stopped,
            metrics,
        }
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Whether the engine thread is still running.
    pub fn is_running(&self) -> bool {
        !self.stopped.load(Ordering::Acquire)
    }

    /// Take an admission slot, or refuse when `capacity` are in flight.
    fn reserve(&self) -> Result<(), SubmitError> {
        if !self.is_running() {
            return Err(SubmitError::Stopped);
        }
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| SubmitError::Full(self.capacity))
    }

    /// Submit a request; returns its engine id and the slot that keeps it
    /// admitted. The request runs until it finishes or its event receiver
    /// is dropped.
    pub fn submit(self: &Arc<Self>, mut sub: Submission) -> Result<(u64, OwnedSlot), SubmitError> {
        self.reserve()?;
        let slot = OwnedSlot {
            handle: Arc::clone(self),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        sub.request.id = id;
        self.tx
            .send(Command::Add(sub))
            .map_err(|_| SubmitError::Stopped)?;
        Ok((id, slot))
    }

    /// A borrowed slot (tests of the admission rule).
    pub fn try_slot(&self) -> Result<Slot<'_>, SubmitError> {
        self.reserve()?;
        Ok(Slot { handle: self })
    }

    /// Ask the engine to stop once the running requests are done.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// A live request in the engine.
struct Live {
    events: UnboundedSender<EngineEvent>,
    /// Output tokens already sent.
    sent: usize,
    logprobs: Option<u32>,
    arrival: Instant,
    last_token: Option<Instant>,
}

/// Natural-log softmax of `logits` at `token` and the top `k` entries.
pub fn logprobs_of(logits: &[f32], token: u32, k: usize) -> TokenLogprob {
    let max = logits
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let lse = f64::from(max)
        + logits
            .iter()
            .map(|&x| (f64::from(x) - f64::from(max)).exp())
            .sum::<f64>()
            .ln();
    let lp = |t: u32| -> f32 {
        logits
            .get(t as usize)
            .map_or(f32::NEG_INFINITY, |&x| (f64::from(x) - lse) as f32)
    };
    let mut top: Vec<(u32, f32)> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k.saturating_sub(1), |&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        top = idx.into_iter().map(|t| (t, lp(t))).collect();
    }
    TokenLogprob {
        token,
        logprob: lp(token),
        top,
    }
}

/// Run the engine loop over `sr` until [`Command::Shutdown`] (and every
/// running request has finished) or every [`EngineHandle`] is dropped.
/// `stopped` is set on return. A backend error ends every live request
/// with [`EngineEvent::Error`] and is returned.
pub fn run_engine(
    sr: &mut SchedRunner<'_>,
    rx: mpsc::Receiver<Command>,
    metrics: &Metrics,
    stopped: &AtomicBool,
) -> Result<(), RunnerError> {
    /// Sets `stopped` however the loop ends, a panic included, so the
    /// HTTP side stops admitting requests and `m3 serve` can exit.
    struct Stopped<'a>(&'a AtomicBool);
    impl Drop for Stopped<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }
    let _guard = Stopped(stopped);
    engine_loop(sr, rx, metrics)
}

fn engine_loop(
    sr: &mut SchedRunner<'_>,
    rx: mpsc::Receiver<Command>,
    metrics: &Metrics,
) -> Result<(), RunnerError> {
    let vocab = sr.runner.config().vocab_size;
    let mut live: BTreeMap<RequestId, Live> = BTreeMap::new();
    let mut draining = false;
    let total_blocks = sr.sched.pool().num_blocks();
    metrics.update(|m| m.kv_blocks_total = total_blocks);
    loop {
        // 1. Commands: block while idle, else take what is there.
        let mut cmds = Vec::new();
        if sr.sched.is_done() && live.is_empty() {
            if draining {
                return Ok(());
            }
            match rx.recv() {
                Ok(c) => cmds.push(c),
                Err(_) => return Ok(()),
            }
        }
        loop {
            match rx.try_recv() {
                Ok(c) => cmds.push(c),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    draining = true;
                    break;
                }
            }
        }
        for c in cmds {
            match c {
                Command::Shutdown => draining = true,
                Command::Add(sub) => {
                    let id = sub.request.id;
                    if sub.logprobs.is_some() {
                        sr.want_logits.insert(id);
                    }
                    match sr.sched.add_request(sub.request) {
                        Ok(()) => {
                            live.insert(
                                id,
                                Live {
                                    events: sub.events,
                                    sent: 0,
                                    logprobs: sub.logprobs,
                                    arrival: sub.arrival,
                                    last_token: None,
                                },
                            );
                        }
                        Err(e) => {
                            sr.want_logits.remove(&id);
                            let _ = sub.events.send(EngineEvent::Error(e.to_string()));
                        }
                    }
                }
            }
        }
        // 2. Disconnected clients.
        let gone: Vec<RequestId> = live
            .iter()
            .filter(|(_, l)| l.events.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            live.remove(&id);
            sr.abort(id)?;
            tracing::debug!(request = id, "client gone: request aborted");
        }
        // 3. One step (when anything is runnable).
        if !sr.sched.is_done() {
            let step = match sr.step() {
                Ok(s) => s,
                Err(e) => {
                    let msg = format!("engine step failed: {e}");
                    for (_, l) in std::mem::take(&mut live) {
                        let _ = l.events.send(EngineEvent::Error(msg.clone()));
                    }
                    return Err(e);
                }
            };
            let now = Instant::now();
            let finished = sr.sched.take_finished();
            // Gauges and counters first, so a client that has seen this
            // step's tokens also sees its state in /metrics.
            let c = *sr.sched.counters();
            let pool = sr.sched.pool();
            let used = pool.num_blocks() - pool.num_available();
            let (running, waiting) = (sr.sched.num_running(), sr.sched.num_waiting());
            metrics.update(|m| {
                m.running = running;
                m.waiting = waiting;
                m.kv_blocks_used = used;
                m.preemptions = c.preemptions;
                m.prefix_cache_hit_tokens = c.prefix_hit_tokens;
                m.prefill_tokens = c.prefill_tokens;
                m.generation_tokens = c.tokens_generated;
                m.spec_proposed = c.spec_proposed;
                m.spec_accepted = c.spec_accepted;
                m.requests_finished = c.requests_finished;
                m.requests_aborted = c.requests_aborted;
                if !step.is_empty() {
                    m.steps += 1;
                }
            });
            let mut itl = Vec::new();
            let mut ttft = Vec::new();
            let mut e2e = Vec::new();
            // Tokens committed by running requests.
            for s in step.seqs.iter().filter(|s| s.needs_logits) {
                let id = s.request_id;
                let Some(out) = sr.sched.output(id) else {
                    continue; // finished this step: handled below
                };
                if let Some(l) = live.get_mut(&id) {
                    send_new(
                        l,
                        id,
                        out,
                        sr.step_logits.get(&id),
                        vocab,
                        now,
                        &mut ttft,
                        &mut itl,
                    );
                }
            }
            for f in finished {
                if let Some(d) = sr.drafter.as_mut() {
                    d.forget(f.id);
                }
                sr.want_logits.remove(&f.id);
                sr.spec_stats.remove(&f.id);
                if let Some(mut l) = live.remove(&f.id) {
                    send_new(
                        &mut l,
                        f.id,
                        &f.output,
                        sr.step_logits.get(&f.id),
                        vocab,
                        now,
                        &mut ttft,
                        &mut itl,
                    );
                    if f.reason != FinishReason::Rejected {
                        e2e.push(now.duration_since(l.arrival).as_secs_f64());
                    }
                    let _ = l.events.send(EngineEvent::Done {
                        reason: f.reason,
                        cached_tokens: f.cached_tokens,
                    });
                }
            }
            metrics.update(|m| {
                for x in ttft {
                    m.ttft.observe(x);
                }
                for x in itl {
                    m.itl.observe(x);
                }
                for x in e2e {
                    m.e2e.observe(x);
                }
            });
        } else {
            // Nothing runnable: rejected requests (finished at add time)
            // still need their `Done`.
            for f in sr.sched.take_finished() {
                sr.want_logits.remove(&f.id);
                if let Some(l) = live.remove(&f.id) {
                    let _ = l.events.send(EngineEvent::Done {
                        reason: f.reason,
                        cached_tokens: f.cached_tokens,
                    });
                }
            }
            let pool = sr.sched.pool();
            let used = pool.num_blocks() - pool.num_available();
            let aborted = sr.sched.counters().requests_aborted;
            metrics.update(|m| {
                m.running = 0;
                m.waiting = 0;
                m.kv_blocks_used = used;
                m.requests_aborted = aborted;
            });
        }
    }
}

/// Send `l` the part of `out` (the request's output so far) it has not
/// seen, with logprobs from `logits` (one row per token committed this
/// step) when asked; record TTFT / inter-token intervals.
#[allow(clippy::too_many_arguments)]
fn send_new(
    l: &mut Live,
    id: RequestId,
    out: &[u32],
    logits: Option<&Vec<f32>>,
    vocab: usize,
    now: Instant,
    ttft: &mut Vec<f64>,
    itl: &mut Vec<f64>,
) {
    if out.len() <= l.sent {
        return;
    }
    let ids = out[l.sent..].to_vec();
    let logprobs = l.logprobs.map(|k| {
        ids.iter()
            .enumerate()
            .map(|(j, &t)| match logits {
                Some(rows) if rows.len() >= (j + 1) * vocab => {
                    logprobs_of(&rows[j * vocab..(j + 1) * vocab], t, k as usize)
                }
                _ => {
                    tracing::warn!(request = id, "no logits row for a token's logprobs");
                    TokenLogprob {
                        token: t,
                        logprob: f32::NAN,
                        top: Vec::new(),
                    }
                }
            })
            .collect()
    });
    match l.last_token {
        None => ttft.push(now.duration_since(l.arrival).as_secs_f64()),
        Some(prev) => {
            let dt = now.duration_since(prev).as_secs_f64() / ids.len() as f64;
            itl.extend(std::iter::repeat_n(dt, ids.len()));
        }
    }
    l.last_token = Some(now);
    l.sent = out.len();
    let _ = l.events.send(EngineEvent::Tokens { ids, logprobs });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_log_softmax() {
        let lp = logprobs_of(&[0.0, 1.0, 2.0, 0.5], 1, 2);
        let z: f64 = [0.0f64, 1.0, 2.0, 0.5].iter().map(|x| x.exp()).sum();
        assert!((f64::from(lp.logprob) - (1.0 - z.ln())).abs() < 1e-6);
        assert_eq!(lp.top.len(), 2);
        assert_eq!(lp.top[0].0, 2);
        assert_eq!(lp.top[1].0, 1);
        assert!(lp.top[0].1 > lp.top[1].1);
        assert!(logprobs_of(&[1.0, 2.0], 0, 0).top.is_empty());
    }

    #[test]
    fn admission_capacity() {
        let (tx, _rx) = mpsc::channel();
        let h = EngineHandle::new(
            tx,
            2,
            Arc::new(Metrics::default()),
            Arc::new(AtomicBool::new(false)),
        );
        let a = h.try_slot().unwrap();
        let _b = h.try_slot().unwrap();
        assert_eq!(h.try_slot().err(), Some(SubmitError::Full(2)));
        drop(a);
        assert!(h.try_slot().is_ok());
        assert_eq!(h.in_flight(), 1);
    }
}
