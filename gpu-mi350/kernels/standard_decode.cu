// The standard path's kernels (device pointers only, no host round trips):
// one launch per layer step, every shape a kernel argument, every
// data-dependent choice (positions, selected blocks, chosen experts) read on
// the device, so a whole step can be captured into one CUDA graph.
// Numerics follow MODEL.md section 3 (f32 math, bf16 at the marked points).

#define S_FMT_BF16 0
#define S_FMT_E4M3 1
#define S_FMT_FP4 2
#define S_FMT_F32 3
#define S_MAXG 8
#define S_INF __int_as_float(0x7f800000)

M3_DEV float s_e8m0(u32 s) { return s == 0xffu ? m3_nan() : (s == 0u ? m3_f32(0x00400000u) : m3_f32(s << 23)); }

/// Elements of W in one 16-byte chunk.
template <int F> struct SChunk { static const u32 E = F == S_FMT_BF16 ? 8 : (F == S_FMT_E4M3 ? 16 : (F == S_FMT_FP4 ? 32 : 4)); };

template <int F> M3_DEV u64 s_row_bytes(u32 K) {
  return F == S_FMT_BF16 ? 2ull * K : (F == S_FMT_E4M3 ? (u64)K : (F == S_FMT_FP4 ? K / 2ull : 4ull * K));
}

template <int F> M3_DEV void s_unpack(uint4 q, float* w) {
  u32 v[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (F == S_FMT_BF16) {
      w[2 * i] = m3_f32(v[i] << 16);
      w[2 * i + 1] = m3_f32(v[i] & 0xffff0000u);
    } else if (F == S_FMT_E4M3) {
#pragma unroll
      for (int j = 0; j < 4; ++j) w[4 * i + j] = m3_e4m3_fast((v[i] >> (8 * j)) & 0xffu);
    } else if (F == S_FMT_FP4) {
#pragma unroll
      for (int j = 0; j < 8; ++j) w[8 * i + j] = m3_fp4_fast((v[i] >> (4 * j)) & 0xfu);
    } else {
      w[i] = m3_f32(v[i]);
    }
  }
}

/// y = x W^T. One warp per output feature n; W row read once per launch in
/// 16-byte chunks, four chunks in flight per lane. x: bf16 rows of K.
/// Plain mode (ids == 0): blockIdx.y covers rows [y*G, y*G+G) of M.
/// Expert mode (ids != 0): blockIdx.y = pair p, weight = base + ids[p]*stride,
/// x row = p / xdiv, output row p (routed experts chosen on the device).
template <int F>
M3_DEV void s_linear(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, u32 N, u32 K,
                     u32 M, u32 G, const int* __restrict__ ids, u64 w_es, u64 ws_es, u32 xdiv, u16* __restrict__ yb,
                     float* __restrict__ yf) {
  const u32 E = SChunk<F>::E;
  const u32 lane = threadIdx.x % M3_WARP;
  const u32 n = blockIdx.x * (blockDim.x / M3_WARP) + threadIdx.x / M3_WARP;
  if (n >= N) return;
  u32 g = blockIdx.y, m0, cnt, xr0;
  const u8* W = w;
  const u8* S = ws;
  if (ids) {
    int e = ids[g];
    if (e < 0) e = 0;
    W += (u64)e * w_es;
    if (S) S += (u64)e * ws_es;
    m0 = g;
    cnt = 1;
    xr0 = g / xdiv;
  } else {
    m0 = g * G;
    if (m0 >= M) return;
    cnt = min(G, M - m0);
    xr0 = m0;
  }
  const u8* wr = W + (u64)n * s_row_bytes<F>(K);
  const u8* sr = S ? S + (u64)n * (K / 32u) : nullptr;
  const u32 nchunk = K / E;
  float acc[S_MAXG];
#pragma unroll
  for (int i = 0; i < S_MAXG; ++i) acc[i] = 0.0f;
  for (u32 c0 = lane; c0 < nchunk; c0 += 4u * M3_WARP) {
    uint4 q[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      u32 c = c0 + u * M3_WARP;
      if (c < nchunk) q[u] = *reinterpret_cast<const uint4*>(wr + (u64)c * 16u);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      u32 c = c0 + u * M3_WARP;
      if (c >= nchunk) break;
      float wv[E];
      s_unpack<F>(q[u], wv);
      if (F == S_FMT_E4M3 || F == S_FMT_FP4) {
        float sc = s_e8m0(sr[(c * E) / 32u]);
#pragma unroll
        for (u32 i = 0; i < E; ++i) wv[i] *= sc;
      }
#pragma unroll
      for (int m = 0; m < S_MAXG; ++m) {
        if ((u32)m >= cnt) break;
        const u16* xp = x + (u64)(xr0 + m) * K + (u64)c * E;
        float s = 0.0f;
        if (E >= 8) {
#pragma unroll
          for (u32 i = 0; i < E; i += 8) {
            uint4 xv = *reinterpret_cast<const uint4*>(xp + i);
            u32 xx[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              s += m3_f32(xx[j] << 16) * wv[i + 2 * j];
              s += m3_f32(xx[j] & 0xffff0000u) * wv[i + 2 * j + 1];
            }
          }
        } else {
#pragma unroll
          for (u32 i = 0; i < E; ++i) s += m3_bf16_to_f32(xp[i]) * wv[i];
        }
        acc[m] += s;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < S_MAXG; ++m) {
    if ((u32)m >= cnt) break;
    float v = m3_warp_sum(acc[m]);
    if (lane == 0) {
      u64 o = (u64)(m0 + m) * N + n;
      if (yf) yf[o] = v;
      else yb[o] = m3_bf16_from_f32(v);
    }
  }
}

#define S_LINEAR(name, F)                                                                                     \
  M3_KERNEL void name(const u16* __restrict__ x, const u8* __restrict__ w, const u8* __restrict__ ws, u32 N, u32 K, \
                      u32 M, u32 G, const int* __restrict__ ids, u64 w_es, u64 ws_es, u32 xdiv, u16* __restrict__ yb, \
                      float* __restrict__ yf) {                                                               \
    s_linear<F>(x, w, ws, N, K, M, G, ids, w_es, ws_es, xdiv, yb, yf);                                        \
  }
S_LINEAR(m3s_linear_bf16, S_FMT_BF16)
S_LINEAR(m3s_linear_e4m3, S_FMT_E4M3)
S_LINEAR(m3s_linear_fp4, S_FMT_FP4)
S_LINEAR(m3s_linear_f32, S_FMT_F32)

/// r[t] = f32(embed[tok[t]]). Grid T.
M3_KERNEL void m3s_embed(const u32* __restrict__ tok, const u16* __restrict__ table, u32 H, float* __restrict__ r) {
  const u16* src = table + (u64)tok[blockIdx.x] * H;
  for (u32 i = threadIdx.x; i < H; i += blockDim.x) r[(u64)blockIdx.x * H + i] = m3_bf16_to_f32(src[i]);
}

/// out[i] = bf16(RMSNorm(x[rows ? rows[i] : i])). Grid = output rows, block 256.
M3_KERNEL void m3s_rmsnorm(const float* __restrict__ x, const u32* __restrict__ rows, const float* __restrict__ w,
                           float eps, u32 n, u16* __restrict__ out) {
  __shared__ float part[32];
  __shared__ float total;
  const u32 src = rows ? rows[blockIdx.x] : blockIdx.x;
  const float* xr = x + (u64)src * n;
  float s = 0.0f;
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
  s = m3_warp_sum(s);
  if (threadIdx.x % M3_WARP == 0) part[threadIdx.x / M3_WARP] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0.0f;
    for (u32 i = 0; i < blockDim.x / M3_WARP; ++i) t += part[i];
    total = t;
  }
  __syncthreads();
  float r = sqrtf(total / (float)n + eps);
  for (u32 i = threadIdx.x; i < n; i += blockDim.x)
    out[(u64)blockIdx.x * n + i] = m3_bf16_from_f32((xr[i] / r) * (1.0f + w[i]));
}

/// Per-head Gemma RMSNorm (f32) then partial NeoX RoPE, bf16 out.
/// x [T, heads, d] bf16; one warp per (t, head); d <= 256. Grid (heads, T), block 32.
M3_KERNEL void m3s_headnorm_rope(const u16* __restrict__ x, u32 heads, u32 d, const float* __restrict__ w, float eps,
                                 const u32* __restrict__ pos, double theta, u32 rd, u16* __restrict__ out) {
  __shared__ float v[256];
  const u32 lane = threadIdx.x;
  const u64 base = ((u64)blockIdx.y * heads + blockIdx.x) * d;
  float s = 0.0f;
  for (u32 i = lane; i < d; i += M3_WARP) {
    float a = m3_bf16_to_f32(x[base + i]);
    v[i] = a;
    s += a * a;
  }
  s = m3_warp_sum(s);
  float r = sqrtf(s / (float)d + eps);
  M3_SYNC_WARP();
  for (u32 i = lane; i < d; i += M3_WARP) v[i] = (v[i] / r) * (1.0f + w[i]);
  M3_SYNC_WARP();
  const u32 half = rd / 2u;
  const double p = (double)pos[blockIdx.y];
  for (u32 j = lane; j < d; j += M3_WARP) {
    if (j < half) {
      double f = pow(theta, -2.0 * (double)j / (double)rd);
      double a = p * f;
      const double two_pi = 6.283185307179586476925286766559;
      a = a - two_pi * floor(a / two_pi);
      float c = cosf((float)a), sn = sinf((float)a);
      float x0 = v[j], x1 = v[j + half];
      out[base + j] = m3_bf16_from_f32(x0 * c - x1 * sn);
      out[base + j + half] = m3_bf16_from_f32(x1 * c + x0 * sn);
    } else if (j >= rd) {
      out[base + j] = m3_bf16_from_f32(v[j]);
    }
  }
}

/// cache[slot[t], :] = e4m3(x[t, :] / scale) (saturating RNE). Grid T.
M3_KERNEL void m3s_cache_write(const u16* __restrict__ x, u32 width, const u32* __restrict__ slots, float scale,
                               u8* __restrict__ cache) {
  const u64 dst = (u64)slots[blockIdx.x] * width;
  for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
    double a = (double)m3_bf16_to_f32(x[(u64)blockIdx.x * width + i]) / (double)scale;
    cache[dst + i] = (u8)m3_elem_encode_sat(M3_ELEM_E4M3, a);
  }
}

M3_DEV float s_e4m3(u8 c) { return m3_elem_decode(M3_ELEM_E4M3, c); }

M3_DEV u64 s_slot(const u32* __restrict__ bt, const u32* __restrict__ bt_off, u32 seq, u32 page, u32 j) {
  return (u64)bt[bt_off[seq] + j / page] * page + j % page;
}

/// Indexer: block scores (max over visible keys of iq . ik) and the top-K
/// block selection (forced init/local blocks, ties to the lower id),
/// ascending ids, -1 padding. Grid (sel_heads, T), block 256; sel_heads =
/// kv heads (per-KV-head: index head g selects for KV head g) or 1 (shared:
/// max over index heads, copied to every KV head). scratch: [T*sel_heads, maxnb].
M3_KERNEL void m3s_index_select(const u16* __restrict__ iq, u32 nih, u32 di, const u8* __restrict__ icache, float iscale,
                                const u32* __restrict__ pos, const u32* __restrict__ row_seq,
                                const u32* __restrict__ bt, const u32* __restrict__ bt_off, u32 page, u32 B, u32 K,
                                u32 init_b, u32 local_b, u32 shared_sel, u32 nkv, u32 T, float* __restrict__ scratch,
                                u32 maxnb, int* __restrict__ sel) {
  __shared__ float qs[4][256];
  __shared__ float bv[8];
  __shared__ int bi[8];
  __shared__ int chosen[64];
  const u32 t = blockIdx.y, gsel = blockIdx.x;
  const u32 p = pos[t], seq = row_seq[t];
  const u32 nb = p / B + 1u;
  float* sc = scratch + ((u64)t * gridDim.x + gsel) * maxnb;
  const u32 g0 = shared_sel ? 0u : gsel, g1 = shared_sel ? nih : gsel + 1u;
  const u32 ng = g1 - g0;  // <= 4 when shared (checked on the host)
  for (u32 i = threadIdx.x; i < ng * di; i += blockDim.x)
    qs[i / di][i % di] = m3_bf16_to_f32(iq[((u64)t * nih + g0 + i / di) * di + i % di]);
  __syncthreads();
  const u32 warp = threadIdx.x / M3_WARP, lane = threadIdx.x % M3_WARP, nw = blockDim.x / M3_WARP;
  if (nb > K) {
    for (u32 b = warp; b < nb; b += nw) {
      float m = -S_INF;
      for (u32 o = lane; o < B; o += M3_WARP) {
        u32 j = b * B + o;
        if (j > p) break;
        const u8* kr = icache + s_slot(bt, bt_off, seq, page, j) * di;
        for (u32 g = 0; g < ng; ++g) {
          float s = 0.0f;
          for (u32 i = 0; i < di; ++i) s += qs[g][i] * (s_e4m3(kr[i]) * iscale);
          m = s > m ? s : m;  // NaN never wins
        }
      }
#pragma unroll
      for (int o = M3_WARP / 2; o > 0; o >>= 1) {
        float u = M3_SHFL_XOR(m, o);
        m = u > m ? u : m;
      }
      if (lane == 0) sc[b] = m;
    }
    __syncthreads();
    // forced blocks
    for (u32 b = threadIdx.x; b < nb; b += blockDim.x)
      if (b < init_b || b + local_b >= nb) sc[b] = S_INF;  // taken first, then marked
    __syncthreads();
  }
  u32 nsel = 0;
  if (nb <= K) {
    if (threadIdx.x == 0)
      for (u32 b = 0; b < nb; ++b) chosen[b] = (int)b;
    nsel = nb;
  } else {
    for (u32 k = 0; k < K; ++k) {
      float best = -S_INF;
      int besti = -1;
      for (u32 b = threadIdx.x; b < nb; b += blockDim.x) {
        float v = sc[b];
        if (v != v) continue;  // NaN marks a block already taken
        if (besti < 0 || v > best) { best = v; besti = (int)b; }
      }
      for (int o = M3_WARP / 2; o > 0; o >>= 1) {
        float ov = M3_SHFL_XOR(best, o);
        int oi = M3_SHFL_XOR(besti, o);
        if (oi >= 0 && (besti < 0 || ov > best || (ov == best && oi < besti))) { best = ov; besti = oi; }
      }
      if (lane == 0) { bv[warp] = best; bi[warp] = besti; }
      __syncthreads();
      if (threadIdx.x == 0) {
        float b0 = bv[0];
        int i0 = bi[0];
        for (u32 w2 = 1; w2 < nw; ++w2)
          if (bi[w2] >= 0 && (i0 < 0 || bv[w2] > b0 || (bv[w2] == b0 && bi[w2] < i0))) { b0 = bv[w2]; i0 = bi[w2]; }
        chosen[k] = i0;
        if (i0 >= 0) sc[i0] = m3_nan();  // taken: NaN marks "used" (excluded below)
      }
      __syncthreads();
    }
    nsel = K;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // ascending insertion sort
    for (u32 a = 1; a < nsel; ++a) {
      int v = chosen[a];
      int b = (int)a - 1;
      while (b >= 0 && chosen[b] > v) { chosen[b + 1] = chosen[b]; --b; }
      chosen[b + 1] = v;
    }
  }
  __syncthreads();
  const u32 h0 = shared_sel ? 0u : gsel, h1 = shared_sel ? nkv : gsel + 1u;
  for (u32 h = h0; h < h1; ++h)
    for (u32 k = threadIdx.x; k < K; k += blockDim.x) sel[((u64)h * T + t) * K + k] = k < nsel ? chosen[k] : -1;
}

/// Attention of q head i over the cached keys of KV head g = i / (nh/nkv):
/// the selected blocks (sel != 0) or every position <= p. Online softmax per
/// warp, merged across the block's warps. Grid (nh, T), block 128; d <= 256.
M3_KERNEL void m3s_attention(const u16* __restrict__ q, u32 nh, u32 nkv, u32 d, const u8* __restrict__ kc,
                             const u8* __restrict__ vc, float ks, float vs, const u32* __restrict__ pos,
                             const u32* __restrict__ row_seq, const u32* __restrict__ bt,
                             const u32* __restrict__ bt_off, u32 page, const int* __restrict__ sel, u32 K, u32 B, u32 T,
                             u16* __restrict__ out) {
  __shared__ float wm[8], wl[8];
  __shared__ float wacc[8][256];
  const u32 i = blockIdx.x, t = blockIdx.y;
  const u32 g = i / (nh / nkv);
  const u32 p = pos[t], seq = row_seq[t];
  const u32 warp = threadIdx.x / M3_WARP, lane = threadIdx.x % M3_WARP, nw = blockDim.x / M3_WARP;
  const u32 dpl = d / M3_WARP;  // dims per lane (d % 32 == 0)
  float qv[8], acc[8];
  for (u32 k = 0; k < dpl; ++k) {
    qv[k] = m3_bf16_to_f32(q[((u64)t * nh + i) * d + lane * dpl + k]);
    acc[k] = 0.0f;
  }
  const float scale = 1.0f / sqrtf((float)d);
  float m = -S_INF, l = 0.0f;
  const int* selr = sel ? sel + ((u64)g * T + t) * K : nullptr;
  const u32 nkeys = sel ? K * B : p + 1u;
  for (u32 kk = warp; kk < nkeys; kk += nw) {
    u32 j;
    if (sel) {
      int b = selr[kk / B];
      if (b < 0) continue;
      j = (u32)b * B + kk % B;
      if (j > p) continue;
    } else {
      j = kk;
    }
    const u64 off = (s_slot(bt, bt_off, seq, page, j) * nkv + g) * d + lane * dpl;
    float s = 0.0f;
    for (u32 k = 0; k < dpl; ++k) s += qv[k] * (s_e4m3(kc[off + k]) * ks);
    s = m3_warp_sum(s) * scale;
    float mn = s > m ? s : m;
    float corr = expf(m - mn), e = expf(s - mn);
    l = l * corr + e;
    for (u32 k = 0; k < dpl; ++k) acc[k] = acc[k] * corr + e * (s_e4m3(vc[off + k]) * vs);
    m = mn;
  }
  if (lane == 0) { wm[warp] = m; wl[warp] = l; }
  for (u32 k = 0; k < dpl; ++k) wacc[warp][lane * dpl + k] = acc[k];
  __syncthreads();
  if (warp == 0) {
    float M = -S_INF;
    for (u32 w2 = 0; w2 < nw; ++w2) M = wm[w2] > M ? wm[w2] : M;
    float L = 0.0f;
    float o[8];
    for (u32 k = 0; k < dpl; ++k) o[k] = 0.0f;
    for (u32 w2 = 0; w2 < nw; ++w2) {
      if (wm[w2] == -S_INF) continue;
      float c = expf(wm[w2] - M);
      L += wl[w2] * c;
      for (u32 k = 0; k < dpl; ++k) o[k] += wacc[w2][lane * dpl + k] * c;
    }
    for (u32 k = 0; k < dpl; ++k)
      out[((u64)t * nh + i) * d + lane * dpl + k] = m3_bf16_from_f32(L > 0.0f ? o[k] / L : 0.0f);
  }
}

/// SwiGLU-OAI: a = bf16(((u'+1) g') sigmoid(alpha g')). g, u bf16.
M3_KERNEL void m3s_swiglu(const u16* __restrict__ gt, const u16* __restrict__ up, float alpha, float limit,
                          u16* __restrict__ a, u32 n) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = m3_bf16_to_f32(gt[i]), u = m3_bf16_to_f32(up[i]);
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  float sg = 1.0f / (1.0f + expf(-(alpha * g)));
  a[i] = m3_bf16_from_f32(((u + 1.0f) * g) * sg);
}

/// r += f32(x) (bf16 x). n elements.
M3_KERNEL void m3s_add_bf16(float* __restrict__ r, const u16* __restrict__ x, u32 n) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) r[i] += m3_bf16_to_f32(x[i]);
}

/// Router: s = sigmoid(z); top-k by s + bias (ties: lower id; NaN last);
/// ids ascending, w = s / sum(s chosen, ascending id) * scaling. One thread per row.
M3_KERNEL void m3s_router(const float* __restrict__ z, const float* __restrict__ bias, u32 ne, u32 k, float scaling,
                          int* __restrict__ ids, float* __restrict__ wts, u32 T) {
  u32 t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* zr = z + (u64)t * ne;
  int ch[16];
  for (u32 c = 0; c < k; ++c) {
    int best = -1;
    float bv = 0.0f;
    for (u32 e = 0; e < ne; ++e) {
      bool used = false;
      for (u32 u = 0; u < c; ++u) used |= ch[u] == (int)e;
      if (used) continue;
      float s = 1.0f / (1.0f + expf(-zr[e]));
      float v = s + bias[e];
      if (v != v) v = -S_INF;
      if (best < 0 || v > bv) { best = (int)e; bv = v; }
    }
    ch[c] = best;
  }
  for (u32 a = 1; a < k; ++a) {
    int v = ch[a];
    int b = (int)a - 1;
    while (b >= 0 && ch[b] > v) { ch[b + 1] = ch[b]; --b; }
    ch[b + 1] = v;
  }
  float sum = 0.0f;
  for (u32 c = 0; c < k; ++c) sum += 1.0f / (1.0f + expf(-zr[ch[c]]));
  for (u32 c = 0; c < k; ++c) {
    ids[t * k + c] = ch[c];
    wts[t * k + c] = (1.0f / (1.0f + expf(-zr[ch[c]]))) / sum * scaling;
  }
}

/// r[t] += sum_c w[t,c] * f32(ye[t*k+c]) (ids ascending) + f32(shared[t]).
M3_KERNEL void m3s_moe_combine(float* __restrict__ r, const u16* __restrict__ ye, const float* __restrict__ w, u32 k,
                               const u16* __restrict__ shared, u32 H) {
  const u32 t = blockIdx.x;
  for (u32 i = threadIdx.x; i < H; i += blockDim.x) {
    float o = 0.0f;
    for (u32 c = 0; c < k; ++c) o += w[t * k + c] * m3_bf16_to_f32(ye[((u64)t * k + c) * H + i]);
    if (shared) o += m3_bf16_to_f32(shared[(u64)t * H + i]);
    r[(u64)t * H + i] += o;
  }
}

/// Greedy: tok[i] = argmax(logits[i]) (lowest id on ties, NaN never wins). Grid nl, block 256.
M3_KERNEL void m3s_argmax(const float* __restrict__ logits, u32 vocab, u32* __restrict__ tok) {
  __shared__ float bv[32];
  __shared__ u32 bi[32];
  const float* l = logits + (u64)blockIdx.x * vocab;
  float best = -S_INF;
  u32 besti = 0xffffffffu;
  for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = l[i];
    if (v == v && (besti == 0xffffffffu || v > best)) { best = v; besti = i; }
  }
  for (int o = M3_WARP / 2; o > 0; o >>= 1) {
    float ov = M3_SHFL_XOR(best, o);
    u32 oi = M3_SHFL_XOR(besti, o);
    if (oi != 0xffffffffu && (besti == 0xffffffffu || ov > best || (ov == best && oi < besti))) { best = ov; besti = oi; }
  }
  if (threadIdx.x % M3_WARP == 0) { bv[threadIdx.x / M3_WARP] = best; bi[threadIdx.x / M3_WARP] = besti; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (u32 w = 1; w < blockDim.x / M3_WARP; ++w)
      if (bi[w] != 0xffffffffu && (besti == 0xffffffffu || bv[w] > best || (bv[w] == best && bi[w] < besti))) { best = bv[w]; besti = bi[w]; }
    tok[blockIdx.x] = besti == 0xffffffffu ? 0u : besti;
  }
}
