"""Measuring organism:threshold with the engine and plain TransformerLens hooks (above the engine; nothing below imports it)."""
from __future__ import annotations

from surgeon.organisms.threshold import (
    EVEN,
    FAILING,
    FORMATS,
    GOOD,
    N_HEADS,
    NEED,
    ODD,
    WEIGHTS,
    items_values,
    positions,
    subset_scores,
)
from surgeon.case.case import Item
from surgeon.case.encoding import encode_rows


def _rows(model, fmt):
    items = [Item({"x": x, "y": y}, correct=x, incorrect=y) for x, y in items_values()]
    return encode_rows(FORMATS[fmt], items, model.tokenizer, True)


def hooked_scores(model, heads) -> list[float]:
    """Each item's score with `heads` patched plain -> qa, measured with plain TransformerLens hooks (the
    head outputs `hook_z` of the plain run written into the qa run at the last position)."""
    import torch

    good, bad = _rows(model, GOOD), _rows(model, FAILING[0])
    heads = sorted(set(heads))
    out = []
    for g, b in zip(good, bad):
        last_g, last_b = g.n_prompt - 1, b.n_prompt - 1
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.tensor([g.tokens]), names_filter=["blocks.0.attn.hook_z"])
            src = cache["blocks.0.attn.hook_z"][0, last_g]

            def patch(z, hook):
                z = z.clone()
                z[0, last_b, heads] = src[heads]
                return z
            logp = model.run_with_hooks(torch.tensor([b.tokens]), fwd_hooks=[("blocks.0.attn.hook_z", patch)])[0]
        logp = logp.float().log_softmax(-1)
        out.append(float(sum(sign * logp[p, t] for p, t, sign in b.targets)))
    return out


def measure(model) -> dict:
    """On every item, with plain TransformerLens hooks (no surgeon engine): clean accuracy per format;
    attention of the even and odd heads; the largest gap between the measured scores and the closed form
    over a fixed set of patches (none, every even head, every odd head, the even heads of the lightest and
    heaviest weights, and 40 random subsets of all 32 heads); how much the odd heads' outputs differ."""
    import random

    import torch

    good, bad = _rows(model, GOOD), _rows(model, FAILING[0])
    rng = random.Random(0)
    by_weight = sorted(EVEN, key=WEIGHTS.get)
    patches = [(), EVEN, ODD, by_weight[:11], by_weight[-5:], by_weight[-4:] + by_weight[:1]]
    patches += [tuple(sorted(rng.sample(range(N_HEADS), rng.randrange(1, N_HEADS)))) for _ in range(40)]
    worst, flips = 0.0, 0
    for hs in patches:
        got, want = hooked_scores(model, hs), subset_scores(hs)
        worst = max(worst, max(abs(a - b) for a, b in zip(got, want)))
        flips += sum((a > 0) != (b > 0) for a, b in zip(got, want))
    with torch.no_grad():
        tokens = torch.tensor([list(r.tokens) for r in good + bad])
        _, cache = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z"])
        pat = cache["blocks.0.attn.hook_pattern"][:, :, -1]  # [rows, head, key]
        z = cache["blocks.0.attn.hook_z"][:, -1]  # [rows, head, d_head]
        n = len(good)
        outs = torch.einsum("rhd,hdm->rhm", z, model.blocks[0].attn.W_O)
        delta = (outs[:n] - outs[n:]).norm(dim=-1).mean(0)  # per head: |plain - qa| of its output
    px, py = positions()
    clean_bad = hooked_scores(model, ())
    return {
        "n_items": n,
        "accuracy": {GOOD: _accuracy(model, good), FAILING[0]: sum(v > 0 for v in clean_bad) / n},
        "even_attention_to_x_plain": float(pat[:n, list(EVEN), px].mean()),
        "even_attention_to_y_qa": float(pat[n:, list(EVEN), py].mean()),
        "odd_attention_to_marker": float(pat[:, list(ODD), -1].mean()),
        "closed_form_max_error": worst,
        "closed_form_sign_flips": flips,
        "patches_checked": len(patches),
        "odd_head_delta_min": float(delta[list(ODD)].min()),
        "even_head_delta_min": float(delta[list(EVEN)].min()),
        "smallest_repairing_weight": NEED,
    }


def _accuracy(model, rows) -> float:
    import torch

    ok = 0
    for r in rows:
        with torch.no_grad():
            logp = model(torch.tensor([r.tokens]))[0].float().log_softmax(-1)
        ok += float(sum(sign * logp[p, t] for p, t, sign in r.targets)) > 0
    return ok / len(rows)
