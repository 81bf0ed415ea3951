// Mono decode, first form (issue 13): one persistent kernel per decoder
// layer that runs the layer's standard-path launches as a program of ops,
// with a grid-wide barrier between two ops instead of a kernel boundary
// (none between the two ops of a phase: SMonoOp::flags).
// See mono_prelude.h for how a body sees its virtual launch; the host side
// (src/standard/mono.rs) records the ops by running the standard path's
// own enqueue code with the launcher in recording mode.

#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#undef __syncthreads
#undef __restrict__
#undef __launch_bounds__
#if defined(M3_HIP_FREESTANDING)
// hip_freestanding.h's built-ins again (the prelude pointed them at the
// virtual launch for the op bodies)
#define threadIdx (m3h_thread_idx())
#define blockIdx (m3h_block_idx())
#define blockDim (m3h_block_dim())
#define gridDim (m3h_grid_dim())
#endif
#if defined(M3_SIM)
// the simulator's built-ins again (runtime/sim.rs, hip_sim.h)
#define threadIdx (m3sim::g_tid)
#define blockIdx (m3sim::g_bid)
#define blockDim (m3sim::g_bdim)
#define gridDim (m3sim::g_gdim)
#endif
#if !defined(M3_HIP)
// the CUDA headers' definition (the prelude emptied it for the op bodies)
#define __launch_bounds__(...) __attribute__((launch_bounds(__VA_ARGS__)))
#endif
#if !defined(__noinline__)
#define __noinline__ __attribute__((noinline))
#endif
/// The CTA-wide barrier of the interpreter (all S_MONO_THREADS).
#if defined(M3_HIP) || defined(M3_SIM)
#define S_MONO_CTA_SYNC() __syncthreads()
#else
#define S_MONO_CTA_SYNC() asm volatile("bar.sync 0;" ::: "memory")
#endif

/// One recorded launch: which body (S_MONO_OPS index), its block size (a
/// power of two <= S_MONO_THREADS, as log2), grid, where its arguments
/// start in the program's argument bytes, flags (S_MONO_SHARES_PHASE: no
/// grid barrier after it, the next op is independent of it) and the CTAs
/// its virtual blocks are rotated by (a phase's second op starts on the
/// CTAs its first leaves idle; with PathOptions::mono_rotate_late any op
/// starts past the CTAs that ran the op before's last round).
/// src/standard/mono.rs `OpRecord`.
struct SMonoOp {
  u32 fn, lg, gx, gy, gz, arg, flags, rot;
};
#define S_MONO_SHARES_PHASE 1u
/// Flag: neither this op nor the one before shares a phase (the op has
/// the grid to itself).
#define S_MONO_ALONE 2u

// Argument bytes, as src/standard/mono.rs writes them: each argument in
// order, one of at most 4 bytes at a 4-byte boundary, one of 8 or more (a
// pointer, a u64, a struct) at an 8-byte boundary taking a multiple of 8.
template <typename T> M3_DEV T s_mono_arg(const unsigned char* p) {
  static_assert(sizeof(T) % 4 == 0, "mono arguments are whole 32-bit words");
  T v;
  u32* d = reinterpret_cast<u32*>(&v);
  const u32* s = reinterpret_cast<const u32*>(p);
#pragma unroll
  for (u32 i = 0; i < sizeof(T) / 4; ++i) d[i] = m3_ldg(s + i);  // read-only: loads may move to their uses
  return v;
}
template <typename... A> struct SMonoPack;
template <> struct SMonoPack<> {
  template <typename L, typename... B> static __device__ __forceinline__ void call(L l, const unsigned char*, u32, B... b) { l(b...); }
};
template <typename T, typename... R> struct SMonoPack<T, R...> {
  template <typename L, typename... B> static __device__ __forceinline__ void call(L l, const unsigned char* p, u32 off, B... b) {
    const u32 wide = sizeof(T) >= 8 ? 1u : 0u;
    off = wide ? (off + 7u) & ~7u : off;
    const T v = s_mono_arg<T>(p + off);
    SMonoPack<R...>::call(l, p, off + (wide ? (u32)((sizeof(T) + 7) & ~7) : 4u), b..., v);
  }
};
template <typename F> struct SMonoSig;
template <typename... A> struct SMonoSig<void (*)(A...)> {
  template <typename L> static __device__ __forceinline__ void call(const unsigned char* p, L l) { SMonoPack<A...>::call(l, p, 0u); }
};

// The ops a mono layer may hold, by index (src/standard/mono.rs MONO_OPS
// lists the same names in the same order; a test holds them equal).
#define S_MONO_OPS(X)             \
  X(0, m3s_rmsnorm)               \
  X(1, m3s_headnorm_rope)         \
  X(2, m3s_cache_write)           \
  X(3, m3s_swiglu)                \
  X(4, m3s_moe_combine)           \
  X(5, m3s_add_bf16)              \
  X(6, m3s_act_mxfp4)             \
  X(7, m3s_linear_f32w)           \
  X(8, m3s_mma_bf16)              \
  X(9, m3s_mma_e4m3)              \
  X(10, m3s_mma_e4m3_any)         \
  X(11, m3s_mma_e5m2)             \
  X(12, m3s_mma_e5m2_any)         \
  X(13, m3s_mma_fp4)              \
  X(14, m3s_mma_fp4_any)          \
  X(15, m3s_mma_nvfp4)            \
  X(16, m3s_route)                \
  X(17, m3s_router_warp)          \
  X(18, m3s_index_scores)         \
  X(19, m3s_index_topk)           \
  X(20, m3s_attn_partial)         \
  X(21, m3s_attn_partial_sparse)  \
  X(22, m3s_attn_partial_split)   \
  X(23, m3s_attn_combine)         \
  X(24, m3s_router_small)         \
  X(25, m3s_index_scores_nv)      \
  X(26, m3s_attn_partial_nv)      \
  X(27, m3s_attn_partial_sparse_nv) \
  X(28, m3s_attn_partial_split_nv) \
  X(29, m3s_x_f16)                \
  X(30, m3s_mma_nvfp4_any)        \
  X(31, m3s_rmsnorm_mix)          \
  X(32, m3s_mma_e4m3_r1)          \
  X(33, m3s_mma_e4m3_r8)          \
  X(34, m3s_mma_e5m2_r1)          \
  X(35, m3s_mma_e5m2_r8)          \
  X(36, m3s_mma_fp4_r1)           \
  X(37, m3s_mma_fp4_r8)           \
  X(38, m3s_mma_nvfp4_r1)         \
  X(39, m3s_mma_nvfp4_r8)         \
  X(40, m3s_l2_prefetch)

/// Each op's index in S_MONO_OPS by name (S_MONO_ID_m3s_rmsnorm = 0, ...).
#define S_MONO_ENUM(i, name) S_MONO_ID_##name = i,
enum SMonoId : u32 { S_MONO_OPS(S_MONO_ENUM) };
#undef S_MONO_ENUM

/// The barrier of sub-block `sub` (B threads) around a virtual block: the
/// body's own (m3_mono_sync, mono_prelude.h).
M3_DEV void s_mono_sub_sync(u32 sub, u32 B) {
#if defined(M3_HIP)
  (void)sub;
  (void)B;
  m3_mono_sync();
#elif defined(M3_SIM)
  m3sim::named_barrier(1u + sub, B);
#else
  asm volatile("bar.sync %0, %1;" ::"r"(1u + sub), "r"(B) : "memory");
#endif
}

/// The op being run (thread 0 reads it from the program; every thread
/// reads it back after a CTA-wide barrier).
__shared__ SMonoOp s_mono_op;
/// Whether this CTA holds a virtual block of the op (thread 0 writes it
/// with s_mono_op).
__shared__ u32 s_mono_has;

// Where an op has its phase to itself, its virtual blocks dealt to every
// CTA's first sub-block before any CTA's second (1), or CTA-major (0). On
// the H100 a b1 MoE layer 0.3326 ms with it against 0.3428 without (with
// S_MONO_EARLY; 0.3703 against 0.3756 without that), bench/NOTES.md
// session 30. Which sub-block runs a block does not change its sums.
#ifndef S_MONO_SPREAD
#define S_MONO_SPREAD 1
#endif

// A CTA that holds no virtual block of an op does not call its body (1),
// or calls it and runs no block (0). The call is not free: its callee
// saves ~60 registers a thread to the stack on entry and loads them back
// on return, and every warp of every CTA made it for every op (Nsight
// Compute, a b1 mono layer on the H100: ~2M local stores and ~2M local
// loads; for a linear's ~66 saves, 2112 warps x 132 accesses x 128 bytes
// = ~36 MB of local traffic an op; bench/NOTES.md session 31). The
// same blocks run: the same bits. (A CTA whose body did not run waits
// before its next arrival, as before, S_MONO_EARLY.) With the carve-out
// cut to the CTAs' shared memory (PathOptions::mono_carveout) it measured
// -0.5% a b1 MoE layer on the H100 (-1.5% with the largest carve-out).
// HIP: 0 (unmeasured there; the branch around the call lifts clang 22's
// SGPR spills of m3s_mono from 168 to 186 on gfx950, past xtask's gate).
#ifndef S_MONO_SKIP
#if defined(M3_HIP)
#define S_MONO_SKIP 0
#else
#define S_MONO_SKIP 1
#endif
#endif

/// Whether an op with `flags` deals its blocks to every CTA's first
/// sub-block before any second (S_MONO_SPREAD, an op alone in its phase).
M3_DEV bool s_mono_spreads(u32 flags) { return S_MONO_SPREAD && (flags & S_MONO_ALONE) != 0u; }
/// The first virtual block of sub-block `sub` (of `subs`) of the CTA at
/// place `cta` in an op's order; its later ones stride by the grid's
/// sub-blocks (s_mono_blocks). Sub-block 0's is the CTA's lowest.
M3_DEV u32 s_mono_first(u32 cta, u32 sub, u32 subs, bool spread) {
  return spread ? sub * gridDim.x + cta : cta * subs + sub;
}

/// Run the calling sub-block's share of the current op: virtual blocks v =
/// its global sub index, then strides of every sub-block of the grid, the
/// body (`run`, inlined here) once per block between two barriers of the
/// sub-block (before: its block index is set; after: its carved shared
/// arrays are the next block's). Sub-blocks run their blocks independently
/// (no CTA-wide barrier between two blocks), and the loop sits inside the
/// op's function so the call ABI's register saves happen once an op, not
/// once a virtual block (bench/NOTES.md session 9, run 3).
template <typename R> M3_DEV void s_mono_blocks(R run) {
  const u32 lg = s_mono_lg, B = 1u << lg, subs = S_MONO_THREADS >> lg, sub = threadIdx.x >> lg;
  const uint3 gd = s_mono_gdim;
  const u32 n = gd.x * gd.y * gd.z;
  // s_mono_cta: this CTA's place in the op's order (blockIdx.x rotated).
  // S_MONO_SPREAD, an op alone in its phase: the first round of blocks
  // v < gridDim.x * subs dealt to every CTA's first sub-block before any
  // CTA's second (fewer blocks an SM where the op has fewer blocks than
  // sub-blocks), each sub-block then striding by the round; else
  // CTA-major (a CTA's sub-blocks in turn).
  const bool spread = s_mono_spreads(m3_mono_vol(s_mono_op.flags));
  for (u32 v = s_mono_first(s_mono_cta, sub, subs, spread); v < n; v += gridDim.x * subs) {
    if ((threadIdx.x & (B - 1u)) == 0u) s_mono_bid[sub] = make_uint3(v % gd.x, (v / gd.x) % gd.y, v / (gd.x * gd.y));
    s_mono_sub_sync(sub, B);
    run();
    s_mono_sub_sync(sub, B);
  }
}

// one function per op (not inlined: each body gets its own register
// allocation, as in its own kernel), its arguments read from the program
#define S_MONO_FN(name)                                                                    \
  struct SMonoCall_##name {                                                                \
    template <typename... A> __device__ __forceinline__ void operator()(A... a) const { name(a...); } \
  };                                                                                        \
  struct SMonoRun_##name {                                                                 \
    const unsigned char* p;                                                                 \
    __device__ __forceinline__ void operator()() const { SMonoSig<decltype(&name)>::call(p, SMonoCall_##name{}); } \
  };                                                                                        \
  static __device__ __noinline__ void s_mono_##name(const unsigned char* p) {               \
    s_mono_blocks(SMonoRun_##name{p});                                                      \
  }
S_MONO_FN(m3s_rmsnorm)
S_MONO_FN(m3s_headnorm_rope)
S_MONO_FN(m3s_cache_write)
S_MONO_FN(m3s_swiglu)
S_MONO_FN(m3s_moe_combine)
S_MONO_FN(m3s_add_bf16)
S_MONO_FN(m3s_act_mxfp4)
S_MONO_FN(m3s_linear_f32w)
S_MONO_FN(m3s_route)
S_MONO_FN(m3s_router_warp)
S_MONO_FN(m3s_index_scores)
S_MONO_FN(m3s_index_topk)
S_MONO_FN(m3s_attn_partial)
S_MONO_FN(m3s_attn_partial_sparse)
S_MONO_FN(m3s_attn_partial_split)
S_MONO_FN(m3s_attn_combine)
S_MONO_FN(m3s_router_small)
S_MONO_FN(m3s_index_scores_nv)
S_MONO_FN(m3s_attn_partial_nv)
S_MONO_FN(m3s_attn_partial_sparse_nv)
S_MONO_FN(m3s_attn_partial_split_nv)
S_MONO_FN(m3s_x_f16)
S_MONO_FN(m3s_rmsnorm_mix)
S_MONO_FN(m3s_l2_prefetch)
#undef S_MONO_FN
// The tensor-core linears take their segment table by reference into the
// program (not as a 408-byte copy through the generic argument unpacking):
// (x, segs, K, M, route, max_rows, xdiv, ts) at the offsets the argument
// rule gives them.
constexpr u32 S_MONO_LIN_SEGS = 8u;
constexpr u32 S_MONO_LIN_K = S_MONO_LIN_SEGS + (((u32)sizeof(SSegs) + 7u) & ~7u);
template <int F, bool ANY, int RC = S_RC_ANY> struct SMonoLin {
  const unsigned char* p;
  __device__ __forceinline__ void operator()() const {
    constexpr u32 k = S_MONO_LIN_K;
    const u16* x = s_mono_arg<const u16*>(p);
    const SSegs& sg = *reinterpret_cast<const SSegs*>(p + 8u);
    const u32 K = s_mono_arg<u32>(p + k), M = s_mono_arg<u32>(p + k + 4u);
    const int* route = s_mono_arg<const int*>(p + k + 8u);
    const u32 mr = s_mono_arg<u32>(p + k + 16u), xdiv = s_mono_arg<u32>(p + k + 20u);
    const float* ts = s_mono_arg<const float*>(p + k + 24u);
    // bf16 weights on the bf16-operand kernel, the MX formats on the f16 one
    if constexpr (F == S_FMT_BF16) s_mma_linear<F, ANY || S_FORCE_ANY>(x, sg, K, M, route, mr, xdiv, ts);
    else s_mmh_linear<F, ANY || S_FORCE_ANY, RC>(x, sg, K, M, route, mr, xdiv, ts);
  }
};
#define S_MONO_LIN(name, F, ANY)           \
  using SMonoRun_##name = SMonoLin<F, ANY>; \
  static __device__ __noinline__ void s_mono_##name(const unsigned char* p) { s_mono_blocks(SMonoRun_##name{p}); }
S_MONO_LIN(m3s_mma_bf16, S_FMT_BF16, true)
S_MONO_LIN(m3s_mma_e4m3, S_FMT_E4M3, false)
S_MONO_LIN(m3s_mma_e4m3_any, S_FMT_E4M3, true)
S_MONO_LIN(m3s_mma_e5m2, S_FMT_E5M2, false)
S_MONO_LIN(m3s_mma_e5m2_any, S_FMT_E5M2, true)
S_MONO_LIN(m3s_mma_fp4, S_FMT_FP4, false)
S_MONO_LIN(m3s_mma_fp4_any, S_FMT_FP4, true)
S_MONO_LIN(m3s_mma_nvfp4, S_FMT_NVFP4, false)
S_MONO_LIN(m3s_mma_nvfp4_any, S_FMT_NVFP4, true)
#undef S_MONO_LIN
// The small-step build's one-row and one-tile entry points as ops of their
// own (the host records them for steps of 1 and of 2-8 rows, CUDA only):
// each body holds one walk, as in its own launch, so it needs fewer
// registers than the format's general body, which under the mono bound
// of 128 spills inside its loops (NVRTC 13.0: m3s_mma_e4m3 19 stores and
// 27 loads of local memory in its innermost loops, m3s_mma_fp4 14 and 25;
// bench/NOTES.md session 28). Each runs the row class of the standard
// launch of its name, so the same walk per CTA: the same bits (the general
// body, which mono ran them as before, picks its walk by the CTA's own
// rows, and a 2-8-row routed launch can give a CTA one row: the one-row
// walk there, not the one-tile walk the `_r8` entry runs, and for NVFP4
// those two differ in their last bits).
#define S_MONO_LIN_RC(name, F, RC)               \
  using SMonoRun_##name = SMonoLin<F, false, RC>; \
  static __device__ __noinline__ void s_mono_##name(const unsigned char* p) { s_mono_blocks(SMonoRun_##name{p}); }
S_MONO_LIN_RC(m3s_mma_e4m3_r1, S_FMT_E4M3, S_RC_ONE)
S_MONO_LIN_RC(m3s_mma_e4m3_r8, S_FMT_E4M3, S_RC_TILE)
S_MONO_LIN_RC(m3s_mma_e5m2_r1, S_FMT_E5M2, S_RC_ONE)
S_MONO_LIN_RC(m3s_mma_e5m2_r8, S_FMT_E5M2, S_RC_TILE)
S_MONO_LIN_RC(m3s_mma_fp4_r1, S_FMT_FP4, S_RC_ONE)
S_MONO_LIN_RC(m3s_mma_fp4_r8, S_FMT_FP4, S_RC_TILE)
S_MONO_LIN_RC(m3s_mma_nvfp4_r1, S_FMT_NVFP4, S_RC_ONE)
S_MONO_LIN_RC(m3s_mma_nvfp4_r8, S_FMT_NVFP4, S_RC_TILE)
#undef S_MONO_LIN_RC

// How the interpreter calls an op body. 1: through a table of function
// pointers read with a volatile load, so ptxas cannot inline or specialise
// the calls and allocates each body on its own under the call ABI (the
// bodies then save and restore registers at entry and exit instead of
// spilling inside their loops: NVRTC 13.5 sm_90, the small-step linears'
// loops went from ~21 local stores and ~36 local loads to ~0 and ~10,
// bench/NOTES.md session 8). 0: a switch of direct calls (what runs 4-6
// measured).
// HIP: direct calls (indirect calls on AMDGPU are a late addition to the
// toolchains this builds with, and unmeasured).
#ifndef S_MONO_INDIRECT
#if defined(M3_HIP)
#define S_MONO_INDIRECT 0
#else
#define S_MONO_INDIRECT 1
#endif
#endif

// The small ops' bodies inlined into the interpreter (1), or called like
// the rest (0). A call saves and restores the registers its body uses
// (27-74 a thread for these ops) in a burst of local stores at entry:
// Nsight Compute found the small ops' functions stalled much on the
// memory queue (LG throttle) and on code not yet fetched (bench/NOTES.md
// session 31). Inlined, their registers come out of the interpreter's own
// allocation (each needs under 72 in its own launch). CUDA's indirect
// form only (HIP calls through a switch: S_MONO_INDIRECT 0). Measured
// (H200, ms a MoE layer, 2 rounds interleaved, every 16-step gate bitwise;
// bench/NOTES.md session 32): b1 0.2674 -> 0.2554 (-4.5%), b4 0.4683 ->
// 0.4536 (-3.1%), b16 1.1015 -> 1.0902 (-1.0%): on.
#ifndef S_MONO_INLINE_SMALL
#if defined(M3_HIP)
#define S_MONO_INLINE_SMALL 0
#else
#define S_MONO_INLINE_SMALL 1
#endif
#endif

// Linear bodies inlined into the interpreter too, a bit mask: 1 the MXFP8
// (E4M3) one-row walk, 2 MXFP4's, 4 / 8 their 2-8-row (one-tile) walks,
// 16 / 32 their general bodies (9-16 rows); 0: every linear called
// through the table. Session 35's in-graph ablation had mono's MXFP8
// linears cost 1.8x the standard path's in a b1 MoE layer and its MXFP4
// ones 1.5x (H100, bench/NOTES.md). Called, the one-row walks' functions
// spill 264-272 bytes a thread (the call's saves at 128 registers);
// inlined (3), NVRTC 13.0 gives the interpreter no spills (15: 24 / 104
// bytes, 63: 28 / 132). Measured with 3 (H100, 2 rounds interleaved,
// every 16-step gate bitwise): a MoE layer -6.5% at b1 (0.2595 -> 0.2428
// ms), +1.2% at b4, +-0 at b16. Against 3 (H100, session 36, the same
// protocol): 15 b4 -7.0%, b1 +0.6%, b16 +0.5%; 63 b4 -7.7%, b16 -6.2%
// (1.1194 -> 1.0498 ms), b1 +0.7%; 63 with S_MONO_INLINE_ATTN 2 and
// S_MONO_WAKE_ACQ 1, the three new defaults together: b1 -4.8%, b4 -6.9%,
// b16 -6.0% (bench/NOTES.md). 63 on CUDA's inlining switch. HIP: 0
// (unmeasured; its switch calls every body). An A/B that turns
// S_MONO_INDIRECT or S_MONO_INLINE_SMALL off turns this off too (the host
// refuses a non-zero mask then: mono.rs defines_fit).
#ifndef S_MONO_INLINE_LIN
#if defined(M3_HIP) || !(S_MONO_INDIRECT && S_MONO_INLINE_SMALL)
#define S_MONO_INLINE_LIN 0
#else
#define S_MONO_INLINE_LIN 63
#endif
#endif
#if S_MONO_INLINE_LIN && !(S_MONO_INDIRECT && S_MONO_INLINE_SMALL)
#error "S_MONO_INLINE_LIN: the inlined small ops' switch's (S_MONO_INDIRECT 1, S_MONO_INLINE_SMALL 1)"
#endif

// Attention bodies inlined too, a bit mask: 1 the index scores, 2 the
// split attention partial, 4 the sparse one; 0: called. Session 35's in-graph ablation
// (H100, b1): index scores 6.9 us a mono layer against 2.7 on the standard
// path, the partial 10.5 against 5.1. Called, their functions take 752 /
// 304-byte frames and 1440 / 292 bytes of spill stores (NVRTC 13.0; 128
// and 108 registers, no spills, in their own launches); inlined, the
// interpreter takes 2652 bytes of spill stores with 1 and 64 with 2
// (beside S_MONO_INLINE_LIN 3). Measured with 2 against 0 (H100, session
// 36, 2 rounds interleaved, every 16-step gate bitwise): b1 -2.8%, b4
// -0.7%, b16 +0.6%; with the other two new defaults see S_MONO_INLINE_LIN.
// 4: the sparse partial (steps past the split's rows); called, its function spills 920 /
// 1324 bytes; 6 gives the interpreter 724 / 1084 (NVRTC 13.0). 6 against
// 2 (H100, session 38, one round, gated bit for bit): b1 +0.7%, b4 -1.2%,
// b16 -1.2%: within a round's spread, not a default.
// 2 on CUDA's inlining switch; HIP and the switch's absence: 0.
#ifndef S_MONO_INLINE_ATTN
#if defined(M3_HIP) || !(S_MONO_INDIRECT && S_MONO_INLINE_SMALL)
#define S_MONO_INLINE_ATTN 0
#else
#define S_MONO_INLINE_ATTN 2
#endif
#endif
#if S_MONO_INLINE_ATTN && !(S_MONO_INDIRECT && S_MONO_INLINE_SMALL)
#error "S_MONO_INLINE_ATTN: the inlined small ops' switch's (S_MONO_INDIRECT 1, S_MONO_INLINE_SMALL 1)"
#endif

#if S_MONO_INDIRECT
typedef void (*SMonoFn)(const unsigned char*);
#define S_MONO_ENTRY(i, name) s_mono_##name,
__device__ SMonoFn s_mono_table[] = {S_MONO_OPS(S_MONO_ENTRY)};
#undef S_MONO_ENTRY

M3_DEV void s_mono_run(u32 fn, const unsigned char* p) {
#if S_MONO_INLINE_SMALL
#define S_MONO_INLINE(name)                 \
  case S_MONO_ID_##name:                    \
    s_mono_blocks(SMonoRun_##name{p});      \
    return;
  switch (fn) {
    S_MONO_INLINE(m3s_rmsnorm)
    S_MONO_INLINE(m3s_headnorm_rope)
    S_MONO_INLINE(m3s_swiglu)
    S_MONO_INLINE(m3s_moe_combine)
    S_MONO_INLINE(m3s_index_topk)
    S_MONO_INLINE(m3s_attn_combine)
#if S_MONO_INLINE_ATTN & 1
    S_MONO_INLINE(m3s_index_scores)
#endif
#if S_MONO_INLINE_ATTN & 2
    S_MONO_INLINE(m3s_attn_partial_split)
#endif
#if S_MONO_INLINE_ATTN & 4
    S_MONO_INLINE(m3s_attn_partial_sparse)
#endif
#if S_MONO_INLINE_LIN & 1
    S_MONO_INLINE(m3s_mma_e4m3_r1)
#endif
#if S_MONO_INLINE_LIN & 2
    S_MONO_INLINE(m3s_mma_fp4_r1)
#endif
#if S_MONO_INLINE_LIN & 4
    S_MONO_INLINE(m3s_mma_e4m3_r8)
#endif
#if S_MONO_INLINE_LIN & 8
    S_MONO_INLINE(m3s_mma_fp4_r8)
#endif
#if S_MONO_INLINE_LIN & 16
    S_MONO_INLINE(m3s_mma_e4m3)
#endif
#if S_MONO_INLINE_LIN & 32
    S_MONO_INLINE(m3s_mma_fp4)
#endif
    default: break;
  }
#undef S_MONO_INLINE
#endif
  if (fn >= sizeof(s_mono_table) / sizeof(s_mono_table[0])) m3_mono_trap();
  const SMonoFn f = *reinterpret_cast<SMonoFn volatile*>(&s_mono_table[fn]);
  f(p);
}
#else
M3_DEV void s_mono_run(u32 fn, const unsigned char* p) {
#define S_MONO_CASE(i, name) \
  case i:                    \
    s_mono_##name(p);        \
    break;
  switch (fn) {
    S_MONO_OPS(S_MONO_CASE)
    default:
      m3_mono_trap();  // the host never records an op it has no body for
  }
#undef S_MONO_CASE
}
#endif

/// Grid-wide barrier on a monotonic 64-bit counter: every CTA adds one and
/// waits for the count to reach the end of its generation (old / n + 1) * n.
/// Arrivals of generation g + 1 cannot start before generation g is
/// complete, so the counter is never reset (not between ops, layers or
/// steps) as long as every launch on it has the same n CTAs. The caller has
/// passed a CTA-wide barrier after its op. Release on the arrival; the wait
/// polls with relaxed loads and acquires once with a fence when the count
/// is reached: an acquire load in the loop invalidates the SM's L1 on every
/// poll, under the other CTA of the SM still running the op (session 9
/// run 3: 1.7M invalidations in one b16 layer).
///
/// HIP: every thread fences its own writes at device (agent) scope before
/// the CTA's barrier and acquires at that scope after the wait (the CU's
/// vector L1 is not coherent with other CUs'), with the same counter rule.
M3_DEV void s_mono_grid_sync(unsigned long long* bar) {
#if defined(M3_HIP)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent");
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long n = gridDim.x;
    const unsigned long long old = __hip_atomic_fetch_add(bar, 1ull, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
    const unsigned long long target = (old / n + 1ull) * n;
    while (__hip_atomic_load(bar, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT) < target) __builtin_amdgcn_s_sleep(1);
  }
  __syncthreads();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent");
#elif defined(M3_SIM)
  // the simulator runs a launch's CTAs one after another: a barrier that
  // would wait for another CTA can never end (the host gives it one CTA)
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long n = gridDim.x;
    const unsigned long long old = __atomic_fetch_add(bar, 1ull, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(bar, __ATOMIC_SEQ_CST) < (old / n + 1ull) * n)
      m3sim::trap("a grid barrier with another CTA to wait for (the simulator runs one at a time)");
  }
  __syncthreads();
#else
  if (threadIdx.x == 0) {
    const unsigned long long n = gridDim.x;
    unsigned long long old, cur;
    asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(bar) : "memory");
    const unsigned long long target = (old / n + 1ull) * n;
    do {
      asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(cur) : "l"(bar) : "memory");
    } while (cur < target);
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  asm volatile("bar.sync 0;" ::: "memory");
#endif
}

#if S_MONO_EARLY
/// Early start: thread 0's arrival at the grid barrier after an op (the
/// CTA has passed a CTA-wide barrier after its share), with the counter
/// rule of s_mono_grid_sync; the wait is m3_mono_wait (mono_prelude.h), in
/// the next op's body or, where none ran, before the next arrival. A CTA
/// arrives at a barrier only once it has seen the one before complete, so
/// the generations stay apart as in s_mono_grid_sync.
M3_DEV void s_mono_arrive(unsigned long long* bar) {
  if (m3_mono_vol(s_mono_seen) != m3_mono_vol(s_mono_need)) m3_mono_poll();
  const unsigned long long n = gridDim.x;
  unsigned long long old;
#if defined(M3_SIM)
  old = __atomic_fetch_add(bar, 1ull, __ATOMIC_SEQ_CST);
#else
  asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(bar) : "memory");
#endif
  *reinterpret_cast<volatile unsigned long long*>(&s_mono_target) = (old / n + 1ull) * n;
  *reinterpret_cast<volatile u32*>(&s_mono_need) = m3_mono_vol(s_mono_need) + 1u;
}
#endif

#ifndef S_MONO_MINB
#define S_MONO_MINB 2
#endif

// The program's op records copied to shared memory at the launch's start
// (1; the first S_MONO_MAX_OPS of them: 32 bytes each), or read by thread
// 0 from global memory op by op (0). Each op's record is otherwise a
// round trip to L2 between a CTA's arrival and its call of the next body,
// on the critical path for the CTA that arrives last. Records are written
// once, when a program is made, so the copy needs no wait for the launch
// before. Measured with S_MONO_INLINE_SMALL (H200, bench/NOTES.md session
// 32): a further -0.2% (b1), -0.1% (b4), -0.5% (b16), in both rounds: on
// for CUDA; HIP 0 (unmeasured there, and its gfx950 build kept as gated).
#ifndef S_MONO_OPS_SMEM
#if defined(M3_HIP)
#define S_MONO_OPS_SMEM 0
#else
#define S_MONO_OPS_SMEM 1
#endif
#endif
#define S_MONO_MAX_OPS 64
#if S_MONO_OPS_SMEM
__shared__ SMonoOp s_mono_prog[S_MONO_MAX_OPS];
#endif

/// One decoder layer (or several, PathOptions::mono_layers_per_launch:
/// their programs one after another): ops[0..nops) in order, each over its virtual grid
/// (blocks v = x + gx * (y + gy * z); an op of B threads a block runs
/// S_MONO_THREADS / B of them at once per CTA, see s_mono_blocks), a grid
/// barrier between two ops except inside a phase (S_MONO_SHARES_PHASE:
/// the next op is independent of this one; the CTA still passes a
/// CTA-wide barrier between them). Launched with a grid every CTA of which is
/// resident at once (the host sizes it by occupancy); `bar` is the path's
/// barrier counter (zeroed once at load).
/// `prof` (null: no profile): nops rows of gridDim.x + 1 u64 timestamps a
/// launch, row i = [when CTA 0 starts op i, when each CTA finished its share
/// of op i], then nops rows of gridDim.x: when a body of op i first passed
/// its dependency wait on each CTA (0: none ran there, or no early start);
/// the host (src/standard/mono.rs `mono_op_profile`) turns them into work,
/// straggle, barrier, wake and run times per op.
#if defined(M3_HIP)
#define S_MONO_BOUNDS __attribute__((amdgpu_flat_work_group_size(1, S_MONO_THREADS)))
#else
#define S_MONO_BOUNDS __launch_bounds__(S_MONO_THREADS, S_MONO_MINB)
#endif
extern "C" __global__ void S_MONO_BOUNDS
    m3s_mono(const SMonoOp* __restrict__ ops, u32 nops, const unsigned char* __restrict__ args,
             unsigned long long* bar, unsigned long long* prof) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#if !S_MONO_EARLY
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#endif
#if S_MONO_EARLY
  // (the first phase waits for the launch before in its bodies)
  if (threadIdx.x == 0) {
    s_mono_need = 0u;
    s_mono_seen = 0u;
    s_mono_claim = 0u;
    s_mono_bar = bar;
    s_mono_profiling = prof != nullptr ? 1u : 0u;
    s_mono_woke = 0ull;
  }
#endif
#if defined(M3_HIP)
  if (threadIdx.x < S_MONO_MAX_SUBS) s_mono_wbar[threadIdx.x] = 0u;
  __syncthreads();
#endif
#if S_MONO_OPS_SMEM
  {
    const u32 held = (nops < S_MONO_MAX_OPS ? nops : S_MONO_MAX_OPS) * (u32)(sizeof(SMonoOp) / 4u);
    for (u32 j = threadIdx.x; j < held; j += S_MONO_THREADS)
      reinterpret_cast<u32*>(s_mono_prog)[j] = m3_ldg(reinterpret_cast<const u32*>(ops) + j);
    S_MONO_CTA_SYNC();
  }
#endif
  for (u32 i = 0; i < nops; ++i) {
    if (threadIdx.x == 0) {
#if S_MONO_OPS_SMEM
      const SMonoOp o = i < S_MONO_MAX_OPS ? s_mono_prog[i] : ops[i];
#else
      const SMonoOp o = ops[i];
#endif
      s_mono_op = o;
      s_mono_lg = o.lg;
      const u32 rot = o.rot < gridDim.x ? o.rot : 0u;
      s_mono_cta = blockIdx.x >= rot ? blockIdx.x - rot : blockIdx.x + gridDim.x - rot;
      s_mono_gdim = make_uint3(o.gx, o.gy, o.gz);
      // the first block of this CTA's first sub-block: none there, none in
      // the CTA
      const u32 v0 = s_mono_first(s_mono_cta, 0u, S_MONO_THREADS >> o.lg, s_mono_spreads(o.flags));
      s_mono_has = !S_MONO_SKIP || v0 < o.gx * o.gy * o.gz ? 1u : 0u;
      if (prof != nullptr && blockIdx.x == 0) prof[(u64)i * (gridDim.x + 1u)] = m3_mono_now();
    }
    S_MONO_CTA_SYNC();
    if (!S_MONO_SKIP || m3_mono_vol(s_mono_has) != 0u) s_mono_run(m3_mono_vol(s_mono_op.fn), args + m3_mono_vol(s_mono_op.arg));
    // (read before the barrier: past it, with no grid barrier to follow,
    // thread 0 may already be writing the next op; read after the call,
    // so nothing is held across it)
    const u32 flags = m3_mono_vol(s_mono_op.flags);
#if S_MONO_EARLY && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // every thread past the launch before, whether or not a body of the
    // first phase ran on it (idempotent)
    if (i == 0u) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    S_MONO_CTA_SYNC();  // the CTA's share is done; s_mono_op is free
    if (prof != nullptr && threadIdx.x == 0) {
      prof[(u64)i * (gridDim.x + 1u) + 1u + blockIdx.x] = m3_mono_now();
      // the second table: when a body of the op first passed its wait here
      // (without the early start it keeps the zeros the host gave it)
#if S_MONO_EARLY
      prof[(u64)nops * (gridDim.x + 1u) + (u64)i * gridDim.x + blockIdx.x] = s_mono_woke;
      s_mono_woke = 0ull;
#endif
    }
    // none after the last op, nor between the two ops of a phase
    if (i + 1u < nops && (flags & S_MONO_SHARES_PHASE) == 0u) {
#if S_MONO_EARLY
      // arrive only: the next op's body waits (or the next arrival does)
      if (threadIdx.x == 0) s_mono_arrive(bar);
#else
      s_mono_grid_sync(bar);
#endif
    }
  }
}
