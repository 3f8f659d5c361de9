"""How big and how long a fresh install is: a new virtual environment, the pinned torch, then surgeon
(and then its test extras), each step timed, the environment's size measured after each. Saves
bench/results/install.txt (the README and the docs render it).

    python bench/install.py --save

What it measures is this machine's: torch comes from whatever index pip is configured with here (a CPU
build where a local mirror provides one)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write bench/results/install.txt")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="surgeon-install-") as tmp:
        venv = Path(tmp) / "venv"
        py = venv / "bin" / "python"
        steps = [("python -m venv", [sys.executable, "-m", "venv", str(venv)]),
                 ("pip install torch==2.13.0", [str(py), "-m", "pip", "install", "-q", "torch==2.13.0"]),
                 ("pip install -e .", [str(py), "-m", "pip", "install", "-q", "-e", str(ROOT)]),
                 ('pip install -e ".[test]"', [str(py), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"])]
        rows = []
        for label, cmd in steps:
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            rows.append((label, time.perf_counter() - t0, size(venv)))
        torch_build = subprocess.run([str(py), "-c", "import torch; print(torch.__version__, "
                                      "'CUDA ' + torch.version.cuda if torch.version.cuda else 'CPU only')"],
                                     capture_output=True, text=True, check=True).stdout.strip()
    lines = [f"fresh install on this machine (Python {sys.version.split()[0]}; torch {torch_build})",
             f"{'step':28s} {'time':>8s} {'environment after':>18s}"]
    for label, dt, nbytes in rows:
        lines.append(f"{label:28s} {dt:7.0f}s {nbytes / 1e9:15.2f} GB")
    sys.path.insert(0, str(ROOT / "bench"))
    from saving import saved

    with saved("install", args.save):
        print("\n".join(lines))
        from limit import limit_only

        print(limit_only("this bench times installs (downloads and unpacking)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
