"""Memory predicted on shapes the predictor was not fitted to.

The predictor's constants (`surgeon.engine.memory`) were fitted on bench/scale.py's two models, GPT-2 small and the
narrowed Llama-3.1-8B layout; this bench runs each job on three held-out shapes (a deeper, narrower GPT-2;
grouped-query attention with RMSNorm, rotary and a gated MLP; attention and MLP in parallel) and compares the
prediction with the measured peak, above the weights (the part the predictor models; the weights are counted
exactly, so totals flatter it). Each job runs in a fresh process with glibc's mmap threshold fixed, after one warm-up
pass, as bench/scale.py measures memory: the peak the job adds to the resident set. 8 items of 58 positions, so that
the jobs' tensors are what is measured (at 2 items of 30 positions the smallest jobs add under 20 MiB, much of it small
allocations of the process rather than tensors).

    python bench/memory.py [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

import scale  # noqa: E402  (bench/ is this script's folder)


HELD_OUT_JOBS = ("patch", "eap", "eap-ig", "exact", "curve", "subsets-512")


def measure_memory(model: str, job: str, items: int = 8, letters: int = 10, threads: int = 2) -> dict:
    """`job` on `model` in a fresh process with the mmap threshold fixed: its measured and predicted peaks."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MALLOC_MMAP_THRESHOLD_=str(scale.MMAP_THRESHOLD))
    r = subprocess.run([sys.executable, scale.__file__, "measure", model, job, str(items), str(letters), "--threads",
                        str(threads), "--mode", "memory"], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{model} {job} {items}x{letters} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def held_out(threads: int, data: dict | None = None) -> float:
    """The predictor on shapes its constants were not fitted to, the memory above the weights compared; each
    measurement kept in `data` (shape -> job -> the measure's result)."""
    print("\n== memory predicted on held-out shapes (random weights, 8 items x 10 letters: 58 positions; each job in a fresh "
          "process, after a warm-up pass)")
    print("above = (predicted - weights) / (measured - weights): the part the predictor models; total = with the "
          "weights, counted exactly")
    worst = 0.0
    for name in scale.HELD_OUT:
        model = scale.make_model(name)
        cfg = model.cfg
        kind = (f"{cfg.n_layers} layers x {cfg.n_heads} heads"
                f"{f' ({cfg.n_key_value_heads} key/value)' if cfg.n_key_value_heads else ''}, d_model {cfg.d_model}, "
                f"{cfg.normalization_type}, {cfg.positional_embedding_type}"
                f"{', parallel attention and MLP' if cfg.parallel_attn_mlp else ''}")
        del model
        cells = []
        pool = min(16, cfg.n_heads)
        n_subsets = min(512, math.comb(pool, pool // 2))  # distinct subsets of half the heads
        jobs = [j if j != "subsets-512" else f"subsets-{n_subsets}" for j in HELD_OUT_JOBS]
        if cfg.parallel_attn_mlp:  # surgeon refuses edge graphs of parallel blocks: node jobs only
            jobs = [j for j in jobs if j == "patch" or j.startswith("subsets")]
            cells.append("edge jobs: none (surgeon's edge graphs refuse parallel attention/MLP blocks)")
        for job in jobs:
            r = measure_memory(name, job, threads=threads)
            if data is not None:
                data.setdefault("held_out", {}).setdefault(name, {})[job] = r
            worst = max(worst, abs(scale.above(r) - 1))
            label = scale.NAMES[job].strip() if job in scale.NAMES else f"subsets: {job.split('-')[1]}"
            cells.append(f"{label} {scale.above(r):.2f}x (total {r['predicted'] / r['measured']:.2f}x, "
                         f"{scale.mib(r['measured'] - r['weights'])} MiB above {scale.mib(r['weights'])})")
        print(f"  {name}: {kind}")
        for c in cells:
            print(f"    {c}")
    print(scale.memory_goal(worst))
    from limit import limit_only

    print(limit_only("this bench measures peak memory, not speed (the jobs' work and share of the peak: "
                     "bench/scale.py)"))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/memory.txt (the README's)")
    args = ap.parse_args()
    from saving import saved

    data = {}
    with saved("memory", args.save, data=data):
        held_out(args.threads, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
