"""The circuit graph as data: a `networkx.DiGraph`, and plain functions over it.

Nodes: `input`, every head `a{l}.h{h}`, every MLP `m{l}`, `logits` (kind input | head | mlp | logits,
with layer and head), and the heads' input ports `a{l}.h{h}<q>`, `<k>`, `<v>` (kind port; under
grouped-query attention the key/value ports are the key/value heads' `a{l}.g{g}<k>`), joined to their
head(s) by internal edges. Scored edges run from a sender to a port, an MLP or the logits, named as
EAP-IG names them (`a0.h1->a1.h2<k>`), and carry `score` (attribution), `exact` (measured effect, where
measured) and `in_circuit`. Display labels follow `L{l}H{h}`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

import networkx as nx
import numpy as np

if TYPE_CHECKING:  # a type only: reading and writing circuit files needs no torch
    from surgeon.sites.edges import EdgeSite


def _label(name: str) -> str:
    if name.startswith("a") and ".h" in name:
        layer, rest = name[1:].split(".h", 1)
        head, _, port = rest.partition("<")
        return f"L{layer}H{head}" + (f"<{port}" if port else "")
    if name.startswith("a") and ".g" in name:
        layer, rest = name[1:].split(".g", 1)
        g, _, port = rest.partition("<")
        return f"L{layer}KV{g}<{port}"
    if name.startswith("m") and name[1:].isdigit():
        return f"MLP{name[1:]}"
    return name


def build_graph(site: EdgeSite, scores: Sequence[float] | None = None, exact: dict[int, float] | None = None,
                in_circuit: Iterable[int] = ()) -> nx.DiGraph:
    """The model's computation graph with each edge's score, measured effect and circuit membership."""
    g = nx.DiGraph(n_layers=site.n_layers)
    for s in site.senders:
        kind = s.kind
        g.add_node(s.name, kind=kind, layer=s.layer, head=s.unit if kind == "head" else -1, label=_label(s.name))
    g.add_node("logits", kind="logits", layer=site.n_layers, head=-1, label="logits")
    n_heads = sum(1 for s in site.senders if s.kind == "head" and s.layer == 0)
    for r in site.receivers:
        if r.kind in "qkv":
            g.add_node(r.name, kind="port", port=r.kind, layer=r.layer, head=r.unit, label=_label(r.name))
            if r.kind == "q" or r.name.startswith(f"a{r.layer}.h"):
                heads = [r.unit]
            else:  # a key/value head feeds every query head of its group
                G = sum(1 for x in site.receivers if x.kind == "k" and x.layer == r.layer)
                heads = [h for h in range(n_heads) if h // (n_heads // G) == r.unit]
            for h in heads:
                g.add_edge(r.name, f"a{r.layer}.h{h}", internal=True, name="", score=0.0, exact=float("nan"),
                           in_circuit=False)
    scores = np.zeros(len(site.edges)) if scores is None else np.asarray(scores, dtype=float)
    chosen = set(in_circuit)
    exact = exact or {}
    for e, (si, ri) in enumerate(site.edges):
        s, r = site.senders[si].name, site.receivers[ri].name
        g.add_edge(s, r, internal=False, name=f"{s}->{r}", index=e, score=float(scores[e]),
                   exact=float(exact.get(e, float("nan"))), in_circuit=e in chosen)
    return g


def circuit_subgraph(g: nx.DiGraph) -> nx.DiGraph:
    """The edges in the circuit, with the internal port edges they need, and the nodes they touch."""
    keep = [(u, v) for u, v, d in g.edges(data=True) if d["in_circuit"]]
    nodes = {x for e in keep for x in e}
    keep += [(u, v) for u, v, d in g.edges(data=True) if d["internal"] and u in nodes]
    return g.edge_subgraph(keep).copy()


def prune_dangling(g: nx.DiGraph, edges: Iterable[int]) -> set[int]:
    """The given scored edges less those on no complete path input -> logits within them (nodes that
    lose every input or every output drop out with their edges)."""
    edges = set(edges)
    sub = nx.DiGraph()
    index = {}
    for u, v, d in g.edges(data=True):
        if d["internal"]:
            sub.add_edge(u, v)
        elif d["index"] in edges:
            sub.add_edge(u, v)
            index[(u, v)] = d["index"]
    if "input" not in sub or "logits" not in sub:
        return set()
    fwd = nx.descendants(sub, "input") | {"input"}
    back = nx.ancestors(sub, "logits") | {"logits"}
    alive = fwd & back
    return {e for (u, v), e in index.items() if u in alive and v in alive}


def strongest_paths(g: nx.DiGraph, k: int, candidates: int = 2000, start: str = "input") -> list[list[int]]:
    """The k complete paths to the logits with the largest product of |edge score|, as lists of scored edge
    indices (ranked with networkx's k-shortest simple paths on -log of the normalized scores, over the
    `candidates` highest-scoring edges). `start="input"`: paths input -> ... -> logits; `start="any"`: paths
    from any sender (the input, a head, an MLP) to the logits."""
    scored = sorted(((abs(d["score"]), u, v, d["index"]) for u, v, d in g.edges(data=True) if not d["internal"]),
                    reverse=True)[:candidates]
    top = max((s for s, *_ in scored), default=0.0)
    if top <= 0:
        return []
    h = nx.DiGraph()
    for s, u, v, e in scored:
        if s > 0:
            h.add_edge(u, v, weight=-np.log(s / top), index=e)
    for u, v, d in g.edges(data=True):
        if d["internal"]:
            h.add_edge(u, v, weight=0.0, index=None)
    source = "input"
    if start == "any":
        source = ("start",)  # a node no graph name can equal
        for n, d in g.nodes(data=True):
            if d.get("kind") in ("input", "head", "mlp") and n in h:
                h.add_edge(source, n, weight=0.0, index=None)
    if source not in h or "logits" not in h or not nx.has_path(h, source, "logits"):
        return []
    out = []
    for path in nx.shortest_simple_paths(h, source, "logits", weight="weight"):
        out.append([h.edges[a, b]["index"] for a, b in zip(path, path[1:]) if h.edges[a, b]["index"] is not None])
        if len(out) == k:
            break
    return out


def path_nodes(g: nx.DiGraph, path: Sequence[int]) -> list[str]:
    """The nodes a path of scored edges visits: input, a0.h1, a1.h2<k>, logits (ports where it enters a head)."""
    by_index = {d["index"]: (u, v) for u, v, d in g.edges(data=True) if not d["internal"]}
    out = []
    for e in path:
        u, v = by_index[e]
        if not out:
            out.append(u)
        out.append(v)
    return out


def matches(nodes: Sequence[str], pattern: Sequence[str]) -> bool:
    """Whether a path's nodes follow a pattern: a pattern entry with a port (`a1.h2<k>`) must match
    exactly; one without (`a0.h1`) matches that head through any of its ports."""
    if len(nodes) != len(pattern):
        return False
    return all(n == p if "<" in p else n.split("<")[0] == p for n, p in zip(nodes, pattern))
