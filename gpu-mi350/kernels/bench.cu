// Bandwidth probes for the in-run ceiling (PERF.md protocol step 2).

/// Reads n16 16-byte words once (grid-stride, 4 loads in flight per
/// thread) and folds them so the loads cannot be removed; writes only when
/// the fold hits a magic value, i.e. practically never.
M3_KERNEL void m3_stream_read(const uint4* __restrict__ p, u64 n16, u32* __restrict__ sink) {
  u32 acc = 0u;
  u64 stride = (u64)gridDim.x * blockDim.x;
  u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}
