"""Where `surgeon diagnose` spends its start-up: each stage a fresh interpreter, interleaved and repeated.

Stages, each run in a new `python -c` (so import caches do not carry over), round-robin --repeat times so
that machine noise hits them alike; the median wall time of each and the increment over the stage before:

    python              the interpreter alone
    surgeon cli         `import surgeon.cli` (what `surgeon --help` and bad arguments cost)
    + case file         the default case loaded and checked (its tokenizer included), no torch
    + torch             torch imported
    + transformers      transformers' PreTrainedModel (HookedTransformer imports it)
    + transformer_lens  `import transformer_lens` (it also imports Bert, T5, HuBERT and Wav2Vec2 models)
    diagnose            the whole command on the embedded default (128 items x 3 formats)

    python bench/startup.py [--repeat 5] [--save]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASE = "from surgeon import load_case; load_case('cases/decimal_organism.py')"
STAGES = [
    ("python", "pass"),
    ("surgeon cli", "import surgeon.cli"),
    ("+ case file", f"import surgeon.cli; {CASE}"),
    ("+ torch", f"import surgeon.cli; {CASE}; import torch"),
    ("+ transformers", f"import surgeon.cli; {CASE}; import torch; from transformers import PreTrainedModel"),
    ("+ transformer_lens", f"import surgeon.cli; {CASE}; import torch; import transformer_lens"),
    ("diagnose", "import sys; from surgeon.cli import main; sys.exit(main(['diagnose']))"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--save", action="store_true", help="also write bench/results/startup.txt (the README's)")
    args = ap.parse_args()
    from saving import saved

    with saved("startup", args.save, organisms=("decimal",)):
        run(args)


def run(args):
    times = {name: [] for name, _ in STAGES}
    for _ in range(args.repeat):
        for name, code in STAGES:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            times[name].append(time.perf_counter() - t0)
    total = statistics.median(times["diagnose"])
    print(f"median of {args.repeat} fresh interpreters per stage (interleaved)")
    print(f"{'stage':20s} {'wall':>7s} {'added':>7s} {'share of diagnose':>18s}")
    prev = 0.0
    for name, _ in STAGES:
        m = statistics.median(times[name])
        added = m - prev if name != "diagnose" else m - statistics.median(times["+ transformer_lens"])
        print(f"{name:20s} {m:6.2f}s {added:+6.2f}s {100 * added / total:17.0f}%")
        prev = m
    print("(diagnose's 'added' = what remains after the imports: loading the organism, scoring, the report)")
    import torch
    from limit import limit_only

    torch.set_num_threads(2)
    print(limit_only("this bench times start-up (imports, loading an organism, a report of a few forward passes)"))


if __name__ == "__main__":
    main()
