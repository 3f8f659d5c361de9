"""Per-position patching: every unit of each layer at each aligned position alone (units x positions), or the
residual stream at each layer and position (TransformerLens's `get_act_patch_*_by_pos` sweeps), batched in the
one engine: a patch is a one-hot mask over (slot, unit), [P, slots, units].

A slot is the j-th aligned position of a row (align="index": position j; align="last": the last prompt token,
then the answer's tokens). Items whose rows have fewer slots are left out of that slot's mean (its n says so).
Slots are labelled by the base format's token there (the most common one, and how many items share it).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from surgeon.analyses.common import Direction, layer_sites, make_contrast
from surgeon.show import Shows
from surgeon.case.case import Case
from surgeon.stats import bootstrap_fraction


@dataclass
class PositionPatchResult(Shows):
    case: str
    component: str
    direction: str
    base: str
    source: str
    tag: str | None
    align: str
    layers: tuple[int, ...]
    n_units: int
    n_items: int
    slots: list[str]  # a label per slot: "j: 'tok'" (with "~" when items differ there)
    slot_items: list[int]  # items that have each slot
    fraction: np.ndarray  # [layer, slot, unit] repair (denoise) or damage (noise) fraction, over the items with it
    fraction_lo: np.ndarray
    fraction_hi: np.ndarray
    per_item: np.ndarray  # [layer, slot, unit, item] patched scores (unpatched for items without the slot)
    execution: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)

    def top(self, k: int = 10) -> list[tuple[int, int, int, float]]:
        """The k (layer, slot, unit, fraction) cells with the largest fraction."""
        f = np.nan_to_num(self.fraction, nan=-np.inf)
        out = []
        for i in np.argsort(-f, axis=None)[:k]:
            li, j, u = np.unravel_index(i, f.shape)
            out.append((int(self.layers[li]), int(j), int(u), float(self.fraction[li, j, u])))
        return out


def slot_labels(tokenizer, tokens: list[list[int]], align: str) -> list[str]:
    out = []
    for j, toks in enumerate(tokens):
        if not toks:
            out.append(f"{j}")
            continue
        tok, count = Counter(toks).most_common(1)[0]
        text = tokenizer.decode([tok]) if tokenizer is not None else str(tok)
        where = str(j) if align == "index" else ("last prompt" if j == 0 else f"answer {j}")
        out.append(f"{where}: {text!r}" + ("" if count == len(toks) else f" ({count}/{len(toks)})"))
    return out


def patch_positions(case: Case, model, *, layers=None, component: str = "z", direction: Direction = "denoise",
                    bad: str | None = None, tag: str | None = None, batch_size: int = 256,
                    progress: bool = False) -> PositionPatchResult:
    """Patch every (position, unit) of `component` at each layer alone; `component="resid_pre"` (one unit) gives
    the residual stream x positions sweep."""
    layers, sites = layer_sites(model, layers, component)
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=sites)
    U, S = contrast.units(sites[0]), contrast.n_slots
    has = contrast.slot_items().numpy()  # [S, items]
    eye = torch.eye(S * U).view(S * U, S, U)
    per_item = np.zeros((len(layers), S, U, contrast.n_items))
    it = sites
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(sites, desc=f"patching {component} by position", unit="layer")
    with torch.no_grad():
        for li, site in enumerate(it):
            per_item[li] = contrast.run({site: eye}).cpu().numpy().reshape(S, U, -1)
    base = contrast.clean_base.cpu().numpy()
    source = contrast.clean_source.cpu().numpy()
    frac = np.full((len(layers), S, U, 3), np.nan)
    for j in range(S):
        sel = has[j]
        if sel.sum() == 0:
            continue
        flat = per_item[:, j][..., sel].reshape(-1, int(sel.sum()))
        f, lo, hi = bootstrap_fraction(flat, base[sel], source[sel])
        frac[:, j] = np.stack([f, lo, hi], -1).reshape(len(layers), U, 3)
    return PositionPatchResult(
        case=case.name, component=component, direction=direction, base=info["base"], source=info["source"],
        tag=info["tag"], align=contrast.align, layers=tuple(layers), n_units=U, n_items=contrast.n_items,
        slots=slot_labels(getattr(model, "tokenizer", None), contrast.slot_tokens(), contrast.align),
        slot_items=[int(x) for x in has.sum(1)], fraction=frac[..., 0], fraction_lo=frac[..., 1],
        fraction_hi=frac[..., 2], per_item=per_item, execution=contrast.execution,
        options=dict(layers=list(layers), component=component, direction=direction, bad=bad, tag=tag,
                     batch_size=batch_size))
