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
