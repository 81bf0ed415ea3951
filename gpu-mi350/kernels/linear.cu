// Linear layer y = x W^T for small M (decode / GEMV): x is [M, K] bf16 rows,
// W is [N, K] in one of the weight formats, dequantized in registers,
// products accumulated in f32, y is [M, N] bf16 (round to nearest even).
// One warp (M3_WARP lanes) per output feature n; each lane reads 16 bytes of
// W per step (coalesced across the warp) and all M rows of x for them.
// M <= M3_LIN_MAXM per launch; the host splits larger M.
// Summation order differs from the CPU reference (lane-strided partial sums,
// then a butterfly): results agree to f32 rounding, not bit for bit.

#define M3_LIN_MAXM 8
// Threads per block of every kernel here (LIN_THREADS in ops/linear.rs): a
// multiple of either warp size; HIP builds them for it (M3_HIP_BLOCK).
#define M3_LIN_THREADS 256
#define M3_LIN_KERNEL M3_KERNEL void M3_HIP_BLOCK(M3_LIN_THREADS)
#define M3_FMT_BF16 0
#define M3_FMT_MXFP8_E4M3 1
#define M3_FMT_MXFP4 2
#define M3_FMT_NVFP4 3
#define M3_FMT_MXFP8_E5M2 4

/// Elements of W covered by one 16-byte load.
template <int F> struct M3Chunk { static const u32 E = F == M3_FMT_BF16 ? 8 : ((F == M3_FMT_MXFP4 || F == M3_FMT_NVFP4) ? 32 : 16); };

M3_DEV float m3_e8m0_fast(u32 s) {
  return s == 0xffu ? m3_nan() : (s == 0u ? m3_f32(0x00400000u) : m3_f32(s << 23));
}
M3_DEV float m3_e5m2_fast(u32 c) { return m3_elem_decode(M3_ELEM_E5M2, c); }

M3_DEV void m3_x8(const u16* __restrict__ p, float* f) {
  uint4 q = *reinterpret_cast<const uint4*>(p);
  u32 v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = m3_f32(v[i] << 16);
    f[2 * i + 1] = m3_f32(v[i] & 0xffff0000u);
  }
}

template <int F>
M3_DEV void m3_unpack(uint4 q, float* w) {
  u32 v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (F == M3_FMT_BF16) {
      w[2 * i] = m3_f32(v[i] << 16);
      w[2 * i + 1] = m3_f32(v[i] & 0xffff0000u);
    } else if (F == M3_FMT_MXFP8_E4M3) {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[4 * i + j] = m3_e4m3_fast((v[i] >> (8 * j)) & 0xffu);
    } else if (F == M3_FMT_MXFP8_E5M2) {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[4 * i + j] = m3_e5m2_fast((v[i] >> (8 * j)) & 0xffu);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) w[8 * i + j] = m3_fp4_fast((v[i] >> (4 * j)) & 0xfu);
    }
  }
}

/// Bytes of W per row for K elements.
template <int F> M3_DEV u64 m3_row_bytes(u32 K) {
  return F == M3_FMT_BF16 ? 2ull * K : ((F == M3_FMT_MXFP4 || F == M3_FMT_NVFP4) ? K / 2ull : (u64)K);
}

template <int F>
M3_DEV void m3_linear_body(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, float g,
                           u16* __restrict__ y, u32 M, u32 N, u32 K) {
  const u32 E = M3Chunk<F>::E;
  const u32 warps = blockDim.x / M3_WARP;
  const u32 n = blockIdx.x * warps + threadIdx.x / M3_WARP;
  const u32 lane = threadIdx.x % M3_WARP;
  if (n >= N) return;
  float acc[M3_LIN_MAXM];
#pragma unroll
  for (int m = 0; m < M3_LIN_MAXM; ++m) acc[m] = 0.0f;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + (u64)n * m3_row_bytes<F>(K));
  const u32 chunks = K / E;
#pragma unroll 2
  for (u32 c = lane; c < chunks; c += M3_WARP) {
    uint4 q = wrow[c];
    float wv[E];
    m3_unpack<F>(q, wv);
    // per-16-element scale halves (NVFP4) or one scale for the chunk
    float s0 = 1.0f, s1 = 1.0f;
    if (F == M3_FMT_MXFP4) { s0 = m3_e8m0_fast(ws[(u64)n * (K / 32u) + c]); s1 = s0; }
    if (F == M3_FMT_MXFP8_E4M3 || F == M3_FMT_MXFP8_E5M2) { s0 = m3_e8m0_fast(ws[(u64)n * (K / 32u) + c / 2u]); s1 = s0; }
    if (F == M3_FMT_NVFP4) {
      s0 = m3_e4m3_fast(ws[(u64)n * (K / 16u) + 2u * c]) * g;
      s1 = m3_e4m3_fast(ws[(u64)n * (K / 16u) + 2u * c + 1u]) * g;
    }
#pragma unroll
    for (int m = 0; m < M3_LIN_MAXM; ++m) {
      if ((u32)m < M) {
        const u16* xr = x + (u64)m * K + (u64)c * E;
        float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
        for (u32 j = 0; j < E; j += 8) {
          float xv[8];
          m3_x8(xr + j, xv);
#pragma unroll
          for (int t = 0; t < 8; ++t) {
            if (j < E / 2 || E == 8) p0 += wv[j + t] * xv[t];
            else p1 += wv[j + t] * xv[t];
          }
        }
        acc[m] += p0 * s0 + p1 * s1;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M3_LIN_MAXM; ++m) {
    if ((u32)m < M) {
      float s = m3_warp_sum(acc[m]);
      if (lane == 0) y[(u64)m * N + n] = m3_bf16_from_f32(s);
    }
  }
}

// ---- v1 (session 1 baseline): one warp per row, x re-read per row --------

M3_LIN_KERNEL m3_linear_bf16_v1(const u16* __restrict__ x, const u8* __restrict__ w, u16* __restrict__ y, u32 M,
                             u32 N, u32 K) {
  m3_linear_body<M3_FMT_BF16>(x, w, w, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp8_e4m3_v1(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                   u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body<M3_FMT_MXFP8_E4M3>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp8_e5m2_v1(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                   u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body<M3_FMT_MXFP8_E5M2>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp4_v1(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                              u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body<M3_FMT_MXFP4>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_nvfp4_v1(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                              float g, u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body<M3_FMT_NVFP4>(x, w, ws, g, y, M, N, K);
}

// ---- v2: R rows per warp sharing each x chunk, cheap exact decoders -------
// FP4 and E4M3 codes are turned into f32 bit patterns by shifts alone (the
// value times 2^-126 resp. 2^-120, subnormals included) and one exact FMUL
// rescales them: 4-5 instructions per element instead of a select chain.
// Caveat: E4M3 NaN codes (0x7F / 0xFF) decode as +-480 here; the quantizers
// never emit them for finite data, and a NaN block carries a NaN scale.

/// Rows per warp for each format (host mirrors this in ops/linear.rs).
template <int F> struct M3Rows { static const u32 R = (F == M3_FMT_MXFP4 || F == M3_FMT_NVFP4) ? 2 : 4; };

template <int F>
M3_DEV void m3_unpack2(uint4 q, float* w) {
  u32 v[4] = {q.x, q.y, q.z, q.w};
  if (F == M3_FMT_BF16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = m3_f32(v[i] << 16);
      w[2 * i + 1] = m3_f32(v[i] & 0xffff0000u);
    }
  } else if (F == M3_FMT_MXFP8_E4M3) {
    const float k = 1.329227995784916e36f;  // 2^120
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      u32 a = v[i];
      w[4 * i + 0] = m3_f32(((a << 20) & 0x07f00000u) | ((a << 24) & 0x80000000u)) * k;
      w[4 * i + 1] = m3_f32(((a << 12) & 0x07f00000u) | ((a << 16) & 0x80000000u)) * k;
      w[4 * i + 2] = m3_f32(((a << 4) & 0x07f00000u) | ((a << 8) & 0x80000000u)) * k;
      w[4 * i + 3] = m3_f32(((a >> 4) & 0x07f00000u) | (a & 0x80000000u)) * k;
    }
  } else if (F == M3_FMT_MXFP8_E5M2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[4 * i + j] = m3_e5m2_fast((v[i] >> (8 * j)) & 0xffu);
    }
  } else {
    const float k = 8.507059173023462e37f;  // 2^126
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      u32 a = v[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        u32 t = a >> (4 * j);
        w[8 * i + j] = m3_f32(((t << 22) & 0x01c00000u) | ((t << 28) & 0x80000000u)) * k;
      }
    }
  }
}

template <int F>
M3_DEV void m3_linear_body2(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, float g,
                            u16* __restrict__ y, u32 M, u32 N, u32 K) {
  const u32 E = M3Chunk<F>::E;
  const u32 R = M3Rows<F>::R;
  const u32 warps = blockDim.x / M3_WARP;
  const u32 n0 = (blockIdx.x * warps + threadIdx.x / M3_WARP) * R;
  const u32 lane = threadIdx.x % M3_WARP;
  if (n0 >= N) return;
  float acc[R][M3_LIN_MAXM];
#pragma unroll
  for (u32 r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M3_LIN_MAXM; ++m) acc[r][m] = 0.0f;
  const u64 rb = m3_row_bytes<F>(K);
  const u32 chunks = K / E;
  for (u32 c = lane; c < chunks; c += M3_WARP) {
    uint4 q[R];
    float s0[R], s1[R];
#pragma unroll
    for (u32 r = 0; r < R; ++r) {
      const u32 n = n0 + r < N ? n0 + r : N - 1;  // clamp: duplicate rows are not stored
      q[r] = reinterpret_cast<const uint4*>(w + (u64)n * rb)[c];
      s0[r] = 1.0f;
      s1[r] = 1.0f;
      if (F == M3_FMT_MXFP4) { s0[r] = m3_e8m0_fast(ws[(u64)n * (K / 32u) + c]); s1[r] = s0[r]; }
      if (F == M3_FMT_MXFP8_E4M3 || F == M3_FMT_MXFP8_E5M2) { s0[r] = m3_e8m0_fast(ws[(u64)n * (K / 32u) + c / 2u]); s1[r] = s0[r]; }
      if (F == M3_FMT_NVFP4) {
        s0[r] = m3_e4m3_fast(ws[(u64)n * (K / 16u) + 2u * c]) * g;
        s1[r] = m3_e4m3_fast(ws[(u64)n * (K / 16u) + 2u * c + 1u]) * g;
      }
    }
    float wv[R][E];
#pragma unroll
    for (u32 r = 0; r < R; ++r) m3_unpack2<F>(q[r], wv[r]);
#pragma unroll
    for (int m = 0; m < M3_LIN_MAXM; ++m) {
      if ((u32)m < M) {
        const u16* xr = x + (u64)m * K + (u64)c * E;
        float xv[E];
#pragma unroll
        for (u32 j = 0; j < E; j += 8) m3_x8(xr + j, xv + j);
#pragma unroll
        for (u32 r = 0; r < R; ++r) {
          float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
          for (u32 j = 0; j < E; ++j) {
            if (j < E / 2 || E == 8) p0 += wv[r][j] * xv[j];
            else p1 += wv[r][j] * xv[j];
          }
          acc[r][m] += p0 * s0[r] + p1 * s1[r];
        }
      }
    }
  }
#pragma unroll
  for (u32 r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M3_LIN_MAXM; ++m) {
      if ((u32)m < M) {
        float s = m3_warp_sum(acc[r][m]);
        if (lane == 0 && n0 + r < N) y[(u64)m * N + n0 + r] = m3_bf16_from_f32(s);
      }
    }
  }
}

M3_LIN_KERNEL m3_linear_bf16(const u16* __restrict__ x, const u8* __restrict__ w, u16* __restrict__ y, u32 M,
                             u32 N, u32 K) {
  m3_linear_body2<M3_FMT_BF16>(x, w, w, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp8_e4m3(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                   u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body2<M3_FMT_MXFP8_E4M3>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp8_e5m2(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                   u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body2<M3_FMT_MXFP8_E5M2>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp4(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                              u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body2<M3_FMT_MXFP4>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_nvfp4(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                              float g, u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body2<M3_FMT_NVFP4>(x, w, ws, g, y, M, N, K);
}

// ---- v3 (decode-bound small M): more rows per warp, weights decoded per x
// row instead of held, so R can grow (more 16-byte loads in flight, x read
// once per R rows). M <= M3_LIN3_MAXM per launch.
#define M3_LIN3_MAXM 2
template <int F> struct M3Rows3 { static const u32 R = (F == M3_FMT_MXFP4 || F == M3_FMT_NVFP4) ? 4 : 8; };

template <int F>
M3_DEV void m3_linear_body3(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, float g,
                            u16* __restrict__ y, u32 M, u32 N, u32 K) {
  const u32 E = M3Chunk<F>::E;
  const u32 R = M3Rows3<F>::R;
  const u32 warps = blockDim.x / M3_WARP;
  const u32 n0 = (blockIdx.x * warps + threadIdx.x / M3_WARP) * R;
  const u32 lane = threadIdx.x % M3_WARP;
  if (n0 >= N) return;
  float acc[R][M3_LIN3_MAXM];
#pragma unroll
  for (u32 r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M3_LIN3_MAXM; ++m) acc[r][m] = 0.0f;
  const u64 rb = m3_row_bytes<F>(K);
  const u32 chunks = K / E;
  for (u32 c = lane; c < chunks; c += M3_WARP) {
    uint4 q[R];
    float s0[R], s1[R];
#pragma unroll
    for (u32 r = 0; r < R; ++r) {
      const u32 n = n0 + r < N ? n0 + r : N - 1;
      q[r] = reinterpret_cast<const uint4*>(w + (u64)n * rb)[c];
      s0[r] = 1.0f;
      s1[r] = 1.0f;
      if (F == M3_FMT_MXFP4) { s0[r] = m3_e8m0_fast(ws[(u64)n * (K / 32u) + c]); s1[r] = s0[r]; }
      if (F == M3_FMT_MXFP8_E4M3 || F == M3_FMT_MXFP8_E5M2) { s0[r] = m3_e8m0_fast(ws[(u64)n * (K / 32u) + c / 2u]); s1[r] = s0[r]; }
      if (F == M3_FMT_NVFP4) {
        s0[r] = m3_e4m3_fast(ws[(u64)n * (K / 16u) + 2u * c]) * g;
        s1[r] = m3_e4m3_fast(ws[(u64)n * (K / 16u) + 2u * c + 1u]) * g;
      }
    }
#pragma unroll
    for (int m = 0; m < M3_LIN3_MAXM; ++m) {
      if ((u32)m < M) {
        const u16* xr = x + (u64)m * K + (u64)c * E;
        float xv[E];
#pragma unroll
        for (u32 j = 0; j < E; j += 8) m3_x8(xr + j, xv + j);
#pragma unroll
        for (u32 r = 0; r < R; ++r) {
          float wv[E];
          m3_unpack2<F>(q[r], wv);
          float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
          for (u32 j = 0; j < E; ++j) {
            if (j < E / 2 || E == 8) p0 += wv[j] * xv[j];
            else p1 += wv[j] * xv[j];
          }
          acc[r][m] += p0 * s0[r] + p1 * s1[r];
        }
      }
    }
  }
#pragma unroll
  for (u32 r = 0; r < R; ++r) {
#pragma unroll
    for (int m = 0; m < M3_LIN3_MAXM; ++m) {
      if ((u32)m < M) {
        float s = m3_warp_sum(acc[r][m]);
        if (lane == 0 && n0 + r < N) y[(u64)m * N + n0 + r] = m3_bf16_from_f32(s);
      }
    }
  }
}

M3_LIN_KERNEL m3_linear_bf16_v3(const u16* __restrict__ x, const u8* __restrict__ w, u16* __restrict__ y, u32 M,
                                u32 N, u32 K) {
  m3_linear_body3<M3_FMT_BF16>(x, w, w, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp8_e4m3_v3(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                      u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body3<M3_FMT_MXFP8_E4M3>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp8_e5m2_v3(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                      u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body3<M3_FMT_MXFP8_E5M2>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_mxfp4_v3(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                 u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body3<M3_FMT_MXFP4>(x, w, ws, 1.0f, y, M, N, K);
}
M3_LIN_KERNEL m3_linear_nvfp4_v3(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws,
                                 float g, u16* __restrict__ y, u32 M, u32 N, u32 K) {
  m3_linear_body3<M3_FMT_NVFP4>(x, w, ws, g, y, M, N, K);
}
