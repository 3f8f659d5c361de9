"""Generation-based scoring: greedy continuations, patched through the core, judged against the answers."""
import os
from dataclasses import replace

import torch

from surgeon import Item, load_case
from surgeon.analyses import diagnose
from surgeon.analyses.generation import generate_format, generate_patched, judge
from surgeon.sites.nodes import Site
from tests.conftest import ROOT


def test_judge():
    it = Item({"a": "9.8"}, correct=" 9.8", incorrect=" 9.11")
    assert judge(" 9.8\n", it) == "correct" and judge("9.11 is bigger", it) == "incorrect"
    assert judge(" 10", it) == "other"
    longer = Item({}, correct=" 9.81", incorrect=" 9.8")
    assert judge(" 9.81", longer) == "correct" and judge(" 9.8\n", longer) == "incorrect"


def test_patched_generation_equals_the_source_run_when_everything_is_patched(induction_model):
    """Index-aligned formats: patching the whole residual stream entering layer 0 at every prompt position
    makes the failing prompt the good one, so greedy generation must equal the good format's; an all-zero
    mask must equal the failing format's."""
    case = load_case(os.path.join(ROOT, "cases", "induction_organism.py"))
    items = case.items[:16]
    case = replace(case, items=items)
    good = generate_format(case, induction_model, "repeat", items, n_new=3)
    bad = generate_format(case, induction_model, "fresh", items, n_new=3)
    assert good.texts != bad.texts
    none, full = generate_patched(case, induction_model, {Site.of("resid_pre", 0): torch.tensor([[0.0], [1.0]])},
                                  n_new=3)
    assert none.texts == bad.texts and full.texts == good.texts
    # generation judges the planted behaviour: copying works in the repeat format only
    assert good.accuracy.value > 0.9 > 0.5 > bad.accuracy.value  # fresh: a guess among the letters in context


def test_diagnose_generate_reports_the_papers_check(decimal_model, decimal_case):
    d = diagnose(decimal_case, decimal_model, generate=6)
    by = {g.format: g for g in d.generations}
    assert by["plain"].accuracy.value > 0.95 and by["qa"].counts()["incorrect"] > 0.9 * by["qa"].accuracy.n
    assert by["qa"].accuracy.n == 64  # the focus items
