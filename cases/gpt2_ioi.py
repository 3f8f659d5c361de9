"""Indirect object identification (IOI) in GPT-2 small (Wang et al., 2022).

Good format: "When Mary and John went to the store, John gave a drink to" -> " Mary" (the indirect
object) beats " John" (the subject). Bad format: the repeated subject is replaced by a third name, so
nothing marks which name is the indirect object, and the preference disappears. Names are single GPT-2
tokens, so the formats have equal length and positions align by index. The published circuit (26
heads) is in `notes` for comparison with what `surgeon patch` and `surgeon threshold` find.

Needs GPT-2 small in the local Hugging Face cache (`hf download openai-community/gpt2`), then e.g.
    surgeon patch cases/gpt2_ioi.py --component z --device cuda
"""
import random

from surgeon import Case, Item

NAMES = [" Mary", " John", " Tom", " James", " Dan", " Sid", " Martin", " Amy", " Paul", " Kate", " Anne", " Mark",
         " Sarah", " Laura", " Jack", " Kevin", " Lisa", " Emma", " Adam", " Henry"]
PLACES = [" store", " park", " school", " office", " station", " garden"]
OBJECTS = [" drink", " book", " ball", " gift", " letter", " bone"]

rng = random.Random(0)
items = []
for _ in range(64):
    io, s, other = rng.sample(NAMES, 3)
    items.append(Item({"io": io, "s": s, "other": other, "place": rng.choice(PLACES), "obj": rng.choice(OBJECTS)},
                      correct=io, incorrect=s))

case = Case(
    name="gpt2_ioi",
    model="openai-community/gpt2",
    formats={
        "abb": "When{io} and{s} went to the{place},{s} gave a{obj} to",
        "abc": "When{io} and{s} went to the{place},{other} gave a{obj} to",
    },
    good="abb",
    bad=["abc"],
    items=items,
    align="index",
    layers=list(range(12)),
    components=["z", "pattern", "v"],
    notes={
        "paper": "Wang et al. 2022, Interpretability in the Wild (arXiv 2211.00593)",
        "circuit": {
            "name_mover": ["9.9", "9.6", "10.0"],
            "backup_name_mover": ["10.10", "10.6", "10.2", "10.1", "11.2", "9.7", "9.0", "11.9"],
            "negative_name_mover": ["10.7", "11.10"],
            "s_inhibition": ["8.6", "8.10", "7.3", "7.9"],
            "induction": ["5.5", "5.8", "5.9", "6.9"],
            "duplicate_token": ["0.1", "0.10", "3.0"],
            "previous_token": ["2.2", "4.11"],
        },
    },
    description="GPT-2 small prefers the indirect object only when the subject is repeated.",
)
