"""The notebook's surgeon (`surgeon.diagnose`, `surgeon.patch`, ...): the CLI's names and defaults, results that
print as the CLI's report, render in Jupyter, draw their figure and save what `--out` writes; a model held in
memory gives what the same model loaded by name gives; the README's Python example runs."""
import argparse
import copy
import html
import inspect
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import surgeon
from surgeon.cli import build_parser, main
from surgeon.show import view_of
from tests.conftest import ROOT

THRESHOLD = f"{ROOT}/cases/threshold_organism.py"
LLAMA_CASE = f"{ROOT}/cases/llama31_decimal.py"


def _subparsers(parser) -> dict:
    act = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return act.choices


COMMANDS = {"diagnose": "diagnose", "dla": "dla", "attention": "attention", "patch": "patch", "patch_positions": "patch-positions", "attribute": "attribute", "threshold": "threshold",
            "blend": "blend", "circuit": "circuit", "circuit_eval": "circuit-eval", "sae_overlap": "sae overlap",
            "sae_amplified": "sae amplified", "sae_heads": "sae heads", "sae_repair": "sae repair",
            "feature_circuit": "feature-circuit"}
# options whose command-line form is text the command parses into the value the function takes
CLI_ONLY = {"n_devices", "threads", "export", "resume", "shard", "ray", "ray_workers", "groups_file", "seed", "model",
            "eval", "loader"}  # threshold --eval is its own function in Python: surgeon.evaluate_subsets; --loader
# bridge is the model spec's bridge: prefix (or a TransformerBridge object) in Python
PARSED = {"groups": lambda v: tuple(g.strip() for g in v.split(",")), "items": lambda v: tuple(int(x) for x in v.split(",")), "layers": lambda v: v, "heads": lambda v: v}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_api_has_the_commands_names_and_defaults(name):
    fn = getattr(surgeon, name)
    sub = build_parser()
    for word in COMMANDS[name].split():  # "sae overlap": a subcommand's subcommand
        sub = _subparsers(sub)[word]
    cli = {a.dest: a.default for a in sub._actions if a.dest not in ("help", "debug", "out", "case", "graph")}
    params = inspect.signature(fn).parameters
    shared = set(cli) & set(params)
    assert shared, name
    for opt in sorted(shared):
        default = params[opt].default
        if default is inspect.Parameter.empty:  # required in both
            assert cli[opt] is None or sub._option_string_actions.get(f"--{opt}").required, opt
            continue
        want = PARSED.get(opt, lambda v: v)(cli[opt]) if isinstance(cli[opt], str) else cli[opt]
        assert (default if not isinstance(default, list) else tuple(default)) == want, (name, opt, default, want)
    # every option of the analysis is a parameter; only the command line's own mechanics are not
    assert set(cli) - set(params) <= CLI_ONLY, (name, set(cli) - set(params) - CLI_ONLY)


def _cli_text(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr().out
    return out.split("\nwrote ")[0].rstrip("\n")


@pytest.fixture(scope="module")
def results(threshold_model):
    return {
        "diagnose": (surgeon.diagnose(THRESHOLD), ["diagnose", THRESHOLD]),
        "dla": (surgeon.dla(THRESHOLD, threshold_model), ["dla", THRESHOLD]),
        "attention": (surgeon.attention(THRESHOLD, threshold_model, heads="L0H0,L0H1", items=[0, 2]),
                      ["attention", THRESHOLD, "--heads", "L0H0,L0H1", "--items", "0,2"]),
        "patch_positions": (surgeon.patch_positions(THRESHOLD, threshold_model),
                            ["patch-positions", THRESHOLD]),
        "patch": (surgeon.patch(THRESHOLD, threshold_model), ["patch", THRESHOLD]),
        "attribute": (surgeon.attribute(THRESHOLD, threshold_model), ["attribute", THRESHOLD]),
        "threshold": (surgeon.threshold(THRESHOLD, threshold_model, layer=0, groups=("even",), budget=20),
                      ["threshold", THRESHOLD, "--layer", "0", "--groups", "even", "--budget", "20"]),
        "sae_overlap": (surgeon.sae_overlap(THRESHOLD, threshold_model), ["sae", "overlap", THRESHOLD]),
        "sae_amplified": (surgeon.sae_amplified(THRESHOLD, threshold_model, layer=0, top=5),
                          ["sae", "amplified", THRESHOLD, "--layer", "0", "--top", "5"]),
        "sae_heads": (surgeon.sae_heads(THRESHOLD, threshold_model, layer=0, sae_layer=0, top=6),
                      ["sae", "heads", THRESHOLD, "--layer", "0", "--sae-layer", "0", "--top", "6"]),
        "blend": (surgeon.blend("threshold_organism", threshold_model, layer=0, heads=[0, 2, 4]),
                  ["blend", THRESHOLD, "--layer", "0", "--heads", "0,2,4"]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["diagnose", "dla", "attention", "patch", "patch_positions", "attribute", "threshold",
                                  "sae_overlap", "sae_heads", "blend"])
def test_results_print_render_draw_and_save_what_the_cli_does(results, name, tmp_path, capsys):
    r, argv = results[name]
    cli_out = tmp_path / "cli"
    assert str(r) == _cli_text(capsys, [*argv, "--out", str(cli_out)])  # print(r) is the command's report
    page = r._repr_html_()  # Jupyter: the headline, the main table, each figure as inline SVG, the report folded
    assert html.unescape(page.split("<pre>")[1].split("</pre>")[0]) == str(r)
    if view_of(r).widget is None:
        assert page.count("<svg") == len(view_of(r).figures) >= 1
    else:  # an interactive view instead of the static figures
        assert "<svg" not in page and "<script>" in page
    if view_of(r).table is not None:
        assert "<table class='data sortable'" in page and "<td" in page
    # the plain repr: one or two short lines naming the analysis and the case, not a dump of the fields
    lines = repr(r).splitlines()
    assert 1 <= len(lines) <= 2 and all(len(x) < 220 for x in lines), repr(r)
    assert lines[0].startswith(f"<{type(r).__name__}: surgeon {view_of(r).command}") and repr(r.case) in lines[0]
    fig = r.figure()
    assert fig.axes and any(ax.has_data() for ax in fig.axes)
    saved = r.save(tmp_path / "api")
    # the same files (a threshold search's --out also holds its checkpoint, parts/)
    assert sorted(p.name for p in saved.iterdir()) == sorted(p.name for p in cli_out.iterdir() if p.name != "parts")
    for table in view_of(r).tables:
        assert (saved / table).read_text() == (cli_out / table).read_text()
    api_res = json.loads((saved / "results.json").read_text())
    cli_res = json.loads((cli_out / "results.json").read_text())
    assert api_res["command"] == cli_res["command"]
    drop = lambda d: {k: v for k, v in d.items() if k != "execution"}  # noqa: E731
    assert drop(api_res["result"]) == drop(cli_res["result"])
    man = json.loads((saved / "manifest.json").read_text())
    assert man["argv"] == [] and man["api"].endswith(".save") and man["command"] == cli_res["command"]


def test_results_reload_from_their_json_as_they_were(results, tmp_path):
    """What `surgeon report` resumes from, and `surgeon.load(DIR)`: a result saved and read back is the same type and
    prints, draws and shows as it did."""
    from surgeon.api import LOADABLE

    assert {type(r).__name__ for r, _ in results.values()} <= set(LOADABLE)
    for name, (r, _) in results.items():
        back = surgeon.load(r.save(tmp_path / name))
        assert type(back) is type(r) and str(back) == str(r) and repr(back) == repr(r), name
        for draw in view_of(r).figures.values():
            draw(back, None)
    with pytest.raises(surgeon.SurgeonError, match="cannot read"):
        surgeon.load(tmp_path / "nowhere")


@pytest.mark.slow
def test_a_result_saved_with_its_case_records_the_model(results, tmp_path):
    r, _ = results["patch"]
    man = json.loads((r.save(tmp_path / "p", surgeon.load_case(THRESHOLD)) / "manifest.json").read_text())
    assert man["case"]["name"] == "threshold_organism" and man["model"]["n_heads"] == 32


@pytest.mark.slow
def test_a_model_in_memory_gives_what_the_model_loaded_by_name_gives(results, threshold_model):
    by_name = surgeon.patch(THRESHOLD)
    np.testing.assert_allclose(results["patch"][0].fraction, by_name.fraction, atol=1e-6)
    threshold_model.cfg.n_heads  # noqa: B018 - the same object the fixture holds, not a copy
    assert surgeon.api.case_and_model(THRESHOLD, threshold_model)[1] is threshold_model


def test_a_hugging_face_model_in_memory_gives_what_its_checkpoint_gives(tmp_path):
    """A transformers model object is converted as a checkpoint directory is; with it (and its tokenizer, when it
    was not loaded from files) the case needs no model of its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.checkpoints import make_llama

    path = make_llama(tmp_path / "llama")
    case = surgeon.load_case(LLAMA_CASE, model=str(path), check_model=False)
    case = replace(case, layers=None, items=case.items[:4] + case.items[-2:])
    by_name = surgeon.patch(case, str(path))
    hf = AutoModelForCausalLM.from_pretrained(str(path))
    from_files = surgeon.patch(case, hf)  # its tokenizer is read from the files it was loaded from
    np.testing.assert_allclose(from_files.per_item, by_name.per_item, atol=1e-5)
    orphan = replace(case, model=None)
    tok = AutoTokenizer.from_pretrained(str(path))
    given = surgeon.patch(orphan, (hf, tok))
    np.testing.assert_allclose(given.per_item, by_name.per_item, atol=1e-5)
    assert surgeon.diagnose(orphan, (hf, tok)).model == "(given in memory)"
    # a model object that was never saved has no tokenizer to find: the error says to pass one
    config = copy.deepcopy(hf.config)
    config._name_or_path = ""
    fresh = type(hf)(config)
    with pytest.raises(surgeon.SurgeonError, match="tokenizer") as e:
        surgeon.patch(orphan, fresh)
    assert "(hf_model, tokenizer)" in e.value.fix


def test_a_case_without_a_model_runs_on_the_model_given(decimal_model, tmp_path, capsys):
    src = tmp_path / "orphan.py"
    src.write_text("from surgeon import Case, Item\n"
                   "case = Case(name='orphan', formats={'plain': 'Which is bigger: {a} or {b}?\\nAnswer:',\n"
                   "    'qa': 'Q: Which is bigger: {a} or {b}?\\nA:'}, good='plain', bad='qa', layers=[2],\n"
                   "    items=[Item({'a': a, 'b': b}, correct=' ' + a, incorrect=' ' + b)\n"
                   "           for a, b in [('9.8', '9.11'), ('3.4', '3.25'), ('7.6', '7.55')]])\n")
    case = surgeon.load_case(src)  # valid without a model: it is checked against the one it runs on
    assert case.model is None
    r = surgeon.patch(case, decimal_model)
    assert r.per_item.shape == (1, 8, 3)
    with pytest.raises(surgeon.CaseError, match="names no model") as e:
        surgeon.patch(case)
    assert e.value.field == "model"
    # checked against the model in memory: a layer it lacks is refused before any work
    with pytest.raises(surgeon.CaseError, match=r"layer 5 is out of range"):
        surgeon.patch(replace(case, layers=[5]), decimal_model)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["patch", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "field 'model': the case names no model" in err and "--model" in err and not out.exists()
    assert main(["patch", str(src), "--model", "organism:decimal", "--out", str(out)]) == 0
    np.testing.assert_allclose(json.loads((out / "results.json").read_text())["result"]["per_item"], r.per_item,
                               atol=1e-6)


@pytest.mark.slow
def test_circuits_export_from_python(induction_model, tmp_path):
    r = surgeon.circuit("induction_organism", induction_model, method="eap", paths=0, verify=5)
    assert "circuit" in str(r) and "<svg" in r._repr_html_()
    r.export(tmp_path / "c.mib.json", tmp_path / "c.svg", tmp_path / "c.json")
    assert json.loads((tmp_path / "c.mib.json").read_text())["edges"]
    g = surgeon.read_circuit(tmp_path / "c.json")  # the one graph type, read back as the result holds it
    assert g.to_json() == r.graph().to_json() and sorted(g.circuit_names()) == sorted(r.names(r.circuit))
    ev = surgeon.circuit_eval("induction_organism", tmp_path / "c.mib.json", induction_model)
    assert ev["faithfulness"] == pytest.approx(r.circuit_faithfulness, abs=1e-6)


def test_bad_input_is_refused_by_the_api_as_by_the_cli():
    with pytest.raises(surgeon.AnalysisError, match="--ig-steps"):
        surgeon.circuit("induction_organism", method="eap-ig-masks", ig_steps=0)
    with pytest.raises(surgeon.SurgeonError):
        surgeon.diagnose(Path(ROOT) / "cases" / "no_such_case.py")


def test_the_docs_python_example_runs(tmp_path, monkeypatch):
    text = (Path(ROOT) / "docs" / "python.md").read_text()
    block = re.search(r"<!-- python example -->\n```python\n(.*?)```", text, re.S)
    assert block, "the Python page's example is marked <!-- python example -->"
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block.group(1), "docs/python.md", "exec"), scope)  # noqa: S102 - the docs' own example
    assert (tmp_path / "out" / "patch" / "results.json").exists()


def test_every_result_is_a_long_data_frame_holding_its_numbers(results):
    """`r.to_pandas()`: long format, named columns; the per-item values reshaped without a permutation (their means
    are the result's own means)."""
    import numpy as np

    for name, (r, _) in results.items():
        df = r.to_pandas()
        assert len(df.columns) and all(isinstance(c, str) for c in df.columns), name
        assert len(df) > 0 or (name == "sae_amplified" and not r.ranked), name
    d = results["diagnose"][0].to_pandas()
    for s in results["diagnose"][0].stats:
        if s.tag == "all":
            assert np.isclose(d[d.format == s.format].score.mean(), s.score.value)
    p, _ = results["patch"]
    means = p.to_pandas().groupby(["layer", "unit"]).score.mean()
    for li, L in enumerate(p.layers):
        np.testing.assert_allclose([means[(L, u)] for u in range(p.n_units)], p.score[li], rtol=1e-6)
    q, _ = results["patch_positions"]
    f = q.to_pandas()
    slot, unit = q.per_item.shape[1] - 1, q.per_item.shape[2] - 1
    got = f[(f.layer == q.layers[0]) & (f.slot == slot) & (f.unit == unit)].sort_values("item").score.to_numpy()
    np.testing.assert_array_equal(got, q.per_item[0, slot, unit])
    a, _ = results["attention"]
    fa = a.to_pandas()
    pat = a.patterns[-1]
    sub = fa[(fa["head"] == pat.head) & (fa["item"] == pat.item) & (fa["format"] == pat.format)]
    np.testing.assert_array_equal(sub.pivot(index="query", columns="key", values="weight").to_numpy(), pat.pattern)
    o, _ = results["sae_overlap"]
    fo = o.to_pandas()
    b = o.bad[0]
    assert np.isclose(fo[(fo.format == b) & (fo.metric == "overlap") & (fo.layer == o.layers[0])].value.mean(),
                      o.metrics[b]["overlap"][0].value)


# ------------------------------------------------------------------- issue 50: what Python callers could get wrong
def test_load_reads_only_what_is_whole_and_stays_in_its_folder(results, tmp_path):
    r, _ = results["patch"]
    saved = r.save(tmp_path / "p")
    man = json.loads((saved / "manifest.json").read_text())
    (saved / "manifest.json").unlink()
    with pytest.raises(surgeon.SurgeonError, match="holds no manifest.json"):
        surgeon.load(saved)
    (saved / "manifest.json").write_text("{garbage")
    with pytest.raises(surgeon.SurgeonError, match="manifest.json cannot be read"):
        surgeon.load(saved)
    (saved / "manifest.json").write_text(json.dumps({**man, "versions": {**man["versions"], "surgeon": "9.0.0"}}))
    with pytest.raises(surgeon.SurgeonError, match="another minor version of 0.x"):
        surgeon.load(saved)
    (saved / "manifest.json").write_text(json.dumps(man))
    assert str(surgeon.load(saved)) == str(r)
    # a report manifest whose step names reach outside the folder
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "manifest.json").write_text(json.dumps({"command": "report", "versions": man["versions"],
                                                   "report": {"case": "x", "model": "y", "steps": ["../../etc"]}}))
    with pytest.raises(surgeon.SurgeonError, match="not a folder inside it"):
        surgeon.load(rep)


@pytest.mark.parametrize("heads", ["L0H6", ["L0H6"], "6", [6], "L0H4,L0H6", ["L0H4", 6]])
def test_blend_takes_heads_as_every_other_analysis_writes_them(decimal_model, heads):
    r = surgeon.blend("decimal_organism", decimal_model, layer=0, heads=heads, step=0.25)
    want = ("L0H4", "L0H6") if "4" in str(heads) else ("L0H6",)
    assert tuple(r.units) == want
    with pytest.raises(surgeon.SurgeonError, match="is in layer 1, but the blend is at layer 0"):
        surgeon.blend("decimal_organism", decimal_model, layer=0, heads="L1H2")


def test_python_warns_like_the_command_line_when_the_failure_is_not_there(decimal_model, capsys):
    surgeon.patch("decimal_organism", decimal_model, tag="control", layers=[0])
    assert "the failure is not reproduced" in capsys.readouterr().err
    surgeon.patch("decimal_organism", decimal_model, layers=[0])
    assert "not reproduced" not in capsys.readouterr().err


def test_first_token_scoring_with_items_read_per_position_is_refused():
    import dataclasses

    from surgeon import Item

    case = dataclasses.replace(surgeon.api.read("decimal_organism"), score="first_token",
                               items=[Item({"a": "9.8", "b": "9.11"}, [" 9"], [" 1"], at=[-1])])
    with pytest.raises(surgeon.CaseError) as e:
        surgeon.api.read(case)
    assert e.value.field == "score" and "scored per position" in e.value.message


def test_generating_fewer_tokens_than_the_answers_need_is_refused_before_any_work(decimal_model):
    with pytest.raises(surgeon.SurgeonError) as e:
        surgeon.diagnose("decimal_organism", decimal_model, generate=1)
    assert e.value.field == "--generate" and "would be judged 'other'" in e.value.message and "or more" in e.value.fix
    with pytest.raises(surgeon.SurgeonError, match="judged 'other'"):
        surgeon.threshold("decimal_organism", decimal_model, layer=0, budget=2, generate=1)


def test_out_a_dangling_symlink_is_refused_before_any_step(tmp_path, capsys):
    from surgeon.cli import main

    link = tmp_path / "out"
    link.symlink_to(tmp_path / "missing" / "deeper")
    assert main(["diagnose", "--out", str(link)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and "does not exist" in err and "Traceback" not in err
