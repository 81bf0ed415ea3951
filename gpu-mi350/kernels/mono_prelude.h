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
// CUDA only for now (named barriers with thread counts; HIP's s_barrier is
// workgroup-wide, so a HIP mono takes one op block per workgroup).

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
// (bit-identical to the standard path's full unroll).
#ifndef S_UNROLL_HALF
#define S_UNROLL_HALF 1
#endif

// the virtual launch of the op being run (set by the interpreter between
// two CTA-wide barriers): per sub-block its block index, and for all the
// grid, log2 of the op's block size
__shared__ uint3 s_mono_bid[S_MONO_MAX_SUBS];
__shared__ uint3 s_mono_gdim;
__shared__ u32 s_mono_lg;
__shared__ __align__(16) unsigned char s_mono_pool[S_MONO_POOL];

M3_DEV u32 m3_mono_bsz() { return 1u << s_mono_lg; }
M3_DEV u32 m3_mono_sub() { return threadIdx.x >> s_mono_lg; }
M3_DEV uint3 m3_mono_tid() { return make_uint3(threadIdx.x & (m3_mono_bsz() - 1u), 0u, 0u); }
M3_DEV uint3 m3_mono_bid() { return s_mono_bid[m3_mono_sub()]; }
M3_DEV dim3 m3_mono_bdim() { return dim3(m3_mono_bsz(), 1u, 1u); }
M3_DEV dim3 m3_mono_gdim() { return dim3(s_mono_gdim.x, s_mono_gdim.y, s_mono_gdim.z); }
/// __syncthreads of a sub-block: barrier 1 + sub, its B threads (barrier 0
/// is the interpreter's, all S_MONO_THREADS).
M3_DEV void m3_mono_sync() {
  asm volatile("bar.sync %0, %1;" ::"r"(1u + m3_mono_sub()), "r"(m3_mono_bsz()) : "memory");
}
/// The next `bytes` of the calling sub-block's share of the pool (16-byte
/// aligned); `off` is the body's running offset (S_SMEM_SCOPE).
M3_DEV unsigned char* m3_mono_smem(u32& off, u32 bytes) {
  const u32 share = S_MONO_POOL / (S_MONO_THREADS >> s_mono_lg);
  const u32 at = off;
  off = (off + bytes + 15u) & ~15u;
  if (off > share) __trap();
  return s_mono_pool + m3_mono_sub() * share + at;
}

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
#undef M3_PDL_WAIT
#undef M3_PDL_TRIGGER
// (the interpreter waits once at its start; a body's wait stays a compiler
// barrier, so the body's code keeps the order it has in its own kernel)
#define M3_PDL_WAIT() asm volatile("" ::: "memory")
#define M3_PDL_TRIGGER() ((void)0)
#undef __launch_bounds__
#define __launch_bounds__(...)
// No read-only (non-coherent) loads: inside one mono launch an op reads
// what an earlier op of the same launch wrote (the residual, the normed
// rows, ...), which `const __restrict__` would let the compiler fetch
// through the non-coherent path.
#define __restrict__
