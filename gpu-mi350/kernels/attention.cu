// Indexer block scores, block top-k and attention over the paged KV cache
// (MODEL.md 3.6-3.7). The cache arrives as raw bytes: bf16 bits, E4M3
// codes read as e4m3 * scale, or NVFP4 (ARCHITECTURE.md, NVFP4 KV cache):
// packed E2M1 codes [slot][width / 2] plus E4M3 block scales
// [slot][width / 16] in `scales`, read as e2m1 * e4m3(s) * scale (the
// scale is the global). Row t of the step belongs to sequence
// row_seq[t]; its position j lives in slot bt[bt_off[seq] + j / page] * page
// + j % page.

/// Cache element types of these kernels' `kind` argument (the host's
/// ops::attention::CacheKind): bf16 bits, E4M3 codes, NVFP4.
#define M3_CACHE_BF16 0
#define M3_CACHE_FP8 1
#define M3_CACHE_NVFP4 2

/// Element i of a cache tensor as f32 (i counts values: row * width + col;
/// an NVFP4 block never crosses a row since width is a multiple of 16).
M3_DEV float m3_cache_at(const u8* __restrict__ data, const u8* __restrict__ scales, int kind, float scale, u64 i) {
  if (kind == M3_CACHE_FP8) return m3_elem_decode(M3_ELEM_E4M3, data[i]) * scale;
  if (kind == M3_CACHE_NVFP4) {
    const u32 byte = data[i / 2u];
    return m3_nvfp4_cache_value(i & 1u ? byte >> 4 : byte & 0xfu, scales[i / 16u], scale);
  }
  return m3_bf16_to_f32(reinterpret_cast<const u16*>(data)[i]);
}

M3_DEV u64 m3_slot(const u32* __restrict__ bt, const u32* __restrict__ bt_off, const u32* __restrict__ row_seq,
                   u32 t, u32 j, u32 page) {
  return (u64)bt[bt_off[row_seq[t]] + j / page] * page + j % page;
}

/// out[g, t, b] = max over visible j (j <= p) in block b of q[t, g] . k_j;
/// -inf for blocks with no visible key. One thread per (g, t, b).
M3_KERNEL void m3_index_scores(const float* __restrict__ q, u32 heads, u32 dim, const u8* __restrict__ cache,
                               const u8* __restrict__ cscales, int kind, float scale, const u32* __restrict__ pos, const u32* __restrict__ row_seq,
                               const u32* __restrict__ bt, const u32* __restrict__ bt_off, u32 page, u32 bs, u32 nb,
                               u32 T, float* __restrict__ out) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)heads * T * nb) return;
  u32 b = (u32)(i % nb);
  u32 t = (u32)((i / nb) % T);
  u32 g = (u32)(i / ((u64)nb * T));
  u32 p = pos[t];
  const float* qh = q + ((u64)t * heads + g) * dim;
  float best = m3_f32(0xff800000u);
  u32 lo = b * bs, hi = lo + bs;
  if (hi > p + 1) hi = p + 1;
  for (u32 j = lo; j < hi; ++j) {
    u64 base = m3_slot(bt, bt_off, row_seq, t, j, page) * dim;
    float s = 0.0f;
    for (u32 c = 0; c < dim; ++c) s += qh[c] * m3_cache_at(cache, cscales, kind, scale, base + c);
    if (s > best) best = s;
  }
  out[i] = best;
}

/// Block top-k for one (output head g, row t): n = p / bs + 1 visible blocks;
/// all when n <= topk, else the forced init / local blocks plus the best of
/// the rest by score (NaN as -inf, ties to the lower index). shared != 0:
/// the score of a block is its max over all `heads` (the same selection is
/// written for every KV head). Output ascending, -1 padded. `flags` is
/// scratch [kv_heads * T * nb].
M3_KERNEL void m3_block_topk(const float* __restrict__ scores, u32 heads, u32 nb, const u32* __restrict__ pos,
                             u32 bs, u32 topk, u32 init, u32 local, int shared, u32 kv_heads, u32 T,
                             i32* __restrict__ out, u8* __restrict__ flags) {
  u64 gi = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (gi >= (u64)kv_heads * T) return;
  u32 t = (u32)(gi % T), g = (u32)(gi / T);
  i32* o = out + gi * topk;
  u8* chosen = flags + gi * nb;
  for (u32 i = 0; i < topk; ++i) o[i] = -1;
  u32 n = pos[t] / bs + 1;
  if (n <= topk) {
    for (u32 b = 0; b < n; ++b) o[b] = (i32)b;
    return;
  }
  u32 forced = 0;
  for (u32 b = 0; b < n; ++b) {
    u8 c = (b < init) || (b + local >= n);
    chosen[b] = c;
    forced += c;
  }
  const float ninf = m3_f32(0xff800000u);
  u32 need = topk > forced ? topk - forced : 0;
  for (u32 r = 0; r < need; ++r) {
    i32 arg = -1;
    float bv = ninf;
    for (u32 b = 0; b < n; ++b) {
      if (chosen[b]) continue;
      float v;
      if (shared) {
        v = ninf;
        for (u32 h = 0; h < heads; ++h) {
          float x = scores[((u64)h * T + t) * nb + b];
          if (x > v) v = x;
        }
      } else {
        v = scores[((u64)g * T + t) * nb + b];
        if (v != v) v = ninf;
      }
      if (arg < 0 || v > bv) {
        arg = (i32)b;
        bv = v;
      }
    }
    if (arg < 0) break;
    chosen[arg] = 1;
  }
  u32 k = 0;
  for (u32 b = 0; b < n && k < topk; ++b)
    if (chosen[b]) o[k++] = (i32)b;
}

/// Most head_dim values one lane holds (head_dim <= M3_ATT_PER * M3_WARP).
#define M3_ATT_PER 16

/// Attention of q [T, heads, d] over the paged cache, one warp per (t, h):
/// scores q . k_j / sqrt(d) over the visible keys (all j <= p, or only those
/// in the selected blocks when has_blocks), f32 softmax in two passes (max,
/// then exp / sum / weighted V in ascending key order), output bf16.
M3_KERNEL void m3_attention(const float* __restrict__ q, u32 heads, u32 kv_heads, u32 d, const u8* __restrict__ kc,
                            const u8* __restrict__ vc, const u8* __restrict__ ksc, const u8* __restrict__ vsc,
                            int kind, float kscale, float vscale,
                            const u32* __restrict__ pos, const u32* __restrict__ row_seq, const u32* __restrict__ bt,
                            const u32* __restrict__ bt_off, u32 page, int has_blocks, const i32* __restrict__ blocks,
                            u32 topk, u32 bs, u32 T, float* __restrict__ out) {
  const u32 warps = blockDim.x / M3_WARP;
  const u64 item = (u64)blockIdx.x * warps + threadIdx.x / M3_WARP;
  const u32 lane = threadIdx.x % M3_WARP;
  if (item >= (u64)T * heads) return;
  const u32 t = (u32)(item / heads), h = (u32)(item % heads);
  const u32 g = h / (heads / kv_heads);
  const u32 p = pos[t];
  const u64 width = (u64)kv_heads * d;
  const float* qh = q + item * d;
  const float scale = sqrtf((float)d);
  const i32* ids = has_blocks ? blocks + ((u64)g * T + t) * topk : blocks;
  const u32 nseg = has_blocks ? topk : 1u;
  float m = m3_f32(0xff800000u);
  for (int pass = 0; pass < 2; ++pass) {
    float acc[M3_ATT_PER];
#pragma unroll
    for (int i = 0; i < M3_ATT_PER; ++i) acc[i] = 0.0f;
    float sum = 0.0f;
    for (u32 sg = 0; sg < nseg; ++sg) {
      u32 lo = 0, hi = p + 1;
      if (has_blocks) {
        i32 b = ids[sg];
        if (b < 0) continue;
        lo = (u32)b * bs;
        hi = lo + bs < p + 1 ? lo + bs : p + 1;
      }
      for (u32 j = lo; j < hi; ++j) {
        u64 base = m3_slot(bt, bt_off, row_seq, t, j, page) * width + (u64)g * d;
        float part = 0.0f;
        for (u32 c = lane; c < d; c += M3_WARP) part += qh[c] * m3_cache_at(kc, ksc, kind, kscale, base + c);
        float s = m3_warp_sum(part) / scale;
        if (pass == 0) {
          m = fmaxf(m, s);
        } else {
          float e = expf(s - m);
          sum += e;
#pragma unroll
          for (int i = 0; i < M3_ATT_PER; ++i) {
            u32 c = lane + (u32)i * M3_WARP;
            if (c < d) acc[i] += e * m3_cache_at(vc, vsc, kind, vscale, base + c);
          }
        }
      }
    }
    if (pass == 1) {
#pragma unroll
      for (int i = 0; i < M3_ATT_PER; ++i) {
        u32 c = lane + (u32)i * M3_WARP;
        if (c < d) out[item * d + c] = m3_bf16_to_f32(m3_bf16_from_f32(acc[i] / sum));
      }
    }
  }
}
