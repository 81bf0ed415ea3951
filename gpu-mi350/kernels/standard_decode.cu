// The standard path's kernels (device pointers only, no host round trips):
// one launch per layer step, every shape a kernel argument, every
// data-dependent choice (positions, selected blocks, chosen experts) read on
// the device, so a whole step can be captured into one CUDA graph.
// Numerics follow MODEL.md section 3 (f32 math, bf16 at the marked points).

// A kernel body's shared memory is declared with S_SHARED, after one
// S_SMEM_SCOPE in the function: plain static arrays here; the mono build
// (kernels/mono_prelude.h) carves them instead from one pool per sub-block
// of its persistent CTA, so the bodies of every op fit one kernel.
#ifndef S_SHARED
#define S_SMEM_SCOPE ((void)0)
#define S_SHARED(T, name, dims) __shared__ T name dims
#endif
#ifndef S_MMA_ONLY
#define S_MMA_ONLY 0  // 1: the tensor-core linears alone (see "the step's other kernels")
#endif

// Weight formats of the tensor-core linear (compile-time template argument;
// the Rust side picks the entry point by name, see WFmt::mma_kernel).
#define S_FMT_BF16 0
#define S_FMT_E4M3 1   // MXFP8 E4M3 codes + E8M0 scale per 32
#define S_FMT_FP4 2    // MXFP4 E2M1 codes (two a byte) + E8M0 scale per 32
#define S_FMT_E5M2 3   // MXFP8 E5M2 codes + E8M0 scale per 32
#define S_FMT_NVFP4 4  // E2M1 codes + E4M3 scale per 16 + f32 global per matrix
#define S_INF __int_as_float(0x7f800000)

// ---- tensor-core linear -----------------------------------------------------
// y = x W^T for any number of x rows: bf16 weights here (s_mma_linear), the
// MX formats (MXFP8 E4M3 / E5M2, MXFP4, NVFP4) on f16 operands further down
// (s_mmh_linear), both with this CTA shape, split of K, expert mode and
// epilogue.
// A CTA owns 16 output features (one m16n8k16 tile of W rows) and up to 64
// x rows (8 tiles of 8); its S_MMA_WARPS warps split K and add their
// partial sums through shared memory at the end. The K dimension is walked
// in super-chunks of 128: lane (g, t) of a warp (g = lane / 4, t = lane % 4)
// reads the 32 contiguous values [32t, 32t+32) of W rows g and g+8 and of
// x row g, and feeds them to 8 tile products as logical columns (2t, 2t+1,
// 2t+8, 2t+9): the same permutation of K on both sides, so the dot products
// are unchanged; products are exact in f32 and summed in f32 by the tensor
// cores.
// Expert mode: blockIdx.y is a slot of the device-built route (see
// m3s_route): the rows are the (row, expert) pairs that chose that slot's
// expert, so each chosen expert is read once per step.

// Tunables (a bench variant may predefine them, see StandardPath::add_variant):
// warps per CTA (they split K) and a multiplier of the super-chunks whose
// loads a warp issues together.
#ifndef S_MMA_WARPS
#define S_MMA_WARPS 8
#endif
#ifndef S_UNROLL_MUL
#define S_UNROLL_MUL 1
#endif
// Which super-chunks a warp walks: 0 = a contiguous range of K per warp (a
// row is then read in runs of U super-chunks: 256 B of MXFP4 per lane quad
// and load), 1 = interleaved across the CTA's warps (the general walk: runs
// of one; the MX fast walk: batches of its U dealt to the warps in turn, so
// a CTA's warps read one contiguous stretch together), 2 = the fast walk's
// MXFP8 walks of several x rows interleaved, the rest contiguous. H200
// (bench/NOTES.md session 26, one round, row-scaled x): interleaved, MXFP8
// at 16 rows +4 to +6 points of the ceiling (tall launch 64.7 -> 70.5%,
// experts 84.8 -> 88.6%), one row +-0.1; E2M1 within +-1.
#ifndef S_MMA_INTERLEAVE
#define S_MMA_INTERLEAVE 2
#endif
// 1: double-buffered weight loads (next iteration's loads issued before this
// iteration's decode). Measured slower on the H200 (bench/NOTES.md session 2
// run E): off by default, kept as a bench variant.
#ifndef S_MMA_DBUF
#define S_MMA_DBUF 0
#endif
// Minimum CTAs per SM the register allocation must allow (launch bounds):
// more means fewer registers per thread and more warps to hide latency.
#ifndef S_MMA_MINB
#define S_MMA_MINB (16 / S_MMA_WARPS)
#endif
// 1: half the super-chunks per load batch (fewer live registers).
#ifndef S_UNROLL_HALF
#define S_UNROLL_HALF 0
#endif
// Load batches of a plain launch's fast walk (a warp's contiguous run of
// super-chunks) brought into L2 before the launch's PDL wait: while the
// launch before drains (standard path), or while the CTA waits at the
// grid barrier after its share of the op before (the mono build's early
// start: a CTA that finished early idles there, its SM's memory pipe with
// it). 1: the first batch (the walk's first loads). More: the next ones
// too, up to the warp's whole run (an interleaved walk: up to its first
// granule of G super-chunks; the next one is G (nwarp - 1) further). A
// hint: no result changes. Measured (H100, bench/NOTES.md session 33):
// 4 and 12 slow a b1 MoE layer by 3.7% / 6.4% (standard) and 1.0% / 4.4%
// (mono), 2 within a round's spread, nothing at 4 and 16 rows: 1.
#ifndef S_PDL_AHEAD
#define S_PDL_AHEAD 1
#endif

// 1: NVFP4's E4M3 block scales multiplied into the f16 weight operands
// (exact) where the walk takes more than one x row: eight f16x2 multiplies
// a block in place of the per-half f32 factors (two scale conversions, four
// f16 -> f32) and their FMAs a block and x tile. SASS, NVRTC 13.5: the
// one-tile loop 323 -> 289 instructions, the general walk 214 -> 166; the
// one-row walk would gain nothing (285 -> 288) and keeps the factors. H200
// (bench/NOTES.md session 25, one round): +1.8 to +3.3 points of the
// ceiling in five of six 16-row cases, -2.2 in the one-tile walk with a
// row-scaled x (its chained form; S_NV_SPLIT below). Bits differ from 0's
// in the sums' roundings only.
#ifndef S_NV_FOLD
#define S_NV_FOLD 1
#endif
// S_NV_FOLD with a row-scaled x: 1 = a block's two tile products summed
// apart, then added to the accumulators (the MX form with factor 1); 0 =
// added straight into them, a chain of 16 MMAs a loop through them (bench
// variant). H200 (bench/NOTES.md session 26, one round, grouped experts 16
// of 128 at 16 rows): 0 -> 1 65.1 -> 68.3% of the ceiling.
#ifndef S_NV_SPLIT
#define S_NV_SPLIT 1
#endif

// 1: tile 0's x loads software-pipelined one super-chunk ahead (issued
// before the current super-chunk's decode instead of after it): a bench
// variant for the x-load cost bench/NOTES.md session 6 run 4 measured
// (~8% of the batch-1 step), not yet timed.
#ifndef S_X_AHEAD
#define S_X_AHEAD 0
#endif

/// A load of the step's activations in the linears (x rows, their f16
/// copies and block exponents): through the read-only path in a launch of
/// its own, where an earlier launch wrote them; a plain load in the mono
/// build, where an earlier op of the same launch did (the memory model
/// orders no non-coherent load after the grid barrier's acquire). The same
/// values either way.
template <typename T> M3_DEV T s_ldx(const T* p) {
#if defined(S_MONO)
  return *p;
#else
  return m3_ldg(p);
#endif
}

/// Super-chunk of a warp's walk at step `i` (U * it + u), and whether it
/// exists: nsc super-chunks split over nwarp warps.
M3_DEV bool s_chunk(u32 warp, u32 nwarp, u32 nsc, u32 i, u32& q) {
#if S_MMA_INTERLEAVE == 1
  q = warp + nwarp * i;
  return q < nsc;
#else
  const u32 per = (nsc + nwarp - 1u) / nwarp;
  q = warp * per + i;
  return i < per && q < nsc;
#endif
}
// 8-row tiles of x one CTA takes (rows per CTA = 8 * S_MMA_MAXBT)
#ifndef S_MMA_MAXBT
#define S_MMA_MAXBT 8
#endif

/// Format class: one byte a code (MXFP8); else bf16 or a nibble a code
/// (MXFP4, NVFP4).
template <int F> struct SFmt { static const bool FP8 = F == S_FMT_E4M3 || F == S_FMT_E5M2; };
/// Bytes of one row's 32-value segment.
template <int F> struct SSeg { static const u32 B = F == S_FMT_BF16 ? 64u : (SFmt<F>::FP8 ? 32u : 16u); };
/// Super-chunks whose loads one warp issues together (2 KB of W in flight
/// per warp in every format).
/// (Double-buffered MX formats load half as many per batch, twice as
/// often: the same bytes in flight.)
template <int F> struct SUnroll {
  static const bool DBUF = S_MMA_DBUF && F != S_FMT_BF16;
  static const u32 U0 = (F == S_FMT_BF16 ? 1u : (SFmt<F>::FP8 ? 2u : 4u)) * S_UNROLL_MUL / (DBUF ? 2u : 1u);
  static const u32 U = S_UNROLL_HALF && U0 > 1u ? U0 / 2u : U0;
};

/// One row's 32-value bf16 segment as 16 bf16x2 words (word w = values 2w,
/// 2w + 1): the stored words themselves. This kernel takes bf16 weights
/// only; the MX formats run on s_mmh_linear below.
template <int F, bool ANY> M3_DEV void s_seg_frag(const uint4* raw, u32, u32* out) {
  static_assert(F == S_FMT_BF16, "the bf16-operand linear takes bf16 weights (MX: s_mmh_linear)");
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[4 * i] = raw[i].x; out[4 * i + 1] = raw[i].y; out[4 * i + 2] = raw[i].z; out[4 * i + 3] = raw[i].w;
  }
}

template <int F> M3_DEV void s_seg_load(const u8* p, bool ok, uint4* raw) {
  const u32 n = SSeg<F>::B / 16u;
#pragma unroll
  for (u32 i = 0; i < n; ++i) raw[i] = ok ? reinterpret_cast<const uint4*>(p)[i] : make_uint4(0u, 0u, 0u, 0u);
}

/// One weight matrix of a fused launch (kernel parameter, by value): its
/// CTAs are the tiles [tile0, tile0 + ceil(n / 16)) (s_lin_place: blockIdx.x,
/// or its tile in a chunk-minor launch). mode: 0 = bf16
/// store to yb, 1 = f32 store to yf, 2 = yf += f32(bf16(y)) (the residual
/// add of MODEL.md, fused).
/// Scales: ws + row * (K / 32) E8M0 bytes (MX) or ws + row * (K / 16) E4M3
/// bytes (NVFP4); w_es / ws_es: bytes between stacked matrices (experts).
/// gs: one f32 global scale per stacked matrix (NVFP4; 0 = 1.0), multiplying
/// the f32 sum before the store. cs: one f32 scale per output feature and
/// stacked matrix (PTPC FP8 weights, `cs[e * n + feature]`; 0 = none),
/// multiplying the sum after gs.
///
/// mode 3 (MX f16 kernels only): gate and up with SwiGLU in the epilogue.
/// `w`, `ws`, `gs` are the gate stack's, `w2`, `ws2`, `gs2` the up stack's
/// (the same shape and strides); n = features; a CTA takes 8 features, its
/// tile rows g the gate's and g + 8 the up's of feature tile0-relative
/// 8 c + g, so one thread of the epilogue holds both halves of a feature.
/// It stores bf16(SwiGLU-OAI(bf16(gate), bf16(up))) with `alpha`, `limit`
/// to yb and its row-scaled f16 copy (p = 2^(xpe - 127), s_xh_put_pe) to
/// the f16-layout rows at yf: the bits of a gate + up launch, then
/// m3s_swiglu with `xpe`.
struct SSeg1 {
  u64 w, ws, yb, yf, w_es, ws_es, gs, cs;
  u32 n, tile0, mode, xpe;
  u64 w2, ws2, gs2;
  float alpha, limit;
};
#define S_MODE_SWIGLU 3u

/// SwiGLU-OAI of one (gate, up) pair of bf16 values (MODEL.md):
/// bf16(((u' + 1) g') sigmoid(alpha g')), g' = min(g, limit), u' = u
/// clamped to [-limit, limit]. One body for m3s_swiglu and the mode-3
/// epilogue, so both give the same bits.
M3_DEV u16 s_swiglu_oai(u16 gb, u16 ub, float alpha, float limit) {
  float g = m3_bf16_to_f32(gb), u = m3_bf16_to_f32(ub);
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  const float sg = 1.0f / (1.0f + expf(-(alpha * g)));
  return m3_bf16_from_f32(((u + 1.0f) * g) * sg);
}
#define S_MAX_SEGS 5
/// flags: S_SEGS_XROW = x is row-scaled (every block's exponent byte of a
/// row the same: s_xh_row_pe), so the MX linears' fast walk leaves the x
/// exponent to the epilogue.
struct SSegs {
  SSeg1 s[S_MAX_SEGS];
  u32 nseg, flags;
};
#define S_SEGS_XROW 1u

/// Route record of expert slot s (written by m3s_route): [expert, rows,
/// pair ids of those rows ascending, ...], S_ROUTE_STRIDE(max_rows) ints.
#define S_ROUTE_STRIDE(mr) (2u + (mr))

/// Scale bytes of the 32-value segment at k0 of a row's scales: one E8M0
/// byte (MX) or two E4M3 bytes k0/16, k0/16 + 1 (NVFP4: one 2-byte load,
/// aligned since k0 is a multiple of 32 and K / 16 is even).
template <int F> M3_DEV u32 s_scale_load(const u8* s, u32 k0) {
  if (F == S_FMT_NVFP4) return *reinterpret_cast<const u16*>(s + k0 / 16u);
  return s[k0 / 32u];
}

/// Issue the loads of iteration `it` of a warp's super-chunk walk: U
/// super-chunks (`s_chunk` of U * it + u) of W rows a and c, and
/// their scale bytes.
template <int F>
M3_DEV void s_mma_fetch(u32 it, u32 warp, u32 nwarp, u32 t, u32 nsc, u32 K, const u8* wa, const u8* wc,
                        const u8* sa, const u8* sc, bool oka, bool okc,
                        uint4 (&raw)[SUnroll<F>::U][2][SSeg<F>::B / 16u], u32 (&sca)[SUnroll<F>::U][2]) {
  const u32 U = SUnroll<F>::U;
#pragma unroll
  for (u32 u = 0; u < U; ++u) {
    u32 q;
    const bool have = s_chunk(warp, nwarp, nsc, U * it + u, q);
    const u32 k0 = q * 128u + 32u * t;
    const bool in = have && k0 < K;
    s_seg_load<F>(wa + (u64)k0 * SSeg<F>::B / 32u, in && oka, raw[u][0]);
    s_seg_load<F>(wc + (u64)k0 * SSeg<F>::B / 32u, in && okc, raw[u][1]);
    sca[u][0] = sa && in && oka ? s_scale_load<F>(sa, k0) : 0u;
    sca[u][1] = sc && in && okc ? s_scale_load<F>(sc, k0) : 0u;
  }
}

/// Lane (g, t)'s 32 x values [k0, k0 + 32) of tile row m (zeros past
/// the CTA's rows or past K).
M3_DEV void s_x_load(const u16* __restrict__ x, const u32* xrow, u32 m, u32 cnt, bool in, u32 k0, u32 K,
                     uint4 (&xr)[4]) {
  const bool okx = in && m < cnt;
  const u16* xp = x + (u64)(okx ? xrow[m] : 0u) * K + (in ? k0 : 0u);
#pragma unroll
  for (int i = 0; i < 4; ++i) xr[i] = okx ? reinterpret_cast<const uint4*>(xp)[i] : make_uint4(0u, 0u, 0u, 0u);
}

/// The 8 tile products of one super-chunk for one 8-row x tile: W rows
/// (g, g + 8) as fa / fc, x as xr.
M3_DEV void s_tile_mma(float (&acc)[4], const u32 (&fa)[16], const u32 (&fc)[16], const uint4 (&xr)[4]) {
  const u32 xw[16] = {xr[0].x, xr[0].y, xr[0].z, xr[0].w, xr[1].x, xr[1].y, xr[1].z, xr[1].w,
                      xr[2].x, xr[2].y, xr[2].z, xr[2].w, xr[3].x, xr[3].y, xr[3].z, xr[3].w};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const u32 a[4] = {fa[2 * j], fc[2 * j], fa[2 * j + 1], fc[2 * j + 1]};
    m3_mma_bf16_16816(acc, a, xw[2 * j], xw[2 * j + 1]);
  }
}

/// A linear CTA's tile (of 16 output features, over the launch's
/// matrices) and, in a plain launch, its row chunk: blockIdx.x and
/// blockIdx.y; but a plain launch of more than one row chunk on a grid one
/// block high (the host's chunk-minor launches, `S_CHUNK_MINOR`) deals the
/// chunks in x, blockIdx.x = tile * chunks + chunk, so that the CTAs that
/// read one weight tile run together and all but the first find it in L2
/// (blockIdx.y-major, a chunk's re-read comes a whole matrix later).
struct SLinPlace {
  u32 tile, chunk;
};
M3_DEV SLinPlace s_lin_place(const int* route, u32 M) {
  const u32 chunks = (M + S_MMA_MAXBT * 8u - 1u) / (S_MMA_MAXBT * 8u);
  if (route == nullptr && gridDim.y == 1u && chunks > 1u) return {blockIdx.x / chunks, blockIdx.x % chunks};
  return {blockIdx.x, blockIdx.y};
}

/// This CTA's matrix of a fused launch (constant indices only: the table
/// stays in the parameter bank); `tile` from s_lin_place.
M3_DEV SSeg1 s_lin_seg(const SSegs& segs, u32 tile) {
  SSeg1 sg = segs.s[0];
#pragma unroll
  for (int i = 1; i < S_MAX_SEGS; ++i)
    if ((u32)i < segs.nseg && tile >= segs.s[i].tile0) sg = segs.s[i];
  return sg;
}

/// The CTA's rows (shared `xrow`: x rows, `yrow`: output rows, `cnt` of
/// them), read after the dependency wait: a routed launch reads its slot's
/// record (`e`: the expert; its pairs from this z-block's on), a plain one
/// takes rows `chunk` * 8 * S_MMA_MAXBT on (s_lin_place). False (for the
/// whole CTA) when it has none.
M3_DEV bool s_lin_rows(const int* __restrict__ route, u32 max_rows, u32 xdiv, u32 M, u32 chunk, int* head,
                       u32* xrow, u32* yrow, u32& cnt, u32& e) {
  const u32 z0 = blockIdx.z * S_MMA_MAXBT * 8u;
  if (route) {
    // one round trip: every thread reads its word of the slot's record
    const int* rec = route + (u64)blockIdx.y * S_ROUTE_STRIDE(max_rows);
    if (threadIdx.x < 2u) head[threadIdx.x] = rec[threadIdx.x];
    if (threadIdx.x < S_MMA_MAXBT * 8u && z0 + threadIdx.x < max_rows) {
      u32 pr = (u32)rec[2u + z0 + threadIdx.x];
      xrow[threadIdx.x] = pr / xdiv;
      yrow[threadIdx.x] = pr;
    }
    __syncthreads();
    const int rows = head[1];
    cnt = rows > (int)z0 ? min((u32)rows - z0, S_MMA_MAXBT * 8u) : 0u;
    e = (u32)head[0];
    return cnt != 0u;
  }
  const u32 m0 = chunk * S_MMA_MAXBT * 8u;
  cnt = m0 < M ? min(S_MMA_MAXBT * 8u, M - m0) : 0u;
  e = 0u;
  if (cnt == 0u) return false;
  if (threadIdx.x < cnt) { xrow[threadIdx.x] = m0 + threadIdx.x; yrow[threadIdx.x] = m0 + threadIdx.x; }
  __syncthreads();
  return true;
}

/// Bytes of one x row in the MX linears' f16 layout (s_mmh_linear): K f16
/// values in fragment order (per 32-value block, lane t's values 4t..4t+3
/// then 16+4t..16+4t+3: 16 bytes), then one exponent byte a block
/// (s_xh_put), padded to 16.
M3_DEV u32 s_xh_stride(u32 K) { return 2u * K + ((K / 32u + 15u) & ~15u); }

/// Value l of block `blk` of an x row into the f16 layout with the power
/// of two p = 2^(pe - 127) (v * p rounded to f16; exponent byte 254 - pe,
/// so that the MX kernel's factor 2^(byte - 127) = 1 / p undoes it): the
/// store of s_xh_put, and of producers that choose one p for a whole row
/// (s_xh_row_pe).
M3_DEV void s_xh_put_pe(float v, u32 l, u8* __restrict__ row, u32 K, u32 blk, u32 pe) {
  const u32 kk = l % 32u;
  const u32 dst = blk * 32u + ((kk % 16u) / 4u) * 8u + (kk / 16u) * 4u + kk % 4u;
  reinterpret_cast<u16*>(row)[dst] = (u16)m3_f16_from_f32(v * m3_f32(pe << 23));
  if (kk == 0u) row[2u * K + blk] = (u8)(254u - pe);
}

/// A tensor-core linear's epilogue: each warp's split-K partials (`acc`
/// of its `nbt` x tiles) through shared `red`, summed per output, times
/// `fix` (an exact power of two undoing the operands' scaling), the
/// matrix's global scale (NVFP4) and PTPC's feature and x-row scales,
/// stored as the segment's mode says (mode 3: rows r < 8 the gate's, r + 8
/// the up's of one feature, through SwiGLU: SSeg1).
M3_DEV void s_lin_store(float (*red)[S_MMA_MAXBT * 8][16], const float (&acc)[S_MMA_MAXBT][4], u32 nbt, u32 warp,
                        u32 nwarp, u32 cnt, u32 n0, const SSeg1& sg, u32 ge, const float* __restrict__ ts,
                        const u32* xrow, const u32* yrow, float fix, const u8* xre = nullptr, u64 xs = 0) {
  const u32 lane = threadIdx.x % 32u, g = lane / 4u, t = lane % 4u;
#pragma unroll
  for (int b = 0; b < S_MMA_MAXBT; ++b) {
    if ((u32)b >= nbt) break;
    red[warp][b * 8 + 2 * t][g] = acc[b][0];
    red[warp][b * 8 + 2 * t + 1][g] = acc[b][1];
    red[warp][b * 8 + 2 * t][g + 8] = acc[b][2];
    red[warp][b * 8 + 2 * t + 1][g + 8] = acc[b][3];
  }
  __syncthreads();
  const u32 N = sg.n;
  u16* yb = reinterpret_cast<u16*>(sg.yb);
  float* yf = reinterpret_cast<float*>(sg.yf);
  // the matrix's global scale (NVFP4; 1.0 when absent)
  const float gsc = sg.gs ? reinterpret_cast<const float*>(sg.gs)[ge] : 1.0f;
  if (sg.mode == S_MODE_SWIGLU) {
    // the up stack's global scale (NVFP4)
    const float gsu = sg.gs2 ? reinterpret_cast<const float*>(sg.gs2)[ge] : 1.0f;
    for (u32 i = threadIdx.x; i < cnt * 8u; i += blockDim.x) {
      const u32 m = i / 8u, r = i % 8u, f = n0 + r;
      if (f >= N) continue;
      // each half as a mode-0 store would round it
      float vg = 0.0f, vu = 0.0f;
      for (u32 w2 = 0; w2 < nwarp; ++w2) { vg += red[w2][m][r]; vu += red[w2][m][r + 8u]; }
      if (xre) {
        const float xf = m3_f32((u32)xre[(u64)xrow[m] * xs] << 23);
        vg = vg * xf; vu = vu * xf;
      }
      vg = vg * fix; vu = vu * fix;
      vg = vg * gsc; vu = vu * gsu;
      const u16 b = s_swiglu_oai(m3_bf16_from_f32(vg), m3_bf16_from_f32(vu), sg.alpha, sg.limit);
      yb[(u64)yrow[m] * N + f] = b;
      s_xh_put_pe(m3_bf16_to_f32(b), f % 32u, reinterpret_cast<u8*>(sg.yf) + (u64)yrow[m] * s_xh_stride(N), N,
                  f / 32u, sg.xpe);
    }
    return;
  }
  for (u32 i = threadIdx.x; i < cnt * 16u; i += blockDim.x) {
    const u32 m = i / 16u, r = i % 16u, n = n0 + r;
    if (n >= N) continue;
    float v = 0.0f;
    for (u32 w2 = 0; w2 < nwarp; ++w2) v += red[w2][m][r];
    // a row-scaled x's 1 / p (the walk left it out: the same power of two
    // every block, so the same bits as multiplying it per block)
    if (xre) v = v * m3_f32((u32)xre[(u64)xrow[m] * xs] << 23);
    v = v * fix;
    v = v * gsc;
    // PTPC FP8: f32(f32(acc * sw) * sa), the weight row's scale, then the
    // x row's (ARCHITECTURE.md, Online quantization)
    if (sg.cs) v = v * reinterpret_cast<const float*>(sg.cs)[(u64)ge * N + n];
    if (ts) v = v * ts[xrow[m]];
    const u64 o = (u64)yrow[m] * N + n;
    if (sg.mode == 0u) yb[o] = m3_bf16_from_f32(v);
    else if (sg.mode == 1u) yf[o] = v;
    else yf[o] += m3_bf16_to_f32(m3_bf16_from_f32(v));
  }
}

template <int F, bool ANY>
M3_DEV void s_mma_linear(const u16* __restrict__ x, const SSegs& segs, u32 K, u32 M, const int* __restrict__ route,
                         u32 max_rows, u32 xdiv, const float* __restrict__ ts) {
  S_SMEM_SCOPE; S_SHARED(float, red, [S_MMA_WARPS][S_MMA_MAXBT * 8][16]);
  S_SHARED(u32, xrow, [S_MMA_MAXBT * 8]); S_SHARED(u32, yrow, [S_MMA_MAXBT * 8]);
  S_SHARED(int, head, [2]);
  M3_PDL_TRIGGER();
  const u32 lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, nwarp = blockDim.x / 32u;
  const u32 g = lane / 4u, t = lane % 4u;
  const SLinPlace at = s_lin_place(route, M);
  const SSeg1 sg = s_lin_seg(segs, at.tile);
  const u32 N = sg.n;
  const u32 n0 = (at.tile - sg.tile0) * 16u;
  const u32 U = SUnroll<F>::U;
  const u32 nsc = (K + 127u) / 128u;
  const u64 rb = F == S_FMT_BF16 ? 2ull * K : (SFmt<F>::FP8 ? (u64)K : K / 2ull);  // code bytes a row
  const u32 sb = F == S_FMT_NVFP4 ? K / 16u : K / 32u;                              // scale bytes a row
  const u32 ra = n0 + g, rc = n0 + g + 8u;
  const bool oka = ra < N, okc = rc < N;
  const u8* W = reinterpret_cast<const u8*>(sg.w);
  const u8* S = reinterpret_cast<const u8*>(sg.ws);
  uint4 raw[SUnroll<F>::U][2][SSeg<F>::B / 16u];
  u32 sca[SUnroll<F>::U][2];
  const u8 *wa = nullptr, *wc = nullptr, *sa = nullptr, *sc = nullptr;
  auto rows_at = [&]() {
    wa = W + (u64)(oka ? ra : 0u) * rb;
    wc = W + (u64)(okc ? rc : 0u) * rb;
    sa = S ? S + (u64)(oka ? ra : 0u) * sb : nullptr;
    sc = S ? S + (u64)(okc ? rc : 0u) * sb : nullptr;
  };
  u32 cnt, ge = 0u;  // rows of this CTA; matrix of the stack (global scale)
  if (!route) {
    // plain mode: the weights are known before the previous kernel ends,
    // so the first loads go out before the dependency wait
    rows_at();
    s_mma_fetch<F>(0u, warp, nwarp, t, nsc, K, wa, wc, sa, sc, oka, okc, raw, sca);
  }
  M3_PDL_WAIT();
  if (!s_lin_rows(route, max_rows, xdiv, M, at.chunk, head, xrow, yrow, cnt, ge)) return;
  if (route) {
    W += (u64)ge * sg.w_es;
    if (S) S += (u64)ge * sg.ws_es;
    rows_at();
    s_mma_fetch<F>(0u, warp, nwarp, t, nsc, K, wa, wc, sa, sc, oka, okc, raw, sca);
  }
  const u32 nbt = (cnt + 7u) / 8u;
  float acc[S_MMA_MAXBT][4];
#pragma unroll
  for (int b = 0; b < S_MMA_MAXBT; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;
  // super-chunk q of 128 K values; warp w takes q = w + nwarp * j, U of
  // them per iteration with every load issued before any is used
  const u32 iters = (((nsc + nwarp - 1u) / nwarp) + U - 1u) / U;
#if S_X_AHEAD
  // x of tile 0 one super-chunk ahead of its use (bench variant; see the
  // define)
  uint4 xa[4];
  {
    u32 q;
    const bool have = s_chunk(warp, nwarp, nsc, 0u, q);
    const u32 k0 = q * 128u + 32u * t;
    s_x_load(x, xrow, g, cnt, have && k0 < K, k0, K, xa);
  }
#endif
  for (u32 it = 0; it < iters; ++it) {
    // double buffer (MX formats): the next iteration's loads go out before
    // this one's decode and tile products
    uint4 nraw[SUnroll<F>::U][2][SSeg<F>::B / 16u];
    u32 nsca[SUnroll<F>::U][2];
    const bool more = SUnroll<F>::DBUF && it + 1u < iters;
    if (more) s_mma_fetch<F>(it + 1u, warp, nwarp, t, nsc, K, wa, wc, sa, sc, oka, okc, nraw, nsca);
    if (!SUnroll<F>::DBUF && it > 0u) s_mma_fetch<F>(it, warp, nwarp, t, nsc, K, wa, wc, sa, sc, oka, okc, raw, sca);
#pragma unroll
    for (u32 u = 0; u < U; ++u) {
      u32 q;
      if (!s_chunk(warp, nwarp, nsc, U * it + u, q)) break;
      const u32 k0 = q * 128u + 32u * t;
      const bool in = k0 < K;
#if S_X_AHEAD
      // this super-chunk's x of tile 0, then the next one's loads go out
      // (they overlap this decode and its tile products)
      uint4 x0[4] = {xa[0], xa[1], xa[2], xa[3]};
      {
        u32 qn;
        const bool hn = s_chunk(warp, nwarp, nsc, U * it + u + 1u, qn);
        const u32 kn = qn * 128u + 32u * t;
        s_x_load(x, xrow, g, cnt, hn && kn < K, kn, K, xa);
      }
#endif
      u32 fa[16], fc[16];
      s_seg_frag<F, ANY>(raw[u][0], sca[u][0], fa);
      s_seg_frag<F, ANY>(raw[u][1], sca[u][1], fc);
#pragma unroll
      for (int b = 0; b < S_MMA_MAXBT; ++b) {
        if ((u32)b >= nbt) break;
#if S_X_AHEAD
        if (b == 0) {
          s_tile_mma(acc[0], fa, fc, x0);
          continue;
        }
#endif
        uint4 xr[4];
        s_x_load(x, xrow, (u32)b * 8u + g, cnt, in, k0, K, xr);
        s_tile_mma(acc[b], fa, fc, xr);
      }
    }
    if (more) {
#pragma unroll
      for (u32 u = 0; u < U; ++u) {
#pragma unroll
        for (u32 r = 0; r < 2u; ++r) {
          sca[u][r] = nsca[u][r];
#pragma unroll
          for (u32 i = 0; i < SSeg<F>::B / 16u; ++i) raw[u][r][i] = nraw[u][r][i];
        }
      }
    }
  }
  s_lin_store(red, acc, nbt, warp, nwarp, cnt, n0, sg, ge, ts, xrow, yrow, 1.0f);
}

/// One p for a whole x row (the row-scaled f16 layout: every block's
/// exponent byte the same, so the MX linears multiply it once an output,
/// s_lin_store, not once a block): from `u`, an exponent with every value
/// of the row at most 2^u, p = 2^(14 - u) puts them at most 2^14 (< f16's
/// 65504), clamped as s_xh_put's; 127 (p = 1) for a zero row. bf16's 8
/// significant bits stay exact in f16 for values down to ~2^-30 of the
/// bound (s_xh_put: of the block's largest).
M3_DEV u32 s_xh_row_pe(int u, bool zero) {
  if (zero) return 127u;
  const int want = 141 - u;
  return (u32)(want > 253 ? 253 : (want < 2 ? 2 : want));
}

/// One 32-value block of an x row into the f16 layout, by a 32-lane group
/// (lane l holds value l of the block, `v` f32 of its bf16): the block's
/// power of two p = 2^(13 - floor(log2 max|v|)) (1 for a zero block or one
/// holding NaN / Inf; within [2^-125, 2^126]) puts its largest value in
/// [2^13, 2^14), each value v * p rounded to f16 (exact: bf16's 8
/// significant bits fit f16's for every value down to 2^-38 of the block's
/// largest), and exponent byte 254 - (127 + log2 p), so that the MX kernel's
/// factor 2^(byte - 127) = 1 / p undoes the scaling exactly.
M3_DEV void s_xh_put(float v, u32 l, u8* __restrict__ row, u32 K, u32 blk) {
  u32 ab = m3_bits(v) & 0x7fffffffu;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const u32 o = M3_SHFL_XOR32(ab, m);
    ab = o > ab ? o : ab;
  }
  u32 pe = 127u;
  if (ab != 0u && ab < 0x7f800000u) {
    const int want = 267 - (int)(ab >> 23);  // f32-subnormal maxima: the largest p
    pe = (u32)(want > 253 ? 253 : (want < 2 ? 2 : want));
  }
  s_xh_put_pe(v, l, row, K, blk, pe);
}

// ---- MX linear on f16 tensor cores ------------------------------------------
// y = x W^T for MXFP4, NVFP4 and MXFP8 (E4M3 / E5M2) weights (bench/NOTES.md
// session 11: 1.5-2.4x the bf16-operand kernel above at 1-16 rows). The
// CTA shape, the split of K over warps, expert mode and the epilogue are
// s_mma_linear's; what differs is where the scale goes:
// - every 32-value MX block of 16 weight rows is one pair of m16n8k16
//   products over a lane quad (lane (g, t) holds values 4t..4t+3 and
//   16+4t..16+4t+3 of rows g and g+8), so the block's scale multiplies the
//   f32 result of the pair (NVFP4: each product of the pair is one 16-value
//   scale block), never a weight;
// - codes become f16 operands exactly: E2M1 as E4M3 bits (value * 2^-6: one
//   mask for half the codes, two shifts and two masks for the other half,
//   model/layout.rs), then E4M3 -> f16 by `cvt` (E5M2 is the top byte of
//   its f16);
// - x comes as f16 fragments with a power of two per 32-value block
//   (s_xh_put), whose inverse multiplies the block's result with the scale.
// Device layout (model/layout.rs): each row's 128-value chunk of nb <= 4
// blocks holds lane t's share of block j at 4 (nb t + j) bytes (E2M1) or,
// for FP8 (values 4t..4t+3, then 16+4t..16+4t+3), at 64 (j / 2) + 16 t +
// 8 (j % 2) in a full chunk and 8 (nb t + j) in a partial one. So a full
// chunk is one 16-byte load per lane and row for E2M1, two for FP8 (at
// 16 t and 64 + 16 t: each load of a lane quad is 64 contiguous bytes).

/// E2M1 codes of a device u32 -> E4M3 bytes (value * 2^-6). Half 0 (values
/// 4t..4t+3) sits in bits 2, 3, 4, 7 of each byte (m, e0, e1, s) already;
/// half 1 (values 16+4t..) in bits 0, 1, 5, 6 (m, e0, s, e1).
M3_DEV u32 s_h_e2m1_lo(u32 q) { return q & 0x9c9c9c9cu; }
M3_DEV u32 s_h_e2m1_hi(u32 q) { return ((q << 2) & 0x8c8c8c8cu) | ((q >> 2) & 0x10101010u); }

// HIP: the tile product is emulated by lane shuffles (compat.h), which
// holds many registers: one load batch, x loaded per block, one walk
// (no VGPR spills: `cargo xtask kernels`). Correct, not fast.
#if defined(M3_HIP)
#define S_H_LEAN 1
#define S_H_UNROLL _Pragma("unroll 1")
#else
#define S_H_LEAN 0
#define S_H_UNROLL _Pragma("unroll")
#endif
template <int F, bool ANY = false> struct SHalf {
  static const bool NIB = F == S_FMT_FP4 || F == S_FMT_NVFP4;
  /// Code bytes of one row and lane in a full chunk.
  static const u32 LB = NIB ? 16u : 32u;
  /// Super-chunks a load batch (prototype: ~2 KB of codes a warp in
  /// flight; one for the prefill shape, whose 8 x tiles hold the registers,
  /// and for the any-scale entry points, whose general loads and factors do).
  static const u32 U = (S_UNROLL_HALF || S_MMA_MAXBT > 2 || ANY || S_H_LEAN ? 1u : 2u) * S_UNROLL_MUL;
  /// U without S_UNROLL_HALF (the mono build's halving): the unit the
  /// fast walk deals super-chunks to the warps in (SHWalk::G).
  static const u32 UG = (S_MMA_MAXBT > 2 || ANY || S_H_LEAN ? 1u : 2u) * S_UNROLL_MUL;
};

/// Bytes from one chunk of a row's codes to its next: FP8 rows are
/// contiguous; E2M1 rows are interleaved by 16-row tiles (model/layout.rs),
/// so a full chunk's 16 pieces of 64 bytes lie between.
template <int F> struct SChunk { static const u32 STRIDE = SHalf<F>::NIB ? 1024u : 128u; };

/// Lane t's codes (`raw`, words j or 2j, 2j + 1 for block j) and scale bytes
/// (`sw`: MX byte j = block j; NVFP4 bytes 2j, 2j + 1) of super-chunk q of
/// one row (`w` at the row's codes of chunk 0, `s` at its scales; `ok`: the
/// row exists). E2M1: `w` = the tile's base + 64 ri for row ri of the tile
/// (its piece of a full chunk; a partial one's is 16 nb ri bytes in).
template <int F, bool ANY>
M3_DEV void s_h_fetch(const u8* w, const u8* s, bool ok, u32 q, u32 K, u32 t, u32 ri,
                      uint4 (&raw)[SHalf<F>::LB / 16u], u32 (&sw)[2]) {
  if (!ANY) {
    // every chunk full (the host takes the `_any` entry unless K % 128 == 0)
    const u8* c = w + (u64)q * SChunk<F>::STRIDE + 16u * t;
#pragma unroll
    for (u32 i = 0; i < SHalf<F>::LB / 16u; ++i)
      raw[i] = ok ? m3_ldg_stream_u4(reinterpret_cast<const uint4*>(c + 64u * i)) : make_uint4(0u, 0u, 0u, 0u);
    if (F == S_FMT_NVFP4) {
      const uint2 v = ok ? m3_ldg(reinterpret_cast<const uint2*>(s + (u64)q * 8u)) : make_uint2(0u, 0u);
      sw[0] = v.x; sw[1] = v.y;
    } else {
      sw[0] = ok ? m3_ldg(reinterpret_cast<const u32*>(s + (u64)q * 4u)) : 0u;
      sw[1] = 0u;
    }
    return;
  }
  const u32 nbk = K / 32u, b0 = 4u * q;
  const u32 nb = nbk > b0 ? min(4u, nbk - b0) : 0u;
  const u32 nw = SHalf<F>::LB / 16u;
#pragma unroll
  for (u32 i = 0; i < nw; ++i) raw[i] = make_uint4(0u, 0u, 0u, 0u);
  sw[0] = sw[1] = 0u;
  if (!ok || nb == 0u) return;
  const u8* c = SHalf<F>::NIB ? w + (u64)q * SChunk<F>::STRIDE - 64u * ri + 16u * nb * ri : w + (u64)b0 * 32u;
  const u32 sbb = F == S_FMT_NVFP4 ? 2u : 1u;  // scale bytes a block
  if (nb == 4u && (K & 127u) == 0u) {
#pragma unroll
    for (u32 i = 0; i < nw; ++i) raw[i] = *reinterpret_cast<const uint4*>(c + 16u * t + 64u * i);
    if (s) {
      if (F == S_FMT_NVFP4) {
        const uint2 v = *reinterpret_cast<const uint2*>(s + (u64)b0 * 2u);
        sw[0] = v.x; sw[1] = v.y;
      } else {
        sw[0] = *reinterpret_cast<const u32*>(s + b0);
      }
    }
    return;
  }
  // the last, partial chunk of a row (or K not a multiple of 128): word by
  // word (constant register indices: the arrays stay in registers); an FP8
  // slot j sits at 64 (j / 2) + 16 t + 8 (j % 2) bytes in a full chunk,
  // at 8 (nb t + j) in a partial one (model/layout.rs)
  u32 r[4 * SHalf<F>::LB / 16u];
#pragma unroll
  for (u32 j = 0; j < 4u; ++j) {
    if (SHalf<F>::NIB) {
      r[j] = j < nb ? reinterpret_cast<const u32*>(c)[nb * t + j] : 0u;
    } else {
      const u32 sl = nb == 4u ? 8u * (j / 2u) + 2u * t + (j % 2u) : nb * t + j;
      const uint2 v = j < nb ? reinterpret_cast<const uint2*>(c)[sl] : make_uint2(0u, 0u);
      r[2u * j] = v.x;
      r[2u * j + 1u] = v.y;
    }
  }
#pragma unroll
  for (u32 i = 0; i < nw; ++i) raw[i] = make_uint4(r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
  if (s) {
#pragma unroll
    for (u32 i = 0; i < 4u * sbb; ++i)
      if (i < nb * sbb) sw[i / 4u] |= (u32)s[(u64)b0 * sbb + i] << (8u * (i % 4u));
  }
}

/// f32 factor of MX scale byte e for codes read as f16 (E2M1 via E4M3:
/// value * 2^-6 -> 2^(e - 121); E4M3 / E5M2: 2^(e - 127)), split in two
/// where one f32 cannot hold it (ANY only: e > 248 for E2M1, e = 0 for the
/// others, NaN for 0xFF). Every MX and NVFP4 matrix has block scales (PTPC's
/// are unit E8M0 bytes).
template <int F, bool ANY> M3_DEV void s_h_factor(u32 e, float& f1, float& f2) {
  f2 = 1.0f;
  const u32 add = F == S_FMT_FP4 ? 6u : 0u;
  if (!ANY) { f1 = m3_f32((e << 23) + (add << 23)); return; }
  if (e == 0xffu) { f1 = m3_nan(); return; }
  if (e + add > 254u) { f1 = m3_f32(254u << 23); f2 = m3_f32((e + add - 127u) << 23); return; }
  if (e + add == 0u) { f1 = m3_f32(0x00400000u); return; }  // 2^-127
  f1 = m3_f32((e + add) << 23);
}

/// One 32-value block j of a super-chunk for 16 weight rows against NB x
/// tiles: `wg` / `w8` the chunk's code words of rows g and g + 8 (E2M1: word
/// j; FP8: words 2j, 2j + 1), `sg` / `s8` their scale words (MX: byte j of
/// word 0; NVFP4: bytes 2j, 2j + 1 of words 0, 1), `xat(b)` x tile b's
/// fragment of the block, `xexp(b, c)` the exponent byte of its column 2t +
/// c (ONE: one x row, whose odd columns are never stored and are left out;
/// XR: x row-scaled, its exponent left to the epilogue and `xexp` unused).
/// Both walks' body.
template <int F, bool ANY, int NB, bool ONE, bool XR = false, typename XAt, typename XExp>
M3_DEV void s_h_block(const u32* wg, const u32* w8, const u32 (&sg)[2], const u32 (&s8)[2], u32 j, const XAt& xat,
                      const XExp& xexp, float (&acc)[S_MMA_MAXBT][4]) {
  u32 a0, a1, a2, a3;
  if (SHalf<F>::NIB) {
    a0 = s_h_e2m1_lo(wg[j]); a2 = s_h_e2m1_hi(wg[j]);
    a1 = s_h_e2m1_lo(w8[j]); a3 = s_h_e2m1_hi(w8[j]);
  } else {
    a0 = wg[2u * j]; a2 = wg[2u * j + 1u];
    a1 = w8[2u * j]; a3 = w8[2u * j + 1u];
  }
  u32 h[8];
  if (F == S_FMT_E5M2) {
    m3_e5m2x4_f16(a0, h[0], h[1]); m3_e5m2x4_f16(a1, h[2], h[3]);
    m3_e5m2x4_f16(a2, h[4], h[5]); m3_e5m2x4_f16(a3, h[6], h[7]);
  } else {
    m3_e4m3x4_f16(a0, h[0], h[1]); m3_e4m3x4_f16(a1, h[2], h[3]);
    m3_e4m3x4_f16(a2, h[4], h[5]); m3_e4m3x4_f16(a3, h[6], h[7]);
  }
  // NVFP4 with its scales in the weights (S_NV_FOLD, not one x row): each
  // half block's f16 operands times its E4M3 scale, exactly (an E2M1 value
  // times 2^-6 times an E4M3 value has at most 6 significant bits, between
  // 2^-16 and 42: f16 holds it), so the pair of products is summed as an
  // MX block's with factor 1
  constexpr bool NVF = F == S_FMT_NVFP4 && S_NV_FOLD && !ONE;
  if (NVF) {
    const u32 sgh = m3_e4m3x2_f16x2(sg[j / 2u] >> (16u * (j % 2u)));
    const u32 s8h = m3_e4m3x2_f16x2(s8[j / 2u] >> (16u * (j % 2u)));
    h[0] = m3_mul_f16x2_by(h[0], sgh, 0); h[1] = m3_mul_f16x2_by(h[1], sgh, 0);
    h[2] = m3_mul_f16x2_by(h[2], s8h, 0); h[3] = m3_mul_f16x2_by(h[3], s8h, 0);
    h[4] = m3_mul_f16x2_by(h[4], sgh, 1); h[5] = m3_mul_f16x2_by(h[5], sgh, 1);
    h[6] = m3_mul_f16x2_by(h[6], s8h, 1); h[7] = m3_mul_f16x2_by(h[7], s8h, 1);
  }
  const u32 p0[4] = {h[0], h[2], h[1], h[3]}, p1[4] = {h[4], h[6], h[5], h[7]};
  // the block's factors for rows g, g + 8 (NVFP4: per half block)
  float fg0, fg1, f80, f81, fgx = 1.0f, f8x = 1.0f;
  if (NVF) {
    fg0 = fg1 = f80 = f81 = 1.0f;
  } else if (F == S_FMT_NVFP4) {
    m3_e4m3x2_f32(sg[j / 2u] >> (16u * (j % 2u)), fg0, fg1);
    m3_e4m3x2_f32(s8[j / 2u] >> (16u * (j % 2u)), f80, f81);
  } else {
    s_h_factor<F, ANY>(m3_byte(sg[0], j), fg0, fgx);
    s_h_factor<F, ANY>(m3_byte(s8[0], j), f80, f8x);
    fg1 = fg0; f81 = f80;
  }
  S_H_UNROLL
  for (int b = 0; b < NB; ++b) {
    const uint4 xv = xat(b);
    if (NVF && XR && !S_NV_SPLIT) {
      // scales in the weights, x's exponent in the epilogue: the block adds
      // to the accumulators inside the tile products
      m3_mma_f16_16816(acc[b], p0, xv.x, xv.y);
      m3_mma_f16_16816(acc[b], p1, xv.z, xv.w);
      continue;
    }
    float d0[4];
    m3_mma_f16_16816z(d0, p0, xv.x, xv.y);
    const bool c2 = !ONE || b > 0;
    if (F == S_FMT_NVFP4 && !NVF) {
      float d1[4];
      m3_mma_f16_16816z(d1, p1, xv.z, xv.w);
      if (!XR) {
        // the x blocks' 1 / p of columns 2t, 2t + 1 (s_xh_put)
        const float x0 = m3_f32(xexp(b, 0u) << 23);
        const float x1 = c2 ? m3_f32(xexp(b, 1u) << 23) : 0.0f;
        d0[0] *= x0; d1[0] *= x0; d0[2] *= x0; d1[2] *= x0;
        d0[1] *= x1; d1[1] *= x1; d0[3] *= x1; d1[3] *= x1;
      }
      acc[b][0] = fmaf(d1[0], fg1, fmaf(d0[0], fg0, acc[b][0]));
      acc[b][2] = fmaf(d1[2], f81, fmaf(d0[2], f80, acc[b][2]));
      if (c2) {
        acc[b][1] = fmaf(d1[1], fg1, fmaf(d0[1], fg0, acc[b][1]));
        acc[b][3] = fmaf(d1[3], f81, fmaf(d0[3], f80, acc[b][3]));
      }
    } else {
      m3_mma_f16_16816(d0, p1, xv.z, xv.w);
      if (ANY) {
        d0[0] *= fgx; d0[1] *= fgx; d0[2] *= f8x; d0[3] *= f8x;
      }
      if (!XR) {
        const float x0 = m3_f32(xexp(b, 0u) << 23);
        const float x1 = c2 ? m3_f32(xexp(b, 1u) << 23) : 0.0f;
        d0[0] *= x0; d0[2] *= x0; d0[1] *= x1; d0[3] *= x1;
      }
      acc[b][0] = fmaf(d0[0], fg0, acc[b][0]);
      acc[b][2] = fmaf(d0[2], f80, acc[b][2]);
      if (c2) {
        acc[b][1] = fmaf(d0[1], fg0, acc[b][1]);
        acc[b][3] = fmaf(d0[3], f80, acc[b][3]);
      }
    }
  }
}

/// s_mmh_linear's walk over K for NB x tiles (ONE: a single x row, so the
/// columns 2t + 1 are never stored and their scale multiplies are left
/// out): specialised per small-step shape, so no per-block test of the tile
/// count. `fetch(it)` loads iteration it's codes and scales into raw / sca.
template <int F, bool ANY, int NB, bool ONE, typename Fetch>
M3_DEV void s_h_walk(const Fetch& fetch, const uint4 (&raw)[SHalf<F, ANY>::U][2][SHalf<F>::LB / 16u],
                     const u32 (&sca)[SHalf<F, ANY>::U][2][2], const uint4* const (&xp)[S_MMA_MAXBT],
                     const u32* const (&xe)[S_MMA_MAXBT][2], float (&acc)[S_MMA_MAXBT][4], u32 iters,
                     u32 warp, u32 nwarp, u32 nsc, u32 nblk) {
  const u32 U = SHalf<F, ANY>::U;
  for (u32 it = 0; it < iters; ++it) {
    if (it > 0u) fetch(it);
    // this batch's x fragments, issued right behind its weights so both
    // latencies overlap (x is in L2 / L1: every CTA of the launch reads
    // it); the prefill shape (8 tiles) loads them per block instead
    constexpr bool XPRE = NB <= 2 && !S_H_LEAN;
    uint4 xr[XPRE ? U : 1][4][XPRE ? NB : 1];
    // the block exponents of this lane's two output columns (x rows 2t,
    // 2t + 1 of each tile), four blocks a word
    u32 xw[U][NB][2];
#pragma unroll
    for (u32 u = 0; u < U; ++u) {
      u32 q;
      const bool have = s_chunk(warp, nwarp, nsc, U * it + u, q);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        xw[u][b][0] = have ? s_ldx(xe[b][0] + q) : 0u;
        xw[u][b][1] = have && !ONE ? s_ldx(xe[b][1] + q) : 0u;
      }
    }
#pragma unroll
    for (u32 u = 0; u < (XPRE ? U : 0u); ++u) {
      u32 q;
      const bool have = s_chunk(warp, nwarp, nsc, U * it + u, q);
#pragma unroll
      for (u32 j = 0; j < 4u; ++j) {
        const u32 blk = 4u * q + j;
        const bool ok = have && (!ANY || blk < nblk);
#pragma unroll
        for (int b = 0; b < (XPRE ? NB : 0); ++b)
          xr[u][j][b] = ok ? s_ldx(xp[b] + blk * 4u) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (u32 u = 0; u < U; ++u) {
      u32 q;
      if (!s_chunk(warp, nwarp, nsc, U * it + u, q)) break;
      const u32* wg = reinterpret_cast<const u32*>(raw[u][0]);
      const u32* w8 = reinterpret_cast<const u32*>(raw[u][1]);
      S_H_UNROLL
      for (u32 j = 0; j < 4u; ++j) {
        const u32 blk = 4u * q + j;
        if (ANY && j > 0u && blk >= nblk) break;  // a row's last, partial chunk
        const auto xat = [&](int b) {
          return XPRE ? xr[XPRE ? u : 0u][j][XPRE ? b : 0] : s_ldx(xp[b] + blk * 4u);
        };
        const auto xexp = [&](int b, u32 c) { return m3_byte(xw[u][b][c], j); };
        s_h_block<F, ANY, NB, ONE>(wg, w8, sca[u][0], sca[u][1], j, xat, xexp, acc);
      }
    }
  }
}

// ---- the small-step fast walk ------------------------------------------------
// Steps of <= 16 rows with every chunk full (K % 128 == 0) and in-range
// scales (not ANY) on CUDA. Against s_h_walk (bench/NOTES.md session 12):
// running pointers with immediate offsets instead of an index per load
// (each x load cost five address instructions there), no guard on a load
// (rows past N or past the CTA's x rows read row 0, whose results are never
// stored; a warp's chunks are counted, so only a tail batch is short), and
// the first MMA of a block takes no accumulator input (no zeroing).

// Bench variant: 0 = the small-step build without the fast walk (s_h_walk
// everywhere, the r1 / r8 entry points its runtime choice), to time it.
#ifndef S_H_FAST
#define S_H_FAST 1
#endif

/// One lane's read positions at its warp's current super-chunk: W rows
/// g (a) and g + 8 (c) of the CTA's tile and their scale words, and per x
/// tile b the lane's x row (`x`, at byte 16 t of the chunk's 256) and the
/// exponent words of its two output columns 2t, 2t + 1 (`xe`).
template <int F, int NB> struct SHPos {
  static const u32 WS = SChunk<F>::STRIDE;            // code bytes from a row's chunk to its next
  static const u32 SS = F == S_FMT_NVFP4 ? 8u : 4u;   // scale bytes a row and chunk
  const u8 *wa, *wc, *sa, *sc;
  const u8* x[NB];
  const u8* xe[NB][2];
};

/// p advanced by n super-chunks.
template <int F, int NB> M3_DEV void s_h_step(SHPos<F, NB>& p, u32 n) {
  p.wa += n * SHPos<F, NB>::WS; p.wc += n * SHPos<F, NB>::WS;
  p.sa += n * SHPos<F, NB>::SS; p.sc += n * SHPos<F, NB>::SS;
#pragma unroll
  for (int b = 0; b < NB; ++b) { p.x[b] += n * 256u; p.xe[b][0] += n * 4u; p.xe[b][1] += n * 4u; }
}

/// One load batch's weights and scales: `UU` super-chunks of the lane's two
/// rows (a: g, c: g + 8), held in registers from their loads to their
/// products.
template <int F, u32 UU> struct SHRaw {
  static const u32 LW = SHalf<F>::LB / 16u;
  uint4 wa[UU][LW], wc[UU][LW];
  u32 sa[UU][2], sc[UU][2];
};

/// Issue the loads of `UU` super-chunks' weights and scales, `OFF`
/// super-chunks past `p` (immediate offsets), into r; `ok` false (a
/// pipelined walk's batch past its run) loads nothing and leaves r zero,
/// never used. (Zeroed, not skipped by an early return: that form saves
/// the standard build ~5% of an entry's instructions but spills inside
/// the mono build's loops, 4 / 21 -> 219 / 182 local stores / loads in
/// one op body, NVRTC 13.0.)
template <int F, int NB, u32 UU, u32 OFF = 0u>
M3_DEV void s_h_load(const SHPos<F, NB>& p, bool ok, SHRaw<F, UU>& r) {
#pragma unroll
  for (u32 v = 0; v < UU; ++v) {
    const u32 u = v + OFF;
#pragma unroll
    for (u32 i = 0; i < SHRaw<F, UU>::LW; ++i) {
      const uint4 z = make_uint4(0u, 0u, 0u, 0u);
      r.wa[v][i] = ok ? m3_ldg_stream_u4(reinterpret_cast<const uint4*>(p.wa + u * SHPos<F, NB>::WS + 64u * i)) : z;
      r.wc[v][i] = ok ? m3_ldg_stream_u4(reinterpret_cast<const uint4*>(p.wc + u * SHPos<F, NB>::WS + 64u * i)) : z;
    }
    if (F == S_FMT_NVFP4) {
      const uint2 z = make_uint2(0u, 0u);
      const uint2 va = ok ? m3_ldg(reinterpret_cast<const uint2*>(p.sa + u * 8u)) : z;
      const uint2 vc = ok ? m3_ldg(reinterpret_cast<const uint2*>(p.sc + u * 8u)) : z;
      r.sa[v][0] = va.x; r.sa[v][1] = va.y; r.sc[v][0] = vc.x; r.sc[v][1] = vc.y;
    } else {
      r.sa[v][0] = ok ? m3_ldg(reinterpret_cast<const u32*>(p.sa + u * 4u)) : 0u; r.sa[v][1] = 0u;
      r.sc[v][0] = ok ? m3_ldg(reinterpret_cast<const u32*>(p.sc + u * 4u)) : 0u; r.sc[v][1] = 0u;
    }
  }
}

/// The products of r (loaded from `p`) into acc (NB x tiles; ONE: one x
/// row, whose odd columns are never stored and are left out; XR: x
/// row-scaled, no exponent loads): x's exponents and fragments loaded
/// (L1 / L2: every CTA reads them), then 4 UU blocks of two products each.
template <int F, int NB, bool ONE, u32 UU, bool XR>
M3_DEV void s_h_use(const SHPos<F, NB>& p, const SHRaw<F, UU>& r, float (&acc)[S_MMA_MAXBT][4]) {
  u32 xe[UU][NB][2];
  uint4 xv[UU][4][NB];
#pragma unroll
  for (u32 u = 0; u < UU; ++u)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      xe[u][b][0] = XR ? 0u : s_ldx(reinterpret_cast<const u32*>(p.xe[b][0] + u * 4u));
      xe[u][b][1] = ONE || XR ? 0u : s_ldx(reinterpret_cast<const u32*>(p.xe[b][1] + u * 4u));
    }
#pragma unroll
  for (u32 u = 0; u < UU; ++u)
#pragma unroll
    for (u32 j = 0; j < 4u; ++j)
#pragma unroll
      for (int b = 0; b < NB; ++b) xv[u][j][b] = s_ldx(reinterpret_cast<const uint4*>(p.x[b] + u * 256u + j * 64u));
#pragma unroll
  for (u32 u = 0; u < UU; ++u) {
    const u32* wg = reinterpret_cast<const u32*>(r.wa[u]);
    const u32* w8 = reinterpret_cast<const u32*>(r.wc[u]);
#pragma unroll
    for (u32 j = 0; j < 4u; ++j) {
      const auto xat = [&](int b) { return xv[u][j][b]; };
      const auto xexp = [&](int b, u32 c) { return m3_byte(xe[u][b][c], j); };
      s_h_block<F, false, NB, ONE, XR>(wg, w8, r.sa[u], r.sc[u], j, xat, xexp, acc);
    }
  }
}

// Bench variant (issue 12, session 41), a format bitmask as S_H_PIPE_ONE's:
// the one-row walk asks L1 for the weights of the batch S_W_PF_DIST
// batches ahead (`prefetch.global.L1`, no registers) right behind this
// batch's loads, so a warp keeps bytes in flight while it decodes and its
// next batch's loads hit L1. The reading behind it (not measured): a warp
// of the plain walk has no load in flight while it decodes, which on the
// H200 may leave the SM short of bytes in flight; the pipelined walk
// (S_H_PIPE_ONE) keeps them in flight in registers and spills at the
// one-row walks' CTAs an SM (bench/NOTES.md session 33).
#ifndef S_W_PF_L1
#define S_W_PF_L1 0
#endif
#ifndef S_W_PF_DIST
#define S_W_PF_DIST 1
#endif
// Which launches prefetch: 0 every one-row walk, 1 only launches of
// several segments (the gate + up pairs: the microbench's grouped experts
// gained 9-12 points at one row on the H100, where its one-segment tall
// launch lost 5-13; in a step the routed and shared gate + up, not the
// down projections), 2 only one-segment launches.
#ifndef S_W_PF_MODE
#define S_W_PF_MODE 0
#endif
/// L1 prefetches of `UU` super-chunks' weight codes, `OFF` super-chunks
/// past `p` (one per lane and row: a lane quad's 64 bytes share a line).
template <int F, int NB, u32 UU>
M3_DEV void s_h_prefetch_l1(const SHPos<F, NB>& p, u32 off) {
#pragma unroll
  for (u32 v = 0; v < UU; ++v)
#pragma unroll
    for (u32 i = 0; i < SHRaw<F, UU>::LW; ++i) {
      m3_prefetch_l1(p.wa + (off + v) * SHPos<F, NB>::WS + 64u * i);
      m3_prefetch_l1(p.wc + (off + v) * SHPos<F, NB>::WS + 64u * i);
    }
}

/// `UU` super-chunks from `p` into acc: loads first (weights, scales, x
/// exponents, x fragments), then their products. `pf`: the walk has the
/// batch S_W_PF_DIST ahead (S_W_PF_L1's prefetch, one-row walks).
template <int F, int NB, bool ONE, u32 UU, bool XR>
M3_DEV void s_h_batch(const SHPos<F, NB>& p, float (&acc)[S_MMA_MAXBT][4], bool pf = false) {
  SHRaw<F, UU> r;
  s_h_load<F, NB, UU>(p, true, r);
  if (ONE && ((S_W_PF_L1 >> F) & 1) != 0 && pf) s_h_prefetch_l1<F, NB, UU>(p, UU * S_W_PF_DIST);
  s_h_use<F, NB, ONE, UU, XR>(p, r, acc);
}

// Super-chunks of a load batch in the fast walk's one-tile walk of E2M1
// weights and in its one-row walk, in units of SHalf::U, per format (bench
// variants: S_H_TILE_UMUL / S_H_ONE_UMUL set every format's; _FP4, _NV
// (and _FP8 for the one-row walk) one format's, and win over them).
// Measured (bench/NOTES.md):
// - one-tile, MXFP4: 1. The doubled batch won the microbench's experts 16
//   of 128 at 16 rows (H200 session 26: 69.6 -> 72.2%) but lost the MoE
//   layer at 4 rows by 5-6% on both cards (H100 session 27 run 3, H200
//   session 28) and was even at 1 and 16 rows;
// - one-tile, NVFP4: 2 (H200 session 26: 65.1 -> 68.4% at 16 of 128, 16
//   rows; H100 session 27: +5 points at 4 and 16 rows);
// - one-row, NVFP4: 2 at its 4 CTAs an SM (H200 session 28, 10 launches
//   back to back: tall 74.2 -> 76.9%, experts 4 of 128 68.2 -> 71.6%;
//   122 registers, no stack); MXFP4 and MXFP8: 1 (the doubled batch lost
//   at any CTAs an SM: MXFP4 79.2 -> 77.5% at 4, and spills at its 6;
//   MXFP8 91.4 -> 84.9%).
// The batch only groups loads: under S_MMA_INTERLEAVE 0 or 2 these walks
// split K into contiguous runs a warp, each summed in order, so U changes
// no result bit (S_MMA_INTERLEAVE=1 deals them in granules of the batch:
// there it does).
#if defined(S_H_TILE_UMUL)
#ifndef S_H_TILE_UMUL_FP4
#define S_H_TILE_UMUL_FP4 S_H_TILE_UMUL
#endif
#ifndef S_H_TILE_UMUL_NV
#define S_H_TILE_UMUL_NV S_H_TILE_UMUL
#endif
#endif
#ifndef S_H_TILE_UMUL_FP4
#define S_H_TILE_UMUL_FP4 1
#endif
#ifndef S_H_TILE_UMUL_NV
#define S_H_TILE_UMUL_NV 2
#endif
#if defined(S_H_ONE_UMUL)
#ifndef S_H_ONE_UMUL_FP4
#define S_H_ONE_UMUL_FP4 S_H_ONE_UMUL
#endif
#ifndef S_H_ONE_UMUL_NV
#define S_H_ONE_UMUL_NV S_H_ONE_UMUL
#endif
#ifndef S_H_ONE_UMUL_FP8
#define S_H_ONE_UMUL_FP8 S_H_ONE_UMUL
#endif
#endif
#ifndef S_H_ONE_UMUL_FP4
#define S_H_ONE_UMUL_FP4 1
#endif
#ifndef S_H_ONE_UMUL_NV
#define S_H_ONE_UMUL_NV 2
#endif
#ifndef S_H_ONE_UMUL_FP8
#define S_H_ONE_UMUL_FP8 1
#endif
// The fast walk software-pipelined, a bitmask over formats (bit 1 << F,
// F = S_FMT_*: E4M3 2, E2M1 4, E5M2 8, NVFP4 16) for the one-row walk
// (S_H_PIPE_ONE) and the one-tile walk (S_H_PIPE_TILE): batch k + 1's
// weights and scales are loaded before batch k's products, so a warp's
// loads stay in flight while it decodes (the plain walk waits for each
// batch with none in flight). Twice the batch's registers; the summation
// order, so every result bit, is the plain walk's. Contiguous runs only
// (an interleaved walk keeps the plain form). Measured (bench/NOTES.md
// session 33, H100):
// - the mono build (its batch halved): the E2M1 one-tile walks (FP8's
//   are interleaved) and MXFP4's one-row walk pipelined, -3.0% / -3.5% a
//   b4 / b16 mono layer, 128 registers and 800 bytes of stack as before:
//   its default (mono.rs MONO_DEFAULTS);
// - the standard build: off. Its one-row entries then need 4 CTAs an SM
//   (MXFP4: spills at 5 and 6), and MXFP4's one-row microbench lost 2-5
//   points, the b1 layer 5%; NVFP4's tall stack gained 1.5-3 points. On
//   the H200 session 19 measured the same form (its S_H_PIPE, since
//   removed): MXFP4 one row flat (71.5 -> 70.8%, 67.8% at 4 CTAs an SM),
//   MXFP8 -9 points.
#ifndef S_H_PIPE_ONE
#define S_H_PIPE_ONE 0
#endif
#ifndef S_H_PIPE_TILE
#define S_H_PIPE_TILE 0
#endif
/// The batch multipliers of format F's one-tile and one-row walks.
template <int F> struct SHUmul {
  static const u32 TILE = F == S_FMT_NVFP4 ? S_H_TILE_UMUL_NV : S_H_TILE_UMUL_FP4;
  static const u32 ONE = F == S_FMT_NVFP4 ? S_H_ONE_UMUL_NV : F == S_FMT_FP4 ? S_H_ONE_UMUL_FP4 : S_H_ONE_UMUL_FP8;
};

/// A fast walk's shape: super-chunks a load batch (U), whether the CTA's
/// warps take granules of G super-chunks in turn (S_MMA_INTERLEAVE) or
/// contiguous runs, and G: the batch of the build without S_UNROLL_HALF.
/// The mono build halves U, not G, so it deals K to the warps as the
/// standard build does and each warp sums the same super-chunks in the
/// same order: the same bits (bench/NOTES.md session 28: dealt by U, mono
/// differed from the standard path wherever MXFP8 took its interleaved
/// walk, steps of 2-16 rows).
template <int F, int NB, bool ONE> struct SHWalk {
  static const u32 M = ONE ? SHUmul<F>::ONE : SHalf<F>::NIB && NB == 1 ? SHUmul<F>::TILE : 1u;
  static const u32 U = M * SHalf<F>::U;
  static const u32 G = M * SHalf<F>::UG;
  static_assert(G % U == 0, "a granule is whole batches");
  static const bool ILV = S_MMA_INTERLEAVE == 1 || (S_MMA_INTERLEAVE == 2 && SFmt<F>::FP8 && !ONE);
  /// Software-pipelined (S_H_PIPE_ONE / S_H_PIPE_TILE; one-tile: NB == 1).
  static const bool PIPE = !ILV && (((ONE ? S_H_PIPE_ONE : NB == 1 ? S_H_PIPE_TILE : 0) >> F) & 1) != 0;
};

/// The fast walk over warp `warp`'s share of a row's `nsc` super-chunks
/// (`p` at the row's first): a contiguous run of them, or (SHWalk::ILV)
/// granules of G dealt to the warps in turn; whole granules in batches of
/// U, then the rest in batches of U, then one at a time. Either way a
/// warp sums its super-chunks in ascending order.
template <int F, int NB, bool ONE, bool XR = false>
M3_DEV void s_h_fast(SHPos<F, NB> p, u32 warp, u32 nwarp, u32 nsc, float (&acc)[S_MMA_MAXBT][4],
                     bool pf_ok = true) {
  using W = SHWalk<F, NB, ONE>;
  const u32 U = W::U, G = W::ILV ? W::G : W::U, per = (nsc + nwarp - 1u) / nwarp;
  const u32 q0 = W::ILV ? min(warp * G, nsc) : min(warp * per, nsc);
  // n: super-chunks from the walk's position to its share's end; gap: those
  // of the other warps after each granule
  u32 n = W::ILV ? nsc - q0 : min(per, nsc - q0);
  const u32 gap = W::ILV ? (nwarp - 1u) * G : 0u;
  s_h_step(p, q0);
  if (W::PIPE) {
    // a contiguous run (G == U, no gap): the next batch's loads issued
    // before this batch's products, into the other of two register sets
    SHRaw<F, U> ra, rb;
    s_h_load<F, NB, U>(p, n >= U, ra);
    while (n >= U) {
      s_h_load<F, NB, U, U>(p, n >= 2u * U, rb);
      s_h_use<F, NB, ONE, U, XR>(p, ra, acc);
      s_h_step(p, U);
      n -= U;
      if (n < U) break;
      s_h_load<F, NB, U, U>(p, n >= 2u * U, ra);
      s_h_use<F, NB, ONE, U, XR>(p, rb, acc);
      s_h_step(p, U);
      n -= U;
    }
  }
  while (!W::PIPE && n >= G) {
#pragma unroll
    for (u32 k = 0; k < G / U; ++k) {
      s_h_batch<F, NB, ONE, U, XR>(p, acc, pf_ok && n >= (S_W_PF_DIST + 1u) * U + k * U);
      s_h_step(p, U);
    }
    s_h_step(p, gap);
    n = n > G + gap ? n - G - gap : 0u;
  }
  // the rest of the share (less than a granule)
  while (n >= U) {
    s_h_batch<F, NB, ONE, U, XR>(p, acc);
    s_h_step(p, U);
    n -= U;
  }
  for (u32 i = 0; i < n; ++i) {
    s_h_batch<F, NB, ONE, 1, XR>(p, acc);
    s_h_step(p, 1u);
  }
}

/// Tile 0's positions of p (the one-tile walks).
template <int F, int NB> M3_DEV SHPos<F, 1> s_h_pos1(const SHPos<F, NB>& p) {
  SHPos<F, 1> o;
  o.wa = p.wa; o.wc = p.wc; o.sa = p.sa; o.sc = p.sc;
  o.x[0] = p.x[0]; o.xe[0][0] = p.xe[0][0]; o.xe[0][1] = p.xe[0][1];
  return o;
}

/// Row classes of the small-step entry points: any count up to 16 (the
/// walk chosen per CTA), one row, one 8-row tile, or a routed launch of
/// 2-8 rows (a slot of one row by the one-row walk, more by the one-tile
/// walk: the general entry's choice, without its 16-row walk).
#define S_RC_ANY 0
#define S_RC_ONE 1
#define S_RC_ROUTED8 2
#define S_RC_TILE 8

template <int F, bool ANY, int RC = S_RC_ANY>
M3_DEV void s_mmh_linear(const u16* __restrict__ x, const SSegs& segs, u32 K, u32 M, const int* __restrict__ route,
                         u32 max_rows, u32 xdiv, const float* __restrict__ ts) {
  S_SMEM_SCOPE; S_SHARED(float, red, [S_MMA_WARPS][S_MMA_MAXBT * 8][16]);
  S_SHARED(u32, xrow, [S_MMA_MAXBT * 8]); S_SHARED(u32, yrow, [S_MMA_MAXBT * 8]);
  S_SHARED(int, head, [2]);
  M3_PDL_TRIGGER();
  const u32 lane = threadIdx.x % 32u, warp = threadIdx.x / 32u, nwarp = blockDim.x / 32u;
  const u32 g = lane / 4u, t = lane % 4u;
  const SLinPlace at = s_lin_place(route, M);
  const SSeg1 sg = s_lin_seg(segs, at.tile);
  const u32 N = sg.n;
  // mode 3: 8 features a CTA, tile rows g of the gate stack, g + 8 of up
  const bool pair = sg.mode == S_MODE_SWIGLU;
  const u32 n0 = (at.tile - sg.tile0) * (pair ? 8u : 16u);
  const u32 U = SHalf<F, ANY>::U;
  const u32 nsc = (K + 127u) / 128u;
  const u64 rb = SHalf<F>::NIB ? K / 2ull : (u64)K;   // code bytes a row
  const u32 sb = F == S_FMT_NVFP4 ? K / 16u : K / 32u;  // scale bytes a row
  const u32 ra = n0 + g, rc = pair ? ra : n0 + g + 8u;
  const bool oka = ra < N, okc = rc < N;
  const u8* W = reinterpret_cast<const u8*>(sg.w);
  const u8* S = reinterpret_cast<const u8*>(sg.ws);
  const u8* Wc = pair ? reinterpret_cast<const u8*>(sg.w2) : W;
  const u8* Sc = pair ? reinterpret_cast<const u8*>(sg.ws2) : S;
  uint4 raw[SHalf<F, ANY>::U][2][SHalf<F>::LB / 16u];
  u32 sca[SHalf<F, ANY>::U][2][2];
  const u8 *wa = nullptr, *wc = nullptr, *sa = nullptr, *sc = nullptr;
  auto rows_at = [&]() {
    if (SHalf<F>::NIB) {
      // rows ra, rc in their 16-row tiles (E2M1 matrices are whole tiles:
      // rows past N are zero padding, never stored)
      wa = W + (u64)(ra / 16u) * 16u * rb + 64u * (ra % 16u);
      wc = Wc + (u64)(rc / 16u) * 16u * rb + 64u * (rc % 16u);
    } else {
      wa = W + (u64)(oka ? ra : 0u) * rb;
      wc = Wc + (u64)(okc ? rc : 0u) * rb;
    }
    sa = S ? S + (u64)(oka ? ra : 0u) * sb : nullptr;
    sc = Sc ? Sc + (u64)(okc ? rc : 0u) * sb : nullptr;
  };
  auto fetch = [&](u32 it) {
#pragma unroll
    for (u32 u = 0; u < U; ++u) {
      u32 q;
      const bool have = s_chunk(warp, nwarp, nsc, U * it + u, q);
      s_h_fetch<F, ANY>(wa, sa, have && oka, q, K, t, ra % 16u, raw[u][0], sca[u][0]);
      s_h_fetch<F, ANY>(wc, sc, have && okc, q, K, t, rc % 16u, raw[u][1], sca[u][1]);
    }
  };
  // the fast walk (every chunk full, scales in range, small steps, CUDA)
  constexpr bool FAST = S_H_FAST && !ANY && S_MMA_MAXBT == 2 && !S_H_LEAN;
  u32 cnt, ge = 0u;
  if (!route) {
    rows_at();
    if (FAST) {
      // the first batch of the warp's fast walk (s_h_fast) into L2 while
      // the previous kernel drains; a plain launch's row count, so its
      // walk, is known before the wait (s_lin_rows)
      const u32 m0 = at.chunk * S_MMA_MAXBT * 8u, c0 = m0 < M ? min(S_MMA_MAXBT * 8u, M - m0) : 0u;
      const bool one0 = RC == S_RC_ONE || (RC != S_RC_TILE && c0 == 1u);
      const bool tile0 = RC == S_RC_TILE || RC == S_RC_ROUTED8 || c0 <= 8u;
      const u32 u0 = one0 ? SHWalk<F, 1, true>::U : tile0 ? SHWalk<F, 1, false>::U : SHWalk<F, 2, false>::U;
      const bool il0 =
          one0 ? SHWalk<F, 1, true>::ILV : tile0 ? SHWalk<F, 1, false>::ILV : SHWalk<F, 2, false>::ILV;
      // (an interleaved walk's warp starts at its granule, warp * G, as
      // s_h_fast's does; G > U where the mono build halves the batch)
      const u32 g0 = one0 ? SHWalk<F, 1, true>::G : tile0 ? SHWalk<F, 1, false>::G : SHWalk<F, 2, false>::G;
      const u32 per = (nsc + nwarp - 1u) / nwarp;
      const u32 q0 = il0 ? min(warp * g0, nsc) : min(warp * per, nsc);
      const u32 nq = il0 ? min(g0, nsc - q0) : min(per, nsc - q0);
      const u32 ahead = u0 * S_PDL_AHEAD;
      for (u32 i = 0; i < min(nq, ahead); ++i) {
        m3_prefetch_l2(wa + (u64)(q0 + i) * SHPos<F, 1>::WS);
        m3_prefetch_l2(wc + (u64)(q0 + i) * SHPos<F, 1>::WS);
      }
    } else {
      fetch(0u);
    }
  }
  M3_PDL_WAIT();
  if (!s_lin_rows(route, max_rows, xdiv, M, at.chunk, head, xrow, yrow, cnt, ge)) return;
  if (route) {
    W += (u64)ge * sg.w_es;
    Wc += (u64)ge * sg.w_es;
    if (S) S += (u64)ge * sg.ws_es;
    if (Sc) Sc += (u64)ge * sg.ws_es;
    rows_at();
    if (!FAST) fetch(0u);
  }
  const u32 nbt = (cnt + 7u) / 8u;
  // this lane's x row in each 8-row tile (rows past cnt read row 0: they
  // reach only output columns that are never stored)
  const u8* xb = reinterpret_cast<const u8*>(x);
  const u64 xs = s_xh_stride(K);
  const uint4* xp[S_MMA_MAXBT];
  const u32* xe[S_MMA_MAXBT][2];
#pragma unroll
  for (int b = 0; b < S_MMA_MAXBT; ++b) {
    const u32 m = (u32)b * 8u + g, c0 = (u32)b * 8u + 2u * t;
    xp[b] = reinterpret_cast<const uint4*>(xb + (u64)(m < cnt ? xrow[m] : xrow[0]) * xs) + t;
#pragma unroll
    for (u32 c = 0; c < 2u; ++c)
      xe[b][c] = reinterpret_cast<const u32*>(xb + (u64)(c0 + c < cnt ? xrow[c0 + c] : xrow[0]) * xs + 2u * K);
  }
  float acc[S_MMA_MAXBT][4];
#pragma unroll
  for (int b = 0; b < S_MMA_MAXBT; ++b) acc[b][0] = acc[b][1] = acc[b][2] = acc[b][3] = 0.0f;
  const u32 iters = (((nsc + nwarp - 1u) / nwarp) + U - 1u) / U;
  const u32 nblk = K / 32u;
  // x row-scaled: the fast walk leaves its exponent to the epilogue; but
  // not MXFP8's one-row walk, which ran no faster row-scaled on the H200
  // while the second walk raised its entry's registers 116 -> 126
  // (bench/NOTES.md session 25): it reads the row-scaled x's block bytes as
  // any x's
  const bool one = RC == S_RC_ONE || (RC != S_RC_TILE && cnt == 1u);
  const bool xr = (segs.flags & S_SEGS_XROW) != 0u && (SHalf<F>::NIB || !one);
  const uint4* const(&xc)[S_MMA_MAXBT] = xp;
  const u32* const(&ec)[S_MMA_MAXBT][2] = xe;
  if (FAST) {
    SHPos<F, S_MMA_MAXBT> p;
    p.wa = wa + 16u * t;
    p.wc = wc + 16u * t;
    p.sa = sa;
    p.sc = sc;
#pragma unroll
    for (int b = 0; b < S_MMA_MAXBT; ++b) {
      p.x[b] = reinterpret_cast<const u8*>(xp[b]);
      p.xe[b][0] = reinterpret_cast<const u8*>(xe[b][0]);
      p.xe[b][1] = reinterpret_cast<const u8*>(xe[b][1]);
    }
    // one walk per row class: the one-row and one-tile entry points hold
    // only theirs (fewer registers: more CTAs an SM); a row-scaled x its own
    if (one) {
      const bool pf_ok = S_W_PF_MODE == 0 || (S_W_PF_MODE == 1) == (segs.nseg > 1u);
      if (xr) s_h_fast<F, 1, true, true>(s_h_pos1(p), warp, nwarp, nsc, acc, pf_ok);
      else s_h_fast<F, 1, true>(s_h_pos1(p), warp, nwarp, nsc, acc, pf_ok);
    } else if (RC == S_RC_TILE || RC == S_RC_ROUTED8 || nbt == 1u) {
      if (xr) s_h_fast<F, 1, false, true>(s_h_pos1(p), warp, nwarp, nsc, acc);
      else s_h_fast<F, 1, false>(s_h_pos1(p), warp, nwarp, nsc, acc);
    } else if (xr) {
      s_h_fast<F, S_MMA_MAXBT, false, true>(p, warp, nwarp, nsc, acc);
    } else {
      s_h_fast<F, S_MMA_MAXBT, false>(p, warp, nwarp, nsc, acc);
    }
  } else if (S_MMA_MAXBT <= 2 && !S_H_LEAN) {
    // small steps: one copy of the walk per tile count (and one for one row)
    if (cnt == 1u) s_h_walk<F, ANY, 1, true>(fetch, raw, sca, xc, ec, acc, iters, warp, nwarp, nsc, nblk);
    else if (nbt == 1u) s_h_walk<F, ANY, 1, false>(fetch, raw, sca, xc, ec, acc, iters, warp, nwarp, nsc, nblk);
    else s_h_walk<F, ANY, S_MMA_MAXBT, false>(fetch, raw, sca, xc, ec, acc, iters, warp, nwarp, nsc, nblk);
  } else {
    // the prefill shape (up to 8 tiles): tiles past the CTA's rows read row 0
    s_h_walk<F, ANY, S_MMA_MAXBT, false>(fetch, raw, sca, xc, ec, acc, iters, warp, nwarp, nsc, nblk);
  }
  // NVFP4: undo E2M1's 2^-6 as E4M3 operands (exact)
  s_lin_store(red, acc, nbt, warp, nwarp, cnt, n0, sg, ge, ts, xrow, yrow, F == S_FMT_NVFP4 ? 64.0f : 1.0f,
              FAST && xr ? xb + 2u * K : nullptr, xs);
}

#define S_MMH_LINEAR_RC(name, F, ANY, RC, MINB)                                                                 \
  M3_KERNEL void __launch_bounds__(S_MMA_WARPS * 32, MINB)                                                   \
      name(const u16* __restrict__ x, const SSegs segs, u32 K, u32 M, const int* __restrict__ route,           \
           u32 max_rows, u32 xdiv, const float* __restrict__ ts) {                                               \
    s_mmh_linear<F, ANY || S_FORCE_ANY, RC>(x, segs, K, M, route, max_rows, xdiv, ts);                         \
  }
#define S_MMH_LINEAR(name, F, ANY) S_MMH_LINEAR_RC(name, F, ANY, S_RC_ANY, S_MMA_MINB)

#define S_MMA_LINEAR(name, F, ANY)                                                                              \
  M3_KERNEL void __launch_bounds__(S_MMA_WARPS * 32, S_MMA_MINB)                                         \
      name(const u16* __restrict__ x, const SSegs segs, u32 K, u32 M, const int* __restrict__ route,           \
           u32 max_rows, u32 xdiv, const float* __restrict__ ts) {                                               \
    s_mma_linear<F, ANY || S_FORCE_ANY>(x, segs, K, M, route, max_rows, xdiv, ts);                             \
  }
// Bench variant: 1 = every entry point compiled as its `_any` form, to time
// the split in one run. Runs 6-7 (bench/NOTES.md session 6) used it when
// that form was the kernel before the split; since the E4M3 NaN-code change
// the E4M3 `_any` form takes the general decode on every segment, so for
// E4M3 it is now slower than the pre-split kernel.
#ifndef S_FORCE_ANY
#define S_FORCE_ANY 0
#endif
// bf16 and NVFP4 have no scale-dependent branch (ANY is moot); MXFP4, E4M3
// and E5M2 come fast-only and general (the `_any` entry points, chosen by
// the host per launch: WFmt::mma_kernel_any_scale)
S_MMA_LINEAR(m3s_mma_bf16, S_FMT_BF16, true)
S_MMH_LINEAR(m3s_mma_e4m3, S_FMT_E4M3, false)
S_MMH_LINEAR(m3s_mma_e4m3_any, S_FMT_E4M3, true)
S_MMH_LINEAR(m3s_mma_e5m2, S_FMT_E5M2, false)
S_MMH_LINEAR(m3s_mma_e5m2_any, S_FMT_E5M2, true)
S_MMH_LINEAR(m3s_mma_fp4, S_FMT_FP4, false)
S_MMH_LINEAR(m3s_mma_fp4_any, S_FMT_FP4, true)
S_MMH_LINEAR(m3s_mma_nvfp4, S_FMT_NVFP4, false)
S_MMH_LINEAR(m3s_mma_nvfp4_any, S_FMT_NVFP4, true)
// The small-step build's one-row and one-tile entry points (the host takes
// them for steps of 1 and of 2-8 rows): each holds one walk, so it needs
// fewer registers. Their CTAs an SM (launch bounds) per format and row
// class, measured (bench/NOTES.md session 12 run 3: 4, 5 and 6 timed on the
// kernel microbench's stacks and expert launches at 1 and 4 rows; 5 was
// the slowest of the three in 8 of 15 cases and the fastest in 1);
// S_R1_MINB / S_R8_MINB set all of them, S_R1_MINB_FP8 / S_R8_MINB_FP8
// (..._FP4, _NV) one format's (bench variants).
#if S_MMA_MAXBT == 2 && S_H_FAST && !defined(S_MONO) && !defined(M3_HIP)
#ifdef S_R1_MINB
#define S_R1_MINB_FP8 S_R1_MINB
#define S_R1_MINB_FP4 S_R1_MINB
#define S_R1_MINB_NV S_R1_MINB
#endif
#ifndef S_R1_MINB_FP8
#define S_R1_MINB_FP8 4
#endif
#ifndef S_R1_MINB_FP4
#define S_R1_MINB_FP4 6
#endif
#ifndef S_R1_MINB_NV
#define S_R1_MINB_NV 4
#endif
#ifdef S_R8_MINB
#define S_R8_MINB_FP8 S_R8_MINB
#define S_R8_MINB_FP4 S_R8_MINB
#define S_R8_MINB_NV S_R8_MINB
#endif
#ifndef S_R8_MINB_FP8
#define S_R8_MINB_FP8 4
#endif
#ifndef S_R8_MINB_FP4
#define S_R8_MINB_FP4 6
#endif
#ifndef S_R8_MINB_NV
#define S_R8_MINB_NV 6
#endif
S_MMH_LINEAR_RC(m3s_mma_e4m3_r1, S_FMT_E4M3, false, S_RC_ONE, S_R1_MINB_FP8)
S_MMH_LINEAR_RC(m3s_mma_e4m3_r8, S_FMT_E4M3, false, S_RC_TILE, S_R8_MINB_FP8)
S_MMH_LINEAR_RC(m3s_mma_e5m2_r1, S_FMT_E5M2, false, S_RC_ONE, S_R1_MINB_FP8)
S_MMH_LINEAR_RC(m3s_mma_e5m2_r8, S_FMT_E5M2, false, S_RC_TILE, S_R8_MINB_FP8)
S_MMH_LINEAR_RC(m3s_mma_fp4_r1, S_FMT_FP4, false, S_RC_ONE, S_R1_MINB_FP4)
S_MMH_LINEAR_RC(m3s_mma_fp4_r8, S_FMT_FP4, false, S_RC_TILE, S_R8_MINB_FP4)
S_MMH_LINEAR_RC(m3s_mma_nvfp4_r1, S_FMT_NVFP4, false, S_RC_ONE, S_R1_MINB_NV)
S_MMH_LINEAR_RC(m3s_mma_nvfp4_r8, S_FMT_NVFP4, false, S_RC_TILE, S_R8_MINB_NV)
// MXFP4 routed launches of 9-64 rows (host: WFmt::mma_kernel_routed,
// ROUTED_SMALL_ROWS; S_ROUTED_SMALL=0 turns it off): the general entry's
// walks at S_RS_MINB_FP4 CTAs an SM (5: 96 registers, 64 bytes of spill in
// the 16-row walk alone; NVRTC 13.0) where the general entry runs at 4
// (128 registers, 16 bytes). Such a step routes most slots 1-4 rows, whose
// one-row and one-tile walks ran 8-10% faster L2-fed at 5 CTAs an SM, the
// 16-row walk 12% slower; the MoE layer 4.6-5.2% faster at b12-b64 (H100,
// bench/NOTES.md sessions 44-45). The same walks, so the same bits.
// NVFP4 has none: its general entry spills 416 bytes at 4 CTAs an SM, and
// its one-row and one-tile walks alone (9-16 rows of a slot by the tile
// walk twice, 100 bytes at 4) gained under 1% a layer and lost 28% on
// 16-row slots (session 45, commit 7a96e40).
#ifndef S_RS_MINB_FP4
#define S_RS_MINB_FP4 5
#endif
S_MMH_LINEAR_RC(m3s_mma_fp4_rs, S_FMT_FP4, false, S_RC_ANY, S_RS_MINB_FP4)
// FP4 routed launches of 2-8 rows under S_ROUTED_TILE=1 (a bench option;
// host: WFmt::mma_kernel_routed_tile): the `_r8` entries run every slot
// by the one-tile walk, a slot of one row too, where such a step puts
// most slots (b4: 16 pairs over 128 experts); these run it by the one-row
// walk, as the general entry does. NVRTC 13.0: MXFP4 80 registers, 32
// bytes of spill at 6 CTAs an SM (`_r8`'s own); NVFP4 128 and none at 4
// (`_r8` at 6: 80 and 292). Built only under the option.
#ifndef S_ROUTED_TILE
#define S_ROUTED_TILE 0
#endif
#ifndef S_R8S_MINB_NV
#define S_R8S_MINB_NV 4
#endif
#if S_ROUTED_TILE
S_MMH_LINEAR_RC(m3s_mma_fp4_r8s, S_FMT_FP4, false, S_RC_ROUTED8, S_R8_MINB_FP4)
S_MMH_LINEAR_RC(m3s_mma_nvfp4_r8s, S_FMT_NVFP4, false, S_RC_ROUTED8, S_R8S_MINB_NV)
#endif
#endif

// ---- the step's other kernels (not in an MMA-only unit) ---------------------
// S_MMA_ONLY = 1 (put first by the host for a tensor-core variant: the
// small-step build and the bench variants, linear.rs `mma_unit_source`):
// the unit then holds only the tensor-core linears above, which is all the
// host loads from it; the default unit holds the rest (and the mono unit,
// which never sets it). Leaving the rest out took the small-step unit's
// NVRTC compile from 77 to 27 s of one core (bench/NOTES.md, session 49).
#if !S_MMA_ONLY

/// Group the step's (row, expert) pairs by expert for the expert-mode
/// linear: slot s < D (D = distinct experts, ascending ids) gets the record
/// [expert, rows, pair ids ascending]; slots D..nslots get rows 0. With
/// `chunk` C > 0 (the host's `PathOptions::route_chunk`), an expert of c
/// pairs takes ceil(c / C) consecutive slots of at most C pairs each (C =
/// the linear's rows a CTA), so the linears launch one z-block and no CTA
/// of an expert with few pairs is empty; D is then the records, and the
/// host passes max_rows = C (records of 2 + C ints). The
/// pairs of row t are t * kk + c, kk = k + fold: c < k the router's choice
/// ids[t * k + c] (negative: none, skipped), c = k (fold = 1) expert ne, the
/// shared expert folded into the table. One CTA, ne + fold <= 1024.
M3_DEV int s_pair_expert(const int* ids, u32 p, u32 k, u32 kk, u32 ne) {
  const u32 t = p / kk, c = p - t * kk;
  return c < k ? ids[t * k + c] : (int)ne;
}
/// Records of an expert of c pairs, at most `per` a record (s_route):
/// ceil(c / per); none for an expert not chosen.
M3_DEV u32 s_route_recs(int c, u32 per) { return c > 0 ? 1u + ((u32)c - 1u) / per : 0u; }
/// m3s_route's work for the calling CTA (any block of whole warps): the
/// arrays are the caller's shared memory (nt = ne + fold <= 1024 entries
/// each, part M3_WARP + 1: the runs' record counts, then all the records).
/// Slots go to the chosen experts in ascending id: lane l of warp 0 counts
/// the records of the chosen experts of its run of ceil(nt / M3_WARP) ids
/// and takes the sum of the runs before its own.
M3_DEV void s_route(const int* ids, u32 rows, u32 k, u32 fold, u32 ne, u32 nslots, u32 max_rows, u32 chunk,
                    int* out, int* cnt, int* slot, int* part) {
  const u32 kk = k + fold, pairs = rows * kk, nt = ne + fold;
  const u32 per = chunk != 0u ? chunk : 0xffffffffu;  // pairs a record at most
  for (u32 e = threadIdx.x; e < nt; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (u32 p = threadIdx.x; p < pairs; p += blockDim.x) {
    int e = s_pair_expert(ids, p, k, kk, ne);
    if (e >= 0 && (u32)e < nt) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  const u32 run = (nt + M3_WARP - 1u) / M3_WARP;
  if (threadIdx.x < M3_WARP) {
    const u32 e0 = threadIdx.x * run, e1 = min(nt, e0 + run);
    int c = 0;
    for (u32 e = e0; e < e1; ++e) c += (int)s_route_recs(cnt[e], per);
    part[threadIdx.x] = c;
    M3_SYNC_WARP();
    int d = 0;
    for (u32 l = 0; l < threadIdx.x; ++l) d += part[l];
    for (u32 e = e0; e < e1; ++e) {
      slot[e] = cnt[e] > 0 ? d : -1;
      d += (int)s_route_recs(cnt[e], per);
    }
    if (threadIdx.x == M3_WARP - 1u) part[M3_WARP] = d;  // the records
  }
  __syncthreads();
  const u32 stride = S_ROUTE_STRIDE(max_rows);
  // each chosen expert's record(s), pairs in ascending order
  for (u32 e = threadIdx.x; e < nt; e += blockDim.x) {
    const int s = slot[e];
    if (s < 0 || (u32)s >= nslots) continue;
    const u32 c = (u32)cnt[e], nrec = s_route_recs(cnt[e], per);
    for (u32 j = 0; j < nrec && (u32)s + j < nslots; ++j) {
      int* rec = out + ((u64)s + j) * stride;
      rec[0] = (int)e;
      rec[1] = (int)min(per, c - j * per);
    }
    u32 o = 0;
    for (u32 p = 0; p < pairs; ++p) {
      if (s_pair_expert(ids, p, k, kk, ne) != (int)e) continue;
      const u32 j = o / per, i = o - j * per;
      if ((u32)s + j < nslots && i < max_rows) out[((u64)s + j) * stride + 2u + i] = (int)p;
      ++o;
    }
  }
  // slots past the records: no rows
  for (u32 s = (u32)part[M3_WARP] + threadIdx.x; s < nslots; s += blockDim.x) {
    out[(u64)s * stride] = 0;
    out[(u64)s * stride + 1] = 0;
  }
}
M3_KERNEL void m3s_route(const int* __restrict__ ids, u32 rows, u32 k, u32 fold, u32 ne, u32 nslots, u32 max_rows,
                         u32 chunk, int* __restrict__ out) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  S_SMEM_SCOPE; S_SHARED(int, cnt, [1024]);
  S_SHARED(int, slot, [1024]);
  S_SHARED(int, part, [M3_WARP + 1]);
  s_route(ids, rows, k, fold, ne, nslots, max_rows, chunk, out, cnt, slot, part);
}

/// r[t] = f32(embed[tok[t]]). Grid T.
M3_KERNEL void m3s_embed(const u32* __restrict__ tok, const u16* __restrict__ table, u32 H, float* __restrict__ r) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  const u16* src = table + (u64)tok[blockIdx.x] * H;
  for (u32 i = threadIdx.x; i < H; i += blockDim.x) r[(u64)blockIdx.x * H + i] = m3_bf16_to_f32(src[i]);
}

/// Value i of row t of a MoE layer's output (MODEL.md): its experts'
/// bf16 rows `ye` (k of them a row, weights `w`, then the folded shared
/// expert's when `fold`) weighted and summed in their order, plus the
/// shared expert's bf16 row when given. One body for m3s_moe_combine and
/// the RMSNorm that takes the combine in (m3s_rmsnorm's `cye`), so both
/// give the same bits.
M3_DEV float s_moe_mix(const u16* __restrict__ ye, const float* __restrict__ w, u32 k, u32 fold,
                       const u16* __restrict__ shared, u32 H, u32 t, u32 i) {
  const u32 kk = k + fold;
  float o = 0.0f;
  for (u32 c = 0; c < k; ++c) o = fmaf(w[t * k + c], m3_bf16_to_f32(ye[((u64)t * kk + c) * H + i]), o);
  if (fold) o += m3_bf16_to_f32(ye[((u64)t * kk + k) * H + i]);
  else if (shared) o += m3_bf16_to_f32(shared[(u64)t * H + i]);
  return o;
}

/// Threads of a m3s_rmsnorm CTA (the host's RMSNORM_BLOCK; a multiple of
/// 64 dividing 1024: whole wavefronts on either vendor).
#define S_NORM_BLOCK 256

/// out[i] = bf16(RMSNorm(x[rows ? rows[i] : i])) (and the f16 layout of
/// the MX linears into xh, if given). Grid (output rows, n / S_NORM_BLOCK
/// rounded up): CTA (i, j) writes values [j B, (j + 1) B) of row i, and
/// every CTA of a row sums the squares of the whole row itself (from L2:
/// 24 KB a row of 6144). The one-CTA-a-row launch it replaces took ~2.2x
/// as long at one row (Nsight Compute, ~10 vs ~4.6 us; bench/NOTES.md
/// session 13): one CTA's chain of loads, reductions and stores.
///
/// The sum is that of a 1024-thread block, whatever S_NORM_BLOCK is: thread
/// t plays virtual threads t, t + B, ... < 1024, each summing its values
/// vt, vt + 1024, ... in order; each real warp reduces the virtual warp
/// its lanes played with one shuffle tree; one thread adds the virtual
/// warps' sums in order. So every slice of a row sees the same bits, and
/// so does the mono build (which runs this body in its persistent CTAs).
/// The weight is loaded before the dependency wait (no kernel writes it).
///
/// `xrow` (with xh): 0 = the f16 rows scaled a block at a time (s_xh_put);
/// else they are row-scaled (s_xh_row_pe) and `xrow` holds the f32 bits of
/// max |1 + w| over the weight (a constant of the weights, computed at load:
/// the host's norm_bound; NaN weights left out as fmaxf leaves them, -0.0's
/// bits for a zero bound), p from a bound every CTA of a row computes alike:
/// max |x| / r * max |1 + w| (max |x| taken in the loop that sums the
/// squares), exponents added so nothing overflows. (Session 23's kernel
/// read the whole weight for that maximum in every CTA.)
///
/// `cye` (not null): the previous MoE layer's combine taken in. The row is
/// x + s_moe_mix(cye, cw, ck, cfold, csh) (what m3s_moe_combine would have
/// added into x, the same bits), every CTA computing it for the whole row
/// from x as it was; CTA (i, j) writes its values of the new row to `rout`
/// (not x: other CTAs of the row still read x). One launch a layer fewer.
/// (m3s_rmsnorm_mix: with a combine; m3s_rmsnorm: without, so the plain
/// norm keeps its registers.)
template <bool MIX>
M3_DEV void s_rmsnorm(const float* __restrict__ x, const u32* __restrict__ rows, const float* __restrict__ w,
                      float eps, u32 n, u16* __restrict__ out, u8* __restrict__ xh, u32 xrow,
                      const u16* __restrict__ cye, const float* __restrict__ cw, u32 ck, u32 cfold,
                      const u16* __restrict__ csh, float* __restrict__ rout) {
  constexpr u32 B = S_NORM_BLOCK, VT = 1024u / S_NORM_BLOCK;
  const u32 i = blockIdx.y * B + threadIdx.x;
  const float wi = i < n ? w[i] : 0.0f;
  const bool rs = xrow != 0u && xh != nullptr;
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  S_SMEM_SCOPE; S_SHARED(float, part, [1024 / M3_WARP]);
  S_SHARED(float, total, );
  S_SHARED(float, pmx, [1024 / M3_WARP]);
  S_SHARED(u32, rpe, );
  const u32 src = rows ? rows[blockIdx.x] : blockIdx.x;
  const float* xr = x + (u64)src * n;
  // value k of the row (with the combine taken in, if any)
  const auto xat = [&](u32 k) -> float {
    const float v = xr[k];
    return MIX ? v + s_moe_mix(cye, cw, ck, cfold, csh, n, src, k) : v;
  };
  // all the loads first (VT x 8 in flight), then the sums in their order
  float v[VT][8];
#pragma unroll
  for (u32 a = 0; a < VT; ++a)
#pragma unroll
    for (u32 j = 0; j < 8; ++j) {
      const u32 k = threadIdx.x + a * B + j * 1024u;
      v[a][j] = k < n ? xat(k) : 0.0f;
    }
  float xm = 0.0f;  // max |x| of this thread's values (row-scaled only)
#pragma unroll
  for (u32 a = 0; a < VT; ++a) {
    const u32 vt = threadIdx.x + a * B;
    float s = 0.0f;
#pragma unroll
    for (u32 j = 0; j < 8; ++j) s += v[a][j] * v[a][j];
    for (u32 k = vt + 8u * 1024u; k < n; k += 1024u) {
      const float xk = xat(k);
      s += xk * xk;
    }
    if (rs) {
#pragma unroll
      for (u32 j = 0; j < 8; ++j) xm = fmaxf(xm, fabsf(v[a][j]));
      for (u32 k = vt + 8u * 1024u; k < n; k += 1024u) xm = fmaxf(xm, fabsf(xat(k)));
    }
    s = m3_warp_sum(s);
    if (vt % M3_WARP == 0) part[vt / M3_WARP] = s;
  }
  if (rs) {
    // the maxima (order-free: every CTA of the row gets the same)
#pragma unroll
    for (int m = M3_WARP / 2; m > 0; m >>= 1) xm = fmaxf(xm, M3_SHFL_XOR(xm, m));
    if (threadIdx.x % M3_WARP == 0) pmx[threadIdx.x / M3_WARP] = xm;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (u32 p = 0; p < 1024u / M3_WARP; ++p) t += part[p];
    total = t;
    if (rs) {
      float mx = 0.0f;
      for (u32 p = 0; p < B / M3_WARP; ++p) mx = fmaxf(mx, pmx[p]);
      const float r = sqrtf(t / (float)n + eps);
      // every output |bf16((x / r) (1 + w))| <= 2^u: mx < 2^(ex - 126),
      // 1 / r <= 2^(127 - er), max |1 + w| < 2^(ew - 126), and one more
      // binade for the roundings (biased f32 exponents; a NaN / Inf row or
      // weight: p = 1)
      const u32 bx = m3_bits(mx), bw = xrow & 0x7fffffffu, br = m3_bits(r);  // -0: a zero bound
      const bool fin = bx < 0x7f800000u && bw < 0x7f800000u && br < 0x7f800000u && br != 0u;
      const int u = (int)(bx >> 23) - (int)(br >> 23) + (int)(bw >> 23) - 124;
      rpe = fin ? s_xh_row_pe(u, bx == 0u || bw == 0u) : 127u;
    }
  }
  __syncthreads();
  // (n a multiple of 32 when xh is given: a 32-lane group holds one whole
  // block, so the test is group-uniform)
  if (i >= n) return;
  const float r = sqrtf(total / (float)n + eps);
  const float xi = xat(i);
  if (MIX) rout[(u64)src * n + i] = xi;
  const u16 b = m3_bf16_from_f32((xi / r) * (1.0f + wi));
  out[(u64)blockIdx.x * n + i] = b;
  if (xh) {
    u8* row = xh + (u64)blockIdx.x * s_xh_stride(n);
    if (rs) s_xh_put_pe(m3_bf16_to_f32(b), threadIdx.x % 32u, row, n, i / 32u, rpe);
    else s_xh_put(m3_bf16_to_f32(b), threadIdx.x % 32u, row, n, i / 32u);
  }
}
M3_KERNEL void M3_HIP_BLOCK(S_NORM_BLOCK) m3s_rmsnorm(const float* __restrict__ x, const u32* __restrict__ rows,
                                                     const float* __restrict__ w, float eps, u32 n,
                                                     u16* __restrict__ out, u8* __restrict__ xh, u32 xrow) {
  s_rmsnorm<false>(x, rows, w, eps, n, out, xh, xrow, nullptr, nullptr, 0u, 0u, nullptr, nullptr);
}
M3_KERNEL void M3_HIP_BLOCK(S_NORM_BLOCK)
    m3s_rmsnorm_mix(const float* __restrict__ x, const u32* __restrict__ rows, const float* __restrict__ w, float eps,
                    u32 n, u16* __restrict__ out, u8* __restrict__ xh, u32 xrow, const u16* __restrict__ cye,
                    const float* __restrict__ cw, u32 ck, u32 cfold, const u16* __restrict__ csh,
                    float* __restrict__ rout) {
  s_rmsnorm<true>(x, rows, w, eps, n, out, xh, xrow, cye, cw, ck, cfold, csh, rout);
}

/// Cache element types (`kind` of a cache write, `cache_kind` of the
/// attention and indexer kernels; the host's attn::KvKind): E4M3 codes,
/// bf16 bits, NVFP4 (ARCHITECTURE.md, NVFP4 KV cache).
#define S_CACHE_FP8 0
#define S_CACHE_BF16 1
#define S_CACHE_NVFP4 2

/// The 16 E2M1 codes of one NVFP4 block as its 8 code bytes: one 8-byte
/// store (`dst` a multiple of 8).
M3_DEV void s_nvfp4_store8(u8* dst, const u32 (&c)[16]) {
  u32 w0 = 0u, w1 = 0u;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w0 |= (c[2 * j] | (c[2 * j + 1] << 4)) << (8 * j);
    w1 |= (c[8 + 2 * j] | (c[8 + 2 * j + 1] << 4)) << (8 * j);
  }
  *reinterpret_cast<uint2*>(dst) = make_uint2(w0, w1);
}

/// Store n bf16 values `src` (bits) at value `dst` of a cache of `kind`
/// (S_CACHE_*): bf16 bits, e4m3(x / scale) codes saturating RNE, or NVFP4
/// blocks of 16 with `scale` as the global (codes at dst / 2, E4M3 block
/// scales in `scales` at dst / 16; n and dst multiples of 16). Thread `i0`
/// of `step` takes values (or NVFP4 blocks) i0, i0 + step, ...
M3_DEV void s_cache_store(u32 kind, u64 cache, u64 scales, float scale, u64 dst, const u16* src, u32 n, u32 i0,
                          u32 step) {
  if (kind == S_CACHE_BF16) {
    u16* c = reinterpret_cast<u16*>(cache);
    for (u32 i = i0; i < n; i += step) c[dst + i] = src[i];
  } else if (kind == S_CACHE_NVFP4) {
    u8* codes = reinterpret_cast<u8*>(cache) + dst / 2u;
    u8* sc = reinterpret_cast<u8*>(scales) + dst / 16u;
    for (u32 b = i0; b < n / 16u; b += step) {
      float v[16];
#pragma unroll
      for (int j = 0; j < 16; ++j) v[j] = m3_bf16_to_f32(src[16u * b + (u32)j]);
      u32 c[16];
      sc[b] = (u8)m3_nvfp4_block(v, (double)scale, c);
      // dst / 2 + 8b is a multiple of 8: dst is a multiple of 16
      s_nvfp4_store8(codes + 8u * b, c);
    }
  } else {
    u8* c = reinterpret_cast<u8*>(cache);
    for (u32 i = i0; i < n; i += step) {
      double a = (double)m3_bf16_to_f32(src[i]) / (double)scale;
      c[dst + i] = (u8)m3_elem_encode_sat(M3_ELEM_E4M3, a);
    }
  }
}

/// One tensor of a fused per-head norm + RoPE launch: x [T, heads, d]
/// bf16 -> out (0: none), weight w [d] (0: no norm, the values as they
/// are: V), rotary dims rd (0: no RoPE); its CTAs are blockIdx.x in
/// [h0, h0 + heads). With `cache` set, row t's result also goes to slot
/// slots[t] of that cache (rows of heads * d values, `jobs.kind`, fp8's
/// divisor or NVFP4's global `cscale`, NVFP4 block scales to `scales`):
/// the values and bits of m3s_cache_write reading `out` back.
struct SHnJob {
  u64 x, w, out, cache, scales;
  u32 heads, d, rd, h0;
  float cscale;
  u32 pad;
};
struct SHnJobs {
  SHnJob j[6];
  double theta;
  float eps;
  u32 n, kind, pad;
};

/// Per-head Gemma RMSNorm (f32) then partial NeoX RoPE, bf16 out, for up
/// to 6 tensors at once (q, k, v and the indexer's q, k), each optionally
/// written to its cache as well (K, V and the index key: no cache-write
/// launch of its own). One warp per (t, head); d <= 256 (NVFP4 caches: a
/// multiple of 16). Grid (total heads, T), block M3_WARP (lanes stride by
/// M3_WARP: a 32-thread block on a wave64 device would skip values).
M3_KERNEL void m3s_headnorm_rope(const SHnJobs jobs, const u32* __restrict__ pos, const u32* __restrict__ slots) {
  M3_PDL_TRIGGER();
  S_SMEM_SCOPE; S_SHARED(float, v, [256]); S_SHARED(u16, ob, [256]);
  S_SHARED(float, wv, [256]); S_SHARED(float, rc, [128]); S_SHARED(float, rs, [128]);
  SHnJob jb = jobs.j[0];
#pragma unroll
  for (int i = 1; i < 6; ++i)
    if ((u32)i < jobs.n && blockIdx.x >= jobs.j[i].h0) jb = jobs.j[i];
  const u32 heads = jb.heads, d = jb.d, rd = jb.rd;
  const u16* x = reinterpret_cast<const u16*>(jb.x);
  const float* w = reinterpret_cast<const float*>(jb.w);
  u16* out = reinterpret_cast<u16*>(jb.out);
  const u32 lane = threadIdx.x;
  const u32 h = blockIdx.x - jb.h0;
  const u64 base = ((u64)blockIdx.y * heads + h) * d;
  // before the dependency wait, what no kernel of the step writes: the
  // norm weights, the row's position (a step input, copied in before the
  // step's first launch) and its rotation, and its cache slot
  const u32 half = rd / 2u;
  const double p = (double)pos[blockIdx.y];
  for (u32 j = lane; j < half; j += M3_WARP) {
    double f = pow(jobs.theta, -2.0 * (double)j / (double)rd);
    double a = p * f;
    const double two_pi = 6.283185307179586476925286766559;
    a = a - two_pi * floor(a / two_pi);
    rc[j] = cosf((float)a);
    rs[j] = sinf((float)a);
  }
  if (w)
    for (u32 i = lane; i < d; i += M3_WARP) wv[i] = w[i];
  const u64 slot = jb.cache ? (u64)slots[blockIdx.y] : 0u;
  M3_PDL_WAIT();
  float s = 0.0f;
  for (u32 i = lane; i < d; i += M3_WARP) {
    float a = m3_bf16_to_f32(x[base + i]);
    v[i] = a;
    s += a * a;
  }
  s = m3_warp_sum(s);
  float r = sqrtf(s / (float)d + jobs.eps);
  M3_SYNC_WARP();
  if (w)
    for (u32 i = lane; i < d; i += M3_WARP) v[i] = (v[i] / r) * (1.0f + wv[i]);
  M3_SYNC_WARP();
  for (u32 j = lane; j < d; j += M3_WARP) {
    if (j < half) {
      const float c = rc[j], sn = rs[j];
      float x0 = v[j], x1 = v[j + half];
      ob[j] = m3_bf16_from_f32(x0 * c - x1 * sn);
      ob[j + half] = m3_bf16_from_f32(x1 * c + x0 * sn);
    } else if (j >= rd) {
      ob[j] = m3_bf16_from_f32(v[j]);
    }
  }
  M3_SYNC_WARP();
  if (out)
    for (u32 i = lane; i < d; i += M3_WARP) out[base + i] = ob[i];
  if (!jb.cache) return;
  const u64 dst = slot * (u64)(heads * d) + (u64)h * d;
  s_cache_store(jobs.kind, jb.cache, jb.scales, jb.cscale, dst, ob, d, lane, M3_WARP);
}

/// One cache write of a fused launch: cache[slot[t], :] = x[t, :] over
/// `width` values, as bf16 bits (kind S_CACHE_BF16: the cache is u16
/// [slot][width], x stored as is), as e4m3(x / scale) codes (S_CACHE_FP8:
/// saturating RNE; the cache is u8 [slot][width]), or as NVFP4 blocks of 16
/// with `scale` as the global (S_CACHE_NVFP4: m3_nvfp4_block; the cache is
/// packed E2M1 codes u8 [slot][width / 2], `scales` E4M3 u8
/// [slot][width / 16]; width a multiple of 16).
struct SCwJob {
  u64 x, cache, scales;
  u32 width;
  float scale;
  u32 kind, pad;
};
struct SCwJobs {
  SCwJob j[3];
  u32 n, pad;
};

/// Up to 3 cache writes (K, V, index K) in one launch. Grid (T, n),
/// block 128 (NVFP4: a thread per block of 16 values).
M3_KERNEL void m3s_cache_write(const SCwJobs jobs, const u32* __restrict__ slots) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  SCwJob jb = jobs.j[0];
#pragma unroll
  for (int i = 1; i < 3; ++i)
    if ((u32)i == blockIdx.y) jb = jobs.j[i];
  const u16* x = reinterpret_cast<const u16*>(jb.x);
  const u32 width = jb.width;
  const u64 slot = slots[blockIdx.x];
  s_cache_store(jb.kind, jb.cache, jb.scales, jb.scale, slot * width, x + (u64)blockIdx.x * width, width,
                threadIdx.x, blockDim.x);
}

M3_DEV u64 s_slot(const u32* __restrict__ bt, const u32* __restrict__ bt_off, u32 seq, u32 page, u32 j) {
  return (u64)bt[bt_off[seq] + j / page] * page + j % page;
}

/// SwiGLU-OAI: a = bf16(((u'+1) g') sigmoid(alpha g')). g, u bf16.
/// `xpe` (with xh): the f16 rows row-scaled with this one p = 2^(xpe - 127)
/// for every row (the host's bound from alpha and the clamp limit,
/// `swiglu_row_pe`); 0: a power of two per block (s_xh_put).
M3_KERNEL void m3s_swiglu(const u16* __restrict__ gt, const u16* __restrict__ up, float alpha, float limit,
                          u16* __restrict__ a, u32 n, u8* __restrict__ xh, u32 K, u32 xpe) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const u16 b = s_swiglu_oai(gt[i], up[i], alpha, limit);
  a[i] = b;
  // xh: rows of K values also in the MX linears' f16 layout (n and K
  // multiples of 32: a 32-lane group is one block of one row)
  if (xh) {
    const u64 r = i / K;
    const u32 c = (u32)(i - r * K);
    if (xpe) s_xh_put_pe(m3_bf16_to_f32(b), threadIdx.x % 32u, xh + r * s_xh_stride(K), K, c / 32u, xpe);
    else s_xh_put(m3_bf16_to_f32(b), threadIdx.x % 32u, xh + r * s_xh_stride(K), K, c / 32u);
  }
}

/// r[t] += o, o = sum_c w[t,c] * f32(ye[t*kk+c]) (ids ascending) +
/// f32(shared[t]) (MODEL.md: the shared expert last, unscaled), kk = k +
/// fold: with the shared expert folded into the expert table (fold = 1) its
/// output is ye[t*kk+k], added at the same point; o also stored to yout[t]
/// (f32 [T][H]) when yout is not null (the FFN-output tap). Grid (T,
/// ceil(H / 256)), block 256.
M3_KERNEL void m3s_moe_combine(float* __restrict__ r, const u16* __restrict__ ye, const float* __restrict__ w, u32 k,
                               u32 fold, const u16* __restrict__ shared, u32 H, float* __restrict__ yout) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  const u32 t = blockIdx.x;
  const u32 i = blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= H) return;
  const float o = s_moe_mix(ye, w, k, fold, shared, H, t, i);
  if (yout) yout[(u64)t * H + i] = o;
  r[(u64)t * H + i] += o;
}

/// acc[i] += f32(y[i]) for i < n (a bf16 linear output added into the f32
/// residual, or stored into a zeroed f32 tap). Grid ceil(n / 256), block 256.
M3_KERNEL void m3s_add_bf16(float* __restrict__ acc, const u16* __restrict__ y, u32 n) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] += m3_bf16_to_f32(y[i]);
}

/// A hint: bring bytes [0, n) at p (16-byte aligned; n a multiple of 16)
/// into L2, S_L2PF_CHUNK bytes a bulk prefetch (sm_90's
/// cp.async.bulk.prefetch.L2: one instruction a chunk, no registers held,
/// nothing waits for it). Launched on the side stream for weights no step
/// writes, so it takes no PDL wait. Elsewhere (HIP, before sm_90) it does
/// nothing. Any grid of 1-D blocks: chunk i goes to thread i mod threads.
#ifndef S_L2PF_CHUNK
#define S_L2PF_CHUNK 16384u
#endif
M3_KERNEL void m3s_l2_prefetch(const unsigned char* __restrict__ p, u64 n) {
#if defined(M3_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const u64 step = (u64)gridDim.x * blockDim.x * S_L2PF_CHUNK;
  for (u64 off = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * S_L2PF_CHUNK; off < n; off += step) {
    const u32 len = (u32)(n - off < S_L2PF_CHUNK ? n - off : S_L2PF_CHUNK);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(len) : "memory");
  }
#else
  (void)p;
  (void)n;
#endif
}

/// MXFP4 fake quantization of expert inputs (MODEL.md 5, `--act mxfp4`):
/// each block of 32 along K of each bf16 row is quantized with the `even`
/// scale rule (FORMATS.md MX) and decoded back, out = bf16(decode(code) *
/// 2^(s-127)): the f32 product is exact (an E2M1 value times a power of two,
/// never below 2^-128) or overflows to +-Inf, and either is a bf16 value, so
/// this is bit for bit cpu-ref's MxTensor::quantize(.., Fp4E2M1, Even)
/// .dequantize(). The arithmetic is m3_mx_quantize's (formats.cu): f32 amax,
/// m3_mx_scale_byte, codes = encode_sat(v / 2^e) in f64 (exact). A block
/// holding NaN / Inf decodes to NaN (scale 0xFF) in every element.
/// Grid (ceil(K / 256), rows), block 256 (K a multiple of 32): thread =
/// element, and each aligned 32-thread group is one MX block, its amax
/// reduced by XOR shuffles of offsets 16..1 (within the group on 32- and
/// 64-wide hardware alike).
M3_KERNEL void m3s_act_mxfp4(const u16* __restrict__ x, u32 rows, u32 K, u16* __restrict__ out) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  const u32 r = blockIdx.y, k = blockIdx.x * blockDim.x + threadIdx.x;
  // every thread takes part in the shuffles; K % 32 == 0 makes a group
  // all inside or all outside the row
  const bool in = r < rows && k < K;
  const u16 h = in ? x[(u64)r * K + k] : (u16)0u;
  // |v| as bits: non-negative floats order like their bit patterns, and
  // NaN / Inf are exactly the patterns >= 0x7f800000
  u32 ab = ((u32)h << 16) & 0x7fffffffu;
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
    const u32 o = M3_SHFL_XOR(ab, m);
    ab = o > ab ? o : ab;
  }
  if (!in) return;
  u16 res;
  if (ab >= 0x7f800000u) {
    res = 0x7fc0u;  // scale 0xFF: the block decodes to NaN (codes 0)
  } else {
    const u32 s = m3_mx_scale_byte(M3_ELEM_E2M1, M3_RULE_EVEN, m3_f32(ab));
    const int e = (int)s - 127;
    const u32 c = m3_elem_encode_sat(M3_ELEM_E2M1, ldexp((double)m3_bf16_to_f32(h), -e));
    res = m3_bf16_from_f32(__fmul_rn(m3_elem_decode(M3_ELEM_E2M1, c), m3_e8m0_decode((u8)s)));
  }
  out[(u64)r * K + k] = res;
}

/// encode_sat_e4m3(x / sa), the quotient's exact value rounded once to
/// nearest even (FORMATS.md's PTPC rule; cpu-ref takes the quotient in f64).
/// sm_89+: the f32 quotient (correctly rounded) then the hardware's
/// round-to-nearest-even saturating conversion; where the f32 quotient is
/// exactly an E4M3 midpoint the exact quotient may lie off it, so the
/// division's residual (exact through fma) moves it one f32 ulp toward the
/// exact value first: no double rounding. Elsewhere: the f64 path.
M3_DEV u32 s_e4m3_quotient(float x, float sa) {
#if defined(M3_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  float q = __fdiv_rn(x, sa);
  const u32 b = m3_bits(q), ab = b & 0x7fffffffu;
  const int e = (int)(ab >> 23) - 127;
  bool mid;
  if (e >= -6) {
    mid = (ab & 0xfffffu) == 0x80000u;  // 3 kept bits, then exactly one half
  } else {
    const float t = m3_f32(ab) * 1024.0f;  // E4M3 subnormal quantum 2^-9: halves are odd multiples of 2^-10
    mid = t == rintf(t) && (((u32)t) & 1u);
  }
  if (mid) {
    const float r = __fmaf_rn(-q, sa, x);  // x - q * sa, exact: its sign says where x / sa lies
    if (r != 0.0f) q = m3_f32((r > 0.0f) == (q > 0.0f) ? b + 1u : b - 1u);
  }
  u16 pair;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(q));
  return (u32)(pair & 0xffu);
#else
  return m3_elem_encode_sat(M3_ELEM_E4M3, __ddiv_rn((double)x, (double)sa));
#endif
}

/// x rows (bf16, `rows` x K) into the MX linears' f16 layout `xh` (rows of
/// s_xh_stride(K) bytes): one 32-lane group a block, 8 blocks a CTA of
/// S_XH_BLOCK threads.
#define S_XH_BLOCK 256
M3_KERNEL void __launch_bounds__(S_XH_BLOCK) m3s_x_f16(const u16* __restrict__ x, u32 rows, u32 K,
                                                       u8* __restrict__ xh) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  const u32 nb = K / 32u;
  const u32 gb = blockIdx.x * (S_XH_BLOCK / 32u) + threadIdx.x / 32u, l = threadIdx.x % 32u;
  if (gb >= rows * nb) return;  // whole 32-lane groups leave together
  const u32 r = gb / nb, blk = gb % nb;
  const float v = m3_bf16_to_f32(x[(u64)r * K + blk * 32u + l]);
  s_xh_put(v, l, xh + (u64)r * s_xh_stride(K), K, blk);
}

/// PTPC FP8 activation quantization (ARCHITECTURE.md, Online quantization),
/// per row of bf16 x: sa = f32(amax / 448) over the row (zero row: 1.0; an
/// underflow to 0: the smallest subnormal), codes encode_sat_e4m3(x / sa)
/// (`s_e4m3_quotient`), written as the codes' bf16 values (exact: E4M3 fits
/// bf16) for the tensor-core linear, and sa to scales[row]. A row holding
/// NaN / Inf gets sa = NaN (so every output of the row is NaN, as on the
/// CPU) and zero values. Grid rows, block S_PTPC_BLOCK: each thread keeps
/// its (up to 8) values in registers, so x is read once.
#define S_PTPC_BLOCK 1024
M3_KERNEL void __launch_bounds__(S_PTPC_BLOCK) m3s_act_ptpc(const u16* __restrict__ x, u32 rows, u32 K,
                                                            u16* __restrict__ out, float* __restrict__ scales) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  S_SMEM_SCOPE; S_SHARED(u32, part, [S_PTPC_BLOCK / M3_WARP]);
  S_SHARED(u32, amax_bits, );
  const u32 r = blockIdx.x;
  if (r >= rows) return;
  const u16* xr = x + (u64)r * K;
  u16 v[8];
  // |v| as bits: non-negative floats order like their bit patterns, and
  // NaN / Inf are exactly the patterns >= 0x7f800000
  u32 ab = 0u;
#pragma unroll
  for (u32 j = 0; j < 8; ++j) {
    const u32 i = threadIdx.x + j * blockDim.x;
    v[j] = i < K ? xr[i] : (u16)0u;
    const u32 b = ((u32)v[j] << 16) & 0x7fffffffu;
    ab = b > ab ? b : ab;
  }
  for (u32 i = threadIdx.x + 8u * blockDim.x; i < K; i += blockDim.x) {
    const u32 b = ((u32)xr[i] << 16) & 0x7fffffffu;
    ab = b > ab ? b : ab;
  }
#pragma unroll
  for (int m = M3_WARP / 2; m > 0; m >>= 1) {
    const u32 o = M3_SHFL_XOR(ab, m);
    ab = o > ab ? o : ab;
  }
  if (threadIdx.x % M3_WARP == 0) part[threadIdx.x / M3_WARP] = ab;
  __syncthreads();
  if (threadIdx.x == 0) {
    u32 t = 0u;
    for (u32 i = 0; i < blockDim.x / M3_WARP; ++i) t = part[i] > t ? part[i] : t;
    amax_bits = t;
  }
  __syncthreads();
  const u32 am = amax_bits;
  u16* o = out + (u64)r * K;
  if (am >= 0x7f800000u) {
    if (threadIdx.x == 0) scales[r] = m3_nan();
    for (u32 i = threadIdx.x; i < K; i += blockDim.x) o[i] = 0u;
    return;
  }
  float sa = 1.0f;
  if (am != 0u) {
    sa = __fdiv_rn(m3_f32(am), 448.0f);
    if (sa == 0.0f) sa = m3_f32(1u);
  }
  if (threadIdx.x == 0) scales[r] = sa;
#pragma unroll
  for (u32 j = 0; j < 8; ++j) {
    const u32 i = threadIdx.x + j * blockDim.x;
    if (i < K) o[i] = m3_bf16_from_f32(m3_elem_decode(M3_ELEM_E4M3, s_e4m3_quotient(m3_bf16_to_f32(v[j]), sa)));
  }
  for (u32 i = threadIdx.x + 8u * blockDim.x; i < K; i += blockDim.x)
    o[i] = m3_bf16_from_f32(m3_elem_decode(M3_ELEM_E4M3, s_e4m3_quotient(m3_bf16_to_f32(xr[i]), sa)));
}

/// The DSpark draft's Markov bias: out[v] = sum_j e[prev][j] * w[j][v] in
/// f32, j in order (e `[vocab][r]`, w `[r][vocab]`, both f32). One thread
/// per v, so the w loads of a warp are consecutive. Grid vocab / block.
M3_KERNEL void m3s_markov_bias(const float* __restrict__ e, const float* __restrict__ w, u32 prev, u32 r,
                               u32 vocab, float* __restrict__ out) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  const u32 v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vocab) return;
  const float* er = e + (u64)prev * r;
  float s = 0.0f;
  for (u32 j = 0; j < r; ++j) s += er[j] * w[(u64)j * vocab + v];
  out[v] = s;
}

/// Threads of m3s_linear_f32w and m3s_router_small's logits (the host's
/// F32W_BLOCK): a compile-time stride, so a thread's 32 loads of a row are
/// one base register and immediate offsets.
#define S_F32W_BLOCK 256u
// 1: s_linear_f32w's row loop issues every x load of its rows (one or
// two, S_F32W_ROWS) before the first product: a memory round trip a pass
// (CUDA default); 0: one row at a time, each product under its own
// `k < K`, which NVRTC 13.0 compiled into loads issued a few at a time (the
// form before session 37; HIP keeps it: the new one spills VGPRs in
// gfx950's / gfx942's m3s_mono and m3s_linear_f32w, `cargo xtask
// kernels`). The same products in the same order: the same output bits.
#ifndef S_F32W_HOIST
#if defined(M3_HIP)
#define S_F32W_HOIST 0
#else
#define S_F32W_HOIST 1
#endif
#endif
// Rows of x a pass with S_F32W_HOIST (1 or 2; the mono build takes 1, its
// MONO_DEFAULTS: session 37).
#ifndef S_F32W_ROWS
#define S_F32W_ROWS 2
#endif
#if S_F32W_ROWS != 1 && S_F32W_ROWS != 2
#error "S_F32W_ROWS is 1 or 2"
#endif

/// R rows of x (from `xr`, this thread's first element; row stride K) times
/// a thread's weights `wv` (k = threadIdx.x + j * S_F32W_BLOCK; j < nj are
/// the k below K, and wv[j] is 0 past them), each summed over the warp into
/// s: every load first, then each row's products in j order. A j past nj
/// adds 0 x 0, so the products need no bound. That add can only turn a -0
/// thread sum into +0 (a -0 comes from an FMA whose product underflows);
/// the warp sums carry at most that zero's sign, and the output's sum
/// starts at +0.0f, which takes either zero to +0: the output's bits are
/// those of the bounded loop. With `if (k < K)` on each product, NVRTC 13.0
/// sank each load to its product: the mono build's loads went out in
/// groups of ~8 (3-4 memory round trips a row; ~3 us a row at b16), a
/// small test kernel's one at a time (bench/NOTES.md session 37).
template <u32 R>
M3_DEV void s_f32w_rows(const u16* xr, u32 K, u32 nj, const float (&wv)[32], float (&s)[R]) {
  u16 xv[R][32];
#pragma unroll
  for (u32 j = 0; j < 32; ++j)
#pragma unroll
    for (u32 r = 0; r < R; ++r) xv[r][j] = j < nj ? s_ldx(xr + (u64)r * K + j * S_F32W_BLOCK) : (u16)0;
#pragma unroll
  for (u32 r = 0; r < R; ++r) {
    float t = 0.0f;
#pragma unroll
    for (u32 j = 0; j < 32; ++j)
      t += m3_bf16_to_f32(xv[r][j]) * wv[j];
    s[r] = m3_warp_sum(t);
  }
}

/// y[m][n] = sum_k f32(x[m][k]) * w[n][k] for f32 weights (the router):
/// CTA n's share, its weight row held in registers (K <= 32 * S_F32W_BLOCK,
/// loaded before the dependency wait) and reused for every row m; `part`
/// is the caller's shared [8][32] (8 warps of 32 lanes; 4 wavefronts of 64
/// use half). Block S_F32W_BLOCK.
#if S_F32W_HOIST
M3_DEV void s_linear_f32w(const u16* x, const float* __restrict__ w, u32 n, u32 N, u32 K, u32 M, float* y,
                          float (*part)[32]) {
  M3_PDL_TRIGGER();
  const u32 lane = threadIdx.x % M3_WARP, warp = threadIdx.x / M3_WARP;
  const u32 nw = S_F32W_BLOCK / M3_WARP;
  const float* wr = w + (u64)n * K + threadIdx.x;
  // the j with k = threadIdx.x + j * S_F32W_BLOCK below K
  const u32 nj = K > threadIdx.x ? (K - threadIdx.x + S_F32W_BLOCK - 1u) / S_F32W_BLOCK : 0u;
  float wv[32];
#pragma unroll
  for (u32 j = 0; j < 32; ++j) wv[j] = j < nj ? wr[j * S_F32W_BLOCK] : 0.0f;
  M3_PDL_WAIT();
  const u16* xt = x + threadIdx.x;
  for (u32 m0 = 0; m0 < M; m0 += 32u) {
    const u32 mc = min(32u, M - m0);
    u32 mm = 0;
#if S_F32W_ROWS > 1
    for (; mm + 2u <= mc; mm += 2u) {
      float s[2];
      s_f32w_rows<2>(xt + (u64)(m0 + mm) * K, K, nj, wv, s);
      if (lane == 0) { part[warp][mm] = s[0]; part[warp][mm + 1u] = s[1]; }
    }
#endif
    for (; mm < mc; ++mm) {
      float s[1];
      s_f32w_rows<1>(xt + (u64)(m0 + mm) * K, K, nj, wv, s);
      if (lane == 0) part[warp][mm] = s[0];
    }
    __syncthreads();
    for (u32 m = threadIdx.x; m < mc; m += S_F32W_BLOCK) {
      float t = 0.0f;
      for (u32 p = 0; p < nw; ++p) t += part[p][m];
      y[(u64)(m0 + m) * N + n] = t;
    }
    __syncthreads();
  }
}
#else
M3_DEV void s_linear_f32w(const u16* x, const float* __restrict__ w, u32 n, u32 N, u32 K, u32 M, float* y,
                          float (*part)[32]) {
  M3_PDL_TRIGGER();
  const u32 lane = threadIdx.x % M3_WARP, warp = threadIdx.x / M3_WARP;
  const u32 nw = blockDim.x / M3_WARP;
  const float* wr = w + (u64)n * K;
  float wv[32];
#pragma unroll
  for (u32 j = 0; j < 32; ++j) {
    const u32 k = threadIdx.x + j * blockDim.x;
    wv[j] = k < K ? wr[k] : 0.0f;
  }
  M3_PDL_WAIT();
  for (u32 m0 = 0; m0 < M; m0 += 32u) {
    const u32 mc = min(32u, M - m0);
    for (u32 mm = 0; mm < mc; ++mm) {
      const u16* xr = x + (u64)(m0 + mm) * K;
      float s = 0.0f;
#pragma unroll
      for (u32 j = 0; j < 32; ++j) {
        const u32 k = threadIdx.x + j * blockDim.x;
        if (k < K) s += m3_bf16_to_f32(xr[k]) * wv[j];
      }
      s = m3_warp_sum(s);
      if (lane == 0) part[warp][mm] = s;
    }
    __syncthreads();
    for (u32 mm = threadIdx.x; mm < mc; mm += blockDim.x) {
      float t = 0.0f;
      for (u32 w2 = 0; w2 < nw; ++w2) t += part[w2][mm];
      y[(u64)(m0 + mm) * N + n] = t;
    }
    __syncthreads();
  }
}
#endif
/// One CTA per output feature n. Grid N, block S_F32W_BLOCK.
M3_KERNEL void m3s_linear_f32w(const u16* __restrict__ x, const float* __restrict__ w, u32 N, u32 K, u32 M,
                               float* __restrict__ y) {
  S_SMEM_SCOPE; S_SHARED(float, part, [8][32]);
  s_linear_f32w(x, w, blockIdx.x, N, K, M, y, part);
}

/// A warp's shared memory for s_router_row: the chosen ids and their
/// sigmoids in the order chosen, then ascending.
struct SRouterWarp {
  int id[16], sid[16];
  float sg[16], ssg[16];
};

// 1: the router's arrays sized to the experts it has (a lane's share of up
// to S_ROUTER_FIT_PL * M3_WARP of them: the 128 of M3 / M3.1 on CUDA) and
// its finished-CTA count fenced by one thread of a CTA; 0: arrays for 1024
// experts and every thread fenced (the form before session 34). Same
// arithmetic, same order, same bits. Measured (H100, bench/NOTES.md
// session 34, 2 rounds interleaved against the build before, every 16-step
// gate bitwise), ms a MoE layer: mono b1 0.2776 -> 0.2576 (-7.2%), b4 -3.3%,
// b16 -2.5% (the router's share of a b1 mono layer's critical path 19.8
// us; 35.2 in another call's profile of the old form); the standard path
// b1 0.1553 -> 0.1516 (-2.4%), b4 -1.2%, b16 -1.3%. HIP keeps 0:
// unmeasured there, and the fit arrays take gfx950's m3s_router_small to
// 40 spilled SGPRs (38 before; `cargo xtask kernels`);
// its fence stays every thread's whatever the define (an AMD wave waits
// only for its own stores, so one thread's fence would not cover the rest).
#ifndef S_ROUTER_FIT
#if defined(M3_HIP)
#define S_ROUTER_FIT 0
#else
#define S_ROUTER_FIT 1
#endif
#endif
#define S_ROUTER_FIT_PL 4u
#if S_ROUTER_FIT && !defined(M3_HIP)
#define S_ROUTER_ONE_FENCE 1
#else
#define S_ROUTER_ONE_FENCE 0
#endif
/// Thread 0's count of the router's finished CTAs (after the CTA barrier
/// that follows its z writes): 1 in the last CTA, which may then read every
/// CTA's z after its next CTA barrier. `done` back to 0 is the caller's.
M3_DEV u32 s_router_count(u32* done, u32 n) {
  if (S_ROUTER_ONE_FENCE) m3_fence_gpu();
  const u32 last = atomicAdd(done, 1u) == n - 1u ? 1u : 0u;
  if (S_ROUTER_ONE_FENCE && last) m3_fence_gpu();
  return last;
}

/// Router of row t by one warp (cpu-ref's arithmetic and tie rules):
/// s = sigmoid(z); top-k by s + bias (ties: lower id; NaN counts as -inf);
/// ids ascending; w = s / sum(s chosen, ascending id) * scaling. Experts
/// lane + i * M3_WARP, i < PL; ne <= PL * M3_WARP, k <= 16. Every load is
/// issued before the first use and the chosen experts' sigmoids stay on
/// chip (the lane holding one hands it over through `sh`), so the row
/// costs one memory round trip; `ids` may point to shared memory (the fused
/// router's copy for its grouping) or be null, `ids_g` is the global output.
template <u32 PL>
M3_DEV void s_router_row_pl(const float* z, const float* bias, u32 ne, u32 k, float scaling, u32 t, int* ids_g,
                            float* wts, SRouterWarp& sh, int* ids) {
  const u32 lane = threadIdx.x % M3_WARP;
  const float* zr = z + (u64)t * ne;
  float zv[PL], bv_[PL];
#pragma unroll
  for (u32 i = 0; i < PL; ++i) {
    const u32 e = lane + i * M3_WARP;
    zv[i] = e < ne ? zr[e] : 0.0f;
    bv_[i] = e < ne ? bias[e] : 0.0f;
  }
  float v[PL], sg[PL];
  u32 used = 0u;  // bit i: expert lane + i * M3_WARP already chosen
#pragma unroll
  for (u32 i = 0; i < PL; ++i) {
    u32 e = lane + i * M3_WARP;
    float x = -S_INF;
    sg[i] = 0.0f;
    if (e < ne) {
      float s = 1.0f / (1.0f + expf(-zv[i]));
      sg[i] = s;
      x = s + bv_[i];
      if (x != x) x = -S_INF;
    }
    v[i] = x;
  }
  for (u32 c = 0; c < k; ++c) {
    float bv = 0.0f;
    int bi = -1;
#pragma unroll
    for (u32 i = 0; i < PL; ++i) {
      u32 e = lane + i * M3_WARP;
      if (e >= ne || (used >> i) & 1u) continue;
      if (bi < 0 || v[i] > bv) { bv = v[i]; bi = (int)e; }
    }
    for (int o = M3_WARP / 2; o > 0; o >>= 1) {
      float ov = M3_SHFL_XOR(bv, o);
      int oi = M3_SHFL_XOR(bi, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
    }
    // (every lane now holds the winner; its lane hands over its sigmoid)
    if (lane == 0) { sh.id[c] = bi; sh.sg[c] = 0.0f; }
    M3_SYNC_WARP();
    if (bi >= 0 && (u32)bi % M3_WARP == lane) {
      const u32 ib = (u32)bi / M3_WARP;
      float s = 0.0f;
#pragma unroll
      for (u32 i = 0; i < PL; ++i) s = i == ib ? sg[i] : s;
      sh.sg[c] = s;
      used |= 1u << ib;
    }
  }
  M3_SYNC_WARP();
  // ascending ids: lane c takes rank #{chosen ids below its own}
  if (lane < k) {
    const int me = sh.id[lane];
    u32 r = 0;
    for (u32 c = 0; c < k; ++c) r += (sh.id[c] < me || (sh.id[c] == me && c < lane)) ? 1u : 0u;
    sh.sid[r] = me;
    sh.ssg[r] = sh.sg[lane];
  }
  M3_SYNC_WARP();
  float sum = 0.0f;
  for (u32 c = 0; c < k; ++c) sum += sh.ssg[c];
  if (lane < k) {
    ids_g[t * k + lane] = sh.sid[lane];
    if (ids) ids[t * k + lane] = sh.sid[lane];
    wts[t * k + lane] = sh.ssg[lane] / sum * scaling;
  }
  M3_SYNC_WARP();
}
/// s_router_row_pl with the arrays the step's `ne` experts need (ne <= 1024).
M3_DEV void s_router_row(const float* z, const float* bias, u32 ne, u32 k, float scaling, u32 t, int* ids_g,
                         float* wts, SRouterWarp& sh, int* ids) {
  if (S_ROUTER_FIT && ne <= S_ROUTER_FIT_PL * M3_WARP)
    s_router_row_pl<S_ROUTER_FIT_PL>(z, bias, ne, k, scaling, t, ids_g, wts, sh, ids);
  else
    s_router_row_pl<1024u / M3_WARP>(z, bias, ne, k, scaling, t, ids_g, wts, sh, ids);
}
/// Grid T, block M3_WARP (a 32-thread block on a wave64 device would see
/// half the experts).
M3_KERNEL void m3s_router_warp(const float* __restrict__ z, const float* __restrict__ bias, u32 ne, u32 k,
                               float scaling, int* __restrict__ ids, float* __restrict__ wts) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  S_SMEM_SCOPE; S_SHARED(SRouterWarp, sh, );
  s_router_row(z, bias, ne, k, scaling, blockIdx.x, ids, wts, sh, nullptr);
}

/// Threads of m3s_router_small (the host's ROUTER_SMALL_BLOCK).
#define S_ROUTER_BLOCK 256
static_assert(S_ROUTER_BLOCK == S_F32W_BLOCK, "m3s_router_small's logits are s_linear_f32w's");
/// Rows m3s_router_small takes at most (the host's ROUTER_SMALL_ROWS): its
/// chosen ids also sit in shared memory for the grouping.
#define S_ROUTER_ROWS 16
/// The router of a small step in one launch instead of m3s_linear_f32w,
/// m3s_router_warp and m3s_route: CTA n computes expert n's logit of every
/// row into z (s_linear_f32w); the last CTA to finish (counted at `done`,
/// which it sets back to 0 for the next launch) then runs the top-k of
/// every row (a warp a row) and groups the pairs by expert (s_route, from
/// a shared copy of the ids). The same arithmetic as the three launches:
/// the same bits. Grid ne, block S_ROUTER_BLOCK, M <= S_ROUTER_ROWS. (z:
/// written here and read back by the last CTA, so no read-only loads.)
M3_KERNEL void M3_HIP_BLOCK(S_ROUTER_BLOCK) m3s_router_small(
    const u16* __restrict__ x, const float* __restrict__ w, u32 ne, u32 K, u32 M, float* z,
    const float* __restrict__ bias, u32 k, float scaling, int* __restrict__ ids, float* __restrict__ wts, u32 fold,
    u32 nslots, u32 max_rows, int* __restrict__ route, u32* done) {
  S_SMEM_SCOPE; S_SHARED(float, part, [8][32]);
  S_SHARED(SRouterWarp, sh, [S_ROUTER_BLOCK / M3_WARP]);
  S_SHARED(int, sids, [S_ROUTER_ROWS * 16]);
  S_SHARED(int, cnt, [1024]);
  S_SHARED(int, slot, [1024]);
  S_SHARED(int, rpart, [M3_WARP + 1]);
  S_SHARED(u32, last, );
  s_linear_f32w(x, w, blockIdx.x, ne, K, M, z, part);
  // every thread's z values out before the count (the last-block-done
  // pattern): the CTA barrier orders them before thread 0's fence, which is
  // cumulative (as cooperative groups' grid sync does it), or every thread
  // fences (S_ROUTER_ONE_FENCE 0)
  if (!S_ROUTER_ONE_FENCE) m3_fence_gpu();
  __syncthreads();
  if (threadIdx.x == 0) last = s_router_count(done, gridDim.x);
  __syncthreads();
  if (last == 0u) return;
  if (!S_ROUTER_ONE_FENCE) m3_fence_gpu();
  if (threadIdx.x == 0) *done = 0u;
  const u32 warp = threadIdx.x / M3_WARP;
  for (u32 t = warp; t < M; t += blockDim.x / M3_WARP)
    s_router_row(z, bias, ne, k, scaling, t, ids, wts, sh[warp], sids);
  __syncthreads();
  s_route(sids, M, k, fold, ne, nslots, max_rows, 0u, route, cnt, slot, rpart);
}

/// Greedy, phase 1: the best (value, id) of slice blockIdx.y of row
/// blockIdx.x (lowest id on ties, NaN never wins; id 0xffffffff = none).
/// Grid (nl, parts), block 256.
M3_KERNEL void m3s_argmax_part(const float* __restrict__ logits, u32 vocab, float* __restrict__ pv,
                               u32* __restrict__ pi) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  S_SMEM_SCOPE; S_SHARED(float, bv, [32]);
  S_SHARED(u32, bi, [32]);
  const u32 parts = gridDim.y, part = blockIdx.y;
  const u32 per = (vocab + parts - 1u) / parts;
  const u32 lo = part * per, hi = min(vocab, lo + per);
  const float* l = logits + (u64)blockIdx.x * vocab;
  float best = -S_INF;
  u32 besti = 0xffffffffu;
  for (u32 i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float v = l[i];
    if (v == v && (besti == 0xffffffffu || v > best)) { best = v; besti = i; }
  }
  for (int o = M3_WARP / 2; o > 0; o >>= 1) {
    float ov = M3_SHFL_XOR(best, o);
    u32 oi = M3_SHFL_XOR(besti, o);
    if (oi != 0xffffffffu && (besti == 0xffffffffu || ov > best || (ov == best && oi < besti))) { best = ov; besti = oi; }
  }
  if (threadIdx.x % M3_WARP == 0) { bv[threadIdx.x / M3_WARP] = best; bi[threadIdx.x / M3_WARP] = besti; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (u32 w = 1; w < blockDim.x / M3_WARP; ++w)
      if (bi[w] != 0xffffffffu && (besti == 0xffffffffu || bv[w] > best || (bv[w] == best && bi[w] < besti))) { best = bv[w]; besti = bi[w]; }
    pv[blockIdx.x * parts + part] = best;
    pi[blockIdx.x * parts + part] = besti;
  }
}

/// Greedy, phase 2: tok[row] = the best of the row's `parts` partials (0 if
/// every logit is NaN). Grid nl, block 1 (parts is small).
M3_KERNEL void m3s_argmax_final(const float* __restrict__ pv, const u32* __restrict__ pi, u32 parts,
                                u32* __restrict__ tok) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  float best = -S_INF;
  u32 besti = 0xffffffffu;
  for (u32 p = 0; p < parts; ++p) {
    float v = pv[blockIdx.x * parts + p];
    u32 i = pi[blockIdx.x * parts + p];
    if (i != 0xffffffffu && (besti == 0xffffffffu || v > best || (v == best && i < besti))) { best = v; besti = i; }
  }
  tok[blockIdx.x] = besti == 0xffffffffu ? 0u : besti;
}
#endif  // !S_MMA_ONLY
