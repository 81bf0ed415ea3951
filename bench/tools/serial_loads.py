#!/usr/bin/env python3
"""Find global loads that ptxas issued one at a time.

Usage: serial_loads.py DIS [TOP] ["DEFINES" FILE...]
  DIS: `nvdisasm -g -c CUBIN` of a cubin compiled with `-lineinfo`
  (nvrtc_cubin.py with NVRTC_OPTS="-lineinfo").
  DEFINES FILE...: the arguments nvrtc_cubin.py compiled it with, to print
  each line's source text (its x.cu lines are compat.h, the defines, then
  the files, concatenated as it does).

A load counts as serialized when its value is read, or its register is
loaded again, before the next global load (LDG / LD) of the same stretch
of code (no label between): the next load then waits a memory round trip.
Prints per source line: loads, serialized, the text. Static: it counts
instructions, not how often they run (a tail loop that never runs counts
too). bench/NOTES.md session 37: the router's logits loop.
"""
import collections
import os
import re
import sys

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../gpu-mi350/kernels")
LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
INS = re.compile(r"/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9._]*)\s*([^;]*);")
LABEL = re.compile(r"^\.L_x_\d+:|^\.text\.")


def parse(path):
    """(source line, opcode, destination registers, source registers)."""
    cur, out = None, []
    for text in open(path):
        m = LINE.search(text)
        if m:
            cur = int(m.group(2))
            continue
        m = INS.search(text)
        if not m:
            if LABEL.match(text.strip()):
                out.append((cur, "LABEL", set(), set()))
            continue
        op, args = m.group(2), m.group(3)
        parts = [a.strip() for a in args.split(",")]
        dest = set()
        writes = not op.startswith(("ST", "RED", "BRA", "ISETP", "FSETP", "ATOMS"))
        d = re.match(r"R(\d+)\b", parts[0]) if parts and writes else None
        if d:
            n = int(d.group(1))
            w = 4 if ".128" in op else 2 if ".64" in op or ".64" in parts[0] else 1
            dest = set(range(n, n + w))
        # (\b: not the R of a uniform register, UR4)
        srcs = {int(r) for p in (parts[1:] if dest else parts) for r in re.findall(r"\bR(\d+)\b", p)}
        out.append((cur, op, dest, srcs))
    return out


def is_load(op):
    """A global (or generic) load: LDG, LD; not LDGSTS / LDGDEPBAR."""
    return op == "LDG" or op.startswith("LDG.") or op.startswith("LD.") or op == "LD"


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    ins = parse(args[0])
    top = int(args[1]) if len(args) > 1 else 30
    text = None
    if len(args) > 2:
        src = open(os.path.join(KERNELS, "compat.h")).read() + "\n" + args[2].replace("\\n", "\n") + "\n"
        src += "".join(open(os.path.join(KERNELS, f)).read() + "\n" for f in args[3:])
        text = src.split("\n")
    stat = collections.defaultdict(lambda: [0, 0])
    loads = [i for i, x in enumerate(ins) if is_load(x[1])]
    for a in loads[-1:]:
        stat[ins[a][0]][0] += 1  # the last load: counted, never serialized
    for a, b in zip(loads, loads[1:]):
        line, _, dest, _ = ins[a]
        stat[line][0] += 1
        between = ins[a + 1:b]
        if any(x[1] == "LABEL" for x in between):
            continue
        if any(dest & x[3] for x in between) or dest & ins[b][2]:
            stat[line][1] += 1
    for line, (n, s) in sorted(stat.items(), key=lambda kv: -kv[1][1])[:top]:
        src = text[line - 1].strip()[:100] if text and line and line <= len(text) else ""
        print(f"{line}: loads {n}, serialized {s}  {src}")


if __name__ == "__main__":
    main()
