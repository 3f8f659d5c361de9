"""The scoring methods as registered functions, as sites, metrics and views are: edge scores for `surgeon circuit`
(`EDGE_METHODS`), unit scores for `surgeon attribute` (`UNIT_METHODS`) and feature-node scores for `surgeon
feature-circuit` (`FEATURE_METHODS`).

A new method is one function and a registration, `@edge_method("name")` or `@unit_method("name")`, beside its
one-line description in `surgeon.circuits.methods` (plain data, so that the CLI lists the methods and checks
`--method` without importing torch; registering a name that has no description there is refused, and a test holds
the two lists equal). The analyses call `score_edges` / `score_units` and never branch on a method's name: what
differs between methods (integrated-gradients steps, prompts of equal length, magnitudes only, the memory the method
needs, its backward passes) is a field of its registration.

Edge methods take (contrast, edge site, steps) and return [n_edges] estimated effects on the mean score of patching
each edge alone. Unit methods take (contrast, sites, component, units, steps) and return ([layer, unit] gradients of
the mean score, backward passes run). Feature methods take (contrast, feature sites, steps, slots) and return
[nodes] estimated effects of each node (every site's features and error term, slot-major with slots) patched alone.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from surgeon.circuits.methods import (
    ATTRIBUTION_IG_STEPS,
    ATTRIBUTION_METHODS,
    FEATURE_METHODS as FEATURE_DESCRIPTIONS,
    IG_METHODS,
    IG_STEPS,
    MAX_IG_STEPS,
    METHODS,
)
from surgeon.engine import memory
from surgeon.errors import AnalysisError
from surgeon.sites.qk_fix import QKFixSite


@dataclass(frozen=True)
class EdgeMethod:
    name: str
    score: Callable  # (contrast, site, steps) -> [n_edges]
    job: Callable  # (cfg, (nodes, edges), steps) -> memory.Job: what the memory plan counts for it
    ig: bool = False  # takes --ig-steps
    equal_length: bool = False  # needs prompts of equal length (align="index") and resample ablation
    exact: bool = False  # its scores are measured effects (no verification against itself)

    @property
    def describe(self) -> str:
        return METHODS[self.name]


@dataclass(frozen=True)
class UnitMethod:
    name: str
    gradient: Callable  # (contrast, sites, component, units, steps) -> ([layer, unit], backward passes)
    ig: bool = False
    magnitudes: bool = False  # estimates |effect|: scaled by |gap| and compared with |exact|

    @property
    def describe(self) -> str:
        return ATTRIBUTION_METHODS[self.name]


@dataclass(frozen=True)
class FeatureMethod:
    name: str
    score: Callable  # (contrast, sites, steps, S) -> [nodes]
    calls: Callable  # (steps, n_saes, first layer) -> the memory.Call's its gradients run (what the plan counts)

    @property
    def describe(self) -> str:
        return FEATURE_DESCRIPTIONS[self.name]


EDGE_METHODS: dict[str, EdgeMethod] = {}
UNIT_METHODS: dict[str, UnitMethod] = {}
FEATURE_METHODS: dict[str, FeatureMethod] = {}


def edge_method(name: str, *, job: Callable, equal_length: bool = False, exact: bool = False):
    """Register an edge-scoring function under `name` (which must have its description in METHODS)."""
    if name not in METHODS:
        raise ValueError(f"edge method {name!r} has no description in surgeon.circuits.methods.METHODS")

    def register(fn):
        EDGE_METHODS[name] = EdgeMethod(name, fn, job, name in IG_METHODS, equal_length, exact)
        return fn

    return register


def unit_method(name: str, *, ig: bool = False, magnitudes: bool = False):
    """Register a unit-scoring function under `name` (which must have its description in ATTRIBUTION_METHODS)."""
    if name not in ATTRIBUTION_METHODS:
        raise ValueError(f"unit method {name!r} has no description in surgeon.circuits.methods.ATTRIBUTION_METHODS")

    def register(fn):
        UNIT_METHODS[name] = UnitMethod(name, fn, ig, magnitudes)
        return fn

    return register


def feature_method(name: str, *, calls: Callable):
    """Register a feature-node scoring function under `name` (which must have its description in
    surgeon.circuits.methods.FEATURE_METHODS); `calls`: (steps, n_saes, first layer) -> its gradient calls, each
    under gradients (`memory.Call`s, for the memory plan)."""
    if name not in FEATURE_DESCRIPTIONS:
        raise ValueError(f"feature method {name!r} has no description in surgeon.circuits.methods.FEATURE_METHODS")

    def register(fn):
        FEATURE_METHODS[name] = FeatureMethod(name, fn, calls)
        return fn

    return register


def check_steps(ig_steps: int, fix: str) -> None:
    if not 1 <= ig_steps <= MAX_IG_STEPS:
        raise AnalysisError(f"--ig-steps {ig_steps} is not between 1 and {MAX_IG_STEPS}", field="--ig-steps", fix=fix)


# ---- edges ---------------------------------------------------------------------------------------------------------

def _mask_gradient(contrast, key, rows) -> np.ndarray:
    """The mean over mask rows of d(mean score)/d(mask) at each row, for the edge site `key` (pooled: the rows'
    gradients are summed before they meet the fixed sender differences, one contraction for all of them)."""
    grads, _ = contrast.gradient({key: rows}, pool=True)
    return grads[key][0].cpu().numpy().astype(float)


def _fixed_job(cfg, graph, steps):
    return memory.eap(cfg, graph, steps)


def _live_job(cfg, graph, steps):  # senders read live from the pass: their differences kept per mask row
    return replace(memory.eap(cfg, graph, steps), live=True)


def _exact_job(cfg, graph, steps):  # every edge patched alone, 512 per call
    edges = graph[1]
    first = memory.exact_edges(cfg, graph, min(512, edges))
    return replace(first, name=f"exact, all {edges:,} edges",
                   calls=(memory.Call(first.calls[0].patches, 0, -(-edges // 512)),))


@edge_method("eap", job=lambda cfg, graph, steps: memory.eap(cfg, graph, 1))
def _eap(contrast, site, steps):
    # at the zero mask every sender's current output is this run's, and a live difference's own change enters
    # multiplied by its edge's mask (zero): the gradient is the fixed differences' (no live capture)
    import torch

    return _mask_gradient(contrast, site.variant(difference="fixed"), torch.zeros(1, len(site.edges)))


@edge_method("eap-ig-inputs", job=_fixed_job, equal_length=True)
def _eap_ig_inputs(contrast, site, steps):
    # EAP-IG runs the clean (our base) tokens with the input at corrupted + k/steps (clean - corrupted),
    # k = 0..steps-1: in our terms base + beta (source - base) with beta = 1 - k/steps; the sender differences are
    # the two runs' own (fixed), as in its activation-difference buffer
    import torch

    senders = torch.tensor([s for s, _ in site.edges])
    betas = torch.tensor([1 - k / steps for k in range(steps)], dtype=torch.float64)  # exact for a float64 model
    return _mask_gradient(contrast, site.variant(difference="fixed"), betas[:, None] * (senders == 0).double()[None])


@edge_method("eap-ig-activations", job=_fixed_job)
def _eap_ig_activations(contrast, site, steps):
    # group by group (the input, each layer's heads, each MLP), alpha = k/steps, k = 1..steps
    import torch

    group_of = [("input",) if s.kind == "input" else (s.kind, s.layer) for s in site.senders]
    groups = sorted(set(group_of), key=lambda g: (-1, 0) if g == ("input",) else (g[1], g[0] == "mlp"))
    rows = []
    for g in groups:
        on = torch.tensor([group_of[s] == g for s, _ in site.edges], dtype=torch.float64)
        rows += [(1 - k / steps) * on for k in range(1, steps + 1)]
    return _mask_gradient(contrast, site.variant(difference="fixed"), torch.stack(rows))


@edge_method("eap-ig-masks", job=_live_job)
def _eap_ig_masks(contrast, site, steps):
    # every edge mask at the midpoints (i + 0.5)/steps, senders read live (the mask's own effect upstream counts)
    import torch

    return _mask_gradient(contrast, site, torch.tensor([(i + 0.5) / steps for i in range(steps)])[:, None]
                          .repeat(1, len(site.edges)))


@edge_method("exact", job=_exact_job, exact=True)
def _exact(contrast, site, steps, step: int = 512):
    import torch

    E = len(site.edges)
    base = float(contrast.clean_base.mean())
    out = np.zeros(E)
    for lo in range(0, E, step):
        idx = list(range(lo, min(E, lo + step)))
        m = torch.zeros(len(idx), E)
        m[torch.arange(len(idx)), idx] = 1
        with torch.no_grad():
            out[idx] = contrast.run({site: m}).cpu().numpy().mean(1) - base
    return out


def check_edge_method(method: str, ig_steps: int, contrast=None) -> EdgeMethod:
    """The registered method, or one clear error (unknown name, steps out of range, prompts of unequal length)."""
    if method == "eap-ig":
        raise AnalysisError("method 'eap-ig' was split in two", field="--method",
                            fix="use eap-ig-inputs (EAP-IG as hannamw/EAP-IG and MIB define it) or eap-ig-masks "
                                "(integrated gradients over the edge masks, what 'eap-ig' computed before)")
    if method not in EDGE_METHODS:
        raise AnalysisError(f"unknown method {method!r}", field="--method", fix=f"use one of: {', '.join(EDGE_METHODS)}")
    m = EDGE_METHODS[method]
    if m.ig:
        check_steps(ig_steps, f"e.g. {IG_STEPS} (MIB's choice)")
    if m.equal_length and contrast is not None and getattr(contrast, "align", None) != "index":
        raise AnalysisError(f"{method!r} interpolates the input embeddings of the two runs, which needs prompts of "
                            f"equal length (align='index'); this case aligns {contrast.align!r}", field="--method",
                            fix="use --method eap-ig-masks or exact for formats of different length")
    return m


def score_edges(contrast, site, method: str, ig_steps: int) -> np.ndarray:
    """[n_edges] each edge's (estimated) effect on the mean score when patched alone, by the registered `method`."""
    return EDGE_METHODS[method].score(contrast, site, ig_steps)


# ---- units ---------------------------------------------------------------------------------------------------------

def _unit_gradient(contrast, sites, U, alphas):
    grads, _ = contrast.gradient({s: alphas[:, None].repeat(1, U) for s in sites})
    return np.stack([grads[s].mean(0).cpu().numpy() for s in sites])


@unit_method("gradient")
def _gradient(contrast, sites, component, U, steps):
    import torch

    return _unit_gradient(contrast, sites, U, torch.zeros(1)), 1


@unit_method("ig", ig=True)
def _ig(contrast, sites, component, U, steps):
    import torch

    # one backward pass over its points, stacked in the batch dimension
    return _unit_gradient(contrast, sites, U, (torch.arange(steps) + 0.5) / steps), 1


@unit_method("atp*", magnitudes=True)
def _atp_star(contrast, sites, component, U, steps):
    """[layer, unit] AtP*: QK-fixed gradients (queries and keys) with GradDrop over the model's layers."""
    import torch

    keys = [QKFixSite(s) for s in sites] if component in ("q", "k") else list(sites)
    zeros = {k: torch.zeros(1, U) for k in keys}
    cfg = contrast.cfg
    L = cfg.n_layers
    if L == 1:  # no other layer to drop: the QK-fixed estimate's magnitude
        grads, _ = contrast.gradient(zeros)
        return np.abs(np.stack([grads[k][0].cpu().numpy() for k in keys])), 1
    total = np.zeros((len(keys), U))
    for layer in range(L):
        drop = [f"blocks.{layer}.hook_attn_out"] + ([] if cfg.attn_only else [f"blocks.{layer}.hook_mlp_out"])
        grads, _ = contrast.gradient(zeros, drop=drop)
        total += np.abs(np.stack([grads[k][0].cpu().numpy() for k in keys]))
    return total / (L - 1), L


def check_unit_method(method: str, ig_steps: int) -> UnitMethod:
    if method not in UNIT_METHODS:
        raise AnalysisError(f"unknown attribution method {method!r}", field="--method",
                            fix=f"use one of: {', '.join(UNIT_METHODS)}")
    m = UNIT_METHODS[method]
    if m.ig:
        check_steps(ig_steps, f"e.g. {ATTRIBUTION_IG_STEPS}")
    return m


# ---- feature nodes (SAE features and error terms) ------------------------------------------------------------------

def feature_masks(sites, P: int, S: int | None) -> dict:
    """Zero masks over every feature site: {site: [P, units]}, or [P, S, units] with a node per slot."""
    import torch

    return {s: torch.zeros(P, s.n_units()) if S is None else torch.zeros(P, S, s.n_units()) for s in sites}


def _feature_flat(sites, grads, row=None):
    """The sites' gradients as one vector over the nodes (slot-major): summed over rows, or row `row`'s."""
    import torch

    g = torch.cat([grads[s].sum(0) if row is None else grads[s][row] for s in sites], dim=-1)
    return g.reshape(-1)


def _feature_ig_at(contrast, sites, S, alphas):
    """Integrated gradients of every node at the points `alphas` of the mask, one SAE interpolated at a time with
    the others clean (Marks et al.'s `_pe_ig`); the gradients averaged over the points."""
    import torch

    steps = len(alphas)
    total = None
    for s in sites:
        masks = feature_masks(sites, steps, S)
        masks[s] = masks[s] + alphas.view(steps, *[1] * (masks[s].dim() - 1))
        grads, _ = contrast.gradient(masks)
        grads = {o: (g if o is s else torch.zeros_like(g)) for o, g in grads.items()}  # this SAE's share only
        part = _feature_flat(sites, grads) / steps
        total = part if total is None else total + part
    return total.double().cpu().numpy()


@feature_method("ig", calls=lambda steps, k, start: (memory.Call(steps, start, k),))
def _feature_ig(contrast, sites, steps, S):
    import torch

    return _feature_ig_at(contrast, sites, S, (torch.arange(steps, dtype=torch.float32) + 0.5) / steps)  # midpoints


@feature_method("ig-marks", calls=lambda steps, k, start: (memory.Call(steps, start, k),))
def _feature_ig_marks(contrast, sites, steps, S):
    import torch

    return _feature_ig_at(contrast, sites, S, torch.arange(steps, dtype=torch.float32) / steps)  # k/N from the run


@feature_method("gradient", calls=lambda steps, k, start: (memory.Call(1, start),))
def _feature_gradient(contrast, sites, steps, S):
    grads, _ = contrast.gradient(feature_masks(sites, 1, S))
    return _feature_flat(sites, grads, 0).double().cpu().numpy()


def check_feature_method(method: str) -> FeatureMethod:
    if method not in FEATURE_METHODS:
        raise AnalysisError(f"unknown attribution method {method!r}", field="--method",
                            fix=f"use one of: {', '.join(FEATURE_METHODS)}")
    return FEATURE_METHODS[method]
