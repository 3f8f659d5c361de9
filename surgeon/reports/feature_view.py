"""The feature circuit in the report page and in Jupyter: one panel per direction, the circuit's nodes in a row per
SAE (strongest first), coloured by the sign and size of their attribution, error nodes dashed, and the edges its
graph draws as lines from the upstream node to the downstream one (width by |attribution|, colour by sign). Hovering
(or focusing) a node shows what it is: its attribution, its exact effect with the interval, its mean activation in
both formats, the items it is most active on in the failing one, and its strongest edges in and out.
Self-contained (styles, data and script inline), no library.
"""
from __future__ import annotations

import hashlib
import html
import json

BOX_W, BOX_H, GAP, PER_LINE = 58, 22, 6, 14

CSS = """
.fc-view{font-family:system-ui,sans-serif;margin:.5em 0}
.fc-view svg{display:block;margin:.3em 0}
.fc-view .fc-node{cursor:pointer}.fc-view .fc-node:hover rect,.fc-view .fc-node:focus rect{stroke:#000;stroke-width:2}
.fc-view .fc-note{min-height:5.5em;font-size:13px;background:#f6f6f6;padding:.4em .6em;white-space:pre-line}
.fc-view .fc-row{font-size:11px;fill:#555}
.fc-view .fc-edge{fill:none;opacity:.75}
"""

JS = """
document.querySelectorAll('.fc-view').forEach(function (view) {
  var data = JSON.parse(view.querySelector('.fc-data').textContent);
  var note = view.querySelector('.fc-note');
  function show(el) { note.textContent = data.nodes[el.getAttribute('data-node')]; }
  view.querySelectorAll('.fc-node').forEach(function (el) {
    el.addEventListener('mouseenter', function () { show(el); });
    el.addEventListener('focus', function () { show(el); });
  });
});
"""


def _colour(v: float, top: float) -> str:
    a = min(1.0, abs(v) / top) if top > 0 else 0.0
    r, g, b = (33, 102, 172) if v >= 0 else (178, 24, 43)
    mix = lambda c: int(255 - (255 - c) * (0.15 + 0.85 * a))  # noqa: E731
    return f"rgb({mix(r)},{mix(g)},{mix(b)})"


def _describe(r, d, i: int) -> str:
    n = r.nodes[i]
    e = d.exact.get(i)
    lines = [f"{n.name}" + (f" at {n.position}" if n.position else "") + (" (the SAE's error term)" if n.error else ""),
             f"attribution {d.attribution[i]:+.3f} of the gap"
             + (f"; exact {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] (n={e.n})" if e is not None else "; exact: not verified")]
    p = r.profiles.get(i)
    if p is not None:
        lines.append(f"mean activation: {r.good} {p.good_mean:.3f}, {r.bad} {p.bad_mean:.3f}")
        lines.append(f"most active in {r.bad} on: " + "; ".join(f"{t} ({a:.2f})" for t, a in zip(p.top_items, p.top_acts)))
    for way, mine, other in (("in", "down", "up"), ("out", "up", "down")):
        edges = [e for e in d.drawn_edges() if getattr(e, mine) == i][:3]
        if edges:
            lines.append(f"edges {way}: " + "; ".join(f"{r.nodes[getattr(e, other)].name} {e.attribution:+.3f}"
                                                      for e in edges))
    return "\n".join(lines)


def _panel(r, key: str, texts: dict) -> str:
    d = r.directions[key]
    rows: dict[str, list[int]] = {}
    for i in d.circuit:
        rows.setdefault(r.nodes[i].hook, []).append(i)
    order = sorted(rows, key=lambda h: (r.nodes[rows[h][0]].layer, h))
    top = max((abs(d.attribution[i]) for i in d.circuit), default=1.0)
    parts, y = [], 4
    at: dict[int, tuple[float, float]] = {}  # node -> its box's top centre
    label_w = 150
    for h in order:
        nodes = sorted(rows[h], key=lambda i: -abs(d.attribution[i]))
        parts.append(f"<text class='fc-row' x='0' y='{y + 15}'>{html.escape(h)}</text>")
        for k, i in enumerate(nodes):
            x = label_w + (k % PER_LINE) * (BOX_W + GAP)
            yy = y + (k // PER_LINE) * (BOX_H + GAP)
            n = r.nodes[i]
            uid = f"{key}:{i}"
            texts[uid] = _describe(r, d, i)
            dash = " stroke-dasharray='3,2'" if n.error else ""
            label = ("err" if n.error else f"f{n.unit}") + ("" if n.slot is None else f"@{n.slot}")
            parts.append(f"<g class='fc-node' tabindex='0' data-node='{html.escape(uid)}'>"
                         f"<rect x='{x}' y='{yy}' width='{BOX_W}' height='{BOX_H}' rx='4' "
                         f"fill='{_colour(d.attribution[i], top)}' stroke='#333'{dash}/>"
                         f"<text x='{x + BOX_W / 2}' y='{yy + 15}' text-anchor='middle' font-size='11'>"
                         f"{html.escape(label)}</text></g>")
            at[i] = (x + BOX_W / 2, yy)
        y += ((len(nodes) - 1) // PER_LINE + 1) * (BOX_H + GAP) + 8
    width = label_w + PER_LINE * (BOX_W + GAP)
    edges = d.drawn_edges()
    strongest = max((abs(e.attribution) for e in edges), default=1.0)
    lines = []
    for e in edges:  # from the upstream box's bottom to the downstream box's top, drawn under the boxes
        (x0, y0), (x1, y1) = at[e.up], at[e.down]
        y0 += BOX_H
        mid = (y0 + y1) / 2
        colour = "#2166ac" if e.attribution >= 0 else "#b2182b"
        lines.append(f"<path class='fc-edge' data-edge='{e.up}-{e.down}' d='M{x0:.1f},{y0:.1f} C{x0:.1f},{mid:.1f} "
                     f"{x1:.1f},{mid:.1f} {x1:.1f},{y1:.1f}' stroke='{colour}' "
                     f"stroke-width='{0.5 + 3.5 * abs(e.attribution) / strongest:.2f}'/>")
    parts = lines + parts
    head = (f"<p><b>{html.escape(d.direction)}</b>: the {html.escape(d.base)!s} run with the {html.escape(d.source)} run's "
            f"values; {len(d.circuit)} nodes, {len(d.drawn_edges())} edges drawn, faithfulness {d.faithfulness.value:.3f} "
            f"[{d.faithfulness.lo:.3f}, {d.faithfulness.hi:.3f}]</p>")
    return (head + f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{y}' viewBox='0 0 {width} {y}' "
            f"role='img' aria-label='feature circuit, {html.escape(key)}'>" + "".join(parts) + "</svg>")


def widget(r) -> str:
    """The result as one HTML fragment: a panel per direction and the note a hovered node fills."""
    texts: dict[str, str] = {}
    panels = [_panel(r, key, texts) for key in r.directions]
    blob = json.dumps({"nodes": texts}).replace("</", "<\\/")
    uid = "fc-" + hashlib.sha256(blob.encode()).hexdigest()[:10]
    return (f"<div class='fc-view' id='{uid}'><style>{CSS}</style>"
            "<p class='note'>hover or focus a node: what it is, its effect, its activation in both formats</p>"
            + "".join(panels) + "<div class='fc-note'></div>"
            f"<script type='application/json' class='fc-data'>{blob}</script><script>{JS}</script></div>")
