// Device-side generation of the bench model's weights and of filler cache
// contents from a seed: every value is a counter hash of (seed, tensor id,
// index), so a run needs no checkpoint and no host-to-device traffic.

M3_DEV u64 g_mix(u64 z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
M3_DEV u64 g_hash(u64 seed, u32 tid, u64 i) { return g_mix(seed ^ g_mix(((u64)tid << 40) ^ i)); }

/// p[i] = (hash & mask) | orv: FP4 codes (mask 0xff), E4M3 codes of a
/// bounded exponent (mask 0x8f, or 0x30: |v| in [0.5, 1.875]), or a constant
/// E8M0 scale (mask 0).
M3_KERNEL void m3s_gen_bytes(u8* __restrict__ p, u64 n, u64 seed, u32 tid, u32 mask, u32 orv) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = (u8)(((u32)g_hash(seed, tid, i) & mask) | orv);
}

/// bf16 bits: random sign and 7 mantissa bits, exponent field e or e + 1
/// (e even).
M3_KERNEL void m3s_gen_bf16(u16* __restrict__ p, u64 n, u64 seed, u32 tid, u32 e) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = (u16)(((u32)g_hash(seed, tid, i) & 0x80ffu) | ((e & ~1u) << 7));
}

/// f32 uniform in [-amp, amp).
M3_KERNEL void m3s_gen_f32(float* __restrict__ p, u64 n, u64 seed, u32 tid, float amp) {
  u64 stride = (u64)gridDim.x * blockDim.x;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    u64 h = g_hash(seed, tid, i);
    p[i] = amp * ((float)(h >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}
