"""The same jobs on a TransformerLens TransformerBridge and on the HookedTransformer holding the same weights (issue 72
item 4), side by side in one run, and where the bridge's extra time goes.

Checkpoints: tiny random Hugging Face checkpoints (tests/checkpoints.py) of two layouts: Llama (8 layers x 8 heads,
4 key/value heads, width 64) and GPT-2 (2 layers x 4 heads, width 64). The HookedTransformer is loaded by surgeon
(TransformerLens's conversion), the bridge booted by TransformerLens from the same folder and given to the API as it
is. The case: 8 decimal items, two formats (tests/checkpoints.py's BRIDGE_CASE, the bridge tests' case).

Jobs, each a call of surgeon's API on both models, interleaved round by round, the fastest of --repeat kept:
  patch    the per-head sweep (z at the last position, every layer x head)
  eap      circuit by EAP over every edge (no verification)
  exact    circuit by exact edge scores (no verification)
And what explains a gap, timed the same way:
  setup         what every call does first (`surgeon.api.case_and_model`): the case checked against the model, and
                on the bridge the adapter built (one forward) and surgeon's model protocol checked (one forward
                caching every hook point)
  forward       one forward of the case's rows on each model, no hook (the floor of every job)
  1-token forward  one forward of one token: a pass's fixed cost, almost no arithmetic (the per-head sweep's passes
                are counted in its execution record)
  fwd+bwd       that forward and a backward from the logits to the residual stream (the floor of EAP)
  JOB, copied   each job on the HookedTransformer with the engine's shared-prefix attention off: each patch
                (EAP's faithfulness curve's too) copies the prefix's keys and values, as it does on the bridge, whose
                attention that mode does not reproduce (the bridge's column repeats its time above)

    python bench/bridge.py [--repeat 5] [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
JOBS = (("patch", {}), ("eap", {"method": "eap", "verify": 0}), ("exact", {"method": "exact", "verify": 0}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/bridge.txt (the docs')")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    sys.path.insert(0, str(ROOT))
    from saving import saved

    data: dict = {"layouts": {}, "repeat": args.repeat}
    with saved("bridge", args.save, data=data), tempfile.TemporaryDirectory() as tmp:
        for name, make in layouts():
            data["layouts"][name] = run(name, make(Path(tmp) / name), args.repeat)
        from limit import limit_only

        print(limit_only("this bench compares two implementations of one model on the same jobs"))


def layouts():
    from tests.checkpoints import make_gpt2, make_llama

    return (("llama 8x8", lambda p: make_llama(p, 8, 8, 4, 64)), ("gpt2 2x4", make_gpt2))


def fastest(fns: dict, repeat: int) -> dict:
    """{name: fastest of `repeat` timings}, the calls interleaved round by round."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def floors(ht, bridge, case) -> dict:
    """{forward / fwd+bwd: (hooked fn, bridge fn)} over the case's prompts in every format (padded batch)."""
    texts = [case.formats[f].format(**it.values) for it in case.items for f in case.formats]
    tok = ht.tokenizer
    tok.padding_side = "right"
    ids = tok(texts, return_tensors="pt", padding=True)["input_ids"]

    def fwd(m, tokens=ids):
        with torch.no_grad():
            m(tokens)

    def fwd_bwd(m):  # the gradient reaches the residual stream, as EAP's does (no weight's gradient)
        leaf = []

        def catch(x, hook):
            leaf.append(x.detach().requires_grad_())
            return leaf[0]

        logits = m.run_with_hooks(ids, fwd_hooks=[("blocks.0.hook_resid_pre", catch)])
        torch.autograd.grad(logits.float().logsumexp(-1).sum(), leaf)

    one = ids[:1, :1]
    return {"forward": (lambda: fwd(ht), lambda: fwd(bridge)),
            "1-token forward": (lambda: fwd(ht, one), lambda: fwd(bridge, one)),
            "fwd+bwd": (lambda: fwd_bwd(ht), lambda: fwd_bwd(bridge))}


def run(name: str, folder: Path, repeat: int) -> dict:
    import surgeon
    from surgeon.engine import prefix_attention
    from surgeon.models.loading import load_model
    from tests.checkpoints import BRIDGE_CASE as case
    from transformer_lens.model_bridge import TransformerBridge

    with contextlib.redirect_stdout(io.StringIO()):  # TransformerLens's "Moving model to device" line
        ht = load_model(str(folder))
        bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    cfg = ht.cfg
    kv = cfg.n_key_value_heads or cfg.n_heads
    print(f"\n== {name}: {cfg.n_layers} layers x {cfg.n_heads} heads ({kv} key/value), width {cfg.d_model}; "
          f"{len(case.items)} items x {len(case.formats)} formats; fastest of {repeat}")
    paths, passes = {}, {}
    rows = []
    for job, kw in JOBS:
        call = surgeon.patch if job == "patch" else surgeon.circuit

        def on(m, key, call=call, kw=kw):
            return lambda: paths.__setitem__(key, prefix_path(call(case, m, **kw), passes, key))

        t = fastest({"hooked": on((ht, ht.tokenizer), (job, "hooked")), "bridge": on(bridge, (job, "bridge"))}, repeat)
        rows.append((job, t["hooked"], t["bridge"]))
    setup = {"hooked": lambda: surgeon.api.case_and_model(case, (ht, ht.tokenizer)),
             "bridge": lambda: surgeon.api.case_and_model(case, bridge)}
    t = fastest(setup, repeat)
    rows.append(("setup", t["hooked"], t["bridge"]))
    for floor, (h, b) in floors(ht, bridge, case).items():
        t = fastest({"hooked": h, "bridge": b}, repeat)
        rows.append((floor, t["hooked"], t["bridge"]))
    bridge_s = {j: b for j, _, b in rows}
    keep = prefix_attention.unsupported
    prefix_attention.unsupported = lambda model: "turned off by the bench"
    try:
        for job, kw in JOBS:
            call = surgeon.patch if job == "patch" else surgeon.circuit
            t = fastest({"hooked": lambda call=call, kw=kw, job=job: paths.__setitem__(
                (f"{job}, copied", "hooked"), prefix_path(call(case, (ht, ht.tokenizer), **kw)))}, repeat)
            rows.append((f"{job}, copied", t["hooked"], bridge_s[job]))
    finally:
        prefix_attention.unsupported = keep
    print(f"{'job':16s} {'hooked':>9s} {'bridge':>9s} {'bridge/hooked':>14s}")
    for job, h, b in rows:
        print(f"{job:16s} {h:8.3f}s {b:8.3f}s {b / h:13.2f}x")
    print("the engine's prefix attention in each run (the results' execution record):")
    for (job, side), how in sorted(paths.items()):
        print(f"  {job:14s} {side:7s} {how}")
    return {"shape": f"{cfg.n_layers} layers x {cfg.n_heads} heads",
            "rows": [{"job": j, "hooked_s": h, "bridge_s": b} for j, h, b in rows], "passes": passes,
            "prefix": {f"{j} / {s}": how for (j, s), how in paths.items()}}


def prefix_path(result, passes: dict | None = None, key=()) -> str:
    """How the engine attended to the shared prefix in `result`'s run (its execution record); the forward passes its
    engine counted go into `passes` under "JOB / SIDE" (`key`)."""
    execution = getattr(result, "execution", None) or {}
    if passes is not None and "forwards" in execution:
        passes[" / ".join(key)] = execution["forwards"]
    return str(execution.get("prefix", "not recorded"))


if __name__ == "__main__":
    main()
