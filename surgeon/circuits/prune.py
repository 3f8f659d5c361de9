"""The smallest faithful circuit among the top-k prefixes of an edge ranking.

`smallest_prefix(f_of, n_edges, target)` returns the smallest k whose top-k edge set reaches the target
faithfulness. Faithfulness need not grow with k (a negative edge can pull it down), so for rankings of up to
`exhaustive_up_to` edges every k from 1 upward is evaluated until the first one reaches the target (exact,
no assumption). Beyond that it bisects (16 candidates per round, every round one batch), which assumes f is
monotone in k between the candidates; k - 1 is then always evaluated, so the answer is at least locally
minimal, and the result says that monotonicity was assumed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

EXHAUSTIVE_UP_TO = 4096  # rankings up to this many edges are scanned k = 1, 2, ... (exact)
SCAN_BATCH = 64  # prefixes per batch in the scan


@dataclass(frozen=True)
class PrefixSearch:
    k: int | None  # smallest top-k prefix with f >= target; None when no prefix reaches it
    f: float  # f(k) (f(n_edges) when k is None)
    f_before: float | None  # f(k - 1), evaluated (None for k = 1 or no k)
    search: str  # "exhaustive" or "bisection"
    monotone_assumed: bool  # True for bisection: f taken as non-decreasing in k between evaluated points
    evaluated: dict = field(default_factory=dict, repr=False)  # k -> f(k) for every prefix evaluated

    def describe(self) -> str:
        if self.search == "exhaustive":
            return (f"k = 1, 2, ... evaluated in batches until the first reaching the target ({len(self.evaluated)} "
                    f"prefixes evaluated): exact")
        return (f"bisection over k ({len(self.evaluated)} prefixes evaluated; f assumed monotone in k between "
                f"them, f(k-1) checked)")


def smallest_prefix(f_of: Callable[[Sequence[int]], Sequence[float]], n_edges: int, target: float, *,
                    exhaustive_up_to: int = EXHAUSTIVE_UP_TO, batch: int = SCAN_BATCH) -> PrefixSearch:
    """`f_of(ks)` gives the faithfulness of the top-k prefix for each k in ks (one batch)."""
    known: dict[int, float] = {}

    def ev(ks) -> None:
        todo = sorted({int(k) for k in ks if int(k) not in known})
        if todo:
            known.update(zip(todo, (float(v) for v in f_of(todo))))

    def result(k: int | None, search: str) -> PrefixSearch:
        if k is not None and k > 1:
            ev([k - 1])
        f = known[k] if k is not None else known[n_edges]
        return PrefixSearch(k, f, known.get(k - 1) if k is not None and k > 1 else None, search,
                            search == "bisection", dict(sorted(known.items())))

    if n_edges < 1:
        raise ValueError("no edges to search")
    if n_edges <= exhaustive_up_to:
        for lo in range(1, n_edges + 1, batch):
            ks = range(lo, min(n_edges, lo + batch - 1) + 1)
            ev(ks)
            hit = next((k for k in ks if known[k] >= target), None)
            if hit is not None:
                return result(hit, "exhaustive")
        return result(None, "exhaustive")
    ev([n_edges])
    if known[n_edges] < target:
        return result(None, "bisection")
    lo, hi = 0, n_edges  # f(top-hi) >= target; no evaluated k <= lo reaches it
    while hi - lo > 1:
        cand = sorted({int(round(lo + (hi - lo) * (i + 1) / 17)) for i in range(16)} - {lo, hi})
        ev(cand)
        ok = [c for c in cand if known[c] >= target]
        if ok:
            hi = min(ok)
            lo = max([c for c in cand if c < hi], default=lo)
        else:
            lo = max(cand)
    return result(hi, "bisection")


def exhaustive_scan(f_of: Callable[[Sequence[int]], Sequence[float]], n_edges: int, batch: int = SCAN_BATCH) -> np.ndarray:
    """f(k) for every k = 0..n_edges (the reference the search is tested against)."""
    out = []
    for lo in range(0, n_edges + 1, batch):
        out += list(f_of(list(range(lo, min(n_edges, lo + batch - 1) + 1))))
    return np.asarray(out, dtype=float)
