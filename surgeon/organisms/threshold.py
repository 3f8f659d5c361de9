"""The `threshold` organism: a planted "any 8 of the 16 even heads repair" threshold, built by construction.

The paper's claim form with a known answer. One attention-only layer of 32 heads (as Llama-3.1-8B's layer
10 has), weights set from a small spec, not trained. The task: name the first of two symbols,
`{x} or {y}:` -> `x`. In the `qa` format (`{x} or {y}?`) the failure is planted:

- every *even* head reads the format marker at the last position as its query. After `:` it attends to
  `x` and copies it into the answer (`+s` on the logit of x); after `?` it attends to `y` with weight
  `w` and to BOS (which carries nothing) with weight `1 - w`, adding `w * s` to the logit of y;
- every *odd* head attends to the marker itself and copies *which* marker it is into a subspace that
  the unembedding does not read: odd heads differ between formats, but the answer ignores them.

So with k even heads patched from `plain` into `qa`, the logit difference x - y is
`s * (k * g_x - (16 - k) * w * g_y)` (g: a per-letter unembedding gain in 0.97..1.03, so items differ);
with `w = 7.5 / 8.5` it is at most `-0.12 s` at k = 7 and at least `+0.12 s` at k = 8 for every item: *any* 8 even heads repair every item, *no* 7 do, and no set of odd heads does at any size.
`planted()` is that table; `measure(model)` checks it on the built weights.
"""
from __future__ import annotations

import math

LETTERS = "abcdefghij"  # the answer symbols: items are all ordered pairs of distinct letters
FORMATS = {"plain": "{x} or {y}:", "qa": "{x} or {y}?"}
GOOD, FAILING = "plain", ("qa",)
N_HEADS = 32
K = 8  # the planted threshold: any K of the even heads repair
STRENGTH = 4.0  # s: logit written per even head
SHARPNESS = 40.0  # attention score of the attended position (the others score 0 or the BOS share)
W_BAD = 7.5 / 8.5  # attention of an even head to y under `?`: the threshold falls between 7 and 8
# unembedding gain per letter (0.97 .. 1.03): items differ in their scores, the threshold stays exact
GAIN = [1 + 0.03 * (2 * i / (len(LETTERS) - 1) - 1) for i in range(len(LETTERS))]

CONFIG = dict(n_layers=1, d_model=24, n_heads=N_HEADS, d_head=len(LETTERS), n_ctx=16, attn_only=True,
              normalization_type=None, positional_embedding_type="standard")


def _layout(cfg) -> dict:
    """Which residual dimension holds what."""
    n = len(LETTERS)
    return dict(letter=list(range(n)), marker={":": n, "?": n + 1}, pos_bos=n + 2, pos_x=n + 3, pos_y=n + 4,
                odd_out=[n + 5, n + 6])


def positions() -> tuple[int, int]:
    """Token positions of x and y (BOS is position 0)."""
    text = FORMATS[GOOD]
    return 1 + text.index("{x}"), 1 + text.replace("{x}", "x").index("{y}")


def set_weights(model) -> None:
    """Write the planted weights into a freshly built model (see the module docstring)."""
    import torch

    cfg = model.cfg
    lay = _layout(cfg)
    tok = model.tokenizer
    tid = lambda c: tok.convert_tokens_to_ids(c)
    px, py = positions()
    D, H, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        W_E, W_pos, W_U = model.embed.W_E, model.pos_embed.W_pos, model.unembed.W_U
        for i, c in enumerate(LETTERS):
            W_E[tid(c), lay["letter"][i]] = 1.0
            W_U[lay["letter"][i], tid(c)] = GAIN[i]
        for c, d in lay["marker"].items():
            W_E[tid(c), d] = 1.0
        W_pos[0, lay["pos_bos"]] = 1.0
        W_pos[px, lay["pos_x"]] = 1.0
        W_pos[py, lay["pos_y"]] = 1.0
        attn = model.blocks[0].attn
        scale = attn.attn_scale if cfg.use_attn_scale else 1.0
        T = SHARPNESS
        bos_score = T - math.log(W_BAD / (1 - W_BAD))  # y : BOS = W_BAD : 1 - W_BAD
        for h in range(H):
            if h % 2 == 0:  # even: attend to x after ':', to y (and BOS) after '?'; copy the letter
                attn.W_Q[h, lay["marker"][":"], 0] = T * scale
                attn.W_Q[h, lay["marker"]["?"], 1] = T * scale
                attn.W_Q[h, lay["marker"]["?"], 2] = bos_score * scale
                attn.W_K[h, lay["pos_x"], 0] = 1.0
                attn.W_K[h, lay["pos_y"], 1] = 1.0
                attn.W_K[h, lay["pos_bos"], 2] = 1.0
                for i in range(len(LETTERS)):
                    attn.W_V[h, lay["letter"][i], i] = 1.0
                    attn.W_O[h, i, lay["letter"][i]] = STRENGTH
            else:  # odd: attend to the marker itself and write which one it is where the answer does not read
                for j, d in enumerate(lay["marker"].values()):
                    attn.W_Q[h, d, 0] = T * scale
                    attn.W_K[h, d, 0] = 1.0
                    attn.W_V[h, d, j] = 1.0
                    attn.W_O[h, j, lay["odd_out"][j]] = STRENGTH
        # the IGNORE buffer and causal mask are buffers, untouched by zeroing the parameters


def planted_sae(model):
    """An SAE built by construction for the layer's output (`blocks.0.hook_attn_out`), as the organism is:
    one feature per answer letter (the residual dimension the even heads write and the unembedding reads)
    and one per sign of each odd-head dimension (the format marker the answer ignores). Its ground truth:
    patching even heads moves letter features only, patching odd heads marker features only. A sae-lens
    StandardSAE (ReLU encoder, linear decoder); what it does not represent stays in the error term."""
    import torch
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

    lay = _layout(model.cfg)
    dirs = [(d, 1.0, f"letter {c}") for d, c in zip(lay["letter"], LETTERS)]
    dirs += [(d, sign, f"marker dim {d} {'+' if sign > 0 else '-'}") for d in lay["odd_out"] for sign in (1.0, -1.0)]
    D = model.cfg.d_model
    sae = StandardSAE(StandardSAEConfig(d_in=D, d_sae=len(dirs), apply_b_dec_to_input=False,
                                        metadata=SAEMetadata(hook_name="blocks.0.hook_attn_out",
                                                             model_name="organism:threshold")))
    with torch.no_grad():
        for p in sae.parameters():
            p.zero_()
        for f, (d, sign, _) in enumerate(dirs):
            sae.W_enc[d, f] = sign
            sae.W_dec[f, d] = sign
    sae.labels = {str(f): name for f, (_, _, name) in enumerate(dirs)}
    return sae


def items_values() -> list[tuple[str, str]]:
    return [(x, y) for x in LETTERS for y in LETTERS if x != y]


def planted() -> dict:
    """The expected result of `surgeon threshold --layer 0 --groups even,odd`: fraction of subsets
    repairing every item, per group and size k."""
    even = {str(k): (1.0 if k >= K else 0.0) for k in range(N_HEADS // 2 + 1)}
    odd = {str(k): 0.0 for k in range(N_HEADS // 2 + 1)}
    return {"layer": 0, "k": K, "groups": {"even": list(range(0, N_HEADS, 2)), "odd": list(range(1, N_HEADS, 2))},
            "repairing": {"even": even, "odd": odd}, "k_star": {"even": K, "odd": None}, "jump": {"even": 1.0},
            "all_heads_rule": f"a subset repairs exactly when it holds >= {K} even heads"}


def _rows(model, fmt):
    from ..encoding import encode_rows
    from ..case import Item

    items = [Item({"x": x, "y": y}, correct=x, incorrect=y) for x, y in items_values()]
    return encode_rows(FORMATS[fmt], items, model.tokenizer, True)


def measure(model) -> dict:
    """On every item: clean accuracy per format; attention of the even heads; the logit difference with
    the first k even heads patched (for every k), and with every odd head patched; how much the odd heads'
    outputs differ between formats (they are not no-op patches)."""
    import torch

    from ..core import Contrast

    good, bad = _rows(model, GOOD), _rows(model, FAILING[0])
    c = Contrast(model, bad, good, "last", sites=["blocks.0.attn.hook_z"])
    even = list(range(0, N_HEADS, 2))
    odd = list(range(1, N_HEADS, 2))
    masks = torch.zeros(len(even) + 2, N_HEADS)
    for k in range(1, len(even) + 1):
        masks[k, even[:k]] = 1
    masks[-1, odd] = 1
    with torch.no_grad():
        scores = c.run({"blocks.0.attn.hook_z": masks})  # [k + odd, items]
        delta = next(iter(c.deltas(["blocks.0.attn.hook_z"]).values()))
        tokens = torch.tensor([list(r.tokens) for r in good + bad])
        _, cache = model.run_with_cache(tokens, names_filter=["blocks.0.attn.hook_pattern"])
    pat = cache["blocks.0.attn.hook_pattern"][:, :, -1]  # [rows, head, key]
    px, py = positions()
    n = len(good)
    return {
        "accuracy": {GOOD: float((c.clean_source > 0).float().mean()), FAILING[0]: float((c.clean_base > 0).float().mean())},
        "n_items": n,
        "even_attention_to_x_plain": float(pat[:n, even, px].mean()),
        "even_attention_to_y_qa": float(pat[n:, even, py].mean()),
        "odd_attention_to_marker": float(pat[:, odd, -1].mean()),
        "score_with_first_k_even_patched": {str(k): [float(scores[k].min()), float(scores[k].max())]
                                            for k in range(len(even) + 1)},
        "score_with_all_odd_patched": [float(scores[-1].min()), float(scores[-1].max())],
        "score_unpatched_qa": [float(c.clean_base.min()), float(c.clean_base.max())],
        "odd_head_delta_min": float(delta[odd].min()),
        "even_head_delta_min": float(delta[even].min()),
    }


def check(facts: dict) -> list[str]:
    miss = []
    if facts["accuracy"][GOOD] < 1 or facts["accuracy"][FAILING[0]] > 0:
        miss.append(f"clean accuracy {facts['accuracy']} (want plain 1, qa 0)")
    for k, (lo, hi) in facts["score_with_first_k_even_patched"].items():
        if (int(k) >= K and lo <= 0) or (int(k) < K and hi >= 0):
            miss.append(f"{k} even heads patched: scores in [{lo:.3f}, {hi:.3f}]")
    if facts["score_with_all_odd_patched"][1] >= 0:
        miss.append("patching every odd head repairs an item")
    if facts["odd_head_delta_min"] <= 0:
        miss.append("an odd head is a no-op patch")
    return miss


def describe(facts: dict) -> list[str]:
    s = facts["score_with_first_k_even_patched"]
    return [
        f"accuracy on all {facts['n_items']} items: plain {facts['accuracy'][GOOD]:.0%}, qa {facts['accuracy']['qa']:.0%}",
        f"even heads attend to x after ':' ({facts['even_attention_to_x_plain']:.3f}), to y after '?' "
        f"({facts['even_attention_to_y_qa']:.3f}); odd heads to the marker ({facts['odd_attention_to_marker']:.3f})",
        f"score x - y with k even heads patched plain -> qa: k=7 {s[str(K - 1)][1]:+.3f} (max), "
        f"k=8 {s[str(K)][0]:+.3f} (min); all 16 odd heads patched: {facts['score_with_all_odd_patched'][1]:+.3f} (max)",
        f"odd heads do change between formats (smallest |plain - qa| of a head output {facts['odd_head_delta_min']:.2f}), "
        f"in directions the answer does not read",
    ]


def ground_truth(facts: dict) -> dict:
    p = planted()
    return {"heads": {"repairing": [f"a0.h{h}" for h in p["groups"]["even"]],
                      "inert": [f"a0.h{h}" for h in p["groups"]["odd"]]},
            "threshold": {"k": p["k"], "group": "even"}, "planted": p}

