"""The report's subset search takes the threshold command's options (--heads, --groups, --item-rate, --seed), gives
the same result as `threshold` with them, states them in the methods paragraph, and says when no k reaches the
criterion, showing the best subset's rate per k."""
import os
import re

import numpy as np
import pytest

import surgeon
from surgeon.cli import main
from surgeon.analyses.heldout import threshold_heldout
from surgeon.reports.html import methods_paragraph
from surgeon.reports.threshold_view import threshold_text
from surgeon.analyses.threshold import threshold_search
from tests.conftest import ROOT

HEADS = "L0H0,L0H1,L0H2,L0H3,L1H0,L1H1,L1H2,L1H3"


def test_report_threshold_equals_the_threshold_command_with_the_same_options(tmp_path, decimal_case, decimal_model):
    """By default the report's subset search is the held-out one (`surgeon threshold --holdout 0.5`); with holdout=0
    it is the search on every item, in-sample."""
    kw = dict(heads=HEADS, groups=["first_half"], item_rate=0.75, seed=3)
    rep = surgeon.report(decimal_case, decimal_model, out=tmp_path / "r", steps=["threshold"], budget=12, layer=0, **kw)
    got = rep.steps["threshold"]
    want = threshold_heldout(decimal_case, decimal_model, holdout=0.5, layer=0, budget=12, **kw)
    assert got.split == want.split and got.split.seed == 3
    assert got.search.item_rate == 0.75 and got.search.units == want.search.units and len(got.search.units) == 8
    assert [(s.family, s.key, s.repairing, s.evaluated) for s in got.search.sizes] == \
        [(s.family, s.key, s.repairing, s.evaluated) for s in want.search.sizes]
    assert [(r.family, r.k, r.subset, r.held_out.value) for r in got.rows] == \
        [(r.family, r.k, r.subset, r.held_out.value) for r in want.rows]
    assert got.search.n_items == len(got.split.discovery)  # the search saw the discovery items alone
    # the sample depends on the seed: another seed draws other subsets of some size
    other = threshold_search(decimal_case, decimal_model, layer=0, budget=12, **{**kw, "seed": 4})
    assert got.search.options["seed"] == 3 and other.options["seed"] == 4
    text = methods_paragraph(rep)
    assert "seed 3" in text and "at least 75% of the items" in text and HEADS in text and "seed 0" not in text
    assert rep.options["threshold"]["item_rate"] == 0.75 and rep.options["threshold"]["holdout"] == 0.5
    # in-sample on request: the search on every item, as `surgeon threshold` without --holdout
    flat = surgeon.report(decimal_case, decimal_model, out=tmp_path / "flat", steps=["threshold"], budget=12, layer=0,
                          holdout=0, **kw).steps["threshold"]
    every = threshold_search(decimal_case, decimal_model, layer=0, budget=12, **kw)
    assert [(s.family, s.key, s.repairing, s.evaluated) for s in flat.sizes] == \
        [(s.family, s.key, s.repairing, s.evaluated) for s in every.sizes]


def test_the_cli_report_takes_the_options_and_checks_them_before_loading(tmp_path, capsys):
    case = os.path.join(ROOT, "cases", "decimal_organism.py")
    out = tmp_path / "r"
    assert main(["report", case, "--steps", "threshold", "--layer", "0", "--budget", "8", "--heads", "0,1,2,3",
                 "--groups", "none", "--item-rate", "0.5", "--seed", "7", "--out", str(out)]) == 0
    res = (out / "threshold" / "results.json").read_text()
    assert '"item_rate": 0.5' in res and '"seed": 7' in res
    for argv, words in [(["--groups", "evn"], "did you mean 'even'"), (["--heads", "L9H0"], "out of range"),
                        (["--item-rate", "1.5"], "--item-rate"), (["--holdout", "0.97"], "each side needs at least 4"),
                        (["--holdout", "0.5", "--eval-items", "8"], "two ways to choose the evaluation items"),
                        (["--holdout", "1"], "must be in [0, 1)")]:
        try:
            code = main(["report", case, "--steps", "threshold", "--out", str(tmp_path / "x"), *argv])
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and words in err and "Traceback" not in err
        assert not (tmp_path / "x").exists()


def test_no_k_reaching_the_criterion_is_said_with_the_best_rate_per_k(decimal_case, decimal_model):
    """On the decimal organism no subset of layer 0's heads gets every item right: the section says so and gives the
    best subset per k, its rate equal to the best of the subsets' own rates (recomputed here from subsets.csv's
    per-subset item rates)."""
    r = threshold_search(decimal_case, decimal_model, layer=0, budget=20, groups=[])
    rows = [s for s in r.sizes if s.family == "all" and s.evaluated]
    assert r.threshold("all").k_star is None and max(s.best_item_rate for s in rows) < 1
    text = threshold_text(r)
    assert re.search(r"no size k has >= 50.0% of subsets repairing; the best subset gets [\d.]+% of the items right "
                     r"\(k = \d+\), short of the criterion \(100.0%\)", text)
    for s in rows:
        n = r.n_items
        assert s.best_lo <= s.best_item_rate <= s.best_hi
        assert np.isclose(s.best_item_rate * n, round(s.best_item_rate * n))
        assert f"{100 * s.best_item_rate:5.1f}% [{100 * s.best_lo:5.1f}%, {100 * s.best_hi:5.1f}%]" in text
