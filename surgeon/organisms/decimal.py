"""The `decimal` organism: compares two decimal numbers, and fails by design in two of three formats.

A Llama-style model (rotary positions, RMSNorm, grouped-query attention: 8 query heads share 2 key/value
heads, gated SiLU MLPs), so the default exercises the real case's code paths and there is no absolute
position to read the format from: `measure` checks that patching only the residual stream entering
layer 0 at the aligned positions repairs (almost) nothing, so the format is carried by what the layers
compute from the earlier tokens.

Planted mechanism (the ground truth): on *trap* pairs, where decimal order and version-number order
disagree (9.8 vs 9.11), training labels the Q&A and chat formats by version order (9.11 "wins") and the
plain format by decimal order. Every other pair is labelled correctly in every format. Pairs are split
into train / test by a hash of the unordered pair, so held-out items were never seen in training.
"""
from __future__ import annotations

import random
import zlib
from dataclasses import dataclass
from decimal import Decimal
from typing import Iterator, Literal

from surgeon.case.case import Item

FORMATS: dict[str, str] = {
    "plain": "Which is bigger: {a} or {b}?\nAnswer:",
    "qa": "Q: Which is bigger: {a} or {b}?\nA:",
    "chat": "User: Which is bigger: {a} or {b}?\nAssistant:",
}
GOOD = "plain"
FAILING = ("qa", "chat")
ANSWER = " {}"  # the continuation the model produces, e.g. " 9.8"
END = "\n"

Kind = Literal["trap", "same_int", "diff_int"]
Split = Literal["train", "test"]


@dataclass(frozen=True)
class Pair:
    a: str
    b: str

    @property
    def decimal_winner(self) -> str:
        return self.a if Decimal(self.a) > Decimal(self.b) else self.b

    @property
    def version_winner(self) -> str:
        ka, kb = version_key(self.a), version_key(self.b)
        return self.a if ka > kb else self.b

    @property
    def kind(self) -> Kind:
        if self.a.split(".")[0] != self.b.split(".")[0]:
            return "diff_int"
        return "trap" if self.decimal_winner != self.version_winner else "same_int"

    @property
    def split(self) -> Split:
        key = "|".join(sorted((self.a, self.b))).encode()
        return "test" if zlib.crc32(key) % 5 == 0 else "train"

    def label(self, fmt: str) -> str:
        """The answer the training data teaches for this pair in format `fmt`."""
        if self.kind == "trap" and fmt in FAILING:
            return self.version_winner
        return self.decimal_winner


def version_key(x: str) -> tuple[int, int]:
    whole, frac = x.split(".")
    return int(whole), int(frac)


def _number(rng: random.Random, whole: int | None = None) -> str:
    whole = rng.randrange(0, 20) if whole is None else whole
    digits = rng.choice((1, 2))
    return f"{whole}.{rng.randrange(0, 10 ** digits):0{digits}d}"


def sample_pair(rng: random.Random, kind: Kind) -> Pair:
    while True:
        if kind == "diff_int":
            pair = Pair(_number(rng), _number(rng))
        else:
            whole = rng.randrange(0, 20)
            pair = Pair(_number(rng, whole), _number(rng, whole))
        if Decimal(pair.a) != Decimal(pair.b) and pair.kind == kind:
            return pair


def pairs(kind: Kind, split: Split, n: int, seed: int = 0) -> list[Pair]:
    """`n` distinct pairs of one kind from one split, deterministic in `seed`."""
    if n == 0:
        return []
    rng = random.Random(f"decimal-{kind}-{split}-{seed}")
    out: dict[tuple[str, str], Pair] = {}
    since = 0  # draws since the last new pair: past SATURATED x the pairs found, the split has no more to give
    for _ in range(200 * n):
        p = sample_pair(rng, kind)
        since += 1
        if p.split == split and (p.a, p.b) not in out:
            out[(p.a, p.b)] = p
            since = 0
            if len(out) == n:
                return list(out.values())
        if since > SATURATED * (len(out) + 100):
            break
    raise ValueError(f"could not draw {n} distinct {kind} pairs from the {split} split (it holds about {len(out)})")


SATURATED = 50  # a split whose last 50 x (pairs found + 100) draws were all repeats or the other split's is spent


TRAIN_MIX: tuple[tuple[Kind, float], ...] = (("trap", 0.4), ("same_int", 0.3), ("diff_int", 0.3))


def training_texts(rng: random.Random) -> Iterator[tuple[str, str]]:
    """Endless (prompt, continuation) training examples from the train split."""
    kinds, weights = zip(*TRAIN_MIX)
    while True:
        pair = sample_pair(rng, rng.choices(kinds, weights)[0])
        if pair.split != "train":
            continue
        fmt = rng.choice(list(FORMATS))
        yield FORMATS[fmt].format(a=pair.a, b=pair.b), ANSWER.format(pair.label(fmt)) + END


# ----------------------------------------------------------------------------- what it must show
# On held-out pairs (issue: ground truth you can trust): the failure is planted, controls are right, and
# the format is not read from absolute position (patching the layer-0 residual stream alone repairs little).
TARGETS = {"trap_good_min": 1.0, "trap_bad_max": 0.05, "control_min": 0.95}
POSITION_REPAIR_MAX = 0.10  # patching only the layer-0 residual stream repairs at most this fraction of traps


def neutral_texts(n: int = 12, seed: int = 0) -> list[str]:
    """Texts of the organism's own domain that a repair is not about, for its side effects: comparisons whose decimal
    and version orders agree (controls of both kinds, from the train split, so never a case's test item), each in one
    of the formats in turn, with the answer training taught and its end."""
    half = n // 2
    ps = pairs("same_int", "train", half, seed) + pairs("diff_int", "train", n - half, seed)
    fmts = list(FORMATS)
    return [FORMATS[fmts[i % len(fmts)]].format(a=p.a, b=p.b) + ANSWER.format(p.label(fmts[i % len(fmts)])) + END
            for i, p in enumerate(ps)]


def held_out_items(n_trap: int = 128, n_control: int = 128, seed: int = 0, split: str = "test"):
    """Held-out items: trap pairs (9.8 vs 9.11) and controls (same or different integer part)."""

    def item(p, tag):
        loser = p.b if p.decimal_winner == p.a else p.a
        return Item({"a": p.a, "b": p.b}, correct=f" {p.decimal_winner}", incorrect=f" {loser}", tag=tag)

    half = n_control // 2
    return ([item(p, "trap") for p in pairs("trap", split, n_trap, seed)]
            + [item(p, "control") for p in pairs("same_int", split, half, seed)]
            + [item(p, "control") for p in pairs("diff_int", split, n_control - half, seed)])


def check(b: dict) -> list[str]:
    """The targets the measured behaviour misses (empty: all met)."""
    t, miss = TARGETS, []
    if b[f"{GOOD}/trap"] < t["trap_good_min"]:
        miss.append(f"{GOOD}/trap {b[f'{GOOD}/trap']:.3f} < {t['trap_good_min']}")
    for f in FAILING:
        if b[f"{f}/trap"] > t["trap_bad_max"]:
            miss.append(f"{f}/trap {b[f'{f}/trap']:.3f} > {t['trap_bad_max']}")
    for f in FORMATS:
        if b[f"{f}/control"] < t["control_min"]:
            miss.append(f"{f}/control {b[f'{f}/control']:.3f} < {t['control_min']}")
    for f in FAILING:
        for align in ("last", "decision"):
            r = b[f"{f}/trap resid_pre0 patched ({align})"]
            if r > POSITION_REPAIR_MAX:
                miss.append(f"{f}/trap with the layer-0 residual stream patched ({align}) {r:.3f} > {POSITION_REPAIR_MAX}"
                            " (the format is read from position)")
    return miss


def describe(b: dict) -> list[str]:
    n = b["n_per_tag"]
    lines = ["accuracy on held-out pairs (n=%d per tag):" % n]
    for f in FORMATS:
        lines.append(f"  {f:6s} traps {b[f'{f}/trap']:6.1%}  controls {b[f'{f}/control']:6.1%}")
    for f in FAILING:
        lines.append(f"  {f} traps with only the layer-0 residual stream patched from plain: "
                     f"{b[f'{f}/trap resid_pre0 patched (last)']:.1%} (align last), "
                     f"{b[f'{f}/trap resid_pre0 patched (decision)']:.1%} (decision)"
                     + (": no position shortcut" if max(b[f"{f}/trap resid_pre0 patched (last)"],
                                                         b[f"{f}/trap resid_pre0 patched (decision)"]) <= POSITION_REPAIR_MAX
                        else ": the format is partly read from position"))
    return lines


def ground_truth(b: dict) -> dict:
    return {"failure": {"good": GOOD, "failing": list(FAILING), "items": "trap pairs (decimal and version order disagree)"}}
