"""Attention sinks and massive activations, measured per head, layer and format over a case's items.

A format-dependent failure is where these matter: a chat template changes the first tokens and what the heads park
their attention on. Measured on each format's prompts (the same items in every format), side by side:

- **sink mass** per head: the attention on the first token, averaged over the prompt's query positions after it
  (Gu et al. 2025's alpha, "When Attention Sink Emerges in Language Models"), and from the last prompt token alone
  (the position whose output the answer is read from); the **sink rate**: the share of heads whose mass passes
  epsilon (0.3, theirs);
- the **strongest other sink** per head: the key position after the first receiving the most attention averaged
  over the queries that see it, with its mass and token;
- per layer, the **first token's residual norm** over the median of the other positions' (the residual stream leaving
  the layer), and **massive activations** (Sun et al. 2024, "Massive Activations in Large Language Models"): the
  largest |activation| of the residual stream, its dimension and position, and its ratio to the layer's median
  |activation|; it counts as massive, as theirs, when above 100 and 1000 times the median;
- the **super neurons** that write each layer's largest activation (Sun et al.; Yu et al. 2024, "The Super Weight
  in Large Language Models"): every MLP neuron at or below the layer, scored by its activation times its output
  weight on that dimension, at that position, averaged over the items (the three largest, with their share of the
  activation);
- **massive values in queries and keys** (Jin et al. 2025, "Massive Values in Self-Attention Modules are the Key to
  Contextual Knowledge Understanding"): per head, the share of the query's (and key's) energy over the prompt in its
  largest dimension (1/d_head when spread evenly, 1 when in one dimension), and which dimension; before rotary
  embeddings (`hook_q`, `hook_k`) and, where the model has them, after (`hook_rot_q`, `hook_rot_k`).

Every number is a mean over items with a bootstrap 95% interval (per head: over items). One forward pass per format
and batch reads the patterns, the residual stream and the queries and keys; a second one, with hooks that keep only
the position they need, scores the MLP neurons.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from surgeon.analyses.planning import budget_of
from surgeon.engine import memory
from surgeon.engine.readout import cached_batches
from surgeon.errors import AnalysisError
from surgeon.show import Shows
from surgeon.case.case import Case
from surgeon.case.encoding import prompt_rows
from surgeon.case.select import pick_items
from surgeon.stats import Estimate, bootstrap_mean
from surgeon.case.encoding import prepend_bos

EPSILON = 0.3  # Gu et al.'s threshold on a head's mean attention to the first token
MASSIVE_ABS, MASSIVE_RATIO = 100.0, 1000.0  # Sun et al.'s criterion: |x| > 100 and > 1000 x the median


@dataclass(frozen=True)
class Concentration:
    """Massive values in one kind of vector (queries or keys, before or after rotary) per layer and head: the share
    of its energy over the prompt in its largest dimension, mean over items (nan where a head's vector is zero),
    its bootstrap 95% interval, and that dimension (the most frequent over items; None where there is no signal)."""

    share: np.ndarray  # [layer, head]
    lo: np.ndarray
    hi: np.ndarray
    dim: list  # [layer][head]


@dataclass(frozen=True)
class FormatSinks:
    format: str
    n_items: int
    mass: np.ndarray  # [layer, head] mean over items of the mean attention to the first token over query positions
    mass_lo: np.ndarray
    mass_hi: np.ndarray
    last: np.ndarray  # [layer, head] attention from the last prompt token to the first token, mean over items
    other_mass: np.ndarray  # [layer, head] the strongest other key's mean attention, mean over items
    other_token: list  # [layer][head] the token most often that strongest other key
    sink_rate: Estimate  # share of heads whose `mass` passes epsilon (bootstrap over items)
    first_norm_ratio: list[Estimate]  # per layer: first token's residual norm / median of the other positions'
    massive: list  # per layer: {"value", "dim", "position", "token", "ratio", "massive"} of the largest |activation|
    # per layer: the three neurons (at or below it) writing most of its largest activation: {"layer", "neuron",
    # "write" (activation x output weight, mean over items), "share" (of the activation's mean value there)}
    super_neurons: list = field(default_factory=list)
    # "q", "k" (and "rot_q", "rot_k" under rotary, where the rotation has been applied)
    qk: dict[str, Concentration] = field(default_factory=dict)


@dataclass
class SinkResult(Shows):
    case: str
    tag: str | None
    epsilon: float
    formats: list[FormatSinks] = field(default_factory=list)
    good: str = ""

    def of(self, fmt: str) -> FormatSinks:
        return next(f for f in self.formats if f.format == fmt)


def _per_format(case: Case, model, fmt: str, items, eps: float, batch_size: int) -> FormatSinks:
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    rows = prompt_rows(case.formats[fmt], items, model.tokenizer, prepend_bos(case, model))
    if min(len(r.tokens) for r in rows) < 2:
        raise AnalysisError(f"format {fmt!r} gives a prompt of one token: a sink needs a first token and another",
                            where=case.source, field="formats", fix="use longer prompts")
    kinds = ["q", "k"] + (["rot_q", "rot_k"] if cfg.positional_embedding_type == "rotary" else [])
    hooks = [f"blocks.{l}.attn.hook_pattern" for l in range(L)] + [f"blocks.{l}.hook_resid_post" for l in range(L)]
    hooks += [f"blocks.{l}.attn.hook_{kind}" for l in range(L) for kind in kinds]
    n = len(rows)
    share = {kind: np.full((n, L, H if kind.endswith("q") else _kv_heads(cfg)), np.nan) for kind in kinds}
    top_dim = {kind: np.zeros(share[kind].shape, dtype=int) for kind in kinds}
    mass, last, other = np.zeros((n, L, H)), np.zeros((n, L, H)), np.zeros((n, L, H))
    other_pos = np.zeros((n, L, H), dtype=int)
    norm_ratio = np.zeros((n, L))
    top = [dict(value=0.0) for _ in range(L)]
    med_abs = [[] for _ in range(L)]
    toks = []
    with torch.no_grad():
        for chunk, acts in cached_batches(model, rows, hooks, batch_size):
            lengths = torch.tensor([len(r.tokens) for r in chunk])
            items_ = [r.item for r in chunk]
            for l in range(L):  # queries and keys, the whole batch at once: energy over each prompt's real positions
                for kind in kinds:
                    x = acts[f"blocks.{l}.attn.hook_{kind}"].double()  # [batch, width, head, d_head]
                    real = (torch.arange(x.shape[1])[None, :] < lengths[:, None]).to(x.device, x.dtype)
                    e = (x.pow(2) * real[:, :, None, None]).sum(1)  # [batch, head, d_head]
                    total = e.sum(-1)
                    largest = e.max(-1)
                    frac = torch.where(total > 0, largest.values / total.clamp_min(1e-300),
                                       torch.full_like(total, float("nan")))
                    share[kind][items_, l] = frac.cpu().numpy()
                    top_dim[kind][items_, l] = largest.indices.cpu().numpy()
            for b, r in enumerate(chunk):
                T = len(r.tokens)
                toks.append(r.tokens)
                for l in range(L):
                    A = acts[f"blocks.{l}.attn.hook_pattern"][b, :, :T, :T].double()  # [head, query, key]
                    mass[r.item, l] = A[:, 1:, 0].mean(1).cpu().numpy()  # queries after the first token
                    last[r.item, l] = A[:, T - 1, 0].cpu().numpy()
                    # each key after the first: its attention averaged over the queries that see it (at or after it)
                    seen = A[:, 1:, 1:].sum(1) / torch.arange(T - 1, 0, -1, device=A.device, dtype=A.dtype)
                    best = seen.max(1)
                    other[r.item, l] = best.values.cpu().numpy()
                    other_pos[r.item, l] = best.indices.cpu().numpy() + 1
                    x = acts[f"blocks.{l}.hook_resid_post"][b, :T].double()  # [pos, d_model]
                    norms = x.norm(dim=-1)
                    norm_ratio[r.item, l] = float(norms[0] / norms[1:].median().clamp_min(1e-30))
                    a = x.abs()
                    med_abs[l].append(a.flatten())
                    v = float(a.max())
                    if v > top[l]["value"]:
                        pos, dim = divmod(int(a.argmax()), a.shape[1])
                        top[l] = dict(value=v, dim=dim, position=pos, item=r.item, token=int(r.tokens[pos]))
    decode = lambda t: model.tokenizer.decode([int(t)])  # noqa: E731
    massive = []
    for l in range(L):
        med = float(torch.cat(med_abs[l]).median())
        t = top[l]
        ratio = t["value"] / med if med > 0 else float("inf")
        massive.append({"value": t["value"], "dim": t["dim"], "position": t["position"], "token": decode(t["token"]),
                        "ratio": ratio, "massive": bool(t["value"] > MASSIVE_ABS and ratio > MASSIVE_RATIO)})
    other_token = [[_most_common([decode(toks[i][other_pos[i, l, h]]) for i in range(n)]) for h in range(H)]
                   for l in range(L)]
    supers = _super_neurons(model, rows, massive, batch_size)
    qk = {}
    for kind in kinds:
        v = share[kind]
        with warnings.catch_warnings():  # a head with no signal in any item: nan, said as such
            warnings.simplefilter("ignore", RuntimeWarning)
            boot = np.stack([np.nanmean(v[idx], axis=0) for idx in np.random.default_rng(1).integers(0, n, (200, n))])
            lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0) if n > 1 else (np.full(v.shape[1:], np.nan),) * 2
            mean = np.nanmean(v, axis=0)
        qk[kind] = Concentration(mean, lo, hi, [[_most_common_int(top_dim[kind][:, l, h][np.isfinite(v[:, l, h])])
                                                  for h in range(v.shape[2])] for l in range(L)])
    rng = np.random.default_rng(0)
    reps = rng.integers(0, n, size=(1000, n))
    boot = mass[reps].mean(1)  # [reps, L, H]
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0) if n > 1 else (np.full((L, H), np.nan),) * 2
    rate = (boot > eps).mean(axis=(1, 2))
    point = float((mass.mean(0) > eps).mean())
    rlo, rhi = (np.percentile(rate, [2.5, 97.5]) if n > 1 else (np.nan, np.nan))
    return FormatSinks(fmt, n, mass.mean(0), lo, hi, last.mean(0), other.mean(0), other_token,
                       Estimate(point, float(rlo), float(rhi), L * H, "bootstrap over items"),
                       [bootstrap_mean(norm_ratio[:, l]) for l in range(L)], massive, supers, qk)


def massive_ratio(m: dict) -> float:
    """A layer's largest |activation| over its median (`FormatSinks.massive`): infinite where the median is 0 (kept
    as null in results.json, read back as None)."""
    r = m.get("ratio")
    return float("inf") if r is None else float(r)


def _kv_heads(cfg) -> int:
    return getattr(cfg, "n_key_value_heads", None) or cfg.n_heads


def _most_common_int(xs) -> int | None:
    xs = [int(x) for x in xs]
    return max(set(xs), key=lambda x: (xs.count(x), -x)) if xs else None


def _super_neurons(model, rows, massive: list, batch_size: int, top: int = 3) -> list:
    """Per layer: the MLP neurons at or below it that write most of its largest activation (dimension d, position p),
    each scored by its activation at p times its output weight on d, averaged over the rows that reach p (with a
    normal 95% interval over them), with its share of the activation's mean there. Hooks keep only position p of each MLP's activations (a second pass)."""
    cfg = model.cfg
    L = cfg.n_layers
    if getattr(cfg, "attn_only", False):
        return [[] for _ in range(L)]
    targets = [(m["position"], m["dim"]) for m in massive]
    writes = [[torch.zeros(cfg.d_mlp, dtype=torch.float64) for _ in range(l + 1)] for l in range(L)]  # [target][mlp]
    squares = [[torch.zeros(cfg.d_mlp, dtype=torch.float64) for _ in range(l + 1)] for l in range(L)]
    value = [0.0] * L
    count = [0] * L
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    device = next(model.parameters()).device
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo: lo + batch_size]
        W = max(len(r.tokens) for r in chunk)
        tokens = torch.tensor([list(r.tokens) + [pad] * (W - len(r.tokens)) for r in chunk], device=device)
        reach = [torch.tensor([len(r.tokens) > p for r in chunk], device=device) for p, _ in targets]

        def post_hook(act, hook, mlp: int):
            W_out = model.blocks[mlp].mlp.W_out.detach()
            for t in range(mlp, L):
                p, d = targets[t]
                if p < act.shape[1]:
                    w = (act[:, p, :].double() * W_out[:, d].double()[None]) * reach[t][:, None]
                    writes[t][mlp] += w.sum(0).cpu()
                    squares[t][mlp] += w.pow(2).sum(0).cpu()

        def resid_hook(act, hook, layer: int):
            p, d = targets[layer]
            if p < act.shape[1]:
                value[layer] += float((act[:, p, d].double() * reach[layer]).sum())
                count[layer] += int(reach[layer].sum())

        fwd = [(f"blocks.{l}.mlp.hook_post", lambda a, hook, l=l: post_hook(a, hook, l)) for l in range(L)]
        fwd += [(f"blocks.{l}.hook_resid_post", lambda a, hook, l=l: resid_hook(a, hook, l)) for l in range(L)]
        with torch.no_grad():
            model.run_with_hooks(tokens, fwd_hooks=fwd, return_type=None)
    out = []
    for t in range(L):
        if not count[t]:
            out.append([])
            continue
        mean_value = value[t] / count[t]
        scored = [(float(writes[t][mlp][i]) / count[t], mlp, i) for mlp in range(t + 1) for i in range(cfg.d_mlp)]
        scored = sorted((x for x in scored if x[0] != 0), key=lambda x: -abs(x[0]))
        n = count[t]
        rows_ = []
        for w, mlp, i in scored[:top]:  # a normal 95% interval over the items from the write's mean and variance
            var = max(float(squares[t][mlp][i]) / n - w * w, 0.0) * n / max(n - 1, 1)
            half = 1.959964 * math.sqrt(var / n) if n > 1 else float("nan")
            rows_.append({"layer": mlp, "neuron": i, "write": w, "lo": w - half, "hi": w + half,
                          "share": w / mean_value if mean_value else float("nan")})
        out.append(rows_)
    return out


def _most_common(xs: list[str]) -> str:
    counts: dict[str, int] = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    return max(counts, key=lambda k: (counts[k], k)) if counts else ""


def plan(case: Case, model, items, batch_size: int, max_memory: int | str | None = None):
    """The sinks measure's batch size and predicted peak (a `surgeon.engine.memory.Prediction`) within `max_memory`
    (default: the device's free memory and the weights): per row, what its pass keeps of every layer (the attention
    pattern [heads, width, width], the residual stream, the queries and keys, rotated too under rotary) and the
    largest layer's working set, in the model's dtype; the batch is the largest that fits, at most `batch_size`."""
    cfg = model.cfg
    W = max(len(r.tokens) for f in [case.good, *case.bad_formats]
            for r in prompt_rows(case.formats[f], items, model.tokenizer, prepend_bos(case, model)))
    e = next(model.parameters()).element_size()
    kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    rot = 2 if cfg.positional_embedding_type == "rotary" else 1
    kept = cfg.n_layers * (cfg.n_heads * W * W + W * cfg.d_model + rot * W * (cfg.n_heads + kv) * cfg.d_head) * e
    working = (3 * cfg.n_heads * W * W + W * (4 * cfg.d_model + 3 * (cfg.d_mlp or 0)) + W * cfg.d_vocab) * e
    weights = memory.model_bytes(model)
    budget = budget_of(model, max_memory)
    if budget < weights + kept + working:
        raise AnalysisError(f"the sinks measure needs {memory.human(weights + kept + working)} at batch size 1 "
                            f"(weights {memory.human(weights)}, one row's activations "
                            f"{memory.human(kept + working)}), more than the {memory.human(budget)} it may use",
                            field="--max-memory", fix="allow more memory, or use shorter prompts or a smaller dtype")
    fits = max(1, int((budget - weights) // max(kept + working, 1)))
    bs = max(1, min(batch_size, fits, len(items)))
    return memory.Prediction("sinks", bs, weights + bs * (kept + working),
                             {"weights": weights, "kept activations": bs * kept, "working": bs * working},
                             forwards=2 * (1 + len(case.bad_formats)) * math.ceil(len(items) / bs)), budget


def sinks(case: Case, model, *, tag: str | None = "all", epsilon: float = EPSILON, batch_size: int = 64) -> SinkResult:
    """Sink mass per head, sink rate, strongest other sinks, the first token's residual norm and massive activations
    per layer, in every format of the case over the same items (`surgeon sinks`)."""
    if not 0 < epsilon < 1:
        raise AnalysisError(f"epsilon {epsilon} is not in (0, 1)", field="--epsilon", fix="e.g. 0.3 (Gu et al.'s)")
    tag, items = pick_items(case, tag)
    fmts = [case.good, *case.bad_formats]
    return SinkResult(case.name, tag, epsilon, [_per_format(case, model, f, items, epsilon, batch_size) for f in fmts],
                      case.good)


__all__ = ["EPSILON", "Concentration", "FormatSinks", "SinkResult", "massive_ratio", "plan", "sinks"]
