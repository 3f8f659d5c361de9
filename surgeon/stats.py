"""Intervals for every number surgeon reports: Wilson for rates, bootstrap for means and ratios."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A number with its sample size and 95% interval."""

    value: float
    lo: float
    hi: float
    n: int
    method: str

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return f"{self.value:.3f} (n={self.n}, no interval)"
        return f"{self.value:.3f} [{self.lo:.3f}, {self.hi:.3f}] (n={self.n})"

    def pct(self) -> str:
        return f"{100 * self.value:5.1f}% [{100 * self.lo:5.1f}, {100 * self.hi:5.1f}] (n={self.n})"


def wilson(k: int, n: int, z: float = Z95) -> Estimate:
    """Wilson score interval for k successes out of n."""
    if n == 0:
        return Estimate(float("nan"), 0.0, 1.0, 0, "wilson")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n, "wilson")


def wilson_many(k: np.ndarray, n: int, z: float = Z95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised Wilson: (rate, lo, hi) arrays for success counts `k` out of `n` each."""
    k = np.asarray(k, dtype=float)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return p, np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)


def _resample(n: int, reps: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(reps, n))


def bootstrap_mean(x, reps: int = 2000, seed: int = 0) -> Estimate:
    """Mean with a percentile-bootstrap 95% interval over the items."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0, "bootstrap")
    if x.size == 1:
        return Estimate(float(x[0]), float("nan"), float("nan"), 1, "bootstrap")
    means = x[_resample(x.size, reps, seed)].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return Estimate(float(x.mean()), float(lo), float(hi), int(x.size), "bootstrap")


def bootstrap_means(x: np.ndarray, reps: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise means of x [cells, n] with bootstrap intervals over the n items (same resamples for all)."""
    x = np.asarray(x, dtype=float)
    if x.shape[-1] < 2:  # one item: nothing to resample, no interval
        m = x.mean(axis=-1)
        return m, m * np.nan, m * np.nan
    idx = _resample(x.shape[-1], reps, seed)
    boots = x[..., idx].mean(axis=-1)  # [cells, reps]
    lo, hi = np.percentile(boots, [2.5, 97.5], axis=-1)
    return x.mean(axis=-1), lo, hi


def bootstrap_fraction(patched: np.ndarray, base: np.ndarray, source: np.ndarray, reps: int = 1000,
                       seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Repair fraction (mean patched - mean base) / (mean source - mean base) per cell, with bootstrap
    intervals over items. patched: [cells, n]; base, source: [n]."""
    patched = np.asarray(patched, dtype=float)
    base, source = np.asarray(base, float), np.asarray(source, float)

    def frac(p, b, s):
        gap = s - b
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(np.abs(gap) > 1e-12, (p - b) / gap, np.nan)

    value = frac(patched.mean(-1), base.mean(), source.mean())
    if base.size < 2:  # one item: nothing to resample, no interval
        return value, value * np.nan, value * np.nan
    idx = _resample(base.size, reps, seed)
    pb = patched[..., idx].mean(-1)  # [cells, reps]
    bb, sb = base[idx].mean(-1), source[idx].mean(-1)  # [reps]
    boots = frac(pb, bb, sb)
    lo, hi = np.nanpercentile(boots, [2.5, 97.5], axis=-1) if np.isfinite(boots).any() else (value * np.nan,) * 2
    return value, lo, hi



def fraction_estimate(scores: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> Estimate:
    """One repair fraction as an `Estimate`: (mean scores - mean lo) / (mean hi - mean lo), with the bootstrap 95%
    interval over items of `bootstrap_fraction` (scores, lo, hi: [n], the same items)."""
    v, a, b = bootstrap_fraction(np.asarray(scores)[None], lo, hi)
    return Estimate(float(v[0]), float(a[0]), float(b[0]), len(lo), "bootstrap")


def scaled(e: Estimate, by: float) -> Estimate:
    """`e` divided by `by` (e.g. an effect over a gap): the interval stays ordered when `by` is negative."""
    if abs(by) <= 1e-12:
        return Estimate(float("nan"), float("nan"), float("nan"), e.n, e.method)
    lo, hi = sorted((e.lo / by, e.hi / by))
    return Estimate(e.value / by, lo, hi, e.n, e.method)


def holm(p) -> np.ndarray:
    """Holm's step-down adjustment (Holm 1979) of p-values for the family tested together: the k-th smallest is
    multiplied by (m - k + 1), made monotone, capped at 1. Rejecting where the adjusted p < alpha keeps the family-wise
    error rate at alpha under any dependence between the tests."""
    p = np.asarray(p, dtype=float)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(adj, 1.0)
    return out


def paired_difference(x: np.ndarray, with_: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[Estimate, float]:
    """x [units, items]: the mean over the units in `with_` minus the mean over the others, with a percentile-bootstrap
    95% interval that resamples items (columns) once for both sides (the units are measured on the same items), and
    the bootstrap's two-sided p-value for no difference (2 x the smaller tail, at least 1 / reps)."""
    x = np.asarray(x, dtype=float)
    w = np.asarray(with_, dtype=bool)
    per_item = x[w].mean(0) - x[~w].mean(0)  # [items]: the difference on each item
    value = float(per_item.mean())
    n = per_item.size
    if n < 2:
        return Estimate(value, float("nan"), float("nan"), n, "bootstrap (items)"), 1.0
    boots = per_item[_resample(n, reps, seed)].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    p = min(1.0, max(2 * min(float((boots <= 0).mean()), float((boots >= 0).mean())), 1.0 / reps))
    return Estimate(value, float(lo), float(hi), n, "bootstrap (items)"), p
