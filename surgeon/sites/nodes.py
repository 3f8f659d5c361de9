"""Where an intervention can act: components, their hook points and their units.

A *site* is (component, layer). Each component names a TransformerLens hook point and how the
activation there splits into *units* that a mask addresses one by one (query heads, key/value heads,
the whole vector, or equal slices of it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from surgeon.sites.protocol import SiteKind, register

if TYPE_CHECKING:
    from torch import Tensor

Units = Literal["head", "kv_head", "whole", "slice"]


@dataclass(frozen=True)
class Component:
    name: str
    hook: str  # hook point name, with {layer}
    units: Units
    doc: str
    pattern_like: bool = False  # activation is [batch, head, query_pos, key_pos]


_ALL = [
    Component("z", "blocks.{layer}.attn.hook_z", "head",
              "per-head attention output before the output projection W_O mixes heads"),
    Component("q", "blocks.{layer}.attn.hook_q", "head", "per-head queries"),
    Component("k", "blocks.{layer}.attn.hook_k", "kv_head", "keys (per key/value head under grouped-query attention)"),
    Component("v", "blocks.{layer}.attn.hook_v", "kv_head", "values (per key/value head under grouped-query attention)"),
    Component("pattern", "blocks.{layer}.attn.hook_pattern", "head",
              "per-head attention pattern (needs equal-length prompts: the keys must correspond)", pattern_like=True),
    Component("attn_out", "blocks.{layer}.hook_attn_out", "whole", "the whole attention layer output"),
    Component("o_slices", "blocks.{layer}.hook_attn_out", "slice",
              "d_head-wide slices of the attention output *after* W_O (what the original paper called heads)"),
    Component("mlp_out", "blocks.{layer}.hook_mlp_out", "whole", "the MLP output"),
    Component("resid_pre", "blocks.{layer}.hook_resid_pre", "whole", "the residual stream entering the layer"),
    Component("resid_post", "blocks.{layer}.hook_resid_post", "whole", "the residual stream leaving the layer"),
]
COMPONENTS: dict[str, Component] = {c.name: c for c in _ALL}


def component(name: str) -> Component:
    if name not in COMPONENTS:
        from surgeon.errors import AnalysisError

        raise AnalysisError(f"unknown component {name!r}", field="component",
                            fix=f"use one of: {', '.join(COMPONENTS)}")
    return COMPONENTS[name]


def hook_name(comp: str, layer: int) -> str:
    return component(comp).hook.format(layer=layer)


def n_units(comp: str, cfg) -> int:
    """How many units a mask over this component has for a model config (the same as its sites')."""
    return Site.of(comp, 0).n_units(cfg)


def unit_label(comp: str, layer: int, unit: int) -> str:
    """The one name of a unit in every report, table and graph: L2H6 (a head; o_slices are heads after W_O),
    L2KV1 (a key/value head under grouped-query attention), L2.mlp_out (a whole-vector component)."""
    c = component(comp)
    if c.units == "whole":
        return f"L{layer}.{c.name}"
    return f"L{layer}{'KV' if c.units == 'kv_head' else 'H'}{unit}"


_HOOK_RE = re.compile(r"^blocks\.(\d+)\.")


def hook_layer(hook: str) -> int:
    from surgeon.errors import AnalysisError

    m = _HOOK_RE.match(hook)
    if not m:
        raise AnalysisError(f"cannot patch at {hook!r}: only hook points inside blocks are supported")
    return int(m.group(1))


def hook_component(hook: str) -> Component:
    """The default component at a hook point (`o_slices` must be asked for with a Site)."""
    from surgeon.errors import AnalysisError

    for c in COMPONENTS.values():
        if re.fullmatch(c.hook.replace(".", r"\.").replace("{layer}", r"\d+"), hook) and c.units != "slice":
            return c
    raise AnalysisError(f"unknown hook point {hook!r}", fix=f"use one of the components: {', '.join(COMPONENTS)}")


def after_z(layer: int) -> set[str]:
    """Hook points of a layer at or after its head outputs: patches there leave its attention as it was."""
    return {f"blocks.{layer}.{h}" for h in ("attn.hook_z", "hook_attn_out", "hook_mlp_out")}


def _parse(key: str) -> "Site":
    return Site(key, hook_component(key))


@register("node", parse=_parse)
@dataclass(frozen=True)
class Site(SiteKind):
    """A hook point and how its activation splits into units: masks [P, units] or [P, slots, units] blend
    each unit at the aligned positions, act <- act + m * (source - act)."""

    hook: str
    component: Component

    @property
    def layer(self) -> int:
        return hook_layer(self.hook)

    @property
    def name(self) -> str:
        return self.hook

    @staticmethod
    def of(comp: str, layer: int) -> "Site":
        c = component(comp)
        return Site(c.hook.format(layer=layer), c)

    @staticmethod
    def coerce(key: "Site | str") -> "Site":
        return key if isinstance(key, Site) else _parse(key)

    def n_units(self, cfg) -> int:
        if self.component.name == "mlp_out" and getattr(cfg, "attn_only", False):
            from surgeon.errors import AnalysisError

            raise AnalysisError("this model is attention-only: it has no MLP", field="component",
                                fix="choose an attention component (z, q, k, v, pattern, attn_out)")
        if self.component.units == "whole":
            return 1
        if self.component.units == "kv_head":
            return getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        return cfg.n_heads

    # ------------------------------------------------------------------ the site protocol
    def node_sites(self) -> list["Site"]:
        return [self]

    def keeps_head_outputs(self, layer: int) -> bool:
        return self.layer > layer or self.hook in after_z(layer)

    def hooks(self, ctx, mask: "Tensor", copies: int, offset: int, start: int) -> list:
        """act <- act + m * (source - act) at the aligned positions (given relative to `offset`)."""
        import torch

        src = ctx.bucket.source_acts[self]
        n, cfg = ctx.bucket.n, ctx.model.cfg
        rel = (ctx.bucket.base_pos - offset).to(ctx.device)
        idx = torch.arange(n, device=ctx.device)[:, None]
        valid = ctx.bucket.slot_valid[:, :, None, None]  # padded slots are left alone
        m = mask.to(src.device, src.dtype)
        # [c, 1, S|1, U, 1]; a per-slot mask may name more slots than these rows have (other rows' later slots)
        m = m[:, None, None, :, None] if m.dim() == 2 else m[:, None, : rel.shape[1], :, None]
        m = m * valid.to(m.device, m.dtype)  # [c, n, S, U, 1]
        units = self.n_units(cfg)

        def mix(act, hook):
            out = act.clone() if torch.is_grad_enabled() else act
            x = units_view(out, self.component, units)
            x = x.view(copies, n, *x.shape[1:])
            i, r = idx.to(x.device), rel.to(x.device)  # layers may sit on different GPUs
            cur = x[:, i, r]  # [c, n, S, U, R]
            x[:, i, r] = cur + m.to(x.device) * (src.to(x.device) - cur)
            return out

        return [(self.hook, mix)]


def units_view(x: Tensor, comp: Component, n_units: int) -> Tensor:
    """View an activation as [batch, pos, unit, rest]."""
    if comp.pattern_like:
        return x.transpose(1, 2)  # [batch, query_pos, head, key_pos]
    if x.dim() == 3:
        return x.view(x.shape[0], x.shape[1], n_units, -1)
    return x
