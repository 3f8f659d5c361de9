"""Peak memory predicted before a run, and batch sizes picked to fit a budget.

From the model's config, the rows (their widths, first patched position, aligned positions and targets, laid out
in buckets exactly as `Contrast` lays them out) and the job (how many patches per engine call, from which layer,
over which sites, with or without gradients), `predict` adds up what the engine holds at its peak:

  weights    parameters and buffers (counted on the model, or from its config);
  caches     per bucket: the residual stream and head outputs from the first patched position on, the prefix's
             keys and values, the patched sites' activations in both runs (edges: every sender's output in both
             runs), for the buckets that fit in the engine's cache budget (the others recompute theirs);
  masks      the patch masks of one call (edge masks are [patches, edges] floats: large on big graphs);
  working    the larger of the clean pass (one batch of full rows, its cached activations and one layer's
             temporaries) and a patched forward (batch_size x width positions of patched rows: one layer's
             temporaries, the readout's logits over the vocabulary; under gradients every layer's saved
             activations and, for edges, the per-head query/key/value inputs).

The per-layer temporaries are counted tensor by tensor from TransformerLens's forward and the engine's
shared-prefix attention (see `_layer_bytes`); the only constants are how many copies of a tensor are alive at
once, fitted on bench/scale.py's two models to the peak a job adds on CPU (`peak_memory`, after a warm-up pass), and
checked on shapes held out of that fit (bench/memory.py; tests/engine/test_memory.py holds the memory above the
weights within 30% of the measured there, and never more than 15% under it). On the CPU the plan adds the host's
part: the job's small allocations and the edge graph's Python objects.

`plan` picks the largest batch size (a power of two, at most the one asked for) whose predicted peak fits the
budget (`--max-memory`, else the device's free memory) and refuses, naming the fix, when batch size 1 does not.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from surgeon.engine.caches import CACHE_BYTES, CACHE_FRACTION
from surgeon.engine.rows import BucketShape, layout, merged_rows
from surgeon.errors import AnalysisError
from surgeon.sites.head_input_grads import unit_chunk
from surgeon.case.sizes import human, parse_bytes  # noqa: F401  (part of this module's API)

# ----------------------------------------------------------------------------- what a job runs
@dataclass(frozen=True)
class Call:
    """`count` engine calls of `patches` patches each, patching from layer `start`."""

    patches: int
    start: int
    count: int = 1


@dataclass(frozen=True)
class Job:
    """What the engine will run: its calls, the sites cached, and what the masks address.

    `node_sites`: (layer, units, values per unit) of each node site whose activations both runs cache;
    `edges`/`senders`: the edge graph's size (0 for node jobs); `masks`: mask tensors per call (a circuit has its
    edges and the frozen rest); `grad`: gradients w.r.t. the masks; `split`: patches grouped by the first layer
    they act at (exact edge patching), so the forward count is an upper bound."""

    name: str
    calls: tuple[Call, ...]
    node_sites: tuple[tuple[int, int, int], ...]
    units: int  # mask width (units of one site, or edges)
    edges: int = 0
    senders: int = 0
    masks: int = 1
    grad: bool = False
    split: bool = False
    live: bool = True  # edges: senders read live from the pass (their differences kept per patch), not fixed

    @property
    def cache_start(self) -> int:
        return min([c.start for c in self.calls] + [s[0] for s in self.node_sites])


def _dims(cfg):
    d, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    Hkv = getattr(cfg, "n_key_value_heads", None) or H
    return d, H, Hkv, dh, (cfg.d_mlp or 0), cfg.d_vocab_out if cfg.d_vocab_out > 0 else cfg.d_vocab, cfg.n_layers


def per_head(cfg, layers: Sequence[int] | None = None, units: int | None = None) -> Job:
    """Per-head patching (`surgeon patch`): every unit (head) of each layer alone, one call per layer."""
    d, H, Hkv, dh, *_ = _dims(cfg)
    U = units or H
    layers = list(range(cfg.n_layers)) if layers is None else list(layers)
    return Job("per-head patching", tuple(Call(U, L) for L in layers), tuple((L, U, max(1, d // U)) for L in layers), U)


def subsets(cfg, layer: int, n_subsets: int, chunk: int = 256) -> Job:
    """A subset search over heads of one layer (`surgeon threshold`): chunks of `chunk` subsets."""
    d, H, Hkv, dh, *_ = _dims(cfg)
    full, rest = divmod(n_subsets, chunk)
    calls = ((Call(chunk, layer, full),) if full else ()) + ((Call(rest, layer),) if rest else ())
    return Job(f"subset search ({n_subsets:,} subsets)", calls, ((layer, H, dh),), H)


def _edge_job(cfg, graph: tuple[int, int], name: str, calls, masks: int = 1, grad: bool = False, split: bool = False,
              live: bool = True) -> Job:
    """`graph`: (senders, edges) of the model's edge graph (as its edge site counts them)."""
    d, H, Hkv, dh, *_ = _dims(cfg)
    senders, edges = graph
    nodes = ((0, 1, d),) + tuple((L, H, dh) for L in range(cfg.n_layers))
    if not getattr(cfg, "attn_only", False):
        nodes += tuple((L, 1, d) for L in range(cfg.n_layers))
    return Job(name, tuple(calls), nodes, edges, edges, senders, masks, grad, split, live)


def eap(cfg, graph: tuple[int, int], steps: int = 1) -> Job:
    """Edge attribution (EAP: one gradient; EAP-IG over the inputs: `steps` of them, in the batch dimension), each
    edge carrying its sender's fixed difference."""
    name = "EAP" if steps == 1 else f"EAP-IG ({steps} steps)"
    return _edge_job(cfg, graph, name, [Call(steps, 0)], grad=True, live=False)


def exact_edges(cfg, graph: tuple[int, int], top: int = 200) -> Job:
    """The top `top` edges each patched alone (exact edge patching, grouped by the first layer they act at)."""
    return _edge_job(cfg, graph, f"exact top-{top} edges", [Call(top, 0)], split=True)


def circuits(cfg, graph: tuple[int, int], n: int = 11, count: int = 1) -> Job:
    """`count` calls of `n` circuits each and the full circuit's call (the faithfulness curve: 11 circuits; the
    smallest-circuit search: 16 per bisection step)."""
    name = "faithfulness curve" if (n, count) == (11, 1) else f"{n} circuits x {count}"
    return _edge_job(cfg, graph, name, [Call(n, 0, count), Call(1, 0)], masks=2)


# ----------------------------------------------------------------------------- sizes
def weights_bytes(cfg) -> int:
    """Parameters and buffers of the TransformerLens model `cfg` describes (what `HookedTransformer(cfg)` holds)."""
    d, H, Hkv, dh, dm, V, L = _dims(cfg)
    e = _elem(cfg)
    gated = bool(getattr(cfg, "gated_mlp", False))
    attn = d * dh * (2 * H + 2 * Hkv) + dh * (H + 2 * Hkv) + d
    mlp = 0 if getattr(cfg, "attn_only", False) else d * dm * (3 if gated else 2) + dm + d
    norm = {"LN": 2 * d, "LNPre": 0, "RMS": d, "RMSPre": 0}.get(cfg.normalization_type or "", 0)
    per_layer = attn + mlp + norm * (1 if getattr(cfg, "attn_only", False) else 2)
    params = L * per_layer + cfg.d_vocab * d + d * V + V + norm
    if cfg.positional_embedding_type == "standard":
        params += cfg.n_ctx * d
    buffers = L * 4  # each attention layer's IGNORE (its causal mask is made when used)
    if cfg.positional_embedding_type == "rotary":
        buffers += L * 2 * cfg.n_ctx * (cfg.rotary_dim or dh) * e
    return int(params * e + buffers)


def model_bytes(model) -> int:
    """Parameters and buffers the model holds now."""
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def _elem(cfg) -> int:
    return torch.empty((), dtype=getattr(cfg, "dtype", torch.float32)).element_size()


# How many tensors of each size are alive at once. The terms are counted tensor by tensor from TransformerLens's
# forward and the engine's hooks; how many copies of each are alive at the peak is fitted, on bench/scale.py's two
# models only (GPT-2 small at 2 x 30, 4 x 30 and 2 x 58 positions, the narrowed Llama-3.1-8B layout at 2 x 30 and
# 4 x 30; six jobs each), to the peak a job adds to the resident set on CPU after one warm-up pass (the libraries'
# one-time set-up done, as a GPU's allocator counts it): the least largest error over those 30 runs, each constant
# a multiple of 0.5 within what the forward can hold (e.g. 1-3 copies of the logits). bench/memory.py checks them on
# three shapes held out of that fit. No gradients: a block's attention holds residual-size tensors, q/k/v, two score-size tensors (the
# scores and the pattern) and the head outputs; its MLP residual-size tensors and hidden-size ones.
MLP_HIDDEN = {False: 3, True: 4}  # gelu_new's pre-activation and temporaries; gate, up, act(gate), product
RESID_COPIES = 6
SCORE_COPIES = 2
# under gradients, per layer: what autograd keeps for the backward pass. The weights are frozen, so a projection
# keeps nothing of its input; the fused norms and activations (`engine.kernels.fused_activations`) keep less than
# TransformerLens's unfused ops would.
GRAD_RESID = 2
GRAD_MLP_HIDDEN = {False: 0, True: 1}
EDGE_GRAD_COPIES = 1  # the backward pass's float32 tensors per unit chunk of a layer's q/k/v edges
# many-edge patches (circuits) without gradients: copies of the per-head query/key/value inputs alive (and per mask)
SPLIT_COPIES, SPLIT_COPIES_PER_MASK = 2, 0
LIVE_COPIES = 0.5  # senders read live: copies of their differences kept, per mask
MASK_COPIES_SPLIT = 1  # single edges (exact patching) run from the masks as given, a layer's group at a time
READOUT_COPIES = 2.5  # float32 copies of the logits at the read positions alive at once (logits, log-softmax)
HOST_BYTES = 5 << 20  # on the CPU: the job's own small allocations (below glibc's mmap threshold, Python objects)
SPLIT_LAYERS = 5  # exact edge patching groups single edges by the layer they enter: top edges taken as entering 5
EDGE_GRAPH_HOST = 106  # bytes per edge of the edge graph's Python objects (host memory)


def _layer_bytes(cfg, rows: int, q: int, keys: int, prefix_rows: int, grad: bool, split: int, hooks: bool) -> float:
    """One layer's forward on `rows` rows of `q` new positions attending to `keys` positions (the first
    keys - q of them a prefix shared by `prefix_rows` rows): the tensors alive at its peak (no gradients), or
    those it saves for the backward pass (`grad`). `split`: copies of the per-head query/key/value inputs alive
    (edge receivers of many-edge patches; 0: none);
    `hooks`: a site's hook rewrites the head outputs (a copy and the difference)."""
    d, H, Hkv, dh, dm, V, L = _dims(cfg)
    e = _elem(cfg)
    rq = rows * q
    p0 = keys - q
    rotary = cfg.positional_embedding_type == "rotary"
    mlp_hidden = 0 if getattr(cfg, "attn_only", False) else dm
    qkv = rq * (H + 2 * Hkv) * dh + (rq * (H + Hkv) * dh if rotary else 0)  # q, k, v (+ rotated q, k)
    kv_rep = 2 * rq * H * dh if Hkv != H else 0  # the new keys/values repeated to the query heads
    scores = rows * H * q * keys  # scores over the prefix and the new keys; then the pattern
    prefix = 2 * prefix_rows * p0 * Hkv * dh  # the prefix's keys and values, laid out once per call
    z = rq * H * dh * (3 if hooks else 1)  # head outputs (+ the patched copy and its difference)
    split_in = rq * (H + 2 * Hkv) * d  # per-head query/key/value inputs
    if not grad:
        attn = RESID_COPIES * rq * d + qkv + kv_rep + SCORE_COPIES * scores + z + split * split_in
        mlp = RESID_COPIES * rq * d + MLP_HIDDEN[bool(getattr(cfg, "gated_mlp", False))] * rq * mlp_hidden
        return e * (max(attn, mlp) + prefix)
    saved = (GRAD_RESID * rq * d + qkv + kv_rep + SCORE_COPIES * scores + 2 * z
             + (split_in if split else 0) + GRAD_MLP_HIDDEN[bool(getattr(cfg, "gated_mlp", False))] * rq * mlp_hidden)
    return e * saved


def _readout_bytes(cfg, rows: int, positions: int) -> int:
    """The logits (float32) at the scored positions of `rows` rows and their log-softmax (with the bfloat16 or
    float16 logits first, in those dtypes)."""
    *_, V, _ = _dims(cfg)
    e = _elem(cfg)
    return rows * positions * V * (4 * READOUT_COPIES + (e if e != 4 else 0))


def _bucket_cache(cfg, b: BucketShape, job: Job, start: int) -> int:
    d, H, Hkv, dh, dm, V, L = _dims(cfg)
    e = _elem(cfg)
    q = b.base_width - b.p0
    layers = L - start
    per_layer = b.n * q * (d + H * dh) + 2 * b.n * b.p0 * Hkv * dh
    sites = 2 * b.n * b.slots * sum(u * r for _, u, r in job.node_sites)
    senders = 2 * b.n * b.slots * job.senders * d  # edges: every sender's output in both runs
    return e * (layers * per_layer + sites + senders)


def _clean_pass(cfg, b: BucketShape, job: Job, start: int, batch_size: int) -> float:
    """The clean passes of one bucket: every cached activation of a full batch, the copies kept, one layer."""
    d, H, Hkv, dh, dm, V, L = _dims(cfg)
    e = _elem(cfg)
    rows = min(b.n, batch_size)
    W = max(b.base_width, b.source_width)
    full = (L - start) * b.n * W * (d + 2 * Hkv * dh + H * dh) * e
    sites = b.n * W * sum(u * r for _, u, r in job.node_sites) * e
    step = max(_layer_bytes(cfg, rows, W, W, 0, False, 0, False), _readout_bytes(cfg, rows, b.positions))
    return full + sites + step + b.n * W * d * e


# ----------------------------------------------------------------------------- the prediction
@dataclass
class Prediction:
    """Predicted peak bytes (and its parts), the batch size, and how many forward passes the job runs."""

    job: str
    batch_size: int
    peak: int
    parts: dict = field(default_factory=dict)
    forwards: int = 0
    forwards_bound: bool = False  # True: `forwards` is an upper bound (patches grouped by first layer)

    def line(self, budget: int | None = None) -> str:
        parts = ", ".join(f"{k} {human(v)}" for k, v in self.parts.items())
        fits = f" of {human(budget)}" if budget else ""
        fw = f"{'at most ' if self.forwards_bound else ''}{self.forwards:,} forward passes"
        return f"{self.job}: batch size {self.batch_size}, predicted peak {human(self.peak)}{fits} ({parts}); {fw}"


def predict(cfg, buckets: Sequence[BucketShape], job: Job, batch_size: int, *, weights: int | None = None,
            cache_bytes: int | None = None, shared_prefix: bool = True, host: bool = True) -> Prediction:
    """Peak memory of `job` over rows laid out as `buckets` (`layout` at this batch size) with `batch_size`.
    `host`: the device is the CPU, so the edge graph's Python objects count too."""
    e = _elem(cfg)
    weights = weights_bytes(cfg) if weights is None else weights
    cache_bytes = CACHE_BYTES if cache_bytes is None else cache_bytes
    start = job.cache_start
    caches = [_bucket_cache(cfg, b, job, start) for b in buckets]
    # buckets are walked in order; once their caches pass cache_bytes, each later one is dropped after use
    held, kept, recompute = 0, 0, 0
    for c in caches:
        held = max(held, kept + c)
        if kept + c > cache_bytes:
            recompute += 1
        else:
            kept += c
    P = max(c.patches for c in job.calls)
    # the masks, a chunk's copy (and their gradients); single edges run from the masks as given, grouped by layer
    masks = job.masks * P * job.units * 4 * (MASK_COPIES_SPLIT if job.split else 3 if job.grad else 2)
    clean = max(_clean_pass(cfg, b, job, start, batch_size) for b in buckets)
    working, forwards, bound = 0.0, 0, False
    for b in buckets:
        W = b.base_width
        q = W - b.p0 if shared_prefix else W
        chunk = max(1, batch_size * W // (b.n * q))
        for call in job.calls:
            c = min(chunk, call.patches)
            if job.split:  # single edges run grouped by the layer they enter: top edges taken as entering ~5 layers
                c = min(c, math.ceil(call.patches / min(SPLIT_LAYERS, cfg.n_layers)))
            rows = c * b.n
            layers = cfg.n_layers - call.start
            # under gradients EAP's masks share one value per sender: no per-head inputs (`head_input_grads`)
            # single edges (exact patching) recompute each patched head's q/k/v alone: no per-head inputs either
            split_in = SPLIT_COPIES + SPLIT_COPIES_PER_MASK * job.masks if job.edges and not job.grad and not job.split else 0
            layer = _layer_bytes(cfg, rows, q, W, b.n, job.grad, split_in, bool(job.node_sites))
            live = rows * q * cfg.d_model * e * 2  # the residual stream entering the first layer, and its copy
            if job.edges:  # the senders' fixed differences, and laid out sender-major (per call)
                live += 2 * b.n * b.slots * job.senders * cfg.d_model * e
            if job.edges and job.live and not job.split:  # senders read live: their differences are kept (per mask:
                # a circuit's own edges and the frozen rest each capture them)
                live += LIVE_COPIES * job.masks * rows * b.slots * job.senders * cfg.d_model * e
            if job.grad:  # the backward pass through the unembedding reads it transposed
                live += cfg.d_model * cfg.d_vocab_out * e
            if job.grad and job.edges:  # a layer's q/k/v edges' input gradients, a chunk of units at a time (float32)
                units = cfg.n_heads + 2 * (getattr(cfg, "n_key_value_heads", None) or cfg.n_heads)
                live += EDGE_GRAD_COPIES * 4 * rows * b.slots * cfg.d_model * unit_chunk(rows, b.slots, cfg.d_model, units)
            readout = _readout_bytes(cfg, min(rows, batch_size), b.positions)
            step = live + (layer * layers + readout if job.grad else max(layer, readout))
            working = max(working, step)
            n_fw = math.ceil(call.patches / c)
            if job.split:  # groups by first layer: at most one more forward per extra layer
                n_fw = min(call.patches, math.ceil(call.patches / min(chunk, call.patches)) + cfg.n_layers - 1)
                bound = True
            forwards += n_fw * call.count
    n_calls = sum(c.count for c in job.calls)
    forwards += 2 * len(buckets) + 2 * recompute * n_calls  # the clean passes, and caches recomputed per call
    parts = {"weights": weights, "caches": held, "masks": masks, "working": max(clean, working)}
    if job.edges and host:
        parts["edge graph"] = job.edges * EDGE_GRAPH_HOST
    if host:
        parts["host"] = HOST_BYTES
    return Prediction(job.name, batch_size, int(sum(parts.values())), {k: int(v) for k, v in parts.items()},
                      forwards, bound)


def predict_rows(cfg, base_rows, source_rows, align: str, job: Job, batch_size: int, **kw) -> Prediction:
    """`predict` for rows as the engine would receive them (aligned, merged, laid out at this batch size)."""
    both = two_way(cfg)
    b, s, aligned = merged_rows(base_rows, source_rows, align, bidirectional=both)
    return predict(cfg, layout(b, s, aligned, batch_size, bidirectional=both), job, batch_size, **kw)


def two_way(cfg) -> bool:
    """Whether the model's attention is bidirectional: its rows are laid out whole (`rows.layout`)."""
    return getattr(cfg, "attention_dir", "causal") == "bidirectional"


def free_memory(device: str | torch.device) -> int:
    """Bytes free on `device` now: a GPU's free memory, or the machine's available memory for the CPU."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def predict_jobs(cfg, buckets: Sequence[BucketShape], jobs: Sequence[Job], batch_size: int, **kw) -> Prediction:
    """Jobs run one after the other on one contrast: the largest peak, the forward passes added up."""
    preds = [predict(cfg, buckets, j, batch_size, **kw) for j in jobs]
    top = max(preds, key=lambda p: p.peak)
    clean = 2 * len(buckets) * (len(preds) - 1)  # one contrast: its clean passes run once
    return Prediction(" + ".join(p.job for p in preds), batch_size, top.peak, top.parts,
                      sum(p.forwards for p in preds) - clean, any(p.forwards_bound for p in preds))


def alongside(preds: Sequence[Prediction]) -> Prediction:
    """Contrasts alive at the same time, each running its own jobs: every one's caches are held throughout, so the
    peak is the largest of (one contrast's peak + the others' caches); forward passes add up."""
    caches = [p.parts.get("caches", 0) for p in preds]
    peaks = [p.peak + sum(caches) - c for p, c in zip(preds, caches)]
    top = max(range(len(preds)), key=lambda i: peaks[i])
    parts = dict(preds[top].parts, caches=sum(caches))
    return Prediction(" + ".join(p.job for p in preds), preds[0].batch_size, int(peaks[top]), parts,
                      sum(p.forwards for p in preds), any(p.forwards_bound for p in preds))


def plan(cfg, base_rows, source_rows, align: str, jobs: Job | Sequence[Job], *, batch_size: int, budget: int,
         weights: int | None = None, device: str = "cpu", shared_prefix: bool = True, also=()) -> Prediction:
    """The largest batch size (`batch_size`, or a power of two below it) whose predicted peak fits `budget`
    (weights included, since the model is on the device: pass `weights` to count what it holds). Raises
    AnalysisError naming the fix when batch size 1 does not fit. `also`: more contrasts alive beside this one, as
    (base_rows, source_rows, align, jobs) (a circuit's scoring run and the reversed run it evaluates circuits on)."""
    jobs = [jobs] if isinstance(jobs, Job) else list(jobs)
    dev = torch.device(device)
    cache = int(CACHE_FRACTION * budget) if dev.type == "cuda" else CACHE_BYTES
    both = two_way(cfg)
    contrasts = [(merged_rows(base_rows, source_rows, align, bidirectional=both), jobs)]
    contrasts += [(merged_rows(b_, s_, a_, bidirectional=both), [j] if isinstance(j, Job) else list(j))
                  for b_, s_, a_, j in also]
    return largest_batch(
        lambda bs: alongside([predict_jobs(cfg, layout(b, s, aligned, bs, bidirectional=both), js, bs, weights=weights,
                                           cache_bytes=cache,
                                           shared_prefix=shared_prefix, host=dev.type == "cpu")
                              for (b, s, aligned), js in contrasts]),
        batch_size, budget,
        fix="use --dtype bfloat16, fewer or shorter items, a device with more memory, or a larger --max-memory if "
            "more is free")


def largest_batch(predict_at: Callable[[int], Prediction], batch_size: int, budget: int, fix: str) -> Prediction:
    """The batch-halving search every plan runs: `predict_at(bs)` at `batch_size`, then at each power of two below
    it, until the predicted peak fits `budget`. A prediction made at a smaller batch size than asked (a part of the
    job that fits only there) is tried next at that size. AnalysisError (field --max-memory, `fix`) when batch size
    1 does not fit."""
    bs = max(1, int(batch_size))
    while True:
        p = predict_at(bs)
        if p.batch_size < bs:
            bs = p.batch_size
            continue
        if p.peak <= budget:
            return p
        if bs == 1:
            parts = ", ".join(f"{k} {human(v)}" for k, v in p.parts.items())
            raise AnalysisError(f"{p.job} needs about {human(p.peak)} even with batch size 1 ({parts}), more than "
                                f"the {human(budget)} available", field="--max-memory", fix=fix)
        bs = 2 ** (math.ceil(math.log2(bs)) - 1)


# ----------------------------------------------------------------------------- measuring
@contextmanager
def peak_memory(device: str | torch.device = "cpu"):
    """Measures the peak memory of the block above what was in use when it began: a dict whose "peak" is set on
    exit (CUDA: the allocator's peak; CPU: the process's resident-set high-water mark, reset on entry)."""
    dev = torch.device(device)
    out = {"peak": 0, "before": 0}
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        out["before"] = torch.cuda.memory_allocated(dev)
        yield out
        torch.cuda.synchronize(dev)
        out["peak"] = torch.cuda.max_memory_allocated(dev) - out["before"]
        return
    _trim_heap()
    with open("/proc/self/clear_refs", "w") as f:  # resets VmHWM to the current resident set
        f.write("5")
    out["before"] = _status("VmRSS")
    yield out
    out["peak"] = _status("VmHWM") - out["before"]


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc), so the resident set is what is in use."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def resident() -> int:
    """This process's resident memory now (bytes; Linux)."""
    return _status("VmRSS")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")
