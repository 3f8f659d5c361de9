"""The `induction` organism: a 2-layer attention-only model that continues a sequence it has seen before.

Training data (only match-and-copy wins): BOS, a random prefix of 0-8 symbols (a random offset), a
string A of P distinct symbols with P drawn from `PERIODS`, a gap of 0-8 random filler symbols, then A
again; every symbol of a sequence is distinct except for the repetition. The loss is taken on the
second copy only. Positions and periods vary, so copying from a fixed offset does not work: the model
has to find the earlier occurrence of the current token and copy the token after it - a previous-token
head in layer 0 writing "my previous token" into each position, read through the *key* of an
induction head in layer 1 (K-composition).

`measure(model)` checks that claim on held-out sequences and names the heads; `surgeon organisms train
induction` records the result in the organism's config.json, and `ground_truth()` reads it from there.
"""
from __future__ import annotations

import random
import string
from typing import Iterator

ALPHABET = string.ascii_letters  # 52 symbols: distinct within a sequence of up to 1 + 8 + 16 + 8 + 16
PERIODS = range(4, 17)  # lengths of the repeated string (the trained range)
GAPS = range(0, 9)  # filler symbols between the two copies
PREFIXES = range(0, 9)  # random symbols before the first copy

# What the organism must show on held-out sequences (issue: ground truth you can trust).
TARGETS = {"prev_token_attention_min": 0.9, "induction_attention_min": 0.8, "repeat_loss_max": 0.1}


def sample(rng: random.Random, period: int | None = None, gap: int | None = None, prefix: int | None = None):
    """(prefix, A, gap) strings, all symbols distinct."""
    period = rng.choice(PERIODS) if period is None else period
    gap = rng.choice(GAPS) if gap is None else gap
    prefix = rng.choice(PREFIXES) if prefix is None else prefix
    symbols = rng.sample(ALPHABET, prefix + period + gap)
    return "".join(symbols[:prefix]), "".join(symbols[prefix:prefix + period]), "".join(symbols[prefix + period:])


def training_texts(rng: random.Random) -> Iterator[tuple[str, str]]:
    """Endless (prompt, continuation) examples: the loss is on the continuation, the second copy."""
    while True:
        pre, a, gap = sample(rng)
        yield pre + a + gap, a


def check(facts: dict) -> list[str]:
    """The targets the measured facts miss (empty: all met)."""
    t, miss = TARGETS, []
    if facts["previous_token_attention"] < t["prev_token_attention_min"]:
        miss.append(f"previous-token attention {facts['previous_token_attention']:.3f} < {t['prev_token_attention_min']}")
    if facts["induction_attention"] < t["induction_attention_min"]:
        miss.append(f"induction attention {facts['induction_attention']:.3f} < {t['induction_attention_min']}")
    if facts["repeat_loss_max"] > t["repeat_loss_max"]:
        miss.append(f"loss on the repeat {facts['repeat_loss_max']:.3f} > {t['repeat_loss_max']} (worst period or gap)")
    return miss


def describe(facts: dict) -> list[str]:
    """The measured facts, as lines for `surgeon organisms list/describe`."""
    L0, ph = facts["previous_token_head"]
    L1, ih = facts["induction_head"]
    return [
        f"previous-token head a{L0}.h{ph}: mean attention to p-1 {facts['previous_token_attention']:.3f}",
        f"induction head a{L1}.h{ih}: mean attention to the token after the first occurrence "
        f"{facts['induction_attention']:.3f}",
        f"loss on the repeat <= {facts['repeat_loss_max']:.4f} nats at every period {PERIODS.start}-{PERIODS.stop - 1} "
        f"and gap {GAPS.start}-{GAPS.stop - 1}; {facts['repeat_loss_with_previous_token_head_zeroed']:.2f} nats with "
        f"a{L0}.h{ph} zeroed",
    ]


def ground_truth(facts: dict) -> dict:
    """The planted circuit, from the measured heads: input -> previous-token head -> K of the induction head -> logits."""
    L0, ph = facts["previous_token_head"]
    L1, ih = facts["induction_head"]
    prev, ind = f"a{L0}.h{ph}", f"a{L1}.h{ih}"
    return {"heads": {"previous_token": prev, "induction": ind},
            "path": ["input", prev, f"{ind}<k>", "logits"],
            "edges": [f"input->{prev}<v>", f"{prev}->{ind}<k>", f"{ind}->logits"]}
