"""Greedy forward selection, the one definition the repair search and the paired head set share: from the empty set,
each step scores every candidate (the set so far plus one member of the pool, under each option) in one call, takes
the admissible candidate with the highest (primary, secondary) score, and stops at `max_size`, when no candidate is
admissible, or when the best does not beat the set so far; the set to keep is the smallest on the path that reaches
the path's best primary score (`smallest_best`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass(frozen=True)
class Step:
    """One step of a forward selection: the candidates it scored, how many were admissible, and the one it took
    (`index` into the candidates; None where it stopped instead, `stopped` saying why)."""

    k: int  # the size the step tried
    candidates: int
    admissible: int
    index: int | None = None
    chosen: tuple = ()  # the set after the step
    option: object = None
    primary: float | None = None
    secondary: float | None = None
    stopped: str | None = None  # "none admissible" or "no gain" (the best admissible does not beat the set)


def forward_selection(pool: Sequence, max_size: int, score: Callable, start: tuple[float, float],
                      options: Sequence = (None,), progress=None) -> list[Step]:
    """Every step of a greedy forward selection over `pool` (see the module). `score(candidates)` takes
    [(set, option)] and returns (primary [P], secondary [P], admissible [P] bool); `start`: the (primary, secondary)
    of the empty set, which the first step must beat. `progress`: a tqdm bar, advanced once per set taken."""
    chosen: list = []
    cur = start
    steps: list[Step] = []
    while len(chosen) < max_size:
        cand = [(chosen + [u], a) for u in pool if u not in chosen for a in options]
        if not cand:
            break
        primary, secondary, ok = (np.asarray(x) for x in score(cand))
        idx = np.flatnonzero(ok)
        k = len(chosen) + 1
        if not len(idx):
            steps.append(Step(k, len(cand), 0, stopped="none admissible"))
            break
        p = int(idx[np.lexsort((-secondary[idx], -primary[idx]))[0]])  # the highest primary; then the secondary
        if (primary[p], secondary[p]) <= cur:
            steps.append(Step(k, len(cand), int(ok.sum()), stopped="no gain"))
            break
        chosen, cur = cand[p][0], (float(primary[p]), float(secondary[p]))
        steps.append(Step(k, len(cand), int(ok.sum()), p, tuple(chosen), cand[p][1], cur[0], cur[1]))
        if progress is not None:
            progress.update(1)
    return steps


def smallest_best(steps: Sequence[Step]) -> Step | None:
    """The step with the smallest set among those reaching the path's best primary score (None: nothing taken)."""
    taken = [s for s in steps if s.index is not None]
    if not taken:
        return None
    top = max(s.primary for s in taken)
    return next(s for s in taken if s.primary == top)


__all__ = ["Step", "forward_selection", "smallest_best"]
