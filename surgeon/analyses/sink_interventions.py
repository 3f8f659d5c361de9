"""Attention sinks tested as causes of the failure: interventions on the one engine (`surgeon sinks --intervene`).

From what `sinks` measured, each intervention is a mask on the one `Contrast` (`surgeon.sites.sinks`), run at every
position of each format's rows (the contrast is built with `align="index"` over the rows it intervenes on):

- **remove the sink** of a head (its attention to the first token taken away and renormalised: the papers'
  intervention i), each sink head alone and all of them together; where no head passes epsilon, the two heads with
  the most attention on the first token;
- **ablate the massive dimension** of the residual stream after the layer where the largest activation first
  appears: zero, or its mean over the items' positions;
- **ablate the super neuron** that writes most of it: zero, or its mean;
- **amplify a token** (intervention ii; asked for with `amplify=(position, factor, layer)`): that position's residual
  stream scaled entering the layer.

Each is measured **in both directions**: in every failing format, whether it repairs (accuracy with a Wilson interval,
and the repair fraction of the mean score, (after - failing) / (good - failing), with a bootstrap interval over the
items), and in the good format, whether it breaks it (the damage fraction, (good - after) / (good - failing)); and
where it moves attention: each targeted head's attention on the first token after the intervention, in each format.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from surgeon.analyses.common import case_metric
from surgeon.analyses.sinks import EPSILON, SinkResult, massive_ratio, sinks
from surgeon.engine.contrast import Contrast
from surgeon.engine.readout import cached_batches
from surgeon.errors import AnalysisError
from surgeon.show import Shows
from surgeon.sites.sinks import SinkRemoval, TokenScale, UnitValue
from surgeon.case.case import Case
from surgeon.case.encoding import prompt_rows
from surgeon.case.select import pick_items
from surgeon.stats import Estimate, wilson
from surgeon.case.encoding import format_rows, prepend_bos


@dataclass(frozen=True)
class Candidate:
    """One intervention: its name, the site it masks and the mask (one row)."""

    name: str
    site: object = field(repr=False)
    mask: torch.Tensor = field(repr=False)
    heads: tuple = ()  # (layer, head) whose attention on the first token it is meant to move


@dataclass(frozen=True)
class EffectRow:
    intervention: str
    format: str
    role: str  # "good" or "bad"
    accuracy: Estimate  # after the intervention
    unintervened: Estimate
    fraction: Estimate  # repair fraction (a failing format) or damage fraction (the good one), of the mean score


@dataclass(frozen=True)
class MovedRow:
    intervention: str
    format: str
    head: str
    before: float  # the head's attention on the first token, averaged over the prompt's later positions and items
    after: float


@dataclass
class SinkInterventionResult(Shows):
    case: str
    tag: str | None
    good: str
    n_items: int
    interventions: list[str] = field(default_factory=list)
    effects: list[EffectRow] = field(default_factory=list)
    moved: list[MovedRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measured: SinkResult | None = None  # what the interventions were chosen from


def _ratio(after: np.ndarray, base: np.ndarray, good: np.ndarray, bad: np.ndarray, damage: bool) -> Estimate:
    """(mean(after) - mean(base)) / (mean(good) - mean(bad)) (or its negative, for damage) with a paired bootstrap 95%
    interval over the items: the four arrays are the same items' scores, so one resample of the items serves all
    four (resampling the formats apart would widen the interval with differences between items)."""
    gap = float(good.mean() - bad.mean())
    sign = -1.0 if damage else 1.0
    if abs(gap) < 1e-12:
        return Estimate(float("nan"), float("nan"), float("nan"), len(after), "bootstrap (no gap between the formats)")
    if not len(after) == len(base) == len(good) == len(bad):
        raise AnalysisError("internal: the sink effects pair the same items in every format")
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(after), size=(2000, len(after)))
    boot = sign * (after[idx].mean(1) - base[idx].mean(1)) / (good[idx].mean(1) - bad[idx].mean(1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Estimate(sign * float(after.mean() - base.mean()) / gap, float(lo), float(hi), len(after), "bootstrap")


def _mean_at(model, rows, hook: str, unit: int, batch_size: int) -> float:
    """The mean of `hook`'s unit over every real position of `rows` (a mean ablation's constant)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for chunk, acts in cached_batches(model, rows, [hook], batch_size):
            for b, r in enumerate(chunk):
                x = acts[hook][b, : len(r.tokens), unit].double()
                total, count = total + float(x.sum()), count + x.numel()
    return total / max(count, 1)


MAX_FACTOR = 1e6  # a token's residual scaled past this overflows float16 and meets nothing a model was trained on


def chosen_heads(cfg, heads: Sequence[str]) -> list[tuple[int, int]]:
    """(layer, head) of each head named (L1H0), refused when it is no head of this model."""
    L, H = cfg.n_layers, cfg.n_heads
    chosen = []
    for h in heads:
        try:
            layer, head = (int(x) for x in h.upper().lstrip("L").split("H"))
        except ValueError:
            raise AnalysisError(f"{h!r} is not a head", field="heads", fix="name heads as L1H0") from None
        if not (0 <= layer < L and 0 <= head < H):
            raise AnalysisError(f"{h} is not a head of this model ({L} layers x {H} heads)", field="heads",
                                fix=f"use L0H0 .. L{L - 1}H{H - 1}")
        chosen.append((layer, head))
    return chosen


def check_amplify(case: Case, model, items, amplify: tuple) -> None:
    """An amplification that means something: a layer of the model, a finite factor in (0, MAX_FACTOR], and a
    position some prompt of some format has (one past every prompt would change nothing and print as an
    intervention)."""
    import math

    position, factor, layer = amplify
    L = model.cfg.n_layers
    if not 0 <= layer < L:
        raise AnalysisError(f"amplify at layer {layer}: the model has {L}", field="amplify",
                            fix=f"a layer in 0..{L - 1}")
    if not (math.isfinite(factor) and 0 < factor <= MAX_FACTOR):
        raise AnalysisError(f"amplify by {factor:g}: a factor in (0, {MAX_FACTOR:g}] scales a token without "
                            "overflowing the model's numbers", field="amplify", fix="e.g. 10")
    longest = max(len(r.tokens) for f in case.formats.values()
                  for r in prompt_rows(f, items, model.tokenizer, prepend_bos(case, model)))
    if not 0 <= position < longest:
        raise AnalysisError(f"amplify position {position}: the longest prompt has {longest} tokens, so it would change "
                            "nothing", field="amplify", fix=f"a position in 0..{longest - 1} (0: the first token)")


def candidates(case: Case, model, measured: SinkResult, items, *, heads: Sequence[str] | None = None,
               amplify: tuple | None = None, batch_size: int = 64) -> tuple[list[Candidate], list[str]]:
    """The interventions `sink_interventions` runs, chosen from what `sinks` measured (see the module docstring)."""
    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    notes = []
    most = np.max(np.stack([f.mass for f in measured.formats]), axis=0)  # [L, H]: a head's largest mass in any format
    if heads:
        chosen = chosen_heads(cfg, heads)
    else:
        order = [tuple(int(v) for v in x) for x in np.dstack(np.unravel_index(np.argsort(-most, axis=None), most.shape))[0]]
        chosen = [lh for lh in order if most[lh] > measured.epsilon][:4]
        if not chosen:
            chosen = order[:2]
            notes.append(f"no head puts more than {measured.epsilon:g} of its attention on the first token in any "
                         f"format: the sink interventions remove it from the two heads with the most "
                         f"({', '.join(f'L{l}H{h} {most[l, h]:.3f}' for l, h in chosen)})")
    out = []
    sites = {}
    for layer, head in chosen:
        site = sites.setdefault(layer, SinkRemoval(layer))
        m = torch.zeros(1, H)
        m[0, head] = 1.0
        out.append(Candidate(f"remove the sink of L{layer}H{head}", site, m, ((layer, head),)))
    if len(chosen) > 1 and len({layer for layer, _ in chosen}) == 1:
        m = torch.zeros(1, H)
        m[0, [h for _, h in chosen]] = 1.0
        out.append(Candidate(f"remove the sinks of {', '.join(f'L{a}H{b}' for a, b in chosen)}",
                             sites[chosen[0][0]], m, tuple(chosen)))
    # the massive dimension, where the largest activation (in the failing formats) first reaches its dimension
    bad = [f for f in measured.formats if f.format != measured.good]
    ref = max(bad or measured.formats, key=lambda f: max(massive_ratio(m) for m in f.massive))
    top = max(range(L), key=lambda l: massive_ratio(ref.massive[l]))
    dim = ref.massive[top]["dim"]
    first = next(l for l in range(L) if ref.massive[l]["dim"] == dim)
    rows = format_rows(case, model, case.bad_formats[0], items)
    hook = f"blocks.{first}.hook_resid_post"
    what = "massive" if ref.massive[top]["massive"] else "largest"
    for how, value in (("zero", 0.0), ("mean", _mean_at(model, rows, hook, dim, batch_size))):
        v = torch.zeros(cfg.d_model)
        v[dim] = value
        m = torch.zeros(1, cfg.d_model)
        m[0, dim] = 1.0
        out.append(Candidate(f"{how}-ablate the {what} dimension d{dim} after layer {first}",
                             UnitValue(hook, v, None, "residual dimensions"), m, tuple(chosen)))
    supers = ref.super_neurons[top] if ref.super_neurons else []
    if supers:
        s = supers[0]
        hook = f"blocks.{s['layer']}.mlp.hook_post"
        for how, value in (("zero", 0.0), ("mean", _mean_at(model, rows, hook, s["neuron"], batch_size))):
            v = torch.zeros(cfg.d_mlp)
            v[s["neuron"]] = value
            m = torch.zeros(1, cfg.d_mlp)
            m[0, s["neuron"]] = 1.0
            out.append(Candidate(f"{how}-ablate the super neuron L{s['layer']}N{s['neuron']}",
                                 UnitValue(hook, v, None, "MLP neurons"), m, tuple(chosen)))
    if amplify is not None:
        position, factor, layer = amplify
        out.append(Candidate(f"amplify position {position} x{factor:g} entering layer {layer}",
                             TokenScale(layer, position, float(factor)), torch.ones(1, 1), tuple(chosen)))
    return out, notes


def run_candidates(contrast: Contrast, cands: Sequence[Candidate]) -> np.ndarray:
    """Every candidate's scores [P, n_items] in one batched run (each site's mask zero outside its candidate's row)."""
    P = len(cands)
    masks = {}
    for p, c in enumerate(cands):
        m = masks.setdefault(c.site, torch.zeros(P, *c.mask.shape[1:]))
        m[p] = c.mask[0]
    with torch.no_grad():
        return contrast.run(masks).float().cpu().numpy()


def _first_token_mass(model, case: Case, fmt: str, items, cands: Sequence[Candidate], layers: set[int],
                      batch_size: int) -> dict:
    """{(candidate, layer): [heads] attention on the first token, averaged over the prompt's later positions and
    the items}, under each candidate (and None: no intervention), read with the engine's capture."""
    rows = prompt_rows(case.formats[fmt], items, model.tokenizer, prepend_bos(case, model))
    c = Contrast(model, rows, rows, "index", batch_size=batch_size, clean=False)
    out = {}
    P = len(cands)
    for layer in sorted(layers):
        hook = f"blocks.{layer}.attn.hook_pattern"
        acting = [p for p, cand in enumerate(cands) if cand.site.layer <= layer]
        total = torch.zeros(P + 1, model.cfg.n_heads, dtype=torch.float64)
        count = 0
        for b in c.buckets:
            masks = {}
            for p in acting:
                m = masks.setdefault(cands[p].site, torch.zeros(len(acting) + 1, *cands[p].mask.shape[1:]))
                m[acting.index(p) + 1] = cands[p].mask[0]
            if not masks:  # nothing acts at or below this layer: read the unintervened pattern once
                masks = {SinkRemoval(layer): torch.zeros(1, model.cfg.n_heads)}
            valid = b.slot_valid.to(torch.float64)  # [n, positions]: real query positions
            later = valid.clone()
            later[:, 0] = 0

            def reduce(x, lo):  # [c, n, head, query, key] -> [c, head]: mass on key 0 over real later queries
                w = torch.zeros(later.shape[0], x.shape[3], dtype=torch.float64)  # a padded column has no query
                w[:, : later.shape[1]] = later[:, : x.shape[3]]
                w = w.to(x.device)[None, :, None, :]
                return ((x[..., 0].double() * w).sum((1, 3)) / w.sum((1, 3)).clamp_min(1)).cpu()

            got = c.capture(b, masks, hook, reduce)  # [1 + acting, head]
            k = b.n
            total[0] += got[0] * k
            for j, p in enumerate(acting):
                total[p + 1] += got[j + 1] * k
            for p in range(P):
                if p not in acting:
                    total[p + 1] += got[0] * k
            count += k
        for p in range(P + 1):
            out[(None if p == 0 else cands[p - 1].name, layer)] = (total[p] / count).numpy()
    return out


def sink_interventions(case: Case, model, *, tag: str | None = None, heads: Sequence[str] | None = None,
                       amplify: tuple | None = None, epsilon: float = EPSILON, batch_size: int = 64,
                       measured: SinkResult | None = None) -> SinkInterventionResult:
    """Remove the sinks, ablate the massive dimension and its super neuron (and amplify a token, where asked), each in
    every format: whether it repairs the failing formats, whether it breaks the good one, and the attention it
    moves (`surgeon sinks --intervene`). `tag`: the items the effects are measured on (None: the case's focus, where
    it fails); the sinks are measured (unless given as `measured`) over every item."""
    tag, items = pick_items(case, tag)
    if heads:  # refused before the sinks are measured, not after
        chosen_heads(model.cfg, heads)
    if amplify is not None:
        check_amplify(case, model, items, amplify)
    measured = measured if measured is not None else sinks(case, model, tag="all", epsilon=epsilon,
                                                           batch_size=batch_size)
    cands, notes = candidates(case, model, measured, items, heads=heads, amplify=amplify, batch_size=batch_size)
    metric, ref = case_metric(case, model, items, batch_size)
    scores, clean = {}, {}
    for fmt in [case.good, *case.bad_formats]:
        rows = format_rows(case, model, fmt, items)
        c = Contrast(model, rows, rows, "index", batch_size=batch_size, metric=metric, reference=ref)
        clean[fmt] = c.clean_base.float().cpu().numpy()
        scores[fmt] = run_candidates(c, cands)
    res = SinkInterventionResult(case.name, tag, case.good, len(items), [c.name for c in cands], notes=notes,
                                 measured=measured)
    good = clean[case.good]
    bads = case.bad_formats
    worst = np.mean([clean[b] for b in bads], axis=0)
    for p, cand in enumerate(cands):
        for fmt in [case.good, *bads]:
            after = scores[fmt][p]
            right = np.asarray(metric.right(after))
            before = np.asarray(metric.right(clean[fmt]))
            if fmt == case.good:
                frac = _ratio(after, good, good, worst, damage=True)
            else:
                frac = _ratio(after, clean[fmt], good, clean[fmt], damage=False)
            res.effects.append(EffectRow(cand.name, fmt, "good" if fmt == case.good else "bad",
                                         wilson(int(right.sum()), right.size), wilson(int(before.sum()), before.size),
                                         frac))
    targeted = sorted({lh for c in cands for lh in c.heads})
    layers = {layer for layer, _ in targeted}
    for fmt in [case.good, *bads]:
        mass = _first_token_mass(model, case, fmt, items, cands, layers, batch_size)
        for cand in cands:
            for layer, head in cand.heads:
                res.moved.append(MovedRow(cand.name, fmt, f"L{layer}H{head}", float(mass[(None, layer)][head]),
                                          float(mass[(cand.name, layer)][head])))
    return res


__all__ = ["Candidate", "EffectRow", "MovedRow", "SinkInterventionResult", "candidates", "run_candidates", "sink_interventions"]
