"""In-context copying in the induction organism: a random string seen before is continued from context.

Good format: a random string, then its first k letters again; the next letter is predictable only by
induction. Bad format: a different random string, then the same k letters; nothing to copy from.
The formats have equal length, so positions align by index. Ground truth: a previous-token head in
layer 0 feeds the key of an induction head in layer 1.
"""
import random

from surgeon import Case, Item

rng = random.Random(0)
LETTERS = "abcdefghijklmnopqrstuvwxyz"
HALF = 16  # the organism was trained on strings of 16 letters repeated once


def word(n):
    return "".join(rng.choice(LETTERS) for _ in range(n))


items = []
for _ in range(64):
    first, other = word(HALF), word(HALF)
    k = rng.randrange(3, 12)
    wrong = rng.choice([c for c in LETTERS if c != first[k]])
    items.append(Item({"first": first, "other": other, "cue": first[:k]}, correct=first[k], incorrect=wrong))

case = Case(
    name="induction_organism",
    model="organism:induction",
    formats={
        "repeat": "{first}{cue}",
        "fresh": "{other}{cue}",
    },
    good="repeat",
    bad=["fresh"],
    items=items,
    align="index",
    components=["z", "pattern"],
    description="Induction: copying works only when the string was seen before in context.",
)
