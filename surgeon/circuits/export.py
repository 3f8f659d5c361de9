"""Circuit graphs written for papers and other tools; the format follows the file's suffix.

- `.graphml`, `.gexf`: networkx's writers (Gephi, Cytoscape);
- `.json`: networkx node-link JSON (our own format, read back by `read_edges`);
- `.mib.json`: EAP-IG / MIB circuit JSON (`cfg`, `nodes`, `edges` with `score` and `in_graph`, EAP-IG's
  names), which MIB's circuit track and EAP-IG's `Graph.from_json` read;
- `.dot`: Graphviz DOT, nodes ranked by layer; `.svg`, `.pdf`: rendered through the `dot` program;
- `.tex`: TikZ (networkx's `to_latex`), a standalone LaTeX document;
- `.png`: matplotlib, layered by layer (always available).
Every writer shows the circuit (the edges with `in_circuit`); the JSON formats carry every scored edge.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import networkx as nx

from ..errors import AnalysisError
from .graph import circuit_subgraph

FORMATS = (".graphml", ".gexf", ".json", ".mib.json", ".dot", ".svg", ".pdf", ".tex", ".png")


def suffix(path: Path) -> str:
    name = Path(path).name
    return ".mib.json" if name.endswith(".mib.json") else Path(path).suffix


def _clean(g: nx.DiGraph) -> nx.DiGraph:
    """A copy whose attribute values GraphML and GEXF accept (no NaN, no None)."""
    h = g.copy()
    for _, d in h.nodes(data=True):
        for k, v in list(d.items()):
            if v is None:
                d[k] = ""
    for _, _, d in h.edges(data=True):
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = -1.0 if k == "exact" else 0.0
                d["exact_measured"] = False if k == "exact" else d.get("exact_measured", True)
            elif k == "exact":
                d.setdefault("exact_measured", True)
    return h


def positions(g: nx.DiGraph) -> dict[str, tuple[float, float]]:
    """Layered layout: y by layer (ports just below their head), x by head."""
    pos = {}
    for n, d in g.nodes(data=True):
        layer, head = d.get("layer", 0), d.get("head", -1)
        y = 2.0 * (layer + 1) - (0.8 if d.get("kind") == "port" else 0.0)
        x = float(head if head >= 0 else 0) + (0.25 * "qkv".index(d["port"]) - 0.25 if d.get("kind") == "port" else 0)
        if d.get("kind") == "mlp":
            x = -1.5
        pos[n] = (x, y)
    return pos


def mib_json(g: nx.DiGraph, cfg) -> dict:
    """EAP-IG / MIB's circuit JSON."""
    nodes = {}
    for n, d in g.nodes(data=True):
        if d["kind"] != "port":
            nodes[n] = {"in_graph": False}
    edges = {}
    for u, v, d in g.edges(data=True):
        if d["internal"]:
            continue
        edges[d["name"]] = {"score": d["score"], "in_graph": bool(d["in_circuit"])}
        if d["in_circuit"]:
            nodes[u]["in_graph"] = True
            head = v.split("<")[0] if "<" in v else v
            if head in nodes:
                nodes[head]["in_graph"] = True
    return {"cfg": {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                    "parallel_attn_mlp": bool(getattr(cfg, "parallel_attn_mlp", False)), "d_model": cfg.d_model},
            "nodes": nodes, "edges": edges}


def dot(g: nx.DiGraph, title: str = "") -> str:
    c = circuit_subgraph(g)
    lines = ["digraph circuit {", "  rankdir=BT;", '  node [shape=box, style=rounded, fontname="Helvetica"];']
    if title:
        lines.append(f'  label="{title}"; labelloc=t;')
    by_layer: dict[int, list[str]] = {}
    for n, d in c.nodes(data=True):
        if d["kind"] == "port":
            continue
        by_layer.setdefault(d["layer"], []).append(n)
        lines.append(f'  "{n}" [label="{d["label"]}"];')
    for layer, ns in sorted(by_layer.items()):
        lines.append("  { rank=same; " + " ".join(f'"{n}";' for n in ns) + " }")
    for u, v, d in c.edges(data=True):
        if d["internal"]:
            continue
        head = next(iter(c.successors(v)), v) if c.nodes[v]["kind"] == "port" else v
        port = c.nodes[v].get("port", "")
        width = 1 + 3 * min(1.0, abs(d["score"]) / max(1e-12, max(abs(x["score"]) for *_, x in c.edges(data=True))))
        color = "#2166ac" if d["score"] >= 0 else "#b2182b"
        label = f', label="{port}"' if port else ""
        lines.append(f'  "{u}" -> "{head}" [penwidth={width:.2f}, color="{color}"{label}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def tikz(g: nx.DiGraph) -> str:
    c = circuit_subgraph(g)
    h = nx.DiGraph()
    pos = positions(c)
    for n, d in c.nodes(data=True):
        if d["kind"] != "port":
            h.add_node(n, label=d["label"])
    for u, v, d in c.edges(data=True):
        if not d["internal"]:
            head = next(iter(c.successors(v)), v) if c.nodes[v]["kind"] == "port" else v
            h.add_edge(u, head, label=c.nodes[v].get("port", ""))
    body = nx.to_latex(h, pos={n: (2 * pos[n][0], pos[n][1]) for n in h}, as_document=False,
                       node_label={n: h.nodes[n]["label"] for n in h},
                       edge_label={e: h.edges[e]["label"] for e in h.edges}, edge_label_options={e: "[midway, font=\\tiny]" for e in h.edges})
    return ("\\documentclass{standalone}\n\\usepackage{tikz}\n\\begin{document}\n" + body
            + "\n\\end{document}\n")


def png(g: nx.DiGraph, path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = circuit_subgraph(g)
    h = nx.DiGraph()
    for n, d in c.nodes(data=True):
        if d["kind"] != "port":
            h.add_node(n, **d)
    for u, v, d in c.edges(data=True):
        if not d["internal"]:
            head = next(iter(c.successors(v)), v) if c.nodes[v]["kind"] == "port" else v
            h.add_edge(u, head, score=d["score"], port=c.nodes[v].get("port", ""))
    pos = positions(h)
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * (1 + max((p[0] for p in pos.values()), default=1))), 5))
    if h.number_of_edges():
        top = max(abs(d["score"]) for *_, d in h.edges(data=True)) or 1.0
        for u, v, d in h.edges(data=True):
            nx.draw_networkx_edges(h, pos, edgelist=[(u, v)], ax=ax, width=0.5 + 3 * abs(d["score"]) / top,
                                   edge_color="#2166ac" if d["score"] >= 0 else "#b2182b", arrows=True,
                                   connectionstyle="arc3,rad=0.08", node_size=900)
        nx.draw_networkx_edge_labels(h, pos, edge_labels={(u, v): d["port"] for u, v, d in h.edges(data=True) if d["port"]},
                                     font_size=7, ax=ax)
    nx.draw_networkx_nodes(h, pos, ax=ax, node_size=900, node_color="#f7f7f7", edgecolors="#333333")
    nx.draw_networkx_labels(h, pos, labels={n: d["label"] for n, d in h.nodes(data=True)}, font_size=7, ax=ax)
    ax.set_title(title, fontsize=9)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def write(g: nx.DiGraph, path: Path, cfg, title: str = "") -> None:
    """Write `g` to `path` in the format its suffix names."""
    path = Path(path)
    kind = suffix(path)
    if kind == ".graphml":
        nx.write_graphml(_clean(g), path)
    elif kind == ".gexf":
        nx.write_gexf(_clean(g), path)
    elif kind == ".mib.json":
        path.write_text(json.dumps(mib_json(g, cfg), indent=1) + "\n")
    elif kind == ".json":
        data = nx.node_link_data(_clean(g), edges="edges")
        path.write_text(json.dumps(data, indent=1) + "\n")
    elif kind == ".dot":
        path.write_text(dot(g, title))
    elif kind in (".svg", ".pdf"):
        exe = shutil.which("dot")
        if exe is None:
            raise AnalysisError(f"rendering {path.name} needs Graphviz's `dot` program, which is not installed",
                                field="--export", fix="install Graphviz (e.g. apt-get install graphviz), or export .dot "
                                                      "and render it elsewhere, or export .png")
        subprocess.run([exe, f"-T{kind[1:]}", "-o", str(path)], input=dot(g, title), text=True, check=True)
    elif kind == ".tex":
        path.write_text(tikz(g))
    elif kind == ".png":
        png(g, path, title)
    else:
        raise AnalysisError(f"cannot export to {path.name!r}", field="--export",
                            fix=f"use a file ending in one of: {', '.join(FORMATS)}")


def read_edges(path: Path) -> list[str]:
    """The circuit's edge names from any of our JSON exports or an EAP-IG / MIB circuit JSON."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise AnalysisError(f"cannot read circuit file: {e}", where=str(path), fix="give a .json or .mib.json export") from None
    if isinstance(data, dict) and "edges" in data and isinstance(data["edges"], dict):  # MIB / EAP-IG
        return [name for name, d in data["edges"].items() if d.get("in_graph")]
    if isinstance(data, dict) and "edges" in data and isinstance(data["edges"], list):  # node-link
        return [d["name"] for d in data["edges"] if d.get("in_circuit") and not d.get("internal")]
    if isinstance(data, dict) and "circuit" in data:  # results.json of `surgeon circuit`
        r = data.get("result", data)
        return [r["edge_names"][e] for e in r["circuit"]]
    raise AnalysisError("the file holds no circuit edges", where=str(path),
                        fix="give a node-link .json or an EAP-IG / MIB .mib.json circuit")
