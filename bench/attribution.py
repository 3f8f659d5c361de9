"""Node attribution against exact patching: which estimate is closest, and at what cost.

On the decimal organism's trap items, for the head outputs (z), queries (q) and keys (k, per key/value head) of
every layer, each `surgeon attribute --method` (gradient, ig, atp*) is timed and compared with exact per-unit
patching run in the same process:
  Pearson     signed estimate vs signed exact effect (atp* estimates magnitudes: n/a);
  Spearman|.| ranks of |estimate| vs |exact| (what a search for the units that matter uses);
  top-5       how many of the 5 units with the largest exact |effect| are in the method's top 5;
  time        wall time of the estimate (contrast built, forward and backward passes), and as a multiple of the
              plain gradient's; exact patching's own time for reference.

    python bench/attribution.py [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("gradient", "ig", "atp*")


def _ranks(x: np.ndarray) -> np.ndarray:
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(len(x))
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/attribution.txt (the README's)")
    args = ap.parse_args()
    from saving import saved

    with saved("attribution", args.save, organisms=("decimal",)):
        return run(args)


def run(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    from surgeon import load_case
    from surgeon.analyses.attribution import attribute
    from surgeon.analyses.patching import patch_heads
    from surgeon.models.loading import load_model

    case = load_case(ROOT / "cases" / "decimal_organism.py")
    model = load_model(case.model)
    attribute(case, model, layers=[0])  # warm up (first calls pay one-off costs)
    print(f"decimal organism, {len(case.items_for(case.focus))} trap items, {args.threads} threads\n")
    sides = []
    print("| component | method | Pearson | Spearman abs | top-5 | time | x gradient |")
    print("|---|---|---|---|---|---|---|")
    for comp in ("z", "q", "k"):
        t0 = time.perf_counter()
        exact = patch_heads(case, model, component=comp).fraction.ravel()
        t_exact = time.perf_counter() - t0
        top = set(np.argsort(-np.abs(exact), kind="stable")[:5])
        base = None
        for method in METHODS:
            t0 = time.perf_counter()
            r = attribute(case, model, component=comp, method=method)
            dt = time.perf_counter() - t0
            base = base or dt
            sides.append((f"{comp} {method}", "surgeon", dt,
                          lambda c=comp, m=method: attribute(case, model, component=c, method=m), None))
            est = r.estimate.ravel()
            pearson = "n/a" if method == "atp*" else f"{np.corrcoef(est, exact)[0, 1]:.2f}"
            spearman = np.corrcoef(_ranks(np.abs(est)), _ranks(np.abs(exact)))[0, 1]
            hits = len(top & set(np.argsort(-np.abs(est), kind="stable")[:5]))
            print(f"| {comp} ({len(exact)} units) | `{method}` | {pearson} | {spearman:.2f} | {hits}/5 | "
                  f"{dt:.2f} s | {dt / base:.1f} |")
        print(f"| {comp} ({len(exact)} units) | exact patching | 1 | 1 | 5/5 | {t_exact:.2f} s | {t_exact / base:.1f} |")
        sides.append((f"{comp} exact patching", "surgeon", t_exact,
                      lambda c=comp: patch_heads(case, model, component=c), None))
    from limit import case_rows, counted_section

    print()
    counted_section("work and speed against this machine's limit (work: matrix-multiply FLOPs of one more run of each "
                    "under torch's FlopCounterMode, apart from the timings)", [(model.cfg, case_rows(case, model))], sides,
                    ["least: a gradient's is one forward and backward and a clean run of each prompt (EAP's floor: "
                     "bench/scale.py and bench/edges.py count it on models large enough to show it)"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
