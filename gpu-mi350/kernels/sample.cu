// Greedy sampling on device: argmax per row, lowest id on ties, NaN never
// wins (an all-NaN row gives 0), as m3_core::sample::greedy.

#define M3_SAMPLE_THREADS 256

M3_DEV bool m3_better(float v, u32 i, int f, float bv, u32 bi, int bf) {
  if (!f) return false;
  if (!bf) return true;
  return v > bv || (v == bv && i < bi);
}

/// One block of M3_SAMPLE_THREADS per row.
M3_KERNEL void m3_argmax(const float* __restrict__ logits, u32 vocab, u32* __restrict__ out) {
  __shared__ float sv[M3_SAMPLE_THREADS];
  __shared__ u32 si[M3_SAMPLE_THREADS];
  __shared__ int sf[M3_SAMPLE_THREADS];
  const float* row = logits + (u64)blockIdx.x * vocab;
  float bv = 0.0f;
  u32 bi = 0;
  int bf = 0;
  for (u32 i = threadIdx.x; i < vocab; i += blockDim.x) {
    float v = row[i];
    if (v != v) continue;
    if (m3_better(v, i, 1, bv, bi, bf)) {
      bv = v;
      bi = i;
      bf = 1;
    }
  }
  sv[threadIdx.x] = bv;
  si[threadIdx.x] = bi;
  sf[threadIdx.x] = bf;
  __syncthreads();
  for (u32 s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      u32 o = threadIdx.x + s;
      if (m3_better(sv[o], si[o], sf[o], sv[threadIdx.x], si[threadIdx.x], sf[threadIdx.x])) {
        sv[threadIdx.x] = sv[o];
        si[threadIdx.x] = si[o];
        sf[threadIdx.x] = sf[o];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sf[0] ? si[0] : 0u;
}
