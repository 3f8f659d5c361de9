"""Greedy forward selection (`surgeon.analyses.selection`), the one definition the repair search and the paired head
set share, on score functions whose greedy path is known by construction."""
import numpy as np

from surgeon.analyses.selection import forward_selection, smallest_best

GAIN = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 0.0}


def additive(cand):
    """primary: the sum of the members' gains; secondary: minus the set's size under its option; d inadmissible."""
    primary = np.array([sum(GAIN[u] for u in s) for s, _ in cand])
    secondary = np.array([-len(s) * (opt or 1) for s, opt in cand], dtype=float)
    ok = np.array(["d" not in s for s, _ in cand])
    return primary, secondary, ok


def test_the_path_takes_the_best_admissible_member_each_step_and_stops_without_gain():
    steps = forward_selection(list("dcba"), 10, additive, (0.0, -np.inf))
    assert [s.chosen for s in steps if s.index is not None] == [("a",), ("a", "b"), ("a", "b", "c")]
    assert steps[-1].stopped == "none admissible" and steps[-1].k == 4  # only d is left
    assert [s.candidates for s in steps] == [4, 3, 2, 1]


def test_ties_go_to_the_secondary_score_and_options_are_tried_with_every_member():
    steps = forward_selection(list("ab"), 1, additive, (0.0, -np.inf), options=(2, 1))
    assert steps[0].chosen == ("a",) and steps[0].option == 1  # same primary: the smaller size x option wins


def test_no_gain_stops_and_the_smallest_set_reaching_the_best_is_kept():
    def plateau(cand):  # adding c or d gains nothing: the path stops at {a, b}
        primary = np.array([min(2.0, sum(GAIN[u] > 1 for u in s)) for s, _ in cand])
        return primary, np.zeros(len(cand)), np.ones(len(cand), bool)

    steps = forward_selection(list("abcd"), 10, plateau, (0.0, 0.0))
    assert steps[-1].stopped == "no gain"
    assert smallest_best(steps).chosen == ("a", "b")
    assert smallest_best(forward_selection(list("d"), 3, additive, (0.0, 0.0))) is None
    assert len(forward_selection(list("abc"), 2, additive, (0.0, -np.inf))) == 2  # max_size
