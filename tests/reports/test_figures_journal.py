"""Figures a journal takes: every report figure is one column (3.25 in) or two (6.75 in) wide, its PDF embeds no
Type 3 font (pdffonts, as journals check), its SVG keeps text as text, and axes that count have integer ticks."""
import re
import shutil
import subprocess

import pytest

import surgeon


@pytest.fixture(scope="module")
def figures(tmp_path_factory, decimal_model):
    out = tmp_path_factory.mktemp("fig") / "r"
    case = surgeon.load_case("decimal_organism")
    rep = surgeon.report(case, decimal_model, out=out, steps=["diagnose", "patch", "threshold", "circuit"], budget=20,
                         verify=5, paths=1)
    return rep, out / "figures"


def _points(path):
    r = subprocess.run(["pdfinfo", str(path)], capture_output=True, text=True, check=True)
    w, h = map(float, re.search(r"Page size:\s+([\d.]+) x ([\d.]+) pts", r.stdout).groups())
    return w, h


@pytest.mark.skipif(not (shutil.which("pdffonts") and shutil.which("pdfinfo")),
                    reason="needs poppler-utils (apt-get install poppler-utils) for pdffonts and pdfinfo")
@pytest.mark.slow
def test_every_figure_is_a_column_wide_with_truetype_fonts(figures):
    _, folder = figures
    pdfs = sorted(folder.glob("*.pdf"))
    assert len(pdfs) >= 5
    for pdf in pdfs:
        w, h = _points(pdf)
        assert round(w) in (234, 486), (pdf.name, w)  # 3.25 in or 6.75 in at 72 pt per inch
        assert 0 < h <= 9 * 72 + 1
        fonts = subprocess.run(["pdffonts", str(pdf)], capture_output=True, text=True, check=True).stdout
        rows = fonts.splitlines()[2:]
        assert rows, (pdf.name, "no font: the text was drawn as outlines")
        assert not any("Type 3" in r for r in rows), (pdf.name, fonts)
        assert all("TrueType" in r for r in rows), (pdf.name, fonts)
    for svg in sorted(folder.glob("*.svg")):
        text = svg.read_text()
        assert "<text" in text, svg.name  # text kept as text (svg.fonttype none), not paths
        assert re.search(r'width="(234|486)pt"', text), svg.name


def test_the_subset_size_axis_has_integer_ticks(figures):
    rep, _ = figures
    fig = rep.steps["threshold"].figure()
    ticks = [t for t in fig.axes[0].get_xticks() if fig.axes[0].get_xlim()[0] <= t <= fig.axes[0].get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert tuple(round(x, 2) for x in fig.get_size_inches())[0] == 6.75
