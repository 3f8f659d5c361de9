"""Findings checked on items they were not found on: a seeded discovery / evaluation split of a case's items, and
named head subsets evaluated on any items.

A search that keeps the best of many subsets and reports its rate on the items it was chosen on overstates it (the
winner's curse: a Wilson interval over those items does not cover the choice). MIB's circuit-localization track finds
on a train split and scores on a held-out test split; `threshold_heldout` does that for the subset search: the search
runs on the discovery items, and the subset it names best for each family and size is evaluated, paired as the search
patches (the good format's activations into the failing one at the aligned positions), on the evaluation items. The
held-out evaluation costs the forward passes of the named subsets only, not a second search.
"""
from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from surgeon.analyses.circuit import CircuitResult, discover, evaluate_circuit, faithfulness_curve
from surgeon.analyses.circuit_runs import circuit_runs
from surgeon.analyses.common import make_contrast
from surgeon.analyses.feature_circuit import FeatureCircuitResult, feature_circuit, run_nodes
from surgeon.analyses.feature_edges import verify_edges
from surgeon.analyses.patching import PatchResult, patch_heads
from surgeon.analyses.sae_repair import FeatureRepairResult, feature_repair
from surgeon.errors import AnalysisError
from surgeon.search.subsets import ThresholdResult, parse_units, per_subset, plan_from_options
from surgeon.analyses.threshold import threshold_search
from surgeon.show import Shows
from surgeon.sites.edges import EdgeSite
from surgeon.sites.features import FeatureSite
from surgeon.sites.nodes import Site
from surgeon.case.case import Case, Item, tag_indices
from surgeon.case.reading import fresh_items, read_case, validate
from surgeon.case.select import pick_items
from surgeon.stats import Estimate, fraction_estimate, wilson

MIN_PER_SPLIT = 4  # fewer items on either side say nothing a reader could use


@dataclass(frozen=True)
class Split:
    """How a case's items were divided: indices into the tag's items, seeded, stratified by tag, each item's good and
    failing prompts kept together (an item is one unit)."""

    discovery: tuple[int, ...]
    evaluation: tuple[int, ...]
    holdout: float
    seed: int
    stratified_by: str = "tag"
    # where the evaluation items came from when they are not a share of the case's (`eval_split`): None for a split
    evaluated_on: str | None = None

    def describe(self) -> str:
        if self.evaluated_on:
            return (f"{len(self.discovery)} discovery items (the case's) and {len(self.evaluation)} evaluation items "
                    f"({self.evaluated_on})")
        return (f"{len(self.discovery)} discovery and {len(self.evaluation)} evaluation items (holdout "
                f"{self.holdout:g}, seed {self.seed}, stratified by {self.stratified_by}, each item's prompts in every "
                "format on one side)")


def evaluation_choice(holdout, eval_items, folds=None, *, default: float | None = None) -> float | None:
    """A Python call's held-out options checked and resolved, as every function reads them: `holdout`, `eval_items`
    and `folds` are three ways to choose the evaluation items (at most one is given); `holdout=0` holds none out (every
    item, in-sample: None is returned), a share outside [0, 1) is refused. With none given: `default` (0.5 where
    a result is only ever measured held out, the repair's and the report's)."""
    given = [n for n, v in (("holdout", holdout), ("eval_items", eval_items), ("folds", folds)) if v is not None]
    if len(given) > 1:
        raise AnalysisError(f"{given[0]} and {given[1]} are two ways to choose the evaluation items", field=given[1],
                            fix="give one: holdout=FRAC (a share of the case's items), eval_items (other items) or "
                                "folds=K")
    if holdout is None:
        return default if not given else None
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 <= holdout < 1:
        raise AnalysisError(f"holdout {holdout!r} is not a share in [0, 1)", field="holdout",
                            fix="the share of items held out for evaluation, e.g. 0.5; 0 holds none out (in-sample)")
    return float(holdout) or None


def split_items(items: Sequence[Item], holdout: float, seed: int = 0) -> Split:
    """A seeded split: in each tag, round(holdout x n) items (at least one where the tag has two or more) go to the
    evaluation side, the rest to discovery. Refused when either side would have fewer than MIN_PER_SPLIT items."""
    if not 0 < holdout < 1:
        raise AnalysisError(f"holdout {holdout} is not in (0, 1)", field="--holdout",
                            fix="the share of items held out for evaluation, e.g. 0.5")
    by_tag = tag_indices(items)
    rng = random.Random(seed)
    disc, ev = [], []
    for tag in sorted(by_tag):
        idx = list(by_tag[tag])
        rng.shuffle(idx)
        k = int(round(holdout * len(idx)))
        if len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        ev += idx[:k]
        disc += idx[k:]
    if min(len(disc), len(ev)) < MIN_PER_SPLIT:
        raise AnalysisError(f"{len(items)} items split at holdout {holdout:g} give {len(disc)} discovery and {len(ev)} "
                            f"evaluation items; each side needs at least {MIN_PER_SPLIT}", field="--holdout",
                            fix="add items to the case, or evaluate on other items (surgeon threshold --eval)")
    return Split(tuple(sorted(disc)), tuple(sorted(ev)), holdout, seed)


def eval_items_of(case: Case, spec, seed: int = 0) -> tuple[list[Item], str]:
    """(items, where they came from) for `--eval-items SPEC`: a number N (N fresh items from the case's `draw`, seed
    1 + `seed`, none equal to one of its items), the path of another case file (its items, checked against this
    case's formats), or a list of Items."""
    from pathlib import Path

    if isinstance(spec, (list, tuple)):
        items = list(spec)
        validate(replace(case, items=items, draw=None))
        return items, f"{len(items)} items given"
    text = str(spec).strip()
    if text.isdigit():
        items = fresh_items(case, int(text), seed + 1)
        return items, f"{len(items)} fresh items from the case's draw, seed {seed + 1}"
    path = Path(text).expanduser()
    if not path.is_file():
        raise AnalysisError(f"--eval-items {text!r} is neither a number of fresh items nor a case file", field="--eval-items",
                            fix="give a number (fresh items from the case's draw) or the path of a case file whose items "
                                "fit this case's formats")
    items = list(read_case(path).items)
    validate(replace(case, items=items, draw=None), str(path))
    return items, f"the {len(items)} items of {path.name}"


def _prompt_key(it: Item) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in it.values.items()))


def eval_split(case: Case, tag: str | None, holdout: float | None, seed: int, eval_items=None):
    """(Split, discovery items, evaluation items) of the items with `tag`: a seeded split of them, or all of them for
    discovery and `eval_items` (`eval_items_of`'s spec) for evaluation."""
    tag, items = pick_items(case, tag)
    if eval_items is None:
        split = split_items(items, holdout if holdout is not None else 0.5, seed)
        return split, [items[i] for i in split.discovery], [items[i] for i in split.evaluation]
    ev, where = eval_items_of(case, eval_items, seed)
    ev = [it for it in ev if tag is None or it.tag == tag]
    # an evaluation item whose prompt is a discovery item's (the same values) is not held out: left out, and said
    seen = {_prompt_key(it) for it in items}
    same = sum(_prompt_key(it) in seen for it in ev)
    if same:
        ev = [it for it in ev if _prompt_key(it) not in seen]
        where += f", {same} whose prompt is a discovery item's left out"
    if len(ev) < MIN_PER_SPLIT:
        why = (f" ({same} more repeat a discovery item's prompt, so they are not held out)" if same else "")
        raise AnalysisError(f"{len(ev)} evaluation items{f' with tag {tag!r}' if tag else ''}{why}; at least "
                            f"{MIN_PER_SPLIT} are needed", field="--eval-items",
                            fix="give items whose prompts the case's own items do not have" if same else
                            "ask for more items")
    split = Split(tuple(range(len(items))), tuple(range(len(ev))), 0.0, seed, "", evaluated_on=where)
    return split, list(items), ev


@dataclass(frozen=True)
class SubsetRate:
    """A named head subset patched from the good format into the failing one on some items."""

    subset: tuple[str, ...]
    rate: Estimate  # fraction of items right when patched (Wilson 95% interval over items)
    mean_score: float
    repair_fraction: float  # (patched mean - failing mean) / (good mean - failing mean)


class SubsetRunner:
    """Head subsets patched from the good format into the failing one on one set of items, as the subset search
    patches them: one Contrast, every subset a row of the batched mask, `chunk` subsets per run."""

    def __init__(self, case: Case, model, layers, *, component: str = "z", bad: str | None = None,
                 tag: str | None = None, batch_size: int = 256, chunk: int = 256):
        self.sites = {L: Site.of(component, L) for L in sorted(set(layers)) or [0]}
        self.contrast, _ = make_contrast(case, model, bad=bad, tag=tag, batch_size=batch_size,
                                         sites=list(self.sites.values()))
        self.chunk = chunk

    def scores(self, subsets) -> np.ndarray:
        """Item scores [len(subsets), items]; each subset a list of `Unit`s (empty: the failing run as it is)."""
        import torch

        out = []
        for start in range(0, len(subsets), self.chunk):
            part = subsets[start:start + self.chunk]
            masks = {}
            for L, site in self.sites.items():
                m = torch.zeros(len(part), self.contrast.units(site))
                for p, us in enumerate(part):
                    for u in us:
                        if u.layer == L:
                            m[p, u.head] = 1.0
                masks[site] = m
            with torch.no_grad():
                out.append(self.contrast.run(masks).cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.contrast.n_items))

    def rates(self, subsets) -> list[SubsetRate]:
        """Each subset (a list of `Unit`s) patched: its rate of items right and repair fraction."""
        return _rates(self, subsets, self.scores(subsets))


def evaluate_subsets(case: Case, model, subsets: Sequence[str | Sequence[str]], *, component: str = "z",
                     bad: str | None = None, tag: str | None = None, batch_size: int = 256) -> list[SubsetRate]:
    """Each named subset ("L0H4,L0H6", or a list of labels; "" is none: the failing run as it is) patched alone, as
    the subset search patches: one batched run of the case's items (`tag`), the rate of items right and the repair
    fraction."""
    names = [s if isinstance(s, str) else ",".join(s) for s in subsets]
    if not names:
        raise AnalysisError("no subset to evaluate", field="--eval", fix="name heads, e.g. --eval L0H4,L0H6")
    n_units = Site.of(component, 0).n_units(model.cfg)
    try:
        units = [parse_units(n, None, model.cfg.n_layers, n_units) if n.strip() else [] for n in names]  # "": none
    except AnalysisError as e:  # the subsets are named by --eval here, not --heads
        raise AnalysisError(e.message, field="--eval", fix=e.fix) from None
    run = SubsetRunner(case, model, [u.layer for us in units for u in us], component=component, bad=bad, tag=tag,
                        batch_size=batch_size)
    return _rates(run, units, run.scores(units))


def _rates(run: SubsetRunner, units, scores) -> list[SubsetRate]:
    c = run.contrast
    base, good = float(c.clean_base.mean()), float(c.clean_source.mean())
    right = run.contrast.metric.right(scores)
    out = []
    for p, us in enumerate(units):
        mean = float(scores[p].mean())
        frac = (mean - base) / (good - base) if abs(good - base) > 1e-12 else float("nan")
        out.append(SubsetRate(tuple(u.label for u in us), wilson(int(right[p].sum()), int(right.shape[1])), mean, frac))
    return out


@dataclass(frozen=True)
class HeldOutRow:
    family: str
    k: int
    subset: tuple[str, ...]  # the best subset of this size on the discovery items (ties: the first evaluated)
    discovery: Estimate  # its rate on the discovery items: in-sample (it was chosen there)
    held_out: Estimate  # its rate on the evaluation items


@dataclass(frozen=True)
class HeldOutKStar:
    """A family's k* (the smallest size at which at least x of the subsets repair) on the discovery items and on the
    evaluation items. The held-out fractions are the search's own subsets of each size re-evaluated on the
    evaluation items (no new choice): from the discovery k*, down while the size below still reaches x, else up until
    a size does; so k* - 1 and k* at the least, and every size between the two k* where they differ. Where the
    fraction repairing grows with k (it does wherever a superset of a repairing subset repairs) this is the smallest
    such k on the evaluation items."""

    family: str
    x: float
    discovery: int | None  # in-sample
    held_out: int | None  # None: no size evaluated reached x (or none reached it on the discovery items)
    sizes: dict[int, Estimate] = field(default_factory=dict)  # k -> the share of its subsets repairing, held out
    discovery_sizes: dict[int, Estimate] = field(default_factory=dict)  # the same sizes on the discovery items


@dataclass
class HeldOutThreshold(Shows):
    """The subset search on the discovery items (in-sample) and, per family and size, its best subset evaluated on
    the evaluation items (held-out, the headline), with each family's k* on both."""

    case: str
    split: Split
    search: ThresholdResult  # on the discovery items: every number in it is in-sample
    rows: list[HeldOutRow] = field(default_factory=list)
    n_discovery: int = 0
    n_evaluation: int = 0
    k_star: list[HeldOutKStar] = field(default_factory=list)

    def row(self, family: str, k: int) -> HeldOutRow:
        return next(r for r in self.rows if r.family == family and r.k == k)

    def threshold(self, family: str) -> HeldOutKStar:
        return next(t for t in self.k_star if t.family == family)


def threshold_heldout(case: Case, model, *, holdout: float = 0.5, seed: int = 0, tag: str | None = None,
                      bad: str | None = None, component: str = "z", batch_size: int = 256, out=None,
                      eval_items=None, _discovery=None, _split=None, **search) -> HeldOutThreshold:
    """The subset search (`threshold_search`, with `search`'s options) on a seeded discovery split of the items, each
    family's best subset per size evaluated on the held-out items, and each family's k* on them (`HeldOutKStar`)."""
    if _discovery is not None:  # cross-validation: the fold's split, given
        split, disc, ev = _split, list(_discovery), list(eval_items)
    else:
        split, disc, ev = eval_split(case, tag, holdout, seed, eval_items)
    disc_case, eval_case = replace(case, items=disc, focus=None), replace(case, items=ev, focus=None)
    with tempfile.TemporaryDirectory(prefix="surgeon-heldout-") as tmp:
        found = threshold_search(disc_case, model, bad=bad, tag=None, component=component, batch_size=batch_size,
                                 seed=seed, out=out or tmp, **search)
        rates = per_subset(out or tmp)
    plan = plan_from_options(found.options)
    units = list(plan.units)
    labels = [u.label for u in units]
    members = lambda m: [units[i] for i in range(len(units)) if (m >> i) & 1]  # noqa: E731
    picks = []
    for fam in plan.families:
        ev_masks = [m for m in fam.masks if m in rates]
        if not ev_masks:
            continue
        best = max(ev_masks, key=lambda m: rates[m][0])  # max keeps the first of ties, in the plan's order
        picks.append((fam.name, fam.key[0], best, rates[best][0]))
    run = SubsetRunner(eval_case, model, [u.layer for u in units], component=component, bad=bad,
                        batch_size=batch_size)
    chosen = [members(p[2]) for p in picks]
    evaluated = _rates(run, chosen, run.scores(chosen)) if picks else []
    n_d = len(split.discovery)
    rows = [HeldOutRow(fam, k, tuple(labels[i] for i in range(len(labels)) if (m >> i) & 1),
                       wilson(int(round(rate * n_d)), n_d), e.rate)
            for (fam, k, m, rate), e in zip(picks, evaluated)]
    k_star = [_held_out_k_star(run, plan, found, t, rates, members) for t in found.thresholds]
    return HeldOutThreshold(case.name, split, found, rows, n_d, len(split.evaluation), k_star)


def _held_out_k_star(run: SubsetRunner, plan, found: ThresholdResult, t, rates: dict, members) -> HeldOutKStar:
    """`HeldOutKStar` of family `t.family` (see there): the walk from the discovery k*."""
    by_k = {f.key[0]: f for f in plan.families if f.name == t.family and len(f.key) == 1}
    item_rate = found.item_rate
    held: dict[int, Estimate] = {}
    disc: dict[int, Estimate] = {}

    def share(k: int) -> float:
        if k not in held:
            fam = by_k[k]
            masks = [m for m in fam.masks if m in rates]  # the subsets the search evaluated
            right = run.contrast.metric.right(run.scores([members(m) for m in masks])) if masks else np.zeros((0, 1), bool)
            n_rep = int((right.mean(axis=1) >= item_rate - 1e-12).sum()) if masks else 0
            exact = fam.enumerated and len(masks) == len(fam.masks)
            held[k] = _share(n_rep, len(masks), exact)
            d_rep = sum(rates[m][0] >= item_rate - 1e-12 for m in masks)
            disc[k] = _share(int(d_rep), len(masks), exact)
        return held[k].value

    k = t.k_star
    if k is None or k not in by_k:
        return HeldOutKStar(t.family, t.x, t.k_star, None)
    if share(k) >= t.x:
        while k - 1 in by_k and share(k - 1) >= t.x:
            k -= 1
    else:
        while k + 1 in by_k:
            k += 1
            if share(k) >= t.x:
                break
        else:
            k = None
    return HeldOutKStar(t.family, t.x, t.k_star, k, dict(sorted(held.items())), dict(sorted(disc.items())))


def _share(n_rep: int, n: int, exact: bool) -> Estimate:
    """The share of `n` subsets that repair: exact where they are every subset of the size, else Wilson's interval."""
    if exact and n:
        v = n_rep / n
        return Estimate(v, v, v, n, "exact (every subset)")
    return wilson(n_rep, n)


@dataclass
class HeldOutCircuit(Shows):
    """The circuit found on the discovery items (its faithfulness there is in-sample: the circuit was pruned to reach
    the target on them) and its faithfulness on the held-out items (the result), under the same ablation, semantics
    and direction (MIB's circuit-localization protocol: find on a train split, score on a test split)."""

    case: str
    split: Split
    search: CircuitResult  # on the discovery items: every number in it is in-sample
    held_out: dict  # `evaluate_circuit` of the found circuit on the evaluation items
    n_discovery: int = 0
    n_evaluation: int = 0
    # the discovery ranking's faithfulness curve (its top-k edges at MIB's fractions) on the evaluation items
    curve: list = field(default_factory=list)
    cpr: float = float("nan")
    cmd: float = float("nan")


def circuit_heldout(case: Case, model, *, holdout: float = 0.5, seed: int = 0, tag: str | None = None,
                    bad: str | None = None, batch_size: int = 256, eval_items=None, **found) -> HeldOutCircuit:
    """`discover` (with `found`'s options) on a seeded discovery split of the items, and the circuit it prunes
    evaluated on the held-out items under the same ablation, semantics and direction."""
    split, disc, ev = eval_split(case, tag, holdout, seed, eval_items)
    label = pick_items(case, tag)[0] or "all"  # the discovery items are all of this tag: the result says which
    r = discover(replace(case, items=disc, focus=None), model, bad=bad, tag=label, batch_size=batch_size, **found)
    eval_case = replace(case, items=ev, focus=None)
    held = evaluate_circuit(eval_case, model, r.names(r.circuit), ablation=r.ablation,
                            semantics=r.options.get("semantics"), direction=r.direction, bad=bad, tag=None,
                            batch_size=batch_size)
    runs = circuit_runs(eval_case, model, EdgeSite.of(model.cfg, r.ablation), semantics=held["semantics"],
                        direction=r.direction, bad=bad, tag=None, batch_size=batch_size)
    order = np.argsort(-np.abs(np.asarray(r.scores, dtype=float)), kind="stable")  # the discovery items' ranking
    _, _, curve, cpr, cmd = faithfulness_curve(runs, order)
    return HeldOutCircuit(case.name, split, r, held, len(split.discovery), len(split.evaluation),
                          [float(v) for v in curve], float(cpr), float(cmd))


@dataclass(frozen=True)
class HeldOutUnit:
    unit: str  # "L0H6"
    rank: int  # its rank on the discovery items (1: repairs most)
    discovery: Estimate  # its repair fraction there: in-sample (the ranking was made there)
    held_out: Estimate  # its repair fraction on the evaluation items


@dataclass
class HeldOutPatch(Shows):
    """Per-head patching on the discovery items, and its top units (ranked there) patched on the evaluation items:
    their held-out repair fractions are the result; the rank correlation over every unit says how well the ranking
    carries over."""

    case: str
    split: Split
    search: PatchResult  # on the discovery items: in-sample
    held: PatchResult  # every unit on the evaluation items
    top: list[HeldOutUnit] = field(default_factory=list)
    spearman: float = float("nan")  # between the discovery and held-out repair fractions of every unit
    n_discovery: int = 0
    n_evaluation: int = 0


def patch_heldout(case: Case, model, *, holdout: float = 0.5, seed: int = 0, tag: str | None = None,
                  bad: str | None = None, top: int = 10, eval_items=None, **patch) -> HeldOutPatch:
    """`patch_heads` (with `patch`'s options) on a seeded discovery split of the items and on the held-out items;
    the `top` units by discovery repair fraction, with their held-out fractions (the result), and the Spearman
    correlation of the two over every unit. The held-out sweep is one more per-head sweep on the held-out items."""
    split, disc, ev = eval_split(case, tag, holdout, seed, eval_items)
    found = patch_heads(replace(case, items=disc, focus=None), model, bad=bad, tag=None, **patch)
    held = patch_heads(replace(case, items=ev, focus=None), model, bad=bad, tag=None, **patch)
    d = np.nan_to_num(np.asarray(found.fraction, dtype=float), nan=-np.inf)
    order = np.argsort(-d, axis=None, kind="stable")[:top]
    rows = []
    for rank, flat in enumerate(order, 1):
        li, u = np.unravel_index(int(flat), d.shape)
        est = lambda r: Estimate(float(r.fraction[li, u]), float(r.fraction_lo[li, u]), float(r.fraction_hi[li, u]),  # noqa: E731
                                 r.n_items, "bootstrap")
        rows.append(HeldOutUnit(f"L{found.layers[li]}H{u}", rank, est(found), est(held)))
    a, b = np.asarray(found.fraction, dtype=float).ravel(), np.asarray(held.fraction, dtype=float).ravel()
    ok = np.isfinite(a) & np.isfinite(b)
    rho = float(np.corrcoef(_ranks(a[ok]), _ranks(b[ok]))[0, 1]) if ok.sum() > 2 else float("nan")
    return HeldOutPatch(case.name, split, found, held, rows, rho, len(split.discovery), len(split.evaluation))


@dataclass(frozen=True)
class HeldOutFeatureDirection:
    direction: str  # denoise | noise
    nodes: int  # the circuit's nodes (chosen on the discovery items)
    faithfulness: Estimate  # on the evaluation items: the result
    completeness: Estimate
    discovery_faithfulness: Estimate  # where it was chosen: in-sample
    discovery_completeness: Estimate
    # the circuit's edges verified exactly on the discovery items, each verified again on the evaluation items:
    # (upstream node, downstream node, its exact effect there (in-sample), its effect held out), fractions of the gap
    edges: list[tuple[int, int, float, Estimate]] = field(default_factory=list)


@dataclass
class HeldOutFeatureCircuit(Shows):
    """The feature circuits found on the discovery items (every number in `search` in-sample) and, on the evaluation
    items, each direction's circuit kept and ablated (faithfulness and completeness, Marks et al.'s definitions) and
    the repair the two circuits' difference suggests (its rate of items right when patched): the result."""

    case: str
    split: Split
    search: FeatureCircuitResult
    directions: list[HeldOutFeatureDirection] = field(default_factory=list)
    repair_rate: Estimate | None = None  # the difference's nodes patched on the evaluation items
    repair_base: Estimate | None = None  # those items right unpatched
    n_discovery: int = 0
    n_evaluation: int = 0


def feature_circuit_heldout(case: Case, model, saes: dict, *, holdout: float = 0.5, seed: int = 0,
                            tag: str | None = None, bad: str | None = None, batch_size: int = 256, eval_items=None,
                            **found) -> HeldOutFeatureCircuit:
    """`feature_circuit` (with `found`'s options) on a seeded discovery split of the items, and what it chose (each
    direction's circuit; the repair of the difference) run on the held-out items: the forward passes of those node
    sets only."""
    split, disc, ev = eval_split(case, tag, holdout, seed, eval_items)
    r = feature_circuit(replace(case, items=disc, focus=None), model, saes, bad=bad, tag=None, batch_size=batch_size,
                        **found)
    eval_case = replace(case, items=ev, focus=None)
    sites = [FeatureSite.of(saes[layer], error=True) for layer in sorted(saes)]
    rows, repair_rate, repair_base = [], None, None
    for name, d in r.directions.items():
        contrast, _ = make_contrast(eval_case, model, bad=bad, direction=name, batch_size=batch_size,
                                    sites=[Site.coerce(x.hook) for x in sites])
        S = contrast.n_slots if found.get("by_position") else None
        base = contrast.clean_base.double().cpu().numpy()
        everything = run_nodes(contrast, sites, [list(range(len(r.nodes)))], S=S)[0]
        kept = run_nodes(contrast, sites, [d.circuit], complement=True, S=S)[0]
        ablated = run_nodes(contrast, sites, [d.circuit], S=S)[0]
        source = contrast.clean_source.double().cpu().numpy()
        verified = [(e.up, e.down, e.exact.value) for e in d.edges if e.exact is not None]
        again = verify_edges(contrast, sites, r.nodes, [(u, v) for u, v, _ in verified], S) if verified else {}
        edges = [(u, v, x, fraction_estimate(again[(u, v)], base, source)) for u, v, x in verified]
        rows.append(HeldOutFeatureDirection(name, len(d.circuit), fraction_estimate(kept, everything, base),
                                            fraction_estimate(ablated, everything, base), d.faithfulness, d.completeness,
                                            edges))
        if name == "denoise" and r.repair.nodes:
            patched = run_nodes(contrast, sites, [r.repair.nodes], S=S)[0]
            right = contrast.metric.right_above
            repair_rate = wilson(int((patched > right).sum()), len(patched))
            repair_base = wilson(int((base > right).sum()), len(base))
    return HeldOutFeatureCircuit(case.name, split, r, rows, repair_rate, repair_base, len(split.discovery),
                                 len(split.evaluation))


@dataclass(frozen=True)
class HeldOutFeatures:
    features: tuple[int, ...]  # SAE features chosen on the discovery items
    discovery: float  # their repair fraction there: in-sample
    held_out: Estimate  # their repair fraction on the evaluation items (bootstrap 95% interval)
    rate: Estimate  # items right there when patched (Wilson)


@dataclass
class HeldOutFeatureRepair(Shows):
    """`sae repair` on the discovery items (every number in `search` in-sample): the top features by attribution,
    each alone and all together, patched on the evaluation items (the result)."""

    case: str
    split: Split
    search: FeatureRepairResult
    rows: list[HeldOutFeatures] = field(default_factory=list)
    n_discovery: int = 0
    n_evaluation: int = 0


def sae_repair_heldout(case: Case, model, sae, *, holdout: float = 0.5, seed: int = 0, tag: str | None = None,
                       bad: str | None = None, batch_size: int = 256, eval_items=None, **found) -> HeldOutFeatureRepair:
    """`feature_repair` (with `found`'s options) on a seeded discovery split of the items, and the features it chose
    (each alone, then all of them) patched on the held-out items."""
    import torch

    split, disc, ev = eval_split(case, tag, holdout, seed, eval_items)
    r = feature_repair(replace(case, items=disc, focus=None), model, sae, bad=bad, tag=None, batch_size=batch_size,
                       **found)
    fs = FeatureSite.of(sae)
    contrast, _ = make_contrast(replace(case, items=ev, focus=None), model, bad=bad,
                                direction=found.get("direction", "denoise"), batch_size=batch_size,
                                sites=[Site.coerce(fs.hook)])
    chosen = [int(j) for j, _, _ in r.top]
    sets = [[j] for j in chosen] + ([chosen] if len(chosen) > 1 else [])
    disc_frac = [float(s) for _, _, s in r.top] + ([float("nan")] if len(chosen) > 1 else [])
    mask = torch.zeros(len(sets), fs.n_units())
    for i, js in enumerate(sets):
        mask[i, js] = 1.0
    with torch.no_grad():
        scores = contrast.run({fs: mask}).double().cpu().numpy()
    base, source = contrast.clean_base.double().cpu().numpy(), contrast.clean_source.double().cpu().numpy()
    right = contrast.metric.right_above
    rows = [HeldOutFeatures(tuple(js), d, fraction_estimate(sc, base, source), wilson(int((sc > right).sum()), len(sc)))
            for js, d, sc in zip(sets, disc_frac, scores)]
    return HeldOutFeatureRepair(case.name, split, r, rows, len(split.discovery), len(split.evaluation))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share theirs), for Spearman's correlation."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):
        same = x == v
        ranks[same] = ranks[same].mean()
    return ranks


def fold_items(items: Sequence[Item], folds: int, seed: int = 0) -> list[tuple[int, ...]]:
    """K seeded folds of `items`, stratified by tag (each tag's items dealt round-robin after a seeded shuffle), each
    with at least MIN_PER_SPLIT items and leaving at least MIN_PER_SPLIT outside it."""
    if not isinstance(folds, int) or folds < 2:
        raise AnalysisError(f"--folds {folds!r}: cross-validation needs at least 2 folds", field="--folds",
                            fix="e.g. --folds 5")
    by_tag = tag_indices(items)
    rng = random.Random(seed)
    out: list[list[int]] = [[] for _ in range(folds)]
    start = 0
    for tag in sorted(by_tag):
        idx = list(by_tag[tag])
        rng.shuffle(idx)
        for j, i in enumerate(idx):
            out[(start + j) % folds].append(i)
        start += len(idx)
    if min(len(f) for f in out) < MIN_PER_SPLIT or len(items) - max(len(f) for f in out) < MIN_PER_SPLIT:
        raise AnalysisError(f"{len(items)} items in {folds} folds leave a fold with {min(len(f) for f in out)}; each fold "
                            f"needs at least {MIN_PER_SPLIT}", field="--folds", fix="use fewer folds, or add items")
    return [tuple(sorted(f)) for f in out]


@dataclass(frozen=True)
class FoldRow:
    family: str
    k: int
    subsets: dict  # "L0H4+L0H6" -> in how many folds it was the best of its size (on that fold's discovery items)
    held_out: list  # per fold, the best subset's rate on the fold's own (held-out) items
    held_out_mean: float
    best: list = field(default_factory=list)  # per fold, its best subset (labels)


@dataclass
class FoldsThreshold(Shows):
    """The subset search cross-validated: per fold the search on the other folds' items, each family's best subset
    per size evaluated on the fold's items; how often each subset is the best of its size, k* per fold (on the
    discovery items, in-sample), and the held-out rates per fold."""

    case: str
    folds: int
    seed: int
    n_items: int
    fold_sizes: list
    k_star: dict  # family -> [k* per fold], on each fold's discovery items (in-sample)
    rows: list = field(default_factory=list)
    k_star_held_out: dict = field(default_factory=dict)  # family -> [k* per fold on the fold's own items]


def threshold_folds(case: Case, model, *, folds: int = 5, seed: int = 0, tag: str | None = None,
                    bad: str | None = None, component: str = "z", batch_size: int = 256, **search) -> FoldsThreshold:
    """K-fold cross-validation of the subset search (`--folds K`): K searches, each followed by the forward passes of
    its best subsets on the held-out fold."""
    tag, items = pick_items(case, tag)
    parts = fold_items(items, folds, seed)
    per: dict[tuple[str, int], list] = {}
    kstar: dict[str, list] = {}
    kstar_held: dict[str, list] = {}
    for f, held in enumerate(parts):
        ev = set(held)
        disc = tuple(i for i in range(len(items)) if i not in ev)
        split = Split(disc, held, 1 / folds, seed, "tag", evaluated_on=f"fold {f + 1} of {folds}")
        r = _heldout_on(case, model, items, split, tag=tag, bad=bad, component=component, batch_size=batch_size,
                        seed=seed, **search)
        for t in r.search.thresholds:
            kstar.setdefault(t.family, []).append(t.k_star)
        for t in r.k_star:
            kstar_held.setdefault(t.family, []).append(t.held_out)
        for row in r.rows:
            per.setdefault((row.family, row.k), []).append(row)
    rows = []
    for (fam, k), got in per.items():
        counts: dict[str, int] = {}
        for row in got:
            name = "+".join(row.subset) or "(none)"
            counts[name] = counts.get(name, 0) + 1
        rates = [row.held_out.value for row in got]
        rows.append(FoldRow(fam, k, dict(sorted(counts.items(), key=lambda kv: -kv[1])), rates,
                            float(sum(rates) / len(rates)), [list(row.subset) for row in got]))
    return FoldsThreshold(case.name, folds, seed, len(items), [len(p) for p in parts], kstar, rows, kstar_held)


@dataclass
class FoldsCircuit(Shows):
    """The circuit cross-validated: per fold found on the other folds' items and its faithfulness measured on the
    fold's; how often each edge is selected, and the sizes and held-out faithfulness per fold."""

    case: str
    folds: int
    seed: int
    n_items: int
    fold_sizes: list
    sizes: list  # per fold, the circuit's edges
    held_out: list  # per fold, its faithfulness (or share removed) on the fold's items
    in_sample: list  # per fold, on its discovery items (where it was pruned)
    edges: dict  # edge name -> in how many folds' circuits it is
    semantics: str = "kept"
    circuits: list = field(default_factory=list)  # per fold, its circuit's edge names


def circuit_folds(case: Case, model, *, folds: int = 5, seed: int = 0, tag: str | None = None, bad: str | None = None,
                  batch_size: int = 256, **found) -> FoldsCircuit:
    """K-fold cross-validation of circuit discovery (`surgeon circuit --folds K`)."""
    tag, items = pick_items(case, tag)
    parts = fold_items(items, folds, seed)
    sizes, held, ins, freq, sem, circuits = [], [], [], {}, "kept", []
    for part in parts:
        ev = set(part)
        disc = [items[i] for i in range(len(items)) if i not in ev]
        r = discover(replace(case, items=disc, focus=None), model, bad=bad, tag=None, batch_size=batch_size, **found)
        sem = r.options.get("semantics") or "kept"
        h = evaluate_circuit(replace(case, items=[items[i] for i in part], focus=None), model, r.names(r.circuit),
                             ablation=r.ablation, semantics=sem, direction=r.direction, bad=bad, tag=None,
                             batch_size=batch_size)
        sizes.append(len(r.circuit))
        held.append(float(h["faithfulness"]))
        ins.append(float(r.circuit_faithfulness))
        circuits.append(r.names(r.circuit))
        for name in r.names(r.circuit):
            freq[name] = freq.get(name, 0) + 1
    return FoldsCircuit(case.name, folds, seed, len(items), [len(p) for p in parts], sizes, held, ins,
                        dict(sorted(freq.items(), key=lambda kv: (-kv[1], kv[0]))), sem, circuits)


def _heldout_on(case: Case, model, items, split: Split, *, tag, bad, component, batch_size, seed, **search):
    """`threshold_heldout` on a given split of `items`."""
    disc = [items[i] for i in split.discovery]
    ev = [items[i] for i in split.evaluation]
    return threshold_heldout(case, model, seed=seed, bad=bad, component=component, batch_size=batch_size,
                             eval_items=ev, _discovery=disc, _split=split, **search)


__all__ = ["FoldRow", "FoldsCircuit", "FoldsThreshold", "circuit_folds", "fold_items", "threshold_folds", "HeldOutCircuit", "HeldOutFeatureRepair", "HeldOutFeatures", "sae_repair_heldout", "HeldOutFeatureCircuit", "HeldOutFeatureDirection", "feature_circuit_heldout", "HeldOutKStar", "HeldOutPatch", "HeldOutRow", "HeldOutUnit", "patch_heldout", "HeldOutThreshold", "Split", "SubsetRate", "eval_items_of", "eval_split",
           "evaluate_subsets", "split_items", "SubsetRunner",
           "threshold_heldout", "circuit_heldout"]
