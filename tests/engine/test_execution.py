"""Which execution path the engine took is recorded, with the reason a faster one was not taken, in the
contrast, in every result that patches and in its manifest."""
import json

import pytest
import torch

from surgeon import load_case
from surgeon.analyses.common import make_contrast
from surgeon.cli import main
from surgeon.sites.edges import EdgeSite
from surgeon.sites.nodes import Site
from tests.conftest import ROOT

THRESHOLD = f"{ROOT}/cases/threshold_organism.py"
INDUCTION = f"{ROOT}/cases/induction_organism.py"


def test_paths_and_reasons_are_recorded(induction_model):
    case = load_case(INDUCTION)
    c, _ = make_contrast(case, induction_model)
    assert c.execution["prefix"].startswith("shared")
    lo, hi = Site.of("z", 0), Site.of("z", 1)
    c.run({lo: torch.eye(2)[[0, 0, 1, 1, 0, 1]], hi: torch.rand(6, 2)})  # 2 lower-layer masks for 6 patches
    assert c.execution["paths"] == {"grouped": 1}
    c.run({lo: torch.ones(1, 2, requires_grad=True), hi: torch.ones(1, 2)})
    assert c.execution["why"] == {"not grouped: gradients w.r.t. the masks": 1}
    site = EdgeSite.of(induction_model.cfg)
    one_by_one = torch.eye(len(site.edges))[[0, len(site.edges) - 1]]  # an edge from the input, one into the logits
    c.run({site: one_by_one})
    assert c.execution["paths"]["split by first layer"] == 1
    assert c.execution["why"]["not grouped: edges sites do not group"] >= 1


def test_prefix_copied_says_why(induction_model):
    from surgeon.analyses.common import format_rows
    from surgeon.engine.contrast import Contrast

    case = load_case(INDUCTION)
    items = case.items[:4]
    b, s = (format_rows(case, induction_model, f, items) for f in (case.bad_formats[0], case.good))
    assert Contrast(induction_model, b, s, case.align, shared_prefix=False).execution["prefix"] == \
        "copied per patch (asked for)"


@pytest.mark.slow
def test_results_and_manifest_record_the_execution(tmp_path):
    out = tmp_path / "patch"
    assert main(["patch", THRESHOLD, "--layers", "0", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())["result"]
    man = json.loads((out / "manifest.json").read_text())
    assert man["execution"] == res["execution"]
    assert man["execution"]["paths"] == {"plain": 1} and man["execution"]["prefix"].startswith("shared")
    assert man["execution"]["backoffs"] == 0 and man["execution"]["batch_size"] == 256


def test_cpu_out_of_memory_halves_the_batch_and_is_recorded(induction_model):
    """Family 3: the CPU allocator's out-of-memory error is retried with half the batch like CUDA's; the scores
    are those of an unhindered run and the manifest's execution record says how often it backed off."""
    case = load_case(INDUCTION)
    c, _ = make_contrast(case, induction_model, batch_size=64)
    masks = {Site.of("z", 1): torch.eye(2)[[0, 1, 0, 1]]}
    want = c.run(masks)

    def scarce(module, args):
        if args[0].shape[0] > 8:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    handle = induction_model.blocks[1].register_forward_pre_hook(scarce)
    try:
        got = c.run(masks)
    finally:
        handle.remove()
    torch.testing.assert_close(got, want)
    assert c.execution["backoffs"] >= 1 and c.execution["batch_size"] < 64
    handle = induction_model.blocks[1].register_forward_pre_hook(
        lambda m, a: (_ for _ in ()).throw(RuntimeError("some other failure")))
    try:
        with pytest.raises(RuntimeError, match="some other failure"):  # not memory: not retried
            c.run(masks)
    finally:
        handle.remove()


# ---------------------------------------------------------------------------------------------- memory and items
def _decimal_contrast(model, n_traps: int, **kw):
    """qa -> plain on `n_traps` held-out trap pairs of the decimal organism (as many as asked: drawn afresh)."""
    from surgeon import Item
    from surgeon.analyses.common import format_rows
    from surgeon.engine.contrast import Contrast
    from surgeon.organisms import decimal as organism

    case = load_case(f"{ROOT}/cases/decimal_organism.py")
    items = [Item({"a": p.a, "b": p.b}, correct=f" {p.decimal_winner}",
                  incorrect=f" {p.b if p.decimal_winner == p.a else p.a}", tag="trap")
             for p in organism.pairs("trap", "test", n_traps, seed=1)]
    b, s = (format_rows(case, model, f, items) for f in ("qa", "plain"))
    return Contrast(model, b, s, case.align, **kw)


def test_caches_past_the_budget_are_recomputed_and_give_the_same_numbers(decimal_model):
    """Family 3: rows sit in buckets of at most batch_size; with no room for caches every bucket recomputes its
    activations on each call, and every call (patches, edges, gradients, deltas, activations) returns what the
    fully cached contrast returns."""
    from surgeon.engine.rows import nbytes

    kept = _decimal_contrast(decimal_model, 40, batch_size=16)
    tight = _decimal_contrast(decimal_model, 40, batch_size=16, cache_bytes=0)
    assert len(kept.buckets) >= 3 and all(b.n <= 16 for b in kept.buckets)
    edges = EdgeSite.of(decimal_model.cfg)
    z1 = Site.of("z", 1)
    calls = [
        lambda c: c.run({z1: torch.eye(8)[:5]}),
        lambda c: c.run({edges: torch.eye(len(edges.edges))[[0, 7, len(edges.edges) - 1]]}),
        lambda c: c.run({edges: (torch.rand(3, len(edges.edges), generator=torch.Generator().manual_seed(0)) > .5)
                         .float()}),
        lambda c: c.gradient({edges: torch.full((2, len(edges.edges)), 0.5)})[0][edges],
        lambda c: c.deltas([z1])[z1],
        lambda c: c.activations(z1, "base"),
    ]
    for call in calls:
        torch.testing.assert_close(call(tight), call(kept), atol=2e-5, rtol=1e-5)
        assert sum(nbytes(b) for b in tight.buckets) == 0
    assert tight.execution["caches_recomputed"] > 0 and kept.execution["caches_recomputed"] == 0
    assert sum(nbytes(b) for b in kept.buckets) > 0


def test_gradient_back_propagates_each_chunk_like_one_backward_of_the_whole_run(decimal_model):
    c = _decimal_contrast(decimal_model, 40, batch_size=16)
    edges, z0 = EdgeSite.of(decimal_model.cfg), Site.of("z", 0)
    for site, mask in ((edges, torch.linspace(0.1, 0.9, 3)[:, None].repeat(1, len(edges.edges))),
                       (z0, torch.zeros(1, 8))):
        m = mask.clone().requires_grad_(True)
        with torch.enable_grad():
            whole = c.run({site: m})
            whole.mean(1).sum().backward()
        grads, scores = c.gradient({site: mask})
        torch.testing.assert_close(grads[site], m.grad, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(scores, whole.detach())
        assert mask.grad is None and not scores.requires_grad


PEAK = """
import resource, sys, torch
from surgeon.models.loading import load_model
from surgeon.analyses.circuit import edge_scores, faithfulness_curve
from surgeon.analyses.circuit_runs import CircuitRuns
from surgeon.sites.edges import EdgeSite
from tests.engine.test_execution import _decimal_contrast
torch.set_num_threads(1)
model = load_model("organism:decimal")
c = _decimal_contrast(model, int(sys.argv[1]), cache_bytes=16 * 2**20, batch_size=32)
site = EdgeSite.of(model.cfg)
scores = edge_scores(c, site, "eap-ig-masks", 5)
runs = CircuitRuns(c, site, c, site, "kept", "resample", {})  # the circuits run on the same rows
faithfulness_curve(runs, (-abs(torch.tensor(scores))).argsort().numpy())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


@pytest.mark.slow
def test_memory_does_not_grow_with_the_number_of_items():
    """Family 3: EAP-IG's gradients and the faithfulness curve over 8x the items in fresh processes: peak memory
    grows by at most 40 MB (before streaming, 1.2 MB per item: about 540 MB more here; 10,000 items passed 6 GB).
    Caches are capped at 16 MB, rows sit in buckets of batch_size, and each chunk of rows is back-propagated as
    soon as it is scored: the peak is set by the batch, not by the items."""
    import os
    import subprocess
    import sys

    def peak(n):
        # large blocks from mmap, so the peak is what the tensors needed, not what glibc's heap kept after freeing
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        out = subprocess.run([sys.executable, "-c", PEAK, str(n)], cwd=ROOT, capture_output=True, text=True,
                             check=True, env=env).stdout
        return int(out.split()[-1])

    small, large = peak(64), peak(512)
    print(f"peak memory: 64 items {small} MB, 512 items {large} MB")
    assert large - small < 40, (small, large)
