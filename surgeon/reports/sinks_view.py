"""How attention sinks print, and what intervening on them does."""
from __future__ import annotations

import numpy as np

from surgeon.analyses.sinks import massive_ratio
from surgeon.show import View
from surgeon.reports import figures
from surgeon.reports import tables


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


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "SinkResult": View("sinks", sinks_text, {"sinks.png": figures.sinks_figure}),
    "SinkInterventionResult": View("sinks-intervene", sink_interventions_text,
                                   {"sinks.png": lambda r, p: figures.sinks_figure(r.measured, p)},
                                   table=tables.sinks_table),
}
