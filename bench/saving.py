"""`--save` for the benches: what a bench prints is also written to bench/results/NAME.txt, which the README
renders verbatim (docs/readme.py), so a number in the README is always one a bench printed."""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self):
        for st in self.streams:
            st.flush()


@contextlib.contextmanager
def saved(name: str, save: bool, organisms=()):
    """Within the block, stdout also goes to bench/results/NAME.txt (written only if the block finishes), and
    bench/results/NAME.json records the sha256 of the organism weights the run used."""
    if not save:
        yield
        return
    buf = io.StringIO()
    old = sys.stdout
    sys.stdout = _Tee(old, buf)
    try:
        yield
    finally:
        sys.stdout = old
    import json

    from surgeon.organisms import weights_sha256

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.txt").write_text(buf.getvalue())
    prov = {o: {"model": f"organism:{o}", "model_sha256": weights_sha256(o)} for o in organisms}
    (RESULTS / f"{name}.json").write_text(json.dumps({"organisms": prov}, indent=1, sort_keys=True) + "\n")
