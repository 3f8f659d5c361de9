"""Plain-text reports and saved results (results.json + manifest.json + figures) for the CLI."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np


def diagnosis_text(d, case) -> str:
    tags = {}
    for it in case.items:
        tags[it.tag or "(untagged)"] = tags.get(it.tag or "(untagged)", 0) + 1
    lines = [f"case {d.case} · model {d.model} · {len(case.items)} items ("
             + ", ".join(f"{k} {v}" for k, v in sorted(tags.items())) + ")",
             "score = log P(correct) - log P(incorrect), summed over answer tokens; accuracy = score > 0",
             "",
             f"{'format':10s} {'role':5s} {'items':9s} {'accuracy [95% CI]':32s} {'mean score [95% CI]'}"]
    for s in d.stats:
        sc = s.score
        lines.append(f"{s.format:10s} {s.role:5s} {s.tag:9s} {s.accuracy.pct():32s} "
                     f"{sc.value:+7.2f} [{sc.lo:+.2f}, {sc.hi:+.2f}]")
    focus = d.focus or "all"
    lines.append("")
    g = d.get(d.good, focus).accuracy
    for b, yes in d.reproduced.items():
        a = d.get(b, focus).accuracy
        verdict = "REPRODUCED" if yes else "not reproduced"
        lines.append(f"failure in {b!r} on {focus} items: {verdict} — accuracy {a.pct()} vs {g.pct()} in {d.good!r}")
    return "\n".join(lines)


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
    for i, L in enumerate(r.layers):
        lines.append(f"{L:5d} " + "".join(f"{v:7.2f}" if np.isfinite(v) else "    nan" for v in r.fraction[i]))
    lines += ["", f"top {min(top, r.fraction.size)} units by {what} fraction:",
              f"{'unit':8s} {what + ' fraction [95% CI]':28s} {'accuracy when patched [95% CI]'}"]
    for L, u, _ in r.top(top):
        i = r.layers.index(L)
        f, lo, hi = r.fraction[i, u], r.fraction_lo[i, u], r.fraction_hi[i, u]
        a, alo, ahi = r.accuracy[i, u], r.accuracy_lo[i, u], r.accuracy_hi[i, u]
        lines.append(f"L{L}.{u:<5d} {f:+.3f} [{lo:+.3f}, {hi:+.3f}]        "
                     f"{100 * a:5.1f}% [{100 * alo:5.1f}, {100 * ahi:5.1f}] (n={r.n_items})")
    if r.noop:
        lines += ["", f"no-op patches (source activation equals base at the patched positions): "
                      + ", ".join(f"L{L}.{u}" for L, u in r.noop[:20]) + (" ..." if len(r.noop) > 20 else "")]
    return "\n".join(lines)


def save(out: Path, command: str, result, case, args, device: str, figures: dict[str, str]) -> None:
    """results.json + manifest.json + figures, all or nothing."""
    from . import figures as figs
    from .results import manifest, staging, write_json

    opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
            if k not in ("debug", "out", "case")}
    with staging(out) as tmp:
        write_json(tmp / "results.json", {"command": command, "result": asdict(result)})
        write_json(tmp / "manifest.json", manifest(command, case, seed=getattr(args, "seed", None), device=device,
                                                   dtype=getattr(args, "dtype", None), options=opts))
        for name, kind in figures.items():
            {"diagnosis": figs.diagnosis_figure, "patch": figs.patch_heatmap}[kind](result, tmp / name)
