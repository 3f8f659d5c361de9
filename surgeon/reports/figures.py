"""Figures, drawn only from numbers the analyses computed (matplotlib, headless).

Each function draws one result into `path` (None: no file) and returns the (closed) matplotlib Figure, so a
notebook or a test can look at what was drawn."""
from __future__ import annotations

import math
import textwrap
import weakref
from pathlib import Path

import numpy as np

from surgeon.analyses.pareto import NAMES
from surgeon.analyses.sinks import massive_ratio
from surgeon.reports.citations import METHOD_NAMES
from surgeon.reports.legibility import MIN_POINTS, layout_renderer, place_legends


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# a journal's column widths (inches): every figure is drawn at one of them
ONE_COLUMN, TWO_COLUMNS = 3.25, 6.75
MAX_HEIGHT = 9.0
# fonts a journal's checks accept: TrueType (Type 42) in PDF, text kept as text in SVG
FONTS = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}


def journal_width(fig) -> None:
    """Scale `fig` to one column (3.25 in) when it was drawn narrow, else to two (6.75 in), keeping its aspect
    (height at most 9 in)."""
    w, h = fig.get_size_inches()
    target = ONE_COLUMN if w <= 4.6 else TWO_COLUMNS
    fig.set_size_inches(target, min(MAX_HEIGHT, max(2.2 if target == ONE_COLUMN else 2.8, h * target / w)))


def save_figure(fig, path, **kw) -> None:
    """Write `fig` as it was laid out (no tight bounding box: its width stays a column's), fonts as `FONTS`."""
    import matplotlib

    with matplotlib.rc_context(FONTS):
        fig.savefig(path, **{"dpi": 150, **kw})


# what a figure does once it is laid out at its printed size (label what fits, per axes): figure -> callables(renderer)
_AFTER_LAYOUT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _wrap_titles(fig, renderer) -> bool:
    """Wrap each panel title and x-axis label wider than its panel onto as many lines as it needs; whether any was
    wrapped."""
    wrapped = False
    for ax in fig.axes:
        for t in (ax.title, ax.xaxis.label):
            text = t.get_text()
            if not text.strip() or "\n" in text:
                continue
            w, room = t.get_window_extent(renderer).width, ax.get_window_extent(renderer).width * 1.1
            if w > room:
                t.set_text(textwrap.fill(text, max(12, int(len(text) * room / w) - 1)))
                wrapped = True
    return wrapped


def _fit_ticks(ax, labels: list[str], size: float = 7.0, rotation: int = 90):
    """Label the x axis's positions 0..n-1 with `labels` (rotated by `rotation`); once the figure is laid out, every
    k-th only where one per position would not fit at `size`."""
    n = len(labels)

    def after(renderer):
        pitch = ax.get_window_extent(renderer).width / max(n, 1) * 72 / ax.figure.dpi
        wide = size * 1.25 if rotation else size * 0.65 * max(map(len, labels), default=1) + size * 0.6
        step = max(1, math.ceil(wide / pitch))
        shown = list(range(0, n, step))
        ax.set_xticks(shown, [labels[i] for i in shown], rotation=rotation, fontsize=size)

    _AFTER_LAYOUT.setdefault(ax.figure, []).append(after)


def _save(fig, path: Path | None):
    """Lay out at a journal's column width (titles wrapped to their panels, then what each figure labels once its
    size is known, then legends moved off the data: `legibility`), write to `path` (none: only return it, for a
    notebook) and close."""
    import matplotlib.pyplot as plt

    journal_width(fig)
    fig.tight_layout()
    renderer = layout_renderer(fig)
    if _wrap_titles(fig, renderer):
        fig.tight_layout()
    for after in _AFTER_LAYOUT.pop(fig, []):
        after(renderer)
        fig.tight_layout()
    place_legends(fig, layout=fig.tight_layout)
    if path is not None:
        save_figure(fig, path)
    plt.close(fig)
    return fig


def _yerr(value, lo, hi) -> np.ndarray:
    """Error bars [2, n] from a value and its interval (clipped at 0 against rounding)."""
    value, lo, hi = (np.asarray(x, dtype=float) for x in (value, lo, hi))
    return np.clip(np.stack([value - lo, hi - value]), 0, None)


def pyplot():
    """matplotlib.pyplot on the Agg backend (for views in other modules)."""
    return _plt()


def finish(fig, path: Path | None):
    """A figure laid out, written to `path` (none: only returned) and closed, as every figure here is."""
    return _save(fig, path)


def diagnosis_figure(d, path: Path):
    """Accuracy per format and item tag, with 95% Wilson intervals."""
    plt = _plt()
    tags = sorted({s.tag for s in d.stats}, key=lambda t: (t != "all", t))
    formats = [d.good] + list(d.bad)
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(formats) * len(tags) / 2, 3.2))
    width = 0.8 / len(tags)
    for j, tag in enumerate(tags):
        vals = [d.get(f, tag).accuracy for f in formats]
        x = np.arange(len(formats)) + (j - (len(tags) - 1) / 2) * width
        y = np.array([v.value for v in vals])
        err = _yerr(y, [v.lo for v in vals], [v.hi for v in vals])
        ax.bar(x, y, width, yerr=err, capsize=3, label=f"{tag} (n={vals[0].n})")
    ax.set_xticks(np.arange(len(formats)), [f"{f}\n({'good' if f == d.good else 'bad'})" for f in formats])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy (items right)")
    ax.set_title("accuracy per format (95% CI)", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _symmetric_limit(*arrays) -> float:
    """The largest finite |value| over `arrays` (1 where there is none): the ends of a diverging scale about 0."""
    finite = np.concatenate([np.abs(np.asarray(a, dtype=float)).ravel() for a in arrays])
    finite = finite[np.isfinite(finite)]
    return float(finite.max()) if finite.size and finite.max() > 0 else 1.0


def _annotate_cells(ax, values: np.ndarray, lim: float):
    """Once the figure is laid out: write each cell's value in it where the widest value fits its cell at
    `MIN_POINTS` or more (else the colour and the step's table say it)."""

    def after(renderer):
        box = ax.get_window_extent(renderer)
        cell = box.width / values.shape[1] * 72 / ax.figure.dpi  # points
        labels = [f"{v:.2f}" for v in values.ravel() if np.isfinite(v)]
        widest = max((len(x) for x in labels), default=0) * 0.64  # DejaVu Sans digits: 0.64 em
        size = min(7.0, (cell - 2) / widest) if widest else 0
        if size < MIN_POINTS:
            return
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=size,
                        color="white" if abs(v) > 0.6 * lim else "black")

    _AFTER_LAYOUT.setdefault(ax.figure, []).append(after)


def _heatmap(ax, values: np.ndarray, layers, component: str, title: str, label: str | None, lim: float | None = None):
    """Layers x units on a diverging scale symmetric about 0 (fitted to the data: the largest |value| is full colour,
    or +-`lim` where panels share a scale), each cell's value written in it where it fits; a labelled colorbar unless
    `label` is None (the caller draws one for several panels)."""
    n_units = values.shape[1]
    lim = _symmetric_limit(values) if lim is None else lim
    im = ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_yticks(range(len(layers)), [str(L) for L in layers])
    ax.set_xticks(range(n_units), [str(u) for u in range(n_units)])
    ax.set_xlabel("head" if component in ("z", "q", "pattern", "o_slices") else "unit")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    _annotate_cells(ax, values, lim)
    if label is not None:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, label=label)
    return im


def _heatmap_figure(n_units: int, n_layers: int, panels: int = 1):
    plt = _plt()
    return plt.subplots(1, panels, figsize=(1.5 + 0.45 * n_units + 4.2 * (panels - 1), 1.6 + 0.45 * max(n_layers, 5)),
                        squeeze=False)


def patch_heatmap(r, path: Path):
    """Repair (or damage) fraction per layer and unit."""
    what = "repair" if r.direction == "denoise" else "damage"
    fig, axes = _heatmap_figure(r.n_units, len(r.layers))
    _heatmap(axes[0, 0], r.fraction, r.layers, r.component,
             f"{r.case}: {what} fraction, {r.component} {r.source}->{r.base} (n={r.n_items})", f"{what} fraction")
    return _save(fig, path)


def attribution_heatmap(r, path: Path):
    """Estimated repair fraction per layer and unit (gradient w.r.t. the mask, over the gap); with --compare, beside
    it the estimate against exact per-unit patching, one point per unit, with the correlation."""
    what = "repair" if r.direction == "denoise" else "damage"
    fig, axes = _heatmap_figure(r.n_units, len(r.layers), panels=1 if r.exact is None else 2)
    _heatmap(axes[0, 0], r.estimate, r.layers, r.component,
             f"{r.case}: attribution estimate, {r.component} {r.source}->{r.base} (n={r.n_items})",
             f"estimated {what} fraction")
    if r.exact is not None:
        ax = axes[0, 1]
        x, y = np.asarray(r.exact).ravel(), np.asarray(r.estimate).ravel()
        layer_of = np.repeat(np.arange(len(r.layers)), r.n_units)
        for i, L in enumerate(r.layers):
            ax.scatter(x[layer_of == i], y[layer_of == i], s=14, label=f"layer {L}")
        ok = np.isfinite(x) & np.isfinite(y)
        if ok.any():
            lo, hi = float(min(x[ok].min(), y[ok].min())), float(max(x[ok].max(), y[ok].max()))
            ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="estimate = exact")
        corr = ("r undefined" if r.pearson is None
                else f"r = {r.pearson:.2f}, Spearman {r.spearman:.2f}")
        ax.set_xlabel(f"exact {what} fraction (the unit patched alone)")
        ax.set_ylabel(f"estimated {what} fraction")
        ax.set_title(f"estimate vs exact ({x.size} units): {corr}", fontsize=8)
        ax.legend(fontsize=7)
    return _save(fig, path)


def threshold_figure(r, path: Path):
    """Fraction of subsets that repair vs subset size k, per family, with 95% intervals and each family's k*
    marked; families whose curves coincide are drawn side by side and say so in the legend."""
    plt = _plt()
    fams = ["all", *r.groups]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    curves = {}
    for fam in fams:
        rows = sorted((s for s in r.sizes if s.family == fam and s.evaluated), key=lambda s: s.key)
        curves[fam] = (np.array([s.key[0] for s in rows]), np.array([s.fraction for s in rows]), rows)
    markers = "osD^vP*X"
    for i, fam in enumerate(fams):
        k, y, rows = curves[fam]
        same = [g for g in fams[:i] if np.array_equal(curves[g][0], k) and np.allclose(curves[g][1], y)]
        dx = 0.08 * (i - (len(fams) - 1) / 2) if len(fams) > 1 else 0.0  # side by side where curves coincide
        err = _yerr(y, [s.lo for s in rows], [s.hi for s in rows])
        n = len(r.units) if fam == "all" else len(r.groups[fam])
        label = f"{fam} ({n} heads)" + (f" = {', '.join(same)}" if same else "")
        line = ax.errorbar(k + dx, y, yerr=err, marker=markers[i % len(markers)], capsize=3, label=label,
                           ls="--" if same else "-", mfc="none" if same else None)
        t = r.threshold(fam)
        if t.k_star is not None:
            ax.axvline(t.k_star + dx, color=line[0].get_color(), lw=0.9, ls=":")
            ax.annotate(f"k*={t.k_star}", (t.k_star + dx, 1.0), xytext=(2, -10 - 9 * i), textcoords="offset points",
                        fontsize=7, color=line[0].get_color())
    ax.axhline(r.x, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("subset size k")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # k counts heads
    ax.set_ylabel("fraction of subsets")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(f"subsets repairing (right on >= {r.item_rate:.0%} of {r.n_items} items)", fontsize=8)
    ax.legend(fontsize=7)
    ax = axes[1]
    u = r.unit_stats
    x = np.arange(len(u))
    w = [s.rate_with for s in u]
    wo = [s.rate_without for s in u]
    if not np.any(np.nan_to_num(np.asarray(w + wo, dtype=float))):  # no subset repairs: with/without is all zero
        rows = sorted((s for s in r.sizes if s.family == "all" and s.evaluated and np.isfinite(s.best_item_rate)),
                      key=lambda s: s.key)
        k = np.array([s.key[0] for s in rows])
        y = np.array([s.best_item_rate for s in rows])
        ax.errorbar(k, y, yerr=_yerr(y, [s.best_lo for s in rows], [s.best_hi for s in rows]), marker="o", capsize=3)
        ax.axhline(r.item_rate, color="grey", lw=0.6, ls=":", label=f"criterion {r.item_rate:.0%}")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("subset size k")
        ax.set_ylabel("best subset: items right")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title("no subset repairs: the best subset per k", fontsize=8)
        ax.legend(fontsize=7)
        return _save(fig, path)
    ax.bar(x - 0.2, w, 0.4, yerr=_yerr(w, [s.rate_with_lo for s in u], [s.rate_with_hi for s in u]), capsize=2,
           label="with head")
    ax.bar(x + 0.2, wo, 0.4, yerr=_yerr(wo, [s.rate_without_lo for s in u], [s.rate_without_hi for s in u]), capsize=2,
           label="without head")
    _fit_ticks(ax, [s.unit for s in u])
    ax.set_ylabel("fraction of subsets")
    ax.set_title("repairing, with and without each head", fontsize=8)
    ax.legend(fontsize=8)
    return _save(fig, path)


def heldout_figure(r, path: Path):
    """A `HeldOutThreshold`: per family and size k, the best subset on the discovery items evaluated on the held-out
    items (filled, the result) beside its in-sample rate (hollow), with 95% intervals; each family's held-out k*."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    fams = list(dict.fromkeys(row.family for row in r.rows))
    for i, fam in enumerate(fams):
        rows = sorted((row for row in r.rows if row.family == fam), key=lambda row: row.k)
        k = np.array([row.k for row in rows], dtype=float) + 0.1 * (i - (len(fams) - 1) / 2)
        h = [row.held_out for row in rows]
        d = [row.discovery for row in rows]
        line = ax.errorbar(k, [e.value for e in h], yerr=_yerr([e.value for e in h], [e.lo for e in h], [e.hi for e in h]),
                           marker="o", capsize=3, label=f"{fam}: held out (n={r.n_evaluation})")
        ax.plot(k, [e.value for e in d], marker="o", mfc="none", ls=":", color=line[0].get_color(),
                label=f"{fam}: in-sample (n={r.n_discovery})")
        t = next((t for t in r.k_star if t.family == fam), None)
        if t is not None and t.held_out is not None:
            ax.axvline(t.held_out, color=line[0].get_color(), lw=0.8, ls="--")
            ax.annotate(f"k*={t.held_out} held out", (t.held_out, 0.02 + 0.07 * i), fontsize=7,
                        color=line[0].get_color())
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("subset size k")
    ax.set_ylabel("items right, best subset of its size")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("the best subset per k, chosen on the discovery items", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, path)


def blend_figure(r, path: Path):
    """Repair rate vs blend fraction a, with 95% intervals, and the distribution of switching points."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    ax = axes[0]
    ax.plot(r.alphas, r.rate, color="C0")
    ax.fill_between(r.alphas, r.rate_lo, r.rate_hi, alpha=0.25, color="C0")
    ax.set_xlabel(f"blend fraction a  ((1-a) {r.base} + a {r.source})")
    ax.set_ylabel("repair rate")
    ax.set_ylim(-0.03, 1.03)
    what = "heads" if r.component == "z" else r.component
    ax.set_title(f"blending layer {r.layer}'s {what} (n={r.n_items})", fontsize=9)
    ax = axes[1]
    sw = r.switch[np.isfinite(r.switch)]
    ax.hist(sw, bins=np.linspace(0, 1, 21), color="C1")
    ax.set_xlabel("switching point a*")
    ax.set_ylabel("items")
    ax.set_title(f"a* per item ({r.never} never repaired)", fontsize=9)
    return _save(fig, path)


def faithfulness_figure(r, path: Path):
    """Faithfulness vs fraction of edges kept (top-scoring first), with CPR and CMD."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    x = np.array(r.curve_fractions[1:])
    ax.plot(x, r.curve[1:], marker="o")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    if r.target is not None:
        ax.axhline(r.target, color="C1", lw=0.8, ls=":", label=f"target {r.target}")
    ax.set_xscale("log")
    ax.set_xlabel("fraction of edges in the circuit (top-scoring)")
    ax.set_ylabel("faithfulness")
    ax.set_title(f"{METHOD_NAMES.get(r.method, (r.method,))[0]}, {r.ablation} ablation (CPR {r.cpr:.3f}, CMD {r.cmd:.3f})",
                 fontsize=9)
    if r.target is not None:
        ax.legend(fontsize=8)
    return _save(fig, path)


def feature_circuit_figure(r, path: Path):
    """Faithfulness (kept) and completeness (ablated) over the top-k nodes, per direction."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for i, d in enumerate(r.directions.values()):
        k = [c[0] for c in d.curve]
        ax.plot(k, [c[1] for c in d.curve], marker="o", color=f"C{i}", label=f"{d.direction}: faithfulness")
        ax.plot(k, [c[2] for c in d.curve], marker="x", ls=":", color=f"C{i}", label=f"{d.direction}: completeness")
        ax.axvline(len(d.circuit), color=f"C{i}", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("nodes (top by |attribution|)")
    ax.set_ylabel("share of the behaviour")
    ax.set_title(f"feature circuit, {len(r.nodes)} nodes ({r.method})", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def overlap_figure(r, path: Path):
    """Per-layer top-k overlap (and Jaccard) between the good and each failing format, with 95% intervals."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    x = np.array(r.layers)
    for i, b in enumerate(r.bad):
        for m, ls in (("overlap", "-"), ("jaccard", ":")):
            e = r.metrics[b][m]
            v = np.array([q.value for q in e])
            ax.errorbar(x, v, yerr=_yerr(v, [q.lo for q in e], [q.hi for q in e]), ls=ls, marker="o", color=f"C{i}",
                        capsize=2, label=f"{b}: {m}")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"top-{r.k} feature overlap with {r.good}")
    ax.set_title("where the formats separate and re-entangle", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def head_feature_heatmap(r, path: Path):
    """Heads (and groups) x features: mean change in feature activation when the head is patched."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1 + 0.5 * len(r.features), 1 + 0.25 * len(r.units)))
    v = np.asarray(r.effect)
    lim = float(np.nanmax(np.abs(v))) or 1.0
    im = ax.imshow(v, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_yticks(range(len(r.units)), r.units, fontsize=6)
    ax.set_xticks(range(len(r.features)), [f"f{j}" for j in r.features], fontsize=6, rotation=90)
    ax.set_title(f"layer {r.layer}'s heads -> layer {r.sae_layer}'s SAE features", fontsize=8)
    fig.colorbar(im, ax=ax, label="activation change")
    return _save(fig, path)


def logit_attribution_figure(r, path: Path):
    """Each head's direct effect on the logit difference in every format (a heatmap each, one colour scale for all,
    symmetric about 0), and below them the logit lens per format with 95% intervals."""
    plt = _plt()
    n = len(r.formats)
    layers = list(range(r.n_layers))
    fig = plt.figure(figsize=(TWO_COLUMNS, 1.2 + 0.28 * max(r.n_layers, 3) + 2.2))
    grid = fig.add_gridspec(2, n + 1, width_ratios=[1] * n + [0.05], height_ratios=[0.4 + 0.28 * max(r.n_layers, 3), 2.2])
    lim = _symmetric_limit(*(f.heads[..., 0] for f in r.formats))
    heat = [fig.add_subplot(grid[0, j]) for j in range(n)]
    for j, (ax, f) in enumerate(zip(heat, r.formats)):
        im = _heatmap(ax, f.heads[..., 0], layers, "z", f"{f.format} ({f.role})", None, lim=lim)
        if j:
            ax.set_ylabel("")
    fig.colorbar(im, cax=fig.add_subplot(grid[0, n]), label="logit diff.")
    fig.suptitle(f"direct effect of each head on the logit difference (n={r.n_items})", fontsize=9)
    ax = fig.add_subplot(grid[1, :])
    for f in r.formats:
        m = f.lens[:, 0]
        ax.errorbar(layers, m, yerr=_yerr(m, f.lens[:, 1], f.lens[:, 2]), marker="o", capsize=3, label=f.format)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(layers)
    ax.set_xlabel("after layer")
    ax.set_ylabel("logit difference\n(correct - incorrect)")
    ax.set_title("logit lens (95% CI)", fontsize=9)
    ax.legend(fontsize=7)
    return _save(fig, path)


def position_heatmap(r, path: Path):
    """Repair (or damage) fraction per (layer, unit) and position, positions labelled by their token."""
    plt = _plt()
    rows = [(li, u) for li in range(len(r.layers)) for u in range(r.n_units)]
    values = np.array([r.fraction[li, :, u] for li, u in rows])
    labels = [f"L{r.layers[li]}" if r.n_units == 1 else f"L{r.layers[li]}H{u}" for li, u in rows]
    fig, ax = plt.subplots(figsize=(2.5 + 1.1 * len(r.slots), 1.5 + 0.28 * len(rows)))
    finite = np.abs(values[np.isfinite(values)])
    lim = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    im = ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xticks(range(len(r.slots)), r.slots, rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), labels, fontsize=6 if len(rows) > 30 else 8)
    what = "repair" if r.direction == "denoise" else "damage"
    unit = "heads" if r.component == "z" else r.component
    ax.set_title(f"{what} fraction by position: {unit}, {r.source} -> {r.base} (n={r.n_items})", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, label=f"{what} fraction")
    return _save(fig, path)


def _token_ticks(ax, labels: list[str], weight=None, size: float = 7.0):
    """Label the axes' keys and queries with their tokens; once the figure is laid out, where one label per position
    would not fit at `size`, as many as fit, chosen first and last position first, then by `weight` (the attention a
    key receives: the positions a reader looks for), then evenly."""
    n = len(labels)
    order = [0, n - 1] + ([int(i) for i in np.argsort(-np.asarray(weight), kind="stable")] if weight is not None
                          else []) + list(range(n))

    def after(renderer):
        box = ax.get_window_extent(renderer)
        pitch = min(box.width, box.height) / max(n, 1) * 72 / ax.figure.dpi  # points per position
        gap = max(1, math.ceil(size * 1.25 / pitch))  # positions between two labels that do not touch
        shown: list[int] = []
        for i in order:
            if all(abs(i - j) >= gap for j in shown):
                shown.append(i)
        shown.sort()
        ax.set_xticks(shown, [labels[i] for i in shown], rotation=90, fontsize=size)
        ax.set_yticks(shown, [labels[i] for i in shown], fontsize=size)

    _AFTER_LAYOUT.setdefault(ax.figure, []).append(after)


def _shown_token(t: str) -> str:
    """A token as a tick label: a newline as \\n, a token of spaces as open boxes (a blank label reads as none)."""
    t = t.replace("\n", "\\n")
    return t if t.strip() else "\u2423" * len(t)


def attention_figure(r, path: Path):
    """Each chosen head on each chosen item: its pattern (query x key, labelled by token) in every format, side by
    side on one colour scale (0 to 1); every k-th token labelled where one per position would not fit."""
    plt = _plt()
    pairs = [(h, i) for h in r.heads for i in r.items]
    cols = len(r.formats)
    size = min(MAX_HEIGHT / len(pairs), TWO_COLUMNS / cols)
    fig, axes = plt.subplots(len(pairs), cols, figsize=(TWO_COLUMNS, size * len(pairs)), squeeze=False)
    for row, (h, i) in enumerate(pairs):
        for col, fmt in enumerate(r.formats):
            p, ax = r.get(h, i, fmt), axes[row, col]
            ax.imshow(p.pattern, cmap="Blues", vmin=0, vmax=1)
            _token_ticks(ax, [_shown_token(t) for t in p.tokens], weight=np.asarray(p.pattern).sum(axis=0))
            ax.set_title(f"{h}, item {i}, {fmt}", fontsize=8)
            ax.set_xlabel("key", fontsize=7)
            ax.set_ylabel("query", fontsize=7)
    return _save(fig, path)


def sinks_figure(r, path: Path):
    """A `SinkResult`: each head's sink mass (attention to the first token, averaged over the later positions) in
    every format on one scale (0 to 1), heads above epsilon marked; below, per layer and format, the first token's
    residual norm over the others' median and the largest |activation| over the median (log scale; Sun et al.'s
    massive threshold, 1000x, drawn)."""
    plt = _plt()
    fs = r.formats
    L, H = fs[0].mass.shape
    n = len(fs)
    fig = plt.figure(figsize=(TWO_COLUMNS, 1.4 + 0.3 * max(L, 3) + 2.3))
    grid = fig.add_gridspec(2, n + 1, width_ratios=[1] * n + [0.05], height_ratios=[0.5 + 0.3 * max(L, 3), 2.3])
    for j, f in enumerate(fs):
        ax = fig.add_subplot(grid[0, j])
        im = ax.imshow(f.mass, cmap="Purples", vmin=0, vmax=1, aspect="auto")
        for l, h in zip(*np.nonzero(f.mass > r.epsilon)):
            ax.add_patch(_plt().Rectangle((h - 0.5, l - 0.5), 1, 1, fill=False, ec="#d95f02", lw=1.2))
        ax.set_yticks(range(L), [str(x) for x in range(L)])
        _fit_ticks(ax, [str(h) for h in range(H)], rotation=0)
        ax.set_xlabel("head")
        if j == 0:
            ax.set_ylabel("layer")
        ax.set_title(f"{f.format}{' (good)' if f.format == r.good else ''}: rate {f.sink_rate.value:.0%}", fontsize=9)
    fig.colorbar(im, cax=fig.add_subplot(grid[0, n]), label="sink mass")
    fig.suptitle(f"attention on the first token (n={fs[0].n_items}; boxed: above {r.epsilon:g})", fontsize=9)
    ax = fig.add_subplot(grid[1, : n + 1])
    layers = np.arange(L)
    width = 0.8 / n
    for j, f in enumerate(fs):
        ratio = np.array([massive_ratio(m) for m in f.massive], dtype=float)
        ratio[~np.isfinite(ratio)] = np.nan  # the median is 0: no ratio to draw (the text says so)
        ax.bar(layers + (j - (n - 1) / 2) * width, ratio, width, color=f"C{j}", label=f"{f.format}: largest |activation|")
        norm = np.array([e.value for e in f.first_norm_ratio])
        ax.plot(layers + (j - (n - 1) / 2) * width, norm, marker="D", ls="none", color=f"C{j}", mec="black",
                label=f"{f.format}: first token's norm")
    ax.axhline(1000, color="grey", lw=0.8, ls=":", label="massive: 1000x")
    ax.set_yscale("log")
    top = max([massive_ratio(m) for f in fs for m in f.massive if np.isfinite(massive_ratio(m))] + [1000.0])
    ax.set_ylim(1, top * 30)  # bars from 1 (= the median); room above them for the legend
    ax.set_xticks(layers, [str(x) for x in layers])
    ax.set_xlabel("layer (residual stream leaving it)")
    ax.set_ylabel("over the median")
    ax.set_title("massive activations and the first token's norm", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


MARKERS = {"surgeon": ("o", "C0"), "caa": ("s", "C1"), "iti": ("^", "C2"), "random": ("x", "C7"), "layer": ("D", "C4")}


def pareto_figure(b, path=None):
    """Held-out efficacy against the good format's KL (symlog) and against control accuracy, one marker per method,
    the front joined, the shipped repair ringed."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(6.75, 3.0), sharey=True)
    for ax, x_of, xlabel in ((axes[0], lambda p: p.kl.value, "good-format KL from unrepaired (nats, symlog)"),
                             (axes[1], lambda p: 100 * p.control.value, "control items right (%)")):
        for fam in b.tried:
            ps = b.family(fam)
            m, c = MARKERS.get(fam, ("o", "k"))
            ax.scatter([x_of(p) for p in ps], [100 * p.efficacy.value for p in ps], marker=m, color=c, s=18,
                       label=NAMES.get(fam, fam), zorder=3)
        fr = sorted((p for p in b.points if p.front), key=x_of)
        if ax is axes[0] and fr:
            ax.step([x_of(p) for p in fr], [100 * p.efficacy.value for p in fr], where="post", color="0.5", lw=0.8,
                    zorder=2, label="front")
        s = b.shipped()
        if s is not None:
            ax.scatter([x_of(s)], [100 * s.efficacy.value], s=90, facecolors="none", edgecolors="k", zorder=4,
                       label="shipped")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0].set_xscale("symlog", linthresh=1e-3)
    axes[0].set_xlim(left=0, right=max([1e-2] + [1.5 * p.kl.value for p in b.points]))
    axes[0].set_ylabel(f"efficacy held out (%, n={b.shipped().efficacy.n if b.shipped() else '?'})")
    axes[0].set_title("efficacy against harm: KL")
    axes[1].set_title("efficacy against harm: controls")
    axes[1].legend(fontsize=6, loc="best")
    journal_width(fig)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path)
    plt.close(fig)
    return fig
