#!/usr/bin/env python3
"""Format conformance vectors for m3, written from FORMATS.md only.

An independent implementation (Python, numpy + ml_dtypes, exact rational
arithmetic via `fractions.Fraction`) of every rule of
/work/shared/design/FORMATS.md. It never reads the Rust codecs.

Usage:  gen_vectors.py OUT_DIR

Writes OUT_DIR/manifest.json and one OUT_DIR/<group>.safetensors per group.
Every file is written to a temporary name in OUT_DIR and renamed into place.
The output is byte-identical on every run and every machine: inputs come from
a seeded splitmix64 generator written here and only IEEE-exact operations
(+ - * / on floats, integer arithmetic, Fractions) are used; no libm function
(log, exp, cos, ...) touches a value.

How ml_dtypes is used, and where FORMATS.md wins (checked at generation time,
the script aborts if any cross-check disagrees):
  * Element decode tables come from ml_dtypes (`view` + `astype(float32)`)
    and are checked against a bit-formula decode written here.
  * RNE encode: ml_dtypes agrees with FORMATS.md for float32 inputs inside the
    finite range, and every such vector is cross-checked against it. It
    differs in three places, where we follow FORMATS.md:
      - float64 inputs are rounded to float32 first (double rounding:
        0.75 - 2^-40 becomes 1.0 in E2M1 instead of 0.5). FORMATS.md rounds the
        exact value, so encode uses exact rationals here.
      - E4M3FN / E5M2 casts do not saturate (464 -> NaN, 61440 -> Inf, Inf ->
        NaN / Inf). FORMATS.md encodes saturate: past max (and +-Inf) -> +-max.
      - NaN code: FORMATS.md only says "NaN becomes NaN"; the runner compares
        NaN codes as NaN (any NaN code of the format is accepted).
  * float64 -> bfloat16 in ml_dtypes also goes through float32; bf16 rounding
    of exact values is done here with rationals and cross-checked with
    ml_dtypes float32 -> bfloat16 wherever the value is a float32.
"""

import json
import os
import struct
import sys
from bisect import bisect_right
from fractions import Fraction

import ml_dtypes
import numpy as np

F = Fraction
FORMAT_VERSION = 1

# --------------------------------------------------------------------------
# deterministic randomness (splitmix64): never numpy's global RNG, whose
# streams and float conversions are not pinned across versions.


class Rng:
    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def u64(self):
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def below(self, n):
        return self.u64() % n

    def normal(self):
        """Approximately N(0, 1): Irwin-Hall sum of 12 uniform 24-bit ints,
        exact in f64, rounded once to f32."""
        s = sum(self.u64() >> 40 for _ in range(12)) - 6 * (1 << 24)
        return f32(s / float(1 << 24))

    def heavy(self):
        """Heavy-tailed: a normal times a random power of two in [2^-20, 2^20]."""
        return f32(self.normal() * 2.0 ** (int(self.below(41)) - 20))


def f32(x):
    """Round a Python float (f64) to f32, returned as a Python float. numpy's
    f64 -> f32 cast is one IEEE RNE rounding (subnormals kept)."""
    return float(np.float32(x))


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32_from_bits(b):
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def f64_next(x, up):
    return float(np.nextafter(np.float64(x), np.float64(np.inf if up else -np.inf)))


def f32_next(x, up):
    return float(np.nextafter(np.float32(x), np.float32(np.inf if up else -np.inf)))


def is_neg(x):
    """Sign bit of a float (so -0.0 and -NaN count as negative)."""
    return struct.unpack("<Q", struct.pack("<d", x))[0] >> 63 == 1


# --------------------------------------------------------------------------
# exact arithmetic helpers


def floor_log2(q):
    """floor(log2(q)) for a positive Fraction, exactly."""
    k = q.numerator.bit_length() - q.denominator.bit_length()
    if F(2) ** k > q:
        k -= 1
    return k


def round_float(q, prec, emin, emax):
    """RNE of a non-negative Fraction to a binary float with `prec`
    significand bits (hidden bit included), minimum normal exponent `emin`
    (gradual underflow below), largest exponent `emax`. Returns a Fraction or
    None for overflow (Inf)."""
    if q == 0:
        return F(0)
    e = max(floor_log2(q), emin)
    ulp = F(2) ** (e - prec + 1)
    n = q / ulp
    fl = n.numerator // n.denominator
    rem = n - fl
    if rem > F(1, 2) or (rem == F(1, 2) and fl % 2 == 1):
        fl += 1
    r = fl * ulp
    if r >= F(2) ** (emax + 1):
        return None
    return r


def frac_to_f32(q, neg=False):
    """f32 RNE of an exact value (sign given separately so -0 survives)."""
    r = round_float(abs(q), 24, -126, 127)
    v = float("inf") if r is None else float(r)  # r is an f32: exact in f64
    return -v if (neg or q < 0) else v


def frac_to_bf16_bits(q, neg=False):
    r = round_float(abs(q), 8, -126, 127)
    v = float("inf") if r is None else float(r)
    if neg or q < 0:
        v = -v
    b = f32_bits(v)
    assert b & 0xFFFF == 0
    return b >> 16


# --------------------------------------------------------------------------
# element formats


class Elem:
    """An element type: decode table from ml_dtypes (checked against the bit
    formula), saturating exact RNE encode."""

    def __init__(self, name, dtype, bits, ebits, mbits, bias, max_code, sign_bit, nan_code):
        self.name = name
        self.dtype = dtype
        self.bits = bits
        self.ebits, self.mbits, self.bias = ebits, mbits, bias
        self.sign_bit = sign_bit
        self.nan_code = nan_code
        n = 1 << bits
        dec = np.arange(n, dtype=np.uint8).view(dtype).astype(np.float32)
        self.decode_table = dec
        for c in range(n):
            mine = self.formula_decode(c)
            got = float(dec[c])
            assert (np.isnan(mine) and np.isnan(got)) or (
                mine == got and is_neg(mine) == is_neg(got)
            ), (name, c, mine, got)
        # positive finite magnitudes, index == code (monotonic in code)
        self.mags = [F(float(dec[c])) for c in range(max_code + 1)]
        assert all(self.mags[i] < self.mags[i + 1] for i in range(max_code))
        self.max = self.mags[-1]
        self.mids = [(self.mags[i] + self.mags[i + 1]) / 2 for i in range(max_code)]

    def formula_decode(self, c):
        s = -1.0 if c & self.sign_bit else 1.0
        mag = c & (self.sign_bit - 1)
        e = mag >> self.mbits
        m = mag & ((1 << self.mbits) - 1)
        emask = (1 << self.ebits) - 1
        if self.name == "e4m3" and e == emask and m == (1 << self.mbits) - 1:
            return float("nan")
        if self.name == "e5m2" and e == emask:
            return s * float("inf") if m == 0 else float("nan")
        if e == 0:
            return s * m * 2.0 ** (1 - self.bias - self.mbits)
        return s * (1 + m / float(1 << self.mbits)) * 2.0 ** (e - self.bias)

    def encode_mag(self, a):
        """Saturating RNE code of a non-negative Fraction (no sign bit)."""
        if a >= self.max:
            return len(self.mags) - 1
        i = bisect_right(self.mags, a) - 1
        mid = self.mids[i]
        if a < mid:
            return i
        if a > mid:
            return i + 1
        return i if i % 2 == 0 else i + 1  # tie: the even code (even mantissa)

    def encode(self, x):
        """Saturating encode of a float (f64 or f32 value), FORMATS.md."""
        if x != x:
            return self.nan_code | (self.sign_bit if is_neg(x) else 0)
        sign = self.sign_bit if is_neg(x) else 0
        if x in (float("inf"), float("-inf")):
            return sign | (len(self.mags) - 1)
        return sign | self.encode_mag(abs(F(x)))

    def encode_frac(self, q, neg):
        return (self.sign_bit if neg else 0) | self.encode_mag(abs(q))

    def value(self, c):
        """Exact value of a finite code as a Fraction."""
        v = float(self.decode_table[c])
        return F(v)


E2M1 = Elem("e2m1", ml_dtypes.float4_e2m1fn, 4, 2, 1, 1, 7, 0x8, None)
E4M3 = Elem("e4m3", ml_dtypes.float8_e4m3fn, 8, 4, 3, 7, 0x7E, 0x80, 0x7F)
E5M2 = Elem("e5m2", ml_dtypes.float8_e5m2, 8, 5, 2, 15, 0x7B, 0x80, 0x7E)
ELEMS = {"e2m1": E2M1, "e4m3": E4M3, "e5m2": E5M2}

# FORMATS.md spot checks, so a wrong table or tie rule stops the script.
for v, c in [(0.25, 0), (0.75, 2), (1.25, 2), (1.75, 4), (2.5, 4), (3.5, 6), (5.0, 6), (7.0, 7), (-0.0, 8)]:
    assert E2M1.encode(v) == c, (v, c)
assert E4M3.encode(464.0) == 0x7E and E4M3.encode(480.0) == 0x7E and E4M3.encode(-0.0) == 0x80
assert E5M2.encode(61440.0) == 0x7B and E5M2.encode(float("-inf")) == 0xFB


def e8m0_decode_formula(c):
    return float("nan") if c == 0xFF else float(F(2) ** (c - 127))


def mlcheck_encode(elem, x, code):
    """Cross-check an encode against ml_dtypes where ml_dtypes applies: an f32
    input strictly inside the finite range (no saturation involved)."""
    if x != x or abs(x) >= float(elem.max) or f32(x) != x:
        return
    got = int(np.array([x], dtype=np.float32).astype(elem.dtype).view(np.uint8)[0])
    assert got == code, (elem.name, x, hex(got), hex(code))


# --------------------------------------------------------------------------
# MX blocks (FORMATS.md "MX")

MX_ELEMS = {"e2m1": (E2M1, 2, 1), "e4m3": (E4M3, 8, 3), "e5m2": (E5M2, 15, 2)}
F32_INV = {name: F(f32(1.0 / float(e.max))) for name, (e, _, _) in MX_ELEMS.items()}


def mx_shared_exp(amax, elem_name, rule):
    """Unclamped shared exponent for a positive exact amax (Fraction)."""
    _, emax, mbits = MX_ELEMS[elem_name]
    if rule == "floor":
        return floor_log2(amax) - emax
    if rule == "even":
        # Round amax's significand up at `mbits` (half-up on the magnitude,
        # what adding 1 << (23 - mbits - 1) to the f32 bits does), then floor.
        # A carry out of the top binade gives 2^128: e = 128 - emax, finite.
        k = floor_log2(amax)
        sig = amax / F(2) ** k
        if sig >= 2 - F(1, 2 ** (mbits + 1)):
            k += 1
        return k - emax
    if rule == "rceil":
        d = round_float(amax * F32_INV[elem_name], 24, -126, 127)
        if d == 0:
            return -(10**9)  # clamps to -127
        k = floor_log2(d)
        return k if d == F(2) ** k else k + 1
    raise ValueError(rule)


def mx_block(vals, elem_name, rule):
    """One MX block. `vals`: list of (Fraction or None for NaN/Inf, neg flag).
    Returns (scale byte, codes)."""
    elem = MX_ELEMS[elem_name][0]
    if any(q is None for q, _ in vals):
        return 0xFF, [0] * len(vals)
    amax = max(abs(q) for q, _ in vals)
    if amax == 0:
        e = -127
    else:
        e = max(-127, min(127, mx_shared_exp(amax, elem_name, rule)))
    p = F(2) ** e
    return e + 127, [elem.encode_frac(q / p, neg) for q, neg in vals]


def exactify(x):
    """A float as (Fraction or None if non-finite, sign)."""
    if x != x or x in (float("inf"), float("-inf")):
        return None, is_neg(x)
    return F(x), is_neg(x)


def pack4(codes):
    return [codes[2 * j] | (codes[2 * j + 1] << 4) for j in range(len(codes) // 2)]


def mx_quantize(rows, elem_name, rule, exact_rows=None):
    """Quantize a list of rows of floats (or of exact (Fraction, neg) pairs).
    Returns (codes (packed for FP4), scales)."""
    codes_all, scales_all = [], []
    src = exact_rows if exact_rows is not None else [[exactify(x) for x in r] for r in rows]
    for r in src:
        rc = []
        for b in range(0, len(r), 32):
            s, c = mx_block(r[b : b + 32], elem_name, rule)
            scales_all.append(s)
            rc.extend(c)
        codes_all.extend(pack4(rc) if elem_name == "e2m1" else rc)
    return codes_all, scales_all


def mx_dequantize(codes, scales, rows, cols, elem_name):
    elem = MX_ELEMS[elem_name][0]
    out = []
    for i in range(rows):
        for j in range(cols):
            if elem_name == "e2m1":
                byte = codes[(i * cols + j) // 2]
                c = (byte >> 4) if j % 2 else (byte & 0xF)
            else:
                c = codes[i * cols + j]
            s = scales[i * (cols // 32) + j // 32]
            d = float(elem.decode_table[c])
            if s == 0xFF or d != d:
                out.append(float("nan"))
            elif d in (float("inf"), float("-inf")):
                out.append(d)
            else:
                v = frac_to_f32(F(d) * F(2) ** (s - 127), neg=is_neg(d))
                # numpy: one f32 multiply of two f32s is the same single rounding
                # (2^(s-127) is an f32 for every s in 0..254)
                with np.errstate(over="ignore"):
                    nv = float(np.float32(d) * np.float32(float(F(2) ** (s - 127))))
                assert f32_bits(nv) == f32_bits(v), (d, s, v, nv)
                out.append(v)
    return out


# --------------------------------------------------------------------------
# NVFP4 (FORMATS.md "NVFP4")

F32_MIN_SUB = F(2) ** -149


def nvfp4_global(flat):
    fin = [abs(F(x)) for x in flat if x == x and x not in (float("inf"), float("-inf"))]
    amax = max(fin) if fin else F(0)
    if amax == 0:
        return 1.0
    g = frac_to_f32(amax / 2688)  # one f32 division (numpy agrees: checked below)
    assert g == f32(float(np.float32(float(amax)) / np.float32(2688.0)))
    return g if g != 0 else float(F32_MIN_SUB)


def nvfp4_quantize(rows):
    flat = [x for r in rows for x in r]
    g = nvfp4_global(flat)
    G = F(g)
    codes, scales = [], []
    for r in rows:
        rc = []
        for b in range(0, len(r), 16):
            blk = [exactify(x) for x in r[b : b + 16]]
            if any(q is None for q, _ in blk):
                scales.append(0x7F)
                rc.extend([0] * 16)
                continue
            bamax = max(abs(q) for q, _ in blk)
            s = E4M3.encode_mag(bamax / (6 * G))
            scales.append(s)
            sv = E4M3.value(s)
            if sv == 0:
                rc.extend([0] * 16)
            else:
                rc.extend(E2M1.encode_frac(q / (G * sv), neg) for q, neg in blk)
        codes.extend(pack4(rc))
    return codes, scales, g


def nvfp4_exact(codes, scales, g, rows, cols):
    """Exact values as (Fraction or None for NaN, neg)."""
    out = []
    for i in range(rows):
        row = []
        for j in range(cols):
            byte = codes[(i * cols + j) // 2]
            c = (byte >> 4) if j % 2 else (byte & 0xF)
            s = scales[i * (cols // 16) + j // 16]
            sv = float(E4M3.decode_table[s])
            if sv != sv:
                row.append((None, False))
                continue
            e = float(E2M1.decode_table[c])
            row.append((F(e) * F(sv) * F(g), is_neg(e) != is_neg(sv)))
        out.append(row)
    return out


def nvfp4_dequantize(codes, scales, g, rows, cols):
    out = [
        float("nan") if q is None else frac_to_f32(q, neg)
        for r in nvfp4_exact(codes, scales, g, rows, cols)
        for q, neg in r
    ]
    # numpy cross-check: e2m1 * s is exact in f32 (6 significant bits, no
    # underflow), so (e2m1 * s) * g in f32 is the same single rounding.
    for i in range(rows):
        for j in range(cols):
            byte = codes[(i * cols + j) // 2]
            c = (byte >> 4) if j % 2 else (byte & 0xF)
            s = E4M3.decode_table[scales[i * (cols // 16) + j // 16]]
            with np.errstate(over="ignore", invalid="ignore"):
                nv = float((E2M1.decode_table[c] * s) * np.float32(g))
            v = out[i * cols + j]
            assert (nv != nv and v != v) or f32_bits(nv) == f32_bits(v), (i, j, v, nv)
    return out


# --------------------------------------------------------------------------
# output: a minimal, deterministic safetensors writer (header keys sorted,
# data in key order, header padded with spaces to 8 bytes)

DT = {"U8": ("<u1", 1), "U16": ("<u2", 2), "F32": ("<f4", 4), "F64": ("<f8", 8)}


def safetensors_bytes(tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, values = tensors[name]
        arr = np.asarray(values, dtype=DT[dtype][0]).reshape(shape)
        raw = arr.tobytes()
        assert len(raw) > 0, name
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class Out:
    def __init__(self, root):
        self.root = root
        self.groups = []

    def group(self, name, kind, params, tensors, count, cases=None):
        fname = name + ".safetensors"
        write_atomic(os.path.join(self.root, fname), safetensors_bytes(tensors))
        g = {"name": name, "kind": kind, "file": fname, "count": count, "params": params}
        if cases is not None:
            g["cases"] = cases
        self.groups.append(g)
        print(f"{name:28s} {count:6d}")

    def finish(self):
        m = {
            "format_version": FORMAT_VERSION,
            "generator": "spec/gen/gen_vectors.py",
            "spec": "shared/design/FORMATS.md",
            "groups": self.groups,
        }
        data = (json.dumps(m, indent=1, sort_keys=True) + "\n").encode()
        write_atomic(os.path.join(self.root, "manifest.json"), data)


# --------------------------------------------------------------------------
# element groups


def gen_decode(out):
    for name, elem in [("e2m1", E2M1), ("e4m3", E4M3), ("e5m2", E5M2)]:
        n = 1 << elem.bits
        codes = list(range(n))
        vals = [float(v) for v in elem.decode_table]
        out.group(f"decode_{name}", "decode", {"elem": name},
                  {"input": ("U8", [n], codes), "expected": ("F32", [n], vals)}, n)
    dec = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    vals = [float(v) for v in dec]
    for c in range(256):
        m = e8m0_decode_formula(c)
        assert (m != m and vals[c] != vals[c]) or m == vals[c], c
    assert vals[0] == float(F(2) ** -127)
    out.group("decode_e8m0", "decode", {"elem": "e8m0"},
              {"input": ("U8", [256], list(range(256))), "expected": ("F32", [256], vals)}, 256)


def encode_inputs(elem, rng):
    """Every midpoint (incl. the one past max), +-1 f32 ulp and +-1 f64 ulp
    around it, every representable value +-1 f32 ulp, specials, randoms."""
    mags = [float(m) for m in elem.mags]
    virt_next = {"e2m1": 8.0, "e4m3": 480.0, "e5m2": 65536.0}[elem.name]
    pts = []
    for i in range(len(mags)):
        hi = mags[i + 1] if i + 1 < len(mags) else virt_next
        mid = (mags[i] + hi) / 2  # exact in f64 (few significant bits)
        assert F(mid) == (F(mags[i]) + F(hi)) / 2
        pts += [mid, f32_next(mid, True), f32_next(mid, False), f64_next(mid, True), f64_next(mid, False)]
        pts += [mags[i], f32_next(mags[i], True)]
        if mags[i] > 0:
            pts.append(f32_next(mags[i], False))
    pts += [virt_next, 2 * virt_next, 1e30, 3.4028234663852886e38, 1e300, float("inf")]
    pts += [0.0, 2.0**-149, 2.0**-130, 2.0**-126, 2.0**-200, 5e-324]
    for _ in range(128):
        pts.append(f32(rng.normal() * float(elem.max) / 3))
    for _ in range(64):
        pts.append(rng.heavy())
    xs = []
    for p in pts:
        xs += [p, -p]
    if elem.nan_code is not None:
        xs += [float("nan"), -float("nan")]
    seen, uniq = set(), []
    for x in xs:
        k = struct.pack("<d", x)
        if k not in seen:
            seen.add(k)
            uniq.append(x)
    return uniq


def gen_encode(out):
    for name, seed in [("e2m1", 11), ("e4m3", 12), ("e5m2", 13)]:
        elem = ELEMS[name]
        xs = encode_inputs(elem, Rng(seed))
        codes = []
        for x in xs:
            c = elem.encode(x)
            mlcheck_encode(elem, x, c)
            codes.append(c)
        out.group(f"encode_{name}", "encode", {"elem": name},
                  {"input": ("F64", [len(xs)], xs), "expected": ("U8", [len(xs)], codes)}, len(xs))


def bf16_rne_bits(b):
    """f32 bits -> bf16 bits, RNE; NaN stays NaN (quiet)."""
    if (b & 0x7F800000) == 0x7F800000 and (b & 0x7FFFFF):
        return (b >> 16) | 0x40
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def gen_bf16(out):
    rng = Rng(21)
    bits = []
    for hi in [0x0000, 0x0001, 0x0080, 0x3F80, 0x3F81, 0x4049, 0x7F7F, 0x7F7E, 0x007F, 0x0040]:
        for lo in [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF]:
            bits += [(hi << 16) | lo, ((hi | 0x8000) << 16) | lo]
    bits += [0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0x00000001, 0x80000001]
    for _ in range(400):
        bits.append(rng.u64() & 0xFFFFFFFF)
    xs, exp = [], []
    for b in dict.fromkeys(bits):
        x = f32_from_bits(b)
        mine = bf16_rne_bits(b)
        got = int(np.array([x], dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)[0])
        if x == x:
            assert mine == got, (hex(b), hex(mine), hex(got))
            # and the rational rounding agrees
            if x not in (float("inf"), float("-inf")):
                assert frac_to_bf16_bits(F(x), is_neg(x)) == mine, hex(b)
        else:
            assert got & 0x7F80 == 0x7F80 and got & 0x7F
        xs.append(b)
        exp.append(mine)
    out.group("bf16_round", "bf16", {},
              {"input": ("F32", [len(xs)], [f32_from_bits(b) for b in xs]), "expected": ("U16", [len(xs)], exp)},
              len(xs))


# --------------------------------------------------------------------------
# block inputs


def rand_rows(rng, rows, cols, kind, scale=1.0):
    f = {"normal": rng.normal, "heavy": rng.heavy}[kind]
    return [[f32(f() * scale) for _ in range(cols)] for _ in range(rows)]


def edge_block(amax, n, rng, neg=False):
    """A block whose amax is exactly `amax` (at a random position), the rest
    random smaller values."""
    vals = [f32(amax * (rng.below(1 << 20) / float(1 << 21))) for _ in range(n)]
    vals = [v if rng.below(2) else -v for v in vals]
    vals[int(rng.below(n))] = -amax if neg else amax
    return vals


def mx_cases(elem_name):
    """(id, note, rows) for the MX block groups of one element type."""
    elem, emax, mbits = MX_ELEMS[elem_name]
    rng = Rng({"e2m1": 101, "e4m3": 102, "e5m2": 103}[elem_name])
    cases = []
    for i, sc in enumerate([1.0, 2.0**-10, 2.0**20]):
        cases.append((f"normal_{i}", f"random normal x {sc}", rand_rows(rng, 4, 64, "normal", sc)))
    for i in range(2):
        cases.append((f"heavy_{i}", "normal x 2^U(-20,20) per element", rand_rows(rng, 4, 64, "heavy")))
    cases.append(("zeros", "all +0; then a +0/-0 mix (signed zero kept)",
                  [[0.0] * 32 + [(-0.0 if k % 3 else 0.0) for k in range(32)]]))
    tiny = [
        edge_block(2.0**-127, 32, rng),
        [f32_from_bits(int(rng.below(1 << 23))) * (1 if k % 2 else -1) for k in range(32)],
        [2.0**-149] + [0.0] * 31,
        edge_block(f32(1.5 * 2.0**-120), 32, rng, neg=True),
        edge_block(2.0**-126, 32, rng),
        edge_block(f32_from_bits(0x007FFFFF), 32, rng),
    ]
    cases.append(("tiny", "near 2^-127, f32 subnormals, min subnormal alone, ~2^-120", [tiny[0] + tiny[1], tiny[2] + tiny[3], tiny[4] + tiny[5]]))
    fmax = f32_from_bits(0x7F7FFFFF)
    huge = [
        edge_block(fmax, 32, rng), edge_block(2.0**127, 32, rng, neg=True),
        edge_block(f32(1.5 * 2.0**127), 32, rng), [fmax] + [1.0] * 30 + [-fmax],
    ]
    cases.append(("huge", "near 2^127 and f32 max", [huge[0] + huge[1], huge[2] + huge[3]]))
    nf = [edge_block(3.0, 32, rng) for _ in range(4)]
    nf[0][5] = float("nan")
    nf[1][0] = float("inf")
    nf[2][31] = float("-inf")
    cases.append(("nonfinite", "NaN / +Inf / -Inf blocks then a finite one", [nf[0] + nf[1], nf[2] + nf[3]]))
    # the `even` carry edge: significand at 2 - 2^-(mbits+1) (carry), one f32
    # ulp below (no carry), above; and at the top binade (carry to 2^128)
    thr = 2.0 - 2.0 ** -(mbits + 1)
    blocks = []
    for k in [0, -3, 7, 40, -100]:
        t = thr * 2.0**k
        for a in [t, f32_next(t, False), f32_next(t, True)]:
            blocks.append(edge_block(a, 32, rng, neg=bool(rng.below(2))))
    blocks += [edge_block(f32(thr * 2.0**127), 32, rng), edge_block(fmax, 32, rng),
               edge_block(f32_next(f32(thr * 2.0**127), False), 32, rng)]
    while len(blocks) % 2:
        blocks.append(edge_block(1.0, 32, rng))
    cases.append(("even_carry", "amax at / just below / above the `even` carry point", [blocks[i] + blocks[i + 1] for i in range(0, len(blocks), 2)]))
    # values past max_elem * 2^e under floor: saturate (FP4: (6, 8))
    sat = []
    top = float(elem.max)
    for k in [0, 5, -5]:
        base = 2.0 ** (floor_log2(elem.max) + k)
        sat.append([f32(base * (1 + (top / 2.0 ** floor_log2(elem.max) - 1) + (j + 1) / 40.0 * (2 - top / 2.0 ** floor_log2(elem.max)))) for j in range(32)])
    sat.append(edge_block(f32(7.9 * 2.0**-3), 32, rng))
    cases.append(("floor_saturate", "amax / 2^e past max_elem (FP4: in (6, 8)): saturates under floor", [sat[0] + sat[1], sat[2] + sat[3]]))
    # rceil edges: amax = max_elem * 2^k exactly, and one ulp each side
    rc = []
    for k in [0, 3, -20]:
        a = f32(top * 2.0**k)
        rc += [edge_block(a, 32, rng), edge_block(f32_next(a, True), 32, rng)]
    cases.append(("rceil_edge", "amax = max_elem * 2^k and one ulp above", [rc[i] + rc[i + 1] for i in range(0, len(rc), 2)]))
    cases.append(("single_block", "one 1x32 block", rand_rows(rng, 1, 32, "normal", 0.3)))
    return cases


def gen_mx(out):
    for elem_name, prefix in [("e2m1", "mxfp4"), ("e4m3", "mxfp8_e4m3"), ("e5m2", "mxfp8_e5m2")]:
        cases = mx_cases(elem_name)
        for rule in ["floor", "even", "rceil"]:
            tensors, meta = {}, []
            for cid, note, rows in cases:
                r, c = len(rows), len(rows[0])
                assert all(len(x) == c for x in rows) and c % 32 == 0
                codes, scales = mx_quantize(rows, elem_name, rule)
                deq = mx_dequantize(codes, scales, r, c, elem_name)
                pc = c // 2 if elem_name == "e2m1" else c
                tensors[cid + ".x"] = ("F32", [r, c], [x for row in rows for x in row])
                tensors[cid + ".codes"] = ("U8", [r, pc], codes)
                tensors[cid + ".scales"] = ("U8", [r, c // 32], scales)
                tensors[cid + ".deq"] = ("F32", [r, c], deq)
                meta.append({"id": cid, "rows": r, "cols": c, "note": note})
            out.group(f"{prefix}_{rule}", "mx", {"elem": elem_name, "rule": rule}, tensors, len(meta), meta)


def nvfp4_cases():
    rng = Rng(201)
    fmax = f32_from_bits(0x7F7FFFFF)
    cases = [
        ("normal_0", "random normal", rand_rows(rng, 4, 64, "normal")),
        ("normal_1", "random normal x 2^-30", rand_rows(rng, 2, 64, "normal", 2.0**-30)),
        ("heavy_0", "heavy-tailed: small blocks get E4M3 subnormal or zero scales", rand_rows(rng, 4, 64, "heavy")),
        ("zeros", "zero tensor: g = 1.0 (with -0)", [[0.0, -0.0] * 16]),
        ("g_underflow", "amax = 2^-149: amax/2688 underflows, g = min subnormal", [[2.0**-149, -(2.0**-149)] + [0.0] * 14 + [2.0**-149] * 16]),
        ("g_subnormal", "amax ~ 2^-130: g is an f32 subnormal", rand_rows(rng, 2, 32, "normal", 2.0**-132)),
        ("huge", "amax = f32 max", [edge_block(fmax, 16, rng) + edge_block(f32(2.0**100), 16, rng)]),
    ]
    nf = rand_rows(rng, 2, 32, "normal")
    nf[0][3] = float("nan")
    nf[1][20] = float("inf")
    nf[1][21] = 1000.0  # amax of the finite values sits in the Inf block's row
    cases.append(("nonfinite", "NaN / Inf blocks: scale 0x7F, codes 0; amax over finite values", nf))
    mixed = [edge_block(100.0, 16, rng), edge_block(100.0 / 2**20, 16, rng), edge_block(100.0 / 2**12, 16, rng), edge_block(100.0 / 2**9, 16, rng)]
    cases.append(("scale_range", "block amax far below the tensor amax: s = 0, subnormal s", [mixed[0] + mixed[1], mixed[2] + mixed[3]]))
    cases.append(("all_nonfinite", "only NaN/Inf: g = 1.0", [[float("nan")] * 16 + [float("-inf")] * 16]))
    cases.append(("f32_trap", "x / (g * s) near E2M1 midpoints: f32 arithmetic changes codes", nvfp4_f32_trap_rows(rng)))
    return cases


def gen_nvfp4(out):
    tensors, meta, quants = {}, [], []
    for cid, note, rows in nvfp4_cases():
        r, c = len(rows), len(rows[0])
        assert all(len(x) == c for x in rows) and c % 16 == 0
        codes, scales, g = nvfp4_quantize(rows)
        deq = nvfp4_dequantize(codes, scales, g, r, c)
        tensors[cid + ".x"] = ("F32", [r, c], [x for row in rows for x in row])
        tensors[cid + ".codes"] = ("U8", [r, c // 2], codes)
        tensors[cid + ".scales"] = ("U8", [r, c // 16], scales)
        tensors[cid + ".global"] = ("F32", [1], [g])
        tensors[cid + ".deq"] = ("F32", [r, c], deq)
        meta.append({"id": cid, "rows": r, "cols": c, "note": note})
        quants.append((cid, note, r, c, codes, scales, g))
    out.group("nvfp4", "nvfp4", {}, tensors, len(meta), meta)
    return quants


def conv_trap_cases():
    """NVFP4 tensors (built directly, not quantized) whose exact values
    e2m1 * s * g need more than 24 bits and sit just off an E2M1 rounding
    midpoint of the MX block scale: dequantizing to f32 first (instead of the
    exact f64 decode FORMATS.md requires) rounds onto the midpoint and
    changes a code. Deterministic search; one tensor per trap since g is per
    tensor. Returns quantized-case tuples as gen_nvfp4 does."""
    found, rules_hit = [], set()
    e4m3_normals = [c for c in range(0x08, 0x7F)]
    for c_code in range(1, 8):
        cval = E2M1.value(c_code)
        for m in E2M1.mids:
            for s_code in e4m3_normals[::7]:
                sv = E4M3.value(s_code)
                for gx in f32_neighbours(frac_to_f32(m / (cval * sv))):
                    G = F(gx)
                    blk = [c_code, 7] + [0] * 14  # the trap value, an amax (6), zeros
                    codes = pack4(blk + [0] * 16)
                    scales = [s_code, s_code]
                    exact = nvfp4_exact(codes, scales, gx, 1, 32)
                    deq = [frac_to_f32(q, neg) for q, neg in exact[0]]
                    hit = []
                    for rule in ["floor", "even", "rceil"]:
                        a = mx_quantize(None, "e2m1", rule, exact_rows=exact)
                        b = mx_quantize([deq], "e2m1", rule)
                        if a != b:
                            hit.append(rule)
                    if hit and not set(hit) <= rules_hit:
                        rules_hit |= set(hit)
                        cid = f"f32_trap_{len(found)}"
                        note = "exact decode needed: an f32 dequant first changes a code under " + "/".join(hit)
                        found.append((cid, note, 1, 32, codes, scales, gx))
                    if len(rules_hit) == 3:
                        return found
    return found


def gen_nvfp4_to_mxfp4(out, quants):
    traps = conv_trap_cases()
    assert traps, "no NVFP4 -> MXFP4 f32 trap found"
    quants = quants + traps
    for rule in ["floor", "even", "rceil"]:
        tensors, meta = {}, []
        for cid, note, r, c, codes, scales, g in quants:
            if c % 32:
                continue
            exact = nvfp4_exact(codes, scales, g, r, c)
            # The MX rules are written for f32 amax; here amax is an exact
            # value of up to 30 bits. Keep only cases where using f32(amax)
            # would choose the same exponents, so the vector is unambiguous.
            ok = True
            for row in exact:
                for b in range(0, c, 32):
                    blk = row[b : b + 32]
                    if any(q is None for q, _ in blk):
                        continue
                    amax = max(abs(q) for q, _ in blk)
                    if amax == 0:
                        continue
                    a32 = F(frac_to_f32(amax))
                    if mx_shared_exp(amax, "e2m1", rule) != mx_shared_exp(a32, "e2m1", rule):
                        ok = False
            if not ok:
                print(f"  skip nvfp4_to_mxfp4_{rule}/{cid}: f32(amax) would change the exponent")
                continue
            mcodes, mscales = mx_quantize(None, "e2m1", rule, exact_rows=exact)
            tensors[cid + ".codes_in"] = ("U8", [r, c // 2], codes)
            tensors[cid + ".scales_in"] = ("U8", [r, c // 16], scales)
            tensors[cid + ".global_in"] = ("F32", [1], [g])
            tensors[cid + ".codes"] = ("U8", [r, c // 2], mcodes)
            tensors[cid + ".scales"] = ("U8", [r, c // 32], mscales)
            meta.append({"id": cid, "rows": r, "cols": c, "note": "from nvfp4/" + cid + ": " + note})
        out.group(f"nvfp4_to_mxfp4_{rule}", "nvfp4_to_mxfp4", {"rule": rule}, tensors, len(meta), meta)


def gen_mxfp8_to_bf16(out):
    for elem_name, lo, hi, seed in [("e4m3", 3, 246, 301), ("e5m2", 10, 239, 302)]:
        elem = ELEMS[elem_name]
        rng = Rng(seed)
        finite = [c for c in range(256) if float(elem.decode_table[c]) == float(elem.decode_table[c]) and abs(float(elem.decode_table[c])) != float("inf")]
        all_codes = list(range(256))

        def rand_codes(n, pool):
            return [pool[int(rng.below(len(pool)))] for _ in range(n)]

        specs = [
            ("in_range", "random codes, scales inside the exact range", [rand_codes(64, finite) for _ in range(2)],
             [lo, hi, 127, int(lo + rng.below(hi - lo))]),
            ("range_edges", "scales exactly at both ends of the exact range, every code",
             [list(range(k, k + 64)) for k in range(0, 256, 64)], [lo, hi] * 4),
            ("low_past", "scale one below the exact range: bf16 subnormals round", [list(range(256))[:64], list(range(256))[64:128]], [lo - 1, 0, lo - 1, 1]),
            ("high_past", "scale one above the exact range: Inf appears", [list(range(256))[128:192], list(range(256))[192:256]], [hi + 1, 254, hi + 1, 250]),
            ("nan_scale", "a NaN (0xFF) scale byte", [rand_codes(64, finite), rand_codes(64, finite)], [127, 130, 0xFF, 120]),
            ("nan_codes", "NaN / Inf element codes with in-range scales (not a refusal)", [rand_codes(64, all_codes), rand_codes(64, all_codes)], [127, 100, 150, 127]),
        ]
        tensors, meta = {}, []
        for cid, note, rows, scales in specs:
            r, c = len(rows), len(rows[0])
            codes = [x for row in rows for x in row]
            out_bits = []
            for i in range(r):
                for j in range(c):
                    code = codes[i * c + j]
                    s = scales[i * (c // 32) + j // 32]
                    d = float(elem.decode_table[code])
                    if s == 0xFF or d != d:
                        out_bits.append(0x7FC0)
                    elif d in (float("inf"), float("-inf")):
                        out_bits.append(0xFF80 if d < 0 else 0x7F80)
                    else:
                        out_bits.append(frac_to_bf16_bits(F(d) * F(2) ** (s - 127), is_neg(d)))
            refuse = None
            for i in range(r):
                for b in range(c // 32):
                    s = scales[i * (c // 32) + b]
                    if refuse is None and (s == 0xFF or s < lo or s > hi):
                        refuse = [i, b]
            tensors[cid + ".codes_in"] = ("U8", [r, c], codes)
            tensors[cid + ".scales_in"] = ("U8", [r, c // 32], scales)
            tensors[cid + ".bf16"] = ("U16", [r, c], out_bits)
            meta.append({"id": cid, "rows": r, "cols": c, "note": note, "exact_refuses": refuse})
        out.group(f"mxfp8_{elem_name}_to_bf16", "mxfp8_to_bf16", {"elem": elem_name, "exact_lo": lo, "exact_hi": hi}, tensors, len(meta), meta)


def f32_neighbours(x):
    """x and up to 3 f32 ulps either side, nearest first."""
    out, up, dn = [x], x, x
    for _ in range(3):
        up, dn = f32_next(up, True), f32_next(dn, False)
        out += [up, dn]
    return out


def ptpc_f32_trap_row(rng, cols):
    """A PTPC row whose values sit within a few ulps of E4M3 midpoints times
    the row scale, chosen so that computing x / scale in f32 (instead of
    exactly, as FORMATS.md requires) rounds onto or across the midpoint and
    changes the code."""
    a = f32(3.0 + rng.below(1 << 22) / float(1 << 22))
    sc = F(frac_to_f32(F(a) / 448))
    row = [a]
    for m in E4M3.mids:
        for x in f32_neighbours(frac_to_f32(m * sc)):
            if not 0 < x < a:
                continue
            exact = E4M3.encode_frac(F(x) / sc, False)
            approx = E4M3.encode(float(np.float32(x) / np.float32(float(sc))))
            if exact != approx:
                row.append(x if len(row) % 2 else -x)
                break
        if len(row) == cols:
            break
    assert len(row) >= cols // 2, len(row)
    while len(row) < cols:
        row.append(f32(a * (rng.below(1 << 20) / float(1 << 21))))
    return row


def nvfp4_f32_trap_rows(rng):
    """NVFP4 blocks whose elements sit within a few ulps of E2M1 midpoints
    times g * s, chosen so that f32 arithmetic for x / (g * s) (instead of
    the exact quotient FORMATS.md requires) changes the code."""
    a = f32(7.0 + rng.below(1 << 22) / float(1 << 21))
    g = F(frac_to_f32(F(a) / 2688))
    blocks = []
    for bam in [a, f32(a * 0.6), f32(a * 0.13), f32(a * 0.011)]:
        sv = E4M3.value(E4M3.encode_mag(F(bam) / (6 * g)))
        gs32 = np.float32(float(g)) * np.float32(float(sv))
        blk = [bam]
        for m in E2M1.mids * 3:
            for x in f32_neighbours(frac_to_f32(m * g * sv)):
                if not 0 < x < bam or x in blk or -x in blk:
                    continue
                exact = E2M1.encode_frac(F(x) / (g * sv), False)
                approx = E2M1.encode(float(np.float32(x) / gs32))
                if exact != approx:
                    blk.append(x if len(blk) % 2 else -x)
                    break
        while len(blk) < 16:
            blk.append(f32(bam * (rng.below(1 << 20) / float(1 << 21))))
        blocks.append(blk[:16])
    return [blocks[0] + blocks[1], blocks[2] + blocks[3]]


def gen_ptpc(out):
    rng = Rng(401)
    rows = rand_rows(rng, 3, 48, "normal")
    rows.append([0.0] * 24 + [-0.0] * 24)  # zero row: scale 1.0
    rows.append([x * 2.0**-60 for x in rand_rows(rng, 1, 48, "heavy")[0]])
    rows.append([f32(448.0 * 2.0**k) for k in range(-24, 24)])  # exact power-of-two ratios
    rows.append(edge_block(f32_from_bits(0x7F7FFFFF), 48, rng))
    rows.append(ptpc_f32_trap_row(rng, 48))
    r, c = len(rows), 48
    codes, scales, deq = [], [], []
    for row in rows:
        amax = max(abs(F(x)) for x in row)
        sc = 1.0 if amax == 0 else frac_to_f32(amax / 448)
        if amax:
            assert sc == float(np.float32(float(amax)) / np.float32(448.0))
        scales.append(sc)
        rc = [E4M3.encode_frac(F(x) / F(sc), is_neg(x)) for x in row]
        codes += rc
        deq += [frac_to_f32(E4M3.value(q) * F(sc), neg=bool(q & 0x80)) for q in rc]
    tensors = {
        "rows.x": ("F32", [r, c], [x for row in rows for x in row]),
        "rows.codes": ("U8", [r, c], codes),
        "rows.scales": ("F32", [r], scales),
        "rows.deq": ("F32", [r, c], deq),
    }
    meta = [{"id": "rows", "rows": r, "cols": c, "note": "normal rows, zero row, tiny row, power-of-two ratios, f32 max, f32-quotient trap"}]
    out.group("ptpc_fp8", "ptpc", {}, tensors, r, meta)


def gen_cache_cast(out):
    rng = Rng(501)
    xs = [f32(rng.normal() * 100) for _ in range(96)] + [rng.heavy() for _ in range(32)]
    xs += [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 448.0, 464.0, -480.0, 2.0**-9, 2.0**-10, 3.0 * 2.0**-11, f32_from_bits(0x7F7FFFFF)]
    tensors, meta = {}, []
    for i, sc in enumerate([1.0, 0.5, 3.0, f32(0.1), f32(1.0 / 448.0), 2.0**-20]):
        # inputs that sit exactly on E4M3 midpoints after division, to make
        # the exact-quotient rule matter
        extra = [f32(float(m) * sc) for m in E4M3.mids[::9]]
        vals = xs + extra + [-v for v in extra]
        codes = []
        for x in vals:
            if x != x:
                codes.append(E4M3.nan_code | (0x80 if is_neg(x) else 0))
            elif x in (float("inf"), float("-inf")):
                codes.append(E4M3.encode(x))
            else:
                codes.append(E4M3.encode_frac(F(x) / F(sc), is_neg(x)))
        cid = f"scale_{i}"
        tensors[cid + ".x"] = ("F32", [len(vals)], vals)
        tensors[cid + ".scale"] = ("F32", [1], [sc])
        tensors[cid + ".codes"] = ("U8", [len(vals)], codes)
        meta.append({"id": cid, "rows": 1, "cols": len(vals), "note": f"per-tensor scale {sc!r}"})
    out.group("cache_cast_e4m3", "cache_cast", {}, tensors, sum(m["cols"] for m in meta), meta)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gen_vectors.py OUT_DIR")
    root = sys.argv[1]
    os.makedirs(root, exist_ok=True)
    out = Out(root)
    gen_decode(out)
    gen_encode(out)
    gen_bf16(out)
    gen_mx(out)
    quants = gen_nvfp4(out)
    gen_nvfp4_to_mxfp4(out, quants)
    gen_mxfp8_to_bf16(out)
    gen_ptpc(out)
    gen_cache_cast(out)
    out.finish()


if __name__ == "__main__":
    main()
