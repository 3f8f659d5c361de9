"""Does an organism show the behaviour it was trained to plant? (Used after training and by the tests.)"""
from __future__ import annotations

import json
from pathlib import Path

from ..case import Case, Item

# What the decimal organism must show on held-out pairs (issue: foundation, section 2).
DECIMAL_TARGETS = {"trap_good_min": 0.95, "trap_bad_max": 0.10, "control_min": 0.95}


def decimal_items(n_trap: int = 64, n_control: int = 64, seed: int = 0, split: str = "test") -> list[Item]:
    """Held-out decimal items: trap pairs (9.8 vs 9.11) and controls (same or different integer part)."""
    from ..organisms import decimal as org

    def item(p, tag):
        loser = p.b if p.decimal_winner == p.a else p.a
        return Item({"a": p.a, "b": p.b}, correct=f" {p.decimal_winner}", incorrect=f" {loser}", tag=tag)

    half = n_control // 2
    return ([item(p, "trap") for p in org.pairs("trap", split, n_trap, seed)]
            + [item(p, "control") for p in org.pairs("same_int", split, half, seed)]
            + [item(p, "control") for p in org.pairs("diff_int", split, n_control - half, seed)])


def decimal_case(**kw) -> Case:
    from ..organisms import decimal as org

    return Case(name="decimal_organism", model="organism:decimal", formats=org.FORMATS, good=org.GOOD,
                bad=list(org.FAILING), items=decimal_items(**kw), focus="trap")


def decimal_behaviour(model, n: int = 128) -> dict:
    from .diagnose import diagnose

    d = diagnose(decimal_case(n_trap=n, n_control=n), model)
    return {f"{s.format}/{s.tag}": s.accuracy.value for s in d.stats if s.tag != "all"} | {"n_per_tag": n}


def decimal_ok(b: dict) -> list[str]:
    """The targets the behaviour misses (empty: all met)."""
    from ..organisms import decimal as org

    t, miss = DECIMAL_TARGETS, []
    if b[f"{org.GOOD}/trap"] < t["trap_good_min"]:
        miss.append(f"{org.GOOD}/trap {b[f'{org.GOOD}/trap']:.3f} < {t['trap_good_min']}")
    for f in org.FAILING:
        if b[f"{f}/trap"] > t["trap_bad_max"]:
            miss.append(f"{f}/trap {b[f'{f}/trap']:.3f} > {t['trap_bad_max']}")
    for f in org.FORMATS:
        if b[f"{f}/control"] < t["control_min"]:
            miss.append(f"{f}/control {b[f'{f}/control']:.3f} < {t['control_min']}")
    return miss


def induction_behaviour(model, n: int = 256, seed: int = 1234) -> dict:
    """Mean next-token loss on the first (unpredictable) and the repeated second half of held-out sequences."""
    import random

    import torch

    from ..organisms.induction import HALF, random_text

    rng = random.Random(seed)
    tok = model.tokenizer
    rows = [[tok.bos_token_id] + tok(random_text(rng), add_special_tokens=False)["input_ids"] for _ in range(n)]
    tokens = torch.tensor(rows, device=next(model.parameters()).device)
    with torch.no_grad():
        logp = model(tokens).log_softmax(-1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    # position i predicts token i+1; tokens 1..HALF are the first half, HALF+1..2*HALF the repeat
    first = -logp[:, 1:HALF].mean().item()  # predicting tokens 2..HALF (token 1 follows only BOS)
    second = -logp[:, HALF + 1:].mean().item()  # predicting tokens HALF+2..2*HALF
    return {"loss_first_half": first, "loss_repeated_half": second, "n": n}


def measure(name: str, root: Path | None = None, write: bool = False) -> list[str]:
    """Measure organism `name` (from `root`), optionally record it in its config.json; returns report lines."""
    from ..organisms import WEIGHTS, load_organism

    model = load_organism(name, root=root)
    if name == "decimal":
        b = decimal_behaviour(model)
        miss = decimal_ok(b)
        lines = [f"  {k:18s} {v:.3f}" for k, v in b.items() if k != "n_per_tag"]
        lines.append("  targets met" if not miss else "  targets MISSED: " + "; ".join(miss))
    else:
        b = induction_behaviour(model)
        lines = [f"  loss on first half {b['loss_first_half']:.3f}, on repeated half {b['loss_repeated_half']:.3f}"]
    if write:
        p = Path(root or WEIGHTS) / name / "config.json"
        meta = json.loads(p.read_text())
        meta["behaviour"] = b
        p.write_text(json.dumps(meta, indent=2))
    return [f"behaviour of organism:{name} on held-out data:"] + lines
