// m3's HIP simulator: what the kernels use from HIP, written for the host
// CPU, so that the HIP route of the engine (wave64, MI350's semantics) runs
// without an AMD GPU (runtime/sim.rs; ARCHITECTURE.md, "The HIP simulator").
//
// The runtime compiles `hip_sim.h` + compat.h + the kernel source with the
// host C++ compiler into a shared library and calls one launcher a kernel
// (`m3sim_launch_<name>`, appended by the runtime). A launch runs its blocks
// one after another on the calling thread; the threads of a block are
// fibers (own stacks, switched cooperatively), so a fiber runs until it
// reaches a point where it must wait for others:
// - `__syncthreads()`: every thread of the block that has not returned;
// - a wavefront collective (`__shfl`, `__shfl_xor`, the wave barrier): every
//   lane of its 64-lane wavefront that has not returned and is not waiting
//   at `__syncthreads` (such a lane is inactive there, as a lane outside
//   the EXEC mask is on hardware) (of its 32-lane half
//   for a collective of width 32 or less, which touches no other lane on
//   hardware either, so a half-wave branch may run it alone). Lanes run one
//   after another, not in lockstep, so code that relies on lockstep without
//   a barrier (warp-synchronous shared memory) reads stale values here, as
//   it may on real hardware: the simulator shows such races, it does not
//   hide them.
// A block in which no fiber can go on (a thread waits at a barrier that
// another never reaches) is a deadlock: the launch fails with a message
// naming the kernel, the block and where its threads wait.
//
// Launches run one at a time in the process (the runtime holds a lock), so
// the scheduler's state and `__shared__` variables are plain statics.
// Atomics are the compiler's `__atomic` builtins. Floating point is the
// host's IEEE arithmetic with no contraction (`-ffp-contract=off`): results
// agree with a GPU's to the kernels' stated tolerances, and bit for bit
// where a kernel is exact.
//
// One shortcut: compat.h's shuffled m16n8k16 tile product gathers its 32
// lanes' fragments in one exchange here (`m3sim::gather32`) instead of 32
// shuffles, doing the same arithmetic in the same order (the shuffle
// indices themselves are modelled by tests/wave64.rs).

#ifndef M3_HIP_SIM_H
#define M3_HIP_SIM_H 1

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

// Two flavours. The HIP one (the default): compat.h takes its HIP branch
// (and includes no HIP header), 64-lane wavefronts. The CUDA one
// (M3_SIM_CUDA): compat.h takes its CUDA branch, 32-lane warps, and every
// PTX `asm` of it is replaced by its generic twin (compat.h guards them
// with M3_SIM), so the CUDA-only code paths (the small-step linears'
// one-row and one-tile walks, warp-aggregated atomics) run too.
#define M3_SIM 1
#if defined(M3_SIM_CUDA)
#define M3_SIM_WARP 32
#else
#define __HIPCC_RTC__ 1
#define M3_SIM_WARP 64
#endif

#define __host__
#define __device__
// The runtime's scan pass (-DM3SIM_SCAN -E) finds the kernels by this mark.
#if defined(M3SIM_SCAN)
#define __global__ __m3sim_kernel__
#else
#define __global__
#endif
#define __shared__ static
#define __constant__ static const
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

// ---- the scheduler (defined once, in the runtime's launcher section) -------
namespace m3sim {
/// Lanes of a wavefront (CDNA, 64) or warp (CUDA, 32).
constexpr int kWave = M3_SIM_WARP;
/// The calling fiber's thread index in its block, and the launch's shape.
struct Dim3 {
  unsigned int x, y, z;
};
extern Dim3 g_tid, g_bid, g_bdim, g_gdim;
/// Block-wide barrier; the barrier of the calling lane's group of `width`
/// lanes (64: its wavefront; 32 or fewer: its half, which a half-wave
/// branch may run alone, as width-32 shuffles do on hardware).
void block_barrier();
void wave_barrier(int width = kWave);
/// The exchange buffer of the calling lane's group of `width` lanes for
/// its next collective (written at the lane's own index, read after
/// `wave_barrier(width)`); `*lane` is the lane in its wavefront, `*base`
/// the group's first lane (indices into the buffer are lane - base).
unsigned long long* wave_slots(int width, int* lane, int* base);
/// The six fragment registers (a0..a3, b0, b1) of every lane of the calling
/// lane's 32-lane group, after a barrier of the group: lane j's at 6 j.
const unsigned int* gather32(const unsigned int* a, unsigned int b0, unsigned int b1);
[[noreturn]] void trap(const char* why);
/// A spinning thread's pause (`__builtin_amdgcn_s_sleep`): let the block's
/// other threads run; a block that only spins for long traps.
void spin_yield();
/// PTX's `bar.sync id, count`: wait until `count` threads of the block have
/// arrived at barrier `id` (the mono kernel's sub-block barriers).
void named_barrier(unsigned id, unsigned count);
}  // namespace m3sim

#define threadIdx (m3sim::g_tid)
#define blockIdx (m3sim::g_bid)
#define blockDim (m3sim::g_bdim)
#define gridDim (m3sim::g_gdim)

struct alignas(8) uint2 {
  unsigned int x, y;
};
struct alignas(16) uint4 {
  unsigned int x, y, z, w;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
  dim3(unsigned int a = 1, unsigned int b = 1, unsigned int c = 1) : x(a), y(b), z(c) {}
};
static inline void __trap() { m3sim::trap("__trap"); }
static inline uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline uint3 make_uint3(unsigned int x, unsigned int y, unsigned int z) { return {x, y, z}; }

static inline void __syncthreads() { m3sim::block_barrier(); }

// ---- bit casts and integer helpers ----------------------------------------
static inline float __uint_as_float(unsigned int b) { return __builtin_bit_cast(float, b); }
static inline float __int_as_float(int b) { return __builtin_bit_cast(float, b); }
static inline unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }
static inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
static inline double __longlong_as_double(long long b) { return __builtin_bit_cast(double, b); }
static inline long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// ---- correctly rounded arithmetic (no contraction in this build) ----------
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }

// ---- wavefront collectives (hip_freestanding.h's semantics) ---------------
namespace m3sim {
/// Every lane of the wavefront publishes `v`; each gets lane `src`'s value.
template <typename T> inline T exchange(T v, int (*pick)(int lane, int arg, int width), int arg, int width) {
  static_assert(sizeof(T) <= 8, "a collective moves at most 8 bytes a lane");
  int lane = 0, base = 0;
  unsigned long long* slots = wave_slots(width, &lane, &base);
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slots[lane - base] = bits;
  wave_barrier(width);
  const unsigned long long got = slots[pick(lane, arg, width) - base];
  T r;
  std::memcpy(&r, &got, sizeof(T));
  return r;
}
inline int pick_index(int lane, int src, int width) { return (src & (width - 1)) | (lane & ~(width - 1)); }
inline int pick_xor(int lane, int mask, int width) {
  const int idx = lane ^ mask;
  return ((idx & ~(width - 1)) != (lane & ~(width - 1))) ? lane : idx;
}
}  // namespace m3sim
template <typename T> static inline T __shfl(T v, int src, int width = M3_SIM_WARP) {
  return m3sim::exchange(v, m3sim::pick_index, src, width);
}
template <typename T> static inline T __shfl_xor(T v, int mask, int width = M3_SIM_WARP) {
  return m3sim::exchange(v, m3sim::pick_xor, mask, width);
}

// ---- CUDA's warp intrinsics (the CUDA flavour; masks are all lanes) ------
template <typename T> static inline T __shfl_sync(unsigned, T v, int src, int width = M3_SIM_WARP) {
  return __shfl(v, src, width);
}
template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int mask, int width = M3_SIM_WARP) {
  return __shfl_xor(v, mask, width);
}
static inline void __syncwarp(unsigned = 0xffffffffu) { m3sim::wave_barrier(32); }
/// The lanes of the calling lane's 32-lane group whose `v` equals its own.
template <typename T> static inline unsigned __match_any_sync(unsigned, T v) {
  int lane = 0, base = 0;
  unsigned long long* slots = m3sim::wave_slots(32, &lane, &base);
  unsigned long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slots[lane - base] = bits;
  m3sim::wave_barrier(32);
  unsigned m = 0;
  for (int j = 0; j < 32; ++j) m |= (slots[j] == bits ? 1u : 0u) << j;
  return m;
}
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= (unsigned)((v >> (8u * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
template <typename T> static inline T __ldg(const T* p) { return *p; }
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- atomics (relaxed unless stated; the simulator orders them anyway) ----
template <typename T> static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline float atomicAdd(float* p, float v) {
  float old = *p, nv;
  do {
    nv = old + v;
  } while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
template <typename T> static inline T atomicMax(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T> static inline T atomicMin(T* p, T v) {
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T> static inline T atomicCAS(T* p, T cmp, T v) {
  __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return cmp;
}
template <typename T> static inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
#define __HIP_MEMORY_SCOPE_WORKGROUP 3
#define __HIP_MEMORY_SCOPE_AGENT 4
#define __HIP_MEMORY_SCOPE_SYSTEM 5
#define __hip_atomic_fetch_add(p, v, order, scope) __atomic_fetch_add((p), (v), (order))
#define __hip_atomic_fetch_max(p, v, order, scope) atomicMax((p), (v))
#define __hip_atomic_load(p, order, scope) __atomic_load_n((p), (order))
#define __hip_atomic_store(p, v, order, scope) __atomic_store_n((p), (v), (order))

// ---- the AMDGPU builtins the kernels name --------------------------------
#define __builtin_amdgcn_fence(order, scope) __atomic_thread_fence(order)
#define __builtin_amdgcn_wave_barrier() m3sim::wave_barrier()
#define __builtin_amdgcn_s_barrier() m3sim::block_barrier()
#define __builtin_amdgcn_s_sleep(n) m3sim::spin_yield()
#define __builtin_amdgcn_s_memrealtime() 0ull
#define __builtin_trap() m3sim::trap("__builtin_trap")

#endif  // M3_HIP_SIM_H
