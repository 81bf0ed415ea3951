#!/usr/bin/env python3
"""Read an Nsight Compute per-SASS-line export and say where the time goes.

Usage: sass_profile.py SASS.csv [TOP] [--per N]
  SASS.csv: `ncu -i REP --page source --print-source sass --csv` (xz -d first;
  an export of several launches holds one table each: the first is read).
Prints: the stall-reason shares of the whole kernel; per function (the
code split at each RET: op bodies of the mono kernel are functions) its
share of the samples, local-memory (LDL / STL), global-load and
tensor-core instructions executed, and its own five largest stall
reasons (% of its samples: `no_inst` is code not yet fetched); then the
TOP lines by samples with their two largest stall reasons; then the
executed instruction mix by opcode, divided by N when given (e.g. the warp-iterations of the main loop, for
instructions a warp and iteration: bench/NOTES.md session 20 run 5).
(bench/NOTES.md session 9, runs 3 and 7.)
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
    args = sys.argv[1:]
    per = 1.0
    if "--per" in args:
        i = args.index("--per")
        per = float(args[i + 1])
        del args[i : i + 2]
    rows = list(csv.reader(open(args[0])))
    top_n = int(args[1]) if len(args) > 1 else 30
    # one table a launch ("Kernel Name" rows): the first
    starts = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"] + [len(rows)]
    if len(starts) > 2:
        rows = rows[starts[0] : starts[1]]
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
        # the function's own stall shares (% of its samples), largest first
        own = sorted(((sum(num(r[ix[h]]) for r in f), h[6:]) for h in stalls), reverse=True)
        print("        stalls %: " + ", ".join(f"{n} {100 * v / s:.0f}" for v, n in own[:5] if v > 0))
    for r in sorted(data, key=lambda r: -num(r[S]))[:top_n]:
        st = sorted(((num(r[ix[h]]), h[6:]) for h in stalls), reverse=True)[:2]
        print(f"{r[0][-6:]} {num(r[S]):7.0f} {100 * num(r[S]) / tot:5.1f}% "
              f"exec {num(r[E]):9.0f} {r[1].strip()[:56]:56s} {st}")
    mix = {}
    for r in data:
        words = [w for w in r[1].split() if not w.startswith("@")]
        if words and num(r[E]) > 0:
            op = words[0].split(".")[0]
            mix[op] = mix.get(op, 0.0) + num(r[E])
    total = sum(mix.values())
    print(f"instruction mix: {total:.0f} executed" + (f", {total / per:.1f} per {per:.0f}" if per != 1.0 else ""))
    for op, n in sorted(mix.items(), key=lambda kv: -kv[1])[:24]:
        print(f"  {op:10s} {n:12.0f} {100 * n / total:5.1f}%" + (f" {n / per:8.1f}" if per != 1.0 else ""))


if __name__ == "__main__":
    main()
