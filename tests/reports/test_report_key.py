"""`surgeon report` reuses a finished step only when everything that changes its numbers is the same: the options,
the case file, the model's weights and config, its dtype, the SAEs, the versions. Each is changed here once, and
the step must run again; and every single step runs on its own."""
import json
import shutil
from dataclasses import replace

import pytest
import torch

import surgeon
from surgeon.analyses.pipeline import STEPS


@pytest.fixture
def model_copy():
    from surgeon.models.loading import load_model

    return load_model("organism:decimal")


def _diagnose(tmp_path, model, case="decimal_organism", **kw):
    return surgeon.report(case, model, out=tmp_path / "rep", steps=["diagnose"], **kw)


@pytest.mark.slow
def test_a_changed_model_reruns_the_step(tmp_path, model_copy):
    first = _diagnose(tmp_path, model_copy)
    assert first.reused == []
    again = _diagnose(tmp_path, model_copy)
    assert again.reused == ["diagnose"]  # nothing changed: reused
    acc = first.steps["diagnose"].get("plain").score.value
    with torch.no_grad():  # every weight zeroed in place: the same object, other numbers
        for w in model_copy.parameters():
            w.zero_()
    zeroed = _diagnose(tmp_path, model_copy)
    assert zeroed.reused == [] and zeroed.steps["diagnose"].get("plain").score.value != acc


@pytest.mark.slow
def test_dtype_case_sae_and_version_are_in_the_key(tmp_path, model_copy, monkeypatch):
    _diagnose(tmp_path, model_copy)
    assert _diagnose(tmp_path, model_copy.to(torch.float64)).reused == []  # another dtype
    model_copy.to(torch.float32)
    assert _diagnose(tmp_path, model_copy).reused == []
    # the same case with other items: its content differs (however it was made)
    case = surgeon.api.read("decimal_organism")
    assert _diagnose(tmp_path, model_copy, case=replace(case, items=case.items[1:])).reused == []
    assert _diagnose(tmp_path, model_copy).reused == []
    # the SAEs: a case naming SAE directories whose files change
    sae_root = tmp_path / "saes"
    shipped = surgeon.api.read("decimal_organism").saes
    assert shipped and "dir" in shipped
    src = shipped["dir"]
    from pathlib import Path

    import glob

    for d in glob.glob(src.replace("{layer}", "*")):
        shutil.copytree(d, sae_root / Path(d).name)
    with_saes = replace(case, saes={"dir": str(sae_root / Path(src).name)})
    assert _diagnose(tmp_path, model_copy, case=with_saes).reused == []
    assert _diagnose(tmp_path, model_copy, case=with_saes).reused == ["diagnose"]
    cfg = next(sae_root.glob("*/cfg.json"))
    cfg.write_text(cfg.read_text() + " ")
    assert _diagnose(tmp_path, model_copy, case=with_saes).reused == []
    # the version of surgeon
    import surgeon.api as api

    real = api.versions
    monkeypatch.setattr(api, "versions", lambda: dict(real(), surgeon="999"))
    assert _diagnose(tmp_path, model_copy, case=with_saes).reused == []


@pytest.mark.slow
def test_an_unreadable_step_file_reruns_the_step(tmp_path, model_copy):
    _diagnose(tmp_path, model_copy)
    meta = tmp_path / "rep" / "diagnose" / "step.json"
    for garbage in ("{not json", json.dumps([1, 2]), json.dumps({"type": "NoSuchResult", "options": {}})):
        meta.write_text(garbage)
        assert _diagnose(tmp_path, model_copy).reused == []


@pytest.mark.slow
@pytest.mark.parametrize("step", [s for s in STEPS if s != "sae"])
def test_every_single_step_runs_alone(tmp_path, step, decimal_model):
    rep = surgeon.report("decimal_organism", decimal_model, out=tmp_path / step, steps=[step], budget=20, verify=5,
                         paths=2)
    assert step in rep.steps and (tmp_path / step / "report.html").is_file()
