"""Head-subset search and blends on the decimal organism, cross-checked against direct hooked forwards."""
import copy
import dataclasses
import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from surgeon.analyses.blend import blend
from surgeon.errors import AnalysisError
from surgeon.search.subsets import Unit, make_groups, make_plan, parse_units
from surgeon.analyses.threshold import threshold_search
from surgeon.search.shards import collect, merge
from surgeon.sites.nodes import Site
from surgeon.case.encoding import format_rows
from tests.conftest import ROOT
from tests.reference import direct_patch_scores
from tests.cli_in_process import surgeon as surgeon_cli


@pytest.fixture(scope="module")
def small_case(decimal_case):
    return replace(decimal_case, items=decimal_case.items_for("trap")[:12], focus=None)


def direct_rate(model, case, heads_by_layer):
    """Item repair rate of one subset by one hooked forward per row (layers patched one hook each)."""
    bad = format_rows(case, model, "qa", case.items)
    good = format_rows(case, model, "plain", case.items)
    assert len(heads_by_layer) == 1  # the reference patches one site
    (L, heads), = heads_by_layer.items()
    mask = torch.zeros(8)
    mask[heads] = 1
    scores = direct_patch_scores(model, bad, good, "last", Site.of("z", L), mask)
    return float((scores > 0).float().mean()), scores


def test_plan_enumerates_or_samples_and_says_so():
    units = [Unit(1, h) for h in range(8)]
    plan = make_plan(units, make_groups(units, ["even", "odd"]), budget=30)
    sizes = {(f.name, f.key[0]): f for f in plan.families}
    assert sizes[("all", 4)].total == 70 and not sizes[("all", 4)].enumerated and len(sizes[("all", 4)].masks) == 30
    assert sizes[("all", 2)].enumerated and len(set(sizes[("all", 2)].masks)) == 28
    assert sizes[("even", 2)].total == math.comb(4, 2) and sizes[("even", 2)].enumerated
    assert all(bin(m).count("1") == 4 for m in sizes[("all", 4)].masks)
    # deterministic in the seed
    assert make_plan(units, {}, budget=30).unique == make_plan(units, {}, budget=30).unique
    assert make_plan(units, {}, budget=30, seed=1).unique != make_plan(units, {}, budget=30).unique


def test_parse_units_and_groups_errors():
    assert parse_units("L1H0,2.3", None, 3, 8) == [Unit(1, 0), Unit(2, 3)]
    assert parse_units("0,2", 1, 3, 8) == [Unit(1, 0), Unit(1, 2)]
    with pytest.raises(AnalysisError, match="out of range"):
        parse_units("L5H0", None, 3, 8)
    with pytest.raises(AnalysisError, match="unknown group"):
        make_groups([Unit(0, 0)], ["thirds"])
    with pytest.raises(AnalysisError, match="not a candidate head"):
        make_groups([Unit(0, 0)], [], {"g": ["L3H3"]})


@pytest.mark.slow
def test_search_rates_equal_direct_forwards(decimal_model, small_case, tmp_path):
    r = threshold_search(small_case, decimal_model, layer=1, groups=["even", "odd"], item_rate=0.5, out=tmp_path,
                         chunk=64)
    assert r.complete and r.subsets_evaluated == 256
    assert r.size("all", 8).evaluated == 1 and r.size("even", 2).total == 6
    # a few subsets' repair rates and mean scores from the search equal one hooked forward per row
    from surgeon.search.subsets import per_subset as _per_subset

    per = _per_subset(tmp_path)
    for heads in ([0], [2, 4], [0, 2, 4, 6], list(range(8))):
        m = sum(1 << h for h in heads)
        rate, scores = direct_rate(decimal_model, small_case, {1: heads})
        assert per[m][0] == pytest.approx(rate, abs=1e-6), heads
        assert per[m][1] == pytest.approx(float(scores.mean()), abs=1e-4), heads
    # family fractions are counts of repairing subsets among C(n, k)
    for fam, k in (("all", 4), ("even", 2), ("odd", 3)):
        row = r.size(fam, k)
        pool = range(8) if fam == "all" else [h for h in range(8) if h % 2 == (0 if fam == "even" else 1)]
        want = np.mean([per[sum(1 << h for h in c)][0] >= 0.5 for c in __import__("itertools").combinations(pool, k)])
        assert row.fraction == pytest.approx(want) and row.lo == row.hi == row.fraction
    # minimal repairing subsets: each repairs, and no proper subset of it does
    labels = r.units
    for m in r.minimal:
        bits = sum(1 << labels.index(u) for u in m)
        assert per[bits][0] >= 0.5
        sub = bits
        while sub:
            sub = (sub - 1) & bits
            if sub != bits and sub in per:
                assert per[sub][0] < 0.5
    # necessity: rate with + without a head are computed over all evaluated subsets
    u0 = r.unit_stats[0]
    with_0 = [v[0] >= 0.5 for k_, v in per.items() if k_ & 1]
    assert u0.rate_with == pytest.approx(np.mean(with_0))


def test_threshold_is_monotone_in_k_for_all_heads(decimal_model, small_case):
    r = threshold_search(small_case, decimal_model, layer=1, groups=[], item_rate=0.5)
    rows = [r.size("all", k) for k in range(9)]
    assert all(row.enumerated for row in rows)  # every subset of 8 heads evaluated: these are exact means
    rates = np.array([row.mean_item_rate for row in rows])
    frac = np.array([row.mean_repair_fraction for row in rows])
    assert rates[0] == 0.0 and rates[-1] > rates[1]
    assert (np.diff(rates) >= 0).all(), rates  # monotone at every k, not only between the ends
    assert (np.diff(frac) > 0).all(), frac
    t = r.threshold("all")
    if t.k_star is not None:
        assert r.size("all", t.k_star).fraction >= 0.5


@pytest.mark.slow
def test_shards_merge_into_the_single_run_result(decimal_model, small_case, tmp_path):
    kw = dict(layer=1, groups=["even", "odd"], grid=("even", "odd"), grid_budget=10, item_rate=0.5, chunk=40)
    single = threshold_search(small_case, decimal_model, out=tmp_path / "single", **kw)
    for i in range(3):
        assert threshold_search(small_case, decimal_model, out=tmp_path / f"s{i}", shard=f"{i}/3", **kw) is None
    merged = merge([tmp_path / f"s{i}" for i in range(3)], tmp_path / "merged")
    assert merged.complete
    a, b = single.__dict__.copy(), merged.__dict__.copy()
    # how this process ran its chunks is recorded; a merge of other processes' chunks ran none here
    assert a.pop("execution")["paths"] and b.pop("execution") == {}
    assert json.dumps(a, default=str, sort_keys=True) == json.dumps(b, default=str, sort_keys=True)
    # a partial shard alone is reported as partial
    part = collect(tmp_path / "s0")
    assert not part.complete and part.chunks_done < part.chunks_total


def test_resume_continues_and_refuses_a_different_plan(decimal_model, small_case, tmp_path):
    out = tmp_path / "run"
    first = threshold_search(small_case, decimal_model, layer=1, groups=[], item_rate=0.5, out=out, chunk=50,
                             shard="0/2")  # half the chunks, as if stopped
    assert first is None
    done = len(list((out / "parts").glob("chunk-*.npz")))
    r = threshold_search(small_case, decimal_model, layer=1, groups=[], item_rate=0.5, out=out, chunk=50)
    assert r.complete and len(list((out / "parts").glob("chunk-*.npz"))) > done
    with pytest.raises(AnalysisError, match="different search"):
        threshold_search(small_case, decimal_model, layer=2, groups=[], out=out, chunk=50)


@pytest.mark.slow
def test_blend_curve_and_switch_points(decimal_model, small_case):
    r = blend(small_case, decimal_model, layer=0, component="mlp_out", step=0.05)
    assert r.alphas[0] == 0 and r.alphas[-1] == pytest.approx(1.0)
    assert r.rate[0] == 0.0  # the failing format fails at a = 0
    # each finite switching point lies where that item's score changes sign (checked with a direct run)
    bad = format_rows(small_case, decimal_model, "qa", small_case.items)
    good = format_rows(small_case, decimal_model, "plain", small_case.items)
    site = Site.of("mlp_out", 0)
    for i in np.nonzero(np.isfinite(r.switch) & (r.crossings == 1))[0][:3]:
        a = float(r.switch[i])
        below = direct_patch_scores(decimal_model, bad, good, "last", site, torch.tensor([max(0.0, a - 0.05)]))[i]
        above = direct_patch_scores(decimal_model, bad, good, "last", site, torch.tensor([min(1.0, a + 0.05)]))[i]
        assert below <= 0 < above


@pytest.mark.slow
def test_cli_threshold_writes_outputs_and_blend(tmp_path):
    case = f"{ROOT}/cases/decimal_organism.py"
    out = tmp_path / "th"
    r = surgeon_cli(["threshold", case, "--layer", "2", "--budget", "20",
                        "--item-rate", "0.5", "--out", str(out)], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "threshold" in r.stdout and (out / "subsets.csv").exists() and (out / "threshold.png").exists()
    rows = (out / "subsets.csv").read_text().splitlines()
    assert rows[0].startswith("subset,size,families") and len(rows) > 20
    again = surgeon_cli(["threshold", case, "--layer", "2", "--out", str(out)], cwd=ROOT)
    assert again.returncode == 2 and "--resume" in again.stderr
    b = surgeon_cli(["blend", case, "--layer", "0", "--component", "mlp_out",
                        "--out", str(tmp_path / "bl")], cwd=ROOT)
    assert b.returncode == 0, b.stderr
    assert "switching point" in b.stdout and (tmp_path / "bl" / "blend.png").exists()


@pytest.mark.slow
def test_ctrl_c_leaves_valid_partial_results_and_resume_finishes(tmp_path):
    """SIGINT in the middle of a search: exit 130, finished chunks kept, results.json marked partial;
    --resume completes it."""
    import signal
    import time

    case = f"{ROOT}/cases/decimal_organism.py"
    out = tmp_path / "th"
    args = [sys.executable, "-m", "surgeon", "threshold", case, "--heads", "L0H0,L0H1,L0H2,L0H3,L1H0,L1H1,L1H2,L1H3",
            "--groups", "none", "--chunk", "2", "--threads", "1", "--out", str(out)]
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "parts").glob("chunk-*.npz"))) < 3:
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, stderr
    assert "partial" in stderr.lower() or "interrupted" in stderr.lower()
    res = json.loads((out / "results.json").read_text())["result"]
    # 128 chunks of 2: after the third, the signal has ample time to land before the last (a loaded machine too)
    assert res["complete"] is False and 3 <= res["chunks_done"] < res["chunks_total"] == 128
    assert "PARTIAL" in stdout
    r = subprocess.run(args + ["--resume"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())["result"]
    assert res["complete"] is True and res["subsets_evaluated"] == 256


def test_mixed_grid_cells_hold_i_from_a_and_j_from_b():
    units = [Unit(1, h) for h in range(8)]
    groups = make_groups(units, ["even", "odd"])
    plan = make_plan(units, groups, grid=("even", "odd"), grid_budget=10)
    cells = [f for f in plan.families if f.name == "even x odd"]
    assert len(cells) == 25
    for f in cells:
        i, j = f.key
        assert f.total == math.comb(4, i) * math.comb(4, j)
        assert len(f.masks) == min(10, f.total) and len(set(f.masks)) == len(f.masks)
        assert f.enumerated == (f.total <= 10)
        for m in f.masks:
            assert sum((m >> h) & 1 for h in groups["even"]) == i
            assert sum((m >> h) & 1 for h in groups["odd"]) == j


def test_merge_checks_everything_before_writing(decimal_model, small_case, tmp_path):
    """Reliability, family 7: a shard with a truncated chunk, shards of different plans, an --out that is a file
    or holds another search: refused before anything is copied; a corrupt plan.json is refused on --resume."""
    from surgeon.errors import SurgeonError

    kw = dict(layer=1, groups=["even"], item_rate=0.5, chunk=40)
    for i in range(2):
        threshold_search(small_case, decimal_model, out=tmp_path / f"s{i}", shard=f"{i}/2", **kw)
    other = tmp_path / "other"
    threshold_search(small_case, decimal_model, out=other, **dict(kw, item_rate=0.9, chunk=20))
    shards = [tmp_path / "s0", tmp_path / "s1"]
    with pytest.raises(SurgeonError, match="was planned differently"):
        merge([*shards, other], tmp_path / "m1")
    assert not (tmp_path / "m1").exists()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SurgeonError, match="exists and is a file"):
        merge(shards, tmp_path / "afile")
    with pytest.raises(SurgeonError, match="holds parts of a different search"):
        merge(shards, other)
    victim = sorted((tmp_path / "s1" / "parts").glob("chunk-*.npz"))[0]
    victim.write_bytes(victim.read_bytes()[:40])
    with pytest.raises(SurgeonError, match=f"the chunk {victim} cannot be read.*cut short"):
        merge(shards, tmp_path / "m2")
    assert not (tmp_path / "m2").exists()
    (tmp_path / "s0" / "parts" / "plan.json").write_text('{"digest": ')
    with pytest.raises(SurgeonError, match="plan.json cannot be read"):
        threshold_search(small_case, decimal_model, out=tmp_path / "s0", shard="0/2", **kw)


def test_the_random_group_is_a_seeded_half():
    from surgeon.search.subsets import make_groups, parse_units

    units = parse_units(None, 10, 32, 32)
    a, b = make_groups(units, ["random", "even"], seed=0), make_groups(units, ["random"], seed=1)
    assert len(a["random"]) == len(a["even"]) == 16 and len(set(a["random"])) == 16
    assert a["random"] == make_groups(units, ["random"], seed=0)["random"] != b["random"]
    assert a["random"] != a["even"] and set(a["random"]) <= set(range(32))


def _rates(r):
    return [(row.family, row.key, row.fraction) for row in r.sizes]


def test_a_saved_search_is_never_reused_for_other_inputs(decimal_model, small_case, tmp_path):
    """Issue 69: the chunk store was keyed by the plan, the chunk size and the metric only, so a qa search's folder
    answered a chat search (or an edited template) with qa's numbers. Now every input that changes a number keys it:
    another failing format, another template or another model is refused naming what differs; another aggregation
    (x, item rate) over the same chunks is recomputed, not read from the folder."""
    out = tmp_path / "run"
    opts = dict(layer=0, groups=[], out=out, chunk=50, item_rate=0.5)
    qa = threshold_search(small_case, decimal_model, bad="qa", **opts)
    chat_fresh = threshold_search(small_case, decimal_model, bad="chat", layer=0, groups=[], chunk=50, item_rate=0.5)
    assert _rates(chat_fresh) != _rates(qa)  # the two runs differ: a reused folder would be visible
    with pytest.raises(AnalysisError, match=r"base 'qa' there, 'chat' here"):
        threshold_search(small_case, decimal_model, bad="chat", **opts)
    edited = dataclasses.replace(small_case, formats={**small_case.formats,
                                                      "qa": small_case.formats["qa"].replace("Q:", "Q :")})
    with pytest.raises(AnalysisError, match="case_content_sha256 differs"):
        threshold_search(edited, decimal_model, bad="qa", **opts)
    other = copy.deepcopy(decimal_model)
    with torch.no_grad():
        other.blocks[2].mlp.W_out.mul_(1.01)
    with pytest.raises(AnalysisError, match="model_sha256 differs"):
        threshold_search(small_case, other, bad="qa", **opts)
    again = threshold_search(small_case, decimal_model, bad="qa", **opts)  # the same inputs: resumed, same numbers
    assert _rates(again) == _rates(qa)
    looser = threshold_search(small_case, decimal_model, bad="qa", **{**opts, "x": 0.9, "item_rate": 0.25})
    fresh = threshold_search(small_case, decimal_model, bad="qa", layer=0, groups=[], chunk=50, x=0.9, item_rate=0.25)
    assert looser.x == 0.9 and _rates(looser) == _rates(fresh) and looser.thresholds == fresh.thresholds
    assert _rates(looser) != _rates(again)  # the aggregation changed what repairs


def test_resume_in_another_searchs_folder_is_refused_on_the_cli(tmp_path):
    out = tmp_path / "th"
    args = [sys.executable, "-m", "surgeon", "threshold", "decimal_organism", "--heads", "L0H4,L0H6,L1H5",
            "--groups", "none", "--out", str(out)]
    first = subprocess.run(args + ["--bad", "qa"], capture_output=True, text=True, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    other = subprocess.run(args + ["--bad", "chat", "--resume"], capture_output=True, text=True, cwd=ROOT)
    assert other.returncode == 2 and "base 'qa' there, 'chat' here" in other.stderr, other.stderr
    assert "Traceback" not in other.stderr
