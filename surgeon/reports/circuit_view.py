"""How a circuit prints (discovered, held out, over folds, evaluated from a file) and its view on the report page.

The report page's circuit view: the circuit's graph laid out by layer, as a static SVG (what a reader sees where
scripts do not run) and as the data the page's script redraws it from (a slider over every top-k prefix of the
ranking, a tooltip per edge and node, paths through a clicked node, and a view of only the nodes the shown edges
touch, for models with many heads).

Layout, in pixels (`layout` here and `place` in the script are the same rule; the browser test checks they agree):
rows from the input (bottom) through each layer's heads and MLP to the logits (top); a row's nodes evenly spaced,
never closer than `SPACING`, so at 32 heads per layer a head's label ("H24", its layer named at the row's left) and
its input ports never reach its neighbour's. A head's q port sits just below it; its k and v ports (a key/value
head's: below the middle of its group of query heads) a sub-row lower, a quarter spacing to each side.

Every number shown is one the result holds (scores, exact effects and their intervals, faithfulness where it was
measured); nothing is computed here but positions and shares of the gap (m(full) - m(empty)).
"""
from __future__ import annotations

import html
import json
import math

import numpy as np

from surgeon.reports.text import num, num3
from surgeon.show import View
from surgeon.reports import figures
from surgeon.reports import tables
from surgeon.circuits.export import circuit_figure

SPACING = 44  # px between neighbouring nodes of a row
MARGIN = 56  # px left and right of the rows (the left one holds the row names)
MIN_WIDTH = 1000
LAYER = 110  # px from one layer's heads to the next
TOP = 24  # px above the logits row
PORT_DY = {"q": 16, "k": 30, "v": 30}  # a port's offset below its head
PORT_DX = {"q": 0.0, "k": -0.25, "v": 0.25}  # ... and beside it, in spacings
TOUCHED_ABOVE = 16  # with more heads per layer than this, the view opens on the nodes the shown edges touch
MAX_EDGES = 3000  # edges on the page: every edge up to this, else the top max(MAX_EDGES, the circuit's prefix)


def _row_y(kind: str, layer: int, n_layers: int) -> float:
    mlp = TOP + 50 + (n_layers - 1 - layer) * LAYER
    return {"logits": TOP, "mlp": mlp, "head": mlp + 40, "input": TOP + 50 + (n_layers - 1) * LAYER + 40 + 70}[kind]


def circuit_data(r, sinks: dict | None = None) -> dict:
    """What the page's script draws from: nodes (row, order within the row, port anchors), the scored edges in
    ranking order (|score|) with estimated and exact effects, intervals and shares of the gap, the faithfulness
    measured per k, and the circuit found (its prefix k, its edges, f and interval)."""
    g = r.graph()
    n_layers = g.graph["n_layers"]
    nodes = []
    for name, d in g.nodes(data=True):
        kind = d["kind"]
        n = {"id": name, "kind": kind, "name": d["label"], "layer": d.get("layer", -1)}
        if kind == "port":
            n["port"] = d["port"]
            n["anchors"] = sorted(g.successors(name), key=lambda h: g.nodes[h]["head"])
            n["row"] = f"p{d['layer']}{d['port']}"
            n["y"] = _row_y("head", d["layer"], n_layers) + PORT_DY[d["port"]]
            n["order"] = d.get("head", 0)
            n["label"] = ""
        else:
            n["row"] = kind if kind in ("input", "logits") else f"{kind}{d['layer']}"
            n["y"] = _row_y(kind, d["layer"], n_layers)
            n["order"] = d.get("head", -1)
            n["label"] = f"H{d['head']}" if kind == "head" else d["label"]
            if kind == "head" and sinks and (d["layer"], d["head"]) in sinks:
                n["sink"] = round(float(sinks[d["layer"], d["head"]]), 3)
        nodes.append(n)
    rows = [{"y": _row_y("head", ly, n_layers), "label": f"L{ly}"} for ly in range(n_layers)]
    rows += [{"y": _row_y("mlp", ly, n_layers), "label": f"MLP{ly}"} for ly in range(n_layers)
             if any(n["kind"] == "mlp" and n["layer"] == ly for n in nodes)]
    scores = np.asarray(r.scores, dtype=float)
    order = np.argsort(-np.abs(scores), kind="stable")
    by_index = {d["index"]: (u, v) for u, v, d in g.edges(data=True) if not d["internal"]}
    exact = {int(k): float(v) for k, v in r.exact.items()}
    ci = {int(k): v for k, v in (getattr(r, "exact_ci", None) or {}).items()}
    inside = {int(e) for e in r.circuit}
    prefix = int((r.search or {}).get("prefix", len(r.circuit)))
    shipped = order[:max(MAX_EDGES, prefix)]
    edges = []
    for i in shipped:
        i = int(i)
        u, v = by_index[i]
        lo, hi = ci.get(i, (None, None))
        edges.append({"s": u, "r": v, "name": r.edge_names[i], "score": float(scores[i]), "exact": exact.get(i),
                      "lo": lo if lo == lo else None, "hi": hi if hi == hi else None, "c": i in inside})
    internal = [{"s": u, "r": v} for u, v, d in g.edges(data=True) if d["internal"]]
    measured = {str(int(k)): float(f) for k, f in zip(r.curve_edges, r.curve)}
    measured[str(prefix)] = float(r.circuit_faithfulness)
    heads = max([sum(1 for n in nodes if n["kind"] == "head" and n["layer"] == ly) for ly in range(n_layers)] or [0])
    lo, hi = r.circuit_faithfulness_ci
    return {"nodes": nodes, "edges": edges, "internal": internal, "rows": rows, "n_layers": n_layers,
            "n_edges": int(r.n_edges), "circuit_k": prefix, "circuit_n": len(r.circuit),
            "circuit_f": float(r.circuit_faithfulness), "circuit_lo": lo if lo == lo else None,
            "circuit_hi": hi if hi == hi else None, "f_at": measured, "gap": float(r.full - r.empty),
            "method": r.method, "verified": len(exact) if r.method != "exact" else None, "n_items": int(r.n_items),
            "touched": heads > TOUCHED_ABOVE, "geometry": {"spacing": SPACING, "margin": MARGIN,
                                                          "min_width": MIN_WIDTH, "port_dx": PORT_DX},
            "height": _row_y("input", 0, n_layers) + TOP + 6}


def shown_nodes(data: dict, k: int, touched: bool) -> set[str]:
    """The nodes drawn with the top `k` edges: all, or (touched) the input, the logits, the ends of the shown edges
    and the heads a shown port feeds."""
    if not touched:
        return {n["id"] for n in data["nodes"]}
    ports = {n["id"]: n for n in data["nodes"] if n["kind"] == "port"}
    on = {"input", "logits"}
    for e in data["edges"][:k]:
        for x in (e["s"], e["r"]):
            on.add(x)
            if x in ports:
                on.update(ports[x]["anchors"])
    return on


def layout(data: dict, on: set[str]) -> tuple[dict[str, tuple[float, float]], float]:
    """({node: (x, y)}, width) for the nodes `on` (the script's `place`)."""
    geo = data["geometry"]
    rows: dict[str, list] = {}
    for n in data["nodes"]:
        if n["id"] in on and n["kind"] != "port":
            rows.setdefault(n["row"], []).append(n)
    widest = max([len(v) for v in rows.values()] or [1])
    width = max(geo["min_width"], 2 * geo["margin"] + (widest + 1) * geo["spacing"])
    pos = {}
    for members in rows.values():
        members.sort(key=lambda n: (n["order"], n["id"]))
        for i, n in enumerate(members):
            pos[n["id"]] = (geo["margin"] + (width - 2 * geo["margin"]) * (i + 1) / (len(members) + 1), n["y"])
    for n in data["nodes"]:
        if n["id"] in on and n["kind"] == "port":
            xs = [pos[h][0] for h in n["anchors"] if h in pos]
            if xs:
                pos[n["id"]] = (sum(xs) / len(xs) + geo["port_dx"][n["port"]] * geo["spacing"], n["y"])
    return pos, width


FILL = {"input": "#999", "logits": "#999", "head": "#ffbb78", "mlp": "#98df8a", "port": "#ddd"}


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def static_svg(data: dict) -> str:
    """The circuit found as SVG markup (what the page shows before, or without, its script): the top-k prefix's edges
    (those on no complete path dashed), the nodes of the default view, row names, and each element's numbers in a
    <title>."""
    k, touched = data["circuit_k"], data["touched"]
    on = shown_nodes(data, k, touched)
    pos, width = layout(data, on)
    maxs = max([abs(e["score"]) for e in data["edges"]] or [1]) or 1
    out = [f"<svg id='circuit-svg' xmlns='http://www.w3.org/2000/svg' width='{_fmt(width)}' "
           f"height='{_fmt(data['height'])}' viewBox='0 0 {_fmt(width)} {_fmt(data['height'])}' role='img' "
           f"aria-label='the circuit: {data['circuit_n']} edges'>"]
    out += [f"<text class='row' x='6' y='{_fmt(row['y'] + 4)}'>{html.escape(row['label'])}</text>"
            for row in data["rows"]]
    out += [f"<line class='internal' x1='{_fmt(pos[e['s']][0])}' y1='{_fmt(pos[e['s']][1])}' "
            f"x2='{_fmt(pos[e['r']][0])}' y2='{_fmt(pos[e['r']][1])}'/>" for e in data["internal"]
            if e["s"] in pos and e["r"] in pos]
    for i, e in enumerate(data["edges"][:k]):
        (x1, y1), (x2, y2) = pos[e["s"]], pos[e["r"]]
        dash = "" if e["c"] else " stroke-dasharray='4 3'"
        out.append(f"<path class='edge' d='{edge_path(x1, y1, x2, y2)}' stroke='{'#1f77b4' if e['score'] >= 0 else '#d62728'}' "
                   f"stroke-width='{0.5 + 5 * abs(e['score']) / maxs:.2f}'{dash}><title>"
                   f"{html.escape(edge_tip(data, i, e))}</title></path>")
    for n in data["nodes"]:
        if n["id"] not in pos:
            continue
        x, y = pos[n["id"]]
        label = (f"<text x='{_fmt(x)}' y='{_fmt(y - 9)}' text-anchor='middle'>{html.escape(n['label'])}</text>"
                 if n["label"] else "")
        sink = n.get("sink")
        out.append(f"<g class='node{' sink' if sink is not None else ''}' data-id='{html.escape(n['id'])}'><circle "
                   f"cx='{_fmt(x)}' cy='{_fmt(y)}' r='{3 if n['kind'] == 'port' else 6}' "
                   f"fill='{FILL.get(n['kind'], '#ccc')}'/>{label}<title>{html.escape(node_tip(n))}</title></g>")
    out.append("</svg>")
    return "".join(out)


def node_tip(n: dict) -> str:
    """A node's name, and for a sink head its attention on the first token (the script's `nodeTip` adds its edges)."""
    sink = n.get("sink")
    return n["name"] + (f"\nsink head: {sink:.3f} of its attention on the first token (most in any format)"
                        if sink is not None else "")


def edge_path(x1: float, y1: float, x2: float, y2: float) -> str:
    """A gentle curve from sender to receiver (the script draws the same)."""
    return f"M{_fmt(x1)},{_fmt(y1)} Q{_fmt((x1 + x2) / 2 + 20)},{_fmt((y1 + y2) / 2)} {_fmt(x2)},{_fmt(y2)}"


def _share(v: float, gap: float) -> str:
    return f"{100 * v / gap:.1f}% of the gap" if abs(gap) > 1e-12 else "gap is zero"


def edge_tip(data: dict, rank: int, e: dict) -> str:
    """An edge's numbers, as its tooltip says them (the script's `edgeTip`)."""
    lines = [e["name"], f"rank {rank + 1} of {data['n_edges']}",
             f"estimated ({data['method']}) {e['score']:+.4f}, {_share(e['score'], data['gap'])}"]
    if e["exact"] is None:
        lines.append("exact: not measured (only the top-ranked edges are verified)")
    else:
        ci = f" [{e['lo']:+.4f}, {e['hi']:+.4f}]" if e["lo"] is not None else ""
        lines.append(f"exact {e['exact']:+.4f}{ci}, {_share(e['exact'], data['gap'])}")
    lines.append("in the circuit" if e["c"] else "not in the circuit")
    return "\n".join(lines)


def view(r, sinks: dict | None = None) -> str:
    """The circuit view's markup: controls, the static SVG, the tooltip and the data for the script; `sinks`
    {(layer, head): attention on the first token} marks those heads as sink heads (a ring)."""
    data = circuit_data(r, sinks)
    blob = json.dumps(data).replace("</", "<\\/")
    checked = " checked" if data["touched"] else ""
    # the controls are hidden until the script runs (without it the page shows the circuit found, labelled)
    return ("<div id='circuit-view'><div class='controls'><span id='k-controls' hidden><label for='k'>edges shown"
            f"</label> <input type='range' id='k' min='0' max='{len(data['edges'])}' step='1' "
            f"value='{data['circuit_k']}'></span> <span id='k-label'>{html.escape(k_label(data, data['circuit_k']))}"
            f"</span> <label id='touched-control' hidden><input type='checkbox' id='touched'{checked}> only the nodes "
            "these edges touch</label></div>"
            f"<div class='scroll'>{static_svg(data)}</div><div id='tip' role='tooltip' hidden></div>"
            "<p class='hint'>hover an edge or node for its numbers; click a node to highlight the paths through it "
            "(click again to clear); dashed edges of the prefix lie on no complete path and are not in the circuit"
            + ("; ringed heads are sink heads (most of their attention on the first token)"
               if any("sink" in n for n in data["nodes"]) else "") + "</p></div>"
            f"<script id='circuit-data' type='application/json'>{blob}</script>")


def k_label(data: dict, k: int) -> str:
    """The slider's label (the script's `kLabel`)."""
    f = data["f_at"].get(str(k))
    of = f"{data['n_edges']} edges" + (f" (the top {len(data['edges'])} on this page)"
                                       if len(data["edges"]) < data["n_edges"] else "")
    text = f"top {k} of {of}, " + ("faithfulness not measured at this k" if f is None else f"faithfulness f = {f:.3f}")
    if k == data["circuit_k"]:
        ci = (f" [{data['circuit_lo']:.3f}, {data['circuit_hi']:.3f}]" if data["circuit_lo"] is not None else "")
        text += f"{ci} (the circuit: {data['circuit_n']} edges)"
    if f is not None:  # measured on the items the circuit was found on: said, as the held-out result says its own
        text += f", in-sample (the {data['n_items']} items it was found on)"
    return text


CSS = """
#circuit-view .scroll{overflow-x:auto;border:1px solid #ddd;background:#fff}
#circuit-svg{display:block}#circuit-svg text{font-size:10px;fill:#222}#circuit-svg text.row{font-weight:600;fill:#555}
.node circle{stroke:#333;stroke-width:1;cursor:pointer}.node.sink circle{stroke:#7b3294;stroke-width:3}.node text{pointer-events:none}.node .hit{fill:transparent;stroke:none}
.edge{fill:none}.edge.dim{opacity:.08}.internal{stroke:#bbb;stroke-width:1}.node.on circle{stroke-width:3}
#tip{position:fixed;z-index:10;background:#fff;border:1px solid #888;border-radius:4px;padding:.4em .6em;
font-size:12px;white-space:pre;box-shadow:0 2px 6px rgba(0,0,0,.2);pointer-events:none}
"""

JS = r"""
(function(){
  var holder = document.getElementById('circuit-data');
  if (!holder) return;
  var d = JSON.parse(holder.textContent), svg = document.getElementById('circuit-svg');
  var NS = 'http://www.w3.org/2000/svg', G = d.geometry, H = d.height;
  var byId = {}; d.nodes.forEach(function(n){ byId[n.id] = n; });
  var maxs = 0; d.edges.forEach(function(e){ maxs = Math.max(maxs, Math.abs(e.score)); }); maxs = maxs || 1;
  var slider = document.getElementById('k'), label = document.getElementById('k-label');
  var touched = document.getElementById('touched'), tip = document.getElementById('tip');
  var k = +slider.value, chosen = null, pos = {}, lines = [];
  function el(tag, attrs){ var x = document.createElementNS(NS, tag); for (var a in attrs) x.setAttribute(a, attrs[a]); return x; }
  function fmt(x){ var s = x.toFixed(1); return s.replace(/\.0$/, ''); }
  function signed(x){ return (x >= 0 ? '+' : '') + x.toFixed(4); }
  function share(v){ return Math.abs(d.gap) > 1e-12 ? (100 * v / d.gap).toFixed(1) + '% of the gap' : 'gap is zero'; }
  function edgeTip(i, e){
    var t = [e.name, 'rank ' + (i + 1) + ' of ' + d.n_edges,
             'estimated (' + d.method + ') ' + signed(e.score) + ', ' + share(e.score)];
    if (e.exact === null) t.push('exact: not measured (only the top-ranked edges are verified)');
    else t.push('exact ' + signed(e.exact) + (e.lo === null ? '' : ' [' + signed(e.lo) + ', ' + signed(e.hi) + ']') +
                ', ' + share(e.exact));
    t.push(e.c ? 'in the circuit' : 'not in the circuit'); return t.join('\n'); }
  function kLabel(k){
    var f = d.f_at[String(k)], n = d.edges.length;
    var s = 'top ' + k + ' of ' + d.n_edges + ' edges' + (n < d.n_edges ? ' (the top ' + n + ' on this page)' : '') + ', ' +
      (f === undefined ? 'faithfulness not measured at this k' : 'faithfulness f = ' + f.toFixed(3));
    if (k === d.circuit_k) s += (d.circuit_lo === null ? '' : ' [' + d.circuit_lo.toFixed(3) + ', ' + d.circuit_hi.toFixed(3) + ']') +
      ' (the circuit: ' + d.circuit_n + ' edges)';
    if (f !== undefined) s += ', in-sample (the ' + d.n_items + ' items it was found on)';
    return s; }
  function shownNodes(k, only){
    var on = {};
    if (!only){ d.nodes.forEach(function(n){ on[n.id] = 1; }); return on; }
    on.input = 1; on.logits = 1;
    d.edges.slice(0, k).forEach(function(e){ [e.s, e.r].forEach(function(x){ on[x] = 1;
      if (byId[x].kind === 'port') byId[x].anchors.forEach(function(h){ on[h] = 1; }); }); });
    return on; }
  function place(on){
    var rows = {}, widest = 1, p = {};
    d.nodes.forEach(function(n){ if (on[n.id] && n.kind !== 'port'){ (rows[n.row] = rows[n.row] || []).push(n); } });
    for (var r in rows) widest = Math.max(widest, rows[r].length);
    var W = Math.max(G.min_width, 2 * G.margin + (widest + 1) * G.spacing);
    for (var r2 in rows){ var m = rows[r2];
      m.sort(function(a, b){ return a.order - b.order || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0); });
      m.forEach(function(n, i){ p[n.id] = [G.margin + (W - 2 * G.margin) * (i + 1) / (m.length + 1), n.y]; }); }
    d.nodes.forEach(function(n){ if (on[n.id] && n.kind === 'port'){
      var xs = n.anchors.filter(function(h){ return p[h]; }).map(function(h){ return p[h][0]; });
      if (xs.length) p[n.id] = [xs.reduce(function(a, b){ return a + b; }, 0) / xs.length + G.port_dx[n.port] * G.spacing, n.y]; } });
    return [p, W]; }
  function showTip(ev, text){ tip.textContent = text; tip.hidden = false;
    tip.style.left = (ev.clientX + 14) + 'px'; tip.style.top = (ev.clientY + 14) + 'px'; }
  function hideTip(){ tip.hidden = true; }
  function build(){
    var placed = place(shownNodes(k, touched.checked)), W = placed[1]; pos = placed[0];
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    svg.setAttribute('width', fmt(W)); svg.setAttribute('viewBox', '0 0 ' + fmt(W) + ' ' + fmt(H));
    d.rows.forEach(function(r){ var t = el('text', {'class': 'row', x: 6, y: fmt(r.y + 4)}); t.textContent = r.label; svg.appendChild(t); });
    var gi = el('g', {}), ge = el('g', {id: 'edges'}), gn = el('g', {id: 'nodes'});
    svg.appendChild(gi); svg.appendChild(ge); svg.appendChild(gn);
    d.internal.forEach(function(e){ var a = pos[e.s], b = pos[e.r]; if (!a || !b) return;
      gi.appendChild(el('line', {x1: fmt(a[0]), y1: fmt(a[1]), x2: fmt(b[0]), y2: fmt(b[1]), 'class': 'internal'})); });
    lines = d.edges.map(function(e, i){
      var a = pos[e.s], b = pos[e.r]; if (!a || !b) return null;
      var p = el('path', {d: 'M' + fmt(a[0]) + ',' + fmt(a[1]) + ' Q' + fmt((a[0] + b[0]) / 2 + 20) + ',' + fmt((a[1] + b[1]) / 2) +
        ' ' + fmt(b[0]) + ',' + fmt(b[1]), 'class': 'edge', stroke: e.score >= 0 ? '#1f77b4' : '#d62728',
        'stroke-width': (0.5 + 5 * Math.abs(e.score) / maxs).toFixed(2), 'data-rank': i + 1});
      if (!e.c) p.setAttribute('stroke-dasharray', '4 3');
      p.addEventListener('mousemove', function(ev){ showTip(ev, edgeTip(i, e)); });
      p.addEventListener('mouseleave', hideTip);
      ge.appendChild(p); return p; });
    d.nodes.forEach(function(n){ var c = pos[n.id]; if (!c) return;
      var g = el('g', {'class': 'node' + (n.sink != null ? ' sink' : ''), 'data-id': n.id});
      g.appendChild(el('circle', {cx: fmt(c[0]), cy: fmt(c[1]), r: n.kind === 'port' ? 3 : 6, fill:
        {input: '#999', logits: '#999', head: '#ffbb78', mlp: '#98df8a', port: '#ddd'}[n.kind] || '#ccc'}));
      g.appendChild(el('circle', {'class': 'hit', cx: fmt(c[0]), cy: fmt(c[1]), r: n.kind === 'port' ? 5 : 8}));
      if (n.label){ var t = el('text', {x: fmt(c[0]), y: fmt(c[1] - 9), 'text-anchor': 'middle'}); t.textContent = n.label; g.appendChild(t); }
      g.addEventListener('click', function(){ chosen = chosen === n.id ? null : n.id; draw(); });
      g.addEventListener('mousemove', function(ev){ showTip(ev, nodeTip(n)); });
      g.addEventListener('mouseleave', hideTip);
      gn.appendChild(g); });
    draw(); }
  function nodeTip(n){ var i = 0, o = 0;
    d.edges.slice(0, k).forEach(function(e){ if (e.r === n.id) i++; if (e.s === n.id) o++; });
    return n.name + (n.sink != null ? '\nsink head: ' + n.sink.toFixed(3) + ' of its attention on the first token (most in any format)' : '') +
      '\n' + i + ' shown edge' + (i === 1 ? '' : 's') + ' in, ' + o + ' out'; }
  function links(){ var on = d.edges.slice(0, k); return on.concat(d.internal); }
  function reach(from, fwd){ var seen = {}; seen[from] = 1; var todo = [from], on = links();
    while (todo.length){ var x = todo.pop(); on.forEach(function(e){ var a = fwd ? e.s : e.r, b = fwd ? e.r : e.s;
      if (a === x && !seen[b]){ seen[b] = 1; todo.push(b); } }); } return seen; }
  function draw(){
    label.textContent = kLabel(k);
    var up = chosen ? reach(chosen, false) : null, down = chosen ? reach(chosen, true) : null;
    lines.forEach(function(p, i){ if (!p) return; var e = d.edges[i];
      p.style.display = i < k ? '' : 'none';
      var lit = !chosen || ((up[e.r] && up[e.s]) || (down[e.s] && down[e.r]));
      p.setAttribute('class', 'edge' + (lit ? '' : ' dim')); });
    Array.prototype.forEach.call(svg.querySelectorAll('g.node'), function(g){
      var n = byId[g.getAttribute('data-id')];
      g.setAttribute('class', 'node' + (n && n.sink != null ? ' sink' : '') + (chosen && g.getAttribute('data-id') === chosen ? ' on' : '')); }); }
  slider.addEventListener('input', function(){ k = +slider.value; if (touched.checked) build(); else draw(); });
  touched.addEventListener('change', build);
  document.getElementById('k-controls').hidden = false; document.getElementById('touched-control').hidden = false;
  build();
})();
"""


def folds_circuit_text(r) -> str:
    """The circuit cross-validated (`surgeon circuit --folds K`): sizes and faithfulness per fold, and each edge's
    selection frequency."""
    reading = "faithfulness" if r.semantics == "kept" else "share removed by knocking it out"
    lines = [f"case {r.case} · the circuit cross-validated: {r.folds} folds of {r.n_items} items (fold sizes "
             f"{', '.join(map(str, r.fold_sizes))}; seed {r.seed}, stratified by tag); each found on the other folds "
             "and measured on its own",
             f"edges per fold: {', '.join(map(str, r.sizes))}",
             f"{reading} held out, per fold: {', '.join(f'{v:.3f}' for v in r.held_out)} (mean "
             f"{sum(r.held_out) / len(r.held_out):.3f}); in-sample, where each was pruned: "
             f"{', '.join(f'{v:.3f}' for v in r.in_sample)}",
             f"edges in every fold's circuit: {sum(1 for n in r.edges.values() if n == r.folds)} of {len(r.edges)} ever "
             "selected", "", "selection frequency (folds whose circuit holds the edge):"]
    for name, n in list(r.edges.items())[:40]:
        lines.append(f"  {n}/{r.folds}  {name}")
    if len(r.edges) > 40:
        lines.append(f"  ... {len(r.edges) - 40} more")
    return "\n".join(lines)


def circuit_text(r, top: int = 10) -> str:
    gap = r.full - r.empty
    steps = r.options.get("ig_steps")
    what = {"eap": "EAP (gradient at mask 0)", "eap-ig-inputs": f"EAP-IG-inputs ({steps} steps)",
            "eap-ig-activations": f"EAP-IG-activations ({steps} steps per sender group)",
            "eap-ig-masks": f"integrated gradients over the edge masks ({steps} midpoints, averaged)",
            "exact": "exact edge patching"}[r.method]
    sem = r.options.get("semantics", "kept")
    sym = "f" if sem == "kept" else "removed"
    lines = [f"case {r.case} · circuit of the {r.source!r} run against {r.base!r} ({r.direction}, {r.ablation} "
             f"ablation, {sem} semantics) · {r.n_items} items ({r.tag or 'all'}) · {r.n_edges} edges scored by {what}",
             f"m(empty) = {r.empty:+.3f} (every edge ablated), m(full) = {r.full:+.3f} (nothing ablated); "
             + ("faithfulness f = (m(circuit) - m(empty)) / (m(full) - m(empty))" if sem == "kept" else
                "removed = (m(full) - m(without the circuit)) / (m(full) - m(empty)), the share of the behaviour "
                "that knocking the circuit out removes")]
    if r.options.get("semantics_detail"):
        lines.append(f"what a circuit means: {r.options['semantics_detail']}; a path is path-patched")
    lines.append("")
    order = np.argsort(-np.abs(r.scores))[:top]
    alone = "patching the edge alone" if r.ablation == "resample" else f"{r.ablation}-ablating the edge alone"
    lines.append(f"top {len(order)} edges by |score| (effect on the mean score of {alone}):")
    lines.append(f"  {'edge':28s} {'score':>9s} {'exact':>9s}")
    for e in order:
        ex = r.exact.get(int(e))
        lines.append(f"  {r.edge_names[e]:28s} {num(r.scores[e], '+9.3f')} " + (num(ex, "+9.3f") if ex is not None else f"{'-':>9s}"))
    if r.verify_pearson is not None:
        lines.append(f"  estimate vs exact over the top {len(r.exact)} edges: Pearson r = {r.verify_pearson:.3f}")
    lines += ["", f"{'faithfulness' if sem == 'kept' else 'knock-out'} curve (top-scoring edges, MIB's fractions):",
              "  " + "  ".join(f"{100 * x:g}%:{n}" for x, n in zip(r.curve_fractions, r.curve_edges)),
              "  " + "  ".join(num(v, ".3f") for v in r.curve),
              f"  CPR (area under f) = {r.cpr:.3f}, CMD (area under |1 - f|) = {r.cmd:.3f}", ""]
    s = r.search
    if r.target is not None and s.get("k") is None:
        how = f"no top-k edge set reaches {sym} >= {r.target}: every edge"
    elif r.target is not None:
        how = f"smallest top-k edge set with {sym} >= {r.target}: k = {s['k']}"
        if s.get("f_before") is not None:
            how += f" ({sym}(k-1) = {s['f_before']:.3f})"
    else:
        how = "the top edges asked for"
    if s.get("pruned", len(r.circuit)) != s.get("prefix", len(r.circuit)):
        how += f", less {s['prefix'] - s['pruned']} edges on no complete path"
    lo, hi = r.circuit_faithfulness_ci
    lines.append(f"circuit ({how}): {len(r.circuit)} edges, "
                 f"{sym} = {r.circuit_faithfulness:.3f} [{lo:.3f}, {hi:.3f}] (95% CI over items)"
                 + past_one(r.circuit_faithfulness, hi))
    if s.get("search"):
        lines.append(f"  search: {s['describe']}")
    nodes = sorted({x.split("<")[0] for n in r.names(r.circuit) for x in n.split("->")} - {"input", "logits"})
    lines.append("  nodes: " + (", ".join(nodes) if nodes else "(none)"))
    if not r.paths and r.options.get("n_paths", 0) > 0:
        lines += ["", f"no paths listed: {r.no_paths}"]
    if r.paths:
        lines += ["", f"strongest complete paths, verified by path patching (effect on the score; share of the full "
                      f"patch's effect, per item; skill path: share >= {r.options['min_share']} on >= "
                      f"{100 * r.options['min_items']:.0f}% of items):"]
        for i, p in enumerate(r.paths, 1):
            e, s = p.effect, p.share
            lines.append(f"  {i:2d}. {' -> '.join(p.nodes)}")
            lines.append(f"      effect {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] (n={e.n}), share {s.value:.3f}"
                         f"{' · skill path' if p.skill else ''}")
    if abs(gap) <= 1e-6 * max(1.0, abs(r.full), abs(r.empty)):
        lines[2:2] = ["warning: the two formats score the same (m(full) = m(empty)): faithfulness is undefined, so "
                      "the curve and the pruned circuit below mean nothing"]
    return "\n".join(lines)


def past_one(value: float, hi: float) -> str:
    """A note where a faithfulness or its interval passes 1: not clipped, because it is a ratio of mean scores that can
    pass 1 (the circuit scores above the full model: some edges outside it work against the behaviour)."""
    if not (math.isfinite(hi) and hi > 1):
        return ""
    what = "it passes 1" if value > 1 else "its interval passes 1"
    return (f" ({what}: faithfulness is (m(C) - m(empty)) / (m(full) - m(empty)), which exceeds 1 where the circuit "
            "scores above the full model, i.e. edges left out work against the behaviour; not clipped)")


def heldout_circuit_text(r) -> str:
    """The circuit found on the discovery items and its faithfulness on the held-out items (the result)."""
    c, h = r.search, r.held_out
    ci = lambda lo_hi: f"[{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if lo_hi else "[no interval]"  # noqa: E731
    reading = "faithfulness" if h["semantics"] == "kept" else "share removed by knocking it out"
    lines = [f"case {r.case} · circuit found on {r.split.describe()} · the {c.source!r} run against {c.base!r} "
             f"({c.ablation} ablation, {h['semantics']} semantics)",
             f"held-out ({r.n_evaluation} items, the result): {len(c.circuit)} edges, {reading} = "
             f"{h['faithfulness']:.3f} {ci(h['faithfulness_ci'])} (95% CI over items)",
             f"in-sample ({r.n_discovery} discovery items, where it was pruned to reach the target): {reading} = "
             f"{c.circuit_faithfulness:.3f} {ci(c.circuit_faithfulness_ci)}",
             "", f"the circuit on the discovery items (in-sample, n={r.n_discovery}):", circuit_text(c)]
    if r.curve:
        head = lines[:3]
        curve = [f"faithfulness curve of the discovery ranking (its top-k edges at MIB's fractions) on the "
                 f"{r.n_evaluation} held-out items:",
                 "  " + "  ".join(f"{100 * x:g}%:{k}" for x, k in zip(c.curve_fractions, c.curve_edges)),
                 "  held out   " + "  ".join(num3(v) for v in r.curve) + f"   CPR {r.cpr:.3f}, CMD {r.cmd:.3f}",
                 "  in-sample  " + "  ".join(num3(v) for v in c.curve) + f"   CPR {c.cpr:.3f}, CMD {c.cmd:.3f}"]
        lines = head + curve + lines[3:]
    return "\n".join(lines)


def circuit_eval_text(r: dict, path) -> str:
    lo, hi = r["faithfulness_ci"] or (float("nan"), float("nan"))
    sem = r.get("semantics", "kept")
    lines = [f"case {r['case']} · circuit {path} · {r['n_edges']} of {r['of_edges']} edges · the {r['source']!r} run "
             f"against {r['base']!r} ({r.get('ablation', 'resample')} ablation, {sem} semantics) · {r['n_items']} items",
             f"what a circuit means: {r['semantics_detail']}" if r.get("semantics_detail") else "",
             f"m(empty) = {r['empty']:+.3f}, m(circuit) = {r['circuit']:+.3f}, m(full) = {r['full']:+.3f}",
             (f"faithfulness = {r['faithfulness']:.3f}" if sem == "kept" else
              f"share removed by knocking the circuit out = {r['faithfulness']:.3f}") +
             f" [{lo:.3f}, {hi:.3f}] (95% CI over items)" + past_one(r["faithfulness"], hi)]
    made = r.get("made") or {}
    if made:
        lines.append(f"the file says it was found by {made.get('method')} on case {made.get('case')!r} ("
                     f"{made.get('ablation')} ablation, {made.get('semantics')}, {made.get('direction')}, failing format "
                     f"{made.get('failing_format')!r}, {made.get('n_items')} items, {made.get('tool')})")
    lines += [f"note: {n}" for n in r.get("notes") or ()]
    lines = [x for x in lines if x]
    if r["n_edges"] == 0:
        lines.append(f"warning: {path} marks no edge as in the circuit: this is the empty circuit "
                     f"({'f = 0' if sem == 'kept' else 'nothing removed'} by definition)")
    return "\n".join(lines)


def circuit_line(c) -> str:
    lo, hi = c.circuit_faithfulness_ci
    return (f"{len(c.circuit)} of {c.n_edges} edges, f = {c.circuit_faithfulness:.3f} [{lo:.3f}, {hi:.3f}] "
            f"({c.method}, {c.ablation} ablation)")


def heldout_circuit_line(r) -> str:
    h, c = r.held_out, r.search
    ci = h.get("faithfulness_ci")
    return (f"{len(c.circuit)} of {c.n_edges} edges, f = {h['faithfulness']:.3f}"
            + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            + f" held out on {r.n_evaluation} items ({c.circuit_faithfulness:.3f} in-sample)")


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "CircuitResult": View("circuit", circuit_text, {"faithfulness.png": figures.faithfulness_figure,
                                                        "circuit.png": circuit_figure}, table=tables.circuit_table,
                          headline=circuit_line),
    "HeldOutCircuit": View("circuit-heldout", heldout_circuit_text,
                           {"faithfulness_discovery.png": lambda r, p: figures.faithfulness_figure(r.search, p),
                            "circuit.png": lambda r, p: circuit_figure(r.search, p)},
                           table=tables.heldout_circuit_table, headline=heldout_circuit_line),
    "FoldsCircuit": View("circuit-folds", folds_circuit_text),
}
