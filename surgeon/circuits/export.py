"""Circuit graphs written for papers and other tools; the format follows the file's suffix, each a registered
`ExportFormat` (`EXPORTS`, in the order `FORMATS` lists them; `register_export` adds one):

- `.graphml`, `.gexf`: networkx's writers (Gephi, Cytoscape);
- `.json`: the circuit graph's own JSON (`CircuitGraph.to_json`: EAP-IG's layout with surgeon's fields beside it),
  read back equal by `read_circuit`;
- `.mib.json`: EAP-IG / MIB circuit JSON (`cfg`, `nodes`, `edges` with `score` and `in_graph`, EAP-IG's
  names), which MIB's circuit track and EAP-IG's `Graph.from_json` read;
- `.dot`: Graphviz DOT, nodes ranked by layer;
- `.tex`: a TikZ picture for a paper to `\\input`;
- `.png`, `.svg`, `.pdf`: matplotlib, layered by layer (no Graphviz needed).
Every writer shows the circuit (the edges with `in_circuit`); the JSON formats carry every scored edge.
"""
from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import networkx as nx

from surgeon.circuits.graph import FORMAT, VERSION, CircuitGraph, cfg_dict, circuit_subgraph, made_by
from surgeon.circuits.methods import SEMANTICS
from surgeon.errors import AnalysisError
from surgeon.results import follow_umask



@dataclass(frozen=True)
class ExportFormat:
    """A circuit file format: its suffix, the tool it is written for (which the tests read it with), and the writer
    `write(graph, path, cfg, title, semantics)` that puts it at `path` (a temporary file `write` renames into place)."""

    suffix: str
    reader: str
    write: Callable[[CircuitGraph, Path, Any, str, "str | None"], None]


EXPORTS: dict[str, ExportFormat] = {}


def register_export(suffix: str, reader: str):
    """Register the decorated function as the writer of files ending in `suffix` (".gml"; a longer suffix such as
    ".mib.json" wins over ".json")."""
    def deco(fn):
        EXPORTS[suffix] = ExportFormat(suffix, reader, fn)
        return fn

    return deco


NODE_W, NODE_H = 0.8, 0.5  # node boxes in layout units (columns are 1 apart, rows ROW_GAP apart)
ROW_GAP = 1.6
BAND = 0.4  # half-height of a row's band: inside it edges run only vertically, through gaps between nodes


def suffix(path: Path) -> str:
    """The registered suffix a path ends in (the longest: ".mib.json" before ".json"), else its last suffix."""
    name = Path(path).name
    return max((s for s in EXPORTS if name.endswith(s)), key=len, default=Path(path).suffix)


def check_targets(files) -> None:
    """Refuse, before any work, export paths whose format is unknown or that cannot be written."""
    import os

    seen = set()
    for f in map(Path, files):
        if suffix(f) not in EXPORTS:
            raise AnalysisError(f"cannot export to {f.name!r}", field="--export",
                                fix=f"use a file ending in one of: {', '.join(EXPORTS)}")
        if f.resolve() in seen:
            raise AnalysisError(f"{f} is given twice", field="--export", fix="name each export file once")
        seen.add(f.resolve())
        if f.is_dir():
            raise AnalysisError(f"{f} is a directory", where=str(f), field="--export", fix="give a file name")
        parent = next((p for p in [f.parent, *f.parent.parents] if p.exists()), Path("."))
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or (f.exists() and not os.access(f, os.W_OK)):
            raise AnalysisError(f"cannot write {f}: {parent} is not a writable folder", where=str(f), field="--export",
                                fix="export into a folder you can write")


def _clean(g: nx.DiGraph) -> nx.DiGraph:
    """A copy whose attribute values GraphML and GEXF accept: None and non-finite values are left out (an
    edge whose exact effect was not measured has no `exact` attribute), never replaced by a stand-in; the model's
    shape becomes graph attributes `cfg_n_layers`, `cfg_n_heads`, ..."""
    h = nx.DiGraph(g)
    cfg = h.graph.pop("cfg", None) or {}
    h.graph.update({f"cfg_{k}": v for k, v in cfg.items()})
    made = h.graph.pop("made", None) or {}
    h.graph.update({f"made_{k}": v for k, v in made.items()})
    for d in [h.graph] + [d for *_, d in list(h.nodes(data=True)) + list(h.edges(data=True))]:
        for k, v in list(d.items()):
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                del d[k]
    return h


# ---------------------------------------------------------------------------------------------- drawing
def drawn(g: nx.DiGraph) -> nx.DiGraph:
    """What a figure of the circuit shows: its heads, MLPs, key/value heads (grouped-query attention) and
    always `input` and `logits`; one edge per scored circuit edge, from its sender to the head (or KV head,
    MLP, logits) whose input it is, labelled with the port (q, k, v). Where no edge leaves the input, the graph's
    `note` says so and why (`NO_INPUT_EDGE`): every drawing shows it."""
    if "input" not in g:  # a circuit of feature nodes (surgeon feature-circuit): its nodes, and edges among them
        keep = [n for n, d in g.nodes(data=True) if d.get("in_circuit")]
        h = nx.DiGraph()
        for n in sorted(keep, key=lambda n: (g.nodes[n].get("layer", 0), g.nodes[n].get("unit", 0), n)):
            h.add_node(n, **g.nodes[n])
        for u, v, d in g.edges(data=True):
            if u in h and v in h and d.get("in_circuit"):
                h.add_edge(u, v, score=d.get("score", 0.0), port="", name=d.get("name", ""))
        return h
    c = circuit_subgraph(g)
    h = nx.DiGraph()
    for n in ("input", "logits"):
        h.add_node(n, **g.nodes[n])
    for n, d in sorted(c.nodes(data=True), key=lambda x: (x[1].get("layer", 0), x[1].get("head", -1), x[0])):
        if d["kind"] != "port":
            h.add_node(n, **d)
    for u, v, d in sorted(c.edges(data=True), key=lambda x: x[2].get("index", -1)):  # deterministic files
        if d["internal"]:
            continue
        port = c.nodes[v].get("port", "") if c.nodes[v]["kind"] == "port" else ""
        if port and ".g" in v:  # a key/value head of a group: a node of its own
            head = v.split("<")[0]
            if head not in h:
                h.add_node(head, kind="kv", layer=c.nodes[v]["layer"], head=c.nodes[v]["head"],
                           label=_kv_label(head))
        elif port:
            head = v.split("<")[0]
        else:
            head = v
        if h.has_edge(u, head):  # q and k of one head from one sender: one arrow, both ports named
            h.edges[u, head]["port"] += "," + port
            h.edges[u, head]["score"] = max(h.edges[u, head]["score"], d["score"], key=abs)
        else:
            h.add_edge(u, head, score=d["score"], port=port, name=d["name"])
    if len(h) > 2 and not h.out_degree("input"):
        h.graph["note"] = NO_INPUT_EDGE
    return h


# what a drawing says where no edge from the input is in the circuit (the nodes drawn are not pruned for it)
NO_INPUT_EDGE = ("No edge from the input is in the circuit: every edge leaving it is ablated, so the first heads drawn "
                 "read the ablated input; a node without a path from the input still moves the output here and is "
                 "kept (dead ends are pruned only where they change nothing: a kept circuit under resample ablation "
                 "at every position).")


def _kv_label(name: str) -> str:
    layer, g = name[1:].split(".g")
    return f"L{layer}KV{g}"


def _row(d: dict, n_layers: int) -> int:
    kind, layer = d.get("kind"), d.get("layer", 0)
    if kind == "input":
        return 0
    if kind == "logits":
        return 2 * n_layers + 1
    if kind in ("feature", "error"):  # an SAE's nodes: the row of what its hook point reads after
        return 2 * layer + (2 if any(k in d.get("hook", "") for k in ("mlp", "resid_post")) else 1)
    return 2 * layer + (2 if kind == "mlp" else 1)


def layout(h: nx.DiGraph, n_layers: int):
    """Node centres and edge routes (polylines) for a drawn circuit: one row per computation step (input,
    each layer's heads, its MLP, the logits; empty rows dropped), nodes 1 apart in a row, centred. An edge
    leaves its sender straight up and enters its receiver straight from below; where it crosses a row it
    runs vertically through the gap nearest its straight line, so no edge passes through a node."""
    rows: dict[int, list[str]] = {}
    for n, d in h.nodes(data=True):
        rows.setdefault(_row(d, n_layers), []).append(n)
    order = sorted(rows)
    y_of = {r: ROW_GAP * i for i, r in enumerate(order)}
    pos: dict[str, tuple[float, float]] = {}
    for r in order:
        ns = sorted(rows[r], key=lambda n: (h.nodes[n].get("kind") == "kv", h.nodes[n].get("head", 0), n))
        for i, n in enumerate(ns):
            pos[n] = (i - (len(ns) - 1) / 2, y_of[r])
    gaps = {}
    for r in order:
        xs = sorted(pos[n][0] for n in rows[r])
        gaps[r] = [xs[0] - 1.0] + [(a + b) / 2 for a, b in zip(xs, xs[1:])] + [xs[-1] + 1.0]
    routes = {}
    for u, v in h.edges():
        (x0, y0), (x1, y1) = pos[u], pos[v]
        ru, rv = _row(h.nodes[u], n_layers), _row(h.nodes[v], n_layers)
        pts = [(x0, y0), (x0, y0 + BAND)]
        for r in order:
            if ru < r < rv:
                y = y_of[r]
                x_line = x0 + (x1 - x0) * (y - y0) / (y1 - y0)
                gx = min(gaps[r], key=lambda g: (abs(g - x_line), g))
                pts += [(gx, y - BAND), (gx, y + BAND)]
        pts += [(x1, y1 - BAND), (x1, y1)]
        routes[(u, v)] = pts
    return pos, routes


def _figure(g: nx.DiGraph, title: str = ""):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    h = drawn(g)
    pos, routes = layout(h, g.graph["n_layers"])
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    width, height = max(xs) - min(xs) + 2, max(ys) - min(ys) + 1.4
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * width), max(3.0, 0.9 * height)))
    top = max((abs(d["score"]) for *_, d in h.edges(data=True)), default=1.0) or 1.0
    for (u, v), pts in routes.items():
        d = h.edges[u, v]
        px, py = zip(*pts)
        ax.plot(px, py, color="#2166ac" if d["score"] >= 0 else "#b2182b", lw=0.6 + 2.4 * abs(d["score"]) / top,
                alpha=0.85, solid_capstyle="round", zorder=1)
        ax.annotate("", xy=pts[-1], xytext=pts[-2], zorder=1,
                    arrowprops=dict(arrowstyle="-|>", color="#333333", lw=0.6, shrinkA=0, shrinkB=NODE_H * 36))
        if d["port"]:
            ax.text(pts[-2][0] + 0.04, pts[-2][1] - 0.05, d["port"], fontsize=6, color="#444444", ha="left", va="top")
    for n, (x, y) in pos.items():
        d = h.nodes[n]
        color = {"input": "#fee8c8", "logits": "#fee8c8", "mlp": "#e5f5e0", "kv": "#efedf5",
                 "error": "#fde0dd"}.get(d["kind"], "#f7f7f7")
        ax.add_patch(FancyBboxPatch((x - NODE_W / 2, y - NODE_H / 2), NODE_W, NODE_H, zorder=2,
                                    boxstyle="round,pad=0,rounding_size=0.12", fc=color, ec="#333333", lw=0.8))
        ax.text(x, y, d.get("label", n), ha="center", va="center", fontsize=7, zorder=3)
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.set_ylim(min(ys) - 0.7, max(ys) + 0.7)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=9)
    if h.graph.get("note"):
        fig.text(0.5, 0.01, textwrap.fill(h.graph["note"], int(fig.get_size_inches()[0] * 14)), ha="center",
                 va="bottom", fontsize=6.5, color="#444444")
        fig.tight_layout(rect=(0, 0.02 + 0.1 * len(h.graph["note"]) / (fig.get_size_inches()[0] * 14) / 3.0, 1, 1))
    else:
        fig.tight_layout()
    return fig


def figure(g: nx.DiGraph, path: Path | None, title: str = ""):
    """The circuit drawn by matplotlib (PNG, SVG or PDF from the suffix; no path: the Figure only): no Graphviz
    needed. Returns the (closed) Figure."""
    import matplotlib.pyplot as plt

    fig = _figure(g, title)
    if path is None:  # a notebook: the figure only
        plt.close(fig)
        return fig
    fmt = Path(path).suffix[1:]
    made = made_line(g)
    meta = {"svg": {"Date": None, **({"Description": made} if made else {})},
            "pdf": {"CreationDate": None, "ModDate": None, **({"Subject": made} if made else {})},
            "png": {"Description": made} if made else {}}.get(fmt, {})
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": "surgeon"}):  # no dates, fixed ids: same circuit, same file
        fig.savefig(path, dpi=150, format=fmt, metadata=meta)
    plt.close(fig)
    return fig


png = figure


def mib_json(g: CircuitGraph, cfg=None, semantics: str | None = None) -> dict:
    """EAP-IG / MIB's circuit JSON, named as EAP-IG's `Graph.from_model` names the model's graph. EAP-IG
    ungroups grouped-query attention (one key and value input per query head), so a key/value head's edge
    is written once per query head of its group, each copy with the group's score and membership. `cfg` and
    `semantics` default to the graph's; `made` (how the circuit was found) is written beside them (EAP-IG's
    loader reads cfg, nodes and edges and ignores the rest)."""
    cfg = cfg_dict(cfg) if cfg is not None else g.cfg
    semantics = semantics or g.semantics
    if not cfg:
        raise AnalysisError("the circuit records no model shape (cfg), which an EAP-IG file needs",
                            fix="export a circuit surgeon found, or one read from a file that records its cfg")
    H = cfg["n_heads"]
    G = cfg.get("n_key_value_heads") or H
    nodes = {}
    for n, d in g.nodes(data=True):
        if d["kind"] != "port":
            nodes[n] = {"in_graph": False}
    edges = {}
    for u, v, d in g.edges(data=True):
        if d["internal"]:
            continue
        inside = bool(d["in_circuit"])
        if ".g" in v:  # a0.g1<k> -> every query head of group 1
            layer, rest = v[1:].split(".g")
            grp, port = rest.rstrip(">").split("<")
            heads = [h for h in range(H) if h // (H // G) == int(grp)]
            targets = [f"a{layer}.h{h}<{port}>" for h in heads]
        else:
            targets = [v]
        for t in targets:
            edges[f"{u}->{t}"] = {"score": float(d["score"]), "in_graph": inside}
            if inside:
                nodes[u]["in_graph"] = True
                head = t.split("<")[0]
                if head in nodes:
                    nodes[head]["in_graph"] = True
    out_cfg = {"n_layers": cfg["n_layers"], "n_heads": H, "parallel_attn_mlp": bool(cfg.get("parallel_attn_mlp")),
               "d_model": cfg["d_model"]}
    if G != H:
        out_cfg["n_key_value_heads"] = G
    out = {"cfg": out_cfg, "nodes": nodes, "edges": edges}
    if semantics:
        out["semantics"] = semantics
        out["semantics_note"] = SEMANTICS[semantics]
    if g.graph.get("made"):
        out["made"] = dict(g.graph["made"], semantics=semantics or g.graph["made"].get("semantics"))
    return out


def made_line(g: nx.DiGraph) -> str:
    """How the circuit was found, in one line (for the text formats' comments and the figures' metadata)."""
    made = g.graph.get("made") or {}
    return "; ".join(f"{k}={v}" for k, v in made.items() if v is not None)


def dot(g: nx.DiGraph, title: str = "") -> str:
    h = drawn(g)
    lines = ["digraph circuit {", "  rankdir=BT;", '  node [shape=box, style=rounded, fontname="Helvetica"];']
    if made_line(g):
        lines.insert(0, "// made: " + made_line(g).replace("\n", " "))
    label = "\\n".join(x for x in (title, h.graph.get("note", "")) if x)
    if label:
        lines.append(f'  label="{label}"; labelloc=t;')
    by_row: dict[int, list[str]] = {}
    for n, d in h.nodes(data=True):
        by_row.setdefault(_row(d, g.graph["n_layers"]), []).append(n)
        lines.append(f'  "{n}" [label="{d.get("label", n)}"];')
    for _, ns in sorted(by_row.items()):
        lines.append("  { rank=same; " + " ".join(f'"{n}";' for n in ns) + " }")
    top = max((abs(d["score"]) for *_, d in h.edges(data=True)), default=1.0) or 1.0
    for u, v, d in h.edges(data=True):
        width = 1 + 3 * min(1.0, abs(d["score"]) / top)
        color = "#2166ac" if d["score"] >= 0 else "#b2182b"
        label = f', label="{d["port"]}"' if d["port"] else ""
        lines.append(f'  "{u}" -> "{v}" [penwidth={width:.2f}, color="{color}"{label}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _tex(s: str) -> str:
    """`s` as LaTeX text (its special characters escaped)."""
    return "".join({"_": r"\_", "&": r"\&", "%": r"\%", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
                    "<": r"\textless{}", ">": r"\textgreater{}", "\\": r"\textbackslash{}", "^": r"\^{}",
                    "~": r"\~{}"}.get(ch, ch) for ch in s)


def tikz_caption(g: nx.DiGraph, title: str = "") -> str:
    """The caption a `tikz` picture of `g` comes with (LaTeX): the title as a sentence, and the drawing's note."""
    return _tex(" ".join(x for x in (title[:1].upper() + title[1:] + "." if title else "", drawn(g).graph.get("note", ""))
                         if x))


def tikz_fit(g: nx.DiGraph) -> str:
    """How a paper scales the `tikz` picture of `g` into a figure: to the text width, or, for a picture taller than
    it is wide, to three quarters of the text height (a float never splits across pages)."""
    pos, _ = layout(drawn(g), g.graph["n_layers"])
    xs, ys = [p[0] for p in pos.values()], [p[1] for p in pos.values()]
    wide = max(xs) - min(xs) + NODE_W >= max(ys) - min(ys) + NODE_H
    return r"\resizebox{\linewidth}{!}" if wide else r"\resizebox{!}{0.75\textheight}"


def tikz(g: nx.DiGraph, title: str = "") -> str:
    """The circuit as a `tikzpicture` for a paper to `\\input` (inside a figure, with a caption: the title is not
    drawn in the picture but written, with how to include the file, as the comments that open it), laid out and
    routed as the PNG is; node names are TikZ-safe (n0, n1, ...), labels as shown. Needs `\\usepackage{tikz}` and
    `\\usetikzlibrary{arrows.meta}` in the preamble."""
    h = drawn(g)
    pos, routes = layout(h, g.graph["n_layers"])
    name = {n: f"n{i}" for i, n in enumerate(h.nodes)}
    top = max((abs(d["score"]) for *_, d in h.edges(data=True)), default=1.0) or 1.0

    caption = tikz_caption(g, title)
    lines = ["% A circuit drawn by surgeon as a TikZ picture, to \\input inside a figure of a LaTeX document.",
             "% Preamble: \\usepackage{tikz} \\usetikzlibrary{arrows.meta}",
             "% Use: \\begin{figure}[tbp]\\centering" + tikz_fit(g) + "{\\input{THIS FILE}}\\caption{...}\\end{figure}"]
    if made_line(g):
        lines.append(f"% made: {made_line(g)}")
    if caption:
        lines += ["% Caption (what the picture shows):"] + [f"%   {x}" for x in textwrap.wrap(caption, 100)]
    lines.append(r"\begin{tikzpicture}[x=1.6cm,y=1.6cm,every node/.style={font=\scriptsize},"
                 rf"box/.style={{draw,rounded corners=2pt,minimum width={NODE_W * 1.6}cm,minimum height={NODE_H * 1.6}cm,"
                 r"inner sep=1pt}]")
    for n, (x, y) in pos.items():  # nodes first: an edge may refer to a node only once it is defined
        lines.append(rf"\node[box] ({name[n]}) at ({x:.3f},{y:.3f}) {{{_tex(h.nodes[n].get('label', n))}}};")
    for (u, v), pts in routes.items():
        d = h.edges[u, v]
        color = "blue!70!black" if d["score"] >= 0 else "red!70!black"
        path = " -- ".join(f"({x:.3f},{y:.3f})" for x, y in pts[1:-1])
        port = rf" node[pos=0.97,right,font=\tiny,text=black] {{{_tex(d['port'])}}}" if d["port"] else ""
        lines.append(rf"\draw[{color},line width={0.3 + 1.5 * abs(d['score']) / top:.2f}pt,-{{Stealth[length=3pt]}}] "
                     rf"({name[u]}.north) -- {path} -- ({name[v]}.south){port};")
    return "\n".join(lines + [r"\end{tikzpicture}"]) + "\n"


def tikz_document(picture: str, caption: str = "", fit: str = r"\resizebox{\linewidth}{!}") -> str:
    """A one-page LaTeX document (article, TikZ; pdflatex or lualatex) that includes `picture` (from `tikz`, or an
    \\input of its file) as a paper would: in a figure, scaled by `fit` (`tikz_fit`), with `caption` (LaTeX, as
    `tikz_caption` gives it)."""
    return "\n".join([r"\documentclass{article}", r"\usepackage{tikz}", r"\usetikzlibrary{arrows.meta}",
                      r"\usepackage[margin=2cm]{geometry}", r"\pagestyle{empty}", r"\begin{document}",
                      r"\begin{figure}[h]\centering", fit + "{%", picture.rstrip("\n") + "%", "}",
                      rf"\caption{{{caption}}}" if caption else "", r"\end{figure}", r"\end{document}"]) + "\n"


@register_export(".graphml", "networkx.read_graphml, Gephi, Cytoscape")
def _write_graphml(g, tmp, cfg, title, semantics):
    nx.write_graphml(_clean(g), tmp)


@register_export(".gexf", "networkx.read_gexf, Gephi")
def _write_gexf(g, tmp, cfg, title, semantics):
    nx.write_gexf(_clean(g), tmp)
    if made_line(g):  # GEXF keeps no graph attributes: how it was made goes in its <meta><description>
        from xml.sax.saxutils import escape

        text = Path(tmp).read_text()
        Path(tmp).write_text(text.replace("</creator>", "</creator>\n    <description>made: "
                                          f"{escape(made_line(g))}</description>", 1))


@register_export(".json", "json, read_circuit, EAP-IG's Graph.from_json naming (models without GQA)")
def _write_json(g, tmp, cfg, title, semantics):
    data = g.to_json()
    if cfg is not None:
        data["cfg"] = cfg_dict(cfg)
    data["semantics"] = semantics or g.semantics
    Path(tmp).write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")


@register_export(".mib.json", "EAP-IG's Graph.from_json, MIB's circuit track, read_circuit")
def _write_mib_json(g, tmp, cfg, title, semantics):
    Path(tmp).write_text(json.dumps(mib_json(g, cfg, semantics), indent=1) + "\n")


@register_export(".dot", "Graphviz dot")
def _write_dot(g, tmp, cfg, title, semantics):
    Path(tmp).write_text(dot(g, title))


@register_export(".pdf", "pdftotext, pdflatex's \\includegraphics")
@register_export(".svg", "a browser")
def _write_drawn(g, tmp, cfg, title, semantics):
    figure(g, Path(tmp), title)


@register_export(".tex", "pdflatex (\\input in a figure)")
def _write_tex(g, tmp, cfg, title, semantics):
    Path(tmp).write_text(tikz(g, title))


register_export(".png", "an image viewer")(_write_drawn)

FORMATS = tuple(EXPORTS)  # the suffixes `--export` takes (those built in; `EXPORTS` holds any registered later)


def write(g: CircuitGraph, path: Path, cfg=None, title: str = "", semantics: str | None = None) -> None:
    """Write `g` to `path` in the format its suffix names (`EXPORTS`), atomically (a temporary file renamed into
    place); `cfg` and `semantics` default to the graph's."""
    import os
    import tempfile

    path = Path(path)
    kind = suffix(path)
    if kind not in EXPORTS:
        raise AnalysisError(f"cannot export to {path.name!r}", field="--export",
                            fix=f"use a file ending in one of: {', '.join(EXPORTS)}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=Path(path.name).suffix, dir=path.parent)
    os.close(fd)
    try:
        EXPORTS[kind].write(g, Path(tmp), cfg, title, semantics)
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_SCORE = 1e30  # no effect on a log-probability score comes near this: a larger one is a corrupt file


def read_circuit(path: Path, edges_only: bool = False) -> CircuitGraph:
    """A circuit file as a `CircuitGraph`: any of our JSON exports (`.json`, `.mib.json`), the results.json of
    `surgeon circuit --out`, an EAP-IG / MIB circuit JSON, or the node-link `.json` of surgeon 0.1. A file that
    carries only edge names and marks gives a graph of those edges, nodes read from the names. `edges_only` (what
    `circuit-eval` reads): a feature circuit (SAE features and error terms as nodes) is refused, named as such."""
    path = Path(path)
    bad = dict(where=str(path), fix="give a .json or .mib.json export, or the results.json of surgeon circuit --out")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise AnalysisError(f"cannot read circuit file: {str(e)[:200]}", **bad) from None
    if not isinstance(data, dict):
        raise AnalysisError("the file holds no circuit edges (its top level is not an object)", **bad)
    inner = data.get("result") if isinstance(data.get("result"), dict) else data
    nodes = inner.get("nodes")
    if edges_only and (data.get("command") == "feature-circuit" or "directions" in inner or str(data.get("semantics")).startswith(
            "feature nodes") or (isinstance(nodes, dict) and any(isinstance(d, dict) and d.get("kind") in
                                                                ("feature", "error") for d in nodes.values()))):
        raise AnalysisError("this is a feature circuit (SAE features and error terms as nodes), not a circuit of edges "
                            "between heads and MLPs, which is what circuit-eval evaluates", **{
                                **bad, "fix": "its faithfulness is in the feature circuit's own result (surgeon "
                                              "feature-circuit CASE --out DIR prints it); give circuit-eval a file of "
                                              "`surgeon circuit --export` (.json, .mib.json) or an EAP-IG / MIB circuit"})
    if "circuit" in inner and "edge_names" in inner:  # results.json of `surgeon circuit`
        names, chosen = inner["edge_names"], inner["circuit"]
        if not (isinstance(names, list) and all(isinstance(n, str) for n in names) and isinstance(chosen, list)
                and all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e < len(names) for e in chosen)):
            raise AnalysisError("field 'circuit' must list indices into 'edge_names'", field="result.circuit", **bad)
        options = inner.get("options") or {}
        if not isinstance(options, dict):
            raise AnalysisError(f"field 'options' is a {type(options).__name__}, not an object", field="result.options",
                                **bad)
        sem = _semantics_field(options.get("semantics"), "result.options.semantics", bad)
        inside = set(chosen)
        g = CircuitGraph.from_marks({n: i in inside for i, n in enumerate(names)}, semantics=sem)
        try:  # how it was found, from the result's own fields
            g.graph["made"] = made_by(case=inner["case"], method=inner["method"], ablation=inner["ablation"],
                                      semantics=sem, direction=inner["direction"], base=inner["base"],
                                      source=inner["source"], tag=inner.get("tag"), n_items=inner.get("n_items"),
                                      metric=options.get("metric"))
        except (KeyError, TypeError):
            pass  # an older or hand-made results.json: it says nothing of how
        return g
    edges = data.get("edges")
    if isinstance(edges, dict):  # ours, MIB / EAP-IG
        for n, d in edges.items():
            if not isinstance(d, dict) or not isinstance(d.get("in_graph"), bool):
                raise AnalysisError(f"edge {str(n)[:60]!r} has no boolean 'in_graph'", field="edges", **bad)
            score = d.get("score", 0.0)
            if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
                raise AnalysisError(f"edge {str(n)[:60]!r} has score {score!r}, not a finite number", field="edges",
                                    **bad)
            if abs(score) > MAX_SCORE:
                raise AnalysisError(f"edge {str(n)[:60]!r} has score {score!r}: an edge's effect is a difference of "
                                    f"log-probabilities, never past {MAX_SCORE:g}", field="edges", **bad)
            if "->" not in str(n):
                raise AnalysisError(f"edge {str(n)[:60]!r} is not named sender->receiver", field="edges", **bad)
        cfg = data.get("cfg")
        if cfg is not None and not isinstance(cfg, dict):
            raise AnalysisError(f"field 'cfg' is a {type(cfg).__name__}, not an object of the model's shape",
                                field="cfg", **bad)
        ours = data.get("format") == FORMAT
        # MIB's circuits are kept sets; ours say what they are (or nothing)
        sem = _semantics_field(data.get("semantics") if ours else data.get("semantics", "kept"), "semantics", bad)
        if not ours:
            g = CircuitGraph.from_marks({n: d["in_graph"] for n, d in edges.items()},
                                        {n: float(d.get("score", 0.0)) for n, d in edges.items()}, cfg, sem)
            if isinstance(data.get("made"), dict):  # our .mib.json says how it was found; EAP-IG's files do not
                g.graph["made"] = data["made"]
            return g
        if data.get("version") != VERSION:
            raise AnalysisError(f"the file is {FORMAT} version {data.get('version')!r}; this surgeon reads version "
                                f"{VERSION}", field="version", where=str(path), fix="upgrade surgeon to read it")
        try:
            return CircuitGraph.from_json({**data, "semantics": sem})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise AnalysisError(f"malformed {FORMAT} file ({type(e).__name__}: {str(e)[:120]})", **bad) from None
    if isinstance(edges, list):  # node-link (surgeon 0.1)
        out = {}
        for d in edges:
            if not isinstance(d, dict) or not isinstance(d.get("name"), str):
                raise AnalysisError("a node-link edge has no 'name'", field="edges", **bad)
            if not d.get("internal"):
                out[d["name"]] = bool(d.get("in_circuit"))
        graph = data.get("graph") or {}
        if not isinstance(graph, dict):
            raise AnalysisError(f"field 'graph' is a {type(graph).__name__}, not an object", field="graph", **bad)
        return CircuitGraph.from_marks(out, semantics=_semantics_field(graph.get("semantics"), "graph.semantics", bad))
    raise AnalysisError("the file holds no circuit edges", **bad)


def _semantics_field(value, field: str, bad: dict):
    """A file's recorded semantics: a name (checked against the known ones where it is used) or absent."""
    if value is not None and not isinstance(value, str):
        raise AnalysisError(f"field {field!r} is a {type(value).__name__}, not a name such as 'kept'", field=field,
                            **bad)
    return value


def read_edges(path: Path) -> list[str]:
    """The names of the circuit's edges in a circuit file (see `read_circuit`)."""
    return read_circuit(path).circuit_names()


def edges_for_model(circuit: CircuitGraph, site, cfg, where: str = "") -> list[int]:
    """Indices into `site`'s edges of a circuit read by `read_circuit`, checked against the model: the file's
    cfg must describe it, every name must be one of its edges, and under grouped-query attention the per-query-
    head key/value edges EAP-IG writes must agree within each group (they are one edge here)."""
    H = cfg.n_heads
    G = getattr(cfg, "n_key_value_heads", None) or H
    fc = circuit.cfg
    if fc:
        want = {"n_layers": cfg.n_layers, "n_heads": H}
        if G != H or "n_key_value_heads" in fc:
            want["n_key_value_heads"] = G
        for k, v in want.items():
            if k in fc and fc[k] != v:
                raise AnalysisError(f"the file's cfg has {k} = {fc[k]!r} but the model has {v}", where=where,
                                    field=f"cfg.{k}", fix="evaluate the circuit on the model it was found for")
    index = {n: i for i, n in enumerate(site.names)}
    groups: dict[int, dict[str, bool]] = {}
    for name, inside in circuit.marks().items():
        target = name
        m = re.fullmatch(r"(?P<snd>[^<>]+)->a(?P<layer>\d+)\.h(?P<h>\d+)<(?P<port>[kv])>", name)
        if name not in index and G != H and m:  # EAP-IG's per-query-head name of a key/value edge
            target = f"{m['snd']}->a{m['layer']}.g{int(m['h']) // (H // G)}<{m['port']}>"
        if target not in index:
            raise AnalysisError(f"no edge {name[:80]!r} in this model's graph", where=where, field="edges",
                                fix="name edges as EAP-IG does (a0.h1->a1.h2<k>, input->m0, m1->logits) for this model")
        groups.setdefault(index[target], {})[name] = inside
    out = []
    for i, copies in groups.items():
        vals = set(copies.values())
        if len(vals) > 1:
            on = sorted(n for n, v in copies.items() if v)
            raise AnalysisError(f"{', '.join(on)[:120]} in the circuit but not the other query heads of the same "
                                f"key/value head: under grouped-query attention those are one edge "
                                f"({site.names[i]})", where=where, field="edges",
                                fix="mark every query head's copy of a key/value edge alike")
        if vals == {True}:
            out.append(i)
    return sorted(out)


def circuit_figure(r, path: Path):
    """The circuit of a `CircuitResult` drawn layer by layer (the PNG `surgeon circuit --out` writes)."""
    return png(r.graph(), path, f"the circuit: {len(r.circuit)} edges, f = {r.circuit_faithfulness:.2f}")
