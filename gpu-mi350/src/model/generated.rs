//! The bench model (PERF.md "Bench model") generated on the device from a
//! seed: every code and scale is a counter hash of (seed, tensor id, index),
//! so no checkpoint is read and nothing crosses PCIe.
//!
//! Formats: routed experts MXFP4, attention / indexer / dense MLP / shared
//! expert MXFP8 (E4M3), router f32, embeddings and LM head bf16
//! ([`BenchWeights::Mx`]); the same with NVFP4 routed experts
//! ([`BenchWeights::Nvfp4`]); or everything bf16 but the f32 router
//! ([`BenchWeights::Bf16`]).
//!
//! Scales keep activations finite and O(1): MXFP8 codes have |v| in
//! [0.5, 1.875] (exponent field 6 or 7), FP4 codes are uniform over all 16
//! (rms ~2.9), bf16 values have |v| in [1, 4) times a power of two; each
//! matrix's E8M0 scale (or bf16 exponent) is 2^-round(log2(rms * sqrt(in))),
//! so a row's dot product with an O(1) input is O(1).

use std::sync::Arc;

use m3_core::config::{AttnKind, MlpKind, ModelConfig};

use super::devmem::DevBuf;
use super::weights::{DevFfn, DevIndexer, DevLayer, DevLinear, DevMlp, DevModel, DevNorm, WFmt};
use crate::error::{GpuError, Result};
use crate::runtime::api::{Device, Func, Gpu};
use crate::standard::launch::{Arg, Launcher};
use crate::standard::GEN;

/// Which weight variant to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchWeights {
    /// PERF.md's formats (MXFP4 experts, MXFP8 rest, bf16 embeddings/head).
    Mx,
    /// bf16 everywhere (f32 router): the like-for-like peer variant.
    Bf16,
    /// As [`BenchWeights::Mx`] with NVFP4 routed experts (E4M3 scale per
    /// 16, an f32 global per matrix): the NVFP4 release served natively.
    Nvfp4,
}

/// Launcher of the generation kernels on a private stream (its own
/// [`Launcher`], without programmatic dependent launch: the generation
/// kernels do not wait on `M3_PDL_WAIT`).
pub struct Gen {
    l: Launcher,
    bytes: Func,
    bf16: Func,
    f32: Func,
    grid: u32,
}

/// Threads of a generation block.
const GEN_BLOCK: u32 = 256;

impl Gen {
    pub fn new(gpu: &dyn Gpu) -> Result<Self> {
        Ok(Gen {
            l: Launcher::new(gpu.device(), false)?,
            bytes: gpu.kernel(&GEN, "m3s_gen_bytes")?,
            bf16: gpu.kernel(&GEN, "m3s_gen_bf16")?,
            f32: gpu.kernel(&GEN, "m3s_gen_f32")?,
            grid: gpu.multiprocessors() * 8,
        })
    }

    /// One grid-stride launch of `f` (writes within the buffer the
    /// arguments name).
    fn run(&self, label: &'static str, f: &Func, args: &[Arg]) -> Result<()> {
        self.l
            .launch(label, f, (self.grid, 1, 1), GEN_BLOCK, 0, args)
    }

    /// Every byte of `b`: `(hash & mask) | orv`.
    pub fn bytes(&self, b: &DevBuf, seed: u64, tid: u32, mask: u32, orv: u32) -> Result<()> {
        let (p, n) = (b.ptr(), b.bytes() as u64);
        self.run(
            "m3s_gen_bytes",
            &self.bytes,
            &[
                Arg::U64(p),
                Arg::U64(n),
                Arg::U64(seed),
                Arg::U32(tid),
                Arg::U32(mask),
                Arg::U32(orv),
            ],
        )
    }

    /// bf16 values of exponent field `e` or `e + 1`, random sign/mantissa.
    pub fn bf16(&self, b: &DevBuf, seed: u64, tid: u32, e: u32) -> Result<()> {
        let (p, n) = (b.ptr(), (b.bytes() / 2) as u64);
        self.run(
            "m3s_gen_bf16",
            &self.bf16,
            &[
                Arg::U64(p),
                Arg::U64(n),
                Arg::U64(seed),
                Arg::U32(tid),
                Arg::U32(e),
            ],
        )
    }

    /// f32 uniform in [-amp, amp).
    pub fn f32(&self, b: &DevBuf, seed: u64, tid: u32, amp: f32) -> Result<()> {
        let (p, n) = (b.ptr(), (b.bytes() / 4) as u64);
        self.run(
            "m3s_gen_f32",
            &self.f32,
            &[
                Arg::U64(p),
                Arg::U64(n),
                Arg::U64(seed),
                Arg::U32(tid),
                Arg::F32(amp),
            ],
        )
    }

    pub fn sync(&self) -> Result<()> {
        self.l.sync()
    }

    /// The f32 values of `b` on the host (waits for the generation so far).
    pub fn read_f32(&self, b: &DevBuf) -> Result<Vec<f32>> {
        let mut v = vec![0.0f32; b.bytes() / 4];
        b.read(self.l.stream(), 0, &mut v)?;
        Ok(v)
    }

    pub fn context(&self) -> &Device {
        self.l.device()
    }
}

/// log2 of the rms of one stored code (before its scale).
fn code_log2_rms(fmt: WFmt) -> f64 {
    match fmt {
        WFmt::Mxfp4 | WFmt::Nvfp4 => 2.93f64.log2(),
        WFmt::Mxfp8E4M3 | WFmt::Mxfp8E5M2 | WFmt::Ptpc => 1.2f64.log2(),
        WFmt::Bf16 => 2.3f64.log2(),
        WFmt::F32 => 0.0,
    }
}

/// One generated matrix stack.
fn gen_linear(
    g: &Gen,
    fmt: WFmt,
    rows: usize,
    cols: usize,
    count: usize,
    seed: u64,
    tid: &mut u32,
) -> Result<DevLinear> {
    let w = DevLinear::alloc(g.context(), fmt, rows, cols, count)?;
    *tid += 1;
    // 2^-s with s = round(log2(rms * sqrt(cols)))
    let s = (code_log2_rms(fmt) + 0.5 * (cols as f64).log2()).round() as i32;
    match fmt {
        WFmt::Mxfp4 => g.bytes(&w.codes, seed, *tid, 0xff, 0)?,
        WFmt::Mxfp8E4M3 | WFmt::Ptpc => g.bytes(&w.codes, seed, *tid, 0x8f, 0x30)?,
        WFmt::Bf16 => g.bf16(&w.codes, seed, *tid, (127 - s).max(2) as u32)?,
        WFmt::F32 => g.f32(&w.codes, seed, *tid, 1.7 / (cols as f32).sqrt())?,
        // E2M1 codes as MXFP4's; the magnitude in the global (below)
        WFmt::Nvfp4 => g.bytes(&w.codes, seed, *tid, 0xff, 0)?,
        WFmt::Mxfp8E5M2 => {
            return Err(GpuError::input(
                "bench model",
                format!("{fmt:?} weights are not generated (mxfp4, nvfp4 or bf16 bench models)"),
            ))
        }
    }
    match (&w.scales, &w.chan) {
        // PTPC: unit block scales, the magnitude in the row scales
        (Some(sc), Some(ch)) => {
            g.bytes(sc, seed, *tid, 0, 127)?;
            g.f32(ch, seed, *tid + 1, 2f32.powi(-s))?;
            *tid += 1;
        }
        // NVFP4: E4M3 block scales in [1, 1.875] (exponent field 7), the
        // matrix's global 2^-s
        (Some(sc), None) if fmt == WFmt::Nvfp4 => {
            g.bytes(sc, seed, *tid, 0x07, 0x38)?;
            if let Some(gl) = &w.globals {
                let v = vec![2f32.powi(-s); count];
                gl.write_sync(0, bytemuck::cast_slice(&v))?;
            }
        }
        (Some(sc), None) => g.bytes(sc, seed, *tid, 0, (127 - s).clamp(1, 254) as u32)?,
        _ => {}
    }
    Ok(w)
}

/// Generate the bench model for `c` on the device.
/// How the bench model's shared experts are generated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SharedGen {
    /// In the dense format, on their own (PERF.md's model).
    #[default]
    Dense,
    /// In the routed experts' format, on their own (the like-for-like
    /// reference of `Folded`).
    ExpertFormat,
    /// In the experts' format as the last matrix of the expert stacks (as
    /// `DevModel::load` folds them, `--fold-shared-expert`).
    Folded,
}

///
/// With `ptpc`, the linears `--online-quant ptpc_fp8` converts by default
/// (attention q / k / v / o, the indexer's q / k, the dense MLP) are
/// generated in PTPC FP8 form, as a load with that option holds them.
pub fn generate(
    gpu: &dyn Gpu,
    c: &ModelConfig,
    kind: BenchWeights,
    seed: u64,
    shared: SharedGen,
    ptpc: bool,
) -> Result<DevModel> {
    let g = Gen::new(gpu)?;
    let ctx = g.context().clone();
    let (ef, df) = match kind {
        BenchWeights::Mx => (WFmt::Mxfp4, WFmt::Mxfp8E4M3),
        BenchWeights::Nvfp4 => (WFmt::Nvfp4, WFmt::Mxfp8E4M3),
        BenchWeights::Bf16 => (WFmt::Bf16, WFmt::Bf16),
    };
    // online quantization's targets
    let af = if ptpc { WFmt::Ptpc } else { df };
    let h = c.hidden_size;
    let mut tid = 0u32;
    let norm = |n: usize, tid: &mut u32| -> Result<DevBuf> {
        let b = DevBuf::new(&ctx, n * 4)?;
        *tid += 1;
        g.f32(&b, seed, *tid, 0.2)?;
        Ok(b)
    };
    // an RMSNorm weight: generated, then read back for its bound
    let rms = |n: usize, tid: &mut u32| -> Result<DevNorm> {
        let b = norm(n, tid)?;
        let w = g.read_f32(&b)?;
        Ok(DevNorm::resident(b, &w))
    };
    let mlp = |fmt: WFmt, width: usize, count: usize, tid: &mut u32| -> Result<DevMlp> {
        Ok(DevMlp {
            gate: gen_linear(&g, fmt, width, h, count, seed, tid)?,
            up: gen_linear(&g, fmt, width, h, count, seed, tid)?,
            down: gen_linear(&g, fmt, h, width, count, seed, tid)?,
        })
    };
    let embed = DevBuf::new(&ctx, c.vocab_size * h * 2)?;
    tid += 1;
    g.bf16(&embed, seed, tid, 126)?;
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let (nh, nkv, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let sparse = c.attn_kinds.get(l) == Some(&AttnKind::Sparse);
        let indexer = if sparse {
            Some(DevIndexer {
                q: gen_linear(
                    &g,
                    af,
                    c.index_n_heads * c.index_head_dim,
                    h,
                    1,
                    seed,
                    &mut tid,
                )?,
                k: gen_linear(&g, af, c.index_head_dim, h, 1, seed, &mut tid)?,
                q_norm: norm(c.index_head_dim, &mut tid)?,
                k_norm: norm(c.index_head_dim, &mut tid)?,
                k_scale: 1.0,
            })
        } else {
            None
        };
        let ffn = if c.mlp_kinds.get(l) == Some(&MlpKind::Dense) {
            DevFfn::Dense(mlp(af, c.dense_intermediate_size, 1, &mut tid)?)
        } else {
            let ne = c.num_local_experts;
            let bias = DevBuf::new(&ctx, ne * 4)?;
            tid += 1;
            g.f32(&bias, seed, tid, 0.05)?;
            let fold = shared == SharedGen::Folded
                && c.shared_intermediate_size > 0
                && c.shared_intermediate_size == c.intermediate_size;
            let sf = if shared == SharedGen::Dense { df } else { ef };
            DevFfn::Moe {
                router: gen_linear(&g, WFmt::F32, ne, h, 1, seed, &mut tid)?,
                bias,
                experts: mlp(ef, c.intermediate_size, ne + usize::from(fold), &mut tid)?,
                shared: if c.shared_intermediate_size > 0 && !fold {
                    Some(mlp(sf, c.shared_intermediate_size, 1, &mut tid)?)
                } else {
                    None
                },
                folded: fold,
            }
        };
        layers.push(DevLayer {
            input_norm: rms(h, &mut tid)?,
            post_norm: rms(h, &mut tid)?,
            q: gen_linear(&g, af, nh * d, h, 1, seed, &mut tid)?,
            k: gen_linear(&g, af, nkv * d, h, 1, seed, &mut tid)?,
            v: gen_linear(&g, af, nkv * d, h, 1, seed, &mut tid)?,
            o: gen_linear(&g, af, h, nh * d, 1, seed, &mut tid)?,
            q_norm: norm(d, &mut tid)?,
            k_norm: norm(d, &mut tid)?,
            indexer,
            k_scale: 1.0,
            v_scale: 1.0,
            ffn,
        });
    }
    let final_norm = rms(h, &mut tid)?;
    let lm_head = gen_linear(&g, WFmt::Bf16, c.vocab_size, h, 1, seed, &mut tid)?;
    g.sync()?;
    Ok(DevModel {
        config: c.clone(),
        embed: Arc::new(embed),
        layers,
        final_norm,
        lm_head: Arc::new(lm_head),
    })
}

/// The bytes a step must move (PERF.md's floor): every weight tensor the
/// step touches once (routed experts: the distinct experts chosen), the
/// embedding rows, and the cache bytes attention and the indexer read,
/// counted per sequence as the union over its rows (a verify step's rows
/// share one cache): index keys of every visible position, and K + V of the
/// selected blocks (sparse layers) or of every visible position (full),
/// at `cache`'s bytes a row (`CacheDtype::row_bytes`: NVFP4's codes and
/// block scales). `experts` / `blocks` come from
/// [`crate::standard::StandardPath::experts_chosen`] /
/// [`crate::standard::StandardPath::blocks_selected`].
pub fn step_bytes(
    m: &DevModel,
    positions: &[u32],
    row_seq: &[u32],
    logits_rows: usize,
    experts: &[Vec<i32>],
    blocks: &[Vec<i32>],
    cache: m3_core::kv::CacheDtype,
) -> u64 {
    use std::collections::{BTreeMap, BTreeSet};
    let c = &m.config;
    let t = positions.len();
    let (h, d, nkv) = (c.hidden_size, c.head_dim, c.num_key_value_heads);
    let kb = c.index_topk_blocks;
    let bs = c.index_block_size.max(1);
    // visible positions of each sequence: its furthest row sees the most
    let mut visible: BTreeMap<u32, usize> = BTreeMap::new();
    for (row, &p) in positions.iter().enumerate() {
        let s = row_seq.get(row).copied().unwrap_or(row as u32);
        let v = visible.entry(s).or_insert(0);
        *v = (*v).max(p as usize + 1);
    }
    let mut b = (t * h * 2) as u64; // embedding rows
    if logits_rows > 0 {
        b += m.lm_head.matrix_bytes() as u64 + (h * 4) as u64;
    }
    for (l, lw) in m.layers.iter().enumerate() {
        b += ((2 * h + 2 * d) * 4) as u64;
        b += (lw.q.matrix_bytes() + lw.k.matrix_bytes() + lw.v.matrix_bytes() + lw.o.matrix_bytes())
            as u64;
        if let Some(ix) = &lw.indexer {
            b += (ix.q.matrix_bytes() + ix.k.matrix_bytes() + 2 * c.index_head_dim * 4) as u64;
            b += visible
                .values()
                .map(|&v| (v * cache.row_bytes(c.index_head_dim)) as u64)
                .sum::<u64>();
            let sel = blocks.get(l).map(|v| v.as_slice()).unwrap_or(&[]);
            // (sequence, kv head) -> distinct blocks selected by any of its rows
            let mut read: BTreeMap<(u32, usize), BTreeSet<i32>> = BTreeMap::new();
            for g in 0..nkv {
                for row in 0..t {
                    let s = row_seq.get(row).copied().unwrap_or(row as u32);
                    let set = read.entry((s, g)).or_default();
                    for k in 0..kb {
                        if let Some(&blk) = sel.get((g * t + row) * kb + k) {
                            if blk >= 0 {
                                set.insert(blk);
                            }
                        }
                    }
                }
            }
            for ((s, _), set) in &read {
                let vis = visible.get(s).copied().unwrap_or(0);
                for &blk in set {
                    let lo = blk as usize * bs;
                    let n = (lo + bs).min(vis).saturating_sub(lo);
                    b += (2 * n * cache.row_bytes(d)) as u64;
                }
            }
        } else {
            b += visible
                .values()
                .map(|&v| (2 * v * nkv * cache.row_bytes(d)) as u64)
                .sum::<u64>();
        }
        match &lw.ffn {
            DevFfn::Dense(mlp) => b += mlp.matrix_bytes() as u64,
            DevFfn::Moe {
                router,
                experts: ex,
                shared,
                folded,
                ..
            } => {
                b += (router.matrix_bytes() + router.rows * 4) as u64;
                let ids: BTreeSet<i32> = experts
                    .get(l)
                    .map(|v| v.iter().copied().filter(|&e| e >= 0).collect())
                    .unwrap_or_default();
                // a folded shared expert is one more expert every row reads
                b += ((ids.len() + usize::from(*folded)) * ex.matrix_bytes()) as u64;
                b += shared.as_ref().map_or(0, |s| s.matrix_bytes()) as u64;
            }
        }
    }
    b
}
