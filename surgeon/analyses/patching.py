"""Per-unit activation patching: each head (or unit) of each layer patched alone, from one format into the other."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from surgeon.analyses.common import Direction, layer_sites, make_contrast
from surgeon.show import Shows
from surgeon.case.case import Case
from surgeon.stats import (
    Estimate,
    bootstrap_fraction,
    bootstrap_mean,
    bootstrap_means,
    wilson,
    wilson_many,
)


@dataclass(frozen=True)
class PatchResult(Shows):
    case: str
    component: str
    direction: str
    base: str  # the format that is run
    source: str  # the format activations come from
    tag: str | None
    layers: tuple[int, ...]
    n_units: int
    n_items: int
    clean_base: Estimate  # mean score of the unpatched base run
    clean_source: Estimate
    base_accuracy: Estimate
    source_accuracy: Estimate
    score: np.ndarray  # [layer, unit] mean patched score
    score_lo: np.ndarray
    score_hi: np.ndarray
    fraction: np.ndarray  # [layer, unit] (patched - base) / (source - base): repair (denoise) or damage (noise)
    fraction_lo: np.ndarray
    fraction_hi: np.ndarray
    accuracy: np.ndarray  # [layer, unit] fraction of items whose correct answer wins when patched
    accuracy_lo: np.ndarray
    accuracy_hi: np.ndarray
    delta: np.ndarray  # [layer, unit] mean |source - base| activation at the patched positions
    noop: tuple[tuple[int, int], ...]  # (layer, unit) whose patch changes nothing (source == base)
    per_item: np.ndarray  # [layer, unit, item] patched scores
    # which execution path the engine took, and why (`Contrast.execution`)
    execution: dict = field(default_factory=dict)

    def top(self, k: int = 10) -> list[tuple[int, int, float]]:
        """The k (layer, unit, fraction) with the largest repair fraction."""
        f = np.nan_to_num(self.fraction, nan=-np.inf)
        order = np.argsort(-f, axis=None)[:k]
        return [(int(self.layers[i // self.n_units]), int(i % self.n_units), float(self.fraction.flat[i]))
                for i in order]


def patch_heads(case: Case, model, *, layers=None, component: str = "z", direction: Direction = "denoise",
                bad: str | None = None, tag: str | None = None, batch_size: int = 256,
                progress: bool = False) -> PatchResult:
    """Patch every unit of `component` at each layer alone (all aligned positions at once) and score it.

    Every (layer, unit) patch goes through the intervention core in one batch per layer; layers before
    the patched one and positions before the first patched position are computed once.
    """
    import torch


    layers, sites = layer_sites(model, layers, component)
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=sites)
    U = contrast.units(sites[0])
    per_item = np.zeros((len(layers), U, contrast.n_items))
    delta = np.zeros((len(layers), U))
    iterator = sites
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(sites, desc=f"patching {component}", unit="layer")
    with torch.no_grad():
        for li, site in enumerate(iterator):
            per_item[li] = contrast.run({site: torch.eye(U)}).cpu().numpy()
            delta[li] = contrast.deltas([site])[site].cpu().numpy()
    base = contrast.clean_base.cpu().numpy()
    source = contrast.clean_source.cpu().numpy()
    flat = per_item.reshape(-1, contrast.n_items)
    s, s_lo, s_hi = bootstrap_means(flat)
    f, f_lo, f_hi = bootstrap_fraction(flat, base, source)
    right = contrast.metric.right
    a, a_lo, a_hi = wilson_many(right(flat).sum(-1), contrast.n_items)
    shape = (len(layers), U)
    scale = max(float(np.abs(delta).max()), 1e-30)
    noop = tuple((int(layers[i]), int(u)) for i, u in zip(*np.nonzero(delta <= 1e-7 * scale)))
    return PatchResult(
        case=case.name, component=component, direction=direction, base=info["base"], source=info["source"],
        tag=info["tag"], layers=layers, n_units=U, n_items=contrast.n_items,
        clean_base=bootstrap_mean(base), clean_source=bootstrap_mean(source),
        base_accuracy=wilson(int(right(base).sum()), base.size), source_accuracy=wilson(int(right(source).sum()), source.size),
        score=s.reshape(shape), score_lo=s_lo.reshape(shape), score_hi=s_hi.reshape(shape),
        fraction=f.reshape(shape), fraction_lo=f_lo.reshape(shape), fraction_hi=f_hi.reshape(shape),
        accuracy=a.reshape(shape), accuracy_lo=a_lo.reshape(shape), accuracy_hi=a_hi.reshape(shape),
        delta=delta, noop=noop, per_item=per_item, execution=contrast.execution,
    )
