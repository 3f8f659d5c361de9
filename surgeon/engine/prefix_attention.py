"""Attention over a prefix shared by every patch in a batch, without copying it once per patch.

The core runs P patches of n rows as one batch of P * n rows that share the same first p0 positions.
TransformerLens's key/value cache would need those keys and values repeated P times (and copied again
inside attention); here each attention layer reads them once, shape [n, p0, kv_heads, d_head], and
broadcasts them over the patches. The attention forward is replaced (inside a context manager that
always restores the modules) by one that does what TransformerLens's does for the configurations
`supported` admits, projections, rotary and causal mask by TransformerLens's own methods; hook points
(q, k, v, rot_q, rot_k, attn_scores, pattern, z) fire with their usual shapes, so interventions on
them behave as in a full forward pass.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Mapping

import torch
from torch import Tensor

_ATTENTION_CLASSES = ("Attention", "GroupedQueryAttention")


def unsupported(model) -> str | None:
    """Why this mode cannot reproduce the model's attention exactly, or None where it can."""
    cfg = model.cfg
    flags = ("use_logn_attn", "use_attention_sinks", "use_attn_result", "load_in_4bit", "use_split_qkv_input",
             "use_attn_in", "use_hook_mlp_in")
    if cfg.positional_embedding_type not in ("standard", "rotary"):
        return f"{cfg.positional_embedding_type} positional embeddings"
    if getattr(cfg, "attention_dir", "causal") != "causal":
        return "non-causal attention"
    on = [f for f in flags if getattr(cfg, f, False)]
    if on:
        return "the model's config sets " + ", ".join(on)
    if getattr(cfg, "clip_qkv", None) is not None:
        return "clipped query/key/value"
    if getattr(cfg, "original_architecture", None) in ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM"):
        return f"{cfg.original_architecture} attention"
    other = sorted({type(b.attn).__name__ for b in model.blocks} - set(_ATTENTION_CLASSES))
    return f"attention class {', '.join(other)}" if other else None


def supported(model) -> bool:
    """Whether every attention layer is one whose forward this mode reproduces exactly."""
    return unsupported(model) is None


class PrefixEntry:
    """Stands in for a TransformerLens cache entry: reports the prefix length, stores nothing."""

    frozen = True

    def __init__(self, p0: int):
        self.past_keys = torch.empty((0, p0, 0, 0))

    def append(self, k: Tensor, v: Tensor):
        return k, v


def _heads(x: Tensor, n_heads: int) -> Tensor:
    """Key/value heads repeated to query heads (grouped-query attention), as TransformerLens does."""
    return x if x.shape[2] == n_heads else x.repeat_interleave(n_heads // x.shape[2], dim=2)


@contextmanager
def shared_prefix(model, prefix: Mapping[int, tuple[Tensor, Tensor]], n: int, p0: int, start: int,
                  z_start: Tensor | None = None):
    """While active, attention of layers >= start attends to `prefix[L]` (keys and values of the first p0
    positions, [n, p0, kv_heads, d_head], before rotary) plus the new positions of each row. The batch
    is patch-major: row b belongs to prefix row b % n. With `z_start` (the head outputs of layer `start`
    at the new positions, [n, Q, heads, d_head] for all patches or [batch, Q, heads, d_head] one per row),
    that layer's attention is not recomputed: its output is made from `z_start` (through hook_z, so
    patches of z apply); hooks before hook_z do not fire there."""
    patched = []
    try:
        for L in range(start, model.cfg.n_layers):
            attn = model.blocks[L].attn
            if L == start and z_start is not None:
                attn.forward = _output_forward(attn, z_start)
            else:
                attn.forward = _suffix_forward(attn, *prefix[L], n, p0)
            patched.append(attn)
        yield
    finally:
        for attn in patched:
            attn.__dict__.pop("forward", None)


def _suffix_forward(attn, k_pre: Tensor, v_pre: Tensor, n: int, p0: int):
    """TransformerLens's attention forward (for the configurations `supported` admits) for new positions
    p0.. of rows that share their first p0 keys and values, with the same hook points firing in the same
    order and shapes. Beyond reading the prefix once per batch it leaves out work that cannot change the
    result here: the causal mask when it masks nothing (one new position, no window cutting in), and the
    NaN guard for fully masked rows (every query sees at least itself). Queries are scaled before the
    score product rather than the scores after it."""
    import torch.nn.functional as F
    from transformer_lens.utilities.activation_functions import apply_softcap

    cfg = attn.cfg
    H = cfg.n_heads
    rotary = cfg.positional_embedding_type == "rotary"
    if rotary:
        k_pre = attn.apply_rotary(k_pre, 0, None)
    G = k_pre.shape[2]  # key/value heads: query head h reads key/value head h // (H // G), as `_heads` repeats them
    w_out = _w_out(attn)
    masks: dict[int, Tensor | None] = {}

    # the prefix's keys and values once per key/value head (not repeated per query head): [n, G, d|p0, p0|d]
    k_t, v_h = k_pre.permute(0, 2, 3, 1).contiguous(), v_pre.permute(0, 2, 1, 3).contiguous()
    del k_pre, v_pre

    def masked(scores: Tensor) -> Tensor:
        """Soft-capping, then TransformerLens's causal (and sliding-window) mask for the new queries, applied
        only where it masks something (not for a single new position, unless a window cuts in)."""
        scores = apply_softcap(scores, cfg.attn_scores_soft_cap)
        Q = scores.shape[-2]
        if Q not in masks:
            m = attn._make_causal_mask(query_ctx_length=Q, key_ctx_length=p0 + Q, past_kv_pos_offset=p0,
                                       device=torch.device("cpu"))
            masks[Q] = None if bool(m.all()) else m.to(scores.device)
        m = masks[Q]
        return scores if m is None else torch.where(m, scores, attn.IGNORE.to(scores.device))

    def forward(query_input, key_input, value_input, past_kv_cache_entry=None, attention_mask=None, **_):
        q, k, v = attn.calculate_qkv_matrices(query_input, key_input, value_input)
        if rotary:  # the new keys, like the queries, start at position p0
            q = attn.hook_rot_q(attn.apply_rotary(q, p0, attention_mask))
            k = attn.hook_rot_k(attn.apply_rotary(k, p0, attention_mask))
        B, Q, _, D = q.shape
        c = B // n
        q = q / attn.attn_scale
        new = torch.einsum("bqhd,bkhd->bhqk", q, _heads(k, H))  # scores of the new keys [B, H, Q, Q]
        if attn.hook_attn_scores._forward_hooks or attn.hook_pattern._forward_hooks:
            # hooks see scores and pattern as [B, H, Q, keys], as in TransformerLens
            k_pre = _heads(k_t.permute(0, 3, 1, 2), H).to(q.dtype)  # [n, p0, H, d]
            pre = torch.einsum("cnqhd,nkhd->cnhqk", q.reshape(c, n, Q, H, D), k_pre)
            scores = torch.cat([pre.reshape(B, H, Q, p0), new], dim=-1)
            pattern = attn.hook_pattern(F.softmax(attn.hook_attn_scores(masked(scores)), dim=-1)).to(v.dtype)
            v_pre = _heads(v_h.permute(0, 2, 1, 3), H).to(v.dtype)
            z_pre = torch.einsum("cnhqk,nkhd->cnqhd", pattern[..., :p0].reshape(c, n, H, Q, p0), v_pre)
            z_new = torch.einsum("bhqk,bkhd->bqhd", pattern[..., p0:], _heads(v, H))
            z = z_pre.reshape(B, Q, H, D) + z_new
        else:
            # nobody looks at scores or pattern: keep them item-major, [n, H, patch, Q, keys], where both
            # products with the prefix are plain batched matrix products and no layout change is copied
            # the query heads of one key/value head side by side: one matrix product per key/value head
            qi = q.view(c, n, Q, H, D).permute(1, 3, 0, 2, 4).reshape(n, G, H // G * c * Q, D)
            pre = torch.matmul(qi, k_t.to(q.dtype)).view(n, H, c, Q, p0)
            scores = torch.cat([pre, new.view(c, n, H, Q, Q).permute(1, 2, 0, 3, 4)], dim=-1)
            pattern = F.softmax(masked(scores), dim=-1).to(v.dtype)
            z_pre = torch.matmul(pattern[..., :p0].reshape(n, G, H // G * c * Q, p0), v_h.to(v.dtype))
            z_new = torch.einsum("nhcqk,cnkhd->cnqhd", pattern[..., p0:], _heads(v, H).view(c, n, Q, H, D))
            z = (z_pre.view(n, H, c, Q, D).permute(2, 0, 3, 1, 4) + z_new).reshape(B, Q, H, D)
        return _project(attn, attn.hook_z(z), w_out)

    return forward


def _output_forward(attn, z: Tensor):
    """An attention forward that takes its head outputs as given ([n, Q, heads, d_head], the same for every
    patch, or one per row of the batch) instead of computing them: hook_z, then the output projection."""
    w_out = _w_out(attn)

    def forward(query_input, key_input, value_input, past_kv_cache_entry=None, attention_mask=None, **_):
        c = query_input.shape[0] // z.shape[0]
        return _project(attn, attn.hook_z(z.to(query_input.device).repeat(c, 1, 1, 1)), w_out)

    return forward


def _w_out(attn) -> Tensor:
    """W_O as TransformerLens's output projection uses it: [d_model, heads * d_head]."""
    return attn.W_O.reshape(-1, attn.cfg.d_model).T.contiguous()


def _project(attn, z: Tensor, w_out: Tensor) -> Tensor:
    """Head outputs [B, Q, heads, d_head] -> attention output [B, Q, d_model], as TransformerLens computes it."""
    import torch.nn.functional as F

    z = z.reshape(*z.shape[:2], -1).to(w_out.dtype)
    return F.linear(z, w_out.to(z.device), attn.b_O.to(z.device))


def prefix_cache(model, p0: int, start: int):
    """A TransformerLens cache object whose entries for layers >= start report a prefix of length p0."""
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    entries = [None] * start + [PrefixEntry(p0) for _ in range(start, model.cfg.n_layers)]
    return TransformerLensKeyValueCache(entries=entries, previous_attention_mask=torch.empty((0, p0)), frozen=True)
