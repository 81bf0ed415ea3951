// m3 freestanding HIP runtime: what the kernels use from the HIP headers and
// the ROCm device libraries (ids, barriers, shuffles, atomics, bit casts,
// math), written with clang builtins only, so a kernel compiles with
// `clang -x hip -nogpuinc -nogpulib` for any gfx9 target clang knows (gfx942,
// gfx950) without ROCm's headers or ockl / ocml bitcode. Prepended to
// compat.h + source by `KernelSource::hip_freestanding_source`; hiprtc and
// hipcc keep the HIP headers (compat.h includes them when this file is
// absent).
//
// Nothing here has run on AMD hardware. Integer and bit operations follow
// CUDA's definitions exactly. The transcendental functions are this file's
// own (see "math" below); they are not bit-identical to ocml's or CUDA's.

#if !defined(__HIP__)
#error "hip_freestanding.h: compile as HIP (clang -x hip)"
#endif
#if defined(__CLANG_HIP_RUNTIME_WRAPPER_INCLUDED__) || defined(__HIPCC_RTC__)
#error "hip_freestanding.h: compile with -nogpuinc (the HIP headers define the same names)"
#endif
#if defined(__HIP_DEVICE_COMPILE__) && !(defined(__gfx942__) || defined(__gfx950__))
#error "hip_freestanding.h: written for the wave64 gfx942 / gfx950 targets only"
#endif

#define M3_HIP_FREESTANDING 1

// ---- keywords ----------------------------------------------------------------
#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
// The kernels are written with CUDA's meaning of the second argument (a
// minimum number of blocks per multiprocessor); the HIP headers pass it on
// as a minimum number of waves per execution unit (SIMD), which caps
// registers far lower (`m3s_attn_partial` spilled 1,530 VGPRs that way).
// Translated here: b blocks of t threads are b * t / 64 waves over a CU's 4
// SIMDs, so at least ceil(b * t / 256) waves per SIMD.
#define M3H_LB_1(t) __attribute__((amdgpu_flat_work_group_size(1, t)))
#define M3H_LB_2(t, b) \
  __attribute__((amdgpu_flat_work_group_size(1, t), amdgpu_waves_per_eu((((b) * (t)) + 255) / 256)))
#define M3H_LB_PICK(a, b, which, ...) which
#define __launch_bounds__(...) M3H_LB_PICK(__VA_ARGS__, M3H_LB_2, M3H_LB_1, )(__VA_ARGS__)

#define M3H_DEV static __device__ __forceinline__

// ---- vector types (CUDA's layout: plain members, 8- / 16-byte aligned) --------
struct __attribute__((aligned(8))) uint2 {
  unsigned int x, y;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned int x, y, z, w;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
M3H_DEV uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }
M3H_DEV uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
M3H_DEV float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// ---- ids and dimensions -----------------------------------------------------
// HIP launches are uniform (grid size = blocks * block size), so the block
// count is the grid size in work items over the block size.
struct m3h_uint3 {
  unsigned int x, y, z;
};
M3H_DEV m3h_uint3 m3h_thread_idx() {
  return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z()};
}
M3H_DEV m3h_uint3 m3h_block_idx() {
  return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z()};
}
M3H_DEV m3h_uint3 m3h_block_dim() {
  return {(unsigned int)__builtin_amdgcn_workgroup_size_x(), (unsigned int)__builtin_amdgcn_workgroup_size_y(),
          (unsigned int)__builtin_amdgcn_workgroup_size_z()};
}
M3H_DEV m3h_uint3 m3h_grid_dim() {
  return {__builtin_amdgcn_grid_size_x() / (unsigned int)__builtin_amdgcn_workgroup_size_x(),
          __builtin_amdgcn_grid_size_y() / (unsigned int)__builtin_amdgcn_workgroup_size_y(),
          __builtin_amdgcn_grid_size_z() / (unsigned int)__builtin_amdgcn_workgroup_size_z()};
}
#define threadIdx (m3h_thread_idx())
#define blockIdx (m3h_block_idx())
#define blockDim (m3h_block_dim())
#define gridDim (m3h_grid_dim())

// ---- barriers -----------------------------------------------------------------
// CUDA's __syncthreads: every access before it (global and shared) is
// visible to the block after it. The HIP headers fence LDS only; this fences
// every address space at workgroup scope.
__attribute__((convergent)) M3H_DEV void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// ---- bit casts ------------------------------------------------------------------
M3H_DEV float __uint_as_float(unsigned int b) { return __builtin_bit_cast(float, b); }
M3H_DEV float __int_as_float(int b) { return __builtin_bit_cast(float, b); }
M3H_DEV unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }
M3H_DEV int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
M3H_DEV double __longlong_as_double(long long b) { return __builtin_bit_cast(double, b); }
M3H_DEV long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }

// ---- integer intrinsics (CUDA's definitions) ---------------------------------
/// Leading zeros of a 32-bit value; 32 for 0.
M3H_DEV int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
/// High 64 bits of the 128-bit product.
M3H_DEV unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
}
M3H_DEV int min(int a, int b) { return a < b ? a : b; }
M3H_DEV int max(int a, int b) { return a > b ? a : b; }
M3H_DEV unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
M3H_DEV unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
M3H_DEV long long min(long long a, long long b) { return a < b ? a : b; }
M3H_DEV long long max(long long a, long long b) { return a > b ? a : b; }
M3H_DEV unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
M3H_DEV unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

// ---- wavefront shuffles (64 lanes; CUDA's width semantics) -------------------
M3H_DEV int m3h_lane_id() { return (int)__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)); }
/// Lane `src % width` of this lane's `width`-wide segment.
M3H_DEV int __shfl(int v, int src, int width = 64) {
  const int l = m3h_lane_id();
  const int idx = (src & (width - 1)) | (l & ~(width - 1));
  return __builtin_amdgcn_ds_bpermute(idx << 2, v);
}
/// Lane `lane ^ mask`; a lane whose partner is outside its segment keeps
/// its own value.
M3H_DEV int __shfl_xor(int v, int mask, int width = 64) {
  const int l = m3h_lane_id();
  int idx = l ^ mask;
  if ((idx & ~(width - 1)) != (l & ~(width - 1))) idx = l;
  return __builtin_amdgcn_ds_bpermute(idx << 2, v);
}
M3H_DEV unsigned int __shfl(unsigned int v, int src, int width = 64) {
  return (unsigned int)__shfl((int)v, src, width);
}
M3H_DEV unsigned int __shfl_xor(unsigned int v, int mask, int width = 64) {
  return (unsigned int)__shfl_xor((int)v, mask, width);
}
M3H_DEV float __shfl(float v, int src, int width = 64) {
  return __int_as_float(__shfl(__float_as_int(v), src, width));
}
M3H_DEV float __shfl_xor(float v, int mask, int width = 64) {
  return __int_as_float(__shfl_xor(__float_as_int(v), mask, width));
}

// ---- atomics (CUDA's: relaxed, device scope; return the old value) ------------
M3H_DEV int atomicAdd(int* p, int v) { return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
M3H_DEV unsigned int atomicAdd(unsigned int* p, unsigned int v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
M3H_DEV unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
M3H_DEV int atomicMax(int* p, int v) { return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
M3H_DEV unsigned int atomicMax(unsigned int* p, unsigned int v) {
  return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}

// ---- correctly rounded arithmetic ------------------------------------------------
// One IEEE operation each, never fused into an FMA whatever -ffp-contract
// says (CUDA's meaning of the _rn intrinsics). HIP compiles f32 division
// correctly rounded by default, as NVRTC does (-prec-div=true).
M3H_DEV float __fmul_rn(float a, float b) {
#pragma clang fp contract(off)
  return a * b;
}
M3H_DEV float __fdiv_rn(float a, float b) {
#pragma clang fp contract(off)
  return a / b;
}
M3H_DEV double __dadd_rn(double a, double b) {
#pragma clang fp contract(off)
  return a + b;
}
M3H_DEV double __dsub_rn(double a, double b) {
#pragma clang fp contract(off)
  return a - b;
}
M3H_DEV double __dmul_rn(double a, double b) {
#pragma clang fp contract(off)
  return a * b;
}
M3H_DEV double __ddiv_rn(double a, double b) {
#pragma clang fp contract(off)
  return a / b;
}

// ---- math ------------------------------------------------------------------------
// Exact operations map to single instructions (fabs, floor, rint, ldexp,
// fmin / fmax, correctly rounded sqrtf). expf is LLVM's own AMDGPU
// expansion of llvm.exp.f32 (about 1 ulp; ocml's is about 1 ulp too, so
// results may differ from the ocml build in the last bit). sin / cos / pow
// in f64 are below (a few ulp in f64, see each), and sinf / cosf round the
// f64 result, so they are within an ulp of the true value where ocml's are
// within two: a HIP build's RoPE tables may differ from the ocml build (and
// from CUDA's) in the last bit of an f32.
M3H_DEV float fabsf(float x) { return __builtin_fabsf(x); }
M3H_DEV double fabs(double x) { return __builtin_fabs(x); }
M3H_DEV float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
M3H_DEV float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
M3H_DEV float fminf(float a, float b) { return __builtin_fminf(a, b); }
M3H_DEV double fmax(double a, double b) { return __builtin_fmax(a, b); }
M3H_DEV double fmin(double a, double b) { return __builtin_fmin(a, b); }
M3H_DEV double floor(double x) { return __builtin_floor(x); }
M3H_DEV double ceil(double x) { return __builtin_ceil(x); }
M3H_DEV double rint(double x) { return __builtin_rint(x); }
M3H_DEV double ldexp(double x, int e) { return __builtin_ldexp(x, e); }
M3H_DEV float sqrtf(float x) { return __builtin_sqrtf(x); }
M3H_DEV float expf(float x) { return __builtin_expf(x); }

/// sin(r) and cos(r) for |r| <= pi/4 + a little: Taylor series through
/// r^19 / r^20 (the first term left out is below 2^-60 relative).
M3H_DEV double m3h_sin_kernel(double r) {
  const double z = r * r;
  double p = 1.0 / 121645100408832000.0;  // 1/19!
  p = __builtin_fma(p, z, -1.0 / 355687428096000.0);  // 1/17!
  p = __builtin_fma(p, z, 1.0 / 1307674368000.0);     // 1/15!
  p = __builtin_fma(p, z, -1.0 / 6227020800.0);       // 1/13!
  p = __builtin_fma(p, z, 1.0 / 39916800.0);          // 1/11!
  p = __builtin_fma(p, z, -1.0 / 362880.0);           // 1/9!
  p = __builtin_fma(p, z, 1.0 / 5040.0);              // 1/7!
  p = __builtin_fma(p, z, -1.0 / 120.0);              // 1/5!
  p = __builtin_fma(p, z, 1.0 / 6.0);                 // 1/3!
  return __builtin_fma(-r * z, p, r);
}
M3H_DEV double m3h_cos_kernel(double r) {
  const double z = r * r;
  double p = 1.0 / 2432902008176640000.0;  // 1/20!
  p = __builtin_fma(p, z, -1.0 / 6402373705728000.0);  // 1/18!
  p = __builtin_fma(p, z, 1.0 / 20922789888000.0);     // 1/16!
  p = __builtin_fma(p, z, -1.0 / 87178291200.0);       // 1/14!
  p = __builtin_fma(p, z, 1.0 / 479001600.0);          // 1/12!
  p = __builtin_fma(p, z, -1.0 / 3628800.0);           // 1/10!
  p = __builtin_fma(p, z, 1.0 / 40320.0);              // 1/8!
  p = __builtin_fma(p, z, -1.0 / 720.0);               // 1/6!
  p = __builtin_fma(p, z, 1.0 / 24.0);                 // 1/4!
  // 1 - z/2 + z^2 p, keeping the rounding error of 1 - z/2
  const double h = 0.5 * z, w = 1.0 - h;
  return w + (((1.0 - w) - h) + z * z * p);
}
/// x = q * pi/2 + r with |r| <= pi/4 (three-part pi/2, each step one FMA).
/// Accurate while q * pi/2 fits the three parts' 160 bits, i.e. for |x| up
/// to about 2^50; past that the result is not meaningful.
M3H_DEV double m3h_reduce_pio2(double x, long long* q) {
  const double n = __builtin_rint(x * 0x1.45f306dc9c883p-1);  // x * 2/pi
  double r = __builtin_fma(-n, 0x1.921fb54442d18p+0, x);
  r = __builtin_fma(-n, 0x1.1a62633145c07p-54, r);
  r = __builtin_fma(-n, -0x1.f1976b7ed8fbcp-110, r);
  *q = (long long)n;
  return r;
}
M3H_DEV double sin(double x) {
  if (!__builtin_isfinite(x)) return x - x;  // NaN
  if (x == 0.0) return x;                    // keeps -0
  long long q;
  const double r = m3h_reduce_pio2(x, &q);
  switch (q & 3) {
    case 0: return m3h_sin_kernel(r);
    case 1: return m3h_cos_kernel(r);
    case 2: return -m3h_sin_kernel(r);
    default: return -m3h_cos_kernel(r);
  }
}
M3H_DEV double cos(double x) {
  if (!__builtin_isfinite(x)) return x - x;
  long long q;
  const double r = m3h_reduce_pio2(x, &q);
  switch (q & 3) {
    case 0: return m3h_cos_kernel(r);
    case 1: return -m3h_sin_kernel(r);
    case 2: return -m3h_cos_kernel(r);
    default: return m3h_sin_kernel(r);
  }
}
M3H_DEV float sinf(float x) { return (float)sin((double)x); }
M3H_DEV float cosf(float x) { return (float)cos((double)x); }

/// Natural log of a finite x > 0: x = 2^e m, m in [sqrt(1/2), sqrt(2)),
/// log m = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172 (series through s^23).
M3H_DEV double m3h_log_pos(double x) {
  int e = 0;
  if (x < 0x1p-1022) {  // subnormal: scale into the normal range
    x *= 0x1p54;
    e = -54;
  }
  const unsigned long long b = (unsigned long long)__double_as_longlong(x);
  e += (int)((b >> 52) & 0x7ffu) - 1023;
  double m = __longlong_as_double((long long)((b & 0x000fffffffffffffull) | 0x3ff0000000000000ull));
  if (m > 0x1.6a09e667f3bcdp+0) {  // sqrt(2)
    m *= 0.5;
    e += 1;
  }
  const double s = (m - 1.0) / (m + 1.0), z = s * s;
  double p = 1.0 / 23.0;
  p = __builtin_fma(p, z, 1.0 / 21.0);
  p = __builtin_fma(p, z, 1.0 / 19.0);
  p = __builtin_fma(p, z, 1.0 / 17.0);
  p = __builtin_fma(p, z, 1.0 / 15.0);
  p = __builtin_fma(p, z, 1.0 / 13.0);
  p = __builtin_fma(p, z, 1.0 / 11.0);
  p = __builtin_fma(p, z, 1.0 / 9.0);
  p = __builtin_fma(p, z, 1.0 / 7.0);
  p = __builtin_fma(p, z, 1.0 / 5.0);
  p = __builtin_fma(p, z, 1.0 / 3.0);
  const double ls = __builtin_fma(2.0 * s * z, p, 2.0 * s);
  const double de = (double)e;
  return __builtin_fma(de, 0x1.62e42fefa39efp-1, __builtin_fma(de, 0x1.abc9e3b39803fp-56, ls));  // e ln2 (two parts)
}
/// e^t: t = n ln2 + r, |r| <= ln2/2, Taylor series through r^13.
M3H_DEV double m3h_exp(double t) {
  if (t != t) return t;
  if (t > 709.79) return __builtin_inf();
  if (t < -745.2) return 0.0;
  const double n = __builtin_rint(t * 0x1.71547652b82fep+0);  // t / ln2
  double r = __builtin_fma(-n, 0x1.62e42fefa39efp-1, t);
  r = __builtin_fma(-n, 0x1.abc9e3b39803fp-56, r);
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = __builtin_fma(p, r, 1.0 / 479001600.0);
  p = __builtin_fma(p, r, 1.0 / 39916800.0);
  p = __builtin_fma(p, r, 1.0 / 3628800.0);
  p = __builtin_fma(p, r, 1.0 / 362880.0);
  p = __builtin_fma(p, r, 1.0 / 40320.0);
  p = __builtin_fma(p, r, 1.0 / 5040.0);
  p = __builtin_fma(p, r, 1.0 / 720.0);
  p = __builtin_fma(p, r, 1.0 / 120.0);
  p = __builtin_fma(p, r, 1.0 / 24.0);
  p = __builtin_fma(p, r, 1.0 / 6.0);
  p = __builtin_fma(p, r, 0.5);
  p = __builtin_fma(p, r, 1.0);
  p = __builtin_fma(p, r, 1.0);
  // 2^n p in two steps so that n down to -1075 does not underflow early
  const int ni = (int)n;
  return __builtin_ldexp(__builtin_ldexp(p, ni / 2), ni - ni / 2);
}
/// x^y for the kernels' use (x > 0: RoPE frequencies theta^(-2j/d)), as
/// exp(y log x): relative error about |y log x| * 2^-52 (a few ulp for
/// |y log x| < 16). x < 0 gives NaN (no integer-y cases: unused).
M3H_DEV double pow(double x, double y) {
  if (y == 0.0 || x == 1.0) return 1.0;
  if (x != x || y != y || x < 0.0) return __builtin_nan("");
  if (x == 0.0) return y > 0.0 ? 0.0 : __builtin_inf();
  if (__builtin_isinf(x)) return y > 0.0 ? x : 0.0;
  return m3h_exp(y * m3h_log_pos(x));
}
