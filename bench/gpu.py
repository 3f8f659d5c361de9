"""The GPU bench (issue 73): surgeon on a GPU at the shapes users run, beside the careful TransformerLens baseline on
the same GPU, its peak memory against the plan's prediction, its achieved FLOP/s against the GPU's own measured peak.

  llama8b  Llama-3.1-8B's layout at full width, random weights in bfloat16: 32 layers x 32 query heads (8 key/value),
           d_model 4,096, d_mlp 14,336, vocab 128,256, rotary, RMSNorm, gated SiLU MLP (1,024 heads, 805,681 edges);
  gpt2     GPT-2 small exactly, random weights, float32 (144 heads, 32,491 edges).

Part A, speed (both shapes): items are random three-letter words in a Q&A template and the same template with the
two words swapped as the other run (align="index", bench/scale.py's rows), ITEMS items; each job timed on the GPU
(synchronised, the fastest of a few runs after a warm-up pass), its peak memory (torch.cuda.max_memory_allocated,
the weights included) beside surgeon's predicted peak (`surgeon.engine.memory.predict_rows`, the same rows and batch
size), its matrix-multiply work counted once apart from its timing (torch's FlopCounterMode) and its achieved share
of the GPU's matrix-multiply peak in the model's dtype (an 8,192-square product, measured in the same run):

  floor            one forward + backward of the failing run, weights frozen, logits at the read position
                   (bench/careful.py): the unit EAP is measured in;
  per-head sweep   every head patched alone, beside the careful TransformerLens sweep (bench/careful.py: a frozen KV
                   cache of the common prefix, start_at_layer, a layer's heads in the batch dimension);
  EAP, EAP-IG      every edge's attribution (EAP-IG: eap-ig-inputs, 5 steps), as a multiple of the floor;
  exact top-200    the top 200 EAP edges each patched alone, beside the careful per-edge loop (bench/scale.py);
  subsets          4,096 distinct subsets of 8 of 16 heads at one layer (layer 28; GPT-2's 12 heads, layer 9), in
                   chunks of 256;
  repair           `surgeon.analyses.repair.repair_case`: 4 heads' mean-ablation repair built on half the items and
                   measured on the other half (rates, the harm to the good format, KL on neutral text).

Part B, the README's memory claim (llama8b only): the paper's workload (bench/scale.py's `llama_rows`: 64 trap items,
two answer rows each, a 45-token chat prompt against a 15-token plain one, aligned at the last prompt token and the
answer) planned for one 80 GB GPU as `surgeon patch` and `surgeon circuit` plan it; EAP over every edge run at the
planned batch size and per-head patching of layers 24-31 (one chunk of 256 patches: the full sweep's peak, a quarter
of its time), their measured peaks beside the predictions.

One command, under 10 minutes on an H200; `--budget` (seconds) skips what would start after it. Everything measured
is written as it is measured (OUT/gpu.json, OUT/gpu.txt); with --save also bench/results/gpu.{json,txt}, which the
README's and docs' GPU statements are generated from, labelled with the device.

    python bench/gpu.py [--out DIR] [--save] [--budget 480] [--models llama8b,gpt2] [--device cuda]
    python bench/gpu.py --device cpu --models tiny --items 2    (a smoke run of every code path, on a CPU)
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import scale  # noqa: E402

SUBSET_LAYER = {"llama8b": 28, "gpt2": 9, "tiny": 1}
N_SUBSETS = 4096
REPAIR_HEADS = 4


def make_model(name: str, device: str):
    """The model on `device`, its weights created there (random, seeded)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from surgeon.organisms.charset import build_tokenizer

    if name == "gpt2":
        with torch.device(device):
            model = scale.make_model("gpt2").to(device)
        return model
    if name == "llama8b":
        cfg = dict(n_layers=32, d_model=4096, n_heads=32, d_head=128, n_key_value_heads=8, d_mlp=14336,
                   d_vocab=128256, rotary_dim=128, dtype=torch.bfloat16)
    elif name == "tiny":  # the smoke run's: the same layout, small
        cfg = dict(n_layers=3, d_model=64, n_heads=4, d_head=16, n_key_value_heads=2, d_mlp=128, d_vocab=1000,
                   rotary_dim=16, dtype=torch.float32)
    else:
        raise SystemExit(f"unknown model {name!r}: llama8b, gpt2 or tiny")
    cfg = HookedTransformerConfig(n_ctx=2048, act_fn="silu", gated_mlp=True, normalization_type="RMS",
                                  positional_embedding_type="rotary", rotary_base=500000, final_rms=True, seed=0,
                                  default_prepend_bos=True, device=device, **cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = HookedTransformer(cfg, tokenizer=build_tokenizer(f"bench-{name}"), move_to_device=True)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, repeat: int) -> tuple[float, object]:
    """The fastest of `repeat` synchronised runs of `fn` (seconds), and the last one's result."""
    best, out = math.inf, None
    for _ in range(repeat):
        gc.collect()
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


def matmul_peak(device: str, dtype: torch.dtype, n: int = 8192, repeat: int = 10) -> float:
    """FLOP/s of an n-square product in `dtype` on `device` (the mean of `repeat` after three warm-ups)."""
    if torch.device(device).type != "cuda":
        n, repeat = 1024, 3
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        a @ b
    sync(device)
    return 2 * n ** 3 * repeat / (time.perf_counter() - t0)


@contextlib.contextmanager
def peak(device: str):
    """{"peak": bytes allocated at the block's peak, everything on the device included (the weights)}."""
    out = {"peak": 0}
    if torch.device(device).type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        yield out
        sync(device)
        out["peak"] = torch.cuda.max_memory_allocated()
    else:
        yield out


class Bench:
    """What the run measured so far, written after every job (a run stopped at its limit keeps what it did)."""

    def __init__(self, out: Path, budget: float, device: str):
        self.out, self.budget, self.device, self.t0 = out, budget, device, time.perf_counter()
        self.data = {"device": device, "jobs": [], "skipped": [], "failed": [], "organisms": {}}  # random weights only
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)
        self.write()

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        for name, text in (("gpu.json", json.dumps(self.data, indent=1, sort_keys=True) + "\n"),
                           ("gpu.txt", "\n".join(self.lines) + "\n")):
            tmp = self.out / (name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.out / name)

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.t0)

    def job(self, model_name: str, job: str, fn, repeat: int = 2, predicted: int | None = None,
            count: bool = True, extra: dict | None = None) -> dict | None:
        """Run `fn` (warm-up included in `repeat`), record its time, peak, work and the prediction; a failure is
        recorded with its traceback and the run goes on."""
        if self.left() <= 0:
            self.data["skipped"].append(f"{model_name} {job}")
            self.say(f"  {job}: skipped (the budget's {self.budget:.0f} s are spent)")
            return None
        try:
            with peak(self.device) as m:
                seconds, result = timed(fn, self.device, 1)
            if repeat > 1:
                s2, result = timed(fn, self.device, repeat - 1)
                seconds = min(seconds, s2)
            flops = None
            if count:
                from limit import count_flops

                flops = count_flops(fn)
        except Exception as e:  # noqa: BLE001  (recorded; the run goes on to the next job)
            self.data["failed"].append({"model": model_name, "job": job, "error": repr(e),
                                        "traceback": traceback.format_exc()[-4000:]})
            self.say(f"  {job}: FAILED {e!r}")
            gc.collect()
            if torch.device(self.device).type == "cuda":
                torch.cuda.empty_cache()
            return None
        rec = {"model": model_name, "job": job, "seconds": seconds, "peak": m["peak"], "predicted": predicted,
               "flops": flops, **(extra or {})}
        if isinstance(result, dict):
            rec.update(result)
        self.data["jobs"].append(rec)
        rate = self.data["peaks"][model_name]
        share = f", {flops / seconds / rate:.0%} of the {rate / 1e12:.0f} TFLOP/s peak" if flops else ""
        mem = f", peak {m['peak'] / 2**30:.2f} GiB" if m["peak"] else ""
        pred = f" (predicted {predicted / 2**30:.2f} GiB: {predicted / m['peak']:.2f}x)" if predicted and m["peak"] else ""
        self.say(f"  {job}: {seconds:.3f} s{mem}{pred}{share}")
        gc.collect()
        return rec


def speed(b: Bench, name: str, model, items: int) -> None:
    """Part A on one model (see the module's docstring)."""
    import numpy as np

    from careful import forward_backward, read_at
    from surgeon.analyses.circuit import edge_scores
    from surgeon.engine import memory
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.edges import EdgeSite
    from surgeon.sites.nodes import Site

    dev, cfg = b.device, model.cfg
    base, source = scale.make_rows(model, items, 3)
    L, H, bs = cfg.n_layers, cfg.n_heads, 256
    site = EdgeSite.of(cfg)
    graph = (len(site.senders), len(site.edges))
    b.say(f"\n== {name}: {L} layers x {H} heads, d_model {cfg.d_model}, {cfg.dtype}; {len(site.edges):,} edges; "
          f"{items} items x {len(base[0].tokens)} positions")

    def pred(job):
        return memory.predict_rows(cfg, base, source, "index", job, bs, weights=memory.model_bytes(model)).peak

    def device_ctx(fn):
        def run():
            with torch.device(dev):
                return fn()
        return run

    b.job(name, "floor", device_ctx(lambda: forward_backward(model, torch.tensor([r.tokens for r in base]),
                                                             *read_at(base))), repeat=3)

    def sweep():
        sites = [Site.of("z", layer) for layer in range(L)]
        c = Contrast(model, base, source, "index", batch_size=bs, sites=sites)
        with torch.no_grad():
            for s in sites:
                c.run({s: torch.eye(H)})
        return {"path": dict(c.execution)}

    b.job(name, "per-head sweep", sweep, predicted=pred(memory.per_head(cfg)))
    b.job(name, "  careful TL sweep", device_ctx(lambda: [scale.careful_patch(model, base, source), None][1]))

    order = {}

    def eap():
        c = Contrast(model, base, source, "index", batch_size=bs, sites=site.node_sites())
        s = edge_scores(c, site, "eap")
        order["top"] = np.argsort(-np.abs(s), kind="stable")[:200]
        return {"path": dict(c.execution)}

    def eap_ig():
        c = Contrast(model, base, source, "index", batch_size=bs, sites=site.node_sites())
        edge_scores(c, site, "eap-ig-inputs", 5)
        return {"path": dict(c.execution)}

    b.job(name, "EAP", eap, repeat=3, predicted=pred(memory.eap(cfg, graph, 1)))
    b.job(name, "EAP-IG (5 steps)", eap_ig, repeat=3, predicted=pred(memory.eap(cfg, graph, 5)))
    if "top" in order:
        top = order["top"]

        def exact():
            c = Contrast(model, base, source, "index", batch_size=bs, sites=site.node_sites())
            onehot = torch.zeros(len(top), len(site.edges))
            onehot[torch.arange(len(top)), torch.as_tensor(top)] = 1
            with torch.no_grad():
                c.run({site: onehot})
            return {"path": dict(c.execution)}

        b.job(name, "exact top-200", exact, predicted=pred(memory.exact_edges(cfg, graph, 200)))
        b.job(name, "  careful TL edge loop", device_ctx(
            lambda: [scale.careful_edge_loop(model, site, base, source, top, bs), None][1]))

    layer = SUBSET_LAYER[name]
    n = min(N_SUBSETS, math.comb(min(16, H), min(16, H) // 2))

    def subsets():
        s = Site.of("z", layer)
        c = Contrast(model, base, source, "index", batch_size=bs, sites=[s])
        masks = scale.subset_masks(n, H, min(16, H) // 2)
        with torch.no_grad():
            for lo in range(0, n, 256):
                c.run({s: masks[lo: lo + 256]})
        return {"path": dict(c.execution), "subsets": n}

    b.job(name, f"subsets ({n:,} at layer {layer})", subsets, predicted=pred(memory.subsets(cfg, layer, n)))
    b.job(name, "repair (4 heads, built and measured)", lambda: repair(model, items), repeat=1, count=False)


def repair(model, items: int) -> dict:
    """A 4-head mean-ablation repair of the swapped-words case, built on half the items, measured on the others."""
    from surgeon import Case
    from surgeon.analyses.repair import repair_case

    words = _items(2 * max(items, 4))
    case = Case(name="gpu-bench", model="random", formats={"plain": scale.SWAPPED, "qa": scale.TEMPLATE},
                good="plain", bad="qa", items=words, align="last")
    L = model.cfg.n_layers
    heads = [f"L{L - 2}H{h}" for h in range(REPAIR_HEADS)]
    r = repair_case(case, model, heads=heads, mode="mean", neutral=["The cat sat on the mat."])
    return {"repair_heads": heads, "repair_evaluation_items": r.n_evaluation}


def _items(n: int):
    import random
    import string

    from surgeon import Item

    rng = random.Random(1)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(3))  # noqa: E731
    return [Item({"a": word(), "b": word()}, correct=" x", incorrect=" y") for _ in range(n)]


def memory_claim(b: Bench, name: str, model, items: int = scale.LLAMA_ITEMS) -> None:
    """Part B: the README's predicted peaks for the paper's workload, measured."""
    from surgeon.analyses.circuit import edge_scores
    from surgeon.engine import memory
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.edges import EdgeSite
    from surgeon.sites.nodes import Site

    cfg = model.cfg
    base, source = scale.llama_rows(scale.LLAMA_PROMPT, items), scale.llama_rows(scale.LLAMA_GOOD_PROMPT, items)
    site = EdgeSite.of(cfg)
    graph = (len(site.senders), len(site.edges))
    w = memory.model_bytes(model)
    budget = scale.GPU_BYTES
    b.say(f"\n== {name}, the paper's workload ({items} items x 2 answer rows, prompts of {scale.LLAMA_PROMPT} and "
          f"{scale.LLAMA_GOOD_PROMPT} tokens, align last), planned for {budget / 1e9:.0f} GB")
    layers = list(range(max(0, cfg.n_layers - 8), cfg.n_layers))
    for label, job, full in (("per-head patching, layers 24-31", memory.per_head(cfg, layers=layers),
                              memory.per_head(cfg)),
                             ("EAP", memory.eap(cfg, graph, 1), memory.eap(cfg, graph, 1))):
        p = memory.plan(cfg, base, source, "last", job, batch_size=256, budget=budget, weights=w, device="cuda:0")
        pf = memory.plan(cfg, base, source, "last", full, batch_size=256, budget=budget, weights=w, device="cuda:0")

        def run(job=job, bs=p.batch_size, label=label):
            if label == "EAP":
                c = Contrast(model, base, source, "last", batch_size=bs, sites=site.node_sites())
                edge_scores(c, site, "eap")
            else:
                sites = [Site.of("z", layer) for layer in layers]
                c = Contrast(model, base, source, "last", batch_size=bs, sites=sites)
                with torch.no_grad():
                    for s in sites:
                        c.run({s: torch.eye(cfg.n_heads)})
            return {"path": dict(c.execution)}

        b.job(name, f"{label} (batch size {p.batch_size})", run, repeat=1, count=False, predicted=p.peak,
              extra={"part": "memory", "batch_size": p.batch_size, "predicted_full_job": pf.peak,
                     "weights": w})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama8b,gpt2")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds after which no job starts")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", HERE / "results" / "gpu-run")))
    ap.add_argument("--save", action="store_true", help="also bench/results/gpu.{json,txt}")
    args = ap.parse_args()
    dev = args.device
    b = Bench(args.out, args.budget, dev)
    name = torch.cuda.get_device_name() if torch.device(dev).type == "cuda" else "cpu"
    from importlib.metadata import version

    tl = version("transformer-lens")
    b.data.update(device_name=name, torch=torch.__version__, transformer_lens=tl,
                  items=args.items, date=time.strftime("%Y-%m-%d"), peaks={},
                  matmul_peak={str(dt): matmul_peak(dev, dt) for dt in (torch.bfloat16, torch.float32)})
    from saving import run_record

    b.data["run"] = run_record("gpu")
    b.say(f"== {name}, torch {torch.__version__}, TransformerLens {tl}; matmul peak: "
          + ", ".join(f"{k.replace('torch.', '')} {v / 1e12:.0f} TFLOP/s" for k, v in b.data["matmul_peak"].items()))
    for mname in args.models.split(","):
        try:
            t0 = time.perf_counter()
            model = make_model(mname, dev)
            b.data["peaks"][mname] = b.data["matmul_peak"][str(model.cfg.dtype)]
            b.say(f"\n({mname}: built on the device in {time.perf_counter() - t0:.1f} s)")
            speed(b, mname, model, args.items)
            if mname == "llama8b" or (mname == "tiny" and dev == "cpu"):
                memory_claim(b, mname, model, scale.LLAMA_ITEMS if mname == "llama8b" else 2)
        except Exception as e:  # noqa: BLE001
            b.data["failed"].append({"model": mname, "job": "(model)", "error": repr(e),
                                     "traceback": traceback.format_exc()[-4000:]})
            b.say(f"{mname}: FAILED {e!r}")
        finally:
            model = None
            gc.collect()
            if torch.device(dev).type == "cuda":
                torch.cuda.empty_cache()
    b.say(f"\n(total {time.perf_counter() - b.t0:.0f} s)")
    if args.save:
        for f in ("gpu.json", "gpu.txt"):
            (HERE / "results" / f).write_text((args.out / f).read_text())
    return 1 if b.data["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
