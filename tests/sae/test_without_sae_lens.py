"""Without a working sae-lens (absent, or installed beside TransformerLens 4, which sae-lens 6 does not support, so
that it fails at import), every route to an SAE refuses with one clear error that names sae-lens and the line that
installs it, exit 2 and no traceback, before any model loads: the CLI's SAE commands, the Python API, training, and
the organisms' planted SAEs; every analysis that needs no SAE still runs. A stand-in package earlier on the path
plays each kind of missing sae-lens in a fresh process."""
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

STAND_INS = {
    "absent": "raise ModuleNotFoundError(\"No module named 'sae_lens'\", name='sae_lens')\n",
    "broken": "raise ImportError(\"cannot import name 'HookedTransformer' from 'transformer_lens' "
              "('HookedTransformer' was removed in TransformerLens 4.0)\")\n",
}
CASE = os.path.join(ROOT, "cases", "decimal_organism.py")


def _env(tmp_path, kind):
    pkg = tmp_path / kind / "sae_lens"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_INS[kind])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / kind), ROOT]), "OMP_NUM_THREADS": "1"}


def _cli(env, *args):
    return subprocess.run([sys.executable, "-m", "surgeon", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


@pytest.mark.parametrize("kind,commands", [
    ("absent", [["sae", "overlap", CASE, "--layers", "0"]]),
    ("broken", [["sae", "train", CASE, "--steps", "2"], ["feature-circuit", CASE, "--layers", "0"]]),
])
def test_the_sae_commands_refuse_with_the_install_line(tmp_path, kind, commands):
    env = _env(tmp_path, kind)
    for i, cmd in enumerate(commands):
        out = tmp_path / f"out{i}"
        r = _cli(env, *cmd, "--out", str(out))
        assert r.returncode == 2, (cmd, r.stderr[-2000:])
        assert "needs sae-lens" in r.stderr and "pip install 'sae-lens" in r.stderr and "field 'sae-lens'" in r.stderr
        assert ("is not installed" if kind == "absent" else "was removed in TransformerLens 4.0") in r.stderr
        assert "Traceback" not in r.stderr and not out.exists()
    if kind == "broken":  # what needs no SAE runs
        r = _cli(env, "diagnose", CASE, "--out", str(tmp_path / "d"))
        assert r.returncode == 0, r.stderr[-2000:]


def test_the_python_routes_refuse_with_the_install_line(tmp_path):
    script = """
import surgeon
from surgeon.errors import SurgeonError
from surgeon.organisms.chain import planted_saes
from surgeon.organisms.threshold import planted_sae
from surgeon.api import case_and_model
case, model = case_and_model(%r)
for name, call in [("overlap", lambda: surgeon.sae_overlap(case, model, layers=[0])),
                   ("chain", lambda: planted_saes(model)), ("threshold", lambda: planted_sae(model))]:
    try:
        call()
    except SurgeonError as e:
        assert "needs sae-lens" in str(e) and "pip install 'sae-lens" in str(e), str(e)
        print(name, "refused")
""" % CASE
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(tmp_path, "absent"),
                       timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:3] == ["overlap refused", "chain refused", "threshold refused"]
