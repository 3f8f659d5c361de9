"""`threshold`: the head-subset search as one function (`threshold_search`), with checkpoints, shards and a Ray
backend: it builds the run (`make_contrast`), evaluates the plan's chunks (`surgeon.search.subsets`) into the chunk
store (`surgeon.search.store`), locally or on Ray workers (`surgeon.search.ray`), and collects them
(`surgeon.search.shards`); `generation_check` judges the minimal subsets by greedy generation."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from surgeon.analyses.common import Direction, make_contrast
from surgeon.analyses.generation import generate_patched
from surgeon.errors import AnalysisError
from surgeon.models.loading import load_model, model_digest
from surgeon.search.ray import evaluate_on_ray, merge_execution
from surgeon.search.shards import collect
from surgeon.search.store import ChunkStore, parse_shard
from surgeon.search.subsets import (
    ThresholdResult,
    chunk_scores,
    evaluate,
    make_groups,
    make_plan,
    parse_units,
    plan_from_options,
    todo_chunks,
)
from surgeon.sites.nodes import Site
from surgeon.sites.nodes import component as get_component
from surgeon.case.case import Case, content_digest


def resume_inputs(case: Case, model, info: dict, contrast, component: str, direction: str) -> dict:
    """Every input of a search besides its plan that changes a chunk's numbers, by content: the case (formats, items,
    metric, ...: `content_digest`), the runs compared (base, source, tag), the component and direction, the metric, the
    model (config and weights: `model_digest`) and its dtype. A saved search resumes only where all of them match."""
    import uuid

    p = next(model.parameters())
    case_sha = content_digest(case)
    return {"case_content_sha256": case_sha or f"unkeyable-{uuid.uuid4().hex}",  # a metric function without source
            "base": info["base"], "source": info["source"], "tag": info["tag"], "component": component,
            "direction": direction, "n_items": int(contrast.n_items), "metric": contrast.metric.label,
            "model_sha256": model_digest(model), "dtype": str(p.dtype)}


def _inputs_digest(inputs: dict) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ChunkEvaluator:
    """What a Ray worker needs to evaluate chunks of a search on its own copy of the model (picklable)."""

    case: Case  # as given (items chosen in memory included); its model is loaded by reference
    dtype: str
    contrast: dict  # make_contrast's keyword arguments
    plan: dict  # the plan's options (the plan is rebuilt deterministically)
    chunk: int
    component: str

    def __call__(self):
        import torch

        case = self.case
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = load_model(case.model, device=device, dtype=self.dtype)
        plan = plan_from_options(self.plan)
        sites = [Site.of(self.component, L) for L in sorted({u.layer for u in plan.units})]
        contrast, _ = make_contrast(case, model, sites=sites, **self.contrast)
        return _Evaluate(contrast, plan, self.chunk, self.component)


@dataclass
class _Evaluate:
    """A worker's evaluator: a chunk's scores, and the worker's execution record (`Contrast.execution`)."""

    contrast: object
    plan: object
    chunk: int
    component: str

    def __call__(self, c: int) -> dict:
        return chunk_scores(self.contrast, self.plan, c, self.chunk, self.component)

    @property
    def execution(self) -> dict:
        return self.contrast.execution


def threshold_search(case: Case, model, *, layer: int | None = None, heads: str | None = None,
                     groups: Sequence[str] = ("even", "odd"), groups_spec: dict | None = None,
                     grid: tuple[str, str] | None = None, budget: int = 20000, grid_budget: int = 200,
                     item_rate: float = 1.0, x: float = 0.5, component: str = "z", direction: Direction = "denoise",
                     bad: str | None = None, tag: str | None = None, batch_size: int = 256, chunk: int = 256,
                     seed: int = 0, out: str | Path | None = None, shard: str | None = None,
                     generate: int = 0, progress: bool = False, ray=None, on_chunk=None) -> ThresholdResult | None:
    """Search head subsets at `layer` (or the heads named in `heads`); see `surgeon.search.subsets`.

    With `out`, finished chunks are saved under `out/parts` and a rerun resumes from them; with
    `shard="i/n"` only every n-th chunk is evaluated and None is returned (merge the shards with
    `merge`). Without `out` a temporary directory is used. With `generate=N`, the minimal repairing
    subsets (up to 20) and the full candidate set are also checked by greedy generation of N tokens.
    With `ray` (a `surgeon.search.ray.RayOptions`), the chunks run on Ray workers that each load the model
    (from the case's file) once; the saved chunks and the result are those of a local run.
    """

    if not 0 < item_rate <= 1:
        raise AnalysisError(f"item rate {item_rate} is not in (0, 1]", field="--item-rate", fix="e.g. 1.0 (all items) or 0.9")
    if not 0 < x <= 1:
        raise AnalysisError(f"x = {x} is not in (0, 1]", field="--x", fix="e.g. 0.5 (half of the subsets repair)")
    comp = get_component(component)
    if comp.units == "whole":
        raise AnalysisError(f"component {component!r} has no heads to choose subsets of", field="--component",
                            fix="use z (per-head outputs), o_slices, q, k or v")
    i_shard, n_shard = parse_shard(shard)
    n_layers = model.cfg.n_layers
    probe = Site.of(component, layer if layer is not None else 0)
    units = parse_units(heads, layer, n_layers, probe.n_units(model.cfg))
    plan = make_plan(units, make_groups(units, groups, groups_spec, seed=seed), budget=budget, grid=grid,
                     grid_budget=grid_budget, seed=seed)
    sites = [Site.of(component, L) for L in sorted({u.layer for u in units})]
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=sites)
    meta = dict(options=plan.options, chunk=chunk, case=case.name, component=component, base=info["base"],
                source=info["source"], tag=info["tag"], n_items=contrast.n_items, item_rate=item_rate, x=x,
                clean_base=contrast.clean_base.cpu().tolist(), clean_source=contrast.clean_source.cpu().tolist(),
                metric=contrast.metric.label, right_above=contrast.metric.right_above)
    tmp = None
    if out is None:  # a fresh folder: nothing to resume, so nothing to key
        tmp = tempfile.TemporaryDirectory(prefix="surgeon-threshold-")
        out = tmp.name
        meta["inputs"] = inputs = {}
    else:  # a saved search resumes only under the inputs it began with (the plan, the chunk size and every input)
        meta["inputs"] = inputs = resume_inputs(case, model, info, contrast, component, direction)
    label = contrast.metric.label
    store = ChunkStore(Path(out), plan.digest + f"-chunk{chunk}" + ("" if label == "logprob" else f"-{label}")
                       + (f"-in{_inputs_digest(inputs)}" if inputs else ""), meta,
                       shape=(len(plan.units), contrast.n_items))
    try:
        if ray is not None:
            dtype = str(model.cfg.dtype).removeprefix("torch.")
            factory = ChunkEvaluator(case, dtype,
                                     dict(bad=bad, direction=direction, tag=tag, batch_size=batch_size),
                                     plan.options, chunk, component)
            todo = todo_chunks(plan, store, chunk, (i_shard, n_shard))
            on_ray = evaluate_on_ray(factory, todo, store, todo, ray, progress=progress, desc="subsets",
                                     unit="subset", on_chunk=on_chunk)
        else:
            evaluate(contrast, plan, store, component=component, chunk=chunk, shard=(i_shard, n_shard),
                     progress=progress)
    except KeyboardInterrupt:
        if n_shard == 1:
            partial = collect(Path(out), item_rate, x)
            raise Interrupted(partial) from None
        raise
    if n_shard > 1:
        return None
    result = collect(Path(out), item_rate, x)  # this run's aggregation, not the one the folder was begun with
    if tmp is not None:
        tmp.cleanup()
    # chunks evaluated here ran on this contrast; on Ray, the workers' records are added (each worker also ran its
    # own clean passes); earlier runs of a resumed search record nothing here (the same code on the same plan)
    result.execution = dict(contrast.execution)
    if ray is not None:
        result.execution = merge_execution([result.execution, on_ray["execution"]])
        result.execution["ray"] = {k: on_ray[k] for k in ("workers", "chunks", "workers_lost")}
    if generate:
        result.generation = generation_check(case, model, result, n_new=generate, component=component, bad=bad,
                                             tag=tag, batch_size=batch_size)
    return result


def generation_check(case: Case, model, result: ThresholdResult, *, n_new: int, component: str = "z",
                     bad: str | None = None, tag: str | None = None, batch_size: int = 256) -> list[dict]:
    """Greedy generation with each minimal repairing subset (up to 20) and with every candidate patched."""
    import torch

    subsets = [list(m) for m in result.minimal[:20]] + [list(result.units)]
    units = parse_units(",".join(result.units), None, model.cfg.n_layers, Site.of(component, 0).n_units(model.cfg))
    masks = {}
    for L in sorted({u.layer for u in units}):
        site = Site.of(component, L)
        m = torch.zeros(len(subsets), site.n_units(model.cfg))
        for p, sub in enumerate(subsets):
            for lab in sub:
                u = units[result.units.index(lab)]
                if u.layer == L:
                    m[p, u.head] = 1
        masks[site] = m
    gens = generate_patched(case, model, masks, n_new, bad=bad, tag=tag, batch_size=batch_size)
    return [dict(subset=sub, correct=g.accuracy.value, lo=g.accuracy.lo, hi=g.accuracy.hi, n=g.accuracy.n,
                 counts=g.counts(), examples=list(g.texts[:3])) for sub, g in zip(subsets, gens)]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a search; `.partial` holds the result of the chunks finished so far."""

    def __init__(self, partial: ThresholdResult):
        super().__init__("interrupted")
        self.partial = partial
