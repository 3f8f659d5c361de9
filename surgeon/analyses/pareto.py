"""A repair beside the field's steering baselines: each configuration a point (efficacy against harm), the Pareto front,
and which method dominates where. Plain data and the front's rule; `surgeon.analyses.steering_baselines` computes it.

A point is better when its held-out efficacy is higher, its good-format KL from the unrepaired model lower and its
control accuracy higher; a point dominates another when it is at least as good in all three and better in one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from surgeon.show import Shows
from surgeon.stats import Estimate

FAMILIES = {  # family -> (what it is, whom it follows)
    "surgeon": ("the heads surgeon's repair search chose (each step of its greedy path), its own mode and strength",
                "this tool"),
    "caa": ("activation addition in the residual stream: the mean good-minus-failing difference at resid_pre of one "
            "layer, added times a strength, every layer tried", "Turner et al. 2023 (ActAdd); Rimsky et al. 2024 (CAA)"),
    "iti": ("inference-time intervention: heads ranked by a linear probe's held-out accuracy at telling the good format "
            "from the failing one, the top K shifted by alpha times the activations' std along the mass-mean direction",
            "Li et al. 2023 (ITI)"),
    "random": ("as many random heads as the shipped repair, with its mode and strength (seeded draws)", "control"),
    "layer": ("every head of one layer, with the shipped repair's mode and strength, every layer tried", "control"),
}
NAMES = {"surgeon": "surgeon", "caa": "CAA", "iti": "ITI", "random": "random heads", "layer": "one layer"}


@dataclass(frozen=True)
class BaselinePoint:
    """One configuration of one method, measured on the held-out items (and on the discovery items that kept it)."""

    family: str  # a key of FAMILIES
    label: str  # e.g. "L1 x2", "K=4 alpha=5", "L0H0+L0H4 x1"
    params: dict
    efficacy: Estimate  # the failing formats' focus items right, pooled over failing formats
    kl: Estimate  # the good format's KL(unrepaired || repaired), mean over items of each item's mean over positions
    kl_q90: float
    control: Estimate  # control items right: the good format's items, the failing formats' other tags
    discovery: dict = field(default_factory=dict)  # efficacy, kl, control on the discovery items (in-sample)
    front: bool = False  # on the held-out Pareto front of every kept point
    shipped: bool = False  # the repair surgeon ships


def better(a: Sequence[float], b: Sequence[float]) -> bool:
    """Does (efficacy, -kl, control) `a` dominate `b`: at least as good in each, better in one."""
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))


def key(efficacy: float, kl: float, control: float) -> tuple[float, float, float]:
    return (efficacy, -kl, control)


def front(keys: Sequence[Sequence[float]]) -> list[bool]:
    """Which of `keys` (each `key(...)`) no other dominates; of points equal in all three, the first stands for them."""
    keys = [tuple(k) for k in keys]
    return [not any(better(o, k) for j, o in enumerate(keys) if j != i) and k not in keys[:i]
            for i, k in enumerate(keys)]


@dataclass
class Baselines(Shows):
    """Every kept configuration of every method on the same held-out items and measures."""

    points: list[BaselinePoint] = field(default_factory=list)
    unrepaired: dict[str, Estimate] = field(default_factory=dict)  # efficacy, control: the model as it is, held out
    n_evaluation: int = 0
    n_discovery: int = 0
    tried: dict = field(default_factory=dict)  # family -> configurations tried on the discovery items
    grids: dict = field(default_factory=dict)  # family -> the grid it tried
    kept_by: str = ("each method's configurations are measured on the discovery items; those no other configuration of "
                    "the same method dominates there are kept and measured on the held-out items, where the front is "
                    "drawn")

    def shipped(self) -> BaselinePoint | None:
        return next((p for p in self.points if p.shipped), None)

    def family(self, name: str) -> list[BaselinePoint]:
        return [p for p in self.points if p.family == name]

    def best_within(self, name: str, ref: BaselinePoint) -> BaselinePoint | None:
        """`name`'s point with the highest held-out efficacy among those whose KL and control accuracy are no worse
        than `ref`'s (the same side effects or less)."""
        ok = [p for p in self.family(name) if p.kl.value <= ref.kl.value + 1e-12
              and p.control.value >= ref.control.value - 1e-12]
        return max(ok, key=lambda p: (p.efficacy.value, -p.kl.value)) if ok else None

    def dominating(self, ref: BaselinePoint) -> list[BaselinePoint]:
        k = key(ref.efficacy.value, ref.kl.value, ref.control.value)
        return [p for p in self.points if p is not ref and better(key(p.efficacy.value, p.kl.value, p.control.value), k)]

    def dominated_by(self, ref: BaselinePoint) -> list[BaselinePoint]:
        k = key(ref.efficacy.value, ref.kl.value, ref.control.value)
        return [p for p in self.points if p is not ref and better(k, key(p.efficacy.value, p.kl.value, p.control.value))]


__all__ = ["BaselinePoint", "Baselines", "FAMILIES", "NAMES", "better", "front", "key"]
