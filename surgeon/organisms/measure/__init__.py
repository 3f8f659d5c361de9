"""Measuring the organisms: each organism's planted mechanism checked on the built model with the engine or
plain TransformerLens hooks. This sits above the engine; loading an organism (`surgeon.organisms`) never
imports it."""
from __future__ import annotations

import json
from pathlib import Path

from surgeon.organisms import WEIGHTS, load_organism, spec
from surgeon.organisms.measure import chain, decimal, induction, sink, threshold

MEASURES = {"chain": chain.measure, "decimal": decimal.measure, "induction": induction.measure, "sink": sink.measure,
            "threshold": threshold.measure}


def measure(name: str, root: Path | None = None, write: bool = False, model=None) -> tuple[dict, list[str]]:
    """Measure organism `name` with its own module's code; with `write`, record the facts in its config.json.
    Returns (facts, the targets missed)."""
    s = spec(name)
    model = model if model is not None else load_organism(name, root=root)
    f = MEASURES[name](model)
    miss = s.module.check(f)
    if write:
        p = Path(root or WEIGHTS) / name / "config.json"
        meta = json.loads(p.read_text())
        meta.pop("behaviour", None)
        meta["measured"] = f
        meta["targets_met"] = not miss
        meta["ground_truth"] = s.module.ground_truth(f)
        p.write_text(json.dumps(meta, indent=2) + "\n")
    return f, miss
