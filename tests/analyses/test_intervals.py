"""Every interval a command prints is ordered and holds its estimate, in both directions (noise divides by
a negative gap: the bounds must be swapped, not printed as [0.950, 0.857])."""
import re

import pytest

from surgeon.analyses import attribute, patch_heads
from surgeon.analyses.circuit import discover, evaluate_circuit
from surgeon.reports.attribution_view import attribution_text
from surgeon.reports.circuit_view import circuit_eval_text, circuit_text
from surgeon.reports.feature_view import feature_repair_text
from surgeon.reports.patch_view import patch_text
from tests.conftest import ROOT

NUM = r"([-+]?\d+(?:\.\d+)?)%?"
INTERVAL = re.compile(NUM + r"\s*\[\s*" + NUM + r",\s*" + NUM + r"\]")


def check_intervals(text: str) -> int:
    """Asserts lo <= estimate <= hi (to the printed precision) for every 'x [lo, hi]' in text; returns the count."""
    n = 0
    for m in INTERVAL.finditer(text):
        est, lo, hi = (float(g) for g in m.groups())
        tol = 1.5 * 10 ** -min(len(g.split(".")[1]) if "." in g else 0 for g in m.groups())
        assert lo <= hi + tol, f"reversed interval: {m.group(0)!r}"
        assert lo - tol <= est <= hi + tol, f"estimate outside its interval: {m.group(0)!r}"
        n += 1
    return n


def test_the_checker_catches_a_reversed_interval():
    with pytest.raises(AssertionError, match="reversed"):
        check_intervals("f = 0.902 [0.950, 0.857] (95% CI)")
    with pytest.raises(AssertionError, match="outside"):
        check_intervals("effect +1.200 [+0.100, +0.300]")
    assert check_intervals("accuracy  15.6% [  8.7,  26.4] (n=64)") == 1


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_every_interval_is_ordered_and_holds_its_estimate(direction, decimal_model, decimal_case, induction_model):
    from surgeon import load_case
    from surgeon.analyses.sae_repair import feature_repair
    from tests.sae.test_sae import shipped

    texts = [patch_text(patch_heads(decimal_case, decimal_model, direction=direction)),
             attribution_text(attribute(decimal_case, decimal_model, direction=direction, compare=True)),
             feature_repair_text(feature_repair(decimal_case, decimal_model, shipped("decimal", 1), top=4,
                                                       budget=50, direction=direction))]
    induction = load_case(f"{ROOT}/cases/induction_organism.py")
    for case, model in [(decimal_case, decimal_model), (induction, induction_model)]:
        for method in ("exact", None):
            r = discover(case, model, method=method, direction=direction, n_paths=3, verify=10)
            texts.append(circuit_text(r))
        ev = evaluate_circuit(case, model, r.names(r.circuit), direction=direction)
        texts.append(circuit_eval_text(ev, "c.json"))
        lo, hi = r.circuit_faithfulness_ci
        assert lo <= r.circuit_faithfulness <= hi
    assert sum(check_intervals(t) for t in texts) > 30
