"""The constant-source site: a hook point's units set towards (or shifted by) a constant per aligned position.

A paired patch blends each unit towards the same item's good-format activation (`surgeon.sites.nodes.Site`); mean
ablation blends it towards the mean over items (`Contrast.mean_activation`). This site blends it towards a constant
the caller holds, one value per slot, unit and feature, so it needs no good-format run at all: what a repair a user
can ship does. Two ways, as the field names them:

- ``replace`` (mean patching): act <- act + m * (value - act); m = 1 puts the value in place of the unit's output.
- ``add`` (steering: ITI, Li et al. 2023; activation addition / CAA): act <- act + m * value; m is the strength.

Slot j is the j-th aligned position of a row, which under the case's ``align="last"`` is the position j tokens after
the last prompt token (0: the last prompt token; then the answer's tokens). `blend_at` is the one place the formula
is written: the engine's hooks and the repair's own hooks for plain forwards and generation (`surgeon.repairs.artifact`)
both call it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Component, Site, after_z, hook_component, hook_layer, units_view
from surgeon.sites.protocol import SiteKind, register

if TYPE_CHECKING:
    from torch import Tensor

HOW = ("replace", "add")


def mix(cur: "Tensor", value: "Tensor", m: "Tensor", how: str) -> "Tensor":
    """The one formula: `cur` moved towards `value` by `m` (replace) or shifted by `m` times it (add)."""
    return cur + m * (value - cur) if how == "replace" else cur + m * value


def blend_at(x: "Tensor", idx: "Tensor", pos: "Tensor", m: "Tensor", value: "Tensor", how: str) -> None:
    """In place: x [..., rows, width, units, rest] at rows `idx` [rows, 1] and positions `pos` [rows, S] blended
    with `value` [S, units, rest] under `m` [..., rows | 1, S, units, 1] (zero where a slot is padding). Every
    (row, position) pair must be distinct: a repeated one is written once, by whichever write lands last."""
    cur = x[..., idx, pos, :, :]
    x[..., idx, pos, :, :] = mix(cur, value.to(x.device, x.dtype), m, how).to(x.dtype)  # a half model stays half


def slot_columns(last: "Tensor", n_slots: int, start: int, width: int):
    """The position rule of a repair, in one place: slot j acts at the absolute position last + j (`last` [rows]: each
    row's last prompt token). A forward that covers the absolute positions start .. start + width - 1 holds slot j of
    row r at column last[r] + j - start when that lies inside it. Returns (rows, slots, columns) of the slots inside,
    each [N]: a slot outside the forward is not there at all (never clamped onto another position)."""
    import torch

    col = last.to(torch.long)[:, None] + torch.arange(n_slots, device=last.device)[None] - int(start)  # [rows, S]
    inside = (col >= 0) & (col < int(width))
    r, s = inside.nonzero(as_tuple=True)
    return r, s, col[r, s]


def write_slots(x: "Tensor", last: "Tensor", start: int, value: "Tensor", m: "Tensor", how: str) -> None:
    """In place: x [rows, width, units, rest] (the units' view of a forward over absolute positions start ..) with
    slot j of `value` [S, units, rest] written at each row's last + j (`slot_columns`) under `m` [units]."""
    r, s, c = slot_columns(last.to(x.device), int(value.shape[0]), start, int(x.shape[1]))
    if not len(r):
        return
    v = value.to(x.device, x.dtype)[s]
    x[r, c] = mix(x[r, c], v, m.to(x.device, x.dtype)[None, :, None], how)


def _parse(key: str):
    return None  # a constant site is built with its values, never named by text


@register("constant", parse=_parse)
@dataclass(frozen=True, eq=False)
class ConstantSite(SiteKind):
    """A hook point's units with a constant source: `value` [slots, units, rest] in the activation's own layout
    (`units_view`), `how` "replace" or "add". Masks [P, units] or [P, slots, units], as a node site's."""

    hook: str
    component: Component
    value: "Tensor" = field(repr=False)
    how: str = "replace"

    def __post_init__(self):
        if self.how not in HOW:
            raise AnalysisError(f"unknown way {self.how!r} to apply a constant", field="mode",
                                fix=f"use one of: {', '.join(HOW)}")

    @staticmethod
    def at(hook: str, value: "Tensor", how: str = "replace") -> "ConstantSite":
        return ConstantSite(hook, hook_component(hook), value, how)

    @property
    def layer(self) -> int:
        return hook_layer(self.hook)

    @property
    def name(self) -> str:
        return f"{self.hook} ({self.how} a constant)"

    def n_units(self, cfg) -> int:
        return Site(self.hook, self.component).n_units(cfg)

    def node_sites(self) -> list:
        return []  # reads no run's activations: its source is the constant

    def keeps_head_outputs(self, layer: int) -> bool:
        return self.layer > layer or self.hook in after_z(layer)

    def hooks(self, ctx, mask: "Tensor", copies: int, offset: int, start: int) -> list:
        import torch

        b, cfg = ctx.bucket, ctx.model.cfg
        n, units = b.n, self.n_units(cfg)
        S = b.base_pos.shape[1]
        value = _slots(self.value, S)
        rel = (b.base_pos - offset).to(ctx.device)
        idx = torch.arange(n, device=ctx.device)[:, None]
        have = torch.zeros(S, device=ctx.device)
        have[: min(S, self.value.shape[0])] = 1.0  # slots past the constant's are left alone
        m = mask.to(ctx.device, value.dtype)
        m = m[:, None, None, :, None] if m.dim() == 2 else m[:, None, :S, :, None]
        m = m * (b.slot_valid.to(ctx.device, m.dtype) * have)[None, :, :, None, None]  # [c, n, S, U, 1]

        def mix(act, hook):
            out = act.clone() if torch.is_grad_enabled() else act
            x = units_view(out, self.component, units)
            x = x.view(copies, n, *x.shape[1:])
            blend_at(x, idx.to(x.device), rel.to(x.device), m.to(x.device), value, self.how)
            return out

        return [(self.hook, mix)]


def _slots(value: "Tensor", S: int) -> "Tensor":
    """`value` cut or zero-padded to S slots (a padded slot's mask is zero)."""
    import torch

    if value.shape[0] >= S:
        return value[:S]
    return torch.cat([value, value.new_zeros(S - value.shape[0], *value.shape[1:])])


__all__ = ["ConstantSite", "HOW", "blend_at", "mix", "slot_columns", "write_slots"]
