"""The README's own-model block, run here: its `surgeon` lines, in order, on checkpoints with Llama's layout and
tiny widths (see the test for which), on the CPU, with the case copied as the block copies it. What cannot run here is left out and said: the clone, torch's CUDA build, the login
and the download (the stand-in replaces the downloaded checkpoint through --model)."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkpoints import make_llama
from tests.conftest import ROOT

ROOT = Path(ROOT)
# glibc keeps freed blocks up to 1 GiB in the process instead of unmapping them (speed only: the same numbers)
KEEP_FREED = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(2**30), MALLOC_TRIM_THRESHOLD_=str(2**30))


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
    """diagnose and patch run on Llama-3.1-8B's layout; the circuit of a 32-layer, 32-head model has about a million
    edges, hours on 2 CPU cores, so it runs on the 2-layer Llama (grouped-query attention) of the other tests, with
    the copied case's `layers` edited to that model as a user edits the case for theirs. The stand-in's widths are
    the smallest that keep the layout (a head of 2 dimensions, rotary's least); its time goes to attention, 32 heads
    over 96-item batches, whose score tensors (tens of MB) glibc hands back to the kernel on every free and faults in
    again on the next forward: the commands run with glibc told to keep them (88 s of patching becomes 53 s here), and
    on a quarter of the case's items."""
    standin = make_llama(tmp_path / "llama-3.1-standin", n_layers=32, n_heads=32, n_kv_heads=8, hidden=64)
    tiny = make_llama(tmp_path / "tiny-llama")
    work = tmp_path / "work"
    work.mkdir()
    ran = []
    for line in own_model_block():
        argv = shlex.split(line)
        if argv[0] == "cp":
            # the items edited as the block's comment says a user does: 16 traps and 8 controls, a quarter of the
            # shipped 96, so that 1,024 heads patched on 2 cores take seconds, not minutes
            text = (ROOT / argv[1]).read_text()
            for shipped, fewer in (("for _ in range(63)]", "for _ in range(15)]"),
                                   ("for _ in range(32)]", "for _ in range(8)]")):
                assert text.count(shipped) == 1, shipped
                text = text.replace(shipped, fewer)
            (work / argv[2]).write_text(text)
            continue
        if argv[0] != "surgeon":
            continue  # git, pip, hf: not here (no network); the stand-in is the downloaded checkpoint
        # the GPU's choices become the CPU's: bfloat16 matrix products are slow on a CPU
        argv = [{"cuda": "cpu", "bfloat16": "float32"}.get(a, a) for a in argv]
        model = standin
        if argv[1] == "circuit":
            case = work / argv[2]
            small = case.with_name("mine_2_layers.py")
            text = case.read_text()
            assert "layers=list(range(32))" in text
            small.write_text(text.replace("layers=list(range(32))", "layers=[0, 1]"))
            argv[2], model = small.name, tiny
        r = subprocess.run([sys.executable, "-m", "surgeon", *argv[1:], "--model", str(model)], cwd=work,
                           capture_output=True, text=True, timeout=900, env=KEEP_FREED)
        assert r.returncode == 0, (line, r.stderr[-3000:])
        ran.append(argv[1])
    assert ran == ["diagnose", "patch", "circuit"]
    assert (work / "circuit.mib.json").stat().st_size > 0 and (work / "circuit.tex").stat().st_size > 0
