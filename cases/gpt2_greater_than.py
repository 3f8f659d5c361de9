"""Greater-Than in GPT-2 small (Hanna et al., 2023).

Good format: "The war lasted from the year 17YY to the year 17" -> a year after YY beats a year before
it. Bad format: the start year is 1701, which carries no information about YY (the paper's "01"
corruption). GPT-2 splits "1732" into "17" + "32", so the year is one token and the formats align by
index. The published circuit (heads 5.5, 6.1, 6.9, 7.10, 8.11, 9.1 and MLPs 8-11) is in `notes`.

Needs GPT-2 small in the local Hugging Face cache (`hf download openai-community/gpt2`), then e.g.
    surgeon patch cases/gpt2_greater_than.py --component mlp_out
"""
import random

from surgeon import Case, Item

NOUNS = ["war", "expedition", "drought", "reign", "voyage", "siege", "famine", "treaty"]

rng = random.Random(0)
items = []
for yy in rng.sample(range(12, 88), 48):
    items.append(Item({"noun": rng.choice(NOUNS), "yy": f"{yy:02d}"},
                      correct=f"{yy + rng.randrange(2, 10):02d}", incorrect=f"{yy - rng.randrange(2, 10):02d}"))

case = Case(
    name="gpt2_greater_than",
    model="openai-community/gpt2",
    formats={
        "year": "The {noun} lasted from the year 17{yy} to the year 17",
        "year01": "The {noun} lasted from the year 1701 to the year 17",
    },
    good="year",
    bad=["year01"],
    items=items,
    align="index",
    layers=list(range(12)),
    components=["z", "mlp_out"],
    notes={
        "paper": "Hanna, Liu and Variengien 2023, How does GPT-2 compute greater-than? (arXiv 2305.00586)",
        "circuit": {"heads": ["5.5", "6.1", "6.9", "7.10", "8.11", "9.1"], "mlps": [8, 9, 10, 11]},
    },
    description="GPT-2 small predicts an end year after the start year; the 01 corruption removes it.",
)
