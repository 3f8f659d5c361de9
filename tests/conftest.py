import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# pytest-xdist (pyproject's addopts: a worker per core): each worker, and the commands its tests start, runs torch on
# one thread, so the workers do not share cores with their own threads (surgeon/threads.py says why that is slow)
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if WORKER:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"

import pytest
import torch

torch.set_num_threads(1 if WORKER else min(2, os.cpu_count() or 1))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def charset():
    from surgeon.organisms.charset import build_tokenizer

    return build_tokenizer()


def tiny_model(tok, **over):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = dict(n_layers=3, d_model=32, n_heads=4, d_head=8, n_ctx=64, d_vocab=len(tok), act_fn="gelu",
               normalization_type="LN", seed=0)
    cfg.update(over)
    torch.manual_seed(0)
    m = HookedTransformer(HookedTransformerConfig(**cfg), tokenizer=tok)
    m.eval()
    return m


# random HookedTransformers of several architectures (standard LN + learned positions; GQA + rotary + RMS)
ARCHS = {
    "gpt2like": dict(),
    "llamalike_gqa": dict(normalization_type="RMS", positional_embedding_type="rotary", n_key_value_heads=2,
                          act_fn="silu", gated_mlp=True, rotary_dim=8),
}


@pytest.fixture(scope="session", params=sorted(ARCHS))
def random_model(request, charset):
    return tiny_model(charset, **ARCHS[request.param])


@pytest.fixture(scope="session")
def decimal_model():
    from surgeon.models.loading import load_model

    return load_model("organism:decimal")


@pytest.fixture(scope="session")
def threshold_model():
    from surgeon.models.loading import load_model

    return load_model("organism:threshold")


@pytest.fixture(scope="session")
def induction_model():
    from surgeon.models.loading import load_model

    return load_model("organism:induction")


@pytest.fixture(scope="session")
def decimal_case():
    from surgeon import load_case

    return load_case(os.path.join(ROOT, "cases", "decimal_organism.py"))


def _tree_state() -> str | None:
    """`git status --porcelain` of the repository, untracked and ignored files included (an out/ folder is
    ignored by git but still written where it was not asked), bytecode and pip's caches left out; None outside
    a git checkout."""
    import subprocess

    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--ignored"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    caches = ("__pycache__/", ".pytest_cache/", ".egg-info/", ".venv")  # Python's and pip's own, not results
    return "\n".join(ln for ln in r.stdout.splitlines() if not any(c in ln for c in caches))


def _recorded_durations() -> dict[str, float]:
    """Each of the slowest tests' time in the last timed run of the suite (docs/timings.json's "suite-slowest", written
    by `python docs/readme.py --suite-only`), by node id; {} where none is recorded."""
    import json

    try:
        rows = json.loads(open(os.path.join(ROOT, "docs", "timings.json")).read()).get("suite-slowest") or []
    except (OSError, ValueError):
        return {}
    out: dict[str, float] = {}
    for sec, _phase, node in rows:
        out[node] = out.get(node, 0.0) + float(sec)
    return out


def pytest_collection_modifyitems(config, items):
    """The files holding the slowest tests of the last timed run first (the file of the longest test first), each
    file's tests in their own order, then the other files in theirs: pytest-xdist hands the tests out in this order,
    so a long test does not start last and leave one worker running alone at the end, and a file's tests stay
    together (a module-scoped fixture, e.g. a report built once for a file's tests, is not built again between
    them). The same order in every worker (xdist compares their collections); only the order changes."""
    took = _recorded_durations()
    if not took:
        return
    longest: dict[str, float] = {}
    for it in items:
        f = it.nodeid.split("::")[0]
        longest[f] = max(longest.get(f, 0.0), took.get(it.nodeid, 0.0))
    items[:] = sorted(items, key=lambda it: -longest[it.nodeid.split("::")[0]])  # stable: the rest keep their order


def pytest_sessionstart(session):
    if not WORKER:  # once, in the process that runs or hands out the tests
        session.config._surgeon_tree = _tree_state()


def pytest_sessionfinish(session, exitstatus):
    """The suite leaves the working tree as it found it (issue 33: no results.json, manifest.json, figures or
    out/ folders written into the repository by a test); a test that writes there fails the run."""
    if WORKER:
        return
    before = getattr(session.config, "_surgeon_tree", None)
    after = _tree_state()
    if before is None or after is None or before == after:
        return
    new = sorted(set(after.splitlines()) - set(before.splitlines()))
    if not new:
        return
    import sys

    print("\nthe working tree changed while the tests ran (a test must write under tmp_path; if another command wrote "
          "these at the same time, e.g. mkdocs build into site/ or a surgeon run with --out, rerun the suite alone):\n  "
          + "\n  ".join(new), file=sys.stderr)
    session.exitstatus = 1

