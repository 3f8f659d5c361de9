"""Each report step's main table as plain data (`Table`), rendered the same way on the page (an HTML table whose
columns sort on a click) and in the paper (a LaTeX booktabs table). Every cell is a number the result holds,
formatted here; nothing is computed but shares and orderings."""
from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass

import numpy as np

from surgeon.reports.citations import tex_escape
from surgeon.show import view_of


@dataclass
class Table:
    step: str
    caption: str  # plain text
    header: list[str]
    rows: list[list[str]]  # plain text cells
    align: str  # "l" or "r" per column (numbers right)

    def latex(self) -> str:
        """A booktabs table (`tab:STEP`)."""
        body = "\n".join(" & ".join(tex_escape(c) for c in r) + r" \\" for r in self.rows)
        # scaled down to the text width only when wider than it
        return ("\\begin{table}[tbp]\n\\centering\\small\n\\caption{" + tex_escape(self.caption) + "}\\label{tab:"
                + self.step.replace("_", "-") + "}\n\\sbox0{\\begin{tabular}{" + self.align + "}\n\\toprule\n"
                + " & ".join(tex_escape(h) for h in self.header) + r" \\" + "\n\\midrule\n" + body +
                "\n\\bottomrule\n\\end{tabular}}\n"
                "\\ifdim\\wd0>\\linewidth\\resizebox{\\linewidth}{!}{\\usebox0}\\else\\usebox0\\fi\n\\end{table}\n")

    def html(self) -> str:
        """An HTML table; numeric cells carry their value in data-sort (the page's script sorts on a header click)."""
        head = "".join(f"<th scope='col' class='{'num' if a == 'r' else ''}'>{html.escape(h)}</th>"
                       for h, a in zip(self.header, self.align))
        body = []
        for r in self.rows:
            cells = []
            for c, a in zip(r, self.align):
                key = _sort_key(c) if a == "r" else None
                attr = f" data-sort='{key!r}'" if key is not None else ""
                cells.append(f"<td class='{'num' if a == 'r' else ''}'{attr}>{html.escape(c)}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        return (f"<table class='data sortable' id='table-{self.step}'><caption>{html.escape(self.caption)}</caption>"
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def _sort_key(cell: str) -> float | None:
    m = re.search(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", cell)
    return float(m.group(0)) if m else None


def _ci(v, lo, hi, digits: int = 3, sign: bool = False) -> str:
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f.format(v)
    return f"{f.format(v)} [{f.format(lo)}, {f.format(hi)}]"


def _pct(v, lo, hi) -> str:
    if not math.isfinite(v):
        return "--"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{100 * v:.1f}%"
    return f"{100 * v:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def diagnose_table(d) -> Table:
    rows = [[s.format, s.role, s.tag, str(s.accuracy.n), _pct(s.accuracy.value, s.accuracy.lo, s.accuracy.hi),
             _ci(s.score.value, s.score.lo, s.score.hi)] for s in d.stats]
    return Table("diagnose", f"Accuracy and mean score per format and tag ({d.case}); 95% intervals (Wilson for "
                 "accuracy, bootstrap for the mean).", ["format", "role", "tag", "n", "accuracy", "mean score"],
                 rows, "lllrrr")


def dla_table(r, top: int = 10) -> Table:
    good = r.formats[0]
    bad, diff = next(iter(r.head_difference.items())) if r.head_difference else (None, None)
    if diff is None:
        order = np.argsort(-np.abs(good.heads[..., 0]), axis=None)[:top]
    else:
        order = np.argsort(-np.abs(diff[..., 0]), axis=None, kind="stable")[:top]
    rows = []
    for k in order:
        L, h = divmod(int(k), r.n_heads)
        cells = [f"L{L}H{h}"] + [_ci(*f.heads[L, h], sign=True) for f in r.formats]
        if diff is not None:
            cells.append(_ci(*diff[L, h], sign=True))
        rows.append(cells)
    header = ["head"] + [f"{f.format} ({f.role})" for f in r.formats] + ([f"{bad} - {good.format}"] if bad else [])
    what = (f"whose direct effect differs most between {bad!r} and {good.format!r}" if bad else
            "with the largest direct effect")
    return Table("dla", f"Direct logit attribution: the {len(rows)} heads {what}, each head's direct effect on the "
                 f"logit difference per format (mean over {r.n_items} items, 95% bootstrap intervals).", header, rows,
                 "l" + "r" * (len(header) - 1))


def patch_table(p, top: int = 10) -> Table:
    flat = np.nan_to_num(np.asarray(p.fraction, dtype=float), nan=-np.inf).ravel()
    order = np.argsort(-flat, kind="stable")[:top]
    rows = []
    for i in order:
        li, u = divmod(int(i), p.n_units)
        rows.append([f"L{int(p.layers[li])}H{u}", _ci(p.fraction[li, u], p.fraction_lo[li, u], p.fraction_hi[li, u],
                                                       sign=True),
                     _pct(p.accuracy[li, u], p.accuracy_lo[li, u], p.accuracy_hi[li, u])])
    return Table("patch", f"The {len(rows)} heads whose patch repairs most ({p.source} into {p.base}, n = {p.n_items} "
                 "items); 95% intervals.", ["head", "repair fraction", "accuracy when patched"], rows, "lrr")


def positions_table(r, top: int = 10) -> Table:
    frac = np.nan_to_num(np.asarray(r.fraction, dtype=float), nan=-np.inf)  # [layer, slot, unit]
    order = np.argsort(-frac.ravel(), kind="stable")[:top]
    rows = []
    for i in order:
        li, si, u = np.unravel_index(int(i), frac.shape)
        unit = f"L{r.layers[li]}H{u}" if r.n_units > 1 else f"L{r.layers[li]} {r.component}"
        rows.append([r.slots[si], unit, str(r.slot_items[si]),
                     _ci(r.fraction[li, si, u], r.fraction_lo[li, si, u], r.fraction_hi[li, si, u], sign=True)])
    what = "repair" if r.direction == "denoise" else "damage"
    return Table("positions", f"Patching one unit at one position alone ({r.source} into {r.base}): the {len(rows)} "
                 f"largest {what} fractions, over the items that have the position (95% intervals).",
                 ["position", "unit", "items", f"{what} fraction"], rows, "llrr")


def threshold_table(r) -> Table:
    rows = []
    for s in sorted((s for s in r.sizes if s.family == "all" and s.evaluated), key=lambda s: s.key):
        rows.append([str(s.key[0]), f"{s.evaluated}/{s.total}", _pct(s.fraction, s.lo, s.hi),
                     _pct(s.best_item_rate, s.best_lo, s.best_hi)])
    t = r.threshold("all")
    k = f"k* = {t.k_star}" if t.k_star is not None else f"no k reaches {100 * t.x:g}%"
    return Table("threshold", f"Head subsets by size k: the fraction that repairs (right on at least "
                 f"{100 * r.item_rate:g}% of {r.n_items} items) and the best subset's share of items right; {k}.",
                 ["k", "subsets", "repairing", "best subset"], rows, "rrrr")


def heldout_threshold_table(r) -> Table:
    rows = []
    for row in sorted((row for row in r.rows if row.family == "all"), key=lambda row: row.k):
        size = r.search.size("all", row.k)
        rows.append([str(row.k), "+".join(row.subset) or "(none)",
                     _pct(row.held_out.value, row.held_out.lo, row.held_out.hi),
                     _pct(row.discovery.value, row.discovery.lo, row.discovery.hi),
                     _pct(size.fraction, size.lo, size.hi)])
    t = next((t for t in r.k_star if t.family == "all"), None)
    k = ("" if t is None else
         f"; k* = {'--' if t.held_out is None else t.held_out} held out ({'--' if t.discovery is None else t.discovery} "
         f"in-sample), the smallest k at which {100 * t.x:g}% of the subsets repair")
    return Table("threshold", f"Head subsets by size k, the search run on {r.n_discovery} discovery items: the best "
                 f"subset of each size evaluated on {r.n_evaluation} held-out items (the result) beside its rate on "
                 f"the discovery items, where it was chosen (in-sample, overstated by the choice), and the in-sample "
                 f"share of subsets repairing (right on at least {100 * r.search.item_rate:g}% of the items){k}. "
                 "Wilson 95% intervals.",
                 ["k", "best subset (discovery)", "held out", "in-sample", "repairing (in-sample)"], rows, "rlrrr")


def heldout_circuit_table(r) -> Table:
    t = circuit_table(r.search)
    h = r.held_out
    ci = h.get("faithfulness_ci")
    reading = "faithfulness" if h.get("semantics", "kept") == "kept" else "share removed by knocking it out"
    held = _ci(h["faithfulness"], *(ci if ci else (None, None)))
    c = r.search
    t.caption = (f"The circuit found on {r.n_discovery} discovery items: {len(c.circuit)} edges, {reading} {held} on "
                 f"{r.n_evaluation} held-out items (the result; 95% interval over items) and "
                 f"{c.circuit_faithfulness:.3f} on the discovery items where it was pruned (in-sample). Its "
                 f"{len(t.rows)} top-scoring edges of {c.n_edges} (estimated and exact effect on the mean score over "
                 "the discovery items, 95% bootstrap intervals).")
    return t


def blend_table(b) -> Table:
    alphas = np.asarray(b.alphas, dtype=float)
    picks = sorted({int(np.argmin(np.abs(alphas - a))) for a in np.linspace(0, 1, 11)})
    rows = [[f"{alphas[i]:.2f}", _pct(b.rate[i], b.rate_lo[i], b.rate_hi[i]), f"{b.mean_score[i]:+.3f}"] for i in picks]
    return Table("blend", f"Layer {b.layer}'s heads blended (1 - a) {b.base} + a {b.source}: the share of "
                 f"{b.n_items} items right (Wilson 95% intervals) and the mean score.",
                 ["a", "items right", "mean score"], rows, "rrr")


def circuit_table(c, top: int = 10) -> Table:
    order = np.argsort(-np.abs(np.asarray(c.scores, dtype=float)), kind="stable")[:top]
    exact = {int(k): float(v) for k, v in c.exact.items()}  # keys are strings in a result read back from JSON
    ci = {int(k): v for k, v in (getattr(c, "exact_ci", None) or {}).items()}
    inside = {int(x) for x in c.circuit}
    rows = []
    for i in map(int, order):
        lo, hi = ci.get(i, (None, None))
        rows.append([c.edge_names[i], f"{c.scores[i]:+.3f}",
                     _ci(exact[i], lo, hi, sign=True) if i in exact else "--", "yes" if i in inside else ""])
    return Table("circuit", f"The {len(rows)} top-scoring edges of {c.n_edges} (estimated and exact effect on the mean "
                 f"score, 95% bootstrap intervals); the circuit has {len(c.circuit)} edges, faithfulness "
                 f"{c.circuit_faithfulness:.3f}.", ["edge", "estimate", "exact", "in circuit"], rows, "lrrl")


def overlap_table(o) -> Table:
    rows = []
    for bad, metrics in o.metrics.items():
        for i, L in enumerate(o.layers):
            rows.append([bad, str(L)] + [_ci(metrics[m][i].value, metrics[m][i].lo, metrics[m][i].hi)
                                         for m in metrics])
    names = list(next(iter(o.metrics.values()))) if o.metrics else []
    return Table("sae_overlap", f"Overlap of the top {o.k} SAE features of the good format ({o.good}) and each "
                 f"failing one per layer, mean over {o.n_items} items (95% bootstrap intervals).",
                 ["failing format", "layer"] + [n.replace("_", " ") for n in names], rows, "lr" + "r" * len(names))


def amplified_table(a, top: int = 10) -> Table:
    rows = [[str(f.feature), _ci(f.ratio.value, f.ratio.lo, f.ratio.hi, digits=2), str(f.n_both),
             f"{f.mean_good:.3f}", f"{f.mean_bad:.3f}", f.label or ""] for f in a.ranked[:top]]
    return Table("sae_amplified", f"SAE features at layer {a.layer} most amplified in {a.bad} over {a.good}: the ratio "
                 f"of activations (95% bootstrap intervals) over the items where each is active in both.",
                 ["feature", f"{a.bad} / {a.good}", "items", f"mean {a.good}", f"mean {a.bad}", "label"], rows,
                 "rrrrrl")


def head_feature_table(r, top: int = 10) -> Table:
    frac = np.asarray(r.fraction, dtype=float)  # [units, F]
    cols = list(range(min(5, len(r.features))))
    rows = [[str(u)] + [f"{frac[i, j]:+.2f}" if np.isfinite(frac[i, j]) else "--" for j in cols]
            for i, u in enumerate(r.units[:top])]
    return Table("sae_heads", f"The share of each layer-{r.sae_layer} feature's format gap that patching each unit of "
                 f"layer {r.layer} closes (mean over {r.n_items} items).", ["unit"] +
                 [f"feature {r.features[j]}" for j in cols], rows, "l" + "r" * len(cols))


def feature_repair_table(r) -> Table:
    num = lambda x: "--" if x is None or not math.isfinite(x) else f"{x:+.3f}"  # noqa: E731
    rows = [["the whole activation", "--", num(r.whole_fraction)],
            ["every feature (error kept)", "--", num(r.all_features_fraction)]]
    rows += [[f"feature {f}", num(est), num(ex)] for f, est, ex in r.top]
    return Table("sae_repair", f"Repair fraction ({r.source} into {r.base}, n = {r.n_items}) of patching SAE features "
                 f"at layer {r.layer}: each of the top features alone, estimated by attribution and exact.",
                 ["patched", "estimate", "exact repair"], rows, "lrr")


def feature_circuit_table(r) -> Table:
    num = lambda x: "--" if x is None or not math.isfinite(x) else f"{x:+.3f}"  # noqa: E731
    d = r.directions["denoise"]
    rows = []
    for i in d.order[:20]:
        e = d.exact.get(int(i))
        rows.append([r.nodes[i].name, num(d.attribution[i]), "--" if e is None else f"{e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]",
                     "yes" if int(i) in set(d.circuit) else ""])
    return Table("feature_circuit", f"Feature-circuit nodes ({d.source} into {d.base}, n = {r.n_items}): attribution and "
                 f"exact effect of each node patched alone, as fractions of the gap.",
                 ["node", "attribution", "exact [95% CI]", "in circuit"], rows, "lrrl")


def repair_table(r) -> Table:
    e = lambda x: _pct(x.value, x.lo, x.hi)  # noqa: E731
    rows = [[row.measure, row.format, row.tag, e(row.repaired), e(row.unrepaired), str(row.repaired.n)]
            for row in r.held_out]
    rows += [[f"{c.chosen_by} heads ({len(c.heads)}), {how}", c.format, r.focus, e(est), "--", str(est.n)]
             for c in r.compare for how, est in (("paired", c.paired), ("shippable", c.shippable))]
    rows += [["KL from unrepaired", s.where, "all", f"{s.kl.value:.4f} [{s.kl.lo:.4f}, {s.kl.hi:.4f}]"
              if math.isfinite(s.kl.lo) else f"{s.kl.value:.4f}", "0", str(s.kl.n)] for s in r.shifts]
    rep = r.repair
    return Table("repair", f"A repair needing the failing prompt alone: heads {'+'.join(rep.heads)} ({rep.mode}, "
                 f"strength {rep.strength:g}), built on {rep.built_on.get('n_items', '?')} discovery items and measured "
                 f"on {r.n_evaluation} held-out items: items right (Wilson 95% intervals) and the mean KL of the "
                 "next-token distribution from the unrepaired model (nats, bootstrap 95% intervals); 'paired' is the "
                 "same heads patched from each item's good-format twin, which a shipped repair does not have; where the repair "
                 "was searched, the heads a paired diagnosis would choose and the heads shipped, each both ways.",
                 ["measure", "format", "tag", "repaired", "unrepaired", "n"], rows, "lllrrr")


def sinks_table(r) -> Table:
    """Each sink intervention, one row, a column per format: the repair (failing format) or damage (good format)
    fraction of the mean score, and the items right after it."""
    formats = list(dict.fromkeys(e.format for e in r.effects))
    cells = {(e.intervention, e.format): e for e in r.effects}
    rows = []
    for name in r.interventions:
        row = [name]
        for f in formats:
            e = cells[name, f]
            fr = e.fraction
            frac = "--" if fr.value is None or not math.isfinite(fr.value) else _ci(fr.value, fr.lo, fr.hi, sign=True)
            row.append(f"{frac}; {100 * e.accuracy.value:.1f}%")
        rows.append(row)
    good = next((e.format for e in r.effects if e.role == "good"), "")
    return Table("sinks", f"Sink interventions at every position of every format ({r.n_items} items, "
                 f"{r.tag or 'focus'}): per format, the repair fraction (after - failing) / (good - failing) of the "
                 f"mean score in a failing format, or the damage (good - after) / (good - failing) in the good one "
                 f"({good}), with bootstrap 95% intervals; then the items right after it.",
                 ["intervention", *[f + (" (good)" if f == good else "") for f in formats]], rows,
                 "l" + "r" * len(formats))


def step_tables(rep) -> dict[str, Table]:
    """{step: its table} for the steps that ran (in the report's order): each result's view's table (`surgeon.show`),
    so a step holding a held-out result shows the held-out table."""
    out = {}
    for step, result in rep.steps.items():
        table = view_of(result).table
        if table is not None:
            out[step] = table(result)
    return out


SORT_JS = r"""
(function(){
  Array.prototype.forEach.call(document.querySelectorAll('table.sortable'), function(t){
    Array.prototype.forEach.call(t.tHead.rows[0].cells, function(th, col){
      th.tabIndex = 0; th.title = 'sort by this column';
      function sort(){ var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var up = th.getAttribute('aria-sort') !== 'ascending';
        Array.prototype.forEach.call(t.tHead.rows[0].cells, function(c){ c.removeAttribute('aria-sort'); });
        th.setAttribute('aria-sort', up ? 'ascending' : 'descending');
        function key(r){ var c = r.cells[col], s = c.getAttribute('data-sort'); return s === null ? c.textContent : parseFloat(s); }
        rows.sort(function(a, b){ var x = key(a), y = key(b), o = typeof x === 'number' && typeof y === 'number' ? x - y :
          String(x).localeCompare(String(y)); return up ? o : -o; });
        rows.forEach(function(r){ body.appendChild(r); }); }
      th.addEventListener('click', sort);
      th.addEventListener('keydown', function(e){ if (e.key === 'Enter') sort(); }); }); });
})();
"""
