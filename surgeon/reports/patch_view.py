"""How per-head and per-position patching print (and per-head patching held out)."""
from __future__ import annotations

import numpy as np

from surgeon.reports.text import gap_note, interval, num
from surgeon.sites.nodes import unit_label
from surgeon.show import View
from surgeon.reports import figures
from surgeon.reports import tables


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
    no_gap = gap_note(r.clean_base, r.clean_source)
    if no_gap:
        lines[-2:] = [f"warning: {no_gap}"]
    else:
        for i, L in enumerate(r.layers):
            lines.append(f"{L:5d} " + "".join(num(v, "7.2f") if np.isfinite(v) else "    nan" for v in r.fraction[i]))
        lines += ["", f"top {min(top, r.fraction.size)} units by {what} fraction:",
                  f"{'unit':10s} {what + ' fraction [95% CI]':28s} {'accuracy when patched [95% CI]'}"]
        for L, u, _ in r.top(top):
            i = r.layers.index(L)
            f, lo, hi = r.fraction[i, u], r.fraction_lo[i, u], r.fraction_hi[i, u]
            a, alo, ahi = r.accuracy[i, u], r.accuracy_lo[i, u], r.accuracy_hi[i, u]
            lines.append(f"{unit_label(r.component, L, u):10s} {f:+.3f} {interval(lo, hi):22s} "
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
            lines.append(f"{L:<6d}" + "".join(f"{num(v, f'{width}.3f')}" if np.isfinite(v) else f"{'-':>{width}s}"
                                              for v in r.fraction[li, :, 0]))
        return "\n".join(lines)
    lines += ["", f"top {top} (unit, position) cells:", f"{'unit':10s} {'position':28s} {what + ' [95% CI]':>26s}"]
    for L, j, u, f in r.top(top):
        li = r.layers.index(L)
        lines.append(f"{unit_label(r.component, L, u):10s} {r.slots[j]:28s} {f:+8.3f} "
                     f"{interval(r.fraction_lo[li, j, u], r.fraction_hi[li, j, u])}")
    return "\n".join(lines)


def patch_line(p) -> str:
    f = np.nan_to_num(np.asarray(p.fraction, dtype=float), nan=-np.inf)
    li, u = np.unravel_index(int(np.argmax(f)), f.shape)
    return (f"best single unit L{p.layers[li]}H{u}: repair fraction {p.fraction[li, u]:+.3f} "
            f"[{p.fraction_lo[li, u]:+.3f}, {p.fraction_hi[li, u]:+.3f}] over {p.n_items} items")


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "PatchResult": View("patch", patch_text, {"heatmap.png": figures.patch_heatmap}, table=tables.patch_table,
                        headline=patch_line),
    "PositionPatchResult": View("patch-positions", position_patch_text, {"positions.png": figures.position_heatmap},
                                table=tables.positions_table),
    "HeldOutPatch": View("patch-heldout", heldout_patch_text,
                         headline=lambda r: f"top unit {r.top[0].unit}: {r.top[0].held_out.value:+.3f} held out, "
                                            f"{r.top[0].discovery.value:+.3f} in-sample; Spearman {r.spearman:.3f}"
                         if r.top else "no unit"),
}
