"""Scale on real shapes: a GPT-2-small model and a Llama-3.1-8B-shaped one (random weights, on CPU).

  gpt2   GPT-2 small exactly: 12 layers x 12 heads, d_model 768, d_mlp 3,072, vocab 50,257, n_ctx 1,024
         (144 heads, 32,491 edges);
  llama  Llama-3.1-8B's layout narrowed in width: 32 layers x 32 query heads, 8 key/value heads, rotary, gated
         SiLU MLP, RMSNorm, vocab 128,256, but d_model 256 (d_head 8, d_mlp 896) so it fits a CPU
         (1,024 heads, 805,681 edges: the real graph).

Items are random three-letter words in a Q&A template, and the same template with the two words swapped as the
other run (equal lengths, so every position is aligned: align="index", the setting of MIB and of EAP-IG).
Each job runs at three sizes, items x prompt positions = 2 x 30, 4 x 30 and 2 x 58 (small: this is a 2-core CPU;
the costs' growth is the point), measured side by side in one run, twice, each time in a fresh process: once timed
(wall time, glibc's allocator as it comes; the floor, EAP and EAP-IG, a second or so each, the fastest of three
runs in that process), once for peak memory (the weights plus the peak the job adds to the
resident set, after one warm-up forward and backward has done the libraries' one-time set-up, as a GPU's allocator
counts a job; glibc's mmap threshold fixed at 128 KiB so freed tensors leave the resident set, as a GPU's allocator
would not count them; that costs page faults, hence the separate timed run):

  per-head sweep   every head of every layer patched alone (surgeon) vs the careful TransformerLens sweep (the
                   positions before the first differing one in a frozen KV cache, start_at_layer, a layer's heads in
                   the batch dimension, logits at the read position only: bench/careful.py; checked equal to
                   surgeon's scores by tests/test_bench.py) and, at the first size, vs TransformerLens's
                   generic_activation_patch with layer_head_vector_patch_setter over the same (layer, head) index (one
                   forward per head; timed on a sample of the index, scaled to all of it); then the work each way
                   computes (layer-positions): what skipping work can buy over each baseline;
  EAP              every edge's attribution, everything surgeon runs (the clean runs of both formats included) vs the
                   floor: one forward + backward of the failing run with the same TransformerLens blocks, weights
                   frozen, logits only at the read position;
  EAP-IG           eap-ig-inputs, 5 steps;
  exact top-200    the 200 top EAP edges each patched alone vs the careful per-edge loop (the common prefix in a
                   frozen KV cache, each edge from its receiver's layer, a layer's edges in the batch dimension, logits
                   at the read position; checked equal to surgeon's scores by tests/test_bench.py) and, at the first
                   size, vs the naive loop: one hooked forward per edge that splits only the receiver's block into
                   per-head inputs (timed on a sample, scaled to 200); then why the target is out of reach: the work
                   each way computes (layer-positions) and surgeon's run under torch.profiler;
  curve            MIB's faithfulness curve: 11 circuits, on the run discover evaluates circuits on (the source rows
                   with the base run's values, analyses/circuit_runs.py);
  smallest circuit the smallest top-k prefix of the EAP ranking with faithfulness >= 0.9 (bisection);
  subsets          a subset search over 16 heads of one layer (GPT-2: its 12 heads), size-8 (6) subsets, in
                   chunks of 256, at 128 and at 512 subsets.
The smallest-circuit search, the 128-subset search and the two naive loops run at the first size only. With
--save, bench/results/scale.json keeps every measurement (the README's summary table reads it).

Every surgeon job also prints surgeon's predicted peak (`surgeon.engine.memory`) and predicted forward passes
against the measured ones. Then the Llama-3.1-8B workload predicted on one 80 GB GPU.

    python bench/scale.py [--models gpt2,llama] [--threads 2] [--save]
    python bench/scale.py measure MODEL JOB[,JOB...] ITEMS WORDS [--batch-size 256] [--mode time --repeat 3]
                                                                                      (a JSON line per job)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import string
import subprocess
import sys
import time

import torch

TEMPLATE = "Q: is {a} {b} or {b} {a}?\nA:"
SWAPPED = "Q: is {b} {a} or {a} {b}?\nA:"
SIZES = ((2, 3), (4, 3), (2, 10))  # (items, letters per word): 30 positions, then twice the items, then 58 positions
JOBS = ("patch", "careful-patch", "tl-patch", "floor", "eap", "eap-ig", "exact", "careful-edge-loop", "edge-loop",
        "curve", "smallest", "subsets-128", "subsets-512")
# the slowest job, the second subset count (memory flat in it) and the two naive loops (beside the careful ones at
# every size; the naive ones are the slowest runs of the bench and their ratio to surgeon is not a goal)
FIRST_SIZE_ONLY = ("smallest", "subsets-128", "tl-patch", "edge-loop")
NAMES = {"patch": "per-head sweep", "careful-patch": "  careful TL (KV cache, batched)",
         "tl-patch": "  TL generic_activation_patch", "floor": "forward + backward (floor)",
         "eap": "EAP", "eap-ig": "EAP-IG (5 steps)", "exact": "exact top-200", "careful-edge-loop": "  careful TL (KV cache, batched)",
         "edge-loop": "  loop, one forward per edge",
         "curve": "faithfulness curve (11)", "smallest": "smallest circuit (f >= 0.9)",
         "subsets-128": "subsets: 128", "subsets-512": "subsets: 512"}
# the short jobs whose one run is mostly noise: timed as the fastest of three in their process (the floor and the
# jobs it is the unit of, on both sides of the EAP / floor ratio alike)
REPEAT = {"floor": 3, "eap": 3, "eap-ig": 3}
TL_SAMPLE = 24  # (layer, head) cells the TransformerLens sweep is timed on
LOOP_SAMPLE = 8  # edges the per-edge loop is timed on
SUBSET_LAYER = {"gpt2": 9, "llama": 28, "deep": 20, "gqa": 9, "parallel": 6}
HELD_OUT = ("deep", "gqa", "parallel")  # shapes the predictor's constants were not fitted to
# glibc's threshold fixed at 128 KiB in the process that measures memory: every tensor of that size or more is its own
# mapping, returned when freed, so the resident set follows the tensors alive (the adaptive default keeps freed memory
# in the heap, which inflates the high-water mark; a GPU's caching allocator does not count such memory as allocated
# either). It costs page faults (the per-head sweep took twice as long, EAP three times), so times come from a
# separate process under glibc's default.
MMAP_THRESHOLD = 128 << 10


def make_model(name: str):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from surgeon.organisms.charset import build_tokenizer

    tok = build_tokenizer(f"bench-{name}")
    if name == "gpt2":
        cfg = HookedTransformerConfig(n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072, n_ctx=1024,
                                      d_vocab=50257, act_fn="gelu_new", normalization_type="LN", seed=0,
                                      default_prepend_bos=True)
    elif name == "llama":
        cfg = HookedTransformerConfig(n_layers=32, d_model=256, n_heads=32, d_head=8, n_key_value_heads=8, d_mlp=896,
                                      n_ctx=2048, d_vocab=128256, act_fn="silu", gated_mlp=True,
                                      normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=8,
                                      rotary_base=500000, final_rms=True, seed=0, default_prepend_bos=True)
    elif name == "deep":  # held out from fitting: deeper and narrower than GPT-2 small, the same family
        cfg = HookedTransformerConfig(n_layers=24, d_model=128, n_heads=4, d_head=32, d_mlp=512, n_ctx=1024,
                                      d_vocab=50257, act_fn="gelu_new", normalization_type="LN", seed=0,
                                      default_prepend_bos=True)
    elif name == "gqa":  # held out: grouped-query attention, RMSNorm, rotary, gated MLP (Qwen2/Mistral's layout)
        cfg = HookedTransformerConfig(n_layers=12, d_model=192, n_heads=12, d_head=16, n_key_value_heads=4, d_mlp=512,
                                      n_ctx=2048, d_vocab=32000, act_fn="silu", gated_mlp=True,
                                      normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=16,
                                      final_rms=True, seed=0, default_prepend_bos=True)
    elif name == "parallel":  # held out: attention and MLP in parallel from one residual stream (GPT-J/NeoX's)
        cfg = HookedTransformerConfig(n_layers=8, d_model=256, n_heads=8, d_head=32, d_mlp=1024, n_ctx=2048,
                                      d_vocab=50400, act_fn="gelu_new", normalization_type="LN",
                                      positional_embedding_type="rotary", rotary_dim=8, parallel_attn_mlp=True,
                                      seed=0, default_prepend_bos=True)
    elif name.startswith("gpt2-L") and "-d" in name:  # bench/growth.py's family: gpt2-L{layers}-d{d_model}, 8 heads
        layers, width = (int(x) for x in name[len("gpt2-L"):].split("-d"))
        cfg = HookedTransformerConfig(n_layers=layers, d_model=width, n_heads=8, d_head=width // 8, d_mlp=4 * width,
                                      n_ctx=1024, d_vocab=50257, act_fn="gelu_new", normalization_type="LN", seed=0,
                                      default_prepend_bos=True)
    else:
        raise SystemExit(f"unknown model {name!r}: one of {', '.join(SUBSET_LAYER)} or gpt2-L<layers>-d<d_model>")
    model = HookedTransformer(cfg, tokenizer=tok)
    model.eval()
    for p in model.parameters():  # nothing here trains: gradients are taken w.r.t. masks or activations only
        p.requires_grad_(False)
    return model


def make_rows(model, n_items: int, letters: int):
    from surgeon import Item
    from surgeon.case.encoding import encode_rows

    rng = random.Random(0)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(letters))  # noqa: E731
    items = [Item({"a": word(), "b": word()}, correct=" x", incorrect=" y") for _ in range(n_items)]
    base = encode_rows(TEMPLATE, items, model.tokenizer, True, "first_token")
    source = encode_rows(SWAPPED, items, model.tokenizer, True, "first_token")
    return base, source


def subset_masks(n: int, H: int, k: int, seed: int = 0) -> torch.Tensor:
    """`n` distinct size-`k` subsets of the first 16 heads (all heads when fewer), as [n, H] masks."""
    rng = random.Random(seed)
    pool = min(16, H)
    if n > math.comb(pool, k):
        raise SystemExit(f"{n} distinct subsets of {k} of {pool} heads asked for; there are {math.comb(pool, k)}")
    seen, out = set(), []
    while len(out) < n:
        s = tuple(sorted(rng.sample(range(pool), k)))
        if s not in seen:
            seen.add(s)
            m = torch.zeros(H)
            m[list(s)] = 1
            out.append(m)
    return torch.stack(out)


# ----------------------------------------------------------------------------- one job, in this process
def measure(model_name: str, job: str, n_items: int, letters: int, batch_size: int = 256, sample: int | None = None,
            repeat: int = 1, count: bool = False) -> dict:
    """Build the model and rows, run `job` (`repeat` times, its wall time the fastest: a short job's single run is
    mostly noise on a shared CPU), return its wall time, peak memory (of the first run), prediction and forwards;
    with `count`, then one more run under torch's FlopCounterMode for its work (`flops`), and the least work the
    method needs (`least`, `least_work`)."""
    import gc

    import numpy as np

    from surgeon.analyses.circuit import CURVE, edge_scores, prune
    from surgeon.analyses.circuit_runs import CircuitRuns
    from surgeon.circuits.graph import build_graph
    from surgeon.engine import memory
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.edges import EdgeSite
    from surgeon.sites.nodes import Site

    import transformer_lens  # noqa: F401,I001  (its import is the process's, not the model's)

    rss0 = memory.resident()
    model = make_model(model_name)
    cfg = model.cfg
    weights = memory.model_bytes(model)
    base, source = make_rows(model, n_items, letters)
    H, L = cfg.n_heads, cfg.n_layers
    out = {"model": model_name, "job": job, "items": n_items, "positions": len(base[0].tokens), "weights": weights,
           "batch_size": batch_size}
    edge_job = job in ("eap", "eap-ig", "exact", "exact-profile", "edge-loop", "careful-edge-loop", "curve", "smallest",
                       "floor")
    site = EdgeSite.of(cfg) if edge_job else None
    graph = (len(site.senders), len(site.edges)) if edge_job else None
    pre = {}
    if job in ("exact", "exact-profile", "edge-loop", "careful-edge-loop", "smallest"):  # the EAP ranking these start from (not measured)
        c = Contrast(model, base, source, "index", batch_size=batch_size, sites=site.node_sites())
        scores = edge_scores(c, site, "eap")
        pre["order"] = np.argsort(-np.abs(scores), kind="stable")
        pre["scores"] = scores
        del c
    warm_up(model, base)
    gc.collect()
    plan_rows = (source, base) if job in ("curve", "smallest") else (base, source)  # the rows the job's contrast holds

    def once():  # the job: returns (forward passes counted, the memory plan's job) where surgeon runs it
        if job == "patch":
            sites = [Site.of("z", layer) for layer in range(L)]
            c = Contrast(model, base, source, "index", batch_size=batch_size, sites=sites)
            with torch.no_grad():
                for s in sites:
                    c.run({s: torch.eye(H)})
            return c.execution["forwards"], memory_job(cfg, job, graph, model_name)
        elif job.startswith("subsets"):
            n = int(job.split("-")[1])
            layer = SUBSET_LAYER.get(model_name, L - 1)
            s = Site.of("z", layer)
            c = Contrast(model, base, source, "index", batch_size=batch_size, sites=[s])
            masks = subset_masks(n, H, min(16, H) // 2)
            with torch.no_grad():
                for lo in range(0, n, 256):
                    c.run({s: masks[lo: lo + 256]})
            return c.execution["forwards"], memory_job(cfg, job, graph, model_name)
        elif job in ("eap", "eap-ig"):
            c = Contrast(model, base, source, "index", batch_size=batch_size, sites=site.node_sites())
            edge_scores(c, site, "eap" if job == "eap" else "eap-ig-inputs", 5)
            return c.execution["forwards"], memory_job(cfg, job, graph, model_name)
        elif job == "exact":
            c = Contrast(model, base, source, "index", batch_size=batch_size, sites=site.node_sites())
            top = pre["order"][:200]
            onehot = torch.zeros(len(top), len(site.edges))
            onehot[torch.arange(len(top)), torch.as_tensor(top)] = 1
            with torch.no_grad():
                c.run({site: onehot})
            return c.execution["forwards"], memory_job(cfg, job, graph, model_name)
        elif job == "curve":  # on the run discover evaluates circuits on: the source rows, the base run's values
            rev = reversed_contrast(model, site, base, source, batch_size)
            order = np.random.default_rng(0).permutation(len(site.edges))
            E = len(site.edges)
            CircuitRuns(rev, site, rev, site, "kept", "resample", {}).value(
                [order[: max(1, round(f * E))] for f in (0.0,) + CURVE])
            return rev.execution["forwards"], memory_job(cfg, job, graph, model_name)
        elif job == "smallest":
            c = reversed_contrast(model, site, base, source, batch_size)  # the run discover evaluates circuits on
            runs = CircuitRuns(c, site, c, site, "kept", "resample", {})
            runs.empty  # noqa: B018  (m(empty), as discover computes it before the search)
            g = build_graph(site, pre["scores"], {})
            _, search = prune(runs, g, pre["order"], 0.9, None)
            out["search"] = search.get("describe")
            return c.execution["forwards"], memory.circuits(cfg, graph, 16, max(1, search.get("evaluated", 1) // 16))
        elif job == "floor":
            from careful import forward_backward, read_at

            forward_backward(model, torch.tensor([r.tokens for r in base]), *read_at(base))
        elif job == "tl-patch":
            out["projected"] = tl_patch(model, base, source, sample or TL_SAMPLE)
        elif job == "careful-patch":
            careful_patch(model, base, source, None if sample is None else range(cfg.n_layers - 2, cfg.n_layers))
        elif job == "edge-loop":
            out["projected"] = edge_loop(model, site, base, source, pre["order"][:200], sample or LOOP_SAMPLE)
        elif job == "careful-edge-loop":
            careful_edge_loop(model, site, base, source, pre["order"][:200], batch_size)
        elif job == "exact-profile":
            out.update(exact_profile(model, site, base, source, pre["order"][:200], batch_size))
        else:
            raise SystemExit(f"unknown job {job!r}")
        return None, None

    with memory.peak_memory() as m:
        t0 = time.perf_counter()
        counted, mem_job = once()
        seconds = [time.perf_counter() - t0]
    for _ in range(repeat - 1 if "projected" not in out else 0):  # timed again after the measured peak (the first's)
        gc.collect()
        t0 = time.perf_counter()
        once()
        seconds.append(time.perf_counter() - t0)
    out["seconds"] = out["projected"] if "projected" in out else min(seconds)
    if count:  # after the timed runs, apart from them: the counter's own cost never enters a time
        from limit import count_flops

        gc.collect()
        out["flops"] = None if "projected" in out else count_flops(once)
        out["least"] = least_work(model, model_name, job, base, source, site, pre)
    # the job's memory: what it added to the resident set at its peak (as a GPU's allocator counts it), on top of the
    # weights; what was resident before it began (the rows, a ranking computed before, the libraries' set-up and the
    # Python objects of the model beyond its tensors) is kept apart
    out["measured"] = weights + m["peak"]
    out["held"] = m["before"] - rss0
    if mem_job is not None:
        p = memory.predict_rows(cfg, *plan_rows, "index", mem_job, batch_size, weights=weights)
        out.update(predicted=p.peak, parts=p.parts, forwards_predicted=p.forwards, forwards_bound=p.forwards_bound,
                   forwards=counted)
    return out


def least_work(model, model_name: str, job: str, base, source, site, pre: dict) -> float | None:
    """The matrix-multiply FLOPs `job`'s method cannot skip on these rows (None for the smallest-circuit search, whose
    least depends on the path it takes): layer-positions as `sweep_work` and `exact_work` count them, each at the
    model's mean FLOPs per layer-position (`limit.block_flops`), less what the patched layer itself need not run (a
    head's output patched: no attention there; an MLP's input: only that MLP) and the last layer's positions that
    are not read, the logits at the positions read, and one clean run of each prompt (the patched values and the
    clean scores: `limit.clean_least`). EAP's least is the floor (one forward and backward of the failing run, weights
    frozen, counted), a forward of the other prompt and the edges' dot products from the first differing position on
    (`limit.edge_dot_least`); EAP-IG's, five such forward-and-backward passes, a clean run of each prompt and the dot
    products once (its sender differences are fixed, so the steps' gradients can be summed before them). The
    faithfulness curve's: each circuit's run from the first differing position on, and one product per edge in the
    circuit carrying its sender's value into its receiver's input (a dense mask multiplies by every zero too)."""
    from careful import forward_backward, read_at, shared_prefix
    from limit import (block_flops, clean_least, count_flops, edge_dot_least, edge_patch_least, head_patch_least,
                       read_positions, unembed_flops)

    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    toks, p0 = shared_prefix(base, source)
    R, T = toks.shape
    Ts = len(source[0].tokens)
    lp, rd = block_flops(model, toks), unembed_flops(cfg)
    reads = read_positions(base)  # read positions in one pass over the rows
    clean = (R * T + R * Ts) * L * lp

    def floor():
        return count_flops(lambda: forward_backward(model, toks, *read_at(base)))

    if job in ("patch", "careful-patch", "tl-patch"):
        return head_patch_least(cfg, lp, R * (T - p0), [{layer: h} for layer in range(L) for h in range(H)], reads,
                                R * T + R * Ts)
    if job in ("exact", "careful-edge-loop", "edge-loop", "exact-profile"):
        recs = [site.receivers[site.edges[int(e)][1]] for e in pre["order"][:200]]
        return edge_patch_least(cfg, lp, recs, R * (T - p0), reads, R * T + R * Ts)
    if job == "floor":
        return floor()
    dots = edge_dot_least(len(site.edges), R * (T - p0), cfg.d_model) if site is not None else 0
    if job == "eap":
        return floor() + R * Ts * L * lp + dots
    if job == "eap-ig":  # five forward-and-backward passes at the interpolated inputs, the two runs' activations
        return 5 * floor() + clean + dots
    if job == "curve":  # every circuit changes every layer from the first differing position on, and each of its
        # edges carries its sender's value into its receiver's input there (one product per edge, as EAP's dots)
        from surgeon.analyses.circuit import CURVE

        n, E = len(CURVE) + 1, len(site.edges)
        carried = sum(edge_dot_least(max(1, round(f * E)), R * (T - p0), cfg.d_model) for f in (0.0,) + CURVE)
        return (n * (R * (T - p0) * (L - 1) + reads) * lp + n * reads * rd + clean_least(cfg, lp, R * T + R * Ts, reads)
                + carried)
    if job.startswith("subsets"):  # every subset's lowest patched layer is SUBSET_LAYER's
        n, layer = int(job.split("-")[1]), SUBSET_LAYER.get(model_name, L - 1)
        return head_patch_least(cfg, lp, R * (T - p0), [{layer: i} for i in range(n)], reads, R * T + R * Ts)
    return None


def memory_job(cfg, job: str, graph: tuple[int, int] | None, model_name: str):
    """The engine's description (surgeon.engine.memory) of a surgeon job of this bench as `measure` runs it: what its
    prediction is made from (the subset search at the model's SUBSET_LAYER, the last layer elsewhere)."""
    from surgeon.engine import memory

    if job == "patch":
        return memory.per_head(cfg)
    if job.startswith("subsets"):
        return memory.subsets(cfg, SUBSET_LAYER.get(model_name, cfg.n_layers - 1), int(job.split("-")[1]))
    if job in ("eap", "eap-ig"):
        return memory.eap(cfg, graph, 1 if job == "eap" else 5)
    if job == "exact":
        return memory.exact_edges(cfg, graph, 200)
    if job == "curve":
        return memory.circuits(cfg, graph, 11)
    raise ValueError(f"no memory plan for job {job!r}")


def warm_up(model, rows) -> None:
    """One forward and backward of `model` on `rows` (the floor's), dropped: the libraries' one-time set-up (thread
    pools, oneDNN/MKL kernels and their scratch space, autograd's engine) happens here, outside the measured peak."""
    from careful import forward_backward, read_at

    forward_backward(model, torch.tensor([r.tokens for r in rows]), *read_at(rows))


def reversed_contrast(model, site, base, source, batch_size: int):
    """The contrast discover evaluates circuits on under resample ablation (analyses/circuit_runs.py): the source
    format's rows run, the base format's sender outputs are what an edge outside the circuit carries."""
    from surgeon.engine.contrast import Contrast

    return Contrast(model, source, base, "index", batch_size=batch_size, sites=site.node_sites())


def tl_patch(model, base, source, n_sample: int = TL_SAMPLE) -> float:
    """TransformerLens's per-head sweep: the other run's cache once, then generic_activation_patch over a sample of
    the (layer, head) index; returns the seconds projected to the whole index (the cache's once, the rest per cell)."""
    import pandas as pd
    from transformer_lens import patching

    cfg = model.cfg
    toks = torch.tensor([r.tokens for r in base])
    src = torch.tensor([r.tokens for r in source])
    idx = torch.arange(len(base))
    tgt = torch.tensor([r.targets[0][1] for r in base])
    pos = torch.tensor([r.targets[0][0] for r in base])

    def metric(logits):
        return logits.log_softmax(-1)[idx, pos, tgt].mean()

    with torch.no_grad():
        t0 = time.perf_counter()
        _, cache = model.run_with_cache(src, names_filter=lambda name: name.endswith("hook_z"))
        setup = time.perf_counter() - t0
        cells = [(layer, h) for layer in range(cfg.n_layers) for h in range(cfg.n_heads)]
        sample = cells[:: max(1, len(cells) // n_sample)][:n_sample]
        index = pd.DataFrame(sample, columns=["layer", "head_index"])
        t0 = time.perf_counter()
        patching.generic_activation_patch(model, toks, cache, metric, patching.layer_head_vector_patch_setter, "z",
                                          index_df=index)
        per_cell = (time.perf_counter() - t0) / len(sample)
    return setup + per_cell * len(cells)


def careful_patch(model, base, source, layers=None) -> torch.Tensor:
    """The per-head sweep as a careful TransformerLens user writes it (bench/careful.py): the positions before the
    first one where the two prompts differ run once into a frozen KV cache, each layer's patched runs start at that
    layer from the clean residual stream, the layer's heads go in the batch dimension, and only the read positions are
    unembedded. Returns the scores [layers, heads, rows] (sum of sign x log P over each row's targets)."""
    from careful import prefix_cache, read_at, read_logprobs, read_signs, repeated, shared_prefix, suffix_residual

    cfg = model.cfg
    H = cfg.n_heads
    toks, p0 = shared_prefix(base, source)
    src = torch.tensor([r.tokens for r in source])
    pos, tok = read_at(base)
    sign = read_signs(base)
    R, heads = len(base), torch.arange(H)
    layers = range(cfg.n_layers) if layers is None else layers
    out = torch.zeros(len(layers), H, R)
    with torch.no_grad():
        _, cache = model.run_with_cache(src, names_filter=lambda name: name.endswith("hook_z"))
        kv = prefix_cache(model, toks[:, :p0])
        kv_h = repeated(kv, H)
        read = (pos - p0).repeat(H, 1)
        for i, layer in enumerate(layers):
            resid = suffix_residual(model, toks[:, p0:], kv, layer).repeat(H, 1, 1)
            patch = cache[f"blocks.{layer}.attn.hook_z"][:, p0:].permute(2, 0, 1, 3)  # [head, row, pos, d_head]

            def hook(z, hook, patch=patch):
                z.view(H, R, *z.shape[1:])[heads, :, :, heads] = patch
                return z

            with model.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_z", hook)]):
                final = model(resid, start_at_layer=layer, stop_at_layer=cfg.n_layers, past_kv_cache=kv_h)
            logp = read_logprobs(model, final, read).gather(-1, tok.repeat(H, 1)[..., None])[..., 0]
            out[i] = (logp * sign.repeat(H, 1)).sum(-1).view(H, R)
    return out


def edge_loop(model, site, base, source, top, n_sample: int = LOOP_SAMPLE) -> float:
    """One hooked forward per edge (receiver's block split): both runs' sender outputs once, then a sample of the
    top edges; returns the seconds projected to all of them (the setup once, the rest per edge)."""
    sys.path.insert(0, os.path.dirname(__file__))
    from edges import Reference

    t0 = time.perf_counter()
    ref = Reference(model, site, base, source, "index")
    setup = time.perf_counter() - t0
    sample = [int(e) for e in top[:: max(1, len(top) // n_sample)][:n_sample]]
    t0 = time.perf_counter()
    for e in sample:
        ref.edge(e)
    return setup + (time.perf_counter() - t0) / len(sample) * len(top)


def careful_edge_loop(model, site, base, source, top, batch_size: int = 256) -> torch.Tensor:
    """Exact edge patching as a careful TransformerLens user writes it: both runs' sender outputs once (edges.py's
    Reference), the positions before the first one where the prompts differ in a frozen KV cache, each edge's patched
    run starting at its receiver's layer from the clean residual stream there (`start_at_layer`), the edges of one
    receiver layer in the batch dimension (as many as surgeon's batch of rows allows), the receiver's input split per
    head only in that block, logits only at the read positions. Returns the scores [edges, rows] (sum of sign x log P
    over each row's targets), which tests/test_bench.py checks equal to surgeon's."""
    from collections import defaultdict

    from careful import prefix_cache, read_at, read_logprobs, read_signs, repeated, shared_prefix, suffix_residual
    from edges import Reference

    from surgeon.sites.edges import split_inputs

    L = model.cfg.n_layers
    toks, p0 = shared_prefix(base, source)
    pos, tok = read_at(base)
    sign = read_signs(base)
    R = len(base)
    chunk = max(1, batch_size // R)
    groups = defaultdict(list)  # receiver layer (L: the logits) -> [(index in top, sender, receiver)]
    for i, e in enumerate(top):
        s, r = site.edges[int(e)]
        rec = site.receivers[r]
        groups[L if rec.kind == "logits" else rec.layer].append((i, s, rec))
    out = torch.zeros(len(top), R)
    with torch.no_grad():
        ref = Reference(model, site, base, source, "index")  # every position aligned: ref.pb is 0..T-1 per row
        delta = ref.delta[:, p0:]  # [R, T - p0, senders, d]
        kv = prefix_cache(model, toks[:, :p0])
        read = pos - p0
        for layer, group in sorted(groups.items()):
            clean = suffix_residual(model, toks[:, p0:], kv, layer) if layer < L else model(
                toks[:, p0:], past_kv_cache=kv, stop_at_layer=L)
            for lo in range(0, len(group), chunk):
                part = group[lo: lo + chunk]
                B = len(part)
                x = clean.repeat(B, 1, 1)
                if layer == L:  # an edge into the logits: the final residual stream plus the sender's difference
                    for j, (_, s, _) in enumerate(part):
                        x.view(B, R, *x.shape[1:])[j] += delta[:, :, s]
                else:
                    at = defaultdict(list)
                    for j, (_, s, rec) in enumerate(part):
                        name, unit = ref.hook_name(rec)
                        at[name].append((j, unit, s))

                    def patch(act, hook, entries=None):
                        act = act.clone()  # per-head inputs are an expanded view of the residual stream
                        a = act.view(B, R, *act.shape[1:])
                        for j, unit, s in entries:
                            if unit is None:
                                a[j] += delta[:, :, s]
                            else:
                                a[j, :, :, unit] += delta[:, :, s]
                        return act

                    hooks = [(name, lambda act, hook, e=entries: patch(act, hook, e)) for name, entries in at.items()]
                    qkv = {layer} if any(rec.kind in "qkv" for _, _, rec in part) else set()
                    with split_inputs(model, qkv), model.hooks(fwd_hooks=hooks):
                        x = model(x, start_at_layer=layer, stop_at_layer=L, past_kv_cache=repeated(kv, B))
                logp = read_logprobs(model, x, read.repeat(B, 1)).gather(-1, tok.repeat(B, 1)[..., None])[..., 0]
                out[[i for i, _, _ in part]] = (logp * sign.repeat(B, 1)).sum(-1).view(B, R)
    return out


def exact_work(model, site, base, source, top) -> dict:
    """Layer-positions (one block at one position of one row) each way of patching the `top` edges alone computes:
    the loop runs every block at every position per edge; the least any method needs that patches each edge alone is
    the blocks from the receiver's layer on (none for an edge into the logits: its readout only) at the positions
    from the first one where the prompts differ. Their ratio bounds what skipping work can buy over the loop."""
    from careful import shared_prefix

    L = model.cfg.n_layers
    toks, p0 = shared_prefix(base, source)
    T = toks.shape[1]
    layers = [L if site.receivers[site.edges[int(e)][1]].kind == "logits" else site.receivers[site.edges[int(e)][1]].layer
              for e in top]
    R = len(base)
    return {"loop": len(top) * R * T * L, "least": sum(R * (T - p0) * (L - layer) for layer in layers),
            "first_differing": p0, "positions": T, "mean_receiver_layer": sum(layers) / len(layers), "layers": L}


def sweep_work(model, base, source) -> dict:
    """Layer-positions (one block at one position of one row) each way of patching every head alone computes: the
    naive sweep (generic_activation_patch) runs a full forward per head; the least any method needs is each head's
    copy from its own layer on, at the positions from the first one where the prompts differ; the careful sweep
    computes that and its clean runs (the source run, the shared prefix, and the clean suffix up to each layer)."""
    from careful import shared_prefix

    L, H = model.cfg.n_layers, model.cfg.n_heads
    toks, p0 = shared_prefix(base, source)
    R, T = len(base), toks.shape[1]
    least = sum(H * R * (T - p0) * (L - layer) for layer in range(L))
    clean = R * len(source[0].tokens) * L + R * p0 * L + sum(R * (T - p0) * layer for layer in range(L))
    return {"naive": L * H * R * T * L, "least": least, "careful": least + clean, "first_differing": p0, "positions": T}


def exact_profile(model, site, base, source, top, batch_size: int) -> dict:
    """Surgeon's exact top-200 under torch.profiler: the operators by share of self CPU time, and the work counts."""
    from torch.profiler import ProfilerActivity, profile

    from surgeon.engine.contrast import Contrast

    c = Contrast(model, base, source, "index", batch_size=batch_size, sites=site.node_sites())
    onehot = torch.zeros(len(top), len(site.edges))
    onehot[torch.arange(len(top)), torch.as_tensor(top)] = 1
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        c.run({site: onehot})
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    ops = sorted(((e.key, e.self_cpu_time_total / total) for e in events), key=lambda x: -x[1])
    return {"ops": ops[:8], "work": exact_work(model, site, base, source, top), "execution": c.execution}


# ----------------------------------------------------------------------------- the bench
def run_one(model: str, job: str, items: int, letters: int, threads: int, count: bool = False) -> dict:
    """The job twice, each in a fresh process: timed under glibc's own allocator (as a user runs it; with `count`, its
    work counted after the timed runs), and measured for memory with the mmap threshold fixed (baselines on a smaller
    sample there: one forward each is their peak)."""
    out = {}
    for mode in ("time", "memory"):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        if mode == "memory":
            env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
        r = subprocess.run([sys.executable, __file__, "measure", model, job, str(items), str(letters),
                            "--threads", str(threads), "--mode", mode, "--repeat", str(REPEAT.get(job, 1))]
                           + (["--count"] if count and mode == "time" else []),
                           capture_output=True, text=True, env=env)
        if r.returncode:
            raise SystemExit(f"{model} {job} {items}x{letters} ({mode}) failed:\n{r.stderr[-3000:]}")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        if mode == "time":
            out.update({k: res[k] for k in ("seconds", "flops", "least") if k in res})
        else:
            out.update({k: v for k, v in res.items() if k != "seconds"})
    return out


def above(r: dict) -> float:
    """Predicted / measured peak, both less the weights (what the predictor models rather than counts)."""
    return (r["predicted"] - r["weights"]) / (r["measured"] - r["weights"])


def mib(x: float) -> str:
    return f"{x / 2**20:,.0f}"


def memory_goal(worst: float) -> str:
    """The memory benches' verdict line (bench/memory.py, bench/features.py): the goal and the worst miss."""
    shown = f"{worst:.0%}" if round(worst, 2) != 0.3 else f"{math.ceil(worst * 1000) / 10:.1f}%"  # no "30% (MISSED)"
    return (f"  goal: predicted memory above the weights within 30% of the measured on held-out shapes: within "
            f"{shown} ({'met' if worst <= 0.3 else 'MISSED'})")


def growth(a: dict, b: dict, key: str, minus: str | None = None) -> float:
    va, vb = a[key] - (a[minus] if minus else 0), b[key] - (b[minus] if minus else 0)
    return vb / va if va > 0 else float("nan")


def profile_one(model: str, items: int, letters: int, threads: int) -> dict:
    """The exact-profile job in one fresh process (timed runs come from run_one; this one is under the profiler)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run([sys.executable, __file__, "measure", model, "exact-profile", str(items), str(letters),
                        "--threads", str(threads), "--mode", "time"], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{model} exact-profile {items}x{letters} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


WORK_SIZE = SIZES[2]  # the size whose work is counted and set against the machine's limit (the README's)
# per surgeon job, the careful baseline set beside it in the work table
PEERS = {"patch": "careful-patch", "exact": "careful-edge-loop", "eap": None, "eap-ig": None, "curve": None,
         "subsets-512": None, "floor": None}


def job_limit(model, items: int, letters: int):
    """The matrix-multiply peak at this model's shapes for rows of this size (a clean run's rows x positions, and a
    full batch of token rows: `limit.model_shapes`), and the machine's limit."""
    from limit import Limit, model_shapes

    base, _ = make_rows(model, items, letters)
    return Limit.measure(model_shapes(model.cfg, sum(len(r.tokens) for r in base), reads=len(base)))


def limit_section(res: dict, lim, positions: int) -> None:
    """Per job at WORK_SIZE, each side's time, work, the least work its method needs, and its share of the peak;
    then the goals against the limit, met or MISSED."""
    from limit import cell, goals, header, row

    items = WORK_SIZE[0]
    print(f"\nwork and speed against this machine's limit at {items} x {positions} (work: the matrix-multiply FLOPs "
          f"of one more run of each job under torch's FlopCounterMode, apart from its timing; least: what the method "
          f"cannot skip, bench/scale.py's least_work; of peak: GFLOP/s over the peak at the model's shapes)")
    print("  " + lim.line("the model's shapes"))
    print("  " + header())
    cells = {}
    for job, peer in PEERS.items():
        r = res[(job, *WORK_SIZE)]
        cells[job] = cell(r["seconds"], r.get("flops"), r.get("least"), lim)
        print("  " + row(NAMES[job].strip(), "surgeon" if job != "floor" else "floor", cells[job]))
        if peer:
            b = res[(peer, *WORK_SIZE)]
            print("  " + row("", "careful", cell(b["seconds"], b.get("flops"), b.get("least"), lim)))
    print("goals against the limit (work <= 1.2x the least; >= 50% of the peak where the shapes reach the limit)")
    for job in PEERS:
        if job != "floor":
            for line in goals(NAMES[job].strip(), cells[job], lim):
                print(line)


def bench_model(name: str, threads: int, data: dict | None = None) -> list[str]:
    from surgeon.sites.edges import EdgeSite

    model = make_model(name)
    cfg = model.cfg
    E = len(EdgeSite.of(cfg).edges)
    lines = []
    p = print
    title = {"gpt2": "GPT-2 small", "llama": "Llama-3.1-8B-shaped, d_model 256"}.get(name, name)
    p(f"\n== {title} (random weights): {cfg.n_layers} layers x {cfg.n_heads} heads"
      f"{f' ({cfg.n_key_value_heads} key/value)' if cfg.n_key_value_heads else ''}, d_model {cfg.d_model}, "
      f"vocab {cfg.d_vocab:,}; {cfg.n_layers * cfg.n_heads:,} heads, {E:,} edges; {threads} threads")
    work = sweep_work(model, *make_rows(model, *SIZES[0]))
    lim = job_limit(model, *WORK_SIZE)
    del model
    res = {}
    for items, letters in SIZES:
        for job in JOBS:
            if job in FIRST_SIZE_ONLY and (items, letters) != SIZES[0]:
                continue
            res[(job, items, letters)] = run_one(name, job, items, letters, threads, (items, letters) == WORK_SIZE)
    prof = profile_one(name, *SIZES[0], threads)
    if data is not None:  # the raw measurements, for the README's summary table (docs/readme.py)
        data[name] = {"jobs": [dict(r, job=j, letters=w) for (j, _, w), r in res.items()], "exact_profile": prof,
                      "config": {"layers": cfg.n_layers, "heads": cfg.n_heads, "d_model": cfg.d_model, "edges": E},
                      "limit": lim.record()}
    pos = {s: res[("patch", *s)]["positions"] for s in SIZES}
    weights = res[("patch", *SIZES[0])]["weights"]
    p(f"weights {mib(weights)} MiB; MiB = the weights + the peak the job adds to the resident set (after a warm-up pass); "
      f"pred = surgeon's predicted peak / the measured one, both above the weights")
    header = f"{'job':32s}" + "".join(f"{f'{i} x {pos[(i, w)]}':>26s}" for i, w in SIZES)
    p(header)
    p(f"{'':32s}" + "".join(f"{'s':>9s}{'MiB':>8s}{'pred':>9s}" for _ in SIZES))
    for job in JOBS:
        row = f"{NAMES[job]:32s}"
        for s in SIZES:
            r = res.get((job, *s))
            if r is None:
                row += f"{'':>26s}"
                continue
            pred = f"{above(r):.2f}x" if "predicted" in r else ""
            row += f"{r['seconds']:9.2f}{mib(r['measured']):>8s}{pred:>9s}"
        p(row)
    first = SIZES[0]
    fw = [f"{NAMES[j].strip()} {r['forwards']}{' <= ' if r['forwards_bound'] else ' = '}{r['forwards_predicted']}"
          for j in JOBS for r in [res[(j, *first)]] if r.get("forwards") is not None]
    p(f"forward passes at {first[0]} x {pos[first]}, counted vs predicted: " + "; ".join(fw))
    r = res[("eap", *SIZES[2])]
    senders, edges = len(EdgeSite.of(cfg).senders), E
    per_edge = 2 * SIZES[2][0] * r["positions"] * edges * cfg.d_model * 4
    p(f"edge buffers: a buffer per edge (2 runs x rows x positions x edges x d_model) would hold {mib(per_edge)} MiB at "
      f"{SIZES[2][0]} x {r['positions']}; per sender ({senders:,} senders) {mib(per_edge * senders / edges)} MiB; "
      f"EAP's measured peak above the weights: {mib(r['measured'] - r['weights'])} MiB")
    # growth
    res_of = lambda j: [res.get((j, *s)) for s in SIZES]  # noqa: E731
    p(f"\ngrowth (time; memory above the weights), per doubling of items ({SIZES[0][0]} -> {SIZES[1][0]}) and of "
      f"positions ({pos[SIZES[0]]} -> {pos[SIZES[2]]}, x{pos[SIZES[2]] / pos[SIZES[0]]:.2f}):")
    for job in ("patch", "eap", "eap-ig", "exact", "curve", "subsets-512"):
        a, b, c = res_of(job)
        p(f"  {NAMES[job].strip():28s} items: time x{growth(a, b, 'seconds'):.2f}, memory "
          f"x{growth(a, b, 'measured', 'weights'):.2f};  positions: time x{growth(a, c, 'seconds'):.2f}, memory "
          f"x{growth(a, c, 'measured', 'weights'):.2f}")
    s5, s20 = res[("subsets-128", *first)], res[("subsets-512", *first)]
    limit_section(res, lim, pos[WORK_SIZE])
    # the peers, side by side; the goals against the machine's limit are above
    p("\nagainst the peers (goal: ahead of each careful baseline, baseline / surgeon >= 1)")
    for s in SIZES:
        r_eap, r_floor = res[("eap", *s)], res[("floor", *s)]
        ratio = r_eap["seconds"] / r_floor["seconds"]
        p(f"  EAP / floor at {s[0]} x {pos[s]}: {ratio:.2f}x time, memory above weights "
          f"x{growth(r_floor, r_eap, 'measured', 'weights'):.2f}"
          f"{'  [EAP: clean runs of both formats + forward/backward of the masked core; floor: one forward + backward of the failing run, weights frozen, logits at the read position only]' if s == SIZES[0] else ''}")
    for s in SIZES:
        r_ex, r_c = res[("exact", *s)], res[("careful-edge-loop", *s)]
        ratio = r_c["seconds"] / r_ex["seconds"]
        naive = res.get(("edge-loop", *s))
        p(f"  exact top-200 vs the careful per-edge loop at {s[0]} x {pos[s]}: {ratio:.2f}x "
          f"({'met' if ratio >= 1 else 'MISSED'})" + (f"; vs the naive loop (one full forward per edge) "
                                                      f"{naive['seconds'] / r_ex['seconds']:.1f}x" if naive else ""))
    w = prof["work"]
    p(f"    why, at {first[0]} x {pos[first]}: the naive loop computes {w['loop']:,} layer-positions (200 edges x rows x "
      f"{w['positions']} positions x {w['layers']} layers); patching each edge alone needs at least {w['least']:,} "
      f"(from its receiver's layer, mean {w['mean_receiver_layer']:.1f}, at the positions from the first one where the "
      f"prompts differ, {w['first_differing']}): a method that patches edges one at a time can beat the naive loop "
      f"by at most {w['loop'] / w['least']:.1f}x by skipping work, and the careful loop skips all of it: surgeon's "
      f"lead over the careful loop is speed per layer-position (where its time goes: the profile below)")
    p("    surgeon's exact top-200 profiled (torch.profiler, self CPU time): " + ", ".join(
        f"{k} {v:.0%}" for k, v in prof["ops"][:6]))
    for s in SIZES:
        r_p, r_c = res[("patch", *s)], res[("careful-patch", *s)]
        ratio = r_c["seconds"] / r_p["seconds"]
        r_tl = res.get(("tl-patch", *s))
        p(f"  per-head sweep vs the careful TransformerLens sweep at {s[0]} x {pos[s]}: {ratio:.2f}x "
          f"({'met' if ratio >= 1 else 'MISSED'})" + (f"; vs generic_activation_patch {r_tl['seconds'] / r_p['seconds']:.1f}x"
                                                     if r_tl else ""))
    p(f"    why, at {first[0]} x {pos[first]}: generic_activation_patch computes {work['naive']:,} layer-positions (a "
      f"full forward per head); patching each head alone needs at least {work['least']:,} (each head's copy from its "
      f"own layer on, at the positions from the first one where the prompts differ, {work['first_differing']}), and the "
      f"careful sweep computes {work['careful']:,} (that and its clean runs): skipping work buys at most "
      f"{work['naive'] / work['least']:.1f}x over the naive sweep and {work['careful'] / work['least']:.2f}x over the "
      f"careful one, so surgeon's lead over the careful sweep is speed per layer-position, not work skipped")
    flat = growth(s5, s20, "measured", "weights")
    p(f"  subset search, 128 -> 512 subsets: time x{growth(s5, s20, 'seconds'):.2f}, memory above weights "
      f"x{flat:.2f} (target: flat: {'met' if flat <= 1.15 else 'MISSED'})")
    worst = max(abs(above(r) - 1) for r in res.values() if "predicted" in r)
    p(f"  predicted memory above the weights within {worst:.0%} of the measured on every surgeon job (the shapes the "
      f"predictor's constants were fitted to; the goal is on held-out shapes: bench/memory.py)")
    return lines


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("model")
        ap.add_argument("job")
        ap.add_argument("items", type=int)
        ap.add_argument("letters", type=int)
        ap.add_argument("--batch-size", type=int, default=256)
        ap.add_argument("--threads", type=int, default=2)
        ap.add_argument("--mode", choices=("time", "memory"), default="memory",
                        help="memory: baselines on a sample of 2 (their peak is one forward)")
        ap.add_argument("--repeat", type=int, default=1, help="time mode: the fastest of this many runs of each job")
        ap.add_argument("--count", action="store_true", help="then count its work (one more run) and the least")
        args = ap.parse_args()
        torch.set_num_threads(args.threads)
        sample = 2 if args.mode == "memory" else None
        for job in args.job.split(","):  # several jobs: one after the other in this process, a JSON line each
            print(json.dumps(measure(args.model, job, args.items, args.letters, args.batch_size, sample,
                                     args.repeat if args.mode == "time" else 1, args.count)), flush=True)
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/scale.txt (the README's)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, os.path.dirname(__file__))
    from saving import saved

    data = {}
    with saved("scale", args.save, data=data):
        for name in args.models.split(","):
            bench_model(name, args.threads, data)
        llama_workload()
    return 0


# ----------------------------------------------------------------------------- Llama-3.1-8B, predicted
LLAMA_ITEMS, LLAMA_PROMPT, LLAMA_GOOD_PROMPT, LLAMA_ANSWER = 64, 45, 15, 3
GPU_BYTES = 80 * 10**9


def llama_8b():
    """TransformerLens's Llama-3.1-8B config in bfloat16 (no weights), and the rows of the paper's workload: 64 trap
    items, two answer rows each, the chat prompt 45 tokens (Llama 3.1's template with its default system header)
    and the plain one 15, answers of 3 tokens (" 9", ".", "11"), aligned at the last prompt token and the answer."""
    from transformer_lens import HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=32, d_model=4096, n_heads=32, d_head=128, n_key_value_heads=8,
                                  d_mlp=14336, n_ctx=2048, d_vocab=128256, act_fn="silu", gated_mlp=True,
                                  normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=128,
                                  final_rms=True, dtype=torch.bfloat16, device="cpu")

    return cfg, llama_rows(LLAMA_PROMPT), llama_rows(LLAMA_GOOD_PROMPT)


def llama_rows(prompt: int, items: int = LLAMA_ITEMS) -> list:
    """The workload's rows of one format: `items` items, two answer rows each (the answers share " 9" "." and differ
    in their last token), a prompt of `prompt` tokens (ids from 100 on)."""
    from surgeon.case.encoding import Row

    out = []
    for i in range(items):
        for answer in range(2):
            ans = [10, 11, 20 + answer]
            tokens = tuple(range(100, 100 + prompt)) + tuple(ans[:-1])
            targets = tuple((prompt - 1 + j, ans[j], 1.0 if answer == 0 else -1.0) for j in range(LLAMA_ANSWER))
            out.append(Row(i, tokens, prompt, targets, {}))
    return out


def LLAMA_JOBS(cfg):
    """The paper's workload: per-head patching of all 1,024 heads, the C(16, 8) search at one layer, EAP, exact
    top-200 edges."""
    from surgeon.engine import memory

    from surgeon.analyses.planning import graph_size

    graph = graph_size(cfg)
    return [memory.per_head(cfg), memory.subsets(cfg, 10, 12870), memory.eap(cfg, graph),
            memory.exact_edges(cfg, graph, 200)]


def llama_8b_workload() -> list[str]:
    """One line per job: the batch size picked for one 80 GB GPU, the predicted peak and forward passes."""
    from surgeon.engine import memory

    cfg, base, source = llama_8b()
    lines = [f"Llama-3.1-8B-Instruct in bfloat16: weights {memory.human(memory.weights_bytes(cfg))}; "
             f"{LLAMA_ITEMS} items x 2 answer rows, prompts of {LLAMA_PROMPT} tokens (chat) and {LLAMA_GOOD_PROMPT} "
             f"(plain), answers of {LLAMA_ANSWER}, aligned at the last prompt token and the answer; budget "
             f"{GPU_BYTES / 1e9:.0f} GB"]
    for job in LLAMA_JOBS(cfg):
        p = memory.plan(cfg, base, source, "last", job, batch_size=256, budget=GPU_BYTES, device="cuda:0")
        lines.append(p.line())
    return lines


def llama_workload() -> None:
    print("\n== predicted (not measured): Llama-3.1-8B-Instruct, one 80 GB GPU")
    for line in llama_8b_workload():
        print("  " + line)


if __name__ == "__main__":
    raise SystemExit(main())
