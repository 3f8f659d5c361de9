"""Rerun every bench on this tree and regenerate the blocks that show them (README.md and docs/*.md).

Each bench runs in its own fresh process with `--save` (bench/results/NAME.txt is what it printed, NAME.json the
commit, the engine's sources and the organism weights it ran on), one after the other so that none slows another;
then the README and the docs pages render the new outputs (`docs/readme.py`'s fast path: the bench blocks and the
line under each saying which commit it ran on and whether the code it times (bench/saving.py: the engine, the sites, the case scoring and its SOURCES) has changed since).
A bench that fails stops the run before anything is rendered; its earlier results are kept.

    python bench/all.py [--only NAME ...] [--skip NAME ...] [--stale]

`--stale` reruns only the benches whose saved result predates the code it times (bench/saving.py: the engine, the
sites and the bench's SOURCES), the ones tests/test_bench.py names.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# cheapest first, so that a broken bench shows before the long ones run
BENCHES = ("startup", "attribution", "circuit_recovery", "heldout", "scan", "patch_sweep", "ray_search", "subset_search", "install",
           "bridge", "memory", "growth", "edges", "peer_auto_circuit", "features", "scale")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=BENCHES, metavar="NAME", help=f"of {', '.join(BENCHES)}")
    ap.add_argument("--skip", nargs="+", choices=BENCHES, default=[], metavar="NAME")
    ap.add_argument("--stale", action="store_true", help="only those whose result predates the code it times")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from saving import stale

    names = [b for b in (args.only or BENCHES) if b not in args.skip and not (args.stale and not stale(b))]
    if args.stale:
        print(f"== stale: {', '.join(names) or 'none'}", flush=True)
    for name in names:
        print(f"== bench/{name}.py --save", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, str(HERE / f"{name}.py"), "--save"], cwd=ROOT).returncode
        print(f"== bench/{name}.py: exit {rc} after {time.perf_counter() - t0:.0f} s", flush=True)
        if rc:
            return rc
    env = {**os.environ, "PYTHONPATH": str(ROOT / "docs"), "SURGEON_README": "check"}
    pages = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))]
    return subprocess.run([sys.executable, "-m", "cogapp", "-r", "-I", "docs", "README.md", *pages], cwd=ROOT,
                          env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
