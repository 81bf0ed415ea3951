//! Bench-only parts of the standard path (`m3 bench --backend gpu`): a
//! cache filled with generated codes instead of a prefill, timed graph
//! replays, the per-launch profile, and tensor-core kernel variants.

use m3_core::backend::{StepBatch, StepSeq};

use super::exec::Shape;
use super::linear::MmaVariant;
use super::step::Extras;
use super::{StandardPath, STANDARD};
use crate::error::{GpuError, Result};
use crate::runtime::api::Gpu;

impl StandardPath {
    /// Fill every K, V and index-key cache slot with codes hashed from
    /// `seed`: the bench's stand-in for a prefill of the context. fp8: |v|
    /// in [0.5, 1.875], random sign (bf16 caches get the same bytes,
    /// whatever values they decode to); NVFP4: any E2M1 codes and block
    /// scales in [1, 1.875] (E4M3 0x38..0x3F: finite, positive).
    pub fn fill_cache(&self, gpu: &dyn Gpu, seed: u64) -> Result<()> {
        let g = crate::model::generated::Gen::new(gpu)?;
        for (l, lc) in self.kv.layers.iter().enumerate() {
            // K, V, index K: ids 4l, 4l + 1, 4l + 2 (the fp8 fill of old)
            let tid = 1_000_000 + 4 * l as u32;
            for (i, t) in lc.tensors().enumerate() {
                let i = i as u32;
                match &t.scales {
                    None => g.bytes(&t.data, seed, tid + i, 0x8f, 0x30)?,
                    Some(sc) => {
                        g.bytes(&t.data, seed, tid + i, 0xff, 0)?;
                        g.bytes(sc, seed, tid + 1_000_000 + i, 0x07, 0x38)?;
                    }
                }
            }
        }
        g.sync()
    }

    /// Time `iters` replays of the uploaded step's graph, each bracketed by
    /// its own device event pair (ms per step).
    pub fn time_replays(&mut self, s: Shape, iters: usize) -> Result<Vec<f64>> {
        self.launch(s, true)?;
        let (dev, stream) = (self.l.device().clone(), self.l.stream().clone());
        super::launch::time_each(&dev, &stream, iters, || self.launch(s, true))
    }

    /// Run the uploaded step once with direct launches and an event after
    /// every launch: (label, ms) per launch in order. The gaps between
    /// launches (launch latency, not hidden here as in a graph) are included
    /// in each launch's time, so the sum exceeds a graph replay's time.
    /// A mono step profiles one entry per `m3s_mono` launch (`mono`: a
    /// layer, or `PathOptions::mono_layers_per_launch` of them).
    pub fn profile(&mut self, s: Shape) -> Result<Vec<(&'static str, f64)>> {
        let mono = self.mono_for(s.rows);
        if mono {
            self.mono_prepare(s.rows)?;
        }
        let run = |p: &Self| {
            if mono {
                p.enqueue_mono(s.rows, s.logits_rows, false)
            } else {
                p.enqueue(s.rows, s.logits_rows, &Extras::default())
            }
        };
        // warm: the first direct run may page in code and data
        run(self)?;
        self.l.profile_start()?;
        let r = run(self);
        let marks = self.l.profile_end();
        r?;
        marks
    }

    /// Compile the tensor-core linear kernels again with `defines`
    /// (`NAME=VALUE` pairs separated by spaces, e.g. `S_MMA_WARPS=4
    /// S_UNROLL_MUL=2`; see standard_decode.cu) as a bench variant; returns
    /// its index for [`StandardPath::set_variant`].
    pub fn add_variant(&mut self, gpu: &dyn Gpu, defines: &str) -> Result<usize> {
        self.kern
            .lin
            .mma
            .push(MmaVariant::load(gpu, &STANDARD, defines)?);
        Ok(self.kern.lin.mma.len() - 1)
    }

    /// Run later steps with tensor-core variant `v` (an index from
    /// [`StandardPath::add_variant`], 0 = the 64-row default), or `None`:
    /// by the step's rows (the 16-row small-step variant up to 16 rows).
    pub fn set_variant(&mut self, v: Option<usize>) -> Result<()> {
        if let Some(i) = v.filter(|&i| i >= self.kern.lin.mma.len()) {
            return Err(GpuError::input(
                "kernel variant",
                format!("{i} of {}", self.kern.lin.mma.len()),
            ));
        }
        self.forced_variant = v;
        Ok(())
    }

    /// Run later decode steps up to the mono threshold (`mono_max_rows`) on the mono
    /// path (`true`, it must have been loaded: `PathOptions::mono`) or the
    /// standard one.
    pub fn set_mono(&mut self, on: bool) -> Result<()> {
        if on && self.mono.is_none() {
            return Err(GpuError::input(
                "mono path",
                "not loaded: build the path with PathOptions::mono",
            ));
        }
        self.mono_on = on;
        Ok(())
    }

    /// Whether the path has its mono kernel (`PathOptions::mono`).
    pub fn has_mono(&self) -> bool {
        self.mono.is_some()
    }

    /// Steps launched on the mono path so far.
    pub fn mono_steps(&self) -> u64 {
        self.mono_steps
    }

    /// The mono kernel's launch shape and resources, and the layers a
    /// launch runs, if the path has it.
    pub fn mono_about(&self) -> Option<String> {
        self.mono
            .as_ref()
            .map(|m| format!("{} ({})", m.about(), m.launch_layers()))
    }

    /// Name of each compiled variant (index = variant).
    pub fn variants(&self) -> Vec<String> {
        self.kern.lin.mma.iter().map(|v| v.label.clone()).collect()
    }

    /// Graphs captured so far.
    pub fn graph_count(&self) -> usize {
        self.graphs.len()
    }
}

/// The in-run bandwidth ceiling's two probes (PERF.md, step 2) on either
/// vendor, through the runtime line: a device-to-device copy of `bytes`
/// (GB/s counts read + write, 2 x bytes) and a streaming read of `bytes`
/// (a multiple of 16) by `m3_stream_read`, 8 CTAs of 256 threads a
/// multiprocessor. Three untimed runs, then `iters` each between its own
/// event pair.
pub fn probe_copy(gpu: &dyn Gpu, bytes: usize, iters: usize) -> Result<crate::Timing> {
    let l = super::launch::Launcher::new(gpu.device(), false)?;
    let src = crate::model::DevBuf::zeroed(gpu.device(), bytes)?;
    let dst = crate::model::DevBuf::zeroed(gpu.device(), bytes)?;
    // SAFETY: both ranges lie inside their allocations, which outlive the
    // timed copies (time_each synchronizes before returning).
    let copy = || unsafe { l.stream().dtod(dst.ptr(), src.ptr(), bytes) };
    timed(&l, iters, copy)
}

/// See [`probe_copy`].
pub fn probe_read(gpu: &dyn Gpu, bytes: usize, iters: usize) -> Result<crate::Timing> {
    if bytes == 0 || !bytes.is_multiple_of(16) {
        return Err(GpuError::input(
            "read probe",
            format!("{bytes} bytes: a positive multiple of 16"),
        ));
    }
    let l = super::launch::Launcher::new(gpu.device(), false)?;
    let buf = crate::model::DevBuf::new(gpu.device(), bytes)?;
    // 0x5a bytes, written 64 MiB at a time (no 4 GiB host copy)
    let chunk = vec![0x5au8; (64usize << 20).min(bytes)];
    let mut off = 0;
    while off < bytes {
        let n = chunk.len().min(bytes - off);
        buf.write_sync(off, &chunk[..n])?;
        off += n;
    }
    let sink = crate::model::DevBuf::zeroed(gpu.device(), 4)?;
    let f = gpu.kernel(&crate::kernels::BENCH, "m3_stream_read")?;
    let grid = gpu.multiprocessors().max(1) * 8;
    let args = [
        super::launch::Arg::U64(buf.ptr()),
        super::launch::Arg::U64((bytes / 16) as u64),
        super::launch::Arg::U64(sink.ptr()),
    ];
    timed(&l, iters, || {
        l.launch("stream_read", &f, (grid, 1, 1), 256, 0, &args)
    })
}

/// Three untimed runs of `f`, then `iters` timed ones.
fn timed(
    l: &super::launch::Launcher,
    iters: usize,
    f: impl Fn() -> Result<()>,
) -> Result<crate::Timing> {
    for _ in 0..3 {
        f()?;
    }
    l.sync()?;
    Ok(crate::Timing::from_samples(l.time_each(iters, &f)?))
}

/// A decode step to time (the bench's cases, the load-time mono
/// crossover): sequence `b` has `rows[b]` rows at positions `ctx..ctx +
/// rows[b]` (one: a decode row; more: a verify step's shape, its rows
/// ending the context), block table `table(b)` (covering those positions:
/// `(ctx + rows[b]).div_ceil(page)` pages), tokens hashed from the
/// sequence and row; every row a logits row; marked decode-only.
pub fn timing_step(
    rows: &[usize],
    ctx: usize,
    page: usize,
    vocab: usize,
    table: impl Fn(usize) -> Vec<u32>,
) -> StepBatch {
    let mut s = StepBatch {
        decode_only: true,
        ..StepBatch::default()
    };
    let vocab = vocab.max(1);
    for (b, &n) in rows.iter().enumerate() {
        let table = table(b);
        for r in 0..n {
            let p = ctx + r;
            s.tokens.push(((b * 7919 + r * 31 + 13) % vocab) as u32);
            s.positions.push(p as u32);
            let pg = table.get(p / page).copied().unwrap_or(u32::MAX);
            s.slot_mapping
                .push(pg.wrapping_mul(page as u32).wrapping_add((p % page) as u32));
            s.row_seq.push(b as u32);
            s.logits_rows.push(s.logits_rows.len() as u32);
        }
        s.seqs.push(StepSeq {
            request_id: b as u64,
            block_table: table,
            context_len: (ctx + n) as u32,
        });
    }
    s
}
