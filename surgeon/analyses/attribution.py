"""Attribution patching: the effect of patching every unit, estimated from one backward pass.

The same masks as per-unit patching, held at 0 with `requires_grad`: d(mean score)/d(mask) is the
first-order estimate of what patching each unit alone would do (as in attribution patching / EAP).
All layers go through the core in one batch, so one forward and one backward cover every unit.
`compare=True` also runs the exact per-unit patching and reports how well the estimate ranks it.

Methods (registered in `surgeon.analyses.scoring`, described in `ATTRIBUTION_METHODS`): `gradient` (the derivative at mask 0, one backward pass), `ig` (integrated
gradients over the masks of every unit together, from 0 to 1, midpoint rule with `ig_steps` points: the
estimates then sum to the effect of patching every unit at once, and a saturated unit is not missed) and `atp*`
(Kramár et al. 2024): queries and keys through their exact attention patterns (the QK fix,
`surgeon.sites.qk_fix`), and GradDrop: one backward pass per layer with that layer's outputs passing no gradient,
the estimate 1/(L-1) sum_l |estimate without layer l|, so an effect that cancels between paths still shows. GradDrop
estimates magnitudes: `compare` then correlates it with the exact effect's magnitude.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from surgeon.analyses.common import Direction, layer_sites, make_contrast
from surgeon.analyses.patching import patch_heads
from surgeon.analyses.scoring import check_unit_method
from surgeon.circuits.methods import ATTRIBUTION_IG_STEPS as IG_STEPS
from surgeon.show import Shows
from surgeon.case.case import Case


@dataclass(frozen=True)
class AttributionResult(Shows):
    case: str
    component: str
    direction: str
    base: str
    source: str
    tag: str | None
    layers: tuple[int, ...]
    n_units: int
    n_items: int
    gap: float  # mean score of the source run - mean score of the base run (what a full patch moves)
    gradient: np.ndarray  # [layer, unit] d(mean score) / d(mask) at mask = 0 (ig: averaged along the path)
    estimate: np.ndarray  # [layer, unit] the gradient as a fraction of the gap (source - base): estimated repair
    exact: np.ndarray | None  # [layer, unit] exact repair fraction of patching the unit alone (compare=True)
    pearson: float | None  # correlation of estimate and exact
    spearman: float | None  # rank correlation of estimate and exact
    # which execution path the engine took, and why (`Contrast.execution`)
    execution: dict = field(default_factory=dict)
    method: str = "gradient"
    ig_steps: int | None = None
    backward_passes: int = 1  # what the estimate cost (gradient and ig one; ig holds its points in the batch; atp* one per layer)


def _ranks(x: np.ndarray) -> np.ndarray:
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(len(x))
    return r


def attribute(case: Case, model, *, layers=None, component: str = "z", direction: Direction = "denoise",
              bad: str | None = None, tag: str | None = None, batch_size: int = 256,
              compare: bool = False, method: str = "gradient", ig_steps: int = IG_STEPS) -> AttributionResult:
    scorer = check_unit_method(method, ig_steps)
    layers, sites = layer_sites(model, layers, component)
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=sites)
    U = contrast.units(sites[0])
    grad, passes = scorer.gradient(contrast, sites, component, U, ig_steps)
    gap = float((contrast.clean_source - contrast.clean_base).mean())
    # a method that estimates magnitudes (atp*): as a fraction of the gap's magnitude
    estimate = (grad / (abs(gap) if scorer.magnitudes else gap)) if abs(gap) > 1e-12 else grad * np.nan
    exact = pearson = spearman = None
    if compare:
        exact = patch_heads(case, model, layers=layers, component=component, direction=direction, bad=bad, tag=tag,
                            batch_size=batch_size).fraction
        a, b = estimate.ravel(), (np.abs(exact) if scorer.magnitudes else exact).ravel()
        if np.std(a) > 0 and np.std(b) > 0:
            pearson = float(np.corrcoef(a, b)[0, 1])
            spearman = float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])
    return AttributionResult(case.name, component, direction, info["base"], info["source"], info["tag"], layers, U,
                             contrast.n_items, gap, grad, estimate, exact, pearson, spearman, execution=contrast.execution,
                             method=method, ig_steps=ig_steps if scorer.ig else None, backward_passes=passes)
