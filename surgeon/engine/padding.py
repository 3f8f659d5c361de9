"""Padding a model reads: a bidirectional model (TransformerLens's `attention_dir="bidirectional"`: tracr's compiled
models, BERT-style encoders) attends from every position to every other, the padding after a short row included.
Where the engine right-pads rows it masks those keys for every query, in every attention layer, so each row computes
what it computes alone; a causal model never reads a later position and needs nothing. The rows' layout for such a
model is `rows.layout(..., bidirectional=True)`: no shared prefix, no row cut after its last read position, no row
merged into another."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch
from torch import Tensor

from surgeon.errors import AnalysisError


def bidirectional(model) -> bool:
    """Whether the model's attention reads later positions (TransformerLens's `attention_dir`)."""
    return getattr(getattr(model, "cfg", None), "attention_dir", "causal") == "bidirectional"


def pad_hooks(model, lengths: Tensor) -> list:
    """(hook point, fn) pairs masking, in every attention layer, the keys at or after each row's length (`lengths`
    [n]; a batch of copies of the n rows, copy-major, is masked copy by copy). None needed for a causal model."""
    if not bidirectional(model):
        return []
    lengths = lengths.long()

    def mask(scores: Tensor, hook) -> Tensor:  # [batch, head, query, key]
        B, K = scores.shape[0], scores.shape[-1]
        n = lengths.shape[0]
        if B % n:
            raise AnalysisError(f"internal: a batch of {B} rows is not copies of {n} padded rows")
        lens = lengths.to(scores.device).repeat(B // n)
        keep = torch.arange(K, device=scores.device)[None] < lens[:, None]  # [B, K]
        return scores.masked_fill(~keep[:, None, None, :], float("-inf"))

    return [(f"blocks.{layer}.attn.hook_attn_scores", mask) for layer in range(model.cfg.n_layers)]


@contextmanager
def masked_padding(model, lengths: Tensor | None):
    """While the block runs, a bidirectional model's padded keys masked (`pad_hooks`); nothing for a causal one."""
    hooks = pad_hooks(model, lengths) if lengths is not None else []
    with (model.hooks(fwd_hooks=hooks) if hooks else nullcontext()):
        yield


def refuse_generation(model) -> None:
    """Generation runs a model left to right, which a bidirectional one is not: refused, naming why."""
    if bidirectional(model):
        raise AnalysisError("the model's attention is bidirectional (cfg.attention_dir='bidirectional'): it reads "
                            "every position of its input at once, so it does not generate text left to right",
                            field="model", fix="score answers instead (every analysis but generation runs on it)")
