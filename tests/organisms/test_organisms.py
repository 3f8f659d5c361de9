"""Each organism's planted mechanism, measured on the shipped weights and asserted (a retrain or a refactor
that loses it fails here); the training code still trains; the built organism rebuilds exactly."""
import json
import math

import pytest
import torch

from surgeon import load_case, organisms
from surgeon.organisms import decimal, induction, measure, threshold
from tests.conftest import ROOT
from tests.cli_in_process import surgeon as surgeon_cli


def recorded(name):
    return json.loads((organisms.weights_dir(name) / "config.json").read_text())


def test_decimal_fails_by_design(decimal_model):
    """Held-out pairs (n=128 per tag): traps right in plain, wrong in qa and chat, controls right everywhere;
    no position shortcut: the layer-0 residual stream alone, patched from plain at the aligned positions,
    repairs <= 10% of traps (align last and decision). The recorded numbers are what the shipped weights do."""
    f = measure.decimal.measure(decimal_model)
    assert decimal.check(f) == [], f
    assert f["plain/trap"] == 1.0 and f["qa/trap"] <= 0.05 and f["chat/trap"] <= 0.05
    assert min(f["plain/control"], f["qa/control"], f["chat/control"]) >= 0.95
    assert max(f[f"{b}/trap resid_pre0 patched ({a})"] for b in ("qa", "chat") for a in ("last", "decision")) <= 0.1
    cfg = decimal_model.cfg  # Llama-style: the real case's code paths
    assert cfg.positional_embedding_type == "rotary" and cfg.normalization_type == "RMS"
    assert cfg.n_key_value_heads == 2 < cfg.n_heads and cfg.gated_mlp
    rec = recorded("decimal")["measured"]
    assert {k: round(v, 4) for k, v in rec.items()} == {k: round(v, 4) for k, v in f.items()}


def test_induction_is_match_and_copy(induction_model):
    """A previous-token head (mean attention to p-1 >= 0.9), an induction head (attention to the token after
    the first occurrence >= 0.8), loss on the repeat <= 0.1 nats at every trained period and 0-8 filler
    tokens, and the loss collapses without the previous-token head."""
    f = measure.induction.measure(induction_model, n=16, seed=99)  # fresh held-out sequences, not the recorded ones
    assert induction.check(f) == [], f
    assert f["previous_token_attention"] >= 0.9 and f["induction_attention"] >= 0.8
    assert all(v <= 0.1 for v in f["repeat_loss_by_period"].values())
    assert all(v <= 0.1 for v in f["repeat_loss_by_gap"].values())
    assert f["repeat_loss_with_previous_token_head_zeroed"] > 1.0
    rec = recorded("induction")["measured"]
    assert rec["previous_token_head"] == f["previous_token_head"] and rec["induction_head"] == f["induction_head"]


def test_induction_case_names_the_measured_heads():
    case = load_case(f"{ROOT}/cases/induction_organism.py")
    gt = case.notes["ground_truth"]
    f = organisms.facts("induction")
    prev = "a{}.h{}".format(*f["previous_token_head"])
    ind = "a{}.h{}".format(*f["induction_head"])
    assert gt["path"] == ["input", prev, f"{ind}<k>", "logits"]


def test_induction_case_fresh_is_a_real_contrast(induction_model):
    """`repeat` is answered right, `fresh` (one token replaced) is not."""
    from surgeon.analyses import diagnose

    d = diagnose(load_case(f"{ROOT}/cases/induction_organism.py"), induction_model)
    assert d.get("repeat").accuracy.value >= 0.95
    assert d.get("fresh").accuracy.value <= 0.7 and d.reproduced["fresh"]


@pytest.mark.slow
def test_threshold_organism_measured(threshold_model):
    """The built weights do what the closed form says: measured with plain TransformerLens hooks (no engine) on
    46 patches, scores equal the formula to 1e-3 with no sign flip."""
    f = measure.threshold.measure(threshold_model)
    assert threshold.check(f) == [], f
    assert f["closed_form_max_error"] < 1e-3 and f["closed_form_sign_flips"] == 0
    assert f["odd_head_delta_min"] > 0.5 and f["even_attention_to_x_plain"] > 0.999
    # the weights are distinct and the rule is about them, not about counts: some 5 heads repair, some 11 do not
    assert sorted(threshold.WEIGHTS.values()) == list(range(1, 17))
    heavy = sorted(threshold.EVEN, key=threshold.WEIGHTS.get)[-5:]
    light = sorted(threshold.EVEN, key=threshold.WEIGHTS.get)[:11]
    assert threshold.item_rate(heavy) == 1.0 and threshold.item_rate(light) < 1.0
    assert min(measure.threshold.hooked_scores(threshold_model, heavy)) > 0 > min(measure.threshold.hooked_scores(threshold_model, light))


def test_threshold_organism_rebuilds_exactly(tmp_path):
    from safetensors.torch import load_file

    d = organisms.train_organism("threshold", out_root=tmp_path, progress=False)
    a = load_file(str(d / "model.safetensors"))
    b = load_file(str(organisms.weights_dir("threshold") / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_chain_organism_measured_and_rebuilt_with_its_saes(tmp_path):
    """The chain organism's built weights do what its closed form says, measured with plain TransformerLens hooks (no
    engine): plain right and qa wrong on every item, scores equal to the formula, its planted SAEs reconstruct exactly,
    and d B / d A is G1 on the diagonal and 0 off it. Rebuilt, the weights and the shipped SAEs come out identical, and
    the shipped SAEs load through sae-lens as the case names them."""
    from safetensors.torch import load_file

    from surgeon.organisms import chain, sae_dir
    from surgeon.sae.load import SAESource, load_sae

    model = organisms.load_organism("chain")
    f = measure.chain.measure(model)
    assert chain.check(f) == [], f
    assert f["accuracy"] == {"plain": 1.0, "qa": 0.0} and f["closed_form_max_error"] < 1e-5
    assert f["jacobian_max_error"] < 1e-5 and f["c_to_d"] == pytest.approx(1.0)
    assert sum(chain.planted_edges().values()) == pytest.approx(1.0)  # the planted edges carry the whole gap
    d = organisms.train_organism("chain", out_root=tmp_path / "weights", progress=False)
    a = load_file(str(d / "model.safetensors"))
    b = load_file(str(organisms.weights_dir("chain") / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for layer, hook in enumerate(chain.HOOKS):
        built = load_file(str(tmp_path / "saes" / "chain" / hook / "sae_weights.safetensors"))
        shipped = load_file(str(sae_dir("chain") / hook / "sae_weights.safetensors"))
        assert built.keys() == shipped.keys() and all(torch.equal(built[k], shipped[k]) for k in built)
        sae = load_sae(SAESource(path=str(sae_dir("chain") / hook)), layer)
        assert sae.cfg.metadata.hook_name == hook and int(sae.cfg.d_sae) == len(chain.feature_names(layer))


def closed_form_mismatches(per: dict, units, relabel=None) -> int:
    """Evaluated subsets whose measured item rate differs from the closed form's (optionally with the heads
    relabelled, as an engine that permuted head indices would)."""
    relabel = relabel or {}
    bad = 0
    for mask, (rate, *_rest) in per.items():
        heads = [relabel.get(u.head, u.head) for i, u in enumerate(units) if mask >> i & 1]
        bad += abs(rate - threshold.item_rate(heads)) > 1e-9
    return bad


@pytest.mark.slow
def test_threshold_search_recovers_the_planted_table_subset_by_subset(threshold_model, tmp_path):
    """The search over the even and the odd heads (every subset of a size enumerated where C(16, k) <= 300,
    sampled otherwise) and over all 32 heads: every evaluated subset's item rate equals the closed form
    derived from the weights alone, and the per-size fractions of enumerated sizes equal the planted table.
    The comparison is not blind to which head is which: the same results with two heads' labels swapped
    disagree with the closed form."""
    from surgeon.search.subsets import per_subset, plan_from_options
    from surgeon.analyses.threshold import threshold_search

    case = load_case(f"{ROOT}/cases/threshold_organism.py")
    planted = case.notes["planted"]
    assert planted == threshold.planted() == recorded("threshold")["ground_truth"]["planted"]
    r = threshold_search(case, threshold_model, layer=0, groups=["even", "odd"], budget=300, out=tmp_path,
                         batch_size=8192, chunk=4096)
    for fam in ("even", "odd"):
        for k in range(17):
            row = r.size(fam, k)
            assert row.enumerated == (math.comb(16, k) <= 300)
            if row.enumerated:
                assert row.fraction == planted["repairing"][fam][str(k)], (fam, k)
    assert r.threshold("odd").k_star is None
    plan = plan_from_options(r.options)
    per = per_subset(tmp_path)
    assert len(per) > 5000 and closed_form_mismatches(per, plan.units) == 0
    # a permuted engine fails this check: swap the labels of the heaviest and the lightest even head
    heavy, light = max(threshold.EVEN, key=threshold.WEIGHTS.get), min(threshold.EVEN, key=threshold.WEIGHTS.get)
    assert closed_form_mismatches(per, plan.units, {heavy: light, light: heavy}) > 100
    # and a sampled size's fraction lies in its interval around the planted value
    row = r.size("even", 8)
    assert not row.enumerated and row.lo <= planted["repairing"]["even"]["8"] <= row.hi


def test_shipped_weights_are_small_safetensors():
    total = 0
    for name in organisms.names():
        d = organisms.weights_dir(name)
        assert (d / "model.safetensors").exists() and (d / "tokenizer.json").exists()
        meta = json.loads((d / "config.json").read_text())
        assert meta["shrunk"] is False and "measured" in meta
        assert meta["targets_met"] == (organisms.spec(name).module.check(meta["measured"]) == [])
        total += (d / "model.safetensors").stat().st_size
    assert total < 5 * 2**20


def test_organisms_list_and_describe():
    r = surgeon_cli(["organisms", "list"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("organism") and "measured" in lines[0]
    for name in organisms.names():
        assert any(line.startswith(f"organism:{name}") for line in lines)
    assert "previous-token head" in r.stdout and "layer-0 residual stream" in r.stdout
    assert "repairs iff its even weights sum to >= 69 of 136 (k=5 at the least, any 12 always)" in r.stdout
    r = surgeon_cli(["organisms", "describe", "induction"])
    assert r.returncode == 0 and "ground truth" in r.stdout and "<k>" in r.stdout
    r = surgeon_cli(["organisms", "describe", "nope"])
    assert r.returncode == 2 and "unknown organism" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", ["decimal", "induction"])
def test_training_is_alive_and_deterministic(tmp_path, name):
    """A shrunken training run: loss goes down, weights save and load, and the run reproduces (to float rounding)."""
    from dataclasses import replace

    from surgeon.organisms.training import train

    s = organisms.spec(name)
    cfg = replace(s.train, **s.shrink)
    losses = train(organisms.build(name), s.texts, replace(cfg, steps=40), progress=False)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    a = organisms.train_organism(name, out_root=tmp_path / "a", shrink=True, progress=False)
    b = organisms.train_organism(name, out_root=tmp_path / "b", shrink=True, progress=False)
    ma = organisms.load_organism(name, root=a.parent)
    mb = organisms.load_organism(name, root=b.parent)
    # same function (weights agree to float rounding; Adam turns rounding noise in zero-gradient
    # parameters such as key biases into tiny steps, so compare what the models compute)
    tokens = torch.randint(4, ma.cfg.d_vocab, (4, 20))
    with torch.no_grad():
        torch.testing.assert_close(ma(tokens), mb(tokens), atol=1e-4, rtol=0)
    assert [k for k in ma.state_dict()] == [k for k in mb.state_dict()]


def test_decimal_items_of_one_tag_only():
    """held_out_items with no controls (or no traps) gives the other tag alone; it raised for a count of 0."""
    from surgeon.organisms import decimal

    traps = decimal.held_out_items(8, 0, seed=3)
    assert len(traps) == 8 and {it.tag for it in traps} == {"trap"}
    assert {it.tag for it in decimal.held_out_items(0, 6, seed=3)} == {"control"}
    assert decimal.pairs("trap", "test", 0) == []


def test_decimal_draws_refuse_more_pairs_than_a_split_holds_without_trying_for_minutes():
    """`--eval-items 100000` on the decimal case asks for 50,000 trap pairs of the test split, which holds about
    3,300: refused once the split stops giving new pairs (it tried 200 x n draws before), and every draw that can
    be met is the one the plain loop, written here, gives."""
    import random

    from surgeon.organisms import decimal as D

    def plain(kind, split, n, seed):
        rng, out = random.Random(f"decimal-{kind}-{split}-{seed}"), {}
        while len(out) < n:
            p = D.sample_pair(rng, kind)
            if p.split == split:
                out.setdefault((p.a, p.b), p)
        return list(out.values())

    with pytest.raises(ValueError, match=r"could not draw 50000 distinct trap pairs from the test split \(it holds"):
        D.pairs("trap", "test", 50000)
    for kind, split, n in (("trap", "test", 3000), ("same_int", "train", 700), ("diff_int", "test", 400)):
        assert D.pairs(kind, split, n, seed=5) == plain(kind, split, n, 5)
