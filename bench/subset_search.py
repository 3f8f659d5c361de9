"""Exhaustive head-subset search on the decimal organism: surgeon vs one TransformerLens forward per subset.

The organism has 8 heads per layer, so the 16 candidate heads are the 8 of layer 1 and the 8 of
layer 2: all C(16, 8) = 12,870 subsets of size 8, patched good format into the failing one, on 32
trap items, in two modes:
  sequence  the case as shipped: whole answers scored, the last prompt token and the answer tokens patched;
  decision  first-token logit difference, patched only at the position that predicts that token
            (the usual last-position setting: one position to recompute from layer 1 on).
The baseline is a straightforward loop: one `run_with_hooks` forward per subset over all rows
(right-padded, cut after the last position patched or scored, as surgeon's are), timed on a sample
of subsets in the same run and checked to give the same scores.

    python bench/subset_search.py [--mode both] [--items 32] [--baseline 60] [--threads 2]
"""
from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import replace

import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=32)
    ap.add_argument("--baseline", type=int, default=60, help="subsets timed with the baseline loop")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--mode", choices=["sequence", "decision", "both"], default="both",
                    help="sequence: the case as shipped (whole answers scored, last prompt token and answer tokens "
                         "patched); decision: first-token logit difference, patched at the position that decides it")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from surgeon import load_case
    from surgeon.models import load_model

    shipped = load_case("cases/decimal_organism.py")
    shipped = replace(shipped, items=shipped.items_for("trap")[: args.items], focus=None)
    model = load_model(shipped.model)
    modes = ["sequence", "decision"] if args.mode == "both" else [args.mode]
    ok = True
    for mode in modes:
        case = shipped if mode == "sequence" else replace(shipped, score="first_token", align="decision")
        print(f"\n== mode {mode}: score={case.score}, align={case.align}")
        ok &= run(case, model, args)
    return 0 if ok else 1


def run(case, model, args) -> bool:
    import tempfile

    from surgeon.analyses.common import format_rows, make_contrast
    from surgeon.analyses.subsets import Unit, evaluate, make_plan
    from surgeon.sites import Site
    from surgeon.encoding import align
    from surgeon.jobs import ChunkStore

    units = [Unit(L, h) for L in (1, 2) for h in range(8)]
    subsets = [sum(1 << i for i in c) for c in itertools.combinations(range(16), 8)]
    print(f"decimal organism: C(16, 8) = {len(subsets)} subsets of heads L1H0-7 + L2H0-7, {len(case.items)} items")

    # --- surgeon: the subset search's own evaluation path (chunks saved to disk as they finish)
    plan = make_plan(units, {}, budget=len(subsets))
    plan = replace(plan, unique=tuple(subsets))
    t0 = time.perf_counter()
    contrast, _ = make_contrast(case, model, batch_size=args.batch_size, sites=[Site.of("z", 1), Site.of("z", 2)])
    with tempfile.TemporaryDirectory() as tmp:
        store = ChunkStore(tmp, "bench")
        evaluate(contrast, plan, store, chunk=512)
        t_ours = time.perf_counter() - t0
        chunks = list(store.iter())
    ours = {}
    for ch in chunks:
        for row, sc in zip(ch["masks"], ch["scores"]):
            ours[sum(1 << i for i, x in enumerate(row) if x)] = sc
    print(f"surgeon: {t_ours:.1f} s for {len(subsets)} subsets = {len(subsets) / t_ours:.0f} subsets/s")

    # --- baseline: one TL forward per subset
    bad = format_rows(case, model, "qa", case.items)
    good = format_rows(case, model, "plain", case.items)
    pairs = [align(b, g, case.align) for b, g in zip(bad, good)]
    # the loop, too, runs only the positions up to the last one patched or scored
    Wb = max(max(*pb, *(t[0] for t in r.targets)) for r, (pb, _) in zip(bad, pairs)) + 1
    Ws = max(max(pg) for _, pg in pairs) + 1
    pad = model.tokenizer.pad_token_id
    toks = torch.tensor([list(r.tokens[:Wb]) + [pad] * (Wb - len(r.tokens[:Wb])) for r in bad])
    src_toks = torch.tensor([list(r.tokens[:Ws]) + [pad] * (Ws - len(r.tokens[:Ws])) for r in good])
    _, cache = model.run_with_cache(src_toks, names_filter=lambda n: n.endswith("hook_z"))
    rng = np.random.default_rng(0)
    sample = [subsets[i] for i in rng.choice(len(subsets), args.baseline, replace=False)]
    n_items = len(case.items)

    def baseline(mask):
        hooks = []
        for L in (1, 2):
            heads = [u.head for i, u in enumerate(units) if u.layer == L and (mask >> i) & 1]
            name = f"blocks.{L}.attn.hook_z"

            def hook(z, hook, heads=heads, name=name):
                for r, (pb, pg) in enumerate(pairs):
                    for p, q in zip(pb, pg):
                        z[r, p, heads] = cache[name][r, q, heads]
                return z

            hooks.append((name, hook))
        logp = model.run_with_hooks(toks, fwd_hooks=hooks).log_softmax(-1)
        out = torch.zeros(n_items)
        for r, row in enumerate(bad):
            out[row.item] += sum(s * logp[r, p, t] for p, t, s in row.targets)
        return out.numpy()

    t0 = time.perf_counter()
    with torch.no_grad():
        base_scores = [baseline(m) for m in sample]
    t_base = (time.perf_counter() - t0) / len(sample)
    err = max(float(np.abs(ours[m] - s).max()) for m, s in zip(sample, base_scores))
    print(f"baseline loop: {t_base * 1e3:.1f} ms per subset = {1 / t_base:.1f} subsets/s (timed on {len(sample)})")
    print(f"ratio: {t_base * len(subsets) / t_ours:.0f}x   (full search would take the loop {t_base * len(subsets):.0f} s)")
    print(f"max |score difference| on the sampled subsets: {err:.1e}")
    ok = err < 1e-3
    print("scores agree" if ok else "SCORES DISAGREE")
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
