"""The smoke tier (`python -m pytest -q -m smoke`, about a minute): the README's quick start, as a newcomer runs it
after an install, from an empty folder: `surgeon diagnose`, `surgeon patch`, and a repair applied in Python."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.smoke


def _surgeon(*args, cwd):
    r = subprocess.run([sys.executable, "-m", "surgeon", *args], capture_output=True, text=True, cwd=cwd)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_quick_start_commands(tmp_path):
    out = _surgeon("diagnose", cwd=tmp_path)
    assert "REPRODUCED" in out
    out = _surgeon("patch", cwd=tmp_path)
    assert "repair fraction" in out
    assert not any(tmp_path.iterdir())  # printed only: nothing written where it ran


def test_a_repair_applied_in_python(tmp_path):
    code = ("import surgeon\n"
            "case, model = surgeon.case_and_model('decimal_organism')\n"
            "r = surgeon.repair(case, model, heads='L0H0,L0H1,L0H4,L0H6,L1H2,L1H5,L2H0,L2H3')\n"
            "print(r.efficacy('qa').repaired.n)\n"
            "with surgeon.apply(model, r.repair):\n"
            "    print(model.generate('Q: Which is bigger: 9.8 or 9.11?\\nA:', max_new_tokens=5, do_sample=False,"
            " verbose=False))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[0] == "32" and "A: 9.8" in r.stdout
