"""Prototype (issue 12): what one SM issues a clock of each instruction the
E2M1 / E4M3 decode is made of, and of two whole decodes of a code word.

Why: on the H100 the MXFP4 one-row walk streams at 95% of the ceiling and on
the H200 at 75% (bench/NOTES.md sessions 32, 40) with the same instructions
a byte, so on the H200 something in the SM, not DRAM, sets its pace. Its
decode is a mask (half the codes), two shifts and a LOP3 (the other half),
then `cvt.rn.f16x2.e4m3x2` (SASS F2FP) for every two values. If F2FP issued
well below LOP3's rate, the conversions alone would hold the FP4 walk near
what the H200 shows, and a decode by logic alone (more instructions, none of
them F2FP) would be faster there. Measured (session 41, H100; the SASS read
after the run): F2FP costs one ALU slot, as LOP3 does.

Each case runs one 1024-thread CTA an SM, 8 independent chains a thread, a
loop of N rounds; the CTA reads `clock64` before its loop and behind a
barrier after it (its last warp's end), so the figure is thread-instructions
a clock an SM, whatever the SM clock. Cases:

- `f2fp`: one `cvt.rn.f16x2.e4m3x2` a chain a round (its input the low
  half of the chain's register); `f2fp_h1` the same from the high half,
  for which ptxas adds PRMTs (24 a 32 F2FP in its loop, NVRTC 13.0: the
  0.58x LOP3's rate session 41's first run read was these PRMTs' too);
- `lop3`, `shf`, `prmt`, `ffma`, `hfma2`: one of each a chain a round (a
  dependent chain like `f2fp`'s); `adds`: one 32-bit add, which ptxas
  emits as IADD3 or IMAD (folded three-input adds: not an IADD3 rate);
- `dec_cvt`: the engine's E2M1 decode of one code word (s_h_e2m1_lo / _hi,
  four F2FP) a chain a round, counted as 8 values;
- `dec_logic`: a decode by logic alone of the same 8 values into f16 (value
  * 2^-14: sign at bit 15, e1 e0 m at bits 11..9 of each half), from a word
  laid out for it (4 mags a half-word at bits 0..11, their signs at 12..15):
  value 3 is one mask, values 0..2 two shifts, a mask and a LOP3 each (13
  instructions for 8 values against the engine's 5 + 4 F2FP).

Prints one JSON line a case (`ops_per_clk_sm`: thread-instructions of the
named kind a clock an SM; `values_per_clk_sm` for the decodes) and checks
that both decodes give the same f16 values times their powers of two for
every code (exits 1 if not).

  python3 bench/proto/pipes.py [--rounds N] [--compile-only] [--dump-cubin PATH]
"""
import json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cudrv  # noqa: E402

SRC = r"""
typedef unsigned int u32;
typedef unsigned long long u64;
#define CH 8

__device__ __forceinline__ u32 f2fp(u32 v) {
  u32 d;
  asm volatile("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, h; }" : "=r"(d) : "r"(v));
  return d;
}
__device__ __forceinline__ u32 f2fp_lo(u32 v) {
  u32 d;
  asm volatile("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.rn.f16x2.e4m3x2 %0, l; }" : "=r"(d) : "r"(v));
  return d;
}
// one PTX instruction of two u32 registers: d = OP(a, b)
#define OP2(name, text)                                                       \
  __device__ __forceinline__ u32 name(u32 a, u32 b) {                         \
    u32 d;                                                                    \
    asm volatile(text : "=r"(d) : "r"(a), "r"(b));                            \
    return d;                                                                 \
  }
OP2(lop3, "lop3.b32 %0, %1, %2, 0x5a5a5a5a, 0x96;")
OP2(shf, "shf.l.wrap.b32 %0, %1, %2, 3;")
OP2(prmt, "prmt.b32 %0, %1, %2, 0x5140;")
OP2(iadd3, "add.u32 %0, %1, %2;")
OP2(hfma2, "fma.rn.f16x2 %0, %1, %2, %1;")
__device__ __forceinline__ u32 ffma(u32 a, u32 b) {
  float d;
  asm volatile("fma.rn.f32 %0, %1, %2, 0f3F800000;" : "=f"(d) : "f"(__uint_as_float(a)), "f"(__uint_as_float(b)));
  return __float_as_uint(d);
}

// The engine's decode (standard_decode.cu s_h_e2m1_lo / _hi + m3_e4m3x4_f16).
__device__ __forceinline__ void dec_cvt(u32 q, u32 (&h)[4]) {
  u32 lo, hi;
  asm volatile("and.b32 %0, %1, 0x9c9c9c9c;" : "=r"(lo) : "r"(q));
  u32 a, b;
  asm volatile("shl.b32 %0, %1, 2;" : "=r"(a) : "r"(q));
  asm volatile("shr.b32 %0, %1, 2;" : "=r"(b) : "r"(q));
  // ((q << 2) & 0x8c8c8c8c) | ((q >> 2) & 0x10101010): a mask, then a LOP3
  u32 t;
  asm volatile("and.b32 %0, %1, 0x10101010;" : "=r"(t) : "r"(b));
  asm volatile("lop3.b32 %0, %1, 0x8c8c8c8c, %2, 0xea;" : "=r"(hi) : "r"(a), "r"(t));
  h[0] = f2fp_lo(lo); h[1] = f2fp(lo); h[2] = f2fp_lo(hi); h[3] = f2fp(hi);
}

// A decode by logic alone into f16 (value * 2^-14). Word: half-word w
// (bits 16w..16w+15) holds values 4w..4w+3; value v's magnitude (e1 e0 m)
// at bits 3v..3v+2 of its half, its sign at 12 + v. Output register v holds
// values v (low half) and 4 + v (high half): sign at 15 / 31, e1 e0 m at
// 11..9 / 27..25.
__device__ __forceinline__ void dec_logic(u32 q, u32 (&h)[4]) {
  // value 3: magnitude at 9..11, sign at 15 already
  asm volatile("and.b32 %0, %1, 0x8e008e00;" : "=r"(h[3]) : "r"(q));
  // value v < 3: magnitude up by 9 - 3v, sign up by 3 - v
#pragma unroll
  for (int v = 0; v < 3; ++v) {
    const u32 m = q << (9 - 3 * v), s = q << (3 - v);
    // (m & 0x0e000e00) | (s & 0x80008000): two masks, so two LOPs
    u32 t;
    asm volatile("and.b32 %0, %1, 0x80008000;" : "=r"(t) : "r"(s));
    asm volatile("lop3.b32 %0, %1, 0x0e000e00, %2, 0xea;" : "=r"(h[v]) : "r"(m), "r"(t));
  }
}

extern "C" __global__ void __launch_bounds__(1024, 1) k_CASE(const u32* in, u32* out, u64* clk, int rounds) {
  u32 x[CH], y[CH];
#pragma unroll
  for (int c = 0; c < CH; ++c) { x[c] = in[(threadIdx.x * CH + c) & 1023]; y[c] = x[c] ^ 0x01010101u; }
  __syncthreads();
  const u64 t0 = clock64();
  for (int r = 0; r < rounds; ++r) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      BODY
    }
  }
  u32 acc = 0;
#pragma unroll
  for (int c = 0; c < CH; ++c) acc ^= x[c] + y[c];
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  // the CTA's span: its last warp's end (read behind a barrier; session
  // 41's first runs read warp 0's own end, which can come before the
  // others': FFMA then read 167 a clock, above the SM's 128)
  __syncthreads();
  const u64 t1 = clock64();
  if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}
"""

# case -> (loop body for chain c, instructions of the named kind a chain a
# round, values decoded a chain a round (decodes only))
CASES = {
    "f2fp": ("x[c] = f2fp_lo(x[c]);", 1, 0),
    "f2fp_h1": ("x[c] = f2fp(x[c]);", 1, 0),
    "lop3": ("x[c] = lop3(x[c], y[c]);", 1, 0),
    "shf": ("x[c] = shf(x[c], y[c]);", 1, 0),
    "prmt": ("x[c] = prmt(x[c], y[c]);", 1, 0),
    "adds": ("x[c] = iadd3(x[c], y[c]);", 1, 0),
    "ffma": ("x[c] = ffma(x[c], y[c]);", 1, 0),
    "hfma2": ("x[c] = hfma2(x[c], y[c]);", 1, 0),
    "dec_cvt": ("{ u32 h[4]; dec_cvt(x[c], h); x[c] = h[0] ^ h[1] ^ h[2] ^ h[3] ^ y[c]; }", 1, 8),
    "dec_logic": ("{ u32 h[4]; dec_logic(x[c], h); x[c] = h[0] ^ h[1] ^ h[2] ^ h[3] ^ y[c]; }", 1, 8),
}


def source():
    out = []
    body_src = SRC.split('extern "C"')
    out.append(body_src[0])
    kern = 'extern "C"' + body_src[1]
    for name, (body, _, _) in CASES.items():
        out.append(kern.replace("k_CASE", "k_" + name).replace("BODY", body))
    return "\n".join(out)


def e2m1(c):
    s = -1.0 if c & 8 else 1.0
    e, m = (c >> 1) & 3, c & 1
    return s * (m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2))


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 4096
    src = source()
    if "--dump-cubin" in sys.argv:  # for `cuobjdump -sass`
        with open(sys.argv[sys.argv.index("--dump-cubin") + 1], "wb") as f:
            f.write(cudrv.cubin(src))
    if "--compile-only" in sys.argv:
        cudrv.cubin(src)
        print("compiled")
        return 0
    import torch
    torch.cuda.init()
    dev = torch.device("cuda")
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    # torch's allocations make the primary context current before the
    # module loads (the driver's error 201 otherwise)
    inp = torch.randint(0, 2**31 - 1, (1024,), dtype=torch.int64, device=dev).to(torch.int32)
    out = torch.empty(nsm * 1024, dtype=torch.int32, device=dev)
    clk = torch.empty(nsm, dtype=torch.int64, device=dev)
    torch.cuda.synchronize()
    mod = cudrv.compile_src(src)
    stream = torch.cuda.current_stream().cuda_stream
    for name, (_, per, vals) in CASES.items():
        f, regs = cudrv.func(mod, "k_" + name)
        for _ in range(2):  # warm, then timed
            cudrv.launch(f, nsm, 1024, [inp, out, clk, rounds], stream)
            torch.cuda.synchronize()
        cyc = clk.double().mean().item()
        thr = 1024 * 8 * rounds / cyc
        rec = {"case": name, "regs": regs, "cycles": round(cyc), "ops_per_clk_sm": round(thr * per, 2)}
        if vals:
            rec["values_per_clk_sm"] = round(thr * vals, 2)
        print(json.dumps(rec), flush=True)
    return check(mod, stream, torch, dev)


def f16_bits(v):
    import numpy as np
    return int(np.array([v], dtype=np.float16).view(np.uint16)[0])


def compare(codes, h):
    """Values of both decodes (`h`: [word][register 0-3 cvt, 4-7 logic][half]
    f16 bits) whose bits, the sign of zero included, are not their codes'
    values times 2^-6 (cvt) / 2^-14 (logic)."""
    bad = 0
    for i, cs in enumerate(codes):
        # register k of the cvt route: values (2k, 2k + 1) (half 0's, then half 1's)
        got_cvt = [h[i, k // 2, k % 2] for k in range(8)]
        got_log = [h[i, 4 + v, 0] for v in range(4)] + [h[i, 4 + v, 1] for v in range(4)]
        for got, (c, e) in zip(got_cvt + got_log, [(c, -6) for c in cs] + [(c, -14) for c in cs]):
            bits = f16_bits(e2m1(c) * 2.0 ** e) | (0x8000 if c & 8 else 0)
            bad += int(got) != bits
    return bad


def check(mod, stream, torch, dev):
    """Both decodes of every code against E2M1's value (f16 read back)."""
    chk = r"""
extern "C" __global__ void k_chk(const u32* q_cvt, const u32* q_log, u32* o) {
  const u32 i = threadIdx.x;
  u32 a[4], b[4];
  dec_cvt(q_cvt[i], a);
  dec_logic(q_log[i], b);
  for (int k = 0; k < 4; ++k) { o[8 * i + k] = a[k]; o[8 * i + 4 + k] = b[k]; }
}
"""
    m2 = cudrv.compile_src(SRC.split('extern "C"')[0] + chk)
    f, _ = cudrv.func(m2, "k_chk")
    import random
    random.seed(1)
    codes = [[random.randrange(16) for _ in range(8)] for _ in range(256)]
    # engine layout (model/layout.rs): byte b: half-0 value b at bits 2,3,4,7
    # (m, e0, e1, s), half-1 value 4+b at bits 0,1,5,6 (m, e0, s, e1)
    def pack_cvt(cs):
        w = 0
        for b in range(4):
            c0, c1 = cs[b], cs[4 + b]
            byte = ((c0 & 1) << 2) | (((c0 >> 1) & 1) << 3) | (((c0 >> 2) & 1) << 4) | ((c0 >> 3) << 7)
            byte |= (c1 & 1) | (((c1 >> 1) & 1) << 1) | ((c1 >> 3) << 5) | (((c1 >> 2) & 1) << 6)
            w |= byte << (8 * b)
        return w
    # logic layout: half-word w holds values 4w..4w+3 (mags at 3v, signs at 12+v)
    def pack_log(cs):
        w = 0
        for hw in range(2):
            for v in range(4):
                c = cs[4 * hw + v]
                w |= ((c & 7) << (3 * v) | (c >> 3) << (12 + v)) << (16 * hw)
        return w
    import numpy as np

    def s32(w):
        return w - (1 << 32) if w >= 1 << 31 else w

    def wrong(words_cvt, words_log):
        """Both decodes of the words on the device, compared."""
        qa = torch.tensor([s32(w) for w in words_cvt], dtype=torch.int32, device=dev)
        qb = torch.tensor([s32(w) for w in words_log], dtype=torch.int32, device=dev)
        o = torch.zeros(256 * 8, dtype=torch.int32, device=dev)
        cudrv.launch(f, 1, 256, [qa, qb, o], stream)
        torch.cuda.synchronize()
        return compare(codes, o.cpu().view(torch.int16).view(256, 8, 2).numpy().astype(np.uint16))

    words_cvt = [pack_cvt(c) for c in codes]
    words_log = [pack_log(c) for c in codes]
    bad = wrong(words_cvt, words_log)
    # planted: one sign bit flipped in each route's first word must be caught
    planted = wrong([words_cvt[0] ^ 0x80] + words_cvt[1:], [words_log[0] ^ (1 << 12)] + words_log[1:])
    print(json.dumps({"case": "check", "wrong_values": bad, "planted_wrong_values": planted}))
    return 0 if bad == 0 and planted == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
