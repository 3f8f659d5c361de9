"""How the subset search prints and saves: the threshold k*, held out, over folds, the subsets' rates and the blend."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from surgeon.reports import figures
from surgeon.search.subsets import per_subset, plan_from_options, subsets_csv_rows
from surgeon.sites.nodes import component
from surgeon.reports.text import interval, num, save
from surgeon.show import View
from surgeon.reports import tables


def save_threshold(out: Path, r, case, args, device: str | None) -> None:
    """A subset search's results, manifest, figure and per-subset table (subsets.csv) in `out`."""
    save(out, "threshold", r, case, args, device, figures={"threshold.png": figures.threshold_figure},
         tables={"subsets.csv": threshold_rows(r, out)})


def threshold_rows(r, out: Path | None = None) -> list:
    """subsets.csv: every evaluated subset once, with the families it belongs to (from the search's numbers kept
    with the result, else from its chunk store in `out`)."""
    scores = getattr(r, "subset_scores", None)
    if scores is None:
        scores = per_subset(out)
    return list(subsets_csv_rows(plan_from_options(r.options), scores, r.item_rate))


def threshold_text(r) -> str:
    pct = lambda v: f"{100 * v:5.1f}%"
    lines = [
        f"case {r.case} · subsets of {len(r.units)} {'SAE features' if r.component == 'sae_features' else r.component + ' heads'} ({', '.join(r.units)}) patched from "
        f"{r.source!r} into {r.base!r} · {r.n_items} items ({r.tag or 'all'})",
        f"a subset repairs when the model is right on >= {pct(r.item_rate).strip()} of the items; "
        f"{r.subsets_evaluated} distinct subsets evaluated"
        + ("" if r.complete else f" (PARTIAL: {r.chunks_done}/{r.chunks_total} chunks)"),
        "",
    ]
    empty = next((s for s in r.sizes if s.family == "all" and s.key[0] == 0 and s.evaluated), None)
    if empty is not None and empty.fraction >= 1:
        lines[-1:] = [f"warning: with nothing patched the {r.base!r} run already gets {pct(empty.mean_item_rate).strip()} "
                      f"of the items right, which meets the repair criterion: there is no failure to repair here "
                      f"(see `surgeon diagnose`, or raise --item-rate)", ""]
    for fam in ["all", *r.groups]:
        rows = [s for s in r.sizes if s.family == fam]
        members = r.units if fam == "all" else r.groups[fam]
        unit = "features" if r.component == "sae_features" else "heads"
        lines.append(f"{fam} ({len(members)} {unit}{'' if fam == 'all' else ': ' + ', '.join(members)}):")
        lines.append(f"  {'k':>3s} {'subsets':>15s}  {'repairing [95% CI]':28s} {'mean item rate':>14s} {'mean repair frac':>16s}"
                     f"  {'best subset: items right [95% CI]':s}")
        for s in rows:
            how = f"{s.evaluated}/{s.total}" + ("" if s.enumerated else " sampled")
            ci = "exact" if s.enumerated and s.evaluated == s.total else f"[{pct(s.lo)}, {pct(s.hi)}]"
            frac = num(s.mean_repair_fraction, "16.3f") if np.isfinite(s.mean_repair_fraction) else f"{'-':>16s}"
            best = (f"  {pct(s.best_item_rate)} [{pct(s.best_lo)}, {pct(s.best_hi)}]" if np.isfinite(s.best_item_rate)
                    else "")
            lines.append(f"  {s.key[0]:3d} {how:>15s}  {pct(s.fraction)} {ci:21s} {pct(s.mean_item_rate):>14s} {frac}{best}")
        t = r.threshold(fam)
        if t.k_star is None:
            top = max((s for s in rows if np.isfinite(s.best_item_rate)), key=lambda s: s.best_item_rate, default=None)
            near = (f"; the best subset gets {pct(top.best_item_rate).strip()} of the items right (k = {top.key[0]}), "
                    f"short of the criterion ({pct(r.item_rate).strip()}): see the last column, or lower --item-rate"
                    if top is not None and top.best_item_rate < r.item_rate else "")
            lines.append(f"  threshold: no size k has >= {pct(t.x).strip()} of subsets repairing{near}")
        else:
            lines.append(f"  threshold k* = {t.k_star} (smallest k with >= {pct(t.x).strip()} repairing; jump from "
                         f"k*-1: {t.jump:+.3f}); every subset repairs from k = {t.k_all if t.k_all is not None else 'never'}")
        lines.append("")
    grid = [s for s in r.sizes if " x " in s.family]
    if grid:
        name = grid[0].family
        I = max(s.key[0] for s in grid)
        J = max(s.key[1] for s in grid)
        lines.append(f"mixed subsets {name}: fraction repairing (rows: i heads from the first group, columns: j from the second)")
        lines.append("     " + "".join(f"{j:>7d}" for j in range(J + 1)))
        for i in range(I + 1):
            row = {s.key[1]: s for s in grid if s.key[0] == i}
            lines.append(f"{i:4d} " + "".join(f"{row[j].fraction:7.2f}" if j in row and row[j].evaluated else "      -"
                                             for j in range(J + 1)))
        lines.append("")
    unit = "feature" if r.component == "sae_features" else "head"
    lines.append(f"per {unit}: share of repairing subsets that contain it; repair rate of subsets with / without it")
    for u in r.unit_stats:
        alone = "" if u.alone_item_rate is None else f"   alone repairs {pct(u.alone_item_rate).strip()} of items"
        lines.append(f"  {u.unit:7s} in {pct(u.in_repairing)} · with {pct(u.rate_with)} [{pct(u.rate_with_lo)}, "
                     f"{pct(u.rate_with_hi)}] · without {pct(u.rate_without)} [{pct(u.rate_without_lo)}, "
                     f"{pct(u.rate_without_hi)}]{alone}")
    lines.append("")
    lines.append(f"minimal repairing subsets (no evaluated proper subset repairs): {r.n_minimal}")
    for m in r.minimal[:10]:
        lines.append("  " + "+".join(m))
    if r.n_minimal > 10:
        lines.append(f"  ... {r.n_minimal - 10} more in results.json")
    if r.generation:
        lines += ["", "greedy generation with the subset patched at the prompt's aligned positions (correct answer first):"]
        for g in r.generation:
            name = "all candidates" if g["subset"] == r.units else "+".join(g["subset"])
            lines.append(f"  {name}: {100 * g['correct']:5.1f}% [{100 * g['lo']:5.1f}, {100 * g['hi']:5.1f}] "
                         f"(n={g['n']}), e.g. {', '.join(repr(t) for t in g['examples'])}")
    return "\n".join(lines)


def heldout_text(r) -> str:
    """The held-out subset search: the held-out rate of each family's best subset per size is the result; the
    discovery rate beside it is in-sample (the subset was chosen there), then the search itself, in-sample."""
    est = lambda e: f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}]"  # noqa: E731
    s = r.search
    lines = [f"case {r.case} · the subset search on {r.split.describe()} · {s.source!r} into {s.base!r}",
             f"per size k, the subset the search found best on the {r.n_discovery} discovery items, evaluated on the "
             f"{r.n_evaluation} held-out items (the result); its discovery rate is in-sample: it was chosen there, "
             "and choosing the best of many overstates it",
             "", f"{'family':<12} {'k':>3}  {'held-out rate [95% CI]':<24} {'in-sample rate [95% CI]':<24} subset"]
    for row in r.rows:
        lines.append(f"{row.family:<12} {row.k:>3}  {est(row.held_out):<24} {est(row.discovery):<24} "
                     f"{'+'.join(row.subset) or '(none)'}")
    if r.k_star:
        lines += ["", f"k* (the smallest k at which at least x of the subsets repair): held out, the search's own subsets "
                      f"of the sizes around it re-evaluated on the {r.n_evaluation} evaluation items; in-sample on the "
                      "discovery items"]
        for t in r.k_star:
            shares = "; ".join(f"k={k}: {100 * e.value:.1f}% held out, {100 * t.discovery_sizes[k].value:.1f}% in-sample"
                               for k, e in t.sizes.items())
            lines.append(f"  {t.family:<10} k* held out {'-' if t.held_out is None else t.held_out:>3} · in-sample "
                         f"{'-' if t.discovery is None else t.discovery:>3}  (x = {100 * t.x:g}%{'; ' + shares if shares else ''})")
    lines += ["", f"the search on the discovery items (in-sample, n={r.n_discovery}):", threshold_text(s)]
    return "\n".join(lines)


def folds_text(r) -> str:
    """The subset search cross-validated (`--folds K`): how stable the choice is, and the held-out rates per fold."""
    lines = [f"case {r.case} · the subset search cross-validated: {r.folds} folds of {r.n_items} items (fold sizes "
             f"{', '.join(map(str, r.fold_sizes))}; seed {r.seed}, stratified by tag); each fold's items held out of "
             "its search and its best subsets evaluated on them",
             "k* per fold (on that fold's discovery items, in-sample): "
             + "; ".join(f"{fam} {', '.join('-' if k is None else str(k) for k in ks)}" for fam, ks in r.k_star.items()),
             "k* per fold held out (on the fold's own items): "
             + ("; ".join(f"{fam} {', '.join('-' if k is None else str(k) for k in ks)}"
                          for fam, ks in r.k_star_held_out.items()) or "(not measured)"),
             "", f"{'family':<12} {'k':>3}  {'held-out rate: mean (per fold)':<40} best subset of its size: in how many "
                 "folds"]
    for row in r.rows:
        per = ", ".join(f"{100 * v:.0f}" for v in row.held_out)
        best = "; ".join(f"{name} {n}/{r.folds}" for name, n in list(row.subsets.items())[:3])
        more = f"; +{len(row.subsets) - 3} others" if len(row.subsets) > 3 else ""
        lines.append(f"{row.family:<12} {row.k:>3}  {100 * row.held_out_mean:5.1f}% ({per}){'':<{max(0, 30 - len(per))}} "
                     f"{best}{more}")
    return "\n".join(lines)


def subset_rates_text(rates, case, bad=None, tag=None) -> str:
    """Named subsets evaluated on a case's items (`surgeon threshold --eval`)."""
    est = lambda e: f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}] (n={e.n})"  # noqa: E731
    lines = [f"case {case.name} · named subsets patched from {case.good!r} into {bad or case.bad_formats[0]!r} · items "
             f"({tag or case.focus or 'all'}); held-out wherever these items are not the ones the subsets were chosen on",
             "", f"{'subset':<40} {'rate right when patched [95% CI]':<34} repair fraction"]
    for r in rates:
        lines.append(f"{'+'.join(r.subset) or '(none)':<40} {est(r.rate):<34} {r.repair_fraction:+.3f}")
    return "\n".join(lines)


def blend_text(r) -> str:
    if component(r.component).units == "whole":
        what = f"layer {r.layer}"  # a whole-vector component: "blend mlp_out of layer 1"
    else:
        what = ", ".join(r.units) if len(r.units) <= 8 else f"{len(r.units)} heads of layer {r.layer}"
    lines = [f"case {r.case} · blend {r.component} of {what}: (1-a)*{r.base} + a*{r.source} · {r.n_items} items "
             f"({r.tag or 'all'})",
             "repair rate (items right) by blend fraction a:"]
    for a, v in r.rate_at.items():
        i = int(round(float(a) / (r.alphas[1] - r.alphas[0])))
        lines.append(f"  a = {a}: {100 * v:5.1f}% [{100 * r.rate_lo[i]:5.1f}, {100 * r.rate_hi[i]:5.1f}]  "
                     f"mean score {r.mean_score[i]:+.2f}")
    lines.append(f"switching point a* per item (linear interpolation on a {r.alphas[1] - r.alphas[0]:.2f} grid):")
    m = r.switch_mean
    if m.n == 0 and r.already == r.n_items:
        lines.append("  every item is already correct at a = 0: there is nothing to repair")
    elif m.n == 0:
        lines.append(f"  no item switches to the correct answer between a = 0 and a = 1: blending this "
                     f"{'unit' if len(r.units) == 1 else 'set'} does not repair the failure")
    else:
        q1, med, q3 = r.switch_quartiles
        lines.append(f"  mean {m.value:.3f} {interval(m.lo, m.hi, '.3f')} over the {m.n} item{'s' * (m.n != 1)} that "
                     f"switch{'es' * (m.n == 1)}, quartiles {q1:.3f} / {med:.3f} / {q3:.3f}")
    lines.append(f"  right already at a = 0: {r.already}; never repaired up to a = 1: {r.never}; "
                 f"items that cross between wrong and right more than once: {int((r.crossings > 1).sum())}")
    return "\n".join(lines)


def threshold_line(r) -> str:
    t = r.threshold("all")
    return (f"k* = {t.k_star} of {len(r.units)} heads" if t.k_star is not None else
            f"no subset size k reaches {100 * t.x:g}% repairing ({len(r.units)} heads)")


def heldout_line(r) -> str:
    t = next((t for t in r.k_star if t.family == "all"), None)
    if t is None:
        return f"{len(r.rows)} best subsets evaluated on {r.n_evaluation} held-out items"
    return (f"k* = {'-' if t.held_out is None else t.held_out} held out on {r.n_evaluation} items "
            f"({'-' if t.discovery is None else t.discovery} in-sample on {r.n_discovery})")


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "ThresholdResult": View("threshold", threshold_text, {"threshold.png": figures.threshold_figure},
                            {"subsets.csv": threshold_rows}, table=tables.threshold_table,
                            headline=threshold_line),
    "HeldOutThreshold": View("threshold-heldout", heldout_text,
                             {"heldout.png": figures.heldout_figure,
                              "search.png": lambda r, p: figures.threshold_figure(r.search, p)},
                             table=tables.heldout_threshold_table, headline=heldout_line),
    "FoldsThreshold": View("threshold-folds", folds_text),
    "BlendResult": View("blend", blend_text, {"blend.png": figures.blend_figure}, table=tables.blend_table),
}
