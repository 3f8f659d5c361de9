"""A sequence task: the induction organism continues a repeated string, scored at every position it continues.

The prompt is a string A of distinct letters, a few filler letters, then A's first letter again. In the good
format (`repeat`) A was seen before, so each next letter is predictable by induction: after A[0] comes A[1], after
A[1] comes A[2], ... In the bad format (`fresh`) the first copy is another string of the same length with none of
A's letters, so nothing before says what follows.

Each item is scored at k positions ("the next k tokens"), teacher-forced on the correct continuation: position j
reads the prompt and A[1..j] and is scored by its correct next letter A[j+1] against a distractor (the letter after
it, A[j+2], the usual slip of a copying mechanism that skips one). The item's score is the mean over its k positions
(`combine="mean"`). The two formats have equal length, so positions align by index.
"""
import random

from surgeon import Case, Item
from surgeon.organisms import ground_truth

rng = random.Random(0)
LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

items = []
for _ in range(48):
    period, gap = rng.randrange(8, 15), rng.randrange(0, 9)
    symbols = rng.sample(LETTERS, 2 * period + gap)
    a, other, filler = "".join(symbols[:period]), "".join(symbols[period:2 * period]), "".join(symbols[2 * period:])
    k = rng.randrange(3, period - 2)  # score the next k letters: A[1..k], each against the letter after it
    items.append(Item({"first": a, "fresh": other, "gap": filler, "cue": a[0]},
                      correct=list(a[1:k + 1]), incorrect=list(a[2:k + 2])))

case = Case(
    name="induction_sequence",
    model="organism:induction",
    formats={
        "repeat": "{first}{gap}{cue}",
        "fresh": "{fresh}{gap}{cue}",
    },
    good="repeat",
    bad=["fresh"],
    items=items,
    align="index",
    combine="mean",
    notes={"ground_truth": ground_truth("induction")},
    description="The next k letters of a repeated string, each scored where the model predicts it.",
)
