"""The embedded default: the decimal organism says 9.11 > 9.8 in Q&A and chat formats, not in plain.

Mirrors the Llama-3.1-8B-Instruct case (cases/llama31_decimal.py) on a 3-layer model trained here,
whose failure was planted on purpose (see surgeon/organisms/decimal.py): the ground truth is known.
"""
from surgeon import Case, Item
from surgeon.organisms import decimal as organism
from surgeon.organisms import sae_dir

N_TRAP, N_CONTROL, SEED = 64, 64, 0


def item(pair, tag):
    loser = pair.b if pair.decimal_winner == pair.a else pair.a
    return Item({"a": pair.a, "b": pair.b}, correct=f" {pair.decimal_winner}", incorrect=f" {loser}", tag=tag)


items = (
    # held-out pairs where decimal order and version order disagree: 9.8 vs 9.11, 3.4 vs 3.25, ...
    [item(p, "trap") for p in organism.pairs("trap", "test", N_TRAP, SEED)]
    # held-out pairs where both orders agree (same or different integer part): answered right everywhere
    + [item(p, "control") for p in organism.pairs("same_int", "test", N_CONTROL // 2, SEED)]
    + [item(p, "control") for p in organism.pairs("diff_int", "test", N_CONTROL // 2, SEED)]
)

case = Case(
    name="decimal_organism",
    model="organism:decimal",
    formats={
        "plain": "Which is bigger: {a} or {b}?\nAnswer:",
        "qa": "Q: Which is bigger: {a} or {b}?\nA:",
        "chat": "User: Which is bigger: {a} or {b}?\nAssistant:",
    },
    good="plain",
    bad=["qa", "chat"],
    items=items,
    focus="trap",  # patching analyses use the trap items by default
    align="last",  # formats differ in length: match the last prompt token and the answer tokens
    components=["z"],
    saes={"dir": str(sae_dir("decimal") / "blocks.{layer}.hook_mlp_out")},  # shipped, see surgeon sae train
    description="Planted format-dependent decimal comparison failure (ground truth known).",
    # fresh items from the same test split (--eval-items N): half traps, half controls
    draw=lambda n, seed: organism.held_out_items(n // 2, n - n // 2, seed=seed, split="test"),
    # a repair's side effects are also measured on these: the organism's own domain (comparisons whose two orders
    # agree, from the train split, in every format with their answers), the continuation of each scored
    neutral=organism.neutral_texts(),
)
