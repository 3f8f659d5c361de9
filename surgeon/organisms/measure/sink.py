"""Measuring organism:sink with plain TransformerLens hooks (no surgeon engine): every attention pattern, residual
stream, MLP activation and query/key of every prompt against the closed form (`surgeon.organisms.sink`)."""
from __future__ import annotations

import numpy as np

from surgeon.organisms.sink import FORMATS, MASSIVE, SINK_HEAD, SUPER, closed_form, flagged_ids, items_values


def prompts(model, fmt: str) -> list[list[int]]:
    """Each item's prompt in format `fmt` as token ids, BOS first (the tokenizer's own encoding)."""
    tok = model.tokenizer
    bos = tok.convert_tokens_to_ids("<bos>")
    return [[bos] + tok.encode(FORMATS[fmt].format(x=x, y=y), add_special_tokens=False) for x, y in items_values()]


def measure(model) -> dict:
    import torch

    L = model.cfg.n_layers
    names = [f"blocks.{l}.{h}" for l in range(L) for h in ("attn.hook_pattern", "hook_resid_post", "mlp.hook_post",
                                                              "attn.hook_q", "attn.hook_k")]
    flagged, bos = flagged_ids(model.tokenizer), model.tokenizer.convert_tokens_to_ids("<bos>")
    worst, checked = 0.0, 0
    mass, other = {}, {}
    top = (0.0, 0.0)
    for fmt in FORMATS:
        ms, os_ = [], []
        for tokens in prompts(model, fmt):
            with torch.no_grad():
                _, cache = model.run_with_cache(torch.tensor([tokens]), names_filter=names)
            want = closed_form(tokens, flagged, bos)
            for l in range(L):
                for key, hook in (("pattern", "attn.hook_pattern"), ("resid_post", "hook_resid_post"),
                                  ("post", "mlp.hook_post"), ("q", "attn.hook_q"), ("k", "attn.hook_k")):
                    got = cache[f"blocks.{l}.{hook}"][0].double().numpy()
                    worst = max(worst, float(np.abs(got - want[key][l]).max()))
            checked += 1
            A = cache[f"blocks.{SINK_HEAD[0]}.attn.hook_pattern"][0, SINK_HEAD[1]].double().numpy()
            ms.append(A[1:, 0].mean())
            os_.append(A[1:, 1].mean())
            x = cache["blocks.0.hook_resid_post"][0].double().numpy()
            if abs(x[0, MASSIVE]) > top[0]:
                top = (abs(x[0, MASSIVE]), float(np.median(np.abs(x))))
        mass[fmt], other[fmt] = float(np.mean(ms)), float(np.mean(os_))
    plain = prompts(model, "plain")[0]
    want = closed_form(plain, flagged, bos)["pattern"][SINK_HEAD[0]][SINK_HEAD[1]]
    return {
        "prompts_checked": checked,
        "closed_form_max_error": worst,
        "sink_head_mass_plain": mass["plain"],
        "sink_head_mass_plain_closed_form": float(want[1:, 0].mean()),
        "sink_head_mass_chat": mass["chat"],
        "sink_head_other_chat": other["chat"],
        "super_neuron_write": float(model.blocks[0].mlp.W_out[SUPER, MASSIVE].detach()),
        "massive_value": top[0],
        "massive_ratio": top[0] / top[1],
    }
