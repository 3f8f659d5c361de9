"""Slow, obviously-correct references: one full TransformerLens forward per row and per patch."""
from __future__ import annotations

import torch

from surgeon.encoding import align


def units_of(act, comp, n_units):
    """[batch, pos, unit, rest] view, as the core sees it."""
    if comp.pattern_like:
        return act.transpose(1, 2)
    if act.dim() == 3:
        return act.view(act.shape[0], act.shape[1], n_units, -1)
    return act


def direct_patch_scores(model, base_rows, source_rows, how, site, mask, extra=()):
    """Item scores [n_items] for one patch: mask [units] at `site` (and at the (site, mask) pairs in
    `extra`), one hooked forward per row."""
    n_items = max(r.item for r in base_rows) + 1
    out = torch.zeros(n_items)
    patches = [(site, mask), *extra]
    for b, s in zip(base_rows, source_rows):
        pb, ps = align(b, s, how)
        _, cache = model.run_with_cache(torch.tensor([s.tokens]), names_filter=[x.hook for x, _ in patches])
        hooks = []
        for x, m in patches:
            src = units_of(cache[x.hook], x.component, m.shape[-1])[0]

            def hook(act, hook, x=x, m=m, src=src, pb=pb, ps=ps):
                act = act.clone()
                u = units_of(act, x.component, m.shape[-1])[0]
                for p, q in zip(pb, ps):
                    cur = u[p].clone()
                    u[p] = cur + m[:, None].to(cur.dtype) * (src[q] - cur)
                return act

            hooks.append((x.hook, hook))
        logits = model.run_with_hooks(torch.tensor([b.tokens]), fwd_hooks=hooks)[0]
        logp = logits.float().log_softmax(-1)
        out[b.item] += sum(sign * logp[p, t] for p, t, sign in b.targets)
    return out


def clean_scores(model, rows):
    n_items = max(r.item for r in rows) + 1
    out = torch.zeros(n_items)
    for r in rows:
        logp = model(torch.tensor([r.tokens]))[0].float().log_softmax(-1)
        out[r.item] += sum(sign * logp[p, t] for p, t, sign in r.targets)
    return out
