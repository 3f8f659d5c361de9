"""Held-out numbers for the subset search (issue 51, first part): a seeded, tag-stratified split; the search on the
discovery items; each family's best subset per size evaluated on the evaluation items; named subsets evaluated on
any items. Checked against patching written with hand-written TransformerLens hooks (tests/reference.py), on fresh
items drawn from the organism's own generator, and against mutations (a leaked item, evaluation on the wrong side)."""
import dataclasses


import pytest
import torch

import surgeon
import surgeon.api
from surgeon.analyses.heldout import evaluate_subsets, split_items, threshold_heldout
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site
from surgeon.case.encoding import format_rows
from tests.reference import direct_patch_scores
from tests.cli_in_process import surgeon as surgeon_cli


def _case():
    return surgeon.api.read("decimal_organism")


def hand_rate(case, model, items, heads, bad="qa"):
    """The fraction of `items` right in the failing format with `heads` (labels of layer 0) carrying the good format's
    z at the aligned positions: one hooked forward per row."""
    if not heads:
        mask = torch.zeros(model.cfg.n_heads)
    else:
        mask = torch.zeros(model.cfg.n_heads)
        for h in heads:
            assert h.startswith("L0H")
            mask[int(h[3:])] = 1.0
    c = dataclasses.replace(case, items=list(items), focus=None)
    rows_b, rows_s = format_rows(c, model, bad, c.items), format_rows(c, model, c.good, c.items)
    with torch.no_grad():
        scores = direct_patch_scores(model, rows_b, rows_s, c.align, Site.of("z", 0), mask)
    return float((scores > 0).float().mean())


def test_the_split_is_seeded_stratified_paired_and_disjoint():
    items = _case().items
    s = split_items(items, 0.5, seed=0)
    assert set(s.discovery).isdisjoint(s.evaluation)  # no item on both sides
    assert sorted(s.discovery + s.evaluation) == list(range(len(items)))  # none lost
    for tag in {it.tag for it in items}:
        n = sum(it.tag == tag for it in items)
        assert sum(items[i].tag == tag for i in s.evaluation) == round(0.5 * n)  # stratified by tag
    assert split_items(items, 0.5, seed=0) == s and split_items(items, 0.5, seed=1) != s
    assert len(split_items(items, 0.25, seed=0).evaluation) == round(0.25 * 64) + round(0.25 * (len(items) - 64))
    with pytest.raises(AnalysisError, match="each side needs at least"):
        split_items(items[:6], 0.5)
    with pytest.raises(AnalysisError, match="not in"):
        split_items(items, 1.0)


def _fresh_items(n=24, seed=12345):
    """Trap items the shipped case does not hold: the organism's test split drawn with another seed."""
    from surgeon.organisms import decimal as organism

    case = _case()
    have = {tuple(sorted(it.values.items())) for it in case.items}
    out = []
    for p in organism.pairs("trap", "test", 4 * n, seed):
        loser = p.b if p.decimal_winner == p.a else p.a
        it = surgeon.Item({"a": p.a, "b": p.b}, correct=f" {p.decimal_winner}", incorrect=f" {loser}", tag="trap")
        if tuple(sorted(it.values.items())) not in have and it not in out:
            out.append(it)
    return out[:n]


def test_named_subsets_on_fresh_items_equal_hand_written_hooks(decimal_model):
    fresh = _fresh_items()
    assert len(fresh) == 24
    case = dataclasses.replace(_case(), items=fresh, focus=None)
    subsets = [["L0H4", "L0H6"], ["L0H6"], [], ["L0H1", "L0H3"]]
    got = evaluate_subsets(case, decimal_model, subsets, bad="qa")
    assert [r.subset for r in got] == [tuple(s) for s in subsets]
    for r, heads in zip(got, subsets):
        assert r.rate.n == 24
        assert r.rate.value == pytest.approx(hand_rate(case, decimal_model, fresh, heads), abs=1e-6), heads
    # the public route, and the same numbers
    again = surgeon.evaluate_subsets(case, decimal_model, ["L0H4,L0H6"], bad="qa")
    assert again[0].rate.value == got[0].rate.value


@pytest.fixture(scope="module")
def held(decimal_model):
    return threshold_heldout(_case(), decimal_model, holdout=0.5, seed=0, layer=0, budget=20, item_rate=0.9)


@pytest.mark.slow
def test_each_best_subset_is_evaluated_on_the_held_out_items_only(held, decimal_model):
    case = _case()
    items = case.items_for(case.focus)
    disc = [items[i] for i in held.split.discovery]
    ev = [items[i] for i in held.split.evaluation]
    assert held.n_discovery == len(disc) == 32 and held.n_evaluation == len(ev) == 32
    assert held.search.n_items == len(disc)  # the search saw the discovery items alone
    checked = 0
    for row in held.rows:
        if row.family != "all" or row.k not in (1, 2, 3):
            continue
        assert row.held_out.value == pytest.approx(hand_rate(case, decimal_model, ev, row.subset), abs=1e-6)
        assert row.discovery.value == pytest.approx(hand_rate(case, decimal_model, disc, row.subset), abs=1e-6)
        checked += 1
    assert checked == 3
    # the row's in-sample rate is the best over the evaluated subsets of its size: no other beats it there
    from surgeon.search.subsets import plan_from_options

    plan = plan_from_options(held.search.options)
    fam = next(f for f in plan.families if f.name == "all" and f.key[0] == 2)
    labels = [u.label for u in plan.units]
    best = held.row("all", 2)
    for m in fam.masks[:3]:
        heads = [labels[i] for i in range(len(labels)) if (m >> i) & 1]
        assert hand_rate(case, decimal_model, disc, heads) <= best.discovery.value + 1e-9


def test_the_held_out_report_says_which_number_is_which(held, tmp_path):
    text = str(held)
    assert "held-out rate" in text and "in-sample" in text and "L0H4+L0H6" in text
    saved = held.save(tmp_path / "h")
    back = surgeon.load(saved)
    assert str(back) == text


def test_the_command_line_runs_held_out_and_named_subsets(capsys, tmp_path):
    from surgeon.cli import main

    assert main(["threshold", "--layer", "0", "--budget", "10", "--item-rate", "0.9", "--holdout", "0.5",
                 "--out", str(tmp_path / "h")]) == 0
    out = capsys.readouterr().out
    assert "held-out rate" in out and (tmp_path / "h" / "results.json").is_file()
    assert main(["threshold", "--eval", "L0H4,L0H6", "--eval", "L0H6"]) == 0
    out = capsys.readouterr().out
    assert "L0H4+L0H6" in out and "(n=64)" in out
    for argv, words in ((["--eval", "4,6"], "cannot read the subset"),
                        (["--eval", "L0H4", "--holdout", "0.5"], "does not combine with --holdout"),
                        (["--holdout", "0.5", "--generate", "4", "--layer", "0"], "does not combine with --generate")):
        assert main(["threshold", *argv]) == 2
        assert words in capsys.readouterr().err





def test_a_circuit_found_on_discovery_items_is_scored_on_the_held_out_ones(decimal_model):
    """MIB's protocol: the circuit is pruned on the discovery items and its faithfulness is measured on the others,
    under the same ablation and semantics; the two sides are the split's, never mixed."""
    from surgeon.analyses.circuit import discover, evaluate_circuit
    from surgeon.analyses.heldout import circuit_heldout

    case = _case()
    r = circuit_heldout(case, decimal_model, holdout=0.5, seed=3, n_paths=0, verify=0)
    items = case.items_for(case.focus)
    as_case = lambda idx: dataclasses.replace(case, items=[items[i] for i in idx], focus=None)  # noqa: E731
    alone = discover(as_case(r.split.discovery), decimal_model, n_paths=0, verify=0)
    assert alone.circuit == r.search.circuit and r.search.n_items == len(r.split.discovery)
    names = r.search.names(r.search.circuit)
    on_eval = evaluate_circuit(as_case(r.split.evaluation), decimal_model, names)
    on_disc = evaluate_circuit(as_case(r.split.discovery), decimal_model, names)
    assert r.held_out["faithfulness"] == pytest.approx(on_eval["faithfulness"], abs=1e-9)
    assert r.held_out["n_items"] == len(r.split.evaluation)
    assert on_disc["faithfulness"] == pytest.approx(r.search.circuit_faithfulness, abs=1e-5)
    assert abs(on_disc["faithfulness"] - on_eval["faithfulness"]) > 1e-4  # the sides differ: which one is read matters
    text = str(r)
    assert "held-out (" in text and "in-sample (" in text
    # the discovery ranking's faithfulness curve, measured on the held-out items: each point is the top-k edges (by
    # the discovery scores) evaluated there
    import numpy as np

    order = np.argsort(-np.abs(np.asarray(r.search.scores)), kind="stable")
    assert len(r.curve) == len(r.search.curve_edges)
    for i in (3, 6, 8):
        k = r.search.curve_edges[i]
        top = evaluate_circuit(as_case(r.split.evaluation), decimal_model, r.search.names(order[:k]))
        assert r.curve[i] == pytest.approx(top["faithfulness"], abs=1e-5)
    assert max(abs(a - b) for a, b in zip(r.curve, r.search.curve)) > 1e-4 and "CPR" in text


def test_per_head_patching_ranked_on_discovery_items_reported_held_out(decimal_model):
    """`surgeon patch --holdout`: the units are ranked on the discovery items; the top ones' held-out fractions are
    those of patching them on the evaluation items alone, which hand-written hooks reproduce for the first."""
    import numpy as np

    from surgeon.analyses.heldout import patch_heldout
    from surgeon.analyses.patching import patch_heads

    case = _case()
    r = patch_heldout(case, decimal_model, holdout=0.5, seed=2, top=5, layers=[0, 1])
    items = case.items_for(case.focus)
    ev = [items[i] for i in r.split.evaluation]
    disc = [items[i] for i in r.split.discovery]
    on_disc = patch_heads(dataclasses.replace(case, items=disc, focus=None), decimal_model, layers=[0, 1])
    on_eval = patch_heads(dataclasses.replace(case, items=ev, focus=None), decimal_model, layers=[0, 1])
    f = np.asarray(on_disc.fraction)
    want = [f"L{on_disc.layers[li]}H{u}" for li, u in
            (np.unravel_index(i, f.shape) for i in np.argsort(-f, axis=None, kind="stable")[:5])]
    assert [u.unit for u in r.top] == want  # ranked where they were chosen
    for u in r.top:
        li, h = on_eval.layers.index(int(u.unit[1])), int(u.unit[3:])
        assert u.held_out.value == pytest.approx(float(on_eval.fraction[li, h]), abs=1e-9)
        assert u.discovery.value == pytest.approx(float(on_disc.fraction[li, h]), abs=1e-9)
    assert any(abs(u.held_out.value - u.discovery.value) > 1e-4 for u in r.top)
    # the first unit's held-out accuracy when patched, from hand-written hooks (layer 0 only in hand_rate)
    first = next(u for u in r.top if u.unit.startswith("L0"))
    h = int(first.unit[3:])
    assert float(on_eval.accuracy[0, h]) == pytest.approx(hand_rate(case, decimal_model, ev, [first.unit]), abs=1e-6)
    assert 0.8 < r.spearman <= 1.0 and "Spearman" in str(r)


def test_the_command_line_finds_a_circuit_held_out(capsys, tmp_path):
    from surgeon.cli import main

    assert main(["circuit", "--holdout", "0.5", "--paths", "0", "--verify", "0",
                 "--export", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "held-out (32 items, the result)" in out and (tmp_path / "c.json").is_file()


def test_fresh_items_from_the_cases_draw_are_new_checked_and_in_proportion():
    """Issue 51, item 1: the organisms' cases draw fresh items from their test splits; none equals one of the case's,
    the tags keep the draw's proportions, the same seed gives the same items, and a case without a draw is refused."""
    from surgeon.case.reading import fresh_items

    case = _case()
    have = {(tuple(sorted(it.values.items())), it.correct, it.incorrect) for it in case.items}
    fresh = fresh_items(case, 64, 1)
    assert len(fresh) == 64 and sum(it.tag == "trap" for it in fresh) == 32
    assert not have & {(tuple(sorted(it.values.items())), it.correct, it.incorrect) for it in fresh}
    assert fresh_items(case, 64, 1) == fresh and fresh_items(case, 64, 2) != fresh
    with pytest.raises(surgeon.CaseError, match="defines no draw"):
        fresh_items(surgeon.api.read("threshold_organism"), 8, 1)


def test_threshold_on_fresh_items_equals_hand_written_hooks(decimal_model):
    """The search on every item of the case and each best subset evaluated on fresh items from the case's draw
    (--eval-items N): the held-out rate equals the named subset patched with hand-written hooks on those items."""
    from surgeon.analyses.heldout import eval_items_of

    case = _case()
    r = surgeon.threshold(case, decimal_model, layer=0, budget=20, item_rate=0.9, eval_items=48)
    fresh, where = eval_items_of(case, 48, 0)
    traps = [it for it in fresh if it.tag == "trap"]
    assert "fresh items from the case's draw" in r.split.describe() and r.n_evaluation == len(traps) == 24
    assert r.n_discovery == len(case.items_for(case.focus))  # every case item searched, none held out of it
    row = r.row("all", 2)
    assert row.held_out.value == pytest.approx(hand_rate(case, decimal_model, traps, row.subset), abs=1e-6)


def test_eval_items_refused_before_the_model_loads(monkeypatch, tmp_path):

    import surgeon.models.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    monkeypatch.setattr(surgeon.api, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    for kwargs in (dict(eval_items="nope"), dict(eval_items=0)):
        with pytest.raises(surgeon.SurgeonError):
            surgeon.threshold("decimal_organism", layer=0, **kwargs)
    with pytest.raises(surgeon.CaseError, match="defines no draw"):
        surgeon.circuit("threshold_organism", eval_items=16)
    r = surgeon_cli(["threshold", "--layer", "0", "--holdout", "0.5",
                        "--eval-items", "16"])
    assert r.returncode == 2 and "--eval-items" in r.stderr and "Traceback" not in r.stderr


def test_folds_partition_the_items_and_each_held_out_rate_is_its_folds(decimal_model):
    """Issue 51, item 3: K seeded, tag-stratified folds cover every item once; each fold's best subset is evaluated on
    that fold alone (hand-written hooks on the fold's items give its rate; the other folds' items would not)."""
    from surgeon.analyses.heldout import fold_items, threshold_folds

    case = _case()
    items = case.items_for(case.focus)
    parts = fold_items(items, 4, seed=0)
    assert sorted(i for p in parts for i in p) == list(range(len(items))) and {len(p) for p in parts} == {16}
    assert fold_items(items, 4, seed=0) == parts and fold_items(items, 4, seed=1) != parts
    with pytest.raises(AnalysisError, match="at least 2 folds"):
        fold_items(items, 1)
    with pytest.raises(AnalysisError, match="needs at least"):
        fold_items(items[:10], 4)
    r = threshold_folds(case, decimal_model, folds=4, seed=0, layer=0, budget=20, item_rate=0.9)
    row = next(x for x in r.rows if x.family == "all" and x.k == 2)
    assert len(row.held_out) == 4 and sum(row.subsets.values()) == 4
    for f, part in enumerate(parts):  # each fold's best subset, patched by hand on that fold's items alone
        fold = [items[i] for i in part]
        assert row.held_out[f] == pytest.approx(hand_rate(case, decimal_model, fold, row.best[f]), abs=1e-6)
    # the mutation "evaluate on the fold's discovery items" gives other numbers
    outside = [[items[i] for i in range(len(items)) if i not in set(p)] for p in parts]
    assert any(hand_rate(case, decimal_model, outside[f], row.best[f]) != row.held_out[f] for f in range(4))
    assert len(r.k_star["all"]) == 4
    assert "cross-validated" in str(r) and "4/4" in str(r)


def test_circuit_folds_measure_each_circuit_on_its_own_fold(decimal_model):
    """Issue 51, item 3 for circuits: each fold's circuit is measured on that fold's items (the same edges on the
    fold's discovery items give another number: the mutation), and the selection frequencies count the folds."""
    from surgeon.analyses.circuit import evaluate_circuit
    from surgeon.analyses.heldout import circuit_folds, fold_items

    case = _case()
    items = case.items_for(case.focus)
    r = circuit_folds(case, decimal_model, folds=3, seed=0, n_paths=0, verify=10)
    parts = fold_items(items, 3, 0)
    assert r.fold_sizes == [len(p) for p in parts] and len(r.circuits) == 3
    assert all(1 <= n <= 3 for n in r.edges.values()) and sum(r.edges.values()) == sum(r.sizes)
    outside = []
    for f, part in enumerate(parts):
        on = dataclasses.replace(case, items=[items[i] for i in part], focus=None)
        off = dataclasses.replace(case, items=[items[i] for i in range(len(items)) if i not in set(part)], focus=None)
        assert evaluate_circuit(on, decimal_model, r.circuits[f])["faithfulness"] == pytest.approx(r.held_out[f],
                                                                                                   abs=1e-9)
        outside.append(evaluate_circuit(off, decimal_model, r.circuits[f])["faithfulness"])
    assert any(abs(o - h) > 1e-6 for o, h in zip(outside, r.held_out))
    assert "selection frequency" in str(r)


def _closed_form_shares(item_index, k_values):
    """Per k, the share of the C(16, k) subsets of even heads that repair every item in `item_index` (indices into
    the organism's `items_values()`), from the organism's closed form alone (no model, no engine)."""
    from itertools import combinations

    from surgeon.organisms import threshold as organism

    out, by_weight = {}, {}  # the closed form reads a subset through its even heads' summed weight alone
    for k in k_values:
        subsets = list(combinations(organism.EVEN, k))
        ok = 0
        for s in subsets:
            w = sum(organism.WEIGHTS[h] for h in s)
            if w not in by_weight:
                scores = organism.subset_scores(s)
                by_weight[w] = all(scores[i] > 0 for i in item_index)
            ok += by_weight[w]
        out[k] = ok / len(subsets)
    return out


def test_held_out_k_star_on_the_threshold_organism_is_what_its_construction_implies():
    """Discovery: the 8 items hardest to repair (one of them needs even weights summing to 69 of 136: k* = 9 by the
    closed form); evaluation: the 8 easiest (65 suffices: k* = 8). Every subset of the 16 even heads is evaluated,
    so the held-out shares are exact and must equal the closed form's on the evaluation items; an engine that
    measured k* on the discovery items (or copied the discovery shares) reports 9."""
    from surgeon.organisms import threshold as organism

    case, model = surgeon.api.case_and_model("threshold_organism")
    values = organism.items_values()
    g = dict(zip(organism.LETTERS, organism.GAIN))
    need = [organism.W_BAD * g[y] * organism.TOTAL / (g[x] + organism.W_BAD * g[y]) for x, y in values]
    order = sorted(range(len(values)), key=lambda i: need[i])
    easy, hard = order[:8], order[-8:]
    disc_case = dataclasses.replace(case, items=[case.items[i] for i in hard])
    r = threshold_heldout(disc_case, model, eval_items=[case.items[i] for i in easy], layer=0,
                          heads=",".join(map(str, organism.EVEN)), groups=[], budget=13000)
    t = r.threshold("all")
    expected_held = _closed_form_shares(easy, range(6, 11))
    expected_disc = _closed_form_shares(hard, range(6, 11))
    k_held = next(k for k in range(6, 11) if expected_held[k] >= 0.5)
    k_disc = next(k for k in range(6, 11) if expected_disc[k] >= 0.5)
    assert (k_disc, k_held) == (9, 8)  # the construction's two thresholds
    assert (t.discovery, t.held_out) == (k_disc, k_held)
    assert set(t.sizes) >= {k_held - 1, k_held, k_disc}  # k* - 1 and every size between the two k* evaluated
    for k, e in t.sizes.items():
        assert e.value == pytest.approx(expected_held[k], abs=1e-12) and e.lo == e.hi == e.value
        assert t.discovery_sizes[k].value == pytest.approx(expected_disc[k], abs=1e-12)
    assert "k* held out   8 · in-sample   9" in str(r)


def test_evaluation_items_that_repeat_a_discovery_prompt_are_left_out_and_said():
    """Items given for evaluation (a list, or another case file's) whose prompt is one of the case's items are not held
    out: they are dropped and the split says how many; the rest are evaluated."""
    from surgeon.analyses.heldout import eval_split

    case = surgeon.api.read("decimal_organism")
    given = list(case.items[:3]) + [dataclasses.replace(case.items[3], tag="other")] + list(case.draw(20, 9))
    split, disc, ev = eval_split(case, "all", None, 0, given)
    assert disc == list(case.items) and len(ev) == len(given) - 4
    assert split.evaluated_on == f"{len(given)} items given, 4 whose prompt is a discovery item's left out"
    assert not {tuple(sorted(it.values.items())) for it in ev} & {tuple(sorted(it.values.items())) for it in disc}
