"""Feature circuits: which SAE features, and which SAEs' error terms, carry the difference between the failing and
the working format to the answer (Marks et al. 2024, Sparse Feature Circuits; nodes only, over items).

Nodes are every feature of the SAEs named (one or more hook points) plus one error node per SAE: Marks et al.'s error
term, act - decode(encode(act)). They are the units of `FeatureSite(error=True)`, one site per SAE, all on one
`Contrast` (the engine's mask between the two formats' runs, at the case's aligned positions), so a node patched
is that feature (or error term) moved to the other run's value with everything else left to the model.

- **Attribution** (an estimate of every node's effect): "gradient" is d(mean score)/d(mask) at 0 for every node of
  every SAE from one backward pass (Marks et al.'s attribution patching); "ig" integrates that gradient along the
  mask from 0 to 1 for one SAE at a time, the others clean (their `_pe_ig`: the features of one submodule
  interpolated, `steps` midpoints in the batch dimension); "ig-marks" at their points k/steps, k = 0..steps-1.
- **Exact**: the `verify` nodes with the largest attributions, each patched alone, per item; the mean effect with
  a 95% bootstrap interval over items, as a fraction of the gap between the formats. A node (one per feature, not
  per position) is patched at every aligned position at once (`exact="joint"`, the effect of the node as the circuit
  uses it), or, as Marks et al.'s `_pe_exact` with node effects summed over positions, at one position at a time
  with the effects summed (`exact="per-position"`); the two differ wherever positions interact.
- **Both directions**: "denoise" patches the working format's values into the failing run, "noise" the failing
  format's into the working run.
- **The circuit** of a direction is a set C of nodes on that direction's base run (the failing format's for
  denoise). Ablating a node gives it the other run's value (resample ablation). Faithfulness (Marks et al. §3):
  (m(C) - m(none)) / (m(all) - m(none)), where m(C) keeps C and ablates every other node, m(all) is the run itself
  and m(none) ablates every node; completeness: the same with C ablated and the rest kept (0: C is all of it).
  The circuit is the smallest prefix of the nodes ranked by |attribution| whose faithfulness reaches `target`,
  or every node with |attribution| >= `threshold` (a fraction of the gap; `threshold_over="example"`: every node
  whose effect on one item at one aligned position reaches it, from the same method's per-example effects: surgeon's
  own node rule; Marks et al. threshold nodes on the aggregated effect and use the per-example, per-position
  threshold only to choose the downstream entries their edges are computed from).
- **Across formats**: the failing format's circuit (denoise) and the working format's (noise); their difference
  (nodes in one circuit and not the other, or in both with an attribution at least `STRONGER` times the other
  direction's); and the repair it suggests: every differing node given the working format's value in the failing
  run, with the rate of items it repairs (Wilson) and its fraction of the gap (bootstrap).

The error nodes' share of the circuit's attribution is reported: a circuit that runs through error terms explains
little (Marks et al.).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from surgeon.analyses.common import make_contrast
from surgeon.analyses.feature_edges import EDGE_RULES, Edge, edge_attribution, left_vectors, marks_entries, verify_edges
from surgeon.analyses.positions import slot_labels
from surgeon.analyses.scoring import FEATURE_METHODS, check_feature_method
from surgeon.case.select import pick_items
from surgeon.circuits.export import write
from surgeon.circuits.graph import CircuitGraph
from surgeon.errors import AnalysisError
from surgeon.show import Shows
from surgeon.sites.features import FeatureSite
from surgeon.sites.nodes import Site
from surgeon.case.case import Case
from surgeon.stats import Estimate, fraction_estimate, wilson

PROFILED = 24  # the first nodes of each circuit whose activations the result keeps (the report's hover)
STRONGER = 2.0  # a node in both circuits differs when its attribution in one direction is this many times the other's
CURVE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
EDGES_KEPT = 500  # edges among a circuit's nodes the result keeps (the strongest; the rest are left out)
EDGE_MIN = 0.01  # an edge is drawn in the circuit's graph when |attribution| >= this fraction of the gap ...
EDGES_PER_NODE = 3  # ... and is among the strongest EDGES_PER_NODE x (circuit nodes)


@dataclass(frozen=True)
class Node:
    """One node of a feature circuit: a feature of an SAE, or that SAE's error term."""

    hook: str
    layer: int
    unit: int  # the feature's index; d_sae for the error node
    error: bool
    slot: int | None = None  # the aligned position (patch slot) it is at; None: at every aligned position at once
    position: str = ""  # the slot's label (its most common token in the base format)

    @property
    def name(self) -> str:
        return f"{self.hook}[{'error' if self.error else f'f{self.unit}'}]" + (
            "" if self.slot is None else f"@{self.slot}")


@dataclass(frozen=True)
class Direction:
    """One direction's node effects and circuit (all effects as fractions of the gap between the formats)."""

    direction: str  # denoise | noise
    base: str  # the format whose run is patched
    source: str  # the format whose values are patched in
    base_mean: float
    source_mean: float
    attribution: np.ndarray  # [nodes] estimated effect of each node patched alone, fraction of the gap
    exact: dict[int, Estimate]  # node index -> exact effect of the node patched alone, fraction of the gap
    order: list[int]  # node indices by |attribution|, largest first
    circuit: list[int]  # node indices in the circuit
    faithfulness: Estimate  # of the circuit
    completeness: Estimate  # of the circuit (0: ablating it removes all of the behaviour)
    curve: list[tuple[int, float, float]]  # (size, faithfulness, completeness) over top-k prefixes of `order`
    error_share: float  # share of the circuit's |attribution| carried by error nodes
    search: str  # how the circuit was chosen
    edges: list[Edge] = field(default_factory=list)  # among the circuit's nodes, strongest first (feature_edges)
    edges_nonzero: int = 0  # how many edges among the circuit's nodes are nonzero (`edges` keeps EDGES_KEPT of them)

    def drawn_edges(self) -> list[Edge]:
        """The edges the circuit's graph shows: |attribution| >= EDGE_MIN of the gap, at most EDGES_PER_NODE per node."""
        return [e for e in self.edges if abs(e.attribution) >= EDGE_MIN][: EDGES_PER_NODE * len(self.circuit)]


@dataclass(frozen=True)
class Repair:
    """The repair the two circuits' difference suggests: its nodes given the working format's values in the failing
    run."""

    nodes: list[int]
    rate: Estimate | None  # items right when patched (Wilson)
    fraction: Estimate | None  # of the gap between the formats (bootstrap)
    base_rate: Estimate | None  # items right unpatched


@dataclass(frozen=True)
class Profile:
    """What a feature node reads in the two formats at the positions patching moves (the case's aligned ones, each
    item's mean over them): its mean activation over items in the working and the failing format, and the items it
    is most active on in the failing one (their values)."""

    good_mean: float
    bad_mean: float
    top_items: list[str]
    top_acts: list[float]


@dataclass(frozen=True)
class FeatureCircuitResult(Shows):
    case: str
    saes: list[tuple[str, str, int]]  # (hook, where the SAE came from, d_sae)
    nodes: list[Node]
    method: str
    steps: int
    n_items: int
    directions: dict[str, Direction]  # "denoise" | "noise"
    only_failing: list[int]  # node indices in the failing format's circuit and not the working one's, or STRONGER there
    only_working: list[int]  # node indices in the working format's circuit and not the failing one's, or STRONGER there
    repair: Repair
    profiles: dict[int, Profile] = field(default_factory=dict)  # node index -> profile, for the circuits' features
    good: str = ""  # the working format
    bad: str = ""  # the failing format
    execution: dict = field(default_factory=dict)
    edges_only_failing: list[tuple[int, int]] = field(default_factory=list)  # drawn edges of the failing format's
    # circuit absent from the working one's (or STRONGER there); and the other way round:
    edges_only_working: list[tuple[int, int]] = field(default_factory=list)
    exact: str = "joint"  # how a node's exact effect was taken (EXACT): at every aligned position at once, or summed
    threshold_over: str = "mean"  # what --threshold was applied to (THRESHOLD_OVER)
    edge_rule: str = "all"  # which downstream entries the edges are computed from (feature_edges.EDGE_RULES)

    def graph(self, direction: str = "denoise"):
        """The circuit of `direction` as surgeon's one circuit graph type (nodes of kind feature / error; no edges)."""
        d = self.directions[direction]
        g = CircuitGraph(n_layers=max(n.layer for n in self.nodes) + 1, cfg=None,
                         semantics=f"feature nodes, kept ({d.direction}: on the {d.base!r} run every node outside the "
                                   f"circuit carries the {d.source!r} run's value)")
        inside = set(d.circuit)
        for i, n in enumerate(self.nodes):
            if i in inside or i in d.exact:
                g.add_node(n.name, kind="error" if n.error else "feature", layer=n.layer, hook=n.hook, unit=n.unit,
                           label=f"L{n.layer} {'error' if n.error else f'f{n.unit}'}"
                                 + ("" if n.slot is None else f" @{n.slot}"), position=n.position,
                           score=float(d.attribution[i]), in_circuit=i in inside,
                           exact=float(d.exact[i].value) if i in d.exact else float("nan"))
        for e in d.drawn_edges():
            u, v = self.nodes[e.up].name, self.nodes[e.down].name
            g.add_edge(u, v, internal=False, name=f"{u}->{v}", index=None, score=float(e.attribution),
                       exact=float(e.exact.value) if e.exact is not None else float("nan"), in_circuit=True)
        return g

    def export(self, *paths, direction: str = "denoise") -> None:
        """Write the circuit of `direction` to each path, in the format its suffix names (.json .graphml .gexf .dot
        .tex .svg .pdf .png; a circuit of nodes has no EAP-IG / MIB form)."""
        g = self.graph(direction)
        for p in paths:
            if str(p).endswith(".mib.json"):
                raise AnalysisError("a feature circuit has no EAP-IG / MIB form (MIB's circuits are edges between "
                                    "heads and MLPs)", field="--export", fix="export .json, .graphml, .dot or .tex")
            write(g, p, title=f"{self.case}: feature circuit ({direction})")


# ----------------------------------------------------------------------------- the parts (plain functions)
def node_list(sites: Sequence[FeatureSite], slots: Sequence[str] | None = None) -> list[Node]:
    """Every site's features and error term; with `slots` (the aligned positions' labels) one node of each per slot,
    slot-major (node index = slot x units + unit), the order of the flat masks below."""
    per = []
    for s in sites:
        F = s.n_units() - 1
        per += [(s, u, u == F) for u in range(F + 1)]
    if slots is None:
        return [Node(s.hook, s.layer, u, e) for s, u, e in per]
    return [Node(s.hook, s.layer, u, e, j, label) for j, label in enumerate(slots) for s, u, e in per]


def _split(sites, flat: torch.Tensor, S: int | None = None) -> dict:
    """A mask over every node [P, nodes] as the sites' masks: {site: [P, units]}, or with S slots {site: [P, S,
    units]} (nodes slot-major)."""
    out, lo = {}, 0
    v = flat if S is None else flat.view(flat.shape[0], S, -1)
    for s in sites:
        out[s] = v[..., lo: lo + s.n_units()]
        lo += s.n_units()
    return out


def attribution(contrast, sites, method: str = "ig", steps: int = 5, S: int | None = None) -> np.ndarray:
    """[nodes] each node's estimated effect on the mean score (score units) by a registered feature method
    (`surgeon.analyses.scoring.FEATURE_METHODS`); S: one node per slot."""
    return check_feature_method(method).score(contrast, sites, steps, S)


def run_nodes(contrast, sites, sets: Sequence[Sequence[int]], complement: bool = False, S: int | None = None
              ) -> np.ndarray:
    """[len(sets), items] scores with each set's nodes patched (`complement`: every node outside the set)."""
    N = sum(s.n_units() for s in sites) * (1 if S is None else S)
    flat = torch.zeros(len(sets), N) if not complement else torch.ones(len(sets), N)
    for i, idx in enumerate(sets):
        flat[i, list(idx)] = 1.0 if not complement else 0.0
    with torch.no_grad():
        return contrast.run(_split(sites, flat, S)).double().cpu().numpy()


EXACT = {"joint": "each node patched at every aligned position at once",
         "per-position": "each node patched at one aligned position at a time, the effects summed (Marks et al.'s "
                         "_pe_exact, node effects summed over positions)"}


def per_position_exact(contrast, sites, top: Sequence[int], base: np.ndarray) -> np.ndarray:
    """[len(top), items] scores whose effect on each item is the sum over the aligned positions of node i patched
    there alone (a padded slot, where an item has fewer positions, moves nothing)."""
    S = contrast.n_slots
    U = sum(s.n_units() for s in sites)
    per = run_nodes(contrast, sites, [[j * U + i] for i in top for j in range(S)], S=S).reshape(len(top), S, -1)
    return base[None] + (per - base[None, None]).sum(1)


@dataclass(frozen=True)
class Points:
    """Where a feature method takes the metric's gradient (mask values of the SAE moved, the others clean), beside its
    registration in `surgeon.analyses.scoring.FEATURE_METHODS` (a test holds the shipped methods' names equal):
    `nodes` for its per-example effects (its own points), `edges` for an edge's left vector (0, the unpatched run's
    gradient, unless the method follows Marks et al.'s `jvp`, whose left vector is their IG-averaged gradient). A
    method registered without points runs everywhere (its edges' left vector at 0) but `threshold_over="example"`,
    which needs its per-example effects and refuses it."""

    nodes: Callable[[int], torch.Tensor]  # steps -> [points]
    edges: Callable[[int], torch.Tensor]


def _zero(steps: int) -> torch.Tensor:
    return torch.zeros(1)


def _midpoints(steps: int) -> torch.Tensor:
    return (torch.arange(steps, dtype=torch.float32) + 0.5) / steps


def _marks_points(steps: int) -> torch.Tensor:  # k/N, k = 0..N-1, from the run's own values (their `_pe_ig`)
    return torch.arange(steps, dtype=torch.float32) / steps


POINTS: dict[str, Points] = {"ig": Points(_midpoints, _zero), "ig-marks": Points(_marks_points, _marks_points),
                             "gradient": Points(_zero, _zero)}


def points_of(method: str) -> Points:
    """The registered method's points (one clear error for a method that has none)."""
    check_feature_method(method)
    if method not in POINTS:
        raise AnalysisError(f"feature method {method!r} has no per-example effects (no points in "
                            f"surgeon.analyses.feature_circuit.POINTS)", field="--threshold-over",
                            fix=f"use --threshold-over mean, or one of: {', '.join(m for m in FEATURE_METHODS if m in POINTS)}")
    return POINTS[method]


def edge_points(method: str, steps: int) -> torch.Tensor:
    """The downstream SAE's mask values an edge's left vector averages over under `method` (0 unless its points say)."""
    return POINTS[method].edges(steps) if method in POINTS else _zero(steps)


THRESHOLD_OVER = {"mean": "a node's attribution, the mean over items of its effect summed over the aligned positions",
                  "example": "a node's largest effect on one item at one aligned position (surgeon's own node rule: "
                             "Marks et al. threshold nodes on the aggregated effect, as 'mean', and apply the "
                             "per-example, per-position threshold only to choose the downstream entries their edges "
                             "are computed from)"}


def check_threshold_over(threshold_over: str, threshold: float | None, field: str = "--threshold-over") -> None:
    """One clear error for a choice of what the threshold applies to that is unknown or has no threshold to apply."""
    if threshold_over not in THRESHOLD_OVER:
        raise AnalysisError(f"threshold over {threshold_over!r} is not one of {', '.join(THRESHOLD_OVER)}",
                            field=field, fix="mean (the attribution, default; Marks et al.'s node rule) or example (surgeon's per-example "
                                "node rule)")
    if threshold_over != "mean" and threshold is None:
        raise AnalysisError(f"a threshold over {threshold_over!r} needs a threshold", field=field,
                            fix="give --threshold T (a fraction of the gap), or leave the choice out")


def check_edge_rule(edge_rule: str, threshold: float | None, field: str = "--edge-rule") -> None:
    """One clear error for an edge rule that is unknown or has no node threshold to choose entries with."""
    if edge_rule not in EDGE_RULES:
        raise AnalysisError(f"edge rule {edge_rule!r} is not one of {', '.join(EDGE_RULES)}", field=field,
                            fix="all (every downstream entry, default) or marks (Marks et al.'s: the entries whose "
                                "per-example effect reaches --threshold)")
    if edge_rule == "marks" and threshold is None:
        raise AnalysisError("the marks edge rule chooses downstream entries by the node threshold, and none is given",
                            field=field, fix="give --threshold T (a fraction of the gap), or leave --edge-rule out")


def per_example_effects(contrast, sites, method: str, steps: int) -> torch.Tensor:
    """[items, S, nodes of one slot] each node's estimated effect on each item's score at each aligned position alone
    (score units; padded slots 0), by the method's own points (its `points`: 0 for the gradient, the IG points for
    ig / ig-marks, one SAE moved at a time): the metric's gradient at the node averaged over the points, times the
    node's change between the runs (Marks et al.'s per-example, per-position effects). Summed over positions and
    averaged over items, it is the method's attribution."""
    pts = points_of(method).nodes(steps)
    out = []
    for s in sites:
        G, gf = left_vectors(contrast, s, pts)  # [n, S, d], [n, S, F]
        with torch.no_grad():
            w = s.sae.W_dec
            xb, xs = (contrast.activations(s.hook, run)[:, :, 0].to(w.device, w.dtype) for run in ("base", "source"))
            fb, fs = s.encode(xb), s.encode(xs)
            rb, rs = xb - s.decode(fb), xs - s.decode(fs)
            feats = gf.to(w.device, torch.float32) * (fs - fb).float()
            err = (G.to(w.device, torch.float32) * (rs - rb).float()).sum(-1, keepdim=True)
        out.append(torch.cat([feats, err], -1).double().cpu())
    return torch.cat(out, -1)


def per_example_peak(effects: torch.Tensor, by_position: bool) -> np.ndarray:
    """[nodes] each node's largest |effect| on one item at one aligned position (`per_example_effects`), in the node
    list's order: one per feature over every position, or (by_position) one per feature and slot, slot-major."""
    if by_position:
        return effects.abs().amax(0).reshape(-1).numpy()
    return effects.abs().amax((0, 1)).numpy()


def one_direction(case: Case, model, sites, direction: str, *, method: str, steps: int, verify: int,
                  target: float | None, threshold: float | None, bad: str | None, tag: str | None, batch_size: int,
                  by_position: bool = False, progress: bool = False, exact: str = "joint",
                  threshold_over: str = "mean", edge_rule: str = "all"):
    contrast, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                   sites=[Site.coerce(s.hook) for s in sites])
    base, source = contrast.clean_base.double().cpu().numpy(), contrast.clean_source.double().cpu().numpy()
    gap = float(source.mean() - base.mean())
    if abs(gap) < 1e-9:
        raise AnalysisError("the two formats score the same on these items: there is no difference to explain",
                            where=case.source, field="bad", fix="check the case with surgeon diagnose")
    S = contrast.n_slots if by_position else None
    labels = slot_labels(getattr(model, "tokenizer", None), contrast.slot_tokens(), contrast.align) if S else None
    nodes = node_list(sites, labels)
    N = len(nodes)
    attr = attribution(contrast, sites, method, steps, S) / gap
    order = [int(i) for i in np.argsort(-np.abs(attr), kind="stable")]
    top = [int(i) for i in order[:min(verify, N)]]
    if not top:
        single = np.zeros((0, len(base)))
    elif exact == "per-position" and S is None:
        single = per_position_exact(contrast, sites, top, base)
    else:  # a node per position is patched at its one position either way
        single = run_nodes(contrast, sites, [[i] for i in top], S=S)
    exact = {i: fraction_estimate(single[k], base, source) for k, i in enumerate(top)}
    # faithfulness: the run itself (nothing ablated) = 1, every node ablated (all patched) = 0
    everything = run_nodes(contrast, sites, [list(range(N))], S=S)[0]
    sizes = sorted({k for k in CURVE_SIZES if k < N} | {N})
    kept = run_nodes(contrast, sites, [order[:k] for k in sizes], complement=True, S=S)
    ablated = run_nodes(contrast, sites, [order[:k] for k in sizes], S=S)
    curve = [(k, fraction_estimate(kept[j], everything, base).value, fraction_estimate(ablated[j], everything, base).value)
             for j, k in enumerate(sizes)]
    effects = (per_example_effects(contrast, sites, method, steps)
               if threshold is not None and (threshold_over == "example" or edge_rule == "marks") else None)
    if threshold is not None and threshold_over == "example":
        peak = per_example_peak(effects, S is not None) / abs(gap)
        circuit = [int(i) for i in order if peak[i] >= threshold]
        search = (f"every node whose |effect| on one item at one aligned position reaches {threshold:g} of the gap "
                  f"(surgeon's per-example node rule; Marks et al. threshold nodes on the aggregated effect)")
    elif threshold is not None:
        circuit = [int(i) for i in order if abs(attr[i]) >= threshold]
        search = f"every node with |attribution| >= {threshold:g} of the gap"
    else:
        goal = 0.9 if target is None else target
        k = _smallest(contrast, sites, order, everything, base, goal, N, S)
        circuit = [int(i) for i in order[:k]]
        search = f"the smallest top-k by |attribution| with faithfulness >= {goal:g} (bisection over k)"
    keep = marks_entries(effects, nodes, circuit, threshold * abs(gap)) if edge_rule == "marks" else None
    edges, nonzero = circuit_edges(contrast, sites, nodes, circuit, S, gap, base, source, verify,
                                   edge_points(method, steps), keep)
    k_scores = run_nodes(contrast, sites, [circuit], complement=True, S=S)[0]
    a_scores = run_nodes(contrast, sites, [circuit], S=S)[0]
    total = float(np.abs(attr[circuit]).sum()) if circuit else 0.0
    err = float(sum(abs(attr[i]) for i in circuit if nodes[i].error)) / total if total > 0 else float("nan")
    d = Direction(direction, info["base"], info["source"], float(base.mean()), float(source.mean()), attr, exact, order,
                  circuit, fraction_estimate(k_scores, everything, base), fraction_estimate(a_scores, everything, base), curve, err, search,
                  edges, nonzero)
    return d, contrast, info, nodes, S


def circuit_edges(contrast, sites, nodes, circuit: Sequence[int], S: int | None, gap: float, base: np.ndarray,
                  source: np.ndarray, verify: int, left_points=None, keep: dict | None = None
                  ) -> tuple[list[Edge], int]:
    """The edges among the circuit's nodes (feature_edges): attribution for all (the downstream left vectors averaged
    over `left_points`, the method's `edge_points`; `keep`: the downstream entries each is computed from, Marks et
    al.'s edge rule), the `verify` strongest patched exactly (through the downstream node only, every entry), as
    fractions of the gap; the strongest EDGES_KEPT nonzero ones, and how many are nonzero."""
    att = edge_attribution(contrast, sites, nodes, down=circuit, up=circuit, S=S, left_points=left_points, keep=keep)
    ranked = [e for e in sorted(att, key=lambda e: -abs(att[e])) if att[e] != 0.0]
    exact = verify_edges(contrast, sites, nodes, ranked[:verify], S) if verify else {}
    return [Edge(u, d, att[(u, d)] / gap, fraction_estimate(exact[(u, d)], base, source) if (u, d) in exact else None)
            for u, d in ranked[:EDGES_KEPT]], len(ranked)


def differing_edges(a: Direction, b: Direction) -> list[tuple[int, int]]:
    """Edges a's graph draws that b's lacks, or whose |attribution| in a is at least STRONGER times b's."""
    other = {(e.up, e.down): abs(e.attribution) for e in b.edges}
    return [(e.up, e.down) for e in a.drawn_edges()
            if abs(e.attribution) >= STRONGER * other.get((e.up, e.down), 0.0)]


def differing(a: Direction, b: Direction) -> list[int]:
    """Nodes of a's circuit that b's lacks, or whose |attribution| in a is at least STRONGER times b's."""
    inside = set(b.circuit)
    return [i for i in a.circuit if i not in inside or abs(a.attribution[i]) >= STRONGER * abs(b.attribution[i])]


def _smallest(contrast, sites, order, everything, base, goal: float, N: int, S: int | None = None) -> int:
    """The smallest k whose top-k prefix, kept with the rest ablated, has faithfulness >= goal (faithfulness is
    evaluated at each bisection step; N when no prefix reaches it)."""
    def faith(k: int) -> float:
        return fraction_estimate(run_nodes(contrast, sites, [order[:k]], complement=True, S=S)[0], everything, base).value

    lo, hi = 0, N  # faith(N) = 1 by construction (nothing ablated)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if faith(mid) >= goal:
            hi = mid
        else:
            lo = mid
    return hi


def feature_circuit(case: Case, model, saes: dict, *, method: str = "ig", steps: int = 5, verify: int = 20,
                    target: float | None = None, threshold: float | None = None, bad: str | None = None,
                    tag: str | None = None, batch_size: int = 256, sources: dict | None = None,
                    by_position: bool = False, progress: bool = False, exact: str = "joint",
                    threshold_over: str = "mean", edge_rule: str = "all") -> FeatureCircuitResult:
    """The feature circuit of the failing format and of the working one over the SAEs `saes` ({layer: sae-lens
    SAE}), and their difference (see the module)."""
    check_feature_method(method)
    if threshold_over == "example":
        points_of(method)
    if exact not in EXACT:
        raise AnalysisError(f"exact effects {exact!r} are not one of {', '.join(EXACT)}", field="--exact",
                            fix="joint (every aligned position at once) or per-position (Marks et al.'s, summed)")
    if steps < 1 or verify < 0:
        raise AnalysisError("--steps must be at least 1 and --verify at least 0", field="--steps", fix="e.g. --steps 5")
    if target is not None and threshold is not None:
        raise AnalysisError("give --target or --threshold, not both", field="--threshold",
                            fix="--target F keeps the smallest circuit with faithfulness >= F; --threshold T every "
                                "node with |attribution| >= T")
    check_threshold_over(threshold_over, threshold)
    check_edge_rule(edge_rule, threshold)
    if edge_rule == "marks":
        points_of(method)
    if not saes:
        raise AnalysisError("no SAEs given", field="--layers", fix="name the layers whose SAEs form the nodes")
    sites = [FeatureSite.of(saes[layer], error=True) for layer in sorted(saes)]
    kw = dict(method=method, steps=steps, verify=verify, target=target, threshold=threshold, bad=bad, tag=tag,
              batch_size=batch_size, by_position=by_position, progress=progress, exact=exact,
              threshold_over=threshold_over, edge_rule=edge_rule)
    den, c_den, info, nodes, S = one_direction(case, model, sites, "denoise", **kw)
    noi, _, _, nodes_n, _ = one_direction(case, model, sites, "noise", **kw)
    if len(nodes_n) != len(nodes):
        raise AnalysisError("the two formats align a different number of positions, so their nodes per position do "
                            "not correspond", where=case.source, field="--by-position",
                            fix="leave out --by-position (one node per feature at every aligned position)")
    only_f = differing(den, noi)
    only_w = differing(noi, den)
    base, source = c_den.clean_base.double().cpu().numpy(), c_den.clean_source.double().cpu().numpy()
    if only_f or only_w:
        patched = run_nodes(c_den, sites, [only_f + only_w], S=S)[0]
        right = c_den.metric.right_above
        repair = Repair(only_f + only_w, wilson(int((patched > right).sum()), len(patched)),
                        fraction_estimate(patched, base, source), wilson(int((base > right).sum()), len(base)))
    else:
        repair = Repair([], None, None, None)
    src = sources or {}
    shown = [i for i in dict.fromkeys(den.circuit[:PROFILED] + noi.circuit[:PROFILED]) if not nodes[i].error]
    return FeatureCircuitResult(case.name, [(s.hook, src.get(s.layer, ""), s.n_units() - 1) for s in sites], nodes,
                                method, steps, info["n_items"], {"denoise": den, "noise": noi}, only_f, only_w,
                                repair, profiles(c_den, case, sites, nodes, shown, tag),
                                case.good, info["bad"], execution=c_den.execution,
                                edges_only_failing=differing_edges(den, noi), edges_only_working=differing_edges(noi, den),
                                exact="joint" if by_position else exact, threshold_over=threshold_over,
                                edge_rule=edge_rule)


def profiles(contrast, case: Case, sites, nodes: Sequence[Node], shown: Sequence[int], tag: str | None = None,
             top: int = 3) -> dict[int, Profile]:
    """The `shown` feature nodes' activations in both runs of `contrast` (base: the failing format) at every item's
    aligned positions (the engine's cached activations: an item scored by several answer rows shows one of them)."""
    if not shown:
        return {}
    _, items = pick_items(case, tag)
    has = contrast.slot_items().T.double()  # [items, S]
    count = has.sum(1).clamp(min=1)
    by_hook = {s.hook: s for s in sites}
    acts = {}
    for h in {nodes[i].hook for i in shown}:
        site = by_hook[h]
        with torch.no_grad():
            acts[h] = tuple(site.encode(contrast.activations(h, run)[:, :, 0]).double().cpu() for run in ("source", "base"))
    out = {}
    for i in shown:
        n = nodes[i]
        g, b = ((x[..., n.unit] * has).sum(1) / count for x in acts[n.hook])  # [items] means over valid slots
        order = torch.argsort(-b, stable=True)[:top]
        out[i] = Profile(float(g.mean()), float(b.mean()),
                         [", ".join(f"{k}={v}" for k, v in items[int(j)].values.items()) for j in order],
                         [float(b[j]) for j in order])
    return out
