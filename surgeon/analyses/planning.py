"""Memory plans for the analyses: a case's rows and an analysis's engine calls, planned before the work starts.

`plan_patch`, `plan_threshold`, `plan_circuit` and `plan_feature_circuit` predict the peak memory of `patch_heads`,
`threshold_search`, `discover` and `feature_circuit` on this model and case (`surgeon.engine.memory`), pick the largest batch size (at most the one asked for)
that fits `max_memory` (default: the device's free memory, plus what the model's weights already take there), and
refuse with an AnalysisError naming the fix when batch size 1 does not fit. The CLI prints the plan in one line
before the work.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from surgeon.analyses.common import Direction, contrast_rows
from surgeon.analyses.feature_circuit import CURVE_SIZES
from surgeon.analyses.scoring import EDGE_METHODS, check_feature_method
from surgeon.engine import memory
from surgeon.engine.memory import Call, Job, Prediction
from surgeon.errors import AnalysisError
from surgeon.sites.edges import EdgeSite
from surgeon.sites.nodes import Site
from surgeon.case.case import Case
from surgeon.case.select import pick_bad, pick_items


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


# A feature site's hook (surgeon.sites.features) works on [rows, slots, d_sae] tensors the engine's plan does not
# know: per SAE, the other run's features at the bucket's aligned positions (held through a call); without
# gradients, FEATURE_COPIES of them alive at once in one hook (the current activation's pre-activations and features,
# their difference to the source's, the moved features); under gradients, what autograd keeps for the backward
# pass: FEATURE_COPIES_GRAD_FIRST for the first SAE hook (no gradient flows into its input) and FEATURE_COPIES_GRAD
# for each one after it. Fitted by the peaks measured at two SAE widths (the slope is the feature tensors) on a
# 24-layer d_model-128 model with one, two and three SAEs; checked on shapes held out (bench/features.py,
# tests/sae/test_feature_memory.py).
FEATURE_COPIES = 6
FEATURE_COPIES_GRAD_FIRST = 1.0
FEATURE_COPIES_GRAD = 1.8
EDGE_NODES_PLANNED = 256  # downstream nodes per SAE the edge step is planned for (a circuit's nodes in one SAE)


@dataclass(frozen=True)
class SAEShape:
    """What the plan needs of an SAE: its width, the bytes of one feature value, and of its weights."""

    d_sae: int
    element: int
    weights: int

    @staticmethod
    def of(sae) -> "SAEShape":
        tensors = [*sae.parameters(), *sae.buffers()]
        return SAEShape(int(sae.cfg.d_sae), tensors[0].element_size(), sum(t.numel() * t.element_size() for t in tensors))


@dataclass(frozen=True)
class FeatureJob:
    """One step of a feature circuit as the plan sees it: its engine calls (`job`), the layer whose SAE hook point its
    passes read and stop at (`stop`; None: they run to the logits), and how many SAE hooks its passes run through
    (`hooks`; None: every SAE's)."""

    job: Job
    stop: int | None = None
    hooks: int | None = None
    moving: tuple[tuple[int, ...] | None, ...] = ()  # per call: the SAE each patch moves (None: every SAE, or unknown)


def feature_jobs(cfg, layers, d_sae: int, nodes: int, method: str = "ig", steps: int = 5, verify: int = 20,
                 down: int | Mapping[int, int] = EDGE_NODES_PLANNED, verify_layers: Sequence[int] | None = None
                 ) -> dict[str, FeatureJob]:
    """The engine calls of one direction of `feature_circuit` over SAEs at `layers` (`d_sae` the largest width,
    `nodes` every node): "attribution" (`method`), "exact" (the `verify` nodes patched alone, the faithfulness
    curve kept and ablated, the bisection for the smallest circuit), "edge left vectors" (the metric's gradient at
    each SAE's hook point, one SAE patched) and, per SAE after the first, "edges into layer L": one gradient per
    earlier SAE with the downstream nodes of L's SAE in the batch dimension (`down`: how many, per layer or for
    every SAE), read at L's hook point (its passes stop there and compute no logits) with the upstream SAE patched
    and L's encoding its features. The widest of them starts at the first SAE's layer. A node patched alone moves
    one SAE's features, and an SAE's hook encodes only the patches of a chunk that move it: `verify_layers`, the SAE
    (its layer) of each verified node in order, once they are known (None, before: every one at each SAE, a bound)."""
    layers = sorted(layers)
    sites = tuple((L, 1, cfg.d_model) for L in layers)
    start, k = layers[0], len(layers)
    attr = Job(f"feature {method} ({steps} steps)" if method.startswith("ig") else f"feature {method}",
               check_feature_method(method).calls(steps, k, start), sites, nodes, grad=True)
    curve = len({c for c in CURVE_SIZES if c < nodes} | {nodes})
    exact = Job(f"exact top-{verify} nodes, curves", (Call(max(1, verify), start), Call(curve, start, 2),
                                                      Call(1, start, math.ceil(math.log2(max(2, nodes))) + 3)),
                sites, nodes)
    moved = None if verify_layers is None else tuple(verify_layers)[: max(1, verify)]
    out = {"attribution": FeatureJob(attr), "exact": FeatureJob(exact, moving=(moved, None, None)),
           "edge left vectors": FeatureJob(Job("edge left vectors", (Call(1, start, k),), sites, d_sae + 1, grad=True),
                                           hooks=1)}
    for i, L in enumerate(layers[1:], 1):
        n = down.get(L, 0) if isinstance(down, Mapping) else down
        if n > 0:
            calls = (Call(min(n, d_sae + 1), start, i),)  # one pass per earlier SAE, the first's the longest
            out[f"edges into layer {L}"] = FeatureJob(Job(f"feature edges into layer {L}", calls, sites, d_sae + 1,
                                                          grad=True), stop=L, hooks=2)
    return out


def _stopped(cfg, layer: int):
    """`cfg` cut after `layer`: what a pass read at that layer's hook point computes (Contrast.run(read=At(...))):
    the blocks up to it and no unembedding (a vocabulary of one: no logits, no readout)."""
    import copy

    cut = copy.copy(cfg)
    cut.n_layers = layer + 1
    cut.d_vocab_out = 1
    return cut


def feature_bytes(buckets, jobs: Mapping[str, FeatureJob], saes, batch_size: int) -> dict:
    """The SAEs' weights and the largest chunk's feature tensors (bytes) over `buckets` at `batch_size` for `jobs`
    (as `feature_jobs` gives them), `saes` as `SAEShape`s (a chunk of a bucket holds as many patches as the engine
    puts in one: batch_size x width / (rows x recomputed positions))."""
    if not saes:
        return {}
    F, e = max(s.d_sae for s in saes), max(s.element for s in saes)
    most = 0
    for b in buckets:
        chunk = max(1, batch_size * b.base_width // (b.n * (b.base_width - b.p0)))
        for fj in jobs.values():
            job, k = fj.job, fj.hooks or len(saes)
            held = k * b.n * b.slots * F * e  # the source features (or left vectors) of this bucket, per SAE hook
            per_hook = FEATURE_COPIES_GRAD_FIRST + FEATURE_COPIES_GRAD * (k - 1) if job.grad else FEATURE_COPIES
            for i, call in enumerate(job.calls):
                rows = min(chunk, call.patches)
                if i < len(fj.moving) and fj.moving[i]:  # a hook encodes only the patches of a chunk that move it
                    rows = min(rows, _most_at_one(fj.moving[i], chunk))
                most = max(most, int(held + rows * b.n * b.slots * F * e * per_hook))
    return {"SAEs": sum(s.weights for s in saes), "features": most}


def _most_at_one(layers: Sequence[int], chunk: int) -> int:
    """The most patches of one chunk (the engine's, `chunk` patches in order) that move the same SAE."""
    return max(max(part.count(L) for L in set(part)) for part in
               (list(layers[lo: lo + chunk]) for lo in range(0, len(layers), chunk)))


def plan_feature_circuit(case: Case, model, saes: dict, method: str = "ig", steps: int = 5, verify: int = 20,
                         by_position: bool = False, *, batch_size: int = 256, max_memory: int | str | None = None,
                         bad: str | None = None, direction: Direction = "denoise", tag: str | None = None
                         ) -> tuple[Prediction, int]:
    """The plan of `feature_circuit` over `saes` ({layer: SAE}) on the case's rows (`plan_features`); `direction` is
    ignored (both run)."""
    _, items = pick_items(case, tag)
    *_, rows_b, rows_s = contrast_rows(case, model, pick_bad(case, bad), "denoise", items)
    budget = budget_of(model, max_memory)
    shapes = {L: SAEShape.of(sae) for L, sae in saes.items()}
    p = plan_features(model.cfg, rows_b, rows_s, case.align, shapes, method, steps, verify, by_position,
                      batch_size=batch_size, budget=budget, weights=memory.model_bytes(model),
                      device=str(next(model.parameters()).device))
    return p, budget


def plan_features(cfg, rows_b, rows_s, align: str, saes: dict, method: str = "ig", steps: int = 5, verify: int = 20,
                  by_position: bool = False, *, batch_size: int = 256, budget: int, weights: int | None = None,
                  device: str = "cpu", jobs: Mapping[str, FeatureJob] | None = None, both: bool = True) -> Prediction:
    """The engine's plan of a feature circuit's calls (every `feature_jobs` job, or `jobs` as it gives them) over
    these rows with SAEs `saes` ({layer: SAEShape}), both directions' (`both`: the failing format's contrast held
    while the working format's runs), each job on the layers its passes run through, with the SAEs' weights and
    feature tensors (`feature_bytes`) added: the largest job's peak at the largest batch size (at most `batch_size`)
    whose peak fits `budget`; AnalysisError naming the fix when batch size 1 does not."""
    whole = memory.two_way(cfg)  # a bidirectional model's rows are laid out whole
    b, s, aligned = memory.merged_rows(rows_b, rows_s, align, bidirectional=whole)
    slots = max(x.slots for x in memory.layout(b, s, aligned, batch_size, bidirectional=whole))
    nodes = sum(x.d_sae + 1 for x in saes.values()) * (slots if by_position else 1)
    if jobs is None:
        jobs = feature_jobs(cfg, list(saes), max(x.d_sae for x in saes.values()), nodes, method, steps, verify)
    weights = memory.weights_bytes(cfg) if weights is None else weights  # the whole model's, on a job's cut layers too

    def engine_plans(bs: int, budget: int) -> list:
        out = []
        for fj in jobs.values():
            c = cfg if fj.stop is None else _stopped(cfg, fj.stop)
            also = [(rows_s, rows_b, align, [fj.job])] if both else []
            out.append((memory.plan(c, rows_b, rows_s, align, [fj.job], also=also, batch_size=bs, budget=budget,
                                    weights=weights, device=device), fj.job))
        return out

    def predict_at(bs: int) -> Prediction:  # each job planned on the layers its passes run through; the largest peak
        try:
            preds = engine_plans(bs, budget)
        except AnalysisError:  # the engine's part alone does not fit at batch size 1: the whole of it, refused below
            bs, preds = 1, engine_plans(1, 1 << 62)
        low = min(p.batch_size for p, _ in preds)
        if low < bs:  # the engine's part alone does not fit at bs: tried next at its size
            return preds[[p.batch_size for p, _ in preds].index(low)][0]
        tops = []
        for (p, _), (key, fj) in zip(preds, jobs.items()):
            extra = feature_bytes(memory.layout(b, s, aligned, bs, bidirectional=whole), {key: fj}, list(saes.values()), bs)
            tops.append((p.peak + sum(extra.values()), {**p.parts, **extra}, p))
        peak, parts, _ = max(tops, key=lambda t: t[0])
        clean = 2 * len(memory.layout(b, s, aligned, bs, bidirectional=whole)) * (2 if both else 1)  # one set of clean passes
        forwards = sum(p.forwards for p, _ in preds) - clean * (len(preds) - 1)
        name = f"feature circuit ({len(saes)} SAEs, {nodes:,} nodes)" if both or len(jobs) > 1 else preds[0][1].name
        return Prediction(name, bs, int(peak), parts, forwards, any(p.forwards_bound for p, _ in preds))

    return memory.largest_batch(predict_at, batch_size, budget,
                                fix="use fewer or smaller SAEs (--layers), --dtype bfloat16, fewer items, a device "
                                    "with more memory, or a larger --max-memory if more is free")


def planned_batch_size(plan, case: Case, model, *a, batch_size: int = 256, max_memory: int | str | None = None,
                       **kw) -> int:
    """Run `plan` (plan_patch, plan_threshold, plan_circuit), print the plan in one line to stderr, and return the
    batch size that fits (AnalysisError when none does)."""
    import sys

    p, budget = plan(case, model, *a, batch_size=batch_size, max_memory=max_memory, **kw)
    lowered = f" (lowered from batch size {batch_size} to fit)" if p.batch_size < batch_size else ""
    print(f"plan: {p.line(budget)}{lowered}", file=sys.stderr)
    return p.batch_size
