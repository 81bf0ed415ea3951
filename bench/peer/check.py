"""`peer.py --check`: the peer computes one consistent model, and it is
MODEL.md's (README.md "--check").  Needs numpy + ml_dtypes for the
reference comparison (skipped with a message without them)."""
import os, sys

import torch

from peer import Cfg, Model, capture

# a reference margin below these may flip a discrete choice under bf16 noise:
# block-score units (O(10)), sigmoid-score units (O(1))
NEAR_TIE = dict(blocks=0.1, experts=5e-3)


def ref_check(m, tok, pos, sq):
    """Row sq alone vs golden/gen/m3ref (the project's independent numpy
    reference of MODEL.md, f64 sums) on the same weights and cache contents.
    Returns (max |dlogit| / max |logit|, argmax same, the expert / block
    choices that differ, whether every difference is at a near-tie)."""
    import numpy as np
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden", "gen"))
    from m3ref import checkpoint as RC, model as R
    c, f = m.c, lambda t: t.float().cpu().numpy()
    cfg = RC.Config(hidden_size=c.H, num_layers=c.L, n_heads=c.nh, n_kv_heads=c.nkv, head_dim=c.d,
                    rotary_dim=c.rot, rope_theta=c.theta, vocab_size=c.V, eps=c.eps, n_experts=c.E,
                    top_k=c.topk, moe_width=c.I, shared_width=c.Is, dense_width=c.Id, routed_scaling=c.rsf,
                    swiglu_alpha=c.alpha, swiglu_limit=c.limit, index_heads=c.nih, index_dim=c.di,
                    block_size=c.bs, topk_blocks=c.kb, local_blocks=c.local_blocks, init_blocks=c.init_blocks,
                    index_selection="per_kv_head", attn_kinds=list(c.attn), mlp_kinds=list(c.mlp))
    rm = R.Model.__new__(R.Model)
    rm.cfg, rm.num = cfg, R.Numerics("f64")
    rm.opts = R.Options(kv_dtype="fp8_e4m3" if m.cdt != torch.bfloat16 else "bf16")
    rm.embed, rm.lm_head, rm.final_norm = f(m.embed), f(m.lm_head), f(m.final_norm)
    rm.layers, caches, p = [], [], int(pos[sq])
    for l, w in enumerate(m.layers):
        lw = dict(in_norm=f(w["in_norm"]), post_norm=f(w["post_norm"]), q=f(w["wq"]), k=f(w["wk"]),
                  v=f(w["wv"]), o=f(w["wo"]), q_norm=f(w["q_norm"]), k_norm=f(w["k_norm"]),
                  k_scale=1.0, v_scale=1.0, ik_scale=1.0)
        lc = R.LayerCache()
        lc.k = f(m.cr(w["kc"][sq, :, :p])).transpose(1, 0, 2)
        lc.v = f(m.cr(w["vc"][sq, :, :p])).transpose(1, 0, 2)
        if c.attn[l] == "sparse":
            lw.update(iq=f(w["wiq"]), ik=f(w["wik"]), iq_norm=f(w["iq_norm"]), ik_norm=f(w["ik_norm"]))
            lc.ik = f(m.cr(w["ic"][sq, :p]))
        if c.mlp[l] == "dense":
            lw["gate"], lw["up"] = np.split(f(w["w_gu"]), 2)
            lw["down"] = f(w["w_d"])
        else:
            lw.update(router=f(w["router"]), bias=f(w["bias"]),
                      experts=[tuple(np.split(f(w["w13"][e % m.pool]), 2)) + (f(w["w2"][e % m.pool]),)
                               for e in range(c.E)],
                      shared=tuple(np.split(f(w["s_gu"]), 2)) + (f(w["s_d"]),))
        rm.layers.append(lw)
        caches.append(lc)
    taps = rm.forward([int(tok[sq])], np.array([p]), caches)
    _, lg, rec = m.step(tok[sq:sq + 1], pos[sq:sq + 1], torch.tensor([sq], device=m.dev))
    lg, rl = f(lg)[0], taps["logits"][0]
    err = float(np.abs(lg - rl).max() / np.abs(rl).max())
    # discrete choices that differ, in compute order (a layer's blocks, then
    # its experts), and whether the FIRST was a near-tie: choices after it
    # see other inputs, so they are reported but not judged (as the golden
    # library's diagnose judges only up to the first discrete difference)
    diff, near = [], True
    for l in range(c.L):
        r = rec[l] if isinstance(rec[l], tuple) else (rec[l], None)
        if r[0] is not None:
            for g in range(c.nkv):
                if r[0][0, g].tolist() != taps[f"topk_blocks.{l}"][g, 0, :].tolist():
                    mg = float(taps[f"topk_margin.{l}"][g, 0])
                    if not diff:
                        near = mg < NEAR_TIE["blocks"]
                    diff.append(f"blocks.{l}.head{g} (ref margin {mg:.3g})")
        ref_slots = sorted((taps[f"experts.{l}"][0] % m.pool).tolist()) if r[1] is not None else None
        if r[1] is not None and sorted(r[1].tolist()) != ref_slots:
            mg = float(taps[f"router_margin.{l}"][0])
            if not diff:
                near = mg < NEAR_TIE["experts"]
            diff.append(f"experts.{l} (ref margin {mg:.3g})")
    top2 = np.sort(rl)[-2:]
    am = int(lg.argmax()) == int(rl.argmax()) or top2[1] - top2[0] < 3e-2 * np.abs(rl).max()  # or a near-tie
    return err, am, diff, near


def check(args):
    """Batch-2 step == each sequence alone (logits within bf16 tolerance, same
    argmax); a planted wrong expert id is caught; the selection is sparse and
    keeps the local block; gather+bmm == torch._grouped_mm where it runs."""
    dev = torch.device(args.device)
    c = Cfg("tiny", args.layers)
    ctx = 200  # > top-k blocks * block size: the selection is really sparse
    moe = args.moe
    if moe == "auto":
        moe = "grouped" if dev.type == "cuda" and hasattr(torch, "_grouped_mm") else "bmm"
    m = Model(c, dev, args.cache, 2, ctx, args.seed, moe)
    m.alloc_experts(args.experts_resident or c.E)
    tok = torch.tensor([5, 77], device=dev)
    pos = torch.tensor([ctx, ctx - 37], device=dev)
    seq = torch.tensor([0, 1], device=dev)
    ok = True
    _, both, rec = m.step(tok, pos, seq)
    tol = 2e-2 * both.abs().max().item()
    for b in range(2):
        nt, one, _ = m.step(tok[b:b + 1], pos[b:b + 1], seq[b:b + 1])
        err = (one[0] - both[b]).abs().max().item()
        same = nt.item() == both[b].argmax().item()
        print(f"check: seq {b} alone vs in batch 2: max |dlogit| {err:.4g} (tol {tol:.4g}), argmax same: {same}")
        ok &= err <= tol and same
    moe_layers = [l for l in range(c.L) if c.mlp[l] == "moe"]
    if moe_layers:
        m.plant = moe_layers[-1]
        _, bad, _ = m.step(tok, pos, seq)
        m.plant = None
        err = (bad[0] - both[0]).abs().max().item()
        print(f"check: planted wrong expert id (layer {moe_layers[-1]}, row 0): max |dlogit| {err:.4g} -> "
              f"{'caught' if err > 5 * tol else 'NOT caught'}")
        ok &= err > 5 * tol
    sparse = [l for l in range(c.L) if c.attn[l] == "sparse"]
    if sparse:
        r = rec[sparse[0]]
        sel = r[0] if isinstance(r, tuple) else r
        loc = bool((sel == (pos // c.bs)[:, None, None]).any(-1).all().item())
        print(f"check: layer {sparse[0]} selects {sel.shape[-1]} of {m.NB} blocks, local block always kept: {loc}")
        ok &= loc and sel.shape[-1] < m.NB
    try:
        import numpy, ml_dtypes  # noqa: F401  (the reference needs both)
        have_ref = True
    except ImportError as e:
        print(f"check: numpy reference skipped ({e})")
        have_ref = False
    for sq in range(2) if have_ref else ():
        err, am, diff, near = ref_check(m, tok, pos, sq)
        print(f"check: seq {sq} vs golden/gen/m3ref (numpy, f64): max |dlogit| / max |logit| {err:.3g}, "
              f"argmax same (or near-tie) {am}, choices that differ: {', '.join(diff) or 'none'}"
              + (f" (the first {'is' if near else 'is NOT'} a near-tie: {NEAR_TIE}; later ones follow from it)" if diff else ""))
        ok &= am and near and (err < 3e-2 or bool(diff))  # a near-tie flip may move logits further
    if moe_layers and hasattr(torch, "_grouped_mm"):
        l = moe_layers[0]
        h = torch.randn(3, c.H, device=dev, generator=m.g).to(torch.bfloat16)
        try:
            m.moe = "grouped"
            ya, _ = m.moe_layer(m.layers[l], h, l)
            m.moe = "bmm"
            yb, _ = m.moe_layer(m.layers[l], h, l)
            err = ((ya - yb).abs().max() / yb.abs().max()).item()
            print(f"check: torch._grouped_mm vs gather+bmm, relative max error {err:.3g}")
            ok &= err < 2e-2
        except Exception as e:  # not every build runs _grouped_mm on every device
            print(f"check: torch._grouped_mm not runnable here ({str(e).splitlines()[0][:120]})")
        m.moe = moe
    if dev.type == "cuda":  # the captured step computes what the eager step does
        st = dict(tok=tok.clone(), pos=pos, seq=seq)
        g = capture(m, st, None)
        st["tok"].copy_(tok)
        g.replay()
        torch.cuda.synchronize()
        err = (st["glogits"] - both).abs().max().item()
        print(f"check: CUDA graph replay vs eager, batch 2: max |dlogit| {err:.4g} (tol {tol:.4g})")
        ok &= err <= tol
        if getattr(args, "compile", "off") != "off":  # the compiled, captured step too
            from peer import compiled_step
            cst = dict(tok=tok.clone(), pos=pos, seq=seq)
            cg = capture(m, cst, None, compiled_step(m, args.compile))
            cst["tok"].copy_(tok)
            cg.replay()
            torch.cuda.synchronize()
            err = (cst["glogits"] - both).abs().max().item()
            # inductor fuses and reorders f32 / bf16 roundings: a looser bound
            print(f"check: torch.compile ({args.compile}) + graph vs eager, batch 2: max |dlogit| "
                  f"{err:.4g} (tol {4 * tol:.4g})")
            ok &= err <= 4 * tol
    print(f"check: moe path {moe}, cache {args.cache}")
    print("check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1
