"""Path-level circuit discovery: edges scored on the intervention core, complete paths verified by path
patching, a circuit pruned to a target faithfulness, and its faithfulness curve.

Every number comes from `Contrast.run` with an edge mask (`surgeon.sites.edges`):
- edge scores by one of `METHODS` (EAP, the three integrated-gradients conventions, exact patching; the
  top `verify` estimates are checked by exact patching);
- circuits as the field means them (`surgeon.analyses.circuit_runs`): under the default `kept` semantics (MIB,
  ACDC, auto-circuit) every edge outside the circuit carries its ablation value (resample, mean or zero) and every
  edge inside its current output; `knockout` ablates the circuit instead (a necessity test);
- paths: path patching (`path_scores`);
- faithfulness f = (m(circuit) - m(empty)) / (m(full) - m(empty)) with m the mean score, at the MIB
  edge fractions; every circuit of the curve is one row of one batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Literal, Sequence

import numpy as np

from surgeon.analyses.circuit_runs import CircuitRuns, check_semantics, circuit_runs
from surgeon.analyses.common import Direction
from surgeon.circuits.export import check_targets, edges_for_model, write
from surgeon.circuits.graph import (
    CircuitGraph,
    build_graph,
    made_by,
    path_nodes,
    prune_dangling,
    strongest_paths,
)
from surgeon.analyses.scoring import EDGE_METHODS, check_edge_method, score_edges
from surgeon.circuits.methods import (  # noqa: F401
    IG_METHODS,
    IG_STEPS,
    LEGACY_SEMANTICS,
    MAX_IG_STEPS,
    METHODS,
    SEMANTICS,
)
from surgeon.circuits.prune import EXHAUSTIVE_UP_TO, smallest_prefix
from surgeon.errors import AnalysisError
from surgeon.models.loading import resolve, shape
from surgeon.show import Shows
from surgeon.sites.ablations import FREEZE
from surgeon.sites.edges import EdgeSite
from surgeon.case.case import Case
from surgeon.stats import Estimate, bootstrap_mean, bootstrap_means, scaled

Method = Literal["eap", "eap-ig-inputs", "eap-ig-activations", "eap-ig-masks", "exact"]
CURVE = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # MIB's edge fractions


@dataclass
class PathResult:
    nodes: list[str]  # input, a0.h1<v>, a1.h2<k>, logits
    edges: list[str]
    product: float  # product of |edge scores| (the ranking networkx used)
    effect: Estimate  # path-patching effect on the score (mean over items, 95% interval)
    share: Estimate  # the effect as a fraction of the full patch's, per item
    skill: bool  # carries >= min_share of the effect on >= min_items of the items


@dataclass
class CircuitResult(Shows):
    case: str
    method: str
    ablation: str
    direction: str
    base: str
    source: str
    tag: str | None
    n_items: int
    n_edges: int
    edge_names: list[str]
    scores: np.ndarray  # [n_edges] estimated (or exact) effect of patching each edge alone
    exact: dict[int, float]  # edge index -> exact effect, for the verified edges
    verify_pearson: float | None  # estimate vs exact over the verified edges
    empty: float  # m(empty): mean unpatched score
    full: float  # m(full): the circuit of every edge (the source run's mean score under index alignment)
    curve_fractions: list[float]
    curve_edges: list[int]
    curve: list[float]  # faithfulness at each fraction
    cpr: float  # area under f over the edge fraction (higher is better)
    cmd: float  # area under |1 - f| (lower is better)
    target: float | None  # the faithfulness asked for
    circuit: list[int]  # edge indices of the pruned circuit
    circuit_faithfulness: float
    circuit_faithfulness_ci: tuple[float, float]
    paths: list[PathResult] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)  # how the smallest circuit was found (k, f(k), f(k-1), method)
    no_paths: str | None = None  # why no path is listed, when none is
    # which execution path the engine took, and why (`Contrast.execution`)
    execution: dict = field(default_factory=dict)
    # the model's shape the edge graph was built from (layers, heads, key/value heads, attention-only)
    shape: dict = field(default_factory=dict)
    # edge index -> bootstrap 95% interval of its exact effect over the items, for the top `verify` edges
    exact_ci: dict[int, tuple[float, float]] = field(default_factory=dict)

    def graph(self):
        """The circuit as a `CircuitGraph` of the model's edges (scores, exact effects, in-circuit marks, the model's
        shape and the circuit's semantics)."""
        cfg = shape_cfg(self.shape)
        g = build_graph(EdgeSite.of(cfg, self.ablation), self.scores, self.exact, self.circuit, cfg,
                        self.options.get("semantics"))
        g.graph["made"] = self.made()
        return g

    def made(self) -> dict:
        """How this circuit was found (method, ablation and the prompts it acts on, semantics, formats, items):
        written into every export, and what `surgeon circuit-eval` evaluates under unless told otherwise."""
        return made_by(case=self.case, method=self.method, ablation=self.ablation,
                       semantics=self.options.get("semantics"), direction=self.direction, base=self.base,
                       source=self.source, tag=self.tag, n_items=self.n_items, metric=self.options.get("metric"))

    def export(self, *paths) -> None:
        """Write the circuit to each path, in the format its extension names (the formats `--export` takes),
        every target checked before anything is written."""
        check_targets([Path(p) for p in paths])
        g = self.graph()
        for f in map(Path, paths):
            f.parent.mkdir(parents=True, exist_ok=True)
            write(g, f, title=f"{self.case}: {self.source} -> {self.base}, {len(self.circuit)} edges")

    def names(self, edges: Sequence[int]) -> list[str]:
        return [self.edge_names[e] for e in edges]


def _mean_scores(contrast, site, masks):
    import torch

    with torch.no_grad():
        return contrast.run({site: masks}).cpu().numpy()  # [P, items]


def check_method(method: str, ig_steps: int, contrast=None) -> None:
    """Refuse an unknown method, steps out of range, or a method the case's prompts cannot run (one clear error)."""
    check_edge_method(method, ig_steps, contrast)


def edge_scores(contrast, site, method: Method = "eap-ig-inputs", ig_steps: int = IG_STEPS) -> np.ndarray:
    """[n_edges] each edge's (estimated) effect on the mean score when patched alone (the convention of each
    method in `METHODS`; the functions are registered in `surgeon.analyses.scoring`)."""
    check_edge_method(method, ig_steps, contrast)
    return score_edges(contrast, site, method, ig_steps)


def faithfulness(runs: CircuitRuns, edge_sets: Sequence[Sequence[int]]):
    """Per circuit: its value under the runs' semantics (kept: faithfulness; knockout: the share removed) and per-item
    scores [P, items]; circuits in one batch."""
    return runs.value(edge_sets)


def path_scores(contrast, site, paths: Sequence[Sequence[int]]) -> np.ndarray:
    """[P, items] scores with each path patched alone (path patching, the same in both semantics): the path's
    first edge carries the other run's output of its sender, each later edge passes on what its sender now
    computes, and every edge off the path is frozen to this run's value, so the difference reaches the logits
    through the path's receivers and nowhere else."""
    import torch

    freeze = site.variant(ablation=FREEZE)
    inside = site.mask([list(p) for p in paths])
    first = site.mask([[p[0]] for p in paths])
    with torch.no_grad():
        return contrast.run({site: first, freeze: 1 - inside}).cpu().numpy()


def _area(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def _verify(contrast, site, scores: np.ndarray, order: np.ndarray, verify: int):
    """Exact effects of the top `verify` edges, their bootstrap 95% intervals over the items, and the Pearson r of
    the estimates against them."""
    import torch

    top = [int(e) for e in order[:verify]]
    if not top:
        return {}, {}, None
    m = torch.zeros(len(top), len(site.edges))
    m[torch.arange(len(top)), top] = 1
    per_item = _mean_scores(contrast, site, m) - contrast.clean_base.cpu().numpy()[None]  # [top, items]
    ex, lo, hi = bootstrap_means(per_item)
    exact = {e: float(v) for e, v in zip(top, ex)}
    ci = {e: (float(a), float(b)) for e, a, b in zip(top, lo, hi)}
    pearson = None
    if len(top) > 2 and np.std(ex) > 0 and np.std(scores[top]) > 0:
        pearson = float(np.corrcoef(scores[top], ex)[0, 1])
    return exact, ci, pearson


def _paths(runs: CircuitRuns, g, scores, n_paths, min_share, min_items):
    """The strongest complete paths by |score| product, verified by path patching on the scoring run; or why there
    are none. Under resample with every position aligned the difference enters through the input alone, so a path
    starts there; otherwise (positions not aligned, or an ablation value for every sender) at any sender."""
    contrast, site = runs.scoring, runs.site
    from_input = runs.ablation == "resample" and contrast.align == "index"
    cand = strongest_paths(g, max(n_paths, 3 * n_paths), start="input" if from_input else "any")
    if not cand:
        return [], ("no complete path input -> logits has edges of nonzero score" if from_input else
                    "no path sender -> logits has edges of nonzero score")
    pp = path_scores(contrast, site, cand)
    base = contrast.clean_base.cpu().numpy()
    total = runs.patched_all() - base  # every edge at the site's value: the effect the paths share
    sign = 1.0 if float(total.mean()) >= 0 else -1.0
    out = []
    for path, row in zip(cand, pp):
        eff = row - base
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(np.abs(total) > 1e-9, eff / total, np.nan)
        fin = share[np.isfinite(share)]
        prod = float(np.prod([abs(scores[e]) for e in path]))
        out.append(PathResult(path_nodes(g, path), [site.names[e] for e in path], prod, bootstrap_mean(eff),
                              bootstrap_mean(fin), bool(len(fin) and (fin >= min_share).mean() >= min_items)))
    out.sort(key=lambda p: -sign * p.effect.value)
    return out[:n_paths], None


def model_shape(cfg) -> dict:
    """What the edge graph depends on in a model's config."""
    return dict(n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                n_key_value_heads=getattr(cfg, "n_key_value_heads", None) or cfg.n_heads,
                attn_only=bool(getattr(cfg, "attn_only", False)), d_model=cfg.d_model)


def shape_cfg(shape: dict):
    """A config stand-in from `model_shape` (enough to build the edge graph without the model)."""
    return SimpleNamespace(**shape, parallel_attn_mlp=False)


def check_circuit_file(circuit: CircuitGraph, model_spec: str, ablation: str = "resample", where: str = "") -> None:
    """A circuit file read by `read_circuit` checked against a model's config alone (names, cfg, GQA copies),
    so a file for another model is refused before the weights load."""
    file_semantics(circuit, where)
    shp = shape(resolve(model_spec))
    cfg = shape_cfg(dict(n_layers=shp.n_layers, n_heads=shp.n_heads, n_key_value_heads=shp.n_kv_heads,
                         attn_only=shp.attn_only, d_model=shp.d_model))
    edges_for_model(circuit, EdgeSite.of(cfg, ablation), cfg, where)


def default_method(case: Case, ablation: str = "resample") -> str:
    """The method `discover` uses when none is named: MIB's `eap-ig-inputs` where every position is aligned
    (prompts of equal length) under resample ablation, else `eap-ig-masks`."""
    return "eap-ig-inputs" if case.align == "index" and ablation == "resample" else "eap-ig-masks"


def check_options(method: str, ablation: str, ig_steps: int, target: float | None, n_edges: int | None,
                  semantics: str = "kept") -> None:
    """Refuse options that cannot run, before any model work."""
    check_semantics(semantics)
    if target is not None and not 0 < target <= 1.5:
        raise AnalysisError(f"faithfulness target {target} is not in (0, 1.5]", field="--faithfulness", fix="e.g. 0.9")
    if n_edges is not None and n_edges < 1:
        raise AnalysisError(f"--edges {n_edges} must be at least 1", field="--edges", fix="e.g. 50")
    if check_edge_method(method, ig_steps).equal_length and ablation != "resample":
        raise AnalysisError(f"{method!r} interpolates towards the other run's inputs, so it has no {ablation!r} "
                            f"ablation", field="--ablation", fix="use --ablation resample, or another --method")


def ranked_edges(contrast, site, method: str, ig_steps: int, verify: int):
    """Edge scores by `method`, the ranking by |score|, the exact effects of the top `verify` edges (every edge for
    `exact`) with their Pearson r against the scores, and the top `verify` edges' intervals over the items:
    (scores, order, exact, intervals, pearson)."""
    scores = edge_scores(contrast, site, method, ig_steps)
    order = np.argsort(-np.abs(scores), kind="stable")
    exact, ci, pearson = _verify(contrast, site, scores, order, verify)
    if EDGE_METHODS[method].exact:  # the scores are the measured effects
        return scores, order, {int(e): float(scores[e]) for e in range(len(site.edges))}, ci, None
    return scores, order, exact, ci, pearson


def faithfulness_curve(runs: CircuitRuns, order):
    """The circuit's value (faithfulness, or the share removed under knockout) at MIB's edge fractions (plus the
    empty circuit), every circuit in one batch: (fractions, edge counts, values, CPR, CMD)."""
    E = len(runs.ablate.edges)
    counts = [0] + [max(1, int(round(fr * E))) for fr in CURVE]
    f_curve, _ = runs.value([order[:k] for k in counts])
    xs = [0.0] + list(CURVE)
    return xs, counts, f_curve, _area(xs, f_curve), _area(xs, np.abs(1 - f_curve))


def prune(runs: CircuitRuns, g, order, target: float | None, n_edges: int | None,
          exhaustive_up_to: int | None = None) -> tuple[list[int], dict]:
    """The circuit: the smallest top-k prefix of the ranking reaching `target` (or the top `n_edges`); then, for a kept
    circuit under resample with every position ablated, less the edges on no complete path input -> logits (each
    carries its sender's base-run output, its ablation value: they change nothing). Returns the circuit's edge
    indices and how the prefix was found."""

    E = len(runs.ablate.edges)
    search: dict = {}
    if n_edges is not None:
        k = min(E, n_edges)
    else:
        ps = smallest_prefix(lambda ks: runs.value([order[:c] for c in ks])[0], E, target,
                             exhaustive_up_to=EXHAUSTIVE_UP_TO if exhaustive_up_to is None else exhaustive_up_to)
        k = E if ps.k is None else ps.k
        search = dict(k=ps.k, f=ps.f, f_before=ps.f_before, search=ps.search, monotone_assumed=ps.monotone_assumed,
                      evaluated=len(ps.evaluated), describe=ps.describe())
    circuit = sorted(int(e) for e in order[:k])
    if dangling_prunable(runs):
        circuit = sorted(prune_dangling(g, circuit))
    search["prefix"], search["pruned"] = k, len(circuit)
    return circuit, search


def dangling_prunable(runs: CircuitRuns) -> bool:
    """Whether edges on no complete path input -> logits change nothing: a kept circuit under resample with every
    position ablated (elsewhere a sender with every input ablated still computes something other than its ablation
    value: a mean or zero input, or context at positions that are not ablated)."""
    return runs.semantics == "kept" and runs.ablation == "resample" and runs.positions == "every position"


def discover(case: Case, model, *, method: Method | None = None, ablation: str = "resample",
             semantics: str = "kept", direction: Direction = "denoise", bad: str | None = None,
             tag: str | None = None, target: float | None = 0.9, n_edges: int | None = None, n_paths: int = 10,
             ig_steps: int = IG_STEPS, verify: int = 50, min_share: float = 0.1, min_items: float = 0.5,
             batch_size: int = 256, exhaustive_up_to: int | None = None) -> CircuitResult:
    """Score every edge, verify the top ones, draw the faithfulness curve, prune a circuit (the smallest
    top-k prefix of the ranking reaching `target`, or the top `n_edges`; see `prune`) and rank its complete paths
    by path patching.

    `method` None picks `default_method(case, ablation)`. `semantics`: what a circuit means (`SEMANTICS`: "kept",
    MIB's, or "knockout"), recorded in the result, its exports and the report."""

    method = method or default_method(case, ablation)
    check_options(method, ablation, ig_steps, target, n_edges, semantics)
    site = EdgeSite.of(model.cfg, ablation)
    if n_edges is not None and n_edges > len(site.edges):
        raise AnalysisError(f"--edges {n_edges} is more than the model's {len(site.edges)} edges", field="--edges",
                            fix=f"use --edges {len(site.edges)} or fewer")
    runs = circuit_runs(case, model, site, semantics=semantics, direction=direction, bad=bad, tag=tag,
                        batch_size=batch_size)
    scores, order, exact, exact_ci, pearson = ranked_edges(runs.scoring, site, method, ig_steps, verify)
    xs, counts, f_curve, cpr, cmd = faithfulness_curve(runs, order)
    circuit, search = prune(runs, build_graph(site, scores, exact), order, target, n_edges, exhaustive_up_to)
    f_c, per_item = runs.value([circuit])
    gap = float(runs.full.mean() - runs.empty.mean())
    ci = scaled(bootstrap_mean(runs.per_item(per_item[0])), gap)
    g = build_graph(site, scores, exact, circuit)
    paths, why = ([], "--paths 0") if n_paths <= 0 else _paths(runs, g, scores, n_paths, min_share, min_items)
    info = runs.info
    return CircuitResult(
        case=case.name, method=method, ablation=ablation, direction=direction, base=info["base"],
        source=info["source"], tag=info["tag"], n_items=runs.explained.n_items, n_edges=len(site.edges),
        edge_names=site.names, scores=scores, exact=exact, verify_pearson=pearson,
        empty=float(runs.empty.mean()), full=float(runs.full.mean()), curve_fractions=xs, curve_edges=counts,
        curve=[float(v) for v in f_curve], cpr=cpr, cmd=cmd, target=target if n_edges is None else None,
        circuit=circuit, circuit_faithfulness=float(f_c[0]), circuit_faithfulness_ci=(ci.lo, ci.hi), paths=paths,
        options=dict(method=method, ablation=ablation, direction=direction, ig_steps=ig_steps, verify=verify,
                     target=target, n_edges=n_edges, n_paths=n_paths, min_share=min_share, min_items=min_items,
                     semantics=semantics, semantics_detail=runs.describe(), positions=runs.positions,
                     align=case.align, mean_over="reference items" if ablation == "mean" and case.reference else
                     ("items" if ablation == "mean" else None), metric=runs.scoring.metric.label),
        search=search, no_paths=why, execution=runs.scoring.execution, shape=model_shape(model.cfg), exact_ci=exact_ci)


def file_semantics(circuit: CircuitGraph, where: str = "") -> str | None:
    """The semantics a circuit file records (legacy names read as today's), or None; a file of the retired
    edge-set reading is refused."""
    sem = circuit.semantics if isinstance(circuit, CircuitGraph) else None
    sem = LEGACY_SEMANTICS.get(sem, sem)
    if sem is None or sem in SEMANTICS:
        return sem
    if sem == "edge-set":
        raise AnalysisError("the circuit file was found under the retired edge-set reading (a circuit's edges patched "
                            "together, every other edge passing current values), which is neither kept nor knockout",
                            where=where, field="semantics",
                            fix="find the circuit again with this version (surgeon circuit ... --export FILE)")
    raise AnalysisError(f"the circuit file records semantics {str(sem)[:40]!r}", where=where, field="semantics",
                        fix=f"a circuit file says one of: {', '.join(SEMANTICS)}")


def evaluation_options(circuit, case: Case, *, ablation: str | None = None, semantics: str | None = None,
                       direction: str | None = None, bad: str | None = None, where: str = ""):
    """(ablation, semantics, direction, bad, notes): how `circuit-eval` evaluates a circuit. What is not given is
    what the file records it was found under (`CircuitGraph.made`), else the defaults (resample, kept, denoise, the
    case's first failing format); every choice that differs from the file's record, or that the file does not
    record, is said in `notes`."""
    made = (circuit.made if isinstance(circuit, CircuitGraph) else None) or {}
    recorded = file_semantics(circuit, where) if isinstance(circuit, CircuitGraph) else None
    notes = []
    chosen = {}
    failing = made.get("failing_format")
    defaults = {"ablation": "resample", "semantics": "kept", "direction": "denoise",
                "failing format": case.bad_formats[0]}
    file_says = {"ablation": made.get("ablation"), "semantics": recorded or made.get("semantics"),
                 "direction": made.get("direction"),
                 "failing format": failing if failing in case.bad_formats else None}
    asked = {"ablation": ablation, "semantics": semantics, "direction": direction, "failing format": bad}
    for k in defaults:
        if asked[k] is not None:
            chosen[k] = asked[k]
            if file_says[k] is not None and file_says[k] != asked[k]:
                notes.append(f"the circuit was found under {k} {file_says[k]!r}; evaluated under {asked[k]!r} as asked")
        elif file_says[k] is not None:
            chosen[k] = file_says[k]
        else:
            chosen[k] = defaults[k]
            if isinstance(circuit, CircuitGraph):
                if k == "failing format" and failing:
                    notes.append(f"the circuit was found on format {failing!r}, which is not one of this case's "
                                 f"failing formats; evaluated on {defaults[k]!r}")
                else:
                    notes.append(f"the file does not record its {k}; evaluated under {defaults[k]!r} (the default)")
    if made.get("case") and made["case"] != case.name:
        notes.append(f"the circuit was found on case {made['case']!r}; evaluated on case {case.name!r}")
    return chosen["ablation"], chosen["semantics"], chosen["direction"], chosen["failing format"], notes


def evaluate_circuit(case: Case, model, edges, *, ablation: str | None = None, semantics: str | None = None,
                     direction: Direction | None = None, bad: str | None = None, tag: str | None = None,
                     batch_size: int = 256, where: str = "") -> dict:
    """The value of a given edge set (names, or a circuit read by `circuits.export.read_circuit`) with a 95% interval
    over items: its faithfulness under `semantics` "kept", or the share removed under "knockout". What is not given
    (ablation, semantics, direction, the failing format) is what the file records it was found under, else the
    defaults; `notes` says each choice that differs from the file or that the file does not record."""

    ablation, semantics, direction, bad, notes = evaluation_options(
        edges, case, ablation=ablation, semantics=semantics, direction=direction, bad=bad, where=where)
    site = EdgeSite.of(model.cfg, ablation)
    if isinstance(edges, CircuitGraph):
        idx = edges_for_model(edges, site, model.cfg, where)
    else:
        idx = [site.index(e) for e in edges]
    check_semantics(semantics)
    runs = circuit_runs(case, model, site, semantics=semantics, direction=direction, bad=bad, tag=tag,
                        batch_size=batch_size)
    f, per_item = runs.value([idx])
    gap = float(runs.full.mean() - runs.empty.mean())
    ci = scaled(bootstrap_mean(runs.per_item(per_item[0])), gap)
    info = runs.info
    return {"case": case.name, "base": info["base"], "source": info["source"], "n_items": runs.explained.n_items,
            "n_edges": len(idx), "of_edges": len(site.edges), "faithfulness": float(f[0]),
            "faithfulness_ci": [ci.lo, ci.hi] if abs(gap) > 1e-12 else None, "semantics": semantics,
            "semantics_detail": runs.describe(), "ablation": ablation, "positions": runs.positions,
            "direction": direction, "failing_format": info["bad"], "prompts_run": info["source"], "notes": notes,
            "made": edges.made if isinstance(edges, CircuitGraph) else None,
            "empty": float(runs.empty.mean()), "full": float(runs.full.mean()), "circuit": float(per_item[0].mean())}
