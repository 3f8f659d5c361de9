"""Attention over a prefix shared by every patch in a batch, without copying it once per patch.

The core runs P patches of n rows as one batch of P * n rows that share the same first p0 positions.
TransformerLens's key/value cache would need those keys and values repeated P times (and copied again
inside attention); here each attention layer reads them once, shape [n, p0, kv_heads, d_head], and
broadcasts them over the patches. Everything else is TransformerLens's own attention code: only the
score and value products (and the rotary offset of the new keys) are replaced, inside a context manager
that always restores the modules. Hook points (q, k, v, attn_scores, pattern, z) fire with their usual
shapes, so interventions on them behave as in a full forward pass.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Mapping

import torch
from torch import Tensor

_ATTENTION_CLASSES = ("Attention", "GroupedQueryAttention")


def supported(model) -> bool:
    """Whether every attention layer is one whose forward this mode reproduces exactly."""
    cfg = model.cfg
    flags = ("use_logn_attn", "use_attention_sinks", "use_attn_result", "load_in_4bit", "use_split_qkv_input",
             "use_attn_in", "use_hook_mlp_in")
    return (cfg.positional_embedding_type in ("standard", "rotary")
            and getattr(cfg, "attention_dir", "causal") == "causal"
            and not any(getattr(cfg, f, False) for f in flags)
            and getattr(cfg, "original_architecture", None) not in ("OlmoeForCausalLM", "Olmo2ForCausalLM",
                                                                    "Olmo3ForCausalLM")
            and all(type(b.attn).__name__ in _ATTENTION_CLASSES for b in model.blocks))


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
def shared_prefix(model, prefix: Mapping[int, tuple[Tensor, Tensor]], n: int, p0: int, start: int):
    """While active, attention of layers >= start attends to `prefix[L]` (keys and values of the first p0
    positions, [n, p0, kv_heads, d_head], before rotary) plus the new positions of each row. The batch
    is patch-major: row b belongs to prefix row b % n."""
    from transformer_lens.utilities.activation_functions import apply_softcap

    patched = []
    try:
        for L in range(start, model.cfg.n_layers):
            attn = model.blocks[L].attn
            H = attn.cfg.n_heads
            k_pre, v_pre = prefix[L]
            original_rotary = attn.apply_rotary
            if attn.cfg.positional_embedding_type == "rotary":
                k_pre = original_rotary(k_pre, 0, None)
            k_pre, v_pre = _heads(k_pre, H), _heads(v_pre, H)  # [n, p0, H, d]

            def scores(q, k, attn=attn, k_pre=k_pre):
                B, Q, _, D = q.shape
                c = B // n
                pre = torch.einsum("cnqhd,nkhd->cnhqk", q.reshape(c, n, Q, H, D), k_pre.to(q.dtype))
                new = torch.einsum("bqhd,bkhd->bhqk", q, _heads(k, H))
                s = torch.cat([pre.reshape(B, H, Q, p0), new], dim=-1) / attn.attn_scale
                return apply_softcap(s, attn.cfg.attn_scores_soft_cap)

            def z_scores(v, pattern, attn=attn, v_pre=v_pre):
                B, _, Q, _ = pattern.shape
                c = B // n
                pre = torch.einsum("cnhqk,nkhd->cnqhd", pattern[..., :p0].reshape(c, n, H, Q, p0), v_pre.to(v.dtype))
                new = torch.einsum("bhqk,bkhd->bqhd", pattern[..., p0:], _heads(v, H))
                return attn.hook_z(pre.reshape(B, Q, H, -1) + new)

            def rotary(x, past_kv_pos_offset=0, attention_mask=None, original=original_rotary):
                # TransformerLens rotates queries from offset p0 and (cached + new) keys from 0; the keys
                # here are only the new ones, which start at p0 too.
                return original(x, p0, attention_mask)

            attn.calculate_attention_scores = scores
            attn.calculate_z_scores = z_scores
            attn.apply_rotary = rotary
            patched.append(attn)
        yield
    finally:
        for attn in patched:
            for name in ("calculate_attention_scores", "calculate_z_scores", "apply_rotary"):
                attn.__dict__.pop(name, None)


def prefix_cache(model, p0: int, start: int):
    """A TransformerLens cache object whose entries for layers >= start report a prefix of length p0."""
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    entries = [None] * start + [PrefixEntry(p0) for _ in range(start, model.cfg.n_layers)]
    return TransformerLensKeyValueCache(entries=entries, previous_attention_mask=torch.empty((0, p0)), frozen=True)
