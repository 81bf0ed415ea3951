// The standard path's attention and indexer kernels (split over keys).
// Compiled in the same translation unit as standard_decode.cu (after it):
// uses its s_slot / S_INF helpers. Same math as cpu-ref's indexer and
// attention (exact E4M3, bf16 or NVFP4 decode, f32 arithmetic); only the
// order of the sums differs. The attention's and (fp8 / bf16 caches) the
// indexer's tensor-core products keep that: bf16 q times E4M3 codes, bf16
// cache values or NVFP4 e2m1 * e4m3 block scale products (all exact bf16
// values; the per-tensor scale multiplies the f32 results, so an fp8 score
// is (q . codes) * scale where the CPU sums q * (code * scale): ~1 ulp a
// term) are exact products summed in f32, and the f32 softmax weights
// enter P V as three bf16 parts (~2^-25 relative). E4M3 codes become bf16 /
// f32 through the hardware's E4M3 -> f16 conversion (m3_e4m3x2_bf16x2:
// four instructions a pair against ~ten a value bit by bit; bench/NOTES.md
// session 18). Every shape is a kernel
// argument and every grid is fixed by capacity (CTAs past a row's work exit
// early), so a step stays capturable. Caches hold E4M3 codes, bf16 bits or
// NVFP4 (cache_kind, S_CACHE_* in standard_decode.cu; NVFP4: packed E2M1
// codes [slot][width / 2] plus E4M3 block scales [slot][width / 16] in a
// second buffer, ARCHITECTURE.md, NVFP4 KV cache): each kernel body is a
// template on that, dispatched once per CTA, so the inner loops carry no
// per-element test.

/// Marks the start of one cache type's kernel body: a PTX comment, so the
/// two instantiations of a body begin with different instructions and the
/// compiler does not hoist their common prefix above the dispatch (that
/// lengthened live ranges across both bodies and made ptxas spill in the
/// fp8 one). No code; CUDA only (AMDGPU assembly comments differ).
#if defined(M3_CUDA) && !defined(M3_SIM)
#define S_PATH_MARK(text) asm volatile("// " text)
#else
#define S_PATH_MARK(text) ((void)0)
#endif

/// The NVFP4 cache's indexer and attention bodies are entry points of
/// their own (`..._nv`, chosen by the host), not a third arm of the fp8 /
/// bf16 kernels' dispatch: in one kernel the NVFP4 instance raised the
/// fp8 path's registers and made the batch-1 step 4% slower (split
/// attention +41%, index scores +26%: bench/NOTES.md session 10 run 5).
/// They exist on CUDA only (no HIP runner reads an NVFP4 cache yet): on
/// HIP the entry points trap, and the standard path refuses an NVFP4 cache
/// there at load. S_NV_ONLY(call) is such an entry's body.
#if defined(M3_CUDA)
#define S_NV_ONLY(call) call
#else
#define S_NV_ONLY(call) __builtin_trap()
#endif

#if !S_MMA_ONLY  // a tensor-core variant's unit has no attention (standard_decode.cu)
// ---- indexer ---------------------------------------------------------------
#define SI_THREADS 256   // m3s_index_scores block size (4 threads per key)
#define SI_KPT 2         // fp8 keys per thread per pass (SI_THREADS / 4 * SI_KPT keys a pass)
#define SI_CPT (SI_MAXD / 64)  // 16-byte chunks of an fp8 key per thread, at most
// (bf16 keys: half the keys per pass, twice the chunks per key: the same
// bytes in flight and registers)
#define SI_MAXH 8        // index q heads held in shared memory
#define SI_MAXD 256      // index head dim
#define SK_THREADS 256   // m3s_index_topk block size
#define SK_SMEM 4096     // block scores kept in shared memory (else global)
#define SK_MAXK 64       // top-K blocks

/// NaN-safe max: NaN never wins (same rule as the old kernel).
M3_DEV float si_max(float m, float s) { return s > m ? s : m; }

/// Indexer block scores. Grid (X <= maxnb, T), block SI_THREADS; CTA (x, t)
/// scores blocks b = x, x + X, ... < nb of row t. Block b: the
/// max over visible keys j = b*B + o <= p of iq[h] . k[j] per selection
/// head h (per-KV-head: index head h for KV head h; shared: max over all
/// nih index heads too), k[j] = e4m3(ik[j]) * iscale, the bf16 key itself
/// (S_CACHE_BF16: icache holds bf16 bits [slot][di], iscale is 1), or
/// f32(e2m1 * e4m3(s) * iscale) (S_CACHE_NVFP4: icache holds packed codes
/// [slot][di / 2], iscales the block scales [slot][di / 16]; the value the
/// CPU reads, bit for bit: m3_nvfp4_cache_value).
/// Forced blocks (b < init_b or among the
/// local_b last blocks of the row) are +INF. Rows with nb <= K blocks need no
/// scores (every block is taken) and blocks past nb exit at once. Four
/// threads per key (16-byte chunks sub, sub + 4, ...: all of a thread's
/// loads are issued together), the four partial dots summed by shuffles.
/// scores: [T][selh][maxnb] f32, selh = 1 (shared) or nkv.
template <int CK>
M3_DEV void si_scores(const u16* __restrict__ iq, u32 nih, u32 di, const u8* __restrict__ icache,
                      const u8* __restrict__ iscales, float iscale,
                      const u32* __restrict__ pos, const u32* __restrict__ row_seq, const u32* __restrict__ bt,
                      const u32* __restrict__ bt_off, u32 page, u32 B, u32 K, u32 init_b, u32 local_b,
                      u32 shared_sel, u32 nkv, float* __restrict__ scores, u32 maxnb, float4* qs4,
                      float (*red)[SI_THREADS / 32]) {
  // per cache type: values per 16-byte chunk, keys per thread per pass,
  // chunks of a key per thread (at most), bytes per value (NVFP4: a chunk
  // is 32 values, two scale blocks, half a byte a value: half the chunks
  // of fp8)
  constexpr bool BF = CK == S_CACHE_BF16, NV = CK == S_CACHE_NVFP4;
  const u32 E = BF ? 8u : (NV ? 32u : 16u);
  const int KPT = BF ? 1 : SI_KPT;
  const int CPT = BF ? 2 * SI_CPT : (NV ? SI_CPT / 2 : SI_CPT);
  const u32 VB = BF ? 2u : 1u;
  if constexpr (BF) S_PATH_MARK("m3s_index_scores: bf16 cache");
  else if constexpr (NV) S_PATH_MARK("m3s_index_scores: nvfp4 cache");
  else S_PATH_MARK("m3s_index_scores: fp8 cache");
  float* qs = reinterpret_cast<float*>(qs4);
  const u32 t = blockIdx.y, tid = threadIdx.x;
  const u32 p = pos[t], seq = row_seq[t];
  const u32 nb = p / B + 1u;
  if (blockIdx.x >= nb || nb <= K) return;
  const u32 selh = shared_sel ? 1u : nkv;
  bool have_q = false;
  for (u32 b = blockIdx.x; b < nb; b += gridDim.x) {  // uniform over the CTA
    float* out = scores + (u64)t * selh * maxnb + b;
    if (b < init_b || b + local_b >= nb) {
      for (u32 h = tid; h < selh; h += blockDim.x) out[(u64)h * maxnb] = S_INF;
      continue;
    }
    if (!have_q) {
      have_q = true;
      // q as f32, 8 bf16 per 16-byte load (di is a multiple of 32)
      for (u32 i = tid; i < nih * di / 8u; i += blockDim.x) {
        const uint4 v = reinterpret_cast<const uint4*>(iq + (u64)t * nih * di)[i];
        const u32 w4[4] = {v.x, v.y, v.z, v.w};
        float4 lo, hi;
        lo.x = m3_f32(w4[0] << 16);
        lo.y = m3_f32(w4[0] & 0xffff0000u);
        lo.z = m3_f32(w4[1] << 16);
        lo.w = m3_f32(w4[1] & 0xffff0000u);
        hi.x = m3_f32(w4[2] << 16);
        hi.y = m3_f32(w4[2] & 0xffff0000u);
        hi.z = m3_f32(w4[3] << 16);
        hi.w = m3_f32(w4[3] & 0xffff0000u);
        qs4[2u * i] = lo;
        qs4[2u * i + 1u] = hi;
      }
      __syncthreads();
    }
    float m[SI_MAXH];
#pragma unroll
    for (int h = 0; h < SI_MAXH; ++h) m[h] = -S_INF;
    const u32 nc = di / E, sub = tid % 4u, kq = tid / 4u;
    const u32 kpass = SI_THREADS / 4u * (u32)KPT;
    const u32 jb = b * B, jlast = p < jb + B - 1u ? p : jb + B - 1u;  // keys jb ..= jlast
    for (u32 o0 = 0; jb + o0 <= jlast; o0 += kpass) {
      uint4 raw[KPT][CPT];
      u32 scl[KPT][NV ? CPT : 1];  // NVFP4: the two scale bytes of each chunk
      bool ok[KPT];
#pragma unroll
      for (int r = 0; r < KPT; ++r) {
        const u32 j = jb + o0 + kq + (u32)r * (SI_THREADS / 4u);
        ok[r] = j <= jlast;
        const u64 slot = ok[r] ? s_slot(bt, bt_off, seq, page, j) : 0u;
        const u8* kr = icache + (NV ? slot * di / 2u : slot * di * VB);
#pragma unroll
        for (int x = 0; x < CPT; ++x) {
          const u32 cc = sub + 4u * (u32)x;
          raw[r][x] = make_uint4(0u, 0u, 0u, 0u);
          if (ok[r] && cc < nc) raw[r][x] = *reinterpret_cast<const uint4*>(kr + 16u * cc);
          if constexpr (NV) {
            // blocks 2cc, 2cc + 1 of the row (di / 16 is even: 2-byte aligned)
            scl[r][x] = 0u;
            if (ok[r] && cc < nc) scl[r][x] = *reinterpret_cast<const u16*>(iscales + slot * (di / 16u) + 2u * cc);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < KPT; ++r) {
        float dot[SI_MAXH];
#pragma unroll
        for (int h = 0; h < SI_MAXH; ++h) dot[h] = 0.0f;
#pragma unroll
        for (int x = 0; x < CPT; ++x) {
          const u32 cc = sub + 4u * (u32)x;
          if (4u * (u32)x >= nc) break;  // uniform
          if (cc < nc) {
            u32 w4[4] = {raw[r][x].x, raw[r][x].y, raw[r][x].z, raw[r][x].w};
            if constexpr (NV) {
              // two blocks of 16: f32(e2m1 * e4m3(s) * iscale), the CPU's value
#pragma unroll
              for (int hf = 0; hf < 2; ++hf) {
                const u32 sb = (scl[r][x] >> (8 * hf)) & 0xffu;
                float kv[16];
#pragma unroll
                for (int e = 0; e < 16; ++e) kv[e] = m3_nvfp4_cache_value(w4[2 * hf + e / 8] >> (4 * (e % 8)), sb, iscale);
#pragma unroll
                for (int h = 0; h < SI_MAXH; ++h) {
                  if ((u32)h >= nih) break;
                  const float4* qv = reinterpret_cast<const float4*>(qs + (u32)h * di + E * cc + 16u * (u32)hf);
                  float s = dot[h];
#pragma unroll
                  for (int e4 = 0; e4 < 4; ++e4) {
                    float4 qq = qv[e4];
                    s += qq.x * kv[4 * e4] + qq.y * kv[4 * e4 + 1] + qq.z * kv[4 * e4 + 2] + qq.w * kv[4 * e4 + 3];
                  }
                  dot[h] = s;
                }
              }
            } else {
              float kv[E];
              if constexpr (BF) {
                // bf16 bits: exact
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                  kv[2 * e] = m3_f32(w4[e] << 16);
                  kv[2 * e + 1] = m3_f32(w4[e] & 0xffff0000u);
                }
              } else {
#pragma unroll
                for (int e = 0; e < 16; e += 2) {
                  // a pair a conversion (exact, as m3_e4m3_fast); the scale per value
                  m3_e4m3x2_f32(w4[e / 4] >> (8 * (e % 4)), kv[e], kv[e + 1]);
                  kv[e] *= iscale;
                  kv[e + 1] *= iscale;
                }
              }
#pragma unroll
              for (int h = 0; h < SI_MAXH; ++h) {
                if ((u32)h >= nih) break;
                const float4* qv = reinterpret_cast<const float4*>(qs + (u32)h * di + E * cc);
                float s = dot[h];
#pragma unroll
                for (int e4 = 0; e4 < (int)(E / 4u); ++e4) {
                  float4 qq = qv[e4];
                  s += qq.x * kv[4 * e4] + qq.y * kv[4 * e4 + 1] + qq.z * kv[4 * e4 + 2] + qq.w * kv[4 * e4 + 3];
                }
                dot[h] = s;
              }
            }
          }
        }
#pragma unroll
        for (int h = 0; h < SI_MAXH; ++h) {
          if ((u32)h >= nih) break;
          float v = dot[h];
          v += M3_SHFL_XOR(v, 1);
          v += M3_SHFL_XOR(v, 2);
          if (ok[r]) {
            if (shared_sel) m[0] = si_max(m[0], v);
            else m[h] = si_max(m[h], v);
          }
        }
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
    __syncthreads();  // red is rewritten by the next block
  }
}

/// si_scores for fp8 and bf16 index caches on tensor cores (the NVFP4 one
/// keeps the scalar form above): each 32-thread group scores 16-key tiles
/// of the block with m16n8k16 bf16 products, keys as M, the (at most 8)
/// index heads as N, d as K. Lane (g, t) holds d values t di/4 .. (t + 1)
/// di/4 - 1 of keys g, g + 8 and of q head g, so each key row is a few
/// 16-byte loads a lane; k-step s takes the lane's values 4s .. 4s + 3
/// (slots 2t, 2t + 1 <- values 0, 1 and 2t + 8, 2t + 9 <- values 2, 3, the
/// same order for q): a permutation of d, which the dot product does not
/// see. Exact products (q is bf16, every E4M3 code and bf16 key is a bf16
/// value) summed in f32; the fp8 cache's per-tensor scale multiplies the
/// f32 dot (the attention's rule) instead of each key value. Same
/// selections of forced, past-the-row and NaN scores as si_scores.
///
/// Before the dependency wait (`prewait`, the path's choice): the CTA's
/// first tile of its first block is loaded when no row of this step
/// writes a key of that block (a position of the row's sequence inside
/// it): those keys were written by earlier steps, and the block table and
/// positions are step inputs. A decode row's own key sits in its last
/// block, which is forced, never scored.
template <int CK>
M3_DEV void si_scores_mma(const u16* __restrict__ iq, u32 nih, u32 di, const u8* __restrict__ icache, float iscale,
                          const u32* __restrict__ pos, const u32* __restrict__ row_seq, const u32* __restrict__ bt,
                          const u32* __restrict__ bt_off, u32 page, u32 B, u32 K, u32 init_b, u32 local_b,
                          u32 shared_sel, u32 nkv, float* __restrict__ scores, u32 maxnb,
                          float (*red)[SI_THREADS / 32], u32* flag, u32 prewait) {
  constexpr bool BF = CK == S_CACHE_BF16;
  if constexpr (BF) S_PATH_MARK("m3s_index_scores: bf16 cache, mma");
  else S_PATH_MARK("m3s_index_scores: fp8 cache, mma");
  // 16-byte chunks of a key row a lane holds (values span = di / 4)
  constexpr u32 VPC = BF ? 8u : 16u;               // values a chunk
  constexpr u32 MAXC = SI_MAXD / 4u / VPC;         // chunks a lane, at most
  const u32 VB = BF ? 2u : 1u;                     // bytes a value
  const u32 t = blockIdx.y, tid = threadIdx.x, T = gridDim.y;
  const u32 p = pos[t], seq = row_seq[t];
  const u32 nb = p / B + 1u;
  if (blockIdx.x >= nb || nb <= K) return;  // no work (before the wait: nothing read)
  const u32 selh = shared_sel ? 1u : nkv;
  const u32 grp = tid / 32u, ngrp = blockDim.x / 32u, l32 = tid % 32u, lg = l32 / 4u, lt = l32 % 4u;
  const u32 span = di / 4u, nch = span / VPC;  // di a multiple of 32: span a multiple of 8 (of 16 for fp8 at di % 64 == 0)
  uint4 ka[MAXC], kc[MAXC];
  // keys ja, jc = ja + 8 of tile `tile` of block b into ka, kc (zero past jlast)
  auto load_tile = [&](u32 b, u32 tile, u32 jlast) {
    const u32 ja = b * B + 16u * tile + lg, jc = ja + 8u;
    const bool oka = ja <= jlast, okc = jc <= jlast;
    const u8* ra = icache + (oka ? s_slot(bt, bt_off, seq, page, ja) : 0u) * di * VB + (u64)lt * span * VB;
    const u8* rc = icache + (okc ? s_slot(bt, bt_off, seq, page, jc) : 0u) * di * VB + (u64)lt * span * VB;
#pragma unroll
    for (u32 c = 0; c < MAXC; ++c) {
      ka[c] = kc[c] = make_uint4(0u, 0u, 0u, 0u);
      if (c < nch) {
        if (oka) ka[c] = reinterpret_cast<const uint4*>(ra)[c];
        if (okc) kc[c] = reinterpret_cast<const uint4*>(rc)[c];
      }
    }
  };
  auto scored = [&](u32 b) { return !(b < init_b || b + local_b >= nb); };
  auto last_key = [&](u32 b) { return p < b * B + B - 1u ? p : b * B + B - 1u; };
  // the first block's first tile before the wait, when no row of this step
  // writes into that block (uniform over the CTA: the flag)
  bool pre = false;
  {
    const u32 b0 = blockIdx.x;
    if (prewait && scored(b0)) {
      const u32 j0 = b0 * B, j1 = last_key(b0);
      if (tid == 0u) *flag = 0u;
      __syncthreads();
      for (u32 r = tid; r < T; r += blockDim.x)
        if (row_seq[r] == seq && pos[r] >= j0 && pos[r] <= j1) *flag = 1u;
      __syncthreads();
      pre = *reinterpret_cast<volatile u32*>(flag) == 0u;
      if (pre && grp < (j1 - j0) / 16u + 1u) load_tile(b0, grp, j1);
    }
  }
  M3_PDL_WAIT();
  // q head lg's values lt span .. + span - 1 as bf16 pairs (zero past nih)
  u32 qf[MAXC][VPC / 2];
#pragma unroll
  for (u32 c = 0; c < MAXC; ++c)
#pragma unroll
    for (u32 i = 0; i < VPC / 2; ++i) qf[c][i] = 0u;
  if (lg < nih) {
    const u16* qr = iq + ((u64)t * nih + lg) * di + (u64)lt * span;
#pragma unroll
    for (u32 c = 0; c < MAXC; ++c) {
      if (c >= nch) break;
#pragma unroll
      for (u32 h = 0; h < VPC / 8u; ++h) {
        const uint4 v = reinterpret_cast<const uint4*>(qr + VPC * c)[h];
        qf[c][4u * h] = v.x; qf[c][4u * h + 1u] = v.y; qf[c][4u * h + 2u] = v.z; qf[c][4u * h + 3u] = v.w;
      }
    }
  }
  for (u32 b = blockIdx.x; b < nb; b += gridDim.x) {  // uniform over the CTA
    float* out = scores + (u64)t * selh * maxnb + b;
    if (!scored(b)) {
      for (u32 h = tid; h < selh; h += blockDim.x) out[(u64)h * maxnb] = S_INF;
      continue;
    }
    const u32 jb = b * B, jlast = last_key(b);  // keys jb ..= jlast
    const u32 ntile = (jlast - jb) / 16u + 1u;
    // running max of heads 2lt, 2lt + 1 over this lane's keys
    float m0 = -S_INF, m1 = -S_INF;
    for (u32 tile = grp; tile < ntile; tile += ngrp) {
      if (!(pre && b == blockIdx.x && tile == grp)) load_tile(b, tile, jlast);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (u32 c = 0; c < MAXC; ++c) {
        if (c >= nch) break;  // uniform
        const u32 wa[4] = {ka[c].x, ka[c].y, ka[c].z, ka[c].w}, wc[4] = {kc[c].x, kc[c].y, kc[c].z, kc[c].w};
#pragma unroll
        for (u32 s = 0; s < VPC / 4u; ++s) {  // k-steps of the chunk: values 4s .. 4s + 3
          u32 a[4];
          if constexpr (BF) {
            a[0] = wa[2u * s]; a[2] = wa[2u * s + 1u];
            a[1] = wc[2u * s]; a[3] = wc[2u * s + 1u];
          } else {
            a[0] = m3_e4m3x2_bf16x2(wa[s]); a[2] = m3_e4m3x2_bf16x2(wa[s] >> 16);
            a[1] = m3_e4m3x2_bf16x2(wc[s]); a[3] = m3_e4m3x2_bf16x2(wc[s] >> 16);
          }
          m3_mma_bf16_16816(acc, a, qf[c][2u * s], qf[c][2u * s + 1u]);
        }
      }
      // acc: keys ja (0, 1) and jc (2, 3) against heads 2lt, 2lt + 1
      const u32 ja = jb + 16u * tile + lg;
      if (ja <= jlast) { m0 = si_max(m0, acc[0] * iscale); m1 = si_max(m1, acc[1] * iscale); }
      if (ja + 8u <= jlast) { m0 = si_max(m0, acc[2] * iscale); m1 = si_max(m1, acc[3] * iscale); }
    }
    // max over the group's keys (lanes of the same lt), then over groups
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      m0 = si_max(m0, M3_SHFL_XOR32(m0, o));
      m1 = si_max(m1, M3_SHFL_XOR32(m1, o));
    }
    if (lg == 0u) {
      red[2u * lt][grp] = m0;
      red[2u * lt + 1u][grp] = m1;
    }
    __syncthreads();
    if (tid < selh) {
      float v = -S_INF;
      // shared selection: the max over every index head too
      const u32 h0 = shared_sel ? 0u : tid, h1 = shared_sel ? nih : tid + 1u;
      for (u32 h = h0; h < h1; ++h)
        for (u32 w = 0; w < ngrp; ++w) v = si_max(v, red[h][w]);
      out[(u64)tid * maxnb] = v;
    }
    __syncthreads();  // red is rewritten by the next block
  }
}

/// See si_scores. cache_kind (S_CACHE_*): what the index cache holds
/// (`m3s_index_scores`: bf16 or fp8, uniform over the grid, so the CTA
/// takes one instantiation; `m3s_index_scores_nv`: NVFP4, iscales its block
/// scales, unused by the other). prewait: 1 lets the tensor-core body load
/// its first tile before the dependency wait (si_scores_mma); each body
/// waits itself.
#define SI_ENTRY(name, DISPATCH)                                                                                     \
  M3_KERNEL void M3_HIP_BLOCK(SI_THREADS)                                                                            \
      name(const u16* __restrict__ iq, u32 nih, u32 di, const u8* __restrict__ icache,                               \
           const u8* __restrict__ iscales, float iscale, const u32* __restrict__ pos,                                \
           const u32* __restrict__ row_seq, const u32* __restrict__ bt, const u32* __restrict__ bt_off, u32 page,     \
           u32 B, u32 K, u32 init_b, u32 local_b, u32 shared_sel, u32 nkv, float* __restrict__ scores, u32 maxnb,    \
           u32 cache_kind, u32 prewait) {                                                                           \
    M3_PDL_TRIGGER();                                                                                               \
    S_SMEM_SCOPE; S_SHARED(float4, qs4, [SI_MAXH * SI_MAXD / 4]); /* float4: 16-byte aligned */                      \
    S_SHARED(float, red, [SI_MAXH][SI_THREADS / 32]); /* a column a 32-thread group (or wave) */                    \
    S_SHARED(u32, flag, [1]);                                                                                       \
    DISPATCH;                                                                                                       \
  }
/* launched with PDL: the scalar body reads nothing before the wait */
#define SI_CALL(CK)                                                                                                  \
  do {                                                                                                               \
    M3_PDL_WAIT();                                                                                                   \
    si_scores<CK>(iq, nih, di, icache, iscales, iscale, pos, row_seq, bt, bt_off, page, B, K, init_b, local_b,    \
                  shared_sel, nkv, scores, maxnb, qs4, red);                                                        \
  } while (0)
#define SI_MMA_CALL(CK)                                                                                              \
  si_scores_mma<CK>(iq, nih, di, icache, iscale, pos, row_seq, bt, bt_off, page, B, K, init_b, local_b, shared_sel, \
                    nkv, scores, maxnb, red, flag, prewait)
// tensor cores where a lane's share of a key row is whole 16-byte chunks
// (fp8: di a multiple of 64), else the scalar body
SI_ENTRY(m3s_index_scores, if (cache_kind == S_CACHE_BF16) SI_MMA_CALL(S_CACHE_BF16);
         else if (di % 64u == 0u) SI_MMA_CALL(S_CACHE_FP8); else SI_CALL(S_CACHE_FP8))
SI_ENTRY(m3s_index_scores_nv, S_NV_ONLY(SI_CALL(S_CACHE_NVFP4)))
#undef SI_CALL
#undef SI_MMA_CALL
#undef SI_ENTRY

/// Sort key of block b with score v: higher score first, ties to the lower
/// id (-0 == +0); 0 (never a block's key) for NaN, which is never picked.
M3_DEV u64 sk_key(float v, u32 b) {
  if (v != v) return 0ull;
  if (v == 0.0f) v = 0.0f;
  const u32 u = m3_bits(v);
  const u32 ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((u64)ord << 32) | (u64)(~b);
}

/// Threads that scan the radix histogram (SK_RADIX_LANES of them, 256 /
/// SK_RADIX_LANES bins each; any warp width).
#define SK_RADIX_LANES 32

/// Count one key into bin `bin` of `hist` (when ok), called by every lane
/// of the warp. CUDA: the warp's lanes with the same bin add once (the
/// first pass puts most keys in one bin: 1025 same-address shared atomics
/// in a row otherwise); HIP: one atomic a key.
M3_DEV void sk_hist_add(u32* hist, u32 bin, bool ok) {
#if defined(M3_CUDA)
  const u32 peers = __match_any_sync(0xffffffffu, ok ? bin : 0xffffffffu);
  if (ok && (threadIdx.x % 32u) == (u32)(__ffs((int)peers) - 1)) atomicAdd(&hist[bin], (u32)__popc((int)peers));
#else
  if (ok) atomicAdd(&hist[bin], 1u);
#endif
}

/// A cut for the K largest of the nonzero keys sk_key(sc[b], b), b < nb
/// (keys are unique), into *kth for the whole CTA: the K-th largest key,
/// or a value between it and the next below; 0 when there are at most K
/// of them. So the K picks are the keys >= *kth. MSB first, 8 bits a pass:
/// each pass counts the keys that match the bits fixed so far by their
/// next byte (shared-memory histogram), then SK_RADIX_LANES threads find
/// the byte holding the wanted rank (a suffix sum by shuffles). When the
/// wanted key is the last of its byte's keys, every key of that byte is
/// taken and the cut is the prefix with the lower bytes 0 (distinct
/// scores: after 3-4 passes of the 6 a 1025-block row has). The key's low
/// word is ~b: its bytes above the block count's are all ones and skip
/// their passes (bench/tools/radix_model.py models the passes against a
/// sort). Every thread of the CTA calls it; part holds 4 words.
M3_DEV void sk_radix_kth(const float* sc, u32 nb, u32 K, u32 tid, u32* hist, u32* part, u64* kth) {
  constexpr u32 BPL = 256u / SK_RADIX_LANES;  // bins a scanning thread
  constexpr u32 BIN = 0u, TOTAL = 1u, ABOVE = 2u, COUNT = 3u;  // part's words
  // id bytes that vary: ~b for b < nb
  const u32 idb = nb <= 0x100u ? 1u : nb <= 0x10000u ? 2u : nb <= 0x1000000u ? 3u : 4u;
  u64 prefix = 0ull, mask = 0ull;
  for (u32 i = idb; i < 4u; ++i) {  // constant bytes: all ones in every key
    prefix |= 0xffull << (8u * i);
    mask |= 0xffull << (8u * i);
  }
  const u32 nbw = (nb + 31u) & ~31u;  // nb in whole 32-lane warps
  u32 want = K;  // rank (1-based) of the key sought among those matching
  for (int byte = 7; byte >= 0; --byte) {
    if (byte < 4 && (u32)byte >= idb) continue;
    const u32 sh = 8u * (u32)byte;
    for (u32 i = tid; i < 256u; i += SK_THREADS) hist[i] = 0u;
    __syncthreads();
    for (u32 b = tid; b < nbw; b += SK_THREADS) {  // whole warps
      const u64 key = b < nb ? sk_key(sc[b], b) : 0ull;
      sk_hist_add(hist, (u32)(key >> sh) & 0xffu, key != 0ull && (key & mask) == prefix);
    }
    __syncthreads();
    // thread l: the count of its bins, then the count above them (a suffix
    // sum over the scanning lanes); the one whose bins hold rank `want`
    // picks the byte
    if (tid < SK_RADIX_LANES) {
      u32 mine = 0u;
#pragma unroll
      for (u32 i = 0; i < BPL; ++i) mine += hist[BPL * tid + i];
      u32 incl = mine;  // lanes tid .. SK_RADIX_LANES - 1
#pragma unroll
      for (u32 o = 1; o < SK_RADIX_LANES; o <<= 1) {
        const u32 v = (u32)M3_SHFL32(incl, min(tid + o, SK_RADIX_LANES - 1u));
        if (tid + o < SK_RADIX_LANES) incl += v;
      }
      u32 above = incl - mine;
      if (byte == 7 && tid == 0u) part[TOTAL] = incl;  // every valid key
      if (above < want && above + mine >= want) {
        for (int i = (int)BPL - 1; i >= 0; --i) {
          const u32 c = hist[BPL * tid + (u32)i];
          if (above + c >= want) {
            part[BIN] = BPL * tid + (u32)i;
            part[COUNT] = c;
            break;
          }
          above += c;
        }
        part[ABOVE] = above;  // the matching keys above the byte
      }
    }
    __syncthreads();
    if (byte == 7 && part[TOTAL] <= K) {  // at most K valid keys: take them all
      if (tid == 0u) *kth = 0ull;
      __syncthreads();
      return;
    }
    const u32 d = part[BIN], above = part[ABOVE], count = part[COUNT];
    prefix |= (u64)d << sh;
    mask |= 0xffull << sh;
    want -= above;
    if (want == count) break;  // the byte's last key: all of its keys are taken
    __syncthreads();  // hist and part are rewritten by the next pass
  }
  __syncthreads();  // every thread has read part before it is reused
  if (tid == 0u) *kth = prefix;
  __syncthreads();
}

/// Top-K block selection of one (selection head, row). Grid (selh, T),
/// block SK_THREADS. nb = p/B + 1 blocks: nb <= K takes them all; else the
/// K best by (score desc, id asc) over the non-NaN scores of
/// m3s_index_scores (the same picks as K rounds of argmax): nb <=
/// SK_THREADS ranks every block in one pass; larger rows find the K-th
/// largest key by an MSB radix select (sk_radix_kth: a handful of
/// histogram passes; bench/NOTES.md session 21 runs 1-2 measured it
/// against K serial warp-argmax rounds, faster from 321 to 1025 blocks)
/// and take every key at or above it. The scores are only read (from
/// shared memory up to SK_SMEM blocks). Written ascending with -1 first
/// for picks short of K (fewer valid blocks), to sel [nkv][T][K] for the
/// KV heads the selection head covers.
M3_KERNEL void M3_HIP_BLOCK(SK_THREADS)
    m3s_index_topk(const float* __restrict__ scores, const u32* __restrict__ pos, u32 B, u32 K, u32 shared_sel,
                   u32 nkv, u32 T, u32 maxnb, int* __restrict__ sel) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();  // launched with PDL: nothing a step writes before this
  S_SMEM_SCOPE; S_SHARED(float, ssc, [SK_SMEM]);
  S_SHARED(int, chosen, [SK_MAXK]);  // picks by rank, -1 past the valid blocks
  const u32 gsel = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const u32 selh = gridDim.x;
  const u32 p = pos[t];
  const u32 nb = p / B + 1u;
  const u32 h0 = shared_sel ? 0u : gsel, h1 = shared_sel ? nkv : gsel + 1u;
  if (nb <= K) {
    for (u32 h = h0; h < h1; ++h)
      for (u32 k = tid; k < K; k += SK_THREADS) sel[((u64)h * T + t) * K + k] = k < nb ? (int)k : -1;
    return;
  }
  const float* gsc = scores + ((u64)t * selh + gsel) * maxnb;
  if (tid < K) chosen[tid] = -1;
  if (nb <= SK_THREADS) {
    // one block per thread: its rank among all blocks
    const float v = tid < nb ? gsc[tid] : m3_nan();
    ssc[tid] = v;
    __syncthreads();
    const u64 mine = sk_key(v, tid);
    if (mine != 0ull) {
      u32 rank = 0;
      for (u32 j = 0; j < nb; ++j) rank += sk_key(ssc[j], j) > mine ? 1u : 0u;
      if (rank < K) chosen[rank] = (int)tid;
    }
  } else {
    const float* sc = gsc;
    if (nb <= SK_SMEM) {
      for (u32 b = tid; b < nb; b += SK_THREADS) ssc[b] = gsc[b];
      sc = ssc;
    }
    S_SHARED(u32, hist, [256]);
    S_SHARED(u32, part, [4]);  // byte, valid keys, keys above, byte's keys; then the picks' count
    S_SHARED(u64, kth, [1]);
    __syncthreads();
    sk_radix_kth(sc, nb, K, tid, hist, part, kth);
    const u64 cut = *kth;  // 0: fewer than K valid keys, every valid one is taken
    if (tid == 0u) part[0] = 0u;
    __syncthreads();
    for (u32 b = tid; b < nb; b += SK_THREADS) {
      const u64 key = sk_key(sc[b], b);
      if (key != 0ull && key >= cut) chosen[atomicAdd(&part[0], 1u)] = (int)b;
    }
  }
  __syncthreads();
  // picks 0..n-1 by rank: the output is the K - n padding -1 first, then the
  // picks ascending (what sorting the rounds' choices gives)
  if (tid < K) {
    const int id = chosen[tid];
    u32 n = 0, below = 0;
    for (u32 k = 0; k < K; ++k) {
      const int o = chosen[k];
      n += o >= 0 ? 1u : 0u;
      below += (o >= 0 && o < id) ? 1u : 0u;
    }
    const u32 slot = id >= 0 ? K - n + below : tid - n;
    for (u32 h = h0; h < h1; ++h) sel[((u64)h * T + t) * K + slot] = id;
  }
}

// ---- attention (flash-decoding split over keys) ----------------------------
#define SA_THREADS 128   // m3s_attn_partial block size: 4 mma groups of 32 threads
#define SA_TILE 128      // keys per tile (32 per mma group)
#define SA_SPLIT 4       // m3s_attn_partial_split: parts of a selected block, one CTA each (tiles of SA_TILE / SA_SPLIT)
#define SA_MAXHG 16      // q heads per KV head (the mma's M = 16)
#ifndef SA_MAXD
#define SA_MAXD 256      // largest head dim (host-set smaller for a timing A/B: attn.rs)
#endif
#define SA_QS (SA_MAXD / 2 + 4)   // u32 (bf16 pairs) per q row in shared memory
#define SA_PS (SA_TILE + 8)       // floats per score row in shared memory
#define SA_KB 2                   // 32-wide d groups whose K codes are loaded at once (fp8; bf16: half)
#define SA_VG ((SA_MAXD / 32 + 3) / 4)  // 32-wide output d groups per mma group
#define SA_REC(d) ((d) + 4u)      // floats per partial: m, l, 2 pad, o[d] (16-byte aligned)

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

/// Two E4M3 codes (bits 0-7 of lo, of hi) as exact bf16 values packed in a
/// u32 (lo in the low half): every E4M3 value is a bf16 value.
M3_DEV u32 sa_e4m3x2_bf16(u32 lo, u32 hi) {
  return m3_e4m3x2_bf16x2((lo & 0xffu) | ((hi & 0xffu) << 8));
}
/// What a lane of an mma group loads of one cache row, per cache type:
/// K: the 8 values 32G + 8lt .. +7 of d group G (Q K^T), V: the 4 values
/// 32G + 4lg .. +3 (P V); and how they become mma B fragments. row(e): what
/// roff keeps for a row starting at value e (bytes for fp8 / bf16, values
/// for NVFP4, whose codes and scales sit at e / 2 and e / 16 of their two
/// buffers); ldk / ldv(cache, scales, row, i) load from value i of the row.
/// KB: d groups of K loaded at once; VS: 16-key steps of V loaded at once
/// (NVB batches per tile). bf16 rows are twice the bytes: half the d groups
/// / key steps per batch keep the registers of fp8.
template <int CK> struct SaCache;
template <> struct SaCache<S_CACHE_FP8> {  // E4M3 codes
  typedef uint2 K;
  typedef u32 V;
  static constexpr u32 KB = SA_KB, VS = SA_TILE / 16, NVB = 1;
  static __device__ __forceinline__ u64 row(u64 e) { return e; }
  static __device__ __forceinline__ K ldk(const u8* c, const u8*, u64 r, u32 i) {
    return *reinterpret_cast<const uint2*>(c + r + i);
  }
  static __device__ __forceinline__ K zk() { return make_uint2(0u, 0u); }
  static __device__ __forceinline__ V ldv(const u8* c, const u8*, u64 r, u32 i) {
    return *reinterpret_cast<const u32*>(c + r + i);
  }
  static __device__ __forceinline__ V zv() { return 0u; }
  /// k-step kk uses values 4kk .. 4kk+3: b0 <- 4kk, 4kk+1; b1 <- 4kk+2, 4kk+3
  static __device__ __forceinline__ void kfrag(K r, int kk, u32& b0, u32& b1) {
    const u32 w = kk ? r.y : r.x;
    b0 = m3_e4m3x2_bf16x2(w);
    b1 = m3_e4m3x2_bf16x2(w >> 16);
  }
  /// n-tile n: value n of keys r = 0, 1 (b0) and r = 2, 3 (b1)
  static __device__ __forceinline__ void vfrag(const V* v, int n, u32& b0, u32& b1) {
    const u32 sh = 8u * (u32)n;
    b0 = sa_e4m3x2_bf16(v[0] >> sh, v[1] >> sh);
    b1 = sa_e4m3x2_bf16(v[2] >> sh, v[3] >> sh);
  }
};
template <> struct SaCache<S_CACHE_BF16> {  // bf16 bits: already bf16 operands
  typedef uint4 K;
  typedef uint2 V;
  static constexpr u32 KB = SA_KB / 2, VS = SA_TILE / 32, NVB = 2;
  static __device__ __forceinline__ u64 row(u64 e) { return 2u * e; }
  static __device__ __forceinline__ K ldk(const u8* c, const u8*, u64 r, u32 i) {
    return *reinterpret_cast<const uint4*>(c + r + 2u * i);
  }
  static __device__ __forceinline__ K zk() { return make_uint4(0u, 0u, 0u, 0u); }
  static __device__ __forceinline__ V ldv(const u8* c, const u8*, u64 r, u32 i) {
    return *reinterpret_cast<const uint2*>(c + r + 2u * i);
  }
  static __device__ __forceinline__ V zv() { return make_uint2(0u, 0u); }
  static __device__ __forceinline__ void kfrag(K r, int kk, u32& b0, u32& b1) {
    b0 = kk ? r.z : r.x;
    b1 = kk ? r.w : r.y;
  }
  /// value n = half n & 1 of word n >> 1; lower key in the low half
  static __device__ __forceinline__ void vfrag(const V* v, int n, u32& b0, u32& b1) {
    const u32 a0 = n & 2 ? v[0].y : v[0].x, a1 = n & 2 ? v[1].y : v[1].x;
    const u32 a2 = n & 2 ? v[2].y : v[2].x, a3 = n & 2 ? v[3].y : v[3].x;
    b0 = n & 1 ? (a0 >> 16) | (a1 & 0xffff0000u) : (a0 & 0xffffu) | (a1 << 16);
    b1 = n & 1 ? (a2 >> 16) | (a3 & 0xffff0000u) : (a2 & 0xffffu) | (a3 << 16);
  }
};
template <> struct SaCache<S_CACHE_NVFP4> {  // packed E2M1 codes + E4M3 block scales
  /// x: the 8 codes (nibble i = value i), y: their block's scale byte (8
  /// values at a multiple of 8 never straddle a block of 16)
  typedef uint2 K;
  /// bits 0-15: the 4 codes, 16-23: their block's scale byte
  typedef u32 V;
  static constexpr u32 KB = SA_KB, VS = SA_TILE / 16, NVB = 1;
  static __device__ __forceinline__ u64 row(u64 e) { return e; }
  static __device__ __forceinline__ K ldk(const u8* c, const u8* sc, u64 r, u32 i) {
    const u64 e = r + i;  // a multiple of 8: 4-byte aligned codes
    return make_uint2(*reinterpret_cast<const u32*>(c + e / 2u), (u32)sc[e / 16u]);
  }
  static __device__ __forceinline__ K zk() { return make_uint2(0u, 0u); }
  static __device__ __forceinline__ V ldv(const u8* c, const u8* sc, u64 r, u32 i) {
    const u64 e = r + i;  // a multiple of 4: 2-byte aligned codes
    return (u32)*reinterpret_cast<const u16*>(c + e / 2u) | ((u32)sc[e / 16u] << 16);
  }
  static __device__ __forceinline__ V zv() { return 0u; }
  /// k-step kk uses values 4kk .. 4kk+3 (nibbles 4kk ..): each e2m1 * s as
  /// an exact bf16 value (m3_nvfp4_bf16); the tensor's global scale
  /// multiplies the f32 scores (ks), as fp8's scale does
  static __device__ __forceinline__ void kfrag(K r, int kk, u32& b0, u32& b1) {
    const float s = m3_e4m3_fast(r.y);
    const u32 w = r.x >> (16 * kk);
    b0 = m3_nvfp4_bf16(w, s) | (m3_nvfp4_bf16(w >> 4, s) << 16);
    b1 = m3_nvfp4_bf16(w >> 8, s) | (m3_nvfp4_bf16(w >> 12, s) << 16);
  }
  /// n-tile n: value n of keys r = 0, 1 (b0) and r = 2, 3 (b1), each with
  /// its own row's block scale
  static __device__ __forceinline__ void vfrag(const V* v, int n, u32& b0, u32& b1) {
    const u32 sh = 4u * (u32)n;
    u32 h[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) h[r] = m3_nvfp4_bf16(v[r] >> sh, m3_e4m3_fast(v[r] >> 16));
    b0 = h[0] | (h[1] << 16);
    b1 = h[2] | (h[3] << 16);
  }
};

/// V values of d group G for 16-key steps s0 .. s0 + VS - 1 of the tile:
/// keys 16s + 2lt, +1, +8, +9 (r = 0..3), values 32G + 4lg .. +3.
template <int CK>
M3_DEV void sa_load_v(typename SaCache<CK>::V (&vraw)[SaCache<CK>::VS][4], const u8* __restrict__ vc,
                      const u8* __restrict__ vsc, const u64* roff, u32 G, u32 ng, u32 s0, u32 nk, u32 lt, u32 lg) {
#pragma unroll
  for (int si = 0; si < (int)SaCache<CK>::VS; ++si)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const u32 key = 16u * (s0 + (u32)si) + 2u * lt + (u32)(r & 1) + 8u * (u32)(r >> 1);
      vraw[si][r] = (G < ng && key < nk) ? SaCache<CK>::ldv(vc, vsc, roff[key], 32u * G + 4u * lg) : SaCache<CK>::zv();
    }
}

/// f32 pair as three bf16 pairs: x = hi + mid + lo to ~2^-25 relative (f32
/// grade), so P V on bf16 tensor cores keeps f32 weights.
M3_DEV void sa_split_bf16(float x0, float x1, u32& hi, u32& mid, u32& lo) {
  hi = m3_pack_bf16x2(x0, x1);
  const float r0 = x0 - m3_f32(hi << 16), r1 = x1 - m3_f32(hi & 0xffff0000u);
  mid = m3_pack_bf16x2(r0, r1);
  lo = m3_pack_bf16x2(r0 - m3_f32(mid << 16), r1 - m3_f32(mid & 0xffff0000u));
}

/// Partial attention of all hg = nh/nkv q heads of KV head g over one chunk
/// of keys. Grid (max_chunks, nkv, T), block SA_THREADS. Chunk c (sparse,
/// SPLIT >= 1, sel != 0): part c % SPLIT of selected block sel[g][t][c /
/// SPLIT] (its keys b*B .. b*B+B-1 in SPLIT parts of ceil(B / SPLIT)), or
/// (SPLIT 0) keys [c*CK, c*CK+CK) with CK = SA_TILE * sa_tiles_per_chunk
/// (full layers), clipped to j <= p. Tiles of SA_TILE / SPLIT keys
/// (SA_TILE for full layers); per tile: S = Q K^T on tensor
/// cores (m16n8k16 bf16, q heads as M, exact: q is bf16 and every E4M3 code
/// or bf16 cache value is a bf16 value; the scales multiply the f32
/// results), each mma group a quarter of the tile's keys
/// in n-tiles of 8; an online softmax per head in f32; O += P V on
/// tensor cores with P split into bf16 hi + mid + lo (three products,
/// ~2^-25 relative), one mma group per 32-wide d group. Writes per head the chunk
/// max m, the sum l of exp(s - m) and the unnormalised o[d] to
/// part [T][nkv][max_chunks][hg][d + 4] (m, l, pad, pad, o); an empty chunk
/// writes m = -INF, l = 0 (o untouched: the combine skips it).
/// Caches [slot][nkv][d]: E4M3 codes, bf16 bits (S_CACHE_BF16; ks = vs =
/// 1), or NVFP4 codes [slot][nkv][d / 2] with block scales ksc / vsc
/// [slot][nkv][d / 16] (S_CACHE_NVFP4; ks, vs the global scales).
/// VG: 32-wide output d groups an mma group holds (SA_VG for any d up to
/// SA_MAXD; 1 for d <= 128, the `_d128` entries: fewer registers, the same
/// products in the same order, so the same bits).
template <int CK, int SPLIT, int VG = SA_VG>
M3_DEV void sa_partial(const u16* __restrict__ q, u32 nh, u32 nkv, u32 d, const u8* __restrict__ kc,
                       const u8* __restrict__ vc, const u8* __restrict__ ksc, const u8* __restrict__ vsc, float ks,
                       float vs, const u32* __restrict__ pos,
                       const u32* __restrict__ row_seq, const u32* __restrict__ bt, const u32* __restrict__ bt_off,
                       u32 page, const int* __restrict__ sel, u32 K, u32 B, u32 T, float* __restrict__ part,
                       u32 max_chunks, float sscale, uint4* qs4, float* sp, u64* roff, float* hm, float* hl,
                       float* hc) {
  typedef SaCache<CK> C;
  if constexpr (CK == S_CACHE_BF16) S_PATH_MARK("m3s_attn_partial: bf16 cache");
  else if constexpr (CK == S_CACHE_NVFP4) S_PATH_MARK("m3s_attn_partial: nvfp4 cache");
  else S_PATH_MARK("m3s_attn_partial: fp8 cache");
  u32* qs = reinterpret_cast<u32*>(qs4);  // q [16][d] as bf16 pairs, rows >= hg zero
  const u32 c = blockIdx.x, g = blockIdx.y, t = blockIdx.z, tid = threadIdx.x;
  const u32 hg = nh / nkv;
  const u32 p = pos[t], seq = row_seq[t];
  u64 j0 = 0, jend = 0;  // keys [j0, jend)
  // keys per tile: split sparse chunks are parts of a block (more,
  // shorter CTAs: bench/NOTES.md session 7)
  constexpr u32 tk = SPLIT > 0 ? SA_TILE / (u32)SPLIT : SA_TILE;
  if constexpr (SPLIT > 0) {
    // chunk c is part c % SPLIT of selected block c / SPLIT
    constexpr u32 S = (u32)SPLIT;
    if (c >= K * S) return;
    const int b = sel[((u64)g * T + t) * K + c / S];
    if (b >= 0) {
      const u64 sub = (B + S - 1u) / S, bend = (u64)b * B + B;
      j0 = (u64)b * B + (u64)(c % S) * sub;
      jend = j0 + sub;
      if (jend > bend) jend = bend;
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
  // q rows of the group as bf16 pairs (exact), zero rows past hg
  // (16-byte loads, all issued together: d is a multiple of 32)
  {
    const u32 d8 = d / 8u;
    const uint4* qr = reinterpret_cast<const uint4*>(q + ((u64)t * nh + (u64)g * hg) * d);
#pragma unroll
    for (int r = 0; r < SA_MAXHG * SA_MAXD / 8 / SA_THREADS; ++r) {
      const u32 i = tid + (u32)r * SA_THREADS;
      const u32 h = i / d8, x = i % d8;
      if (h < SA_MAXHG) {
        uint4 v;
        v.x = v.y = v.z = v.w = 0u;
        if (h < hg) v = qr[i];
        *reinterpret_cast<uint4*>(qs + h * SA_QS + 4u * x) = v;
      }
    }
  }
  if (tid < SA_MAXHG) { hm[tid] = -S_INF; hl[tid] = 0.0f; }
  const u32 grp = tid / 32u, l32 = tid % 32u, lg = l32 / 4u, lt = l32 % 4u;
  const u32 ng = d / 32u;  // 32-wide d groups
  float o[VG][4][4];  // [d group][n-tile][c0..c3] of O rows lg, lg + 8
#pragma unroll
  for (int v = 0; v < VG; ++v)
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[v][n][e] = 0.0f;
  // S = Q K^T: mma group grp takes keys kpg grp .. + kpg - 1 of a tile,
  // in nt n-tiles of 8
  constexpr u32 kpg = tk / 4u, nt = kpg / 8u;
  for (u64 jt = j0; jt < jend; jt += tk) {
    const u32 nk = jend - jt < (u64)tk ? (u32)(jend - jt) : tk;
    if (jt != j0) __syncthreads();  // the previous tile's P and rows are read
    // byte offset of each key's row (g's d values)
    if (tid < nk) roff[tid] = C::row((s_slot(bt, bt_off, seq, page, (u32)(jt + tid)) * nkv + g) * d);
    __syncthreads();
    // V of the first d group's first key steps, loaded before S (latency)
    const u32 nsteps = (nk + 15u) / 16u;
    typename C::V vraw[C::VS][4];
    sa_load_v<CK>(vraw, vc, vsc, roff, grp, ng, 0u, nk, lt, lg);
    // 1. S = Q K^T: this group's keys kpg grp + 8 n + col; lane (lg, lt) loads
    //    key col = lg, d values 32G + 8lt .. +7 (k-step kk uses values
    //    4kk..4kk+3: slots 2lt, 2lt+1 <- values 0,1 and 2lt+8, 2lt+9 <-
    //    values 2,3; the q fragments use the same d order)
    float sacc[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[n][e] = 0.0f;
    for (u32 G0 = 0; G0 < ng; G0 += C::KB) {
      typename C::K kraw[4][C::KB];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const u32 key = kpg * grp + 8u * (u32)n + lg;
#pragma unroll
        for (int gi = 0; gi < (int)C::KB; ++gi) {
          const u32 G = G0 + (u32)gi;
          kraw[n][gi] = ((u32)n < nt && G < ng && key < nk) ? C::ldk(kc, ksc, roff[key], 32u * G + 8u * lt) : C::zk();
        }
      }
#pragma unroll
      for (int gi = 0; gi < (int)C::KB; ++gi) {
        const u32 G = G0 + (u32)gi;
        if (G >= ng) break;  // uniform over the CTA
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const u32 qi = 16u * G + 4u * lt + 2u * (u32)kk;
          u32 a[4];
          a[0] = qs[lg * SA_QS + qi];
          a[2] = qs[lg * SA_QS + qi + 1u];
          a[1] = qs[(lg + 8u) * SA_QS + qi];
          a[3] = qs[(lg + 8u) * SA_QS + qi + 1u];
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            if ((u32)n >= nt) break;  // uniform over the CTA
            u32 b0, b1;
            C::kfrag(kraw[n][gi], kk, b0, b1);
            m3_mma_bf16_16816(sacc[n], a, b0, b1);
          }
        }
      }
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      if ((u32)n >= nt) break;  // uniform over the CTA
      const u32 col = kpg * grp + 8u * (u32)n + 2u * lt;
      sp[lg * SA_PS + col] = sacc[n][0] * sscale;
      sp[lg * SA_PS + col + 1u] = sacc[n][1] * sscale;
      sp[(lg + 8u) * SA_PS + col] = sacc[n][2] * sscale;
      sp[(lg + 8u) * SA_PS + col + 1u] = sacc[n][3] * sscale;
    }
    __syncthreads();
    // 2. online softmax: 8 threads per head, keys sub + 8i (every thread
    //    takes part in the shuffles; rows past hg get P = 0)
    {
      const u32 h = tid / 8u, sub = tid % 8u;
      const bool live = h < hg;
      float* row = sp + h * SA_PS;
      float mt = -S_INF;
      if (live)
        for (u32 k2 = sub; k2 < nk; k2 += 8u) mt = si_max(mt, row[k2]);
      mt = si_max(mt, M3_SHFL_XOR(mt, 1));
      mt = si_max(mt, M3_SHFL_XOR(mt, 2));
      mt = si_max(mt, M3_SHFL_XOR(mt, 4));
      const float mo = hm[h];
      const float mn = si_max(mo, mt);
      // all scores -INF so far: nothing to weigh (keeps exp(-INF - -INF) out)
      const bool none = !live || mn == -S_INF;
      const float corr = none ? 1.0f : expf(mo - mn);
      float ls = 0.0f;
      for (u32 k2 = sub; k2 < tk; k2 += 8u) {
        const float e = (none || k2 >= nk) ? 0.0f : expf(row[k2] - mn);
        row[k2] = e;
        ls += e;
      }
      ls += M3_SHFL_XOR(ls, 1);
      ls += M3_SHFL_XOR(ls, 2);
      ls += M3_SHFL_XOR(ls, 4);
      if (sub == 0u) {
        if (live) {
          hm[h] = mn;
          hl[h] = hl[h] * corr + ls;
        }
        hc[h] = corr;
      }
    }
    __syncthreads();
    // 3. O += P V: group grp owns d groups grp, grp + 4, ...; n-tile nt of d
    //    group G has columns 32G + 4 col + nt, so lane (lg, lt) reads values
    //    32G + 4lg .. +3 of its four key rows (one per n-tile); the key
    //    steps in C::NVB batches of C::VS
    const float c0 = hc[lg], c1 = hc[lg + 8u];
#pragma unroll
    for (int v = 0; v < VG; ++v)
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        o[v][n][0] *= c0;
        o[v][n][1] *= c0;
        o[v][n][2] *= c1;
        o[v][n][3] *= c1;
      }
#pragma unroll
    for (int v = 0; v < VG; ++v) {
      const u32 G = grp + 4u * (u32)v;
      if (4u * (u32)v >= ng) break;  // uniform over the CTA
#pragma unroll
      for (int hb = 0; hb < (int)C::NVB; ++hb) {
        const u32 s0 = (u32)hb * C::VS;
        if (s0 >= nsteps) break;  // uniform over the CTA
        if (v > 0 || hb > 0) sa_load_v<CK>(vraw, vc, vsc, roff, G, ng, s0, nk, lt, lg);
#pragma unroll
        for (int si = 0; si < (int)C::VS; ++si) {
          const u32 s = s0 + (u32)si;
          if (s >= nsteps) break;  // uniform over the CTA
          const u32 k0 = 16u * s + 2u * lt;
          u32 ahi[4], amid[4], alo[4];
          sa_split_bf16(sp[lg * SA_PS + k0], sp[lg * SA_PS + k0 + 1u], ahi[0], amid[0], alo[0]);
          sa_split_bf16(sp[(lg + 8u) * SA_PS + k0], sp[(lg + 8u) * SA_PS + k0 + 1u], ahi[1], amid[1], alo[1]);
          sa_split_bf16(sp[lg * SA_PS + k0 + 8u], sp[lg * SA_PS + k0 + 9u], ahi[2], amid[2], alo[2]);
          sa_split_bf16(sp[(lg + 8u) * SA_PS + k0 + 8u], sp[(lg + 8u) * SA_PS + k0 + 9u], ahi[3], amid[3], alo[3]);
#pragma unroll
          for (int n = 0; n < 4; ++n) {
            u32 b0, b1;
            C::vfrag(vraw[si], n, b0, b1);
            m3_mma_bf16_16816(o[v][n], ahi, b0, b1);
            m3_mma_bf16_16816(o[v][n], amid, b0, b1);
            m3_mma_bf16_16816(o[v][n], alo, b0, b1);
          }
        }
      }
    }
  }
  __syncthreads();
  for (u32 h = tid; h < hg; h += blockDim.x) {
    rec[(u64)h * R] = hm[h];
    rec[(u64)h * R + 1u] = hl[h];
  }
  // o columns 32G + 8lt + nt (c0 / c2) and 32G + 8lt + 4 + nt (c1 / c3)
#pragma unroll
  for (int v = 0; v < VG; ++v) {
    const u32 G = grp + 4u * (u32)v;
    if (G >= ng) break;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const u32 h = lg + 8u * (u32)half;
      if (h >= hg) continue;
      float* dst = rec + (u64)h * R + 4u + 32u * G + 8u * lt;
      float4 lo4, hi4;
      lo4.x = o[v][0][2 * half] * vs;
      lo4.y = o[v][1][2 * half] * vs;
      lo4.z = o[v][2][2 * half] * vs;
      lo4.w = o[v][3][2 * half] * vs;
      hi4.x = o[v][0][2 * half + 1] * vs;
      hi4.y = o[v][1][2 * half + 1] * vs;
      hi4.z = o[v][2][2 * half + 1] * vs;
      hi4.w = o[v][3][2 * half + 1] * vs;
      *reinterpret_cast<float4*>(dst) = lo4;
      *reinterpret_cast<float4*>(dst + 4) = hi4;
    }
  }
}

#if defined(M3_CUDA)
// CTAs an SM the partials are built for (launch bounds: 4 is <= 128
// registers); SA_MINB_SPLIT / SA_MINB_SPARSE for the split and sparse
// entries alone (default SA_MINB). Host-set for a timing A/B
// (`M3_ATTN_DEFINES`, attn.rs `AttnKernels::load`).
#ifndef SA_MINB
#define SA_MINB 4
#endif
#ifndef SA_MINB_SPLIT
#define SA_MINB_SPLIT SA_MINB
#endif
#ifndef SA_MINB_SPARSE
#define SA_MINB_SPARSE SA_MINB
#endif
// The `_d128` entries (d <= 128: one output d group an mma group): the
// split partial at 6 CTAs an SM (77 registers, no spill; NVRTC 13.0), the
// sparse one at SA_MINB_SPARSE. H200 (bench/NOTES.md session 39, 2 rounds,
// ms a MoE layer against the plain partials): 6 -0.3 to -0.9% at b1 / b4 /
// b16, 4 -1.1 / -0.1 / -0.9%, 8 (64 registers, 52 / 68 B of spill) +1.6 /
// +2.8 / -0.9%.
#ifndef SA_MINB_SPLIT_D128
#define SA_MINB_SPLIT_D128 6
#endif
#ifndef SA_MINB_SPARSE_D128
#define SA_MINB_SPARSE_D128 SA_MINB_SPARSE
#endif
#define SA_BOUNDS_N(n) __launch_bounds__(SA_THREADS, n)
#else
// HIP: the block size only (without bounds a kernel is built for 1024-thread
// blocks, which caps a wave64 thread at 128 VGPRs: 1,530 spilled)
#define SA_BOUNDS_N(n) M3_HIP_BLOCK(SA_THREADS)
#endif
/// See sa_partial. cache_kind (S_CACHE_*): what the K and V caches hold;
/// ksc / vsc: NVFP4's block scales (unused otherwise). Uniform over the
/// grid, so the CTA takes one instantiation.
/// The entry points: full layers (sel == 0), sparse ones (sel != 0) a CTA a
/// selected block, and sparse ones a CTA a SA_SPLIT-th of a block (the
/// host's choice for small steps); separate kernels, not one branching,
/// since the bodies together in one kernel spill registers that none does
/// alone.
#define SA_CALL(CK, SP) SA_CALL_VG(CK, SP, SA_VG)
#define SA_CALL_VG(CK, SP, VG)                                                                                     \
  sa_partial<CK, SP, VG>(q, nh, nkv, d, kc, vc, ksc, vsc, ks, vs, pos, row_seq, bt, bt_off, page, sel, K, B, T, part,  \
                     max_chunks, sscale, qs4, sp, roff, hm, hl, hc)
#define SA_ENTRY(name, SP, DISPATCH, MINB)                                                                          \
  M3_KERNEL void SA_BOUNDS_N(MINB) name(const u16* __restrict__ q, u32 nh, u32 nkv, u32 d, const u8* __restrict__ kc,       \
                                const u8* __restrict__ vc, const u8* __restrict__ ksc, const u8* __restrict__ vsc,  \
                                float ks, float vs, const u32* __restrict__ pos, const u32* __restrict__ row_seq,   \
                                const u32* __restrict__ bt, const u32* __restrict__ bt_off, u32 page,               \
                                const int* __restrict__ sel, u32 K, u32 B, u32 T, float* __restrict__ part,         \
                                u32 max_chunks, u32 cache_kind) {                                                   \
    M3_PDL_TRIGGER();                                                                                               \
    M3_PDL_WAIT(); /* launched with PDL: nothing a step writes before this */                                      \
    S_SMEM_SCOPE; S_SHARED(uint4, qs4, [SA_MAXHG * SA_QS / 4]); /* q [16][d] as bf16 pairs, rows >= hg zero */      \
    S_SHARED(float, sp, [SA_MAXHG * SA_PS]); /* scores, then exp(s - m) (0 past the tile's keys) */                 \
    S_SHARED(u64, roff, [SA_TILE]); /* each key's K / V row (SaCache::row) */                                       \
    S_SHARED(float, hm, [SA_MAXHG]); S_SHARED(float, hl, [SA_MAXHG]); S_SHARED(float, hc, [SA_MAXHG]);              \
    /* score scale: K's dequantisation scale and 1/sqrt(d) (computed once, outside the bodies) */                  \
    const float sscale = ks / sqrtf((float)d);                                                                      \
    DISPATCH;                                                                                                       \
  }
// bf16 / fp8 caches (one branch a CTA), and NVFP4 ones (S_NV_ONLY)
#define SA_FP(SP) if (cache_kind == S_CACHE_BF16) SA_CALL(S_CACHE_BF16, SP); else SA_CALL(S_CACHE_FP8, SP)
SA_ENTRY(m3s_attn_partial, 0, SA_FP(0), SA_MINB)
SA_ENTRY(m3s_attn_partial_sparse, 1, SA_FP(1), SA_MINB_SPARSE)
SA_ENTRY(m3s_attn_partial_split, SA_SPLIT, SA_FP(SA_SPLIT), SA_MINB_SPLIT)
SA_ENTRY(m3s_attn_partial_nv, 0, S_NV_ONLY(SA_CALL(S_CACHE_NVFP4, 0)), SA_MINB)
SA_ENTRY(m3s_attn_partial_sparse_nv, 1, S_NV_ONLY(SA_CALL(S_CACHE_NVFP4, 1)), SA_MINB_SPARSE)
SA_ENTRY(m3s_attn_partial_split_nv, SA_SPLIT, S_NV_ONLY(SA_CALL(S_CACHE_NVFP4, SA_SPLIT)), SA_MINB_SPLIT)
// bf16 / fp8 caches with d <= 128 (the host's choice where the layer's d
// fits: attn.rs)
#define SA_FP1(SP) if (cache_kind == S_CACHE_BF16) SA_CALL_VG(S_CACHE_BF16, SP, 1); else SA_CALL_VG(S_CACHE_FP8, SP, 1)
SA_ENTRY(m3s_attn_partial_sparse_d128, 1, SA_FP1(1), SA_MINB_SPARSE_D128)
SA_ENTRY(m3s_attn_partial_split_d128, SA_SPLIT, SA_FP1(SA_SPLIT), SA_MINB_SPLIT_D128)
#undef SA_FP1
#undef SA_FP

#define SC_THREADS 128  // m3s_attn_combine block size
#define SC_UNROLL 16    // chunk loads issued together

/// Merge the chunk partials of q head i (KV head g = i / hg) of row t:
/// M = max m_c, out = sum exp(m_c - M) o_c / sum exp(m_c - M) l_c, 0 when
/// the row saw no key. Grid (nh, T), block SC_THREADS; out [T][nh][d] bf16,
/// and (xh not null) the rows also in the MX linears' f16 layout for the o
/// projection (s_xh_put: a warp's 32 values are one block, d a multiple of
/// 32), so that linear needs no m3s_x_f16 launch of its own.
/// The chunk weights go through shared memory, SC_THREADS chunks at a time,
/// so the o loads of all chunks are independent.
M3_KERNEL void M3_HIP_BLOCK(SC_THREADS)
    m3s_attn_combine(const float* __restrict__ part, u32 nh, u32 nkv, u32 d, const u32* __restrict__ pos, u32 sparse,
                     u32 K, u32 max_chunks, u16* __restrict__ out, u8* __restrict__ xh) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();  // launched with PDL: nothing a step writes before this
  S_SMEM_SCOPE; S_SHARED(float, red, [SC_THREADS / M3_WARP]);
  S_SHARED(float, wsm, [SC_THREADS]);
  const u32 i = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
  const u32 hg = nh / nkv, g = i / hg, h = i % hg;
  const u32 nch = sa_chunks(pos[t], sparse, K, max_chunks);
  const u32 R = SA_REC(d);
  const u64 cs = (u64)hg * R;  // floats between chunks
  const float* base = part + (((u64)t * nkv + g) * max_chunks * hg + h) * R;
  const u32 warp = tid / M3_WARP, lane = tid % M3_WARP, nw = SC_THREADS / M3_WARP;
  float M = -S_INF;
  for (u32 c = tid; c < nch; c += SC_THREADS) M = si_max(M, base[c * cs]);
#pragma unroll
  for (int o = M3_WARP / 2; o > 0; o >>= 1) M = si_max(M, M3_SHFL_XOR(M, o));
  if (lane == 0) red[warp] = M;
  __syncthreads();
  M = -S_INF;
  for (u32 w = 0; w < nw; ++w) M = si_max(M, red[w]);
  __syncthreads();  // red is reused for L
  float Lt = 0.0f;                      // this thread's chunks' weighted l
  float acc[SA_MAXD / SC_THREADS];      // o[x], x = tid + r * SC_THREADS
#pragma unroll
  for (int r = 0; r < SA_MAXD / SC_THREADS; ++r) acc[r] = 0.0f;
  for (u32 c0 = 0; c0 < nch; c0 += SC_THREADS) {
    const u32 c = c0 + tid;
    float w = 0.0f;
    if (c < nch && M != -S_INF) {
      const float mc = base[c * cs];
      if (mc != -S_INF) {
        w = expf(mc - M);
        Lt += w * base[c * cs + 1u];
      }
    }
    wsm[tid] = w;
    __syncthreads();
    const u32 n = nch - c0 < SC_THREADS ? nch - c0 : SC_THREADS;
#pragma unroll
    for (int r = 0; r < SA_MAXD / SC_THREADS; ++r) {
      const u32 x = tid + (u32)r * SC_THREADS;
      if (x < d) {
        const float* ox = base + (u64)c0 * cs + 4u + x;
        float a = acc[r];
        // SC_UNROLL chunks' loads in flight at once
        for (u32 cc = 0; cc < n; cc += SC_UNROLL) {
          float v[SC_UNROLL];
#pragma unroll
          for (int k = 0; k < SC_UNROLL; ++k) v[k] = cc + (u32)k < n ? ox[(u64)(cc + (u32)k) * cs] : 0.0f;
#pragma unroll
          for (int k = 0; k < SC_UNROLL; ++k) {
            if (cc + (u32)k >= n) break;
            const float w = wsm[cc + (u32)k];
            // a skipped chunk's o is not written: weigh it by nothing
            a += w != 0.0f ? w * v[k] : 0.0f;
          }
        }
        acc[r] = a;
      }
    }
    __syncthreads();
  }
  Lt = m3_warp_sum(Lt);
  if (lane == 0) red[warp] = Lt;
  __syncthreads();
  float L = 0.0f;
  for (u32 w = 0; w < nw; ++w) L += red[w];
  u16* orow = out + ((u64)t * nh + i) * d;
  const u32 K16 = nh * d;
  u8* xrow = xh ? xh + (u64)t * s_xh_stride(K16) : nullptr;
#pragma unroll
  for (int r = 0; r < SA_MAXD / SC_THREADS; ++r) {
    const u32 x = tid + (u32)r * SC_THREADS;
    if (x < d) {
      const u16 b = m3_bf16_from_f32(L > 0.0f ? acc[r] / L : 0.0f);
      orow[x] = b;
      if (xrow) s_xh_put(m3_bf16_to_f32(b), x % 32u, xrow, K16, (i * d + x) / 32u);
    }
  }
}
#endif  // !S_MMA_ONLY
