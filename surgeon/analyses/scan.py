"""Find where a model fails, not only explain it (`surgeon scan`): formats composed from a grammar of parts
(`surgeon.case.grammar`) scored on the case's items, the worst and best formats and the spread between them, each
part's effect on accuracy with a correction for the many parts tested, and the minimal pair (two formats a part apart
where one works and one fails), confirmed on items none of it was chosen on, and written as a case file.

- **Search.** Every format of the grammar when (formats x discovery items) fits `budget` prompts (exhaustive); else
  successive halving (Jamieson & Talwalkar 2016; FormatSpread samples under a budget with a bandit): rung 0 scores a
  seeded sample of the formats on a few items, each later rung keeps the most extreme half (the lowest and the
  highest quarter by accuracy) and doubles the items, reusing what earlier rungs scored.
- **Work.** All formats' prompts in one batched pass over the distinct prompts: a prompt two formats share (casing of
  an empty cue, ...) and a (format, item) an earlier rung scored run once; prompts that share a long prefix (the
  few-shot examples, an instruction, a chat template) are batched together and the prefix is run once per batch
  (`surgeon.engine.readout.prefix_batches`; `work` counts prompts and token positions).
- **Which part.** A part option's main effect: the mean accuracy of the formats with it minus that of the formats
  with another option of the same part, over rung 0 (every format on the same items), with a bootstrap interval over
  items and its p-value; Holm's correction over every option tested (`surgeon.stats.holm`).
- **Held out.** Formats, parts and the pair are chosen on discovery items (`holdout`, seeded, stratified by tag; or
  every item with `eval_items`); the chosen formats, the pair and every part's effect are measured again on the
  evaluation items, and the printed result is that measure. `holdout=0`: in-sample, and said so.
- Few-shot examples come from items set aside for them (never scored), the same examples in every format.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from surgeon.analyses.heldout import eval_split
from surgeon.case.case import Case, Chat, Item, case_metric_of
from surgeon.case.encoding import encode_rows, prepend_bos
from surgeon.case.grammar import BUDGET, TEXT_PARTS, Composed, Grammar, compose, grammar_of
from surgeon.case.writer import write_case

from surgeon.case.select import pick_items
from surgeon.engine.readout import score_rows
from surgeon.errors import AnalysisError
from surgeon.models.checks import check_case_against_model
from surgeon.show import Shows
from surgeon.stats import Estimate, bootstrap_mean, holm, paired_difference, wilson

MIN_ITEMS = 8  # items per format at rung 0 of successive halving
SHOWN = 5  # worst and best formats reported
ALPHA = 0.05


@dataclass(frozen=True)
class FormatScore:
    """One format on some items: its accuracy (Wilson 95%) and mean score (bootstrap 95%)."""

    name: str
    choice: dict
    template: str  # the template as text (a chat format shown as chat(...))
    n_tokens: float  # mean prompt length in tokens
    accuracy: Estimate
    mean_score: Estimate
    rung: int = 0  # the last rung of successive halving it was scored at (0: exhaustive or first)


@dataclass(frozen=True)
class PartEffect:
    """A part option's main effect on accuracy: formats with it minus formats with another option of the part."""

    part: str
    option: str
    discovery: Estimate
    p: float  # bootstrap p-value on the discovery items
    p_holm: float  # Holm-adjusted over every option tested
    held_out: Estimate | None = None
    p_held_out: float | None = None

    @property
    def chosen(self) -> bool:
        return self.p_holm < ALPHA


@dataclass(frozen=True)
class PartInteraction:
    """Two options of different parts together: (the accuracy of formats with both - with the first alone) - (with
    the second alone - with neither), the difference in differences over the 2 x 2 cells of formats, paired over
    items. Holm's correction runs over every pair tested, a family apart from the main effects."""

    part_a: str
    option_a: str
    part_b: str
    option_b: str
    discovery: Estimate
    p: float
    p_holm: float
    held_out: Estimate | None = None
    p_held_out: float | None = None

    @property
    def chosen(self) -> bool:
        return self.p_holm < ALPHA


@dataclass
class ScanResult(Shows):
    case: str
    model: str
    body: str
    grammar: str  # its parts and options, in words
    dropped: tuple[str, ...]
    n_formats: int  # in the grammar
    search: dict  # method, rungs, budget, formats scored at rung 0, ...
    metric: str
    discovery: tuple[FormatScore, ...]  # every format scored, on discovery items (at its last rung's items)
    held_out: tuple[FormatScore, ...]  # the chosen formats (worst, best, the pair, the case's own) on evaluation items
    effects: tuple[PartEffect, ...]
    pair: dict | None  # the minimal pair: works, fails, differing parts, their held-out accuracies, confirmed
    case_formats: tuple[FormatScore, ...]  # the case's own formats on the evaluation items, for reference
    split: dict  # holdout, seed, discovery / evaluation / shot items, evaluated_on
    work: dict  # prompts scored, distinct prompts run, what a loop of `surgeon diagnose` on the same formats runs
    in_sample: bool = False
    written: str | None = None  # the case file written (`write_case`)
    execution: dict = field(default_factory=dict)
    interactions: tuple[PartInteraction, ...] = ()  # pairs of options of two parts, where all four cells have formats

    def __post_init__(self):
        """A result read back from JSON (`surgeon.load`, a report's reused step): the pair's estimates and chat
        formats as the objects they were."""
        p = self.pair
        if not p:
            return
        for k in ("discovery", "held_out"):
            if isinstance(p.get(k), dict):
                p[k] = {w: Estimate(**{f: e[f] for f in ("value", "lo", "hi", "n", "method") if f in e})
                        if isinstance(e, dict) else e for w, e in p[k].items()}
        for k in ("works_format", "fails_format"):
            t = p.get(k)
            if isinstance(t, dict) and "user" in t:
                p[k] = Chat(t["user"], t.get("system"))

    @property
    def worst(self) -> FormatScore:
        return min(self.held_out or self.discovery, key=lambda f: (f.accuracy.value, f.mean_score.value))

    @property
    def best(self) -> FormatScore:
        return max(self.held_out or self.discovery, key=lambda f: (f.accuracy.value, f.mean_score.value))

    @property
    def spread(self) -> float:
        """Best minus worst accuracy among the formats measured held out (FormatSpread's spread)."""
        return self.best.accuracy.value - self.worst.accuracy.value


def _shown(t) -> str:
    return f"chat(system={t.system!r}, user={t.user!r})" if isinstance(t, Chat) else t


class _Scorer:
    """Scores (format, item) pairs, each distinct prompt once, memoised across rungs and splits."""

    def __init__(self, case: Case, model, items: Sequence[Item], batch_size: int, progress: bool):
        self.case, self.model, self.items = case, model, list(items)
        self.metric = case_metric_of(case)
        self.score_kind = "first_token" if self.metric.decision else case.score
        self.bos = prepend_bos(case, model)
        self.batch_size, self.progress = batch_size, progress
        self.memo: dict[tuple, float] = {}  # (template key, item index) -> score
        self.by_prompt: dict[tuple, float] = {}  # the rows themselves -> score: one run per distinct prompt
        self.lengths: dict[tuple, int] = {}
        self.pairs: set[tuple] = set()  # (format name, item) scored: what a loop over formats would run
        self.run = 0  # distinct prompts the model ran
        self.positions: dict = {}  # token positions run, and those of the prompts run whole (`score_rows`'s work)

    @staticmethod
    def key(t) -> tuple:
        return ("chat", t.user, t.system) if isinstance(t, Chat) else ("text", t)

    def scores(self, formats: Sequence[Composed], item_ids: Sequence[int]) -> np.ndarray:
        """[formats, items] scores."""
        todo: dict[tuple, list] = {}  # rows key -> [(template key, item)]
        rows_of: dict[tuple, list] = {}
        for f in formats:
            k = self.key(f.template)
            for i in item_ids:
                self.pairs.add((f.name, i))
                if (k, i) in self.memo:
                    continue
                rows = encode_rows(f.template, [self.items[i]], self.model.tokenizer, self.bos, self.score_kind,
                                   self.case.answer_end, self.case.combine)
                rk = tuple((r.tokens, r.targets) for r in rows)
                self.lengths[(k, i)] = rows[0].n_prompt
                if rk in self.by_prompt:
                    self.memo[(k, i)] = self.by_prompt[rk]
                    continue
                todo.setdefault(rk, []).append((k, i))
                rows_of[rk] = rows
        if todo:
            flat, keys = [], list(todo)
            for v, rk in enumerate(keys):
                flat += [replace(r, item=v) for r in rows_of[rk]]
            out = score_rows(self.model, flat, self.batch_size, progress="scan" if self.progress else None,
                             metric=self.metric, share_prefixes=True, work=self.positions).cpu().double().numpy()
            self.run += len(keys)
            for v, rk in enumerate(keys):
                self.by_prompt[rk] = float(out[v])
                for ki in todo[rk]:
                    self.memo[ki] = float(out[v])
        return np.array([[self.memo[(self.key(f.template), i)] for i in item_ids] for f in formats])

    def n_tokens(self, f: Composed, item_ids: Sequence[int]) -> float:
        k = self.key(f.template)
        return float(np.mean([self.lengths[(k, i)] for i in item_ids]))


def _interaction(right: np.ndarray, choices: Sequence[dict], a: tuple[str, str], b: tuple[str, str], seed: int):
    """The difference in differences of accuracy between options `a` and `b` (each (part, option)) over formats
    (rows of `right` [formats, items], their parts in `choices`), paired over items: the cells with both, `a` alone,
    `b` alone and neither, each a mean over its formats; (None, 1.0) where a cell has no format."""
    wa = np.array([c.get(a[0]) == a[1] for c in choices])
    wb = np.array([c.get(b[0]) == b[1] for c in choices])
    cells = [wa & wb, wa & ~wb, ~wa & wb, ~wa & ~wb]
    if not all(c.any() for c in cells):
        return None, 1.0
    means = [right[c].mean(0) for c in cells]  # [items] each
    per_item = (means[0] - means[1]) - (means[2] - means[3])
    # paired_difference of [per_item; 0] with the first row "with": the same percentile bootstrap over items
    return paired_difference(np.stack([per_item, np.zeros_like(per_item)]), np.array([True, False]), seed=seed)


def _summary(scorer: _Scorer, f: Composed, s: np.ndarray, item_ids, rung: int = 0) -> FormatScore:
    right = scorer.metric.right(s)
    return FormatScore(f.name, dict(f.choice), _shown(f.template), scorer.n_tokens(f, item_ids),
                       wilson(int(right.sum()), int(s.size)), bootstrap_mean(s), rung)


def check_scan_options(budget: int) -> None:
    """A budget that can score a format at all."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_ITEMS:
        raise AnalysisError(f"budget {budget!r} prompts cannot score a format on {MIN_ITEMS} items", field="budget",
                            fix=f"at least {MIN_ITEMS}, e.g. {BUDGET}")


def scan_formats(case: Case, model, *, grammar: Grammar | None = None, budget: int = BUDGET, tag: str | None = None,
                 holdout: float | None = 0.5, eval_items=None, seed: int = 0, batch_size: int = 256,
                 progress: bool = False) -> ScanResult:
    """Score the grammar's formats on the case's items (`tag`: which; default the case's focus, 'all' every item),
    find the worst and best
    formats, each part's effect, the minimal pair, chosen on discovery items and measured on the evaluation items
    (see the module docstring)."""
    check_scan_options(budget)
    metric = case_metric_of(case)
    if metric.reference:
        raise AnalysisError(f"metric {metric.label!r} compares against the good format, which a scan is looking for",
                            where=case.source, field="metric", fix='scan with metric "logprob", "logit" or "prob"')
    g = grammar or grammar_of(case, model.tokenizer)
    tag, items = pick_items(case, tag)
    items = list(items)
    # few-shot examples: items set aside (a seeded draw, every tag alike), never scored; as many as the most
    # examples of a format that fits the model's context
    order = list(range(len(items)))
    random.Random(f"scan-{seed}").shuffle(order)
    most = max(int(v) for v in g.parts["shots"].values())
    g = _fitting(g, case, model, [items[i] for i in order[:most]], items, seed)
    shot_ids = order[:max(int(v) for v in g.parts["shots"].values())]
    shot_items = [items[i] for i in shot_ids]
    scored = [items[i] for i in range(len(items)) if i not in set(shot_ids)]
    in_sample = not holdout and eval_items is None
    if in_sample:
        disc, ev, where = scored, [], None
        split = None
    else:
        # the evaluation items of the same tag as the scored ones (fresh items from a draw come in every tag)
        split, disc, ev = eval_split(replace(case, items=scored), tag or "all", holdout, seed, eval_items)
        where = split.evaluated_on
    all_items = shot_items + list(disc) + list(ev)  # the scorer's index space
    d_ids = list(range(len(shot_ids), len(shot_ids) + len(disc)))
    e_ids = list(range(len(shot_ids) + len(disc), len(all_items)))
    formats = [compose(g, c, shot_items, seed) for c in g.choices()]
    _check_formats(case, model, formats, all_items)
    scorer = _Scorer(case, model, all_items, batch_size, progress)
    rng = random.Random(f"scan-order-{seed}")
    d_order = list(d_ids)
    rng.shuffle(d_order)

    rung0, right0, n0, method, last, rungs = _search(scorer, formats, d_order, budget, seed)
    discovery = []
    for f in sorted(last):
        r, ids = last[f]
        discovery.append(_summary(scorer, formats[f], scorer.scores([formats[f]], ids)[0], ids, r))
    # compare formats at the deepest rung that holds them all for the extremes
    deepest = max(r for r, _ in last.values())
    finalists = [f for f in sorted(last) if last[f][0] == deepest]
    by = {f: discovery[i] for i, f in enumerate(sorted(last))}
    ranked = sorted(finalists, key=lambda f: (by[f].accuracy.value, by[f].mean_score.value))
    worst, best = ranked[:SHOWN], ranked[::-1][:SHOWN]

    # which part: each option's main effect and each pair's interaction, on rung 0 (Holm over each family)
    tests, effects_d, ps, adj, pairs_t, inter_d, ips, iadj = _part_tests(g, formats, rung0, right0, seed)

    # ----------------------------------------------------------------------------------------- minimal pair
    pair_d = _minimal_pair(formats, rung0, right0, scorer, d_order[:n0], g)

    # ------------------------------------------------------------------------------------------- held out
    held, case_scores = [], []
    ev_ids = e_ids if not in_sample else d_ids
    chosen = list(dict.fromkeys(worst + best + ([pair_d["works"], pair_d["fails"]] if pair_d else [])))
    if not in_sample:
        sc = scorer.scores([formats[f] for f in chosen], ev_ids)
        held = [_summary(scorer, formats[f], row, ev_ids) for f, row in zip(chosen, sc)]
        room = max(0, budget - len(chosen) * len(ev_ids))
        pool = list(rung0)
        if len(pool) * len(ev_ids) > room:  # the effects' formats on the evaluation items, within the budget
            pool = sorted(random.Random(f"scan-eval-{seed}").sample(pool, max(2, room // max(1, len(ev_ids)))))
        right_e = scorer.metric.right(scorer.scores([formats[f] for f in pool], ev_ids)).astype(float)
    own = [Composed({"case format": name}, t) for name, t in (case.formats or {}).items()]
    if own:
        so = scorer.scores(own, ev_ids)
        case_scores = [replace(_summary(scorer, f, row, ev_ids), name=f"case format {f.choice['case format']!r}")
                       for f, row in zip(own, so)]
    effects, interactions = _held_out_tests(formats, pool if not in_sample else [], right_e if not in_sample else None,
                                           tests, effects_d, ps, adj, pairs_t, inter_d, ips, iadj, seed)
    pair = _pair_record(pair_d, formats, chosen, held, in_sample)
    return ScanResult(
        case.name, case.model or "(in memory)", g.body, g.describe(), g.dropped, g.size,
        {"method": method, "budget": budget, "rungs": rungs, "sampled": len(rung0) < len(formats), "seed": seed,
         "effects_over": "rung 0: every format scored on the same items"
         if method == "exhaustive" or len(rung0) == len(formats)
         else f"rung 0: {len(rung0)} formats sampled at random from {len(formats)}, on the same items",
         "held_out_effects_over": None if in_sample else f"{len(pool)} of rung 0's formats"},
        metric.label, tuple(discovery), tuple(held), tuple(effects), pair, tuple(case_scores),
        {"holdout": None if split is None else split.holdout, "seed": seed, "tag": tag or "all",
         "discovery": len(disc), "evaluation": len(ev), "shots": len(shot_ids), "evaluated_on": where},
        {"format_items": len(scorer.pairs), "prompts_run": scorer.run,
         "formats_scored": len({k for k, _ in scorer.pairs}),
         "positions_run": scorer.positions.get("positions", 0),
         "positions_whole": scorer.positions.get("positions_whole", 0),
         "note": "each distinct prompt run once (format_items: the (format, item) scores the result holds, what a "
                 "loop scoring one format at a time runs; prompts_run: the distinct prompts among them); prompts "
                 "sharing a long prefix (few-shot examples, an instruction, a chat template) batched together and "
                 "the prefix run once per batch (positions_run: the token positions run; positions_whole: those of "
                 "the distinct prompts run whole)"},
        in_sample, interactions=tuple(interactions))


def _search(scorer: "_Scorer", formats, d_order: list, budget: int, seed: int):
    """Every format on every discovery item where the budget allows (exhaustive), else successive halving: a seeded
    sample of formats on a few items, then the best and worst quarter of them on twice the items, until the budget
    or the items run out. Returns rung 0's formats and their right/wrong [F0, n0], n0, the method, each format's
    deepest rung and its items, and the rungs' sizes."""
    F, D = len(formats), len(d_order)
    if F * D <= budget:
        rung0, n0, method = list(range(F)), D, "exhaustive"
    else:
        f0 = min(F, max(2, budget // (2 * MIN_ITEMS)))
        n0 = max(MIN_ITEMS, min(D, budget // (2 * f0)))
        rung0 = sorted(random.Random(f"scan-sample-{seed}").sample(range(F), f0)) if f0 < F else list(range(F))
        method = "successive halving"
    s0 = scorer.scores([formats[i] for i in rung0], d_order[:n0])  # [F0, n0]
    right0 = scorer.metric.right(s0).astype(float)
    last: dict[int, tuple[int, list]] = {f: (0, d_order[:n0]) for f in rung0}  # format -> (rung, its items)
    alive, n, rung, rungs = list(rung0), n0, 0, [{"formats": len(rung0), "items": n0}]
    if method != "exhaustive":
        acc = dict(zip(rung0, right0.mean(1)))
        mean = dict(zip(rung0, s0.mean(1)))
        used = len(rung0) * n0  # discovery's distinct (format, item) scores so far
        while len(alive) > 2 * SHOWN and n < D:
            ranked = sorted(alive, key=lambda f: (acc[f], mean[f]))
            q = max(SHOWN, math.ceil(len(ranked) / 4))
            keep = sorted(set(ranked[:q]) | set(ranked[-q:]))
            grow = min(D, 2 * n)
            if used + len(keep) * (grow - n) > budget:  # the next rung would pass the budget: stop here
                break
            alive, used = keep, used + len(keep) * (grow - n)
            n, rung = grow, rung + 1
            s = scorer.scores([formats[i] for i in alive], d_order[:n])
            for f, row in zip(alive, s):
                acc[f], mean[f] = float(scorer.metric.right(row).mean()), float(row.mean())
                last[f] = (rung, d_order[:n])
            rungs.append({"formats": len(alive), "items": n})
    return rung0, right0, n0, method, last, rungs


def _part_tests(g: Grammar, formats, rung0: list, right0: np.ndarray, seed: int):
    """Each option's main effect on accuracy (formats with it minus those with another option of its part, a paired
    bootstrap over items) and each pair of options' interaction, on rung 0, with Holm's adjustment in each family."""
    tests = [(p, o) for p in g.varied for o in g.parts[p]]
    effects_d, ps = [], []
    for k, (p, o) in enumerate(tests):
        w = np.array([formats[f].choice.get(p) == o for f in rung0])
        if w.all() or not w.any():
            effects_d.append(None)
            ps.append(1.0)
            continue
        est, pv = paired_difference(right0, w, seed=seed + k)
        effects_d.append(est)
        ps.append(pv)
    adj = holm(np.array(ps)) if ps else np.array([])
    pairs_t = [(a, b) for i, a in enumerate(tests) for b in tests[i + 1:] if a[0] != b[0]]
    inter_d, ips = [], []
    for k, (a, b) in enumerate(pairs_t):
        est, pv = _interaction(right0, [formats[f].choice for f in rung0], a, b, seed + 5000 + k)
        inter_d.append(est)
        ips.append(pv)
    iadj = holm(np.array(ips)) if ips else np.array([])
    return tests, effects_d, ps, adj, pairs_t, inter_d, ips, iadj


def _held_out_tests(formats, pool: list, right_e, tests, effects_d, ps, adj, pairs_t, inter_d, ips, iadj, seed: int):
    """The effects and interactions chosen on discovery, each measured again on the evaluation items over `pool`'s
    formats (`right_e` their right/wrong; None in-sample)."""
    in_sample = right_e is None
    effects = []
    for k, ((p, o), est) in enumerate(zip(tests, effects_d)):
        if est is None:
            continue
        he, hp = None, None
        if not in_sample:
            w = np.array([formats[f].choice.get(p) == o for f in pool])
            if w.any() and not w.all():
                he, hp = paired_difference(right_e, w, seed=seed + 1000 + k)
        effects.append(PartEffect(p, o, est, float(ps[k]), float(adj[k]), he, hp))
    interactions = []
    for k, ((a, b), est) in enumerate(zip(pairs_t, inter_d)):
        if est is None:
            continue
        he, hp = None, None
        if not in_sample:
            he, hp = _interaction(right_e, [formats[f].choice for f in pool], a, b, seed + 9000 + k)
        interactions.append(PartInteraction(a[0], a[1], b[0], b[1], est, float(ips[k]), float(iadj[k]), he, hp))
    return effects, interactions


def _pair_record(pair_d: dict | None, formats, chosen: list, held: list, in_sample: bool) -> dict | None:
    """The minimal pair as the result records it: its formats' names and templates, held out where measured."""
    pair = None
    if pair_d:
        pair = dict(pair_d)
        pair["works_name"], pair["fails_name"] = formats[pair_d["works"]].name, formats[pair_d["fails"]].name
        pair["works_template"] = _shown(formats[pair_d["works"]].template)
        pair["fails_template"] = _shown(formats[pair_d["fails"]].template)
        pair["works_format"], pair["fails_format"] = formats[pair_d["works"]].template, formats[pair_d["fails"]].template
        if not in_sample:
            hw = next(h for f, h in zip(chosen, held) if f == pair_d["works"])
            hf = next(h for f, h in zip(chosen, held) if f == pair_d["fails"])
            pair["held_out"] = {"works": hw.accuracy, "fails": hf.accuracy}
            pair["confirmed"] = hw.accuracy.lo > hf.accuracy.hi
    return pair


def _minimal_pair(formats: Sequence[Composed], ids: Sequence[int], right: np.ndarray, scorer: _Scorer, items,
                  g: Grammar) -> dict | None:
    """The two formats of rung 0 closest in parts where one works and one fails (the works format's Wilson interval
    lies above the fails format's); among those, the widest gap in accuracy, then the nearest in prompt length
    (equal lengths patch position by position)."""
    n = right.shape[1]
    acc = right.mean(1)
    lo = np.array([wilson(int(round(a * n)), n).lo for a in acc])
    hi = np.array([wilson(int(round(a * n)), n).hi for a in acc])
    toks = np.array([scorer.n_tokens(formats[f], items) for f in ids])
    parts = [p for p in g.parts if g.parts[p]]
    codes = np.array([[list(g.parts[p]).index(formats[f].choice.get(p, next(iter(g.parts[p]))))
                       for p in parts] for f in ids])
    best = None
    for a in range(len(ids)):
        ok = lo[a] > hi  # a works where b fails
        if not ok.any():
            continue
        bs = np.nonzero(ok)[0]
        dist = (codes[bs] != codes[a]).sum(1)
        key = np.stack([dist, -(acc[a] - acc[bs]), np.abs(toks[bs] - toks[a])], 1)
        j = np.lexsort(key.T[::-1])[0]
        cand = (int(dist[j]), -float(acc[a] - acc[bs[j]]), float(abs(toks[bs[j]] - toks[a])), a, int(bs[j]))
        if best is None or cand[:3] < best[:3]:
            best = cand
    if best is None:
        return None
    _, _, dlen, a, b = best
    fa, fb = formats[ids[a]], formats[ids[b]]
    differs = [p for p in parts if fa.choice.get(p) != fb.choice.get(p)]
    return {"works": ids[a], "fails": ids[b], "differs": {p: (fa.choice.get(p), fb.choice.get(p)) for p in differs},
            "length_difference": dlen,
            "discovery": {"works": wilson(int(right[a].sum()), n), "fails": wilson(int(right[b].sum()), n)}}


def _fitting(g: Grammar, case: Case, model, shots: Sequence[Item], items: Sequence[Item], seed: int) -> Grammar:
    """The grammar without the options of `instruction` and `shots` whose prompts cannot fit the model's context (the
    longest option of every other text part, the fewest examples while the instruction is tried, every item), said
    in `dropped`; what still cannot fit is refused by the format check."""
    bos = prepend_bos(case, model)

    def need(choice) -> int:
        f = compose(g2, choice, shots, seed)
        rows = encode_rows(f.template, list(items), model.tokenizer, bos, case.score, case.answer_end, case.combine)
        return max(len(r.tokens) for r in rows)

    g2 = g
    for part in ("instruction", "shots"):
        longest = {p: max(g2.parts[p], key=lambda o: len(str(g2.parts[p][o]))) for p in TEXT_PARTS}
        longest["chat"] = list(g2.parts["chat"])[-1]
        longest["shots"] = min(g2.parts["shots"], key=lambda o: g2.parts["shots"][o])
        options = g2.parts[part]
        keep = {o: v for o, v in options.items() if need({**longest, part: o}) <= model.cfg.n_ctx}
        gone = [o for o in options if o not in keep]
        if gone and keep:
            g2 = replace(g2, parts={**g2.parts, part: keep}, dropped=g2.dropped + (
                f"{part} {', '.join(map(repr, gone))}: its prompts would not fit the model's context of "
                f"{model.cfg.n_ctx} tokens",))
    return g2


def _check_formats(case: Case, model, formats: Sequence[Composed], items: Sequence[Item]) -> None:
    """Every composed format checked as a case format is (placeholders, answers that tokenize, the context length,
    characters the tokenizer lacks), before anything is scored."""
    fmts = {f"scan format {i}": f.template for i, f in enumerate(formats)}
    probe = replace(case, formats=fmts, good=next(iter(fmts)), bad=list(fmts)[1:2] or None, items=list(items),
                    reference=None)
    try:
        check_case_against_model(probe, model)
    except Exception as e:  # name the format by its parts, not its index
        msg = str(getattr(e, "message", e))
        for i, f in enumerate(formats):
            msg = msg.replace(f"'scan format {i}'", f"({f.name})")
        raise AnalysisError(f"a format the grammar composes is not one the model can read: {msg}", where=case.source,
                            field="scan", fix="narrow that part with scan={...} in the case (surgeon.case.grammar)") \
            from None


def write_found(r: ScanResult, case: Case, path) -> ScanResult:
    """The minimal pair as a case file (`surgeon.case.writer`): good the working format, bad the failing one."""
    if r.pair is None:
        raise AnalysisError("the scan found no pair of formats where one works and the other fails, so there is no "
                            "case to write", field="--write-case",
                            fix="widen the grammar (scan= in the case), or scan other items (--tag)")
    p = r.pair
    differs = ", ".join(f"{k} {a!r} (works) / {b!r} (fails)" for k, (a, b) in p["differs"].items())
    held = p.get("held_out")
    measured = (f"held out on {held['works'].n} items: works {100 * held['works'].value:.1f}%, fails "
                f"{100 * held['fails'].value:.1f}%" + ("" if p.get("confirmed") else " (NOT confirmed held out)")
                if held else f"in-sample on {p['discovery']['works'].n} items (no items held out)")
    doc = (f"Written by `surgeon scan` on case {case.name!r}: the minimal pair of formats it found, differing in "
           f"{differs}; {measured}.\n\nworks: {p['works_name']}\nfails: {p['fails_name']}\n")
    out = write_case(path, case, {"works": p["works_format"], "fails": p["fails_format"]}, "works", ["fails"],
                     name=f"{case.name}_scan", description=f"found by surgeon scan: {differs}", doc=doc)
    return replace(r, written=str(out))
