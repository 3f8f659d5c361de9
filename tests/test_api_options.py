"""The Python API means what it says about evaluation items and options that need a partner (issue 69, item 5):
holdout=0 runs in-sample, holdout with eval_items is refused by every function (before any weight loads), the
report's repair step takes the report's split, and options that do nothing without another are refused."""
import pytest

import surgeon
from surgeon.errors import SurgeonError
from tests.cli.test_reliability import refused
from tests.conftest import ROOT

DECIMAL = f"{ROOT}/cases/decimal_organism.py"
NOT_A_MODEL = "no/such/model/dir"  # loading it would fail: a refusal that names eval_items came before the model


@pytest.mark.parametrize("fn,kw", [
    (surgeon.patch, {}), (surgeon.threshold, {"layer": 0}), (surgeon.circuit, {}), (surgeon.repair, {"search": True}),
    (surgeon.report, {}), (surgeon.sae_repair, {"layer": 0}), (surgeon.feature_circuit, {}),
])
@pytest.mark.parametrize("holdout", [0.5, 0])
def test_holdout_with_eval_items_is_refused_by_every_function_before_the_model_loads(fn, kw, holdout):
    with pytest.raises(SurgeonError) as e:
        fn(DECIMAL, NOT_A_MODEL, holdout=holdout, eval_items=8, **kw)
    assert e.value.field == "eval_items" and "two ways to choose the evaluation items" in str(e.value)


@pytest.mark.parametrize("fn,kw", [(surgeon.threshold, {"layer": 0}), (surgeon.circuit, {})])
def test_folds_with_holdout_is_refused(fn, kw):
    with pytest.raises(SurgeonError) as e:
        fn(DECIMAL, NOT_A_MODEL, holdout=0.5, folds=3, **kw)
    assert e.value.field == "folds"


@pytest.mark.parametrize("bad", [1, 1.5, -0.1, "0.5", True])
def test_a_holdout_that_is_not_a_share_is_refused(bad):
    with pytest.raises(SurgeonError) as e:
        surgeon.patch(DECIMAL, NOT_A_MODEL, holdout=bad)
    assert e.value.field == "holdout"


def test_holdout_zero_runs_in_sample(decimal_model):
    """holdout=0 holds no item out: the plain, in-sample result on every item, never a 0.5 split."""
    r = surgeon.patch(DECIMAL, decimal_model, holdout=0, layers=[0])
    assert type(r).__name__ == "PatchResult"
    plain = surgeon.patch(DECIMAL, decimal_model, layers=[0])
    assert r.n_items == plain.n_items and str(r) == str(plain)
    t = surgeon.circuit(DECIMAL, decimal_model, holdout=0, method="eap", edges=3, paths=0, verify=0)
    assert type(t).__name__ == "CircuitResult"


def test_a_repair_with_holdout_zero_is_refused_not_measured_in_sample():
    with pytest.raises(SurgeonError) as e:
        surgeon.repair(DECIMAL, NOT_A_MODEL, heads="L0H1", holdout=0)
    assert e.value.field == "--holdout" and "not built on" in str(e.value)


def test_the_reports_repair_step_needs_held_out_items(tmp_path, capsys):
    with pytest.raises(SurgeonError) as e:
        surgeon.report(DECIMAL, NOT_A_MODEL, steps=["diagnose", "repair"], holdout=0)
    assert e.value.field == "holdout"
    refused(capsys, ["report", DECIMAL, "--steps", "diagnose,repair", "--holdout", "0", "--out", str(tmp_path / "r")],
            "--holdout", "not built on")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("argv,flag", [
    (["--heads", "L0H1", "--strengths", "1,2"], "--strengths"),
    (["--heads", "L0H1", "--max-kl", "0.2"], "--max-kl"),
    (["--heads", "L0H1", "--max-drop", "0.1"], "--max-drop"),
    (["--heads", "L0H1", "--max-heads", "3"], "--max-heads"),
    (["--heads", "L0H1", "--max-kl-q90", "0.3"], "--max-kl-q90"),
    (["--heads", "L0H1", "--holdout", "0.4", "--eval-items", "8"], "--eval-items"),
])
def test_repair_options_without_their_partner_are_refused(capsys, tmp_path, argv, flag):
    refused(capsys, ["repair", DECIMAL, *argv, "--out", str(tmp_path / "r")], flag)
    assert not (tmp_path / "r").exists()


def test_strengths_without_search_are_refused_in_python():
    with pytest.raises(SurgeonError) as e:
        surgeon.repair(DECIMAL, NOT_A_MODEL, heads="L0H1", strengths=[1, 2])
    assert e.value.field == "--strengths"


def test_max_drop_zero_is_accepted_as_the_library_accepts_it(capsys):
    from surgeon.cli.commands import build_parser

    args = build_parser().parse_args(["repair", DECIMAL, "--search", "--max-drop", "0"])
    assert args.max_drop == 0.0


def test_feature_circuit_steps_with_a_method_that_does_not_integrate_is_refused(capsys):
    refused(capsys, ["feature-circuit", DECIMAL, "--method", "gradient", "--steps", "3"], "--steps", "does not")


@pytest.mark.slow
def test_the_marks_edge_rule_needs_a_threshold(capsys):
    with pytest.raises(SurgeonError) as e:
        surgeon.feature_circuit(DECIMAL, NOT_A_MODEL, edge_rule="marks")
    assert e.value.field == "edge_rule"
    with pytest.raises(SurgeonError) as e:
        surgeon.feature_circuit(DECIMAL, NOT_A_MODEL, edge_rule="theirs", threshold=0.1)
    assert e.value.field == "edge_rule"
    refused(capsys, ["feature-circuit", DECIMAL, "--edge-rule", "marks"], "--edge-rule", "--threshold")


def test_a_holdout_of_one_is_refused_before_the_model_loads(capsys):
    refused(capsys, ["repair", DECIMAL, "--heads", "L0H4", "--holdout", "1", "--model", NOT_A_MODEL], "--holdout")
    refused(capsys, ["threshold", DECIMAL, "--layer", "0", "--holdout", "1", "--model", NOT_A_MODEL], "--holdout")


@pytest.mark.parametrize("text,phrase", [("Vergleich: 3.4 \u00fcber 3.25", "does not know"),
                                         ("Which is bigger: 1.1 or 1.2?" * 5, "past the model's context")])
def test_neutral_texts_the_model_cannot_read_are_refused(text, phrase):
    import dataclasses

    from surgeon.models.checks import check_case_against_model

    case = dataclasses.replace(surgeon.load_case(DECIMAL), neutral=["Which is bigger: 1.1 or 1.2? 1.2", text])
    with pytest.raises(SurgeonError) as e:
        check_case_against_model(case)  # the tokenizer and the config only, no weights
    assert e.value.field == "neutral[1]" and phrase in str(e.value)


def test_subsets_to_evaluate_are_named_by_eval(capsys):
    refused(capsys, ["threshold", DECIMAL, "--eval", "L0H4,L0H99"], "'--eval'", "L0H99")


def test_a_repair_where_nothing_fails_is_said_before_the_work(decimal_model, capsys):
    surgeon.repair(DECIMAL, decimal_model, heads="L0H4", tag="control", bad="qa")
    assert "the failure is not reproduced" in capsys.readouterr().err


def test_a_mean_repair_past_full_strength_is_not_called_a_replacement(decimal_model):
    r = surgeon.repair(DECIMAL, decimal_model, heads="L0H4", strength=5)
    first = str(r).splitlines()[0]
    assert "extrapolated" in first and "in place of" not in first


def test_the_report_refuses_a_repair_step_it_cannot_run_before_any_step(tmp_path, capsys):
    import dataclasses

    case = dataclasses.replace(surgeon.load_case(DECIMAL), align="index")
    with pytest.raises(SurgeonError) as e:
        surgeon.report(case, "organism:decimal", steps=["diagnose", "repair"], out=tmp_path / "r")
    assert e.value.field == "align" and not (tmp_path / "r").exists()


def test_evaluation_items_that_all_repeat_discovery_prompts_say_so():
    from surgeon.analyses.heldout import eval_split

    case = surgeon.load_case(DECIMAL)
    with pytest.raises(SurgeonError) as e:
        eval_split(case, None, None, 0, list(case.items_for(case.focus))[:10])
    assert "repeat a discovery item's prompt" in str(e.value) and e.value.field == "--eval-items"


@pytest.mark.parametrize("manifest,phrase", [({"command": "report"}, "holds no step"),
                                             ({"command": "diagnose", "versions": {"surgeon": "0.0.1"}},
                                              "another minor version of 0.x")])
def test_manifests_that_cannot_be_read_as_they_say_are_refused(tmp_path, manifest, phrase):
    import json

    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SurgeonError) as e:
        surgeon.load(tmp_path)
    assert phrase in str(e.value)


def test_an_empty_item_list_is_refused(capsys):
    refused(capsys, ["encode", DECIMAL, "--items", ","], "--items", "names no item")
    with pytest.raises(SurgeonError) as e:
        surgeon.encode(DECIMAL, items=[])
    assert e.value.field == "--items"
