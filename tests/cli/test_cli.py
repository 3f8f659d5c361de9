"""The CLI end to end on the decimal organism: what the README shows."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.cli_in_process import surgeon as surgeon_cli

CASE = f"{ROOT}/cases/decimal_organism.py"


def run(*args):
    return surgeon_cli([*args], cwd=ROOT)


def test_help_does_not_import_heavy_libraries():
    code = "import sys, surgeon.cli; surgeon.cli.build_parser(); print(sorted(m for m in ('torch', 'transformer_lens', 'sae_lens', 'transformers') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.slow
def test_diagnose_reproduces_the_failure(tmp_path):
    r = run("diagnose", CASE, "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "failure in 'qa' on trap items: REPRODUCED" in r.stdout
    res = json.loads((tmp_path / "results.json").read_text())["result"]
    man = json.loads((tmp_path / "manifest.json").read_text())
    import hashlib

    import torch

    assert man["case"]["sha256"] == hashlib.sha256(open(CASE, "rb").read()).hexdigest()
    assert man["case"]["file"] == CASE and man["case"]["model"] == "organism:decimal"
    assert man["versions"]["torch"] == torch.__version__ and man["seed"] == 0
    assert man["device"] == "cpu" and man["dtype"] == "float32" and man["command"] == "diagnose"
    assert man["model"]["kind"] == "organism" and man["model"]["n_layers"] == 3 and man["model"]["n_kv_heads"] == 2
    assert (tmp_path / "accuracy.png").stat().st_size > 1000
    stats = {(s["format"], s["tag"]): s for s in res["stats"]}
    assert stats[("plain", "trap")]["accuracy"]["n"] == 64
    assert stats[("plain", "trap")]["accuracy"]["value"] > stats[("qa", "trap")]["accuracy"]["hi"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".staging")]


@pytest.mark.slow
def test_patch_heatmap_and_outputs(tmp_path):
    r = run("patch", CASE, "--layers", "0-2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "repair fraction per layer" in r.stdout
    res = json.loads((tmp_path / "results.json").read_text())["result"]
    assert len(res["fraction"]) == 3 and len(res["fraction"][0]) == 8
    assert (tmp_path / "heatmap.png").exists()


@pytest.mark.slow
def test_bad_option_values_exit_cleanly(tmp_path):
    r = run("patch", CASE, "--layers", "7")
    assert r.returncode == 2 and "out of range" in r.stderr and "Traceback" not in r.stderr
    r = run("patch", CASE, "--layers", "x")
    assert r.returncode == 2 and "--layers" in r.stderr
    r = run("patch", CASE, "--tag", "nope")
    assert r.returncode == 2 and "tag" in r.stderr


@pytest.mark.slow
def test_attribute_command(tmp_path):
    r = run("attribute", CASE, "--layers", "1", "--compare", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "Pearson r =" in r.stdout and (tmp_path / "attribution.png").exists()
    res = json.loads((tmp_path / "results.json").read_text())["result"]
    assert len(res["estimate"]) == 1 and len(res["estimate"][0]) == 8


@pytest.mark.slow
@pytest.mark.parametrize("name", ["decimal_organism", "induction_organism", "threshold_organism"])
def test_manifest_model_fields_are_the_loaded_model(name):
    """Every model field a manifest records equals the model as loaded (the decimal organism has 2 key/value
    heads for its 8 query heads; a manifest once said 8)."""
    from surgeon import load_case
    from surgeon.models.loading import load_model
    from surgeon.reports.text import model_info

    case = load_case(f"{ROOT}/cases/{name}.py")
    cfg = load_model(case.model).cfg
    info = model_info(case)
    assert info == {"spec": case.model, "kind": "organism", "path": info["path"], "n_layers": cfg.n_layers,
                    "n_heads": cfg.n_heads, "n_kv_heads": cfg.n_key_value_heads or cfg.n_heads,
                    "d_model": cfg.d_model, "attn_only": bool(cfg.attn_only)}
    assert info["path"].endswith(name.split("_")[0])
