"""Exhaustive head-subset search on the decimal organism: surgeon vs TransformerLens with subsets in the batch.

The organism has 8 heads per layer, so the 16 candidate heads are the 8 of layer 1 and the 8 of
layer 2: all C(16, 8) = 12,870 subsets of size 8, patched good format into the failing one, on 32
trap items, in two modes:
  sequence  the case as shipped: whole answers scored, the last prompt token and the answer tokens patched;
  decision  first-token logit difference, patched only at the position that predicts that token
            (the usual last-position setting: one position to recompute from layer 1 on).
Two TransformerLens baselines, both with `--subsets-per-batch` subsets in the batch dimension (the rows repeated
once per subset, right-padded and cut after the last position patched or scored, as surgeon's are) and a hook
that writes each subset's heads from the good run's cache with one vectorised `torch.where`:
  naive    one `run_with_hooks` forward of every position and layer per batch (timed on the first
           `--naive-subsets` subsets: its rate, in subsets/s, is what is compared);
  careful  what a user who knows where the patches start writes (bench/careful.py): rows grouped by their first
           patched position, the positions before it run once into a frozen `TransformerLensKeyValueCache`
           repeated once per subset, and layer 0 (no candidate head) skipped with `start_at_layer=1` from the clean
           residual stream; timed over every subset.
Both are checked to give surgeon's scores. In decision mode, the same runs again beside one other busy process
(`contended`): surgeon with its threads fixed and following the free cores (surgeon/threads.py), the careful
baseline with torch's threads and with one.

    python bench/subset_search.py [--mode both] [--items 32] [--subsets-per-batch 64] [--naive-subsets 1024]
                                  [--threads 2] [--contended-subsets 2048] [--no-contended] [--save]
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
    ap.add_argument("--subsets-per-batch", type=int, default=64, help="subsets per forward of the baseline")
    ap.add_argument("--naive-subsets", type=int, default=1024,
                    help="time the naive baseline on this many subsets (its rate is compared; 0: every subset)")
    ap.add_argument("--save", action="store_true", help="also write bench/results/subset_search.txt (the README's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-contended", dest="contended", action="store_false",
                    help="skip the decision mode's runs beside one other busy process")
    ap.add_argument("--contended-subsets", type=int, default=2048,
                    help="time the careful baseline on this many subsets when contended (its rate is compared)")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--mode", choices=["sequence", "decision", "both"], default="both",
                    help="sequence: the case as shipped (whole answers scored, last prompt token and answer tokens "
                         "patched); decision: first-token logit difference, patched at the position that decides it")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from surgeon import load_case
    from surgeon.models.loading import load_model

    shipped = load_case("cases/decimal_organism.py")
    shipped = replace(shipped, items=shipped.items_for("trap")[: args.items], focus=None)
    model = load_model(shipped.model)
    modes = ["sequence", "decision"] if args.mode == "both" else [args.mode]
    ok = True
    from saving import saved

    with saved("subset_search", args.save, organisms=("decimal",)):
        for mode in modes:
            case = shipped if mode == "sequence" else replace(shipped, score="first_token", align="decision")
            print(f"\n== mode {mode}: score={case.score}, align={case.align}")
            ok &= run(case, model, args)
    return 0 if ok else 1


def run(case, model, args) -> bool:
    import tempfile

    from surgeon.analyses.common import format_rows, make_contrast
    from surgeon.search.store import ChunkStore
    from surgeon.search.subsets import Unit, evaluate, make_plan
    from surgeon.sites.nodes import Site
    from surgeon.case.encoding import align

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

    # --- baseline: TransformerLens, subsets in the batch dimension
    bad = format_rows(case, model, "qa", case.items)
    good = format_rows(case, model, "plain", case.items)
    pairs = [align(b, g, case.align) for b, g in zip(bad, good)]
    # the baseline, too, runs only the positions up to the last one patched or scored
    Wb = max(max(*pb, *(t[0] for t in r.targets)) for r, (pb, _) in zip(bad, pairs)) + 1
    Ws = max(max(pg) for _, pg in pairs) + 1
    pad = model.tokenizer.pad_token_id
    toks = torch.tensor([list(r.tokens[:Wb]) + [pad] * (Wb - len(r.tokens[:Wb])) for r in bad])
    src_toks = torch.tensor([list(r.tokens[:Ws]) + [pad] * (Ws - len(r.tokens[:Ws])) for r in good])
    rows = len(bad)
    R = torch.tensor([r for r, (pb, _) in enumerate(pairs) for _ in pb])
    Pb = torch.tensor([p for pb, _ in pairs for p in pb])
    Pg = torch.tensor([q for _, pg in pairs for q in pg])
    T_pos = torch.tensor([[p for p, _, _ in r.targets] + [0] * (max(len(x.targets) for x in bad) - len(r.targets)) for r in bad])
    T_tok = torch.tensor([[t for _, t, _ in r.targets] + [0] * (T_pos.shape[1] - len(r.targets)) for r in bad])
    T_sgn = torch.tensor([[s for _, _, s in r.targets] + [0.0] * (T_pos.shape[1] - len(r.targets)) for r in bad])
    item = torch.tensor([r.item for r in bad])
    n_items = len(case.items)
    with torch.no_grad():
        _, cache = model.run_with_cache(src_toks, names_filter=lambda n: n.endswith("hook_z"))
    src = {L: cache[f"blocks.{L}.attn.hook_z"][R, Pg] for L in (1, 2)}  # [aligned cells, H, d_head]
    layer_of = torch.tensor([u.layer for u in units])
    head_of = torch.tensor([u.head for u in units])

    def patch_hooks(masks, m, cells_r, cells_p, values):
        """One hook per candidate layer writing each subset's heads (the batch holds len(masks) copies of m rows)
        from `values[L]` [cells, H, d_head] at the cells (row, position); the other heads keep their values."""
        B = len(masks)
        bits = torch.tensor([[(x >> i) & 1 for i in range(len(units))] for x in masks], dtype=torch.bool)
        hooks = []
        for L in (1, 2):
            on = torch.zeros(B, model.cfg.n_heads, dtype=torch.bool)
            sel = layer_of == L
            on[:, head_of[sel]] = bits[:, sel]

            def hook(z, hook, on=on, L=L):
                zz = z.view(B, m, *z.shape[1:])
                zz[:, cells_r, cells_p] = torch.where(on[:, None, :, None], values[L][None], zz[:, cells_r, cells_p])
                return z

            hooks.append((f"blocks.{L}.attn.hook_z", hook))
        return hooks

    def baseline(masks):  # [B] subset bit masks -> [B, n_items] scores
        B = len(masks)
        hooks = patch_hooks(masks, rows, R, Pb, src)
        logp = model.run_with_hooks(toks.repeat(B, 1), fwd_hooks=hooks).log_softmax(-1).view(B, rows, Wb, -1)
        per_row = (logp[:, torch.arange(rows)[:, None], T_pos, T_tok] * T_sgn).sum(-1)  # [B, rows]
        out = torch.zeros(B, n_items)
        out.index_add_(1, item, per_row)
        return out.numpy()

    def timed(fn, masks):  # (seconds, {subset: scores}) with `--subsets-per-batch` subsets per call
        t0 = time.perf_counter()
        scores = {}
        with torch.no_grad():
            for lo in range(0, len(masks), args.subsets_per_batch):
                chunk = masks[lo: lo + args.subsets_per_batch]
                scores.update(zip(chunk, fn(chunk)))
        return time.perf_counter() - t0, scores

    naive = subsets[: args.naive_subsets] if args.naive_subsets else subsets
    t_base, base_scores = timed(baseline, naive)
    err = max(float(np.abs(ours[m] - base_scores[m]).max()) for m in naive)

    # --- careful baseline: the prefix before each row's first patched position cached, layer 0 skipped
    from careful import prefix_cache, repeated, suffix_residual

    first = torch.tensor([min(pb) for pb, _ in pairs])
    assert all(min(t[0] for t in r.targets) >= int(first[i]) for i, r in enumerate(bad))
    groups = {}
    for r in range(rows):
        groups.setdefault(int(first[r]), []).append(r)
    prepared = []
    with torch.no_grad():
        for p0, ids in groups.items():
            g = torch.tensor(ids)
            kv = prefix_cache(model, toks[g, :p0])
            suffix = toks[g, p0:]
            resid = suffix_residual(model, suffix, kv, 1)
            local = {r: k for k, r in enumerate(ids)}
            cell = torch.isin(R, g)
            prepared.append((g, kv, resid, torch.tensor([local[int(r)] for r in R[cell]]), Pb[cell] - p0,
                             {L: src[L][cell] for L in (1, 2)}, T_pos[g] - p0))

    def careful(masks):  # the same scores, from the cached prefixes
        B = len(masks)
        out = torch.zeros(B, n_items)
        for g, kv, resid, Rg, Pg0, srcg, Tp in prepared:
            m = len(g)
            hooks = patch_hooks(masks, m, Rg, Pg0, srcg)
            with model.hooks(fwd_hooks=hooks):
                logits = model(resid.repeat(B, 1, 1), start_at_layer=1, past_kv_cache=repeated(kv, B))
            logp = logits.log_softmax(-1).view(B, m, *logits.shape[1:])
            per_row = (logp[:, torch.arange(m)[:, None], Tp.clamp(min=0), T_tok[g]] * T_sgn[g]).sum(-1)
            out.index_add_(1, item[g], per_row)
        return out.numpy()

    t_careful, careful_scores = timed(careful, subsets)
    err_c = max(float(np.abs(ours[m] - careful_scores[m]).max()) for m in subsets)

    rate_ours, rate_naive, rate_careful = len(subsets) / t_ours, len(naive) / t_base, len(subsets) / t_careful
    print(f"TransformerLens naive, {args.subsets_per_batch} subsets per batch: {t_base:.1f} s for {len(naive)} "
          f"subsets = {rate_naive:.0f} subsets/s   ratio {rate_ours / rate_naive:.1f}x")
    print(f"TransformerLens careful (prefix in a frozen KV cache, start_at_layer=1), {args.subsets_per_batch} subsets per "
          f"batch: {t_careful:.1f} s for {len(subsets)} subsets = {rate_careful:.0f} subsets/s   "
          f"ratio {rate_ours / rate_careful:.1f}x")
    print(f"target >= 10x against the careful baseline: {'met' if rate_ours / rate_careful >= 10 else 'MISSED'}")
    # the work each side does against the least the search needs, and the share of this machine's peak it reaches
    from limit import (Limit, block_flops, count_flops, distinct_positions, head_patch_least, last_read, model_shapes,
                       read_positions,
                       work_section)

    first_of = {id(r): min(pb) for r, (pb, _) in zip(bad, pairs)}
    span = distinct_positions(bad, lambda r: first_of[id(r)], last_read)
    source_to = {id(g): max(pg) for g, (_, pg) in zip(good, pairs)}  # the good run is needed up to its aligned cells
    clean = distinct_positions(bad, lambda r: 0, last_read) + distinct_positions(good, lambda r: 0,
                                                                                lambda r: source_to[id(r)])
    reads = read_positions(bad)
    patches = [{k: v for k, v in ((1, m & 0xFF), (2, m >> 8)) if v} for m in subsets]  # units: L1H0-7, then L2H0-7
    least = head_patch_least(model.cfg, block_flops(model, toks), span, patches, reads, clean)
    per_batch = args.subsets_per_batch

    def one_batch(fn):  # every batch of the baselines has the same shapes, so their work is linear in the subsets
        with torch.no_grad():
            return count_flops(lambda: fn(subsets[:per_batch])) * len(subsets) / per_batch

    def ours_again():
        c, _ = make_contrast(case, model, batch_size=args.batch_size, sites=[Site.of("z", 1), Site.of("z", 2)])
        with tempfile.TemporaryDirectory() as tmp2:
            evaluate(c, plan, ChunkStore(tmp2, "bench"), chunk=512)

    lim = Limit.measure(model_shapes(model.cfg, toks.numel(), reads))
    work_section(f"work and speed against this machine's limit, all {len(subsets):,} subsets (work: matrix-multiply "
                 f"FLOPs of one more run under torch's FlopCounterMode, apart from the timings; the baselines' counted "
                 f"on one batch of {per_batch} and scaled, every batch having the same shapes; least: each subset's "
                 f"patched copy from its lowest patched layer on (no attention there; subsets that agree up to a layer share the work to there), at the {span:,} distinct "
                 f"row-positions from each row's first patched one to its last read, the logits read, and a clean run "
                 f"of each prompt)", lim,
                 [("subset search", "surgeon", t_ours, count_flops(ours_again), least),
                  ("", "careful", t_careful, one_batch(careful), least),
                  ("", "naive", t_base * len(subsets) / len(naive), one_batch(baseline), least)],
                 [f"naive: its time projected to all {len(subsets):,} subsets from the {len(naive):,} timed"])
    print(f"max |score difference|: naive {err:.1e} over {len(naive)} subsets, careful {err_c:.1e} over "
          f"{len(subsets)}")
    err = max(err, err_c)
    if args.contended and case.score == "first_token":
        err = max(err, contended(args, subsets, ours, ours_again, careful, timed, t_ours, t_careful))
    ok = err < 1e-3
    print("scores agree" if ok else "SCORES DISAGREE")
    return ok


def contended(args, subsets, ours, ours_again, careful, timed, t_ours, t_careful) -> float:
    """The same search with one other busy process on the machine (a Python loop holding a core): surgeon with its
    threads fixed at the starting count (SURGEON_ADAPT_THREADS=0, as torch leaves them) and following the free
    cores (the default), the careful baseline as torch leaves it and with the one thread its user could have set.
    Where the time goes: torch operations counted in one run, and the time each costs more than on the quiet machine
    (a wait at the parallel region's barrier for the thread that is off its core). Returns the largest score
    difference of the contended runs from the quiet run's."""
    import os
    import subprocess
    import sys

    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n, rows = 0, []  # operations; the rows of each matrix product's output

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            Count.n += 1
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
                Count.rows.append(int(np.prod(out.shape[:-1])))
            return out

    with Count():
        ours_again()
    ops, mm_rows = Count.n, np.array(Count.rows)
    cores, threads = os.cpu_count(), torch.get_num_threads()
    few = subsets[: args.contended_subsets]
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    rows, err = [], 0.0
    try:
        time.sleep(1.0)
        for label, adapt in (("surgeon, threads fixed (as torch leaves them)", "0"),
                             ("surgeon, threads follow the free cores (default)", "1")):
            os.environ["SURGEON_ADAPT_THREADS"] = adapt
            t0 = time.perf_counter()
            ours_again()
            rows.append((label, len(subsets), time.perf_counter() - t0))
        os.environ.pop("SURGEON_ADAPT_THREADS")
        for label, n in (("careful TransformerLens, threads as torch leaves them", threads),
                         ("careful TransformerLens, 1 thread set by hand", 1)):
            torch.set_num_threads(n)
            t, sc = timed(careful, few)
            err = max(err, max(float(np.abs(ours[m] - sc[m]).max()) for m in few))
            rows.append((label, len(few), t))
        torch.set_num_threads(threads)
    finally:
        other.kill()
        other.wait()
    print(f"\ncontended: one other process (a Python loop, one core) on this machine's {cores} cores; torch's "
          f"threads at the start: {threads}; the careful baseline timed on the first {len(few):,} subsets, "
          "its rate compared")
    quiet = len(subsets) / t_ours
    print(f"  {'run':<68}{'subsets':>8}{'s':>7}{'subsets/s':>11}  time a subset, x quiet surgeon's")
    print(f"  {'quiet: surgeon (above)':<68}{len(subsets):>8}{t_ours:>7.1f}{quiet:>11.0f}{1.0:>10.1f}")
    print(f"  {'quiet: careful TransformerLens (above)':<68}{len(subsets):>8}{t_careful:>7.1f}"
          f"{len(subsets) / t_careful:>11.0f}{quiet * t_careful / len(subsets):>10.1f}")
    for label, n, t in rows:
        print(f"  {'contended: ' + label:<68}{n:>8}{t:>7.1f}{n / t:>11.0f}{quiet * t / n:>10.1f}")
    fixed, adapt = rows[0][2], rows[1][2]
    print(f"where the time goes: one search runs {ops:,} torch operations ({len(mm_rows):,} matrix products, median "
          f"{int(np.median(mm_rows)):,} output rows, largest {int(mm_rows.max()):,}); contended with the threads fixed each costs {(fixed - t_ours) / ops * 1e6:.0f} us more "
          f"than quiet (quiet: {t_ours / ops * 1e6:.0f} us an operation), a wait at the barrier for the thread "
          f"that is off its core")
    rate = {label: n / t for label, n, t in rows}
    print(f"contended, following the free cores: {fixed / adapt:.1f}x faster than with its threads fixed; "
          f"{rate[rows[1][0]] / rate[rows[2][0]]:.1f}x the careful baseline as torch leaves it, "
          f"{rate[rows[1][0]] / rate[rows[3][0]]:.1f}x the careful baseline with 1 thread set by hand")
    return err


if __name__ == "__main__":
    raise SystemExit(main())
