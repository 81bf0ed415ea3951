// Mono decode, first form (issue 13): the standard path's kernels run as
// device functions ("ops") inside one persistent kernel per decoder layer,
// `m3s_mono` in kernels/mono.cu. The translation unit is compat.h, this
// prelude, standard_decode.cu + standard_attention.cu (with the small-step
// defines), then mono.cu.
//
// This prelude turns every M3_KERNEL into a device function and points the
// CUDA built-ins a body reads at the virtual launch the interpreter sets
// up for it: an op launched with B threads a block (B a power of two, at
// most S_MONO_THREADS) runs S_MONO_THREADS / B of its blocks at once in
// one persistent CTA, one per "sub-block" of B threads. For a body:
//   threadIdx.x  the thread's index within its sub-block
//   blockIdx     the virtual block its sub-block runs
//   blockDim.x   B;  gridDim: the op's recorded grid
//   __syncthreads()  a named barrier of the sub-block's B threads
//   S_SHARED     arrays carved from the sub-block's share of one pool
// so each body runs the same instructions on the same data as in its own
// launch: a mono step is bit-identical to the standard step it replaces.
// HIP (wave64): s_barrier is workgroup-wide and there are no named
// barriers, so a sub-block's barrier is the workgroup's when the op fills
// the CTA, a wavefront barrier when the sub-block is one wavefront, and
// an LDS counter among its wavefronts otherwise (m3_mono_sync); every op
// block there is at least a wavefront (the host checks).

#define S_MONO 1
#ifndef S_MONO_THREADS
#define S_MONO_THREADS 256
#endif
// bytes of shared memory for the op bodies' arrays, split evenly over the
// sub-blocks of an op (checked per carve: a body past its share traps)
#ifndef S_MONO_POOL
#define S_MONO_POOL 40960
#endif
#define S_MONO_MAX_SUBS (S_MONO_THREADS / 32)
// The linears' bodies with half the loads in flight a warp: under the call
// ABI at 128 registers the full unroll spills inside their loops (NVRTC
// 13.0, sm_90); half does not, and measured 11-14% faster a mono layer
// (bench/NOTES.md session 9, run 5). The order of the sums is the same
// (bit-identical to the standard path's full unroll): the general walks
// deal K to the warps whatever the batch (s_chunk), and the fast walk's
// interleaved form deals granules of the unhalved batch (SHWalk::G;
// until session 28 it dealt by the halved one, and mono's MXFP8 linears
// past one row summed in another order than the standard path's).
#ifndef S_UNROLL_HALF
#define S_UNROLL_HALF 1
#endif

#if defined(M3_HIP_FREESTANDING)
#define __align__(n) __attribute__((aligned(n)))
// the HIP headers' vector types the interpreter uses (bodies read .x/.y/.z)
struct uint3 {
  unsigned int x, y, z;
};
M3_DEV uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return {x, y, z}; }
struct dim3 {
  unsigned int x, y, z;
  __device__ dim3(unsigned int a, unsigned int b, unsigned int c) : x(a), y(b), z(c) {}
};
#endif

// the virtual launch of the op being run (set by the interpreter between
// two CTA-wide barriers): per sub-block its block index, and for all the
// grid, log2 of the op's block size
__shared__ uint3 s_mono_bid[S_MONO_MAX_SUBS];
__shared__ uint3 s_mono_gdim;
__shared__ u32 s_mono_lg;
// this CTA's place in the op's order: blockIdx.x rotated by the op's
// SMonoOp::rot (mono.cu s_mono_blocks)
__shared__ u32 s_mono_cta;
__shared__ __align__(16) unsigned char s_mono_pool[S_MONO_POOL];

/// Stop the kernel (a broken invariant: the host never records such a
/// program).
M3_DEV void m3_mono_trap() {
#if defined(M3_HIP)
  __builtin_trap();
#else
  __trap();
#endif
}
/// The global nanosecond timer (comparable across SMs, unlike clock64).
/// HIP: the device's constant-rate real-time counter (`s_memrealtime`,
/// 100 MHz on CDNA3 / CDNA4: ticks x 10 ns), comparable across CUs too.
M3_DEV unsigned long long m3_mono_now() {
#if defined(M3_SIM)
  return 0ull;  // the simulator keeps no time
#elif defined(M3_HIP)
  return __builtin_amdgcn_s_memrealtime() * 10ull;
#else
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}
M3_DEV u32 m3_mono_bsz() { return 1u << s_mono_lg; }
M3_DEV u32 m3_mono_sub() { return threadIdx.x >> s_mono_lg; }
M3_DEV uint3 m3_mono_tid() { return make_uint3(threadIdx.x & (m3_mono_bsz() - 1u), 0u, 0u); }
M3_DEV uint3 m3_mono_bid() { return s_mono_bid[m3_mono_sub()]; }
M3_DEV dim3 m3_mono_bdim() { return dim3(m3_mono_bsz(), 1u, 1u); }
M3_DEV dim3 m3_mono_gdim() { return dim3(s_mono_gdim.x, s_mono_gdim.y, s_mono_gdim.z); }
#if defined(M3_HIP)
// one multi-wavefront sub-block size at most (128 threads: 2 wavefronts),
// so a counter below only ever counts generations of one size
static_assert(S_MONO_THREADS <= 256, "HIP mono: the sub-block counters assume one partial multi-wave size");
/// Per sub-block, the arrivals of its wavefronts at its barriers (LDS,
/// zeroed at the kernel's start; counts generations, never reset).
__shared__ u32 s_mono_wbar[S_MONO_MAX_SUBS];
/// __syncthreads of a sub-block (HIP): the workgroup's barrier when the op
/// fills the CTA; a wavefront's when the sub-block is one (its lanes run
/// in lockstep: the fences order its memory accesses); else lane 0 of each
/// wavefront adds one to the sub-block's counter and waits for the end of
/// the generation, fenced at workgroup scope on both sides.
M3_DEV void m3_mono_sync() {
  const u32 B = m3_mono_bsz();
  if (B == S_MONO_THREADS) {
    __syncthreads();
    return;
  }
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_wave_barrier();
  if (B > M3_WARP && (threadIdx.x % M3_WARP) == 0u) {
    const u32 waves = B / M3_WARP;  // a power of two: the counter wraps whole
    u32* c = &s_mono_wbar[m3_mono_sub()];
    const u32 old = __hip_atomic_fetch_add(c, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP);
    const u32 target = (old / waves + 1u) * waves;
    while ((int)(__hip_atomic_load(c, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP) - target) < 0)
      __builtin_amdgcn_s_sleep(1);
  }
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
#else
/// __syncthreads of a sub-block: barrier 1 + sub, its B threads (barrier 0
/// is the interpreter's, all S_MONO_THREADS).
M3_DEV void m3_mono_sync() {
#if defined(M3_SIM)
  m3sim::named_barrier(1u + m3_mono_sub(), m3_mono_bsz());
#else
  asm volatile("bar.sync %0, %1;" ::"r"(1u + m3_mono_sub()), "r"(m3_mono_bsz()) : "memory");
#endif
}
#endif
/// The next `bytes` of the calling sub-block's share of the pool (16-byte
/// aligned); `off` is the body's running offset (S_SMEM_SCOPE).
M3_DEV unsigned char* m3_mono_smem(u32& off, u32 bytes) {
  const u32 share = S_MONO_POOL / (S_MONO_THREADS >> s_mono_lg);
  const u32 at = off;
  off = (off + bytes + 15u) & ~15u;
  if (off > share) m3_mono_trap();
  return s_mono_pool + m3_mono_sub() * share + at;
}

// (hip_freestanding.h defines the built-ins as macros)
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#define threadIdx (m3_mono_tid())
#define blockIdx (m3_mono_bid())
#define blockDim (m3_mono_bdim())
#define gridDim (m3_mono_gdim())
#define __syncthreads() m3_mono_sync()
#define S_SMEM_SCOPE u32 s_smem_off_ = 0u
#define S_SHARED(T, name, dims) \
  T(&name) dims = *reinterpret_cast<T(*) dims>(m3_mono_smem(s_smem_off_, (u32)sizeof(T dims)))
#undef M3_KERNEL
#define M3_KERNEL static __device__ __forceinline__
/// A shared word read as it is now (another thread of the CTA writes it).
M3_DEV u32 m3_mono_vol(const u32& v) { return *reinterpret_cast<const volatile u32*>(&v); }
#undef M3_PDL_WAIT
#undef M3_PDL_TRIGGER
// Early start (S_MONO_EARLY, CUDA): the grid barrier between two phases
// is split into its arrival, made when a CTA's share of the op is done,
// and its wait, made where the next op's body would wait for the previous
// kernel in its own launch (M3_PDL_WAIT: the standard path launches every
// body with PDL, so what a body does before it reads and writes nothing a
// step writes). So a CTA reads the next op, calls its body, loads its
// arguments and its first weights while the grid's other CTAs finish the
// op before, as a PDL launch overlaps the kernel before it; the layer's
// first op waits for the previous launch (griddepcontrol.wait) there too.
// 0: the interpreter waits at the barrier and a body's wait is a compiler
// barrier only (HIP: no early start, unmeasured there). On the H100 a b1
// MoE layer 0.3428 ms with it against 0.3756 without (-8.7%; b4 -6.2%,
// b16 -1.9%), the same bits (bench/NOTES.md session 30).
#ifndef S_MONO_EARLY
#if defined(M3_HIP)
#define S_MONO_EARLY 0
#else
#define S_MONO_EARLY 1
#endif
#endif
#if S_MONO_EARLY && defined(M3_HIP)
#error "S_MONO_EARLY: CUDA only (its waiters spin apart from their poller, which wave64 lockstep cannot)"
#endif
// How the wait acquires once the grid barrier is complete. 0: the poller
// fences at GPU scope (`fence.acq_rel.gpu`: MEMBAR.ALL.GPU, which also
// waits for the poller's own loads still in flight, such as a linear's
// weights loaded before its wait, and an L1 invalidation), then writes
// `seen`, and every thread of the body fences at CTA scope
// (MEMBAR.ALL.CTA) after its wait. 1: the poller re-reads the count with
// one acquire load (NVRTC 13.0: the invalidation, no GPU-scope MEMBAR)
// and releases `seen` at CTA scope; the waiters read `seen` with acquire
// loads and do not fence. The same ordering by the PTX memory model's
// causality (arrivals' releases -> the poller's acquire -> its release
// of `seen` -> a waiter's acquire). Measured (H100, bench/NOTES.md
// session 36, 2 rounds interleaved, every 16-step gate bitwise), a MoE
// layer: b1 -2.0% (0.2398 -> 0.2351 ms), b4 -1.1%, b16 -0.5%: 1 (CUDA's
// early start only; HIP has none).
#ifndef S_MONO_WAKE_ACQ
#define S_MONO_WAKE_ACQ 1
#endif
#if S_MONO_EARLY
// The CTA's barrier state (thread 0 of the interpreter writes it between
// two CTA-wide barriers; a body's threads read it): the grid barriers this
// CTA has arrived at in this launch, the ones it has seen complete, the
// ones a waiter has claimed to poll for, and the counter value that ends
// the newest one (mono.cu s_mono_arrive).
__shared__ u32 s_mono_need, s_mono_seen, s_mono_claim;
__shared__ unsigned long long s_mono_target;
__shared__ unsigned long long* s_mono_bar;
/// The op profile's wake stamp (the launch has a profile buffer:
/// s_mono_profiling 1): when a body of the current op first passed its
/// dependency wait on this CTA (0: none yet). The interpreter's thread 0
/// stores it with the CTA's finish stamp and sets it back to 0.
__shared__ u32 s_mono_profiling;
__shared__ unsigned long long s_mono_woke;
/// Poll the grid's counter until the newest barrier this CTA arrived at
/// is complete, acquire, and mark it seen (one thread: the interpreter's
/// thread 0 or a body's claimed poller).
M3_DEV void m3_mono_poll() {
  const u32 need = m3_mono_vol(s_mono_need);
  const unsigned long long target = *reinterpret_cast<const volatile unsigned long long*>(&s_mono_target);
#if defined(M3_SIM)
  // one CTA at a time: the barrier is complete when its only CTA arrived
  if (__atomic_load_n(s_mono_bar, __ATOMIC_SEQ_CST) < target)
    m3sim::trap("a grid barrier with another CTA to wait for (the simulator runs one at a time)");
#else
  unsigned long long cur;
  do {
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(cur) : "l"(s_mono_bar) : "memory");
  } while (cur < target);
#if S_MONO_WAKE_ACQ
  // one acquire load of the count (it synchronizes with the arrivals'
  // releases); `seen` is then released at CTA scope for the waiters
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(cur) : "l"(s_mono_bar) : "memory");
#else
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
#endif
#endif
  *reinterpret_cast<volatile u32*>(&s_mono_claim) = need;
#if S_MONO_WAKE_ACQ && !defined(M3_SIM)
  asm volatile("st.release.cta.shared.u32 [%0], %1;"
               ::"r"((u32)__cvta_generic_to_shared(&s_mono_seen)), "r"(need)
               : "memory");
#else
  *reinterpret_cast<volatile u32*>(&s_mono_seen) = need;
#endif
}
/// The wake stamp of a body's first pass of its wait (thread 0 of each
/// sub-block offers it; the first one stays), in a profiled launch only.
M3_DEV void m3_mono_woke() {
  if (m3_mono_vol(s_mono_profiling) != 0u && threadIdx.x == 0u)
    atomicCAS(&s_mono_woke, 0ull, m3_mono_now());
}
/// `seen` as a waiter reads it: with S_MONO_WAKE_ACQ an acquire at CTA
/// scope (it pairs with the poller's release store), else a plain read
/// (the wait's closing fence orders what follows).
M3_DEV u32 m3_mono_seen() {
#if S_MONO_WAKE_ACQ && !defined(M3_SIM)
  u32 v;
  asm volatile("ld.acquire.cta.shared.u32 %0, [%1];"
               : "=r"(v)
               : "r"((u32)__cvta_generic_to_shared(&s_mono_seen))
               : "memory");
  return v;
#else
  return m3_mono_vol(s_mono_seen);
#endif
}
/// A body's dependency wait: nothing on a step's data before it. The
/// layer's first phase waits for the launch before (griddepcontrol.wait,
/// each thread); a later one for the CTA's newest grid barrier: the first
/// thread to claim it polls, the rest wait for it on shared memory.
M3_DEV void m3_mono_wait() {
  const u32 need = m3_mono_vol(s_mono_need);
  if (need == 0u) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    m3_mono_woke();
    return;
  }
  if (m3_mono_seen() != need) {
    if (atomicCAS(&s_mono_claim, need - 1u, need) == need - 1u) m3_mono_poll();
    else
      while (m3_mono_seen() != need) {
#if defined(M3_SIM)
        m3sim::trap("a mono waiter with no poller (the simulator runs one CTA at a time)");
#else
        __nanosleep(32);
#endif
      }
  }
#if !defined(M3_SIM) && !S_MONO_WAKE_ACQ
  // the poller acquired at gpu scope, then wrote `seen`: ordered after it
  asm volatile("fence.acq_rel.cta;" ::: "memory");
#endif
  m3_mono_woke();
}
#define M3_PDL_WAIT() m3_mono_wait()
#else
// (the interpreter waits once at its start; a body's wait stays a compiler
// barrier, so the body's code keeps the order it has in its own kernel)
#define M3_PDL_WAIT() asm volatile("" ::: "memory")
#endif
#define M3_PDL_TRIGGER() ((void)0)
#undef __launch_bounds__
#define __launch_bounds__(...)
// No read-only (non-coherent) loads: inside one mono launch an op reads
// what an earlier op of the same launch wrote (the residual, the normed
// rows, ...), which `const __restrict__` would let the compiler fetch
// through the non-coherent path.
#define __restrict__
