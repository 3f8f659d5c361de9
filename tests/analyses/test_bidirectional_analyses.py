"""A tracr-style bidirectional model (attention_dir="bidirectional", no norms, ReLU MLPs) through every analysis from
Python, with ragged prompts and an item scored at several positions inside its prompt: each runs, records that its
rows ran whole and alone with their padding masked, and its unpatched scores are each prompt's run alone. The engine's
patched numbers are checked against hand-written hooks in tests/engine/test_bidirectional.py."""
import pytest
import torch

import surgeon
from surgeon import Case, Item
from tests.engine.test_bidirectional import _alone_score, tracr_style


def _case():
    words = ["x", "xy", "xyz", "wxyz", "v", "vw", "uvw", "tuvw"]
    others = ["o", "on", "onm", "onml", "k", "kj", "kji", "kjih"]
    answers = [("p", "r"), ("pq", "rs"), ("p", "rs"), ("pq", "r")]
    items = [Item({"a": a, "b": b}, correct=answers[i % 4][0], incorrect=answers[i % 4][1])
             for i, (a, b) in enumerate(zip(words, others))]
    return Case(name="tracr-style", formats={"good": "{b}", "bad": "{a}"}, good="good", bad="bad", items=items)


@pytest.fixture(scope="module")
def model(charset):
    return tracr_style(charset)


def test_diagnose_scores_each_prompt_as_run_alone(model):
    from surgeon.case.encoding import encode_rows

    case = _case()
    d = surgeon.diagnose(case, model)
    for fmt in ("good", "bad"):
        rows = encode_rows(case.formats[fmt], case.items, model.tokenizer, True, "sequence")
        with torch.no_grad():
            per_item = torch.zeros(len(case.items))
            for r in rows:
                per_item[r.item] += _alone_score(model, r)
        assert d.get(fmt).score.value == pytest.approx(float(per_item.mean()), rel=1e-5)


@pytest.mark.parametrize("analysis", ["patch", "attribute", "threshold", "circuit", "patch_positions", "repair"])
def test_every_analysis_runs_and_says_how_its_rows_ran(model, analysis):
    case = _case()
    run = {"patch": lambda: surgeon.patch(case, model),
           "attribute": lambda: surgeon.attribute(case, model),
           "threshold": lambda: surgeon.threshold(case, model, layer=1, budget=20),
           "circuit": lambda: surgeon.circuit(case, model, verify=5),
           "patch_positions": lambda: surgeon.patch_positions(case, model, layers=[0]),
           "repair": lambda: surgeon.repair(case, model, heads=["L1H0"], mode="mean")}[analysis]
    r = run()
    assert str(r)  # it prints
    if analysis == "repair":  # a repair runs the failing prompt alone under hooks: its held-out effect is a number
        assert r.held_out and r.efficacy() is not None
        return
    assert "bidirectional" in str(r.execution), r.execution
