"""`surgeon report`: the pipeline on an organism, resumed from its folder, rendered as one offline HTML page that a
real browser (headless Chromium through Selenium) shows with an interactive circuit."""
import json
import re
import shutil
import time

import pytest

import surgeon
from surgeon.analyses.pipeline import found_circuit
from surgeon.cli import main
from tests.browser import browser
from tests.conftest import ROOT

INDUCTION = f"{ROOT}/cases/induction_organism.py"


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory, induction_model):
    out = tmp_path_factory.mktemp("report") / "induction"
    rep = surgeon.report(INDUCTION, induction_model, out=out, budget=50, verify=10, paths=3)
    return out, rep


@pytest.mark.slow
def test_the_report_runs_every_step_and_writes_one_page(report_dir):
    out, rep = report_dir
    assert list(rep.steps) == ["diagnose", "dla", "patch", "positions", "threshold", "blend", "circuit", "attention",
                               "sinks"]
    assert not rep.reused
    assert rep.skipped["sae"].startswith("the case names no SAEs")
    page = (out / "report.html").read_text()
    # self-contained: no resource is fetched (scripts and styles inline, figures inline SVG)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "<link" not in page and "@import" not in page
    assert page.count("<svg") >= 6
    for step in rep.steps:
        assert f"<section id='{step}'>" in page
        assert (out / step / "results.json").is_file() and (out / step / "manifest.json").is_file()
    methods = re.search(r"<p id='methods'>(.*?)</p>", page, re.S).group(1)
    assert "organism:induction" in methods and f"{len(rep.facts['formats'])} prompt formats" in methods
    assert "torch" in methods and "alignment" in methods
    # the steps the page adds: DLA and the logit lens, per-position patching of the patched layer, the attention of
    # the circuit's strongest heads (by the summed |score| of their circuit edges, counted here from the edge names)
    assert "Direct logit attribution" in methods and "(Elhage et al., 2021)" in methods
    assert "including its value bias" in methods and "with the unembedding bias" in methods
    assert rep.options["positions"]["layers"] == [rep.options["threshold"]["layer"]]
    c = found_circuit(rep.steps["circuit"])
    weight = {}
    for e in c.circuit:
        for layer, head in re.findall(r"a(\d+)\.h(\d+)", c.edge_names[e]):
            weight[f"L{layer}H{head}"] = weight.get(f"L{layer}H{head}", 0) + abs(c.scores[e])
    strongest = sorted(weight, key=lambda h: -weight[h])[:4]
    assert rep.steps["attention"].heads == strongest and ", ".join(strongest) in methods
    assert {p.format for p in rep.steps["attention"].patterns} == set(rep.facts["formats"])
    for step in ("dla", "positions", "patch", "threshold", "blend", "circuit", "diagnose", "sinks"):
        assert f"<table class='data sortable' id='table-{step}'>" in page
    # the sinks step: measured in every format, each intervention's effects, its methods sentence with its papers
    si = rep.steps["sinks"]
    assert si.measured is not None and {e.format for e in si.effects} == set(rep.facts["formats"])
    assert "Attention sinks (Xiao et al., 2024)" in methods and "(Sun et al., 2024)" in methods
    assert "renormalised" in methods
    figs = sorted(p.name for p in (out / "figures").iterdir())
    assert any(f.endswith(".pdf") for f in figs) and any(f.endswith(".svg") for f in figs)
    assert len([f for f in figs if f.endswith(".pdf")]) == len([f for f in figs if f.endswith(".svg")])


@pytest.mark.slow
def test_a_second_run_reuses_the_finished_steps(report_dir, induction_model, tmp_path):
    out, first = report_dir
    stamps = {s: (out / s / "results.json").stat().st_mtime_ns for s in first.steps}
    again = surgeon.report(INDUCTION, induction_model, out=out, budget=50, verify=10, paths=3)
    assert again.reused == list(first.steps)
    assert {s: (out / s / "results.json").stat().st_mtime_ns for s in first.steps} == stamps
    # the page is rendered from the results alone: reloaded, they give the same page (but its date line)
    strip = lambda p: re.sub(r"<p class='meta'>.*?</p>", "", p)  # noqa: E731
    assert strip(surgeon.api.render_report(again)) == strip(surgeon.api.render_report(first))
    # surgeon.load(DIR) reads the whole report back: the same steps, options and page
    loaded = surgeon.load(out)
    assert list(loaded.steps) == list(first.steps) and loaded.options == json.loads(json.dumps(first.options))
    assert strip(surgeon.api.render_report(loaded)) == strip(surgeon.api.render_report(first))
    assert repr(loaded) == repr(first) and repr(loaded.steps["circuit"]) == repr(first.steps["circuit"])
    # another budget is another threshold search: that step runs again, the others are reused
    shutil.copytree(out, tmp_path / "copy")
    other = surgeon.report(INDUCTION, induction_model, out=tmp_path / "copy", budget=40, verify=10, paths=3,
                           steps=["threshold"])
    assert list(other.steps) == ["patch", "threshold"] and other.reused == ["patch"]


@pytest.mark.slow
def test_the_page_works_in_a_real_browser(report_dir, tmp_path):
    out, rep = report_dir
    page = out / "report.html"
    b = browser()
    try:
        b.get(page.resolve().as_uri())
        time.sleep(0.5)
        # nothing but the file itself was requested, and the console is clean
        urls = set()
        for entry in b.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] == "Network.requestWillBeSent":
                urls.add(msg["params"]["request"]["url"])
        assert urls and all(u.startswith(("file:", "data:", "about:")) for u in urls), urls
        errors = [e for e in b.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        assert not errors, errors
        # the circuit view drew every node of the graph, and the slider changes the edges shown
        data = json.loads(b.find_element("id", "circuit-data").get_attribute("textContent"))
        assert len(b.find_elements("css selector", "#circuit-svg g.node")) == len(data["nodes"])
        shown = lambda: len([e for e in b.find_elements("css selector", "#circuit-svg path.edge")  # noqa: E731
                             if e.value_of_css_property("display") != "none"])
        at_circuit = shown()
        c = found_circuit(rep.steps["circuit"])
        label = lambda: b.find_element("id", "k-label").text  # noqa: E731
        # the page opens on the circuit found, marked, with its faithfulness
        assert at_circuit == len(c.circuit) > 0 and f"(the circuit: {len(c.circuit)} edges)" in label()
        assert f"f = {c.circuit_faithfulness:.3f}" in label()
        # every k is reachable, one edge at a time; f is shown where it was measured and said missing elsewhere
        for k in range(len(c.scores) + 1):
            b.execute_script(f"var s = document.getElementById('k'); s.value = {k}; s.dispatchEvent(new Event('input'));")
            assert shown() == k
            f = data["f_at"].get(str(k))
            assert (f"f = {f:.3f}" if f is not None else "not measured at this k") in label()
        assert "faithfulness f =" in label()  # k = all edges: a point of the curve
        # clicking a node highlights the paths through it (other edges dimmed)
        b.execute_script("document.querySelector('#circuit-svg g.node[data-id=\"logits\"]')"
                         ".dispatchEvent(new MouseEvent('click'))")
        assert b.find_elements("css selector", "#circuit-svg g.node.on")
        # a table sorts on a click on its header: ascending, then descending
        col = "return Array.prototype.map.call(document.querySelectorAll('#table-patch tbody tr'), function(r){ " \
              "return parseFloat(r.cells[1].getAttribute('data-sort')); });"
        before = b.execute_script(col)
        b.find_element("css selector", "#table-patch thead th:nth-child(2)").click()
        assert b.execute_script(col) == sorted(before)
        b.find_element("css selector", "#table-patch thead th:nth-child(2)").click()
        assert b.execute_script(col) == sorted(before, reverse=True)
        # a screenshot of the page is not blank
        shot = tmp_path / "shot.png"
        b.save_screenshot(str(shot))
        from PIL import Image

        colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is None or len(colours) > 20
    finally:
        b.quit()


def test_the_cli_writes_the_report(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", INDUCTION, "--out", str(out), "--budget", "20", "--verify", "5", "--paths", "1",
                 "--steps", "diagnose,patch,circuit"]) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}/report.html" in text
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["circuit", "diagnose", "figures", "paper", "patch"]
    assert (out / "references.bib").is_file() and (out / "paper" / "methods.tex").is_file()
    assert main(["report", INDUCTION, "--steps", "diagnose,bogus", "--out", str(tmp_path / "x")]) == 2
    assert "field '--steps'" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_the_command_line_knows_the_pipelines_steps():
    import argparse

    from surgeon.analyses.pipeline import STEPS
    from surgeon.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["report"]
    assert sub.get_default("steps") == ",".join(STEPS)


def test_the_command_line_knows_the_optional_steps(tmp_path, capsys):
    import argparse

    from surgeon.analyses.pipeline import OPTIONAL_STEPS
    from surgeon.cli import build_parser, main

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["report"]
    steps = next(a for a in sub._actions if a.dest == "steps")
    assert all(s in steps.help for s in OPTIONAL_STEPS)
    assert main(["report", INDUCTION, "--steps", "bogus", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in OPTIONAL_STEPS), err


def test_the_report_can_start_from_a_scan(decimal_model, tmp_path):
    """`--steps scan,...`: the scan is a step of the page (its section, its effects figure and tables, its methods
    sentence citing FormatSpread and Holm), held out as the report's split says, saved and reused like every step."""
    out = tmp_path / "r"
    rep = surgeon.report("decimal_organism", decimal_model, out=out, steps=["scan", "diagnose"], holdout=0.5)
    s = rep.steps["scan"]
    assert not s.in_sample and s.split["holdout"] == 0.5 and s.worst.accuracy.value < s.best.accuracy.value
    page = (out / "report.html").read_text()
    assert "Where the model fails: formats scanned" in page and "Sclar et al., 2024" in page and "Holm, 1979" in page
    assert (out / "scan" / "results.json").exists() and (out / "scan" / "interactions.csv").exists()
    again = surgeon.report("decimal_organism", decimal_model, out=out, steps=["scan", "diagnose"], holdout=0.5)
    assert again.reused == ["scan", "diagnose"]
    assert str(again.steps["scan"]) == str(s)  # read back whole: the pair's estimates, the interactions
    assert again.steps["scan"].interactions == s.interactions
