"""The paper's case: Llama-3.1-8B-Instruct says 9.11 > 9.8 in Q&A and chat formats, not in a simple one.

From "Even Heads Fix Odd Errors" (arXiv 2508.19414). Its code used one prompt pair and one greedy
generation; here every claim is tested on many pairs with logit-based scores and intervals.
Needs the weights: on a machine with network, `hf download meta-llama/Llama-3.1-8B-Instruct` fills the
local Hugging Face cache, then e.g.
    surgeon diagnose cases/llama31_decimal.py --device cuda --dtype bfloat16
    surgeon patch cases/llama31_decimal.py --layers 10 --device cuda --dtype bfloat16
or run the same case on a local checkpoint directory with --model /path/to/checkpoint.
"""
import random
from decimal import Decimal

from surgeon import Case, Chat, Item

rng = random.Random(0)


def trap_pair():
    """x.y vs x.zw where decimal order and version order disagree (9.8 vs 9.11)."""
    while True:
        whole = rng.randrange(1, 20)
        a = f"{whole}.{rng.randrange(1, 10)}"
        b = f"{whole}.{rng.randrange(10, 100)}"
        if Decimal(a) > Decimal(b):  # the shorter fraction is bigger: a trap
            return (a, b) if rng.random() < 0.5 else (b, a)


def control_pair():
    """Pairs where both orders agree (different integer parts)."""
    x, y = rng.sample(range(1, 20), 2)
    return f"{x}.{rng.randrange(1, 10)}", f"{y}.{rng.randrange(10, 100)}"


def item(a, b, tag):
    hi, lo = (a, b) if Decimal(a) > Decimal(b) else (b, a)
    return Item({"a": a, "b": b}, correct=f" {hi}", incorrect=f" {lo}", tag=tag)


items = (
    [item("9.8", "9.11", "trap")]  # the famous pair, then 63 more like it
    + [item(*trap_pair(), "trap") for _ in range(63)]
    + [item(*control_pair(), "control") for _ in range(32)]
)

case = Case(
    name="llama31_decimal",
    model="meta-llama/Llama-3.1-8B-Instruct",
    formats={
        "simple": "Which is bigger: {a} or {b}?\nAnswer:",
        "qa": "Q: Which is bigger: {a} or {b}?\nA:",
        # the model's own chat template around the question, ending with the assistant header
        "chat": Chat(user="Which is bigger: {a} or {b}?"),
    },
    good="simple",
    bad=["qa", "chat"],
    items=items,
    focus="trap",
    align="last",
    layers=list(range(32)),
    components=["z", "attn_out", "o_slices", "mlp_out"],
    notes={
        "paper": "arXiv 2508.19414",
        "claims": {
            "layer": 10,
            "repairing_heads": "the 16 even heads of layer 10 repair; the 16 odd ones do not",
            "threshold": "any 8 even heads suffice; 7 or fewer fail",
            "blend_threshold": 0.6,
            "sae_overlap": {"layer_7": 0.10, "layer_10": 0.80},
        },
        "caveat": "the paper's 'heads' were 128-wide slices of the attention output after o_proj (component o_slices)",
    },
    description="Llama-3.1-8B-Instruct prefers 9.11 over 9.8 in Q&A and chat formats.",
)
