//! Mono decode, first form (issue 13): each decoder layer of a decode step
//! of at most [`MONO_MAX_ROWS`] rows runs as ONE persistent launch
//! (`m3s_mono`, kernels/mono.cu) instead of the standard path's ~20.
//!
//! The program a mono launch runs is recorded, not written twice: the
//! standard path's own launch code ([`StandardPath::enqueue_attention`] /
//! `enqueue_ffn`) runs once per (rows, layer) with the launcher in
//! recording mode, and every launch it would have made becomes an op (which
//! body, block size, grid, argument bytes) of that layer's program. On the
//! device each op's body is the standard kernel's own code compiled as a
//! device function (kernels/mono_prelude.h), run over its recorded grid by
//! the persistent CTAs, with a grid-wide barrier between two ops. So a mono
//! step computes exactly what the standard step computes, bit for bit; what
//! it removes is the launch boundaries (and, later, what overlapping across
//! them can win).
//!
//! Invariants: a program only holds kernel launches (a copy or memset while
//! recording is an error); every op's block is a power of two from 32 to
//! `MONO_THREADS`; the grid of `m3s_mono` is the same for every launch of a
//! path (its barrier counter counts generations of that many arrivals and is
//! never reset) and every CTA of it is resident at once (sized by the
//! occupancy the driver reports).

use std::collections::HashMap;

use super::launch::{Arg, Recorded};
use super::linear::variant_source;
use super::{StandardPath, STANDARD};
use crate::error::{GpuError, Result};
use crate::kernels::KernelSource;
use crate::model::{DevBuf, WFmt};
use crate::runtime::api::{Device, Func, Gpu};

/// Most rows a mono step takes (the small-step variant's rows: its linears
/// are the ones the mono build carries).
pub const MONO_MAX_ROWS: usize = super::linear::SMALL_STEP_ROWS;

/// Threads of a persistent CTA (`S_MONO_THREADS`).
pub(crate) const MONO_THREADS: u32 = 256;

/// The op bodies a program may name, by index: kernels/mono.cu's
/// `S_MONO_OPS` in the same order (a test holds the two lists equal).
pub(crate) const MONO_OPS: [&str; 32] = [
    "m3s_rmsnorm",
    "m3s_headnorm_rope",
    "m3s_cache_write",
    "m3s_swiglu",
    "m3s_moe_combine",
    "m3s_add_bf16",
    "m3s_act_mxfp4",
    "m3s_linear_f32w",
    "m3s_mma_bf16",
    "m3s_mma_e4m3",
    "m3s_mma_e4m3_any",
    "m3s_mma_e5m2",
    "m3s_mma_e5m2_any",
    "m3s_mma_fp4",
    "m3s_mma_fp4_any",
    "m3s_mma_nvfp4",
    "m3s_route",
    "m3s_router_warp",
    "m3s_index_scores",
    "m3s_index_topk",
    "m3s_attn_partial",
    "m3s_attn_partial_sparse",
    "m3s_attn_partial_split",
    "m3s_attn_combine",
    // the router of a small step in one launch
    "m3s_router_small",
    // the NVFP4 cache's entry points
    "m3s_index_scores_nv",
    "m3s_attn_partial_nv",
    "m3s_attn_partial_sparse_nv",
    "m3s_attn_partial_split_nv",
    // the MX linears' f16 x (m3s_mma_e4m3 .. m3s_mma_nvfp4 read it)
    "m3s_x_f16",
    // NVFP4 weights whose K is not a multiple of 128
    "m3s_mma_nvfp4_any",
    // RMSNorm with a MoE layer's combine taken in (fold_combine)
    "m3s_rmsnorm_mix",
];

/// Whether op `name` is a tensor-core linear (its body in the mono build
/// is the small-step variant's).
fn is_linear(name: &str) -> bool {
    name.starts_with("m3s_mma_")
}

/// The mono build's tunables and the values each takes (mono.cu /
/// mono_prelude.h / standard_decode.cu): op calls through a pointer table
/// or a switch, persistent CTAs an SM, and the linears' loads in flight.
const MONO_TUNABLES: [(&str, &[&str]); 4] = [
    ("S_MONO_INDIRECT", &["0", "1"]),
    ("S_MONO_MINB", &["1", "2"]),
    ("S_UNROLL_MUL", &["1", "2"]),
    ("S_UNROLL_HALF", &["0", "1"]),
];

/// The mono translation unit: `extra` (`NAME=VALUE` pairs of
/// [`MONO_TUNABLES`]), the prelude, the standard sources with the
/// small-step defines `small`, the interpreter. Built (and leaked) once per
/// define strings.
pub fn mono_source(small: &str, extra: &str) -> Result<KernelSource> {
    let std_small = variant_source(&STANDARD, small)?.src;
    let mut prefix = String::new();
    for kv in extra.split_whitespace() {
        let known = kv.split_once('=').is_some_and(|(k, v)| {
            MONO_TUNABLES
                .iter()
                .any(|(name, vals)| *name == k && vals.contains(&v))
        });
        if !known {
            let takes: Vec<String> = MONO_TUNABLES
                .iter()
                .map(|(name, vals)| format!("{name}={}", vals.join("|")))
                .collect();
            return Err(GpuError::input(
                "mono defines",
                format!("`{kv}`: the mono build takes {}", takes.join(", ")),
            ));
        }
        prefix.push_str(&format!("#define {}\n", kv.replacen('=', " ", 1)));
    }
    let body: &'static str = Box::leak(
        format!(
            "{prefix}{}\n#line 1 \"standard_decode.cu\"\n{}\n#line 1 \"mono.cu\"\n{}",
            include_str!("../../kernels/mono_prelude.h"),
            std_small.body,
            include_str!("../../kernels/mono.cu")
        )
        .into_boxed_str(),
    );
    Ok(KernelSource {
        name: "standard_mono",
        body,
        exact: false,
        entries: &["m3s_mono"],
    })
}

/// One recorded op as kernels/mono.cu's `SMonoOp` reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct OpRecord {
    fn_id: u32,
    lg: u32,
    gx: u32,
    gy: u32,
    gz: u32,
    arg: u32,
    pad: [u32; 2],
}

/// A layer's program on the device.
struct Program {
    ops: DevBuf,
    args: DevBuf,
    nops: u32,
    /// Per op: the launch label, the body and the virtual launch (for the
    /// op profile).
    about: Vec<OpAbout>,
    /// The op profile's timestamps (`nops x (grid + 1)` u64, see
    /// kernels/mono.cu `m3s_mono`), made by the first profiled run.
    prof: Option<DevBuf>,
}

/// What one op of a program is, for reports.
#[derive(Clone, Debug, PartialEq)]
struct OpAbout {
    label: &'static str,
    body: &'static str,
    grid: (u32, u32, u32),
    block: u32,
}

/// One op's times in a profiled mono step, summed over the layers whose
/// programs have the same ops ([`StandardPath::mono_op_profile`]).
#[derive(Clone, Debug)]
pub struct OpTime {
    /// The standard path's launch label (what the op replaces).
    pub label: &'static str,
    /// The op body (kernels/mono.cu `S_MONO_OPS`).
    pub body: &'static str,
    /// The virtual launch: grid and threads a block.
    pub grid: (u32, u32, u32),
    pub block: u32,
    /// Microseconds from the op's start (CTA 0 past the barrier before it)
    /// to the last CTA's finish.
    pub work_us: f64,
    /// Microseconds from the first CTA's finish to the last one's (how long
    /// the earliest CTA idles at the barrier).
    pub straggle_us: f64,
    /// Microseconds from the last CTA's finish to the next op's start (the
    /// barrier's own cost; 0 after the last op).
    pub barrier_us: f64,
}

/// The mono path of one standard path.
pub(crate) struct Mono {
    f: Func,
    /// Grid, registers and local memory, for reports.
    about: String,
    /// CTAs of every `m3s_mono` launch (all resident at once).
    grid: u32,
    /// The grid barrier's counter (u64, zeroed once).
    bar: DevBuf,
    /// Function handle (`Func::handle`) of each standard kernel a program may hold ->
    /// its op index.
    ids: HashMap<usize, u32>,
    /// Programs per step rows, one per layer, and the residual buffer
    /// their layers leave the step in (`PathOptions::fold_combine` moves
    /// it), where the head reads it.
    programs: HashMap<usize, (Vec<Program>, u64)>,
}

impl Mono {
    /// Compile the mono kernel (the small-step defines `small`, the ones
    /// the path's decode linears use; mono.cu's tunables `extra`) and size
    /// its grid.
    pub(crate) fn load(gpu: &dyn Gpu, small: &str, extra: &str) -> Result<Self> {
        let src = mono_source(small, extra)?;
        let f = gpu.kernel(&src, "m3s_mono")?;
        // the largest shared-memory carve-out, so the occupancy the driver
        // reports (every CTA resident: the grid barrier needs it) is the one
        // the launch gets
        f.prefer_max_shared_carveout()?;
        let regs = f.registers();
        let local = f.local_bytes();
        let per_sm = gpu.occupancy(&f, MONO_THREADS, 0)?;
        if per_sm == 0 {
            return Err(GpuError::input(
                "mono path",
                "m3s_mono cannot be resident on this device (occupancy 0)",
            ));
        }
        let sms = gpu.multiprocessors();
        let small_src = variant_source(&STANDARD, small)?;
        let std_small = small_src.src;
        let mut ids = HashMap::new();
        for (i, name) in MONO_OPS.iter().enumerate() {
            let from = if is_linear(name) {
                &std_small
            } else {
                &STANDARD
            };
            let h = gpu.kernel(from, name)?;
            ids.insert(h.handle(), i as u32);
        }
        // the small-step build's one-row and one-tile linears run as their
        // format's op (its body picks the same walk per CTA)
        if small_src.row_entries(gpu.vendor()) {
            for fm in WFmt::MMA {
                let Some(op) = fm
                    .mma_kernel()
                    .and_then(|n| MONO_OPS.iter().position(|o| *o == n))
                else {
                    continue;
                };
                for name in [fm.mma_kernel_rows(1), fm.mma_kernel_rows(8)]
                    .into_iter()
                    .flatten()
                {
                    ids.insert(gpu.kernel(&std_small, name)?.handle(), op as u32);
                }
            }
        }
        Ok(Mono {
            f,
            about: format!(
                "{} persistent CTAs ({per_sm} an SM) of {MONO_THREADS} threads, {regs} registers, {local} bytes of local memory a thread",
                per_sm as u32 * sms
            ),
            grid: per_sm as u32 * sms,
            bar: DevBuf::zeroed(gpu.device(), 8)?,
            ids,
            programs: HashMap::new(),
        })
    }

    /// The launch shape and resources, for reports.
    pub(crate) fn about(&self) -> &str {
        &self.about
    }

    /// Turn one layer's recorded launches into a program (checking each).
    fn program(&self, ctx: &Device, rec: &[Recorded]) -> Result<Program> {
        let bad = |why: String| GpuError::input("mono program", why);
        let mut ops = Vec::with_capacity(rec.len());
        let mut args: Vec<u8> = Vec::new();
        let mut about = Vec::with_capacity(rec.len());
        for r in rec {
            let Some(&id) = self.ids.get(&r.func) else {
                return Err(bad(format!(
                    "launch `{}` is not a mono op (an 8-warp linear, or a kernel the mono build lacks)",
                    r.label
                )));
            };
            let block = r.block;
            if !block.is_power_of_two() || !(32..=MONO_THREADS).contains(&block) {
                return Err(bad(format!(
                    "launch `{}` has {} threads a block (mono runs powers of two from 32 to {MONO_THREADS})",
                    r.label, block
                )));
            }
            if r.smem != 0 {
                return Err(bad(format!(
                    "launch `{}` takes {} bytes of dynamic shared memory (mono bodies carve a static pool)",
                    r.label, r.smem
                )));
            }
            let n = r.grid.0 as u64 * r.grid.1 as u64 * r.grid.2 as u64;
            if n > u32::MAX as u64 {
                return Err(bad(format!(
                    "launch `{}`: grid {:?} too large",
                    r.label, r.grid
                )));
            }
            args.resize(args.len().next_multiple_of(8), 0);
            ops.push(OpRecord {
                fn_id: id,
                lg: block.trailing_zeros(),
                gx: r.grid.0,
                gy: r.grid.1,
                gz: r.grid.2,
                arg: args.len() as u32,
                pad: [0; 2],
            });
            args.extend_from_slice(&r.args);
            about.push(OpAbout {
                label: r.label,
                body: MONO_OPS[id as usize],
                grid: r.grid,
                block,
            });
        }
        if ops.is_empty() {
            return Err(bad("a layer with no launches".into()));
        }
        args.resize(args.len().next_multiple_of(8).max(8), 0);
        Ok(Program {
            ops: DevBuf::from_slice(ctx, &ops)?,
            args: DevBuf::from_slice(ctx, &args)?,
            nops: ops.len() as u32,
            about,
            prof: None,
        })
    }
}

impl StandardPath {
    /// Whether a plain step of `t` rows runs on the mono path.
    pub(crate) fn mono_for(&self, t: usize) -> bool {
        self.mono_on && self.mono.is_some() && t <= MONO_MAX_ROWS && self.variant_for(t) == 1
    }

    /// Record the per-layer programs of steps of `t` rows (once per `t`).
    pub(crate) fn mono_prepare(&mut self, t: usize) -> Result<()> {
        let Some(mono) = self.mono.as_ref() else {
            return Err(GpuError::input(
                "mono path",
                "not loaded (PathOptions::mono)",
            ));
        };
        if mono.programs.contains_key(&t) {
            return Ok(());
        }
        let ex = super::step::Extras::default();
        let ctx = self.l.device().clone();
        let mut progs = Vec::with_capacity(self.model.layers.len());
        // the layers in order, the residual buffers as a step's enqueue
        // passes them (PathOptions::fold_combine)
        self.reset_residual();
        for li in 0..self.model.layers.len() {
            let rec = self.l.record(|| {
                self.enqueue_attention(li, t, &ex)?;
                self.enqueue_ffn(li, t, &ex)
            })?;
            let p = mono.program(&ctx, &rec).map_err(|e| match e {
                GpuError::Input { op, why } => GpuError::Input {
                    op,
                    why: format!("layer {li}, {t} rows: {why}"),
                },
                e => e,
            })?;
            progs.push(p);
        }
        let last = self.acts.cur_r.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(m) = self.mono.as_mut() {
            m.programs.insert(t, (progs, last));
        }
        Ok(())
    }

    /// Every kernel of a mono step of `t` rows with `nl` logits rows: the
    /// embedding, one `m3s_mono` per layer, the head ([`Self::mono_prepare`]
    /// first).
    ///
    /// `profile`: each layer's launch writes its op timestamps (the buffers
    /// [`Self::mono_op_profile`] made; a direct run, not for capture).
    pub(crate) fn enqueue_mono(&self, t: usize, nl: usize, profile: bool) -> Result<()> {
        let mono = self
            .mono
            .as_ref()
            .ok_or_else(|| GpuError::input("mono path", "not loaded (PathOptions::mono)"))?;
        let (progs, last) = mono
            .programs
            .get(&t)
            .ok_or_else(|| GpuError::input("mono path", format!("no programs for {t} rows")))?;
        self.enqueue_embed(t)?;
        for p in progs {
            self.l.launch(
                "mono",
                &mono.f,
                (mono.grid, 1, 1),
                MONO_THREADS,
                0,
                &[
                    Arg::U64(p.ops.ptr()),
                    Arg::U32(p.nops),
                    Arg::U64(p.args.ptr()),
                    Arg::U64(mono.bar.ptr()),
                    Arg::U64(match (&p.prof, profile) {
                        (Some(b), true) => b.ptr(),
                        _ => 0,
                    }),
                ],
            )?;
        }
        if nl > 0 {
            // the residual where the recorded layers leave it
            self.acts
                .cur_r
                .store(*last, std::sync::atomic::Ordering::Relaxed);
            self.enqueue_head(nl)?;
        }
        Ok(())
    }
}

impl StandardPath {
    /// Run a mono step of shape `s` once with op timestamps and return, per
    /// op of the most common layer program, its work, straggle and barrier
    /// times summed over the layers running that program, with how many
    /// layers that is. The step's inputs must be uploaded
    /// ([`Self::prepare`]); a direct run, so the first op of each layer
    /// also holds the launch's own start.
    pub fn mono_op_profile(&mut self, s: super::exec::Shape) -> Result<(Vec<OpTime>, usize)> {
        let t = s.rows;
        if !self.mono_for(t) {
            return Err(GpuError::input(
                "mono profile",
                format!("a step of {t} rows does not run on the mono path"),
            ));
        }
        self.mono_prepare(t)?;
        let ctx = self.l.device().clone();
        let Some(mono) = self.mono.as_mut() else {
            return Err(GpuError::input("mono profile", "not loaded"));
        };
        let g = mono.grid as usize;
        if let Some((progs, _)) = mono.programs.get_mut(&t) {
            for p in progs.iter_mut().filter(|p| p.prof.is_none()) {
                p.prof = Some(DevBuf::zeroed(&ctx, p.nops as usize * (g + 1) * 8)?);
            }
        }
        self.enqueue_mono(t, s.logits_rows, true)?;
        let Some((progs, _)) = self.mono.as_ref().and_then(|m| m.programs.get(&t)) else {
            return Err(GpuError::input("mono profile", "no programs"));
        };
        // the most common op sequence (the MoE layers of the bench model)
        let mut common: Vec<(&[OpAbout], usize)> = Vec::new();
        for p in progs {
            match common.iter_mut().find(|(a, _)| *a == p.about.as_slice()) {
                Some((_, n)) => *n += 1,
                None => common.push((&p.about, 1)),
            }
        }
        let Some(&(about, layers)) = common.iter().max_by_key(|(_, n)| *n) else {
            return Err(GpuError::input("mono profile", "no layers"));
        };
        let mut out: Vec<OpTime> = about
            .iter()
            .map(|a| OpTime {
                label: a.label,
                body: a.body,
                grid: a.grid,
                block: a.block,
                work_us: 0.0,
                straggle_us: 0.0,
                barrier_us: 0.0,
            })
            .collect();
        for p in progs.iter().filter(|p| p.about.as_slice() == about) {
            let Some(buf) = &p.prof else { continue };
            let mut ts = vec![0u64; p.nops as usize * (g + 1)];
            buf.read(self.l.stream(), 0, &mut ts)?;
            for (o, (w, s, b)) in out.iter_mut().zip(op_times(&ts, g)) {
                o.work_us += w;
                o.straggle_us += s;
                o.barrier_us += b;
            }
        }
        Ok((out, layers))
    }
}

/// (work, straggle, barrier) in us per op of one launch's stamps `ts`
/// (`nops` rows of `grid + 1` ns stamps: CTA 0's start of the op, then each
/// CTA's finish; kernels/mono.cu `m3s_mono`). Work: start to the last
/// finish; straggle: first finish to last; barrier: last finish to the next
/// op's start (0 for the last op). Stamps out of order count as 0.
fn op_times(ts: &[u64], grid: usize) -> Vec<(f64, f64, f64)> {
    let rows: Vec<&[u64]> = ts.chunks_exact(grid + 1).collect();
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 * 1e-3;
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let (lo, hi) = row[1..]
                .iter()
                .fold((u64::MAX, 0), |(lo, hi), &v| (lo.min(v), hi.max(v)));
            let barrier = rows.get(i + 1).map_or(0.0, |next| us(hi, next[0]));
            (us(row[0], hi), us(lo, hi), barrier)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where `list` and the `X(i, name)` entries of `src` (mono.cu's
    /// `S_MONO_OPS`) disagree, if they do.
    fn op_list_mismatch(list: &[&str], src: &str) -> Option<String> {
        let mut cu = Vec::new();
        for line in src.lines() {
            let l = line.trim().trim_end_matches('\\').trim();
            if let Some(rest) = l.strip_prefix("X(") {
                let rest = rest.trim_end_matches(')');
                let (i, name) = rest.split_once(',')?;
                cu.push((i.trim().parse::<usize>().ok()?, name.trim().to_string()));
            }
        }
        if cu.len() != list.len() {
            return Some(format!(
                "S_MONO_OPS has {}, the host {}",
                cu.len(),
                list.len()
            ));
        }
        cu.iter().enumerate().find_map(|(k, (i, name))| {
            (*i != k || name != list[k])
                .then(|| format!("entry {k}: X({i}, {name}) vs {}", list[k]))
        })
    }

    /// The host's op list and kernels/mono.cu's `S_MONO_OPS` name the same
    /// bodies at the same indices (a program's op ids index that switch),
    /// and the comparison catches a swap.
    #[test]
    fn op_list_matches_the_interpreter() {
        let src = include_str!("../../kernels/mono.cu");
        assert_eq!(op_list_mismatch(&MONO_OPS, src), None);
        let mut swapped = MONO_OPS;
        swapped.swap(3, 4);
        assert!(
            op_list_mismatch(&swapped, src).is_some(),
            "a swap went unseen"
        );
        assert!(
            op_list_mismatch(&MONO_OPS[..MONO_OPS.len() - 1], src).is_some(),
            "a missing op went unseen"
        );
        // every op is a standard kernel
        for n in MONO_OPS {
            assert!(
                STANDARD.entries.contains(&n),
                "{n} is not a standard kernel"
            );
        }
    }

    /// The mono build takes its one tunable and refuses anything else.
    #[test]
    fn mono_defines_are_checked() {
        let small = super::super::linear::SMALL_STEP_VARIANT;
        for ok in [
            "",
            "S_MONO_INDIRECT=0",
            "S_MONO_INDIRECT=1",
            "S_MONO_MINB=1 S_UNROLL_MUL=2",
            "S_UNROLL_HALF=1",
        ] {
            assert!(mono_source(small, ok).is_ok(), "{ok}");
        }
        let src = mono_source(small, "S_MONO_INDIRECT=0").expect("source");
        assert!(src.body.starts_with("#define S_MONO_INDIRECT 0\n"));
        for bad in [
            "S_MONO_INDIRECT=2",
            "S_MONO_MINB=0",
            "S_UNROLL_MUL=3",
            "S_UNROLL_MUL=0",
            "S_UNROLL_HALF=2",
            "S_MMA_WARPS=8",
            "junk",
        ] {
            let e = mono_source(small, bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("S_MONO_INDIRECT"), "{bad}: {e}");
        }
    }

    /// The op profile's arithmetic on stamps worked by hand: 2 ops over 3
    /// CTAs; and a wrong stamp is seen.
    #[test]
    fn op_times_from_stamps() {
        // op 0 starts at 1000 ns, CTAs finish at 3000, 1500, 2000; op 1
        // starts at 3400 (barrier 400 ns), CTAs finish at 5000, 5000, 4000
        let ts = [1000, 3000, 1500, 2000, 3400, 5000, 5000, 4000];
        let t = op_times(&ts, 3);
        assert_eq!(t, vec![(2.0, 1.5, 0.4), (1.6, 1.0, 0.0)]);
        let mut bad = ts;
        bad[1] = 2500; // the last CTA of op 0 finishing earlier
        assert_ne!(op_times(&bad, 3), t);
        // a stamp before its op's start counts as 0, not a negative time
        assert_eq!(op_times(&[5, 1, 2], 2), vec![(0.0, 0.001, 0.0)]);
    }

    /// Arguments are laid out as mono.cu's `SMonoPack` reads them: 4-byte
    /// values at 4-byte boundaries, u64s and structs at 8, structs padded to
    /// a multiple of 8.
    #[test]
    fn arguments_follow_the_interpreters_layout() {
        let mut b = Vec::new();
        for a in [
            Arg::U32(1),
            Arg::U64(0x0203_0405_0607_0809),
            Arg::F32(1.5),
            Arg::Pod(vec![7, 8]),
            Arg::U32(3),
        ] {
            a.encode_for_test(&mut b);
        }
        assert_eq!(b.len(), 4 + 4 + 8 + 4 + 4 + 16 + 4);
        assert_eq!(&b[0..4], &1u32.to_le_bytes());
        assert_eq!(&b[4..8], &[0; 4], "the u64 starts at 8");
        assert_eq!(&b[8..16], &0x0203_0405_0607_0809u64.to_le_bytes());
        assert_eq!(&b[16..20], &1.5f32.to_le_bytes());
        assert_eq!(&b[24..32], &7u64.to_le_bytes(), "the struct starts at 24");
        assert_eq!(&b[40..44], &3u32.to_le_bytes());
    }
}
