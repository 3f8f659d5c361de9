"""Slow, obviously-correct references: one full TransformerLens forward per row and per patch."""
from __future__ import annotations

import torch

from surgeon.case.encoding import align


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
        logp = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
        out[b.item] += sum(sign * logp[p, t] for p, t, sign in b.targets)
    return out


def clean_scores(model, rows):
    n_items = max(r.item for r in rows) + 1
    out = torch.zeros(n_items)
    for r in rows:
        logp = model(torch.tensor([r.tokens]))[0].float().log_softmax(-1)
        out[r.item] += sum(sign * logp[p, t] for p, t, sign in r.targets)
    return out


# ---------------------------------------------------------------------------------------------- edge graph
# Written from TransformerLens hooks alone, not from surgeon's edge code: senders are the embedding
# (resid_pre of layer 0), each head's z_h @ W_O[h] and each MLP's output; receivers are each head's q/k/v
# input (TransformerLens's split inputs; key/value heads under grouped-query attention), each MLP's input and
# the final residual. A receiver reads every sender computed before it.
def _receivers(cfg):
    """[(hook name, kind, layer)] in computation order."""
    out = []
    for L in range(cfg.n_layers):
        out += [(f"blocks.{L}.hook_{x}_input", x, L) for x in "qkv"]
        if not cfg.attn_only:
            out.append((f"blocks.{L}.hook_mlp_in", "mlp", L))
    out.append((f"blocks.{cfg.n_layers - 1}.hook_resid_post", "logits", cfg.n_layers))
    return out


def _reads(sender, kind, layer):
    """Whether a receiver (kind, layer) reads sender ("input", -1, 0) / ("head", l, h) / ("mlp", l, 0)."""
    s_kind, s_layer, _ = sender
    return s_layer < layer or (kind == "mlp" and s_kind == "head" and s_layer == layer)


def sender_outputs(model, tokens):
    """{sender: [pos, d_model]} of one unpatched run, sender = ("input", -1, 0) | ("head", l, h) | ("mlp", l, 0)."""
    cfg = model.cfg
    _, cache = model.run_with_cache(tokens[None])
    out = {("input", -1, 0): cache["blocks.0.hook_resid_pre"][0]}
    for L in range(cfg.n_layers):
        z = cache[f"blocks.{L}.attn.hook_z"][0]  # [pos, H, d_head]
        for h in range(cfg.n_heads):
            out[("head", L, h)] = z[:, h] @ model.blocks[L].attn.W_O[h]
        if not cfg.attn_only:
            out[("mlp", L, 0)] = cache[f"blocks.{L}.hook_mlp_out"][0]
    return out


def graph_forward(model, tokens, replace):
    """Logits [pos, vocab] of one forward on `tokens` in which receiver r reads, from sender s, what
    `replace(s, r, current)` returns (`current`: s's output in this very forward; r = (kind, layer, unit) with
    unit the head, or key/value head, for q/k/v). Senders' own outputs are never altered."""
    cfg = model.cfg
    cur: dict = {}
    G = cfg.n_key_value_heads or cfg.n_heads

    def keep_resid(act, hook):
        cur[("input", -1, 0)] = act[0]

    def keep_z(act, hook):
        L = int(hook.name.split(".")[1])
        for h in range(cfg.n_heads):
            cur[("head", L, h)] = act[0, :, h] @ model.blocks[L].attn.W_O[h]

    def keep_mlp(act, hook):
        cur[("mlp", int(hook.name.split(".")[1]), 0)] = act[0]

    def receive(kind, layer):
        def hook(act, hook):
            act = act.clone()
            units = range(act.shape[2]) if act.dim() == 4 else [None]
            for s, val in list(cur.items()):
                if not _reads(s, kind, layer):
                    continue
                for u in units:
                    new = replace(s, (kind, layer, u if u is not None else 0), val)
                    if new is not val:
                        if u is None:
                            act[0] = act[0] + (new - val)
                        else:
                            act[0, :, u] = act[0, :, u] + (new - val)
            return act
        return hook

    hooks = [("blocks.0.hook_resid_pre", keep_resid)]
    for L in range(cfg.n_layers):
        hooks.append((f"blocks.{L}.attn.hook_z", keep_z))
        if not cfg.attn_only:
            hooks.append((f"blocks.{L}.hook_mlp_out", keep_mlp))
    hooks += [(name, receive(kind, L)) for name, kind, L in _receivers(cfg)]
    old = (cfg.use_split_qkv_input, cfg.use_hook_mlp_in)
    cfg.use_split_qkv_input, cfg.use_hook_mlp_in = True, True
    try:
        return model.run_with_hooks(tokens[None], fwd_hooks=hooks)[0]
    finally:
        cfg.use_split_qkv_input, cfg.use_hook_mlp_in = old


def row_score(logits, row):
    logp = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
    return sum(sign * logp[p, t] for p, t, sign in row.targets)


def edge_name(sender, receiver, cfg):
    """EAP-IG's name of the edge sender -> receiver (surgeon's under grouped-query attention: a1.g0<k>)."""
    s_kind, s_layer, s_unit = sender
    snd = {"input": "input", "head": f"a{s_layer}.h{s_unit}", "mlp": f"m{s_layer}"}[s_kind]
    kind, layer, unit = receiver
    G = cfg.n_key_value_heads or cfg.n_heads
    if kind == "q" or (kind in "kv" and G == cfg.n_heads):
        rcv = f"a{layer}.h{unit}<{kind}>"
    elif kind in "kv":
        rcv = f"a{layer}.g{unit}<{kind}>"
    else:
        rcv = {"mlp": f"m{layer}", "logits": "logits"}[kind]
    return f"{snd}->{rcv}"


def eap_ig_reference(model, base_rows, source_rows, method: str, steps: int) -> dict:
    """EAP-IG's edge scores written out from its formula (hannamw/EAP-IG `get_scores_eap_ig` and
    `get_scores_ig_activations`), with `clean` = the base rows (the run patched into) and `corrupted` = the
    source rows: the sender difference (corrupted - clean) times the gradient of the mean item score at the
    receiver, summed over positions, averaged over the interpolation points. inputs: the embedding at
    corrupted + k/steps (clean - corrupted), k = 0..steps-1; activations: one sender group (the embedding, a
    layer's heads, an MLP) at alpha clean + (1 - alpha) corrupted, alpha = k/steps, k = 1..steps, with the
    gradient still flowing through the group (EAP-IG replaces its output by a constant, which cuts it)."""
    cfg = model.cfg
    n_items = max(r.item for r in base_rows) + 1
    scores: dict = {}
    groups = [("input", -1)] + [(k, L) for L in range(cfg.n_layers) for k in (("head",) if cfg.attn_only else ("head", "mlp"))]
    for b, s in zip(base_rows, source_rows):
        tb, ts = torch.tensor(b.tokens), torch.tensor(s.tokens)
        with torch.no_grad():
            out_b, out_s = sender_outputs(model, tb), sender_outputs(model, ts)
            _, cb = model.run_with_cache(tb[None])
            _, cs = model.run_with_cache(ts[None])
        if method == "inputs":
            points = [(("input", -1), 1 - k / steps) for k in range(steps)]
        else:
            points = [(g, 1 - k / steps) for g in groups for k in range(1, steps + 1)]
        for (gkind, glayer), beta in points:
            grads = {}

            def leaf(act, hook, beta=beta, gk=gkind):
                x = cb["blocks.0.hook_resid_pre"] + (beta if gk == "input" else 0.0) * (
                    cs["blocks.0.hook_resid_pre"] - cb["blocks.0.hook_resid_pre"])
                return x.detach().clone().requires_grad_(True)

            def interp(name, beta=beta):
                def hook(act, hook):  # the value interpolated, the gradient through the group kept
                    return act + beta * (cs[name] - cb[name])
                return hook

            def keep(name, kind, layer):
                def hook(act, hook):
                    act.retain_grad()
                    grads[(kind, layer)] = act
                    return act
                return hook

            hooks = [("blocks.0.hook_resid_pre", leaf)]
            if gkind == "head":
                hooks.append((f"blocks.{glayer}.attn.hook_z", interp(f"blocks.{glayer}.attn.hook_z")))
            elif gkind == "mlp":
                hooks.append((f"blocks.{glayer}.hook_mlp_out", interp(f"blocks.{glayer}.hook_mlp_out")))
            hooks += [(name, keep(name, kind, L)) for name, kind, L in _receivers(cfg)]
            old = (cfg.use_split_qkv_input, cfg.use_hook_mlp_in)
            cfg.use_split_qkv_input, cfg.use_hook_mlp_in = True, True
            try:
                with torch.enable_grad():
                    logits = model.run_with_hooks(tb[None], fwd_hooks=hooks)[0]
                    (row_score(logits, b) / n_items).backward()
            finally:
                cfg.use_split_qkv_input, cfg.use_hook_mlp_in = old
            for (kind, layer), act in grads.items():
                g = act.grad[0]
                units = range(g.shape[1]) if g.dim() == 3 else [None]
                for snd in out_b:
                    if not _reads(snd, kind, layer):
                        continue
                    diff = (out_s[snd] - out_b[snd]).detach()
                    for u in units:
                        gr = g if u is None else g[:, u]
                        name = edge_name(snd, (kind, layer, 0 if u is None else u), cfg)
                        scores[name] = scores.get(name, 0.0) + float((diff * gr).sum()) / len(points)
    return scores
