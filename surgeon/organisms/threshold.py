"""The `threshold` organism: a planted weighted repair threshold over the even heads, built by construction.

The paper's claim form with a known answer. One attention-only layer of 32 heads (as Llama-3.1-8B's layer
10 has), weights set from a small spec, not trained. The task: name the first of two symbols,
`{x} or {y}:` -> `x`. In the `qa` format (`{x} or {y}?`) the failure is planted:

- every *even* head h reads the format marker at the last position as its query. After `:` it attends to
  `x` and copies it into the answer (`+u v_h` on the logit of x); after `?` it attends to `y` with weight
  `w` and to BOS (which carries nothing) with weight `1 - w`, adding `w u v_h` to the logit of y. Each even
  head has its own weight v_h: the 16 even heads carry the weights 1..16, in the scrambled order `WEIGHTS`;
- every *odd* head attends to the marker itself and copies *which* marker it is into a subspace that
  the unembedding does not read: odd heads differ between formats, but the answer ignores them.

So with a set S of heads patched from `plain` into `qa`, the score of item (x, y) (log P(x) - log P(y), the
logit difference: the softmax's normaliser cancels) is, in closed form,

    score(S, x, y) = u * (g_x * sum_{h in S even} v_h - w * g_y * sum_{h even, not in S} v_h)

(g: a per-letter unembedding gain in 0.97..1.03, so items differ). `w` puts the worst item's threshold at
68.5 of the 136 total weight, so a subset repairs *every* item exactly when its even heads' weights sum to
at least 69: *which* heads matter, not only how many, and no set of odd heads repairs anything.
`subset_scores` is that formula, `planted()` the table of the threshold search it implies; neither runs the
model. `measure(model)` checks the built weights against the formula with plain TransformerLens hooks.
"""
from __future__ import annotations

import copy
import functools
import math
from itertools import combinations

from surgeon.errors import optional_import

LETTERS = "abcdefghij"  # the answer symbols: items are all ordered pairs of distinct letters
FORMATS = {"plain": "{x} or {y}:", "qa": "{x} or {y}?"}
GOOD, FAILING = "plain", ("qa",)
N_HEADS = 32
EVEN = tuple(range(0, N_HEADS, 2))
ODD = tuple(range(1, N_HEADS, 2))
WEIGHTS = {h: (5 * i + 3) % 16 + 1 for i, h in enumerate(EVEN)}  # even head -> its weight, 1..16 scrambled
TOTAL = sum(WEIGHTS.values())  # 136
NEED = 69  # a subset repairs every item iff its even heads' weights sum to >= NEED
UNIT = 0.5  # u: logit written per unit of weight
SHARPNESS = 40.0  # attention score of the attended position (the others score 0 or the BOS share)
# unembedding gain per letter (0.97 .. 1.03): items differ in their scores, the rule stays exact
GAIN = [1 + 0.03 * (2 * i / (len(LETTERS) - 1) - 1) for i in range(len(LETTERS))]
# the sizes the rule implies: the heaviest k even heads first repair at K_MIN; every K_ALL even heads repair
K_MIN = next(k for k in range(1, len(WEIGHTS) + 1) if sum(sorted(WEIGHTS.values())[-k:]) >= NEED)  # 5
K_ALL = next(k for k in range(1, len(WEIGHTS) + 1) if sum(sorted(WEIGHTS.values())[:k]) >= NEED)  # 12
SUMMARY = (f"1 layer x 32 heads built by construction: each even head carries its own weight; a set of heads "
           f"repairs iff its even weights sum to >= {NEED} of {TOTAL} (k={K_MIN} at the least, any {K_ALL} always)")
# attention of an even head to y under `?`: the worst item (g_x 0.97, g_y 1.03) switches at weight NEED - 0.5
W_BAD = (NEED - 0.5) * min(GAIN) / (max(GAIN) * (TOTAL - (NEED - 0.5)))

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
                    attn.W_O[h, i, lay["letter"][i]] = UNIT * WEIGHTS[h]
            else:  # odd: attend to the marker itself and write which one it is where the answer does not read
                for j, d in enumerate(lay["marker"].values()):
                    attn.W_Q[h, d, 0] = T * scale
                    attn.W_K[h, d, 0] = 1.0
                    attn.W_V[h, d, j] = 1.0
                    attn.W_O[h, j, lay["odd_out"][j]] = 4.0
        # the IGNORE buffer and causal mask are buffers, untouched by zeroing the parameters


def planted_sae(model):
    """An SAE built by construction for the layer's output (`blocks.0.hook_attn_out`), as the organism is:
    one feature per answer letter (the residual dimension the even heads write and the unembedding reads)
    and one per sign of each odd-head dimension (the format marker the answer ignores). Its ground truth:
    patching even heads moves letter features only, patching odd heads marker features only. A sae-lens
    StandardSAE (ReLU encoder, linear decoder); what it does not represent stays in the error term."""
    import torch

    optional_import("sae_lens", "the organism's planted SAE")
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


def subset_scores(heads) -> list[float]:
    """The closed form: each item's score (in `items_values()` order) with `heads` patched plain -> qa."""
    inside = sum(WEIGHTS.get(h, 0) for h in set(heads))
    outside = TOTAL - inside
    g = dict(zip(LETTERS, GAIN))
    return [UNIT * (g[x] * inside - W_BAD * g[y] * outside) for x, y in items_values()]


def item_rate(heads) -> float:
    """Fraction of items the closed form says a patch of `heads` repairs (score > 0)."""
    s = subset_scores(heads)
    return sum(v > 0 for v in s) / len(s)


def planted(item_rate_needed: float = 1.0) -> dict:
    """The expected result of `surgeon threshold --layer 0 --groups even,odd` (a subset repairs when it fixes at
    least `item_rate_needed` of the items), from the closed form alone: per group and size k the fraction of
    the C(16, k) subsets that repair, and the smallest k where at least half of them do. Computed once per
    process (2 x 65,536 subsets take seconds; the case file and the ground truth both ask): a fresh copy each call."""
    return copy.deepcopy(_planted(item_rate_needed))


@functools.lru_cache(maxsize=None)
def _planted(item_rate_needed: float) -> dict:
    table, k_star = {}, {}
    for name, group in (("even", EVEN), ("odd", ODD)):
        table[name] = {}
        for k in range(len(group) + 1):
            subsets = list(combinations(group, k))
            table[name][str(k)] = sum(item_rate(s) >= item_rate_needed for s in subsets) / len(subsets)
        k_star[name] = next((int(k) for k, v in table[name].items() if v >= 0.5), None)
    return {"layer": 0, "groups": {"even": list(EVEN), "odd": list(ODD)}, "weights": {str(h): v for h, v in WEIGHTS.items()},
            "need": NEED, "total": TOTAL, "repairing": table, "k_star": k_star,
            "rule": f"a subset repairs every item exactly when its even heads' weights sum to >= {NEED} of {TOTAL}"}


def check(facts: dict) -> list[str]:
    miss = []
    if facts["accuracy"][GOOD] < 1 or facts["accuracy"][FAILING[0]] > 0:
        miss.append(f"clean accuracy {facts['accuracy']} (want plain 1, qa 0)")
    if facts["closed_form_max_error"] > 1e-3 or facts["closed_form_sign_flips"]:
        miss.append(f"scores differ from the closed form by up to {facts['closed_form_max_error']:.2e} "
                    f"({facts['closed_form_sign_flips']} sign flips)")
    if facts["odd_head_delta_min"] <= 0:
        miss.append("an odd head is a no-op patch")
    return miss


def describe(facts: dict) -> list[str]:
    return [
        f"accuracy on all {facts['n_items']} items: plain {facts['accuracy'][GOOD]:.0%}, qa {facts['accuracy']['qa']:.0%}",
        f"even heads attend to x after ':' ({facts['even_attention_to_x_plain']:.3f}), to y after '?' "
        f"({facts['even_attention_to_y_qa']:.3f}); odd heads to the marker ({facts['odd_attention_to_marker']:.3f})",
        f"even head weights (head: weight) {', '.join(f'{h}:{v}' for h, v in WEIGHTS.items())}; a subset repairs every "
        f"item iff its even weights sum to >= {NEED} of {TOTAL}",
        f"measured scores equal the closed form on {facts['patches_checked']} patches to "
        f"{facts['closed_form_max_error']:.1e} ({facts['closed_form_sign_flips']} sign flips)",
        f"odd heads do change between formats (smallest |plain - qa| of a head output {facts['odd_head_delta_min']:.2f}), "
        f"in directions the answer does not read",
    ]


def ground_truth(facts: dict) -> dict:
    p = planted()
    return {"heads": {"repairing": [f"a0.h{h}" for h in p["groups"]["even"]],
                      "inert": [f"a0.h{h}" for h in p["groups"]["odd"]]},
            "weights": {f"a0.h{h}": v for h, v in WEIGHTS.items()}, "need": NEED, "planted": p}
