#!/usr/bin/env python3
"""Join an `m3 bench --backend gpu` JSON and a `peer.py` JSON of the same
model (same call, bench/h200.sh) into one table: per batch, m3's step
against each peer mode (eager, graph, compiled), the ratio peer / m3 (> 1:
m3 is faster) and PERF.md's 1.6x bar. Writes JSON and markdown."""
import argparse, json, os, sys


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--m3", required=True, help="m3 bench --out JSON")
    ap.add_argument("--peer", required=True, help="peer.py --out JSON")
    ap.add_argument("--out", required=True, help="joined JSON (markdown beside it, .md)")
    ap.add_argument("--context", type=int, default=4096)
    a = ap.parse_args()
    m3 = json.load(open(a.m3))
    peer = json.load(open(a.peer))
    mine = {c["batch"]: c for c in m3["cases"] if c["context"] == a.context and c["variant"] in ("auto", "default")}
    rows = []
    for c in peer["cases"]:
        b = c["batch"]
        if b not in mine:
            continue
        m = mine[b]["median_ms"]
        rows.append(dict(batch=b, m3_ms=m, m3_pct_of_ceiling=mine[b]["pct_of_ceiling"], peer_mode=c["mode"],
                         peer_ms=c["median_ms"], peer_pct_of_ceiling=c["pct_of_ceiling"],
                         ratio=c["median_ms"] / m, meets_1_6x=c["median_ms"] / m >= 1.6))
    rows.sort(key=lambda r: (r["batch"], r["peer_mode"]))
    md = ["| batch | m3 ms | peer mode | peer ms | peer / m3 | >= 1.6x (PERF.md) |", "|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['batch']} | {r['m3_ms']:.3f} | {r['peer_mode']} | {r['peer_ms']:.3f} | "
                  f"{r['ratio']:.2f}x | {'yes' if r['meets_1_6x'] else 'no'} |")
    doc = dict(what="bench/peer/ratios.py: m3 against the PyTorch peer, same device call",
               m3=dict(command=m3.get("command"), model=m3.get("model"), ceiling=m3.get("ceiling")),
               peer=dict(command=peer.get("command"), model=peer.get("model"), ceiling=peer.get("ceiling"),
                         protocol=peer.get("protocol")),
               context=a.context, rows=rows)
    for path, text in ((a.out, json.dumps(doc, indent=1)), (os.path.splitext(a.out)[0] + ".md", "\n".join(md) + "\n")):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
