"""The one protocol every site kind implements, and the registry of kinds.

A *site* is where a mask acts: a node (a hook point split into units), the edges of the model's graph, an
SAE's features. `Contrast.run` takes masks keyed by sites and calls only the methods below, so a new
kind of site is one module that subclasses `SiteKind` and registers itself; the engine has no branch
per kind (sae-lens's architecture registry is the model).
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Callable, ClassVar

if TYPE_CHECKING:
    from torch import Tensor

KINDS: dict[str, type["SiteKind"]] = {}
_PARSERS: list[Callable[[str], "SiteKind | None"]] = []


def register(kind: str, parse: Callable[[str], "SiteKind | None"] | None = None):
    """Class decorator: register a site kind under `kind`; `parse` turns a mask key given as text (a hook
    name) into a site of this kind, or returns None when the text is not one."""
    def deco(cls):
        if kind in KINDS:
            raise ValueError(f"site kind {kind!r} registered twice")
        KINDS[kind] = cls
        cls.kind = kind
        if parse is not None:
            _PARSERS.append(parse)
        return cls
    return deco


class SiteKind:
    """What the engine asks of a site. Defaults suit a site that patches one hook point's activation."""

    kind: ClassVar[str] = "?"
    # patches of several layers share the work below their last layer (Contrast groups them)
    groupable: ClassVar[bool] = True
    # a batch of patches is split by the first layer each acts at (each part starts there)
    split_by_first_layer: ClassVar[bool] = False

    @property
    def layer(self) -> int:  # the first layer a mask here can act at
        raise NotImplementedError

    def n_units(self, cfg) -> int:
        raise NotImplementedError

    def node_sites(self) -> list:
        """The node sites whose activations (base and source, at the aligned positions) this site reads."""
        raise NotImplementedError

    @property
    def name(self) -> str:  # how reports and errors name the site
        raise NotImplementedError

    def keeps_head_outputs(self, layer: int) -> bool:
        """True when a patch here leaves everything up to `layer`'s head outputs as the base run computed it (it
        acts at or after them, or at a later layer), so a pass from `layer` may start from the cached ones."""
        return False

    def first_layers(self, mask: "Tensor", n_layers: int) -> "Tensor":
        """[P] the first layer each patch of `mask` [P, ...] acts at (n_layers for an empty patch)."""
        import torch

        on = (mask.detach().reshape(mask.shape[0], -1) != 0).any(1).cpu()
        return torch.where(on, self.layer, n_layers)

    def hooks(self, ctx, mask: "Tensor", copies: int, offset: int, start: int) -> list:
        """Forward hooks [(hook name, fn)] applying `mask` [copies, ...] to one chunk. `ctx` is the engine's
        view of the rows (`engine.contrast.HookContext`): the model, the rows' caches, the positions. A name
        is a TransformerLens hook point (fn(act, hook) -> act), or a module's path followed by `:pre` for a
        forward pre-hook on it (fn(module, args) -> args: e.g. a norm's input, which has no hook point)."""
        raise NotImplementedError

    def forward_context(self, model, mask: "Tensor", masks=None):
        """A context the forward pass runs in (e.g. per-head inputs switched on); none by default. `masks`: every
        site's mask of this pass (a site whose shortcuts hold only when no other site acts upstream reads them)."""
        return nullcontext()


def coerce(key) -> SiteKind:
    """A mask key as a site: a site as it is, a hook name parsed by the kind that knows it."""
    if isinstance(key, SiteKind):
        return key
    if isinstance(key, str):
        for parse in _PARSERS:
            site = parse(key)
            if site is not None:
                return site
    from surgeon.errors import AnalysisError

    raise AnalysisError(f"{key!r} is not a site", field="masks",
                        fix="key masks by a hook name (blocks.3.attn.hook_z) or a site object")
