"""`--save` for the benches: what a bench prints is also written to bench/results/NAME.txt, which the README
renders verbatim (docs/readme.py), so a number in the README is always one a bench printed. NAME.json records what
the run ran on: the commit, whether the package or the bench scripts had uncommitted changes, the sha256 of the
engine's, the sites' and the case scoring's sources (ENGINE: surgeon/engine, surgeon/sites, surgeon/case's scoring),
of the other sources the bench times (SOURCES) and of the organism weights."""
from __future__ import annotations

import contextlib
import hashlib
import io
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent
# a change here makes every saved bench result stale: the engine and the site kinds the engine and the benches run
# (a site kind no bench runs, e.g. surgeon/sites/sinks.py, is left out: tests/test_bench.py checks that every site
# module the engine, a bench or a source a bench times imports is listed); the case's scoring every bench times
# (surgeon/case: how items become rows, the metrics, the formats picked, the sizes parsed). surgeon/case/case.py (the Case's fields, its checks and its content digest) and
# case/shipped.py (where shipped case files are found) only refuse a case or record it, so they are left out.
ENGINE = ("surgeon/engine", "surgeon/sites/__init__.py", "surgeon/sites/ablations.py", "surgeon/sites/edges.py",
          "surgeon/sites/features.py", "surgeon/sites/head_input_grads.py", "surgeon/sites/nodes.py",
          "surgeon/sites/protocol.py", "surgeon/sites/qk_fix.py", "surgeon/case/encoding.py",
          "surgeon/case/metrics.py", "surgeon/case/select.py", "surgeon/case/sizes.py")
# the circuit code the scale/growth/memory/edges/circuit-recovery benches run (scores, runs, graph, pruning);
# surgeon/circuits/export.py (file formats and drawing) is imported with it but never runs in them
# (tests/test_bench.py checks that by tracing), so a change to how a circuit is written leaves their numbers alone
_CIRCUIT = ("surgeon/analyses/circuit.py", "surgeon/analyses/circuit_runs.py", "surgeon/analyses/scoring.py",
            "surgeon/analyses/common.py", "surgeon/circuits/__init__.py", "surgeon/circuits/graph.py",
            "surgeon/circuits/methods.py", "surgeon/circuits/prune.py")
# Beyond ENGINE, the code whose work or numbers each bench times and prints (files or folders): a change there makes
# that bench's saved result stale. The bench scripts themselves are not in it (a result says whether they differed
# from its commit when it ran, `run_record`).
SOURCES = {
    "attribution": ("surgeon/analyses/attribution.py", "surgeon/analyses/patching.py", "surgeon/analyses/scoring.py",
                    "surgeon/analyses/common.py", "surgeon/circuits/methods.py"),
    # the bridge adapter and how the API wraps a bridge, beside the circuit code and the per-head sweep it times
    "bridge": _CIRCUIT + ("surgeon/models/bridge.py", "surgeon/api.py", "surgeon/analyses/patching.py"),
    "circuit_recovery": _CIRCUIT,
    "edges": _CIRCUIT,
    "features": ("surgeon/analyses/planning.py", "surgeon/analyses/feature_circuit.py",
                 "surgeon/analyses/feature_edges.py", "surgeon/analyses/scoring.py", "surgeon/analyses/common.py"),
    # bench/gpu.py: run on a lent GPU, never by bench/all.py (no GPU where CI runs), so its result can be older than
    # the code it times: the README and docs say so beside its numbers rather than fail (tests/test_bench.py)
    "gpu": _CIRCUIT + ("surgeon/analyses/repair.py", "surgeon/repairs", "surgeon/models/loading.py"),  # model_digest
    "growth": _CIRCUIT,
    "heldout": ("surgeon/analyses/heldout.py", "surgeon/search/subsets.py", "surgeon/analyses/threshold.py",
                "surgeon/search/shards.py", "surgeon/threads.py",
                "surgeon/circuits/export.py") + _CIRCUIT,  # discover() checks its output paths there
    "install": ("pyproject.toml",),
    "memory": _CIRCUIT,
    "patch_sweep": (),
    "peer_auto_circuit": _CIRCUIT,  # surgeon's side: edge_scores and the engine's exact edges; the peer's own venv
    "ray_search": ("surgeon/search", "surgeon/analyses/threshold.py", "surgeon/analyses/common.py",
                   "surgeon/threads.py"),
    "scale": _CIRCUIT,
    "scan": ("surgeon/analyses/scan.py", "surgeon/case/grammar.py", "surgeon/analyses/diagnose.py",
             "surgeon/analyses/heldout.py"),
    "startup": ("surgeon/__init__.py", "surgeon/api.py", "surgeon/cli", "surgeon/case", "surgeon/analyses/diagnose.py"),
    "subset_search": ("surgeon/search/subsets.py", "surgeon/search/store.py", "surgeon/analyses/common.py",
                      "surgeon/threads.py"),  # the threads between chunks
}


def _sha256(paths, root: Path) -> str:
    """sha256 over the relative paths and bytes of `paths` (a folder: every .py file under it)."""
    h = hashlib.sha256()
    for p in paths:
        for f in sorted((root / p).rglob("*.py")) if (root / p).is_dir() else [root / p]:
            h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def engine_sha256(root: Path = ROOT) -> str:
    """sha256 over the paths and bytes of every .py file in ENGINE (the code every bench times)."""
    return _sha256(ENGINE, root)


def sources_sha256(name: str, root: Path = ROOT) -> str:
    """sha256 over ENGINE and the bench's SOURCES: everything under surgeon/ whose change moves its numbers."""
    return _sha256(ENGINE + SOURCES[name], root)


def stale(name: str) -> bool:
    """Whether bench `name`'s saved result is missing or ran on other code than it would time now (its record's
    sources_sha256 is not today's)."""
    import json

    f = RESULTS / f"{name}.json"
    return not f.exists() or json.loads(f.read_text())["run"].get("sources_sha256") != sources_sha256(name)


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def run_record(name: str) -> dict:
    """What bench `name`'s saved result ran on (its commit, a dirty tree said as such, the engine's sources and the
    other sources it times)."""
    return {"commit": _git("rev-parse", "HEAD") or None,
            # the package or the bench scripts themselves differ from the commit named
            "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no", "--", "surgeon",
                                             "bench/*.py")),
            "engine_sha256": engine_sha256(),
            "sources_sha256": sources_sha256(name),
            "date": time.strftime("%Y-%m-%d")}


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
def saved(name: str, save: bool, organisms=(), data: dict | None = None):
    """Within the block, stdout also goes to bench/results/NAME.txt (written only if the block finishes), and
    bench/results/NAME.json records the sha256 of the organism weights the run used, what the run ran on, and
    `data` (filled by the block: the bench's raw measurements, where it keeps them)."""
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
    record = {"organisms": prov, "run": run_record(name), **(data or {})}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def best_of(repeats: int, fn):
    """The fastest of `repeats` runs of `fn` (seconds) and the last run's result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out
