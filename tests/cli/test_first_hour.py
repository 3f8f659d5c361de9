"""Issue 33: the command line catches a newcomer's mistakes before anything loads (under a second, torch never
imported), answers unknown options with the subcommand's usage and the closest name, suggests the case name,
Case field, format, tag or choice meant; warns when there is nothing to repair; `report` takes --bad, --tag
and --metric; threshold writes nothing without --out; the version and distribution name are what pip sees."""
import json
import subprocess
import sys

import pytest

from surgeon.analyses.diagnose import failure_check
from surgeon.models.checks import load_case
from tests.conftest import ROOT
from tests.cli_in_process import surgeon as surgeon_cli

DECIMAL = f"{ROOT}/cases/decimal_organism.py"
PROBE = ("import sys, time; t = time.perf_counter(); from surgeon.cli.commands import main\n"
         "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
         "print('RESULT', code, 'torch' in sys.modules, round(time.perf_counter() - t, 3))")


def before_loading(*argv):
    """(exit code, stderr, torch imported?, seconds in main) of `surgeon ARGV` in a fresh interpreter."""
    r = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=ROOT)
    code, torch_loaded, secs = r.stdout.split("RESULT ")[1].split()
    return int(code), r.stderr, torch_loaded == "True", float(secs)


@pytest.mark.parametrize("argv, phrases", [
    (["patch", "--layers", "0-5"], ["field '--layers'", "layer 3 is out of range: the model has layers 0..2"]),
    (["patch", "--bad", "chta"], ["field '--bad'", "(did you mean 'chat'?)", "use one of: qa, chat"]),
    (["patch", "--bad", "plain"], ["'plain' is the case's good format"]),
    (["circuit", "--tag", "trapp"], ["field '--tag'", "(did you mean 'trap'?)"]),
    (["threshold", "--layer", "7"], ["field '--layer'", "layer 7 is out of range"]),
    (["blend", "--layer", "1", "--heads", "0,9"], ["field '--heads'", "L1H9 is out of range"]),
    (["attention", "--heads", "L5H0"], ["field '--heads'", "L5H0 is out of range"]),
    (["patch", "--layer", "1"], ["usage: surgeon patch", "unrecognized option --layer (did you mean '--layers'?)"]),
    (["circuit", "--ablaton", "mean"], ["usage: surgeon circuit", "(did you mean '--ablation'?)"]),
    (["circuit", "--ablation", "meen"], ["usage: surgeon circuit", "(did you mean 'mean'?)"]),
    (["pach"], ["invalid command: 'pach' (did you mean 'patch'?)"]),
    (["diagnose", "decimal_organsm"], ["no such case file (did you mean the shipped case 'decimal_organism'?)"]),
    (["report", "--bad", "chta"], ["field '--bad'", "(did you mean 'chat'?)"]),
    (["blend", "induction_organism", "--layer", "0", "--component", "mlp_out"],
     ["field '--component'", "the model is attention-only and has no MLP"]),
])
def test_mistakes_are_caught_before_torch_loads(argv, phrases):
    code, err, torch_loaded, secs = before_loading(*argv)
    assert code == 2 and "Traceback" not in err, err
    for p in phrases:
        assert p in err, (p, err)
    assert not torch_loaded, f"torch was imported before {argv} was refused"
    assert secs < 5, secs  # well under a second alone; generous for a loaded 2-core CI machine


def test_abbreviations_are_off(capsys):
    """`--layer` on patch is an unknown option, not --layers (argparse's abbreviations), in every subcommand."""
    from surgeon.cli.commands import build_parser

    parser = build_parser()
    stack = [parser]
    while stack:
        p = stack.pop()
        assert p.allow_abbrev is False, p.prog
        for a in p._actions:
            stack.extend(getattr(a, "choices", None).values() if hasattr(getattr(a, "choices", None), "values") else [])
    with pytest.raises(SystemExit):
        parser.parse_args(["patch", "--lay", "1"])
    assert "unrecognized option --lay" in capsys.readouterr().err


def test_a_misspelt_case_field_is_named(tmp_path, capsys):
    f = tmp_path / "mine.py"
    f.write_text(open(DECIMAL).read().replace("good=", "goood=", 1))
    code, err, torch_loaded, _ = before_loading("diagnose", str(f))
    assert code == 2 and "unexpected keyword argument 'goood'" in err and "(did you mean 'good'?)" in err, err
    assert not torch_loaded
    f.write_text("from surgeon import Case, Item\nItem({'a': 'b'}, corect='x', incorrect='y')\n")
    code, err, _, _ = before_loading("diagnose", str(f))
    assert code == 2 and "(did you mean 'correct'?)" in err, err


def test_nothing_to_repair_is_said(decimal_model):
    """The control items are right in both formats: patching them would 'repair' a failure that is not there."""
    case = load_case(DECIMAL)
    assert failure_check(case, decimal_model) is None  # the focus (trap items) fails in qa
    why = failure_check(case, decimal_model, tag="control")
    assert why is not None and "the failure is not reproduced on the 64 items tagged 'control'" in why
    assert failure_check(case, decimal_model, bad="chat", tag="trap") is None


@pytest.mark.slow
def test_patch_warns_when_the_format_does_not_fail():
    r = surgeon_cli(["patch", DECIMAL, "--tag", "control", "--layers", "0"], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "surgeon: warning: the failure is not reproduced" in r.stderr
    r = surgeon_cli(["patch", DECIMAL, "--layers", "0"], cwd=ROOT)
    assert r.returncode == 0 and "warning: the failure is not reproduced" not in r.stderr, r.stderr


@pytest.mark.slow
def test_report_takes_bad_tag_and_metric(tmp_path, decimal_model):
    import surgeon.api as api

    case = load_case(DECIMAL)
    out = tmp_path / "rep"
    rep = api.report(case, decimal_model, out=out, steps=["patch"], bad="chat", tag="all")
    patch = rep.steps["patch"]
    assert patch.base == "chat" and patch.n_items == len(case.items)
    step = json.loads((out / "patch" / "step.json").read_text())
    assert step["options"]["bad"] == "chat" and step["options"]["tag"] == "all"
    rep2 = api.report(case, decimal_model, out=out, steps=["patch"], bad="qa", tag="all")
    assert "patch" not in rep2.reused and rep2.steps["patch"].base == "qa"  # another choice is not reused
    from dataclasses import replace

    key = api.report_key(replace(case, metric="logit"), decimal_model, None)
    assert key["metric"] == "logit" and api.report_key(case, decimal_model, None)["metric"] == "logprob"
