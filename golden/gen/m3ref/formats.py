"""Number formats of FORMATS.md, decoded and quantized with numpy.

Written from FORMATS.md alone.  Element decodes go through exact tables or
ml_dtypes; every dequantized weight is computed in f64 (exact: the products
have at most 30 significant bits) and rounded to f32 once.
"""

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2

# E2M1 magnitudes indexed by the three low bits of the code.
_E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)
E2M1_MAX = 6.0
E4M3_MAX = 448.0


def bf16(x):
    """Round-to-nearest-even to bfloat16, returned as f32 values."""
    return np.asarray(x, dtype=np.float32).astype(BF16).astype(np.float32)


def e2m1_decode(codes):
    """Decode 4-bit E2M1 codes (0..15, bit 3 = sign) to f64."""
    codes = np.asarray(codes, dtype=np.uint8)
    mag = _E2M1_MAG[codes & 7]
    return np.where(codes & 8, -mag, mag)


def unpack_fp4(packed):
    """[rows, n/2] bytes -> [rows, n] codes; the low nibble is the even element."""
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def e8m0_decode(codes):
    """E8M0 byte -> 2^(c-127) as f64 (0x00 is 2^-127, 0xFF is NaN)."""
    c = np.asarray(codes, dtype=np.int64)
    v = np.ldexp(1.0, c - 127)
    return np.where(c == 255, np.nan, v)


def e4m3_decode(raw_u8):
    """E4M3FN bytes -> f64."""
    return np.asarray(raw_u8, dtype=np.uint8).view(E4M3).astype(np.float64)


def e5m2_decode(raw_u8):
    return np.asarray(raw_u8, dtype=np.uint8).view(E5M2).astype(np.float64)


def _expand_scale(scale, block, n):
    """[rows, n/block] -> [rows, n] by repeating each scale `block` times."""
    return np.repeat(scale, block, axis=-1)[..., :n]


def mxfp4_dequant(packed, scale_u8):
    """MXFP4: packed E2M1 [out, in/2] + E8M0 [out, in/32] -> f32 [out, in]."""
    codes = unpack_fp4(packed)
    n = codes.shape[-1]
    if n % 32:
        raise ValueError(f"MXFP4 row length {n} is not a multiple of 32")
    vals = e2m1_decode(codes) * _expand_scale(e8m0_decode(scale_u8), 32, n)
    return vals.astype(np.float32)


def mxfp8_dequant(raw_u8, scale_u8, elem="e4m3"):
    """MXFP8: E4M3 (or E5M2) [out, in] + E8M0 [out, in/32] -> f32."""
    dec = e4m3_decode if elem == "e4m3" else e5m2_decode
    vals = dec(raw_u8)
    n = vals.shape[-1]
    return (vals * _expand_scale(e8m0_decode(scale_u8), 32, n)).astype(np.float32)


def nvfp4_dequant_f64(packed, scale_e4m3_u8, global_scale):
    """NVFP4 exact values in f64: e2m1 * e4m3(s) * g."""
    codes = unpack_fp4(packed)
    n = codes.shape[-1]
    if n % 16:
        raise ValueError(f"NVFP4 row length {n} is not a multiple of 16")
    s = _expand_scale(e4m3_decode(scale_e4m3_u8), 16, n)
    return e2m1_decode(codes) * s * float(np.float32(global_scale))


# ---------------------------------------------------------------- encoders


def e2m1_encode_sat(v):
    """Saturating RNE encode of f64 values to E2M1 codes (ties: FORMATS.md)."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    # Thresholds between neighbours; `<=` where the tie goes down (even code).
    mag_code = np.select(
        [a <= 0.25, a < 0.75, a <= 1.25, a < 1.75, a <= 2.5, a < 3.5, a <= 5.0],
        [0, 1, 2, 3, 4, 5, 6],
        default=7,
    ).astype(np.uint8)
    sign = np.signbit(v).astype(np.uint8) << 3
    return mag_code | sign


def _f32_bits(x):
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def mx_exponent(amax, emax, mbits, rule="even"):
    """Shared exponent e (int64) for blocks with the given f32 amax."""
    bits = _f32_bits(amax).astype(np.int64)
    if rule == "even":
        bits = bits + (1 << (23 - mbits - 1))
    elif rule != "floor":
        raise ValueError(f"unsupported scale rule {rule}")
    expf = (bits >> 23) & 0x1FF  # may reach 255 (carry into the all-ones exponent)
    e = np.where(expf >= 255, 128, expf - 127) - emax
    # amax = 0 (or a subnormal amax) gives the smallest scale.
    e = np.where(expf == 0, -127, e)
    return np.clip(e, -127, 127)


def mxfp4_quantize(x, rule="even"):
    """MX quantization (E2M1 / 32) of f32 rows; returns (codes, e) with
    codes [.., n] and e [.., n/32]."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    if n % 32:
        raise ValueError(f"MXFP4 row length {n} is not a multiple of 32")
    blocks = x.reshape(x.shape[:-1] + (n // 32, 32))
    amax = np.max(np.abs(blocks), axis=-1)
    e = mx_exponent(amax, emax=2, mbits=1, rule=rule)
    q = blocks.astype(np.float64) / np.ldexp(1.0, e)[..., None]
    codes = e2m1_encode_sat(q)
    bad = ~np.all(np.isfinite(blocks), axis=-1)
    if np.any(bad):
        codes = np.where(bad[..., None], 0, codes)
    return codes.reshape(x.shape).astype(np.uint8), np.where(bad, 128, e)


def mxfp4_fake_quant(x, rule="even"):
    """Quantize to MXFP4 and decode back to f32 (the activation path)."""
    codes, e = mxfp4_quantize(x, rule)
    n = codes.shape[-1]
    scale = _expand_scale(np.where(e == 128, np.nan, np.ldexp(1.0, np.minimum(e, 127))), 32, n)
    return (e2m1_decode(codes) * scale).astype(np.float32)


def pack_fp4(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def e4m3_encode_sat(x):
    """Saturating RNE encode to E4M3FN (raw bytes); NaN stays NaN."""
    x = np.asarray(x, dtype=np.float64)
    c = np.clip(x, -E4M3_MAX, E4M3_MAX)
    return c.astype(E4M3).view(np.uint8)


def e4m3_roundtrip(x):
    """f32 value of encode_sat_e4m3(x)."""
    return e4m3_decode(e4m3_encode_sat(x)).astype(np.float32)


def nvfp4_to_mxfp4_values(packed, scale_u8, g, rule="even"):
    """NVFP4 -> MXFP4 conversion (FORMATS.md): decode exactly, re-quantize
    with the MX rule, return the f32 MXFP4 values."""
    exact = nvfp4_dequant_f64(packed, scale_u8, g)
    # The exact values have <= 30 significant bits; MX blocks need the f32
    # amax: quantize from f64 values, amax rounded to f32 (monotone, so the
    # block exponent is that of the exact amax unless rounding carries).
    n = exact.shape[-1]
    blocks = exact.reshape(exact.shape[:-1] + (n // 32, 32))
    amax = np.max(np.abs(blocks), axis=-1).astype(np.float32)
    e = mx_exponent(amax, emax=2, mbits=1, rule=rule)
    codes = e2m1_encode_sat(blocks / np.ldexp(1.0, e)[..., None])
    vals = e2m1_decode(codes) * np.ldexp(1.0, e)[..., None]
    return vals.reshape(exact.shape).astype(np.float32)


def mx_quantize_generic(x, elem, rule="floor"):
    """MX quantization for the self-test writer: elem 'fp4' or 'e4m3'.
    Returns (element bytes or codes, scale bytes)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    blocks = x.reshape(x.shape[:-1] + (n // 32, 32))
    amax = np.max(np.abs(blocks), axis=-1)
    if elem == "fp4":
        e = mx_exponent(amax, 2, 1, rule)
        codes = e2m1_encode_sat(blocks / np.ldexp(1.0, e)[..., None]).reshape(x.shape)
        return pack_fp4(codes), (e + 127).astype(np.uint8)
    e = mx_exponent(amax, 8, 3, rule)
    raw = e4m3_encode_sat(blocks / np.ldexp(1.0, e)[..., None]).reshape(x.shape)
    return raw, (e + 127).astype(np.uint8)


def nvfp4_quantize(x):
    """NVFP4 quantization of a weight (self-test writer)."""
    x = np.asarray(x, dtype=np.float32)
    amax = float(np.max(np.abs(x)))
    g = np.float32(amax / 2688.0) if amax > 0 else np.float32(1.0)
    n = x.shape[-1]
    blocks = x.reshape(x.shape[:-1] + (n // 16, 16)).astype(np.float64)
    bamax = np.max(np.abs(blocks), axis=-1)
    s_raw = e4m3_encode_sat(bamax / (6.0 * float(g)))
    s = e4m3_decode(s_raw)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = blocks / (float(g) * s)[..., None]
    q = np.where((s == 0)[..., None], 0.0, q)
    codes = e2m1_encode_sat(q).reshape(x.shape)
    return pack_fp4(codes), s_raw, g


# ------------------------------------------------------ NVFP4 KV cache
#
# ARCHITECTURE.md, "NVFP4 KV cache": a cached row (one position of a K, V or
# index-K cache tensor) in blocks of 16 along the row, the tensor's cache
# scale g (checkpoint k_scale / v_scale / index_k_scale, default 1.0) as
# NVFP4's global scale.  Per block: NaN or +-Inf anywhere -> scale byte
# 0x7F (NaN) and codes 0, the block reads NaN; else
# s = encode_sat_e4m3(bamax / (6 g)) (quotient exact), and if e4m3(s) == 0
# every code is 0 (the block reads +0), else
# code = encode_sat_e2m1(x / (g e4m3(s))) (quotient exact).  Read:
# f32(e2m1 * e4m3(s) * g), the product exact in f64, rounded once.


def nvfp4_cache_quantize(x, g):
    """Rows [..., n] (n a multiple of 16) with global scale g ->
    (packed E2M1 codes [..., n/2] u8, E4M3 scale bytes [..., n/16] u8)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    if n % 16:
        raise ValueError(f"NVFP4 cache row length {n} is not a multiple of 16")
    g = float(np.float32(g))
    if not (np.isfinite(g) and g > 0):
        raise ValueError(f"NVFP4 cache global scale {g} must be finite and positive")
    blocks = x.reshape(x.shape[:-1] + (n // 16, 16)).astype(np.float64)
    bad = ~np.all(np.isfinite(blocks), axis=-1)
    safe = np.where(bad[..., None], 0.0, blocks)
    bamax = np.max(np.abs(safe), axis=-1)
    # 6 g is exact in f64; the f64 quotient rounds like the exact one.
    s_raw = e4m3_encode_sat(bamax / (6.0 * g))
    s = e4m3_decode(s_raw)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = safe / (g * s)[..., None]
    zero = bad | (s == 0)
    codes = np.where(zero[..., None], 0, e2m1_encode_sat(np.where(zero[..., None], 0.0, q)))
    s_raw = np.where(bad, np.uint8(0x7F), s_raw).astype(np.uint8)
    return pack_fp4(codes.reshape(x.shape).astype(np.uint8)), s_raw


def nvfp4_cache_dequant(packed, scales, g):
    """Packed codes [..., n/2] + scale bytes [..., n/16] -> f32 [..., n]."""
    vals = nvfp4_dequant_f64(packed, scales, g)  # e2m1 * e4m3(s) * g, exact in f64
    return vals.astype(np.float32)


def nvfp4_cache_roundtrip(x, g):
    """The value an NVFP4 cache read returns for each element of x."""
    packed, scales = nvfp4_cache_quantize(x, g)
    return nvfp4_cache_dequant(packed, scales, g)


# ------------------------------------------------------------- PTPC FP8
#
# ARCHITECTURE.md, "Online quantization": per row (output channel of a
# weight, token of an activation) scale = f32(amax / 448) (zero row: 1.0),
# codes = encode_sat_e4m3(x / scale); a PTPC linear is
# y = f32(f32(exact_dot(qa, qw) * sw) * sa), the dot of the decoded codes
# summed exactly and rounded to f32 once.

F32_TINY = np.float32(np.ldexp(1.0, -149))


def ptpc_quantize(x):
    """[rows, K] finite f32 values -> (codes u8 [rows, K], scales f32 [rows])."""
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=-1) if x.shape[-1] else np.zeros(x.shape[:-1], np.float32)
    s = (amax / np.float32(E4M3_MAX)).astype(np.float32)  # one f32 division
    s = np.where(amax == 0, np.float32(1.0), np.where(s == 0, F32_TINY, s)).astype(np.float32)
    codes = e4m3_encode_sat(x.astype(np.float64) / s.astype(np.float64)[..., None])
    return codes, s


def e4m3_units(codes):
    """E4M3 codes -> exact integers in units of 2^-9 (int64), via ml_dtypes."""
    v = e4m3_decode(codes) * 512.0
    if not np.all(np.isfinite(v)):
        raise ValueError("NaN E4M3 code in a PTPC operand")
    u = v.astype(np.int64)
    assert np.all(u == v), "an E4M3 value is not a multiple of 2^-9"
    return u


def ptpc_linear(x, qw, sw):
    """x [T, K] (bf16 values), weight codes qw [N, K] and scales sw [N] ->
    f32 [T, N] before the output's bf16 rounding.  Rows of x holding NaN or
    an infinity give NaN rows."""
    x = np.asarray(x, dtype=np.float32)
    bad = ~np.all(np.isfinite(x), axis=-1)
    qa, sa = ptpc_quantize(np.where(bad[:, None], np.float32(0), x))
    acc = e4m3_units(qa) @ e4m3_units(qw).T  # exact int64
    assert np.all(np.abs(acc) < 2**53)
    accf = acc.astype(np.float64).astype(np.float32) * np.float32(2.0 ** -18)
    y = (accf * np.asarray(sw, np.float32)[None, :]).astype(np.float32)
    y = (y * sa[:, None]).astype(np.float32)
    y[bad] = np.float32(np.nan)
    return y
