//! The standard path's HIP route, without ROCm or an AMD GPU (issue 16
//! item 2): a `tiny` model is loaded and a decode step of two sequences
//! is captured, replayed and read back on [`HipGpu`] over the recording
//! stub table (`runtime::hip::stub`: host memory, every call logged). The
//! checks:
//!
//! - every kernel launch the HIP runtime received matches, in order, what
//!   the path's own [`Launcher::record`] takes down for the same step (the
//!   mono path's recorder): kernel, grid, block, dynamic shared memory and
//!   the argument bytes read back through `kernelParams`;
//! - the call order: the step's launches all inside one capture on the
//!   launcher's stream, or on its side stream forked from it by an event
//!   inside the capture and joined back into it before the capture ends
//!   (the MoE layers' shared experts), ended, instantiated, then
//!   replayed; a stream sync
//!   between the replay and the read-back; no free while the stream has
//!   work pending; no copy or free outside a live allocation (the stub
//!   refuses those); and on drop every allocation, stream, graph and event
//!   released;
//! - the vendor's warp width reaches the one-warp kernels (64 on HIP).
//!
//! Planted mistakes (grid x / y swapped, one launch dropped, one argument
//! byte flipped, a buffer freed before the sync, the streams' waits on
//! each other's events dropped) each make the check fail,
//! so it can fail. What this does not prove: that a real HIP runtime and
//! gfx950 accept these calls and compute the right numbers (nothing here
//! has run on AMD hardware).

use std::collections::{HashMap, HashSet};

use m3_core::backend::{ActMode, KvBudget, StepBatch, StepSeq};
use m3_core::config::ModelConfig;
use m3_core::kv::CacheDtype;
use m3_core::sample::SampleParams;
use m3_cpu_ref::synthetic::{self, Formats, WeightFormat};

use super::exec::Shape;
use super::launch::{Launcher, Recorded};
use super::step::Extras;
use super::{Beside, Capacity, PathOptions, StandardPath};
use crate::model::{DevBuf, DevModel};
use crate::runtime::api::Gpu;
use crate::runtime::hip::stub::{self, Call, Plant};
use crate::runtime::hip::{HipGpu, HIP_MEMCPY_D2H};

const PAGE: usize = 16;

/// The standard path of a synthetic `tiny` model (bf16 weights) on `gpu`.
fn build(gpu: &HipGpu, opts: PathOptions) -> crate::Result<StandardPath> {
    build_with(gpu, opts, Formats::default())
}

/// [`build`] with the weights in `formats`.
fn build_with(gpu: &HipGpu, opts: PathOptions, formats: Formats) -> crate::Result<StandardPath> {
    build_rows(gpu, opts, formats, 8)
}

/// [`build_with`] for steps of up to `max_rows` rows.
fn build_rows(
    gpu: &HipGpu,
    opts: PathOptions,
    formats: Formats,
    max_rows: usize,
) -> crate::Result<StandardPath> {
    let c = ModelConfig::preset("tiny").expect("tiny preset");
    let w = synthetic::model(&c, formats, 7).expect("synthetic tiny");
    let model = DevModel::upload(gpu.device(), &w)?;
    let cap = Capacity {
        max_rows,
        max_seqs: 2,
        page_size: PAGE,
        max_context: 64,
        cache_dtype: CacheDtype::Bf16,
        act: ActMode::Bf16,
    };
    StandardPath::new(gpu, model, cap, KvBudget::Blocks(6), opts)
}

/// The stub's calls of one direct [`decode_step`] on a path of a `formats`
/// model built with `opts`.
fn decode_calls(opts: PathOptions, formats: Formats) -> Vec<Call> {
    let gpu = stub::gpu();
    let mut path = build_with(&gpu, opts, formats).expect("a path on the stub");
    let (batch, sampling) = decode_step();
    let shape = path.prepare(&batch, &sampling).expect("prepare");
    stub::take_calls();
    path.launch(shape, false).expect("direct step");
    stub::take_calls()
}

/// The kernel launches among `calls`, in order.
fn launches(calls: &[Call]) -> Vec<&stub::Launch> {
    calls
        .iter()
        .filter_map(|c| match c {
            Call::Launch(l) => Some(l),
            _ => None,
        })
        .collect()
}

/// A decode step: sequence 0 at position 5 (page 0), sequence 1 at
/// position 20 (pages 1, 2); both rows greedy.
fn decode_step() -> (StepBatch, Vec<SampleParams>) {
    let batch = StepBatch {
        tokens: vec![3, 7],
        positions: vec![5, 20],
        slot_mapping: vec![5, (2 * PAGE + 4) as u32],
        row_seq: vec![0, 1],
        seqs: vec![
            StepSeq {
                request_id: 1,
                block_table: vec![0],
                context_len: 6,
            },
            StepSeq {
                request_id: 2,
                block_table: vec![1, 2],
                context_len: 21,
            },
        ],
        logits_rows: vec![0, 1],
        decode_only: true,
    };
    (batch, vec![SampleParams::default(); 2])
}

/// The step's launches as the path's own recorder takes them down, and
/// the kernels' argument sizes by name (told to the stub, as a code
/// object's metadata would tell a real runtime). A kernel recorded with
/// two argument lists is an error.
fn reference(path: &StandardPath, s: Shape) -> Result<Vec<Recorded>, String> {
    let rec = path
        .l
        .record(|| path.enqueue(s.rows, s.logits_rows, &Extras::default()))
        .map_err(|e| e.to_string())?;
    let mut sig: HashMap<String, Vec<usize>> = HashMap::new();
    for r in &rec {
        let name = stub::name_of(r.func as u64).ok_or(format!("{}: unknown handle", r.label))?;
        if let Some(old) = sig.insert(name.clone(), r.sizes.clone()) {
            if old != r.sizes {
                return Err(format!("{name}: arguments {old:?} and {:?}", r.sizes));
            }
        }
    }
    stub::set_signatures(sig);
    Ok(rec)
}

/// Arguments in the recorder's layout (`Arg::encode`: 4-byte values at
/// 4-byte boundaries, 8-byte values and structs at 8-byte ones).
fn encode(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for a in args {
        if a.len() >= 8 {
            out.resize(out.len().next_multiple_of(8), 0);
        }
        out.extend_from_slice(a);
    }
    out
}

/// The calls of one captured step (from the launch to the read-back of
/// its tokens) against the recorder's launches.
fn check_step(calls: &[Call], rec: &[Recorded]) -> Result<(), String> {
    if let Some(Call::Bad(why)) = calls.iter().find(|c| matches!(c, Call::Bad(_))) {
        return Err(format!("the runtime refused a call: {why}"));
    }
    let at = |what: &str, f: &dyn Fn(&Call) -> bool| {
        calls.iter().position(f).ok_or_else(|| format!("no {what}"))
    };
    let begin = at("capture begin", &|c| matches!(c, Call::BeginCapture(_)))?;
    let Call::BeginCapture(s) = calls[begin] else {
        unreachable!()
    };
    let end = at(
        "capture end",
        &|c| matches!(c, Call::EndCapture { stream, .. } if *stream == s),
    )?;
    let Call::EndCapture { graph, .. } = calls[end] else {
        unreachable!()
    };
    let inst = at(
        "instantiation",
        &|c| matches!(c, Call::Instantiate { graph: g, .. } if *g == graph),
    )?;
    let Call::Instantiate { exec, .. } = calls[inst] else {
        unreachable!()
    };
    let replay = at("replay", &|c| *c == Call::GraphLaunch { exec, stream: s })?;
    let sync = calls[replay..]
        .iter()
        .position(|c| *c == Call::StreamSync(s))
        .map(|i| replay + i)
        .ok_or("no stream sync after the replay")?;
    let read = at(
        "read-back",
        &|c| matches!(c, Call::Memcpy { kind, .. } if *kind == HIP_MEMCPY_D2H),
    )?;
    if !(begin < end && end < inst && inst < replay && replay < sync && sync < read) {
        return Err(format!(
            "order: begin {begin}, end {end}, instantiate {inst}, replay {replay}, sync {sync}, read {read}"
        ));
    }
    let launches: Vec<(usize, &stub::Launch)> = calls
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c {
            Call::Launch(l) => Some((i, l)),
            _ => None,
        })
        .collect();
    if launches.is_empty() {
        return Err("no launches".into());
    }
    if let Some((i, l)) = launches.iter().find(|(i, _)| *i < begin || *i > end) {
        return Err(format!(
            "launch {} at call {i} outside the capture of stream {s:#x}",
            l.name
        ));
    }
    check_branches(&calls[begin..=end], s)?;
    if launches.len() != rec.len() {
        return Err(format!(
            "{} launches reached the runtime, the recorder took down {}",
            launches.len(),
            rec.len()
        ));
    }
    for (n, ((_, l), r)) in launches.iter().zip(rec).enumerate() {
        let want = stub::name_of(r.func as u64).unwrap_or_default();
        let what = format!("launch {n} ({}, `{}`)", want, r.label);
        if l.name != want {
            return Err(format!("{what}: kernel {}", l.name));
        }
        if l.grid != r.grid {
            return Err(format!("{what}: grid {:?}, recorded {:?}", l.grid, r.grid));
        }
        if l.block != (r.block, 1, 1) || l.smem != r.smem {
            return Err(format!(
                "{what}: block {:?} smem {}, recorded {} / {}",
                l.block, l.smem, r.block, r.smem
            ));
        }
        if encode(&l.args) != r.args {
            return Err(format!(
                "{what}: argument bytes differ from the recorded ones"
            ));
        }
    }
    // no free while the stream has work that was not waited for
    let mut pending = false;
    for (i, c) in calls.iter().enumerate() {
        match c {
            Call::GraphLaunch { .. } | Call::MemcpyAsync { .. } | Call::MemsetAsync { .. } => {
                pending = true
            }
            // a launch inside the capture is recorded, not run
            Call::Launch(_) => pending |= !(begin..end).contains(&i),
            Call::StreamSync(_) => pending = false,
            Call::Free { ptr } if pending => {
                return Err(format!(
                    "free of {ptr:#x} while the stream has work pending"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The streams of one capture (`calls` from its begin to its end, `s` the
/// capturing stream): a launch on another stream is captured only when that
/// stream waited, inside the capture, for an event recorded on a captured
/// stream (a fork); and every launch on another stream must be joined back
/// before the end (an event recorded on it after the launch, then waited
/// for by `s`), or the capture would end with work outside its graph.
fn check_branches(calls: &[Call], s: u64) -> Result<(), String> {
    let mut captured: HashSet<u64> = HashSet::from([s]);
    // launches so far on each stream; an event's (stream, launches) when
    // it was recorded; each side stream's launches joined back into `s`
    let mut count: HashMap<u64, usize> = HashMap::new();
    let mut recorded: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut joined: HashMap<u64, usize> = HashMap::new();
    for c in calls {
        match c {
            Call::Launch(l) => {
                if !captured.contains(&l.stream) {
                    return Err(format!(
                        "launch {} on stream {:#x}, which never joined the capture of {s:#x}",
                        l.name, l.stream
                    ));
                }
                *count.entry(l.stream).or_default() += 1;
            }
            Call::EventRecord { event, stream } if captured.contains(stream) => {
                let n = count.get(stream).copied().unwrap_or(0);
                recorded.insert(*event, (*stream, n));
            }
            Call::StreamWaitEvent { stream, event } => {
                if let Some(&(from, n)) = recorded.get(event) {
                    captured.insert(*stream);
                    if *stream == s && from != s {
                        joined.insert(from, n);
                    }
                }
            }
            _ => {}
        }
    }
    for (stream, n) in count {
        let j = joined.get(&stream).copied().unwrap_or(0);
        if stream != s && j < n {
            return Err(format!(
                "{} launches on stream {stream:#x} not joined back into {s:#x} before the capture ends",
                n - j
            ));
        }
    }
    Ok(())
}

/// After everything is dropped: every allocation, stream, event, graph
/// and graph exec the calls made was released, once.
fn check_released(calls: &[Call]) -> Result<(), String> {
    if let Some(Call::Bad(why)) = calls.iter().find(|c| matches!(c, Call::Bad(_))) {
        return Err(format!("the runtime refused a call: {why}"));
    }
    let mut live: HashSet<u64> = HashSet::new();
    let mut handles: HashSet<(&str, u64)> = HashSet::new();
    for c in calls {
        let ok = match *c {
            Call::Malloc { ptr, .. } => live.insert(ptr),
            Call::Free { ptr } => live.remove(&ptr),
            Call::StreamCreate(h) => handles.insert(("stream", h)),
            Call::StreamDestroy(h) => handles.remove(&("stream", h)),
            Call::EventCreate(h) => handles.insert(("event", h)),
            Call::EventDestroy(h) => handles.remove(&("event", h)),
            Call::EndCapture { graph, .. } => handles.insert(("graph", graph)),
            Call::GraphDestroy(h) => handles.remove(&("graph", h)),
            Call::Instantiate { exec, .. } => handles.insert(("exec", exec)),
            Call::ExecDestroy(h) => handles.remove(&("exec", h)),
            _ => true,
        };
        if !ok {
            return Err(format!("{c:?}: twice, or of something never made"));
        }
    }
    if !live.is_empty() || !stub::live().is_empty() {
        return Err(format!(
            "{} allocations never freed",
            live.len().max(stub::live().len())
        ));
    }
    if !handles.is_empty() {
        return Err(format!("never released: {handles:?}"));
    }
    Ok(())
}

/// Build the path, run one captured decode step with `plant` in the stub
/// (and, with `free_early`, drop a buffer between the replay and the
/// read-back), and check the step's calls.
fn run_step(plant: Plant, free_early: bool) -> Result<(), String> {
    let gpu = stub::gpu();
    let mut path = build(&gpu, PathOptions::default()).map_err(|e| e.to_string())?;
    let (batch, sampling) = decode_step();
    let shape = path.prepare(&batch, &sampling).map_err(|e| e.to_string())?;
    let rec = reference(&path, shape)?;
    let spare = DevBuf::zeroed(gpu.device(), 64).map_err(|e| e.to_string())?;
    stub::take_calls();
    stub::plant(plant);
    path.launch(shape, true).map_err(|e| e.to_string())?;
    if free_early {
        drop(spare);
    }
    path.read_tokens(shape.logits_rows)
        .map_err(|e| e.to_string())?;
    check_step(&stub::take_calls(), &rec)
}

#[test]
fn a_decode_step_on_the_hip_route_launches_what_the_path_records() {
    let gpu = stub::gpu();
    let mut path = build(&gpu, PathOptions::default()).expect("a standard path on the stub");
    let mut all = stub::take_calls();
    assert!(
        all.iter().any(|c| matches!(c, Call::Rtc("compile"))),
        "kernels compiled through hiprtc"
    );
    let (batch, sampling) = decode_step();
    let shape = path.prepare(&batch, &sampling).expect("prepare");
    let rec = reference(&path, shape).expect("reference");
    all.extend(stub::take_calls());
    path.launch(shape, true).expect("captured step");
    let tokens = path.read_tokens(shape.logits_rows).expect("tokens");
    assert_eq!(tokens.len(), 2);
    let step = stub::take_calls();
    check_step(&step, &rec).unwrap_or_else(|e| panic!("HIP route: {e}"));
    let launches = launches(&step);
    // 4 layers and a head: dozens of launches, embedding first, sampler last
    assert!(launches.len() > 20, "{} launches", launches.len());
    assert_eq!(launches[0].name, "m3s_embed");
    assert_eq!(
        launches.last().map(|l| l.name.as_str()),
        Some("m3s_sample_keyed")
    );
    // the one-warp kernels take the vendor's width: a wavefront of 64 (the
    // router of a step this small is one 256-thread launch)
    let hn = launches
        .iter()
        .find(|l| l.name == "m3s_headnorm_rope")
        .expect("no m3s_headnorm_rope");
    assert_eq!(hn.block, (64, 1, 1));
    assert!(launches
        .iter()
        .all(|l| l.args.iter().all(|a| !a.is_empty())));
    // the shared experts ran on the side stream: one branch a MoE layer
    let main = launches[0].stream;
    let side: Vec<&str> = launches
        .iter()
        .filter(|l| l.stream != main)
        .map(|l| l.name.as_str())
        .collect();
    let moe_layers = 3;
    assert_eq!(
        side.iter().filter(|n| **n == "m3s_swiglu").count(),
        moe_layers,
        "{side:?}"
    );
    all.extend(step);

    // the same shape again: a replay only, no launch and no capture
    path.prepare(&batch, &sampling).expect("prepare again");
    path.launch(shape, true).expect("replayed step");
    path.read_tokens(shape.logits_rows).expect("tokens again");
    let again = stub::take_calls();
    assert!(!again
        .iter()
        .any(|c| matches!(c, Call::Launch(_) | Call::BeginCapture(_))));
    assert_eq!(
        again
            .iter()
            .filter(|c| matches!(c, Call::GraphLaunch { .. }))
            .count(),
        1
    );
    all.extend(again);

    // copy-on-write: device-to-device copies inside the caches
    path.kv
        .copy_blocks(path.launcher(), &[(1, 3)])
        .expect("block copy");
    path.launcher().sync().expect("sync");
    let cow = stub::take_calls();
    let copies = cow
        .iter()
        .filter(|c| matches!(c, Call::MemcpyAsync { kind: 3, .. }))
        .count();
    // K and V of every layer, and the index keys of the sparse ones
    assert!(copies >= 8, "{copies} copies");
    all.extend(cow);

    drop(path);
    all.extend(stub::take_calls());
    check_released(&all).unwrap_or_else(|e| panic!("HIP route teardown: {e}"));
}

#[test]
fn direct_launches_match_the_recorder_too() {
    let gpu = stub::gpu();
    let mut path = build(&gpu, PathOptions::default()).expect("path");
    let (batch, sampling) = decode_step();
    let shape = path.prepare(&batch, &sampling).expect("prepare");
    let rec = reference(&path, shape).expect("reference");
    stub::take_calls();
    path.launch(shape, false).expect("direct step");
    let calls = stub::take_calls();
    let launches = launches(&calls);
    assert!(!calls.iter().any(|c| matches!(c, Call::BeginCapture(_))));
    assert_eq!(launches.len(), rec.len());
    for (l, r) in launches.iter().zip(&rec) {
        assert_eq!(
            (l.grid, l.block.0, l.smem),
            (r.grid, r.block, r.smem),
            "{}",
            r.label
        );
        assert_eq!(encode(&l.args), r.args, "{}", r.label);
    }
}

/// A step of more rows than the one-launch router takes (a 20-row
/// prefill) runs the router's three launches, whose top-k is one warp a
/// row: on HIP a wavefront of 64 lanes. Its launches match the recorder's.
#[test]
fn a_large_step_routes_a_row_a_wavefront() {
    let gpu = stub::gpu();
    let mut path = build_rows(&gpu, PathOptions::default(), Formats::default(), 24).expect("path");
    let tokens: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 64).collect();
    let batch = StepBatch::contiguous(1, &tokens, 0, &[0, 1], PAGE, false);
    let sampling = vec![SampleParams::default()];
    let shape = path.prepare(&batch, &sampling).expect("prepare");
    let rec = reference(&path, shape).expect("reference");
    stub::take_calls();
    path.launch(shape, true).expect("captured step");
    assert_eq!(
        path.read_tokens(shape.logits_rows).expect("tokens").len(),
        1
    );
    let calls = stub::take_calls();
    check_step(&calls, &rec).unwrap_or_else(|e| panic!("HIP route, 20 rows: {e}"));
    let warp: Vec<&stub::Launch> = calls
        .iter()
        .filter_map(|c| match c {
            Call::Launch(l) if l.name == "m3s_router_warp" => Some(l),
            _ => None,
        })
        .collect();
    // one a MoE layer (tiny: 3), a wavefront a row
    assert_eq!(warp.len(), 3, "m3s_router_warp launches");
    for l in warp {
        assert_eq!((l.grid.0, l.block), (20, (64, 1, 1)));
    }
    assert!(!calls
        .iter()
        .any(|c| matches!(c, Call::Launch(l) if l.name == "m3s_router_small")));
}

#[test]
fn planted_route_mistakes_fail_the_check() {
    // control: the same run without a plant passes
    run_step(Plant::None, false).unwrap_or_else(|e| panic!("control: {e}"));
    let cases: [(Plant, bool, &str); 5] = [
        (Plant::SwapGridXY, false, "grid"),
        (Plant::DropLaunch(3), false, "launches reached the runtime"),
        (Plant::FlipFirstArg, false, "argument bytes"),
        (Plant::None, true, "while the stream has work pending"),
        (Plant::DropWaits, false, "never joined the capture"),
    ];
    for (plant, early, want) in cases {
        let e = run_step(plant, early).expect_err("a planted mistake passed the check");
        assert!(e.contains(want), "{plant:?} / free early {early}: {e}");
    }
}

/// The shared experts of MX models run beside the routed experts too (their
/// f16 x rows have buffers of their own): the launches of each MoE layer's
/// shared expert reach the side stream, so the GPU runner test that
/// compares beside against one stream bitwise on MX models compares two
/// different schedules. With `Beside::Off` nothing leaves the main stream.
#[test]
fn the_shared_experts_of_an_mx_model_run_beside() {
    let mx = Formats {
        experts: WeightFormat::Mxfp4,
        dense: WeightFormat::Mxfp8,
    };
    let side_swiglus = |beside: Beside| -> usize {
        let opts = PathOptions {
            beside,
            ..PathOptions::default()
        };
        let calls = decode_calls(opts, mx);
        let launches = launches(&calls);
        let main = launches[0].stream;
        launches
            .iter()
            .filter(|l| l.stream != main && l.name == "m3s_swiglu")
            .count()
    };
    // tiny: 3 MoE layers after 1 dense one
    assert_eq!(side_swiglus(Beside::On), 3);
    assert_eq!(side_swiglus(Beside::Off), 0);
}

/// The two folds of small launches (`PathOptions::fuse_swiglu`,
/// `PathOptions::fold_combine`) on an MX model: every SwiGLU goes into its
/// gate + up launch (the dense layer's, each MoE layer's routed and shared
/// experts'), and every MoE layer's combine but the last one's into the
/// next layer's RMSNorm (`m3s_rmsnorm_mix`); nothing else changes in the
/// step's launches. (That the results keep their bits is the GPU runner
/// tests' part.)
#[test]
fn the_folds_take_out_exactly_their_launches() {
    let mx = Formats {
        experts: WeightFormat::Mxfp4,
        dense: WeightFormat::Mxfp8,
    };
    let names = |folds: bool| -> Vec<String> {
        let opts = PathOptions {
            fuse_swiglu: folds,
            fold_combine: folds,
            ..PathOptions::default()
        };
        let calls = decode_calls(opts, mx);
        launches(&calls).iter().map(|l| l.name.clone()).collect()
    };
    let count = |v: &[String], n: &str| v.iter().filter(|x| *x == n).count();
    let (plain, folded) = (names(false), names(true));
    // tiny: a dense layer, then 3 MoE layers with a shared expert each
    assert_eq!(count(&plain, "m3s_swiglu"), 7, "{plain:?}");
    assert_eq!(count(&plain, "m3s_moe_combine"), 3);
    assert_eq!(count(&plain, "m3s_rmsnorm_mix"), 0);
    assert_eq!(count(&folded, "m3s_swiglu"), 0, "{folded:?}");
    assert_eq!(count(&folded, "m3s_moe_combine"), 1);
    assert_eq!(count(&folded, "m3s_rmsnorm_mix"), 2);
    // the rest, in order: the plain step's launches less the folded ones,
    // with two of its input norms now the combine-taking kind
    let rest = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|n| *n != "m3s_swiglu" && *n != "m3s_moe_combine")
            .map(|n| n.replace("m3s_rmsnorm_mix", "m3s_rmsnorm"))
            .collect()
    };
    assert_eq!(rest(&folded), rest(&plain));
    assert_eq!(plain.len() - folded.len(), 7 + 2);
}

/// The mono path on HIP sizes its all-resident grid from the device's
/// answers: compute units (hipDeviceGetAttribute, by ROCm 6's numbering
/// once two known attributes check out) times the occupancy query's blocks
/// a unit; a decode step then launches `m3s_mono` on exactly that grid.
#[test]
fn the_mono_path_sizes_its_grid_from_the_hip_queries() {
    let opts = PathOptions {
        mono: true,
        ..PathOptions::default()
    };
    let gpu = stub::gpu_answering(stub::Answers {
        cus: 304,
        occupancy: 3,
        ..stub::Answers::default()
    });
    assert_eq!(gpu.multiprocessors(), 304);
    assert_eq!(gpu.mono_unsupported(), None);
    let mut path = build(&gpu, opts).expect("mono on the stub HIP device");
    // the occupancy asked of m3s_mono's blocks, as they are launched
    let asked: Vec<_> = stub::take_calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::Occupancy {
                name,
                threads,
                smem,
            } => Some((name, threads, smem)),
            _ => None,
        })
        .collect();
    assert_eq!(
        asked,
        [("m3s_mono".to_string(), super::mono::MONO_THREADS as i32, 0)]
    );
    let about = path.mono_about().expect("the path has its mono kernel");
    assert!(
        about.starts_with("912 persistent CTAs (3 an SM)"),
        "{about}"
    );
    path.set_mono(true).expect("mono on");
    let (batch, sampling) = decode_step();
    let shape = path.prepare(&batch, &sampling).expect("prepare");
    stub::take_calls();
    path.launch(shape, false).expect("a mono step");
    let calls = stub::take_calls();
    let mono: Vec<_> = launches(&calls)
        .into_iter()
        .filter(|l| l.name == "m3s_mono")
        .collect();
    assert!(!mono.is_empty(), "no m3s_mono launch");
    assert!(
        mono.iter().all(|l| l.grid == (912, 1, 1)),
        "{:?}",
        mono[0].grid
    );
}

/// `PathOptions::mono_layers_per_launch`: a mono step launches
/// `m3s_mono` once per group of that many layers (tiny's 4 layers: 4, 2,
/// 1 launches for 1, 3, 0 = all), each launch holding its layers' ops
/// together (the per-layer programs' counts summed).
#[test]
fn mono_launches_hold_their_groups_of_layers() {
    let nops = |per: usize| -> Vec<u32> {
        let gpu = stub::gpu_answering(stub::Answers {
            cus: 304,
            occupancy: 3,
            ..stub::Answers::default()
        });
        let opts = PathOptions {
            mono: true,
            mono_layers_per_launch: per,
            ..PathOptions::default()
        };
        let mut path = build(&gpu, opts).expect("mono on the stub HIP device");
        path.set_mono(true).expect("mono on");
        let (batch, sampling) = decode_step();
        let shape = path.prepare(&batch, &sampling).expect("prepare");
        // m3s_mono(ops, nops, args, bar, prof)
        stub::set_signatures(HashMap::from([(
            "m3s_mono".to_string(),
            vec![8, 4, 8, 8, 8],
        )]));
        stub::take_calls();
        path.launch(shape, false).expect("a mono step");
        let calls = stub::take_calls();
        launches(&calls)
            .into_iter()
            .filter(|l| l.name == "m3s_mono")
            .map(|l| u32::from_le_bytes(l.args[1][..4].try_into().expect("nops")))
            .collect()
    };
    let one = nops(1);
    assert_eq!(one.len(), 4, "{one:?}");
    assert!(one.iter().all(|&n| n > 0), "{one:?}");
    assert_eq!(nops(3), [one[..3].iter().sum(), one[3]]);
    assert_eq!(nops(0), [one.iter().sum::<u32>()]);
}

/// Where the device's answers cannot be trusted, the mono path is refused
/// with the reason (and the standard path still opens).
#[test]
fn the_mono_path_is_refused_where_the_hip_queries_fail() {
    let opts = PathOptions {
        mono: true,
        ..PathOptions::default()
    };
    // 304 compute units answered where the count is asked for: 256 can
    // then only be the fallback
    let a = stub::Answers {
        cus: 304,
        ..stub::Answers::default()
    };
    for (a, why) in [
        (
            stub::Answers {
                version: 50_731_921,
                ..a
            },
            "before ROCm 6",
        ),
        (stub::Answers { warp: 0, ..a }, "numbering check failed"),
        (
            stub::Answers {
                cooperative: 0,
                ..a
            },
            "cooperative launches",
        ),
        (stub::Answers { cus: 0, ..a }, "MultiprocessorCount) gave 0"),
    ] {
        let gpu = stub::gpu_answering(a);
        assert_eq!(gpu.multiprocessors(), 256, "{a:?}: the assumed count");
        let e = build(&gpu, opts).err().expect("mono refused");
        assert!(e.to_string().contains(why), "{a:?}: {e}");
        build(&gpu, PathOptions::default()).expect("the standard path opens");
    }
}

/// The launcher itself takes its warp width from the device's vendor.
#[test]
fn a_hip_launcher_has_wave64() {
    let gpu = stub::gpu();
    let l = Launcher::new(gpu.device(), gpu.pdl()).expect("launcher");
    assert_eq!(l.warp(), 64);
    assert!(!gpu.pdl());
}

/// The kernel names of one direct decode step on the stub, in launch
/// order, the path built with `opts`.
fn step_launch_names(opts: PathOptions) -> Vec<String> {
    let gpu = stub::gpu();
    let mut path = build(&gpu, opts).expect("a path on the stub");
    let (batch, sampling) = decode_step();
    let shape = path.prepare(&batch, &sampling).expect("prepare");
    stub::take_calls();
    path.launch(shape, false).expect("direct step");
    let calls = stub::take_calls();
    launches(&calls).iter().map(|l| l.name.clone()).collect()
}

/// The timing ablation (`PathOptions::skip_launches`) leaves out exactly
/// the launches it names, by label, and nothing else: a step with
/// `rmsnorm,swiglu` skipped has the control step's launches minus every
/// `m3s_rmsnorm` and `m3s_swiglu`, in the same order.
#[test]
fn skipped_launches_are_exactly_the_named_ones() {
    let names = |skip: &'static str| {
        step_launch_names(PathOptions {
            skip_launches: skip,
            ..PathOptions::default()
        })
    };
    let all = names("");
    let skipped = names(" rmsnorm, swiglu ");
    let gone = |n: &String| n == "m3s_rmsnorm" || n == "m3s_swiglu";
    assert!(all.iter().filter(|n| gone(n)).count() >= 2, "{all:?}");
    let want: Vec<String> = all.iter().filter(|n| !gone(n)).cloned().collect();
    assert_eq!(skipped, want);
}

/// A sparse layer of head dim <= 128 takes the `_d128` attention partials
/// where `PathOptions::attn_d128` says so (the default) and the plain ones
/// where not, the split and the sparse entry alike (the sparse one where
/// the split is capped below the step's rows); no other launch changes.
/// The runner test `d128_attention_is_bitwise_the_same` holds both to the
/// same bits on a device; this one says which entries its two runs took.
#[test]
fn the_d128_partials_are_the_ones_launched() {
    let names = |d128: bool, split_max_rows: usize| {
        step_launch_names(PathOptions {
            attn_d128: d128,
            attn_split_max_rows: split_max_rows,
            ..PathOptions::default()
        })
    };
    assert!(PathOptions::default().attn_d128, "the default");
    for (split_rows, entry) in [
        (super::attn::SPLIT_MAX_ROWS, "m3s_attn_partial_split"),
        (0, "m3s_attn_partial_sparse"),
    ] {
        let plain = names(false, split_rows);
        let d128 = names(true, split_rows);
        let count = |v: &[String], n: &str| v.iter().filter(|x| *x == n).count();
        let wide = format!("{entry}_d128");
        assert!(count(&plain, entry) >= 1, "{entry} in {plain:?}");
        assert_eq!(count(&plain, &wide), 0, "{plain:?}");
        assert_eq!(count(&d128, entry), 0, "{d128:?}");
        assert_eq!(count(&d128, &wide), count(&plain, entry), "{d128:?}");
        let renamed: Vec<String> = d128
            .iter()
            .map(|n| {
                if *n == wide {
                    entry.to_string()
                } else {
                    n.clone()
                }
            })
            .collect();
        assert_eq!(renamed, plain, "only the partials differ");
    }
}

/// The twice diagnosis (`PathOptions::twice_launches`) repeats exactly the
/// launches it names, each right after itself: a step with `rmsnorm` made
/// twice has the control step's launches with every `m3s_rmsnorm` doubled
/// in place, and nothing else changed.
#[test]
fn twice_launches_are_exactly_the_named_ones() {
    let names = |twice: &'static str| {
        step_launch_names(PathOptions {
            twice_launches: twice,
            ..PathOptions::default()
        })
    };
    let all = names("");
    assert!(all.iter().any(|n| n == "m3s_rmsnorm"), "{all:?}");
    let want: Vec<String> = all
        .iter()
        .flat_map(|n| {
            let k = if n == "m3s_rmsnorm" { 2 } else { 1 };
            std::iter::repeat_n(n.clone(), k)
        })
        .collect();
    assert_eq!(names(" rmsnorm "), want);
}

/// The mono programs of a 2-row step, per layer, on a stub HIP device of
/// 304 CUs answering an occupancy of 3 (a grid of 912 CTAs), the path built
/// with `opts` and `mono` on.
fn mono_programs_of_two_rows(opts: PathOptions) -> Vec<Vec<super::mono::OpAbout>> {
    let gpu = stub::gpu_answering(stub::Answers {
        cus: 304,
        occupancy: 3,
        ..stub::Answers::default()
    });
    let opts = PathOptions { mono: true, ..opts };
    let mut path = build(&gpu, opts).expect("mono on the stub HIP device");
    path.mono_prepare(2).expect("programs of 2 rows");
    assert_eq!(path.mono_grid(), Some(912));
    path.mono_programs(2).expect("programs")
}

/// A mono program runs each MoE layer's shared expert (the side chain of
/// its `beside` call) in phases with the router and routed experts: with
/// pairing on, the same ops as without, each chain in its own order, some
/// op sharing its phase with the next, and that next op's blocks rotated
/// past the CTAs the first fills (CUs x occupancy = 912 here); with it
/// off, no shared phase and no rotation (`mono_rotate_late` off: the
/// pairing's rotation alone).
#[test]
fn mono_programs_pair_the_shared_expert_with_the_routed_chain() {
    let programs = |pair: bool| {
        mono_programs_of_two_rows(PathOptions {
            mono_pair_beside: pair,
            mono_rotate_late: false,
            ..PathOptions::default()
        })
    };
    let on = programs(true);
    let off = programs(false);

    assert_eq!(on.len(), off.len());
    let mut paired = 0;
    for (li, (a, b)) in on.iter().zip(&off).enumerate() {
        let labels = |p: &[super::mono::OpAbout]| {
            let mut v: Vec<_> = p.iter().map(|o| (o.label, o.grid)).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(labels(a), labels(b), "layer {li}: the same ops");
        assert!(
            b.iter().all(|o| !o.shares_phase && o.rot == 0),
            "layer {li} unpaired"
        );
        assert!(
            !a.last().is_some_and(|o| o.shares_phase),
            "layer {li}: last op"
        );
        for (i, o) in a.iter().enumerate().filter(|(_, o)| o.shares_phase) {
            paired += 1;
            let blocks = o.grid.0 * o.grid.1 * o.grid.2;
            let ctas = blocks.div_ceil(super::mono::MONO_THREADS / o.block);
            assert_eq!(a[i + 1].rot, ctas % 912, "layer {li} op {i} ({})", o.label);
            assert!(!a[i + 1].shares_phase, "layer {li}: a phase holds two ops");
        }
    }
    assert!(
        paired > 0,
        "no op shares a phase: {:?}",
        on.iter()
            .map(|p| p.iter().map(|o| o.label).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
}

/// `mono_router_split`: each MoE layer's mono program holds the router's
/// three ops (the f32 linear, the top-k, the grouping) in that order and no
/// `m3s_router_small`; off, the one fused op and none of the three. The
/// standard path's own steps are not touched (it only applies to a
/// recording).
#[test]
fn mono_router_split_records_the_three_router_ops() {
    let programs = |split: bool| {
        mono_programs_of_two_rows(PathOptions {
            mono_router_split: split,
            ..PathOptions::default()
        })
    };
    let bodies = |p: &[super::mono::OpAbout]| p.iter().map(|o| o.body).collect::<Vec<_>>();
    let fused = programs(false);
    let split = programs(true);
    let mut moe = 0;
    for (li, (a, b)) in fused.iter().zip(&split).enumerate() {
        let (a, b) = (bodies(a), bodies(b));
        assert!(!b.contains(&"m3s_router_small"), "layer {li}: {b:?}");
        let three = ["m3s_linear_f32w", "m3s_router_warp", "m3s_route"];
        if a.contains(&"m3s_router_small") {
            moe += 1;
            assert!(three.iter().all(|n| !a.contains(n)), "layer {li}: {a:?}");
            let at: Vec<usize> = three
                .iter()
                .map(|n| b.iter().position(|x| x == n).expect("a split router op"))
                .collect();
            assert!(at[0] < at[1] && at[1] < at[2], "layer {li}: {b:?}");
            assert_eq!(b.len(), a.len() + 2, "layer {li}: two more ops");
        } else {
            assert_eq!(a, b, "layer {li}: a dense layer is the same program");
        }
    }
    assert!(moe > 0, "no MoE layer with the fused router");
}

/// `mono_rotate_late`: each op's blocks start past the CTAs that held the
/// op before's last round (912 CTAs here). The last layer's program (a MoE
/// layer of 2 rows), the rotations worked by hand from its grids: an op
/// alone in its phase deals its blocks to every CTA's first sub-block
/// first, so its last round holds min(blocks, 912) CTAs (e.g. the 30-block
/// q|k|v: 2 + 30 = 32); a phase's first op moves the second past the CTAs
/// it fills (8 blocks of 128 threads: 4 CTAs, 164 -> 168), and the second,
/// dealt CTA-major, past its own (the 8-block router: 168 -> 176; the 32
/// expert blocks of 128 threads: 16 CTAs). Off: the same ops and phases,
/// an op alone from CTA 0.
#[test]
fn mono_rotate_late_starts_each_op_past_the_last_round() {
    let programs = |on: bool| {
        mono_programs_of_two_rows(PathOptions {
            mono_rotate_late: on,
            ..PathOptions::default()
        })
    };
    let (on, off) = (programs(true), programs(false));
    let last = on.last().expect("layers");
    let rots: Vec<u32> = last.iter().map(|o| o.rot).collect();
    assert_eq!(
        rots,
        [0, 2, 32, 62, 70, 74, 138, 154, 162, 164, 168, 176, 177, 193, 197, 198, 230],
        "{:?}",
        last.iter()
            .map(|o| (o.label, o.grid, o.block, o.shares_phase))
            .collect::<Vec<_>>()
    );
    for (a, b) in on.iter().zip(&off) {
        let shape = |p: &[super::mono::OpAbout]| -> Vec<_> {
            p.iter()
                .map(|o| (o.label, o.grid, o.block, o.shares_phase))
                .collect()
        };
        assert_eq!(shape(a), shape(b));
        for (i, o) in b.iter().enumerate() {
            let after_shared = i > 0 && b[i - 1].shares_phase;
            assert!(
                after_shared || o.rot == 0,
                "off: op {i} ({}) rotated",
                o.label
            );
        }
    }
}
