#!/usr/bin/env bash
# Session 11 (issue 12), second prototype call: the f16-MMA MX linear for all
# four formats (MXFP4, NVFP4, MXFP8 E4M3 / E5M2) at 1-16 rows, more warp /
# unroll shapes for 16 rows. bench/proto/fp8mma.py, no engine binary.
set -u
F16_ONLY=1 FMTS=4,5,8,9 timeout 500 python3 bench/proto/fp8mma.py > $OUT/proto.jsonl 2>&1
echo "proto exit $?"
python3 - $OUT/proto.jsonl <<'PY'
import sys, json, collections
best = collections.OrderedDict()
for l in open(sys.argv[1]):
    try: r = json.loads(l)
    except Exception: print(l.strip()); continue
    if "fmt" not in r: print(r); continue
    k = (r["fmt"], r["M"])
    if k not in best or r["ms"] < best[k]["ms"]: best[k] = r
for k, r in best.items():
    print(f'{k[0]:11} M={k[1]:2} best {r["ms"]:.4f} ms {r["pct_ceiling"]:5.1f}% W{r["WARPS"]} U{r["UNR"]} B{r["MINB"]} F{r["FULL"]} regs {r["regs"]} rel_l2 {r["rel_l2"]}')
PY
