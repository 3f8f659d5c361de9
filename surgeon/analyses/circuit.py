"""Path-level circuit discovery: edges scored on the intervention core, complete paths verified by path
patching, a circuit pruned to a target faithfulness, and its faithfulness curve.

Every number comes from `Contrast.run` with an edge mask (`surgeon.edges`):
- `eap`: d(mean score)/d(mask) at mask 0 for every edge, one forward and one backward;
- `eap-ig`: that gradient averaged at `ig_steps` points along the mask from 0 to 1 (all steps in one batch);
- `exact`: the mean score with each edge patched alone minus the unpatched one, edges in the batch
  dimension (also used to verify the top `verify` edges of the estimates);
- circuits (and paths, as circuits of their edges): edges out of the input carry the other run's
  embedding, edges inside pass on what their senders now compute, every edge outside is frozen to this
  run's value (EAP-IG / MIB's evaluation; for one path it is path patching);
- faithfulness f = (m(circuit) - m(empty)) / (m(full) - m(empty)) with m the mean score, at the MIB
  edge fractions; every circuit of the curve is one row of one batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np

from ..case import Case
from ..errors import AnalysisError
from ..stats import Estimate, bootstrap_mean
from .common import Direction, make_contrast

Method = Literal["eap", "eap-ig", "exact"]
METHODS = ("eap", "eap-ig", "exact")
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
class CircuitResult:
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

    def names(self, edges: Sequence[int]) -> list[str]:
        return [self.edge_names[e] for e in edges]


def _mean_scores(contrast, site, masks):
    import torch

    with torch.no_grad():
        return contrast.run({site: masks}).cpu().numpy()  # [P, items]


def edge_scores(contrast, site, method: Method = "eap-ig", ig_steps: int = 5) -> np.ndarray:
    """[n_edges] each edge's (estimated) effect on the mean score when patched alone."""
    import torch

    E = len(site.edges)
    if method == "exact":
        base = float(contrast.clean_base.mean())
        out = np.zeros(E)
        step = 512
        for lo in range(0, E, step):
            idx = list(range(lo, min(E, lo + step)))
            m = torch.zeros(len(idx), E)
            m[torch.arange(len(idx)), idx] = 1
            out[idx] = _mean_scores(contrast, site, m).mean(1) - base
        return out
    if method not in METHODS:
        raise AnalysisError(f"unknown method {method!r}", field="--method", fix=f"use one of: {', '.join(METHODS)}")
    if ig_steps < 1:
        raise AnalysisError(f"--ig-steps {ig_steps} must be at least 1", field="--ig-steps", fix="e.g. 5")
    alphas = [0.0] if method == "eap" else [(i + 0.5) / ig_steps for i in range(ig_steps)]
    m = torch.tensor(alphas)[:, None].repeat(1, E).requires_grad_(True)
    with torch.enable_grad():
        contrast.run({site: m}).mean(1).sum().backward()
    return m.grad.mean(0).numpy().astype(float)


def semantics(contrast) -> str:
    """How circuits are run on this contrast: `chain` when every position is aligned (align="index": the
    other run differs from this one only through the input, so a circuit's difference starts at its edges
    out of the input and travels along its edges, every other edge frozen), else `edge-set` (formats of
    different lengths: the difference also enters through what every sender computed over its own prompt's
    other positions, which no edge out of the input carries; a circuit is then its edges patched together,
    each carrying the other run's sender output in place of the current one, as exact edge patching does)."""
    return "chain" if getattr(contrast, "align", None) == "index" else "edge-set"


def circuit_scores(contrast, site, edge_sets: Sequence[Sequence[int]]):
    """[P, items] scores with each edge set run as a circuit, every edge outside it frozen to this run's value.
    `chain` semantics (index alignment): its edges out of the input carry the other run's embedding and its
    other edges pass on their senders' current outputs: with every edge, that is the other run; with none, this
    run; with the edges of one complete path, it is path patching (the change reaches the logits through the
    path alone). `edge-set` semantics (other alignments): its edges are patched (the other run's sender
    outputs at the aligned positions), the others carry current values; every edge gives the other run."""
    import torch

    from ..edges import EdgeSite

    freeze = EdgeSite(site.senders, site.receivers, site.edges, site.n_layers, ablation="freeze")
    from_input = torch.tensor([site.senders[s].kind == "input" for s, _ in site.edges])
    inside = site.mask([list(x) for x in edge_sets])
    if semantics(contrast) == "edge-set":
        with torch.no_grad():
            return contrast.run({site: inside}).cpu().numpy()
    first = inside * from_input[None].float()
    with torch.no_grad():
        return contrast.run({site: first, freeze: 1 - inside}).cpu().numpy()


def full_circuit(contrast, site) -> np.ndarray:
    """[items] scores of the circuit of every edge: the other run's scores (positions outside the aligned ones
    keep this run's values, which the scored positions of the other run do not read under `edge-set`)."""
    return circuit_scores(contrast, site, [range(len(site.edges))])[0]


def faithfulness(contrast, site, edge_sets: Sequence[Sequence[int]], full: np.ndarray | None = None):
    """Per circuit: faithfulness of the mean score, and per-item scores [P, items]; circuits in one batch."""
    scores = circuit_scores(contrast, site, edge_sets)
    full = full_circuit(contrast, site) if full is None else full
    empty, full = float(contrast.clean_base.mean()), float(np.mean(full))
    gap = full - empty
    f = (scores.mean(1) - empty) / gap if abs(gap) > 1e-12 else np.full(len(edge_sets), np.nan)
    return f, scores


path_patch = circuit_scores  # a path is a circuit of the edges along it


def _area(x: Sequence[float], y: Sequence[float]) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2))


def discover(case: Case, model, *, method: Method = "eap-ig", ablation: str = "resample",
             direction: Direction = "denoise", bad: str | None = None, tag: str | None = None,
             target: float | None = 0.9, n_edges: int | None = None, n_paths: int = 10, ig_steps: int = 5,
             verify: int = 50, min_share: float = 0.1, min_items: float = 0.5, batch_size: int = 256) -> CircuitResult:
    """Score every edge, verify the top ones, draw the faithfulness curve, prune a circuit (the smallest
    top-scoring edge set reaching `target` faithfulness, or the top `n_edges`, less dangling edges) and
    rank its complete paths by path patching."""
    from ..circuits.graph import build_graph, prune_dangling, strongest_paths, path_nodes
    from ..edges import EdgeSite

    if target is not None and not 0 < target <= 1.5:
        raise AnalysisError(f"faithfulness target {target} is not in (0, 1.5]", field="--faithfulness", fix="e.g. 0.9")
    if n_edges is not None and n_edges < 1:
        raise AnalysisError(f"--edges {n_edges} must be at least 1", field="--edges", fix="e.g. 50")
    site = EdgeSite.of(model.cfg, ablation)
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=site.node_sites())
    E = len(site.edges)
    full = full_circuit(contrast, site)
    scores = edge_scores(contrast, site, method, ig_steps)
    order = np.argsort(-np.abs(scores), kind="stable")
    exact: dict[int, float] = {}
    pearson = None
    if method == "exact":
        exact = {int(e): float(scores[e]) for e in range(E)}
    elif verify > 0:
        top = [int(e) for e in order[:verify]]
        import torch

        m = torch.zeros(len(top), E)
        m[torch.arange(len(top)), top] = 1
        ex = _mean_scores(contrast, site, m).mean(1) - float(contrast.clean_base.mean())
        exact = {e: float(v) for e, v in zip(top, ex)}
        if len(top) > 2 and np.std(ex) > 0 and np.std(scores[top]) > 0:
            pearson = float(np.corrcoef(scores[top], ex)[0, 1])
    # faithfulness curve at MIB's fractions (plus the empty circuit), every circuit in one batch
    counts = [0] + [max(1, int(round(fr * E))) for fr in CURVE]
    f_curve, _ = faithfulness(contrast, site, [order[:k] for k in counts], full)
    xs = [0.0] + list(CURVE)
    cpr, cmd = _area(xs, f_curve), _area(xs, np.abs(1 - f_curve))
    # step 1 of pruning: the smallest top-k edge set that reaches the target (bisection over k, 16 at a time)
    g = build_graph(site, scores, exact)
    if n_edges is not None:
        k = min(E, n_edges)
    else:
        lo, hi = 0, E  # f(top-hi) >= target is known for hi = E (the full patch has f = 1)
        while hi - lo > 1:
            cand = sorted({int(round(lo + (hi - lo) * (i + 1) / 17)) for i in range(16)} - {lo, hi} | {hi})
            f, _ = faithfulness(contrast, site, [order[:c] for c in cand], full)
            ok = [c for c, v in zip(cand, f) if v >= target]
            hi = min(ok) if ok else hi
            lo = max([c for c in cand if c < hi] + [lo])
            if not any(c < hi for c in cand):
                break
        k = hi
    circuit = [int(e) for e in order[:k]]
    # under chain semantics an edge on no complete path input -> logits carries nothing: drop it
    circuit = sorted(prune_dangling(g, circuit) if semantics(contrast) == "chain" else circuit)
    f_c, per_item = faithfulness(contrast, site, [circuit], full)
    boot = bootstrap_mean((per_item[0] - contrast.clean_base.cpu().numpy()))
    gap = float(full.mean() - contrast.clean_base.mean())
    ci = (boot.lo / gap, boot.hi / gap) if abs(gap) > 1e-12 else (float("nan"), float("nan"))
    g = build_graph(site, scores, exact, circuit)
    # paths: the strongest complete paths through the scored graph, verified by path patching
    paths: list[PathResult] = []
    if n_paths > 0:
        cand = strongest_paths(g, max(n_paths, 3 * n_paths))
        if cand:
            pp = path_patch(contrast, site, cand)
            base = contrast.clean_base.cpu().numpy()
            total = full - base
            for path, row in zip(cand, pp):
                eff = row - base
                with np.errstate(divide="ignore", invalid="ignore"):
                    share = np.where(np.abs(total) > 1e-9, eff / total, np.nan)
                fin = share[np.isfinite(share)]
                prod = float(np.prod([abs(scores[e]) for e in path]))
                paths.append(PathResult(path_nodes(g, path), [site.names[e] for e in path], prod, bootstrap_mean(eff),
                                        bootstrap_mean(fin), bool(len(fin) and (fin >= min_share).mean() >= min_items)))
            paths.sort(key=lambda p: -p.effect.value if direction == "denoise" else p.effect.value)
            paths = paths[:n_paths]
    return CircuitResult(
        case=case.name, method=method, ablation=ablation, direction=direction, base=info["base"],
        source=info["source"], tag=info["tag"], n_items=contrast.n_items, n_edges=E, edge_names=site.names,
        scores=scores, exact=exact, verify_pearson=pearson, empty=float(contrast.clean_base.mean()),
        full=float(full.mean()), curve_fractions=xs, curve_edges=counts, curve=[float(v) for v in f_curve],
        cpr=cpr, cmd=cmd, target=target if n_edges is None else None, circuit=circuit,
        circuit_faithfulness=float(f_c[0]), circuit_faithfulness_ci=ci, paths=paths,
        options=dict(method=method, ablation=ablation, direction=direction, ig_steps=ig_steps, verify=verify,
                     target=target, n_edges=n_edges, n_paths=n_paths, min_share=min_share, min_items=min_items,
                     semantics=semantics(contrast), align=contrast.align))


def evaluate_circuit(case: Case, model, edges: Sequence[str], *, ablation: str = "resample",
                     direction: Direction = "denoise", bad: str | None = None, tag: str | None = None,
                     batch_size: int = 256) -> dict:
    """Faithfulness of a given edge set (e.g. read from a file), with a 95% interval over items."""
    from ..edges import EdgeSite

    site = EdgeSite.of(model.cfg, ablation)
    idx = [site.index(e) for e in edges]
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=site.node_sites())
    full = full_circuit(contrast, site)
    f, per_item = faithfulness(contrast, site, [idx], full)
    gap = float(full.mean() - contrast.clean_base.mean())
    boot = bootstrap_mean(per_item[0] - contrast.clean_base.cpu().numpy())
    return {"case": case.name, "base": info["base"], "source": info["source"], "n_items": contrast.n_items,
            "n_edges": len(idx), "of_edges": len(site.edges), "faithfulness": float(f[0]),
            "faithfulness_ci": [boot.lo / gap, boot.hi / gap] if abs(gap) > 1e-12 else None,
            "empty": float(contrast.clean_base.mean()), "full": float(full.mean()),
            "circuit": float(per_item[0].mean())}
