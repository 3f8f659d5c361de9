"""SAE analysis: metrics on hand-built sets, feature patching on the core, loading paths, quality, and the
organisms' shipped SAEs."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def threshold_case():
    from surgeon import load_case

    return load_case(os.path.join(ROOT, "cases", "threshold_organism.py"))


def shipped(name, layer):
    from surgeon.organisms import sae_dir
    from surgeon.sae.load import SAESource, load_sae

    hook = {"decimal": "mlp_out", "threshold": "attn_out", "chain": "mlp_out"}[name]
    return load_sae(SAESource(path=str(sae_dir(name)) + "/blocks.{layer}.hook_" + hook), layer)


# ----------------------------------------------------------------------------- metrics on hand-built sets
def test_overlap_metrics_on_hand_built_sets():
    from surgeon.analyses.sae_features import overlap_metrics

    a = torch.tensor([[3.0, 2.0, 1.0, 0.0, 0.0],   # top-2 {0, 1}
                      [1.0, 0.0, 0.0, 0.0, 0.0],   # one active feature
                      [0.0, 0.0, 0.0, 0.0, 0.0]])  # nothing active
    b = torch.tensor([[0.0, 2.0, 1.0, 3.0, 0.0],   # top-2 {3, 1}
                      [2.0, 0.0, 0.0, 5.0, 0.0],
                      [1.0, 0.0, 0.0, 0.0, 0.0]])
    m = overlap_metrics(a, b, k=2)
    assert m["overlap"][0] == pytest.approx(0.5)  # |{1}| / 2
    assert m["jaccard"][0] == pytest.approx(1 / 3)  # |{1}| / |{0, 1, 3}|
    assert m["weighted_jaccard"][0] == pytest.approx(3 / 9)  # (0+2+1+0+0) / (3+2+1+3+0)
    assert m["overlap"][1] == pytest.approx(1.0)  # A = {0} is inside B = {3, 0}: / min(|A|, |B|)
    assert m["jaccard"][1] == pytest.approx(0.5)
    assert m["weighted_jaccard"][1] == pytest.approx(1 / 7)
    assert np.isnan(m["overlap"][2]) and m["jaccard"][2] == 0 and m["weighted_jaccard"][2] == 0
    same = overlap_metrics(b, b, k=2)
    assert np.allclose(same["overlap"], 1) and np.allclose(same["weighted_jaccard"], 1)


# ----------------------------------------------------------------------------- features on the core
def test_empty_feature_patch_reproduces_the_model_and_gradients_match(decimal_case, decimal_model):
    from surgeon.analyses.common import make_contrast
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site

    sae = shipped("decimal", 1)
    fs = FeatureSite.of(sae)
    c, _ = make_contrast(decimal_case, decimal_model, sites=[Site.coerce(fs.hook)])
    F = fs.n_units()
    with torch.no_grad():
        empty = c.run({fs: torch.zeros(1, F)})[0]
    assert torch.allclose(empty, c.clean_base, atol=1e-5)  # reconstruction + error term = the activation
    m = torch.zeros(1, F, requires_grad=True)
    with torch.enable_grad():
        c.run({fs: m}).mean().backward()
    top = torch.argsort(m.grad[0].abs(), descending=True)[:4]
    eps = 1e-2
    with torch.no_grad():
        fd = (c.run({fs: eps * torch.eye(F)[top]}).mean(1) - empty.mean()) / eps
    assert torch.allclose(fd, m.grad[0, top], rtol=0.05, atol=1e-4)


def test_feature_patch_equals_independent_hooks(decimal_case, decimal_model):
    """Patching a feature set through the core = a hand-written hook that moves those features at the last
    prompt token and the answer tokens (align='last') of every failing-format row."""
    from surgeon.analyses.common import format_rows, make_contrast
    from surgeon.engine.readout import score_rows
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site
    from surgeon.case.encoding import align

    sae = shipped("decimal", 2)
    fs = FeatureSite.of(sae)
    items = decimal_case.items_for("trap")[:6]
    case = type(decimal_case)(**{**decimal_case.__dict__, "items": items, "focus": None})
    c, _ = make_contrast(case, decimal_model, sites=[Site.coerce(fs.hook)], tag="all")
    chosen = torch.tensor([3, 17, 40, 77, 200])
    mask = torch.zeros(1, fs.n_units()).index_fill_(1, chosen, 1.0)
    with torch.no_grad():
        core = c.run({fs: mask})[0]
    rows_b = format_rows(case, decimal_model, "qa", items)
    rows_g = format_rows(case, decimal_model, "plain", items)
    ref = []
    for rb, rg in zip(rows_b, rows_g):
        pb, pg = align(rb, rg, "last")
        _, cache = decimal_model.run_with_cache(torch.tensor([rg.tokens]), names_filter=[fs.hook])
        f_src = sae.encode(cache[fs.hook][0, pg])

        def hook(act, hook, pb=pb, f_src=f_src):
            act = act.clone()
            f = sae.encode(act[0, pb])
            f2 = f.clone()
            f2[:, chosen] = f_src[:, chosen]
            act[0, pb] = act[0, pb] + sae.decode(f2) - sae.decode(f)
            return act
        with decimal_model.hooks(fwd_hooks=[(fs.hook, hook)]), torch.no_grad():
            ref.append(score_rows(decimal_model, [type(rb)(**{**rb.__dict__, "item": 0})]))
    # items with two rows (whole-answer scoring) sum their rows' signed log-probabilities
    per_item = torch.zeros(len(items))
    for rb, s in zip(rows_b, ref):
        per_item[rb.item] += s[0]
    assert torch.allclose(core, per_item, atol=1e-4)


@pytest.mark.parametrize("which", ["error", "features and error"])
def test_error_node_patch_equals_independent_hooks(decimal_case, decimal_model, which):
    """The SAE's error term as a unit (Marks et al.'s error node), written with plain hooks: the error alone moves
    act -> decode(encode(act)) + (src - decode(encode(src))); every feature and the error moves act -> src, the
    whole activation (so it equals patching the hook point itself)."""
    from surgeon.analyses.common import format_rows, make_contrast
    from surgeon.engine.readout import score_rows
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site
    from surgeon.case.encoding import align

    sae = shipped("decimal", 2)
    fs = FeatureSite.of(sae, error=True)
    F = int(sae.cfg.d_sae)
    assert fs.n_units() == F + 1
    items = decimal_case.items_for("trap")[:6]
    case = type(decimal_case)(**{**decimal_case.__dict__, "items": items, "focus": None})
    node = Site.coerce(fs.hook)
    c, _ = make_contrast(case, decimal_model, sites=[node], tag="all")
    mask = torch.zeros(1, F + 1)
    mask[0, F] = 1
    if which != "error":
        mask[:] = 1
    with torch.no_grad():
        core = c.run({fs: mask})[0]
        if which != "error":  # every unit moved: the hook point's activation is the other run's
            whole = c.run({node: torch.ones(1, c.units(node))})[0]
            assert torch.allclose(core, whole, atol=1e-4)
    rows_b = format_rows(case, decimal_model, "qa", items)
    rows_g = format_rows(case, decimal_model, "plain", items)
    per_item = torch.zeros(len(items))
    for rb, rg in zip(rows_b, rows_g):
        pb, pg = align(rb, rg, "last")
        _, cache = decimal_model.run_with_cache(torch.tensor([rg.tokens]), names_filter=[fs.hook])
        src = cache[fs.hook][0, pg]
        err_src = src - sae.decode(sae.encode(src))

        def hook(act, hook, pb=pb, src=src, err_src=err_src):
            act = act.clone()
            a = act[0, pb]
            act[0, pb] = sae.decode(sae.encode(a)) + err_src if which == "error" else src
            return act
        with decimal_model.hooks(fwd_hooks=[(fs.hook, hook)]), torch.no_grad():
            per_item[rb.item] += score_rows(decimal_model, [type(rb)(**{**rb.__dict__, "item": 0})])[0]
    assert torch.allclose(core, per_item, atol=1e-4)
    assert (core - c.clean_base).abs().max() > 1e-3  # the patch moves the scores: the comparison is not vacuous
    # and the error unit's gradient is its finite difference
    m = torch.zeros(1, F + 1, requires_grad=True)
    with torch.enable_grad():
        c.run({fs: m}).mean().backward()
    eps = 1e-3
    with torch.no_grad():
        step = torch.zeros(1, F + 1)
        step[0, F] = eps
        fd = (c.run({fs: step}).mean() - c.clean_base.mean()) / eps
    assert torch.allclose(fd, m.grad[0, F], rtol=0.05, atol=1e-4)


# ----------------------------------------------------------------------------- head -> feature effects
@pytest.mark.slow
def test_head_feature_effects_match_hand_written_hooks(threshold_case, threshold_model):
    """On the threshold organism (formats of equal length): the odd group's effect on each feature equals
    patching the odd heads' z at the last prompt token with a hand-written hook and encoding attn_out."""
    from surgeon.analyses.sae_heads import head_feature_effects
    from surgeon.case.encoding import prompt_rows

    sae = shipped("threshold", 0)
    r = head_feature_effects(threshold_case, threshold_model, sae, layer=0, top=8)
    H = threshold_model.cfg.n_heads
    odd = torch.arange(1, H, 2)
    items = threshold_case.items_for(threshold_case.focus)
    qa = prompt_rows(threshold_case.formats["qa"], items, threshold_model.tokenizer, True)
    plain = prompt_rows(threshold_case.formats["plain"], items, threshold_model.tokenizer, True)
    tq, tp = torch.tensor([r_.tokens for r_ in qa]), torch.tensor([r_.tokens for r_ in plain])
    hook_z, hook_out = "blocks.0.attn.hook_z", "blocks.0.hook_attn_out"
    _, cp = threshold_model.run_with_cache(tp, names_filter=[hook_z])
    _, cq = threshold_model.run_with_cache(tq, names_filter=[hook_out])

    def patch(z, hook):
        z = z.clone()
        z[:, -1, odd] = cp[hook_z][:, -1, odd]
        return z
    kept = {}
    with threshold_model.hooks(fwd_hooks=[(hook_z, patch), (hook_out, lambda a, hook: kept.setdefault("x", a))]):
        threshold_model(tq)
    with torch.no_grad():
        eff = (sae.encode(kept["x"][:, -1]) - sae.encode(cq[hook_out][:, -1]))[:, r.features].mean(0)
    assert np.allclose(r.effect[r.units.index("odd")], eff.numpy(), atol=1e-3)
    # what was planted: the odd heads are identical; each even head writes its own weight's share of the answer,
    # so on the feature the even heads move most their effects are ordered exactly as the planted weights
    from surgeon.organisms.threshold import WEIGHTS

    heads = [int(u.split("H")[1]) for u in r.units[:H]]
    odd_rows = np.stack([r.effect[i] for i, h in enumerate(heads) if h % 2])
    assert np.allclose(odd_rows, odd_rows[0], atol=1e-3)
    even = sorted((WEIGHTS[h], i) for i, h in enumerate(heads) if h % 2 == 0)
    rows = np.stack([r.effect[i] for _, i in even])  # by planted weight, lightest first
    top = int(np.abs(rows).mean(0).argmax())
    steps = np.diff(rows[:, top])
    assert (steps < -1e-3).all() or (steps > 1e-3).all(), rows[:, top]


def test_threshold_sae_features_follow_the_format_marker_not_the_answer(threshold_case, threshold_model):
    """Measured fact (recorded in the README): the trained SAE's features that differ most between formats
    are carried by the odd heads, which write only the format marker (the answer ignores them); all 16
    even heads together, which carry the answer, move the top feature by less than 10% of its gap."""
    from surgeon.analyses.sae_heads import head_feature_effects

    r = head_feature_effects(threshold_case, threshold_model, shipped("threshold", 0), layer=0, top=3)
    odd, even = r.fraction[r.units.index("odd")], r.fraction[r.units.index("even")]
    assert odd[0] > 0.9 and abs(even[0]) < 0.1


# ----------------------------------------------------------------------------- analyses end to end
def test_overlap_and_amplified_on_the_decimal_organism(decimal_case, decimal_model):
    from surgeon.analyses.sae_features import amplified, overlap

    saes = {L: shipped("decimal", L) for L in range(3)}
    r = overlap(decimal_case, decimal_model, saes, k=20)
    for b in ("qa", "chat"):
        ov = r.metrics[b]["overlap"]
        assert all(e.n == 128 and e.lo <= e.value <= e.hi for e in ov)
        assert ov[0].value < ov[2].value  # the formats differ most early and converge by the last layer
        assert all(0 < e.value < 1 for e in ov)
    a = amplified(decimal_case, decimal_model, saes[1], 1)
    ratios = [f.ratio.value for f in a.ranked]
    assert ratios == sorted(ratios, reverse=True) and all(f.n_both >= a.min_items for f in a.ranked)
    assert a.only_bad and a.only_good


def test_feature_repair_runs_the_subset_search(decimal_case, decimal_model):
    from surgeon.analyses.sae_repair import feature_repair

    r = feature_repair(decimal_case, decimal_model, shipped("decimal", 1), top=4, budget=100)
    assert r.empty_patch_max_diff < 1e-5
    assert len(r.top) == 4 and r.search.subsets_evaluated == 16
    for (j, est, exact) in r.top:  # first-order estimates agree with exact single-feature patching here
        assert abs(est - exact) < 0.2 * abs(exact) + 1e-3
    # compared with the heads of the same layer: 8 heads, every subset
    assert r.heads.units == [f"L1H{h}" for h in range(8)] and r.heads.subsets_evaluated == 256
    # the search's single-feature subsets are the exact single-feature patches
    assert r.search.size("all", 1).mean_repair_fraction == pytest.approx(np.mean([e for _, _, e in r.top]), abs=1e-5)


# ----------------------------------------------------------------------------- quality
@pytest.mark.slow
def test_quality_flags_a_poor_sae_and_passes_the_shipped_ones(decimal_case, decimal_model):
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKSAE, TopKSAEConfig

    from surgeon.sae.quality import measure
    from surgeon.sae.train import collect_activations

    hook = "blocks.1.hook_mlp_out"
    acts = collect_activations(decimal_case, decimal_model, [hook])[hook]
    good = measure(decimal_case, decimal_model, shipped("decimal", 1), 1, hook, acts, "shipped")
    assert not good.warnings and good.explained_variance > 0.9 and good.l0 == pytest.approx(8)
    torch.manual_seed(0)
    poor = TopKSAE(TopKSAEConfig(d_in=64, d_sae=256, k=2, metadata=SAEMetadata(hook_name=hook)))
    bad = measure(decimal_case, decimal_model, poor, 1, hook, acts, "random")
    assert bad.warnings and bad.explained_variance < 0.7


def unexplained(w: dict, x: torch.Tensor, k: int) -> float:
    """A TopK SAE's unexplained variance on `x`, written from its definition (sae-lens's TopK: the k largest
    pre-activations, ReLU'd, decoded), not with the SAE classes under test."""
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    top = torch.topk(pre, k, dim=-1)
    f = torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))
    return float(((f @ w["W_dec"] + w["b_dec"] - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())


@pytest.mark.slow
def test_training_is_deterministic_and_the_shipped_sae_fits_what_its_record_names(threshold_case, threshold_model,
                                                                                   tmp_path):
    """The shipped SAE is reproduced bit for bit only where torch and the CPU's kernels are those it was trained with
    (its record's float_environment): elsewhere the same seed rounds differently and 4,000 TopK steps end elsewhere
    (seeds 0-4 of the recorded command leave 0.8% to 12.7% of the variance unexplained on one CPU). What holds on
    every machine: training is deterministic, and the shipped SAE fits the activations its record names."""
    from safetensors.torch import load_file

    from surgeon.organisms import sae_dir
    from surgeon.sae.train import TrainOptions, collect_activations, float_environment, save, train_sae

    hook = "blocks.0.hook_attn_out"
    rec = json.loads((sae_dir("threshold") / hook / "training.json").read_text())
    acts = collect_activations(threshold_case, threshold_model, [hook])[hook]
    assert len(acts) == rec["n_activations"]
    opts = TrainOptions(k=rec["k"], expansion=rec["expansion"], steps=300, seed=rec["seed"])
    a, b = (train_sae(acts, hook, opts).state_dict() for _ in range(2))
    c = train_sae(acts, hook, TrainOptions(k=rec["k"], expansion=rec["expansion"], steps=300, seed=rec["seed"] + 1))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["W_dec"], c.state_dict()["W_dec"])  # the seed is what decides it
    ref = load_file(str(sae_dir("threshold") / hook / "sae_weights.safetensors"))
    assert unexplained(ref, acts, rec["k"]) < 0.02  # 0.9%: it was trained on these activations, with this k
    shuffled = dict(ref, W_dec=ref["W_dec"][torch.randperm(len(ref["W_dec"]), generator=torch.Generator().manual_seed(0))])
    assert unexplained(shuffled, acts, rec["k"]) > 0.5  # the check tells a dictionary from its permutation
    if rec.get("float_environment") == float_environment():
        sae = train_sae(acts, hook, TrainOptions(k=rec["k"], expansion=rec["expansion"], steps=rec["steps"],
                                                 seed=rec["seed"]))
        save(sae, tmp_path / hook)
        new = load_file(str(tmp_path / hook / "sae_weights.safetensors"))
        assert set(new) == set(ref) and all(torch.allclose(new[k], ref[k], atol=1e-4) for k in ref)


# ----------------------------------------------------------------------------- where SAEs come from
def test_local_dir_templating_and_errors(tmp_path):
    from surgeon.organisms import sae_dir
    from surgeon.sae.load import SAEError, SAESource, load_sae

    sae = load_sae(SAESource(path=str(sae_dir("decimal")) + "/blocks.{layer}.hook_mlp_out"), 2)
    assert sae.cfg.metadata.hook_name == "blocks.2.hook_mlp_out"
    with pytest.raises(SAEError, match="not an SAE directory"):
        load_sae(SAESource(path=str(tmp_path / "L{layer}")), 0)
    with pytest.raises(SAEError, match="needs an SAE id"):
        SAESource(release="llama_scope_lxm_8x")
    with pytest.raises(SAEError, match="center_writing_weights"):  # trained on a processed model: refused
        load_sae(SAESource("gpt2-small-res-jb", "blocks.{layer}.hook_resid_pre"), 0)
    with pytest.raises(SAEError, match="--sae-id"):
        load_sae(SAESource("llama_scope_lxm_8x", "no_such_{layer}"), 0)


HF_SCRIPT = r"""
import sys, torch
from surgeon.sae.load import SAESource, load_sae, SAEError
src = SAESource("gpt2-small-res_sce-ajt", "blocks.{layer}.hook_resid_pre")
sae = load_sae(src, int(sys.argv[1]))
print(float(sae.W_dec.sum()), src.neuronpedia(int(sys.argv[1])))
"""


@pytest.mark.slow
def test_pretrained_release_from_a_hugging_face_cache_layout(tmp_path):
    """The release path reads a cache written the way huggingface_hub lays it out, offline; a layer that is
    not cached gives one clear error."""
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.standard_sae import StandardSAE, StandardSAEConfig

    torch.manual_seed(0)
    sae = StandardSAE(StandardSAEConfig(d_in=16, d_sae=32, metadata=SAEMetadata(hook_name="blocks.2.hook_resid_pre")))
    with torch.no_grad():
        sae.W_dec.normal_()
    rev = "0" * 40
    repo = tmp_path / "hub" / "models--neuronpedia--gpt2-small__res_sce-ajt"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    sae.save_model(repo / "snapshots" / rev / "2-res_sce-ajt")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", HF_SCRIPT, "2"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    total, np_id = out.stdout.split()
    assert float(total) == pytest.approx(float(sae.W_dec.detach().sum()), rel=1e-5)
    assert np_id == "gpt2-small/2-res_sce-ajt"
    out = subprocess.run([sys.executable, "-c", HF_SCRIPT, "6"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode != 0 and "not in the local Hugging Face cache" in out.stderr


# ----------------------------------------------------------------------------- the command line
def test_sae_commands_write_results_and_refuse_bad_input(tmp_path, capsys):
    from surgeon.cli.commands import main

    out = tmp_path / "ov"
    assert main(["sae", "overlap", os.path.join(ROOT, "cases", "decimal_organism.py"), "--layers", "0,2",
                 "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["result"]["layers"] == [0, 2] and (out / "manifest.json").exists() and (out / "overlap.png").exists()
    assert "formats most separate" in capsys.readouterr().out
    assert main(["sae", "overlap", os.path.join(ROOT, "cases", "decimal_organism.py"), "--sae-dir",
                 str(tmp_path / "none{layer}"), "--out", str(tmp_path / "x")]) == 2
    assert "no SAE directory matches" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["sae", "heads", os.path.join(ROOT, "cases", "decimal_organism.py"), "--layer", "2",
                 "--sae-layer", "1"]) == 2
    assert "computed before the patched sites" in capsys.readouterr().err


def test_planted_threshold_sae_even_heads_move_the_answer_feature_odd_ones_do_not(threshold_case, threshold_model):
    """With the SAE built by construction for the threshold organism, the head -> feature matrix recovers the
    planted roles: the even heads move the answer-letter features (toward the good format), the odd heads
    move only the format-marker features; and the empty patch of its features reproduces the model."""
    from surgeon.analyses.sae_heads import head_feature_effects
    from surgeon.organisms.threshold import planted_sae

    sae = planted_sae(threshold_model)
    r = head_feature_effects(threshold_case, threshold_model, sae, layer=0, top=sae.cfg.d_sae)
    letter = np.array([sae.labels[str(j)].startswith("letter") for j in r.features])
    moved = np.abs(r.format_gap) > 1e-3
    even, odd = r.effect[r.units.index("even")], r.effect[r.units.index("odd")]
    assert (letter & moved).sum() >= 2 and (~letter & moved).sum() >= 1
    assert np.abs(odd[letter]).max() < 1e-4  # odd heads never move an answer feature
    assert np.abs(even[~letter]).max() < 1e-4  # even heads never move a marker feature
    assert np.abs(even[letter & moved]).min() > 0.1
    assert np.allclose(even[letter], r.format_gap[letter], atol=1e-3)  # all 16 even heads: the whole gap
    assert np.allclose(odd[~letter], r.format_gap[~letter], atol=1e-3)


def test_shipped_planted_sae_is_the_construction(threshold_model):
    from safetensors.torch import load_file

    from surgeon.organisms import sae_dir
    from surgeon.organisms.threshold import planted_sae

    d = sae_dir("threshold-planted") / "blocks.0.hook_attn_out"
    sae = planted_sae(threshold_model)
    shipped_w = load_file(str(d / "sae_weights.safetensors"))
    built = sae.state_dict()
    assert set(shipped_w) == set(built) and shipped_w  # the same tensors, none missing on either side
    assert all(torch.equal(shipped_w[k], built[k].detach()) for k in built)
    assert json.loads((d / "labels.json").read_text()) == sae.labels


@pytest.mark.slow
def test_sae_train_writes_results_and_a_manifest_to_out(tmp_path):
    import subprocess
    import sys

    saes, out = tmp_path / "saes", tmp_path / "o"
    r = subprocess.run([sys.executable, "-m", "surgeon", "sae", "train", f"{ROOT}/cases/threshold_organism.py",
                        "--component", "attn_out", "--k", "2", "--steps", "20", "--sae-out", str(saes), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    man = json.loads((out / "manifest.json").read_text())
    assert res["command"] == "sae-train" and res["result"]["layers"] == [0]
    assert res["result"]["sae_out"] == str(saes) and (saes / "blocks.0.hook_attn_out" / "cfg.json").exists()
    assert res["result"]["quality"][0]["d_sae"] > 0 and man["options"]["steps"] == 20 and man["model"]["n_heads"] == 32
    # its record reproduces it here, bit for bit: same machine, same float environment
    from safetensors.torch import load_file

    from surgeon import load_case
    from surgeon.models.loading import load_model
    from surgeon.sae.train import TrainOptions, collect_activations, float_environment, save, train_sae

    rec = json.loads((saes / "blocks.0.hook_attn_out" / "training.json").read_text())
    assert rec["float_environment"] == float_environment()
    case = load_case(f"{ROOT}/cases/threshold_organism.py")
    acts = collect_activations(case, load_model(case.model), [rec["hook"]])[rec["hook"]]
    again = train_sae(acts, rec["hook"], TrainOptions(k=rec["k"], expansion=rec["expansion"], steps=rec["steps"],
                                                      seed=rec["seed"], batch=rec["batch"], lr=rec["lr"]))
    save(again, tmp_path / "again")
    shipped = load_file(str(saes / "blocks.0.hook_attn_out" / "sae_weights.safetensors"))
    new = load_file(str(tmp_path / "again" / "sae_weights.safetensors"))
    assert set(new) == set(shipped) and all(torch.equal(new[k], shipped[k]) for k in shipped)


def test_an_sae_whose_config_names_another_hook_point_than_its_folder_is_refused(tmp_path):
    """A folder named blocks.1.hook_mlp_out whose cfg.json says it reads blocks.1.hook_resid_pre (a copy slip):
    used without comment it gives error nodes that carry most of the effect; refused, naming both."""
    import json
    import shutil

    from surgeon import organisms
    from surgeon.sae.load import SAEError, SAESource, load_sae

    from pathlib import Path

    src = Path(organisms.__file__).parent / "saes" / "decimal" / "blocks.1.hook_mlp_out"
    dest = tmp_path / "blocks.1.hook_mlp_out"
    shutil.copytree(src, dest)
    load_sae(SAESource(path=str(tmp_path / "blocks.{layer}.hook_mlp_out")), 1)  # as shipped: fine
    cfg = json.loads((dest / "cfg.json").read_text())
    meta = cfg.get("metadata", cfg)
    meta["hook_name"] = "blocks.1.hook_resid_pre"
    (dest / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEError) as e:
        load_sae(SAESource(path=str(tmp_path / "blocks.{layer}.hook_mlp_out")), 1)
    assert "blocks.1.hook_mlp_out" in e.value.message and "blocks.1.hook_resid_pre" in e.value.message


def test_an_sae_trained_on_another_model_is_warned(tmp_path, capsys, decimal_model):
    import json
    import shutil
    from pathlib import Path

    import surgeon
    from surgeon import organisms

    src = Path(organisms.__file__).parent / "saes" / "decimal"
    for d in src.iterdir():
        shutil.copytree(d, tmp_path / d.name)
    cfg_file = tmp_path / "blocks.1.hook_mlp_out" / "cfg.json"
    cfg = json.loads(cfg_file.read_text())
    surgeon.sae_overlap("decimal_organism", "organism:decimal", layers=[1],
                        sae_dir=str(tmp_path / "blocks.{layer}.hook_mlp_out"))
    assert "was trained on" not in capsys.readouterr().err  # the same model: nothing to say
    cfg["metadata"]["model_name"] = "organism:threshold"
    cfg_file.write_text(json.dumps(cfg))
    surgeon.sae_overlap("decimal_organism", "organism:decimal", layers=[1],
                        sae_dir=str(tmp_path / "blocks.{layer}.hook_mlp_out"))
    err = capsys.readouterr().err
    assert "was trained on 'organism:threshold'" in err and "'organism:decimal'" in err, err
