"""Where a score is read: the final residual stream's logits at the target positions through the case's metric
(`readout`), clean scores of rows (`score_rows`), a KL metric's reference, scores read at a hook point instead
(`At`), and greedy generation with hooks on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor

from surgeon.causal import check_attention
from surgeon.engine.kernels import hooked
from surgeon.engine.padding import bidirectional, masked_padding, refuse_generation
from surgeon.engine.rows import padded
from surgeon.errors import AnalysisError
from surgeon.case.encoding import Row
from surgeon.case.metrics import LogProb, Metric


LOGPROB = LogProb()


@dataclass(frozen=True)
class At:
    """Scores read at a hook point instead of the logits (`Contrast.run(masks, read=At(...))`): `fn(x, items, valid,
    lo)` turns the activation there at the base run's aligned positions, x [c, n, S, ...] under patches lo..lo+c of
    the call, into [c, n] scores (items [n]: each row's item; valid [n, S]: 1 for real slots). The pass stops after
    the hook's layer; grouping and splitting by first layer are not taken (why: "read at a hook point")."""

    hook: str
    fn: Callable


def final_logits(model, h: Tensor) -> Tensor:
    """float32 logits from final-layer residuals [..., d]: the final norm, the unembedding and the model's logit
    soft-cap where it has one."""
    if model.cfg.normalization_type is not None:
        h = model.ln_final(h)
    u = model.unembed
    if u.hook_in._forward_hooks or u.hook_out._forward_hooks:
        logits = u(h).float()
    else:  # TransformerLens's Unembed copies W_U transposed on every call (the size of the unembedding): not here
        logits = (torch.matmul(h, u.W_U) + u.b_U).float()
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0
    return cap * torch.tanh(logits / cap) if cap > 0 else logits


def readout(model, resid: Tensor, tgt_rel: Tensor, tok: Tensor, sign: Tensor, max_rows: int | None = None,
            metric: Metric | None = None, ref: Tensor | None = None) -> Tensor:
    """Scores [chunk, n] from final-layer residuals [chunk * n, pos, d]: the metric (default: sum of sign *
    log P(token)) over the logits at the target positions (given relative to the residual's first position);
    `ref` [n, vocab]: the metric's reference log-probabilities per row. Unembeds only those positions, at most
    `max_rows` rows at a time (the logits over a large vocabulary dominate memory)."""
    metric = metric or LOGPROB
    n = tok.shape[0]
    r = resid.view(-1, n, *resid.shape[1:])
    idx = torch.arange(n, device=r.device)[:, None]
    tgt_rel = tgt_rel.to(r.device)
    if tgt_rel.shape[1] > 1 and bool((tgt_rel == tgt_rel[:, :1]).all()):
        tgt_rel = tgt_rel[:, :1]  # every target of a row at one position: its logits once (metrics view them per target)
    sel = r[:, idx, tgt_rel]  # [chunk, n, T or 1, d]
    c, _, T, d = sel.shape
    x = sel.reshape(c * n, T, d)
    toks = tok.to(x.device).repeat(c, 1)
    signs = sign.to(x.device).float().repeat(c, 1)
    refs = ref.to(x.device).repeat(c, 1) if ref is not None else None
    step = max_rows or c * n
    picked = []
    for lo in range(0, c * n, step):
        logits = final_logits(model, x[lo: lo + step])
        picked.append(metric.score(logits, toks[lo: lo + step], signs[lo: lo + step],
                                   None if refs is None else refs[lo: lo + step]))
    return torch.cat(picked).view(c, n)


@torch.no_grad()
def score_rows(model, rows: Sequence[Row], batch_size: int = 256, progress: str | None = None,
               metric: Metric | None = None, reference: Tensor | None = None) -> Tensor:
    """Clean (unpatched) item scores [n_items]: the metric per item (default: log P(correct) - log P(incorrect));
    `reference` [n_items, vocab]: the metric's reference log-probabilities per item.

    Rows are sorted by length and right-padded per batch (a bidirectional model's padding masked). `progress`: a
    tqdm bar with this description when there is more than one batch."""
    check_attention(model)
    device = next(model.parameters()).device
    n_items = max(r.item for r in rows) + 1
    out = torch.zeros(n_items, device=device)
    for batch, resid, pos, tok, sign in final_batches(model, rows, batch_size, progress):
        items = torch.tensor([r.item for r in batch], device=device)
        ref = reference[items.to(reference.device)] if reference is not None else None
        out = out.index_add(0, items, readout(model, resid, pos, tok, sign, metric=metric, ref=ref)[0])
    check_scores(out, "unpatched")
    return out


@torch.no_grad()
def reference_logprobs(model, rows: Sequence[Row], batch_size: int = 256) -> Tensor:
    """[n_items, vocab]: each item's next-token log-probabilities at its first target position (where its
    answers first differ, for rows encoded by first token), the reference a KL metric compares against."""
    device = next(model.parameters()).device
    n_items = max(r.item for r in rows) + 1
    out = torch.zeros(n_items, model.cfg.d_vocab_out, device=device)
    for batch, resid, pos, _, _ in final_batches(model, rows, batch_size, None):
        logits = final_logits(model, resid[torch.arange(len(batch), device=device), pos[:, 0]][:, None])[:, 0]
        out[torch.tensor([r.item for r in batch], device=device)] = logits.log_softmax(-1)
    return out


def final_batches(model, rows: Sequence[Row], batch_size: int, progress: str | None):
    """Rows sorted by length, right-padded per batch: (rows, final residual, target positions, tokens, signs)."""
    device = next(model.parameters()).device
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].tokens))
    starts = range(0, len(order), batch_size)
    if progress and len(starts) > 1:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=progress, unit="batch")
    for lo in starts:
        batch = [rows[i] for i in order[lo: lo + batch_size]]
        W, T = max(len(r.tokens) for r in batch), max(len(r.targets) for r in batch)
        tokens = padded([r.tokens for r in batch], W, pad, device)
        pos = padded([[t[0] for t in r.targets] for r in batch], T, 0, device)
        tok = padded([[t[1] for t in r.targets] for r in batch], T, 0, device)
        sign = padded([[t[2] for t in r.targets] for r in batch], T, 0.0, device, torch.float32)
        with masked_padding(model, lengths(batch, device) if bidirectional(model) else None):
            final = model(tokens, stop_at_layer=model.cfg.n_layers)
        yield batch, final, pos, tok, sign


def lengths(rows: Sequence[Row], device, width: int | None = None) -> Tensor:
    """[rows] each row's real tokens (at most `width`): where a bidirectional model's padding starts."""
    return torch.tensor([min(len(r.tokens), width or len(r.tokens)) for r in rows], device=device)


def check_scores(scores: Tensor, run: str) -> None:
    """Refuse scores that are NaN or infinite: every number after them would be meaningless."""
    if not bool(torch.isfinite(scores).all()):
        raise AnalysisError(f"the model's scores in the {run} run are not finite (NaN or infinity in its logits)",
                            field="model", fix="check the checkpoint's weights; under float16 activations can "
                                               "overflow: use --dtype bfloat16 or float32")


@torch.no_grad()
def cached_batches(model, rows: Sequence[Row], hooks: Sequence[str], batch_size: int = 64, width: int | None = None):
    """Run `rows` right-padded (to `width`, else to each batch's longest) in batches of `batch_size`; yield each
    batch's rows and its activations {hook: [batch, width, ...]} (real positions never read the pad after them: a
    causal model does not, a bidirectional one's is masked)."""
    device = next(model.parameters()).device
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo: lo + batch_size]
        W = width or max(len(r.tokens) for r in chunk)
        with masked_padding(model, lengths(chunk, device, W) if bidirectional(model) else None):
            _, cache = model.run_with_cache(padded([r.tokens for r in chunk], W, pad, device), names_filter=list(hooks))
        yield chunk, {h: cache[h] for h in hooks}


@torch.no_grad()
def greedy(model, tokens: Tensor, lengths: Tensor, n_new: int, hooks: Sequence = ()) -> Tensor:
    """Greedy decoding of right-padded rows (`lengths` real tokens each), `hooks` active on every step.
    Full forward passes (no key/value cache), so position-indexed hooks stay valid. Returns [rows, n_new]."""
    refuse_generation(model)
    rows = tokens.shape[0]
    cur = torch.cat([tokens, torch.zeros((rows, n_new), dtype=tokens.dtype, device=tokens.device)], dim=1)
    lengths = lengths.clone().to(tokens.device)
    ar = torch.arange(rows, device=tokens.device)
    out = []
    first = tokens.shape[1]  # never narrower than the padded prompts: hooks may index their padding
    with hooked(model, list(hooks)):
        for _ in range(n_new):
            width = max(first, int(lengths.max()))
            logits = model(cur[:, :width])
            nxt = logits[ar, lengths - 1].argmax(-1)
            cur[ar, lengths] = nxt
            lengths += 1
            out.append(nxt)
    return torch.stack(out, dim=1)
