"""Figures, drawn only from numbers the analyses computed (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def diagnosis_figure(d, path: Path) -> None:
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
        err = np.array([[v.value - v.lo for v in vals], [v.hi - v.value for v in vals]])
        ax.bar(x, y, width, yerr=err, capsize=3, label=f"{tag} (n={vals[0].n})")
    ax.set_xticks(np.arange(len(formats)), [f"{f}\n({'good' if f == d.good else 'bad'})" for f in formats])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy (correct answer wins)")
    ax.set_title(f"{d.case}: accuracy per format (95% CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def patch_heatmap(r, path: Path) -> None:
    """Repair (or damage) fraction per layer and unit."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(1.5 + 0.45 * r.n_units, 1.2 + 0.45 * len(r.layers)))
    lim = max(1.0, float(np.nanmax(np.abs(r.fraction))) if np.isfinite(r.fraction).any() else 1.0)
    im = ax.imshow(r.fraction, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    ax.set_yticks(range(len(r.layers)), [str(L) for L in r.layers])
    ax.set_xticks(range(r.n_units), [str(u) for u in range(r.n_units)])
    ax.set_xlabel("head" if r.component in ("z", "q", "pattern", "o_slices") else "unit")
    ax.set_ylabel("layer")
    what = "repair" if r.direction == "denoise" else "damage"
    ax.set_title(f"{r.case}: {what} fraction, {r.component} {r.source}->{r.base} (n={r.n_items})", fontsize=9)
    for (i, j), v in np.ndenumerate(r.fraction):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
