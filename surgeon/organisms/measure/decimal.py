"""Measuring organism:decimal with the engine and plain TransformerLens hooks (above the engine; nothing below imports it)."""
from __future__ import annotations

from surgeon.engine.contrast import Contrast
from surgeon.engine.readout import score_rows
from surgeon.organisms.decimal import FAILING, FORMATS, GOOD, held_out_items
from surgeon.case.encoding import encode_rows


def measure(model, n: int = 128) -> dict:
    """Accuracy per format and tag on n held-out items per tag, and the accuracy on the traps of each failing
    format when only the residual stream entering layer 0 (token + any positional embedding) is patched
    from plain at the aligned positions (`last` and `decision`)."""
    import torch

    items = held_out_items(n, n)
    tok = model.tokenizer
    out: dict = {"n_per_tag": n}
    rows = {f: encode_rows(t, items, tok, True) for f, t in FORMATS.items()}
    for f in FORMATS:
        s = score_rows(model, rows[f]).cpu()
        for tag in ("trap", "control"):
            sel = torch.tensor([it.tag == tag for it in items])
            out[f"{f}/{tag}"] = float((s[sel] > 0).float().mean())
    traps = [it for it in items if it.tag == "trap"]
    for align in ("last", "decision"):
        for f in FAILING:
            c = Contrast(model, encode_rows(FORMATS[f], traps, tok, True), encode_rows(FORMATS[GOOD], traps, tok, True),
                         align, sites=["blocks.0.hook_resid_pre"])
            with torch.no_grad():
                s = c.run({"blocks.0.hook_resid_pre": torch.ones(1, 1)})[0]
            out[f"{f}/trap resid_pre0 patched ({align})"] = float((s > 0).float().mean())
    return out
