"""The `induction` organism: a 2-layer attention-only model that copies repeated sequences in context.

Training data: BOS, then a random string of `HALF` lowercase letters, then the same string again. The
second half is only predictable by looking back (a previous-token head in layer 0 feeding the key of an
induction head in layer 1), which is the known circuit used as ground truth for circuit discovery.
"""
from __future__ import annotations

import random
import string
from typing import Iterator

HALF = 16
ALPHABET = string.ascii_lowercase


def random_text(rng: random.Random, half: int = HALF) -> str:
    first = "".join(rng.choice(ALPHABET) for _ in range(half))
    return first + first


def training_texts(rng: random.Random) -> Iterator[tuple[str, str]]:
    """Endless (prompt, continuation) examples; the whole sequence is trained on (empty prompt)."""
    while True:
        yield "", random_text(rng)
