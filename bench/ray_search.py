"""The same head-subset search on a local Ray cluster with 2 workers vs one process, side by side.

The threshold organism's layer (32 heads; the even/odd groups and all-heads sizes, sampled to --budget per
size), chunks of --chunk subsets. Prints both wall times, the speed ratio, Ray's start-up (cluster and
workers loading the model) and its overhead per chunk, and checks the results are identical.
On this 2-core machine the ceiling is 2x minus what the two workers' start-up and the driver cost.

    python bench/ray_search.py [--budget 400] [--chunk 256] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=400)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/ray_search.txt (the README's)")
    args = ap.parse_args()
    from saving import saved

    with saved("ray_search", args.save, organisms=("threshold",)):
        return run(args)


def run(args):

    import ray

    from surgeon import load_case
    from surgeon.models.loading import load_model
    from surgeon.search.ray import RayOptions
    from surgeon.analyses.threshold import threshold_search

    case = load_case(Path(__file__).parent.parent / "cases" / "threshold_organism.py")
    model = load_model(case.model)
    kw = dict(layer=0, groups=["even", "odd"], budget=args.budget, chunk=args.chunk)
    with tempfile.TemporaryDirectory() as tmp:
        torch.set_num_threads(args.workers)  # one process may use every core
        t0 = time.perf_counter()
        single = threshold_search(case, model, out=Path(tmp) / "single", **kw)
        t_single = time.perf_counter() - t0
        n_chunks = single.chunks_total

        torch.set_num_threads(1)  # the driver only saves chunks
        t0 = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        t_init = time.perf_counter() - t0
        first = []
        t0 = time.perf_counter()
        r = threshold_search(case, model, out=Path(tmp) / "ray", ray=RayOptions(workers=args.workers),
                             on_chunk=lambda c, a: first or first.append(time.perf_counter() - t0), **kw)
        t_ray = time.perf_counter() - t0
        ray.shutdown()
    # the results are the same numbers; `execution` records what each process ran (every Ray worker its own clean runs)
    numbers = lambda res: json.dumps({k: v for k, v in res.__dict__.items() if k != "execution"},  # noqa: E731
                                     default=str, sort_keys=True)
    same = numbers(single) == numbers(r)
    per_chunk_single = t_single / n_chunks
    # after the first chunk (workers started, model loaded), chunks arrive from both workers
    steady = (t_ray - first[0]) / max(1, n_chunks - 1)
    print(f"threshold organism, layer 0 (32 heads): {single.subsets_evaluated:,} subsets in {n_chunks} chunks of "
          f"{args.chunk}, {r.chunks_done} chunks on Ray")
    print(f"  one process ({args.workers} threads)         {t_single:8.2f} s  ({per_chunk_single * 1e3:.0f} ms per chunk)")
    print(f"  Ray, {args.workers} workers x 1 thread          {t_ray:8.2f} s  (+ {t_init:.1f} s ray.init)")
    print(f"    first chunk back after {first[0]:.2f} s (workers start and load the model); then one every "
          f"{steady * 1e3:.0f} ms")
    print(f"    Ray overhead per chunk: {steady - per_chunk_single / args.workers:+.3f} s against a perfect split")
    print(f"  speed ratio one process / Ray: {t_single / t_ray:.2f}x (without start-up: "
          f"{per_chunk_single / steady:.2f}x)")
    print(f"  forward passes recorded: one process {single.execution['forwards']:,}; Ray "
          f"{r.execution['forwards']:,} over {r.execution['ray']['workers']} workers and the driver (each its own "
          f"clean runs)")
    print(f"  results identical (every field but the execution record): {same}")
    from limit import case_rows, counted_section

    torch.set_num_threads(args.workers)

    def single_again():
        with tempfile.TemporaryDirectory() as tmp2:
            threshold_search(case, model, out=Path(tmp2) / "single", **kw)

    counted_section("work and speed against this machine's limit (work: matrix-multiply FLOPs of one more run under "
                    "torch's FlopCounterMode, apart from the timings)", [(model.cfg, case_rows(case, model))],
                    [("threshold search", "one process", t_single, single_again, None),
                     ("", "Ray", t_ray, None, None)],
                    ["Ray: its workers' work is not counted here (other processes): the same subsets, and each "
                     "worker's own clean runs; least: not derived for a search (bench/subset_search.py derives it for "
                     "a fixed set of subsets)"])
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
