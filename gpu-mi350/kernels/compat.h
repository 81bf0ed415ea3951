// m3 kernel prelude: the one place that knows whether we are compiled by
// NVRTC (CUDA) or by hiprtc / hipcc (HIP). Every kernel source is compiled as
// `compat.h` + source, concatenated by the Rust side (no #include search path
// is needed with NVRTC), so nothing here may depend on a system header under
// CUDA. No <cuda_fp16.h>: bf16 / FP8 / FP4 bit helpers live here.


#if defined(__HIPCC__) || defined(__HIP__) || defined(__HIPCC_RTC__)
#define M3_HIP 1
// hiprtc declares the HIP device API itself; hipcc needs the header; the
// clang -nogpuinc build has hip_freestanding.h in front of this file.
#if !defined(__HIPCC_RTC__) && !defined(M3_HIP_FREESTANDING)
#include <hip/hip_runtime.h>
#endif
// CDNA (gfx9) runs 64-wide wavefronts.
#define M3_WARP 64
#define M3_SHFL_XOR(v, m) __shfl_xor((v), (m), M3_WARP)
#define M3_SHFL_XOR32(v, m) __shfl_xor((v), (m), 32)
#define M3_SHFL32(v, src) __shfl((v), (src), 32)
// A wavefront runs in lockstep; the barrier orders its LDS accesses.
#define M3_SYNC_WARP() __builtin_amdgcn_wave_barrier()
#else
#define M3_CUDA 1
#define M3_WARP 32
#define M3_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), M3_WARP)
#define M3_SHFL_XOR32(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), 32)
#define M3_SHFL32(v, src) __shfl_sync(0xffffffffu, (v), (src), 32)
#define M3_SYNC_WARP() __syncwarp()
#endif

#define M3_KERNEL extern "C" __global__

// ---- launch bounds on HIP ---------------------------------------------------
// Without __launch_bounds__, HIP compiles a kernel for 1024-thread blocks,
// which caps a wave64 thread at 128 VGPRs (and spills past that). A kernel
// whose host launch uses a smaller block states it with M3_HIP_BLOCK(t): t
// must be the block size the host really launches with (a larger block
// then fails to launch), so t is a #define the host's constant is tested
// against. Nothing on CUDA, whose register allocation is tuned as it is.
#if defined(M3_HIP)
#define M3_HIP_BLOCK(t) __launch_bounds__(t)
#else
#define M3_HIP_BLOCK(t)
#endif
#define M3_DEV static __device__ __forceinline__

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef int i32;
typedef long long i64;

// ---- bit casts -----------------------------------------------------------
M3_DEV float m3_f32(u32 b) { return __uint_as_float(b); }
M3_DEV u32 m3_bits(float x) { return __float_as_uint(x); }
/// Byte j (0..3, a compile-time constant at the call) of w, zero-extended:
/// one byte permute on CUDA (where a shift and a mask are two).
#if defined(M3_CUDA)
M3_DEV u32 m3_byte(u32 w, u32 j) { return __byte_perm(w, 0u, 0x4440u | j); }
#else
M3_DEV u32 m3_byte(u32 w, u32 j) { return (w >> (8u * j)) & 0xffu; }
#endif
M3_DEV double m3_f64(u64 b) { return __longlong_as_double((long long)b); }
M3_DEV u64 m3_bits64(double x) { return (u64)__double_as_longlong(x); }

/// The canonical quiet NaN that every decoder returns (payloads carry no
/// meaning in these formats).
M3_DEV float m3_nan() { return m3_f32(0x7fc00000u); }

// ---- device-wide fence -----------------------------------------------------
/// Orders the calling thread's global memory accesses before and after it
/// for every thread of the device: the last-block-done pattern (each CTA
/// writes, fences, counts; the last to count fences, then reads them all).
#if defined(M3_HIP)
M3_DEV void m3_fence_gpu() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }
#else
M3_DEV void m3_fence_gpu() { __threadfence(); }
#endif

// ---- warp reduction (width M3_WARP, never a literal 32) --------------------
M3_DEV float m3_warp_sum(float v) {
#pragma unroll
  for (int m = M3_WARP / 2; m > 0; m >>= 1) v += M3_SHFL_XOR(v, m);
  return v;
}

// ---- BF16 ----------------------------------------------------------------
/// f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN.
M3_DEV u16 m3_bf16_from_f32(float x) {
  u32 b = m3_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (u16)((b >> 16) | 0x0040u);
  u32 lsb = (b >> 16) & 1u;
  return (u16)((b + 0x7fffu + lsb) >> 16);
}
M3_DEV float m3_bf16_to_f32(u16 h) { return m3_f32(((u32)h) << 16); }

// ---- E8M0 ----------------------------------------------------------------
/// 2^(c-127) exactly; 0x00 is the f32 subnormal 2^-127; 0xFF is NaN.
M3_DEV float m3_e8m0_decode(u8 c) {
  if (c == 0xffu) return m3_nan();
  if (c == 0u) return m3_f32(0x00400000u);
  return m3_f32(((u32)c) << 23);
}

// ---- small-float element codecs -------------------------------------------
// Element types as integers shared with the Rust side.
#define M3_ELEM_E2M1 0
#define M3_ELEM_E4M3 1
#define M3_ELEM_E5M2 2

/// Exact decode of an element code (E2M1: low nibble).
M3_DEV float m3_elem_decode(int elem, u32 code) {
  int ebits, mbits, bias;
  u32 sign;
  if (elem == M3_ELEM_E2M1) {
    code &= 0xfu; ebits = 2; mbits = 1; bias = 1; sign = code >> 3;
  } else if (elem == M3_ELEM_E4M3) {
    code &= 0xffu; ebits = 4; mbits = 3; bias = 7; sign = code >> 7;
    if ((code & 0x7fu) == 0x7fu) return m3_nan();
  } else {
    code &= 0xffu; ebits = 5; mbits = 2; bias = 15; sign = code >> 7;
    if (((code >> 2) & 0x1fu) == 0x1fu) {
      if ((code & 3u) == 0u) return sign ? m3_f32(0xff800000u) : m3_f32(0x7f800000u);
      return m3_nan();
    }
  }
  u32 e = (code >> mbits) & ((1u << ebits) - 1u);
  u32 m = code & ((1u << mbits) - 1u);
  u32 bits;
  if (e == 0u) {
    // subnormal: m * 2^(1 - bias - mbits), exact in f32
    float v = (float)m * m3_f32((u32)(127 + 1 - bias - mbits) << 23);
    bits = m3_bits(v);
  } else {
    bits = ((e - (u32)bias + 127u) << 23) | (m << (23 - mbits));
  }
  return m3_f32(bits | (sign << 31));
}

/// Saturating round-to-nearest-even encode of an exact value (f64 so that
/// quotients computed by callers stay exact). Past max (and +-Inf) gives
/// +-max; -0 keeps its sign; NaN gives E4M3 0x7F / E5M2 0x7E with the sign
/// kept, and E2M1 code 0 (block rules handle NaN before).
M3_DEV u32 m3_elem_encode_sat(int elem, double x) {
  int mbits, bias;
  u32 sign_shift, maxcode;
  double maxv;
  if (elem == M3_ELEM_E2M1) { mbits = 1; bias = 1; sign_shift = 3; maxcode = 0x7u; maxv = 6.0; }
  else if (elem == M3_ELEM_E4M3) { mbits = 3; bias = 7; sign_shift = 7; maxcode = 0x7eu; maxv = 448.0; }
  else { mbits = 2; bias = 15; sign_shift = 7; maxcode = 0x7bu; maxv = 57344.0; }
  u64 xb = m3_bits64(x);
  u32 sign = (u32)(xb >> 63);
  if ((xb & 0x7fffffffffffffffull) > 0x7ff0000000000000ull) {
    if (elem == M3_ELEM_E2M1) return 0u;
    return (sign << sign_shift) | (elem == M3_ELEM_E4M3 ? 0x7fu : 0x7eu);
  }
  double a = fabs(x);
  if (a >= maxv) return (sign << sign_shift) | maxcode;
  int emin = 1 - bias;
  u32 code;
  // exponent of a (f64 bits; a is finite, non-negative)
  int ea = (int)((m3_bits64(a) >> 52) & 0x7ffu) - 1023;
  if (a == 0.0 || ea < emin) {
    // target subnormal range: quantum 2^(emin - mbits)
    double q = rint(ldexp(a, mbits - emin));
    code = (u32)q;  // q == 2^mbits is the smallest normal: same bit pattern
  } else {
    double q = rint(ldexp(a, mbits - ea));  // in [2^mbits, 2^(mbits+1)]
    u32 qi = (u32)q;
    if (qi == (1u << (mbits + 1))) { qi >>= 1; ea += 1; }
    code = ((u32)(ea + bias) << mbits) | (qi - (1u << mbits));
    if (code > maxcode) code = maxcode;
  }
  return (sign << sign_shift) | code;
}

// ---- NVFP4 block (FORMATS.md NVFP4 steps 2-3) ------------------------------
/// One NVFP4 block of 16 values `v` with global scale `g` (multiplies at
/// decode): the unpacked E2M1 codes into `c[16]`, the E4M3 scale byte
/// returned. A block holding NaN or +-Inf: scale 0x7F (NaN), codes 0. Else
/// s = e4m3_sat(bamax / (6 g)); s decoding to 0 gives codes 0 (the block
/// reads +0); else c_i = e2m1_sat(v_i / (g * e4m3(s))). Both quotients in
/// f64 with explicit roundings (no contraction whatever the build's
/// --fmad): 6 g and g * e4m3(s) are exact there, and the f64 quotient rounds
/// like the exact one (m3_core::formats::nvfp4::quantize_block says why),
/// so this is bit-identical with the CPU's block rule. Shared by the weight
/// quantizer (formats.cu) and the NVFP4 KV cache writes
/// (standard_decode.cu's m3s_cache_write, elementwise.cu's harness encode).
M3_DEV u32 m3_nvfp4_block(const float* v, double g, u32* c) {
  float bamax = 0.0f;
  bool bad = false;
  for (int j = 0; j < 16; ++j) {
    const float a = fabsf(v[j]);
    if (!(a <= 3.402823466e38f)) bad = true;  // NaN or Inf
    else bamax = fmaxf(bamax, a);
  }
  if (bad) {
    for (int j = 0; j < 16; ++j) c[j] = 0u;
    return 0x7fu;
  }
  const u32 s = m3_elem_encode_sat(M3_ELEM_E4M3, __ddiv_rn((double)bamax, __dmul_rn(6.0, g)));
  const double sd = (double)m3_elem_decode(M3_ELEM_E4M3, s);
  if (sd == 0.0) {
    for (int j = 0; j < 16; ++j) c[j] = 0u;
    return s;
  }
  const double den = __dmul_rn(g, sd);
  for (int j = 0; j < 16; ++j) c[j] = m3_elem_encode_sat(M3_ELEM_E2M1, __ddiv_rn((double)v[j], den));
  return s;
}

// ---- MX shared exponent ----------------------------------------------------
#define M3_RULE_FLOOR 0
#define M3_RULE_EVEN 1
#define M3_RULE_RCEIL 2

M3_DEV int m3_elem_emax(int elem) { return elem == M3_ELEM_E2M1 ? 2 : (elem == M3_ELEM_E4M3 ? 8 : 15); }
M3_DEV int m3_elem_mbits(int elem) { return elem == M3_ELEM_E2M1 ? 1 : (elem == M3_ELEM_E4M3 ? 3 : 2); }

/// floor(log2(a)) of a finite positive f32 from its bits (subnormals too).
M3_DEV int m3_floor_log2_f32(u32 b) {
  int e = (int)((b >> 23) & 0xffu);
  if (e == 0) return (31 - __clz((int)(b & 0x7fffffu))) - 149;
  return e - 127;
}

/// The E8M0 scale byte of a block whose finite amax (>= 0) is given
/// (FORMATS.md MX step 2). NaN / Inf blocks are handled by the caller.
M3_DEV u32 m3_mx_scale_byte(int elem, int rule, float amax) {
  if (amax == 0.0f) return 0u;
  u32 b = m3_bits(amax);
  int e;
  if (rule == M3_RULE_FLOOR) {
    e = m3_floor_log2_f32(b) - m3_elem_emax(elem);
  } else if (rule == M3_RULE_EVEN) {
    u32 r = b + (1u << (23 - m3_elem_mbits(elem) - 1));
    u32 ex = (r >> 23) & 0xffu;
    // mantissa cleared; a subnormal that did not carry floors below 2^-126,
    // where every e clamps to -127 anyway; the all-ones exponent is 2^128.
    int fl = ex == 0xffu ? 128 : (ex == 0u ? -127 : (int)ex - 127);
    e = fl - m3_elem_emax(elem);
  } else {
    float inv = elem == M3_ELEM_E2M1 ? (1.0f / 6.0f) : (elem == M3_ELEM_E4M3 ? (1.0f / 448.0f) : (1.0f / 57344.0f));
    float d = __fmul_rn(amax, inv);
    u32 db = m3_bits(d);
    if (d == 0.0f) {
      e = -149;  // below the smallest subnormal: rounded up it is 2^-149
    } else {
      int ex = (int)((db >> 23) & 0xffu);
      u32 mant = db & 0x7fffffu;
      if (ex == 0) {
        int fl = (31 - __clz((int)mant)) - 149;
        e = fl + ((mant & (mant - 1u)) != 0u ? 1 : 0);
      } else {
        e = ex - 127 + (mant != 0u ? 1 : 0);
      }
    }
  }
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return (u32)(e + 127);
}

// ---- fast in-register decoders for the GEMV inner loops -------------------
/// |E2M1| magnitude from the low 3 bits, sign from bit 3 (no NaN in E2M1).
M3_DEV float m3_fp4_fast(u32 c) {
  u32 mag = c & 7u;
  u32 bits = mag < 2u ? (mag ? 0x3f000000u : 0u) : ((((mag >> 1) + 126u) << 23) | ((mag & 1u) << 22));
  return m3_f32(bits | ((c & 8u) << 28));
}
/// E4M3FN decode for weights (NaN codes give NaN).
M3_DEV float m3_e4m3_fast(u32 c) {
  u32 e = (c >> 3) & 0xfu, m = c & 7u;
  u32 s = (c & 0x80u) << 24;
  if ((c & 0x7fu) == 0x7fu) return m3_nan();
  if (e == 0u) return m3_f32(m3_bits((float)m * 0.001953125f) | s);
  return m3_f32(s | ((e + 120u) << 23) | (m << 20));
}

/// One NVFP4 KV-cache value as attention and the indexer read it (ARCHITECTURE.md,
/// NVFP4 KV cache): f32(e2m1(code) * e4m3(s) * g). e2m1 * e4m3 has at most
/// 6 significant bits and lies in [2^-10, 2688], so the first product is
/// exact in f32 and the second is the one rounding of the exact product the
/// CPU takes in f64: bit-identical with cache_load_nvfp4. A NaN scale byte
/// (0x7F / 0xFF) gives NaN. Explicit roundings: no contraction.
M3_DEV float m3_nvfp4_cache_value(u32 code, u32 sbyte, float g) {
  return __fmul_rn(__fmul_rn(m3_fp4_fast(code), m3_e4m3_fast(sbyte)), g);
}
/// bf16 bits of e2m1(code) * s for a decoded E4M3 scale s: exact (at most
/// 6 significant bits, in bf16's normal range), so the top half of the f32
/// product is the value; NaN stays NaN (every f32 NaN's top half is one).
M3_DEV u32 m3_nvfp4_bf16(u32 code, float s) { return m3_bits(__fmul_rn(m3_fp4_fast(code), s)) >> 16; }

// ---- tensor-core tile product (bf16 in, f32 accumulate) --------------------
// The m16n8k16 tile product as PTX `mma.sync` defines it, over a group of 32
// threads (the mma's own geometry, not the hardware warp size): with
// g = lane32 / 4 and t = lane32 % 4, a0..a3 hold A[g][2t..2t+1],
// A[g+8][2t..2t+1], A[g][2t+8..2t+9], A[g+8][2t+8..2t+9]; b0, b1 hold
// B[2t..2t+1][g], B[2t+8..2t+9][g]; c0..c3 are D[g][2t], D[g][2t+1],
// D[g+8][2t], D[g+8][2t+1]. Lower column / row index in the low half.
// (The simulator, runtime/sim.rs, takes the generic twins of every PTX
// block below in both of its flavours: M3_SIM.)
#if defined(M3_CUDA) && !defined(M3_SIM)
M3_DEV void m3_mma_bf16_16816(float* c, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/// Two f32 to bf16x2 (round to nearest even; `hi` in the upper half).
M3_DEV u32 m3_pack_bf16x2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
/// Two bf16 products, lane by lane (bf16x2; round to nearest even; bf16
/// arithmetic has no flush-to-zero, so subnormal inputs are values). The
/// addend -0 keeps every product's own sign, zeros included.
M3_DEV u32 m3_mul_bf16x2(u32 a, u32 b) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(0x80008000u));
  return r;
}
#else
// HIP: the same tile product from lane shuffles within each 32-thread group
// (two groups per 64-lane wavefront: the width-32 shuffles keep them apart;
// tests/wave64.rs models it). Correct, not fast: the MFMA version for gfx950
// is still to be written.
/// The shuffled tile product for 16-bit operands whose halves `half(w, 0)`
/// (low) and `half(w, 1)` (high) turn into f32 exactly.
/// Fragment register k (a0..a3, b0, b1) of a tile product's operands.
M3_DEV u32 m3_frag_reg(const u32* a, u32 b0, u32 b1, int k) { return k < 4 ? a[k] : (k == 4 ? b0 : b1); }
template <typename Half> M3_DEV void m3_mma_emul_16816(float* c, const u32* a, u32 b0, u32 b1, Half half) {
  const int l = (int)(threadIdx.x % 32u), g = l / 4, t = l % 4;
#if defined(M3_SIM)
  // the simulator exchanges the group's fragments once (hip_sim.h)
  const u32* frag = m3sim::gather32(a, b0, b1);
#define M3_FRAG(k, lane) frag[(lane) * 6 + (k)]
#else
#define M3_FRAG(k, lane) __shfl(m3_frag_reg(a, b0, b1, (k)), (lane), 32)
#endif
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
#pragma unroll
    for (int tp = 0; tp < 4; ++tp) {
      u32 ag = M3_FRAG(hi ? 2 : 0, g * 4 + tp);
      u32 ag8 = M3_FRAG(hi ? 3 : 1, g * 4 + tp);
      u32 bn0 = M3_FRAG(hi ? 5 : 4, (2 * t) * 4 + tp);
      u32 bn1 = M3_FRAG(hi ? 5 : 4, (2 * t + 1) * 4 + tp);
      float al = half(ag, 0), ah = half(ag, 1);
      float a8l = half(ag8, 0), a8h = half(ag8, 1);
      float b0l = half(bn0, 0), b0h = half(bn0, 1);
      float b1l = half(bn1, 0), b1h = half(bn1, 1);
      c[0] += al * b0l + ah * b0h;
      c[1] += al * b1l + ah * b1h;
      c[2] += a8l * b0l + a8h * b0h;
      c[3] += a8l * b1l + a8h * b1h;
    }
  }
#undef M3_FRAG
}
struct M3Bf16Half {
  __device__ __forceinline__ float operator()(u32 w, int hi) const { return m3_f32(hi ? (w & 0xffff0000u) : (w << 16)); }
};
M3_DEV void m3_mma_bf16_16816(float* c, const u32* a, u32 b0, u32 b1) {
  m3_mma_emul_16816(c, a, b0, b1, M3Bf16Half{});
}
M3_DEV u32 m3_pack_bf16x2(float lo, float hi) {
  return (u32)m3_bf16_from_f32(lo) | ((u32)m3_bf16_from_f32(hi) << 16);
}
M3_DEV u32 m3_mul_bf16x2(u32 a, u32 b) {
  return m3_pack_bf16x2(m3_f32(a << 16) * m3_f32(b << 16), m3_f32(a & 0xffff0000u) * m3_f32(b & 0xffff0000u));
}
#endif

// ---- f16: the MX linears' operands -----------------------------------------
// s_mmh_linear (standard_decode.cu) multiplies f16 operands on the tensor
// cores: every E2M1 (through E4M3, times 2^-6), E4M3 and E5M2 code is an f16
// value exactly, and x comes in f16 with a power-of-two scale a block or a
// row that puts its largest |value| in [2^13, 2^15): bf16's 8 significant
// bits fit f16's 11 down to 2^-17, 30 binades below, so the products are
// exact there and only the f32 sums round. A value smaller still rounds to
// f16's subnormal grid (2^-24: at most 2^-38 of the largest; SwiGLU's
// negative tail reaches it under a row scale).
/// f16 bits -> f32, exact (subnormals, Inf, NaN kept).
M3_DEV float m3_f16_to_f32(u32 h) {
#if defined(M3_HIP) || defined(M3_SIM)
  return (float)__builtin_bit_cast(_Float16, (u16)h);
#else
  const u32 s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return m3_f32(s | 0x7f800000u | (m << 13));
  if (e == 0u) return m3_f32(m3_bits((float)m * 5.9604644775390625e-8f) | s);
  return m3_f32(s | ((e + 112u) << 23) | (m << 13));
#endif
}
/// f32 -> f16 bits, round to nearest even (integer arithmetic, the same on
/// every vendor); past 65504 rounds to Inf; NaN gives a quiet NaN.
M3_DEV u32 m3_f16_from_f32(float x) {
  const u32 b = m3_bits(x), s = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return s | 0x7e00u;
  if (a >= 0x477ff000u) return s | 0x7c00u;
  if (a < 0x38800000u) {
    // below 2^-14: an f16 subnormal, value * 2^24 = mant24 >> sh rounded
    const int sh = 126 - (int)(a >> 23);
    if (sh > 25 || (a >> 23) == 0u) return s;
    const u32 m = (a & 0x7fffffu) | 0x800000u, half = 1u << (sh - 1);
    const u32 rem = m & ((1u << sh) - 1u);
    u32 q = m >> sh;
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return s | q;
  }
  return s | ((a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13);
}
/// One E4M3FN code -> f16 bits (exact; NaN codes give NaN).
M3_DEV u32 m3_e4m3_f16(u32 c) {
  const u32 s = (c & 0x80u) << 8, e = (c >> 3) & 0xfu, m = c & 7u;
  if ((c & 0x7fu) == 0x7fu) return s | 0x7e00u;
  if (e != 0u) return s | ((e + 8u) << 10) | (m << 7);
  if (m == 0u) return s;
  // m * 2^-9 with m = 1..7: leading bit p, exponent p - 9
  const u32 p = m >= 4u ? 2u : (m >= 2u ? 1u : 0u);
  return s | ((p + 6u) << 10) | ((m << (10u - p)) & 0x3ffu);
}
#if defined(M3_CUDA) && !defined(M3_SIM)
/// Four E4M3 codes (bytes 0-3) -> f16x2 of bytes 0, 1 and of bytes 2, 3.
M3_DEV void m3_e4m3x4_f16(u32 a, u32& lo, u32& hi) {
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.rn.f16x2.e4m3x2 %0, l; cvt.rn.f16x2.e4m3x2 %1, h; }"
      : "=r"(lo), "=r"(hi) : "r"(a));
}
/// Two E4M3 codes (bits 0-7, 8-15 of a) as f32 (exact; NaN codes NaN).
M3_DEV void m3_e4m3x2_f32(u32 a, float& f0, float& f1) {
  asm("{ .reg .b16 p, l, h; .reg .b32 x; cvt.u16.u32 p, %2; cvt.rn.f16x2.e4m3x2 x, p; mov.b32 {l, h}, x;"
      " cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
      : "=f"(f0), "=f"(f1) : "r"(a));
}
/// Two E4M3 codes (bits 0-7, 8-15 of a) as f16x2, bits 0-7's value in the
/// low half (exact; NaN codes NaN).
M3_DEV u32 m3_e4m3x2_f16x2(u32 a) {
  u32 r;
  asm("{ .reg .b16 p; cvt.u16.u32 p, %1; cvt.rn.f16x2.e4m3x2 %0, p; }" : "=r"(r) : "r"(a));
  return r;
}
/// f16x2 a times the f16 in half `hi` of s (0: low), lane by lane (round
/// to nearest even; f16 arithmetic keeps subnormals). One HMUL2 with a
/// broadcast operand.
M3_DEV u32 m3_mul_f16x2_by(u32 a, u32 s, int hi) {
  u32 r;
  if (hi)
    asm("{ .reg .b16 l, h; .reg .b32 b; mov.b32 {l, h}, %2; mov.b32 b, {h, h}; mul.rn.f16x2 %0, %1, b; }"
        : "=r"(r) : "r"(a), "r"(s));
  else
    asm("{ .reg .b16 l, h; .reg .b32 b; mov.b32 {l, h}, %2; mov.b32 b, {l, l}; mul.rn.f16x2 %0, %1, b; }"
        : "=r"(r) : "r"(a), "r"(s));
  return r;
}
/// The m16n8k16 tile product on f16 operands (layout as the bf16 one).
M3_DEV void m3_mma_f16_16816(float* c, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/// d = A B (m3_mma_f16_16816 without an accumulator input: no zeroing).
M3_DEV void m3_mma_f16_16816z(float* d, const u32* a, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
#else
M3_DEV void m3_e4m3x4_f16(u32 a, u32& lo, u32& hi) {
  lo = m3_e4m3_f16(a & 0xffu) | (m3_e4m3_f16((a >> 8) & 0xffu) << 16);
  hi = m3_e4m3_f16((a >> 16) & 0xffu) | (m3_e4m3_f16(a >> 24) << 16);
}
M3_DEV void m3_e4m3x2_f32(u32 a, float& f0, float& f1) {
  f0 = m3_e4m3_fast(a & 0xffu);
  f1 = m3_e4m3_fast((a >> 8) & 0xffu);
}
M3_DEV u32 m3_e4m3x2_f16x2(u32 a) { return m3_e4m3_f16(a & 0xffu) | (m3_e4m3_f16((a >> 8) & 0xffu) << 16); }
M3_DEV u32 m3_mul_f16x2_by(u32 a, u32 s, int hi) {
  // an f16 product is exact in f32; one rounding to f16 (the hardware's
  // conversion on HIP, F16C on the simulator's host)
  const float f = m3_f16_to_f32(hi ? s >> 16 : s & 0xffffu);
  const _Float16 lo = (_Float16)(m3_f16_to_f32(a & 0xffffu) * f), up = (_Float16)(m3_f16_to_f32(a >> 16) * f);
  return (u32)__builtin_bit_cast(u16, lo) | ((u32)__builtin_bit_cast(u16, up) << 16);
}
// HIP: lane shuffles within each 32-thread group, as the bf16 one.
struct M3F16Half {
  __device__ __forceinline__ float operator()(u32 w, int hi) const { return m3_f16_to_f32(hi ? (w >> 16) : (w & 0xffffu)); }
};
M3_DEV void m3_mma_f16_16816(float* c, const u32* a, u32 b0, u32 b1) {
  m3_mma_emul_16816(c, a, b0, b1, M3F16Half{});
}
M3_DEV void m3_mma_f16_16816z(float* d, const u32* a, u32 b0, u32 b1) {
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  m3_mma_f16_16816(d, a, b0, b1);
}
#endif
/// Two E4M3 codes (bits 0-7, 8-15 of a) as exact bf16 values packed in a
/// u32 (bits 0-7's value in the low half): every E4M3 value is a bf16
/// value, so the top half of its f32 is it. On CUDA four instructions a
/// pair (the hardware E4M3 -> f16 conversion, two f16 -> f32, a byte
/// permute) where the bit-level m3_e4m3_fast took about ten a value
/// (bench/NOTES.md session 18); NaN codes give NaN.
M3_DEV u32 m3_e4m3x2_bf16x2(u32 a) {
  float f0, f1;
  m3_e4m3x2_f32(a, f0, f1);
  return (m3_bits(f0) >> 16) | (m3_bits(f1) & 0xffff0000u);
}
/// Ask L2 for the line holding p (no register, no wait; nothing on HIP).
M3_DEV void m3_prefetch_l2(const void* p) {
#if defined(M3_CUDA) && !defined(M3_SIM)
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}
/// Ask L1 for the line holding p (no register, no wait; nothing on HIP).
M3_DEV void m3_prefetch_l1(const void* p) {
#if defined(M3_CUDA) && !defined(M3_SIM)
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#else
  (void)p;
#endif
}
/// A global load through the read-only path (uint4, uint2, u32; plain on
/// HIP).
template <typename T> M3_DEV T m3_ldg(const T* p) {
#if defined(M3_CUDA)
  return __ldg(p);
#else
  return *p;
#endif
}
/// A 16-byte global load of streamed weights (read once a step: not kept in
/// L1; plain on HIP).
M3_DEV uint4 m3_ldg_stream_u4(const uint4* p) {
#if defined(M3_CUDA) && !defined(M3_SIM)
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
#else
  return *p;
#endif
}
/// Four E5M2 codes -> f16x2 of bytes 0, 1 and 2, 3 (an E5M2 code is the
/// top byte of its f16).
M3_DEV void m3_e5m2x4_f16(u32 a, u32& lo, u32& hi) {
  lo = ((a & 0xffu) << 8) | ((a & 0xff00u) << 16);
  hi = ((a >> 8) & 0xff00u) | (a & 0xff000000u);
}

// ---- programmatic dependent launch ------------------------------------------
// A kernel launched with programmatic stream serialization may start while
// the previous kernel drains: M3_PDL_WAIT blocks until that kernel has
// finished and its writes are visible (nothing a step writes may be read or
// written before it); M3_PDL_TRIGGER lets the next kernel be scheduled early.
// Both are no-ops where the hardware has no such launch (HIP, before sm_90).
#if defined(M3_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define M3_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define M3_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" :::)
#else
#define M3_PDL_WAIT() ((void)0)
#define M3_PDL_TRIGGER() ((void)0)
#endif
