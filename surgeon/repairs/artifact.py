"""A repair a user can ship: constants written into chosen heads of a model at positions counted from the last prompt
token, needing the failing prompt alone.

`Repair` holds, per TransformerLens hook point, the constant [slots, units, rest] (in `units_view`'s layout: for
``hook_z``, [slots, head, d_head]) and the units it acts on; `mode` says how (``mean``: the units' output replaced by
the good format's mean over discovery items, blended by `strength`; ``steer``: the mean good-minus-failing difference
added, times `strength`, as ITI and contrastive activation addition shift a head's output). The position rule is
`POSITIONS`: slot j acts at the position j tokens after the last prompt token, on a scored run (the answer's tokens,
teacher-forced) and while generating alike (the j-th generated token's position), never before the last prompt token.

- `repair.hooks(last)`: TransformerLens forward hooks for rows whose last prompt token is at `last` [rows] (right-
  padded batches), for `model.run_with_hooks` or the engine's `greedy`;
- `apply(model, repair)`: a context manager under which any forward or ``model.generate`` runs repaired (each forward
  over several positions is a new prompt whose last position is slot 0; a one-token forward after it, under a key /
  value cache, is the next slot);
- `repair.save(DIR)` / `read_repair(DIR)` (and `surgeon.load(DIR)`): ``repair.safetensors`` (one tensor per hook point,
  named by it, zero outside the repaired units) and ``repair.json`` (heads, mode, strength, position rule, slots, the
  case by content and the split it was built on), with a manifest written last.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from surgeon.errors import AnalysisError
from surgeon.results import manifest, staging, write_json
from surgeon.repairs.site import ConstantSite, blend_at
from surgeon.sites.nodes import hook_component, units_view

if TYPE_CHECKING:
    from torch import Tensor

MODES = {"mean": "replace", "steer": "add"}  # a repair's mode -> how its constant site applies the value
POSITIONS = ("slot j at the position j tokens after the last prompt token (0: the last prompt token; then the answer's "
             "or the generated tokens), as the case's align='last' matches positions")
FILE, TENSORS = "repair.json", "repair.safetensors"


@dataclass
class Repair:
    """Constants for chosen units at positions from the last prompt token (see the module's docstring)."""

    heads: tuple[str, ...]  # unit labels, L0H4
    mode: str  # "mean" or "steer"
    strength: float
    values: dict = field(repr=False)  # hook point -> Tensor [slots, units, rest], zero outside `units`
    units: dict = field(default_factory=dict)  # hook point -> unit indices acted on
    component: str = "z"
    positions: str = POSITIONS
    built_on: dict = field(default_factory=dict)  # case name and digest, formats, split, n items: how it was made

    @property
    def how(self) -> str:
        return MODES[self.mode]

    @property
    def n_slots(self) -> int:
        return max((int(v.shape[0]) for v in self.values.values()), default=0)

    def unit_mask(self, hook: str, n_units: int) -> "Tensor":
        import torch

        m = torch.zeros(n_units)
        m[list(self.units.get(hook, ()))] = 1.0
        return m

    def sites(self) -> dict[str, ConstantSite]:
        """The engine's view: one constant-source site per hook point (masks select units and scale them)."""
        return {h: ConstantSite(h, hook_component(h), v, self.how) for h, v in self.values.items()}

    def masks(self, strengths=None) -> dict:
        """Masks [P, units] for the engine: the repair's units at each strength (default: its own)."""
        import torch

        s = torch.tensor([self.strength] if strengths is None else list(strengths), dtype=torch.float32)
        return {site: s[:, None] * self.unit_mask(h, int(self.values[h].shape[1]))[None]
                for h, site in self.sites().items()}

    def hooks(self, last: "Tensor", strength: float | None = None) -> list:
        """Forward hooks [(hook point, fn)] for rows whose last prompt token is at `last` [rows]: slot j acts at
        last + j where the forward has that position (a greedy loop's full forwards grow into the later slots)."""
        import torch

        a = self.strength if strength is None else float(strength)
        out = []
        for h, v in self.values.items():
            comp, U = hook_component(h), int(v.shape[1])
            unit_m = self.unit_mask(h, U)

            def fn(act, hook, v=v, comp=comp, U=U, unit_m=unit_m):
                x = units_view(act, comp, U)
                rows, width = x.shape[0], x.shape[1]
                lst = last.to(x.device)
                S = v.shape[0]
                pos = lst[:, None] + torch.arange(S, device=x.device)[None]  # [rows, S]
                inside = (pos < width).to(x.dtype)
                m = (a * unit_m.to(x.device, x.dtype))[None, None, :, None] * inside[:, :, None, None]
                idx = torch.arange(rows, device=x.device)[:, None]
                blend_at(x, idx, pos.clamp(max=width - 1), m, v, self.how)
                return act

            out.append((h, fn))
        return out

    # ------------------------------------------------------------------ keep
    def record(self) -> dict:
        return {"heads": list(self.heads), "mode": self.mode, "how": self.how, "strength": self.strength,
                "component": self.component, "units": {h: list(map(int, u)) for h, u in self.units.items()},
                "slots": self.n_slots, "positions": self.positions, "built_on": self.built_on,
                "tensors": {h: list(v.shape) for h, v in self.values.items()}}

    def save(self, out, command: str = "repair") -> Path:
        """DIR/repair.safetensors (one tensor per hook point, named by it) and DIR/repair.json, then manifest.json;
        written atomically (nothing half-written on error or Ctrl-C)."""
        from safetensors.torch import save_file

        out = Path(out)
        with staging(out) as tmp:
            save_file({h: v.detach().float().contiguous().cpu() for h, v in self.values.items()}, str(tmp / TENSORS))
            write_json(tmp / FILE, self.record())
            write_json(tmp / "manifest.json", manifest(command, options={"repair": self.record()}, argv=None))
        return out


def read_repair(path) -> Repair:
    """A repair saved by `Repair.save` (tensors loaded with safetensors; nothing executed)."""
    from safetensors.torch import load_file

    path = Path(path)
    bad = dict(where=str(path), field="repair", fix="give a folder written by repair.save(DIR) or surgeon repair --out DIR")
    try:
        meta = json.loads((path / FILE).read_text())
        values = load_file(str(path / TENSORS))
    except (OSError, ValueError) as e:
        raise AnalysisError(f"holds no repair surgeon can read ({type(e).__name__}: {str(e)[:100]})", **bad) from None
    if meta.get("mode") not in MODES or set(values) != set(meta.get("units", {})):
        raise AnalysisError("its repair.json and repair.safetensors do not agree (mode or hook points)", **bad)
    return Repair(tuple(meta["heads"]), meta["mode"], float(meta["strength"]), values,
                  {h: tuple(u) for h, u in meta["units"].items()}, meta.get("component", "z"),
                  meta.get("positions", POSITIONS), meta.get("built_on") or {})


def check_fits(repair: Repair, model) -> None:
    """Refuse a repair built for another model shape (its hook points or unit sizes do not exist here)."""
    names = set(model.hook_dict)
    for h, v in repair.values.items():
        if h not in names:
            raise AnalysisError(f"the repair acts at {h}, which this model does not have", field="repair",
                                fix="apply a repair to the model it was built for")
        dims = {"z": (model.cfg.n_heads, model.cfg.d_head)}.get(hook_component(h).name)
        if dims is not None and tuple(v.shape[1:]) != dims:
            raise AnalysisError(f"the repair's values at {h} are {tuple(v.shape[1:])} per slot; this model's heads are "
                                f"{dims}", field="repair", fix="apply a repair to the model it was built for")


@contextmanager
def apply(model, repair: Repair, strength: float | None = None):
    """Every forward of `model` inside the block runs repaired, ``model.generate`` included. A forward over several
    positions is a prompt (batches: equal lengths or left-padded, so each row's last prompt token is the last
    position): slot 0 acts at its last position; each one-position forward after it (a key/value-cache step) is the
    next slot. For right-padded batches of different lengths use `repair.hooks(last)` with each row's last position."""
    import torch

    check_fits(repair, model)
    a = repair.strength if strength is None else float(strength)
    state = {h: 0 for h in repair.values}  # per hook point: the slot of the next one-position forward

    def make(h, v):
        comp, U = hook_component(h), int(v.shape[1])
        unit_m = repair.unit_mask(h, U)

        def fn(act, hook):
            x = units_view(act, comp, U)
            rows, width = x.shape[0], x.shape[1]
            if width > 1:
                slot, pos = 0, width - 1
                state[h] = 1
            else:
                slot, pos = state[h], 0
                state[h] += 1
            if slot >= v.shape[0]:
                return act
            m = (a * unit_m.to(x.device, x.dtype))[None, None, :, None].expand(rows, 1, U, 1)
            idx = torch.arange(rows, device=x.device)[:, None]
            p = torch.full((rows, 1), pos, device=x.device, dtype=torch.long)
            blend_at(x, idx, p, m, v[slot: slot + 1], repair.how)
            return act
        return fn

    with model.hooks(fwd_hooks=[(h, make(h, v)) for h, v in repair.values.items()]):
        yield model


def as_values(values: Mapping[str, "Tensor"]) -> dict:
    return {h: v.detach().float().cpu() for h, v in values.items()}


__all__ = ["MODES", "POSITIONS", "Repair", "apply", "check_fits", "read_repair"]
