"""Head -> feature effects: how much each head (or head group) moves each SAE feature when patched from the
good format into the failing one, through the intervention core.

The failing format's prompts run with head outputs (z) at `layer` patched from the good format at the
case's matched positions, one patch per head and per group, all in the batch dimension; the activation
the SAE reads at `sae_layer` is captured there (`Contrast.probe`) and encoded. A feature's effect is its
activation under the patch minus its activation in the unpatched failing run, averaged over the matched
positions of each item; reported as a mean over items with a 95% interval, for the features that differ
most between the formats (largest |mean(good - failing)|).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from surgeon.case.select import pick_bad, pick_items
from surgeon.engine.contrast import Contrast
from surgeon.errors import AnalysisError
from surgeon.search.subsets import Unit, make_groups
from surgeon.show import Shows
from surgeon.sites.features import sae_hook
from surgeon.sites.nodes import Site, hook_layer
from surgeon.case.case import Case
from surgeon.case.encoding import prompt_rows
from surgeon.stats import bootstrap_means
from surgeon.case.encoding import prepend_bos


@dataclass(frozen=True)
class HeadFeatureResult(Shows):
    case: str
    good: str
    bad: str
    layer: int
    sae_layer: int
    hook: str
    sae: str
    n_items: int
    units: list  # row labels: L{l}H{h} and group names
    features: list  # the features examined (columns)
    format_gap: np.ndarray  # [F] mean over items of good - failing activation
    effect: np.ndarray  # [units, F] mean over items of patched - failing
    lo: np.ndarray
    hi: np.ndarray
    fraction: np.ndarray  # effect / format_gap
    # which execution path the engine took, and why (`Contrast.execution`)
    execution: dict = field(default_factory=dict)


def head_feature_effects(case: Case, model, sae, *, layer: int, groups: Sequence[str] = ("even", "odd"),
                         bad: str | None = None, tag: str | None = None, top: int = 10, batch_size: int = 256,
                         source: str = "") -> HeadFeatureResult:
    if not 0 <= layer < model.cfg.n_layers:
        raise AnalysisError(f"layer {layer} is out of range (the model has layers 0..{model.cfg.n_layers - 1})",
                            field="--layer", fix=f"use a layer between 0 and {model.cfg.n_layers - 1}")
    if top < 1:
        raise AnalysisError("--top must be at least 1", field="--top", fix="e.g. --top 10")
    hook = sae_hook(sae)
    bad = pick_bad(case, bad)
    tag, items = pick_items(case, tag)
    bos = prepend_bos(case, model)
    rows_b = prompt_rows(case.formats[bad], items, model.tokenizer, bos)
    rows_g = prompt_rows(case.formats[case.good], items, model.tokenizer, bos)
    site = Site.of("z", layer)
    node = Site.coerce(hook)
    contrast = Contrast(model, rows_b, rows_g, case.align, batch_size=batch_size, base_name=bad,
                        source_name=case.good, sites=[site, node], clean=False)
    H = contrast.units(site)
    heads = [Unit(layer, h) for h in range(H)]
    grp = make_groups(heads, groups)
    masks = torch.cat([torch.zeros(1, H), torch.eye(H)] + [
        torch.zeros(1, H).index_fill_(1, torch.tensor(g), 1.0) for g in grp.values()])
    acts, valid = contrast.probe({site: masks}, hook)  # [P, n, S, d]
    # the good run's activation at the same slots: the core's cached source activations
    src = contrast.activations(node, "source")[:, :, 0]  # [n, S, d]
    p = next(sae.parameters())
    with torch.no_grad():
        f = sae.encode(acts.to(p.device, p.dtype)).float().cpu()  # [P, n, S, F]
        fg = sae.encode(src.to(p.device, p.dtype)).float().cpu()  # [n, S, F]
    w = valid[None, :, :, None]
    per_item = (f * w).sum(2) / w.sum(2).clamp_min(1)  # [P, n, F]
    good = (fg * valid[:, :, None]).sum(1) / valid.sum(1).clamp_min(1)[:, None]  # [n, F]
    base = per_item[0]
    gap_items = good - base  # [n, F]
    gap = gap_items.mean(0)
    feats = torch.argsort(gap.abs(), descending=True)[:top].tolist()
    eff = (per_item[1:] - base[None])[:, :, feats]  # [units, n, F']
    mean, lo, hi = bootstrap_means(eff.permute(0, 2, 1).numpy())  # over items
    g = gap[feats].numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(np.abs(g) > 1e-9, mean / g, np.nan)
    labels = [u.label for u in heads] + list(grp)
    return HeadFeatureResult(case.name, case.good, bad, layer, hook_layer(hook), hook, source, len(items), labels,
                             feats, g, mean, lo, hi, frac, execution=contrast.execution)
