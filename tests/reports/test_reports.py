"""Reports say what happened in words: no NaN tables, one unit naming, no interval invented from one item."""
from dataclasses import replace

import numpy as np
import pytest

from surgeon.analyses import attribute, diagnose, patch_heads
from surgeon.analyses.blend import blend
from surgeon.cli.commands import main
from surgeon.reports.attribution_view import attribution_text
from surgeon.reports.diagnose_view import diagnosis_text
from surgeon.reports.patch_view import patch_text
from surgeon.reports.threshold_view import blend_text
from tests.conftest import ROOT

CASE = f"{ROOT}/cases/decimal_organism.py"


def _case_file(tmp_path, body: str):
    f = tmp_path / "variant.py"
    f.write_text("import runpy\nfrom dataclasses import replace\n"
                 f"base = runpy.run_path({CASE!r})['case']\n" + body)
    return str(f)


def test_identical_formats_are_refused_with_the_file_named(tmp_path, capsys):
    f = _case_file(tmp_path, "case = replace(base, name='same', formats={**base.formats, 'qa': base.formats['plain']})\n")
    assert main(["patch", f, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f in err and "are the same template" in err and "fix:" in err  # refused from the case, before the model
    assert not (tmp_path / "o").exists()


def test_one_item_has_no_interval_and_the_verdict_says_why(decimal_model, decimal_case):
    case = replace(decimal_case, items=decimal_case.items[:1], focus=None)
    d = diagnose(case, decimal_model)
    text = diagnosis_text(d, case)
    assert "nan" not in text.lower()
    assert "(no interval)" in text and "1 item cannot separate them" in text
    p = patch_heads(case, decimal_model, layers=[1])
    text = patch_text(p)
    assert "nan" not in text.lower() and "(no interval)" in text
    assert d.get("plain").score.n == 1 and str(d.get("plain").score).endswith("(n=1, no interval)")


def test_units_are_named_one_way_everywhere(decimal_model, decimal_case):
    p = patch_heads(decimal_case, decimal_model, layers=[1, 2])
    a = attribute(decimal_case, decimal_model, layers=[1, 2])
    for text in (patch_text(p), attribution_text(a)):
        assert "L1H" in text or "L2H" in text
        assert "L1." not in text and "L2." not in text
    top = patch_text(p).split("top ")[1].splitlines()[2].split()[0]
    L, h = top[1:].split("H")
    assert p.fraction[p.layers.index(int(L)), int(h)] == max(x for x in p.fraction.ravel())


def test_blend_reports_whole_components_and_no_repair_in_words(decimal_model, decimal_case):
    r = blend(decimal_case, decimal_model, layer=1, component="mlp_out", step=0.1)
    text = blend_text(r)
    assert "blend mlp_out of layer 1:" in text and r.units == ("L1.mlp_out",)
    # L2H1 alone never repairs a trap item (the answer heads are elsewhere): said in words, not "nan (n=0)"
    r = blend(decimal_case, decimal_model, layer=2, heads=[1], step=0.1)
    assert r.never == r.n_items and r.switch_mean.n == 0
    text = blend_text(r)
    assert "nan" not in text and "does not repair the failure" in text


def test_threshold_warns_when_the_unpatched_run_already_passes(tmp_path, capsys):
    assert main(["threshold", CASE, "--layer", "1", "--tag", "control", "--item-rate", "0.5", "--budget", "5",
                 "--groups", "none", "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "there is no failure to repair here" in out and "nan" not in out


def test_diagnose_saves_per_item_scores_and_shows_progress(tmp_path, capsys):
    import csv
    import json

    assert main(["diagnose", CASE, "--batch-size", "32", "--out", str(tmp_path / "d")]) == 0
    err = capsys.readouterr().err
    assert "scoring plain" in err and "scoring qa" in err  # several batches: a progress bar per format
    res = json.loads((tmp_path / "d" / "results.json").read_text())["result"]
    per_item = res["per_item"]
    assert len(per_item) == 128 and {"item", "tag", "values", "correct", "incorrect", "score"} <= set(per_item[0])
    for st in res["stats"]:  # every accuracy in the report is recomputable from the saved item scores
        xs = [it["score"][st["format"]] for it in per_item if st["tag"] in ("all", it["tag"])]
        assert st["accuracy"]["n"] == len(xs)
        assert abs(st["accuracy"]["value"] - sum(x > 0 for x in xs) / len(xs)) < 1e-12
    rows = list(csv.reader(open(tmp_path / "d" / "items.csv")))
    assert rows[0][:4] == ["item", "tag", "correct", "incorrect"] and len(rows) == 129
    assert abs(float(rows[1][4]) - per_item[0]["score"]["plain"]) < 1e-4


@pytest.mark.slow
def test_figures_scale_to_the_data_and_mark_what_they_claim(decimal_model, decimal_case, threshold_model, tmp_path):
    from surgeon.reports import figures
    from surgeon.analyses.threshold import threshold_search

    p = patch_heads(decimal_case, decimal_model, layers=[0, 1, 2])
    fig = figures.patch_heatmap(p, tmp_path / "h.png")
    lo, hi = fig.axes[0].images[0].get_clim()
    assert hi == -lo == np.nanmax(np.abs(p.fraction)) < 1  # symmetric, full colour at the largest effect
    assert fig.axes[1].get_ylabel() == "repair fraction"  # the colorbar says what it shows

    a = attribute(decimal_case, decimal_model, layers=[0, 1, 2], compare=True)
    fig = figures.attribution_heatmap(a, tmp_path / "a.png")
    scatter = [ax for ax in fig.axes if ax.collections and ax.get_xlabel().startswith("exact")]
    assert len(scatter) == 1 and sum(len(c.get_offsets()) for c in scatter[0].collections) == a.exact.size
    assert f"r = {a.pearson:.2f}" in scatter[0].get_title()
    assert len(figures.attribution_heatmap(replace(a, exact=None), tmp_path / "b.png").axes) == 2  # map + colorbar

    case = __import__("surgeon").load_case(f"{ROOT}/cases/threshold_organism.py")
    odds = [f"L0H{h}" for h in range(1, 32, 2)]  # no odd subset repairs: a curve that must coincide with odd's
    r = threshold_search(case, threshold_model, layer=0, groups=["even", "odd"], groups_spec={"mine": odds},
                         budget=20, out=tmp_path / "t", batch_size=4096, chunk=4096)
    ax = figures.threshold_figure(r, tmp_path / "t.png").axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert any(lab.startswith("mine") and lab.endswith("= odd") for lab in labels)  # coinciding curves named
    assert not any(lab.startswith("even") and "=" in lab for lab in labels)  # distinct weights: a curve of its own
    marks = [t.get_text() for t in ax.texts]
    assert f"k*={r.threshold('even').k_star}" in marks and f"k*={r.threshold('all').k_star}" in marks


def test_numbers_that_round_to_zero_print_as_zero(decimal_model, decimal_case):
    p = patch_heads(decimal_case, decimal_model, layers=[2])
    assert ((p.fraction < 0) & (p.fraction > -0.005)).any()  # tiny negative effects, which used to print -0.00
    grid = patch_text(p).split("unit (columns):")[1].split("top ")[0]
    assert "-0.00" not in grid and " 0.00" in grid


def test_a_faithfulness_past_one_says_why_it_is_not_clipped():
    """Issue 53, item 5: an interval above 1 printed with its reason (a ratio of mean scores: edges left out can work
    against the behaviour), nothing added below 1."""
    from surgeon.reports.circuit_view import circuit_eval_text

    base = dict(case="c", n_edges=3, of_edges=10, source="plain", base="qa", n_items=8, empty=-1.0, full=1.0,
                semantics="kept")
    inside = circuit_eval_text({**base, "circuit": 0.8, "faithfulness": 0.9, "faithfulness_ci": (0.85, 0.95)}, "f")
    assert "not clipped" not in inside
    past = circuit_eval_text({**base, "circuit": 0.98, "faithfulness": 0.99, "faithfulness_ci": (0.9, 1.04)}, "f")
    assert "interval passes 1" in past and "edges left out work against the behaviour" in past


def test_the_report_bar_counts_the_steps_the_header_lists():
    """Issue 53, item 5: the SAE step runs (and the page lists) five parts; the bar counts them, not one."""
    from surgeon.analyses.pipeline import SAE_STEPS, STEPS, bar_total

    assert bar_total(STEPS, saes=True) == len(STEPS) - 1 + len(SAE_STEPS) == 14
    assert bar_total(STEPS, saes=False) == len(STEPS) - 1
    assert bar_total(["diagnose", "repair"], saes=True) == 2
