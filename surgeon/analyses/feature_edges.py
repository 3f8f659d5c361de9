"""Feature-to-feature edges of a feature circuit: how much of the metric an upstream node moves through one
downstream node (Marks et al. 2024, Sparse Feature Circuits, §2: edges between SAE features and error terms).

An edge u -> d joins nodes of two SAEs, u's hook point before d's. Its **attribution** is Marks et al.'s linear
edge effect, summed over the aligned positions and averaged over items,

    E(u -> d) = mean_items  sum_p  g_d(p) . (J_{d <- u} delta_u)(p),

with delta_u = u moved to the other run's value (the node patch), J the Jacobian of d's value (a feature's
activation, or the error term's vector) with respect to u's, and g_d = d(item score)/d(d's value) with every
path open (Marks et al.'s left vector; an error node's is the gradient at the hook point itself, a feature's
that gradient through the SAE's decoder), taken in the unpatched run, or, with `--method ig-marks` (their `jvp`'s
left vector), averaged over their integrated-gradients points with d's SAE moved towards the other run. J runs through the model between the two hook points with every SAE
hook point in between **held** at its value (its output passes no gradient: features and error terms alike), so
E counts only the paths from u to d that pass through no other node of the graph: direct edges, as Marks et
al. compute them (their residual-stream graph subtracts the paths through the intermediate MLP and attention
nodes). One backward pass gives every upstream node's edge into a set of downstream nodes: the downstream nodes
are put in the batch dimension (one patch each, `Contrast.gradient(read=...)` reading each its own node), and
the gradient with respect to the upstream SAE's mask at 0 is g . J . delta for every upstream node at once.

**Exact** (the top edges verified): u patched alone, the SAE hook points in between held at the unpatched run's
values, gives d a new value d'; then, in the unpatched run, d alone is set to d' (`FeatureSite(source=...)`,
everything else as it was): the change of the mean score is the effect of u that reaches the answer through d
only (path patching with only d's input path open). Both as fractions of the gap between the formats.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from surgeon.analyses.scoring import feature_masks
from surgeon.engine.readout import At
from surgeon.errors import AnalysisError
from surgeon.sites.features import FeatureSite
from surgeon.sites.nodes import hook_layer
from surgeon.stats import Estimate

# where a hook point sits inside its block, in the order the forward pass computes them
_WITHIN = ("hook_resid_pre", "attn.", "hook_attn_out", "hook_resid_mid", "mlp.", "hook_mlp_out", "hook_resid_post")


@dataclass(frozen=True)
class Edge:
    """u -> d between two nodes of a feature circuit (indices into its node list); effects as fractions of the
    gap between the formats."""

    up: int
    down: int
    attribution: float
    exact: Estimate | None = None


def hook_rank(hook: str) -> tuple[int, int]:
    """(layer, place within the block): hook points in the order the forward pass computes them."""
    rest = hook.split(".", 2)[2]
    for k, name in enumerate(_WITHIN):
        if rest == name or (name.endswith(".") and rest.startswith(name)):
            return hook_layer(hook), k
    raise AnalysisError(f"cannot order the hook point {hook!r} for feature edges",
                        fix="use SAEs on hook_resid_pre, hook_attn_out, hook_resid_mid, hook_mlp_out or hook_resid_post")


def _index(sites: Sequence[FeatureSite], S: int | None):
    """node index <-> (site, unit, slot), as `feature_circuit.node_list` lays nodes out (slot-major)."""
    offset, lo = {}, 0
    for s in sites:
        offset[s.hook] = lo
        lo += s.n_units()
    return offset, lo


def _zeros(site: FeatureSite, P: int, S: int | None) -> torch.Tensor:
    return feature_masks([site], P, S)[site]


def left_vectors(contrast, site: FeatureSite, points: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """g at the hook point [n_items, S, d] (the error node's left vector) and through the decoder [n_items, S, F]
    (the features'): d(item score)/d(value), every path open, in the unpatched run (`points` None or [0]) or averaged
    over the runs with this SAE's nodes (features and error term) moved by each of `points` towards the other run's
    values, the other SAEs clean (Marks et al.'s `jvp` takes their `_pe_ig`'s averaged gradient as its left vector)."""
    pts = [0.0] if points is None else [float(a) for a in points]
    G = None
    for a in pts:
        g = contrast.activation_gradient({site: _zeros(site, 1, None) + a}, site.hook)
        G = g if G is None else G + g
    G = G / len(pts)
    F = site.n_units() - int(site.error)
    with torch.enable_grad():  # the decoder is affine in f: its vector-Jacobian product does not depend on f
        f0 = torch.zeros(*G.shape[:2], F, requires_grad=True)
        dec = site.decode(f0.to(site.sae.W_dec.device, site.sae.W_dec.dtype))
        (gf,) = torch.autograd.grad((dec * G.to(dec.device, dec.dtype)).sum(), f0)
    return G, gf.detach()


def _reader(site: FeatureSite, down: Sequence, G: torch.Tensor, gf: torch.Tensor, keep: Sequence | None = None):
    """The read for `Contrast.gradient`: patch k of a call reads downstream node down[k]'s g . value, summed over
    its slots (one slot for a node at one position); `keep[k]` [n_items, S] (bool, or None): only the (item, slot)
    entries it marks are read (Marks et al.'s edge rule, `marks_entries`)."""
    def read(x, items, valid, lo):
        S_ = x.shape[2]
        it = items.to(G.device)
        Gb = G[it, :S_].to(x.device, torch.float32)
        gfb = gf[it, :S_].to(x.device, torch.float32)
        f = site.encode(x)
        w = valid.to(x.device, torch.float32)
        rows = []
        for j in range(x.shape[0]):
            node = down[lo + j]
            if node.error:
                v = ((x[j].to(torch.float32) - site.decode(f[j]).to(torch.float32)) * Gb).sum(-1)  # [n, S']
            else:
                v = f[j, ..., node.unit].to(torch.float32) * gfb[..., node.unit]
            wj = w if node.slot is None else w * (torch.arange(S_, device=w.device) == node.slot).to(w.dtype)
            if keep is not None and keep[lo + j] is not None:
                wj = wj * keep[lo + j][items.cpu(), :S_].to(w.device, w.dtype)
            rows.append((v * wj).sum(-1))
        return torch.stack(rows)
    return read


def edge_attribution(contrast, sites: Sequence[FeatureSite], nodes: Sequence, down: Sequence[int],
                     up: Sequence[int] | None = None, S: int | None = None, left_points: torch.Tensor | None = None,
                     keep: dict | None = None) -> dict[tuple[int, int], float]:
    """{(u, d): E(u -> d)} in score units for every downstream node in `down` and every upstream node (or those in
    `up`) of an SAE whose hook point comes earlier; one backward pass per (upstream SAE, downstream SAE) pair.
    `left_points`: the downstream SAE's mask values its left vectors average over (`left_vectors`; None: 0).
    `keep`: {d: bool [n_items, S]} the (item, aligned position) entries of downstream node d its edges are computed
    from (Marks et al.'s edge rule: `marks_entries`); None: every entry."""
    offset, U = _index(sites, S)
    wanted = None if up is None else set(up)
    out: dict[tuple[int, int], float] = {}
    for sd in sorted(sites, key=lambda s: hook_rank(s.hook)):
        D = [i for i in down if nodes[i].hook == sd.hook]
        earlier = [s for s in sites if hook_rank(s.hook) < hook_rank(sd.hook)]
        if not D or not earlier:
            continue
        G, gf = left_vectors(contrast, sd, left_points)
        read = At(sd.hook, _reader(sd, [nodes[i] for i in D], G, gf, None if keep is None else [keep.get(i) for i in D]))
        for su in earlier:
            between = [s.hook for s in sites if hook_rank(su.hook) < hook_rank(s.hook) < hook_rank(sd.hook)]
            grads, _ = contrast.gradient({su: _zeros(su, len(D), S)}, drop=between, read=read)
            g = grads[su].detach().double().cpu().reshape(len(D), -1).numpy()  # slot-major like the node list
            j = np.arange(g.shape[1])
            slot, unit = (np.zeros_like(j), j) if S is None else np.divmod(j, su.n_units())
            ids = (offset[su.hook] + unit + slot * U).tolist()
            cols = range(len(ids)) if wanted is None else [k for k, u in enumerate(ids) if u in wanted]
            for k, d in enumerate(D):
                row = g[k].tolist()
                out.update({(ids[c], d): row[c] for c in cols})
    return out


EDGE_RULES = {"all": "every (item, aligned position) entry of the downstream node (surgeon's default)",
              "marks": "only the downstream node's (item, aligned position) entries whose own effect reaches the node "
                       "threshold (Marks et al.'s: their per-example, per-position threshold chooses the entries "
                       "`jvp` is computed from)"}


def marks_entries(effects: torch.Tensor, nodes: Sequence, down: Sequence[int], threshold: float) -> dict:
    """{d: bool [n_items, S]} for each downstream node d: the entries whose per-example, per-position effect
    (`per_example_effects`: [items, S, nodes of one slot], score units) is at least `threshold` in size (Marks et
    al.'s `features_by_submod`, in score units)."""
    per_slot = effects.shape[-1]
    return {d: effects[:, :, d % per_slot].abs() >= threshold for d in down}


def _one_hot(site: FeatureSite, node, S: int | None) -> torch.Tensor:
    m = _zeros(site, 1, S)
    if S is None:
        m[0, node.unit] = 1.0
    else:
        m[0, node.slot, node.unit] = 1.0
    return m


def verify_edges(contrast, sites: Sequence[FeatureSite], nodes: Sequence, edges: Sequence[tuple[int, int]],
                 S: int | None = None) -> dict[tuple[int, int], np.ndarray]:
    """{(u, d): [items] scores} with u's effect let through d only (see the module): per upstream node, one run with
    u patched and the SAE hook points between held reads d's hook point; then one run per downstream node sets d
    alone to the value read. The held hook points are set to the unpatched run's values at the aligned positions:
    everywhere a patch can move them when those run to the end of the row, as they do under the usual alignments
    (last, index); an alignment that leaves positions out after its first would leave those free."""
    by_hook = {s.hook: s for s in sites}
    base_acts: dict[str, torch.Tensor] = {}
    out: dict[tuple[int, int], np.ndarray] = {}
    groups: dict[tuple[int, str], list[int]] = {}
    for u, d in edges:
        groups.setdefault((u, nodes[d].hook), []).append(d)
    for (u, hd), downs in groups.items():
        su, sd = by_hook[nodes[u].hook], by_hook[hd]
        if hook_rank(su.hook) >= hook_rank(sd.hook):
            raise AnalysisError(f"no edge from {nodes[u].name} to a node of {hd}: it is not downstream")
        masks = {su: _one_hot(su, nodes[u], S)}
        for s in sites:  # the SAE hook points between held at the unpatched run's values
            if hook_rank(su.hook) < hook_rank(s.hook) < hook_rank(sd.hook):
                if s.hook not in base_acts:
                    base_acts[s.hook] = contrast.activations(s.hook, "base")[:, :, 0]
                held = FeatureSite.of(s.sae, s.hook, error=True, source=base_acts[s.hook])
                masks[held] = torch.ones(1, held.n_units()) if S is None else torch.ones(1, S, held.n_units())
        seen = torch.zeros(contrast.n_items, contrast.n_slots, sd.sae.cfg.d_in)

        def stash(x, items, valid, lo, seen=seen):
            seen[items.cpu(), : x.shape[2]] = x[0].detach().float().cpu()
            return torch.zeros(x.shape[0], x.shape[1], device=x.device)

        with torch.no_grad():
            contrast.run(masks, read=At(sd.hook, stash))
            to = FeatureSite.of(sd.sae, sd.hook, error=True, source=seen)
            m = torch.cat([_one_hot(to, nodes[d], S) for d in downs])
            scores = contrast.run({to: m}).double().cpu().numpy()
        for k, d in enumerate(downs):
            out[(u, d)] = scores[k]
    return out

