"""Is the failure there? Accuracy and score per format (and item tag), with intervals."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from surgeon.analyses.common import case_metric
from surgeon.analyses.generation import check_generation, generate_format
from surgeon.engine.readout import score_rows
from surgeon.show import Shows
from surgeon.case.case import Case
from surgeon.case.select import pick_bad, pick_items
from surgeon.stats import Estimate, bootstrap_mean, wilson
from surgeon.case.encoding import format_rows


IN_MEMORY = "(given in memory)"  # the model, when the case names none


@dataclass(frozen=True)
class FormatStats:
    format: str
    role: str  # good | bad
    tag: str  # item tag, or "all"
    accuracy: Estimate  # fraction of items the model gets right (the metric's `right`: for most, score > 0)
    score: Estimate  # mean score (the case's metric; default log P(correct) - log P(incorrect))


@dataclass(frozen=True)
class Diagnosis(Shows):
    case: str
    model: str
    good: str
    bad: tuple[str, ...]
    focus: str | None
    stats: tuple[FormatStats, ...]
    reproduced: dict[str, bool]  # per failing format: its accuracy interval lies below the good format's
    generations: tuple = ()  # per format, with generate > 0: greedy continuations and their verdicts
    per_item: tuple = ()  # one dict per item: index, tag, values, answers, and its score in every format
    metric: str = "logprob"  # what the scores measure (surgeon.case.metrics)

    def get(self, fmt: str, tag: str = "all") -> FormatStats:
        return next(s for s in self.stats if s.format == fmt and s.tag == tag)


def diagnose(case: Case, model, *, batch_size: int = 256, generate: int = 0, progress: bool = False) -> Diagnosis:
    """Score every item in every format. The failure is *reproduced* for a failing format when, on the
    focus items (all items if the case names none), its accuracy's 95% interval lies entirely below the
    good format's."""

    formats = [case.good] + list(case.bad_formats)
    if generate:  # refused before any scoring
        check_generation(case, model, case.items_for(case.focus), generate)
    tags = ["all"] + [t for t in case.tags if len(case.tags) > 1 or t == case.focus]
    stats = []
    scores = {}
    metric, ref = case_metric(case, model, case.items, batch_size)
    for fmt in formats:
        s = score_rows(model, format_rows(case, model, fmt, case.items), batch_size,
                       progress=f"scoring {fmt}" if progress else None, metric=metric, reference=ref).cpu().numpy()
        scores[fmt] = s
        for tag in tags:
            sel = np.array([tag == "all" or it.tag == tag for it in case.items])
            x = s[sel]
            stats.append(FormatStats(fmt, "good" if fmt == case.good else "bad", tag,
                                     wilson(int(metric.right(x).sum()), int(x.size)), bootstrap_mean(x)))
    focus = case.focus or "all"
    d = Diagnosis(case.name, case.model or IN_MEMORY, case.good, case.bad_formats, case.focus, tuple(stats), {})
    good = d.get(case.good, focus).accuracy
    reproduced = {b: d.get(b, focus).accuracy.hi < good.lo for b in case.bad_formats}
    gens = ()
    if generate:
        gens = tuple(generate_format(case, model, f, case.items_for(case.focus), generate, batch_size) for f in formats)
    per_item = tuple({"item": i, "tag": it.tag, "values": dict(it.values), "correct": it.correct,
                      "incorrect": it.incorrect, "score": {f: float(scores[f][i]) for f in formats}}
                     for i, it in enumerate(case.items))
    return Diagnosis(case.name, case.model or IN_MEMORY, case.good, case.bad_formats, case.focus, tuple(stats), reproduced, gens,
                     per_item, metric.label)




def failure_check(case: Case, model, *, bad: str | None = None, tag: str | None = None,
                  batch_size: int = 256) -> str | None:
    """Why there is nothing to repair, in words, or None when the failure is there: on the items an analysis
    runs on, the failing format `bad` must be right less often than the good format (its accuracy's 95%
    interval entirely below the good format's, the test `diagnose` calls *reproduced*). Two forward passes."""
    bad = pick_bad(case, bad)
    tag, items = pick_items(case, tag)
    metric, ref = case_metric(case, model, items, batch_size)
    acc = {}
    for fmt in (case.good, bad):
        s = score_rows(model, format_rows(case, model, fmt, items), batch_size, metric=metric, reference=ref)
        x = s.cpu().numpy()
        acc[fmt] = wilson(int(metric.right(x).sum()), int(x.size))
    g, b = acc[case.good], acc[bad]
    if b.hi < g.lo:
        return None
    on = f"the {len(items)} items tagged {tag!r}" if tag else f"all {len(items)} items"
    return (f"the failure is not reproduced on {on}: the failing format {bad!r} is right on "
            f"{100 * b.value:.0f}% [{100 * b.lo:.0f}, {100 * b.hi:.0f}] of them and the good format {case.good!r} on "
            f"{100 * g.value:.0f}% [{100 * g.lo:.0f}, {100 * g.hi:.0f}] (95% intervals overlap or the failing one is "
            f"higher), so repair fractions measure a gap that is not a failure; check with `surgeon diagnose`, "
            f"pick another --bad or --tag, or fix the case's templates")
