"""Measuring organism:chain with plain TransformerLens hooks and its planted SAEs (no surgeon engine)."""
from __future__ import annotations

from surgeon.organisms.chain import (
    FAILING,
    FORMATS,
    G1,
    GOOD,
    HOOKS,
    LETTERS,
    items_values,
    planted_edges,
    planted_saes,
    scores,
)


def _last_logit_diffs(model, fmt: str, hooks=()) -> list[float]:
    import torch

    out = []
    tid = model.tokenizer.convert_tokens_to_ids
    for x, y in items_values():
        text = FORMATS[fmt].format(x=x, y=y)
        tokens = model.to_tokens(text, prepend_bos=True)
        with torch.no_grad():
            logits = model.run_with_hooks(tokens, fwd_hooks=list(hooks))[0, -1]
        out.append(float(logits[tid(x)] - logits[tid(y)]))
    return out


def measure(model) -> dict:
    """On every item: clean accuracy per format, the largest gap between the measured scores and the closed form, the
    planted SAEs' largest error term at the last position, and the Jacobian d B / d A measured by adding one unit of
    each A_j (and of C) to layer 0's MLP output at the last position of every qa item and reading the layer-1 SAE."""
    import torch

    facts: dict = {"n_items": len(items_values())}
    measured = {f: _last_logit_diffs(model, f) for f in (GOOD, FAILING[0])}
    facts["accuracy"] = {f: sum(v > 0 for v in s) / len(s) for f, s in measured.items()}
    facts["closed_form_max_error"] = max(abs(a - b) for f in measured for a, b in zip(measured[f], scores(f)))
    saes = planted_saes(model)
    err, jac, c_to_d = 0.0, 0.0, 0.0
    n = len(LETTERS)
    for fmt in (GOOD, FAILING[0]):
        for x, y in items_values():
            tokens = model.to_tokens(FORMATS[fmt].format(x=x, y=y), prepend_bos=True)
            with torch.no_grad():
                _, cache = model.run_with_cache(tokens, names_filter=list(HOOKS))
                for layer, hook in enumerate(HOOKS):
                    a = cache[hook][0, -1]
                    err = max(err, float((a - saes[layer].decode(saes[layer].encode(a))).abs().max()))
            if fmt != FAILING[0] or y != LETTERS[(LETTERS.index(x) + 1) % n]:
                continue  # the Jacobian on n qa items (one per x)
            with torch.no_grad():
                base = saes[1].encode(cache[HOOKS[1]][0, -1])
                for j in range(n + 2):  # A_0..A_{n-1}, then C_:, C_?
                    direction = saes[0].W_dec[j]

                    def add(act, hook, direction=direction):
                        act = act.clone()
                        act[0, -1] += direction
                        return act
                    kept = {}
                    model.run_with_hooks(tokens, fwd_hooks=[(HOOKS[0], add),
                                                            (HOOKS[1], lambda a, hook: kept.setdefault("x", a[0, -1]))])
                    moved = saes[1].encode(kept["x"]) - base
                    want = torch.zeros_like(moved)
                    if j < n:
                        want[j] = G1[j]
                    else:
                        want[n + j - n] = 1.0
                        c_to_d = max(c_to_d, float(moved[j]))
                    jac = max(jac, float((moved - want).abs().max()))
    facts.update(sae_error_max=err, jacobian_max_error=jac, c_to_d=c_to_d,
                 planted_edges=[planted_edges()[(f"A_{c}", f"B_{c}")] for c in LETTERS])
    return facts
