"""The report as the start of a paper: each step's main table as a LaTeX (booktabs) table (`tables`), and a `main.tex` that
inputs the methods paragraph, the tables and the figures (with generated captions) and compiles with pdflatex and
bibtex. Every number comes from the results; nothing here computes one."""
from __future__ import annotations

from surgeon.reports.citations import tex_escape
from surgeon.reports.tables import step_tables

# what each figure shows, for its caption (by step and file name); the step's numbers complete it
CAPTIONS = {
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
}


def paper_tables(rep) -> dict[str, str]:
    """{file name: LaTeX table} for the steps that ran (`surgeon.reports.tables`)."""
    return {f"{step}.tex": t.latex() for step, t in step_tables(rep).items()}


def main_tex(rep, tables: list[str], figures: list[tuple[str, str]]) -> str:
    """A document inputting methods.tex, the tables (file names in paper/) and the figures ((step, file name), PDFs in
    ../figures), with the bibliography ../references.bib."""
    figs = "".join(
        ("\\clearpage\n" if i % 4 == 0 else "") + "\\begin{figure}[htbp]\n\\centering\n\\includegraphics[width=\\linewidth,height=0.75\\textheight,keepaspectratio]{../figures/" + f"{step}-{name[:-4]}.pdf"
        + "}\n\\caption{" + CAPTIONS.get((step, name), tex_escape(f"{step}: {name[:-4]}.")) + "}\n\\end{figure}\n"
        for i, (step, name) in enumerate(figures))
    return ("\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\usepackage{lmodern}\n\\usepackage{graphicx}\n"
            "\\usepackage{booktabs}\n\\title{" + tex_escape(f"surgeon report: {rep.case}") + "}\n\\date{}\n"
            "\\begin{document}\n\\maketitle\n\\section*{Methods}\n\\input{methods}\n\n"
            "\\clearpage\n\\section*{Results}\n" + "".join(("\\clearpage\n" if i and i % 4 == 0 else "") + f"\\input{{{t[:-4]}}}\n"
                                          for i, t in enumerate(tables)) + figs +
            "\\bibliographystyle{plain}\n\\bibliography{../references}\n\\end{document}\n")
