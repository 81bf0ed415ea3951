//! `m3 bench --backend gpu`: the graph-captured standard path on PERF.md's
//! bench model (weights generated on the device from a seed), following
//! PERF.md's GPU protocol:
//! 1. clocks and throttle reasons recorded (nvidia-smi, before and after);
//! 2. ceiling measured in the same run (device-to-device copy, bytes read +
//!    written, and a streaming-read kernel; the larger is quoted);
//! 3. every case compiled, captured into a graph and warmed up;
//! 4. correctness is gated separately (gpu-mi350/tests/standard_path.rs on
//!    `tiny`, which must pass in the same device session);
//! 5. each case timed over `iters` graph replays, one device event pair
//!    each: median, p10, p90;
//! 6. cases interleaved over `rounds` rounds; ratios within a round;
//! 7. one JSON with the raw samples.
//!
//! The context is filled with generated fp8 K/V/index-key codes instead of a
//! prefill (same bytes read by the decode step; selection and attention see
//! generated keys). Each case is a pure decode step of `batch` sequences,
//! one row each at position `context`; replays feed the greedy token back
//! (argmax on the device) and rewrite the same cache slot.

use std::process::Command;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use m3_core::backend::StepBatch;
use m3_core::backend::{ActMode, KvBudget};
use m3_core::config::ModelConfig;
use m3_core::kv::CacheDtype;
use m3_core::sample::SampleParams;
use m3_gpu::benchmodel::{self, BenchWeights, SharedGen};
use m3_gpu::standard::bench::{probe_copy, probe_read};
use m3_gpu::standard::{Capacity, PathOptions, StandardPath};

use super::BenchPath;
use m3_gpu::Gpu;
use serde_json::json;

use super::Args;

/// The bench's device: CUDA device 0, or where CUDA finds none, HIP
/// device 0 (`M3_GPU_RUNTIME=cuda|hip` forces one, `sim|sim-cuda` the
/// simulator on this machine's CPU: figures from it are not speeds).
fn open_gpu() -> Result<m3_gpu::GpuBackend> {
    m3_gpu::GpuBackend::open().map_err(|e| anyhow!("--backend gpu: {e}"))
}

/// The device line of the report, and its JSON.
fn describe(gpu: &dyn Gpu) -> (String, serde_json::Value) {
    let d = gpu.describe();
    let line = format!(
        "device: {} ({}, {} multiprocessors, {:.1} GiB, {} {}.{}){}",
        d.name,
        d.arch,
        d.units,
        d.total_mem_bytes as f64 / (1u64 << 30) as f64,
        d.compiler.0,
        d.compiler.1,
        d.compiler.2,
        if gpu.simulated() {
            ": the simulator, so no time below is a speed"
        } else {
            ""
        }
    );
    let json = json!({"name": d.name, "arch": d.arch, "sm_count": d.units,
        "total_mem_bytes": d.total_mem_bytes, d.compiler.0: [d.compiler.1, d.compiler.2],
        "simulated": gpu.simulated()});
    (line, json)
}

fn nvidia_smi() -> String {
    Command::new("nvidia-smi")
        .args([
            "--query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,clocks_event_reasons.active,power.draw,temperature.gpu",
            "--format=csv,noheader",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "nvidia-smi not available (clocks not recorded)".to_string())
}

/// Per-kernel profile of one case: time per launch label (summed over the
/// step's launches of that label), largest first.
fn print_profile(case: &str, prof: &[(&'static str, f64)]) {
    let mut by: Vec<(&str, f64, usize)> = Vec::new();
    for &(l, ms) in prof {
        match by.iter_mut().find(|e| e.0 == l) {
            Some(e) => {
                e.1 += ms;
                e.2 += 1;
            }
            None => by.push((l, ms, 1)),
        }
    }
    by.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = by.iter().map(|e| e.1).sum();
    println!(
        "profile {case}: {} launches, {total:.3} ms (direct launches, gaps included)",
        prof.len()
    );
    for (l, ms, n) in by {
        println!(
            "  {l:>18} {ms:8.3} ms {:5.1}%  x{n}",
            100.0 * ms / total.max(1e-12)
        );
    }
}

/// The mono op profile: per op of the common layer program, its times
/// summed over the `layers` layers that run it (comparable with the
/// standard profile's per-label sums).
fn print_mono_ops(case: &str, ops: &[m3_gpu::standard::OpTime], layers: usize) {
    let sum = |f: fn(&m3_gpu::standard::OpTime) -> f64| ops.iter().map(f).sum::<f64>();
    println!(
        "mono ops {case}: {} ops x {layers} layers; critical path {:.1} us, work {:.1} us, straggle {:.1} us, barriers {:.1} us, wake {:.1} us, run {:.1} us (sums over those layers)",
        ops.len(),
        sum(|o| o.crit_us),
        sum(|o| o.work_us),
        sum(|o| o.straggle_us),
        sum(|o| o.barrier_us),
        sum(|o| o.wake_us),
        sum(|o| o.run_us)
    );
    // wake / run: the last CTA to finish, from the op before's end to its
    // body passing its wait, and from there to its finish; wake avg: the
    // first interval over every CTA that ran a body
    println!(
        "  {:>3}  {:>18} {:>24} {:>16} {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8}",
        "op",
        "label",
        "body",
        "grid",
        "block",
        "rounds",
        "crit us",
        "work us",
        "straggle",
        "barrier",
        "wake",
        "run",
        "wake avg"
    );
    for (i, o) in ops.iter().enumerate() {
        // ("+": the next op runs in this one's phase, no barrier between)
        println!(
            "  {i:>3}{} {:>18} {:>24} {:>16} {:>5} {:>6} {:9.1} {:9.1} {:9.1} {:9.1} {:8.1} {:8.1} {:8.1}",
            if o.shares_phase { "+" } else { " " },
            o.label,
            o.body,
            format!("{}x{}x{}", o.grid.0, o.grid.1, o.grid.2),
            o.block,
            o.rounds,
            o.crit_us,
            o.work_us,
            o.straggle_us,
            o.barrier_us,
            o.wake_us,
            o.run_us,
            o.wake_mean_us
        );
    }
}

/// (median, p10, p90) of `v`.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    let q = |p: f64| s[((s.len() - 1) as f64 * p).round() as usize];
    (q(0.5), q(0.1), q(0.9))
}

/// UTC date `YYYY-MM-DD` (civil-from-days).
fn today() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let z = secs.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{d:02}")
}

/// One timed case: `batch` sequences, each with `rows` rows (1 = decode,
/// K + 1 = a verify step) at positions `ctx..ctx + rows`, pages taken from
/// `first_page` on.
struct Case {
    label: String,
    batch: usize,
    context: usize,
    step: StepBatch,
}

fn case_step(
    batch: usize,
    rows: usize,
    ctx: usize,
    page: usize,
    first_page: usize,
    vocab: usize,
) -> (StepBatch, usize) {
    let pps = (ctx + rows).div_ceil(page);
    let s = m3_gpu::standard::bench::timing_step(&vec![rows; batch], ctx, page, vocab, |b| {
        (0..pps)
            .map(|i| (first_page + b * pps + i) as u32)
            .collect()
    });
    (s, batch * pps)
}

/// The in-run bandwidth ceiling (PERF.md step 2).
struct Ceiling {
    copy_gbs: f64,
    read_gbs: f64,
    /// The larger of the two.
    quoted: f64,
    tc: m3_gpu::Timing,
    tr: m3_gpu::Timing,
}

fn measure_ceiling(gpu: &dyn Gpu, read_mib: usize) -> Result<Ceiling> {
    let read_bytes = read_mib
        .checked_mul(1 << 20)
        .filter(|_| read_mib >= 2)
        .ok_or_else(|| {
            anyhow!("--ceiling-mib {read_mib}: at least 2, and a size this machine can address")
        })?;
    let copy_bytes = read_bytes / 2;
    let tc = probe_copy(gpu, copy_bytes, 20).context("copy probe")?;
    let tr = probe_read(gpu, read_bytes, 20).context("read probe")?;
    let copy_gbs = 2.0 * copy_bytes as f64 / (tc.median_ms * 1e-3) / 1e9;
    let read_gbs = read_bytes as f64 / (tr.median_ms * 1e-3) / 1e9;
    let quoted = copy_gbs.max(read_gbs);
    println!(
        "ceiling: copy {copy_gbs:.0} GB/s (read+write of {} MiB), stream read {read_gbs:.0} GB/s ({read_mib} MiB) -> {quoted:.0} GB/s",
        copy_bytes as f64 / (1 << 20) as f64
    );
    Ok(Ceiling {
        copy_gbs,
        read_gbs,
        quoted,
        tc,
        tr,
    })
}

fn list<T: std::str::FromStr>(what: &str, s: &str) -> Result<Vec<T>>
where
    T::Err: std::fmt::Display,
{
    s.split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| v.parse::<T>().map_err(|e| anyhow!("{what} `{v}`: {e}")))
        .collect()
}

/// `m3 bench --backend gpu --kernels`: the linear-kernel microbench
/// (`m3_gpu::standard::kernel_bench`) at `cfg`'s shapes.
fn run_kernels(args: &Args, cfg: &ModelConfig) -> Result<()> {
    use m3_gpu::model::WFmt;
    use m3_gpu::standard::kernel_bench::{kernel_bench, KernelBenchSpec, KernelRow};
    let formats = args
        .kernel_formats
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|f| {
            Ok(match f {
                "bf16" => WFmt::Bf16,
                "mxfp8" | "mxfp8-e4m3" => WFmt::Mxfp8E4M3,
                "mxfp8-e5m2" => WFmt::Mxfp8E5M2,
                "mxfp4" => WFmt::Mxfp4,
                "nvfp4" => WFmt::Nvfp4,
                o => bail!(
                    "--kernel-formats `{o}` is not one of bf16, mxfp8, mxfp8-e5m2, mxfp4, nvfp4"
                ),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (stack, n) = match args.kernel_stack.trim() {
        "" => (8, cfg.hidden_size),
        s => {
            let (c, r) = s.split_once('x').ok_or_else(|| {
                anyhow!("--kernel-stack `{s}`: expected COUNTxROWS, e.g. 1x49152")
            })?;
            let parse = |v: &str| {
                v.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| anyhow!("--kernel-stack `{s}`: `{v}` is not a positive count"))
            };
            (parse(c)?, parse(r)?)
        }
    };
    let spec = KernelBenchSpec {
        formats,
        rows: list("--kernel-rows", &args.kernel_rows)?,
        n,
        k: cfg.hidden_size,
        stack,
        experts: cfg.num_local_experts,
        expert_n: match args.kernel_expert_n {
            0 => cfg.intermediate_size,
            n => n,
        },
        top_k: match args.kernel_top_k {
            0 => cfg.num_experts_per_tok,
            k => k,
        },
        distinct: list("--kernel-experts", &args.kernel_experts)?,
        l2: args.kernel_l2,
        iters: args.iters,
        reps: args.kernel_reps,
        variants: args
            .variants
            .split(';')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from)
            .collect(),
    };
    let smi_before = nvidia_smi();
    println!("clocks before: {smi_before}");
    let dev = open_gpu()?;
    let gpu = dev.gpu();
    let (line, device_json) = describe(gpu);
    println!("{line}");
    let c = measure_ceiling(gpu, args.ceiling_mib)?;
    println!("| format | case | variant | median ms | p10 ms | MB | GB/s | % of ceiling | checked (worst rel err) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let show = |r: &KernelRow| {
        let (med, p10, _) = stats(&r.samples_ms);
        let gbs = r.bytes as f64 / (med * 1e-3) / 1e9;
        println!(
            "| {:?} | {} | {} | {med:.4} | {p10:.4} | {:.1} | {gbs:.0} | {:.1}% | {} ({:.1e}) |",
            r.fmt,
            r.case,
            r.variant,
            r.bytes as f64 / 1e6,
            100.0 * gbs / c.quoted,
            r.checked,
            r.worst
        );
    };
    let rows = kernel_bench(gpu, &spec, &mut |r| show(r)).context("kernel microbench")?;
    let smi_after = nvidia_smi();
    println!("clocks after: {smi_after}");
    let cases: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let (med, p10, p90) = stats(&r.samples_ms);
            let gbs = r.bytes as f64 / (med * 1e-3) / 1e9;
            json!({"format": format!("{:?}", r.fmt), "case": r.case, "rows": r.rows, "variant": r.variant,
                "bytes": r.bytes, "median_ms": med, "p10_ms": p10, "p90_ms": p90, "gb_per_s": gbs,
                "pct_of_ceiling": 100.0 * gbs / c.quoted, "checked": r.checked, "worst_rel_err": r.worst,
                "samples_ms": r.samples_ms})
        })
        .collect();
    let doc = json!({
        "what": "m3 bench --backend gpu --kernels: tensor-core linear microbench",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "device": device_json,
        "clocks_before": smi_before, "clocks_after": smi_after,
        "ceiling": {"copy_gb_per_s": c.copy_gbs, "read_gb_per_s": c.read_gbs, "quoted_gb_per_s": c.quoted},
        "reps": spec.reps,
        "shapes": {"n": spec.n, "k": spec.k, "stack": spec.stack, "experts": spec.experts,
                    "expert_n": spec.expert_n, "top_k": spec.top_k},
        "cases": cases,
    });
    write_json(
        args.out.clone().unwrap_or_else(|| {
            std::path::PathBuf::from(format!("bench/results/{}-gpu-kernels.json", today()))
        }),
        &doc,
    )
}

/// Write `doc` to `out` through a temp file and a rename.
fn write_json(out: std::path::PathBuf, doc: &serde_json::Value) -> Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = out.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(doc)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &out).with_context(|| format!("renaming to {}", out.display()))?;
    println!("\nwrote {}", out.display());
    Ok(())
}

/// PERF.md's per-layer figure from two depths of the same model timed in
/// one run: per case, the difference in bytes over the difference in time
/// (the added layers' own streaming rate, the LM head and the fixed costs
/// cancelling), the time a layer adds, and the full-depth step projected by
/// adding the missing layers at that rate.
fn print_per_layer(
    a: &ModelRun,
    b: &ModelRun,
    full: &ModelConfig,
    ceiling: f64,
) -> serde_json::Value {
    let (la, lb) = (a.layers, b.layers);
    let nfull = full.num_hidden_layers;
    println!(
        "\nper layer: --layers {la} minus --layers {lb} ({} layers; both past the {} dense layers: {}), full depth {nfull}",
        la.abs_diff(lb),
        full.first_k_dense(),
        if la.min(lb) > full.first_k_dense() { "yes, the difference is MoE layers" } else { "NO: the difference includes dense layers" }
    );
    println!("| case | step ms ({la} / {lb}) | ms per layer | MB per layer | layer GB/s | layer % of ceiling | whole-step % of ceiling | projected {nfull}-layer step ms |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (label, v, ta, ba) in &a.medians {
        let Some((_, _, tb, bb)) = b.medians.iter().find(|(l, vb, _, _)| l == label && vb == v)
        else {
            continue;
        };
        let dl = la as f64 - lb as f64;
        if dl == 0.0 {
            continue;
        }
        let (dt, db) = ((ta - tb) / dl, (ba - bb) / dl);
        let gbs = db / (dt * 1e-3) / 1e9;
        let whole = ba / (ta * 1e-3) / 1e9;
        let projected = ta + (nfull as f64 - la as f64) * dt;
        println!(
            "| {label} | {ta:.3} / {tb:.3} | {dt:.4} | {:.1} | {gbs:.0} | {:.1}% | {:.1}% | {projected:.2} |",
            db / 1e6,
            100.0 * gbs / ceiling,
            100.0 * whole / ceiling
        );
        rows.push(json!({"case": label, "variant": v, "layers": [la, lb], "step_ms": [ta, tb],
            "ms_per_layer": dt, "bytes_per_layer": db, "layer_gb_per_s": gbs,
            "layer_pct_of_ceiling": 100.0 * gbs / ceiling, "whole_step_pct_of_ceiling": 100.0 * whole / ceiling,
            "projected_full_depth_ms": projected, "full_depth_layers": nfull}));
    }
    json!(rows)
}

/// One bench model's timed cases.
struct ModelRun {
    layers: usize,
    /// The KV / index cache dtype of the run.
    cache: CacheDtype,
    gen_s: f64,
    capture_s: f64,
    out_cases: Vec<serde_json::Value>,
    profiles: Vec<serde_json::Value>,
    /// (case label, variant index, median ms, bytes per step).
    medians: Vec<(String, usize, f64, f64)>,
    /// `--path both`: the mono parity gate's rows (JSON).
    parity: Vec<serde_json::Value>,
}

/// The bench model's shared experts for `--shared-expert`.
fn shared_gen(a: super::SharedArg) -> SharedGen {
    match a {
        super::SharedArg::Dense => SharedGen::Dense,
        super::SharedArg::Expert => SharedGen::ExpertFormat,
        super::SharedArg::Folded => SharedGen::Folded,
    }
}

/// Generate the bench model of `cfg` on the device, capture every case
/// (and variant), time them in interleaved rounds and print the table.
fn bench_model(
    args: &Args,
    gpu: &dyn Gpu,
    cfg: &ModelConfig,
    kind: BenchWeights,
    batches: &[usize],
    ceiling: f64,
    cache: CacheDtype,
) -> Result<ModelRun> {
    // 3. model, cache, graphs
    let t0 = Instant::now();
    let model = benchmodel::generate(
        gpu,
        cfg,
        kind,
        0x5eed,
        shared_gen(args.shared_expert),
        args.online_quant.is_some(),
    )
    .context("generating the bench model")?;
    let gen_s = t0.elapsed().as_secs_f64();
    let page = cfg.index_block_size.max(1);
    // cases: every batch at --context, then the long-context and verify
    // cases; each sequence gets its own pages
    let mut cases: Vec<Case> = Vec::new();
    let mut pages = 0usize;
    let mut add = |label: String, batch: usize, rows: usize, ctx: usize| {
        let (step, used) = case_step(batch, rows, ctx, page, pages, cfg.vocab_size);
        pages += used;
        cases.push(Case {
            label,
            batch,
            context: ctx,
            step,
        });
    };
    for &b in batches {
        add(
            format!("decode b{b} ctx{}", args.context),
            b,
            1,
            args.context,
        );
    }
    if args.long_context > 0 {
        add(
            format!("decode b1 ctx{}", args.long_context),
            1,
            1,
            args.long_context,
        );
    }
    if args.verify_k > 0 {
        add(
            format!("verify K={} ctx{}", args.verify_k, args.context),
            1,
            args.verify_k + 1,
            args.context,
        );
    }
    let max_rows = cases.iter().map(|c| c.step.rows()).max().unwrap_or(1);
    let max_context = cases
        .iter()
        .map(|c| c.context + c.step.rows() / c.batch.max(1))
        .max()
        .unwrap_or(1);
    let max_seqs = cases.iter().map(|c| c.step.seqs.len()).max().unwrap_or(1);
    let mut sp = StandardPath::new(
        gpu,
        model,
        Capacity {
            max_rows,
            max_seqs,
            page_size: page,
            max_context,
            cache_dtype: cache,
            act: ActMode::Bf16,
        },
        KvBudget::Blocks(pages),
        PathOptions {
            mono: args.path != BenchPath::Standard,
            ..PathOptions::default().with_env_overrides()
        },
    )
    .context("standard path")?;
    sp.fill_cache(gpu, 0xcafe).context("filling the cache")?;
    let (skipped, no_pdl) = (sp.options().skip_launches, sp.options().no_pdl_launches);
    if !skipped.is_empty() {
        println!(
            "ABLATION (M3_SKIP_LAUNCHES={skipped}): those launches are left out; the times are a diagnosis, the outputs wrong"
        );
    }
    if !no_pdl.is_empty() {
        println!("diagnosis (M3_NO_PDL_LAUNCHES={no_pdl}): those launches go without PDL");
    }
    let twice = sp.options().twice_launches;
    if !twice.is_empty() {
        println!(
            "DIAGNOSIS (M3_TWICE_LAUNCHES={twice}): those launches are made twice in a row; the times are a diagnosis, the outputs may be wrong"
        );
    }
    println!(
        "bench model {} --layers {} ({:?}) generated in {gen_s:.2} s; {} cache {pages} pages of {page}",
        args.preset,
        cfg.num_hidden_layers,
        kind,
        cache.name(),
    );
    // kernel variants (tensor-core linear tunables), each run on every case
    // variant None: chosen by the step's rows (the defaults)
    // (and the mono path, `--path`: a run of its own label)
    let mut vlabels = vec![if args.path == BenchPath::Mono {
        "mono"
    } else {
        "auto"
    }
    .to_string()];
    let mut vids: Vec<Option<usize>> = vec![None];
    let mut vmono = vec![args.path == BenchPath::Mono];
    if args.path == BenchPath::Both {
        vlabels.push("mono".into());
        vids.push(None);
        vmono.push(true);
    }
    if let Some(m) = sp.mono_about() {
        println!("mono path: {m}");
    }
    for v in args
        .variants
        .split(';')
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        let id = sp
            .add_variant(gpu, v)
            .with_context(|| format!("--variants: compiling `{v}`"))?;
        vlabels.push(v.to_string());
        vids.push(Some(id));
        vmono.push(false);
    }
    let runs: Vec<(usize, usize)> = (0..vlabels.len())
        .flat_map(|v| (0..cases.len()).map(move |c| (v, c)))
        .collect();
    let run_label = |v: usize, c: &Case| {
        if vlabels.len() > 1 {
            format!("[{}] {}", vlabels[v], c.label)
        } else {
            c.label.clone()
        }
    };
    let t0 = Instant::now();
    let mut profiles = Vec::new();
    for &(v, ci) in &runs {
        sp.set_variant(vids[v]).context("variant")?;
        sp.set_mono(vmono[v]).context("path")?;
        let c = &cases[ci];
        let s = &c.step;
        let greedy = vec![SampleParams::GREEDY; s.logits_rows.len()];
        let shape = sp.prepare(s, &greedy).context("upload")?;
        // one direct step first: every kernel loaded before the capture
        sp.launch(shape, false).context("direct step")?;
        sp.launcher().sync().context("direct step sync")?;
        if args.profile {
            let prof = sp.profile(shape).context("profile")?;
            print_profile(&run_label(v, c), &prof);
            if vmono[v] {
                let (ops, layers) = sp.mono_op_profile(shape).context("mono op profile")?;
                print_mono_ops(&run_label(v, c), &ops, layers);
            }
            profiles.push(json!({"case": run_label(v, c), "launches": prof
                .iter()
                .map(|(l, ms)| json!([l, ms]))
                .collect::<Vec<_>>()}));
        }
        sp.launch(shape, true).context("capture")?;
        for _ in 0..args.warmup {
            sp.launch(shape, true).context("warm-up")?;
        }
        sp.launcher().sync().context("warm-up sync")?;
    }
    let capture_s = t0.elapsed().as_secs_f64();
    println!(
        "{} graphs captured + {} warm-up replays each in {capture_s:.2} s",
        sp.graph_count(),
        args.warmup
    );
    // 4. (`--path both`) the mono path against the standard one on this
    // model: greedy chains, bit for bit, before anything is timed
    let parity = if args.path == BenchPath::Both && args.parity_steps > 0 {
        let t = Instant::now();
        let rows = mono_parity(&mut sp, &cases, args.parity_steps)?;
        print_parity(&rows, args.parity_steps, t.elapsed().as_secs_f64());
        if let Some(r) = rows.iter().find(|r| !r.same()) {
            bail!(
                "mono path parity: `{}` differs from the standard path ({}); nothing timed",
                r.label,
                r.describe()
            );
        }
        rows.iter().map(ParityRow::to_json).collect()
    } else {
        Vec::new()
    };

    // 5-6. interleaved timed rounds
    let n = runs.len();
    let mut samples: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n];
    let mut bytes: Vec<Vec<u64>> = vec![Vec::new(); n];
    for _round in 0..args.rounds {
        for (i, &(vi, ci)) in runs.iter().enumerate() {
            sp.set_variant(vids[vi]).context("variant")?;
            sp.set_mono(vmono[vi]).context("path")?;
            let c = &cases[ci];
            let s = &c.step;
            let greedy = vec![SampleParams::GREEDY; s.logits_rows.len()];
            let shape = sp.prepare(s, &greedy).context("upload")?;
            let v = sp.time_replays(shape, args.iters).context("timing")?;
            let ex = sp.experts_chosen(s.rows()).context("experts")?;
            let bl = sp.blocks_selected(s.rows()).context("blocks")?;
            bytes[i].push(benchmodel::step_bytes(
                &sp.model,
                &s.positions,
                &s.row_seq,
                s.logits_rows.len(),
                &ex,
                &bl,
                cache,
            ));
            // printed as it goes: a run cut short still leaves its numbers
            let (med, p10, p90) = stats(&v);
            let by = *bytes[i].last().unwrap_or(&0) as f64;
            println!(
                "round {_round} {}: median {med:.3} ms (p10 {p10:.3}, p90 {p90:.3}), {:.1} MB/step, {:.1}% of ceiling",
                run_label(vi, c),
                by / 1e6,
                100.0 * by / (med * 1e-3) / 1e9 / ceiling
            );
            samples[i].push(v);
        }
    }

    println!(
        "\nstandard path, {} --layers {}, weights {:?}{}, {} KV/index cache, {} rounds x {} replays",
        args.preset,
        cfg.num_hidden_layers,
        kind,
        if args.online_quant.is_some() {
            " (attention + dense MLP: PTPC FP8)"
        } else {
            ""
        },
        cache.name(),
        args.rounds,
        args.iters
    );
    println!("| case | median ms | p10 ms | p90 ms | MB/step | GB/s | % of ceiling | tok/s | time / batch-1 time (per round) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut out_cases = Vec::new();
    let mut medians = Vec::new();
    for (i, &(vi, ci)) in runs.iter().enumerate() {
        let c = &cases[ci];
        let b = c.batch;
        let all: Vec<f64> = samples[i].iter().flatten().copied().collect();
        let (med, p10, p90) = stats(&all);
        let mut bs = bytes[i].clone();
        bs.sort_unstable();
        let by = bs[bs.len() / 2] as f64;
        let gbs = by / (med * 1e-3) / 1e9;
        let ratios: Vec<f64> = (0..args.rounds)
            .map(|r| stats(&samples[i][r]).0 / stats(&samples[0][r]).0.max(1e-12))
            .collect();
        println!(
            "| {} | {med:.3} | {p10:.3} | {p90:.3} | {:.1} | {gbs:.0} | {:.1}% | {:.0} | {} |",
            run_label(vi, c),
            by / 1e6,
            100.0 * gbs / ceiling,
            b as f64 / (med * 1e-3),
            ratios
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect::<Vec<_>>()
                .join(" / ")
        );
        // the run's label ([variant] or [mono] before the case when several)
        medians.push((run_label(vi, c), vi, med, by));
        out_cases.push(json!({
            "case": c.label,
            "kv_cache": cache.name(),
            "variant": vlabels[vi],
            "batch": b,
            "rows": c.step.rows(),
            "context": c.context,
            "median_ms": med, "p10_ms": p10, "p90_ms": p90,
            "bytes_per_step": bs,
            "gb_per_s": gbs,
            "pct_of_ceiling": 100.0 * gbs / ceiling,
            "ratio_to_first_case_per_round": ratios,
            "samples_ms_per_round": samples[i],
        }));
    }
    if args.path == BenchPath::Both {
        let k = cases.len();
        print_mono_vs_standard(&cases, &samples[..k], &samples[k..2 * k]);
    }
    Ok(ModelRun {
        layers: cfg.num_hidden_layers,
        cache,
        gen_s,
        capture_s,
        out_cases,
        profiles,
        medians,
        parity,
    })
}

/// One chain of the mono parity gate against the reference chain: every
/// step's greedy tokens and logits (the logits as a digest of their bits),
/// and the first and last steps' logits value by value, compared bit for
/// bit.
struct ParityRow {
    label: String,
    rows: usize,
    /// The first step (0-based) whose tokens differ, if one does.
    first_token_diff: Option<usize>,
    /// The first step whose logits differ in any bit (their digests), if
    /// one does.
    first_logits_diff: Option<usize>,
    /// Logits of the chain's last step that differ in their bits, and
    /// the largest absolute difference among them.
    logits_diff: usize,
    max_abs: f32,
    /// Logits rows with a differing logit.
    rows_diff: usize,
    /// Logits of the first step (the same inputs on both sides) that
    /// differ in their bits.
    first_step_logits_diff: usize,
}

impl ParityRow {
    /// Compare the reference chain `a` with chain `b`.
    fn compare(label: &str, rows: usize, a: &Chain, b: &Chain) -> Self {
        let first_token_diff = a.tokens.iter().zip(&b.tokens).position(|(x, y)| x != y);
        let first_logits_diff = a.digests.iter().zip(&b.digests).position(|(x, y)| x != y);
        let mut logits_diff = 0;
        let mut max_abs = 0f32;
        // the last step's logits rows (vocab values each)
        let nl = a.tokens.last().map_or(1, Vec::len).max(1);
        let vocab = (a.last.len() / nl).max(1);
        let mut rows_hit = vec![false; nl];
        for (i, (x, y)) in a.last.iter().zip(&b.last).enumerate() {
            if x.to_bits() != y.to_bits() {
                logits_diff += 1;
                max_abs = max_abs.max((x - y).abs());
                if let Some(h) = rows_hit.get_mut(i / vocab) {
                    *h = true;
                }
            }
        }
        let first_step_logits_diff = a
            .first
            .iter()
            .zip(&b.first)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        ParityRow {
            label: label.to_string(),
            rows,
            first_token_diff,
            first_logits_diff,
            logits_diff,
            max_abs,
            rows_diff: rows_hit.iter().filter(|&&h| h).count(),
            first_step_logits_diff,
        }
    }
    fn same(&self) -> bool {
        self.first_token_diff.is_none()
            && self.first_logits_diff.is_none()
            && self.logits_diff == 0
            && self.first_step_logits_diff == 0
    }
    fn describe(&self) -> String {
        if self.same() {
            return "identical tokens, bitwise logits".into();
        }
        format!(
            "tokens {}; logits {}; {} logits of the last step differ, in {} of its rows (max |diff| {:.3e}); {} of the first step's",
            self.first_token_diff
                .map_or("identical".into(), |k| format!("differ from step {k}")),
            self.first_logits_diff
                .map_or("bitwise at every step".into(), |k| format!("differ from step {k}")),
            self.logits_diff,
            self.rows_diff,
            self.max_abs,
            self.first_step_logits_diff
        )
    }
    fn to_json(&self) -> serde_json::Value {
        json!({"case": self.label, "rows": self.rows,
            "first_token_diff": self.first_token_diff,
            "first_logits_diff": self.first_logits_diff,
            "logits_diff": self.logits_diff, "rows_diff": self.rows_diff,
            "first_step_logits_diff": self.first_step_logits_diff,
            "max_abs_diff": self.max_abs})
    }
}

/// The mono parity gate (`--path both`): for every case the mono path
/// runs, a chain of `steps` greedy steps on each of four forms (`CHAINS`:
/// the standard path's captured graphs, the reference; its direct
/// launches; the mono path's graphs, which the bench times; its direct
/// launches), each from the case's own tokens, each row's sampled token
/// fed back as its next input (rows keep their positions: each step
/// rewrites the same cache slots, so a step's inputs are its tokens and the
/// generated context). Mono runs the standard path's kernels and must give
/// its bits; each chain must also have run on the path it names.
fn mono_parity(sp: &mut StandardPath, cases: &[Case], steps: usize) -> Result<Vec<ParityRow>> {
    // (name, mono, graph): the first is the reference, the third what the
    // bench times on mono; the direct-launch chains tell a capture's fault
    // from a path's
    const CHAINS: [(&str, bool, bool); 4] = [
        ("standard", false, true),
        ("standard, direct launches", false, false),
        ("mono", true, true),
        ("mono, direct launches", true, false),
    ];
    let mut out = Vec::new();
    for c in cases {
        let rows = c.step.rows();
        if rows > sp.mono_max_rows() {
            continue;
        }
        let nl = c.step.logits_rows.len();
        let greedy = vec![SampleParams::GREEDY; nl];
        let all: Vec<u32> = (0..nl as u32).collect();
        let mut chains = Vec::new();
        for (name, mono, graph) in CHAINS {
            sp.set_variant(None).context("variant")?;
            sp.set_mono(mono).context("path")?;
            let mono_before = sp.mono_steps();
            let mut s = c.step.clone();
            let mut chain = Chain::default();
            for k in 0..steps {
                let shape = sp.prepare(&s, &greedy).context("parity: upload")?;
                sp.launch(shape, graph).context("parity: step")?;
                let t = sp.read_tokens(nl).context("parity: tokens")?;
                let logits = sp.read_logits(&all).context("parity: logits")?;
                for (i, &r) in c.step.logits_rows.iter().enumerate() {
                    s.tokens[r as usize] = t[i];
                }
                chain.push(t, logits, k == 0);
            }
            // the chain ran where it says (not a standard chain twice)
            let on_mono = (sp.mono_steps() - mono_before) as usize;
            if on_mono != if mono { steps } else { 0 } {
                bail!(
                    "mono parity: `{}` {name}: {on_mono} of {steps} steps ran on the mono path",
                    c.label
                );
            }
            chains.push(chain);
        }
        for (k, (name, _, _)) in CHAINS.iter().enumerate().skip(1) {
            let label = format!("{} {name}", c.label);
            out.push(ParityRow::compare(&label, rows, &chains[0], &chains[k]));
        }
    }
    Ok(out)
}

/// One greedy chain: each step's sampled tokens and a digest of its
/// logits' bits, and the logits of its first step (the same inputs on
/// every chain: a difference there is the path's, not a diverged token's)
/// and of its last.
#[derive(Clone, Default)]
struct Chain {
    tokens: Vec<Vec<u32>>,
    digests: Vec<u64>,
    first: Vec<f32>,
    last: Vec<f32>,
}

impl Chain {
    /// Add a step: its tokens and logits (kept whole if `first`, and as
    /// the last step's until the next).
    fn push(&mut self, tokens: Vec<u32>, logits: Vec<f32>, first: bool) {
        self.tokens.push(tokens);
        self.digests.push(logits_digest(&logits));
        if first {
            self.first = logits.clone();
        }
        self.last = logits;
    }
}

/// A digest of logits' bits (the standard library's fixed-key SipHash:
/// the same in every process of a build; compared within one run only).
fn logits_digest(v: &[f32]) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write(bytemuck::cast_slice(v));
    h.finish()
}

fn print_parity(rows: &[ParityRow], steps: usize, secs: f64) {
    println!(
        "mono parity: {steps} greedy steps a chain, tokens fed back; each chain against the standard path's graphs: every step's tokens and logits bit for bit ({secs:.1} s)"
    );
    for r in rows {
        println!("  {} ({} rows): {}", r.label, r.rows, r.describe());
    }
    if rows.is_empty() {
        println!("  (no case runs on the mono path)");
    }
}

/// `--path both`: each case's standard and mono medians from the same
/// rounds, the ratio per round, and the crossover the runner's `--path
/// auto` rule gives over the cases at the first case's context (the
/// largest rows up to which mono is faster at every case).
fn print_mono_vs_standard(cases: &[Case], std: &[Vec<Vec<f64>>], mono: &[Vec<Vec<f64>>]) {
    println!("\nmono against standard (same rounds; ratio = standard / mono, > 1: mono faster):");
    println!("| case | rows | standard ms | mono ms | ratio per round |");
    println!("|---|---|---|---|---|");
    let mut times = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let med = |v: &[Vec<f64>]| stats(&v.iter().flatten().copied().collect::<Vec<_>>()).0;
        let (s, m) = (med(&std[i]), med(&mono[i]));
        let per: Vec<String> = std[i]
            .iter()
            .zip(&mono[i])
            .map(|(a, b)| format!("{:.2}", stats(a).0 / stats(b).0.max(1e-12)))
            .collect();
        println!(
            "| {} | {} | {s:.3} | {m:.3} | {} |",
            c.label,
            c.step.rows(),
            per.join(" / ")
        );
        // (past MONO_MAX_ROWS both runs are the standard path's)
        if c.context == cases[0].context && c.step.rows() <= m3_gpu::standard::MONO_MAX_ROWS {
            times.push((c.step.rows(), s, m));
        }
    }
    times.sort_by_key(|t| t.0);
    times.dedup_by_key(|t| t.0);
    let x = m3_gpu::standard::MonoCrossover::from_times(times);
    println!(
        "crossover at context {} (the --path auto rule): {}",
        cases.first().map_or(0, |c| c.context),
        x.summary()
    );
}

/// Each later cache dtype's medians against the first's, case by case
/// (same model, same device, same call): the time and bytes a step costs
/// with that cache.
fn print_cache_comparison(first: &ModelRun, more: &[ModelRun]) {
    println!(
        "\nKV cache dtypes against {} (same model and cases, one call):",
        first.cache.name()
    );
    println!(
        "| case | cache | median ms | vs {0} ms | time ratio | MB/step | vs {0} MB/step |",
        first.cache.name()
    );
    println!("|---|---|---|---|---|---|---|");
    for r in more {
        for (label, vi, med, by) in &r.medians {
            let base = first
                .medians
                .iter()
                .find(|(l, v, _, _)| l == label && v == vi);
            let (bm, bb) = base.map_or((f64::NAN, f64::NAN), |b| (b.2, b.3));
            println!(
                "| {label} | {} | {med:.3} | {bm:.3} | {:.3} | {:.1} | {:.1} |",
                r.cache.name(),
                med / bm,
                by / 1e6,
                bb / 1e6
            );
        }
    }
}

pub fn run(args: &Args) -> Result<()> {
    let kind = match args.weights.as_str() {
        "mxfp4" | "mx" => BenchWeights::Mx,
        "nvfp4" => BenchWeights::Nvfp4,
        "bf16" => BenchWeights::Bf16,
        o => bail!("--weights `{o}` is not one of mxfp4, nvfp4, bf16"),
    };
    let batches: Vec<usize> = args
        .batch
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| anyhow!("--batch `{}`: {e}", args.batch))?;
    if batches.is_empty() || batches.contains(&0) {
        bail!("--batch needs positive sizes");
    }
    if args.iters == 0 || args.rounds == 0 {
        bail!("--iters and --rounds must be at least 1");
    }
    let base = ModelConfig::preset(&args.preset).map_err(|e| anyhow!("--preset: {e}"))?;
    let mut cfg = base.clone();
    if let Some(l) = args.layers {
        cfg = cfg.with_layers(l).map_err(|e| anyhow!("--layers: {e}"))?;
    }
    if args.kernels {
        return run_kernels(args, &cfg);
    }
    let smi_before = nvidia_smi();
    println!("clocks before: {smi_before}");
    let dev = open_gpu()?;
    let gpu = dev.gpu();
    let (line, device_json) = describe(gpu);
    println!("{line}");

    // 2. ceiling
    let Ceiling {
        copy_gbs,
        read_gbs,
        quoted: ceiling,
        tc,
        tr,
    } = measure_ceiling(gpu, args.ceiling_mib)?;

    // one whole bench per cache dtype (`--kv-cache-dtype fp8_e4m3,nvfp4`),
    // in the order given, on the same device in the same call
    let caches: Vec<CacheDtype> = args.kv_dtype.iter().map(|&k| k.into()).collect();
    let Some(&first_cache) = caches.first() else {
        bail!("--kv-cache-dtype needs at least one dtype");
    };
    let mut runs = vec![bench_model(
        args,
        gpu,
        &cfg,
        kind,
        &batches,
        ceiling,
        first_cache,
    )?];
    let mut per_layer = serde_json::Value::Null;
    if let Some(l2) = args.per_layer {
        let cfg2 = base
            .clone()
            .with_layers(l2)
            .map_err(|e| anyhow!("--per-layer: {e}"))?;
        runs.push(bench_model(
            args,
            gpu,
            &cfg2,
            kind,
            &batches,
            ceiling,
            first_cache,
        )?);
        per_layer = print_per_layer(&runs[0], &runs[1], &base, ceiling);
    }
    let mut more_caches = Vec::new();
    for &c in &caches[1..] {
        more_caches.push(bench_model(args, gpu, &cfg, kind, &batches, ceiling, c)?);
    }
    if !more_caches.is_empty() {
        print_cache_comparison(&runs[0], &more_caches);
    }
    let smi_after = nvidia_smi();
    println!("clocks after: {smi_after}");
    let ModelRun {
        gen_s,
        capture_s,
        mut out_cases,
        mut profiles,
        parity,
        cache: _,
        ..
    } = runs.swap_remove(0);
    for r in &more_caches {
        out_cases.extend(r.out_cases.iter().cloned());
        profiles.extend(r.profiles.iter().cloned());
    }
    let doc = json!({
        "what": "m3 bench --backend gpu: graph-captured standard path, pure decode",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "device": device_json,
        "clocks_before": smi_before, "clocks_after": smi_after,
        "ceiling": {"copy_gb_per_s": copy_gbs, "read_gb_per_s": read_gbs, "quoted_gb_per_s": ceiling,
                     "copy_samples_ms": [tc.median_ms, tc.p10_ms, tc.p90_ms],
                     "read_samples_ms": [tr.median_ms, tr.p10_ms, tr.p90_ms]},
        "model": {"preset": args.preset, "layers": cfg.num_hidden_layers, "weights": format!("{kind:?}"),
                   "online_quant": args.online_quant.is_some().then_some("ptpc_fp8"),
                   "seed": "0x5eed", "context": args.context,
                   "cache": format!("{}, generated codes (no prefill)",
                       caches.iter().map(|c| c.name()).collect::<Vec<_>>().join(" then "))},
        "protocol": {"warmup": args.warmup, "iters": args.iters, "rounds": args.rounds,
                      "generate_s": gen_s, "capture_and_warmup_s": capture_s},
        "cases": out_cases,
        "mono_parity": {"steps": args.parity_steps, "cases": parity},
        "profiles": profiles,
        "per_layer": per_layer,
        "second_model": runs.first().map(|r| json!({"layers": r.layers, "generate_s": r.gen_s,
            "capture_and_warmup_s": r.capture_s, "cases": r.out_cases})),
    });
    write_json(
        args.out.clone().unwrap_or_else(|| {
            std::path::PathBuf::from(format!("bench/results/{}-gpu-standard.json", today()))
        }),
        &doc,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parity gate's comparison: equal chains pass; one token, one
    /// logit's last bit (first or last step), or a -0.0 against 0.0 each
    /// fail it.
    #[test]
    fn parity_catches_a_token_or_a_bit() {
        // two logits rows of two values
        let mut a = Chain::default();
        a.push(vec![5, 6], vec![0.5, 1.5, -1.0, 2.0], true);
        a.push(vec![7, 8], vec![1.0, -2.5, 0.0, 3.0], false);
        assert!(ParityRow::compare("c", 2, &a, &a.clone()).same());
        // a middle step's logits (tokens and the first and last logits
        // equal) differ in one bit
        let mid = |x: f32| {
            let mut c = Chain::default();
            c.push(vec![5, 6], vec![0.5, 1.5, -1.0, 2.0], true);
            c.push(vec![1, 1], vec![x, 0.0, 0.0, 0.0], false);
            c.push(vec![7, 8], vec![1.0, -2.5, 0.0, 3.0], false);
            c
        };
        let (m0, m1) = (mid(1.0), mid(f32::from_bits(1.0f32.to_bits() + 1)));
        let r = ParityRow::compare("c", 2, &m0, &m1);
        assert_eq!(
            (
                r.first_token_diff,
                r.first_logits_diff,
                r.logits_diff,
                r.first_step_logits_diff
            ),
            (None, Some(1), 0, 0)
        );
        assert!(!r.same() && r.describe().contains("logits differ from step 1"));
        let mut tok = a.clone();
        tok.tokens[1][0] = 9;
        let r = ParityRow::compare("c", 2, &a, &tok);
        assert_eq!(r.first_token_diff, Some(1));
        assert!(!r.same());
        let mut ulp = a.clone();
        ulp.last[1] = f32::from_bits(ulp.last[1].to_bits() + 1);
        let r = ParityRow::compare("c", 2, &a, &ulp);
        assert_eq!(
            (r.first_token_diff, r.logits_diff, r.rows_diff),
            (None, 1, 1)
        );
        assert!(r.max_abs > 0.0 && !r.same());
        let mut zero = a.clone();
        zero.last[2] = -0.0;
        assert!(!ParityRow::compare("c", 2, &a, &zero).same());
        assert!(r.describe().contains("1 logits"));
        let mut both = ulp.clone();
        both.last[3] = 4.0;
        assert_eq!(ParityRow::compare("c", 2, &a, &both).rows_diff, 2);
        let mut early = a.clone();
        early.first[0] = f32::from_bits(early.first[0].to_bits() ^ 1);
        let r = ParityRow::compare("c", 2, &a, &early);
        assert_eq!((r.first_step_logits_diff, r.logits_diff), (1, 0));
        assert!(!r.same());
    }
}
