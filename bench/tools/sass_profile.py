#!/usr/bin/env python3
"""Read an Nsight Compute per-SASS-line export and say where the time goes.

Usage: sass_profile.py SASS.csv [TOP]
  SASS.csv: `ncu -i REP --page source --print-source sass --csv` (xz -d first).
Prints: the stall-reason shares of the whole kernel; per function (the
code split at each RET: op bodies of the mono kernel are functions) its
share of the samples, local-memory (LDL / STL), global-load and
tensor-core instructions executed; then the TOP lines by samples with their
two largest stall reasons. (bench/NOTES.md session 9, runs 3 and 7.)
"""
import csv
import re
import sys


def num(v):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    hdr, data = rows[1], rows[2:]
    ix = {h: i for i, h in enumerate(hdr)}
    S, E = ix["Warp Stall Sampling (All Samples)"], ix["Instructions Executed"]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    tot = sum(num(r[S]) for r in data) or 1.0
    shares = {h[6:]: 100 * sum(num(r[ix[h]]) for r in data) / tot for h in stalls}
    print("samples", int(tot), "stalls %:", {k: round(v, 1) for k, v in shares.items() if v >= 0.5})
    fns, cur = [], []
    for r in data:
        cur.append(r)
        if re.search(r"\bRET\b", r[1]):
            fns.append(cur)
            cur = []
    fns.append(cur)
    for i, f in enumerate(fns):
        s = sum(num(r[S]) for r in f)
        if s < 0.005 * tot:
            continue
        count = lambda pat: int(sum(num(r[E]) for r in f if re.search(pat, r[1])))
        ldl, stl = count(r"\bLDL"), count(r"\bSTL")
        ldg, mma = count(r"\bLDG|\bLD\."), count("HMMA")
        print(f"fn{i:3d} {f[0][0][-6:]} {len(f):6d} instr {100 * s / tot:5.1f}% "
              f"LDL {ldl:10d} STL {stl:10d} LDG/LD {ldg:10d} HMMA {mma:10d}")
    for r in sorted(data, key=lambda r: -num(r[S]))[:top_n]:
        st = sorted(((num(r[ix[h]]), h[6:]) for h in stalls), reverse=True)[:2]
        print(f"{r[0][-6:]} {num(r[S]):7.0f} {100 * num(r[S]) / tot:5.1f}% "
              f"exec {num(r[E]):9.0f} {r[1].strip()[:56]:56s} {st}")


if __name__ == "__main__":
    main()
