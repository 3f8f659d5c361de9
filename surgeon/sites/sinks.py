"""Site kinds for the attention-sink interventions (`surgeon sinks --intervene`): each is a mask on the one `Contrast`
acting at every position of a row, so a contrast built with `align="index"` over the rows it intervenes on (base and
source the same rows: the first patched position is 0, nothing is shared from an unpatched prefix).

- `SinkRemoval`: remove a sink, the papers' intervention (i): a share m of each head's attention to one key position
  (the first token by default) taken away and the rest renormalised (`hook_pattern`), at every query position that
  sees another key; units are the layer's heads.
- `UnitValue`: set units of a hook point's last dimension towards a constant (zero, or a mean), at every position or
  at one: the massive dimensions of the residual stream (`hook_resid_post`, units = d_model), the super neurons
  (`mlp.hook_post`, units = d_mlp), or a massive value written at another position (a sink created there).
- `TokenScale`: amplify (or shrink) one position's residual stream by a factor (`hook_resid_pre`), the papers'
  intervention (ii): a token whose representation is scaled up can become a sink; one unit.

A mask value m in [0, 1] blends each from none (0) to all (1) of the intervention.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from surgeon.errors import AnalysisError
from surgeon.sites.nodes import hook_layer
from surgeon.sites.protocol import SiteKind, register

if TYPE_CHECKING:
    from torch import Tensor


def _every_position(offset: int, name: str) -> None:
    if offset:
        raise AnalysisError(f"internal: {name} acts at every position, but the rows were laid out to share the first "
                            f"{offset} positions", fix="build the Contrast with align='index' over the same rows")


def _no_parse(key: str):
    return None  # built with their values, never named by text


class EveryPosition(SiteKind):
    """What the three kinds share: one hook point (`hook`), acted on at every position of rows that share no prefix,
    reading no run's activations; a kind writes `mix(mask, copies, n)`, the hook's function for one chunk."""

    def node_sites(self) -> list:
        return []  # the source is the intervention itself

    def mix(self, mask: "Tensor", copies: int, n: int):
        raise NotImplementedError

    def hooks(self, ctx, mask: "Tensor", copies: int, offset: int, start: int) -> list:
        _every_position(offset, self.name)
        return [(self.hook, self.mix(mask, copies, ctx.bucket.n))]


@register("sink-removal", parse=_no_parse)
@dataclass(frozen=True, eq=False)
class SinkRemoval(EveryPosition):
    """Layer `at`'s heads with their attention to key position `key` removed (share m) and renormalised."""

    at: int
    key: int = 0

    @property
    def layer(self) -> int:
        return self.at

    @property
    def hook(self) -> str:
        return f"blocks.{self.at}.attn.hook_pattern"

    @property
    def name(self) -> str:
        return f"layer {self.at}'s attention to position {self.key} removed"

    def n_units(self, cfg) -> int:
        return cfg.n_heads

    def keeps_head_outputs(self, layer: int) -> bool:
        return self.at > layer

    def mix(self, mask: "Tensor", copies: int, n: int):
        import torch

        def fn(act, hook):  # [copies * n, head, query, key]
            out = act.clone() if torch.is_grad_enabled() else act
            p = out.view(copies, n, *out.shape[1:])
            m = mask.to(p.device, p.dtype)[:, None, :, None]  # [copies, 1, head, 1]
            kept = p[..., self.key] * (1 - m)
            total = p.sum(-1) - p[..., self.key] + kept
            scale = torch.where(total > 0, 1 / total.clamp_min(1e-30), torch.ones_like(total))
            renorm = p * scale[..., None]
            renorm[..., self.key] = kept * scale
            # a query that sees no other key (the first position) keeps its pattern
            p.copy_(torch.where((total - kept > 0)[..., None], renorm, p))
            return out

        return fn


@register("unit-value", parse=_no_parse)
@dataclass(frozen=True, eq=False)
class UnitValue(EveryPosition):
    """Units of `hook`'s last dimension set towards `value` [units] (act <- act + m (value - act)), at `position`
    (None: every position)."""

    hook: str
    value: "Tensor" = field(repr=False)
    position: int | None = None
    what: str = "units"

    @property
    def layer(self) -> int:
        return hook_layer(self.hook)

    @property
    def name(self) -> str:
        where = "every position" if self.position is None else f"position {self.position}"
        return f"{self.what} at {self.hook} set to a constant ({where})"

    def n_units(self, cfg) -> int:
        return int(self.value.shape[-1])

    def keeps_head_outputs(self, layer: int) -> bool:
        return self.layer > layer or (self.layer == layer and not self.hook.endswith("hook_resid_pre"))

    def mix(self, mask: "Tensor", copies: int, n: int):
        import torch

        def fn(act, hook):  # [copies * n, pos, units]
            out = act.clone() if torch.is_grad_enabled() else act
            x = out.view(copies, n, *out.shape[1:])
            m = mask.to(x.device, x.dtype)[:, None, None, :]  # [copies, 1, 1, units]
            v = self.value.to(x.device, x.dtype)
            if self.position is None:
                x.copy_(x + m * (v - x))
            elif self.position < x.shape[2]:
                x[:, :, self.position] = x[:, :, self.position] + m[:, :, 0] * (v - x[:, :, self.position])
            return out

        return fn


@register("token-scale", parse=_no_parse)
@dataclass(frozen=True, eq=False)
class TokenScale(EveryPosition):
    """The residual stream entering layer `at` at `position` scaled by 1 + m (factor - 1)."""

    at: int
    position: int
    factor: float

    @property
    def layer(self) -> int:
        return self.at

    @property
    def hook(self) -> str:
        return f"blocks.{self.at}.hook_resid_pre"

    @property
    def name(self) -> str:
        return f"position {self.position}'s residual stream x{self.factor:g} entering layer {self.at}"

    def n_units(self, cfg) -> int:
        return 1

    def mix(self, mask: "Tensor", copies: int, n: int):
        import torch

        def fn(act, hook):  # [copies * n, pos, d_model]
            out = act.clone() if torch.is_grad_enabled() else act
            x = out.view(copies, n, *out.shape[1:])
            if self.position < x.shape[2]:
                m = mask.to(x.device, x.dtype)[:, :1, None]  # [copies, 1, 1]
                x[:, :, self.position] = x[:, :, self.position] * (1 + m * (self.factor - 1))
            return out

        return fn


__all__ = ["EveryPosition", "SinkRemoval", "TokenScale", "UnitValue"]
