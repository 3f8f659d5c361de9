"""What every analysis assumes of a model's attention, checked wherever a model enters: its config before the
weights load (`models.checks`), the loaded model (`models.loading`) and the engine it is handed to (`Contrast`,
`score_rows`). Below the engine and torch-free, so the checks before loading import nothing heavy.

Causal attention (decoder-only language models) and bidirectional attention (TransformerLens's
`attention_dir="bidirectional"`: tracr's compiled models, BERT-style encoders) both run exactly: for a bidirectional
model the engine keeps every row whole and alone and masks its padding (`surgeon.engine.padding`)."""
from __future__ import annotations

from surgeon.errors import ModelError

DIRECTIONS = ("causal", "bidirectional")


def check_attention(model, where: str = "") -> None:
    """Refuse a model whose attention direction the engine does not know how to run exactly."""
    direction = getattr(getattr(model, "cfg", None), "attention_dir", "causal")
    if direction not in DIRECTIONS:
        raise ModelError(f"the model's attention is {direction!r} (cfg.attention_dir); surgeon runs causal and "
                         "bidirectional attention exactly, and no other", where=where or None, field="attention_dir",
                         fix="use a model whose config says attention_dir 'causal' or 'bidirectional'")
