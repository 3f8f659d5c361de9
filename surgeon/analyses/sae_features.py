"""SAE features per format: where the formats' representations separate and re-entangle (`overlap`), and
which features the failing format amplifies (`amplified`).

Features are read at the case's matched positions of each item's prompt (`position="last"`: the last
prompt token; `"aligned"`: every position the case's `align` matches, each pair compared and the
item's metric the mean over its pairs). One forward pass per format caches every layer's hook at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from surgeon.case.select import pick_bad, pick_items
from surgeon.engine.readout import cached_batches
from surgeon.errors import AnalysisError
from surgeon.sae.load import neuronpedia_url
from surgeon.show import Shows
from surgeon.sites.features import sae_hook
from surgeon.case.case import Case
from surgeon.case.encoding import align, prompt_rows
from surgeon.stats import Estimate, bootstrap_mean
from surgeon.case.encoding import prepend_bos

POSITIONS = ("last", "aligned")
METRICS = ("overlap", "jaccard", "weighted_jaccard")


# ----------------------------------------------------------------------------- the metrics (plain tensors)
def top_sets(f: Tensor, k: int) -> Tensor:
    """[N, F] bool: each row's top-k features among those active (> 0); fewer when fewer are active."""
    vals, idx = f.topk(min(k, f.shape[-1]), dim=-1)
    out = torch.zeros_like(f, dtype=torch.bool)
    out.scatter_(-1, idx, vals > 0)
    return out


def overlap_metrics(a: Tensor, b: Tensor, k: int) -> dict[str, np.ndarray]:
    """Per row of two feature-activation sets a, b [N, F]:
    - overlap: |A ∩ B| / min(|A|, |B|) with A, B the top-k active features (|A ∩ B| / k when both
      have k active features: the paper's number);
    - jaccard: |A ∩ B| / |A ∪ B|;
    - weighted_jaccard: sum_i min(a_i, b_i) / sum_i max(a_i, b_i) over all features (activations
      clipped at 0).
    NaN where a set is empty (nothing active)."""
    A, B = top_sets(a, k), top_sets(b, k)
    inter = (A & B).sum(-1).double()
    na, nb = A.sum(-1).double(), B.sum(-1).double()
    nan = torch.tensor(float("nan"), dtype=torch.float64)
    small = torch.minimum(na, nb)
    union = (A | B).sum(-1).double()
    ac, bc = a.clamp_min(0).double(), b.clamp_min(0).double()
    mx = torch.maximum(ac, bc).sum(-1)
    return dict(overlap=torch.where(small > 0, inter / small.clamp_min(1), nan).numpy(),
                jaccard=torch.where(union > 0, inter / union.clamp_min(1), nan).numpy(),
                weighted_jaccard=torch.where(mx > 0, torch.minimum(ac, bc).sum(-1) / mx.clamp_min(1e-30), nan).numpy())


# ----------------------------------------------------------------------------- reading features
@torch.no_grad()
def format_activations(case: Case, model, fmt: str, items, hooks: Sequence[str], batch_size: int = 64):
    """Prompt rows of `items` in `fmt` and, per hook, the activations [n_items, max_len, d] (right-padded)."""

    rows = prompt_rows(case.formats[fmt], items, model.tokenizer, prepend_bos(case, model))
    W = max(len(r.tokens) for r in rows)  # one width for all, so the items stack into [n_items, W, d]
    out = {h: [] for h in hooks}
    for _, acts in cached_batches(model, rows, hooks, batch_size, width=W):
        for h in hooks:
            out[h].append(acts[h].float().cpu())
    return rows, {h: torch.cat(v) for h, v in out.items()}


def matched_positions(case: Case, good_rows, bad_rows, position: str):
    """Per item, (good positions, bad positions) to compare."""

    if position not in POSITIONS:
        raise AnalysisError(f"unknown position {position!r}", field="--position", fix=f"use one of: {', '.join(POSITIONS)}")
    if position == "last":
        return [([len(g.tokens) - 1], [len(b.tokens) - 1]) for g, b in zip(good_rows, bad_rows)]
    return [align(g, b, case.align, case.good, "bad") for g, b in zip(good_rows, bad_rows)]


def _encode(sae, x: Tensor) -> Tensor:
    p = next(sae.parameters())
    with torch.no_grad():
        return sae.encode(x.to(p.device, p.dtype)).float().cpu()


def paired_features(case: Case, model, saes: dict, *, bad: str, items, position: str, batch_size: int = 64):
    """Per layer: good and bad feature activations [pairs, F] and each pair's item index [pairs]."""

    hooks = {L: sae_hook(s) for L, s in saes.items()}
    g_rows, g_act = format_activations(case, model, case.good, items, list(set(hooks.values())), batch_size)
    b_rows, b_act = format_activations(case, model, bad, items, list(set(hooks.values())), batch_size)
    pos = matched_positions(case, g_rows, b_rows, position)
    item = torch.tensor([i for i, (pg, _) in enumerate(pos) for _ in pg])
    gi = torch.tensor([p for pg, _ in pos for p in pg])
    bi = torch.tensor([p for _, pb in pos for p in pb])
    out = {}
    for L, sae in saes.items():
        h = hooks[L]
        out[L] = (_encode(sae, g_act[h][item, gi]), _encode(sae, b_act[h][item, bi]))
    return out, item


def _per_item(x: np.ndarray, item: Tensor, n: int) -> np.ndarray:
    """Mean of each item's pairs (NaN pairs ignored; NaN when all are)."""
    out = np.full(n, np.nan)
    it = item.numpy()
    for i in range(n):
        v = x[it == i]
        v = v[~np.isnan(v)]
        if v.size:
            out[i] = v.mean()
    return out


# ----------------------------------------------------------------------------- overlap
@dataclass(frozen=True)
class OverlapResult(Shows):
    case: str
    good: str
    bad: tuple[str, ...]
    layers: tuple[int, ...]
    k: int
    position: str
    n_items: int
    saes: dict  # layer -> where the SAE came from
    metrics: dict[str, dict[str, list[Estimate]]]  # bad format -> metric -> [Estimate per layer] (mean, 95% interval)
    per_item: dict  # bad format -> metric -> [layer][item]


def overlap(case: Case, model, saes: dict, *, k: int = 20, position: str = "last", bad: str | None = None,
            tag: str | None = "all", batch_size: int = 64, sources: dict | None = None) -> OverlapResult:
    """Top-k feature overlap between the good format and each failing format (or `bad`), per layer."""
    if k < 1:
        raise AnalysisError(f"top-k {k} must be at least 1", field="--top-k", fix="e.g. --top-k 20")
    width = min(int(sae.cfg.d_sae) for sae in saes.values())
    if k >= width:
        raise AnalysisError(f"top-k {k} is not below the SAE's {width} features (every feature would be in every set)",
                            field="--top-k", fix=f"use --top-k {max(1, width // 10)} or so")
    if 2 * k > width:  # two sets of more than half the features always overlap: the overlap would measure k, not the run
        raise AnalysisError(f"top-k {k} is more than half the SAE's {width} features (any two such sets share at least "
                            f"{2 * k - width})", field="--top-k", fix=f"use --top-k {max(1, width // 10)} or so")
    bads = (pick_bad(case, bad),) if bad else tuple(case.bad_formats)
    tag, items = pick_items(case, tag)
    layers = tuple(sorted(saes))
    metrics, per_item = {}, {}
    for b in bads:
        feats, item = paired_features(case, model, saes, bad=b, items=items, position=position, batch_size=batch_size)
        metrics[b] = {m: [] for m in METRICS}
        per_item[b] = {m: [] for m in METRICS}
        for L in layers:
            g, f = feats[L]
            vals = overlap_metrics(g, f, k)
            for m in METRICS:
                x = _per_item(vals[m], item, len(items))
                x = x[~np.isnan(x)]
                metrics[b][m].append(bootstrap_mean(x))
                per_item[b][m].append(x.tolist())
    return OverlapResult(case.name, case.good, bads, layers, k, position, len(items),
                         {L: (sources or {}).get(L, "") for L in layers}, metrics, per_item)


# ----------------------------------------------------------------------------- amplified features
@dataclass(frozen=True)
class FeatureRatio:
    feature: int
    ratio: Estimate  # failing / good activation, over items where it is active in both
    n_both: int  # items where it is active in both formats
    mean_good: float
    mean_bad: float
    label: str | None = None
    link: str | None = None


@dataclass(frozen=True)
class AmplifiedResult(Shows):
    case: str
    good: str
    bad: str
    layer: int
    position: str
    n_items: int
    sae: str
    min_items: int
    ranked: list[FeatureRatio]  # highest mean ratio first (active in both on >= min_items items)
    only_bad: list  # (feature, items active in bad only) most frequent first
    only_good: list  # (feature, items active in good only)


def amplified(case: Case, model, sae, layer: int, *, bad: str | None = None, position: str = "last",
              tag: str | None = "all", min_items: int | None = None, top: int = 20, labels: dict | None = None,
              neuronpedia: str | None = None, batch_size: int = 64, source: str = "") -> AmplifiedResult:
    """Features active in both formats ranked by their activation ratio failing / good (per item, then the
    mean over the items where both are active, with an interval), and features active in one format only."""

    bad = pick_bad(case, bad)
    tag, items = pick_items(case, tag)
    feats, item = paired_features(case, model, {layer: sae}, bad=bad, items=items, position=position,
                                  batch_size=batch_size)
    g, f = feats[layer]
    n = len(items)
    # per item: mean activation over its pairs
    idx = item.long()
    cnt = torch.bincount(idx, minlength=n).clamp_min(1)[:, None].float()
    G = torch.zeros(n, g.shape[1]).index_add_(0, idx, g) / cnt
    B = torch.zeros(n, f.shape[1]).index_add_(0, idx, f) / cnt
    both = (G > 0) & (B > 0)
    n_both = both.sum(0)
    min_items = min_items if min_items is not None else max(3, int(np.ceil(0.1 * n)))
    ranked = []
    for j in torch.nonzero(n_both >= min_items).flatten().tolist():
        r = (B[both[:, j], j] / G[both[:, j], j]).numpy()
        ranked.append(FeatureRatio(j, bootstrap_mean(r), int(n_both[j]), float(G[:, j].mean()), float(B[:, j].mean()),
                                   (labels or {}).get(str(j)), neuronpedia_url(neuronpedia, j)))
    ranked.sort(key=lambda x: -x.ratio.value)
    only_b = ((B > 0) & ~(G > 0)).sum(0)
    only_g = ((G > 0) & ~(B > 0)).sum(0)
    ob = [(int(j), int(only_b[j])) for j in torch.argsort(only_b, descending=True, stable=True).tolist() if only_b[j] > 0]
    og = [(int(j), int(only_g[j])) for j in torch.argsort(only_g, descending=True, stable=True).tolist() if only_g[j] > 0]
    return AmplifiedResult(case.name, case.good, bad, layer, position, n, source, min_items, ranked, ob[:top], og[:top])
