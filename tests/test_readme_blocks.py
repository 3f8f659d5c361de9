"""The README's own-model block, run here: its `surgeon` lines, in order, on a checkpoint with Llama-3.1-8B's
layout (32 layers, 32 query heads sharing 8 key/value heads) and tiny widths, on the CPU, with the case copied
as the block copies it. What cannot run here is left out and said: the clone, torch's CUDA build, the login
and the download (the stand-in replaces the downloaded checkpoint through --model)."""
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoints import make_llama
from tests.conftest import ROOT

ROOT = Path(ROOT)


def own_model_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "hf download" in b)
    return [ln.split("#")[0].strip() for ln in block.splitlines() if ln.strip()]


def test_the_block_is_what_the_issue_asks_for():
    lines = own_model_block()
    first = [ln.split()[0] + " " + ln.split()[1] for ln in lines]
    for step in ("git clone", "pip install", "hf auth", "hf download", "cp cases/llama31_decimal.py", "surgeon diagnose",
                 "surgeon patch", "surgeon circuit"):
        assert any(f.startswith(step.split()[0]) and step in ln for f, ln in zip(first, lines)), step
    assert any("--device cuda" in ln for ln in lines) and any("--bad chat" in ln for ln in lines)
    assert any("--export" in ln for ln in lines)


@pytest.mark.slow
def test_the_own_model_block_runs_on_a_standin(tmp_path):
    standin = make_llama(tmp_path / "llama-3.1-standin", n_layers=32, n_heads=32, n_kv_heads=8, hidden=256)
    work = tmp_path / "work"
    work.mkdir()
    ran = []
    for line in own_model_block():
        argv = shlex.split(line)
        if argv[0] == "cp":
            shutil.copy(ROOT / argv[1], work / argv[2])
            continue
        if argv[0] != "surgeon":
            continue  # git, pip, hf: not here (no network); the stand-in is the downloaded checkpoint
        # the GPU's choices become the CPU's: bfloat16 matrix products are slow on a CPU
        argv = [{"cuda": "cpu", "bfloat16": "float32"}.get(a, a) for a in argv] + ["--model", str(standin)]
        if argv[1] == "circuit":
            argv += ["--verify", "5", "--paths", "2"]  # fewer exact checks than the default, on 2 CPU cores
        r = subprocess.run([sys.executable, "-m", "surgeon", *argv[1:]], cwd=work, capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, (line, r.stderr[-3000:])
        ran.append(argv[1])
    assert ran == ["diagnose", "patch", "circuit"]
    assert (work / "circuit.mib.json").stat().st_size > 0 and (work / "circuit.tex").stat().st_size > 0
