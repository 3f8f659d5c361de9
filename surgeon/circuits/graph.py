"""The circuit graph: one type (`CircuitGraph`, a `networkx.DiGraph`) for every circuit surgeon finds, writes and
reads back, with symmetric JSON (`to_json` / `from_json`, as EAP-IG's `Graph`), and plain functions over it.

Nodes: `input`, every head `a{l}.h{h}`, every MLP `m{l}`, `logits` (kind input | head | mlp | logits,
with layer and head), and the heads' input ports `a{l}.h{h}<q>`, `<k>`, `<v>` (kind port; under
grouped-query attention the key/value ports are the key/value heads' `a{l}.g{g}<k>`), joined to their
head(s) by internal edges. Scored edges run from a sender to a port, an MLP or the logits, named as
EAP-IG names them (`a0.h1->a1.h2<k>`), and carry `score` (attribution), `exact` (measured effect, where
measured) and `in_circuit`. Display labels follow `L{l}H{h}`. The graph's attributes: `n_layers`, `cfg` (the
model's shape: n_layers, n_heads, n_key_value_heads, d_model, parallel_attn_mlp) and `semantics` (how the circuit
runs: kept or knockout), each None where a file did not say.

The JSON (`to_json`; the `.json` export) is EAP-IG's layout with surgeon's fields beside EAP-IG's:

    {"format": "surgeon-circuit", "version": 1, "semantics": "kept", "n_layers": 3,
     "cfg":   {"n_layers": 3, "n_heads": 8, "n_key_value_heads": 2, "d_model": 64, "parallel_attn_mlp": false},
     "nodes": {"a0.h1": {"in_graph": true, "kind": "head", "layer": 0, "head": 1, "label": "L0H1"}, ...},
     "ports": {"a1.h2<k>": {"kind": "port", "port": "k", "layer": 1, "head": 2, "label": "L1H2<k", "feeds": ["a1.h2"]}},
     "edges": {"a0.h1->a1.h2<k>": {"score": 0.12, "in_graph": true, "exact": 0.1, "index": 57}, ...}}

`in_graph` is EAP-IG's name for circuit membership (a node is in the graph when a circuit edge touches it);
`exact` is null where not measured; `index` is the edge's position in the model's edge order. Without grouped-query
attention the file is one EAP-IG's `Graph.from_json` reads (it ignores the fields it does not know); the `.mib.json`
export is EAP-IG's own layout for every model.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import networkx as nx
import numpy as np

from surgeon.version import __version__

if TYPE_CHECKING:  # a type only: reading and writing circuit files needs no torch
    from surgeon.sites.edges import EdgeSite

FORMAT, VERSION = "surgeon-circuit", 1
CFG_KEYS = ("n_layers", "n_heads", "n_key_value_heads", "d_model", "parallel_attn_mlp")


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


_NODE = re.compile(r"a(?P<layer>\d+)\.(?P<hg>[hg])(?P<unit>\d+)(?:<(?P<port>[qkv])>)?|m(?P<mlp>\d+)")


def node_attrs(name: str, n_layers: int | None = None) -> dict:
    """A node's attributes from its EAP-IG name alone (kind unknown for a name of no known form)."""
    if name == "input":
        return {"kind": "input", "layer": -1, "head": -1, "label": "input"}
    if name == "logits":
        return {"kind": "logits", "layer": n_layers if n_layers is not None else -1, "head": -1, "label": "logits"}
    m = _NODE.fullmatch(name)
    if m is None or (m["hg"] == "g" and not m["port"]):
        return {"kind": "unknown", "layer": -1, "head": -1, "label": name}
    if m["mlp"] is not None:
        return {"kind": "mlp", "layer": int(m["mlp"]), "head": -1, "label": _label(name)}
    d = {"layer": int(m["layer"]), "head": int(m["unit"]), "label": _label(name)}
    return {"kind": "port", "port": m["port"], **d} if m["port"] else {"kind": "head", **d}


def cfg_dict(cfg) -> dict | None:
    """The model shape a circuit file records (EAP-IG's cfg keys, and n_key_value_heads under grouped-query
    attention), from a TransformerLens config, a stand-in or a dict."""
    if cfg is None:
        return None
    get = cfg.get if isinstance(cfg, Mapping) else (lambda k, default=None: getattr(cfg, k, default))
    out = {"n_layers": get("n_layers"), "n_heads": get("n_heads"), "d_model": get("d_model"),
           "parallel_attn_mlp": bool(get("parallel_attn_mlp", False))}
    G = get("n_key_value_heads", None)
    if G and G != out["n_heads"]:
        out["n_key_value_heads"] = G
    return out


def _finite(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


class CircuitGraph(nx.DiGraph):
    """A model's edge graph with each edge's score, measured effect and circuit membership: what `surgeon circuit`
    finds, every export writes, the report's circuit view draws and `surgeon circuit-eval` reads back (from any of
    the JSON files). A `networkx.DiGraph`, so networkx's algorithms and writers take it as it is."""

    @property
    def cfg(self) -> dict | None:
        return self.graph.get("cfg")

    @property
    def semantics(self) -> str | None:
        return self.graph.get("semantics")

    @property
    def made(self) -> dict | None:
        """How the circuit was found, as the finding run recorded it (`made_by`), or None where a file did not say."""
        return self.graph.get("made")

    def scored(self):
        """(sender, receiver, attributes) of every scored (not internal) edge."""
        return ((u, v, d) for u, v, d in self.edges(data=True) if not d["internal"])

    def marks(self) -> dict[str, bool]:
        """{edge name: in the circuit} over the scored edges."""
        return {d["name"]: bool(d["in_circuit"]) for *_, d in self.scored()}

    def circuit_names(self) -> list[str]:
        return [n for n, inside in self.marks().items() if inside]

    def to_json(self) -> dict:
        """The graph as JSON data (the module's docstring shows the layout); `from_json` reads it back equal."""
        inside = {x for u, v, d in self.scored() if d["in_circuit"] for x in (u, v)}
        inside |= {n for n, d in self.nodes(data=True) if d.get("in_circuit")}  # a circuit of nodes (feature circuits)
        inside |= {h for p in list(inside) if self.nodes[p]["kind"] == "port" for h in self.successors(p)}
        nodes, ports = {}, {}
        for n, d in self.nodes(data=True):
            attrs = {k: _finite(v) for k, v in d.items()}
            if d["kind"] == "port":
                ports[n] = {**attrs, "feeds": sorted(self.successors(n), key=lambda h: self.nodes[h].get("head", 0))}
            else:
                nodes[n] = {"in_graph": n in inside, **attrs}
        edges = {}
        for *_, d in self.scored():
            e = {"score": float(d["score"]), "in_graph": bool(d["in_circuit"]), "exact": _finite(d["exact"])}
            if d.get("index") is not None:
                e["index"] = int(d["index"])
            edges[d["name"]] = e
        out = {"format": FORMAT, "version": VERSION, "semantics": self.semantics, "n_layers": self.graph["n_layers"],
               "cfg": self.cfg, "nodes": nodes, "ports": ports, "edges": edges}
        if self.made:
            out["made"] = dict(self.made)
        return out

    @classmethod
    def from_json(cls, data: dict) -> CircuitGraph:
        """A graph from `to_json`'s data, or from an EAP-IG / MIB circuit JSON (`cfg`, `nodes`, `edges` with `score`
        and `in_graph`: nodes and ports follow from the edge names). Checks nothing: `circuits.export.read_circuit`
        checks a file before it gets here."""
        cfg = data.get("cfg")
        if data.get("format") != FORMAT:
            scores = {n: float(e.get("score", 0.0)) for n, e in data["edges"].items()}
            return cls.from_marks({n: bool(e["in_graph"]) for n, e in data["edges"].items()}, scores, cfg,
                                  data.get("semantics"))
        g = cls(n_layers=data["n_layers"], cfg=cfg, semantics=data.get("semantics"))
        if isinstance(data.get("made"), dict):
            g.graph["made"] = data["made"]
        for n, d in data["nodes"].items():
            g.add_node(n, **{k: v for k, v in d.items() if k != "in_graph"})
        for n, d in data["ports"].items():
            g.add_node(n, **{k: v for k, v in d.items() if k != "feeds"})
            for h in d["feeds"]:
                g.add_edge(n, h, **_INTERNAL)
        for name, e in data["edges"].items():
            u, v = name.split("->", 1)
            ex = e.get("exact")
            g.add_edge(u, v, internal=False, name=name, index=e.get("index"), score=float(e["score"]),
                       exact=float("nan") if ex is None else float(ex), in_circuit=bool(e["in_graph"]))
        return g

    @classmethod
    def from_marks(cls, marks: Mapping[str, bool], scores: Mapping[str, float] | None = None, cfg: dict | None = None,
                   semantics: str | None = None) -> CircuitGraph:
        """A graph of the named edges alone ({name: in the circuit}), nodes and ports read from the names (what a
        file that carries no more, an EAP-IG file or a circuit's results.json, gives)."""
        n_layers = (cfg or {}).get("n_layers") if isinstance(cfg, dict) else None
        parsed = [node_attrs(x) for name in marks for x in name.split("->", 1)]
        if not isinstance(n_layers, int):
            n_layers = max([d["layer"] + 1 for d in parsed if d["kind"] in ("head", "mlp", "port")] or [0])
        g = cls(n_layers=n_layers, cfg=cfg, semantics=semantics)
        scores = scores or {}
        for name, inside in marks.items():
            u, _, v = name.partition("->")
            for x in (u, v):
                if x not in g:
                    g.add_node(x, **node_attrs(x, n_layers))
                    d = g.nodes[x]
                    if d["kind"] == "port" and ".h" in x:
                        head = x.split("<")[0]
                        if head not in g:
                            g.add_node(head, **node_attrs(head, n_layers))
                        g.add_edge(x, head, **_INTERNAL)
            g.add_edge(u, v, internal=False, name=name, index=None, score=float(scores.get(name, 0.0)),
                       exact=float("nan"), in_circuit=bool(inside))
        return g


# how a circuit was found, in every export and read back by `surgeon circuit-eval` (`made_by`)
MADE_FIELDS = ("tool", "case", "method", "ablation", "semantics", "direction", "failing_format", "good_format",
               "prompts_run", "ablated_values", "tag", "n_items", "metric")


def made_by(*, case: str, method: str, ablation: str, semantics: str | None, direction: str, base: str, source: str,
            tag: str | None, n_items: int, metric: str | None = None) -> dict:
    """The record of how a circuit was found: the method, the ablation and which prompts it acts on, the semantics,
    the failing and the good format (denoise runs the failing format with the good one's values; noise the
    reverse), the items. What `circuit-eval` uses unless told otherwise."""
    bad, good = (base, source) if direction == "denoise" else (source, base)
    values = {"resample": f"the {base!r} run's sender outputs at the aligned positions",
              "mean": f"each sender's mean over the {source!r} items at each position",
              "zero": "zero"}.get(ablation, ablation)
    return {"tool": f"surgeon {__version__}", "case": case, "method": method, "ablation": ablation,
            "semantics": semantics, "direction": direction, "failing_format": bad, "good_format": good,
            "prompts_run": source, "ablated_values": values, "tag": tag, "n_items": n_items, "metric": metric}


_INTERNAL = dict(internal=True, name="", score=0.0, exact=float("nan"), in_circuit=False)


def build_graph(site: EdgeSite, scores: Sequence[float] | None = None, exact: dict[int, float] | None = None,
                in_circuit: Iterable[int] = (), cfg=None, semantics: str | None = None) -> CircuitGraph:
    """The model's computation graph with each edge's score, measured effect and circuit membership (`cfg`: the
    model's config or shape, recorded for the files; `semantics`: how the circuit runs)."""
    g = CircuitGraph(n_layers=site.n_layers, cfg=cfg_dict(cfg), semantics=semantics)
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
                g.add_edge(r.name, f"a{r.layer}.h{h}", **_INTERNAL)
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
