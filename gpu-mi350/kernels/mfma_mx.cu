// Native MX linears for gfx950 (MI350, CDNA4): y = x W^T with the matrix
// cores, W in its stored (checkpoint) layout.
//
// NOT RUN ON AMD HARDWARE. This file is compiled for gfx950 only (clang 22,
// `cargo xtask kernels`, which also checks the code object's instructions,
// spills and VGPRs). What is proven without hardware: `src/mfma_model.rs`, a
// CPU model of the two MFMA instructions below (operand decode, E8M0 scale
// application, per-lane register layout of A / B / C as the ISA documents
// them), driven through this file's data layout over whole linears, matches
// cpu-ref's linear (tests/mfma_model.rs). The lane layout this file uses is
// `mfma_model::operand_lane` / `mfma_model::acc_lane`; change both together.
//
// Data layout (all row-major, FORMATS.md's stored layout, nothing permuted):
// - MXFP4 weight `w`: [N, K/2] bytes, byte j of a row = elements 2j (low
//   nibble) and 2j+1 (high nibble); scales `ws`: [N, K/32] E8M0.
// - MXFP8 E4M3 weight `w`: [N, K] bytes; scales `ws`: [N, K/32] E8M0.
// - MXFP4 activations (`--act mxfp4`): `xq` [M, K/2], `xs` [M, K/32], written
//   by m3x_act_mxfp4_pack from the bf16 rows (`even` rule, MODEL.md 5).
// - bf16 activations `x`: [M, K] (u16 bf16 bits).
// - output `y`: [M, N] f32.
// K must be a multiple of 32 (FORMATS.md); it need not be a multiple of the
// instruction's K: lanes past K feed zero codes with scale 127.
//
// Tiling (both linears): a workgroup of MX_WAVES wave64s owns a 16-token x
// 16-channel tile of y (grid: ceil(N / 16) x ceil(M / 16)); A = x (tokens),
// B = W^T (channels), so lane l's four accumulators are channel n0 + l % 16
// and tokens m0 + 4 (l / 16) + i. Wave w takes the K steps w, w + MX_WAVES,
// ...; the waves' tiles are added in LDS in wave order 0, 1, 2, 3 (f32).

#if !defined(M3_HIP)
#error "mfma_mx.cu is gfx950-only HIP code (CDNA4 scaled MFMA); it has no CUDA build"
#endif
#if defined(__HIP_DEVICE_COMPILE__) && !defined(__gfx950__)
#error "mfma_mx.cu: v_mfma_scale_f32_16x16x128_f8f6f4 exists on gfx950 only"
#endif

#define MX_WAVES 4
#define MX_BLOCK 256
#define MX_TILE 16
// operand format codes of the scaled MFMA's cbsz (A) / blgp (B) fields
#define MX_FMT_E4M3 0
#define MX_FMT_E2M1 4
// E8M0 for 2^0: the scale of lanes past K (their codes are zero)
#define MX_SCALE_ONE 127u

typedef int mx_v8i __attribute__((ext_vector_type(8)));
typedef float mx_v4f __attribute__((ext_vector_type(4)));
typedef __bf16 mx_v8bf __attribute__((ext_vector_type(8)));

/// Add the MX_WAVES partial tiles in wave order and store y (f32).
M3_DEV void mx_reduce_store(float (*red)[MX_TILE * MX_TILE], const mx_v4f acc, u32 wave, u32 lane, u32 m0,
                            u32 n0, u32 M, u32 N, float* __restrict__ y) {
  // lane (r, g) holds tile[token 4g + i][channel r]
  const u32 r = lane % MX_TILE, g = lane / MX_TILE;
#pragma unroll
  for (int i = 0; i < 4; ++i) red[wave][(4u * g + (u32)i) * MX_TILE + r] = acc[i];
  __syncthreads();
  const u32 t = threadIdx.x;  // MX_BLOCK == MX_TILE * MX_TILE: one y element each
  float s = red[0][t];
#pragma unroll
  for (int w = 1; w < MX_WAVES; ++w) s += red[w][t];
  const u32 tok = m0 + t / MX_TILE, ch = n0 + t % MX_TILE;
  if (tok < M && ch < N) y[(u64)tok * N + ch] = s;
}

/// `--act mxfp4` input: one thread per 32-value block of a bf16 row, MXFP4
/// with the `even` rule (FORMATS.md MX; the same rule as m3s_act_mxfp4,
/// which writes the decoded values instead of codes). NaN / Inf in a block:
/// scale 0xFF, codes 0. Grid: ceil(rows * K / 32 / MX_BLOCK) blocks.
M3_KERNEL void __launch_bounds__(MX_BLOCK) m3x_act_mxfp4_pack(const u16* __restrict__ x, u32 rows, u32 K,
                                                              u8* __restrict__ codes, u8* __restrict__ scales) {
  const u64 b = (u64)blockIdx.x * MX_BLOCK + threadIdx.x;
  const u64 nb = (u64)rows * (K / 32u);
  if (b >= nb) return;
  const uint4* src = (const uint4*)(x + b * 32u);
  u32 h[16];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 q = src[i];
    h[4 * i] = q.x;
    h[4 * i + 1] = q.y;
    h[4 * i + 2] = q.z;
    h[4 * i + 3] = q.w;
  }
  u32 ab = 0u;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const u32 lo = (h[i] << 16) & 0x7fffffffu, hi = h[i] & 0x7fff0000u;
    ab = lo > ab ? lo : ab;
    ab = hi > ab ? hi : ab;
  }
  u32 out[4] = {0u, 0u, 0u, 0u};
  u32 s = 0xffu;
  if (ab < 0x7f800000u) {
    s = m3_mx_scale_byte(M3_ELEM_E2M1, M3_RULE_EVEN, m3_f32(ab));
    const int e = (int)s - 127;
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const u16 v = (u16)(h[i / 2] >> (16 * (i % 2)));
      const u32 c = m3_elem_encode_sat(M3_ELEM_E2M1, ldexp((double)m3_bf16_to_f32(v), -e));
      out[i / 8] |= c << (4 * (i % 8));
    }
  }
  ((uint4*)codes)[b] = make_uint4(out[0], out[1], out[2], out[3]);
  scales[b] = (u8)s;
}

/// MXFP4 W x MXFP4 x (`--act mxfp4`): one v_mfma_scale_f32_16x16x128_f8f6f4
/// per 128 values of K, cbsz = blgp = E2M1. Lane l holds the 32 values
/// k0 + 32 (l / 16) .. + 32 of row l % 16 (token for A, channel for B): one
/// MX block, 16 bytes of the stored layout, and its E8M0 byte in bits 0-7
/// of the scale register (op_sel 0). Every product is exact; the instruction
/// sums them in f32 (model: `mfma_model::mfma_scale`).
M3_KERNEL void __launch_bounds__(MX_BLOCK) m3x_mfma_fp4_a4(const u8* __restrict__ w, const u8* __restrict__ ws,
                                                           const u8* __restrict__ xq, const u8* __restrict__ xs,
                                                           u32 K, u32 N, u32 M, float* __restrict__ y) {
  __shared__ float red[MX_WAVES][MX_TILE * MX_TILE];
  const u32 wave = threadIdx.x / 64u, lane = threadIdx.x % 64u;
  const u32 n0 = blockIdx.x * MX_TILE, m0 = blockIdx.y * MX_TILE;
  const u32 r = lane % MX_TILE, g = lane / MX_TILE;
  const u32 kb = K / 32u, steps = (K + 127u) / 128u;
  const bool okx = m0 + r < M, okw = n0 + r < N;
  const u8* xrow = xq + (u64)(okx ? m0 + r : 0u) * (K / 2u);
  const u8* wrow = w + (u64)(okw ? n0 + r : 0u) * (K / 2u);
  const u8* xsrow = xs + (u64)(okx ? m0 + r : 0u) * kb;
  const u8* wsrow = ws + (u64)(okw ? n0 + r : 0u) * kb;
  mx_v4f acc = {0.0f, 0.0f, 0.0f, 0.0f};
  for (u32 s = wave; s < steps; s += MX_WAVES) {
    const u32 blk = 4u * s + g;  // this lane's MX block along K
    const bool in = blk < kb;
    uint4 a = make_uint4(0u, 0u, 0u, 0u), b = a;
    u32 sa = MX_SCALE_ONE, sb = MX_SCALE_ONE;
    if (in && okx) {
      a = *(const uint4*)(xrow + 16u * blk);
      sa = xsrow[blk];
    }
    if (in && okw) {
      b = *(const uint4*)(wrow + 16u * blk);
      sb = wsrow[blk];
    }
    const mx_v8i av = {(int)a.x, (int)a.y, (int)a.z, (int)a.w, 0, 0, 0, 0};
    const mx_v8i bv = {(int)b.x, (int)b.y, (int)b.z, (int)b.w, 0, 0, 0, 0};
    acc = __builtin_amdgcn_mfma_scale_f32_16x16x128_f8f6f4(av, bv, acc, MX_FMT_E2M1, MX_FMT_E2M1, 0, (int)sa, 0,
                                                           (int)sb);
  }
  mx_reduce_store(red, acc, wave, lane, m0, n0, M, N, y);
}

/// E4M3 code to bf16 bits, exactly (every E4M3 value, subnormals included,
/// is a bf16; NaN codes 0x7f / 0xff give a bf16 NaN).
M3_DEV u32 mx_e4m3_to_bf16(u32 c) {
  const u32 sign = (c & 0x80u) << 8, mag = c & 0x7fu;
  if (mag == 0x7fu) return sign | 0x7fc0u;
  if (mag >= 8u) return sign | ((mag + (120u << 3)) << 4);  // normal: rebias 7 -> 127
  if (mag == 0u) return sign;
  // subnormal m * 2^-9 (m = 1..7): normalise
  const u32 top = 31u - (u32)__clz((int)mag);  // 0..2
  const u32 exp = 127u - 9u + top, frac = (mag << (7u - top)) & 0x7fu;
  return sign | (exp << 7) | frac;
}

/// MXFP8 E4M3 W x bf16 x (the model's default activations, no MX
/// quantization of x): one v_mfma_f32_16x16x32_bf16 per MX block of 32
/// values. Lane l holds the 8 values k0 + 8 (l / 16) .. + 8 of row l % 16;
/// the weight codes are decoded to bf16 exactly in registers, the block's
/// dot products (f32) are multiplied by the channel's E8M0 scale 2^(s-127)
/// (exact but for f32 under/overflow) and added to the accumulator. All four
/// accumulators of a lane are one channel, so one scale byte per lane.
M3_KERNEL void __launch_bounds__(MX_BLOCK) m3x_mfma_e4m3_bf16(const u8* __restrict__ w, const u8* __restrict__ ws,
                                                              const u16* __restrict__ x, u32 K, u32 N, u32 M,
                                                              float* __restrict__ y) {
  __shared__ float red[MX_WAVES][MX_TILE * MX_TILE];
  const u32 wave = threadIdx.x / 64u, lane = threadIdx.x % 64u;
  const u32 n0 = blockIdx.x * MX_TILE, m0 = blockIdx.y * MX_TILE;
  const u32 r = lane % MX_TILE, g = lane / MX_TILE;
  const u32 kb = K / 32u;
  const bool okx = m0 + r < M, okw = n0 + r < N;
  const u16* xrow = x + (u64)(okx ? m0 + r : 0u) * K;
  const u8* wrow = w + (u64)(okw ? n0 + r : 0u) * K;
  const u8* wsrow = ws + (u64)(okw ? n0 + r : 0u) * kb;
  mx_v4f acc = {0.0f, 0.0f, 0.0f, 0.0f};
  for (u32 blk = wave; blk < kb; blk += MX_WAVES) {
    const u32 k = 32u * blk + 8u * g;
    uint4 xa = make_uint4(0u, 0u, 0u, 0u);
    uint2 wc = make_uint2(0u, 0u);
    float sc = 1.0f;
    if (okx) xa = *(const uint4*)(xrow + k);
    if (okw) {
      wc = *(const uint2*)(wrow + k);
      sc = m3_e8m0_decode(wsrow[blk]);
    }
    u32 wb[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const u32 q = j < 2 ? wc.x : wc.y, sh = 16u * (u32)(j % 2);
      wb[j] = mx_e4m3_to_bf16((q >> sh) & 0xffu) | (mx_e4m3_to_bf16((q >> (sh + 8u)) & 0xffu) << 16);
    }
    const uint4 wv = make_uint4(wb[0], wb[1], wb[2], wb[3]);
    const mx_v8bf av = __builtin_bit_cast(mx_v8bf, xa);
    const mx_v8bf bv = __builtin_bit_cast(mx_v8bf, wv);
    const mx_v4f zero = {0.0f, 0.0f, 0.0f, 0.0f};
    const mx_v4f p = __builtin_amdgcn_mfma_f32_16x16x32_bf16(av, bv, zero, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += p[i] * sc;
  }
  mx_reduce_store(red, acc, wave, lane, m0, n0, M, N, y);
}
