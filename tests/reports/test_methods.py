"""The report's methods paragraph: every statement from what ran, methods named as papers name them, each cited, and
the LaTeX version with its BibTeX file compiled by pdflatex and bibtex."""
import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import surgeon
from surgeon.reports.citations import REFERENCES, cited, tex_escape
from surgeon.reports.html import methods_paragraph


@pytest.fixture(scope="module")
def run(tmp_path_factory, induction_model):
    out = tmp_path_factory.mktemp("methods") / "r"
    case = surgeon.load_case("induction_organism")
    rep = surgeon.report(case, induction_model, out=out, steps=["patch", "threshold", "circuit"], seed=5, verify=50)
    return rep, out


def test_each_statement_is_what_ran(run):
    rep, out = run
    text = methods_paragraph(rep)
    c, t = rep.steps["circuit"].search, rep.steps["threshold"].search  # found on the discovery items
    # the verified edges are those exact patching ran on (never more than the graph has)
    assert 0 < len(c.exact) <= c.n_edges < 50
    assert f"the top {len(c.exact)} verified by exact edge patching" in text and f"({c.n_edges} in all)" in text
    assert "EAP with integrated gradients over the input embeddings (EAP-IG-inputs) with 5 steps" in text
    assert c.method == "eap-ig-inputs" and c.options["ig_steps"] == 5
    assert "resample ablation" in text and "set of edges kept" in text and c.options["semantics"] == "kept"
    assert f"{len(c.circuit)} edges, f = {c.circuit_faithfulness:.3f}" in text
    assert f"Its {len(c.paths)} strongest complete paths" in text
    assert "seed 5" in text and t.options["seed"] == 5 and "seed 0" not in text
    assert json.loads((out / "manifest.json").read_text())["seed"] == 5
    assert f"layer {rep.options['threshold']['layer']}'s {len(t.units)} heads" in text
    assert "every item" in text and t.item_rate == 1.0
    assert "(Hanna et al., 2024; Sundararajan et al., 2017; Mueller et al., 2025)" in text
    # the split the selecting steps ran on, from what ran: n per side, the seed, the stratification, and the
    # held-out numbers named the result
    held = rep.steps["circuit"]
    assert held.split.seed == 5 and held.split.holdout == 0.5
    assert (f"{held.n_discovery} discovery and {held.n_evaluation} evaluation items (holdout 0.5, seed 5, stratified "
            "by tag") in text
    assert f"on the held-out items f = {held.held_out['faithfulness']:.3f}" in text and ", the result." in text
    assert f"{c.circuit_faithfulness:.3f} on the discovery items (in-sample)" in text
    assert "rates on the discovery items are in-sample" in text
    assert "[[" not in text and "eap-ig-inputs" not in text.replace("(EAP-IG-inputs)", "")


def test_the_feature_circuits_conventions_are_named_beside_marks_et_als():
    """The methods text says which of Marks et al.'s four feature-circuit conventions a report's feature circuit took
    (IG points, exact node effects, the node threshold, the edges' left vector), from the step's options; the shipped
    report says surgeon's defaults."""
    from tests.conftest import ROOT
    from surgeon.reports.html import feature_conventions

    ours = feature_conventions({"method": "ig", "steps": 5})
    for said in ("5 midpoints of the mask", "Marks et al. take the points k/N", "every aligned position at once",
                 "faithfulness at least 0.9", "aggregated effect reaches a threshold", "gradient in the unpatched run"):
        assert said in ours, said
    theirs = feature_conventions({"method": "ig-marks", "steps": 10, "exact": "per-position", "threshold": 0.05,
                                  "threshold_over": "example"})
    for said in ("Marks et al.'s points k/10", "one aligned position at a time, the effects summed, as Marks et al.",
                 "effect on one item at one aligned position reaches 0.05 of the gap (surgeon's per-example node rule",
                 "averaged over the same points, as Marks et al."):
        assert said in theirs, said
    assert "every node whose attribution reaches 0.05 of the gap (the aggregated effect, as Marks et al. threshold " \
        "nodes)" in feature_conventions({"threshold": 0.05})
    assert "as Marks et al. threshold nodes" not in theirs  # the per-example node rule is surgeon's own
    assert "reaches the threshold (Marks et al.'s edge rule)" in feature_conventions({"threshold": 0.05,
                                                                                      "edge_rule": "marks"})
    assert "computed from every entry of the downstream node" in ours
    page = (Path(ROOT) / "docs" / "report-decimal" / "report.html").read_text()
    assert html.escape(ours) in page


def test_the_bibtex_file_holds_every_citation(run):
    rep, out = run
    keys = cited(methods_paragraph(rep, "marked"))
    assert {"nanda2022transformerlens", "hanna2024faith", "mueller2025mib", "conmy2023acdc", "sandoval2025even",
            "wang2023ioi", "heimersheim2024patching"} <= set(keys)
    bib = (out / "references.bib").read_text()
    assert sorted(re.findall(r"^@\w+\{([\w]+),", bib, re.M)) == sorted(keys)
    assert all(k in REFERENCES for k in keys)


@pytest.mark.skipif(not (shutil.which("pdflatex") and shutil.which("bibtex")),
                    reason="needs pdflatex and bibtex (apt-get install texlive-latex-base texlive-latex-recommended)")
def test_the_latex_paragraph_compiles_with_its_bibliography(run, tmp_path):
    rep, out = run
    shutil.copy(out / "paper" / "methods.tex", tmp_path / "methods.tex")
    shutil.copy(out / "references.bib", tmp_path / "references.bib")
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\n\\usepackage[T1]{fontenc}\n\\begin{document}\n"
                                      "\\input{methods}\n\\bibliographystyle{plain}\n\\bibliography{references}\n"
                                      "\\end{document}\n")
    for cmd in (["pdflatex", "-interaction=nonstopmode", "doc"], ["bibtex", "doc"],
                ["pdflatex", "-interaction=nonstopmode", "doc"], ["pdflatex", "-interaction=nonstopmode", "doc"]):
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout[-3000:]
    log = (tmp_path / "doc.log").read_text(errors="replace")
    assert "undefined" not in log.lower(), [ln for ln in log.splitlines() if "undefined" in ln.lower()]
    bbl = (tmp_path / "doc.bbl").read_text()
    assert sorted(re.findall(r"\\bibitem\{(\w+)\}", bbl)) == sorted(cited(methods_paragraph(rep, "marked")))
    assert (tmp_path / "doc.pdf").stat().st_size > 0


def test_the_page_shows_example_items_of_each_tag_with_their_scores(tmp_path, decimal_model):
    """The diagnose section lists the first items of each tag with each format's score, the score recomputed here
    with one plain forward per row (log P(correct) - log P(incorrect), teacher-forced)."""
    import html as html_lib

    import torch

    case = surgeon.load_case("decimal_organism")
    rep = surgeon.report(case, decimal_model, out=tmp_path / "r", steps=["diagnose"])
    page = (tmp_path / "r" / "report.html").read_text()
    start = page.index("<table class='items'>")
    table = page[start: page.index("</table>", start)]
    tok = decimal_model.tokenizer
    for tag in case.tags:
        it_i, it = next((i, it) for i, it in enumerate(case.items) if it.tag == tag)
        row = table[table.index(f"<td>{tag}</td><td>{it_i}</td>"):]
        row = row[: row.index("</tr>")]
        assert html_lib.escape(repr(it.correct)) in row
        shown = [float(x) for x in re.findall(r"<td class='num'>([+-][\d.]+)</td>", row)]
        for fmt, got in zip([case.good, *case.bad_formats], shown, strict=True):
            prompt = [tok.bos_token_id] + tok(case.formats[fmt].format(**it.values), add_special_tokens=False)["input_ids"]
            score = 0.0
            for ans, sign in ((it.correct, 1), (it.incorrect, -1)):
                a = tok(ans, add_special_tokens=False)["input_ids"]
                with torch.no_grad():
                    lp = decimal_model(torch.tensor([prompt + a[:-1]]))[0].log_softmax(-1)
                score += sign * sum(float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(a))
            assert got == pytest.approx(score, abs=1.5e-3), (tag, fmt, score, row)


def _compile(paper):
    """main.tex as the README says: pdflatex, bibtex, pdflatex twice; each must succeed."""
    for cmd in (["pdflatex", "-interaction=nonstopmode", "main"], ["bibtex", "main"],
                ["pdflatex", "-interaction=nonstopmode", "main"], ["pdflatex", "-interaction=nonstopmode", "main"]):
        r = subprocess.run(cmd, cwd=paper, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout[-3000:]


@pytest.mark.skipif(not (shutil.which("pdflatex") and shutil.which("bibtex") and shutil.which("pdffonts")),
                    reason="needs pdflatex, bibtex (texlive-latex-recommended, lmodern) and pdffonts (poppler-utils)")
def test_main_tex_compiles_with_the_tables_figures_and_bibliography(run, tmp_path):
    """DIR/paper/main.tex inputs the methods paragraph, a booktabs table per step and every figure; pdflatex and bibtex
    compile it with no undefined reference and no Type 3 font, and its tables hold the results' numbers."""
    import numpy as np

    rep, out = run
    copy = tmp_path / "r"
    shutil.copytree(out, copy)
    paper = copy / "paper"
    assert {"main.tex", "methods.tex", "patch.tex", "threshold.tex", "circuit.tex"} <= {p.name for p in paper.iterdir()}
    _compile(paper)
    log = (paper / "main.log").read_text(errors="replace")
    assert "undefined" not in log.lower() and "File `" not in log
    fonts = subprocess.run(["pdffonts", str(paper / "main.pdf")], capture_output=True, text=True, check=True).stdout
    assert "Type 3" not in fonts
    main = (paper / "main.tex").read_text()
    assert main.count("\\includegraphics") == len(list((copy / "figures").glob("*.pdf")))
    c = rep.steps["circuit"].search
    top = int(np.argmax(np.abs(c.scores)))
    row = next(ln for ln in (paper / "circuit.tex").read_text().splitlines() if ln.startswith(tex_escape(c.edge_names[top]) + " &"))
    assert f"{c.scores[top]:+.3f}" in row
    t = rep.steps["threshold"].search
    k_rows = [ln for ln in (paper / "threshold.tex").read_text().splitlines() if re.match(r"^\d+ & ", ln)]
    assert len(k_rows) == len([s for s in t.sizes if s.family == "all" and s.evaluated])


@pytest.mark.skipif(not (shutil.which("pdflatex") and shutil.which("bibtex")),
                    reason="needs pdflatex and bibtex (texlive-latex-recommended, lmodern)")
def test_the_shipped_reports_paper_with_every_steps_table_compiles(tmp_path):
    """docs/report-decimal (every step, SAEs included: a table each) compiles as its README says."""
    from tests.conftest import ROOT

    copy = tmp_path / "r"
    shutil.copytree(f"{ROOT}/docs/report-decimal", copy)
    paper = copy / "paper"
    tables = {p.name for p in paper.glob("*.tex")} - {"main.tex", "methods.tex"}
    assert {"dla.tex", "positions.tex", "blend.tex", "sae_overlap.tex", "sae_repair.tex"} <= tables
    _compile(paper)
    log = (paper / "main.log").read_text(errors="replace")
    assert "undefined" not in log.lower() and "Float too large" not in log
    assert all(f"\\input{{{t[:-4]}}}" in (paper / "main.tex").read_text() for t in tables)
    _check_layout(copy)


MAX_PAGES = 14  # every step of the decimal organism's report (13 tables, 14 figures, the sinks step included) on a few pages


def _words(pdf, page=None):
    """(page width, page height, [(xmin, ymin, xmax, ymax, word)]) of each page (pdftotext -bbox)."""
    import xml.etree.ElementTree as ET

    args = ["pdftotext", "-bbox", *(["-f", str(page), "-l", str(page)] if page else []), str(pdf), "-"]
    xml = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    root = ET.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", xml).replace('xmlns="http://www.w3.org/1999/xhtml"', ""))
    out = []
    for pg in root.iter("page"):
        words = [(float(w.get("xMin")), float(w.get("yMin")), float(w.get("xMax")), float(w.get("yMax")), w.text or "")
                 for w in pg.iter("word")]
        out.append((float(pg.get("width")), float(pg.get("height")), words))
    return out


def _check_layout(report):
    """The compiled paper as a journal takes it: a few pages, no overfull box, every table and figure before the
    bibliography, and no text outside a page, neither the paper's nor any figure's own (a title cut at its edge)."""
    paper = report / "paper"
    log = (paper / "main.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log and "Overfull \\vbox" not in log, re.findall(r"Overfull.*", log)[:5]
    pages = _words(paper / "main.pdf")
    assert len(pages) <= MAX_PAGES, len(pages)
    text = subprocess.run(["pdftotext", str(paper / "main.pdf"), "-"], capture_output=True, text=True, check=True).stdout
    refs = text.rfind("References")
    captions = [m.start() for m in re.finditer(r"^(Figure|Table) \d+:", text, re.M)]
    assert refs > 0 and captions and max(captions) < refs  # the bibliography last
    for w, h, words in pages:
        assert all(-0.5 <= x0 and x1 <= w + 0.5 and -0.5 <= y0 and y1 <= h + 0.5 for x0, y0, x1, y1, _ in words)
    for fig in sorted((report / "figures").glob("*.pdf")):
        for w, h, words in _words(fig):
            out = [t for x0, y0, x1, y1, t in words if x0 < -0.5 or x1 > w + 0.5 or y0 < -0.5 or y1 > h + 0.5]
            assert not out, (fig.name, out[:5])
