"""Ablations and circuit semantics as the field defines them, checked against definitions written with plain
TransformerLens hooks (tests/reference.py `graph_forward`), never with surgeon's edge code:

- mean ablation: the sender's mean over *every* item at each aligned position (EAP-IG's `compute_mean_activations`
  with `per_position=True` over the whole dataset), so nothing depends on the batch size or bucket layout;
- a circuit is what is kept (MIB, ACDC, auto-circuit): on the source run, every edge outside it carries its
  ablation value, every edge inside its current output; `knockout` is the opposite reading, by name;
- resample ablates at the case's aligned positions (every position under align="index"); mean and zero at every
  position of the source run."""
import numpy as np
import pytest
import torch

from surgeon import Case, Item
from surgeon.analyses.circuit_runs import circuit_runs
from surgeon.analyses.common import make_contrast
from surgeon.sites.edges import EdgeSite
from surgeon.case.encoding import align
from surgeon.case.encoding import format_rows
from tests.reference import edge_name, graph_forward, row_score, sender_outputs

ITEMS = [Item({"a": a, "b": b}, correct=" x", incorrect=" y") for a, b in
         [("ab", "cd"), ("ef", "gh"), ("ij", "kl"), ("mno", "p"), ("q", "rst")]]
LAYOUTS = {"index": ("Q {a} {b}:", "P {a} {b}:"), "last": ("Q: {a} {b}?", "Answer {a} {b}:")}


def make_case(how: str, **kw) -> Case:
    bad, good = LAYOUTS[how]
    return Case(name=f"toy-{how}", formats={"bad": bad, "good": good}, good="good", bad="bad", items=ITEMS,
                align=how, **kw)


def hand_mean(model, rows, positions):
    """{sender: [P, d]} the sender's output averaged over items at each position index j of `positions` (each row's
    list of positions), each item's rows averaged first, only items having position j counted."""
    sums, counts = {}, {}
    by_item: dict[int, list] = {}
    for r, pos in zip(rows, positions):
        by_item.setdefault(r.item, []).append((r, pos))
    for item, rs in by_item.items():
        per_row = [(sender_outputs(model, torch.tensor(r.tokens)), pos) for r, pos in rs]
        n = max(len(p) for _, p in per_row)
        for j in range(n):
            have = [(o, p) for o, p in per_row if j < len(p)]
            for s in have[0][0]:
                v = sum(o[s][p[j]] for o, p in have) / len(have)
                sums.setdefault(s, {})
                sums[s][j] = sums[s].get(j, 0) + v.double()
            counts[j] = counts.get(j, 0) + 1
    return {s: {j: (v / counts[j]).float() for j, v in d.items()} for s, d in sums.items()}


# --------------------------------------------------------------------------------------------- mean ablation
@pytest.mark.slow
def test_mean_ablation_is_the_same_at_every_batch_size(decimal_model, decimal_case):
    """The decimal organism's formats differ in length, so its rows fall into several buckets; batch size 1 puts
    one row in each. The mean a bucket would give is resample at batch size 1: the scores and EAP must not move."""
    site = EdgeSite.of(decimal_model.cfg, "mean")
    E = len(site.edges)
    full, grads, buckets = [], [], []
    for bs in (256, 7, 1):
        c, _ = make_contrast(decimal_case, decimal_model, batch_size=bs, sites=site.node_sites())
        with torch.no_grad():
            full.append(c.run({site: torch.ones(1, E)})[0])
        g, _ = c.gradient({site.variant(difference="fixed"): torch.zeros(1, E)})
        grads.append(next(iter(g.values()))[0])
        buckets.append(len(c.buckets))
    assert buckets[0] < buckets[1] < buckets[2]
    for f, g in zip(full[1:], grads[1:]):
        torch.testing.assert_close(f, full[0], atol=1e-5, rtol=0)
        assert abs(float(f.mean()) - float(full[0].mean())) < 1e-6
        torch.testing.assert_close(g, grads[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("how", ["index", "last"])
@pytest.mark.parametrize("bs", [1, 256])
def test_mean_ablated_edges_carry_the_mean_over_every_item(random_model, how, bs):
    """Edges patched under mean ablation carry, at each aligned position, the sender's mean over all items of the
    source format at that aligned position: equal to that definition written with hooks, at any batch size."""
    case = make_case(how)
    site = EdgeSite.of(random_model.cfg, "mean")
    c, _ = make_contrast(case, random_model, batch_size=bs, sites=site.node_sites())
    rb, rs = format_rows(case, random_model, "bad", ITEMS), format_rows(case, random_model, "good", ITEMS)
    pairs = [align(b, s, how) for b, s in zip(rb, rs)]
    mean = hand_mean(random_model, rs, [ps for _, ps in pairs])
    gen = torch.Generator().manual_seed(1)
    chosen = set(torch.randperm(len(site.edges), generator=gen)[: len(site.edges) // 3].tolist())
    with torch.no_grad():
        got = c.run({site: site.mask([sorted(chosen)])})[0]
    cfg = random_model.cfg
    want = torch.zeros(len(ITEMS))
    for b, (pb, _) in zip(rb, pairs):
        def replace(s, r, cur, pb=pb):
            if site.index(edge_name(s, r, cfg)) not in chosen:
                return cur
            out = cur.clone()
            for j, p in enumerate(pb):
                out[p] = mean[s][j]
            return out
        with torch.no_grad():
            want[b.item] += row_score(graph_forward(random_model, torch.tensor(b.tokens), replace), b)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)


# --------------------------------------------------------------------------------------------- kept / knockout
def _hand_circuit(model, case, site, ablation, chosen, reading, direction="denoise"):
    """Item scores of the source run ('good' under denoise, 'bad' under noise) with the edges outside `chosen` (kept)
    or inside it (knockout) at their ablation value: the other run's sender output at the aligned positions
    (resample), or the mean over the source run's items / zero at every position (mean, zero); the other edges carry
    their current output."""
    cfg = model.cfg
    source, other = ("good", "bad") if direction == "denoise" else ("bad", "good")
    rb, rs = format_rows(case, model, other, ITEMS), format_rows(case, model, source, ITEMS)
    pairs = [align(b, s, case.align) for b, s in zip(rb, rs)]
    mean = hand_mean(model, rs, [list(range(len(s.tokens))) for s in rs]) if ablation == "mean" else None
    out = torch.zeros(len(ITEMS))
    for b, s, (pb, ps) in zip(rb, rs, pairs):
        base = sender_outputs(model, torch.tensor(b.tokens))

        def replace(snd, r, cur, pb=pb, ps=ps, base=base):
            inside = site.index(edge_name(snd, r, cfg)) in chosen
            if inside == (reading == "kept"):
                return cur
            if ablation == "zero":
                return torch.zeros_like(cur)
            new = cur.clone()
            if ablation == "mean":
                for p in range(cur.shape[0]):
                    new[p] = mean[snd][p]
            else:
                for p, q in zip(pb, ps):
                    new[q] = base[snd][p]
            return new

        with torch.no_grad():
            out[s.item] += row_score(graph_forward(model, torch.tensor(s.tokens), replace), s)
    return out


@pytest.mark.parametrize("ablation", ["resample", "mean", "zero"])
def test_each_direction_ablates_in_the_run_it_names(random_model, ablation):
    """`--direction noise` explains the failing format's run: its edges are ablated there (zero and mean act on the
    failing prompts; resample patches the good run's values in), and the result says so; `denoise` acts on the good
    format's prompts, as auto-circuit's zero ablation runs the clean ones. Written with hooks for both."""
    case = make_case("last")
    site = EdgeSite.of(random_model.cfg, ablation)
    gen = torch.Generator().manual_seed(3)
    chosen = sorted(torch.randperm(len(site.edges), generator=gen)[: 2 * len(site.edges) // 3].tolist())
    got = {}
    for direction in ("denoise", "noise"):
        runs = circuit_runs(case, random_model, site, direction=direction, batch_size=3)
        got[direction] = torch.tensor(runs.ablated([chosen])[0])
        want = _hand_circuit(random_model, case, site, ablation, set(chosen), "kept", direction)
        torch.testing.assert_close(got[direction], want, atol=2e-4, rtol=0)
        assert float(want.abs().max()) > 1e-3  # the circuit reaches the logits: the comparison can tell
        source = "good" if direction == "denoise" else "bad"
        assert runs.info["source"] == source and f"on the {source!r} items" in runs.describe()
    assert not torch.allclose(got["denoise"], got["noise"], atol=1e-3)


@pytest.mark.parametrize("ablation", ["resample", "mean", "zero"])
@pytest.mark.parametrize("how", ["index", "last"])
def test_circuits_are_kept_and_knockouts_are_removed_as_written_with_hooks(random_model, ablation, how):
    case = make_case(how)
    site = EdgeSite.of(random_model.cfg, ablation)
    gen = torch.Generator().manual_seed(2)
    chosen = sorted(torch.randperm(len(site.edges), generator=gen)[: len(site.edges) // 4].tolist())
    for reading in ("kept", "knockout"):
        runs = circuit_runs(case, random_model, site, semantics=reading, batch_size=3)
        got = torch.tensor(runs.ablated([chosen])[0])
        want = _hand_circuit(random_model, case, site, ablation, set(chosen), reading)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
        # the value each reading reports, from the same runs: kept = faithfulness, knockout = the share removed
        full, empty = float(runs.full.mean()), float(runs.empty.mean())
        v = runs.value([chosen])[0][0]
        if reading == "kept":
            assert abs(v - (float(want.mean()) - empty) / (full - empty)) < 1e-3
        else:
            assert abs(v - (full - float(want.mean())) / (full - empty)) < 1e-3
    # every edge kept is the source run; none kept is every edge ablated (for resample: the base run's scores)
    kept = circuit_runs(case, random_model, site, batch_size=3)
    all_edges = list(range(len(site.edges)))
    torch.testing.assert_close(torch.tensor(kept.ablated([all_edges])[0]), torch.tensor(kept.full), atol=2e-5, rtol=0)
    empty = _hand_circuit(random_model, case, site, ablation, set(), "kept")
    torch.testing.assert_close(torch.tensor(kept.empty), empty, atol=2e-4, rtol=0)
    if ablation == "resample":
        c, _ = make_contrast(case, random_model, sites=site.node_sites())
        torch.testing.assert_close(torch.tensor(kept.empty), c.clean_base, atol=2e-4, rtol=0)


def test_kept_circuit_under_resample_and_index_equals_the_chain_written_from_the_patched_run(induction_model):
    """MIB's circuit run from the other side: the base run with the circuit's input edges carrying the source
    embedding, its other edges passing current values and every edge outside frozen to the base run (what surgeon
    computed before 0.2, checked against auto-circuit) gives the same scores as the source run with every edge
    outside ablated."""
    from surgeon import load_case
    from surgeon.sites.ablations import FREEZE
    from tests.conftest import ROOT

    case = load_case(f"{ROOT}/cases/induction_organism.py")
    site = EdgeSite.of(induction_model.cfg)
    runs = circuit_runs(case, induction_model, site)
    gen = torch.Generator().manual_seed(3)
    sets = [sorted(torch.randperm(len(site.edges), generator=gen)[:k].tolist()) for k in (3, 9, 20)]
    inside = site.mask(sets)
    from_input = torch.tensor([site.senders[s].kind == "input" for s, _ in site.edges]).float()
    with torch.no_grad():
        chain = runs.scoring.run({site: inside * from_input, site.variant(ablation=FREEZE): 1 - inside})
    np.testing.assert_allclose(runs.ablated(sets), chain.numpy(), atol=2e-4)


def test_zero_ablated_circuit_keeps_what_a_knockout_removes(induction_model):
    """The two readings give different circuits on the induction organism under zero ablation: the smallest kept
    circuit needs the whole match-and-copy path and what feeds it, the smallest knockout needs one edge of it."""
    from surgeon import load_case
    from surgeon.analyses.circuit import discover
    from tests.conftest import ROOT

    case = load_case(f"{ROOT}/cases/induction_organism.py")
    kept = discover(case, induction_model, ablation="zero", n_paths=0, verify=0)
    ko = discover(case, induction_model, ablation="zero", semantics="knockout", n_paths=0, verify=0)
    assert kept.options["semantics"] == "kept" and ko.options["semantics"] == "knockout"
    assert kept.circuit_faithfulness >= 0.9 and ko.circuit_faithfulness >= 0.9
    assert len(ko.circuit) < len(kept.circuit)
    assert kept.curve[0] == pytest.approx(0.0, abs=1e-6) and kept.curve[-1] == pytest.approx(1.0, abs=1e-6)


# --------------------------------------------------------------------------------------------- a reference set
# mean ablation over the case's `reference` items (EAP-IG's reference dataset): shorter and longer than the analysed
REFERENCE = [Item({"a": a, "b": b}, correct=" x", incorrect=" y") for a, b in
             [("uvwx", "yz"), ("a", "b"), ("hijklm", "no"), ("c", "defg")]]


def _kept_under_mean(model, rows, site, chosen, mean):
    """Item scores of `rows` with every edge outside `chosen` carrying `mean[sender][position]` at every position,
    the edges inside their current output (the kept circuit under mean ablation, written with hooks)."""
    cfg = model.cfg
    out = torch.zeros(max(r.item for r in rows) + 1)
    for s in rows:
        def replace(snd, r, cur):
            if site.index(edge_name(snd, r, cfg)) in chosen:
                return cur
            new = cur.clone()
            for p in range(cur.shape[0]):
                new[p] = mean[snd][p]
            return new

        with torch.no_grad():
            out[s.item] += row_score(graph_forward(model, torch.tensor(s.tokens), replace), s)
    return out


def _hand_reference_circuit(model, case, site, chosen):
    """The kept circuit's item scores under mean ablation where the mean is over the reference items' rows (the
    source format) at each position, only the reference items that reach a position counted."""
    ref = format_rows(case, model, "good", REFERENCE)
    mean = hand_mean(model, ref, [list(range(len(r.tokens))) for r in ref])
    return _kept_under_mean(model, format_rows(case, model, "good", ITEMS), site, chosen, mean)


@pytest.mark.parametrize("how", ["index", "last"])
def test_mean_ablation_over_a_reference_set_is_its_per_position_mean(random_model, how):
    from dataclasses import replace

    from surgeon.models.checks import check_case_against_model

    case = make_case(how, reference=REFERENCE)
    check_case_against_model(case, random_model)  # the longest reference row covers every analysed position
    lengths = [len(r.tokens) for r in format_rows(case, random_model, "good", REFERENCE)]
    top = max(len(r.tokens) for r in format_rows(case, random_model, "good", ITEMS))
    assert min(lengths) < top < max(lengths)  # shorter and longer than the analysed rows
    site = EdgeSite.of(random_model.cfg, "mean")
    gen = torch.Generator().manual_seed(4)
    chosen = sorted(torch.randperm(len(site.edges), generator=gen)[: len(site.edges) // 4].tolist())
    runs = circuit_runs(case, random_model, site, batch_size=2)
    got = torch.tensor(runs.ablated([chosen])[0])
    want = _hand_reference_circuit(random_model, case, site, set(chosen))
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
    own = circuit_runs(replace(case, reference=None), random_model, site, batch_size=2)
    assert float((torch.tensor(own.ablated([chosen])[0]) - got).abs().max()) > 1e-2  # the reference is what is used


def test_a_reference_set_that_does_not_reach_every_position_is_refused(random_model):
    from surgeon import CaseError
    from surgeon.models.checks import check_case_against_model

    short = [Item({"a": "a", "b": "b"}, correct=" x", incorrect=" y")]
    case = make_case("last", reference=short)
    with pytest.raises(CaseError) as e:
        check_case_against_model(case, random_model)
    assert e.value.field == "reference" and "no mean at the last" in str(e.value) and e.value.fix


# items of different lengths: a later position is reached by fewer items, and its mean is over those alone
RAGGED = [Item({"a": a, "b": b}, correct=" x", incorrect=" y") for a, b in
          [("ab", "cd"), ("efgh", "ij"), ("k", "l"), ("mnopqr", "st"), ("uv", "wxyz")]]


def test_mean_ablation_over_ragged_items_counts_only_the_items_that_reach_a_position(random_model):
    """EAP-IG's per-position mean over items of different lengths: at each position, the mean over the items whose
    rows reach it. Dividing by every item instead (a zero for each item too short) gives other scores: checked."""
    case = Case(name="toy-ragged", formats={"bad": "Q {a} {b}:", "good": "P {a} {b}:"}, good="good", bad="bad",
                items=RAGGED, align="index")
    site = EdgeSite.of(random_model.cfg, "mean")
    rs = format_rows(case, random_model, "good", RAGGED)
    assert len({len(r.tokens) for r in rs}) > 2
    gen = torch.Generator().manual_seed(5)
    chosen = set(torch.randperm(len(site.edges), generator=gen)[: len(site.edges) // 4].tolist())
    got = torch.tensor(circuit_runs(case, random_model, site, batch_size=2).ablated([sorted(chosen)])[0])
    right = hand_mean(random_model, rs, [list(range(len(r.tokens))) for r in rs])
    reach = {j: sum(len(r.tokens) > j for r in rs) for j in range(max(len(r.tokens) for r in rs))}
    wrong = {s: {j: v * reach[j] / len(rs) for j, v in d.items()} for s, d in right.items()}  # divided by every item
    torch.testing.assert_close(got, _kept_under_mean(random_model, rs, site, chosen, right), atol=2e-4, rtol=0)
    told_apart = _kept_under_mean(random_model, rs, site, chosen, wrong) - got
    assert float(told_apart.abs().max()) > 1e-2  # the test tells the two conventions apart
