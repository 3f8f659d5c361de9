"""Memory plans: the predicted weights equal the tensors a model holds, the predicted forward passes equal the
engine's count, a tight budget lowers the batch size or refuses before the work, and above the
weights the predicted peak is within 30% of the measured one, and never more than 15% under it, on shapes held out of
the fit of its constants."""
import json
import os
import subprocess
import sys

import pytest
import torch

from surgeon.analyses import planning
from surgeon.analyses.common import make_contrast
from surgeon.cli import main
from surgeon.engine import memory
from surgeon.errors import AnalysisError
from surgeon.models.loading import load_model
from surgeon.sites.nodes import Site
from surgeon.case.encoding import format_rows
from tests.checkpoints import make_gpt2, make_llama
from tests.conftest import ROOT


@pytest.mark.parametrize("maker", [make_gpt2, make_llama])
def test_weights_from_the_config_are_the_tensors_the_model_holds(maker, tmp_path):
    model = load_model(str(maker(tmp_path / "m")))
    assert memory.weights_bytes(model.cfg) == memory.model_bytes(model)


def test_weights_of_an_organism_and_in_bfloat16(decimal_model):
    assert memory.weights_bytes(decimal_model.cfg) == memory.model_bytes(decimal_model)
    half = load_model("organism:decimal", dtype="bfloat16")
    assert memory.weights_bytes(half.cfg) == memory.model_bytes(half)


def _rows(case, model):
    items = case.items_for(case.focus)
    return format_rows(case, model, case.bad_formats[0], items), format_rows(case, model, case.good, items)


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [256, 16, 5])
def test_predicted_forward_passes_are_the_engine_s(decimal_case, decimal_model, batch_size):
    """Per-head patching and a subset search, each at several batch sizes (several buckets, chunks of patches):
    the forward passes the plan predicts are those the engine counts."""
    cfg, H = decimal_model.cfg, decimal_model.cfg.n_heads
    base, source = _rows(decimal_case, decimal_model)
    layers = list(range(cfg.n_layers))
    c, _ = make_contrast(decimal_case, decimal_model, batch_size=batch_size, sites=[Site.of("z", L) for L in layers])
    with torch.no_grad():
        for L in layers:
            c.run({Site.of("z", L): torch.eye(H)})
    p = memory.predict_rows(cfg, base, source, decimal_case.align, memory.per_head(cfg), batch_size)
    assert p.forwards == c.execution["forwards"] > 2 * len(c.buckets)
    c, _ = make_contrast(decimal_case, decimal_model, batch_size=batch_size, sites=[Site.of("z", 1)])
    masks = (torch.rand(700, H, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    with torch.no_grad():
        for lo in range(0, 700, 256):
            c.run({Site.of("z", 1): masks[lo: lo + 256]})
    p = memory.predict_rows(cfg, base, source, decimal_case.align, memory.subsets(cfg, 1, 700, 256), batch_size)
    assert p.forwards == c.execution["forwards"]


def test_a_tight_budget_lowers_the_batch_size_and_an_impossible_one_refuses(decimal_case, decimal_model):
    full, _ = planning.plan_patch(decimal_case, decimal_model, batch_size=256, max_memory="64GiB")
    assert full.batch_size == 256 and full.peak < 64 * 2**30
    one = memory.plan(decimal_model.cfg, *_rows(decimal_case, decimal_model), decimal_case.align,
                      memory.per_head(decimal_model.cfg), batch_size=1, budget=2**40,
                      weights=memory.model_bytes(decimal_model))
    # a budget between batch size 1's peak and batch size 256's: the largest power of two that fits
    budget = (one.peak + full.peak) // 2
    mid, _ = planning.plan_patch(decimal_case, decimal_model, batch_size=256, max_memory=budget)
    assert 1 <= mid.batch_size < 256 and mid.peak <= budget
    bigger = memory.plan(decimal_model.cfg, *_rows(decimal_case, decimal_model), decimal_case.align,
                         memory.per_head(decimal_model.cfg), batch_size=mid.batch_size * 2, budget=2**40,
                         weights=memory.model_bytes(decimal_model))
    assert bigger.peak > budget
    with pytest.raises(AnalysisError) as e:
        planning.plan_patch(decimal_case, decimal_model, batch_size=256, max_memory=one.peak - 1)
    assert e.value.field == "--max-memory" and "batch size 1" in e.value.message


def test_cli_prints_the_plan_and_refuses_before_the_work(capsys, tmp_path):
    case = f"{ROOT}/cases/decimal_organism.py"
    assert main(["patch", case, "--layers", "0", "--max-memory", "8GiB"]) == 0
    err = capsys.readouterr().err
    plan = [ln for ln in err.splitlines() if ln.startswith("plan: ")]
    assert len(plan) == 1 and "per-head patching: batch size 256, predicted peak" in plan[0] and "of 8 GiB" in plan[0]
    out = tmp_path / "out"
    code, err = _code(capsys, ["patch", case, "--max-memory", "1MB", "--out", str(out)])
    assert code == 2 and "Traceback" not in err and "--max-memory" in err and "batch size 1" in err
    assert "patching z" not in err and not out.exists()  # refused before any work (no progress bar), nothing written
    code, err = _code(capsys, ["circuit", case, "--max-memory", "lots"])
    assert code == 2 and "cannot read the memory size 'lots'" in err


def _code(capsys, argv):
    try:
        return main(argv), capsys.readouterr().err
    except SystemExit as e:
        return e.code, capsys.readouterr().err


def test_the_llama_workload_fits_one_80gb_gpu_by_prediction():
    """The README's predicted Llama-3.1-8B workload: every job fits 80 GB, the weights are 16 GB in bfloat16."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from scale import LLAMA_JOBS, llama_8b

    cfg, base, source = llama_8b()
    assert 16.0e9 < memory.weights_bytes(cfg) < 16.4e9  # 8.03B parameters in bfloat16, and the causal masks
    for job in LLAMA_JOBS(cfg):
        p = memory.plan(cfg, base, source, "last", job, batch_size=256, budget=80 * 10**9, device="cuda:0")
        assert p.peak <= 80 * 10**9 and p.batch_size >= 1


# (model, job): shapes held out of the fit of the predictor's constants (bench/memory.py's: a deeper, narrower GPT-2;
# grouped-query attention with RMSNorm and rotary; parallel attention and MLP), 8 items of 58 positions, each job in
# a fresh process. The suite measures two of them again (a minute with glibc's mmap threshold set, which the peak
# needs); bench/memory.py measured every job on every shape on today's engine and planner (its result is keyed by
# their sources: tests/test_bench.py fails while it is older than them), and the test below holds those numbers to
# the same bounds.
MEASURED = [("deep", "patch"), ("gqa", "eap"), ("gqa", "exact"), ("parallel", "subsets-70")]
REMEASURED = [("gqa", "eap"), ("parallel", "subsets-70")]


def _check_measurement(res, model, job):
    above = (res["predicted"] - res["weights"]) / (res["measured"] - res["weights"])
    assert res["measured"] - res["weights"] > 16 << 20, res  # the job's own memory, not the process's noise
    # a plan that predicts too little runs out of memory: never more than 15% under
    assert 0.85 <= above <= 1.30, (model, job, above, res)
    if not res["forwards_bound"]:
        assert res["forwards"] == res["forwards_predicted"], res
    else:
        assert res["forwards"] <= res["forwards_predicted"], res


@pytest.mark.slow
@pytest.mark.parametrize("model,job", REMEASURED)
def test_predicted_memory_above_the_weights_within_30_percent_on_held_out_shapes(model, job):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from scale import MMAP_THRESHOLD

    # one thread, as the suite's workers have: a second waits on a core another worker holds, and the peak is the
    # same (gqa's exact edges: 652.09 MB measured at 1 thread, 652.16 MB at 2)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale.py"), "measure", model, job, "8", "10"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    _check_measurement(json.loads(r.stdout.strip().splitlines()[-1]), model, job)


def test_the_benchs_held_out_measurements_on_todays_engine_are_within_the_bounds():
    """bench/memory.py's saved measurements (every job on every held-out shape, each in a fresh process at 8 items x
    58 positions): each within 30% of its prediction above the weights, and those of MEASURED never more than 15%
    under with their forward passes as predicted. Today's: its key is the engine's and the planner's sources."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from saving import RESULTS, stale

    assert not stale("memory"), "bench/results/memory.json predates the engine: rerun python bench/all.py --stale"
    held = json.loads((RESULTS / "memory.json").read_text())["held_out"]
    assert {m for m, _ in MEASURED} <= set(held) and len(held) >= 3
    for model, jobs in held.items():
        for job, res in jobs.items():
            assert (res["items"], res["positions"]) == (8, 58), res
            above = (res["predicted"] - res["weights"]) / (res["measured"] - res["weights"])
            assert 0.70 <= above <= 1.30, (model, job, above)
    for model, job in MEASURED:
        _check_measurement(held[model][job], model, job)


@pytest.mark.parametrize("ablation", ["resample", "mean", "zero"])
def test_the_circuit_plan_counts_every_contrast_discover_builds(decimal_case, decimal_model, ablation):
    """`discover` holds the scoring contrast and, under resample, the reversed one circuits are evaluated on (under
    mean and zero: the source rows against themselves at every position, a wider layout). The plan's caches are at
    least what those contrasts hold after their clean passes, and under resample more than one contrast's."""
    from surgeon.analyses.circuit import default_method
    from surgeon.analyses.circuit_runs import circuit_runs
    from surgeon.engine.rows import nbytes
    from surgeon.sites.edges import EdgeSite

    runs = circuit_runs(decimal_case, decimal_model, EdgeSite.of(decimal_model.cfg, ablation=ablation))
    contrasts = {id(c): c for c in (runs.scoring, runs.explained)}.values()
    assert len(contrasts) == (2 if ablation == "resample" else 1)
    held = sum(nbytes(b) for c in contrasts for b in c.buckets)
    method = default_method(decimal_case, ablation)
    p, _ = planning.plan_circuit(decimal_case, decimal_model, method, ablation=ablation, max_memory="64GiB")
    assert p.parts["caches"] >= held > 0
    if ablation == "resample":
        base, source = _rows(decimal_case, decimal_model)
        alone = memory.plan(decimal_model.cfg, base, source, decimal_case.align,
                            memory.eap(decimal_model.cfg, planning.graph_size(decimal_model.cfg), 5), batch_size=256,
                            budget=2**40, weights=memory.model_bytes(decimal_model))
        assert p.parts["caches"] > alone.parts["caches"]
