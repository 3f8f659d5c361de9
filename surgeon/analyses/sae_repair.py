"""Feature-level repair: which small sets of SAE features, patched from the good format into the failing
one, repair it, and how that compares with patching the whole activation.

Features are a site of the intervention core (`surgeon.sites.features.FeatureSite`: reconstruction plus error
term, so the empty patch is the model itself). One backward pass gives every feature's attribution
(d mean score / d mask at 0, as a fraction of the good-bad gap); the `top` features by attribution are
then patched one by one (exact), and their subsets searched with the head-subset machinery (sizes,
thresholds, minimal repairing sets).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from surgeon.analyses.common import Direction, make_contrast
from surgeon.errors import AnalysisError
from surgeon.search.subsets import (
    ThresholdResult,
    Unit,
    aggregate,
    chunk_scores,
    make_plan,
    summarize_chunks,
)
from surgeon.show import Shows
from surgeon.sites.features import FeatureSite
from surgeon.sites.nodes import Site
from surgeon.case.case import Case


@dataclass(frozen=True)
class FeatureRepairResult(Shows):
    case: str
    base: str
    source: str
    layer: int
    hook: str
    sae: str
    n_items: int
    d_sae: int
    empty_patch_max_diff: float  # |score with no feature patched - clean score|, max over items (should be ~0)
    whole_fraction: float  # repair fraction patching the whole activation (features + error)
    all_features_fraction: float  # repair fraction patching every feature (error term kept)
    top: list  # [(feature, attribution estimate, exact single-feature repair fraction)]
    search: ThresholdResult  # subsets of the top features
    heads: ThresholdResult  # the same search over the heads of the SAE's layer (patching head outputs z), to compare
    # which execution path the engine took, and why (`Contrast.execution`)
    execution: dict = field(default_factory=dict)


def feature_repair(case: Case, model, sae, *, top: int = 8, direction: Direction = "denoise", bad: str | None = None,
                   tag: str | None = None, budget: int = 2000, item_rate: float = 1.0, x: float = 0.5,
                   batch_size: int = 256, chunk: int = 256, source: str = "", progress: bool = False
                   ) -> FeatureRepairResult:
    if not 1 <= top <= 24:
        raise AnalysisError(f"--top {top}: the subset search needs 1 to 24 features", field="--top", fix="e.g. --top 8")
    fs = FeatureSite.of(sae)
    node = Site.coerce(fs.hook)
    head_site = Site.of("z", fs.layer)
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=[node, head_site])
    F = fs.n_units()
    base_mean = float(contrast.clean_base.mean())
    gap = float(contrast.clean_source.mean()) - base_mean
    if abs(gap) < 1e-9:
        raise AnalysisError("the two formats score the same on these items: there is nothing to repair",
                            field="bad", fix="check the case with surgeon diagnose")
    with torch.no_grad():
        empty = contrast.run({fs: torch.zeros(1, F)})[0]
        whole = contrast.run({node: torch.ones(1, 1)})[0]
        every = contrast.run({fs: torch.ones(1, F)})[0]
    frac = lambda s: (float(s.mean()) - base_mean) / gap
    grads, _ = contrast.gradient({fs: torch.zeros(1, F)})
    est = (grads[fs][0] / gap).cpu()
    chosen = torch.argsort(est, descending=True)[:min(top, F)].tolist()
    with torch.no_grad():
        single = contrast.run({fs: torch.eye(F)[chosen]})
    singles = [frac(single[i]) for i in range(len(chosen))]
    kw = dict(case=case.name, info=info, item_rate=item_rate, x=x, budget=budget, chunk=chunk, progress=progress)
    search = _search(contrast, [Unit(fs.layer, j, "F") for j in chosen], fs, "sae_features", **kw)
    heads = _search(contrast, [Unit(fs.layer, h) for h in range(contrast.units(head_site))], head_site, "z", **kw)
    return FeatureRepairResult(case.name, info["base"], info["source"], fs.layer, fs.hook, source, contrast.n_items, F,
                               float((empty - contrast.clean_base).abs().max()), frac(whole), frac(every),
                               [(j, float(est[j]), s) for j, s in zip(chosen, singles)], search, heads, execution=contrast.execution)


def _search(contrast, units, site, component: str, *, case: str, info: dict, item_rate: float, x: float, budget: int,
            chunk: int, progress: bool) -> ThresholdResult:
    """Subsets of `units` (all one site) evaluated in memory, aggregated as `surgeon threshold` does."""
    plan = make_plan(units, {}, budget=budget)
    per_subset: dict = {}
    n_chunks = math.ceil(len(plan.unique) / chunk)
    base_np, src_np = contrast.clean_base.cpu().numpy(), contrast.clean_source.cpu().numpy()
    it = range(n_chunks)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=f"{component} subsets", unit="chunk", leave=False)
    for c in it:
        per_subset.update(summarize_chunks([chunk_scores(contrast, plan, c, chunk, sites={units[0].layer: site})],
                                           base_np, src_np, contrast.metric.right_above))
    return aggregate(plan, per_subset, case=case, component=component, base=info["base"], source=info["source"],
                     tag=info["tag"], n_items=contrast.n_items, item_rate=item_rate, x=x,
                     base_mean=float(contrast.clean_base.mean()), source_mean=float(contrast.clean_source.mean()),
                     chunks_done=n_chunks, chunks_total=n_chunks)
