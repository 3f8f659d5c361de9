"""What a careful TransformerLens user writes to avoid recomputing what a patch cannot change.

Positions before the first patched one are the same in every patched run, so the user runs them once and keeps their
keys and values (TransformerLens's own `TransformerLensKeyValueCache`, frozen); layers before the first patched one are
the same too, so the user keeps the clean residual stream there and starts the patched runs at that layer
(`start_at_layer`). Many patches go in the batch dimension: the frozen cache is repeated once per patch. Used by
bench/patch_sweep.py and bench/subset_search.py beside the naive loop they always had.
"""
from __future__ import annotations

import dataclasses

import torch
from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache


def prefix_cache(model, prefix: torch.Tensor) -> TransformerLensKeyValueCache:
    """Run `prefix` [batch, pos] once and return its keys and values, frozen."""
    kv = TransformerLensKeyValueCache.init_cache(model.cfg, prefix.device, prefix.shape[0])
    if prefix.shape[1]:
        model(prefix, past_kv_cache=kv, return_type=None)
    kv.freeze()
    return kv


def repeated(kv: TransformerLensKeyValueCache, copies: int) -> TransformerLensKeyValueCache:
    """The frozen cache for `copies` patches of the same rows in the batch dimension (patch-major, as `x.repeat`)."""
    entries = [dataclasses.replace(e, past_keys=e.past_keys.repeat(copies, 1, 1, 1),
                                   past_values=e.past_values.repeat(copies, 1, 1, 1), frozen=True)
               for e in kv.entries]
    return TransformerLensKeyValueCache(entries, kv.previous_attention_mask.repeat(copies, 1), frozen=True)


def suffix_residual(model, suffix: torch.Tensor, kv: TransformerLensKeyValueCache, layer: int) -> torch.Tensor:
    """The clean residual stream entering `layer` at the suffix positions (the prefix read from `kv`)."""
    name = f"blocks.{layer}.hook_resid_pre"
    _, cache = model.run_with_cache(suffix, past_kv_cache=kv, names_filter=name, stop_at_layer=layer + 1)
    return cache[name]
