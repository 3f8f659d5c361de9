"""Regenerate the exported circuits of the shipped organism cases (run from the repository root):

    python circuits/regenerate.py [--out circuits]

Each case runs `surgeon circuit` with the options below, one thread (the numbers are then the same on every
run), and writes every export format plus the printed report (`NAME.txt`); the figures the documentation site
shows are copied into docs/ (`DOCS_FIGURES`). `tests/circuits/test_circuits.py` runs
the same commands into a temporary folder and fails when the files here differ (stale circuits).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

SHIPPED = {
    "decimal_organism": ["--paths", "5"],
    "induction_organism": ["--paths", "5"],
    "threshold_organism": ["--paths", "5", "--faithfulness", "1.0"],
}
FORMATS = ("graphml", "gexf", "json", "mib.json", "dot", "tex", "png", "svg", "pdf")
# the figures the documentation site shows, copied beside its pages (a page reads nothing from the network)
DOCS = Path(__file__).resolve().parent.parent / "docs"
DOCS_FIGURES = ("induction_organism.png",)


def command(name: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "surgeon", "circuit", f"cases/{name}.py", *SHIPPED[name], "--threads", "1",
            "--export", *[str(out / f"{name}.{f}") for f in FORMATS]]


def regenerate(name: str, out: Path, run_command=None) -> str:
    """Write the exports of case `name` into `out` and its report to `out/NAME.txt`; returns the report.
    `run_command(argv)` runs `surgeon` with the arguments after it and returns a `subprocess.CompletedProcess`
    (default: `python -m surgeon` in a new process; the test runs the same `main` in its own)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = command(name, out)
    run = (subprocess.run(cmd, capture_output=True, text=True) if run_command is None
           else run_command(cmd[cmd.index("surgeon") + 1:]))
    if run.returncode:
        raise SystemExit(f"{name}: surgeon circuit failed:\n{run.stderr}")
    report = "".join(line for line in run.stdout.splitlines(keepends=True) if not line.startswith("exported "))
    (out / f"{name}.txt").write_text(report)
    return report


def write_provenance(out: Path, names) -> None:
    """circuits/provenance.json: the sha256 of the organism weights each shipped circuit was made from."""
    import json

    from surgeon.organisms import weights_sha256

    path = out / "provenance.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    for name in names:
        organism = name.removesuffix("_organism")
        data[name] = {"model": f"organism:{organism}", "model_sha256": weights_sha256(organism)}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent)
    ap.add_argument("cases", nargs="*", default=list(SHIPPED), help=f"default: {', '.join(SHIPPED)}")
    args = ap.parse_args()
    for name in args.cases:
        regenerate(name, args.out)
        print(f"{name}: {', '.join(f'{name}.{f}' for f in (*FORMATS, 'txt'))} in {args.out}")
    write_provenance(args.out, args.cases)
    if args.out.resolve() == Path(__file__).resolve().parent:
        import shutil

        for f in DOCS_FIGURES:
            shutil.copyfile(args.out / f, DOCS / f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
