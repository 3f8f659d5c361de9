"""The `chain` organism: a planted chain of SAE features across two layers, built by construction.

The ground truth for feature circuits and their edges. Two layers, weights set from a small spec, not trained,
with an SAE per MLP output whose features are, by construction, the planted directions. The task: name the first
of two letters, `{x} or {y}:` -> `x`; in the `qa` format (`{x} or {y}?`) the failure is planted:

- layer 0's attention copies x (head 0) and y (head 1) to the last position; its MLP writes the **answer
  feature** A_k (residual direction a_k) for k = x after `:` and for k = y after `?` (units relu(x_k + [:] - 1)
  and relu(y_k + [?] - 1)), and a **marker feature** C_: or C_? naming the marker;
- layer 1's MLP (its attention is empty) turns each A_k into the **logit feature** B_k = 1 + G1_k A_k (a unit
  that is always on) and each marker feature into a **distractor** D = 1 + C, which nothing reads;
- the unembedding reads B_k into the logit of letter k with gain G2_k.

So an item's score (log P(x) - log P(y): the logit difference) is G2_x (1 + G1_x A_x) - G2_y (1 + G1_y A_y):
G2_x (1 + G1_x) - G2_y in `plain`, G2_x - G2_y (1 + G1_y) in `qa`. The SAEs (`planted_saes`) have one feature per
direction: A_k and C at blocks.0.hook_mlp_out, B_k and D at blocks.1.hook_mlp_out; they reconstruct the MLP outputs
exactly, so the error terms are 0.

The planted edges are A_k -> B_k, each with Jacobian G1_k; from the construction alone (`planted_edges`), patching
plain into qa, the edge's effect (Marks et al.'s left vector . Jacobian . delta, mean over items) is
G1_k G2_k x (the share of items with k as x or y), and every other edge between the two SAEs' nodes is 0: A_j -> B_k
(j != k) has no Jacobian, C -> D has one (1) but the answer ignores D, so an edge score that does not weigh by the
metric's gradient would find it. The planted feature circuit (every A_k and B_k) is faithful 1 (`planted_faithfulness`):
what it leaves out (markers, distractors, error terms) moves nothing the answer reads.
"""
from __future__ import annotations

from surgeon.errors import optional_import

LETTERS = "abcdef"
FORMATS = {"plain": "{x} or {y}:", "qa": "{x} or {y}?"}
GOOD, FAILING = "plain", ("qa",)
G1 = [1.5 + 0.25 * i for i in range(len(LETTERS))]  # the A_k -> B_k gain (the planted edge's Jacobian)
G2 = [0.95 + 0.02 * i for i in range(len(LETTERS))]  # the unembedding gain of B_k
SHARPNESS = 40.0
HOOKS = ("blocks.0.hook_mlp_out", "blocks.1.hook_mlp_out")
SUMMARY = ("2 layers built by construction: a planted chain of SAE features, answer feature A_k (layer 0 MLP) -> "
           "logit feature B_k (layer 1 MLP) -> the answer; marker features feed distractors nothing reads")

_N = len(LETTERS)
# the residual stream: letter tokens, markers, positions, the two copied letters, then the features' directions
_DIMS = dict(letter=0, marker=_N, pos=_N + 2, x=_N + 5, y=2 * _N + 5, A=3 * _N + 5, C=4 * _N + 5, B=4 * _N + 7,
             D=5 * _N + 7)
D_MODEL = 5 * _N + 9
CONFIG = dict(n_layers=2, d_model=D_MODEL, n_heads=2, d_head=_N, d_mlp=2 * _N + 2, n_ctx=16, act_fn="relu",
              normalization_type=None, positional_embedding_type="standard")


def positions() -> tuple[int, int]:
    """Token positions of x and y (BOS is position 0)."""
    text = FORMATS[GOOD]
    return 1 + text.index("{x}"), 1 + text.replace("{x}", "x").index("{y}")


def set_weights(model) -> None:
    """Write the planted weights into a freshly built model (see the module docstring)."""
    import torch

    cfg = model.cfg
    tid = model.tokenizer.convert_tokens_to_ids
    L, M, P, X, Y, A, C, B, D = (_DIMS[k] for k in ("letter", "marker", "pos", "x", "y", "A", "C", "B", "D"))
    px, py = positions()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for i, c in enumerate(LETTERS):
            model.embed.W_E[tid(c), L + i] = 1.0
            model.unembed.W_U[B + i, tid(c)] = G2[i]
        model.embed.W_E[tid(":"), M] = 1.0
        model.embed.W_E[tid("?"), M + 1] = 1.0
        model.pos_embed.W_pos[0, P] = 1.0
        model.pos_embed.W_pos[px, P + 1] = 1.0
        model.pos_embed.W_pos[py, P + 2] = 1.0
        attn = model.blocks[0].attn
        scale = attn.attn_scale if cfg.use_attn_scale else 1.0
        for h, (key, dest) in enumerate(((P + 1, X), (P + 2, Y))):  # head 0 copies x, head 1 copies y
            attn.W_Q[h, M, 0] = attn.W_Q[h, M + 1, 0] = SHARPNESS * scale  # from either marker
            attn.W_K[h, key, 0] = 1.0
            for i in range(_N):
                attn.W_V[h, L + i, i] = 1.0
                attn.W_O[h, i, dest + i] = 1.0
        mlp0, mlp1 = model.blocks[0].mlp, model.blocks[1].mlp
        for i in range(_N):
            for unit, (copy, marker) in ((i, (X, M)), (_N + i, (Y, M + 1))):  # A_k after ':' for x, after '?' for y
                mlp0.W_in[copy + i, unit] = 1.0
                mlp0.W_in[marker, unit] = 1.0
                mlp0.b_in[unit] = -1.0
                mlp0.W_out[unit, A + i] = 1.0
            mlp1.W_in[A + i, i] = G1[i]  # B_k = 1 + G1_k A_k (always on)
            mlp1.b_in[i] = 1.0
            mlp1.W_out[i, B + i] = 1.0
        for j in range(2):
            mlp0.W_in[M + j, 2 * _N + j] = 1.0  # C: which marker
            mlp0.W_out[2 * _N + j, C + j] = 1.0
            mlp1.W_in[C + j, _N + j] = 1.0  # D = 1 + C, read by nothing
            mlp1.b_in[_N + j] = 1.0
            mlp1.W_out[_N + j, D + j] = 1.0


def feature_names(layer: int) -> list[str]:
    """The planted SAE's features at HOOKS[layer], in order."""
    if layer == 0:
        return [f"A_{c}" for c in LETTERS] + ["C_:", "C_?"]
    return [f"B_{c}" for c in LETTERS] + ["D_:", "D_?"]


def planted_saes(model) -> dict:
    """{layer: SAE} built by construction (sae-lens StandardSAE: ReLU encoder, linear decoder), one feature per
    planted direction of that layer's MLP output (`feature_names`); `.labels` names them."""
    import torch

    optional_import("sae_lens", "the organism's planted SAEs")
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

    out = {}
    for layer, (first, second) in enumerate((("A", "C"), ("B", "D"))):
        dims = [_DIMS[first] + i for i in range(_N)] + [_DIMS[second] + j for j in range(2)]
        sae = StandardSAE(StandardSAEConfig(d_in=model.cfg.d_model, d_sae=len(dims), apply_b_dec_to_input=False,
                                            metadata=SAEMetadata(hook_name=HOOKS[layer], model_name="organism:chain")))
        with torch.no_grad():
            for p in sae.parameters():
                p.zero_()
            for f, d in enumerate(dims):
                sae.W_enc[d, f] = 1.0
                sae.W_dec[f, d] = 1.0
        sae.labels = {str(f): name for f, name in enumerate(feature_names(layer))}
        out[layer] = sae
    return out


def items_values() -> list[tuple[str, str]]:
    return [(x, y) for x in LETTERS for y in LETTERS if x != y]


def scores(fmt: str) -> list[float]:
    """The closed form: each item's score (in `items_values()` order) in format `fmt`."""
    out = []
    for x, y in items_values():
        i, j = LETTERS.index(x), LETTERS.index(y)
        a_x, a_y = (1.0, 0.0) if fmt == GOOD else (0.0, 1.0)
        out.append(G2[i] * (1 + G1[i] * a_x) - G2[j] * (1 + G1[j] * a_y))
    return out


def gap() -> float:
    """Mean score in plain minus mean score in qa."""
    good, bad = scores(GOOD), scores(FAILING[0])
    return (sum(good) - sum(bad)) / len(good)


def planted_edges() -> dict[tuple[str, str], float]:
    """{(upstream feature, downstream feature): effect as a fraction of the gap} patching plain into qa, from the
    construction alone: A_k -> B_k carries G1_k G2_k on items with k as x (A_k moves +1, the answer reads +B_k) and
    on items with k as y (A_k moves -1, the answer reads -B_k); every other pair of the SAEs' nodes carries 0."""
    items = items_values()
    return {(f"A_{c}", f"B_{c}"): G1[i] * G2[i] * sum((x == c) + (y == c) for x, y in items) / len(items) / gap()
            for i, c in enumerate(LETTERS)}


def planted_faithfulness() -> float:
    """Of the planted feature circuit (every A_k and B_k): keeping them and giving every other node (markers,
    distractors, error terms) the other run's value leaves every score as it is: 1."""
    return 1.0


def check(facts: dict) -> list[str]:
    miss = []
    if facts["accuracy"][GOOD] < 1 or facts["accuracy"][FAILING[0]] > 0:
        miss.append(f"clean accuracy {facts['accuracy']} (want plain 1, qa 0)")
    if facts["closed_form_max_error"] > 1e-4:
        miss.append(f"scores differ from the closed form by up to {facts['closed_form_max_error']:.2e}")
    if facts["sae_error_max"] > 1e-5:
        miss.append(f"the planted SAEs leave up to {facts['sae_error_max']:.2e} in their error terms")
    if facts["jacobian_max_error"] > 1e-4:
        miss.append(f"the measured A -> B Jacobian differs from the planted one by up to {facts['jacobian_max_error']:.2e}")
    return miss


def describe(facts: dict) -> list[str]:
    return [
        f"accuracy on all {facts['n_items']} items: plain {facts['accuracy'][GOOD]:.0%}, qa {facts['accuracy']['qa']:.0%}",
        f"measured scores equal the closed form to {facts['closed_form_max_error']:.1e}; the planted SAEs' error terms "
        f"are at most {facts['sae_error_max']:.1e}",
        f"d B_k / d A_j measured with hooks: G1_k on the diagonal, 0 off it (to {facts['jacobian_max_error']:.1e}); "
        f"C -> D {facts['c_to_d']:.2f}, but the answer ignores D",
        "planted edges A_k -> B_k (fraction of the gap): "
        + ", ".join(f"{c} {v:.3f}" for c, v in zip(LETTERS, facts["planted_edges"])),
    ]


def ground_truth(facts: dict) -> dict:
    return {"hooks": list(HOOKS), "features": {h: feature_names(i) for i, h in enumerate(HOOKS)},
            "edges": {f"{u}->{d}": v for (u, d), v in planted_edges().items()},
            "circuit": feature_names(0)[:_N] + feature_names(1)[:_N], "faithfulness": planted_faithfulness(),
            "gap": gap()}
