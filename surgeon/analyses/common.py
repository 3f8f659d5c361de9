"""What every analysis needs: a case's items encoded for a model, and the contrast between two formats."""
from __future__ import annotations

from typing import Literal

from surgeon.engine.contrast import Contrast
from surgeon.engine.readout import reference_logprobs
from surgeon.errors import AnalysisError, CaseError
from surgeon.sites.nodes import Site
from surgeon.sites.nodes import component as get_component
from surgeon.case.case import Case, case_metric_of
from surgeon.case.select import pick_bad, pick_items
from surgeon.case.encoding import format_rows, prepend_bos

Direction = Literal["denoise", "noise"]
DIRECTIONS = ("denoise", "noise")


def case_metric(case: Case, model, items, batch_size: int = 256):
    """(Metric, reference): the case's metric, and what it compares against (the good format's next-token
    log-probabilities per item, for kl; else None)."""
    metric = case_metric_of(case)
    ref = None
    if metric.reference:
        ref = reference_logprobs(model, format_rows(case, model, case.good, items), batch_size)
    return metric, ref


def make_contrast(case: Case, model, *, bad: str | None = None, direction: Direction = "denoise",
                  tag: str | None = None, batch_size: int = 256, sites=()):
    """The Contrast for a case: base = failing format, source = good format (denoise) or the reverse."""

    if direction not in DIRECTIONS:
        raise AnalysisError(f"unknown direction {direction!r}", field="direction", fix="use denoise or noise")
    bad = pick_bad(case, bad)
    tag, items = pick_items(case, tag)
    base, source, rows_b, rows_s = contrast_rows(case, model, bad, direction, items)
    if all(a.tokens == b.tokens for a, b in zip(rows_b, rows_s)):
        raise AnalysisError(f"formats {bad!r} and {case.good!r} give the same tokens for every item, so there is "
                            f"nothing to patch between them", where=case.source, field="formats",
                            fix="give the failing format a different template (or pick another with --bad)")
    metric, ref = case_metric(case, model, items, batch_size)
    c = Contrast(model, rows_b, rows_s, case.align, batch_size=batch_size, base_name=base, source_name=source,
                 sites=sites, metric=metric, reference=ref)
    return c, dict(base=base, source=source, bad=bad, tag=tag, n_items=len(items), direction=direction,
                   rows=(rows_b, rows_s))


def contrast_rows(case: Case, model, bad: str, direction: Direction, items):
    """(base format, source format, base rows, source rows): denoise runs the failing format `bad` with the good
    one's activations, noise the reverse."""
    base, source = (bad, case.good) if direction == "denoise" else (case.good, bad)
    return base, source, format_rows(case, model, base, items), format_rows(case, model, source, items)


def layer_sites(model, layers, component: str):
    """The layers to examine (all when None), checked against the model, and one site per layer."""

    get_component(component)
    n_layers = model.cfg.n_layers
    layers = tuple(range(n_layers)) if layers is None else tuple(layers)
    for L in layers:
        if not 0 <= L < n_layers:
            raise AnalysisError(f"layer {L} is out of range (the model has layers 0..{n_layers - 1})", field="layers",
                                fix=f"use layers between 0 and {n_layers - 1}")
    return layers, [Site.of(component, L) for L in layers]
