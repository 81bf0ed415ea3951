// Format kernels: bit-exact with m3_core::formats (FORMATS.md). Built with
// FMA contraction off (--fmad=false on NVRTC, -ffp-contract=off on HIP), so
// every product and quotient is one IEEE rounding, as on the CPU.
// Element types: 0 E2M1, 1 E4M3, 2 E5M2 (M3_ELEM_*); rules: 0 floor,
// 1 even, 2 rceil (M3_RULE_*). One thread per element or per block.

// Threads per block of the one-thread-per-item launches (ops::THREADS,
// grid_1d); M3_HIP_BLOCK for the kernels that need more than the 128 VGPRs
// of HIP's default 1024-thread build.
#define M3_FMT_THREADS 256

M3_KERNEL void m3_decode_elem(int elem, const u8* __restrict__ codes, float* __restrict__ out, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = m3_elem_decode(elem, codes[i]);
}

M3_KERNEL void m3_decode_e8m0(const u8* __restrict__ codes, float* __restrict__ out, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = m3_e8m0_decode(codes[i]);
}

M3_KERNEL void m3_encode_elem(int elem, const double* __restrict__ x, u8* __restrict__ out, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (u8)m3_elem_encode_sat(elem, x[i]);
}

M3_KERNEL void m3_bf16_round(const float* __restrict__ x, u16* __restrict__ out, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = m3_bf16_from_f32(x[i]);
}

/// Store 32 element codes of one block: FP4 packed (low nibble = even
/// element), FP8 one byte each.
M3_DEV void m3_store_block_codes(int elem, u8* dst, const u32* codes) {
  if (elem == M3_ELEM_E2M1) {
    for (int j = 0; j < 16; ++j) dst[j] = (u8)(codes[2 * j] | (codes[2 * j + 1] << 4));
  } else {
    for (int j = 0; j < 32; ++j) dst[j] = (u8)codes[j];
  }
}

/// MX quantize (FORMATS.md MX steps 1-3), one thread per block of 32.
/// codes: [rows, cols/2] (FP4) or [rows, cols]; scales: [rows, cols/32].
M3_KERNEL void m3_mx_quantize(int elem, int rule, const float* __restrict__ x, u8* __restrict__ codes,
                              u8* __restrict__ scales, u32 rows, u32 cols) {
  u32 nb = cols / 32u;
  u64 blk = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (blk >= (u64)rows * nb) return;
  u64 r = blk / nb, b = blk % nb;
  const float* v = x + r * cols + b * 32u;
  u32 c[32];
  float amax = 0.0f;
  bool bad = false;
  for (int j = 0; j < 32; ++j) {
    float a = fabsf(v[j]);
    if (!(a <= 3.402823466e38f)) bad = true;  // NaN or Inf
    else amax = fmaxf(amax, a);
  }
  u32 s;
  if (bad) {
    s = 0xffu;
    for (int j = 0; j < 32; ++j) c[j] = 0u;
  } else {
    s = m3_mx_scale_byte(elem, rule, amax);
    int e = (int)s - 127;
    for (int j = 0; j < 32; ++j) c[j] = m3_elem_encode_sat(elem, ldexp((double)v[j], -e));
  }
  scales[blk] = (u8)s;
  u64 per = elem == M3_ELEM_E2M1 ? 16u : 32u;
  m3_store_block_codes(elem, codes + r * (cols / 32u) * per + b * per, c);
}

/// MX dequantize: decode(code) * 2^(scale-127) as one f32 product; scale
/// 0xFF gives NaN. One thread per element.
M3_KERNEL void m3_mx_dequantize(int elem, const u8* __restrict__ codes, const u8* __restrict__ scales,
                                float* __restrict__ out, u32 rows, u32 cols) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * cols) return;
  u64 r = i / cols, k = i % cols;
  u32 s = scales[r * (cols / 32u) + k / 32u];
  u32 code;
  if (elem == M3_ELEM_E2M1) {
    u32 byte = codes[r * (cols / 2u) + k / 2u];
    code = (k & 1u) ? (byte >> 4) : (byte & 0xfu);
  } else {
    code = codes[r * cols + k];
  }
  out[i] = s == 0xffu ? m3_nan() : __fmul_rn(m3_elem_decode(elem, code), m3_e8m0_decode((u8)s));
}

/// NVFP4 step 1, part 1: max |x| over finite values, as f32 bits
/// (non-negative floats order like their bit patterns). *amax_bits must be 0.
M3_KERNEL void m3_nvfp4_amax(const float* __restrict__ x, u32* __restrict__ amax_bits, u64 n) {
  u32 m = 0u;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
    u32 b = m3_bits(x[i]) & 0x7fffffffu;
    if (b < 0x7f800000u && b > m) m = b;
  }
  atomicMax(amax_bits, m);
}

/// NVFP4 step 1, part 2: g = f32(amax / 2688); amax 0 gives 1.0; an
/// underflow to 0 gives the smallest f32 subnormal. One thread.
M3_KERNEL void m3_nvfp4_global(const u32* __restrict__ amax_bits, float* __restrict__ g) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  float amax = m3_f32(*amax_bits);
  float v;
  if (amax == 0.0f) v = 1.0f;
  else {
    v = __fdiv_rn(amax, 2688.0f);
    if (v == 0.0f) v = m3_f32(1u);
  }
  *g = v;
}

/// NVFP4 steps 2-3, one thread per block of 16. codes: [rows, cols/2];
/// scales (E4M3): [rows, cols/16]; g read from device memory.
M3_KERNEL void m3_nvfp4_quantize(const float* __restrict__ x, const float* __restrict__ gp, u8* __restrict__ codes,
                                 u8* __restrict__ scales, u32 rows, u32 cols) {
  u32 nb = cols / 16u;
  u64 blk = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (blk >= (u64)rows * nb) return;
  u64 r = blk / nb, b = blk % nb;
  const float* v = x + r * cols + b * 16u;
  u32 c[16];
  const u32 s = m3_nvfp4_block(v, (double)(*gp), c);
  scales[blk] = (u8)s;
  u8* dst = codes + r * (cols / 2u) + b * 8u;
  for (int j = 0; j < 8; ++j) dst[j] = (u8)(c[2 * j] | (c[2 * j + 1] << 4));
}

/// Exact NVFP4 element value e2m1 * e4m3(s) * g (at most 30 significant
/// bits, so exact in f64); a NaN scale gives NaN.
M3_DEV double m3_nvfp4_value(const u8* codes, const u8* scales, double g, u64 r, u64 k, u32 cols) {
  u32 byte = codes[r * (cols / 2u) + k / 2u];
  u32 code = (k & 1u) ? (byte >> 4) : (byte & 0xfu);
  float s = m3_elem_decode(M3_ELEM_E4M3, scales[r * (cols / 16u) + k / 16u]);
  return __dmul_rn(__dmul_rn((double)m3_elem_decode(M3_ELEM_E2M1, code), (double)s), g);
}

/// NVFP4 decode: f32 rounding of the exact product. One thread per element.
M3_KERNEL void m3_nvfp4_dequantize(const u8* __restrict__ codes, const u8* __restrict__ scales, float g,
                                   float* __restrict__ out, u32 rows, u32 cols) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * cols) return;
  out[i] = (float)m3_nvfp4_value(codes, scales, (double)g, i / cols, i % cols, cols);
}

/// E8M0 scale byte of a block of exact (f64) values under `rule`: the f64
/// twin of m3_mx_scale_byte (floor / even read the exact value's exponent;
/// rceil rounds amax to f32 first, as its definition is an f32 product).
M3_DEV u32 m3_mx_scale_byte_f64(int elem, int rule, double amax) {
  if (amax == 0.0) return 0u;
  if (rule == M3_RULE_RCEIL) return m3_mx_scale_byte(elem, rule, (float)amax);
  u64 b = m3_bits64(amax);
  if (rule == M3_RULE_EVEN) b += 1ull << (52 - m3_elem_mbits(elem) - 1);
  int ex = (int)((b >> 52) & 0x7ffu) - 1023;
  int e = ex - m3_elem_emax(elem);
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return (u32)(e + 127);
}

/// NVFP4 -> MXFP4 (FORMATS.md Conversions): exact decode, then MX-quantize
/// the exact values under `rule`. One thread per MX block of 32.
M3_KERNEL void M3_HIP_BLOCK(M3_FMT_THREADS)
    m3_nvfp4_to_mxfp4(int rule, const u8* __restrict__ codes, const u8* __restrict__ scales, float gf,
                      u8* __restrict__ out_codes, u8* __restrict__ out_scales, u32 rows, u32 cols) {
  u32 nb = cols / 32u;
  u64 blk = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (blk >= (u64)rows * nb) return;
  u64 r = blk / nb, b = blk % nb;
  double g = (double)gf;
  double v[32];
  double amax = 0.0;
  bool bad = false;
  for (int j = 0; j < 32; ++j) {
    v[j] = m3_nvfp4_value(codes, scales, g, r, b * 32u + j, cols);
    double a = fabs(v[j]);
    if (!(a <= 1.79e308)) bad = true;
    else amax = fmax(amax, a);
  }
  u32 c[32];
  u32 s;
  if (bad) {
    s = 0xffu;
    for (int j = 0; j < 32; ++j) c[j] = 0u;
  } else {
    s = m3_mx_scale_byte_f64(M3_ELEM_E2M1, rule, amax);
    int e = (int)s - 127;
    for (int j = 0; j < 32; ++j) c[j] = m3_elem_encode_sat(M3_ELEM_E2M1, ldexp(v[j], -e));
  }
  out_scales[blk] = (u8)s;
  m3_store_block_codes(M3_ELEM_E2M1, out_codes + r * (cols / 2u) + b * 16u, c);
}

/// MXFP8 -> BF16: RNE(decode(e) * 2^(s-127)), one f32 product then one
/// rounding. The lossless-mode refusal (NaN or out-of-range scale bytes) is
/// checked by the host before launch. One thread per element.
M3_KERNEL void m3_mxfp8_to_bf16(int elem, const u8* __restrict__ codes, const u8* __restrict__ scales,
                                u16* __restrict__ out, u32 rows, u32 cols) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * cols) return;
  u64 r = i / cols, k = i % cols;
  float v = __fmul_rn(m3_elem_decode(elem, codes[i]), m3_e8m0_decode(scales[r * (cols / 32u) + k / 32u]));
  out[i] = m3_bf16_from_f32(v);
}

/// PTPC FP8 (E4M3) quantize, one thread per row: scale = f32(amax / 448)
/// over the finite values (zero row: 1.0; an underflow to 0: the smallest
/// subnormal), codes = encode_sat_e4m3(x / scale) with the quotient in f64.
M3_KERNEL void m3_ptpc_quantize(const float* __restrict__ x, u8* __restrict__ codes, float* __restrict__ scales,
                                u32 rows, u32 cols) {
  u32 r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* v = x + (u64)r * cols;
  float amax = 0.0f;
  for (u32 j = 0; j < cols; ++j) {
    float a = fabsf(v[j]);
    if (a <= 3.402823466e38f && a > amax) amax = a;
  }
  float s = 1.0f;
  if (amax != 0.0f) {
    s = __fdiv_rn(amax, 448.0f);
    if (s == 0.0f) s = m3_f32(1u);
  }
  scales[r] = s;
  for (u32 j = 0; j < cols; ++j) codes[(u64)r * cols + j] = (u8)m3_elem_encode_sat(M3_ELEM_E4M3, __ddiv_rn((double)v[j], (double)s));
}

/// PTPC dequantize: e4m3 * scale_row, one f32 product.
M3_KERNEL void m3_ptpc_dequantize(const u8* __restrict__ codes, const float* __restrict__ scales,
                                  float* __restrict__ out, u32 rows, u32 cols) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * cols) return;
  out[i] = __fmul_rn(m3_elem_decode(M3_ELEM_E4M3, codes[i]), scales[i / cols]);
}

/// FP8 KV / index cache store: encode_sat_e4m3(x / scale), quotient in f64.
M3_KERNEL void m3_cache_cast_e4m3(const float* __restrict__ x, float scale, u8* __restrict__ out, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (u8)m3_elem_encode_sat(M3_ELEM_E4M3, __ddiv_rn((double)x[i], (double)scale));
}
