// Element-wise and row ops of the GPU backend (MODEL.md 2, 3.4, 3.5, 3.10):
// weight decode (embed / dequantize), a generic f32-out linear (router, LM
// head, f32 weights), residual add, SwiGLU-OAI, partial NeoX RoPE and the
// KV-cache store. Compiled without FMA contraction so each element follows
// the CPU reference's operation order.

// Weight storage kinds (GpuBackend's device weights).
#define M3_W_BF16 0
#define M3_W_F32 1
#define M3_W_MX 2
#define M3_W_NVFP4 3

/// Element (r, c) of a weight [rows, cols] decoded exactly as cpu-ref does:
/// MX: elem * 2^(s-127) in f32; NVFP4: (e2m1 * e4m3) in f32, times the
/// global scale in f64, one rounding to f32.
M3_DEV float m3_w_at(int fmt, int elem, const u8* __restrict__ codes, const u8* __restrict__ scales, float g,
                     u64 cols, u64 r, u64 c) {
  u64 i = r * cols + c;
  if (fmt == M3_W_BF16) return m3_bf16_to_f32(reinterpret_cast<const u16*>(codes)[i]);
  if (fmt == M3_W_F32) return reinterpret_cast<const float*>(codes)[i];
  if (fmt == M3_W_MX) {
    u32 code = elem == M3_ELEM_E2M1 ? ((codes[i / 2] >> ((i & 1) * 4)) & 0xfu) : (u32)codes[i];
    u64 nb = (cols + 31) / 32;
    return m3_elem_decode(elem, code) * m3_e8m0_decode(scales[r * nb + c / 32]);
  }
  u32 code = (codes[i / 2] >> ((i & 1) * 4)) & 0xfu;
  float bs = m3_elem_decode(M3_ELEM_E4M3, scales[r * (cols / 16) + c / 16]);
  return (float)((double)(m3_elem_decode(M3_ELEM_E2M1, code) * bs) * (double)g);
}

/// out[i, c] = W[ids[i], c] as f32 (embedding rows, whole-weight decode).
M3_KERNEL void m3_decode_rows(int fmt, int elem, const u8* __restrict__ codes, const u8* __restrict__ scales, float g,
                              u32 cols, const u32* __restrict__ ids, u32 n, float* __restrict__ out) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)n * cols) return;
  u64 r = i / cols, c = i % cols;
  out[i] = m3_w_at(fmt, elem, codes, scales, g, cols, ids[r], c);
}

/// y[m, n] = sum_k xin[m, k] W[n, k] in f32; xin is x rounded to bf16 when
/// round_in; y rounded to bf16 when round_out. One warp per (m, n).
M3_KERNEL void m3_linear_generic(int fmt, int elem, const u8* __restrict__ codes, const u8* __restrict__ scales,
                                 float g, const float* __restrict__ x, u32 M, u32 N, u32 K, int round_in,
                                 int round_out, float* __restrict__ y) {
  const u32 warps = blockDim.x / M3_WARP;
  const u64 item = (u64)blockIdx.x * warps + threadIdx.x / M3_WARP;
  const u32 lane = threadIdx.x % M3_WARP;
  if (item >= (u64)M * N) return;
  const u64 m = item / N, n = item % N;
  float acc = 0.0f;
  for (u32 k = lane; k < K; k += M3_WARP) {
    float xv = x[m * K + k];
    if (round_in) xv = m3_bf16_to_f32(m3_bf16_from_f32(xv));
    acc += xv * m3_w_at(fmt, elem, codes, scales, g, K, n, k);
  }
  acc = m3_warp_sum(acc);
  if (lane == 0) y[item] = round_out ? m3_bf16_to_f32(m3_bf16_from_f32(acc)) : acc;
}

/// y = f32(bf16(x)).
M3_KERNEL void m3_round_bf16(const float* __restrict__ x, float* __restrict__ y, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = m3_bf16_to_f32(m3_bf16_from_f32(x[i]));
}

/// f32 -> bf16 bits (the input rows of the bf16 linear kernels).
M3_KERNEL void m3_to_bf16(const float* __restrict__ x, u16* __restrict__ y, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = m3_bf16_from_f32(x[i]);
}

/// bf16 bits -> f32.
M3_KERNEL void m3_from_bf16(const u16* __restrict__ x, float* __restrict__ y, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = m3_bf16_to_f32(x[i]);
}

/// acc += x.
M3_KERNEL void m3_add(float* __restrict__ acc, const float* __restrict__ x, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) acc[i] = acc[i] + x[i];
}

/// SwiGLU-OAI: g' = min(g, limit), u' = clamp(u, -limit, limit),
/// bf16(((u' + 1) * g') * sigmoid(alpha * g')), sigmoid = 1 / (1 + exp(-z)).
M3_KERNEL void m3_swiglu(const float* __restrict__ gate, const float* __restrict__ up, float alpha, float limit,
                         float* __restrict__ out, u32 n) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = fminf(gate[i], limit);
  float u = fminf(fmaxf(up[i], -limit), limit);
  float s = 1.0f / (1.0f + expf(-(alpha * g)));
  out[i] = m3_bf16_to_f32(m3_bf16_from_f32(((u + 1.0f) * g) * s));
}

/// Partial NeoX RoPE in place on x [T, heads, d] (f32). Pair i < rd/2:
/// f_i = theta^(-2i/rd), angle p * f_i in f64, cos/sin in f64 rounded to
/// f32 (as cpu-ref), rotation in f32; bf16 rounding of the whole head when
/// round_out. One thread per (row, head).
M3_KERNEL void m3_rope(float* __restrict__ x, const u32* __restrict__ pos, double theta, u32 heads, u32 d, u32 rd,
                       u32 T, int round_out) {
  u64 th = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (th >= (u64)T * heads) return;
  u64 t = th / heads;
  float* h = x + th * d;
  const u32 half = rd / 2u;
  for (u32 i = 0; i < half; ++i) {
    double f = pow(theta, -(2.0 * (double)i) / (double)rd);
    double a = (double)pos[t] * f;
    float c = (float)cos(a), s = (float)sin(a);
    float a0 = h[i], b0 = h[i + half];
    h[i] = a0 * c - b0 * s;
    h[i + half] = b0 * c + a0 * s;
  }
  if (round_out)
    for (u32 i = 0; i < d; ++i) h[i] = m3_bf16_to_f32(m3_bf16_from_f32(h[i]));
}

/// KV-cache store of n values: bf16 RNE bits (fp8 == 0) or
/// e4m3_sat(x / scale) with the division in f64 (fp8 == 1), as
/// m3_core::formats::convert::cache_cast_e4m3.
M3_KERNEL void m3_cache_encode(const float* __restrict__ x, u32 n, int fp8, float scale, u16* __restrict__ o16,
                               u8* __restrict__ o8) {
  u32 i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (fp8)
    o8[i] = (u8)m3_elem_encode_sat(M3_ELEM_E4M3, __ddiv_rn((double)x[i], (double)scale));
  else
    o16[i] = m3_bf16_from_f32(x[i]);
}

/// NVFP4 KV-cache store (ARCHITECTURE.md, NVFP4 KV cache) of `nblocks`
/// blocks of 16 values of x (rows of a multiple of 16, back to back): per
/// block m3_nvfp4_block with the tensor's cache scale g as the global scale,
/// the codes packed two a byte (low nibble = even element) into codes
/// [nblocks * 8], the E4M3 scale byte into scales [nblocks], as
/// m3_core::formats::convert::cache_store_nvfp4. One thread per block.
M3_KERNEL void m3_cache_encode_nvfp4(const float* __restrict__ x, u32 nblocks, float g, u8* __restrict__ codes,
                                     u8* __restrict__ scales) {
  const u32 b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= nblocks) return;
  u32 c[16];
  scales[b] = (u8)m3_nvfp4_block(x + (u64)b * 16u, (double)g, c);
  for (int j = 0; j < 8; ++j) codes[(u64)b * 8u + j] = (u8)(c[2 * j] | (c[2 * j + 1] << 4));
}
