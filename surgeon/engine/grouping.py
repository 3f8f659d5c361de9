"""Patches that share work: grouped where their masks agree below the last patched layer (the lower layers run once
per group), or split by the first layer they act at (each group runs from its own)."""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Mapping

import torch
from torch import Tensor

from surgeon.engine import prefix_attention
from surgeon.engine.progress import Progress
from surgeon.engine.readout import RunSpec
from surgeon.engine.rows import Bucket
from surgeon.sites.nodes import Site
from surgeon.sites.protocol import SiteKind


@dataclass
class Groups:
    """Patches grouped by their masks below the last patched layer (see `Grouping.groups`)."""

    last: int  # the last patched layer
    lower: dict[Site, Tensor]  # masks below it, one per group [G, ...]
    upper: dict[Site, Tensor]  # masks at it, one per patch [P, ...]
    group: Tensor  # [P] each patch's group
    order: Tensor  # [P] patches sorted by group
    ends: Tensor  # [G] cumulative group sizes


class Grouping:
    """How a `Contrast`'s patches share work: a part the Contrast holds (`contrast.grouping`), with no state of its
    own; it runs the Contrast's patched forward passes through a weak reference."""

    def __init__(self, engine):
        self.engine = weakref.proxy(engine)

    def by_first_layer(self, masks: Mapping, P: int, start: int):
        """[(layer, patch indices)] grouping patches by the first layer they act at, or None.

        Done where a site kind asks for it (edges: a batch verifying the top edges one by one mostly acts
        at later layers; each group then runs from its own first layer, not from the earliest of the batch)."""
        if (not any(s.split_by_first_layer for s in masks) or any(m.requires_grad for m in masks.values())
                or P < 2):
            return None
        first = torch.full((P,), self.engine.cfg.n_layers, dtype=torch.long)
        for s, m in masks.items():
            first = torch.minimum(first, s.first_layers(m, self.engine.cfg.n_layers))
        first = first.clamp(min=start, max=self.engine.cfg.n_layers - 1)
        layers = torch.unique(first).tolist()
        if len(layers) < 2:
            return None
        return [(L, torch.nonzero(first == L).flatten()) for L in layers]

    def groups(self, masks: Mapping[SiteKind, Tensor], start: int, P: int) -> "tuple[Groups | None, str | None]":
        """How patches that also act at a later layer share work, or (None, why not) where that does not pay.

        Patches whose masks agree below the last patched layer `last` agree on everything up to that
        layer's head outputs. When every patch at `last` acts at or after them, those are computed once
        per group of agreeing patches, and each patch runs only from there on (a subset search over the
        heads of two layers computes the lower layer's 2^8 head combinations, not one per subset)."""
        last = max(s.layer for s in masks)
        if last == start:
            return None, None  # one layer: nothing below it to share
        if not self.engine.shared_prefix:
            return None, "not grouped: the prefix is copied per patch"
        kinds = sorted({s.kind for s in masks if not s.groupable})
        if kinds:
            return None, f"not grouped: {', '.join(kinds)} sites do not group"
        if any(m.requires_grad for m in masks.values()):
            return None, "not grouped: gradients w.r.t. the masks"
        if not all(s.keeps_head_outputs(last) for s in masks if s.layer == last):
            return None, f"not grouped: a site at layer {last} acts before its head outputs"
        lower = {s: m for s, m in masks.items() if s.layer < last}
        key = torch.cat([m.reshape(P, -1) for m in lower.values()], dim=1)
        _, group = torch.unique(key, dim=0, return_inverse=True)
        G = int(group.max()) + 1
        if 2 * G > P:
            return None, "not grouped: fewer than two patches per group"
        first = torch.full((G,), P, dtype=torch.long, device=group.device).scatter_reduce(
            0, group, torch.arange(P, device=group.device), "amin")
        return Groups(last, {s: m[first] for s, m in lower.items()},
                       {s: m for s, m in masks.items() if s.layer == last}, group,
                       torch.argsort(group, stable=True), torch.bincount(group, minlength=G).cumsum(0)), None

    def scores(self, b: Bucket, start: int, g: "Groups", chunk: int, bar: Progress, spec: RunSpec) -> Tensor:
        """[P, n] scores, each group's state at its last layer computed once (see `groups`)."""
        G, n, out, done = len(g.ends), b.n, None, 0
        for g0 in range(0, G, chunk):
            g1 = min(G, g0 + chunk)
            resid, z = self.group_states(b, start, g.last, {s: m[g0:g1] for s, m in g.lower.items()}, g1 - g0,
                                          spec)
            resid, z = resid.view(g1 - g0, n, *resid.shape[1:]), z.view(g1 - g0, n, *z.shape[1:])
            ids = g.order[done: int(g.ends[g1 - 1])]
            done = int(g.ends[g1 - 1])
            kv = prefix_attention.prefix_cache(self.engine.model, b.p0, g.last)
            for lo in range(0, len(ids), chunk):
                p = ids[lo: lo + chunk]
                sel = (g.group[p] - g0).to(resid.device)
                c = len(p)
                scores = self.engine.run_chunk(b, g.last, {s: m[p] for s, m in g.upper.items()}, c, kv, spec,
                                         resid=resid[sel].flatten(0, 1), z=z[sel.to(z.device)].flatten(0, 1))
                if out is None:
                    out = torch.empty(len(g.group), n, device=scores.device, dtype=scores.dtype)
                out[p.to(out.device)] = scores
                bar.update(c * n)
        return out

    def group_states(self, b: Bucket, start: int, last: int, masks: Mapping[Site, Tensor], copies: int,
                      spec: RunSpec):
        """Residual stream entering layer `last` and head outputs there [copies * n, ...] under each patch."""
        names = (f"blocks.{last}.hook_resid_pre", f"blocks.{last}.attn.hook_z")
        kept = {}

        def keep(act, hook):
            kept[hook.name] = act

        self.engine.patched_forward(b, start, masks, copies, prefix_attention.prefix_cache(self.engine.model, b.p0, start),
                      stop=last + 1, extra_hooks=[(name, keep) for name in names], spec=spec)
        return kept[names[0]], kept[names[1]]
