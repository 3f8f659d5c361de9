"""What every analysis assumes of a model's attention, checked wherever a model enters: its config before the
weights load (`models.checks`), the loaded model (`models.loading`) and the engine it is handed to (`Contrast`,
`score_rows`). Below the engine and torch-free, so the checks before loading import nothing heavy."""
from __future__ import annotations

from surgeon.errors import ModelError


def check_causal(model, where: str = "") -> None:
    """Refuse a model whose attention is not causal (TransformerLens's `attention_dir="bidirectional"`, BERT-style):
    the engine right-pads rows, cuts them after the last position it reads, merges rows that are prefixes of others
    and shares cached prefixes, all exact only when no position reads a later one."""
    direction = getattr(getattr(model, "cfg", None), "attention_dir", "causal")
    if direction != "causal":
        raise ModelError(f"the model's attention is {direction} (cfg.attention_dir={direction!r}); surgeon pads, cuts "
                         "and merges rows and shares prefixes, which is exact only for causal attention, so every score "
                         "would be wrong", where=where or None, field="model",
                         fix="use a causal (decoder-only) language model; bidirectional encoders are not supported")
