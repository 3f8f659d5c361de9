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
  |activation|; it counts as massive, as theirs, when above 100 and 1000 times the median.

Every number is a mean over items with a bootstrap 95% interval (per head: over items). One forward pass per format
and batch, reading the patterns and the residual stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from surgeon.analyses.common import prepend_bos
from surgeon.engine.contrast import cached_batches
from surgeon.errors import AnalysisError
from surgeon.show import Shows
from surgeon.spec.case import Case
from surgeon.spec.encoding import prompt_rows
from surgeon.spec.select import pick_items
from surgeon.stats import Estimate, bootstrap_mean

EPSILON = 0.3  # Gu et al.'s threshold on a head's mean attention to the first token
MASSIVE_ABS, MASSIVE_RATIO = 100.0, 1000.0  # Sun et al.'s criterion: |x| > 100 and > 1000 x the median


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
    first_norm_ratio: list  # per layer: first token's residual norm / median of the other positions' (Estimate)
    massive: list  # per layer: {"value", "dim", "position", "token", "ratio", "massive"} of the largest |activation|


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
    hooks = [f"blocks.{l}.attn.hook_pattern" for l in range(L)] + [f"blocks.{l}.hook_resid_post" for l in range(L)]
    n = len(rows)
    mass, last, other = np.zeros((n, L, H)), np.zeros((n, L, H)), np.zeros((n, L, H))
    other_pos = np.zeros((n, L, H), dtype=int)
    norm_ratio = np.zeros((n, L))
    top = [dict(value=0.0) for _ in range(L)]
    med_abs = [[] for _ in range(L)]
    toks = []
    with torch.no_grad():
        for chunk, acts in cached_batches(model, rows, hooks, batch_size):
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
    rng = np.random.default_rng(0)
    reps = rng.integers(0, n, size=(1000, n))
    boot = mass[reps].mean(1)  # [reps, L, H]
    lo, hi = np.percentile(boot, [2.5, 97.5], axis=0) if n > 1 else (np.full((L, H), np.nan),) * 2
    rate = (boot > eps).mean(axis=(1, 2))
    point = float((mass.mean(0) > eps).mean())
    rlo, rhi = (np.percentile(rate, [2.5, 97.5]) if n > 1 else (np.nan, np.nan))
    return FormatSinks(fmt, n, mass.mean(0), lo, hi, last.mean(0), other.mean(0), other_token,
                       Estimate(point, float(rlo), float(rhi), L * H, "bootstrap over items"),
                       [bootstrap_mean(norm_ratio[:, l]) for l in range(L)], massive)


def _most_common(xs: list[str]) -> str:
    counts: dict[str, int] = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    return max(counts, key=lambda k: (counts[k], k)) if counts else ""


def sinks(case: Case, model, *, tag: str | None = "all", epsilon: float = EPSILON, batch_size: int = 64) -> SinkResult:
    """Sink mass per head, sink rate, strongest other sinks, the first token's residual norm and massive activations
    per layer, in every format of the case over the same items (`surgeon sinks`)."""
    if not 0 < epsilon < 1:
        raise AnalysisError(f"epsilon {epsilon} is not in (0, 1)", field="--epsilon", fix="e.g. 0.3 (Gu et al.'s)")
    tag, items = pick_items(case, tag)
    fmts = [case.good, *case.bad_formats]
    return SinkResult(case.name, tag, epsilon, [_per_format(case, model, f, items, epsilon, batch_size) for f in fmts],
                      case.good)


__all__ = ["EPSILON", "FormatSinks", "SinkResult", "sinks"]
