// Stochastic sampling on device, token for token the same as
// m3_core::sample::sample (whose module doc is the normative definition:
// candidates ordered by a 64-bit key, integer weights floor(exp(...) * 2^40)
// from a deterministic f64 exp, top_k / top_p cuts and the draw on integer
// sums, the uniform keyed by (seed, position)). This file does what
// m3_core::sample::radix emulates on the CPU: no sort, radix selects of
// 8 passes x 256 bins over the key, one thread block per row.
//
// Determinism: every sum is an integer sum (order-independent, so shared
// atomics are fine); the float work (one f64 subtraction, one division and
// the exp of m3sk_exp_det) uses the round-to-nearest intrinsics and the
// module is compiled with --fmad=false (KernelSource exact), so nothing is
// contracted into an FMA. Every constant is given as its f64 bits.

// Threads per block (one block per row); SAMPLE_KEYED_THREADS in
// gpu-mi350/src/sampling.rs.
#define M3SK_THREADS 1024
// Bins of one radix pass (8 key bits).
#define M3SK_BINS 256
// Private histogram copies (warp w adds to copy w % M3SK_COPIES), so that
// fewer threads collide on one shared atomic; folded before the scan.
#define M3SK_COPIES 8

// The three kinds of radix select.
#define M3SK_BY_COUNT 0
#define M3SK_TOP_P 1
#define M3SK_DRAW 2

/// One row's sampling parameters (RowSample in sampling.rs, 32 bytes).
struct M3RowSample {
  float temperature;  // NaN or <= 0: greedy (the row is skipped)
  u32 top_k;          // 0: no cut
  float top_p;        // >= 1 or NaN: no cut
  u32 pad0;
  u64 seed;
  u32 position;  // the key position of uniform_bits(seed, position)
  u32 pad1;
};

/// ord(x): f32 bits with the order of the floats, -0.0 as +0.0 (non-NaN x).
M3_DEV u32 m3sk_order(float x) {
  u32 b = m3_bits(x);
  if ((b & 0x7fffffffu) == 0u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b ^ 0x80000000u);
}
M3_DEV float m3sk_unorder(u32 o) { return m3_f32((o & 0x80000000u) ? (o ^ 0x80000000u) : ~o); }
/// (ord(x) << 32) | (0xFFFFFFFF - id): descending = logit descending, ties
/// by lower id.
M3_DEV u64 m3sk_key(float x, u32 id) { return ((u64)m3sk_order(x) << 32) | (u64)(0xffffffffu - id); }

/// 2^k from bits, -1022 <= k <= 1023.
M3_DEV double m3sk_pow2(int k) { return m3_f64((u64)(k + 1023) << 52); }

#define M3SK_HORNER(c) p = __dadd_rn(__dmul_rn(p, r), m3_f64(c))

/// m3_core::sample::exp_det, operation for operation.
M3_DEV double m3sk_exp_det(double x) {
  if (!(x >= -745.0)) return 0.0;
  if (x > 709.0) return m3_f64(0x7ff0000000000000ull);
  const double t = __dmul_rn(x, m3_f64(0x3ff71547652b82feull));  // LOG2E
  const int k = (int)__dadd_rn(t, t < 0.0 ? -0.5 : 0.5);  // truncates
  const double kf = (double)k;
  const double hi = __dsub_rn(x, __dmul_rn(kf, m3_f64(0x3fe62e42fee00000ull)));  // LN2_HI
  const double lo = __dmul_rn(kf, m3_f64(0x3dea39ef35793c76ull));  // LN2_LO
  const double r = __dsub_rn(hi, lo);
  double p = m3_f64(0x3de6124613a86d09ull);  // 1/13!
  M3SK_HORNER(0x3e21eed8eff8d898ull);  // 1/12!
  M3SK_HORNER(0x3e5ae64567f544e4ull);  // 1/11!
  M3SK_HORNER(0x3e927e4fb7789f5cull);  // 1/10!
  M3SK_HORNER(0x3ec71de3a556c734ull);  // 1/9!
  M3SK_HORNER(0x3efa01a01a01a01aull);  // 1/8!
  M3SK_HORNER(0x3f2a01a01a01a01aull);  // 1/7!
  M3SK_HORNER(0x3f56c16c16c16c17ull);  // 1/6!
  M3SK_HORNER(0x3f81111111111111ull);  // 1/5!
  M3SK_HORNER(0x3fa5555555555555ull);  // 1/4!
  M3SK_HORNER(0x3fc5555555555555ull);  // 1/3!
  M3SK_HORNER(0x3fe0000000000000ull);  // 1/2!
  M3SK_HORNER(0x3ff0000000000000ull);  // 1/1!
  M3SK_HORNER(0x3ff0000000000000ull);  // 1/0!
  if (k >= -1022) return __dmul_rn(p, m3sk_pow2(k));
  return __dmul_rn(__dmul_rn(p, m3sk_pow2(k + 1000)), m3sk_pow2(-1000));
}

/// m3_core::sample::relative_weight: 1 when l == m, else
/// exp_det((l - m) / t) in f64.
M3_DEV double m3sk_rel_weight(float l, float m, float t) {
  if (l == m) return 1.0;
  return m3sk_exp_det(__ddiv_rn(__dsub_rn((double)l, (double)m), (double)t));
}

/// floor(e * 2^40) (e in [0, 1]: the product is exact, truncation floors).
M3_DEV u64 m3sk_weight_of(double e) { return (u64)__dmul_rn(e, 1099511627776.0); }

/// SplitMix64 finalizer (m3_core::sample::mix64).
M3_DEV u64 m3sk_mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// m3_core::sample::uniform_bits: 53 random bits keyed by (seed, position).
M3_DEV u64 m3sk_uniform_bits(u64 seed, u32 position) {
  const u64 a = m3sk_mix64(seed ^ 0x6d335f73616d706cull);
  const u64 b = m3sk_mix64(a + (u64)position * 0x9e3779b97f4a7c15ull);
  return b >> 11;
}

/// round(max(top_p, 0) * 2^24) (only called when top_p < 1).
M3_DEV u64 m3sk_top_p_units(float top_p) {
  const double v = top_p > 0.0f ? (double)top_p : 0.0;
  return (u64)__dadd_rn(__dmul_rn(v, 16777216.0), 0.5);
}

/// max(1, ceil(total * p24 / 2^24)), exact through the 128-bit product.
M3_DEV u64 m3sk_top_p_target(u64 total, u64 p24) {
  const u64 lo = total * p24;
  u64 hi = __umul64hi(total, p24);
  const u64 lo2 = lo + 0xffffffull;
  if (lo2 < lo) hi += 1ull;
  const u64 t = (hi << 40) | (lo2 >> 24);
  return t > 0ull ? t : 1ull;
}

/// (u53 * total) >> 53, exact through the 128-bit product.
M3_DEV u64 m3sk_draw_point(u64 u53, u64 total) {
  return (__umul64hi(u53, total) << 11) | ((u53 * total) >> 53);
}

/// Shared memory of one block.
struct M3skShared {
  u64 hist[M3SK_COPIES * M3SK_BINS];  // the private copies of the bins
  u64 suf[M3SK_BINS];                 // folded bins, then their suffix sums
  u64 pick_bin;
  u64 pick_above;
  u32 omax;
  u32 count;
};

/// One radix select (m3_core::sample::radix::select): the largest key K*
/// such that the mass of the candidates with key >= max(lo, K*) reaches a
/// threshold. Mass: 1 per candidate (M3SK_BY_COUNT, threshold `param` =
/// top_k) or the weight (M3SK_TOP_P: threshold top_p_target(total,
/// p24 = `param`); M3SK_DRAW: threshold draw_point(U = `param`, total) + 1),
/// `total` being the mass of all candidates with key >= lo (the first pass's
/// bins). When `rel` is not null, the first pass stores every element's
/// relative weight there as f64 bits (0 for NaN and for keys below lo).
/// Every thread of the block calls it and gets K*.
M3_DEV u64 m3sk_select(M3skShared& sh, const float* __restrict__ row, u32 vocab, u64 lo, int kind,
                       u64 param, float m, float temp, u64* __restrict__ rel) {
  const u32 tid = threadIdx.x;
  u64* const mine = sh.hist + ((tid / M3_WARP) % M3SK_COPIES) * M3SK_BINS;
  u64 prefix = 0ull, mask = 0ull, above = 0ull, thr = 0ull;
  for (int pass = 0; pass < 8; ++pass) {
    const int shift = 56 - 8 * pass;
    for (u32 j = tid; j < M3SK_COPIES * M3SK_BINS; j += blockDim.x) sh.hist[j] = 0ull;
    if (tid == 0) {
      sh.pick_bin = 0ull;  // only read if no bin qualified (cannot happen)
      sh.pick_above = above;
    }
    __syncthreads();
    for (u32 i = tid; i < vocab; i += blockDim.x) {
      const float v = row[i];
      double e = 0.0;
      if (v == v) {
        const u64 k = m3sk_key(v, i);
        if (k >= lo && (k & mask) == prefix) {
          u64 mass = 1ull;
          if (kind != M3SK_BY_COUNT) {
            e = m3sk_rel_weight(v, m, temp);
            mass = m3sk_weight_of(e);
          }
          if (mass != 0ull) atomicAdd(&mine[(k >> shift) & 0xffull], mass);
        }
      }
      if (rel != nullptr && pass == 0) rel[i] = m3_bits64(e);
    }
    __syncthreads();
    if (tid < M3SK_BINS) {
      u64 s = 0ull;
      for (int c = 0; c < M3SK_COPIES; ++c) s += sh.hist[c * M3SK_BINS + tid];
      sh.suf[tid] = s;
    }
    __syncthreads();
    // Inclusive suffix scan: suf[b] = sum of the bins b..255.
    for (u32 off = 1; off < M3SK_BINS; off <<= 1) {
      u64 add = 0ull;
      if (tid + off < M3SK_BINS) add = sh.suf[tid + off];
      __syncthreads();
      if (tid < M3SK_BINS) sh.suf[tid] += add;
      __syncthreads();
    }
    if (pass == 0) {
      const u64 total = sh.suf[0];
      thr = kind == M3SK_BY_COUNT ? param
          : kind == M3SK_TOP_P    ? m3sk_top_p_target(total, param)
                                  : m3sk_draw_point(param, total) + 1ull;
    }
    // The one bin b with above + suf[b] >= thr > above + suf[b + 1] (the
    // running mass from the top first reaches the threshold in b).
    if (tid < M3SK_BINS) {
      const u64 s = above + sh.suf[tid];
      const u64 next = above + (tid + 1 < M3SK_BINS ? sh.suf[tid + 1] : 0ull);
      if (s >= thr && next < thr) {
        sh.pick_bin = tid;
        sh.pick_above = next;
      }
    }
    __syncthreads();
    prefix |= sh.pick_bin << shift;
    mask |= 0xffull << shift;
    above = sh.pick_above;
    __syncthreads();
  }
  return prefix;
}

/// One block of M3SK_THREADS per row (grid = nrows). For every row whose
/// params are not greedy, out[row] = m3_core::sample::sample(logits row,
/// params, position); greedy rows are left alone (the engine's m3_argmax ran
/// first and wrote every row). `scratch` may be null; if not, it holds
/// nrows * vocab u64 and receives, for each stochastic row, every element's
/// relative weight (m3_core::sample::relative_weight) as f64 bits, 0 for NaN
/// and for elements cut by top_k: a test hook to check the float work bit for
/// bit. vocab < 2^23 keeps every sum of weights below 2^63.
M3_KERNEL void __launch_bounds__(M3SK_THREADS)
    m3s_sample_keyed(const float* __restrict__ logits, u32 vocab, const M3RowSample* __restrict__ rows,
                     u32 nrows, u64* __restrict__ scratch, u32* __restrict__ out) {
  M3_PDL_TRIGGER();
  M3_PDL_WAIT();
  const u32 r = blockIdx.x;
  if (r >= nrows) return;
  const M3RowSample p = rows[r];
  if (!(p.temperature > 0.0f)) return;  // greedy (NaN too): m3_argmax's row
  __shared__ M3skShared sh;
  const float* const row = logits + (u64)r * vocab;
  u64* const rel = scratch != nullptr ? scratch + (u64)r * vocab : nullptr;
  const u32 tid = threadIdx.x;

  // Candidates (non-NaN) and ord of the largest logit.
  if (tid == 0) {
    sh.omax = 0u;
    sh.count = 0u;
  }
  __syncthreads();
  u32 omax = 0u, cnt = 0u;
  for (u32 i = tid; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v == v) {
      const u32 o = m3sk_order(v);
      omax = o > omax ? o : omax;
      cnt += 1u;
    }
  }
#pragma unroll
  for (int s = M3_WARP / 2; s > 0; s >>= 1) {
    const u32 oo = M3_SHFL_XOR(omax, s);
    omax = oo > omax ? oo : omax;
    cnt += M3_SHFL_XOR(cnt, s);
  }
  if (tid % M3_WARP == 0u) {
    atomicMax(&sh.omax, omax);
    atomicAdd(&sh.count, cnt);
  }
  __syncthreads();
  const u32 n = sh.count;
  if (n == 0u) {
    if (tid == 0) out[r] = 0u;
    if (rel != nullptr)
      for (u32 i = tid; i < vocab; i += blockDim.x) rel[i] = 0ull;
    return;
  }
  const float m = m3sk_unorder(sh.omax);
  const float t = p.temperature;

  u64 lo = 0ull;  // every candidate's key is > 0
  if (p.top_k > 0u && p.top_k < n) lo = m3sk_select(sh, row, vocab, 0ull, M3SK_BY_COUNT, p.top_k, m, t, nullptr);
  const bool cut = p.top_p < 1.0f;  // NaN does not cut
  if (cut) lo = m3sk_select(sh, row, vocab, lo, M3SK_TOP_P, m3sk_top_p_units(p.top_p), m, t, rel);
  const u64 ks = m3sk_select(sh, row, vocab, lo, M3SK_DRAW, m3sk_uniform_bits(p.seed, p.position), m, t,
                             cut ? nullptr : rel);
  if (tid == 0) out[r] = 0xffffffffu - (u32)ks;
}
