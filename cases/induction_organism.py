"""Induction in the induction organism: a token seen before is continued by what followed it.

Good format (`repeat`): a string of distinct letters, a few filler letters, then the string's first k
letters again; the next letter is predictable only by induction (find the earlier occurrence of the last
letter, copy the letter after it). Bad format (`fresh`): the same, except that the letter before the
answer's first occurrence is replaced, so the last cue letter was never seen: nothing to match. The two
prompts differ in one token, and what they differ in reaches the answer only through the K-composition
path: that token -> the previous-token head at the next position -> the *key* of the induction head there
-> the induction head's output at the last position (the value it copies is the same in both formats).
The formats have equal length, so positions align by index.

The ground-truth heads are read from the organism's measurement (`surgeon organisms describe induction`),
not typed in.
"""
import random

from surgeon import Case, Item
from surgeon.organisms import ground_truth

rng = random.Random(0)
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

items = []
for _ in range(64):
    period, gap = rng.randrange(8, 15), rng.randrange(0, 9)
    symbols = rng.sample(LETTERS, period + gap + 1)
    a, filler, z = "".join(symbols[:period]), "".join(symbols[period:period + gap]), symbols[-1]
    k = rng.randrange(2, period - 1)  # predict a[k] after the cue a[:k]; a[k - 1] is what `fresh` replaces
    items.append(Item({"head": a[: k - 1], "m": a[k - 1], "z": z, "tail": a[k:], "gap": filler, "cue": a[:k]},
                      correct=a[k], incorrect=rng.choice(a[k + 1:])))

case = Case(
    name="induction_organism",
    model="organism:induction",
    formats={
        "repeat": "{head}{m}{tail}{gap}{cue}",
        "fresh": "{head}{z}{tail}{gap}{cue}",
    },
    good="repeat",
    bad=["fresh"],
    items=items,
    align="index",
    components=["z", "pattern"],
    notes={"ground_truth": ground_truth("induction")},
    description="Induction: the next letter is copied from context only when its cue was seen before.",
)
