"""Reliability, family 4: an SAE is checked against the layer it is used at, the model's width and its own
weights before any feature is read."""
import json
import shutil

import pytest

from surgeon.cli import main
from surgeon.organisms import sae_dir
from tests.conftest import ROOT

DECIMAL = f"{ROOT}/cases/decimal_organism.py"


def copy_saes(tmp_path):
    d = tmp_path / "saes"
    shutil.copytree(sae_dir("decimal"), d)
    return d


def edit_cfg(d, layer, **meta):
    f = d / f"blocks.{layer}.hook_mlp_out" / "cfg.json"
    cfg = json.loads(f.read_text())
    for k, v in meta.items():
        if k == "hook_name":
            cfg["metadata"]["hook_name"] = v
        else:
            cfg[k] = v
    f.write_text(json.dumps(cfg))


def nan_weights(d, layer):
    from safetensors.torch import load_file, save_file

    f = d / f"blocks.{layer}.hook_mlp_out" / "sae_weights.safetensors"
    w = load_file(str(f))
    w["W_dec"][0, 0] = float("nan")
    save_file(w, str(f))


@pytest.mark.parametrize("breakage,phrase", [
    ("layer", "was trained on blocks.2.hook_mlp_out (layer 2) but is used at layer 1"),
    ("hook", "which is not a residual, MLP-output or attention-output hook point"),
    ("nan", "the SAE's W_dec holds NaN or infinite values"),
])
def test_an_sae_that_does_not_fit_is_refused(tmp_path, capsys, breakage, phrase):
    d = copy_saes(tmp_path)
    if breakage == "layer":
        edit_cfg(d, 1, hook_name="blocks.2.hook_mlp_out")
    elif breakage == "hook":
        edit_cfg(d, 1, hook_name="blocks.1.attn.hook_q")
    else:
        nan_weights(d, 1)
    code = main(["sae", "amplified", DECIMAL, "--layer", "1", "--sae-dir", str(d / "blocks.{layer}.hook_mlp_out")])
    err = capsys.readouterr().err
    assert code == 2 and phrase in err and "field '--sae-dir'" in err and "Traceback" not in err, err


def test_an_sae_of_another_width_is_refused(tmp_path):
    from surgeon.errors import SurgeonError
    from surgeon.sae.load import SAESource, load_sae

    d = copy_saes(tmp_path)
    with pytest.raises(SurgeonError, match="the SAE reads vectors of width 64, but the model writes 128"):
        load_sae(SAESource(path=str(d / "blocks.{layer}.hook_mlp_out")), 1, d_model=128)
    assert load_sae(SAESource(path=str(d / "blocks.{layer}.hook_mlp_out")), 1, d_model=64).cfg.d_sae == 256


@pytest.mark.parametrize("how,phrase", [("file", "exists and is a file"), ("readonly", "is not writable"),
                                        ("k", "is not below the dictionary's")])
def test_sae_train_refuses_before_training(tmp_path, capsys, how, phrase):
    import os

    out = tmp_path / "saes"
    extra = []
    if how == "file":
        out.write_text("x")
    elif how == "readonly":
        ro = tmp_path / "ro"
        ro.mkdir()
        os.chmod(ro, 0o555)
        out = ro / "saes"
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root): a read-only folder cannot be made")
    else:
        extra = ["--k", "10000"]
    code = main(["sae", "train", DECIMAL, "--layers", "0", "--steps", "1", "--sae-out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2 and phrase in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv,phrase", [
    (["sae", "overlap", f"{ROOT}/cases/induction_organism.py"], "names no SAEs and none were given"),
    (["sae", "overlap", DECIMAL, "--sae-dir", "/nonexistent/blocks.{layer}.hook_mlp_out"], "no SAE directory matches"),
    (["sae", "amplified", DECIMAL, "--layer", "1", "--sae-dir", "/nonexistent/x{layer}"], "is not an SAE directory"),
])
def test_sae_sources_are_checked_before_the_model_loads(capsys, monkeypatch, argv, phrase):
    import surgeon.models.loading as loading

    def never(*a, **k):
        raise AssertionError("the model was loaded before the SAE source was checked")

    monkeypatch.setattr(loading, "load_model", never)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and phrase in err and "Traceback" not in err, err
