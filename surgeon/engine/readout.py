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
from surgeon.engine import prefix_attention
from surgeon.engine.rows import answer_cuts, cut_row, padded, unseen_answers
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


@dataclass(frozen=True, eq=False)
class RunSpec:
    """What one call to the engine does, handed down its call chain (`run` -> its buckets -> each chunk's forward
    pass and hooks) instead of set on the engine around the call, so two calls in different modes can interleave
    (a callback of one making the other) and each sees only its own. `leaves`: the masks whose `.grad` a gradient
    call accumulates (each chunk back-propagated as soon as it is scored); none: no backward pass. `drop`: hook points
    whose outputs pass no gradient back. `pool`: only the patches' summed gradient of each mask is wanted (a site may
    put it in a chunk's first row). `read`: scores read at a hook point, not the metric. `catch`: (hook, store), the
    activation at `hook` whose gradient `store(bucket, grad)` receives."""

    leaves: tuple = ()
    drop: tuple = ()
    pool: bool = False
    read: At | None = None
    catch: tuple | None = None


PLAIN = RunSpec()


def logits_dtype(model) -> torch.dtype:
    """The dtype of `final_logits` and of every score read from them: float32, float64 for a float64 model."""
    return torch.promote_types(next(model.parameters()).dtype, torch.float32)


def final_logits(model, h: Tensor) -> Tensor:
    """float32 logits (float64 for a float64 model) from final-layer residuals [..., d]: the final norm, the
    unembedding and the model's logit soft-cap where it has one."""
    if model.cfg.normalization_type is not None:
        h = model.ln_final(h)
    u = model.unembed
    if u.hook_in._forward_hooks or u.hook_out._forward_hooks:
        logits = u(h)
    else:  # TransformerLens's Unembed copies W_U transposed on every call (the size of the unembedding): not here
        logits = torch.matmul(h, u.W_U) + u.b_U
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # logits_dtype(model)
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
               metric: Metric | None = None, reference: Tensor | None = None, share_prefixes: bool = False,
               work: dict | None = None) -> Tensor:
    """Clean (unpatched) item scores [n_items]: the metric per item (default: log P(correct) - log P(incorrect));
    `reference` [n_items, vocab]: the metric's reference log-probabilities per item.

    Rows are sorted by length and right-padded per batch (a bidirectional model's padding masked). `progress`: a
    tqdm bar with this description when there is more than one batch. `share_prefixes`, `work`: see
    `final_batches`."""
    check_attention(model)
    device = next(model.parameters()).device
    n_items = max(r.item for r in rows) + 1
    out = torch.zeros(n_items, device=device, dtype=logits_dtype(model))
    for batch, resid, pos, tok, sign in final_batches(model, rows, batch_size, progress, share_prefixes, work):
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
    out = torch.zeros(n_items, model.cfg.d_vocab_out, device=device, dtype=logits_dtype(model))
    if bidirectional(model):  # the first target's position, reading none of the answer (one row per row)
        rows = [cut_row(r, cuts[0]) for r in rows for cuts in [answer_cuts(r)] if cuts]
    for batch, resid, pos, _, _ in final_batches(model, rows, batch_size, None):
        logits = final_logits(model, resid[torch.arange(len(batch), device=device), pos[:, 0]][:, None])[:, 0]
        out[torch.tensor([r.item for r in batch], device=device)] = logits.log_softmax(-1)
    return out


def final_batches(model, rows: Sequence[Row], batch_size: int, progress: str | None, share_prefixes: bool = False,
                  work: dict | None = None):
    """Rows in right-padded batches: (rows, final residual from the batch's first computed position on, target
    positions relative to it, tokens, signs). A bidirectional model's rows are cut first, so that no scored position
    reads the answer it predicts (`rows.unseen_answers`). Rows are sorted by length; with `share_prefixes` (a causal
    model whose attention `prefix_attention` reproduces), rows that share a long token prefix (few-shot examples, an
    instruction, a chat template's system prompt: `prefix_batches`) are batched together and the prefix is run once
    per batch, every row attending to its keys and values. `work`: adds the positions run ("positions", real tokens
    only) and those a run of each row whole would ("positions_whole")."""
    device = next(model.parameters()).device
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    both = bidirectional(model)
    if both:
        rows = unseen_answers(rows)
    share = share_prefixes and prefix_attention.unsupported(model) is None
    plan = prefix_batches(rows, batch_size) if share else [
        (ids, 0) for ids in _chunks(sorted(range(len(rows)), key=lambda i: len(rows[i].tokens)), batch_size)]
    if progress and len(plan) > 1:
        from tqdm.auto import tqdm

        plan = tqdm(plan, desc=progress, unit="batch")
    n_layers = model.cfg.n_layers
    for ids, p in plan:
        batch = [rows[i] for i in ids]
        W, T = max(len(r.tokens) for r in batch), max(len(r.targets) for r in batch)
        tokens = padded([r.tokens for r in batch], W, pad, device)
        pos = padded([[t[0] for t in r.targets] for r in batch], T, p, device) - p
        tok = padded([[t[1] for t in r.targets] for r in batch], T, 0, device)
        sign = padded([[t[2] for t in r.targets] for r in batch], T, 0.0, device, torch.float32)
        if p:
            names = [f"blocks.{L}.attn.hook_{x}" for L in range(n_layers) for x in "kv"]
            _, cache = model.run_with_cache(tokens[:1, :p], names_filter=names, stop_at_layer=n_layers)
            kv = {L: (cache[f"blocks.{L}.attn.hook_k"], cache[f"blocks.{L}.attn.hook_v"]) for L in range(n_layers)}
            resid = model.input_to_embed(tokens)[0][:, p:]
            with prefix_attention.shared_prefix(model, kv, 1, p, 0):
                final = model(resid, start_at_layer=0, stop_at_layer=n_layers,
                              past_kv_cache=prefix_attention.prefix_cache(model, p, 0))
        else:
            with masked_padding(model, lengths(batch, device) if both else None):
                final = model(tokens, stop_at_layer=n_layers)
        if work is not None:
            work["positions"] = work.get("positions", 0) + p + sum(len(r.tokens) - p for r in batch)
            work["positions_whole"] = work.get("positions_whole", 0) + sum(len(r.tokens) for r in batch)
        yield batch, final, pos, tok, sign


SHARED_PREFIX = 8  # tokens: rows sharing fewer are batched by length, as if they shared none
FAMILY = 4  # rows: fewer sharing a prefix are not worth a batch of their own


def prefix_batches(rows: Sequence[Row], batch_size: int) -> list[tuple[list[int], int]]:
    """Batches [(row indices, shared prefix length)]: rows sorted by their tokens fall into families that share at
    least a quarter of the first one's tokens (and `SHARED_PREFIX`); a family of at least `FAMILY` rows is batched
    alone, each batch with the prefix all its rows share (never past a row's first scored position, so every score
    is read from the positions run after it); the other rows by length, sharing nothing."""
    lex = sorted(range(len(rows)), key=lambda i: rows[i].tokens)
    out, rest, i = [], [], 0
    while i < len(lex):
        a = rows[lex[i]].tokens
        need, j = max(SHARED_PREFIX, len(a) // 4), i + 1
        while j < len(lex) and _common(a, rows[lex[j]].tokens) >= need:  # sorted: the common part only shrinks
            j += 1
        if j - i >= FAMILY:
            for ids in _chunks(lex[i:j], batch_size):
                p = min(_common(rows[ids[0]].tokens, rows[ids[-1]].tokens),
                        *(min((t[0] for t in rows[k].targets), default=0) for k in ids),
                        *(len(rows[k].tokens) - 1 for k in ids))
                out.append((ids, p if p >= SHARED_PREFIX else 0))
        else:
            rest += lex[i:j]
        i = j
    rest.sort(key=lambda k: len(rows[k].tokens))
    return out + [(ids, 0) for ids in _chunks(rest, batch_size)]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[lo: lo + size] for lo in range(0, len(ids), size)]


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
