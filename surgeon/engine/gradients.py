"""Gradients through a Contrast's runs: of the mean score w.r.t. the masks (attribution; each chunk of rows
back-propagated as soon as it is scored) and w.r.t. an activation at the aligned positions (an edge's
downstream end)."""
from __future__ import annotations

import weakref
from dataclasses import replace
from typing import Mapping, Sequence

import torch
from torch import Tensor

from surgeon.engine.readout import At, RunSpec
from surgeon.engine.rows import Bucket
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site
from surgeon.sites.protocol import SiteKind, coerce


class Gradients:
    """A `Contrast`'s gradient calls: a part the Contrast holds (`contrast.gradients`), with no state of its own.
    Each call builds a `RunSpec` saying what its backward passes need and hands it to the Contrast's run (through a
    weak reference); nothing is set on the engine."""

    def __init__(self, engine):
        self.engine = weakref.proxy(engine)

    def gradient(self, masks: Mapping[Site | str, Tensor], progress: bool | str = False, drop: Sequence[str] = (),
                 read: "At | None" = None, pool: bool = False) -> tuple[dict[SiteKind, Tensor], Tensor]:
        """d/d(mask) of the sum over patches of the mean score over items, at the given masks; and the scores
        [P, n_items]. `pool`: only the mean over the patches of each mask's gradient is wanted (EAP-IG's
        average over its steps), returned as [1, units]; a site whose patches add fixed differences then sums
        the patches' gradients before contracting them with the differences (one product, not one per patch). Each chunk of rows is back-propagated as soon as it is scored, so memory holds one chunk's
        graph, not every item's (what `run(masks).mean(1).sum().backward()` would keep). `drop`: hook points whose
        output passes no gradient back (its value is unchanged): AtP*'s GradDrop drops a layer's outputs, a feature
        edge the SAEs' hook points between its ends. `read`: the scores read at a hook point (see `run`)."""
        return self.with_spec(masks, progress, RunSpec(drop=tuple(drop), read=read, pool=pool))

    def with_spec(self, masks: Mapping[Site | str, Tensor], progress: bool | str, spec: RunSpec
                  ) -> tuple[dict[SiteKind, Tensor], Tensor]:
        acc = torch.promote_types(getattr(self.engine.cfg, "dtype", torch.float32), torch.float32)
        leaves = {coerce(k): v.detach().to(acc).clone().requires_grad_(True)
                  for k, v in masks.items()}  # a float64 model's gradients taken in float64, any other's in float32
        with torch.enable_grad():
            scores = self.engine.run_spec(leaves, replace(spec, leaves=tuple(leaves.values())), progress)
        grads = {s: (m.grad if m.grad is not None else torch.zeros_like(m)) for s, m in leaves.items()}
        if spec.pool:  # a pooling site put its patches' summed gradient in one row of the chunk: only the sum is whole
            grads = {s: g.sum(0, keepdim=True) / g.shape[0] for s, g in grads.items()}
        return grads, scores

    def activation_gradient(self, masks: Mapping[Site | str, Tensor], hook: str, progress: bool | str = False
                            ) -> Tensor:
        """[n_items, S, ...] d(item score)/d(activation at `hook`) at the aligned positions (the base run's), under
        one patch (masks [1, units]; zeros: the run as it is). What an edge's downstream end needs: the metric's
        gradient at a node, item by item (Marks et al.'s left vector), from one backward pass per chunk."""
        masks = {coerce(k): v for k, v in masks.items()}
        if any(m.shape[0] != 1 for m in masks.values()):
            raise AnalysisError("internal: activation_gradient takes one patch (masks [1, units])")
        S = max(b.base_pos.shape[1] for b in self.engine.buckets)
        out: dict[str, Tensor] = {}

        def store(b: Bucket, g: Tensor):
            rel, idx = (b.base_pos - b.p0).to(g.device), torch.arange(b.n, device=g.device)[:, None]
            x = g.view(-1, b.n, *g.shape[1:]).sum(0)[idx, rel].float().cpu() * self.engine.n_items  # [n, S', ...]
            if "g" not in out:
                out["g"] = torch.zeros(self.engine.n_items, S, *x.shape[2:])
            out["g"].index_add_(0, b.items.cpu(), torch.nn.functional.pad(
                x, [0, 0] * (x.dim() - 2) + [0, S - x.shape[1]]))

        self.with_spec(masks, progress, RunSpec(catch=(hook, store)))
        return out["g"]

    @staticmethod
    def catch_hook(b: Bucket, store):
        def catch(act, hook):
            if not act.requires_grad:
                act = act.detach().requires_grad_(True)
            act.register_hook(lambda g: store(b, g))
            return act
        return catch

    def backward_now(self, scores: Tensor, spec: RunSpec) -> Tensor:
        """Under a gradient call (`spec.leaves`): back-propagate one chunk's share of the mean score and keep only
        the values."""
        if not spec.leaves or not scores.requires_grad:
            return scores
        (scores.sum() / self.engine.n_items).backward()
        return scores.detach()

    @staticmethod
    def restore_grads(spec: RunSpec):
        """Under a gradient call: a function putting the masks' gradients back to what they are now (before a bucket
        is retried after out-of-memory, so its rows are not counted twice)."""
        if not spec.leaves:
            return None
        saved = [None if m.grad is None else m.grad.clone() for m in spec.leaves]

        def restore():
            for m, g in zip(spec.leaves, saved):
                m.grad = g
        return restore
