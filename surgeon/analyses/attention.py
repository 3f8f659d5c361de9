"""Attention patterns of chosen heads on chosen items, in every format of the case side by side."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import torch

from surgeon.case.select import pick_items
from surgeon.engine.readout import cached_batches
from surgeon.errors import AnalysisError, CaseError
from surgeon.show import Shows
from surgeon.case.case import Case
from surgeon.case.encoding import encode_rows, prompt_rows
from surgeon.case.encoding import prepend_bos


@dataclass
class HeadPattern:
    head: str  # L1H0
    item: int  # index among the items analysed
    format: str
    tokens: list[str]  # the tokens read up to the scored position (keys and queries)
    pattern: np.ndarray  # [query, key] attention weights
    scored: int | None = None  # the position whose logits the metric reads (the last token here)


@dataclass
class AttentionResult(Shows):
    case: str
    tag: str | None
    formats: list[str]
    heads: list[str]
    items: list[int]
    patterns: list[HeadPattern] = field(default_factory=list)
    options: dict = field(default_factory=dict)

    def get(self, head: str, item: int, fmt: str) -> HeadPattern:
        return next(p for p in self.patterns if p.head == head and p.item == item and p.format == fmt)


def parse_heads(text, cfg) -> list[tuple[int, int]]:
    """"L1H0,L2H3" (or a list of such names) -> [(layer, head)], checked against the model."""
    names = [h.strip() for h in (text.split(",") if isinstance(text, str) else text) if h.strip()]
    out = []
    for name in names:
        m = re.fullmatch(r"L(\d+)H(\d+)", name)
        if not m:
            raise AnalysisError(f"cannot read head {name!r}", field="--heads", fix="write heads as L1H0,L2H3")
        L, h = int(m.group(1)), int(m.group(2))
        if not (0 <= L < cfg.n_layers and 0 <= h < cfg.n_heads):
            raise AnalysisError(f"head {name} is not in the model ({cfg.n_layers} layers of {cfg.n_heads} heads)",
                                field="--heads", fix=f"layers 0..{cfg.n_layers - 1}, heads 0..{cfg.n_heads - 1}")
        out.append((L, h))
    if not out:
        raise AnalysisError("no head given", field="--heads", fix="e.g. --heads L1H0,L1H1")
    return out


def _rows_to_the_scored_position(case: Case, model, fmt: str, items):
    """One row per item reaching the position whose logits the metric reads first (the prompt, then the answers'
    common prefix, teacher-forced); the prompt alone where the answers have no first differing token."""
    tok, bos = model.tokenizer, prepend_bos(case, model)
    try:
        return encode_rows(case.formats[fmt], items, tok, bos, "first_token", case.answer_end, case.combine)
    except CaseError:
        return prompt_rows(case.formats[fmt], items, tok, bos)


@torch.no_grad()
def attention_patterns(case: Case, model, *, heads, items=(0,), tag: str | None = None,
                       batch_size: int = 256) -> AttentionResult:
    """The attention pattern of each head on each item, up to and including the position whose logits the metric
    reads, in the good format and every failing one."""
    chosen = parse_heads(heads, model.cfg)
    tag, pool = pick_items(case, tag)
    items = list(items)
    bad = [i for i in items if not 0 <= i < len(pool)]
    if bad or not items:
        raise AnalysisError(f"items {bad or items} are not among the {len(pool)} items analysed", field="--items",
                            fix=f"give indices 0..{len(pool) - 1}")
    formats = [case.good, *case.bad_formats]
    layers = sorted({L for L, _ in chosen})
    out = []
    for fmt in formats:
        rows = _rows_to_the_scored_position(case, model, fmt, [pool[i] for i in items])
        hooks = [f"blocks.{L}.attn.hook_pattern" for L in layers]
        done = 0
        for chunk, cache in cached_batches(model, rows, hooks, batch_size):  # right-padded: exact when causal
            for b, row in enumerate(chunk):
                n, i = row.targets[0][0] + 1, items[done + b]  # up to the scored position (the last read here)
                toks = [model.tokenizer.decode([t]) for t in row.tokens[:n]]
                for L, h in chosen:
                    pat = cache[f"blocks.{L}.attn.hook_pattern"][b, h, :n, :n].float().cpu().numpy()
                    out.append(HeadPattern(f"L{L}H{h}", i, fmt, toks, pat, n - 1))
            done += len(chunk)
    return AttentionResult(case.name, tag, formats, [f"L{L}H{h}" for L, h in chosen], items, out,
                           options=dict(heads=[f"L{L}H{h}" for L, h in chosen], items=items, tag=tag))
