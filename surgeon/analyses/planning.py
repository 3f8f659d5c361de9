"""Memory plans for the analyses: a case's rows and an analysis's engine calls, planned before the work starts.

`plan_patch`, `plan_threshold` and `plan_circuit` predict the peak memory of `patch_heads`, `threshold_search` and
`discover` on this model and case (`surgeon.engine.memory`), pick the largest batch size (at most the one asked for)
that fits `max_memory` (default: the device's free memory, plus what the model's weights already take there), and
refuse with an AnalysisError naming the fix when batch size 1 does not fit. The CLI prints the plan in one line
before the work.
"""
from __future__ import annotations

from surgeon.analyses.common import Direction, contrast_rows
from surgeon.analyses.scoring import EDGE_METHODS
from surgeon.engine import memory
from surgeon.engine.memory import Prediction
from surgeon.sites.edges import EdgeSite
from surgeon.sites.nodes import Site
from surgeon.spec.case import Case
from surgeon.spec.select import pick_bad, pick_items


def graph_size(cfg) -> tuple[int, int]:
    """(senders, edges) of the model's edge graph."""
    site = EdgeSite.of(cfg)
    return len(site.senders), len(site.edges)


def budget_of(model, max_memory: int | str | None) -> int:
    """The bytes a run may use on the model's device, weights included: `max_memory` (bytes or "40GB"), else what
    is free there now plus what the model's weights take."""
    if max_memory is not None:
        return memory.parse_bytes(max_memory) if isinstance(max_memory, str) else int(max_memory)
    device = next(model.parameters()).device
    return memory.free_memory(device) + memory.model_bytes(model)


def plan_jobs(case: Case, model, jobs, *, batch_size: int = 256, max_memory: int | str | None = None,
              bad: str | None = None, direction: Direction = "denoise", tag: str | None = None) -> tuple[Prediction, int]:
    """(the plan, the budget) for `jobs` (`surgeon.engine.memory` jobs) over the case's rows on this model."""
    _, items = pick_items(case, tag)
    *_, rows_b, rows_s = contrast_rows(case, model, pick_bad(case, bad), direction, items)
    budget = budget_of(model, max_memory)
    device = next(model.parameters()).device
    p = memory.plan(model.cfg, rows_b, rows_s, case.align, jobs, batch_size=batch_size, budget=budget,
                    weights=memory.model_bytes(model), device=str(device))
    return p, budget


def plan_patch(case: Case, model, layers=None, component: str = "z", **kw) -> tuple[Prediction, int]:
    """The plan of `patch_heads` (every unit of `component` at each layer alone)."""
    layers = list(range(model.cfg.n_layers)) if layers is None else list(layers)
    units = Site.of(component, layers[0]).n_units(model.cfg)
    return plan_jobs(case, model, [memory.per_head(model.cfg, layers, units)], **kw)


def plan_threshold(case: Case, model, layer: int, n_subsets: int, chunk: int = 256, **kw) -> tuple[Prediction, int]:
    """The plan of a subset search of `n_subsets` subsets at `layer`, in chunks of `chunk`."""
    return plan_jobs(case, model, [memory.subsets(model.cfg, layer, n_subsets, chunk)], **kw)


def plan_circuit(case: Case, model, method: str, ig_steps: int = 5, verify: int = 50, ablation: str = "resample", *,
                 batch_size: int = 256, max_memory: int | str | None = None, bad: str | None = None,
                 direction: Direction = "denoise", tag: str | None = None) -> tuple[Prediction, int]:
    """The plan of `discover`: the edge scores (`method`), the top `verify` edges patched alone, the faithfulness
    curve and the smallest-circuit search (about five batches of 16 circuits), on the runs `circuit_runs` builds:
    under resample ablation the scoring contrast (failing against good) and beside it the reversed one circuits are
    evaluated on, both holding caches; under mean and zero one contrast of the source rows against themselves at
    every position (align="index")."""
    cfg = model.cfg
    graph = graph_size(cfg)
    first = EDGE_METHODS[method].job(cfg, graph, ig_steps)  # the method as it runs (fixed or live senders)
    scoring = [j for j in (first, memory.exact_edges(cfg, graph, verify)) if j.calls[0].patches > 0]
    evaluating = [memory.circuits(cfg, graph, 11), memory.circuits(cfg, graph, 16, 5)]
    _, items = pick_items(case, tag)
    *_, rows_b, rows_s = contrast_rows(case, model, pick_bad(case, bad), direction, items)
    budget = budget_of(model, max_memory)
    kw = dict(batch_size=batch_size, budget=budget, weights=memory.model_bytes(model),
              device=str(next(model.parameters()).device))
    if ablation == "resample":
        p = memory.plan(cfg, rows_b, rows_s, case.align, scoring, also=[(rows_s, rows_b, case.align, evaluating)],
                        **kw)
    else:
        p = memory.plan(cfg, rows_s, rows_s, "index", scoring + evaluating, **kw)
    return p, budget


def planned_batch_size(plan, case: Case, model, *a, batch_size: int = 256, max_memory: int | str | None = None,
                       **kw) -> int:
    """Run `plan` (plan_patch, plan_threshold, plan_circuit), print the plan in one line to stderr, and return the
    batch size that fits (AnalysisError when none does)."""
    import sys

    p, budget = plan(case, model, *a, batch_size=batch_size, max_memory=max_memory, **kw)
    lowered = f" (lowered from batch size {batch_size} to fit)" if p.batch_size < batch_size else ""
    print(f"plan: {p.line(budget)}{lowered}", file=sys.stderr)
    return p.batch_size
