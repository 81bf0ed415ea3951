//! Attention and indexer launches of the standard path (kernels in
//! `kernels/standard_attention.cu`).
//!
//! The indexer is two launches: `m3s_index_scores` (one CTA per (key block,
//! row), four threads per key) writes the block scores, `m3s_index_topk` (one
//! CTA per (selection head, row)) picks the top-K blocks. Attention is
//! flash-decoding: `m3s_attn_partial` (one CTA per (chunk, KV head, row),
//! all q heads of the KV group share each K/V load; Q K^T and P V on bf16
//! tensor cores) writes per-chunk softmax partials, `m3s_attn_combine` (one
//! CTA per (q head, row)) merges them. Every grid is fixed by capacity, so
//! the launches are graph-capturable.

use super::launch::{Arg, Launcher};
use crate::error::{GpuError, Result};
use crate::runtime::api::{Func, Gpu};

/// Threads of `m3s_index_scores` (SI_THREADS in the kernel: four per key).
const INDEX_SCORES_BLOCK: u32 = 256;
/// Most `m3s_index_scores` CTAs a row by default (each CTA loops over
/// blocks x, x + X, ..), and the fewest the by-rows cap takes
/// ([`index_grid_x`]). The grid is sized by capacity (the longest
/// context's blocks), so at short contexts most CTAs have no block: a
/// larger cap measured faster at 128k and slower at 4k (bench/NOTES.md
/// session 18 run 5), and 4k is the figure of record.
pub(crate) const INDEX_SCORES_GRID_X: u32 = 256;
/// `m3s_index_scores` CTAs a launch the by-rows cap aims at. With the
/// tensor-core body a CTA's block is short work, and at 128k (1025 blocks
/// a row) more CTAs measured faster (session 18 runs 4-5: a MoE layer at
/// 128k -2.1% at 1 row, -4.8% at 4) but the idle CTAs cost at 4k (+1.6%
/// at 1 row, +1.0% at 4); the scalar body measured slower with more
/// (session 7 run 4).
pub(crate) const INDEX_SCORES_CTAS: u32 = 2048;

/// Most `m3s_index_scores` CTAs a row for a step of `t` rows: `fixed` when
/// not 0 ([`super::PathOptions::index_grid_x`], [`INDEX_SCORES_GRID_X`] by
/// default), else by rows: `INDEX_SCORES_CTAS / t`, at least
/// `INDEX_SCORES_GRID_X`.
pub(crate) fn index_grid_x(fixed: usize, t: usize) -> u32 {
    if fixed > 0 {
        return u32::try_from(fixed).unwrap_or(u32::MAX);
    }
    let t = u32::try_from(t.max(1)).unwrap_or(u32::MAX);
    (INDEX_SCORES_CTAS / t).max(INDEX_SCORES_GRID_X)
}
/// Threads of `m3s_index_topk` (SK_THREADS).
const INDEX_TOPK_BLOCK: u32 = 256;
/// Block scores `m3s_index_topk` copies into shared memory (SK_SMEM); past
/// it the radix select reads them from the scratch (tests only: the
/// long-context test's rows reach both sides).
#[cfg(test)]
const INDEX_TOPK_SMEM: usize = 4096;
/// Threads of `m3s_attn_partial` (SA_THREADS: four 32-thread mma groups).
const ATTN_PARTIAL_BLOCK: u32 = 128;
/// Parts `m3s_attn_partial_split` splits a sparse layer's selected block
/// into, one CTA each (tiles of ATTN_TILE / SPARSE_SPLIT keys; the
/// kernel's SA_SPLIT): one CTA a 128-key block left a batch-1 step's 64
/// CTAs each a long serial chain at one warp per scheduler (Nsight Compute,
/// bench/NOTES.md session 7 run 5).
pub(crate) const SPARSE_SPLIT: usize = 4;
/// Steps of at most this many rows take the split kernel (when the path's
/// `small_step_attn_split` is on): measured on m3.1 -10.3% a step at 1
/// row, -3.2% at 4, +0.3% at 8, +1.5% at 16 (bench/NOTES.md session 7
/// runs 6-7: past a few rows the 4x partial records cost more than the
/// shorter chains save).
pub(crate) const SPLIT_MAX_ROWS: usize = 4;
/// Threads of `m3s_attn_combine` (SC_THREADS).
const ATTN_COMBINE_BLOCK: u32 = 128;

/// Index q heads the scores kernel holds in shared memory (SI_MAXH).
pub(super) const MAX_INDEX_HEADS: usize = 8;
/// Largest head dim the `_d128` partials take (one 32-wide output d group
/// a warp of four: standard_attention.cu `sa_partial<.., VG = 1>`).
pub(super) const D128_MAX_HEAD_DIM: usize = 128;
/// Largest head dim / index head dim (SI_MAXD, SA_MAXD): bounds shared memory.
pub(super) const MAX_HEAD_DIM: usize = 256;
/// Most q heads per KV head (SA_MAXHG): one CTA holds all of them.
pub(super) const MAX_GROUP: usize = 16;
/// Most selected blocks (SK_MAXK).
pub(super) const MAX_TOPK: usize = 64;
/// Keys of one attention score tile (SA_TILE); full-layer chunks are whole
/// tiles.
pub(super) const ATTN_TILE: usize = 128;
/// Default cap on full-layer chunks per (row, KV head): past
/// `ATTN_TILE * FULL_CHUNK_CAP` keys (32k) the chunks grow by whole tiles
/// instead of multiplying, which bounds the partials' scratch.
pub(super) const FULL_CHUNK_CAP: usize = 256;
/// Largest grid y / z dimension (rows, KV heads).
const MAX_GRID_YZ: usize = 65_535;
/// Values per NVFP4 cache block (one E4M3 scale byte each): a row's codes
/// are `width / 2` bytes, its scales `width / NVFP4_BLOCK` bytes.
pub(crate) const NVFP4_BLOCK: usize = 16;

/// What a cache buffer holds: the kernels' `cache_kind` / cache-write
/// `kind` argument (`S_CACHE_*` in standard_decode.cu, values held equal by
/// a test). One value for K, V and the index keys of a step (the cache
/// dtype is the runner's, not a layer's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum KvKind {
    /// E4M3 codes, `e4m3 * scale` (S_CACHE_FP8).
    Fp8 = 0,
    /// bf16 bits (S_CACHE_BF16; the scales are 1).
    Bf16 = 1,
    /// NVFP4 (S_CACHE_NVFP4; ARCHITECTURE.md, *NVFP4 KV cache*): packed
    /// E2M1 codes `[slot][width / 2]` in the cache buffer, E4M3 block scales
    /// `[slot][width / 16]` in a second buffer, the per-tensor scale as the
    /// global.
    Nvfp4 = 2,
}

impl KvKind {
    /// The kind of a cache of `dtype`.
    pub(crate) fn of(dtype: m3_core::kv::CacheDtype) -> Self {
        match dtype {
            m3_core::kv::CacheDtype::Bf16 => KvKind::Bf16,
            m3_core::kv::CacheDtype::Fp8E4M3 => KvKind::Fp8,
            m3_core::kv::CacheDtype::Nvfp4 => KvKind::Nvfp4,
        }
    }

    /// The per-tensor scale the kernels take for a tensor whose checkpoint
    /// scale is `scale`: 1 for bf16 (unscaled), else the scale itself (fp8's
    /// divisor, NVFP4's global).
    pub(crate) fn scale(self, scale: f32) -> f32 {
        if self == KvKind::Bf16 {
            1.0
        } else {
            scale
        }
    }
}

/// The block-scale buffer of an NVFP4 cache is given exactly when the cache
/// is NVFP4 (a pointer for another kind is a caller's mix-up, not ignored).
fn check_scales(kind: KvKind, ptrs: &[(u64, &str)]) -> Result<()> {
    for &(p, what) in ptrs {
        match (kind, p) {
            (KvKind::Nvfp4, 0) => {
                return Err(bad(format!(
                    "{what}: an NVFP4 cache needs its block scales"
                )))
            }
            (KvKind::Fp8 | KvKind::Bf16, p) if p != 0 => {
                return Err(bad(format!(
                    "{what} {p:#x} given for a {kind:?} cache (block scales are NVFP4's)"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The kernels of this module. The NVFP4 cache's index-score and partial
/// kernels are entry points of their own (`_nv`), not an arm of the bf16 /
/// fp8 ones: in one kernel they cost the fp8 path registers and time
/// (standard_attention.cu, `S_NV_ONLY`).
pub(crate) struct AttnKernels {
    index_scores: Func,
    index_scores_nv: Func,
    index_topk: Func,
    attn_partial: Func,
    attn_partial_sparse: Func,
    attn_partial_split: Func,
    attn_partial_nv: Func,
    attn_partial_sparse_nv: Func,
    attn_partial_split_nv: Func,
    /// The sparse and split partials for d <= 128 (bf16 / fp8 caches): one
    /// output d group a warp, fewer registers, more CTAs an SM; the same
    /// bits ([`AttnKernels::d128`]).
    attn_partial_sparse_d128: Func,
    attn_partial_split_d128: Func,
    attn_combine: Func,
    /// Whether layers with d <= [`D128_MAX_HEAD_DIM`] take the `_d128`
    /// partials ([`super::PathOptions::attn_d128`]).
    d128: bool,
    /// The head dim the partials and the merge were compiled for
    /// (`SA_MAXD`): a layer's must not exceed it.
    max_head_dim: usize,
}

/// The attention kernels' compile-time settings a timing A/B may set
/// (`M3_ATTN_DEFINES`, [`super::PathOptions::attn_defines`]): `SA_MAXD`
/// (the largest head dim: 64, 128 or 256; the partial's output registers
/// and shared memory scale with it) and the partials' launch bounds
/// `SA_MINB`, `SA_MINB_SPLIT`, `SA_MINB_SPARSE`, `SA_MINB_SPLIT_D128`,
/// `SA_MINB_SPARSE_D128` (CTAs an SM, 1..=8; CUDA launch bounds, which the
/// HIP build does not take).
/// Returns the source to compile and the head dim it holds.
pub(super) fn attn_source(defines: &str) -> Result<(crate::kernels::KernelSource, usize)> {
    let mut maxd = MAX_HEAD_DIM;
    let src = super::linear::prefixed_source(
        &super::STANDARD,
        defines,
        "attention kernel defines",
        |k, n| match k {
            "SA_MAXD" if [64, 128, 256].contains(&n) => {
                maxd = n as usize;
                true
            }
            "SA_MINB"
            | "SA_MINB_SPLIT"
            | "SA_MINB_SPARSE"
            | "SA_MINB_SPLIT_D128"
            | "SA_MINB_SPARSE_D128" => (1..=8).contains(&n),
            _ => false,
        },
    )?;
    Ok((src, maxd))
}

impl AttnKernels {
    /// Load the kernels from the standard path's module, compiled with
    /// `defines` (empty: the module itself; see [`attn_source`]); `d128`:
    /// whether sparse layers with d <= [`D128_MAX_HEAD_DIM`] take the
    /// `_d128` partials.
    pub(super) fn load(gpu: &dyn Gpu, defines: &str, d128: bool) -> Result<Self> {
        let (src, max_head_dim) = attn_source(defines)?;
        let f = |n: &str| gpu.kernel(&src, n);
        Ok(AttnKernels {
            index_scores: f("m3s_index_scores")?,
            index_scores_nv: f("m3s_index_scores_nv")?,
            index_topk: f("m3s_index_topk")?,
            attn_partial: f("m3s_attn_partial")?,
            attn_partial_sparse: f("m3s_attn_partial_sparse")?,
            attn_partial_split: f("m3s_attn_partial_split")?,
            attn_partial_nv: f("m3s_attn_partial_nv")?,
            attn_partial_sparse_nv: f("m3s_attn_partial_sparse_nv")?,
            attn_partial_split_nv: f("m3s_attn_partial_split_nv")?,
            attn_partial_sparse_d128: f("m3s_attn_partial_sparse_d128")?,
            attn_partial_split_d128: f("m3s_attn_partial_split_d128")?,
            attn_combine: f("m3s_attn_combine")?,
            d128,
            max_head_dim,
        })
    }
}

/// Chunks per (row, KV head) the attention scratch must hold: the `topk`
/// selected blocks of a sparse layer, or the full-layer chunks of a
/// `max_context`-position row (one [`ATTN_TILE`]-key chunk each, at most
/// [`FULL_CHUNK_CAP`]; longer rows use longer chunks). Pass the result as
/// [`AttnArgs::max_chunks`] for every layer.
pub(crate) fn attn_max_chunks(max_context: usize, topk: usize) -> usize {
    max_context
        .div_ceil(ATTN_TILE)
        .clamp(1, FULL_CHUNK_CAP)
        .max(topk)
}

/// Bytes of the attention partials: [max_rows][nkv][max_chunks][hg] records
/// of (m, l, 2 pad, o[d]) f32.
pub(crate) fn attn_scratch_bytes(
    max_rows: usize,
    nkv: usize,
    max_chunks: usize,
    hg: usize,
    d: usize,
) -> usize {
    max_rows * nkv * max_chunks * hg * (d + 4) * 4
}

/// Bytes of the indexer block scores: [max_rows][selh][maxnb] f32, selh =
/// `nkv` (per-KV-head selection) or 1 (shared).
pub(crate) fn index_scratch_bytes(max_rows: usize, selh: usize, maxnb: usize) -> usize {
    max_rows * selh.max(1) * maxnb * 4
}

/// Arguments of the indexer launches (device pointers as u64).
#[derive(Clone, Copy, Debug)]
pub(super) struct IndexArgs {
    /// Index queries [t][nih][di] bf16 (16-byte aligned: read in 16-byte
    /// loads).
    pub iq: u64,
    /// Index heads.
    pub nih: usize,
    /// Index head dim (multiple of 32, <= 256).
    pub di: usize,
    /// Index key cache [slot][di]: E4M3 codes, bf16 bits, or NVFP4 codes
    /// [slot][di / 2] (16-byte aligned).
    pub icache: u64,
    /// NVFP4 block scales of the index keys [slot][di / 16] (E4M3 bytes,
    /// 2-byte aligned); 0 for the other kinds.
    pub iscales: u64,
    /// Dequantisation scale of the index key cache (1 for bf16; NVFP4's
    /// global).
    pub iscale: f32,
    /// What the index cache holds.
    pub cache: KvKind,
    /// Positions [t] u32 (the row's last visible key).
    pub pos: u64,
    /// Sequence of each row [t] u32.
    pub row_seq: u64,
    /// Block tables (pages) of all sequences, u32.
    pub bt: u64,
    /// Start of each sequence's block table in `bt`, u32.
    pub bt_off: u64,
    /// Positions per cache page.
    pub page: usize,
    /// Keys per index block (`index_block_size`).
    pub block: usize,
    /// Blocks to select (`index_topk_blocks`, <= 64).
    pub topk: usize,
    /// Forced leading blocks.
    pub init_b: usize,
    /// Forced trailing (local) blocks.
    pub local_b: usize,
    /// Shared selection (max over index heads, one choice for every KV head).
    pub shared: bool,
    /// KV heads.
    pub nkv: usize,
    /// Rows of the step.
    pub t: usize,
    /// Block scores, [`index_scratch_bytes`] for `t` rows.
    pub scratch: u64,
    /// Blocks of the longest context (`max_context / block`, rounded up).
    pub maxnb: usize,
    /// Output selection [nkv][t][topk] i32 (this layer's slice).
    pub sel: u64,
    /// Let the scores load their first key tile before the dependency
    /// wait ([`super::PathOptions::index_prewait`]).
    pub prewait: bool,
    /// Most score CTAs a row ([`index_grid_x`]).
    pub grid_x: u32,
}

/// Arguments of the attention launches (device pointers as u64).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnArgs {
    /// Queries [t][nh][d] bf16 (16-byte aligned: read in 16-byte loads).
    pub q: u64,
    /// Q heads.
    pub nh: usize,
    /// KV heads (divides `nh`, nh/nkv <= 16).
    pub nkv: usize,
    /// Head dim (multiple of 32, <= 256).
    pub d: usize,
    /// K cache [slot][nkv][d]: E4M3 codes, bf16 bits, or NVFP4 codes
    /// [slot][nkv][d / 2] (16-byte aligned).
    pub kc: u64,
    /// V cache, as `kc`.
    pub vc: u64,
    /// NVFP4 block scales of K [slot][nkv][d / 16] (E4M3 bytes); 0 for the
    /// other kinds.
    pub ksc: u64,
    /// NVFP4 block scales of V, as `ksc`.
    pub vsc: u64,
    /// K dequantisation scale (1 for bf16; NVFP4's global).
    pub ks: f32,
    /// V dequantisation scale (1 for bf16; NVFP4's global).
    pub vs: f32,
    /// What the K and V caches hold.
    pub cache: KvKind,
    /// Positions [t] u32.
    pub pos: u64,
    /// Sequence of each row [t] u32.
    pub row_seq: u64,
    /// Block tables, u32.
    pub bt: u64,
    /// Block table offsets, u32.
    pub bt_off: u64,
    /// Positions per cache page.
    pub page: usize,
    /// Selected blocks [nkv][t][topk] i32, or 0 for a full layer.
    pub sel: u64,
    /// Selected blocks per row (sparse layers).
    pub topk: usize,
    /// Keys per index block (sparse layers).
    pub block: usize,
    /// Rows of the step.
    pub t: usize,
    /// Output [t][nh][d] bf16.
    pub out: u64,
    /// The output rows also in the MX linears' f16 layout (rows of
    /// `xh_stride(nh * d)` bytes), or 0: the o projection's input.
    pub xh: u64,
    /// Partials, [`attn_scratch_bytes`] for `t` rows and `max_chunks`.
    pub scratch: u64,
    /// Chunks per (row, KV head) of the scratch ([`attn_max_chunks`]).
    pub max_chunks: usize,
    /// Sparse layers: parts each selected block is split into, one CTA
    /// each (1, or [`SPARSE_SPLIT`] for small steps).
    pub split: usize,
}

fn bad(why: String) -> GpuError {
    GpuError::input("standard attention", why)
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| bad(format!("{what} {v} does not fit in u32")))
}

/// The kernels read these buffers in 16-byte loads.
fn aligned(ptrs: &[(u64, &str)]) -> Result<()> {
    for &(p, what) in ptrs {
        if p % 16 != 0 {
            return Err(bad(format!("{what} pointer {p:#x} is not 16-byte aligned")));
        }
    }
    Ok(())
}

/// Check what the indexer kernels assume.
pub(super) fn check_index(a: &IndexArgs) -> Result<()> {
    if a.t == 0 || a.t > MAX_GRID_YZ {
        return Err(bad(format!("rows {} must be in 1..={MAX_GRID_YZ}", a.t)));
    }
    if a.di == 0 || !a.di.is_multiple_of(32) || a.di > MAX_HEAD_DIM {
        return Err(bad(format!(
            "index head dim {} must be a multiple of 32 up to {MAX_HEAD_DIM}",
            a.di
        )));
    }
    if a.nih == 0 || a.nih > MAX_INDEX_HEADS {
        return Err(bad(format!(
            "index heads {} must be in 1..={MAX_INDEX_HEADS}",
            a.nih
        )));
    }
    if a.nkv == 0 || a.nkv > MAX_GRID_YZ {
        return Err(bad(format!("KV heads {} out of range", a.nkv)));
    }
    if !a.shared && a.nih != a.nkv {
        return Err(bad(format!(
            "per-KV-head selection needs index heads {} == KV heads {}",
            a.nih, a.nkv
        )));
    }
    if a.topk == 0 || a.topk > MAX_TOPK {
        return Err(bad(format!(
            "top-k blocks {} must be in 1..={MAX_TOPK}",
            a.topk
        )));
    }
    if a.block == 0 || a.page == 0 || a.maxnb == 0 {
        return Err(bad(format!(
            "index block {} / page {} / maxnb {} must be positive",
            a.block, a.page, a.maxnb
        )));
    }
    aligned(&[
        (a.iq, "index queries"),
        (a.icache, "index cache"),
        (a.scratch, "scratch"),
    ])?;
    check_scales(a.cache, &[(a.iscales, "index cache block scales")])?;
    if !a.iscales.is_multiple_of(2) {
        return Err(bad(format!(
            "index cache block scales pointer {:#x} is not 2-byte aligned (read in pairs)",
            a.iscales
        )));
    }
    u32_of(a.maxnb, "maxnb")?;
    u32_of(a.init_b, "forced init blocks")?;
    u32_of(a.local_b, "forced local blocks")?;
    u32_of(a.block, "index block")?;
    u32_of(a.page, "page")?;
    Ok(())
}

/// Check what the attention kernels assume.
pub(super) fn check_attn(a: &AttnArgs) -> Result<()> {
    if a.t == 0 || a.t > MAX_GRID_YZ {
        return Err(bad(format!("rows {} must be in 1..={MAX_GRID_YZ}", a.t)));
    }
    if a.nkv == 0 || a.nh == 0 || !a.nh.is_multiple_of(a.nkv) {
        return Err(bad(format!(
            "q heads {} must be a positive multiple of KV heads {}",
            a.nh, a.nkv
        )));
    }
    let hg = a.nh / a.nkv;
    if hg > MAX_GROUP {
        return Err(bad(format!(
            "{hg} q heads per KV head; at most {MAX_GROUP} supported"
        )));
    }
    if a.d == 0 || !a.d.is_multiple_of(32) || a.d > MAX_HEAD_DIM {
        return Err(bad(format!(
            "head dim {} must be a multiple of 32 up to {MAX_HEAD_DIM}",
            a.d
        )));
    }
    if a.page == 0 || a.max_chunks == 0 {
        return Err(bad(format!(
            "page {} / max_chunks {} must be positive",
            a.page, a.max_chunks
        )));
    }
    if a.sel != 0 {
        if a.split != 1 && a.split != SPARSE_SPLIT {
            return Err(bad(format!(
                "split {} must be 1 or {SPARSE_SPLIT}",
                a.split
            )));
        }
        if a.topk == 0 || a.topk > MAX_TOPK || a.topk * a.split > a.max_chunks {
            return Err(bad(format!(
                "top-k blocks {} must be in 1..={MAX_TOPK} and {} x top-k <= max_chunks {}",
                a.topk, a.split, a.max_chunks
            )));
        }
        if a.block == 0 {
            return Err(bad("index block size must be positive".into()));
        }
    }
    aligned(&[
        (a.q, "queries"),
        (a.kc, "K cache"),
        (a.vc, "V cache"),
        (a.scratch, "scratch"),
    ])?;
    check_scales(
        a.cache,
        &[
            (a.ksc, "K cache block scales"),
            (a.vsc, "V cache block scales"),
        ],
    )?;
    u32_of(a.max_chunks, "max_chunks")?;
    u32_of(a.block, "index block")?;
    u32_of(a.page, "page")?;
    Ok(())
}

/// Indexer: block scores then top-K selection into `a.sel`.
pub(super) fn index_select(sp: &Launcher, k: &AttnKernels, a: &IndexArgs) -> Result<()> {
    check_index(a)?;
    let selh = if a.shared { 1 } else { a.nkv };
    let (t, maxnb) = (a.t as u32, a.maxnb as u32);
    let (b, kb) = (a.block as u32, a.topk as u32);
    let sargs = [
        Arg::U64(a.iq),
        Arg::U32(a.nih as u32),
        Arg::U32(a.di as u32),
        Arg::U64(a.icache),
        Arg::U64(a.iscales),
        Arg::F32(a.iscale),
        Arg::U64(a.pos),
        Arg::U64(a.row_seq),
        Arg::U64(a.bt),
        Arg::U64(a.bt_off),
        Arg::U32(a.page as u32),
        Arg::U32(b),
        Arg::U32(kb),
        Arg::U32(a.init_b as u32),
        Arg::U32(a.local_b as u32),
        Arg::U32(a.shared as u32),
        Arg::U32(a.nkv as u32),
        Arg::U64(a.scratch),
        Arg::U32(maxnb),
        Arg::U32(a.cache as u32),
        Arg::U32(a.prewait as u32),
    ];
    // CTAs loop over blocks past the grid: a capacity-sized maxnb launches
    // no more than grid_x CTAs per row
    let gx = maxnb.min(a.grid_x.max(1));
    sp.launch(
        "index_scores",
        if a.cache == KvKind::Nvfp4 {
            &k.index_scores_nv
        } else {
            &k.index_scores
        },
        (gx, t, 1),
        INDEX_SCORES_BLOCK,
        0,
        &sargs,
    )?;
    let targs = [
        Arg::U64(a.scratch),
        Arg::U64(a.pos),
        Arg::U32(b),
        Arg::U32(kb),
        Arg::U32(a.shared as u32),
        Arg::U32(a.nkv as u32),
        Arg::U32(t),
        Arg::U32(maxnb),
        Arg::U64(a.sel),
    ];
    sp.launch(
        "index_topk",
        &k.index_topk,
        (selh as u32, t, 1),
        INDEX_TOPK_BLOCK,
        0,
        &targs,
    )
}

/// Attention: per-chunk partials, then the merge into `a.out`.
pub(crate) fn attention(sp: &Launcher, k: &AttnKernels, a: &AttnArgs) -> Result<()> {
    check_attn(a)?;
    if a.d > k.max_head_dim {
        return Err(bad(format!(
            "head dim {} exceeds the attention kernels' compiled SA_MAXD {} (M3_ATTN_DEFINES)",
            a.d, k.max_head_dim
        )));
    }
    let (t, nh, nkv, d) = (a.t as u32, a.nh as u32, a.nkv as u32, a.d as u32);
    let mc = a.max_chunks as u32;
    // a sparse layer has topk * split chunks per row: no CTAs for the rest
    // of the scratch's capacity (the kernel still indexes records by `mc`)
    let sparse_chunks = (a.topk * a.split) as u32;
    let gx = if a.sel != 0 { sparse_chunks } else { mc };
    sp.launch(
        "attn_partial",
        match (a.sel != 0, a.split, a.cache == KvKind::Nvfp4) {
            (false, _, false) => &k.attn_partial,
            (true, 1, false) if k.d128 && a.d <= D128_MAX_HEAD_DIM => &k.attn_partial_sparse_d128,
            (true, 1, false) => &k.attn_partial_sparse,
            (true, _, false) if k.d128 && a.d <= D128_MAX_HEAD_DIM => &k.attn_partial_split_d128,
            (true, _, false) => &k.attn_partial_split,
            (false, _, true) => &k.attn_partial_nv,
            (true, 1, true) => &k.attn_partial_sparse_nv,
            (true, _, true) => &k.attn_partial_split_nv,
        },
        (gx, nkv, t),
        ATTN_PARTIAL_BLOCK,
        0,
        &[
            Arg::U64(a.q),
            Arg::U32(nh),
            Arg::U32(nkv),
            Arg::U32(d),
            Arg::U64(a.kc),
            Arg::U64(a.vc),
            Arg::U64(a.ksc),
            Arg::U64(a.vsc),
            Arg::F32(a.ks),
            Arg::F32(a.vs),
            Arg::U64(a.pos),
            Arg::U64(a.row_seq),
            Arg::U64(a.bt),
            Arg::U64(a.bt_off),
            Arg::U32(a.page as u32),
            Arg::U64(a.sel),
            Arg::U32(a.topk as u32),
            Arg::U32(a.block as u32),
            Arg::U32(t),
            Arg::U64(a.scratch),
            Arg::U32(mc),
            Arg::U32(a.cache as u32),
        ],
    )?;
    sp.launch(
        "attn_combine",
        &k.attn_combine,
        (nh, t, 1),
        ATTN_COMBINE_BLOCK,
        0,
        &[
            Arg::U64(a.scratch),
            Arg::U32(nh),
            Arg::U32(nkv),
            Arg::U32(d),
            Arg::U64(a.pos),
            Arg::U32((a.sel != 0) as u32),
            Arg::U32(sparse_chunks),
            Arg::U32(mc),
            Arg::U64(a.out),
            Arg::U64(a.xh),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block size here is the kernel's own `#define` (on HIP the
    /// kernels are built for exactly that block: `M3_HIP_BLOCK`), and the
    /// other mirrored limits match too.
    #[test]
    fn constants_match_the_kernels() {
        let body = super::super::STANDARD.body;
        let d = |n: &str| crate::kernels::define(body, n).map(|v| v as usize);
        assert_eq!(d("SI_THREADS"), Some(INDEX_SCORES_BLOCK as usize));
        assert_eq!(d("SK_THREADS"), Some(INDEX_TOPK_BLOCK as usize));
        assert_eq!(d("SA_THREADS"), Some(ATTN_PARTIAL_BLOCK as usize));
        assert_eq!(d("SC_THREADS"), Some(ATTN_COMBINE_BLOCK as usize));
        assert_eq!(d("SI_MAXH"), Some(MAX_INDEX_HEADS));
        assert_eq!(d("SI_MAXD"), Some(MAX_HEAD_DIM));
        assert_eq!(d("SA_MAXD"), Some(MAX_HEAD_DIM));
        assert_eq!(d("SA_MAXHG"), Some(MAX_GROUP));
        assert_eq!(d("SK_MAXK"), Some(MAX_TOPK));
        assert_eq!(d("SK_SMEM"), Some(INDEX_TOPK_SMEM));
        assert_eq!(d("SA_TILE"), Some(ATTN_TILE));
        assert_eq!(d("SA_SPLIT"), Some(SPARSE_SPLIT));
        assert_eq!(d("S_CACHE_FP8"), Some(KvKind::Fp8 as usize));
        assert_eq!(d("S_CACHE_BF16"), Some(KvKind::Bf16 as usize));
        assert_eq!(d("S_CACHE_NVFP4"), Some(KvKind::Nvfp4 as usize));
    }

    /// `M3_ATTN_DEFINES`: the listed names and values become `#define`s
    /// ahead of the module (which then reads them: its own are `#ifndef`
    /// guarded), the head dim bound comes back, anything else is refused
    /// and named.
    #[test]
    fn attn_defines_are_checked_and_prefixed() {
        let (plain, d) = attn_source("").unwrap();
        assert_eq!(
            (plain.body.len(), d),
            (super::super::STANDARD.body.len(), MAX_HEAD_DIM)
        );
        let (src, d) = attn_source("SA_MAXD=128 SA_MINB_SPLIT=8").unwrap();
        assert_eq!(d, 128);
        assert!(src
            .body
            .starts_with("#define SA_MAXD 128\n#define SA_MINB_SPLIT 8\n"));
        // the module's own value yields to the prefix
        for name in [
            "SA_MAXD",
            "SA_MINB",
            "SA_MINB_SPLIT",
            "SA_MINB_SPARSE",
            "SA_MINB_SPLIT_D128",
            "SA_MINB_SPARSE_D128",
        ] {
            assert!(
                super::super::STANDARD
                    .body
                    .contains(&format!("#ifndef {name}\n")),
                "{name} is not #ifndef-guarded"
            );
        }
        for bad in [
            "SA_MAXD=96",
            "SA_MAXD=512",
            "SA_MINB=0",
            "SA_MINB_SPARSE=9",
            "SA_TILE=64",
            "SA_MAXD",
            "SA_MINB=x",
        ] {
            let e = attn_source(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    /// m3.1 at batch 1: 4 KV heads, 16 q heads each, d 128, B 128, K 16.
    fn attn_m31() -> AttnArgs {
        AttnArgs {
            q: 256,
            nh: 64,
            nkv: 4,
            d: 128,
            kc: 256,
            vc: 256,
            ksc: 0,
            vsc: 0,
            ks: 1.0,
            vs: 1.0,
            cache: KvKind::Fp8,
            pos: 256,
            row_seq: 256,
            bt: 256,
            bt_off: 256,
            page: 64,
            sel: 256,
            topk: 16,
            block: 128,
            t: 1,
            out: 256,
            xh: 0,
            scratch: 256,
            max_chunks: attn_max_chunks(131_072, 16),
            split: SPARSE_SPLIT,
        }
    }

    /// The split kernel's key assignment, modelled from its source: over
    /// the SPARSE_SPLIT chunks of a selected block, the tiles of each chunk,
    /// the 4 mma groups, their n-tiles and lanes, every visible key of the
    /// block is scored exactly once and no other key is (block sizes that
    /// do and do not divide by the split, a last block cut by the
    /// position), and each key's score column is inside its tile.
    #[test]
    fn split_chunks_cover_each_visible_key_once() {
        let body = super::super::STANDARD.body;
        // the expressions modelled below, as the kernel has them
        for expr in [
            "const u64 sub = (B + S - 1u) / S, bend = (u64)b * B + B;",
            "j0 = (u64)b * B + (u64)(c % S) * sub;",
            "constexpr u32 tk = SPLIT > 0 ? SA_TILE / (u32)SPLIT : SA_TILE;",
            "constexpr u32 kpg = tk / 4u, nt = kpg / 8u;",
            "const u32 key = kpg * grp + 8u * (u32)n + lg;",
        ] {
            assert!(body.contains(expr), "the kernel no longer has `{expr}`");
        }
        let s = SPARSE_SPLIT as u64;
        let tk = (ATTN_TILE / SPARSE_SPLIT) as u64;
        let (kpg, nt) = (tk / 4, tk / 32);
        for bsz in [16u64, 48, 64, 128, 256] {
            for b in [0u64, 3] {
                for p in [b * bsz, b * bsz + 5, b * bsz + bsz - 1, b * bsz + 3 * bsz] {
                    let mut seen = vec![0u32; bsz as usize];
                    for c in 0..s {
                        let sub = bsz.div_ceil(s);
                        let bend = b * bsz + bsz;
                        let j0 = b * bsz + c * sub;
                        let jend = (j0 + sub).min(bend).min(p + 1);
                        let mut jt = j0;
                        while jt < jend {
                            let nk = (jend - jt).min(tk);
                            for grp in 0..4 {
                                for n in 0..nt {
                                    for lg in 0..8 {
                                        let key = kpg * grp + 8 * n + lg;
                                        assert!(key < tk, "column {key} past the tile");
                                        if key < nk {
                                            let j = jt + key;
                                            assert!(j >= b * bsz && j < bend && j <= p, "key {j}");
                                            seen[(j - b * bsz) as usize] += 1;
                                        }
                                    }
                                }
                            }
                            jt += tk;
                        }
                    }
                    for (o, &k) in seen.iter().enumerate() {
                        let visible = b * bsz + o as u64 <= p;
                        assert_eq!(k, u32::from(visible), "B {bsz} block {b} p {p}: key {o}");
                    }
                }
            }
        }
    }

    #[test]
    fn sparse_split_fits_the_tile() {
        // the kernel's S phase gives each of 4 mma groups whole 8-key
        // n-tiles of a tile of ATTN_TILE / SPARSE_SPLIT keys
        assert!([1, 2, 4].contains(&SPARSE_SPLIT));
        assert_eq!(ATTN_TILE % (32 * SPARSE_SPLIT), 0);
    }

    /// The scores' grid cap by rows: 2048 CTAs a launch, never under 256 a
    /// row; a fixed value wins.
    #[test]
    fn index_grid_by_rows() {
        assert_eq!(index_grid_x(0, 1), 2048);
        assert_eq!(index_grid_x(0, 4), 512);
        assert_eq!(index_grid_x(0, 8), 256);
        assert_eq!(index_grid_x(0, 64), 256);
        assert_eq!(index_grid_x(0, 0), 2048);
        assert_eq!(index_grid_x(1024, 4), 1024);
        assert_eq!(index_grid_x(usize::MAX, 1), u32::MAX);
    }

    fn index_m31() -> IndexArgs {
        IndexArgs {
            iq: 256,
            nih: 4,
            di: 128,
            icache: 256,
            iscales: 0,
            iscale: 1.0,
            cache: KvKind::Fp8,
            pos: 256,
            row_seq: 256,
            bt: 256,
            bt_off: 256,
            page: 64,
            block: 128,
            topk: 16,
            init_b: 0,
            local_b: 1,
            shared: false,
            nkv: 4,
            t: 64,
            scratch: 256,
            maxnb: 1025,
            sel: 256,
            prewait: true,
            grid_x: INDEX_SCORES_GRID_X,
        }
    }

    #[test]
    fn chunking_and_scratch() {
        // short contexts: one tile per chunk, never fewer chunks than top-k
        assert_eq!(attn_max_chunks(1, 16), 16);
        assert_eq!(attn_max_chunks(4096, 16), 32);
        assert_eq!(attn_max_chunks(4096, 64), 64);
        // long contexts: capped
        assert_eq!(attn_max_chunks(131_072, 16), FULL_CHUNK_CAP);
        // m3.1, 64 rows, 256 chunks: 64*4*256*16*132*4 bytes
        assert_eq!(
            attn_scratch_bytes(64, 4, 256, 16, 128),
            64 * 4 * 256 * 16 * 132 * 4
        );
        assert_eq!(index_scratch_bytes(64, 4, 1025), 64 * 4 * 1025 * 4);
        assert_eq!(index_scratch_bytes(2, 0, 3), 2 * 3 * 4);
    }

    #[test]
    fn attn_validation() {
        assert!(check_attn(&attn_m31()).is_ok());
        // tiny preset: 8 heads over 2 KV heads, d 32, B 16, K 4
        let tiny = AttnArgs {
            nh: 8,
            nkv: 2,
            d: 32,
            block: 16,
            topk: 4,
            max_chunks: 4 * SPARSE_SPLIT,
            ..attn_m31()
        };
        assert!(check_attn(&tiny).is_ok());
        assert!(check_attn(&AttnArgs { sel: 0, ..tiny }).is_ok());
        let bad_cases = [
            AttnArgs {
                nh: 68,
                ..attn_m31()
            }, // not a multiple of nkv
            AttnArgs {
                nh: 128,
                ..attn_m31()
            }, // hg 32
            AttnArgs {
                d: 48,
                ..attn_m31()
            }, // not a multiple of 32
            AttnArgs {
                d: 288,
                ..attn_m31()
            }, // too wide
            AttnArgs {
                topk: 65,
                ..attn_m31()
            }, // too many blocks
            AttnArgs {
                topk: 17,
                max_chunks: 16,
                ..attn_m31()
            },
            AttnArgs {
                block: 0,
                ..attn_m31()
            },
            AttnArgs { t: 0, ..attn_m31() },
            AttnArgs {
                nkv: 0,
                ..attn_m31()
            },
            AttnArgs {
                max_chunks: 0,
                ..attn_m31()
            },
            AttnArgs {
                q: 258,
                ..attn_m31()
            }, // q not 16-byte aligned
            AttnArgs {
                scratch: 264,
                ..attn_m31()
            },
        ];
        for (i, a) in bad_cases.iter().enumerate() {
            assert!(check_attn(a).is_err(), "case {i} accepted");
        }
        // NVFP4: both block-scale buffers, and only for NVFP4
        let nv = AttnArgs {
            cache: KvKind::Nvfp4,
            ksc: 4096,
            vsc: 8192,
            ks: 0.25,
            vs: 0.375,
            ..attn_m31()
        };
        assert!(check_attn(&nv).is_ok());
        assert!(check_attn(&AttnArgs { sel: 0, ..nv }).is_ok());
        for (i, (a, what)) in [
            (AttnArgs { ksc: 0, ..nv }, "K cache block scales"),
            (AttnArgs { vsc: 0, ..nv }, "V cache block scales"),
            (
                AttnArgs {
                    cache: KvKind::Fp8,
                    ..nv
                },
                "given for a Fp8 cache",
            ),
            (
                AttnArgs {
                    cache: KvKind::Bf16,
                    ksc: 0,
                    ..nv
                },
                "V cache block scales",
            ),
        ]
        .iter()
        .enumerate()
        {
            let e = check_attn(a).err().map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(|e| e.contains(what)),
                "nvfp4 case {i}: {e:?}"
            );
        }
        // full layers ignore top-k and block
        assert!(check_attn(&AttnArgs {
            sel: 0,
            topk: 0,
            block: 0,
            ..attn_m31()
        })
        .is_ok());
    }

    #[test]
    fn index_validation() {
        assert!(check_index(&index_m31()).is_ok());
        assert!(check_index(&IndexArgs {
            shared: true,
            nih: 2,
            ..index_m31()
        })
        .is_ok());
        let bad_cases = [
            IndexArgs {
                nih: 2,
                ..index_m31()
            }, // per-KV-head needs nih == nkv
            IndexArgs {
                nih: 9,
                nkv: 9,
                ..index_m31()
            },
            IndexArgs {
                di: 96 + 1,
                ..index_m31()
            },
            IndexArgs {
                di: 512,
                ..index_m31()
            },
            IndexArgs {
                topk: 0,
                ..index_m31()
            },
            IndexArgs {
                topk: 65,
                ..index_m31()
            },
            IndexArgs {
                block: 0,
                ..index_m31()
            },
            IndexArgs {
                maxnb: 0,
                ..index_m31()
            },
            IndexArgs {
                t: 70_000,
                ..index_m31()
            },
            IndexArgs {
                iq: 264,
                ..index_m31()
            }, // not 16-byte aligned
        ];
        for (i, a) in bad_cases.iter().enumerate() {
            assert!(check_index(a).is_err(), "case {i} accepted");
        }
        // NVFP4: the index keys' block scales, 2-byte aligned, only for NVFP4
        let nv = IndexArgs {
            cache: KvKind::Nvfp4,
            iscales: 4096,
            iscale: 1.5,
            ..index_m31()
        };
        assert!(check_index(&nv).is_ok());
        for (i, (a, what)) in [
            (IndexArgs { iscales: 0, ..nv }, "needs its block scales"),
            (
                IndexArgs {
                    iscales: 4097,
                    ..nv
                },
                "2-byte aligned",
            ),
            (
                IndexArgs {
                    cache: KvKind::Bf16,
                    ..nv
                },
                "given for a Bf16 cache",
            ),
        ]
        .iter()
        .enumerate()
        {
            let e = check_index(a).err().map(|e| e.to_string());
            assert!(
                e.as_deref().is_some_and(|e| e.contains(what)),
                "nvfp4 case {i}: {e:?}"
            );
        }
    }

    #[test]
    fn kv_kinds_and_scales() {
        use m3_core::kv::CacheDtype;
        assert_eq!(KvKind::of(CacheDtype::Bf16), KvKind::Bf16);
        assert_eq!(KvKind::of(CacheDtype::Fp8E4M3), KvKind::Fp8);
        assert_eq!(KvKind::of(CacheDtype::Nvfp4), KvKind::Nvfp4);
        assert_eq!(KvKind::Bf16.scale(0.25), 1.0);
        assert_eq!(KvKind::Fp8.scale(0.25), 0.25);
        assert_eq!(KvKind::Nvfp4.scale(0.375), 0.375);
    }
}

/// The standard path's indexer (`m3s_index_scores`, `m3s_index_topk`)
/// against an f64 reference at contexts past the top-k kernel's one-pass
/// limit (SK_THREADS blocks a row) and past its shared-memory limit
/// (SK_SMEM), with score CTAs looping over many blocks: the figures of
/// record run at 128k (1025 blocks a row), which the runner tests (short
/// contexts) never reach. The harness backend's ops use other kernels.
#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::model::DevBuf;
    use m3_core::formats::{bf16, fp8::e4m3};

    use super::super::test_gpu as gpu;

    use super::super::TestRng;

    /// One indexer configuration and its rows (position, sequence).
    struct Case {
        name: &'static str,
        cache: KvKind,
        di: usize,
        nih: usize,
        nkv: usize,
        shared: bool,
        block: usize,
        page: usize,
        topk: usize,
        init_b: usize,
        local_b: usize,
        grid_x: u32,
        prewait: bool,
        rows: Vec<(u32, u32)>,
    }

    /// What a case's launches produced and what they should have.
    struct Outcome {
        nb: Vec<usize>,
        selh: usize,
        maxnb: usize,
        /// GPU block scores [t][selh][maxnb].
        scores: Vec<f32>,
        /// f64 reference scores (same layout; +inf forced) and each block's
        /// sum of |products| (the tolerance's scale).
        want: Vec<f64>,
        mag: Vec<f64>,
        /// GPU selections [nkv][t][K].
        sel: Vec<i32>,
    }

    /// The K best of `s` (score desc, id asc, NaN never, -0 == +0),
    /// ascending, -1 first for picks short of K; every block if nb <= K
    /// (ids then -1), as MODEL.md 6 and the kernel state.
    fn topk_of(s: &[f64], k: usize) -> Vec<i32> {
        let nb = s.len();
        if nb <= k {
            return (0..k).map(|i| if i < nb { i as i32 } else { -1 }).collect();
        }
        let mut c: Vec<(f64, usize)> = s
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(b, &v)| (v, b))
            .collect();
        c.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
        let mut picks: Vec<i32> = c.iter().take(k).map(|x| x.1 as i32).collect();
        picks.sort_unstable();
        let mut out = vec![-1; k - picks.len()];
        out.extend(picks);
        out
    }

    fn run(gpu: &dyn Gpu, c: &Case, seed: u64) -> Outcome {
        let ctx = gpu.device();
        let l = Launcher::new(ctx, true).unwrap();
        let k = AttnKernels::load(gpu, "", false).unwrap();
        let mut rng = TestRng(seed);
        let (t, di, b) = (c.rows.len(), c.di, c.block);
        let vb = if c.cache == KvKind::Bf16 { 2 } else { 1 };
        let iscale = if c.cache == KvKind::Fp8 { 0.5f32 } else { 1.0 };
        // sequences: length past their last row, pages dealt in a shuffled order
        let nseq = c.rows.iter().map(|r| r.1 as usize).max().unwrap() + 1;
        let len: Vec<usize> = (0..nseq)
            .map(|s| {
                c.rows
                    .iter()
                    .filter(|r| r.1 as usize == s)
                    .map(|r| r.0 as usize + 1)
                    .max()
                    .unwrap_or(1)
            })
            .collect();
        let npages: Vec<usize> = len.iter().map(|n| n.div_ceil(c.page)).collect();
        let total: usize = npages.iter().sum();
        let mut perm: Vec<u32> = (0..total as u32).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.next_u32() as usize % (i + 1));
        }
        let mut bt_off = Vec::new();
        let mut off = 0u32;
        for &n in &npages {
            bt_off.push(off);
            off += n as u32;
        }
        let slot = |s: usize, j: usize| {
            perm[bt_off[s] as usize + j / c.page] as usize * c.page + j % c.page
        };
        // queries (bf16) and keys: random, plus per sequence 20 copies of a
        // key aligned with row 0's head 0 (exact ties at the top, more than
        // K of them: the lower ids must win) and one NaN key (never wins)
        let q: Vec<u16> = (0..t * c.nih * di)
            .map(|_| bf16::from_f32(rng.unit() * 2.0))
            .collect();
        let mut cache = vec![0u8; total * c.page * di * vb];
        let put = |sl: usize, d: usize, v: f32, cache: &mut [u8]| {
            let o = (sl * di + d) * vb;
            if vb == 2 {
                cache[o..o + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes());
            } else {
                cache[o] = e4m3::encode_sat(f64::from(v));
            }
        };
        for (s, &n) in len.iter().enumerate() {
            for j in 0..n {
                for d in 0..di {
                    put(slot(s, j), d, rng.unit() * 3.0, &mut cache);
                }
            }
        }
        for (ri, &(p, s)) in c.rows.iter().enumerate() {
            let s = s as usize;
            if c.rows.iter().position(|r| r.1 as usize == s) != Some(ri) {
                continue; // the sequence's first row sets its planted keys
            }
            let nb = p as usize / b + 1;
            let first = nb / 3;
            for cp in 0..20usize {
                let j = (first + cp) * b + (cp % b);
                if j > p as usize {
                    break;
                }
                for d in 0..di {
                    let qv = bf16::to_f32(q[(ri * c.nih) * di + d]);
                    put(slot(s, j), d, if qv < 0.0 { -4.0 } else { 4.0 }, &mut cache);
                }
            }
            let j = 7 * b + 3;
            if j <= p as usize {
                let o = slot(s, j) * di * vb;
                if vb == 2 {
                    cache[o..o + 2].copy_from_slice(&0x7fc0u16.to_le_bytes());
                } else {
                    cache[o] = e4m3::NAN;
                }
            }
        }
        let pos: Vec<u32> = c.rows.iter().map(|r| r.0).collect();
        let row_seq: Vec<u32> = c.rows.iter().map(|r| r.1).collect();
        let nb: Vec<usize> = pos.iter().map(|&p| p as usize / b + 1).collect();
        let maxnb = nb.iter().max().unwrap() + 3;
        let selh = if c.shared { 1 } else { c.nkv };
        let qd = DevBuf::from_slice(ctx, &q).unwrap();
        let cd = DevBuf::from_slice(ctx, &cache).unwrap();
        let pd = DevBuf::from_slice(ctx, &pos).unwrap();
        let rd = DevBuf::from_slice(ctx, &row_seq).unwrap();
        let btd = DevBuf::from_slice(ctx, &perm).unwrap();
        let bod = DevBuf::from_slice(ctx, &bt_off).unwrap();
        let sd = DevBuf::zeroed(ctx, index_scratch_bytes(t, selh, maxnb)).unwrap();
        let seld = DevBuf::zeroed(ctx, c.nkv * t * c.topk * 4).unwrap();
        index_select(
            &l,
            &k,
            &IndexArgs {
                iq: qd.ptr(),
                nih: c.nih,
                di,
                icache: cd.ptr(),
                iscales: 0,
                iscale,
                cache: c.cache,
                pos: pd.ptr(),
                row_seq: rd.ptr(),
                bt: btd.ptr(),
                bt_off: bod.ptr(),
                page: c.page,
                block: b,
                topk: c.topk,
                init_b: c.init_b,
                local_b: c.local_b,
                shared: c.shared,
                nkv: c.nkv,
                t,
                scratch: sd.ptr(),
                maxnb,
                sel: seld.ptr(),
                prewait: c.prewait,
                grid_x: c.grid_x,
            },
        )
        .unwrap();
        let mut scores = vec![0f32; t * selh * maxnb];
        sd.read(l.stream(), 0, &mut scores).unwrap();
        let mut sel = vec![0i32; c.nkv * t * c.topk];
        seld.read(l.stream(), 0, &mut sel).unwrap();
        // the f64 reference: max over visible keys (and heads, shared) of
        // q . e4m3(k) * iscale, NaN dots skipped; forced blocks +inf
        let key = |sl: usize, d: usize| -> f64 {
            let o = (sl * di + d) * vb;
            if vb == 2 {
                f64::from(bf16::to_f32(u16::from_le_bytes([cache[o], cache[o + 1]])))
            } else {
                f64::from(e4m3::decode(cache[o]))
            }
        };
        let mut want = vec![f64::NAN; t * selh * maxnb];
        let mut mag = vec![0f64; t * selh * maxnb];
        for (ti, &(p, s)) in c.rows.iter().enumerate() {
            let (p, s, n) = (p as usize, s as usize, nb[ti]);
            if n <= c.topk {
                continue; // nothing scored: every block is taken
            }
            for g in 0..selh {
                let heads = if c.shared { 0..c.nih } else { g..g + 1 };
                for bi in 0..n {
                    let o = (ti * selh + g) * maxnb + bi;
                    if bi < c.init_b || bi + c.local_b >= n {
                        want[o] = f64::INFINITY;
                        continue;
                    }
                    let (mut m, mut a) = (f64::NEG_INFINITY, 0f64);
                    for h in heads.clone() {
                        for j in bi * b..=(bi * b + b - 1).min(p) {
                            let (mut dot, mut abs) = (0f64, 0f64);
                            for d in 0..di {
                                let x = f64::from(bf16::to_f32(q[(ti * c.nih + h) * di + d]))
                                    * key(slot(s, j), d)
                                    * f64::from(iscale);
                                dot += x;
                                abs += x.abs();
                            }
                            if !dot.is_nan() {
                                m = m.max(dot);
                                a = a.max(abs);
                            }
                        }
                    }
                    want[o] = m;
                    mag[o] = a;
                }
            }
        }
        Outcome {
            nb,
            selh,
            maxnb,
            scores,
            want,
            mag,
            sel,
        }
    }

    /// Scores off the f64 reference (f32 sums of exact products: 1e-5 of
    /// the block's sum of |products|), and selections other than the top-K
    /// of the GPU's own scores (exact; the top-k only reads the scores);
    /// each failure as a line.
    fn check(c: &Case, o: &Outcome) -> Vec<String> {
        let mut bad = Vec::new();
        let t = c.rows.len();
        for ti in 0..t {
            let n = o.nb[ti];
            for g in 0..o.selh {
                let base = (ti * o.selh + g) * o.maxnb;
                if n > c.topk {
                    for bi in 0..n {
                        let (gv, w) = (o.scores[base + bi], o.want[base + bi]);
                        let ok = if w.is_infinite() {
                            f64::from(gv) == w
                        } else {
                            (f64::from(gv) - w).abs() <= 1e-5 * o.mag[base + bi] + 1e-30
                        };
                        if !ok {
                            bad.push(format!(
                                "{}: row {ti} head {g} block {bi}: score {gv} want {w}",
                                c.name
                            ));
                        }
                    }
                }
                let own: Vec<f64> = o.scores[base..base + n]
                    .iter()
                    .map(|&v| f64::from(v))
                    .collect();
                let want = topk_of(&own, c.topk);
                let heads = if c.shared { 0..c.nkv } else { g..g + 1 };
                for h in heads {
                    let s = (h * t + ti) * c.topk;
                    if o.sel[s..s + c.topk] != want[..] {
                        bad.push(format!(
                            "{}: row {ti} KV head {h}: selected {:?}, the top-{} of the scores {:?}",
                            c.name,
                            &o.sel[s..s + c.topk],
                            c.topk,
                            want
                        ));
                    }
                }
            }
        }
        bad
    }

    #[test]
    fn long_context_indexer_matches_an_f64_reference() {
        // the presets' shape (m3.1: blocks and pages of 128, top-16, the
        // local block forced, fp8 keys of 128, 256 score CTAs a row)
        let m31 = |name, rows| Case {
            name,
            cache: KvKind::Fp8,
            di: 128,
            nih: 2,
            nkv: 2,
            shared: false,
            block: 128,
            page: 128,
            topk: 16,
            init_b: 0,
            local_b: 1,
            grid_x: INDEX_SCORES_GRID_X,
            prewait: true,
            rows,
        };
        let cases = [
            // one-pass top-k (41 blocks), the radix select from shared
            // memory (300) and from the scratch past SK_SMEM (5001)
            Case {
                block: 16,
                page: 64,
                ..m31(
                    "fp8 di 128 per-KV-head",
                    vec![(16 * 300 - 5, 0), (16 * 5000 + 3, 1), (16 * 40, 2)],
                )
            },
            // shared selection, pages smaller than a block, a scored last
            // (partial) block, two rows of one sequence, few CTAs a row
            Case {
                di: 64,
                nih: 4,
                shared: true,
                block: 16,
                page: 8,
                init_b: 1,
                local_b: 0,
                grid_x: 5,
                prewait: false,
                ..m31(
                    "fp8 di 64 shared",
                    vec![(16 * 1100 + 9, 0), (16 * 4200 - 1, 0), (16 * 700 + 15, 1)],
                )
            },
            // 128k: 1025 blocks a row
            Case {
                cache: KvKind::Bf16,
                nih: 1,
                nkv: 1,
                ..m31("bf16 di 128 128k", vec![(128 * 1025 - 1, 0)])
            },
            m31(
                "fp8 di 128 128k",
                vec![(128 * 1025 - 1, 0), (128 * 1025 - 1, 1)],
            ),
        ];
        // the cases reach every top-k path: one pass, the radix select on
        // shared memory, on the scratch past SK_SMEM
        let nbs: Vec<usize> = cases
            .iter()
            .flat_map(|c| c.rows.iter().map(|r| r.0 as usize / c.block + 1))
            .collect();
        let top = INDEX_TOPK_BLOCK as usize;
        assert!(nbs.iter().any(|&n| n <= top));
        assert!(nbs.iter().any(|&n| n > top && n <= INDEX_TOPK_SMEM));
        assert!(nbs.iter().any(|&n| n > INDEX_TOPK_SMEM));
        let Some(gpu) = gpu() else { return };
        let mut failures = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let o = run(&gpu, c, 17 + i as u64);
            let bad = check(c, &o);
            let n0 = bad.len();
            println!("{}: blocks a row {:?}, {n0} failure(s)", c.name, o.nb);
            failures.extend(bad.into_iter().take(8));
            // the comparison catches a planted error (first case): a score
            // off by 1e-3 of its scale, a selection swapped for another block
            if i == 0 {
                let mut p = o;
                let s = (0..p.nb[0])
                    .find(|&bi| p.want[bi].is_finite() && p.mag[bi] > 0.0)
                    .unwrap();
                let kept = p.scores[s];
                p.scores[s] += (1e-3 * p.mag[s]) as f32;
                let b = check(c, &p);
                assert!(
                    b.len() > n0 && b.iter().any(|f| f.contains(" want ")),
                    "a planted score error went unseen"
                );
                p.scores[s] = kept;
                let first = p.sel[0..c.topk].iter().position(|&x| x >= 0).unwrap();
                p.sel[first] = if p.sel[first] == 1 { 2 } else { 1 };
                let b = check(c, &p);
                assert!(
                    b.len() == n0 + 1 && b.iter().any(|f| f.contains("selected")),
                    "a planted selection error went unseen"
                );
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
