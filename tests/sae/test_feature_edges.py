"""Feature-to-feature edges (surgeon.analyses.feature_edges) against the same quantities written with plain
TransformerLens hooks and sae-lens on the decimal organism's three MLP-output SAEs: the attribution (Marks et al.'s
left vector . Jacobian . delta, the SAE hook points between held) and the exact path patch (u patched with the
hook points between held, d alone set to the value it took)."""
import numpy as np
import pytest
import torch

from tests.engine.test_read_at import _longest, _rows
from tests.sae.test_sae import shipped

HOOKS = [f"blocks.{L}.hook_mlp_out" for L in range(3)]


def _score(model, rows):
    from surgeon.engine.readout import final_batches, readout

    total = 0.0
    for batch, resid, pos, tok, sign in final_batches(model, rows, 8, None):
        total = total + readout(model, resid, pos, tok, sign)[0].sum()
    return total


def _value(sae, x, unit, error):
    """A node's value at activations x [S, d]: a feature's activation [S], or the error term [S, d]."""
    f = sae.encode(x)
    return x - sae.decode(f) if error else f[:, unit]


def _by_hand(case, model, rows_b, rows_s, saes, u, d):
    """Edge u -> d (each (layer, unit, error)) by hand: (attribution in score units, exact scores per item)."""
    from surgeon.case.encoding import align

    (Lu, uu, eu), (Ld, ud, ed) = u, d
    su, sd = saes[Lu], saes[Ld]
    hu, hd = HOOKS[Lu], HOOKS[Ld]
    held = HOOKS[Lu + 1: Ld]
    items = _longest(rows_b, rows_s)
    n = len(items)
    att, exact = 0.0, np.zeros(n)
    for rb, rs in items:
        rows = [r for r in rows_b if r.item == rb.item]
        pb, ps = align(rb, rs, case.align)
        _, cs = model.run_with_cache(torch.tensor([rs.tokens]), names_filter=[hu])
        _, cb = model.run_with_cache(torch.tensor([rb.tokens]), names_filter=HOOKS)
        src = cs[hu][0, ps].detach()
        # the left vector: d(item score)/d(activation at hd), every path open, summed over the item's rows
        G = torch.zeros(len(pb), model.cfg.d_model)
        for r in rows:
            pr = align(r, [x for x in rows_s if x.item == r.item and len(x.tokens) - len(r.tokens)
                           == len(rs.tokens) - len(rb.tokens)][0], case.align)[0]
            leaf = {}

            def grab(act, hook):
                act = act.detach().requires_grad_(True)
                leaf["x"] = act
                return act
            with model.hooks(fwd_hooks=[(hd, grab)]), torch.enable_grad():
                _score(model, [type(r)(**{**r.__dict__, "item": 0})]).backward()
            G[: len(pr)] += leaf["x"].grad[0, pr]
        m = torch.zeros((), requires_grad=True)

        def patch(act, hook, m=m):
            act = act.clone()
            cur = act[0, pb]
            f = su.encode(cur)
            if eu:
                f_src = su.encode(src)
                moved = m * ((src - su.decode(f_src)) - (cur - su.decode(f)))
            else:
                delta = torch.zeros_like(f)
                delta[:, uu] = su.encode(src)[:, uu] - f[:, uu]
                moved = su.decode(f + m * delta) - su.decode(f)
            act[0, pb] = cur + moved
            return act

        kept = {}

        def keep(act, hook):
            kept["x"] = act[0, pb]
        hold = [(h, lambda a, hook: a.detach()) for h in held]
        with torch.enable_grad():
            model.run_with_hooks(torch.tensor([rb.tokens]), fwd_hooks=[(hu, patch)] + hold + [(hd, keep)])
            v = _value(sd, kept["x"], ud, ed)
            g = G if ed else G @ sd.W_dec[ud]  # a feature's left vector through the (linear) decoder, by hand
            (dv,) = torch.autograd.grad((v * g).sum() if not ed else (v * g).sum(), m)
        att += float(dv) / n
        # exact: u patched (m = 1), the hook points between held at this run's values, d's new value read ...
        with torch.no_grad():
            hold_base = [(h, lambda a, hook, h=h: torch.cat([a[:, :0], cb[h][:, : a.shape[1]]], 1)) for h in held]
            model.run_with_hooks(torch.tensor([rb.tokens]), fwd_hooks=[(hu, lambda a, hook: patch(a, hook, m=torch.ones(())))]
                                 + hold_base + [(hd, keep)])
            new = kept["x"].clone()
            for r in rows:  # ... then d alone set to it in the unpatched run
                pr = align(r, [x for x in rows_s if x.item == r.item and len(x.tokens) - len(r.tokens)
                               == len(rs.tokens) - len(rb.tokens)][0], case.align)[0]

                def set_d(act, hook, pr=pr):
                    act = act.clone()
                    cur = act[0, pr]
                    f, f_new = sd.encode(cur), sd.encode(new[: len(pr)])
                    if ed:
                        act[0, pr] = cur + (new[: len(pr)] - sd.decode(f_new)) - (cur - sd.decode(f))
                    else:
                        g2 = f.clone()
                        g2[:, ud] = f_new[:, ud]
                        act[0, pr] = cur + sd.decode(g2) - sd.decode(f)
                    return act
                with model.hooks(fwd_hooks=[(hd, set_d)]):
                    exact[rb.item] += float(_score(model, [type(r)(**{**r.__dict__, "item": 0})]))
    return att, exact


@pytest.mark.parametrize("u, d", [((0, None, False), (2, None, False)), ((0, None, True), (1, None, True)),
                                  ((1, None, False), (2, None, True))])
def test_edges_equal_hooks_written_by_hand(decimal_case, decimal_model, u, d):
    """Edge attribution and the exact path patch of an edge, between features and error nodes, across one SAE held
    (layer 0 -> layer 2: layer 1's hook point held) and adjacent ones, equal the hand-written versions; the upstream
    feature picked is the one the formats move most, the downstream one the most active at the last aligned
    position (by hand)."""
    from surgeon.analyses.common import make_contrast
    from surgeon.analyses.feature_circuit import node_list
    from surgeon.analyses.feature_edges import edge_attribution, verify_edges
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site
    from surgeon.case.encoding import align

    saes = {L: shipped("decimal", L) for L in range(3)}
    case, rows_b, rows_s = _rows(decimal_case, decimal_model)
    moved, active = {}, {}
    for L in (u[0], d[0]):  # by hand: the feature the formats move most, the one most active in the failing run
        tot, on = 0, 0
        for rb, rs in _longest(rows_b, rows_s):
            pb, ps = align(rb, rs, case.align)
            _, cb = decimal_model.run_with_cache(torch.tensor([rb.tokens]), names_filter=[HOOKS[L]])
            _, cs = decimal_model.run_with_cache(torch.tensor([rs.tokens]), names_filter=[HOOKS[L]])
            fb = saes[L].encode(cb[HOOKS[L]][0, pb])
            tot = tot + (saes[L].encode(cs[HOOKS[L]][0, ps]) - fb).abs().sum(0)
            on = on + fb[-1]  # at the last aligned position: every moved position comes before it
        moved[L], active[L] = int(tot.argmax()), int(on.argmax())
    u = (u[0], int(saes[u[0]].cfg.d_sae) if u[2] else moved[u[0]], u[2])
    d = (d[0], int(saes[d[0]].cfg.d_sae) if d[2] else active[d[0]], d[2])
    sites = [FeatureSite.of(saes[L], error=True) for L in range(3)]
    c, _ = make_contrast(case, decimal_model, sites=[Site.coerce(s.hook) for s in sites], tag="all")
    nodes = node_list(sites)
    index = {(n.layer, n.unit): i for i, n in enumerate(nodes)}
    iu, i_d = index[u[:2]], index[d[:2]]
    torch.manual_seed(0)
    got = edge_attribution(c, sites, nodes, down=[i_d], up=[iu])[(iu, i_d)]
    scores = verify_edges(c, sites, nodes, [(iu, i_d)])[(iu, i_d)]
    want_att, want_exact = _by_hand(case, decimal_model, rows_b, rows_s, saes, u, d)
    assert got == pytest.approx(want_att, rel=1e-3, abs=1e-5)
    np.testing.assert_allclose(scores, want_exact, rtol=1e-4, atol=1e-4)
    assert abs(want_att) > 1e-5 and np.abs(want_exact - c.clean_base.double().numpy()).max() > 1e-5


def _auc(pos, neg) -> float:
    """ROC AUC of scores `pos` (planted) against `neg` (the rest), ties counted half."""
    pos, neg = np.asarray(pos), np.asarray(neg)
    return float(((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (len(pos) * len(neg)))


def test_the_chain_organisms_planted_edges_are_recovered():
    """On the chain organism with its shipped SAEs (built with it): every edge between the two SAEs' nodes (features
    and error terms, 9 x 9), scored; the planted edges A_k -> B_k equal the construction's closed form (not the
    engine's), every other edge is 0 (C -> D too: its Jacobian is 1 but the answer ignores D), so the planted edges
    rank above all others (ROC AUC 1 >= 0.99); the exact path patch of each planted edge equals its closed form; the
    planted feature circuit (every A_k and B_k) is faithful 1 and the circuit found is exactly it, with its edges."""
    from surgeon import load_case
    from surgeon.analyses.common import make_contrast
    from surgeon.analyses.feature_circuit import feature_circuit, node_list, run_nodes
    from surgeon.stats import fraction_estimate as _frac
    from surgeon.analyses.feature_edges import edge_attribution, verify_edges
    from surgeon.models.loading import load_model
    from surgeon.organisms import chain
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site
    from tests.conftest import ROOT
    import os

    case = load_case(os.path.join(ROOT, "cases", "chain_organism.py"))
    model = load_model("organism:chain")
    saes = {L: shipped("chain", L) for L in (0, 1)}
    sites = [FeatureSite.of(saes[L], error=True) for L in (0, 1)]
    c, _ = make_contrast(case, model, sites=[Site.coerce(s.hook) for s in sites], tag="all")
    nodes = node_list(sites)
    names = {i: ("err" if n.error else chain.feature_names(n.layer)[n.unit]) for i, n in enumerate(nodes)}
    up = [i for i, n in enumerate(nodes) if n.layer == 0]
    down = [i for i, n in enumerate(nodes) if n.layer == 1]
    gap = chain.gap()
    base, source = c.clean_base.double().numpy(), c.clean_source.double().numpy()
    assert float(source.mean() - base.mean()) == pytest.approx(gap, abs=1e-5)
    att = edge_attribution(c, sites, nodes, down=down, up=up)
    assert len(att) == len(up) * len(down) == 81
    planted = chain.planted_edges()
    want = {(u, d): planted.get((names[u], names[d]), 0.0) for u in up for d in down}
    for e, v in att.items():
        assert v / gap == pytest.approx(want[e], abs=1e-5), (names[e[0]], names[e[1]])
    cd = next(e for e in att if (names[e[0]], names[e[1]]) == ("C_?", "D_?"))
    assert att[cd] == 0.0
    is_planted = [e for e in att if want[e] != 0]
    assert len(is_planted) == len(chain.LETTERS)
    auc = _auc([abs(att[e]) for e in is_planted], [abs(att[e]) for e in att if e not in is_planted])
    assert auc >= 0.99 and auc == 1.0
    exact = verify_edges(c, sites, nodes, is_planted)
    for e in is_planted:
        assert _frac(exact[e], base, source).value == pytest.approx(want[e], abs=1e-5)
    circuit = [i for i in range(len(nodes)) if names[i][:2] in ("A_", "B_")]
    kept = run_nodes(c, sites, [circuit], complement=True)[0]
    everything = run_nodes(c, sites, [list(range(len(nodes)))])[0]
    assert _frac(kept, everything, base).value == pytest.approx(chain.planted_faithfulness(), abs=1e-6)
    r = feature_circuit(case, model, saes, method="ig", steps=3, verify=6)
    d = r.directions["denoise"]
    assert sorted(d.circuit) == circuit
    found = {(names[e.up], names[e.down]): e for e in d.edges}
    assert set(k for k, e in found.items() if abs(e.attribution) > 1e-6) == set(planted)
    for k, v in planted.items():
        assert found[k].attribution == pytest.approx(v, abs=1e-5)
    assert sum(e.exact is not None for e in d.edges) == 6
    by_name = {n.name: names[i] for i, n in enumerate(nodes)}
    assert {(by_name[u], by_name[v]) for u, v in r.graph("denoise").edges()} == set(planted)


@pytest.mark.slow
def test_the_chain_circuit_with_its_edges_in_every_tool_and_a_browser(tmp_path, capsys):
    """`surgeon feature-circuit` on the chain case: the planted edges in the text, and the circuit with its 6 edges in
    every export, opened by the tool it is named for (our JSON read back, GraphML and GEXF by networkx, DOT by
    Graphviz, TikZ by pdflatex); the report's view in headless Chromium draws the 6 edges per direction and a hovered
    node lists its edge."""
    import json
    import os
    import shutil
    import subprocess

    import networkx as nx

    import surgeon
    from surgeon.circuits.export import read_circuit
    from surgeon.cli import main
    from surgeon.reports.feature_view import widget
    from tests.browser import open_widget
    from tests.conftest import ROOT

    case = os.path.join(ROOT, "cases", "chain_organism.py")
    ex = {k: tmp_path / f"c{k}" for k in (".json", ".graphml", ".gexf", ".dot", ".tex")}
    assert main(["feature-circuit", case, "--layers", "0,1", "--verify", "6", "--out", str(tmp_path / "fc"),
                 "--export", *map(str, ex.values())]) == 0
    text = capsys.readouterr().out
    assert "edges among its nodes: 6 nonzero, 6 drawn" in text
    assert "blocks.0.hook_mlp_out[f5] -> blocks.1.hook_mlp_out[f5]  +0.225   +0.225" in text
    want = {(f"blocks.0.hook_mlp_out[f{k}]", f"blocks.1.hook_mlp_out[f{k}]") for k in range(6)}
    back = read_circuit(ex[".json"])
    assert set(back.edges()) == want and json.loads(ex[".json"].read_text())["edges"]
    assert set(nx.read_graphml(ex[".graphml"]).edges()) == want
    assert set(nx.read_gexf(ex[".gexf"]).edges()) == want
    if shutil.which("dot"):
        r = subprocess.run(["dot", "-Tsvg", str(ex[".dot"])], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.count('<g id="edge') == 6 and r.stdout.count('<g id="node') == 12, r.stderr
    if shutil.which("pdflatex"):
        from surgeon.circuits.export import tikz_document

        (tmp_path / "doc.tex").write_text(tikz_document(r"\input{" + ex[".tex"].name + "}", "The feature circuit."))
        r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                           capture_output=True, text=True)
        assert r.returncode == 0 and (tmp_path / "doc.pdf").stat().st_size > 1000, r.stdout[-2000:]
    res = surgeon.load(tmp_path / "fc")
    assert [(e.up, e.down) for e in res.directions["denoise"].edges] and str(res) in text
    b = open_widget(tmp_path / "fc.html", widget(res))
    try:
        from selenium.webdriver.common.action_chains import ActionChains

        assert len(b.find_elements("css selector", ".fc-edge")) == 12
        node = next(el for el in b.find_elements("css selector", ".fc-node")
                    if res.nodes[int(el.get_attribute("data-node").split(":")[1])].name == "blocks.1.hook_mlp_out[f5]")
        ActionChains(b).move_to_element(node).perform()
        assert "edges in: blocks.0.hook_mlp_out[f5] +0.225" in b.find_element("css selector", ".fc-note").text
    finally:
        b.quit()


def test_edges_per_position_sum_to_the_edges_at_every_position(decimal_case, decimal_model):
    """With a node per aligned position (--by-position, over items whose answers differ in length), the edges from
    every slot of u into every slot of d add up to the edge u -> d between the nodes at every position at once (the
    attribution is linear in u's change and d's read): a slot layout mixed up between the mask and the read breaks it."""
    from surgeon.analyses.common import make_contrast
    from surgeon.analyses.feature_circuit import node_list
    from surgeon.analyses.feature_edges import edge_attribution
    from surgeon.sites.features import FeatureSite
    from surgeon.sites.nodes import Site

    saes = {L: shipped("decimal", L) for L in (0, 2)}
    sites = [FeatureSite.of(saes[L], error=True) for L in (0, 2)]
    case, _, _ = _rows(decimal_case, decimal_model)
    c, _ = make_contrast(case, decimal_model, sites=[Site.coerce(s.hook) for s in sites], tag="all")
    S = c.n_slots
    assert S >= 2 and not bool(c.slot_items().all())  # some items align fewer positions than others
    flat, per = node_list(sites), node_list(sites, [str(j) for j in range(S)])
    F0, F2 = int(saes[0].cfg.d_sae), int(saes[2].cfg.d_sae)
    ups, downs = [3, 17, 100, F0], [F0 + 1 + 5, F0 + 1 + 40, F0 + 1 + F2]  # features and the error nodes
    whole = edge_attribution(c, sites, flat, down=downs, up=ups)
    U = len(flat)
    sliced = edge_attribution(c, sites, per, down=[t * U + d for d in downs for t in range(S)],
                              up=[s * U + u for u in ups for s in range(S)], S=S)
    for u in ups:
        for d in downs:
            total = sum(sliced[(s * U + u, t * U + d)] for s in range(S) for t in range(S))
            assert total == pytest.approx(whole[(u, d)], rel=1e-4, abs=1e-6)
    assert max(abs(v) for v in whole.values()) > 1e-4
    # causal: no slot feeds an earlier one
    assert all(v == 0.0 for (a, b), v in sliced.items() if a // U > b // U)
