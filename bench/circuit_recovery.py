"""Planted-circuit recovery: how well each edge-scoring method finds the edges an organism was built or
measured to use.

For each organism with a planted circuit (its `ground_truth`):
  induction  input -> a0.h1<v> -> a1.h0<k> -> logits (previous-token head feeding the induction head's key);
  threshold  the 16 even heads: the format marker into their query (input -> a0.h{even}<q>) and their output
             into the answer (a0.h{even} -> logits);
  decimal    trained, not built: no planted edge set, so it is not scored here.
it prints, per method (`surgeon.circuits.methods.METHODS`): the ROC AUC of |score| against planted
membership, the rank of every planted edge (1 = top), the faithfulness of the planted circuit itself, and
the wall time of the scoring. Goal: AUC >= 0.99 for exact patching and EAP-IG-inputs on both organisms.

    python bench/circuit_recovery.py [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def planted_edges(name: str, gt: dict) -> list[str]:
    if name == "induction":
        return list(gt["edges"])
    even = gt["heads"]["repairing"]
    return [f"input->{h}<q>" for h in even] + [f"{h}->logits" for h in even]


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Probability that a planted edge outranks an unplanted one (ties count half): Mann-Whitney U / (n+ n-)."""
    s = np.abs(scores)
    pos, neg = s[positive], s[~positive]
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/circuit_recovery.txt (the README's)")
    args = ap.parse_args()
    from saving import saved

    with saved("circuit_recovery", args.save, organisms=("induction", "threshold")):
        return run(args)


def run(args) -> int:
    import torch

    torch.set_num_threads(args.threads)
    from limit import case_rows

    from surgeon import load_case
    from surgeon.analyses.circuit import METHODS, edge_scores
    from surgeon.analyses.circuit_runs import circuit_runs
    from surgeon.errors import AnalysisError
    from surgeon.models.loading import load_model
    from surgeon.organisms import ground_truth
    from surgeon.sites.edges import EdgeSite

    print("| organism | method | ROC AUC | planted edges' ranks | f(planted circuit) | time |")
    print("|---|---|---|---|---|---|")
    notes = []
    sides, models = [], []
    for name in ("induction", "threshold"):
        case = load_case(str(ROOT / "cases" / f"{name}_organism.py"))
        model = load_model(case.model)
        site = EdgeSite.of(model.cfg)
        models.append((model.cfg, case_rows(case, model)))
        runs = circuit_runs(case, model, site)  # the kept reading (MIB's), resample ablation
        contrast = runs.scoring
        where = 'every position' if runs.positions == 'every position' else 'aligned positions'
        planted = planted_edges(name, ground_truth(name))
        idx = [site.index(e) for e in planted]
        positive = np.zeros(len(site.edges), bool)
        positive[idx] = True
        f_planted = float(runs.value([idx])[0][0])
        for method in METHODS:
            t0 = time.perf_counter()
            try:
                s = edge_scores(contrast, site, method)
            except AnalysisError as e:
                print(f"| {name} ({len(site.edges)} edges, kept, {where}) | {method} | n/a | | | |")
                notes.append(f"{name}, {method}: {str(e).splitlines()[0]}")
                continue
            dt = time.perf_counter() - t0
            sides.append((f"{name} {method}", "surgeon", dt,
                          lambda c=contrast, st=site, m=method: edge_scores(c, st, m), None))
            order = np.argsort(-np.abs(s), kind="stable")
            rank = {int(e): i + 1 for i, e in enumerate(order)}
            ranks = sorted(rank[e] for e in idx)
            shown = ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}-{ranks[-1]} (all {len(ranks)})"
            print(f"| {name} ({len(site.edges)} edges, kept, {where}) | {method} | {roc_auc(s, positive):.3f} | "
                  f"{shown} | {f_planted:.3f} | {dt:.2f} s |")
    for n in notes:
        print(f"\n{n}")
    print("\ndecimal: trained, not built; no planted edge set to score (see its measured facts: "
          "`surgeon organisms describe decimal`).")
    from limit import counted_section

    counted_section("work and speed against this machine's limit (work: matrix-multiply FLOPs of one more run of each "
                    "method under torch's FlopCounterMode, apart from the timings)", models, sides,
                    ["least: EAP's (the floor, the other run's forward and the edges' dot products) is bench/edges.py's "
                     "and bench/scale.py's; "
                     "these organisms are too small for their times to be more than fixed costs"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
