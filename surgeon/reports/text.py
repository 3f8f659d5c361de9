"""Plain-text reports and saved results (results.json + manifest.json + figures) for the CLI."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from surgeon.analyses.feature_circuit import EDGE_MIN, EXACT
from surgeon.analyses.sinks import massive_ratio
from surgeon.models.loading import resolve, shape
from surgeon.reports import figures
from surgeon.results import manifest, shown_path, staging, write_json
from surgeon.search.subsets import per_subset, plan_from_options, subsets_csv_rows
from surgeon.sites.nodes import component, unit_label
from surgeon.case.metrics import describe as describe_metric


def _f(v: float, spec: str) -> str:
    """format(v, spec), with a value that rounds to zero printed as zero, not -0.000."""
    out = format(v, spec)
    return format(0.0, spec) if np.isfinite(v) and float(out) == 0 else out


def _ci(lo, hi, fmt: str = "+.3f", pct: bool = False) -> str:
    """An interval in brackets, or the reason there is none (one item: nothing to resample)."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "(no interval)"
    k = 100 if pct else 1
    return f"[{k * lo:{fmt}}, {k * hi:{fmt}}]"


def _no_gap(base, source) -> str | None:
    """Why a repair fraction is undefined, in words, or None when the two runs differ."""
    if abs(source.value - base.value) > 1e-9 and np.isfinite(source.value - base.value):
        return None
    return (f"the two formats score the same on these items (mean score {base.value:+.3f} vs {source.value:+.3f}): "
            f"there is no gap to repair, so repair fractions are undefined. Are the formats really different "
            f"(check the case's templates and --bad)?")


def diagnosis_text(d, case=None) -> str:
    tags = {}
    for it in d.per_item:
        tags[it["tag"] or "(untagged)"] = tags.get(it["tag"] or "(untagged)", 0) + 1
    lines = [f"case {d.case} · model {d.model} · {len(d.per_item)} items ("
             + ", ".join(f"{k} {v}" for k, v in sorted(tags.items())) + ")",
             f"score = {describe_metric(d.metric)}; accuracy = fraction right",
             "",
             f"{'format':10s} {'role':5s} {'items':9s} {'accuracy [95% CI]':32s} {'mean score [95% CI]'}"]
    for s in d.stats:
        sc = s.score
        lines.append(f"{s.format:10s} {s.role:5s} {s.tag:9s} {s.accuracy.pct():32s} "
                     f"{sc.value:+7.2f} {_ci(sc.lo, sc.hi, '+.2f')}")
    focus = d.focus or "all"
    lines.append("")
    g = d.get(d.good, focus).accuracy
    for b, yes in d.reproduced.items():
        a = d.get(b, focus).accuracy
        if yes:
            verdict = "REPRODUCED"
        elif a.value >= g.value:
            verdict = f"not reproduced ({b!r} is not less accurate than {d.good!r})"
        else:
            verdict = (f"not reproduced (less accurate, but the 95% intervals overlap: {a.n} item{'s' * (a.n != 1)} "
                       f"cannot separate them; add items)")
        lines.append(f"failure in {b!r} on {focus} items: {verdict} — accuracy {a.pct()} vs {g.pct()} in {d.good!r}")
    if any(s.score.n < 2 for s in d.stats):
        lines.append("(a mean over one item has no interval)")
    if d.generations:
        lines += ["", f"greedy generation ({d.generations[0].n_new} new tokens) on {focus} items, judged against the answers:"]
        for g in d.generations:
            c = g.counts()
            lines.append(f"{g.format:10s} correct {g.accuracy.pct()}   incorrect {c['incorrect']}, other {c['other']}   "
                         f"e.g. " + ", ".join(repr(t) for t in g.texts[:3]))
    return "\n".join(lines)


def diagnosis_rows(d) -> list[list]:
    """items.csv: one row per item with its score in every format (accuracy = score > 0)."""
    formats = [d.good, *d.bad]
    rows = [["item", "tag", "correct", "incorrect", *(f"score_{f}" for f in formats)]]
    for it in d.per_item:
        rows.append([it["item"], it["tag"], it["correct"], it["incorrect"], *(f"{it['score'][f]:.6g}" for f in formats)])
    return rows


def patch_text(r, top: int = 10) -> str:
    what = "repair" if r.direction == "denoise" else "damage"
    lines = [
        f"case {r.case} · patch {r.component} from {r.source!r} into {r.base!r} ({r.direction}) · "
        f"{r.n_items} items ({r.tag or 'all'}) · layers {list(r.layers)} · {r.n_units} units/layer",
        f"unpatched {r.base!r}: accuracy {r.base_accuracy.pct()}, mean score {r.clean_base}",
        f"unpatched {r.source!r}: accuracy {r.source_accuracy.pct()}, mean score {r.clean_source}",
        f"{what} fraction = (patched - {r.base}) / ({r.source} - {r.base}) of the mean score",
        "",
        f"{what} fraction per layer (rows) and unit (columns):",
        "layer " + "".join(f"{u:>7d}" for u in range(r.n_units)),
    ]
    no_gap = _no_gap(r.clean_base, r.clean_source)
    if no_gap:
        lines[-2:] = [f"warning: {no_gap}"]
    else:
        for i, L in enumerate(r.layers):
            lines.append(f"{L:5d} " + "".join(_f(v, "7.2f") if np.isfinite(v) else "    nan" for v in r.fraction[i]))
        lines += ["", f"top {min(top, r.fraction.size)} units by {what} fraction:",
                  f"{'unit':10s} {what + ' fraction [95% CI]':28s} {'accuracy when patched [95% CI]'}"]
        for L, u, _ in r.top(top):
            i = r.layers.index(L)
            f, lo, hi = r.fraction[i, u], r.fraction_lo[i, u], r.fraction_hi[i, u]
            a, alo, ahi = r.accuracy[i, u], r.accuracy_lo[i, u], r.accuracy_hi[i, u]
            lines.append(f"{unit_label(r.component, L, u):10s} {f:+.3f} {_ci(lo, hi):22s} "
                         f"{100 * a:5.1f}% [{100 * alo:5.1f}, {100 * ahi:5.1f}] (n={r.n_items})")
        if r.n_items < 2:
            lines.append("(one item: the repair fractions have no interval)")
    if r.noop:
        everything = len(r.noop) == len(r.layers) * r.n_units
        lines += ["", ("every patch is a no-op: " if everything else "no-op patches: ")
                  + f"the {r.source!r} activation equals the {r.base!r} one at the patched positions"
                  + ("" if everything else ": " + ", ".join(unit_label(r.component, L, u) for L, u in r.noop[:20])
                     + (" ..." if len(r.noop) > 20 else ""))]
    return "\n".join(lines)


def model_info(case) -> dict | None:
    """Where the case's model came from: spec, kind, resolved path (a cache snapshot names its revision)."""
    if case is None:
        return None
    if case.model is None:
        return {"spec": None, "kind": "given in memory (the case names no model)"}
    ref = resolve(case.model)
    shp = shape(ref)
    return {"spec": ref.spec, "kind": ref.kind, "path": shown_path(ref.path) if ref.path else None,
            "n_layers": shp.n_layers, "n_heads": shp.n_heads, "n_kv_heads": shp.n_kv_heads, "d_model": shp.d_model,
            "attn_only": shp.attn_only}


def save(out: Path, command: str, result, case, args, device: str | None, figures: dict | None = None,
         tables: dict | None = None) -> None:
    """A command's results in `out` (see `save_result`), its options taken from the parsed command line."""
    opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in ("debug", "out", "case")}
    save_result(out, command, result, case, options=opts, device=device, figures=figures, tables=tables)


def save_result(out: Path, command: str, result, case, *, options: dict, device: str | None,
                figures: dict | None = None, tables: dict | None = None, api: str | None = None) -> None:
    """results.json + manifest.json + figures (name -> draw(result, path)) + CSV tables, all or nothing.
    `api`: the Python call that made the result (the manifest then holds no command line)."""
    import csv

    with staging(out) as tmp:
        write_json(tmp / "results.json", {"command": command, "result": result})
        m = manifest(command, case, seed=options.get("seed"), device=device, dtype=options.get("dtype"),
                     options=options, model_info=model_info(case), execution=getattr(result, "execution", None),
                     argv=[] if api else None)
        if api:
            m["api"] = api
        write_json(tmp / "manifest.json", m)
        for name, draw in (figures or {}).items():
            draw(result, tmp / name)
        for name, rows in (tables or {}).items():
            with open(tmp / name, "w", newline="") as f:
                csv.writer(f).writerows(rows)


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


def _times(ratio: float) -> str:
    return f"x{ratio:.0f}" if np.isfinite(ratio) else "median 0"


def sinks_text(r, top: int = 12) -> str:
    """Attention sinks and massive activations per format, side by side (`surgeon sinks`)."""
    fs = r.formats
    pct = lambda e: f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}]"  # noqa: E731
    lines = [f"case {r.case} · attention sinks and massive activations · {fs[0].n_items} items ({r.tag or 'all'}) in "
             f"every format · sink mass: a head's attention to the first token averaged over the prompt's later "
             f"positions (Gu et al.); sink rate: the share of heads above {r.epsilon:g}",
             "", f"{'format':<16} {'sink rate [95% CI]':<24} heads"]
    for f in fs:
        lines.append(f"{f.format + (' (good)' if f.format == r.good else ''):<16} {pct(f.sink_rate):<24} "
                     f"{int(round(f.sink_rate.value * f.sink_rate.n))} of {f.sink_rate.n}")
    L, H = fs[0].mass.shape
    lines += ["", "per layer: mean sink mass over heads · first token's residual norm / median of the others · the "
                  "largest |activation| (dimension, position's token, ratio to the median; massive: > 100 and > 1000x)"]
    for l in range(L):
        parts = []
        for f in fs:
            m = f.massive[l]
            parts.append(f"{f.format}: {f.mass[l].mean():.3f} · norm x{f.first_norm_ratio[l].value:.2f} · "
                         f"{m['value']:.1f} (d{m['dim']}, {m['token']!r}, {_times(massive_ratio(m))})"
                         f"{' MASSIVE' if m['massive'] else ''}")
        lines.append(f"  layer {l}: " + " | ".join(parts))
    good = r.of(r.good)
    diff = np.max(np.stack([np.abs(f.mass - good.mass) for f in fs if f.format != r.good] or [good.mass * 0]), axis=0)
    order = np.dstack(np.unravel_index(np.argsort(-diff, axis=None), diff.shape))[0][:top]
    lines += ["", f"the {min(top, L * H)} heads whose sink mass differs most between the good format and a failing "
                  "one (mass [95% CI]; from the last prompt token; the strongest other sink and its mass):",
              f"{'head':<8} " + " ".join(f"{f.format:<44}" for f in fs)]
    for l, h in order:
        cells = []
        for f in fs:
            cells.append(f"{f.mass[l, h]:.3f} [{f.mass_lo[l, h]:.3f}, {f.mass_hi[l, h]:.3f}] last {f.last[l, h]:.3f} "
                         f"{f.other_token[l][h]!r} {f.other_mass[l, h]:.2f}"[:44].ljust(44))
        lines.append(f"L{l}H{h:<5} " + " ".join(cells))
    if any(f.super_neurons for f in fs):
        lines += ["", "super neurons: the MLP neurons writing each layer's largest activation (activation x output weight "
                      "on its dimension at its position, mean over items [95% CI]; share of the activation)"]
        for l in range(L):
            parts = []
            for f in fs:
                top_ = (f.super_neurons[l] if l < len(f.super_neurons) else [])[:2]
                parts.append(f"{f.format} d{f.massive[l]['dim']}: " + (", ".join(
                    f"L{w['layer']}N{w['neuron']} {w['write']:+.1f}"
                    + (f" [{w['lo']:+.1f}, {w['hi']:+.1f}]" if w.get("lo") is not None and np.isfinite(w["lo"]) else "")
                    + (f" ({100 * w['share']:.1f}%)" if w.get("share") is not None and np.isfinite(w["share"]) else "")
                    for w in top_) or "none"))
            lines.append(f"  layer {l}: " + " | ".join(parts))
    if fs[0].qk:
        lines += ["", "massive values in queries and keys: the heads whose vector puts the largest share of its energy "
                      "in one dimension (1/d_head: spread evenly; 1: one dimension), per format"]
        for kind, c0 in fs[0].qk.items():
            v = np.asarray(c0.share, dtype=float)
            if not np.isfinite(v).any():
                lines.append(f"  {kind}: no signal in any head")
                continue
            order = [(l, h) for l, h in np.dstack(np.unravel_index(np.argsort(-np.nan_to_num(v, nan=-1), axis=None),
                                                                 v.shape))[0] if np.isfinite(v[l, h])][:3]
            unit = "H" if v.shape[1] == fs[0].mass.shape[1] else "KV"  # keys under grouped-query attention
            cells = []
            for l, h in order:
                cells.append(f"L{l}{unit}{h} d{c0.dim[l][h]} " + " / ".join(
                    f"{np.asarray(f.qk[kind].share, dtype=float)[l, h]:.2f}" for f in fs))
            lines.append(f"  {kind:<6} " + " · ".join(cells) + f"   ({' / '.join(f.format for f in fs)})")
    return "\n".join(lines)


def sink_interventions_text(r) -> str:
    """The sinks measured, then each intervention's effect in every format and the attention it moves
    (`surgeon sinks --intervene`)."""
    pct = lambda e: f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}]"  # noqa: E731

    def frac(e):
        return "   n/a (no gap)" if e.value is None or not np.isfinite(e.value) else \
            f"{e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]"

    lines = [sinks_text(r.measured)] if r.measured is not None else []
    lines += ["", f"interventions on the one engine, at every position, in every format ({r.n_items} items "
                  f"({r.tag or 'all'})): accuracy after [95% CI] (before); in a failing format the repair fraction "
                  f"(after - failing) / (good - failing), in the good one the damage fraction (good - after) / "
                  f"(good - failing), of the mean score [95% CI]"]
    lines += [f"note: {n}" for n in r.notes]
    for name in r.interventions:
        lines.append(f"  {name}")
        for e in (e for e in r.effects if e.intervention == name):
            what = "damage" if e.role == "good" else "repair"
            lines.append(f"    {e.format + (' (good)' if e.role == 'good' else ''):<14} {pct(e.accuracy)} "
                         f"(before {100 * e.unintervened.value:5.1f}%)   {what} {frac(e.fraction)}")
        moved = [m for m in r.moved if m.intervention == name]
        if moved:
            lines.append("    attention on the first token, before -> after: " + "; ".join(
                f"{m.head} {m.format} {m.before:.3f} -> {m.after:.3f}" for m in moved))
    return "\n".join(lines)


def folds_circuit_text(r) -> str:
    """The circuit cross-validated (`surgeon circuit --folds K`): sizes and faithfulness per fold, and each edge's
    selection frequency."""
    reading = "faithfulness" if r.semantics == "kept" else "share removed by knocking it out"
    lines = [f"case {r.case} · the circuit cross-validated: {r.folds} folds of {r.n_items} items (fold sizes "
             f"{', '.join(map(str, r.fold_sizes))}; seed {r.seed}, stratified by tag); each found on the other folds "
             "and measured on its own",
             f"edges per fold: {', '.join(map(str, r.sizes))}",
             f"{reading} held out, per fold: {', '.join(f'{v:.3f}' for v in r.held_out)} (mean "
             f"{sum(r.held_out) / len(r.held_out):.3f}); in-sample, where each was pruned: "
             f"{', '.join(f'{v:.3f}' for v in r.in_sample)}",
             f"edges in every fold's circuit: {sum(1 for n in r.edges.values() if n == r.folds)} of {len(r.edges)} ever "
             "selected", "", "selection frequency (folds whose circuit holds the edge):"]
    for name, n in list(r.edges.items())[:40]:
        lines.append(f"  {n}/{r.folds}  {name}")
    if len(r.edges) > 40:
        lines.append(f"  ... {len(r.edges) - 40} more")
    return "\n".join(lines)


def _f3(v: float) -> str:
    """v to 3 decimals, a value that rounds to zero without a sign."""
    out = f"{v:.3f}"
    return "0.000" if out == "-0.000" else out


def heldout_circuit_text(r) -> str:
    """The circuit found on the discovery items and its faithfulness on the held-out items (the result)."""
    c, h = r.search, r.held_out
    ci = lambda lo_hi: f"[{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if lo_hi else "[no interval]"  # noqa: E731
    reading = "faithfulness" if h["semantics"] == "kept" else "share removed by knocking it out"
    lines = [f"case {r.case} · circuit found on {r.split.describe()} · the {c.source!r} run against {c.base!r} "
             f"({c.ablation} ablation, {h['semantics']} semantics)",
             f"held-out ({r.n_evaluation} items, the result): {len(c.circuit)} edges, {reading} = "
             f"{h['faithfulness']:.3f} {ci(h['faithfulness_ci'])} (95% CI over items)",
             f"in-sample ({r.n_discovery} discovery items, where it was pruned to reach the target): {reading} = "
             f"{c.circuit_faithfulness:.3f} {ci(c.circuit_faithfulness_ci)}",
             "", f"the circuit on the discovery items (in-sample, n={r.n_discovery}):", circuit_text(c)]
    if r.curve:
        head = lines[:3]
        curve = [f"faithfulness curve of the discovery ranking (its top-k edges at MIB's fractions) on the "
                 f"{r.n_evaluation} held-out items:",
                 "  " + "  ".join(f"{100 * x:g}%:{k}" for x, k in zip(c.curve_fractions, c.curve_edges)),
                 "  held out   " + "  ".join(_f3(v) for v in r.curve) + f"   CPR {r.cpr:.3f}, CMD {r.cmd:.3f}",
                 "  in-sample  " + "  ".join(_f3(v) for v in c.curve) + f"   CPR {c.cpr:.3f}, CMD {c.cmd:.3f}"]
        lines = head + curve + lines[3:]
    return "\n".join(lines)


def heldout_feature_circuit_text(r) -> str:
    """The feature circuits found on the discovery items, measured on the held-out ones (the result)."""
    ci = lambda e: f"{e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}]"  # noqa: E731
    pct = lambda e: f"{100 * e.value:.1f}% [{100 * e.lo:.1f}, {100 * e.hi:.1f}] (n={e.n})"  # noqa: E731
    lines = [f"case {r.case} · feature circuits found on {r.split.describe()}",
             f"each direction's circuit (its nodes chosen on the {r.n_discovery} discovery items) kept and ablated on "
             f"the {r.n_evaluation} held-out items (the result), beside the discovery items (in-sample; 95% bootstrap "
             "intervals over items)", "",
             f"{'direction':<10} {'nodes':>5}  {'faithfulness held out':<24} {'in-sample':<24} {'completeness held out':<24} in-sample"]
    for d in r.directions:
        lines.append(f"{d.direction:<10} {d.nodes:>5}  {ci(d.faithfulness):<24} {ci(d.discovery_faithfulness):<24} "
                     f"{ci(d.completeness):<24} {ci(d.discovery_completeness)}")
    for d in r.directions:
        if d.edges:
            names = r.search.nodes
            lines += ["", f"{d.direction}: the circuit's edges verified exactly on the discovery items, verified again "
                          "on the held-out items (fractions of the gap; held out [95% CI] · in-sample):"]
            for u, v, x, e in d.edges[:10]:
                lines.append(f"  {names[u].name} -> {names[v].name}: {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] · {x:+.3f}")
    if r.repair_rate is not None:
        lines += ["", f"the repair the circuits' difference suggests ({len(r.search.repair.nodes)} nodes), patched on the "
                      f"held-out items: {pct(r.repair_rate)} right (unpatched {pct(r.repair_base)})"]
    lines += ["", f"the feature circuits on the discovery items (in-sample, n={r.n_discovery}):",
              feature_circuit_text(r.search)]
    return "\n".join(lines)


def heldout_feature_repair_text(r) -> str:
    """`sae repair --holdout`: the features chosen on the discovery items, patched on the held-out ones."""
    ci = lambda e: f"{e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]"  # noqa: E731
    pct = lambda e: f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}]"  # noqa: E731
    s = r.search
    lines = [f"case {r.case} · SAE features at layer {s.layer} ({s.hook}) chosen on {r.split.describe()}",
             f"the top {len(s.top)} features by attribution on the {r.n_discovery} discovery items, each alone and all "
             f"together, patched {s.source!r} into {s.base!r} on the {r.n_evaluation} held-out items (the result); the "
             "discovery fraction is in-sample", "",
             f"{'features':<28} {'held-out repair fraction':<28} {'held-out items right':<24} in-sample fraction"]
    for row in r.rows:
        name = "all: " + "+".join(map(str, row.features)) if len(row.features) > 1 else f"feature {row.features[0]}"
        d = "--" if row.discovery != row.discovery else f"{row.discovery:+.3f}"
        lines.append(f"{name[:28]:<28} {ci(row.held_out):<28} {pct(row.rate):<24} {d}")
    lines += ["", f"the search on the discovery items (in-sample, n={r.n_discovery}):", feature_repair_text(s)]
    return "\n".join(lines)


def heldout_patch_text(r) -> str:
    """Per-head patching's top units, ranked on the discovery items, with their held-out repair fractions (the
    result) beside the in-sample ones."""
    s = r.search
    ci = lambda e: f"{e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]"  # noqa: E731
    what = "repair" if s.direction == "denoise" else "damage"
    lines = [f"case {r.case} · patch {s.component} from {s.source!r} into {s.base!r} ({s.direction}) · units ranked on "
             f"{r.split.describe()}",
             f"the top {len(r.top)} units by {what} fraction on the {r.n_discovery} discovery items, patched on the "
             f"{r.n_evaluation} held-out items (the result); the discovery fraction is in-sample: the ranking was made "
             "there",
             f"rank correlation (Spearman) of every unit's {what} fraction, discovery vs held out: {r.spearman:.3f}",
             "", f"{'rank':>4}  {'unit':<8} {'held-out fraction [95% CI]':<30} in-sample fraction [95% CI]"]
    for u in r.top:
        lines.append(f"{u.rank:>4}  {u.unit:<8} {ci(u.held_out):<30} {ci(u.discovery)}")
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
            frac = _f(s.mean_repair_fraction, "16.3f") if np.isfinite(s.mean_repair_fraction) else f"{'-':>16s}"
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
        lines.append(f"  mean {m.value:.3f} {_ci(m.lo, m.hi, '.3f')} over the {m.n} item{'s' * (m.n != 1)} that "
                     f"switch{'es' * (m.n == 1)}, quartiles {q1:.3f} / {med:.3f} / {q3:.3f}")
    lines.append(f"  right already at a = 0: {r.already}; never repaired up to a = 1: {r.never}; "
                 f"items that cross between wrong and right more than once: {int((r.crossings > 1).sum())}")
    return "\n".join(lines)


def attribution_text(r, top: int = 10) -> str:
    what = "repair" if r.direction == "denoise" else "damage"
    qk = " with the QK fix" if r.component in ("q", "k") else ""
    how = {"gradient": ("one forward and one backward pass", "gradient w.r.t. its mask at 0"),
           "ig": (f"integrated gradients, {r.ig_steps} points",
                  "gradient w.r.t. its mask integrated as every mask goes from 0 to 1"),
           "atp*": (f"AtP*{qk}, GradDrop: {r.backward_passes} backward passes",
                    "magnitude: mean over layers l of |gradient at 0 with layer l's outputs dropped|"
                    + (", through the exact attention patterns" if qk else ""))}[r.method]
    lines = [f"case {r.case} · attribution of {r.component} from {r.source!r} into {r.base!r} ({r.direction}) · "
             f"{r.n_items} items ({r.tag or 'all'}) · {how[0]}",
             f"estimated {what} fraction of patching each unit alone ({how[1]}, over the gap):",
             "layer " + "".join(f"{u:>7d}" for u in range(r.n_units))]
    if abs(r.gap) <= 1e-12:
        lines[-2:] = ["warning: the two formats score the same on these items (no gap): estimated repair "
                      "fractions are undefined; the raw gradients are in results.json"]
        return "\n".join(lines)
    for i, L in enumerate(r.layers):
        lines.append(f"{L:5d} " + "".join(_f(v, "7.2f") if np.isfinite(v) else "    nan" for v in r.estimate[i]))
    if r.exact is not None:
        corr = ("correlation undefined (one side is constant)" if r.pearson is None
                else f"Pearson r = {r.pearson:.3f}, Spearman rho = {r.spearman:.3f}")
        mag = r.method == "atp*"  # magnitudes: against the exact effect's magnitude
        lines += ["", f"against exact per-unit patching{' (its magnitude)' if mag else ''}: {corr}",
                  f"top {min(top, r.exact.size)} units by exact {what} fraction{' magnitude' if mag else ''}:",
                  f"{'unit':10s} {'estimate':>9s} {'exact':>9s}"]
        order = np.argsort(-np.nan_to_num(np.abs(r.exact) if mag else r.exact, nan=-np.inf), axis=None)[:top]
    else:
        lines += ["", f"top {min(top, r.estimate.size)} units by estimated {what} fraction "
                      f"(--compare checks them against exact patching):", f"{'unit':10s} {'estimate':>9s}"]
        order = np.argsort(-np.nan_to_num(r.estimate, nan=-np.inf), axis=None)[:top]
    for k in order:
        i, u = divmod(int(k), r.n_units)
        lines.append(f"{unit_label(r.component, r.layers[i], u):10s} {r.estimate[i, u]:+9.3f}"
                     + (f" {r.exact[i, u]:+9.3f}" if r.exact is not None else ""))
    return "\n".join(lines)


def circuit_text(r, top: int = 10) -> str:
    gap = r.full - r.empty
    steps = r.options.get("ig_steps")
    what = {"eap": "EAP (gradient at mask 0)", "eap-ig-inputs": f"EAP-IG-inputs ({steps} steps)",
            "eap-ig-activations": f"EAP-IG-activations ({steps} steps per sender group)",
            "eap-ig-masks": f"integrated gradients over the edge masks ({steps} midpoints, averaged)",
            "exact": "exact edge patching"}[r.method]
    sem = r.options.get("semantics", "kept")
    sym = "f" if sem == "kept" else "removed"
    lines = [f"case {r.case} · circuit of the {r.source!r} run against {r.base!r} ({r.direction}, {r.ablation} "
             f"ablation, {sem} semantics) · {r.n_items} items ({r.tag or 'all'}) · {r.n_edges} edges scored by {what}",
             f"m(empty) = {r.empty:+.3f} (every edge ablated), m(full) = {r.full:+.3f} (nothing ablated); "
             + ("faithfulness f = (m(circuit) - m(empty)) / (m(full) - m(empty))" if sem == "kept" else
                "removed = (m(full) - m(without the circuit)) / (m(full) - m(empty)), the share of the behaviour "
                "that knocking the circuit out removes")]
    if r.options.get("semantics_detail"):
        lines.append(f"what a circuit means: {r.options['semantics_detail']}; a path is path-patched")
    lines.append("")
    order = np.argsort(-np.abs(r.scores))[:top]
    alone = "patching the edge alone" if r.ablation == "resample" else f"{r.ablation}-ablating the edge alone"
    lines.append(f"top {len(order)} edges by |score| (effect on the mean score of {alone}):")
    lines.append(f"  {'edge':28s} {'score':>9s} {'exact':>9s}")
    for e in order:
        ex = r.exact.get(int(e))
        lines.append(f"  {r.edge_names[e]:28s} {_f(r.scores[e], '+9.3f')} " + (_f(ex, "+9.3f") if ex is not None else f"{'-':>9s}"))
    if r.verify_pearson is not None:
        lines.append(f"  estimate vs exact over the top {len(r.exact)} edges: Pearson r = {r.verify_pearson:.3f}")
    lines += ["", f"{'faithfulness' if sem == 'kept' else 'knock-out'} curve (top-scoring edges, MIB's fractions):",
              "  " + "  ".join(f"{100 * x:g}%:{n}" for x, n in zip(r.curve_fractions, r.curve_edges)),
              "  " + "  ".join(_f(v, ".3f") for v in r.curve),
              f"  CPR (area under f) = {r.cpr:.3f}, CMD (area under |1 - f|) = {r.cmd:.3f}", ""]
    s = r.search
    if r.target is not None and s.get("k") is None:
        how = f"no top-k edge set reaches {sym} >= {r.target}: every edge"
    elif r.target is not None:
        how = f"smallest top-k edge set with {sym} >= {r.target}: k = {s['k']}"
        if s.get("f_before") is not None:
            how += f" ({sym}(k-1) = {s['f_before']:.3f})"
    else:
        how = "the top edges asked for"
    if s.get("pruned", len(r.circuit)) != s.get("prefix", len(r.circuit)):
        how += f", less {s['prefix'] - s['pruned']} edges on no complete path"
    lo, hi = r.circuit_faithfulness_ci
    lines.append(f"circuit ({how}): {len(r.circuit)} edges, "
                 f"{sym} = {r.circuit_faithfulness:.3f} [{lo:.3f}, {hi:.3f}] (95% CI over items)"
                 + past_one(r.circuit_faithfulness, hi))
    if s.get("search"):
        lines.append(f"  search: {s['describe']}")
    nodes = sorted({x.split("<")[0] for n in r.names(r.circuit) for x in n.split("->")} - {"input", "logits"})
    lines.append("  nodes: " + (", ".join(nodes) if nodes else "(none)"))
    if not r.paths and r.options.get("n_paths", 0) > 0:
        lines += ["", f"no paths listed: {r.no_paths}"]
    if r.paths:
        lines += ["", f"strongest complete paths, verified by path patching (effect on the score; share of the full "
                      f"patch's effect, per item; skill path: share >= {r.options['min_share']} on >= "
                      f"{100 * r.options['min_items']:.0f}% of items):"]
        for i, p in enumerate(r.paths, 1):
            e, s = p.effect, p.share
            lines.append(f"  {i:2d}. {' -> '.join(p.nodes)}")
            lines.append(f"      effect {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] (n={e.n}), share {s.value:.3f}"
                         f"{' · skill path' if p.skill else ''}")
    if abs(gap) <= 1e-6 * max(1.0, abs(r.full), abs(r.empty)):
        lines[2:2] = ["warning: the two formats score the same (m(full) = m(empty)): faithfulness is undefined, so "
                      "the curve and the pruned circuit below mean nothing"]
    return "\n".join(lines)


def past_one(value: float, hi: float) -> str:
    """A note where a faithfulness or its interval passes 1: not clipped, because it is a ratio of mean scores that can
    pass 1 (the circuit scores above the full model: some edges outside it work against the behaviour)."""
    if not (math.isfinite(hi) and hi > 1):
        return ""
    what = "it passes 1" if value > 1 else "its interval passes 1"
    return (f" ({what}: faithfulness is (m(C) - m(empty)) / (m(full) - m(empty)), which exceeds 1 where the circuit "
            "scores above the full model, i.e. edges left out work against the behaviour; not clipped)")


def circuit_eval_text(r: dict, path) -> str:
    lo, hi = r["faithfulness_ci"] or (float("nan"), float("nan"))
    sem = r.get("semantics", "kept")
    lines = [f"case {r['case']} · circuit {path} · {r['n_edges']} of {r['of_edges']} edges · the {r['source']!r} run "
             f"against {r['base']!r} ({r.get('ablation', 'resample')} ablation, {sem} semantics) · {r['n_items']} items",
             f"what a circuit means: {r['semantics_detail']}" if r.get("semantics_detail") else "",
             f"m(empty) = {r['empty']:+.3f}, m(circuit) = {r['circuit']:+.3f}, m(full) = {r['full']:+.3f}",
             (f"faithfulness = {r['faithfulness']:.3f}" if sem == "kept" else
              f"share removed by knocking the circuit out = {r['faithfulness']:.3f}") +
             f" [{lo:.3f}, {hi:.3f}] (95% CI over items)" + past_one(r["faithfulness"], hi)]
    made = r.get("made") or {}
    if made:
        lines.append(f"the file says it was found by {made.get('method')} on case {made.get('case')!r} ("
                     f"{made.get('ablation')} ablation, {made.get('semantics')}, {made.get('direction')}, failing format "
                     f"{made.get('failing_format')!r}, {made.get('n_items')} items, {made.get('tool')})")
    lines += [f"note: {n}" for n in r.get("notes") or ()]
    lines = [x for x in lines if x]
    if r["n_edges"] == 0:
        lines.append(f"warning: {path} marks no edge as in the circuit: this is the empty circuit "
                     f"({'f = 0' if sem == 'kept' else 'nothing removed'} by definition)")
    return "\n".join(lines)


def overlap_text(r) -> str:
    lines = [f"case {r.case} · SAE features, top-{r.k} sets at the {r.position} position(s), {r.good!r} vs each "
             f"failing format · {r.n_items} items · mean [95% CI] over items"]
    for b in r.bad:
        lines += ["", f"{r.good} vs {b}:", f"{'layer':>5}  {'overlap':<24} {'jaccard':<24} {'weighted jaccard':<24}"]
        for i, L in enumerate(r.layers):
            cells = [r.metrics[b][m][i] for m in ("overlap", "jaccard", "weighted_jaccard")]
            lines.append(f"{L:>5}  " + " ".join(f"{e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}]".ljust(24) for e in cells))
        ov = [e.value for e in r.metrics[b]["overlap"]]
        lo_i = min(range(len(ov)), key=lambda i: ov[i])
        lines.append(f"formats most separate at layer {r.layers[lo_i]} (overlap {ov[lo_i]:.2f}); "
                     f"last layer {r.layers[-1]}: {ov[-1]:.2f}")
    return "\n".join(lines)


def amplified_text(r, top: int = 20) -> str:
    lines = [f"case {r.case} · SAE layer {r.layer} ({r.sae}) · {r.bad!r} / {r.good!r} activation ratio at the "
             f"{r.position} position · {r.n_items} items",
             f"features active in both formats on >= {r.min_items} items, highest mean ratio first:"]
    if not r.ranked:
        lines.append("  (none)")
    for f in r.ranked[:top]:
        extra = "".join(f"  {x}" for x in (f.label, f.link) if x)
        lines.append(f"  feature {f.feature:>6}: ratio {f.ratio.value:6.2f} [{f.ratio.lo:.2f}, {f.ratio.hi:.2f}] "
                     f"on {f.n_both} items · mean act {r.good} {f.mean_good:.3f}, {r.bad} {f.mean_bad:.3f}{extra}")
    for name, lst, fmt in (("only in the failing format", r.only_bad, r.bad), ("only in the good format", r.only_good, r.good)):
        lines.append(f"active {name} ({fmt}), by number of items: " +
                     (", ".join(f"{j} ({c})" for j, c in lst) if lst else "(none)"))
    return "\n".join(lines)


def head_feature_text(r, top_units: int = 12) -> str:
    lines = [f"case {r.case} · heads of layer {r.layer} patched from {r.good!r} into {r.bad!r}; features of the SAE "
             f"at {r.hook} ({r.sae}) · {r.n_items} items",
             "effect = feature activation patched - unpatched (mean over items); columns: the features differing most "
             "between formats, with their gap (good - failing)",
             f"{'':>8}" + "".join(f"{'f' + str(j):>9}" for j in r.features),
             f"{'gap':>8}" + "".join(f"{g:>+9.3f}" for g in r.format_gap)]
    order = sorted(range(len(r.units)), key=lambda i: -float(abs(r.effect[i]).sum()))
    shown = [i for i in order if not r.units[i].startswith("L")] + [i for i in order if r.units[i].startswith("L")][:top_units]
    for i in shown:
        lines.append(f"{r.units[i]:>8}" + "".join(f"{v:>+9.3f}" for v in r.effect[i]))
    lines.append("(95% intervals over items, and effect / gap per cell, are in results.json)")
    return "\n".join(lines)


def feature_repair_text(r) -> str:
    lines = [f"case {r.case} · SAE features at {r.hook} ({r.sae}, {r.d_sae} features) patched from {r.source!r} into "
             f"{r.base!r} · {r.n_items} items",
             f"empty patch reproduces the model: max |score difference| {r.empty_patch_max_diff:.1e}",
             f"repair fraction, whole activation patched: {r.whole_fraction:+.3f}; every feature patched (error term "
             f"kept): {r.all_features_fraction:+.3f}",
             "top features by attribution (one backward pass), with their exact single-feature repair fraction:"]
    for j, est, exact in r.top:
        lines.append(f"  feature {j:>6}: estimate {est:+.3f}, exact {exact:+.3f}")
    lines += ["", "subsets of these features:", threshold_text(r.search)]
    f_all, h_all = r.search.sizes, r.heads.sizes
    best = lambda rows: max((row.mean_repair_fraction for row in rows if row.family == "all"), default=float("nan"))  # noqa: E731
    kf, kh = r.search.threshold("all").k_star, r.heads.threshold("all").k_star
    lines += ["", f"against head subsets of layer {r.layer} (head outputs patched, same items):",
              f"  features: k* = {kf if kf is not None else 'none'}, best mean repair fraction of a size {best(f_all):+.3f}",
              f"  heads:    k* = {kh if kh is not None else 'none'}, best mean repair fraction of a size {best(h_all):+.3f}"]
    return "\n".join(lines)


def _exact_words(r) -> str:
    """How a feature circuit's exact node effects were taken (analyses.feature_circuit.EXACT)."""
    if any(n.slot is not None for n in r.nodes):
        return "a node per aligned position, patched there"
    return EXACT[getattr(r, "exact", "joint")]


# above this share of a feature circuit's attribution on error nodes, the SAEs are said to explain little: SAEs that fit
# their activations leave 0-5% there on the shipped organisms; an SAE of the next layer saved under another's name, 31%
ERROR_SHARE_WARN = 0.2


def feature_circuit_text(r, top: int = 12) -> str:
    saes = ", ".join(f"{h} ({d})" for h, _, d in r.saes)
    meth = {"ig": f"integrated gradients over the feature mask ({r.steps} midpoints, one SAE at a time)",
            "ig-marks": f"integrated gradients at Marks et al.'s points k/{r.steps}, k = 0..{r.steps - 1}, one SAE at a "
                        f"time (their _pe_ig)",
            "gradient": "the gradient at the mask's 0 (one backward pass)"}.get(r.method, r.method)
    left = ("averaged over the same points with d's SAE moved (Marks et al.'s jvp)" if r.method == "ig-marks"
            else "in the unpatched run")
    lines = [f"case {r.case} · feature circuit over {len(r.nodes)} nodes (every feature, and an error node per SAE) · "
             f"{r.n_items} items",
             "edges (Marks et al.): u -> d, the effect of u that reaches the answer through d alone; attribution: d's "
             f"gradient ({left}) . the Jacobian . u's change, the SAE hook points between held (direct edges), "
             + ("read only at d's (item, position) entries whose own effect reaches the node threshold (Marks et al.'s "
                "edge rule, --edge-rule marks)" if getattr(r, "edge_rule", "all") == "marks" else
                "read at every (item, position) entry of d (Marks et al. read only the entries whose effect reaches "
                "their node threshold: --edge-rule marks)")
             + "; exact: u patched, then d alone set to the value it took",
             f"SAEs (features): {saes}",
             f"attribution: {meth}; exact: the top nodes each patched alone ({_exact_words(r)}); effects as fractions "
             f"of the gap between the formats, 95% bootstrap intervals over items",
             "faithfulness (Marks et al.): keep the circuit, give every other node the other run's value: 1 is all of "
             "the behaviour; completeness: ablate the circuit, keep the rest: 0 is complete"]
    slots = sorted({(n.slot, n.position) for n in r.nodes if n.slot is not None})
    if slots:
        lines.insert(2, "a node per aligned position: " + ", ".join(f"@{j} = {label}" for j, label in slots))
    for d in r.directions.values():
        errs = sum(r.nodes[i].error for i in d.circuit)
        lines += ["", f"{d.direction}: the {d.base!r} run with the {d.source!r} run's values (mean score {d.base_mean:+.3f} "
                      f"-> {d.source_mean:+.3f})",
                  f"  circuit: {len(d.circuit)} nodes ({errs} error nodes, {d.error_share:.0%} of its attribution) · "
                  f"faithfulness {d.faithfulness} · completeness {d.completeness}",
                  f"  chosen as {d.search}",
                  "  top nodes:  attribution  exact [95% CI]"]
        if d.error_share > ERROR_SHARE_WARN:
            lines.insert(-2, f"  WARNING: error nodes carry {d.error_share:.0%} of the circuit's attribution: the SAEs "
                             "leave much of these activations unexplained (an SAE of another layer or model reads "
                             "this way; `surgeon sae quality` measures each SAE's reconstruction on the case)")
        for i in d.order[:top]:
            e = d.exact.get(int(i))
            lines.append(f"    {r.nodes[i].name:32s} {d.attribution[i]:+.3f}   "
                         + (f"{e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]" if e is not None else "--"))
        lines.append("  curve (top-k kept | ablated): " + ", ".join(f"{k}: {f:.2f} | {c:.2f}" for k, f, c in d.curve))
        if d.edges:
            kept = f" ({len(d.edges)} kept)" if len(d.edges) < d.edges_nonzero else ""
            lines.append(f"  edges among its nodes: {d.edges_nonzero} nonzero{kept}, {len(d.drawn_edges())} drawn "
                         f"(|attribution| >= {EDGE_MIN:g} of the gap); strongest:  attribution  exact [95% CI]")
            for e in d.edges[: top // 2]:
                x = e.exact
                lines.append(f"    {r.nodes[e.up].name} -> {r.nodes[e.down].name}  {e.attribution:+.3f}   "
                             + (f"{x.value:+.3f} [{x.lo:+.3f}, {x.hi:+.3f}]" if x is not None else "--"))
    names = lambda idx: ", ".join(r.nodes[i].name for i in idx[:8]) + (f" (+{len(idx) - 8})" if len(idx) > 8 else "")  # noqa: E731
    lines += ["", "across formats (in one circuit only, or at least 2x stronger there):",
              f"  failing format's: {len(r.only_failing)} nodes{': ' + names(r.only_failing) if r.only_failing else ''}",
              f"  working format's: {len(r.only_working)} nodes{': ' + names(r.only_working) if r.only_working else ''}"]
    if r.edges_only_failing or r.edges_only_working:
        lines.append(f"  edges: {len(r.edges_only_failing)} drawn in the failing format's circuit only (or 2x stronger), "
                     f"{len(r.edges_only_working)} in the working format's")
    rep = r.repair
    if rep.nodes:
        lines.append(f"  repair they suggest (these {len(rep.nodes)} nodes given the working format's values in the "
                     f"failing run): items right {rep.rate.pct()} (unpatched {rep.base_rate.pct()}); fraction of "
                     f"the gap {rep.fraction}")
    else:
        lines.append("  the two circuits do not differ: no repair to suggest")
    return "\n".join(lines)


def _dla_conventions(options: dict) -> str:
    vb, lb = options.get("value_biases", "per-head"), options.get("lens_bias", "included")
    return ("conventions: value biases " + ("in each head's output (raw weights; TransformerLens's default model folds "
                                            "them into the attention bias: --value-biases folded)" if vb == "per-head"
                                            else "folded into the attention bias, as TransformerLens's default model")
            + "; logit lens " + ("with the unembedding bias (TransformerLens's has none: --lens-bias excluded)"
                                 if lb == "included" else "without the unembedding bias, as TransformerLens's"))


def logit_attribution_text(r, top: int = 10) -> str:
    def ci(v) -> str:
        return f"{v[0]:+.2f} [{v[1]:+.2f}, {v[2]:+.2f}]" if np.isfinite(v[1]) else f"{v[0]:+.2f} (no interval)"

    names = [f.format for f in r.formats]
    lines = [f"case {r.case} · direct logit attribution and logit lens · {r.n_items} items ({r.tag or 'all'}) · "
             "logit difference correct - incorrect at the first token where the answers differ, 95% CI over items",
             _dla_conventions(r.options),
             "", f"{'':24s}" + "".join(f"{n + (' (good)' if f.role == 'good' else ''):>26s}"
                                       for n, f in zip(names, r.formats)),
             f"{'logit difference':24s}" + "".join(f"{ci(f.logit_diff):>26s}" for f in r.formats),
             "", "logit lens (the residual stream after each layer, read through the final norm and unembedding):"]
    for L in range(r.n_layers):
        lines.append(f"{'after layer ' + str(L):24s}" + "".join(f"{ci(f.lens[L]):>26s}" for f in r.formats))
    gap = max(f.max_residual for f in r.formats)
    bound = f"below {10 ** math.ceil(math.log10(gap)):.0e}" if gap > 0 else "0"
    lines += ["", f"direct effect on the logit difference, per layer (the parts sum to it; largest gap {bound}):"]
    for key, label in (("embed", "embeddings"),):
        lines.append(f"{label:24s}" + "".join(f"{ci(f.other[key]):>26s}" for f in r.formats))
    for L in range(r.n_layers):
        lines.append(f"{f'L{L} attention':24s}" + "".join(f"{ci(f.attn[L]):>26s}" for f in r.formats))
        if np.any([f.mlp[L, 0] != 0 for f in r.formats]):
            lines.append(f"{f'L{L} MLP':24s}" + "".join(f"{ci(f.mlp[L]):>26s}" for f in r.formats))
    lines.append(f"{'biases (norm, unembed)':24s}"
                 + "".join(f"{ci(f.other['norm and unembedding biases']):>26s}" for f in r.formats))
    good = r.formats[0]
    for bad, diff in r.head_difference.items():
        b = next(f for f in r.formats if f.format == bad)
        order = np.argsort(-np.abs(diff[..., 0]), axis=None)[:top]
        lines += ["", f"heads whose direct effect differs most between {bad!r} and {good.format!r}:",
                  f"{'head':8s} {good.format:>10s} {bad:>10s} {bad + ' - ' + good.format + ' [95% CI]':>32s}"]
        for k in order:
            L, h = divmod(int(k), r.n_heads)
            lines.append(f"{f'L{L}H{h}':8s} {good.heads[L, h, 0]:+10.3f} {b.heads[L, h, 0]:+10.3f} "
                         f"{ci(diff[L, h]):>32s}")
    return "\n".join(lines)


def position_patch_text(r, top: int = 12) -> str:
    what = "repair" if r.direction == "denoise" else "damage"
    lines = [f"case {r.case} · patch {r.component} by position from {r.source!r} into {r.base!r} ({r.direction}) · "
             f"{r.n_items} items ({r.tag or 'all'}) · align {r.align} · layers {list(r.layers)}",
             f"{what} fraction of patching one {'unit' if r.n_units > 1 else r.component} at one position alone "
             "(over the items that have the position; 95% CI):", "",
             "positions: " + "; ".join(f"{s} n={n}" for s, n in zip(r.slots, r.slot_items))]
    if r.n_units == 1:  # a whole vector per layer: the layers x positions table
        width = max(14, *(len(s) + 2 for s in r.slots))
        lines += ["", f"{'layer':6s}" + "".join(f"{s:>{width}s}" for s in r.slots)]
        for li, L in enumerate(r.layers):
            lines.append(f"{L:<6d}" + "".join(f"{_f(v, f'{width}.3f')}" if np.isfinite(v) else f"{'-':>{width}s}"
                                              for v in r.fraction[li, :, 0]))
        return "\n".join(lines)
    lines += ["", f"top {top} (unit, position) cells:", f"{'unit':10s} {'position':28s} {what + ' [95% CI]':>26s}"]
    for L, j, u, f in r.top(top):
        li = r.layers.index(L)
        lines.append(f"{unit_label(r.component, L, u):10s} {r.slots[j]:28s} {f:+8.3f} "
                     f"{_ci(r.fraction_lo[li, j, u], r.fraction_hi[li, j, u])}")
    return "\n".join(lines)


def attention_text(r, top: int = 3) -> str:
    lines = [f"case {r.case} · attention patterns of {', '.join(r.heads)} · items {r.items} ({r.tag or 'all'}) · "
             f"formats {', '.join(r.formats)}",
             f"from the last prompt token: the {top} keys attended most (weight)"]
    for head in r.heads:
        for i in r.items:
            lines.append("")
            for fmt in r.formats:
                p = r.get(head, i, fmt)
                row = p.pattern[-1]
                best = np.argsort(-row, kind="stable")[:top]
                lines.append(f"{head} item {i:<3d} {fmt:8s} " + "  ".join(f"{k}:{p.tokens[k]!r} {row[k]:.2f}"
                                                                         for k in best))
    return "\n".join(lines)


def encoding_text(e, shown: int = 3) -> str:
    """The first `shown` items: each format's tokens (position:token), the scored positions with the answer token
    each scores, and the aligned pairs patching moves between (failing <- good)."""
    lines = [f"case {e.case} · what the model reads · {e.n_items} item{'s' * (e.n_items != 1)} ({e.tag or 'all'}) · "
             f"align {e.align} · good {e.good!r}, failing {', '.join(map(repr, e.bad))}",
             "tokens as position:text (| ends the prompt); scored: position -> answer token id (+ correct, - incorrect)"]
    items = sorted({r.item for r in e.rows})
    for i in items[:shown]:
        lines.append("")
        for r in (r for r in e.rows if r.item == i):
            toks = " ".join(f"{p}:{t!r}" + (" |" if p == r.n_prompt - 1 else "") for p, t in enumerate(r.strings))
            lines.append(f"item {i} ({r.tag or 'untagged'}) {r.format} ({r.role}), the {r.answer} answer's row, "
                         f"{len(r.tokens)} tokens: {toks}")
            lines.append("  scored: " + ", ".join(f"{p} -> {t} ({'+' if s > 0 else '-'})" for p, t, s in r.targets))
            if r.pairs:
                lines.append(f"  patched from {e.good!r}: " + ", ".join(f"{b}<-{g}" for b, g in r.pairs))
    if len(items) > shown:
        lines.append(f"\n... {len(items) - shown} more items (surgeon.encode(...).to_pandas() holds every row)")
    return "\n".join(lines)
