"""Feature circuits (surgeon.analyses.feature_circuit): node effects against the threshold organism's closed form with
the SAE built by construction, circuits of several SAEs against hand-written hooks, and the command line."""
import json
import os

import numpy as np
import pytest
import torch

from tests.conftest import ROOT
from tests.sae.test_sae import shipped, threshold_case  # noqa: F401  (a fixture)


def _threshold_expected():
    """From the organism's construction alone (no model run): each planted SAE feature's effect, patched from `plain`
    into `qa` at the last position, as a mean over items. A letter feature c moves the answer only on items whose x or
    y is c: it writes the letter (gain g_c) the plain run writes (u x TOTAL on x) or removes what qa writes (W_BAD u
    TOTAL on y); marker features and the error term write nothing the unembedding reads."""
    from surgeon.organisms import threshold as t

    items = t.items_values()
    g = dict(zip(t.LETTERS, t.GAIN))
    plain = np.array(t.subset_scores(t.EVEN))  # every even head patched: the plain run's scores
    qa = np.array(t.subset_scores(()))
    effect = {}
    for c in t.LETTERS:
        effect[f"letter {c}"] = np.mean([(t.UNIT * g[x] * t.TOTAL if x == c else 0.0)
                                         + (t.W_BAD * t.UNIT * g[y] * t.TOTAL if y == c else 0.0) for x, y in items])
    return effect, qa, plain


def test_feature_nodes_recover_the_threshold_organisms_planted_features(threshold_case, threshold_model):
    """With the SAE whose features are the planted directions: the exact effect of every feature equals the closed
    form (letter features carry the failure, marker features and the error node nothing), attribution ranks the
    letter features above every other node (ROC AUC 1), and the circuit is letter features only, faithful 1 -
    with the ground truth from the construction, not from the engine."""
    from surgeon.analyses.feature_circuit import feature_circuit
    from surgeon.organisms.threshold import planted_sae

    sae = planted_sae(threshold_model)
    F = int(sae.cfg.d_sae)
    r = feature_circuit(threshold_case, threshold_model, {0: sae}, method="ig", steps=4, verify=F + 1, target=0.99)
    effect, qa, plain = _threshold_expected()
    gap = plain.mean() - qa.mean()
    d = r.directions["denoise"]
    assert (d.base, d.source) == ("qa", "plain") and len(r.nodes) == F + 1 and r.nodes[F].error
    assert d.base_mean == pytest.approx(qa.mean(), abs=1e-3) and d.source_mean == pytest.approx(plain.mean(), abs=1e-3)
    for i in range(F):
        want = effect.get(sae.labels[str(i)], 0.0) / gap
        assert d.exact[i].value == pytest.approx(want, abs=1e-4), sae.labels[str(i)]
    assert abs(d.exact[F].value) < 1e-6  # the error node: the SAE represents everything the answer reads
    letter = np.array([sae.labels[str(i)].startswith("letter") for i in range(F)] + [False])
    # ROC AUC of |attribution| for the planted nodes against the rest: every planted one above every other
    a = np.abs(d.attribution)
    assert a[letter].min() > a[~letter].max()
    assert a[~letter].max() < 1e-6
    assert all(letter[i] for i in d.circuit) and d.faithfulness.value >= 0.99
    assert d.completeness.value == pytest.approx(0.0, abs=1e-4) or len(d.circuit) < letter.sum()
    assert d.error_share == pytest.approx(0.0, abs=1e-6)
    # the working format's direction: the same features, moved the other way
    n = r.directions["noise"]
    assert (n.base, n.source) == ("plain", "qa") and all(letter[i] for i in n.circuit)


def _hand_written_kept(case, model, saes, keep, items):
    """Item scores of the failing run with every node outside `keep` given the good run's value, written with plain
    TransformerLens hooks and sae-lens: at each SAE's hook in layer order, at the aligned positions, the features
    outside `keep` take the good run's (read from the good run itself), and the error term too when its node is
    outside; decode(features) + error replaces the activation."""
    from surgeon.analyses.common import format_rows
    from surgeon.engine.readout import score_rows
    from surgeon.case.encoding import align

    rows_b = format_rows(case, model, case.bad[0], items)
    rows_g = format_rows(case, model, case.good, items)
    hooks = [(L, saes[L].cfg.metadata.hook_name, saes[L]) for L in sorted(saes)]
    offsets, lo = {}, 0
    for L, _, sae in hooks:
        offsets[L] = lo
        lo += int(sae.cfg.d_sae) + 1
    per_item = torch.zeros(len(items))
    for rb, rg in zip(rows_b, rows_g):
        pb, pg = align(rb, rg, case.align)
        _, cache = model.run_with_cache(torch.tensor([rg.tokens]), names_filter=[h for _, h, _ in hooks])
        fwd = []
        for L, h, sae in hooks:
            F = int(sae.cfg.d_sae)
            units = torch.tensor([u - offsets[L] for u in keep if offsets[L] <= u < offsets[L] + F + 1], dtype=torch.long)
            src = cache[h][0, pg]
            f_src = sae.encode(src)
            err_src = src - sae.decode(f_src)

            def hook(act, hook, sae=sae, F=F, units=units, f_src=f_src, err_src=err_src, pb=pb):
                act = act.clone()
                a = act[0, pb]
                f = sae.encode(a)
                err = a - sae.decode(f)
                kept = torch.zeros(F + 1, dtype=torch.bool)
                kept[units] = True if len(units) else kept[units]
                f2 = torch.where(kept[:F], f, f_src)
                e2 = err if kept[F] else err_src
                act[0, pb] = sae.decode(f2) + e2
                return act
            fwd.append((h, hook))
        with model.hooks(fwd_hooks=fwd), torch.no_grad():
            per_item[rb.item] += score_rows(model, [type(rb)(**{**rb.__dict__, "item": 0})])[0]
    return per_item


def test_circuits_over_three_saes_equal_hand_written_hooks(decimal_case, decimal_model):
    """On the decimal organism with its three shipped SAEs: a circuit kept (every other feature and error node given
    the good run's value, through all three layers at once) scores what hand-written hooks give, item by item; and
    the empty circuit and the full one are the two runs' ends of faithfulness (0 and 1)."""
    from surgeon.analyses.common import make_contrast
    from surgeon.analyses.feature_circuit import run_nodes
    from surgeon.stats import fraction_estimate as _frac
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site

    saes = {L: shipped("decimal", L) for L in (0, 1, 2)}
    items = decimal_case.items_for("trap")[:5]
    case = type(decimal_case)(**{**decimal_case.__dict__, "items": items, "focus": None})
    sites = [FeatureSite.of(saes[L], error=True) for L in (0, 1, 2)]
    c, _ = make_contrast(case, decimal_model, sites=[Site.coerce(s.hook) for s in sites], tag="all")
    N = sum(s.n_units() for s in sites)
    rng = np.random.default_rng(0)
    keep = sorted(rng.choice(N, 300, replace=False).tolist()) + [256, N - 1]  # some features and two error nodes
    got = run_nodes(c, sites, [keep], complement=True)[0]
    want = _hand_written_kept(case, decimal_model, saes, set(keep), items).double().numpy()
    np.testing.assert_allclose(got, want, atol=2e-4)
    base = c.clean_base.double().numpy()
    assert np.abs(got - base).max() > 1e-2  # ablating the rest moves the scores: the comparison is not vacuous
    everything, nothing = run_nodes(c, sites, [list(range(N)), []])
    np.testing.assert_allclose(nothing, base, atol=1e-4)
    assert _frac(everything, everything, base).value == pytest.approx(0.0, abs=1e-9)
    assert _frac(base, everything, base).value == pytest.approx(1.0, abs=1e-9)


@pytest.mark.slow
def test_feature_circuit_command(tmp_path, capsys):
    """`surgeon feature-circuit` on the shipped decimal case: the report, results and manifest, and the circuit's
    exports opened by the tools they are named for (our JSON read back equal, GraphML by networkx, DOT by Graphviz,
    TikZ by pdflatex); bad input exits 2 naming the field, before the model loads and with nothing written."""
    import shutil
    import subprocess

    import networkx as nx

    from surgeon.circuits.export import read_circuit
    from surgeon.cli import main

    case = os.path.join(ROOT, "cases", "decimal_organism.py")
    out = tmp_path / "fc"
    ex = {k: tmp_path / f"c{k}" for k in (".json", ".graphml", ".dot", ".tex")}
    assert main(["feature-circuit", case, "--layers", "0,2", "--method", "gradient", "--verify", "3",
                 "--out", str(out), "--export", *map(str, ex.values())]) == 0
    text = capsys.readouterr().out
    back = read_circuit(ex[".json"])
    circuit = {n for n, d in back.nodes(data=True) if d["in_circuit"]}
    assert circuit == {n for n, d in json.loads(ex[".json"].read_text())["nodes"].items() if d["in_graph"]}
    assert circuit and {back.nodes[n]["kind"] for n in circuit} <= {"feature", "error"}
    assert all(n.startswith(("blocks.0.hook_mlp_out[", "blocks.2.hook_mlp_out[")) for n in circuit)
    gm = nx.read_graphml(ex[".graphml"])
    assert {n for n, d in gm.nodes(data=True) if d["in_circuit"]} == circuit
    if shutil.which("dot"):
        r = subprocess.run(["dot", "-Tsvg", str(ex[".dot"])], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.count("<g id=\"node") == len(circuit), r.stderr
    if shutil.which("pdflatex"):
        from surgeon.circuits.export import tikz_document

        (tmp_path / "doc.tex").write_text(tikz_document(r"\input{" + ex[".tex"].name + "}", "The feature circuit."))
        r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                           capture_output=True, text=True)
        assert r.returncode == 0 and (tmp_path / "doc.pdf").stat().st_size > 1000, r.stdout[-2000:]
    assert main(["feature-circuit", case, "--export", str(tmp_path / "c.mib.json"), "--out", str(tmp_path / "z")]) == 2
    assert "no EAP-IG / MIB form" in capsys.readouterr().err and not (tmp_path / "z").exists()
    assert "denoise: the 'qa' run" in text and "across formats" in text and "faithfulness" in text
    res = json.loads((out / "results.json").read_text())
    assert res["command"] == "feature-circuit" and (out / "manifest.json").exists() and (out / "feature_curve.png").exists()
    import surgeon

    back = surgeon.load(out)  # read back as the analysis returned it: it prints the same report
    assert str(back) == text.split("\nwrote ")[0].rstrip("\n") and back.repair.rate.n == back.n_items
    assert "each node patched at every aligned position at once" in text
    # Marks et al.'s exact effects by name: said in the result, kept when it is read back
    assert main(["feature-circuit", case, "--layers", "0", "--method", "gradient", "--verify", "2", "--exact",
                 "per-position", "--out", str(tmp_path / "pp")]) == 0
    pp = capsys.readouterr().out
    assert "one aligned position at a time, the effects summed" in pp
    assert surgeon.load(tmp_path / "pp").exact == "per-position"
    # surgeon's own per-example node rule by name (not Marks et al.'s): said in the circuit's search, kept when read back
    assert main(["feature-circuit", case, "--layers", "0", "--method", "gradient", "--verify", "0", "--threshold",
                 "0.2", "--threshold-over", "example", "--out", str(tmp_path / "ex")]) == 0
    assert "reaches 0.2 of the gap (surgeon's per-example node rule; Marks et al. threshold nodes on the aggregated " \
        "effect)" in capsys.readouterr().out
    assert surgeon.load(tmp_path / "ex").threshold_over == "example"
    assert main(["feature-circuit", case, "--threshold-over", "example", "--out", str(tmp_path / "w")]) == 2
    assert "--threshold-over" in capsys.readouterr().err and not (tmp_path / "w").exists()
    assert main(["feature-circuit", case, "--faithfulness", "0.9", "--threshold", "0.1", "--out", str(tmp_path / "x")]) == 2
    assert "--threshold" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["feature-circuit", case, "--sae-dir", str(tmp_path / "none{layer}"), "--layers", "0",
                 "--out", str(tmp_path / "y")]) == 2
    assert "is not an SAE directory" in capsys.readouterr().err and not (tmp_path / "y").exists()


def test_nodes_per_position_sum_to_the_nodes_at_every_position_and_equal_hooks_at_one(decimal_case, decimal_model):
    """--by-position on decimal items that align the same positions: each node's gradient attribution summed over the
    positions is the attribution of the node patched at every position at once (nodes slot-major: a mixed-up layout
    breaks it), and a node at one position, patched exactly, scores what a hand-written hook at that position alone
    gives (the layer-1 error term at the answer's first position)."""
    from surgeon.analyses.common import format_rows, make_contrast
    from surgeon.analyses.feature_circuit import attribution, node_list, run_nodes
    from surgeon.stats import fraction_estimate as _frac
    from surgeon.engine.readout import score_rows
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site
    from surgeon.case.encoding import align

    saes = {L: shipped("decimal", L) for L in (1, 2)}
    sites = [FeatureSite.of(saes[L], error=True) for L in (1, 2)]
    items = decimal_case.items_for("trap")[:24]
    case = type(decimal_case)(**{**decimal_case.__dict__, "items": items, "focus": None})
    c, _ = make_contrast(case, decimal_model, sites=[Site.coerce(s.hook) for s in sites], tag="all")
    has = c.slot_items()
    keep = [items[i] for i in range(len(items)) if bool(has[:, i].all())][:8]
    case = type(decimal_case)(**{**decimal_case.__dict__, "items": keep, "focus": None})
    c, _ = make_contrast(case, decimal_model, sites=[Site.coerce(s.hook) for s in sites], tag="all")
    S = c.n_slots
    assert S >= 2 and bool(c.slot_items().all())
    per = attribution(c, sites, "gradient", S=S).reshape(S, -1)
    together = attribution(c, sites, "gradient")
    np.testing.assert_allclose(per.sum(0), together, rtol=1e-4, atol=1e-5)
    assert np.abs(per).max() > 1e-3
    nodes = node_list(sites, [str(j) for j in range(S)])
    F1 = int(saes[1].cfg.d_sae)
    i = next(k for k, n in enumerate(nodes) if n.slot == 1 and n.layer == 1 and n.error)
    assert nodes[i].unit == F1
    got = run_nodes(c, sites, [[i]], S=S)[0]
    rows_b, rows_g = format_rows(case, decimal_model, "qa", keep), format_rows(case, decimal_model, "plain", keep)
    hook = saes[1].cfg.metadata.hook_name
    sae = saes[1]
    want = torch.zeros(len(keep))
    for rb, rg in zip(rows_b, rows_g):
        pb, pg = align(rb, rg, case.align)
        _, cache = decimal_model.run_with_cache(torch.tensor([rg.tokens]), names_filter=[hook])
        src = cache[hook][0, pg[1]]
        err_src = src - sae.decode(sae.encode(src))

        def fn(act, hook, p=pb[1], err_src=err_src):
            act = act.clone()
            a = act[0, p]
            act[0, p] = sae.decode(sae.encode(a)) + err_src
            return act
        with decimal_model.hooks(fwd_hooks=[(hook, fn)]), torch.no_grad():
            want[rb.item] += score_rows(decimal_model, [type(rb)(**{**rb.__dict__, "item": 0})])[0]
    np.testing.assert_allclose(got, want.double().numpy(), atol=1e-4)
    assert np.abs(got - c.clean_base.double().numpy()).max() > 1e-4
    assert _frac(got, c.clean_base.double().numpy(), c.clean_source.double().numpy()).n == len(keep)


@pytest.mark.slow
def test_the_feature_circuit_view_in_a_browser(threshold_case, threshold_model, tmp_path):
    """The report's feature-circuit view in headless Chromium, on the threshold organism with its built SAE: no
    script error, one node drawn per circuit node in each direction, and hovering a node shows that node's numbers as
    the result holds them (its attribution, its exact effect, its activation in both formats)."""

    from surgeon.analyses.feature_circuit import feature_circuit
    from surgeon.organisms.threshold import planted_sae
    from surgeon.reports.feature_view import widget
    from tests.browser import open_widget

    sae = planted_sae(threshold_model)
    r = feature_circuit(threshold_case, threshold_model, {0: sae}, method="gradient", verify=15, target=0.99)
    b = open_widget(tmp_path / "fc.html", widget(r))
    try:
        from selenium.webdriver.common.action_chains import ActionChains

        nodes = b.find_elements("css selector", ".fc-node")
        assert len(nodes) == sum(len(d.circuit) for d in r.directions.values())
        d = r.directions["denoise"]
        for el in nodes[:3] + nodes[-2:]:
            key, i = el.get_attribute("data-node").split(":")
            i = int(i)
            ActionChains(b).move_to_element(el).perform()
            note = b.find_element("css selector", ".fc-note").text
            dd = r.directions[key]
            assert r.nodes[i].name in note and f"attribution {dd.attribution[i]:+.3f}" in note
            e = dd.exact[i]
            assert f"exact {e.value:+.3f} [{e.lo:+.3f}, {e.hi:+.3f}]" in note
            p = r.profiles[i]
            assert f"mean activation: plain {p.good_mean:.3f}, qa {p.bad_mean:.3f}" in note
        assert set(d.circuit) <= set(r.profiles)
    finally:
        b.quit()


def test_a_feature_circuit_found_on_discovery_items_is_measured_on_held_out_ones(decimal_case, decimal_model):
    """`feature-circuit --holdout`: the circuits are chosen on the discovery items only; the failing direction's
    circuit kept on the held-out items scores what hand-written hooks give there (faithfulness from those scores),
    and differs from its in-sample value (which side is read matters)."""
    import dataclasses

    from surgeon.analyses.heldout import feature_circuit_heldout

    saes = {L: shipped("decimal", L) for L in (0, 2)}
    r = feature_circuit_heldout(decimal_case, decimal_model, saes, holdout=0.5, seed=1, method="gradient", verify=3)
    items = decimal_case.items_for(decimal_case.focus)
    ev = [items[i] for i in r.split.evaluation]
    assert r.search.n_items == len(r.split.discovery) and r.n_evaluation == len(ev)
    d = next(x for x in r.directions if x.direction == "denoise")
    circuit = r.search.directions["denoise"].circuit
    assert d.nodes == len(circuit) > 0
    case = dataclasses.replace(decimal_case, items=ev, focus=None)
    N = len(r.search.nodes)
    with torch.no_grad():
        kept = _hand_written_kept(case, decimal_model, saes, set(circuit), ev).double().numpy()
        everything = _hand_written_kept(case, decimal_model, saes, set(), ev).double().numpy()
        base = _hand_written_kept(case, decimal_model, saes, set(range(N)), ev).double().numpy()
    want = (kept.mean() - everything.mean()) / (base.mean() - everything.mean())
    assert d.faithfulness.value == pytest.approx(want, abs=1e-3)
    assert d.discovery_faithfulness == r.search.directions["denoise"].faithfulness
    assert abs(d.faithfulness.value - d.discovery_faithfulness.value) > 1e-4
    assert "held out" in str(r) and "in-sample" in str(r)
    # the verified edges, verified again on the held-out items: the same edges, their effects measured there
    verified = [(e.up, e.down) for e in r.search.directions["denoise"].edges if e.exact is not None]
    assert verified and [(u, v) for u, v, _, _ in d.edges] == verified
    assert all(e.n == len(ev) for _, _, _, e in d.edges)


def test_sae_repair_features_chosen_on_discovery_items_patched_on_held_out_ones(decimal_case, decimal_model, tmp_path,
                                                                             capsys):
    """`sae repair --holdout`: the top features are chosen on the discovery items; each alone, and all together, is
    patched on the held-out items, where hand-written hooks give the same scores for the set of all of them."""
    import dataclasses

    from surgeon.analyses.heldout import sae_repair_heldout
    from surgeon.cli import main

    sae = shipped("decimal", 0)
    r = sae_repair_heldout(decimal_case, decimal_model, sae, holdout=0.5, seed=4, top=3, budget=20)
    items = decimal_case.items_for(decimal_case.focus)
    ev = [items[i] for i in r.split.evaluation]
    chosen = [j for j, _, _ in r.search.top]
    assert r.search.n_items == len(r.split.discovery) and [x.features for x in r.rows] == [(j,) for j in chosen] + [tuple(chosen)]
    F = int(sae.cfg.d_sae)
    keep = set(range(F + 1)) - set(chosen)  # every node but the chosen features keeps the failing run's value
    case = dataclasses.replace(decimal_case, items=ev, focus=None)
    with torch.no_grad():
        patched = _hand_written_kept(case, decimal_model, {0: sae}, keep, ev).double().numpy()
    every = r.rows[-1]
    assert every.rate.value == pytest.approx(float((patched > 0).mean()), abs=1e-9)
    assert main(["sae", "repair", "--layer", "0", "--top", "2", "--budget", "10", "--holdout", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "held-out repair fraction" in out and "in-sample" in out


@pytest.mark.slow
def test_an_sae_of_another_layer_is_said_by_its_error_share(decimal_case, decimal_model):
    """The layer-2 SAE saved under layer 1's name (its cfg edited to read blocks.1.hook_mlp_out, so nothing in the
    files tells): its error nodes carry over a fifth of the circuit's attribution and the text warns; the layer-1
    SAE's carry under a tenth, with no warning."""
    from surgeon.analyses.feature_circuit import feature_circuit
    from surgeon.reports.feature_view import ERROR_SHARE_WARN, feature_circuit_text
    from tests.sae.test_sae import shipped

    wrong = shipped("decimal", 2)
    wrong.cfg.metadata.hook_name = "blocks.1.hook_mlp_out"
    for sae, says in ((shipped("decimal", 1), False), (wrong, True)):
        r = feature_circuit(decimal_case, decimal_model, {1: sae}, method="gradient", verify=2)
        shares = [d.error_share for d in r.directions.values()]
        assert all(s > ERROR_SHARE_WARN for s in shares) if says else all(s < 0.1 for s in shares)
        assert ("WARNING: error nodes carry" in feature_circuit_text(r)) == says
