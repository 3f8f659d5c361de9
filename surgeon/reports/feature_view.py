"""How the SAE comparisons and feature circuits print (overlap, amplified features, heads' features, feature repair,
the feature circuit, held out), and the feature circuit's interactive view.

The feature circuit in the report page and in Jupyter: one panel per direction, the circuit's nodes in a row per
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

from surgeon.analyses.feature_circuit import EDGE_MIN, EXACT
from surgeon.reports.threshold_view import threshold_text
from surgeon.show import View
from surgeon.reports import figures
from surgeon.reports import tables

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


def overlap_text(r) -> str:
    lines = [f"case {r.case} · SAE features, top-{r.k} sets at the {r.position} position(s), {r.good!r} vs each "
             f"failing format · {r.n_items} items · mean [95% CI] over items"]
    for b in r.bad:
        lines += ["", f"{r.good} vs {b}:", f"{'layer':>5}  {'overlap':<24} {'jaccard':<24} {'weighted jaccard':<24}"]
        for i, L in enumerate(r.layers):
            cells = [r.metrics[b][m][i] for m in ("overlap", "jaccard", "weighted_jaccard")]
            lines.append(f"{L:>5}  " + " ".join(f"{e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}]".ljust(24) for e in cells))
        ov = [e.value for e in r.metrics[b]["overlap"]]
        lo_i = min(range(len(ov)), key=lambda i: ov[i])
        lines.append(f"formats most separate at layer {r.layers[lo_i]} (overlap {ov[lo_i]:.2f}); "
                     f"last layer {r.layers[-1]}: {ov[-1]:.2f}")
    return "\n".join(lines)


def amplified_text(r, top: int = 20) -> str:
    lines = [f"case {r.case} · SAE layer {r.layer} ({r.sae}) · {r.bad!r} / {r.good!r} activation ratio at the "
             f"{r.position} position · {r.n_items} items",
             f"features active in both formats on >= {r.min_items} items, highest mean ratio first:"]
    if not r.ranked:
        lines.append("  (none)")
    for f in r.ranked[:top]:
        extra = "".join(f"  {x}" for x in (f.label, f.link) if x)
        lines.append(f"  feature {f.feature:>6}: ratio {f.ratio.value:6.2f} [{f.ratio.lo:.2f}, {f.ratio.hi:.2f}] "
                     f"on {f.n_both} items · mean act {r.good} {f.mean_good:.3f}, {r.bad} {f.mean_bad:.3f}{extra}")
    for name, lst, fmt in (("only in the failing format", r.only_bad, r.bad), ("only in the good format", r.only_good, r.good)):
        lines.append(f"active {name} ({fmt}), by number of items: " +
                     (", ".join(f"{j} ({c})" for j, c in lst) if lst else "(none)"))
    return "\n".join(lines)


def head_feature_text(r, top_units: int = 12) -> str:
    lines = [f"case {r.case} · heads of layer {r.layer} patched from {r.good!r} into {r.bad!r}; features of the SAE "
             f"at {r.hook} ({r.sae}) · {r.n_items} items",
             "effect = feature activation patched - unpatched (mean over items); columns: the features differing most "
             "between formats, with their gap (good - failing)",
             f"{'':>8}" + "".join(f"{'f' + str(j):>9}" for j in r.features),
             f"{'gap':>8}" + "".join(f"{g:>+9.3f}" for g in r.format_gap)]
    order = sorted(range(len(r.units)), key=lambda i: -float(abs(r.effect[i]).sum()))
    shown = [i for i in order if not r.units[i].startswith("L")] + [i for i in order if r.units[i].startswith("L")][:top_units]
    for i in shown:
        lines.append(f"{r.units[i]:>8}" + "".join(f"{v:>+9.3f}" for v in r.effect[i]))
    lines.append("(95% intervals over items, and effect / gap per cell, are in results.json)")
    return "\n".join(lines)


def feature_repair_text(r) -> str:
    lines = [f"case {r.case} · SAE features at {r.hook} ({r.sae}, {r.d_sae} features) patched from {r.source!r} into "
             f"{r.base!r} · {r.n_items} items",
             f"empty patch reproduces the model: max |score difference| {r.empty_patch_max_diff:.1e}",
             f"repair fraction, whole activation patched: {r.whole_fraction:+.3f}; every feature patched (error term "
             f"kept): {r.all_features_fraction:+.3f}",
             "top features by attribution (one backward pass), with their exact single-feature repair fraction:"]
    for j, est, exact in r.top:
        lines.append(f"  feature {j:>6}: estimate {est:+.3f}, exact {exact:+.3f}")
    lines += ["", "subsets of these features:", threshold_text(r.search)]
    f_all, h_all = r.search.sizes, r.heads.sizes
    best = lambda rows: max((row.mean_repair_fraction for row in rows if row.family == "all"), default=float("nan"))  # noqa: E731
    kf, kh = r.search.threshold("all").k_star, r.heads.threshold("all").k_star
    lines += ["", f"against head subsets of layer {r.layer} (head outputs patched, same items):",
              f"  features: k* = {kf if kf is not None else 'none'}, best mean repair fraction of a size {best(f_all):+.3f}",
              f"  heads:    k* = {kh if kh is not None else 'none'}, best mean repair fraction of a size {best(h_all):+.3f}"]
    return "\n".join(lines)


def _exact_words(r) -> str:
    """How a feature circuit's exact node effects were taken (analyses.feature_circuit.EXACT)."""
    if any(n.slot is not None for n in r.nodes):
        return "a node per aligned position, patched there"
    return EXACT[getattr(r, "exact", "joint")]


# above this share of a feature circuit's attribution on error nodes, the SAEs are said to explain little: SAEs that fit
# their activations leave 0-5% there on the shipped organisms; an SAE of the next layer saved under another's name, 31%
ERROR_SHARE_WARN = 0.2


def feature_circuit_text(r, top: int = 12) -> str:
    saes = ", ".join(f"{h} ({d})" for h, _, d in r.saes)
    meth = {"ig": f"integrated gradients over the feature mask ({r.steps} midpoints, one SAE at a time)",
            "ig-marks": f"integrated gradients at Marks et al.'s points k/{r.steps}, k = 0..{r.steps - 1}, one SAE at a "
                        f"time (their _pe_ig)",
            "gradient": "the gradient at the mask's 0 (one backward pass)"}.get(r.method, r.method)
    left = ("averaged over the same points with d's SAE moved (Marks et al.'s jvp)" if r.method == "ig-marks"
            else "in the unpatched run")
    lines = [f"case {r.case} · feature circuit over {len(r.nodes)} nodes (every feature, and an error node per SAE) · "
             f"{r.n_items} items",
             "edges (Marks et al.): u -> d, the effect of u that reaches the answer through d alone; attribution: d's "
             f"gradient ({left}) . the Jacobian . u's change, the SAE hook points between held (direct edges), "
             + ("read only at d's (item, position) entries whose own effect reaches the node threshold (Marks et al.'s "
                "edge rule, --edge-rule marks)" if getattr(r, "edge_rule", "all") == "marks" else
                "read at every (item, position) entry of d (Marks et al. read only the entries whose effect reaches "
                "their node threshold: --edge-rule marks)")
             + "; exact: u patched, then d alone set to the value it took",
             f"SAEs (features): {saes}",
             f"attribution: {meth}; exact: the top nodes each patched alone ({_exact_words(r)}); effects as fractions "
             f"of the gap between the formats, 95% bootstrap intervals over items",
             "faithfulness (Marks et al.): keep the circuit, give every other node the other run's value: 1 is all of "
             "the behaviour; completeness: ablate the circuit, keep the rest: 0 is complete"]
    slots = sorted({(n.slot, n.position) for n in r.nodes if n.slot is not None})
    if slots:
        lines.insert(2, "a node per aligned position: " + ", ".join(f"@{j} = {label}" for j, label in slots))
    for d in r.directions.values():
        errs = sum(r.nodes[i].error for i in d.circuit)
        lines += ["", f"{d.direction}: the {d.base!r} run with the {d.source!r} run's values (mean score {d.base_mean:+.3f} "
                      f"-> {d.source_mean:+.3f})",
                  f"  circuit: {len(d.circuit)} nodes ({errs} error nodes, {d.error_share:.0%} of its attribution) · "
                  f"faithfulness {d.faithfulness} · completeness {d.completeness}",
                  f"  chosen as {d.search}",
                  "  top nodes:  attribution  exact [95% CI]"]
        if d.error_share > ERROR_SHARE_WARN:
            lines.insert(-2, f"  WARNING: error nodes carry {d.error_share:.0%} of the circuit's attribution: the SAEs "
                             "leave much of these activations unexplained (an SAE of another layer or model reads "
                             "this way; `surgeon sae quality` measures each SAE's reconstruction on the case)")
        for i in d.order[:top]:
            e = d.exact.get(int(i))
            lines.append(f"    {r.nodes[i].name:32s} {d.attribution[i]:+.3f}   "
                         + (f"{e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]" if e is not None else "--"))
        lines.append("  curve (top-k kept | ablated): " + ", ".join(f"{k}: {f:.2f} | {c:.2f}" for k, f, c in d.curve))
        if d.edges:
            kept = f" ({len(d.edges)} kept)" if len(d.edges) < d.edges_nonzero else ""
            lines.append(f"  edges among its nodes: {d.edges_nonzero} nonzero{kept}, {len(d.drawn_edges())} drawn "
                         f"(|attribution| >= {EDGE_MIN:g} of the gap); strongest:  attribution  exact [95% CI]")
            for e in d.edges[: top // 2]:
                x = e.exact
                lines.append(f"    {r.nodes[e.up].name} -> {r.nodes[e.down].name}  {e.attribution:+.3f}   "
                             + (f"{x.value:+.3f} [{x.lo:+.3f}, {x.hi:+.3f}]" if x is not None else "--"))
    names = lambda idx: ", ".join(r.nodes[i].name for i in idx[:8]) + (f" (+{len(idx) - 8})" if len(idx) > 8 else "")  # noqa: E731
    lines += ["", "across formats (in one circuit only, or at least 2x stronger there):",
              f"  failing format's: {len(r.only_failing)} nodes{': ' + names(r.only_failing) if r.only_failing else ''}",
              f"  working format's: {len(r.only_working)} nodes{': ' + names(r.only_working) if r.only_working else ''}"]
    if r.edges_only_failing or r.edges_only_working:
        lines.append(f"  edges: {len(r.edges_only_failing)} drawn in the failing format's circuit only (or 2x stronger), "
                     f"{len(r.edges_only_working)} in the working format's")
    rep = r.repair
    if rep.nodes:
        lines.append(f"  repair they suggest (these {len(rep.nodes)} nodes given the working format's values in the "
                     f"failing run): items right {rep.rate.pct()} (unpatched {rep.base_rate.pct()}); fraction of "
                     f"the gap {rep.fraction}")
    else:
        lines.append("  the two circuits do not differ: no repair to suggest")
    return "\n".join(lines)


def heldout_feature_circuit_text(r) -> str:
    """The feature circuits found on the discovery items, measured on the held-out ones (the result)."""
    ci = lambda e: f"{e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}]"  # noqa: E731
    pct = lambda e: f"{100 * e.value:.1f}% [{100 * e.lo:.1f}, {100 * e.hi:.1f}] (n={e.n})"  # noqa: E731
    lines = [f"case {r.case} · feature circuits found on {r.split.describe()}",
             f"each direction's circuit (its nodes chosen on the {r.n_discovery} discovery items) kept and ablated on "
             f"the {r.n_evaluation} held-out items (the result), beside the discovery items (in-sample; 95% bootstrap "
             "intervals over items)", "",
             f"{'direction':<10} {'nodes':>5}  {'faithfulness held out':<24} {'in-sample':<24} {'completeness held out':<24} in-sample"]
    for d in r.directions:
        lines.append(f"{d.direction:<10} {d.nodes:>5}  {ci(d.faithfulness):<24} {ci(d.discovery_faithfulness):<24} "
                     f"{ci(d.completeness):<24} {ci(d.discovery_completeness)}")
    for d in r.directions:
        if d.edges:
            names = r.search.nodes
            lines += ["", f"{d.direction}: the circuit's edges verified exactly on the discovery items, verified again "
                          "on the held-out items (fractions of the gap; held out [95% CI] · in-sample):"]
            for u, v, x, e in d.edges[:10]:
                lines.append(f"  {names[u].name} -> {names[v].name}: {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}] · {x:+.3f}")
    if r.repair_rate is not None:
        lines += ["", f"the repair the circuits' difference suggests ({len(r.search.repair.nodes)} nodes), patched on the "
                      f"held-out items: {pct(r.repair_rate)} right (unpatched {pct(r.repair_base)})"]
    lines += ["", f"the feature circuits on the discovery items (in-sample, n={r.n_discovery}):",
              feature_circuit_text(r.search)]
    return "\n".join(lines)


def heldout_feature_repair_text(r) -> str:
    """`sae repair --holdout`: the features chosen on the discovery items, patched on the held-out ones."""
    ci = lambda e: f"{e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]"  # noqa: E731
    pct = lambda e: f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}]"  # noqa: E731
    s = r.search
    lines = [f"case {r.case} · SAE features at layer {s.layer} ({s.hook}) chosen on {r.split.describe()}",
             f"the top {len(s.top)} features by attribution on the {r.n_discovery} discovery items, each alone and all "
             f"together, patched {s.source!r} into {s.base!r} on the {r.n_evaluation} held-out items (the result); the "
             "discovery fraction is in-sample", "",
             f"{'features':<28} {'held-out repair fraction':<28} {'held-out items right':<24} in-sample fraction"]
    for row in r.rows:
        name = "all: " + "+".join(map(str, row.features)) if len(row.features) > 1 else f"feature {row.features[0]}"
        d = "--" if row.discovery != row.discovery else f"{row.discovery:+.3f}"
        lines.append(f"{name[:28]:<28} {ci(row.held_out):<28} {pct(row.rate):<24} {d}")
    lines += ["", f"the search on the discovery items (in-sample, n={r.n_discovery}):", feature_repair_text(s)]
    return "\n".join(lines)


def feature_circuit_line(r) -> str:
    d = r.directions["denoise"]
    return (f"{len(d.circuit)} of {len(r.nodes)} nodes, faithfulness {d.faithfulness.value:.3f} "
            f"[{d.faithfulness.lo:.3f}, {d.faithfulness.hi:.3f}], error nodes {d.error_share:.0%} of its attribution")


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "OverlapResult": View("sae-overlap", overlap_text, {"overlap.png": figures.overlap_figure},
                          table=tables.overlap_table),
    "AmplifiedResult": View("sae-amplified", amplified_text, table=tables.amplified_table),
    "HeadFeatureResult": View("sae-heads", head_feature_text, {"heads_features.png": figures.head_feature_heatmap},
                              table=tables.head_feature_table),
    "FeatureRepairResult": View("sae-repair", feature_repair_text, table=tables.feature_repair_table),
    "FeatureCircuitResult": View("feature-circuit", feature_circuit_text,
                                 {"feature_curve.png": figures.feature_circuit_figure},
                                 table=tables.feature_circuit_table, headline=feature_circuit_line,
                                 widget=widget),
    "HeldOutFeatureCircuit": View("feature-circuit-heldout", heldout_feature_circuit_text),
    "HeldOutFeatureRepair": View("sae-repair-heldout", heldout_feature_repair_text),
}
