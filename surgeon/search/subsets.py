"""Head-subset search: which sets of heads repair the failure, from what size k on, and how sharply.

Every subset S of candidate heads is a binary mask on the intervention core (good-format head outputs
patched into the failing run for the heads in S, at the case's aligned positions). S *repairs* an item
when the correct answer then wins; S *repairs* the case when its item repair rate reaches `item_rate`
(default 1.0: every item). For each family (all candidates, and each group) and each size k, all C(n, k)
subsets are enumerated when that fits `budget`, else `budget` are sampled uniformly without
replacement, and the report says which.

The work is a deterministic plan of unique subsets, evaluated in chunks that are saved as they finish
(see `surgeon.search.store`): a run resumes, splits into shards, and merges into the result one run gives.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from surgeon.errors import AnalysisError, warn
from surgeon.search.store import ChunkStore, read_plan
from surgeon.show import Shows
from surgeon.sites.nodes import Site
from surgeon.stats import wilson
from surgeon.threads import ThreadGovernor


# ----------------------------------------------------------------------------- candidates and groups
@dataclass(frozen=True, order=True)
class Unit:
    layer: int
    head: int  # a head, or an SAE feature (kind "F")
    kind: str = "H"

    @property
    def label(self) -> str:
        return f"L{self.layer}{self.kind}{self.head}"


_UNIT_RE = re.compile(r"^(?:L?(\d+)[.H:])?H?(\d+)$", re.I)


def parse_units(spec: str | None, layer: int | None, n_layers: int, n_heads: int) -> list[Unit]:
    """`None` -> every head of `layer`; "0,2,5" -> those heads of `layer`; "L1H0,L2H3" or "1.0,2.3" -> as named."""
    if spec is None:
        if layer is None:
            raise AnalysisError("no candidate heads", field="--layer", fix="give --layer L (all its heads) or --heads")
        units = [Unit(layer, h) for h in range(n_heads)]
    else:
        units = []
        for part in spec.split(","):
            m = _UNIT_RE.match(part.strip())
            if not m:
                raise AnalysisError(f"cannot read head {part!r}", field="--heads", fix="write heads as 0,2,5 (with --layer) or L1H0,L2H3")
            L = int(m.group(1)) if m.group(1) is not None else layer
            if L is None:
                raise AnalysisError(f"head {part!r} names no layer", field="--heads", fix="add --layer L or write L1H0")
            units.append(Unit(L, int(m.group(2))))
    for u in units:
        if not 0 <= u.layer < n_layers or not 0 <= u.head < n_heads:
            raise AnalysisError(f"{u.label} is out of range (the model has layers 0..{n_layers - 1}, heads 0..{n_heads - 1})",
                                field="--heads", fix="choose heads that exist")
    if len(set(units)) != len(units):
        raise AnalysisError("a head is listed twice", field="--heads", fix="list each head once")
    return units


BUILTIN_GROUPS = ("even", "odd", "first_half", "second_half", "random")  # random: a seeded random half (a control)


def read_groups(path) -> dict[str, list[str]]:
    """A groups file: a JSON object mapping each group's name to a list of head labels ("L1H0"). Its shape
    is checked here, before any model loads; the labels are checked against the candidates by `make_groups`."""
    import json

    where = str(path)
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise AnalysisError(f"cannot read groups file: {e}", where=where, field="--groups-file",
                            fix='write JSON like {"mine": ["L1H0", "L1H3"]}') from None
    if not isinstance(spec, dict) or not spec:
        raise AnalysisError("a groups file holds a JSON object of groups", where=where, field="--groups-file",
                            fix='write JSON like {"mine": ["L1H0", "L1H3"]}')
    for name, labels in spec.items():
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) for x in labels):
            raise AnalysisError(f"group {name!r} is not a non-empty list of head labels", where=where,
                                field=f"--groups-file[{name!r}]", fix=f'write e.g. "{name}": ["L1H0", "L1H3"]')
        if len(set(labels)) < len(labels):
            twice = sorted({x for x in labels if labels.count(x) > 1})
            warn(f"{where}: group {name!r} lists {', '.join(twice)} more than once; each head counts once")
            spec[name] = list(dict.fromkeys(labels))
    seen: dict[frozenset, str] = {}
    for name, labels in spec.items():
        other = seen.setdefault(frozenset(labels), name)
        if other != name:
            raise AnalysisError(f"groups {other!r} and {name!r} hold the same heads", where=where,
                                field=f"--groups-file[{name!r}]", fix="give each group its own heads, or drop one")
    return spec


def make_groups(units: Sequence[Unit], names: Sequence[str] = (), spec: dict | None = None,
                seed: int = 0) -> dict[str, tuple[int, ...]]:
    """Groups as indices into `units`: built-in partitions by name (`random`: half the units drawn with `seed`, a
    control as large as `even`), or a user mapping name -> head labels."""
    groups: dict[str, tuple[int, ...]] = {}
    n = len(units)
    for name in names:
        if name == "even":
            g = [i for i, u in enumerate(units) if u.head % 2 == 0]
        elif name == "odd":
            g = [i for i, u in enumerate(units) if u.head % 2 == 1]
        elif name == "first_half":
            g = list(range(n // 2))
        elif name == "second_half":
            g = list(range(n // 2, n))
        elif name == "random":
            g = sorted(random.Random(f"random-half-{seed}").sample(range(n), n // 2))
        else:
            raise AnalysisError(f"unknown group {name!r}", field="--groups",
                                fix=f"use {', '.join(BUILTIN_GROUPS)}, or --groups-file with your own")
        groups[name] = tuple(g)
    index = {u.label: i for i, u in enumerate(units)}
    for name, labels in (spec or {}).items():
        try:
            groups[name] = tuple(index[str(x)] for x in labels)
        except KeyError as e:
            raise AnalysisError(f"group {name!r} names {e.args[0]!r}, which is not a candidate head", field="--groups-file",
                                fix=f"use labels like {units[0].label}; candidates: {', '.join(index)}") from None
    for name, g in groups.items():
        if not g:
            raise AnalysisError(f"group {name!r} is empty", field="--groups", fix="check the candidate heads")
    return groups


# ----------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Family:
    """The subsets evaluated for one question: size k within a group, or (i, j) from two groups."""

    name: str  # "all", a group name, or "A x B"
    key: tuple[int, ...]  # (k,) or (i, j)
    masks: tuple[int, ...]  # bitmasks over the candidate units
    total: int  # how many such subsets exist
    enumerated: bool


@dataclass(frozen=True)
class Plan:
    units: tuple[Unit, ...]
    groups: dict[str, tuple[int, ...]]
    families: tuple[Family, ...]
    unique: tuple[int, ...]  # every distinct subset to evaluate, in evaluation order
    options: dict
    digest: str


def _subsets(pool: Sequence[int], k: int, budget: int, rng: random.Random) -> tuple[list[int], int, bool]:
    total = math.comb(len(pool), k)
    if total <= budget:
        return [sum(1 << i for i in c) for c in itertools.combinations(pool, k)], total, True
    seen: dict[int, None] = {}
    while len(seen) < budget:
        seen.setdefault(sum(1 << i for i in rng.sample(pool, k)), None)
    return list(seen), total, False


def make_plan(units: Sequence[Unit], groups: dict[str, tuple[int, ...]], *, budget: int = 20000,
              grid: tuple[str, str] | None = None, grid_budget: int = 200, seed: int = 0) -> Plan:
    if budget < 1:
        raise AnalysisError("budget must be at least 1", field="--budget", fix="e.g. --budget 20000")
    fams: list[Family] = []
    pools = {"all": tuple(range(len(units))), **groups}
    for name, pool in pools.items():
        for k in range(len(pool) + 1):
            rng = random.Random(f"{seed}-{name}-{k}")
            masks, total, enum = _subsets(list(pool), k, budget, rng)
            fams.append(Family(name, (k,), tuple(masks), total, enum))
    if grid:
        for g in grid:
            if g not in groups:
                raise AnalysisError(f"grid group {g!r} is not a group", field="--grid", fix=f"use two of: {', '.join(groups)}")
        A, B = (list(groups[g]) for g in grid)
        for i in range(len(A) + 1):
            for j in range(len(B) + 1):
                total = math.comb(len(A), i) * math.comb(len(B), j)
                if total <= grid_budget:
                    masks = [sum(1 << t for t in ca + cb) for ca in itertools.combinations(A, i)
                             for cb in itertools.combinations(B, j)]
                else:
                    rng = random.Random(f"{seed}-grid-{i}-{j}")
                    seen: dict[int, None] = {}
                    while len(seen) < grid_budget:
                        seen.setdefault(sum(1 << t for t in rng.sample(A, i) + rng.sample(B, j)), None)
                    masks = list(seen)
                fams.append(Family(f"{grid[0]} x {grid[1]}", (i, j), tuple(masks), total, total <= grid_budget))
    unique = tuple(dict.fromkeys(m for f in fams for m in f.masks))
    options = dict(units=[u.label for u in units], groups={k: list(v) for k, v in groups.items()}, budget=budget,
                   grid=list(grid) if grid else None, grid_budget=grid_budget, seed=seed)
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()
    return Plan(tuple(units), dict(groups), tuple(fams), unique, options, digest)


def plan_from_options(options: dict) -> Plan:
    units = [Unit(int(m.group(1)), int(m.group(3)), m.group(2))
             for m in (re.match(r"L(\d+)([HF])(\d+)", s) for s in options["units"])]
    groups = {k: tuple(v) for k, v in options["groups"].items()}
    return make_plan(units, groups, budget=options["budget"], grid=tuple(options["grid"]) if options["grid"] else None,
                     grid_budget=options["grid_budget"], seed=options["seed"])


def bits_to_bool(masks: Sequence[int], n: int) -> np.ndarray:
    return np.array([[(m >> i) & 1 for i in range(n)] for m in masks], dtype=bool).reshape(len(masks), n)


def bool_to_bits(rows: np.ndarray) -> list[int]:
    w = [1 << i for i in range(rows.shape[1])]
    return [sum(b for b, x in zip(w, r) if x) for r in rows]


# ----------------------------------------------------------------------------- evaluation
def chunk_scores(contrast, plan: Plan, c: int, chunk: int, component: str = "z", sites: dict | None = None) -> dict:
    """Chunk c of the plan: its subsets as a bool [subsets, units] array and their item scores [subsets, items].
    `sites` (layer -> site) overrides the component's sites, e.g. an SAE's `FeatureSite`."""
    import torch

    n_units = len(plan.units)
    layers = sorted({u.layer for u in plan.units})
    sites = sites or {L: Site.of(component, L) for L in layers}
    H = contrast.units(sites[layers[0]])
    masks = plan.unique[c * chunk: (c + 1) * chunk]
    on = torch.from_numpy(bits_to_bool(masks, n_units)).float()
    site_masks = {}
    for L in layers:
        m = torch.zeros(len(masks), H)
        for i, u in enumerate(plan.units):
            if u.layer == L:
                m[:, u.head] = on[:, i]
        site_masks[sites[L]] = m
    with torch.no_grad():
        scores = contrast.run(site_masks).cpu().numpy().astype(np.float32)
    return dict(masks=bits_to_bool(masks, n_units), scores=scores)


def todo_chunks(plan: Plan, store, chunk: int, shard: tuple[int, int] = (0, 1)) -> dict[int, int]:
    """This shard's chunks not yet in `store`: chunk index -> number of subsets."""
    n_chunks = math.ceil(len(plan.unique) / chunk)
    done = store.done()
    return {c: min(chunk, len(plan.unique) - c * chunk) for c in range(n_chunks)
            if c % shard[1] == shard[0] and c not in done}


def evaluate(contrast, plan: Plan, store, *, component: str = "z", chunk: int = 256, shard: tuple[int, int] = (0, 1),
             progress: bool = False) -> int:
    """Evaluate this shard's missing chunks of the plan, saving each as it finishes. Returns chunks done now.
    Between chunks, torch's threads follow the cores other work leaves free (`ThreadGovernor`; the progress line
    says when the machine is contended)."""
    todo = todo_chunks(plan, store, chunk, shard)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(todo.values()), desc="subsets", unit="subset")
    with ThreadGovernor() as gov:
        for c, size in todo.items():
            store.save(c, **chunk_scores(contrast, plan, c, chunk, component))
            gov.step()
            if bar is not None:
                bar.set_postfix_str(gov.note, refresh=False)
                bar.update(size)
    if bar is not None:
        bar.close()
    return len(todo)


# ----------------------------------------------------------------------------- aggregation
@dataclass(frozen=True)
class SizeRow:
    family: str
    key: tuple[int, ...]
    total: int  # subsets that exist
    evaluated: int
    enumerated: bool
    repairing: int
    fraction: float  # of evaluated subsets that repair
    lo: float  # 95% interval (exact when enumerated)
    hi: float
    mean_item_rate: float  # mean over subsets of the fraction of items repaired
    mean_repair_fraction: float  # mean over subsets of (patched - bad) / (good - bad)
    item_rate_hist: tuple[int, ...]  # subsets per item-rate bin [0, .1), ..., [.9, 1), {1}
    # the best evaluated subset of this size: the fraction of items it gets right, with its Wilson 95% interval over
    # items (the interval of that subset's rate; choosing the best of many is not corrected for)
    best_item_rate: float = float("nan")
    best_lo: float = float("nan")
    best_hi: float = float("nan")


@dataclass(frozen=True)
class UnitStats:
    unit: str
    in_repairing: float  # share of repairing subsets that contain this head
    rate_with: float  # fraction of subsets with this head that repair
    rate_with_lo: float
    rate_with_hi: float
    rate_without: float
    rate_without_lo: float
    rate_without_hi: float
    alone_item_rate: float | None  # item repair rate of the head alone


@dataclass(frozen=True)
class Threshold:
    family: str
    x: float
    k_star: int | None  # smallest k at which >= x of subsets repair
    jump: float | None  # fraction(k*) - fraction(k* - 1)
    k_all: int | None  # smallest k at which every evaluated subset repairs


@dataclass
class ThresholdResult(Shows):
    case: str
    component: str
    base: str
    source: str
    tag: str | None
    n_items: int
    item_rate: float
    x: float
    units: list[str]
    groups: dict[str, list[str]]
    clean_base_mean: float
    clean_source_mean: float
    sizes: list[SizeRow]
    thresholds: list[Threshold]
    unit_stats: list[UnitStats]
    minimal: list[list[str]]  # minimal repairing subsets (no evaluated proper subset repairs), smallest first
    n_minimal: int
    complete: bool
    chunks_done: int
    chunks_total: int
    subsets_evaluated: int
    options: dict = field(default_factory=dict)
    generation: list = field(default_factory=list)  # with --generate: greedy check of chosen subsets
    # which execution path the engine took, and why (`Contrast.execution`)
    execution: dict = field(default_factory=dict)

    def size(self, family: str, k: int) -> SizeRow:
        return next(r for r in self.sizes if r.family == family and r.key == (k,))

    def threshold(self, family: str) -> Threshold:
        return next(t for t in self.thresholds if t.family == family)


def summarize_chunks(chunks: Iterable[dict], base: np.ndarray, source: np.ndarray, right_above: float = 0.0):
    """Per subset: item repair rate (items scored above `right_above`, the metric's line between wrong and right),
    mean score and repair fraction, from the saved chunks (streamed)."""
    out: dict[int, tuple[float, float, float]] = {}
    gap = float(source.mean() - base.mean())
    for ch in chunks:
        bits = bool_to_bits(ch["masks"])
        sc = ch["scores"]
        rate = (sc > right_above).mean(axis=1)
        mean = sc.mean(axis=1)
        frac = (mean - base.mean()) / gap if abs(gap) > 1e-12 else np.full_like(mean, np.nan)
        for b, r, m, f in zip(bits, rate, mean, frac):
            out[b] = (float(r), float(m), float(f))
    return out


def aggregate(plan: Plan, per_subset: dict[int, tuple[float, float, float]], *, case: str, component: str, base: str,
              source: str, tag: str | None, n_items: int, item_rate: float, x: float, base_mean: float,
              source_mean: float, chunks_done: int, chunks_total: int) -> ThresholdResult:
    labels = [u.label for u in plan.units]
    repairs = {m: v[0] >= item_rate - 1e-12 for m, v in per_subset.items()}
    sizes: list[SizeRow] = []
    for fam in plan.families:
        ev = [m for m in fam.masks if m in per_subset]
        k_rep = sum(repairs[m] for m in ev)
        rates = np.array([per_subset[m][0] for m in ev])
        fracs = np.array([per_subset[m][2] for m in ev])
        if ev and fam.enumerated and len(ev) == len(fam.masks):
            value = k_rep / len(ev)
            lo = hi = value
        else:
            est = wilson(k_rep, len(ev))
            value, lo, hi = est.value, est.lo, est.hi
        hist = np.histogram(np.minimum(rates, 0.999999) if len(rates) else rates, bins=10, range=(0, 1))[0].tolist()
        hist.append(int((rates >= 1 - 1e-12).sum()))
        hist[-2] -= hist[-1]
        best = wilson(int(round(rates.max() * n_items)), n_items) if len(rates) else None
        sizes.append(SizeRow(fam.name, fam.key, fam.total, len(ev), fam.enumerated, int(k_rep), float(value), float(lo),
                             float(hi), float(rates.mean()) if len(rates) else float("nan"),
                             float(np.nanmean(fracs)) if np.isfinite(fracs).any() else float("nan"), tuple(hist),
                             *((float(rates.max()), best.lo, best.hi) if best else ())))
    thresholds = []
    for name in ["all", *plan.groups]:
        rows = sorted((r for r in sizes if r.family == name and r.evaluated), key=lambda r: r.key)
        k_star = next((r.key[0] for r in rows if r.fraction >= x), None)
        jump = None
        if k_star is not None:
            prev = next((r for r in rows if r.key[0] == k_star - 1), None)
            jump = rows[[r.key[0] for r in rows].index(k_star)].fraction - (prev.fraction if prev else 0.0)
        k_all = next((r.key[0] for r in rows if r.repairing == r.evaluated and all(
            q.repairing == q.evaluated for q in rows if q.key[0] > r.key[0])), None)
        thresholds.append(Threshold(name, x, k_star, jump, k_all))
    # per-head necessity and sufficiency over every evaluated subset
    rep = np.array([repairs[m] for m in per_subset], dtype=bool)
    onoff = bits_to_bool(list(per_subset), len(labels)) if per_subset else np.zeros((0, len(labels)), bool)
    unit_stats = []
    for i, lab in enumerate(labels):
        with_i, without_i = onoff[:, i], ~onoff[:, i]
        w = wilson(int((rep & with_i).sum()), int(with_i.sum()))
        wo = wilson(int((rep & without_i).sum()), int(without_i.sum()))
        alone = per_subset.get(1 << i)
        unit_stats.append(UnitStats(lab, float((rep & with_i).sum() / max(1, rep.sum())), w.value, w.lo, w.hi,
                                    wo.value, wo.lo, wo.hi, alone[0] if alone else None))
    # minimal repairing subsets: no evaluated proper subset repairs
    R = sorted((m for m, r in repairs.items() if r), key=lambda m: (bin(m).count("1"), m))
    minimal: list[int] = []
    for m in R:
        if not any((p & m) == p for p in minimal):
            minimal.append(m)
    minimal_labels = [[labels[i] for i in range(len(labels)) if (m >> i) & 1] for m in minimal]
    return ThresholdResult(
        case=case, component=component, base=base, source=source, tag=tag, n_items=n_items, item_rate=item_rate, x=x,
        units=labels, groups={k: [labels[i] for i in v] for k, v in plan.groups.items()},
        clean_base_mean=base_mean, clean_source_mean=source_mean, sizes=sizes, thresholds=thresholds,
        unit_stats=unit_stats, minimal=minimal_labels[:100], n_minimal=len(minimal), complete=chunks_done == chunks_total,
        chunks_done=chunks_done, chunks_total=chunks_total, subsets_evaluated=len(per_subset), options=plan.options)


def subsets_csv_rows(plan: Plan, per_subset: dict[int, tuple[float, float, float]], item_rate: float):
    """Rows for subsets.csv: every evaluated subset once, with the families it belongs to."""
    labels = [u.label for u in plan.units]
    member: dict[int, list[str]] = {}
    for fam in plan.families:
        tag = f"{fam.name}:{'/'.join(map(str, fam.key))}"
        for m in fam.masks:
            member.setdefault(m, []).append(tag)
    yield ["subset", "size", "families", "item_repair_rate", "repairs", "mean_score", "repair_fraction"]
    for m in plan.unique:
        if m in per_subset:
            r, s, f = per_subset[m]
            yield ["+".join(labels[i] for i in range(len(labels)) if (m >> i) & 1) or "(none)", bin(m).count("1"),
                   " ".join(member.get(m, [])), f"{r:.6g}", int(r >= item_rate - 1e-12), f"{s:.6g}", f"{f:.6g}"]


def per_subset(out) -> dict:
    """Per evaluated subset (bit mask over the plan's units): (item rate, mean repair fraction, ...) from the
    chunk store a search wrote to `out`."""
    meta = read_plan(out)
    return summarize_chunks(ChunkStore(out, meta["digest"]).iter(), np.array(meta["clean_base"]),
                            np.array(meta["clean_source"]), meta.get("right_above", 0.0))
