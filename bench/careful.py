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


def read_logprobs(model, resid: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """log-probabilities [rows, T, vocab] at positions `pos` [rows, T] from the final residual stream [rows, P, d]:
    the final norm and the unembedding at those positions only (what `stop_at_layer=n_layers` leaves to the user)."""
    x = resid[torch.arange(len(resid))[:, None], pos]
    if model.cfg.normalization_type is not None:
        x = model.ln_final(x)
    return model.unembed(x).float().log_softmax(-1)


def forward_backward(model, tokens: torch.Tensor, pos: torch.Tensor, tok: torch.Tensor) -> None:
    """The least an attribution needs: one forward of `tokens` and one backward of the log-probability of `tok` at
    `pos` (both [rows, T]), the weights frozen (gradients w.r.t. the activations only: the embedding's output is the
    leaf), the same TransformerLens blocks and kernels surgeon runs, logits only at the read positions."""
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    try:
        leaf = lambda x, hook: x.detach().requires_grad_(True)  # noqa: E731
        with model.hooks(fwd_hooks=[("hook_embed", leaf)]):
            resid = model(tokens, stop_at_layer=model.cfg.n_layers)
        if bool((pos == pos[:, :1]).all()):  # every target of a row at one position: its logits once
            pos = pos[:, :1]
        logp = read_logprobs(model, resid, pos)
        logp.expand(-1, tok.shape[1], -1).gather(-1, tok[..., None]).sum().backward()
    finally:
        for p, g in frozen:
            p.requires_grad_(g)


def shared_prefix(base, source) -> tuple[torch.Tensor, int]:
    """The base rows' tokens [rows, T] (rows of one length, aligned index by index with `source`'s) and the first
    position where any row's two prompts differ: every position before it is the same in both runs (T - 1 when none
    differs, so the last position is always computed)."""
    toks = torch.tensor([r.tokens for r in base])
    differ = (toks != torch.tensor([r.tokens for r in source])).any(0).nonzero()
    return toks, int(differ[0]) if len(differ) else toks.shape[1] - 1


def read_signs(rows) -> torch.Tensor:
    """[rows, T] the sign each target's log-probability counts with in a row's score."""
    return torch.tensor([[sg for _, _, sg in r.targets] for r in rows], dtype=torch.float32)


def read_at(rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, tokens) [rows, T] a row's metric reads (its targets; rows of one length and target count)."""
    return (torch.tensor([[p for p, _, _ in r.targets] for r in rows]),
            torch.tensor([[t for _, t, _ in r.targets] for r in rows]))
