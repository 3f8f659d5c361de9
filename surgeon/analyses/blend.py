"""Blends: activation = (1 - a) * failing + a * good for chosen heads; where does repair switch on?"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from surgeon.analyses.common import make_contrast
from surgeon.errors import AnalysisError
from surgeon.show import Shows
from surgeon.sites.nodes import Site, unit_label
from surgeon.case.case import Case
from surgeon.stats import Estimate, bootstrap_mean, wilson_many


@dataclass(frozen=True)
class BlendResult(Shows):
    case: str
    component: str
    base: str
    source: str
    tag: str | None
    layer: int
    units: tuple[str, ...]  # what is blended ("L10H0", ... or "attn_out10")
    n_items: int
    alphas: np.ndarray  # [A] grid of blend fractions
    rate: np.ndarray  # [A] fraction of items right (the metric's `right`: for most, the correct answer wins)
    rate_lo: np.ndarray
    rate_hi: np.ndarray
    mean_score: np.ndarray  # [A]
    switch: np.ndarray  # [n_items] a* where the score crosses into right (0 for most metrics; nan: not repaired at a = 1)
    crossings: np.ndarray  # [n_items] how many times the score changes sign along the grid
    switch_mean: Estimate  # over the items that switch
    switch_quartiles: tuple[float, float, float]
    never: int  # items not repaired even at a = 1
    already: int  # items correct at a = 0
    rate_at: dict  # repair rate at a few round fractions, e.g. {"0.4": ..., "0.6": ...}
    # which execution path the engine took, and why (`Contrast.execution`)
    execution: dict = field(default_factory=dict)


def blend_heads(heads, layer: int) -> list[int] | None:
    """The heads of `layer` to blend, from what a user writes anywhere else: None (every head), head numbers
    (ints, or "0,2,5"), or labels ("L0H6", "L0H4,L0H6", ["L0H6", "L0H4"]); a label of another layer is refused."""
    import re

    if heads is None:
        return None
    parts = heads.split(",") if isinstance(heads, str) else list(heads) if not isinstance(heads, int) else [heads]
    out = []
    for h in parts:
        if isinstance(h, int) and not isinstance(h, bool):
            out.append(h)
            continue
        m = re.fullmatch(r"\s*(?:L(\d+)H)?(\d+)\s*", h) if isinstance(h, str) else None
        if m is None:
            raise AnalysisError(f"cannot read head {h!r}", field="--heads",
                                fix=f"write heads as 0,2,5 or L{layer}H0,L{layer}H2 (heads of --layer {layer})")
        if m.group(1) is not None and int(m.group(1)) != layer:
            raise AnalysisError(f"head {h.strip()} is in layer {m.group(1)}, but the blend is at layer {layer}",
                                field="--heads", fix=f"blend heads of one layer: --layer {m.group(1)}, or heads "
                                                     f"L{layer}H...")
        out.append(int(m.group(2)))
    if len(set(out)) != len(out):
        raise AnalysisError("a head is listed twice", field="--heads", fix="list each head once")
    return out


def blend(case: Case, model, *, layer: int, heads=None, component: str = "z",
          step: float = 0.01, bad: str | None = None, tag: str | None = None, batch_size: int = 256) -> BlendResult:
    """Score every item on a grid of blend fractions a (step 0.01 by default) in one batch, and locate each
    item's switching point a* by linear interpolation between the grid points around its sign change."""
    import torch

    if not 0 < step <= 0.5:
        raise AnalysisError(f"step {step} is not in (0, 0.5]", field="--step", fix="e.g. 0.01")
    if not 0 <= layer < model.cfg.n_layers:
        raise AnalysisError(f"layer {layer} is out of range (0..{model.cfg.n_layers - 1})", field="--layer",
                            fix=f"use a layer between 0 and {model.cfg.n_layers - 1}")
    site = Site.of(component, layer)
    U = site.n_units(model.cfg)
    if site.component.units == "whole":
        chosen = [0]
        labels = (unit_label(component, layer, 0),)
    else:
        heads = blend_heads(heads, layer)
        chosen = list(range(U)) if heads is None else heads
        bad_heads = [h for h in chosen if not 0 <= h < U]
        if bad_heads:
            raise AnalysisError(f"heads {bad_heads} are out of range (0..{U - 1})", field="--heads", fix="choose heads that exist")
        labels = tuple(unit_label(component, layer, h) for h in chosen)
    contrast, info = make_contrast(case, model, bad=bad, tag=tag, batch_size=batch_size, sites=[site])
    alphas = np.round(np.arange(0, 1 + step / 2, step), 10)
    masks = torch.zeros(len(alphas), U)
    masks[:, chosen] = torch.tensor(alphas, dtype=torch.float32)[:, None]
    with torch.no_grad():
        scores = contrast.run({site: masks}).cpu().numpy()  # [A, n_items]
    t = contrast.metric.right_above  # an item is right above this score (0 for all but kl)
    ok = scores > t
    rate, lo, hi = wilson_many(ok.sum(1), contrast.n_items)
    n = contrast.n_items
    switch = np.full(n, np.nan)
    crossings = (np.diff(ok.astype(int), axis=0) != 0).sum(0)
    for i in range(n):
        if ok[0, i]:
            switch[i] = 0.0
            continue
        idx = np.nonzero(ok[:, i])[0]
        if len(idx):
            k = idx[0]
            s0, s1 = scores[k - 1, i], scores[k, i]
            switch[i] = alphas[k - 1] + (t - s0) / (s1 - s0) * (alphas[k] - alphas[k - 1])
    moved = switch[np.isfinite(switch) & ~ok[0]]
    q = tuple(float(v) for v in np.percentile(moved, [25, 50, 75])) if len(moved) else (float("nan"),) * 3
    rate_at = {f"{a:.1f}": float(rate[int(round(a / step))]) for a in np.arange(0, 1.01, 0.2)
               if int(round(a / step)) < len(alphas)}
    return BlendResult(case.name, component, info["base"], info["source"], info["tag"], layer, labels, n, alphas,
                       rate, lo, hi, scores.mean(1), switch, crossings, bootstrap_mean(moved), q,
                       int((~ok[-1]).sum()), int(ok[0].sum()), rate_at, execution=contrast.execution)
