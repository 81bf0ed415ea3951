// Router selection (MODEL.md 3.10) on f32 router logits: s = sigmoid(z),
// top-k by s + bias (NaN as -inf, ties to the lower expert id), weights
// s_e / sum(s_chosen, ascending id) * scaling, ids ascending. One thread per
// row; `flags` is scratch [rows, ne].
M3_KERNEL void m3_router_select(const float* __restrict__ z, const float* __restrict__ bias, u32 ne, u32 top_k,
                                float scaling, u32 rows, i32* __restrict__ ids, float* __restrict__ w,
                                u8* __restrict__ flags) {
  u32 t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= rows) return;
  const float* zr = z + (u64)t * ne;
  u8* chosen = flags + (u64)t * ne;
  for (u32 e = 0; e < ne; ++e) chosen[e] = 0;
  const float ninf = m3_f32(0xff800000u);
  for (u32 r = 0; r < top_k; ++r) {
    i32 arg = -1;
    float bv = ninf;
    for (u32 e = 0; e < ne; ++e) {
      if (chosen[e]) continue;
      float v = 1.0f / (1.0f + expf(-zr[e])) + bias[e];
      if (v != v) v = ninf;
      if (arg < 0 || v > bv) {
        arg = (i32)e;
        bv = v;
      }
    }
    chosen[arg] = 1;
  }
  float sum = 0.0f;
  for (u32 e = 0; e < ne; ++e)
    if (chosen[e]) sum += 1.0f / (1.0f + expf(-zr[e]));
  u32 k = 0;
  for (u32 e = 0; e < ne; ++e) {
    if (!chosen[e]) continue;
    ids[(u64)t * top_k + k] = (i32)e;
    w[(u64)t * top_k + k] = (1.0f / (1.0f + expf(-zr[e]))) / sum * scaling;
    ++k;
  }
}

/// out[t] = sum over the row's experts in ascending id of f32(w_e * y_e) +
/// shared[t] (when has_shared). `src` [rows, top_k] gives, per chosen
/// expert (already ascending), the row of `y` holding its output. One thread
/// per (t, c).
M3_KERNEL void m3_moe_combine(const float* __restrict__ y, const u32* __restrict__ src, const float* __restrict__ w,
                              const float* __restrict__ shared, int has_shared, u32 rows, u32 top_k, u32 h,
                              float* __restrict__ out) {
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)rows * h) return;
  u64 t = i / h, c = i % h;
  float a = 0.0f;
  for (u32 k = 0; k < top_k; ++k) a += w[t * top_k + k] * y[(u64)src[t * top_k + k] * h + c];
  if (has_shared) a += shared[i];
  out[i] = a;
}
