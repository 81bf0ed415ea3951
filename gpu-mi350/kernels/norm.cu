// RMSNorm (Gemma: y = x / sqrt(mean(x^2) + eps) * (1 + w), f32) and partial
// NeoX RoPE (MODEL.md section 3, steps 1 and 4).

/// One block per row of width n; blockDim.x a multiple of M3_WARP, at most
/// 1024. Writes f32 `y` and, when `yb` is not null, its bf16 rounding.
M3_KERNEL void m3_rmsnorm(const float* __restrict__ x, const float* __restrict__ w, float eps,
                          float* __restrict__ y, u16* __restrict__ yb, u32 n) {
  __shared__ float part[1024 / M3_WARP];
  __shared__ float total;
  const float* xr = x + (u64)blockIdx.x * n;
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
  for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
    float v = (xr[i] / r) * (1.0f + w[i]);
    y[(u64)blockIdx.x * n + i] = v;
    if (yb) yb[(u64)blockIdx.x * n + i] = m3_bf16_from_f32(v);
  }
}

/// Partial NeoX RoPE over x [T, heads, d] (f32), positions [T]. For pair i <
/// rd/2: f_i = theta^(-2i/rd), angle p*f_i in f64 reduced mod 2pi in f64 (so
/// positions up to 2^20 keep their phase), then f32 sin/cos. Output bf16.
/// One thread per (row, head, i) with i < d - rd/2 (pairs, then pass-through).
M3_KERNEL void m3_rope_neox(const float* __restrict__ x, const u32* __restrict__ pos, double theta, u32 heads,
                            u32 d, u32 rd, u16* __restrict__ out, u32 T) {
  const u32 half = rd / 2u;
  const u32 per = d - half;  // work items per head
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (u64)T * heads * per) return;
  u64 th = i / per;
  u32 j = (u32)(i % per);
  u64 t = th / heads;
  const float* xh = x + th * d;
  u16* oh = out + th * d;
  if (j < half) {
    double f = pow(theta, -2.0 * (double)j / (double)rd);
    double a = (double)pos[t] * f;
    const double two_pi = 6.283185307179586476925286766559;
    a = a - two_pi * floor(a / two_pi);
    float c = cosf((float)a), s = sinf((float)a);
    float x0 = xh[j], x1 = xh[j + half];
    oh[j] = m3_bf16_from_f32(x0 * c - x1 * s);
    oh[j + half] = m3_bf16_from_f32(x1 * c + x0 * s);
  } else {
    u32 k = j + half;  // j in [half, d - half) -> k in [rd, d)
    oh[k] = m3_bf16_from_f32(xh[k]);
  }
}
