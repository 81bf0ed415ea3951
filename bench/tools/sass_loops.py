#!/usr/bin/env python3
"""Static spill check of a cubin's SASS (`cuobjdump -sass X.cubin > X.sass`).

Usage: sass_loops.py X.sass
For every function (split at RET) that holds tensor-core instructions:
its STL / LDL count, those inside the innermost loops around its HMMAs (a
loop = the span of a backward branch), and those in the next loop out (for
a mono op body: the virtual-block loop). Compile with the device's NVRTC
(13.0 on the H200 image: PyPI nvidia-cuda-nvrtc==13.0.88 reproduces its
SASS; 13.5 does not), see nvrtc_cubin.py.
"""
import re
import sys


def main():
    ins = []
    for line in open(sys.argv[1]).read().splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    fns, cur = [], []
    for a, t in ins:
        cur.append((a, t))
        if re.match(r"^RET\.", t.strip()):
            fns.append(cur)
            cur = []
    fns.append(cur)
    for f in fns:
        h = [a for a, t in f if "HMMA" in t]
        if not h:
            continue
        loops = []
        for a, t in f:
            m = re.search(r"BRA (?:!?U?P[0-9T], )?(0x[0-9a-f]+)", t)
            if m and int(m.group(1), 16) < a:
                loops.append((int(m.group(1), 16), a))
        inner, outer = set(), set()
        for a in h:
            c = sorted((l for l in loops if l[0] <= a <= l[1]), key=lambda l: l[1] - l[0])
            if c:
                inner.add(c[0])
            if len(c) > 1:
                outer.add(c[1])
        inside = lambda a, spans: any(lo <= a <= hi for lo, hi in spans)
        st = [a for a, t in f if "STL" in t]
        ld = [a for a, t in f if "LDL" in t]
        print(f"{f[0][0]:#x} instr {len(f)} HMMA {len(h)} STL {len(st)} LDL {len(ld)} | "
              f"innermost loops STL {sum(inside(a, inner) for a in st)} LDL {sum(inside(a, inner) for a in ld)} | "
              f"next loop out STL {sum(inside(a, outer) for a in st)} LDL {sum(inside(a, outer) for a in ld)}")


if __name__ == "__main__":
    main()
