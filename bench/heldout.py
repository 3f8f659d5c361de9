"""What the discovery / evaluation split adds in time: the subset search and the circuit, in-sample against held-out.

On the decimal organism's 64 trap items (the case's focus), side by side in one process:
  threshold   the subset search of layer 0's 8 heads (every subset of each size, the even and odd groups too) on
              every item, in-sample, against `threshold_heldout` at holdout 0.5: the same search on the 32
              discovery items, then each family's best subset per size and the subsets around each k* patched on the
              32 held-out items;
  circuit     `discover` (its default method, the top 50 edges verified exactly, the smallest faithful prefix) on every item
              against `circuit_heldout`: the same on the discovery items, then the circuit it prunes measured once on
              the held-out items.
The held-out evaluation's own cost is the held-out run's time minus that of its search on the discovery items alone
(timed here too); its work is counted in patched forwards (subsets x items), beside the search's.

    python bench/heldout.py [--repeats 3] [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/heldout.txt (the docs')")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from saving import best_of, saved

    from surgeon import load_case
    from surgeon.analyses.circuit import discover
    from surgeon.analyses.heldout import circuit_heldout, eval_split, threshold_heldout
    from surgeon.models.loading import load_model
    from surgeon.analyses.threshold import threshold_search

    case = load_case("cases/decimal_organism.py")
    model = load_model(case.model)
    split, disc, ev = eval_split(case, None, 0.5, 0)
    disc_case = replace(case, items=disc, focus=None)
    search = dict(layer=0, groups=["even", "odd"], budget=200, item_rate=0.9)
    with saved("heldout", args.save, organisms=("decimal",)):
        print(f"decimal organism, {len(disc) + len(ev)} {case.focus} items: {split.describe()}; best of {args.repeats} "
              f"runs, {args.threads} threads")
        t_all, r_all = best_of(args.repeats, lambda: threshold_search(case, model, **search))
        t_disc, _ = best_of(args.repeats, lambda: threshold_search(disc_case, model, **search))
        t_held, r_held = best_of(args.repeats, lambda: threshold_heldout(case, model, holdout=0.5, **search))
        n_search = sum(s.evaluated for s in r_all.sizes)
        n_eval = len(r_held.rows) + sum(len(t.sizes) and sum(e.n for e in t.sizes.values()) for t in r_held.k_star)
        print(f"\nthreshold (layer 0's 8 heads, {n_search} subset evaluations over the families):")
        print(f"  in-sample search on all {r_all.n_items} items        {t_all:7.2f} s")
        print(f"  held-out: search on {len(disc)} discovery items      {t_disc:7.2f} s")
        print(f"  held-out: search + evaluation on {len(ev)} items     {t_held:7.2f} s   ratio to in-sample "
              f"{t_held / t_all:.2f}x")
        print(f"  the held-out evaluation alone: {max(t_held - t_disc, 0.0):.2f} s for {n_eval} subsets x {len(ev)} "
              f"items = {n_eval * len(ev)} patched forwards, against the search's {n_search} x {len(disc)} = "
              f"{n_search * len(disc)} ({100 * n_eval / n_search:.0f}% of its work)")
        found = dict(verify=50, n_paths=0)  # the default method: what surgeon circuit and the report run
        t_call, c_all = best_of(args.repeats, lambda: discover(case, model, **found))
        t_cdisc, _ = best_of(args.repeats, lambda: discover(disc_case, model, **found))
        t_chold, c_held = best_of(args.repeats, lambda: circuit_heldout(case, model, holdout=0.5, **found))
        print(f"\ncircuit ({c_all.method} over {c_all.n_edges} edges, the top 50 verified exactly):")
        print(f"  in-sample on all {len(disc) + len(ev)} items              {t_call:7.2f} s   ({len(c_all.circuit)} edges, "
              f"f = {c_all.circuit_faithfulness:.3f})")
        print(f"  held-out: found on {len(disc)} discovery items       {t_cdisc:7.2f} s")
        print(f"  held-out: found + measured on {len(ev)} items        {t_chold:7.2f} s   ratio to in-sample "
              f"{t_chold / t_call:.2f}x   ({len(c_held.search.circuit)} edges, f = "
              f"{c_held.held_out['faithfulness']:.3f} held out, {c_held.search.circuit_faithfulness:.3f} in-sample)")
        print(f"  the held-out measurement alone: {max(t_chold - t_cdisc, 0.0):.2f} s (one circuit's forwards on "
              f"{len(ev)} items)")
        from limit import case_rows, counted_section

        counted_section("work and speed against this machine's limit (work: matrix-multiply FLOPs of one more run of "
                        "each under torch's FlopCounterMode, apart from the timings)",
                        [(model.cfg, case_rows(case, model))], [
                            ("threshold, in-sample", "surgeon", t_all, lambda: threshold_search(case, model, **search),
                             None),
                            ("threshold, held-out", "surgeon", t_held,
                             lambda: threshold_heldout(case, model, holdout=0.5, **search), None),
                            ("circuit, in-sample", "surgeon", t_call, lambda: discover(case, model, **found), None),
                            ("circuit, held-out", "surgeon", t_chold,
                             lambda: circuit_heldout(case, model, holdout=0.5, **found), None)],
                        ["least: not derived for searches (what they evaluate depends on the path they take); the "
                         "held-out run's work against the in-sample one's is what this bench compares"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
