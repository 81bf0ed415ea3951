// The standard path's attention and indexer kernels (split over keys).
// Compiled in the same translation unit as standard_decode.cu (after it):
// uses its s_slot / S_INF helpers. Same math as cpu-ref's indexer and
// attention (exact E4M3 decode, f32 arithmetic); only the order of the sums
// differs. Every shape is a kernel argument and every grid is fixed by
// capacity (CTAs past a row's work exit early), so a step stays capturable.

// ---- indexer ---------------------------------------------------------------
#define SI_THREADS 128   // m3s_index_scores block size (one key per thread)
#define SI_MAXH 8        // index q heads held in shared memory
#define SI_MAXD 256      // index head dim
#define SK_THREADS 256   // m3s_index_topk block size
#define SK_SMEM 4096     // block scores kept in shared memory (else global)
#define SK_MAXK 64       // top-K blocks

/// NaN-safe max: NaN never wins (same rule as the old kernel).
M3_DEV float si_max(float m, float s) { return s > m ? s : m; }

/// Indexer block scores. Grid (maxnb, T), block SI_THREADS. CTA (b, t): the
/// max over visible keys j = b*B + o <= p of iq[h] . (e4m3(ik[j]) * iscale)
/// per selection head h (per-KV-head: index head h for KV head h; shared: max
/// over all nih index heads too). Forced blocks (b < init_b or among the
/// local_b last blocks of the row) are +INF. Rows with nb <= K blocks need no
/// scores (every block is taken) and blocks past nb exit at once.
/// scores: [T][selh][maxnb] f32, selh = 1 (shared) or nkv.
M3_KERNEL void m3s_index_scores(const u16* __restrict__ iq, u32 nih, u32 di, const u8* __restrict__ icache,
                                float iscale, const u32* __restrict__ pos, const u32* __restrict__ row_seq,
                                const u32* __restrict__ bt, const u32* __restrict__ bt_off, u32 page, u32 B, u32 K,
                                u32 init_b, u32 local_b, u32 shared_sel, u32 nkv, float* __restrict__ scores,
                                u32 maxnb) {
  __shared__ float4 qs4[SI_MAXH * SI_MAXD / 4];  // float4: 16-byte aligned
  float* qs = reinterpret_cast<float*>(qs4);
  __shared__ float red[SI_MAXH][SI_THREADS / M3_WARP];
  const u32 b = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const u32 p = pos[t], seq = row_seq[t];
  const u32 nb = p / B + 1u;
  if (b >= nb || nb <= K) return;
  const u32 selh = shared_sel ? 1u : nkv;
  float* out = scores + (u64)t * selh * maxnb + b;
  if (b < init_b || b + local_b >= nb) {
    for (u32 h = tid; h < selh; h += blockDim.x) out[(u64)h * maxnb] = S_INF;
    return;
  }
  for (u32 i = tid; i < nih * di; i += blockDim.x) qs[i] = m3_bf16_to_f32(iq[(u64)t * nih * di + i]);
  __syncthreads();
  float m[SI_MAXH];
#pragma unroll
  for (int h = 0; h < SI_MAXH; ++h) m[h] = -S_INF;
  const u32 nc = di / 16u;
  for (u32 o = tid; o < B; o += blockDim.x) {
    const u32 j = b * B + o;
    if (j > p) break;
    const u8* kr = icache + s_slot(bt, bt_off, seq, page, j) * di;
    float dot[SI_MAXH];
#pragma unroll
    for (int h = 0; h < SI_MAXH; ++h) dot[h] = 0.0f;
    for (u32 c = 0; c < nc; ++c) {
      uint4 raw = *reinterpret_cast<const uint4*>(kr + 16u * c);
      u32 w4[4] = {raw.x, raw.y, raw.z, raw.w};
      float kv[16];
#pragma unroll
      for (int e = 0; e < 16; ++e) kv[e] = m3_e4m3_fast((w4[e / 4] >> (8 * (e % 4))) & 0xffu) * iscale;
#pragma unroll
      for (int h = 0; h < SI_MAXH; ++h) {
        if ((u32)h >= nih) break;
        const float4* qv = reinterpret_cast<const float4*>(qs + (u32)h * di + 16u * c);
        float s = dot[h];
#pragma unroll
        for (int e4 = 0; e4 < 4; ++e4) {
          float4 qq = qv[e4];
          s += qq.x * kv[4 * e4] + qq.y * kv[4 * e4 + 1] + qq.z * kv[4 * e4 + 2] + qq.w * kv[4 * e4 + 3];
        }
        dot[h] = s;
      }
    }
#pragma unroll
    for (int h = 0; h < SI_MAXH; ++h) {
      if ((u32)h >= nih) break;
      if (shared_sel) m[0] = si_max(m[0], dot[h]);
      else m[h] = si_max(m[h], dot[h]);
    }
  }
  const u32 warp = tid / M3_WARP, lane = tid % M3_WARP, nw = blockDim.x / M3_WARP;
#pragma unroll
  for (int h = 0; h < SI_MAXH; ++h) {
    if ((u32)h >= selh) break;
    float v = m[h];
#pragma unroll
    for (int o = M3_WARP / 2; o > 0; o >>= 1) v = si_max(v, M3_SHFL_XOR(v, o));
    if (lane == 0) red[h][warp] = v;
  }
  __syncthreads();
  if (tid < selh) {
    float v = -S_INF;
    for (u32 w = 0; w < nw; ++w) v = si_max(v, red[tid][w]);
    out[(u64)tid * maxnb] = v;
  }
}

/// Is candidate (v, i) better than (bv, bi)? Higher score, ties to the lower
/// id; i < 0 means "none".
M3_DEV bool sk_better(float v, int i, float bv, int bi) {
  return i >= 0 && (bi < 0 || v > bv || (v == bv && i < bi));
}

/// Top-K block selection of one (selection head, row). Grid (selh, T),
/// block SK_THREADS. nb = p/B + 1 blocks: nb <= K takes them all; else K
/// rounds of argmax over the scores of m3s_index_scores (ties to the lower
/// id, taken blocks excluded). Each thread keeps the best of its own strided
/// blocks and rescans only when one of them is taken, so a round is one
/// warp reduction and one barrier. Ids ascending, -1 padding, written to
/// sel [nkv][T][K] for the KV heads the selection head covers.
M3_KERNEL void m3s_index_topk(float* __restrict__ scores, const u32* __restrict__ pos, u32 B, u32 K, u32 shared_sel,
                              u32 nkv, u32 T, u32 maxnb, int* __restrict__ sel) {
  __shared__ float ssc[SK_SMEM];
  __shared__ float cv[2][SK_THREADS / M3_WARP];
  __shared__ int ci[2][SK_THREADS / M3_WARP];
  __shared__ int chosen[SK_MAXK];
  const u32 gsel = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const u32 selh = gridDim.x;
  const u32 p = pos[t];
  const u32 nb = p / B + 1u;
  const u32 warp = tid / M3_WARP, lane = tid % M3_WARP, nw = blockDim.x / M3_WARP;
  u32 nsel;
  if (nb <= K) {
    for (u32 b = tid; b < nb; b += blockDim.x) chosen[b] = (int)b;
    nsel = nb;
  } else {
    float* gsc = scores + ((u64)t * selh + gsel) * maxnb;
    float* sc = gsc;
    if (nb <= SK_SMEM) {
      for (u32 b = tid; b < nb; b += blockDim.x) ssc[b] = gsc[b];
      sc = ssc;
    }
    __syncthreads();
    float best = -S_INF;
    int besti = -1;
    for (u32 b = tid; b < nb; b += blockDim.x) {
      float v = sc[b];
      if (v != v) continue;
      if (besti < 0 || v > best) { best = v; besti = (int)b; }
    }
    for (u32 k = 0; k < K; ++k) {
      float wb = best;
      int wi = besti;
#pragma unroll
      for (int o = M3_WARP / 2; o > 0; o >>= 1) {
        float ov = M3_SHFL_XOR(wb, o);
        int oi = M3_SHFL_XOR(wi, o);
        if (sk_better(ov, oi, wb, wi)) { wb = ov; wi = oi; }
      }
      const u32 par = k & 1u;  // double buffer: one barrier per round
      if (lane == 0) { cv[par][warp] = wb; ci[par][warp] = wi; }
      __syncthreads();
      float b0 = cv[par][0];
      int i0 = ci[par][0];
      for (u32 w = 1; w < nw; ++w)
        if (sk_better(cv[par][w], ci[par][w], b0, i0)) { b0 = cv[par][w]; i0 = ci[par][w]; }
      if (tid == 0) chosen[k] = i0;
      if (i0 >= 0 && (u32)i0 % blockDim.x == tid) {
        // the owner marks it taken (NaN) and rescans its own blocks
        sc[i0] = m3_nan();
        best = -S_INF;
        besti = -1;
        for (u32 b = tid; b < nb; b += blockDim.x) {
          float v = sc[b];
          if (v != v) continue;
          if (besti < 0 || v > best) { best = v; besti = (int)b; }
        }
      }
    }
    nsel = K;
  }
  __syncthreads();
  if (tid == 0) {
    // ascending insertion sort (K <= 64)
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
    for (u32 k = tid; k < K; k += blockDim.x) sel[((u64)h * T + t) * K + k] = k < nsel ? chosen[k] : -1;
}

// ---- attention (flash-decoding split over keys) ----------------------------
#define SA_THREADS 256   // m3s_attn_partial block size
#define SA_TILE 128      // keys per score tile (SA_THREADS / SA_TILE threads per key)
#define SA_HSPLIT (SA_THREADS / SA_TILE)
#define SA_MAXHG 16      // q heads per KV head
#define SA_MAXD 256      // head dim
#define SA_QBUF (SA_MAXHG * SA_MAXD)              // floats of q (and of a V tile)
#define SA_QUADS (SA_QBUF / 4 / SA_THREADS)       // output quads o[h][i..i+3] per thread
#define SA_REC(d) ((d) + 4u)                      // floats per partial: m, l, 2 pad, o[d] (16-byte aligned)

/// Score tiles (of SA_TILE keys) per chunk of a full layer: chunks stay
/// SA_TILE keys until the row would need more than max_chunks of them, then
/// grow by whole tiles. Shared by the partial and the combine kernels.
M3_DEV u32 sa_tiles_per_chunk(u32 p, u32 max_chunks) {
  const u32 nt = p / SA_TILE + 1u;
  return (nt + max_chunks - 1u) / max_chunks;
}
/// Chunks a row uses: K selected blocks (sparse) or the full layer's chunks.
M3_DEV u32 sa_chunks(u32 p, u32 sparse, u32 K, u32 max_chunks) {
  if (sparse) return K;
  const u32 nt = p / SA_TILE + 1u, tpc = sa_tiles_per_chunk(p, max_chunks);
  return (nt + tpc - 1u) / tpc;
}

/// Decode 16 E4M3 codes of one 16-byte load, times a scale.
M3_DEV void sa_dec16(uint4 raw, float sc, float* o) {
  u32 w4[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 16; ++e) o[e] = m3_e4m3_fast((w4[e / 4] >> (8 * (e % 4))) & 0xffu) * sc;
}

/// Partial attention of all hg = nh/nkv q heads of KV head g over one chunk
/// of keys. Grid (max_chunks, nkv, T), block SA_THREADS. Chunk c: selected
/// block sel[g][t][c] (keys b*B .. b*B+B-1, sel != 0) or keys
/// [c*CK, c*CK+CK) with CK = SA_TILE * sa_tiles_per_chunk (full layers),
/// clipped to j <= p. K and V of the chunk are read once per CTA (16-byte
/// loads, decoded once) and shared by the hg heads; tiles of SA_TILE keys
/// merge with an online softmax. Writes per head the chunk max m, the sum l
/// of exp(s - m) and the unnormalised o[d] to
/// part [T][nkv][max_chunks][hg][d + 4] (m, l, pad, pad, o); an empty chunk
/// writes m = -INF, l = 0 (o untouched: the combine skips it).
M3_KERNEL void m3s_attn_partial(const u16* __restrict__ q, u32 nh, u32 nkv, u32 d, const u8* __restrict__ kc,
                                const u8* __restrict__ vc, float ks, float vs, const u32* __restrict__ pos,
                                const u32* __restrict__ row_seq, const u32* __restrict__ bt,
                                const u32* __restrict__ bt_off, u32 page, const int* __restrict__ sel, u32 K, u32 B,
                                u32 T, float* __restrict__ part, u32 max_chunks) {
  __shared__ float4 qs4[SA_QBUF / 4];  // q [hg][d] f32 (float4: 16-byte aligned)
  __shared__ float4 vt4[SA_QBUF / 4];  // decoded V tile [tv][d]
  float* qs = reinterpret_cast<float*>(qs4);
  float* vt = reinterpret_cast<float*>(vt4);
  __shared__ float sp[SA_MAXHG][SA_TILE];        // scores, then exp(s - m)
  __shared__ float hm[SA_MAXHG], hl[SA_MAXHG], hc[SA_MAXHG];
  const u32 c = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
  const u32 hg = nh / nkv;
  const u32 p = pos[t], seq = row_seq[t];
  u64 j0 = 0, jend = 0;  // keys [j0, jend)
  if (sel) {
    if (c >= K) return;
    const int b = sel[((u64)g * T + t) * K + c];
    if (b >= 0) {
      j0 = (u64)b * B;
      jend = j0 + B;
      if (jend > (u64)p + 1u) jend = (u64)p + 1u;
    }
  } else {
    if (c >= sa_chunks(p, 0u, K, max_chunks)) return;
    const u64 ck = (u64)SA_TILE * sa_tiles_per_chunk(p, max_chunks);
    j0 = (u64)c * ck;
    jend = j0 + ck;
    if (jend > (u64)p + 1u) jend = (u64)p + 1u;
  }
  const u32 R = SA_REC(d);
  float* rec = part + ((((u64)t * nkv + g) * max_chunks + c) * hg) * R;
  if (jend <= j0) {
    for (u32 h = tid; h < hg; h += blockDim.x) {
      rec[(u64)h * R] = -S_INF;
      rec[(u64)h * R + 1u] = 0.0f;
    }
    return;
  }
  const u32 nq = hg * d;
  const u16* qr = q + ((u64)t * nh + (u64)g * hg) * d;
  for (u32 i = tid; i < nq; i += blockDim.x) qs[i] = m3_bf16_to_f32(qr[i]);
  for (u32 h = tid; h < hg; h += blockDim.x) { hm[h] = -S_INF; hl[h] = 0.0f; }
  // the outputs this thread owns: quads o[h][i..i+3], 4*(tid + r*SA_THREADS) = h*d + i
  const u32 nquad = nq / 4u;
  u32 oh[SA_QUADS], oi[SA_QUADS];
  float4 acc[SA_QUADS];
#pragma unroll
  for (int r = 0; r < SA_QUADS; ++r) {
    const u32 idx = 4u * (tid + (u32)r * SA_THREADS);
    oh[r] = idx / d;
    oi[r] = idx % d;
    acc[r].x = acc[r].y = acc[r].z = acc[r].w = 0.0f;
  }
  __syncthreads();
  const float scale = 1.0f / sqrtf((float)d);
  const u32 nc = d / 16u;
  const u32 warp = tid / M3_WARP, lane = tid % M3_WARP, nw = blockDim.x / M3_WARP;
  const u32 tv = SA_QBUF / d;  // keys per V tile
  const u32 kk = tid % SA_TILE, hpart = tid / SA_TILE;
  for (u64 jt = j0; jt < jend; jt += SA_TILE) {
    const u32 nk = jend - jt < (u64)SA_TILE ? (u32)(jend - jt) : (u32)SA_TILE;
    // 1. scores s[h][kk] = (q_h . k_j) * scale, one key per thread (heads split
    //    SA_HSPLIT ways), the K row read in 16-byte loads
    if (kk < nk) {
      const u8* kr = kc + (s_slot(bt, bt_off, seq, page, (u32)(jt + kk)) * nkv + g) * d;
      float dot[SA_MAXHG / SA_HSPLIT];
#pragma unroll
      for (int r = 0; r < SA_MAXHG / SA_HSPLIT; ++r) dot[r] = 0.0f;
      for (u32 cc = 0; cc < nc; ++cc) {
        float kv[16];
        sa_dec16(*reinterpret_cast<const uint4*>(kr + 16u * cc), ks, kv);
#pragma unroll
        for (int r = 0; r < SA_MAXHG / SA_HSPLIT; ++r) {
          const u32 h = hpart + (u32)r * SA_HSPLIT;
          if (h >= hg) break;
          const float4* qv = reinterpret_cast<const float4*>(qs + h * d + 16u * cc);
          float s = dot[r];
#pragma unroll
          for (int e4 = 0; e4 < 4; ++e4) {
            float4 qq = qv[e4];
            s += qq.x * kv[4 * e4] + qq.y * kv[4 * e4 + 1] + qq.z * kv[4 * e4 + 2] + qq.w * kv[4 * e4 + 3];
          }
          dot[r] = s;
        }
      }
#pragma unroll
      for (int r = 0; r < SA_MAXHG / SA_HSPLIT; ++r) {
        const u32 h = hpart + (u32)r * SA_HSPLIT;
        if (h >= hg) break;
        sp[h][kk] = dot[r] * scale;
      }
    }
    __syncthreads();
    // 2. online softmax per head (one warp per head)
    for (u32 h = warp; h < hg; h += nw) {
      float mt = -S_INF;
      for (u32 k2 = lane; k2 < nk; k2 += M3_WARP) mt = si_max(mt, sp[h][k2]);
#pragma unroll
      for (int o = M3_WARP / 2; o > 0; o >>= 1) mt = si_max(mt, M3_SHFL_XOR(mt, o));
      const float mo = hm[h];
      const float mn = si_max(mo, mt);
      // all scores -INF so far: nothing to weigh (keeps exp(-INF - -INF) out)
      const bool none = mn == -S_INF;
      const float corr = none ? 1.0f : expf(mo - mn);
      float ls = 0.0f;
      for (u32 k2 = lane; k2 < nk; k2 += M3_WARP) {
        const float e = none ? 0.0f : expf(sp[h][k2] - mn);
        sp[h][k2] = e;
        ls += e;
      }
      ls = m3_warp_sum(ls);
      if (lane == 0) {
        hm[h] = mn;
        hl[h] = hl[h] * corr + ls;
        hc[h] = corr;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < SA_QUADS; ++r) {
      if (tid + (u32)r * SA_THREADS < nquad) {
        const float cr = hc[oh[r]];
        acc[r].x *= cr;
        acc[r].y *= cr;
        acc[r].z *= cr;
        acc[r].w *= cr;
      }
    }
    // 3. o[h][i] += sum_j e[h][j] * v_j[i], V decoded once into a shared tile
    for (u32 v0 = 0; v0 < nk; v0 += tv) {
      const u32 nvk = nk - v0 < tv ? nk - v0 : tv;
      for (u32 vi = tid; vi < nvk * nc; vi += blockDim.x) {
        const u32 key = vi / nc, cc = vi % nc;
        const u8* vr = vc + (s_slot(bt, bt_off, seq, page, (u32)(jt + v0 + key)) * nkv + g) * d;
        float vv[16];
        sa_dec16(*reinterpret_cast<const uint4*>(vr + 16u * cc), vs, vv);
        float4* dst = reinterpret_cast<float4*>(vt + key * d + 16u * cc);
#pragma unroll
        for (int e4 = 0; e4 < 4; ++e4) {
          float4 f;
          f.x = vv[4 * e4];
          f.y = vv[4 * e4 + 1];
          f.z = vv[4 * e4 + 2];
          f.w = vv[4 * e4 + 3];
          dst[e4] = f;
        }
      }
      __syncthreads();
      for (u32 k2 = 0; k2 < nvk; ++k2) {
        const float* vrow = vt + k2 * d;
#pragma unroll
        for (int r = 0; r < SA_QUADS; ++r) {
          if (tid + (u32)r * SA_THREADS < nquad) {
            const float e = sp[oh[r]][v0 + k2];
            const float4 vv = *reinterpret_cast<const float4*>(vrow + oi[r]);
            acc[r].x += e * vv.x;
            acc[r].y += e * vv.y;
            acc[r].z += e * vv.z;
            acc[r].w += e * vv.w;
          }
        }
      }
      __syncthreads();
    }
  }
  for (u32 h = tid; h < hg; h += blockDim.x) {
    rec[(u64)h * R] = hm[h];
    rec[(u64)h * R + 1u] = hl[h];
  }
#pragma unroll
  for (int r = 0; r < SA_QUADS; ++r)
    if (tid + (u32)r * SA_THREADS < nquad) *reinterpret_cast<float4*>(rec + (u64)oh[r] * R + 4u + oi[r]) = acc[r];
}

#define SC_THREADS 128  // m3s_attn_combine block size

/// Merge the chunk partials of q head i (KV head g = i / hg) of row t:
/// M = max m_c, out = sum exp(m_c - M) o_c / sum exp(m_c - M) l_c, 0 when
/// the row saw no key. Grid (nh, T), block SC_THREADS; out [T][nh][d] bf16.
M3_KERNEL void m3s_attn_combine(const float* __restrict__ part, u32 nh, u32 nkv, u32 d, const u32* __restrict__ pos,
                                u32 sparse, u32 K, u32 max_chunks, u16* __restrict__ out) {
  __shared__ float red[SC_THREADS / M3_WARP];
  const u32 i = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const u32 hg = nh / nkv, g = i / hg, h = i % hg;
  const u32 nch = sa_chunks(pos[t], sparse, K, max_chunks);
  const u32 R = SA_REC(d);
  const u64 cs = (u64)hg * R;  // floats between chunks
  const float* base = part + (((u64)t * nkv + g) * max_chunks * hg + h) * R;
  float M = -S_INF;
  for (u32 c = tid; c < nch; c += blockDim.x) M = si_max(M, base[c * cs]);
#pragma unroll
  for (int o = M3_WARP / 2; o > 0; o >>= 1) M = si_max(M, M3_SHFL_XOR(M, o));
  if (tid % M3_WARP == 0) red[tid / M3_WARP] = M;
  __syncthreads();
  M = -S_INF;
  for (u32 w = 0; w < blockDim.x / M3_WARP; ++w) M = si_max(M, red[w]);
  u16* orow = out + ((u64)t * nh + i) * d;
  for (u32 x = tid; x < d; x += blockDim.x) {
    float L = 0.0f, o = 0.0f;
    if (M != -S_INF) {
      for (u32 c = 0; c < nch; ++c) {
        const float* rc = base + c * cs;
        const float mc = rc[0];
        if (mc == -S_INF) continue;
        const float w = expf(mc - M);
        L += w * rc[1];
        o += w * rc[4u + x];
      }
    }
    orow[x] = m3_bf16_from_f32(L > 0.0f ? o / L : 0.0f);
  }
}
