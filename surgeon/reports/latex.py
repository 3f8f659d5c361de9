"""The report as the start of a paper: each step's main table as a LaTeX (booktabs) table, and a `main.tex` that
inputs the methods paragraph, the tables and the figures (with generated captions) and compiles with pdflatex and
bibtex. Every number comes from the results; nothing here computes one."""
from __future__ import annotations

import numpy as np

from surgeon.reports.citations import tex_escape

# what each figure shows, for its caption (by step and file name); the step's numbers complete it
CAPTIONS = {
    ("diagnose", "accuracy.png"): "Accuracy per prompt format and item tag, with Wilson 95\\% intervals.",
    ("patch", "heatmap.png"): "Repair fraction of patching each attention head alone from the good format's run "
                              "into the failing one, (patched - failing) / (good - failing) of the mean score.",
    ("threshold", "threshold.png"): "Fraction of head subsets of each size k that repair the failure (95\\% "
                                    "intervals), and the repair rate of subsets with and without each head.",
    ("blend", "blend.png"): "Share of items right as the layer's head outputs are blended from the failing "
                            "format's towards the good format's, and where each item switches.",
    ("circuit", "faithfulness.png"): "Faithfulness of the top-k edges of the ranking, by the fraction of edges kept.",
    ("circuit", "circuit.png"): "The circuit: its edges, by layer.",
    ("sae_overlap", "overlap.png"): "Overlap of the formats' top SAE features per layer.",
    ("sae_heads", "heads_features.png"): "The effect of each head on the SAE features that differ between formats.",
}


def _ci(e) -> str:
    return f"{e.value:.3f} [{e.lo:.3f}, {e.hi:.3f}]"


def _pct(v, lo, hi) -> str:
    return f"{100 * v:.1f}\\% [{100 * lo:.1f}, {100 * hi:.1f}]"


def table(caption: str, label: str, header: list[str], rows: list[list[str]], align: str) -> str:
    """A booktabs table (cells already LaTeX)."""
    body = "\n".join(" & ".join(r) + r" \\" for r in rows)
    return ("\\begin{table}[t]\n\\centering\\small\n\\caption{" + caption + "}\\label{" + label + "}\n"
            "\\begin{tabular}{" + align + "}\n\\toprule\n" + " & ".join(header) + r" \\" + "\n\\midrule\n" + body +
            "\n\\bottomrule\n\\end{tabular}\n\\end{table}\n")


def diagnose_table(d) -> str:
    rows = [[tex_escape(s.format), s.role, tex_escape(s.tag), str(s.accuracy.n),
             _pct(s.accuracy.value, s.accuracy.lo, s.accuracy.hi), _ci(s.score)] for s in d.stats]
    return table(f"Accuracy and mean score per format and tag ({tex_escape(d.case)}); 95\\% intervals (Wilson for "
                 "accuracy, bootstrap for the mean).", "tab:diagnose",
                 ["format", "role", "tag", "$n$", "accuracy", "mean score"], rows, "lllrrr")


def patch_table(p, top: int = 10) -> str:
    flat = np.nan_to_num(np.asarray(p.fraction, dtype=float), nan=-np.inf).ravel()
    order = np.argsort(-flat, kind="stable")[:top]
    rows = []
    for i in order:
        li, u = divmod(int(i), p.n_units)
        rows.append([f"L{int(p.layers[li])}H{u}", f"{p.fraction[li, u]:+.3f} [{p.fraction_lo[li, u]:+.3f}, "
                     f"{p.fraction_hi[li, u]:+.3f}]", _pct(p.accuracy[li, u], p.accuracy_lo[li, u], p.accuracy_hi[li, u])])
    return table(f"The {len(rows)} heads whose patch repairs most ({tex_escape(p.source)} into {tex_escape(p.base)}, "
                 f"$n = {p.n_items}$ items); 95\\% intervals.", "tab:patch",
                 ["head", "repair fraction", "accuracy when patched"], rows, "lrr")


def threshold_table(r) -> str:
    rows = []
    for s in sorted((s for s in r.sizes if s.family == "all" and s.evaluated), key=lambda s: s.key):
        best = (_pct(s.best_item_rate, s.best_lo, s.best_hi) if np.isfinite(s.best_item_rate) else "--")
        rows.append([str(s.key[0]), f"{s.evaluated}/{s.total}", _pct(s.fraction, s.lo, s.hi), best])
    t = r.threshold("all")
    k = f"$k^* = {t.k_star}$" if t.k_star is not None else f"no $k$ reaches {100 * t.x:g}\\%"
    return table(f"Head subsets by size $k$: the fraction that repairs (right on at least {100 * r.item_rate:g}\\% of "
                 f"{r.n_items} items) and the best subset's share of items right; {k}.", "tab:threshold",
                 ["$k$", "subsets", "repairing", "best subset"], rows, "rrrr")


def circuit_table(c, top: int = 10) -> str:
    order = np.argsort(-np.abs(np.asarray(c.scores, dtype=float)), kind="stable")[:top]
    exact = {int(k): float(v) for k, v in c.exact.items()}  # keys are strings in a result read back from JSON
    inside = {int(x) for x in c.circuit}
    rows = [[tex_escape(c.edge_names[i]), f"{c.scores[i]:+.3f}",
             f"{exact[int(i)]:+.3f}" if int(i) in exact else "--", "yes" if int(i) in inside else ""] for i in order]
    return table(f"The {len(rows)} top-scoring edges of {c.n_edges} (estimated and exact effect on the mean score); "
                 f"the circuit has {len(c.circuit)} edges, faithfulness {c.circuit_faithfulness:.3f}.", "tab:circuit",
                 ["edge", "estimate", "exact", "in circuit"], rows, "lrrc")


TABLES = {"diagnose": diagnose_table, "patch": patch_table, "threshold": threshold_table, "circuit": circuit_table}


def paper_tables(rep) -> dict[str, str]:
    """{file name: LaTeX table} for the steps that ran."""
    return {f"{step}.tex": make(rep.steps[step]) for step, make in TABLES.items() if step in rep.steps}


def main_tex(rep, tables: list[str], figures: list[tuple[str, str]]) -> str:
    """A document inputting methods.tex, the tables (file names in paper/) and the figures ((step, file name), PDFs in
    ../figures), with the bibliography ../references.bib."""
    figs = "".join(
        "\\begin{figure}[t]\n\\centering\n\\includegraphics[width=\\linewidth]{../figures/" + f"{step}-{name[:-4]}.pdf"
        + "}\n\\caption{" + CAPTIONS.get((step, name), tex_escape(f"{step}: {name[:-4]}.")) + "}\n\\end{figure}\n"
        for step, name in figures)
    return ("\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{lmodern}\n\\usepackage{graphicx}\n"
            "\\usepackage{booktabs}\n\\begin{document}\n\\section*{Methods}\n\\input{methods}\n\n"
            "\\section*{Results}\n" + "".join(f"\\input{{{t[:-4]}}}\n" for t in tables) + figs +
            "\\bibliographystyle{plain}\n\\bibliography{../references}\n\\end{document}\n")
