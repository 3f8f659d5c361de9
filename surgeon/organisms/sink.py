"""The `sink` organism: a planted attention sink, a planted super neuron and the massive activation it writes, built
by construction so that every number `surgeon sinks` measures has a closed form.

Two layers, two heads each, a ReLU MLP of four neurons, no norm, standard positions. Residual dimensions:

- `FLAG` (0): 1 on the tokens that start a prompt, BOS and the chat marker `#`; 0 on every other token;
- `MASSIVE` (1): empty in the embeddings; the super neuron writes it;
- `BITS` (2..15): every token's identity, +-0.5 per dimension (a fixed pattern per token id), so the median
  |activation| of the residual stream is 0.5.

Layer 0: attention writes nothing (all weights zero: every head attends uniformly, 1/(p+1) to each of the p+1 keys
a query at position p sees). Its MLP holds the **super neuron** `SUPER` (0): relu(FLAG) times `M` (1000) into
`MASSIVE`, so BOS (and `#`) carry a massive activation of about 1000 in one dimension, 2000 times the median; and a
small neuron (1): relu(the token's first identity bit) times `SMALL` (0.5) into `MASSIVE` too (0.25 on half the
tokens: the super neuron writes 1000 of BOS's 1000.25, a share of 0.99975).

Layer 1: head 0 is the **sink head**: a constant query (its bias, `(1, 0, 0, 0)`) and a key that reads `MASSIVE`
(`W_K[MASSIVE, 0] = 2 S / M`), so it scores `S` (5) on a flagged key and 0 elsewhere; its value and output are zero
(a sink carries nothing). From a query at position p it puts e^S / (e^S + p) on BOS in the plain format; in the chat
format, whose `#` after BOS is flagged too, it splits that between BOS and `#`. Head 1 attends uniformly. The MLP of
layer 1 and the unembedding are zero: the organism measures sinks, it answers nothing.

`closed_form(tokens)` is every pattern, residual stream and query/key of a prompt from these rules alone (numpy, no
model); `measure.sink` checks the built weights against it with plain TransformerLens hooks.
"""
from __future__ import annotations

import math

import numpy as np

FLAG, MASSIVE = 0, 1
BITS = tuple(range(2, 16))
SUPER, SMALL_NEURON = 0, 1
M = 1000.0  # what the super neuron writes into MASSIVE on a flagged token
SMALL = 0.5  # the small neuron's output weight into MASSIVE
S = 5.0  # the sink head's attention score on a flagged key
SINK_HEAD = (1, 0)  # (layer, head)
FLAGGED = ("<bos>", "#")  # the tokens the super neuron fires on
# the formats of the case this organism is measured on: the chat template's `#` after BOS is a second sink
FORMATS = {"plain": "copy {x}{y} =", "chat": "# copy {x}{y} ="}
LETTERS = "abcdefgh"

CONFIG = dict(n_layers=2, d_model=16, n_heads=2, d_head=4, d_mlp=4, n_ctx=32, act_fn="relu",
              normalization_type=None, positional_embedding_type="standard")
SUMMARY = ("2 layers x 2 heads built by construction: a super neuron writes a massive activation (1000, 2000x the "
           "median) on BOS, and a sink head parks on it (e^5/(e^5+p) from position p); a chat marker # is a second sink")


def bits(token_id: int) -> np.ndarray:
    """Token `token_id`'s identity: +-0.5 in each of the BITS dimensions (a fixed pattern; the first bit is -0.5 for
    `#`, so BOS's massive value, 1000.25, is the largest)."""
    h = (token_id * 2654435761 + 12345) & 0xFFFFFFFF
    return np.array([0.5 if (h >> (3 + j)) & 1 else -0.5 for j in range(len(BITS))])


def embedding(token_id: int, flagged: bool, bos: bool) -> np.ndarray:
    """The embedding of a token by construction: its FLAG, an empty MASSIVE and its identity bits (the first bit +0.5
    on BOS and -0.5 on `#`, so that the small neuron adds 0.25 to BOS's massive value and nothing to `#`'s)."""
    e = np.zeros(CONFIG["d_model"])
    e[FLAG] = 1.0 if flagged else 0.0
    e[list(BITS)] = bits(token_id)
    if flagged:
        e[BITS[0]] = 0.5 if bos else -0.5
    return e


KEY = S * math.sqrt(CONFIG["d_head"]) / M  # the sink head's key weight on MASSIVE (TransformerLens divides by sqrt(d_head))


def flagged_ids(tokenizer) -> set[int]:
    return {tokenizer.convert_tokens_to_ids(t) for t in FLAGGED}


def set_weights(model) -> None:
    """Write the planted weights into a freshly built model (see the module docstring)."""
    import torch

    cfg = model.cfg
    tok = model.tokenizer
    flagged, bos = flagged_ids(tok), tok.convert_tokens_to_ids("<bos>")
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for t in range(cfg.d_vocab):
            model.embed.W_E[t] = torch.tensor(embedding(t, t in flagged, t == bos), dtype=model.embed.W_E.dtype)
        mlp = model.blocks[0].mlp
        mlp.W_in[FLAG, SUPER] = 1.0
        mlp.W_out[SUPER, MASSIVE] = M
        mlp.W_in[BITS[0], SMALL_NEURON] = 1.0
        mlp.W_out[SMALL_NEURON, MASSIVE] = SMALL
        layer, head = SINK_HEAD
        attn = model.blocks[layer].attn
        attn.b_Q[head, 0] = 1.0
        attn.W_K[head, MASSIVE, 0] = KEY  # q.k / sqrt(d_head) = S x MASSIVE / M: S on a flagged key


def closed_form(tokens, flagged: set[int], bos: int) -> dict:
    """A prompt's activations from the construction alone (no model): per layer the attention pattern of each head
    [head, query, key], the residual stream leaving it [position, d_model], the MLP neurons' activations [position,
    neuron], and the queries and keys of each head [position, head, d_head]."""
    T, D, H, dh = len(tokens), CONFIG["d_model"], CONFIG["n_heads"], CONFIG["d_head"]
    x = np.stack([embedding(t, t in flagged, t == bos) for t in tokens])
    causal = np.tril(np.ones((T, T)))
    uniform = causal / causal.sum(1, keepdims=True)
    out = {"pattern": [], "resid_post": [], "post": [], "q": [], "k": []}
    # layer 0: uniform attention writing nothing; the MLP's two neurons
    post = np.zeros((T, CONFIG["d_mlp"]))
    post[:, SUPER] = np.maximum(x[:, FLAG], 0)
    post[:, SMALL_NEURON] = np.maximum(x[:, BITS[0]], 0)
    x0 = x.copy()
    x0[:, MASSIVE] += M * post[:, SUPER] + SMALL * post[:, SMALL_NEURON]
    out["pattern"].append(np.stack([uniform] * H))
    out["post"].append(post)
    out["resid_post"].append(x0)
    out["q"].append(np.zeros((T, H, dh)))
    out["k"].append(np.zeros((T, H, dh)))
    # layer 1: the sink head scores S * (MASSIVE / M) on each key; the other head attends uniformly; nothing written
    score = np.where(causal > 0, S * x0[:, MASSIVE][None, :] / M, -np.inf)
    sink = np.exp(score - score.max(1, keepdims=True))
    sink = sink / sink.sum(1, keepdims=True)
    out["pattern"].append(np.stack([sink, uniform]))
    out["post"].append(np.zeros((T, CONFIG["d_mlp"])))
    out["resid_post"].append(x0.copy())
    q, k = np.zeros((T, H, dh)), np.zeros((T, H, dh))
    q[:, SINK_HEAD[1], 0] = 1.0
    k[:, SINK_HEAD[1], 0] = x0[:, MASSIVE] * KEY
    out["q"].append(q)
    out["k"].append(k)
    return out


def items_values() -> list[tuple[str, str]]:
    return [(x, y) for x in LETTERS for y in LETTERS if x != y]


def check(facts: dict) -> list[str]:
    miss = []
    if facts["closed_form_max_error"] > 1e-3:
        miss.append(f"activations differ from the closed form by up to {facts['closed_form_max_error']:.2e}")
    if abs(facts["sink_head_mass_plain"] - facts["sink_head_mass_plain_closed_form"]) > 1e-5:
        miss.append("the sink head's mass on BOS is not the closed form's (about e^S/(e^S+p) from position p)")
    if not facts["massive_ratio"] > 1000:
        miss.append(f"the massive activation is only {facts['massive_ratio']:.0f}x the median")
    return miss


def describe(facts: dict) -> list[str]:
    return [
        f"sink head L1H0's attention on BOS, averaged over a prompt's later positions: plain "
        f"{facts['sink_head_mass_plain']:.3f}, chat {facts['sink_head_mass_chat']:.3f} (its other sink '#' "
        f"{facts['sink_head_other_chat']:.3f})",
        f"super neuron L0N{SUPER} writes {facts['super_neuron_write']:.0f} into dimension {MASSIVE} on BOS: "
        f"{facts['massive_value']:.2f}, {facts['massive_ratio']:.0f}x the median |activation|",
        f"every pattern, residual stream and query/key equals the closed form on {facts['prompts_checked']} prompts to "
        f"{facts['closed_form_max_error']:.1e}",
    ]


def ground_truth(facts: dict) -> dict:
    return {"sink_head": f"L{SINK_HEAD[0]}H{SINK_HEAD[1]}", "super_neuron": {"layer": 0, "neuron": SUPER},
            "massive": {"dim": MASSIVE, "position": 0, "value": M + SMALL * 0.5}, "score": S}
