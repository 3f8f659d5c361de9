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
- `apply(model, repair, last=None)`: a context manager under which ``model.generate`` (key/value-cached or not) runs
  repaired, and any other forward when told where each row's prompt ends (`last`); without it such a forward is
  refused rather than guessed (`surgeon.repairs.site.slot_columns` is the one rule every route takes);
- `repair.save(DIR)` / `read_repair(DIR)` (and `surgeon.load(DIR)`): ``repair.safetensors`` (one tensor per hook point,
  named by it, zero outside the repaired units) and ``repair.json`` (heads, mode, strength, position rule, slots, the
  case by content and the split it was built on), with a manifest written last.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from surgeon.errors import AnalysisError
from surgeon.results import manifest, staging, write_json
from surgeon.repairs.site import ConstantSite, write_slots
from surgeon.models.loading import model_digest
from surgeon.sites.nodes import Site, hook_component, unit_label, units_view

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

    def hooks(self, last: "Tensor", strength: float | None = None) -> list:
        """Forward hooks [(hook point, fn)] for full forwards (from position 0) of rows whose last prompt token is at
        `last` [rows] (right-padded batches): slot j acts at last + j where the forward has that position (a greedy
        loop's full forwards grow into the later slots; `surgeon.repairs.site.slot_columns` is the rule)."""
        a = self.strength if strength is None else float(strength)
        out = []
        for h, v in self.values.items():
            comp, U = hook_component(h), int(v.shape[1])
            unit_m = a * self.unit_mask(h, U)

            def fn(act, hook, v=v, comp=comp, U=U, unit_m=unit_m):
                write_slots(units_view(act, comp, U), last, 0, v, unit_m, self.how)
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
    """A repair saved by `Repair.save` (tensors loaded with safetensors; nothing executed), checked whole: a folder
    edited or corrupted by hand is refused with what is wrong, never applied (`_check_saved`)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    bad = dict(where=str(path), field="repair", fix="give a folder written by repair.save(DIR) or surgeon repair --out DIR")
    try:
        meta = json.loads((path / FILE).read_text())
        values = load_file(str(path / TENSORS))
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:  # missing, truncated or not JSON / safetensors at all
        raise AnalysisError(f"holds no repair surgeon can read ({type(e).__name__}: {str(e)[:100]})", **bad) from None
    _check_saved(meta, values, bad)
    return Repair(tuple(meta["heads"]), meta["mode"], float(meta["strength"]), values,
                  {h: tuple(u) for h, u in meta["units"].items()}, meta.get("component", "z"),
                  meta.get("positions", POSITIONS), meta.get("built_on") or {})


def _check_saved(meta, values: dict, bad: dict) -> None:
    """What a saved repair must be to mean anything: repair.json an object with heads (labels), mode, a finite
    positive strength and units per hook point; repair.safetensors one floating, finite tensor [slots >= 1, units,
    ...] per hook point, zero outside its units; the labels the units' own (a relabelled head is refused)."""
    import math

    import torch

    def no(why: str):
        raise AnalysisError(f"its {FILE} or {TENSORS} {why}", **bad)

    if not isinstance(meta, dict):
        no(f"is not a repair: {FILE} holds a JSON {type(meta).__name__}, not an object")
    for key in ("heads", "mode", "strength", "units"):
        if key not in meta:
            no(f"is not whole: {FILE} has no {key!r}")
    if meta["mode"] not in MODES:
        no(f"names mode {meta['mode']!r}, not one of {', '.join(MODES)}")
    st = meta["strength"]
    if isinstance(st, bool) or not isinstance(st, (int, float)) or not math.isfinite(st) or st <= 0:
        no(f"holds strength {st!r}, not a finite positive number")
    units, heads = meta["units"], meta["heads"]
    if not isinstance(units, dict) or not isinstance(heads, list) or not all(isinstance(h, str) for h in heads):
        no("holds units or heads of the wrong form (units: hook point -> unit indices; heads: labels)")
    if set(values) != set(units):
        no("do not agree: the hook points of the units and of the tensors differ")
    labels = []
    for h, v in values.items():
        if not v.is_floating_point():
            no(f"holds {v.dtype} values at {h}; a repair's constants are floating point")
        if v.dim() < 3 or v.shape[0] < 1:
            no(f"holds values of shape {tuple(v.shape)} at {h}: [slots >= 1, units, ...] expected")
        if not bool(torch.isfinite(v).all()):
            no(f"holds NaN or infinite values at {h}")
        us = units[h]
        if not isinstance(us, list) or not us or not all(isinstance(u, int) and not isinstance(u, bool) for u in us):
            no(f"holds units {us!r} at {h}, not a list of unit indices")
        if min(us) < 0 or max(us) >= v.shape[1]:
            no(f"names units {us} at {h}, outside its {v.shape[1]} units")
        off = torch.ones(v.shape[1], dtype=torch.bool)
        off[us] = False
        if bool(v[:, off].ne(0).any()):
            no(f"holds values at {h} for units it does not name (units edited?)")
        try:
            site = Site.coerce(h)
            comp, layer = site.component.name, site.layer
        except AnalysisError:
            no(f"acts at {h!r}, which is no hook point a repair writes")
        labels += [unit_label(comp, layer, u) for u in us]
    if sorted(labels) != sorted(heads):
        no(f"do not agree: the units are {', '.join(sorted(labels))} but the heads say {', '.join(sorted(heads))} "
           "(relabelled?)")


def check_fits(repair: Repair, model, any_model: bool = False) -> None:
    """Refuse a repair built for another model shape (its hook points or unit sizes do not exist here), or, unless
    `any_model`, for other weights of the same shape (the weights' digest it recorded, `model_digest`)."""
    names = set(model.hook_dict)
    for h, v in repair.values.items():
        if h not in names:
            raise AnalysisError(f"the repair acts at {h}, which this model does not have", field="repair",
                                fix="apply a repair to the model it was built for")
        dims = {"z": (model.cfg.n_heads, model.cfg.d_head)}.get(hook_component(h).name)
        if dims is not None and tuple(v.shape[1:]) != dims:
            raise AnalysisError(f"the repair's values at {h} are {tuple(v.shape[1:])} per slot; this model's heads are "
                                f"{dims}", field="repair", fix="apply a repair to the model it was built for")
    built = (repair.built_on or {}).get("model_sha256")
    if built and not any_model:
        if model_digest(model) != built:
            raise AnalysisError(f"the repair was built on other weights (sha256 {built[:12]}...) than this model's, of "
                                "the same shape: its constants are that model's activations", field="repair",
                                fix="apply it to the model it was built on; to apply it to these weights on purpose, "
                                    "pass any_model=True (surgeon repair --from DIR --any-model)")


_APPLIED = "_surgeon_applied_repair"  # set on a model while `apply` holds it: a second apply inside is refused
END = "end"  # apply(..., last=END): every forward's last position is each row's last prompt token


def _lasts(last, rows: int, width: int, device) -> "Tensor":
    """`last` (an int, a sequence or tensor of one per row, or END) as a tensor [rows]."""
    import torch

    if isinstance(last, str):
        return torch.full((rows,), width - 1, device=device, dtype=torch.long)
    t = torch.as_tensor(last, device=device, dtype=torch.long).reshape(-1)
    if t.numel() == 1:
        t = t.expand(rows)
    if t.numel() != rows:
        raise AnalysisError(f"last= names {t.numel()} rows' last prompt positions, but the forward has {rows} rows",
                            field="last", fix="give one last prompt position per row of the batch (or one for all)")
    if bool((t < 0).any()) or bool((t >= width).any()):
        raise AnalysisError(f"last= holds positions outside the forward's {width} positions", field="last",
                            fix="give each row's last prompt token's position, counted from 0")
    return t


def check_last(last) -> None:
    import torch

    if last is None or (isinstance(last, str) and last == END):
        return
    if isinstance(last, str) or not isinstance(last, (int, list, tuple, torch.Tensor)) or isinstance(last, bool):
        raise AnalysisError(f"last={last!r} is neither a position nor one per row", field="last",
                            fix=f"give each row's last prompt position (an int, a list or a tensor), or {END!r}")


@contextmanager
def apply(model, repair: Repair, strength: float | None = None, last=None, any_model: bool = False):
    """Every forward of `model` inside the block runs repaired, by one position rule (`slot_columns`): slot j at
    the position j tokens after each row's last prompt token.

    - ``model.generate`` (and ``generate_stream``), with a key/value cache or without: the prompt's last position is
      the last prompt token of every row (TransformerLens left-pads a batch of strings); each later forward is placed
      by the positions it covers (a cached step is the next position, an uncached one the whole sequence again).
    - any other forward (a prompt, a teacher-forced prompt + answer, a right-padded batch): say where each row's
      prompt ends with `last` (an int, one per row, or ``"end"`` for "each forward's last position"). Without it such
      a forward is refused: the repair cannot know where the prompt ends, and a guess would silently misplace it.
    """
    check_fits(repair, model, any_model)
    check_last(last)
    if model.__dict__.get(_APPLIED) is not None:
        raise AnalysisError("a repair is already applied to this model (surgeon.apply inside surgeon.apply): both "
                            "would act, a steer added twice", field="repair",
                            fix="leave the outer `with surgeon.apply(...)` first, or apply one repair")
    a = repair.strength if strength is None else float(strength)
    gen: dict = {}  # while model.generate runs: cached (bool), and per hook point the positions seen so far

    def make(h, v):
        comp, U = hook_component(h), int(v.shape[1])
        unit_m = a * repair.unit_mask(h, U)

        def fn(act, hook):
            x = units_view(act, comp, U)
            rows, width = x.shape[0], x.shape[1]
            if gen:
                seen = gen["seen"].get(h)
                if seen is None:  # the prompt
                    start, gen["seen"][h], gen["last"][h] = 0, width, width - 1
                elif gen["cached"]:
                    start, gen["seen"][h] = seen, seen + width
                else:
                    start, gen["seen"][h] = 0, width
                lst = _lasts(gen["last"][h], rows, gen["last"][h] + 1, x.device)
            elif last is None:
                raise AnalysisError(
                    "surgeon.apply does not know where this forward's prompt ends (a forward outside model.generate: a "
                    "prompt, a prompt + answer teacher-forced, a padded batch), so it cannot place the repair",
                    field="last", fix="pass surgeon.apply(model, repair, last=...) with each row's last prompt position "
                                      "(or last='end' when every row's prompt ends at the forward's last position)")
            else:
                start, lst = 0, _lasts(last, rows, width, x.device)
            write_slots(x, lst, start, v, unit_m, repair.how)
            return act
        return fn

    def wrap(name):
        inner = getattr(model, name)

        def run(*args, **kwargs):
            if gen:
                return inner(*args, **kwargs)
            gen.update(cached=bool(kwargs.get("use_past_kv_cache", True)), seen={}, last={})
            try:
                return inner(*args, **kwargs)
            finally:
                gen.clear()

        def stream(*args, **kwargs):  # a generator: generation runs while it is iterated
            gen.update(cached=bool(kwargs.get("use_past_kv_cache", True)), seen={}, last={})
            try:
                yield from inner(*args, **kwargs)
            finally:
                gen.clear()
        return stream if name == "generate_stream" else run

    wrapped = [n for n in ("generate", "generate_stream") if hasattr(model, n)]
    for n in wrapped:
        setattr(model, n, wrap(n))
    model.__dict__[_APPLIED] = repair
    try:
        with model.hooks(fwd_hooks=[(h, make(h, v)) for h, v in repair.values.items()]):
            yield model
    finally:
        for n in wrapped:
            model.__dict__.pop(n, None)
        model.__dict__.pop(_APPLIED, None)


__all__ = ["END", "MODES", "POSITIONS", "Repair", "apply", "check_fits", "check_last", "read_repair"]
