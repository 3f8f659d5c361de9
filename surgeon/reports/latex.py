"""The report as the start of a paper: each step's main table as a LaTeX (booktabs) table (`tables`), and a `main.tex` that
inputs the methods paragraph, the tables and the figures (with generated captions) and compiles with pdflatex and
bibtex. Every number comes from the results; nothing here computes one."""
from __future__ import annotations

from dataclasses import replace

from surgeon.reports.citations import tex_escape
from surgeon.reports.tables import step_tables

# what each figure shows, for its caption (by step and file name); the step's numbers complete it
CAPTIONS = {
    ("sinks", "sinks.png"): "Attention on the first token per head in every format (boxed: above the sink-rate "
                            "threshold), and per layer the largest residual activation and the first token's norm, "
                            "each over the median (log scale; massive above 1000 times).",
    ("repair", "pareto.png"): "The repair beside the field's steering baselines on the held-out items: efficacy "
                              "(the failing formats' focus items right) against the good format's KL from the "
                              "unrepaired model (symlog) and against control accuracy, one marker per method (CAA, "
                              "ITI, random heads, one layer's heads), the front joined, the shipped repair ringed.",
    ("diagnose", "accuracy.png"): "Accuracy per prompt format and item tag, with Wilson 95\\% intervals.",
    ("patch", "heatmap.png"): "Repair fraction of patching each attention head alone from the good format's run "
                              "into the failing one, (patched - failing) / (good - failing) of the mean score.",
    ("threshold", "threshold.png"): "Fraction of head subsets of each size k that repair the failure (95\\% "
                                    "intervals), and the repair rate of subsets with and without each head.",
    ("threshold", "heldout.png"): "The best head subset of each size k, chosen on the discovery items: its share of "
                                  "held-out items right (filled, the result) and of the discovery items (hollow, "
                                  "in-sample), with Wilson 95\\% intervals; k* measured on the held-out items.",
    ("threshold", "search.png"): "The subset search on the discovery items (in-sample): fraction of head subsets of "
                                 "each size k that repair (95\\% intervals), and the repair rate of subsets with and "
                                 "without each head.",
    ("blend", "blend.png"): "Share of items right as the layer's head outputs are blended from the failing "
                            "format's towards the good format's, and where each item switches.",
    ("dla", "dla.png"): "Direct logit attribution: each head's direct effect on the logit difference per format "
                        "(mean over items), and the logit lens after each layer.",
    ("positions", "positions.png"): "Repair fraction of patching one head at one aligned position alone from the good "
                                    "format's run into the failing one.",
    ("attention", "attention.png"): "Attention patterns of the circuit's strongest heads on the first item, each "
                                    "format side by side.",
    ("circuit", "faithfulness.png"): "Faithfulness of the top-k edges of the ranking, by the fraction of edges kept.",
    ("circuit", "circuit.png"): "The circuit: its edges, by layer.",
    ("circuit", "faithfulness_discovery.png"): "Faithfulness of the top-k edges of the ranking on the discovery items "
                                               "(in-sample), by the fraction of edges kept.",
    ("sae_overlap", "overlap.png"): "Overlap of the formats' top SAE features per layer.",
    ("sae_heads", "heads_features.png"): "The effect of each head on the SAE features that differ between formats.",
    ("sae_feature_circuit", "feature_curve.png"): "The feature circuit's faithfulness (its top-k nodes kept) and "
                                                  "completeness (those nodes ablated) as k grows, in each direction.",
}


def paper_tables(rep) -> dict[str, str]:
    """{file name: LaTeX table} for the steps that ran (`surgeon.reports.tables`)."""
    return {f"{step}.tex": replace(t, step=step).latex() for step, t in step_tables(rep).items()}  # tab:STEP


# the float placement a paper of a few pages needs: several floats to a page, little text required beside them
FLOATS = ("\\setcounter{topnumber}{3}\n\\setcounter{bottomnumber}{2}\n\\setcounter{totalnumber}{5}\n"
          "\\renewcommand{\\topfraction}{0.9}\n\\renewcommand{\\bottomfraction}{0.6}\n"
          "\\renewcommand{\\textfraction}{0.07}\n\\renewcommand{\\floatpagefraction}{0.75}\n")
NARROW = 3.5  # inches: a figure at most this wide is a column's and pairs with the next one of its step
HEIGHT, PAIR_HEIGHT = "0.3\\textheight", "0.26\\textheight"  # the tallest a figure (a pair) is set


def strip_titles(fig) -> list[str]:
    """Take the titles out of a figure for the paper, where a caption says what a figure shows (a title drawn in
    the picture is set in another type and can be cut at its edge): its suptitle and each panel's title, in order,
    cleared from the figure and returned."""
    titles = []
    sup = getattr(fig, "_suptitle", None)
    if sup is not None and sup.get_text().strip():
        titles.append(sup.get_text().strip())
        sup.set_text("")
    for ax in fig.axes:
        for loc in ("left", "center", "right"):
            t = ax.get_title(loc=loc).strip()
            if t:
                titles.append(t)
                ax.set_title("", loc=loc)
    return titles


def _caption(step: str, name: str, titles: list[str]) -> str:
    base = CAPTIONS.get((step, name), tex_escape(f"{step}: {name[:-4]}."))
    if not titles:
        return base
    if len(titles) == 1:
        return base + " " + tex_escape(titles[0][:1].upper() + titles[0][1:]) + "."
    return base + " " + "; ".join(f"({chr(97 + i)}) {tex_escape(t)}" for i, t in enumerate(titles)) + "."


def _label(step: str, name: str) -> str:
    return f"fig:{step}-{name[:-4]}".replace("_", "-")


def _graphic(step: str, name: str, width: str, height: str) -> str:
    """A figure at `width`, kept within `height` (its aspect kept): two to a page at the most."""
    return ("\\includegraphics[width=" + width + ",height=" + height + ",keepaspectratio]{../figures/"
            + f"{step}-{name[:-4]}.pdf" + "}")


def _figure_floats(step: str, figs: list[tuple[str, float, list[str]]]) -> str:
    """A step's figures as floats: two narrow ones side by side in one float (each with its caption), a wide one
    across the text width, a lone narrow one at its own width."""
    out, i = [], 0
    while i < len(figs):
        name, width, titles = figs[i]
        pair = width <= NARROW and i + 1 < len(figs) and figs[i + 1][1] <= NARROW
        if pair:
            cells = []
            for n, _, t in figs[i:i + 2]:
                cells.append("\\begin{minipage}[t]{0.485\\linewidth}\n\\centering\n" + _graphic(step, n, "\\linewidth", PAIR_HEIGHT)
                             + "\n\\caption{" + _caption(step, n, t) + "}\\label{" + _label(step, n) + "}\n\\end{minipage}")
            out.append("\\begin{figure}[tbp]\n\\centering\n" + "\\hfill\n".join(cells) + "\n\\end{figure}\n")
            i += 2
            continue
        w = "\\linewidth" if width > NARROW else f"{min(width, 6.5):.2f}in"
        out.append("\\begin{figure}[tbp]\n\\centering\n" + _graphic(step, name, w, HEIGHT) + "\n\\caption{"
                   + _caption(step, name, titles) + "}\\label{" + _label(step, name) + "}\n\\end{figure}\n")
        i += 1
    return "".join(out)


def main_tex(rep, tables: list[str], figures, titles: dict | None = None) -> str:
    """A document inputting methods.tex, then per step (in the report's order) a heading, a sentence pointing at its
    table and figures, and those floats placed at the top or bottom of a page near it (two narrow figures side by
    side), and last, after every float, the bibliography ../references.bib. `tables`: file names in paper/;
    `figures`: {(step, file name): (width in inches, titles taken out of it)} or a list of (step, file name), PDFs in
    ../figures; `titles`: {step: its section title}."""
    titles = titles or {}
    if not isinstance(figures, dict):
        figures = {key: (6.75, []) for key in figures}
    body = []
    for step in rep.steps:
        tab = f"{step}.tex" if f"{step}.tex" in tables else None
        figs = [(name, w, t) for (st, name), (w, t) in figures.items() if st == step]
        if tab is None and not figs:
            continue
        refs = ([f"Table~\\ref{{tab:{step.replace('_', '-')}}}"] if tab else []) + \
               [f"Figure~\\ref{{{_label(step, n)}}}" for n, _, _ in figs]
        body.append("\\subsection*{" + tex_escape(titles.get(step, step)) + "}\n" + "See " + ", ".join(refs) + ".\n"
                    + (f"\\input{{{tab[:-4]}}}\n" if tab else "") + _figure_floats(step, figs))
    return ("\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{lmodern}\n\\usepackage{graphicx}\n"
            "\\usepackage{booktabs}\n\\usepackage{url}\n\\usepackage[margin=1in]{geometry}\n\\usepackage[font=small]{caption}\n"
            "\\emergencystretch=2em\n" + FLOATS +
            "\\title{" + tex_escape(f"surgeon report: {rep.case}") + "}\n\\date{}\n"
            "\\begin{document}\n\\maketitle\n\\section*{Methods}\n\\input{methods}\n\n\\section*{Results}\n"
            + "".join(body) +
            "\\clearpage\n\\bibliographystyle{plain}\n\\bibliography{../references}\n\\end{document}\n")
