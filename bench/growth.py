"""Where the work grows: each job's time and memory over items, positions, layers and width, fitted and extrapolated.

One model family (GPT-2's: LayerNorm, learned positions, 8 heads, d_mlp = 4 x d_model, vocab 50,257, random
weights), a base point (4 items, 58 positions, 4 layers, d_model 256) and one axis varied at a time over three sizes:
items 2 / 4 / 8, positions 30 / 58 / 114 (the words in bench/scale.py's template made longer), layers 2 / 4 / 8,
d_model 128 / 256 / 512 (d_head = d_model / 8); at smaller sizes fixed costs hide the growth. Every job runs as
bench/scale.py runs it (`scale.py measure`): in a fresh process for its peak memory (above the weights) and, per point,
all jobs timed one after the other in one process, each the fastest of three runs after a warm-up pass
(TransformerLens's import and the model's construction dominate a short job's process, and one run of a job that takes
a tenth of a second is mostly noise). The measurements are printed as a table before the fits. Per job and quantity, a power law is fitted by least squares in log space over the nine distinct
points (intercept and one exponent per axis) and printed with its largest residual.

Then the extrapolation to Llama-3.1-8B on one 80 GB GPU, the assumptions stated with it: the fitted power laws hold
out to Llama's sizes (d_model 4,096 is 8x the widest model fitted; its 32 layers 4x the deepest), Llama's layout
(grouped-query attention, gated MLP, RMSNorm) costs what GPT-2's does at the same width, and the GPU runs bfloat16
matmuls at 400 TFLOP/s (about 40% of an H100's dense peak). Two ways, both printed: (a) the job's fitted CPU time
moved to the GPU by the ratio of matmul throughputs (this CPU's measured here); (b) the job's time as a multiple of
the floor (one forward + backward, fitted the same way) times the floor's FLOP count on the GPU. At these sizes the
fitted width exponents stay below a matmul's d_model^2 (fixed costs), so (a) understates; the floor's own fit
against its FLOP count shows by how much; and a floor of a tenth of a second is mostly fixed cost, so the ratios in (b)
grow with items and layers faster than the work does, and (b) overstates. (c) needs no fit: it counts the
matrix-multiply work of the engine's own calls for the workload (`job_flops`; tests/test_bench.py checks it against torch's FLOP counter on the engine's own run) and divides by the same throughput,
and the engine's plan for one 80 GB GPU (batch size, forward passes, predicted peak) stands beside the power law's
memory. Memory above the weights is extrapolated for one batch of all rows in
float32 and halved for bfloat16; surgeon plans smaller batches where that does not fit (bench/scale.py prints its
plan for the same workload). The raw measurements are kept in bench/results/growth.json.

    python bench/growth.py [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

import scale  # noqa: E402  (bench/ is this script's folder)

BASE = {"items": 4, "positions": 10, "layers": 4, "width": 256}  # positions as letters per word: 10 -> 58 tokens
AXES = {"items": (2, 4, 8), "positions": (3, 10, 24), "layers": (2, 4, 8), "width": (128, 256, 512)}
JOBS = ("floor", "patch", "eap", "eap-ig", "exact", "curve", "subsets-64")
NAMES = {**scale.NAMES, "subsets-64": "subsets: 64"}
REPEAT = 3  # each job's time: the fastest of this many runs in its process (one run of a 0.1-s job is mostly noise)
GPU_FLOPS = 400e12  # assumed: bfloat16 matmuls on an H100 at about 40% of its 989 TFLOP/s dense peak
LLAMA = {"items": scale.LLAMA_ITEMS, "positions": scale.LLAMA_PROMPT + scale.LLAMA_ANSWER - 1, "layers": 32,
         "width": 4096}


def points() -> list[dict]:
    """The base point and each axis's other sizes (nine distinct points)."""
    out = [dict(BASE)]
    for axis, sizes in AXES.items():
        out += [{**BASE, axis: v} for v in sizes if v != BASE[axis]]
    return out


def run_point(pt: dict, threads: int) -> dict:
    """Every job at one point: timed one after the other in one process (glibc's allocator as it comes; at the base
    point each job's work then counted, bench/scale.py's `--count`), then each surgeon job in a fresh process for its
    peak memory (the mmap threshold fixed, as bench/scale.py measures)."""
    model = f"gpt2-L{pt['layers']}-d{pt['width']}"
    args = [str(pt["items"]), str(pt["positions"]), "--threads", str(threads)]
    count = ["--count"] if pt == BASE else []
    timed = _measure([model, ",".join(JOBS), *args, "--mode", "time", "--repeat", str(REPEAT), *count], threads,
                     memory=False)
    out = {}
    for r in timed:
        job = r["job"]
        out[job] = {k: r[k] for k in ("seconds", "positions", "flops", "least") if k in r}
        if job != "floor":
            out[job].update(_measure([model, job, *args, "--mode", "memory"], threads, memory=True)[0])
    return out


def _measure(argv: list[str], threads: int, memory: bool) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if memory:
        env["MALLOC_MMAP_THRESHOLD_"] = str(scale.MMAP_THRESHOLD)
    r = subprocess.run([sys.executable, scale.__file__, "measure", *argv], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"scale.py measure {' '.join(argv)} failed:\n{r.stderr[-3000:]}")
    return [json.loads(line) for line in r.stdout.strip().splitlines() if line.startswith("{")]


def fit(rows: list[tuple[dict, float]]) -> tuple[np.ndarray, float]:
    """log y = c + sum_a e_a log x_a by least squares: (c and the exponents in AXES order, largest |residual| as a
    factor)."""
    X = np.array([[1.0] + [math.log(x[a]) for a in AXES] for x, _ in rows])
    y = np.log([v for _, v in rows])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return coef, float(np.exp(np.abs(X @ coef - y).max()))


def predict(coef: np.ndarray, x: dict) -> float:
    return float(np.exp(coef[0] + sum(e * math.log(x[a]) for e, a in zip(coef[1:], AXES))))


def law(name: str, coef: np.ndarray) -> str:
    return f"{name} ~ " + " x ".join(f"{a}^{e:.2f}" for a, e in zip(AXES, coef[1:]))


def base_limit(res: dict):
    """At the base point: the matrix-multiply peak at its model's shapes and the machine's limit (bench/limit.py), and
    each job's work, least and share of that peak, printed with the goals against the limit."""
    from limit import Limit, model_shapes, work_section

    model = scale.make_model(f"gpt2-L{BASE['layers']}-d{BASE['width']}")
    r0 = res[("floor", *BASE.values())]
    lim = Limit.measure(model_shapes(model.cfg, BASE["items"] * r0["positions"], BASE["items"]))
    sides = [(NAMES[job].strip(), "floor" if job == "floor" else "surgeon", r["seconds"], r.get("flops"),
              r.get("least")) for job in JOBS for r in [res[(job, *BASE.values())]]]
    work_section(f"work and speed against this machine's limit at the base point (work: bench/scale.py's count, one "
                 f"more run of each job under torch's FlopCounterMode after its timed runs; least: scale.py's "
                 f"least_work)", lim, sides)
    return lim


def bench(threads: int) -> list[dict]:
    """Measure every job at every point, print the fits and the extrapolation; returns the measurements."""
    pts = points()
    res = {}
    for pt in pts:
        for job, r in run_point(pt, threads).items():
            res[(job, *pt.values())] = {**r, "job": job, "x": {**pt, "positions": r["positions"]}}
    print(f"== growth on GPT-2's family (random weights; {threads} threads): base {BASE['items']} items x "
          f"{res[('floor', *BASE.values())]['positions']} positions, {BASE['layers']} layers, d_model {BASE['width']}; "
          f"one axis at a time: items {', '.join(map(str, AXES['items']))}; positions "
          f"{', '.join(map(str, sorted({r['x']['positions'] for r in res.values()})))};"
          f" layers {', '.join(map(str, AXES['layers']))}; d_model {', '.join(map(str, AXES['width']))}")
    print(f"measured (seconds, the fastest of {REPEAT} runs; memory above the weights in MiB, each job in a fresh process):")
    print(f"  {'items':>5s} {'pos':>4s} {'layers':>6s} {'width':>5s}  " + " ".join(f"{j:>15s}" for j in JOBS))
    for pt in pts:
        rows = [res[(job, *pt.values())] for job in JOBS]
        x = rows[0]["x"]
        cells = [f"{r['seconds']:7.3f}" + (f" {max(r['measured'] - r['weights'], 0) / 2**20:6.0f}M" if "measured" in r
                                          else " " * 8) for r in rows]
        print(f"  {x['items']:5d} {x['positions']:4d} {x['layers']:6d} {x['width']:5d}  " + " ".join(cells))
    print("fitted over the 9 points (largest residual: the worst point's measured / fitted, as a factor):")
    fits = {}
    for job in JOBS:
        rows = [res[(job, *pt.values())] for pt in pts]
        t_coef, t_res = fit([(r["x"], r["seconds"]) for r in rows])
        label = NAMES[job].strip()
        print(f"  {label:28s} {law('time', t_coef)}  (x{t_res:.2f})")
        m_coef = None
        if job != "floor":  # the floor is timed only (the time unit of the extrapolation)
            m_coef, m_res = fit([(r["x"], max(r["measured"] - r["weights"], 1)) for r in rows])
            print(f"  {'':28s} {law('memory', m_coef)}  (x{m_res:.2f})")
        r_coef = None
        if job != "floor":  # the job's time as a multiple of the floor at the same point
            floors = {tuple(r["x"].values()): r["seconds"] for r in (res[("floor", *pt.values())] for pt in pts)}
            r_coef, _ = fit([(r["x"], r["seconds"] / floors[tuple(r["x"].values())]) for r in rows])
        fits[job] = t_coef, m_coef, r_coef

    lim = base_limit(res)
    flops = lim.limit
    x = {**LLAMA, "items": 2 * LLAMA["items"]}  # the fit's items are rows (one per item here); the case has two
    from surgeon.engine.memory import weights_bytes

    params = weights_bytes(scale.llama_8b()[0]) / 2  # bfloat16
    tokens = x["items"] * x["positions"]
    floor_flops = 4 * params * tokens / GPU_FLOPS
    floor_fit = predict(fits["floor"][0], x) * flops / GPU_FLOPS
    print(f"\n== extrapolated to Llama-3.1-8B on one 80 GB GPU ({LLAMA['items']} items x 2 answer rows, "
          f"{LLAMA['positions']} positions, {LLAMA['layers']} layers, d_model {LLAMA['width']}): power laws far outside "
          f"their range, read as an order of magnitude at best")
    print(f"assumed: the fits hold out to these sizes (width 8x, layers 4x the largest fitted); Llama's layout costs "
          f"what GPT-2's does at its width; the GPU runs bfloat16 matmuls at {GPU_FLOPS / 1e12:.0f} TFLOP/s (an H100 at "
          f"~40% of its dense peak); memory above the weights in one batch, float32 halved for bfloat16")
    print(f"  the floor by FLOP count (4 x {params / 1e9:.2f}e9 parameters x {tokens:,} tokens: a forward, and a backward "
          f"w.r.t. the activations only): {floor_flops:.2f} s; by its own fit moved by this CPU's measured matmul "
          f"throughput ({flops / 1e9:,.0f} GFLOP/s at a 2,048-square product): {floor_fit:.3f} s. The fitted widths grow slower than a matmul's "
          f"d_model^2 (fixed costs at these sizes), so (a) understates; (b) scales each job's measured ratio to the "
          f"floor (itself fitted) by the floor's FLOP count, and a floor of a tenth of a second is mostly fixed cost, so "
          f"its ratios grow with items and layers faster than the work does and (b) overstates.")
    counted = work_counts()
    print(f"  (c) counts the matrix-multiply work of the engine's own calls for this workload (its rows merged and "
          f"aligned as it runs them: the clean runs of both formats, then each call's patches from their first layer "
          f"on, at the positions from the first patched one, a backward costing a forward, and for EAP and EAP-IG "
          f"one product of d_model per edge, aligned position and row; exact edges counted from layer 0, an upper "
          f"bound) at {GPU_FLOPS / 1e12:.0f} TFLOP/s: no fit, a lower bound on a GPU's time where the work is large "
          f"enough to keep it busy. Memory: the power law (one batch of every row, halved for bfloat16) beside the "
          f"engine's own plan for one 80 GB GPU (checked within 30% on held-out shapes: bench/memory.py)")
    print(f"  {'':28s} {'(a) fit x CPU/GPU':>18s} {'(b) ratio x floor':>18s} {'ratio':>8s} {'(c) counted':>12s} "
          f"{'ratio':>7s}   {'memory: power law':>18s} {'plan':>30s}")
    floor_count = counted["floor"]["flops"]
    for job in JOBS:
        if job == "floor":
            continue
        t_coef, m_coef, r_coef = fits[job]
        t = predict(t_coef, x) * flops / GPU_FLOPS
        ratio = predict(r_coef, x)
        mem = predict(m_coef, x) / 2
        c = counted[job]
        plan = f"{c['above'] / 2**30:.2f} GiB (batch {c['batch_size']}, {c['forwards']} passes)"
        print(f"  {NAMES[job].strip():28s} {t:16.2f} s {ratio * floor_flops:16.2f} s {ratio:7.1f}x "
              f"{c['flops'] / GPU_FLOPS:10.2f} s {c['flops'] / floor_count:6.1f}x {mem / 2**30:15.2f} GiB "
              f"{plan:>30s}")
    return list(res.values())


def work_counts() -> dict:
    """Per job, the matrix-multiply FLOPs of the engine's calls for the Llama-3.1-8B workload (bench/scale.py's rows)
    and its plan for one 80 GB GPU: batch size, forward passes, the predicted peak above the weights."""
    from surgeon.analyses.planning import graph_size
    from surgeon.engine import memory

    cfg, base, source = scale.llama_8b()
    graph = graph_size(cfg)
    jobs = {job: scale.memory_job(cfg, job, graph, "llama") for job in JOBS if job != "floor"}  # as scale measures them
    weights = memory.weights_bytes(cfg)
    out = {"floor": {"flops": floor_flops(cfg, base)}}
    for key, job in jobs.items():
        p = memory.plan(cfg, base, source, "last", job, batch_size=256, budget=scale.GPU_BYTES, device="cuda:0")
        out[key] = {"flops": job_flops(cfg, base, source, "last", job, p.batch_size), "batch_size": p.batch_size,
                    "forwards": p.forwards, "above": p.peak - weights}
    return out


def _layer_params(cfg) -> int:
    """The weights of one block that every position multiplies by (attention projections, the MLP)."""
    kv = cfg.n_key_value_heads or cfg.n_heads
    return (cfg.d_model * cfg.d_head * (2 * cfg.n_heads + 2 * kv)
            + cfg.d_model * cfg.d_mlp * (3 if cfg.gated_mlp else 2))


def floor_flops(cfg, rows) -> int:
    """A forward and a backward (w.r.t. the activations, as much again) of every row at every position."""
    return 2 * 2 * _layer_params(cfg) * sum(len(r.tokens) for r in rows) * cfg.n_layers


def job_flops(cfg, base, source, align: str, job, batch_size: int) -> int:
    """The matrix-multiply FLOPs of the engine's calls of `job` (surgeon.engine.memory's description) on these rows,
    merged and aligned as the engine runs them: a layer-position (one block at one position of one row) costs 2 x the
    block's weights; the clean runs of both formats every layer at every position; each call's patches from their
    first layer on at the positions from the first patched one, a backward as much again; for a gradient over edges
    (EAP, EAP-IG) one product of d_model per edge, aligned position, row and step. Attention's own products, the
    embedding and the unembedding are left out (small beside the blocks at these lengths)."""
    from surgeon.engine import memory

    b, s, aligned = memory.merged_rows(base, source, align)
    shapes = memory.layout(b, s, aligned, batch_size)
    L = cfg.n_layers
    clean = sum(x.n * (x.base_width + x.source_width) for x in shapes) * L
    suffix = sum(x.n * (x.base_width - x.p0) for x in shapes)
    patched = sum(c.count * c.patches * suffix * (L - c.start) for c in job.calls) * (2 if job.grad else 1)
    products = (job.edges * sum(x.n * x.slots for x in shapes) * cfg.d_model * sum(c.patches for c in job.calls)
                if job.grad else 0)
    return 2 * _layer_params(cfg) * (clean + patched) + 2 * products


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/growth.txt (the README's)")
    args = ap.parse_args()
    from saving import saved

    points: dict = {}
    with saved("growth", args.save, data=points):
        points["points"] = bench(args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
