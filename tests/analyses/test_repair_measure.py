"""A saved repair measured anywhere (issue 68 item 6): `surgeon.measure(repair, case)` and `surgeon repair --from DIR
CASE` measure it on another case's items and formats, leaving out every item it was built on. The expected counts come
from hand-written TransformerLens hooks (the good format's mean per offset from the last prompt token, taken here from
the items the repair was built on), on formats and items it was not built on."""
import dataclasses

import pytest
import torch

import surgeon
from surgeon.errors import AnalysisError
from surgeon.organisms import decimal as organism
from tests.analyses.test_repair import _case
from tests.analyses.test_repair_table import _hand_means, _hand_right
from tests.cli_in_process import surgeon as surgeon_cli

UNITS = ((0, 4), (0, 6))


def _fresh(n_trap, n_control, seed):
    """Fresh items first-token scoring can read (neither answer a prefix of the other)."""
    return [it for it in organism.held_out_items(n_trap, n_control, seed=seed)
            if not (it.correct.startswith(it.incorrect) or it.incorrect.startswith(it.correct))]


@pytest.fixture(scope="module")
def saved(decimal_model, tmp_path_factory):
    case = _case(n_trap=16, n_control=8, seed=5)
    r = surgeon.repair(case, decimal_model, heads="L0H4,L0H6", bad="qa", eval_items=_fresh(8, 4, 6))
    out = tmp_path_factory.mktemp("saved") / "rep"
    r.save(out)
    return case, r, out


def test_a_saved_repair_measured_on_other_items_and_a_format_it_was_not_built_on(decimal_model, saved):
    case, _, out = saved
    fresh = _fresh(24, 8, 21)
    disc = [it for it in case.items if it.tag == "trap"]
    m = surgeon.measure(out, dataclasses.replace(case, items=fresh), decimal_model)
    with torch.no_grad():
        means = _hand_means(decimal_model, case, disc, [0])
        for fmt in ("qa", "chat"):  # built on qa only: chat is a format it never saw
            row = next(x for x in m.held_out if x.measure == "efficacy" and x.format == fmt)
            traps = [it for it in fresh if it.tag == "trap"]
            assert row.repaired.n == len(traps)
            assert round(row.repaired.value * row.repaired.n) == _hand_right(decimal_model, case, fmt, traps, UNITS,
                                                                             means), fmt
    assert "a saved repair built on case" in str(m) and m.n_evaluation == len(fresh)


def test_items_it_was_built_on_are_left_out(decimal_model, saved):
    case, r, out = saved
    mixed = list(case.items[:10]) + _fresh(8, 4, 31)
    m = surgeon.measure(out, dataclasses.replace(case, items=mixed), decimal_model)
    assert m.n_evaluation == len(mixed) - 10
    assert "10 the repair was built on left out" in m.split.evaluated_on
    with pytest.raises(AnalysisError, match="at least"):
        surgeon.measure(out, case, decimal_model)  # every item of its own case was read to build it


def test_repair_from_on_the_cli(saved, tmp_path):
    _, _, out = saved
    bad = surgeon_cli(["repair", "--from", str(out), "--heads", "L0H4"])
    assert bad.returncode == 2 and "--heads" in bad.stderr and "Traceback" not in bad.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = surgeon_cli(["repair", "--from", str(empty)])
    assert bad.returncode == 2 and "holds no repair" in bad.stderr and "Traceback" not in bad.stderr
    ok = surgeon_cli(["repair", "--from", str(out), "--eval-items", "16"])
    assert ok.returncode == 0, ok.stderr
    assert "a saved repair built on case 'decimal_organism'" in ok.stdout and "efficacy         chat" in ok.stdout
