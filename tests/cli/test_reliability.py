"""Reliability families: bad input gets exit 2 and one message naming the file or option, the field and the
fix, before the model loads wherever the input can be checked without it; nothing is left behind."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from surgeon.cli import main
from tests.conftest import ROOT

THRESHOLD = f"{ROOT}/cases/threshold_organism.py"
DECIMAL = f"{ROOT}/cases/decimal_organism.py"

CASE = '''from surgeon import Case, Item
case = Case(name="t", model="organism:threshold", formats={formats}, good="plain", bad=["qa"],
            items=[Item({{"x": "a", "y": "b"}}, correct="a", incorrect="b"),
                   Item({{"x": "c", "y": "d"}}, correct="c", incorrect="d")]{extra})
'''
OK_FORMATS = '{"plain": "{x} or {y}:", "qa": "{x} or {y}?"}'


def refused(capsys, argv, *phrases):
    """Exit 2 (from argparse or the command), one message, no traceback, every phrase in it."""
    code, err = code_of(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    for p in phrases:
        assert p in err, (p, err)
    return err


def code_of(capsys, argv):
    try:
        return main(argv), capsys.readouterr().err
    except SystemExit as e:
        return e.code, capsys.readouterr().err


# family 6: case content that parses but cannot mean anything
@pytest.mark.parametrize("formats,extra,field,phrase", [
    ('{"plain": "{x} or {y}:", "qa": ""}', "", "formats['qa']", "is empty"),
    ('{"plain": "{x} or {y}:", "qa": "{x:>5} or {y}?"}', "", "formats['qa']", "with a spec or conversion"),
    ('{"plain": "{x} or {y}:", "qa": "{x!r} or {y}?"}', "", "formats['qa']", "with a spec or conversion"),
    ('{"plain": "{x} or {y}:", "qa": "which one?"}', "", "formats['qa']", "has no placeholders"),
    ('{"plain": "{x} or {y}:", "qa": "{x} or {y}?", 3: "{x}"}', "", "formats", "is not a format name"),
    (OK_FORMATS, ", prepend_bos='yes'", "prepend_bos", "is a str"),
    (OK_FORMATS, ", layers=0", "layers", "not a list of layers"),
    ('{"plain": "{x} or {y}:", "qa": "{x} or {y}?" + " pad" * 40}', "", "items[0]", "longer than the model's context"),
])
def test_case_content_that_cannot_mean_anything(tmp_path, capsys, formats, extra, field, phrase):
    f = tmp_path / "case.py"
    f.write_text(CASE.format(formats=formats, extra=extra))
    code, err = code_of(capsys, ["diagnose", str(f), "--out", str(tmp_path / "out")])
    assert code == 2 and "Traceback" not in err, err
    assert str(f) in err and f"field '{field}'" in err and phrase in err and "fix:" in err, err
    assert not (tmp_path / "out").exists()


# family 3: absurd sizes, refused by what the model and the case allow
@pytest.mark.slow
@pytest.mark.parametrize("argv,phrases", [
    (["diagnose", THRESHOLD, "--seed", str(10 ** 23)], ["--seed", "between 0 and 4294967295"]),
    (["diagnose", THRESHOLD, "--n-devices", "2", "--device", "cpu"], ["--n-devices", "the device is cpu"]),
    (["diagnose", THRESHOLD, "--generate", "500"], ["--generate", "pass the model's context", "fix: use --generate"]),
    (["circuit", THRESHOLD, "--edges", str(10 ** 9)], ["--edges", "more than the model's"]),
    (["sae", "overlap", THRESHOLD, "--top-k", "100000"], ["--top-k", "is not below the SAE's"]),
    (["diagnose", THRESHOLD, "--out", ""], ["--out is empty"]),
])
def test_absurd_sizes_are_refused(capsys, argv, phrases):
    code, err = code_of(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    for p in phrases:
        assert p in err, (p, err)


# families 8 and 9: late errors, leftovers, locks that follow no symlink
def test_a_planted_lock_symlink_is_not_followed(tmp_path, capsys):
    target = tmp_path / "elsewhere" / "created-by-surgeon"
    target.parent.mkdir()
    (tmp_path / ".out.surgeon-lock").symlink_to(target)
    code, err = code_of(capsys, ["diagnose", THRESHOLD, "--out", str(tmp_path / "out")])
    assert code == 2 and "is a symbolic link" in err and "Traceback" not in err
    assert not target.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_no_lock_file_is_left_and_another_command_leaves_no_files_of_its_own(tmp_path):
    out = tmp_path / "out"
    run = lambda *a: subprocess.run([sys.executable, "-m", "surgeon", *a], capture_output=True, text=True,
                                    cwd=tmp_path)
    r = run("blend", THRESHOLD, "--layer", "0", "--component", "z", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "blend.png").exists()
    r = run("patch", THRESHOLD, "--layers", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    man = json.loads((out / "manifest.json").read_text())
    assert man["command"] == "patch" and sorted(os.listdir(out)) == sorted(man["files"])
    assert not (out / "blend.png").exists()  # the old command's figure is gone with its manifest
    assert [p.name for p in tmp_path.iterdir() if "surgeon-lock" in p.name] == []


@pytest.mark.slow
def test_threshold_writes_only_with_out_and_groups_files_are_read_as_lists(tmp_path, capsys):
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"mine": "L0H0"}))
    err = refused_code(capsys, ["threshold", THRESHOLD, "--layer", "0", "--groups-file", str(groups),
                                "--out", str(tmp_path / "t")])
    assert "field '--groups-file['mine']'" in err and "not a non-empty list of head labels" in err
    groups.write_text(json.dumps(["L0H0"]))
    err = refused_code(capsys, ["threshold", THRESHOLD, "--layer", "0", "--groups-file", str(groups),
                                "--out", str(tmp_path / "t")])
    assert "a groups file holds a JSON object of groups" in err
    assert not (tmp_path / "t").exists()
    r = subprocess.run([sys.executable, "-m", "surgeon", "threshold", THRESHOLD, "--layer", "0", "--groups", "none",
                        "--budget", "10"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "threshold k*" in r.stdout and "wrote" not in r.stdout
    assert list(tmp_path.iterdir()) == [groups]  # no --out: printed only, nothing written (issue 33 item 8)
    r = subprocess.run([sys.executable, "-m", "surgeon", "threshold", THRESHOLD, "--layer", "0", "--resume"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "--resume needs the search's folder" in r.stderr and "Traceback" not in r.stderr


def refused_code(capsys, argv):
    code, err = code_of(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    return err


@pytest.mark.slow
def test_a_full_disk_is_reported_and_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    """Family 7: the disk fills up after the first chunk: exit 2 with the fix, the finished chunk kept, no hidden
    temporary file, and --resume then finishes the search."""
    import errno

    import numpy as np

    real, calls = np.savez, {"n": 0}

    def full(path, **arrays):
        calls["n"] += 1
        if calls["n"] > 1:
            open(path, "wb").write(b"partial")  # what a full disk leaves of a file
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, **arrays)

    out = tmp_path / "t"
    argv = ["threshold", THRESHOLD, "--layer", "0", "--groups", "none", "--budget", "120", "--chunk", "32",
            "--out", str(out)]
    monkeypatch.setattr(np, "savez", full)
    code, err = code_of(capsys, argv)
    assert code == 2 and "No space left on device" in err and "--resume continues" in err and "Traceback" not in err
    parts = out / "parts"
    assert list(parts.glob(".chunk-*")) == [] and len(list(parts.glob("chunk-*.npz"))) == 1
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(np, "savez", real)
    code, err = code_of(capsys, [*argv, "--resume"])
    assert code == 0, err
    assert json.loads((out / "manifest.json").read_text())["command"] == "threshold"


# ---- reliability, third round (issue 36) ----
INDUCTION = f"{ROOT}/cases/induction_organism.py"


@pytest.mark.parametrize("content,field", [
    ({"result": {"circuit": [0], "edge_names": ["input->logits"], "options": "kept"}}, "result.options"),
    ({"result": {"circuit": [0], "edge_names": ["input->logits"], "options": [1]}}, "result.options"),
    ({"result": {"circuit": [0], "edge_names": ["input->logits"], "options": {"semantics": [1]}}},
     "result.options.semantics"),
    ({"edges": [{"name": "input->logits", "in_circuit": True}], "graph": "kept"}, "graph"),
    ({"edges": [{"name": "input->logits", "in_circuit": True}], "graph": [1]}, "graph"),
    ({"edges": {"input->logits": {"in_graph": True}}, "cfg": [2, 4]}, "cfg"),
    ({"edges": {"input->logits": {"in_graph": True}}, "semantics": {"x": 1}}, "semantics"),
])
def test_circuit_files_of_the_wrong_shape_are_refused(tmp_path, capsys, content, field):
    f = tmp_path / "c.json"
    f.write_text(json.dumps(content))
    refused(capsys, ["circuit-eval", INDUCTION, str(f)], str(f), f"field '{field}'")


@pytest.mark.parametrize("name", ["a0.h1->a1.h2<k>->logits", "a0.h1->a1.h2.k<k>", "a0.h1->a1.h2<q><k>",
                                  "a0.h1.h0->a1.h2<v>", "a0.h1->a1.h2<k", "a0.h1->a1<k>"])
def test_grouped_query_edge_names_that_are_not_edges_are_refused(tmp_path, random_model, name):
    """Names EAP-IG would not write, on a model with grouped key/value heads (where per-query-head k/v names are
    read): one error naming the edge, never an unpacking traceback."""
    import surgeon

    if random_model.cfg.n_key_value_heads is None:
        pytest.skip("the grouped-query model is the other parameter")
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"edges": {name: {"in_graph": True, "score": 0.1}}}))
    case = surgeon.load_case(DECIMAL, check_model=False)
    with pytest.raises(surgeon.SurgeonError) as e:
        surgeon.circuit_eval(case, f, random_model)
    assert e.value.field == "edges" and name[:40] in e.value.message


def test_models_that_do_not_fit_the_case_are_refused_from_python(charset):
    """A model whose vocabulary is smaller than the tokenizer's ids, and one without a tokenizer: refused with the
    case named and the fix, before any work; (HookedTransformer, tokenizer) runs."""
    from dataclasses import replace

    import surgeon
    from tests.conftest import tiny_model

    case = replace(surgeon.load_case("decimal_organism", check_model=False), model=None)
    small = tiny_model(charset, d_vocab=50)
    with pytest.raises(surgeon.SurgeonError) as e:
        surgeon.diagnose(case, small)
    assert e.value.field == "model" and "vocabulary holds ids 0..49" in e.value.message
    bare = tiny_model(charset)
    bare.tokenizer = None
    with pytest.raises(surgeon.SurgeonError) as e:
        surgeon.diagnose(case, bare)
    assert e.value.field == "model" and "no tokenizer" in e.value.message and "(model, tokenizer)" in e.value.fix
    assert surgeon.diagnose(case, (bare, charset)).stats[0].accuracy.n == len(case.items)


@pytest.mark.parametrize("argv,phrase", [
    (["patch", "--layers", ""], "names no layer"),
    (["patch", "--layers", ",,"], "names no layer"),
    (["patch", "--layers", "0-99999999999"], "runs past any model's layers"),
    (["patch", "--max-memory", "1e400"], "more than any device holds"),
    (["patch", "--max-memory", "10000000TB"], "more than any device holds"),
    (["circuit", "--max-memory", "1e30"], "more than any device holds"),
])
def test_option_values_past_reason_are_refused(capsys, argv, phrase):
    refused(capsys, argv, phrase)


def test_a_layer_named_twice_runs_once_and_says_so(capsys):
    assert main(["patch", "--layers", "0,0"]) == 0
    out, err = capsys.readouterr()
    assert "--layers 0,0 names layer 0 more than once; each layer runs once" in err
    assert "L1H" not in out and out.count("L0H0 ") == 1


def test_an_sae_whose_k_exceeds_its_width_is_refused(tmp_path, capsys):
    import shutil

    src = f"{ROOT}/surgeon/organisms/saes/decimal"
    shutil.copytree(src, tmp_path / "saes")
    for cfg in (tmp_path / "saes").glob("*/cfg.json"):
        c = json.loads(cfg.read_text())
        c["k"] = 1000
        cfg.write_text(json.dumps(c))
    refused(capsys, ["sae", "quality", DECIMAL, "--sae-dir", str(tmp_path / "saes" / "blocks.{layer}.hook_mlp_out")],
            "keeps k = 1000 features of its 256", "field '--sae-dir'")


@pytest.fixture(scope="module")
def search_dirs(tmp_path_factory):
    """A finished subset search on the induction organism in two shards and as one run."""
    root = tmp_path_factory.mktemp("search")
    argv = ["threshold", INDUCTION, "--layer", "1", "--groups", "none", "--budget", "10", "--chunk", "1"]
    assert main([*argv, "--out", str(root / "one")]) == 0
    for i in (0, 1):
        assert main([*argv, "--shard", f"{i}/2", "--out", str(root / f"s{i}")]) == 0
    return root, argv


def _result(path):
    """The search's numbers (what ran to get them, `execution`, differs between a resume and one run)."""
    r = json.loads((path / "results.json").read_text())["result"]
    r.pop("execution", None)
    return r


def test_resume_folders_that_were_tampered_with(search_dirs, tmp_path, capsys):
    import shutil

    import numpy as np

    root, argv = search_dirs
    capsys.readouterr()
    # parts/ is a file
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "parts").write_text("x")
    refused(capsys, [*argv, "--out", str(tmp_path / "a"), "--resume"], "is a file, not the folder", "delete")
    # a chunk named with letters
    shutil.copytree(root / "one", tmp_path / "b")
    shutil.copy(tmp_path / "b" / "parts" / "chunk-000000.npz", tmp_path / "b" / "parts" / "chunk-abc.npz")
    refused(capsys, [*argv, "--out", str(tmp_path / "b"), "--resume"], "chunk-abc.npz", "has no chunk number")
    # chunks without their arrays, with NaN scores, of the wrong shape: evaluated again, the result a clean run's
    shutil.copytree(root / "one", tmp_path / "c")
    parts = tmp_path / "c" / "parts"
    with np.load(parts / "chunk-000001.npz") as z:
        masks, scores = z["masks"], z["scores"]
    np.savez(parts / "chunk-000000.npz", masks=masks)
    np.savez(parts / "chunk-000001.npz", masks=masks, scores=scores * np.nan)
    np.savez(parts / "chunk-000002.npz", masks=masks[:, :1], scores=scores)
    assert main([*argv, "--out", str(tmp_path / "c"), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "has no scores array" in err and "not finite" in err and "this search has" in err
    assert _result(tmp_path / "c") == _result(root / "one")


def test_merge_refuses_bad_chunks_and_folders_given_twice(search_dirs, tmp_path, capsys):
    import shutil

    import numpy as np

    root, _ = search_dirs
    capsys.readouterr()
    refused(capsys, ["merge", str(root / "s0"), str(root / "s0"), "--out", str(tmp_path / "m0")], "is given twice")
    refused(capsys, ["merge", str(root / "s0"), str(root / "s1"), "--out", str(root / "s1")],
            "is one of the shards being merged")
    shutil.copytree(root / "s1", tmp_path / "s1")
    chunk = sorted((tmp_path / "s1" / "parts").glob("chunk-*.npz"))[0]
    with np.load(chunk) as z:
        masks = z["masks"]
    np.savez(chunk, masks=masks)
    refused(capsys, ["merge", str(root / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m1")],
            str(chunk), "has no scores array", "rerun that shard with --resume")
    assert not (tmp_path / "m1").exists()
    assert main(["merge", str(root / "s0"), str(root / "s1"), "--out", str(tmp_path / "m2")]) == 0
    assert _result(tmp_path / "m2") == _result(root / "one")


@pytest.mark.slow
def test_a_full_disk_while_saving_an_sae_leaves_the_old_one_and_says_so(tmp_path, capsys, monkeypatch):
    """safetensors reports a full disk as its own error type: one message, exit 2, the SAE already there kept."""
    from sae_lens import TrainingSAE

    out = tmp_path / "saes"
    assert main(["sae", "train", DECIMAL, "--layers", "0", "--steps", "1", "--sae-out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in (out / "blocks.0.hook_mlp_out").iterdir()}

    class SafetensorError(Exception):
        pass

    def full(self, path, *a, **k):
        (Path(path) / "sae_weights.safetensors").write_bytes(b"half")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr(TrainingSAE, "save_inference_model", full)
    capsys.readouterr()
    code = main(["sae", "train", DECIMAL, "--layers", "0", "--steps", "2", "--sae-out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and "Traceback" not in err, err
    assert {p.name: p.read_bytes() for p in (out / "blocks.0.hook_mlp_out").iterdir()} == before
    assert sorted(p.name for p in out.iterdir()) == ["blocks.0.hook_mlp_out"]  # no temporary folder left


def test_a_model_in_memory_with_nan_or_scaled_weights_is_refused(charset):
    """NaN q weights or q weights scaled by 1e30 give plausible-looking scores (attention saturates or turns to
    zeros): refused before any work, naming the tensor, as a checkpoint's are."""
    from dataclasses import replace

    import torch

    import surgeon
    from tests.conftest import tiny_model

    case = replace(surgeon.load_case("decimal_organism", check_model=False), model=None)
    for value, phrase in ((float("nan"), "holds NaN or infinite values"), (1e30, "past any trained model's")):
        m = tiny_model(charset)
        with torch.no_grad():
            m.blocks[0].attn.W_Q.mul_(value)
        with pytest.raises(surgeon.SurgeonError) as e:
            surgeon.diagnose(case, m)
        assert "blocks.0.attn.W_Q" in e.value.message and phrase in e.value.message


@pytest.mark.slow
def test_a_checkpoint_that_asks_to_run_its_own_code_is_refused_even_when_answered_yes(tmp_path):
    """A config.json that names custom code (auto_map) would make transformers ask on a terminal whether to run it;
    surgeon never lets a checkpoint run code: refused with exit 2, the code never imported, whatever stdin says."""
    from tests.checkpoints import make_gpt2

    ckpt = make_gpt2(tmp_path / "remote")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(model_type="surgeon_remote_test", auto_map={"AutoConfig": "configuration_remote.RemoteConfig",
                                                           "AutoModelForCausalLM": "modeling_remote.RemoteModel"})
    (ckpt / "config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "code-ran"
    for name in ("configuration_remote.py", "modeling_remote.py"):
        (ckpt / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    r = subprocess.run([sys.executable, "-m", "surgeon", "diagnose", DECIMAL, "--model", str(ckpt)], input="y\ny\n",
                       capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and "field 'model'" in r.stderr, r.stderr
    assert "surgeon never runs code from a checkpoint" in r.stderr
    assert not marker.exists()


def test_ig_steps_given_to_a_method_that_does_not_integrate_is_said(capsys, monkeypatch):
    """Said before anything loads (the model loader is not reached in this test)."""
    def stop(args, **kwargs):
        raise SystemExit(0)

    for module in ("circuit", "patching"):  # where the circuit and attribute commands live
        monkeypatch.setattr(f"surgeon.cli.{module}.load_case_and_model", stop)
    for argv, method in ((["circuit", "--method", "eap", "--ig-steps", "7"], "eap"),
                         (["attribute", "--ig-steps", "7"], "gradient")):
        with pytest.raises(SystemExit):
            main(argv)
        assert f"--ig-steps 7 is ignored: --method {method} does not integrate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["circuit", "--method", "eap-ig-masks", "--ig-steps", "7"])
    assert "ignored" not in capsys.readouterr().err


def test_groups_files_with_repeated_heads_or_identical_groups(tmp_path, capsys):
    from surgeon.search.subsets import read_groups

    f = tmp_path / "g.json"
    f.write_text(json.dumps({"mine": ["L1H0", "L1H0", "L1H1"]}))
    assert read_groups(f) == {"mine": ["L1H0", "L1H1"]}
    assert "group 'mine' lists L1H0 more than once; each head counts once" in capsys.readouterr().err
    f.write_text(json.dumps({"a": ["L1H0", "L1H1"], "b": ["L1H1", "L1H0"]}))
    refused(capsys, ["threshold", INDUCTION, "--layer", "1", "--groups-file", str(f)], "groups 'a' and 'b' hold the same heads",
            "field '--groups-file['b']'")


def test_a_top_k_past_half_the_sae_is_refused(capsys):
    refused(capsys, ["sae", "overlap", DECIMAL, "--top-k", "255"], "is more than half the SAE's 256 features",
            "field '--top-k'")


def test_a_float16_overflow_never_yields_a_plausible_score():
    """MLP outputs scaled past float16's range (weights still far below the absurd bound): the residual stream
    turns to inf and NaN, and the run is refused rather than scored."""
    import torch

    import surgeon
    from surgeon.models.loading import load_model

    m = load_model("organism:decimal", dtype="float16")
    with torch.no_grad():
        for b in m.blocks:
            b.mlp.W_out.mul_(30000)
    with pytest.raises(surgeon.SurgeonError) as e:
        surgeon.diagnose("decimal_organism", m)
    assert "not finite" in e.value.message and "bfloat16" in e.value.fix
