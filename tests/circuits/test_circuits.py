"""Edges on the intervention core and the circuit analyses built on them.

Identities every edge implementation must satisfy, on random checkpoints of two architectures (GPT-2
style, and Llama style with grouped-query attention), with and without the shared prefix, for prompts of
equal and of different length; then the ground truth of the organisms; then the CLI and the exports."""
import json
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch

from surgeon import Item, load_case
from surgeon.engine.contrast import Contrast
from surgeon.sites.edges import EdgeSite
from surgeon.case.encoding import encode_rows
from tests.conftest import ARCHS, ROOT, tiny_model
from tests.cli_in_process import surgeon as surgeon_cli

ITEMS = [Item({"a": a, "b": b}, correct=" x", incorrect=" y") for a, b in [("ab", "cd"), ("ef", "gh"), ("ij", "kl")]]
LAYOUTS = {"index": ("Q {a} {b}:", "P {a} {b}:"), "last": ("Q: {a} {b}?", "Answer {a} {b}:")}


@pytest.fixture(params=[(a, s) for a in LAYOUTS for s in (True, False)], ids=lambda p: f"{p[0]}-shared{p[1]}")
def contrast(request, random_model, charset):
    align, shared = request.param
    fb, fs = LAYOUTS[align]
    site = EdgeSite.of(random_model.cfg)
    base, source = encode_rows(fb, ITEMS, charset, True), encode_rows(fs, ITEMS, charset, True)
    c = Contrast(random_model, base, source, align, sites=site.node_sites(), shared_prefix=shared)
    c.test_rows = (base, source, align)  # for the independent references below
    return c, site


def run(c, site, m):
    with torch.no_grad():
        return c.run({site: m})


def test_graph_shape_and_names(random_model):
    cfg = random_model.cfg
    site = EdgeSite.of(cfg)
    L, H = cfg.n_layers, cfg.n_heads
    G = cfg.n_key_value_heads or H
    senders = 1 + L * H + (0 if cfg.attn_only else L)
    assert len(site.senders) == senders
    names = site.names
    assert len(names) == len(set(names))
    assert "input->a0.h0<q>" in names and "a0.h1->logits" in names and "input->m0" in names
    assert "a1.h0->a0.h1<q>" not in names  # no edge backwards
    assert "a0.h1->m0" in names  # an MLP reads its own layer's heads
    kv = "a1.h0<k>" if G == H else "a1.g0<k>"
    assert f"a0.h1->{kv}" in names
    # receivers per layer: H queries, G keys, G values, one MLP
    assert sum(1 for r in site.receivers if r.layer == 0) == H + 2 * G + 1


def test_full_and_empty_edge_sets_are_the_two_runs(contrast):
    c, site = contrast
    E = len(site.edges)
    torch.testing.assert_close(run(c, site, torch.ones(1, E))[0], c.clean_source, atol=2e-5, rtol=0)
    torch.testing.assert_close(run(c, site, torch.zeros(1, E))[0], c.clean_base, atol=2e-5, rtol=0)


def test_out_edges_of_a_head_equal_patching_its_output(contrast, random_model):
    c, site = contrast
    for L, h in [(0, 1), (1, 3), (2, 0)]:
        m = site.mask([[e for e, n in enumerate(site.names) if n.startswith(f"a{L}.h{h}->")]])
        z = torch.zeros(1, random_model.cfg.n_heads)
        z[0, h] = 1
        with torch.no_grad():
            node = c.run({f"blocks.{L}.attn.hook_z": z})
        torch.testing.assert_close(run(c, site, m), node, atol=1e-4, rtol=0)


def test_in_edges_of_the_logits_equal_patching_the_final_residual(contrast, random_model):
    """Every edge into a receiver patched = that receiver's input replaced by the other run's: for the logits,
    the final residual stream at the aligned positions (which hold every scored position), i.e. the other
    run's scores; and the same through a node patch of the last block's output."""
    c, site = contrast
    n_layers = random_model.cfg.n_layers
    into_logits = site.mask([[e for e, n in enumerate(site.names) if n.endswith("->logits")]])
    torch.testing.assert_close(run(c, site, into_logits)[0], c.clean_source, atol=2e-5, rtol=0)
    with torch.no_grad():
        node = c.run({f"blocks.{n_layers - 1}.hook_resid_pre": torch.ones(1, 1)})[0]
    last_layer = site.mask([[e for e, n in enumerate(site.names)
                             if n.endswith("->logits") and not n.startswith(f"a{n_layers - 1}.")
                             and not n.startswith(f"m{n_layers - 1}->")]
                            + [e for e, n in enumerate(site.names) if "->" in n and n.split("->")[1].startswith(
                                (f"a{n_layers - 1}.", f"m{n_layers - 1}")) and not n.startswith(
                                (f"a{n_layers - 1}.", f"m{n_layers - 1}->"))]])
    # every edge from layers < L-1 into layer L-1 and the logits = the residual entering layer L-1 patched
    torch.testing.assert_close(run(c, site, last_layer)[0], node, atol=1e-4, rtol=0)


def _receiver_input_patched(model, c, hook, unit):
    """Reference, one hooked forward per row: the receiver's whole input (e.g. blocks.1.hook_q_input[:, :, h])
    replaced by the other run's at the aligned positions."""
    from surgeon.sites.edges import split_inputs
    from surgeon.case.encoding import align

    out = torch.zeros(len(c.clean_base))
    base, source, how = c.test_rows
    with split_inputs(model), torch.no_grad():
        for b, s in zip(base, source):
            pb, ps = align(b, s, how)
            _, cache = model.run_with_cache(torch.tensor([s.tokens]), names_filter=[hook])
            src = cache[hook][0]

            def patch(act, hook, src=src, pb=pb, ps=ps):
                act = act.clone()
                for p, q in zip(pb, ps):
                    if unit is None:
                        act[0, p] = src[q]
                    else:
                        act[0, p, unit] = src[q, unit]
                return act

            logp = model.run_with_hooks(torch.tensor([b.tokens]), fwd_hooks=[(hook, patch)])[0].log_softmax(-1)
            out[b.item] += sum(sign * logp[p, t] for p, t, sign in b.targets)
    return out


def test_in_edges_of_a_receiver_equal_patching_its_input(contrast, random_model):
    """Every edge into one receiver patched = that receiver's input node patched (q, k and v inputs of a head,
    with split q/k/v inputs; the MLP's input), checked against independent hooks; under grouped-query attention
    the k/v receivers are the key/value heads."""
    c, site = contrast
    cfg = random_model.cfg
    grouped = (cfg.n_key_value_heads or cfg.n_heads) != cfg.n_heads
    kv = "g" if grouped else "h"
    cases = [("a1.h2<q>", "blocks.1.hook_q_input", 2), (f"a2.{kv}1<k>", "blocks.2.hook_k_input", 1),
             (f"a1.{kv}0<v>", "blocks.1.hook_v_input", 0)]
    if not cfg.attn_only:
        cases.append(("m1", "blocks.1.hook_mlp_in", None))
    for receiver, hook, unit in cases:
        m = site.mask([[e for e, n in enumerate(site.names) if n.split("->")[1] == receiver]])
        assert m.sum() > 0
        torch.testing.assert_close(run(c, site, m)[0], _receiver_input_patched(random_model, c, hook, unit),
                                   atol=1e-4, rtol=0)


def test_batched_single_edges_equal_one_at_a_time(contrast, decimal_model, decimal_case):
    """Exact edge verification puts many single edges in one batch, each group starting at its own first
    layer with every sender's difference precomputed: the same scores as patching each edge alone (both
    random architectures and the decimal organism, whose formats differ in length)."""
    from surgeon.analyses.common import make_contrast
    from surgeon.sites.edges import EdgeSite

    c, site = contrast
    dsite = EdgeSite.of(decimal_model.cfg)
    dc, _ = make_contrast(decimal_case, decimal_model, sites=dsite.node_sites())
    for cc, ss in ((c, site), (dc, dsite)):
        gen = torch.Generator().manual_seed(0)
        pick = torch.randperm(len(ss.edges), generator=gen)[:16]
        m = torch.zeros(len(pick), len(ss.edges))
        m[torch.arange(len(pick)), pick] = 1
        layers = {ss.receivers[ss.edges[int(e)][1]].layer for e in pick}
        assert len(layers) >= 2  # the batch spans several first layers
        with torch.no_grad():
            batched = cc.run({ss: m})
            alone = torch.cat([cc.run({ss: m[i: i + 1]}) for i in range(len(pick))])
        torch.testing.assert_close(batched, alone, atol=1e-4, rtol=0)


def test_eap_is_the_derivative_of_exact_edge_patching(contrast):
    c, site = contrast
    E = len(site.edges)
    m = torch.zeros(1, E, requires_grad=True)
    with torch.enable_grad():
        c.run({site: m}).sum().backward()
    g = m.grad[0]
    top = g.abs().argsort(descending=True)[:6]
    eps = 1e-3
    P = torch.zeros(len(top), E)
    P[torch.arange(len(top)), top] = eps
    fd = (run(c, site, P).sum(1) - c.clean_base.sum()) / eps
    torch.testing.assert_close(fd, g[top], atol=2e-2 * float(g.abs().max()), rtol=2e-2)


@pytest.mark.parametrize("variant", ["inputs", "activations"])
def test_eap_ig_through_the_projections_equals_its_formula_with_per_head_inputs(random_model, charset, variant):
    """EAP-IG's masks share one value per sender, so the engine takes the q/k/v edges' gradients through the
    projections and the norm (no per-head inputs): equal to EAP-IG's formula written with TransformerLens's
    per-head inputs, on LayerNorm and on RMSNorm with grouped-query attention."""
    from surgeon.analyses.circuit import edge_scores
    from tests.reference import eap_ig_reference

    fb, fs = LAYOUTS["index"]
    base, source = encode_rows(fb, ITEMS, charset, True), encode_rows(fs, ITEMS, charset, True)
    site = EdgeSite.of(random_model.cfg)
    c = Contrast(random_model, base, source, "index", sites=site.node_sites())
    ours = edge_scores(c, site, f"eap-ig-{variant}", 3)
    assert c.execution["sites"] == {"edge gradients: q/k/v through the projections, fixed differences' gradients "
                                    "pooled over patches": c.execution["forwards"] - 2}
    ref = eap_ig_reference(random_model, base, source, variant, 3)
    ref = np.array([ref[n] for n in site.names])
    assert np.abs(ours - ref).max() < 1e-4 * np.abs(ref).max(), np.abs(ours - ref).max()


def test_eap_equals_its_formula_with_per_head_inputs(random_model, charset):
    """EAP (the gradient at the zero mask, taken with the fixed sender differences and no live capture) equals
    its formula written with TransformerLens's per-head inputs: EAP-IG over activations with one step is the
    gradient at the unpatched run, group by group. On LayerNorm and on RMSNorm with grouped-query attention;
    and it is the live-difference site's gradient at zero."""
    from surgeon.analyses.circuit import edge_scores
    from tests.reference import eap_ig_reference

    fb, fs = LAYOUTS["index"]
    base, source = encode_rows(fb, ITEMS, charset, True), encode_rows(fs, ITEMS, charset, True)
    site = EdgeSite.of(random_model.cfg)
    c = Contrast(random_model, base, source, "index", sites=site.node_sites())
    ours = edge_scores(c, site, "eap")
    ref = eap_ig_reference(random_model, base, source, "activations", 1)
    ref = np.array([ref[n] for n in site.names])
    assert np.abs(ours - ref).max() < 1e-4 * np.abs(ref).max(), np.abs(ours - ref).max()
    m = torch.zeros(1, len(site.edges), requires_grad=True)
    with torch.enable_grad():
        c.run({site: m}).mean().backward()
    live = m.grad[0].numpy()
    assert np.abs(ours - live).max() < 1e-4 * np.abs(live).max()


def test_edge_gradients_at_masks_that_differ_per_receiver_take_per_head_inputs(contrast):
    """Where a sender's edges carry different values, heads read different inputs: the per-head path runs,
    and its gradient is the derivative of exact edge patching there."""
    c, site = contrast
    E = len(site.edges)
    g0 = torch.Generator().manual_seed(0)
    at = (torch.rand(1, E, generator=g0) < 0.3).float() * 0.5
    m = at.clone().requires_grad_(True)
    with torch.enable_grad():
        c.run({site: m}).sum().backward()
    assert c.execution["sites"] == {"edge gradients: per-head q/k/v inputs": 1}
    g = m.grad[0]
    top = g.abs().argsort(descending=True)[:6]
    eps = 1e-3
    P = at.repeat(len(top), 1)
    P[torch.arange(len(top)), top] += eps
    fd = (run(c, site, P).sum(1) - run(c, site, at).sum()) / eps
    torch.testing.assert_close(fd, g[top], atol=2e-2 * float(g.abs().max()), rtol=2e-2)


# ---------------------------------------------------------------------------------------------- organisms
@pytest.fixture(scope="module")
def induction_circuit(induction_model):
    from surgeon.analyses.circuit import discover

    case = load_case(f"{ROOT}/cases/induction_organism.py")
    return case, discover(case, induction_model, method="eap-ig-inputs", n_paths=5)


def test_induction_path_ranks_first(induction_circuit):
    """input -> previous-token head -> K input of the induction head -> logits, first by path patching;
    both heads in the pruned circuit."""
    from surgeon.circuits.graph import matches

    case, r = induction_circuit
    gt = case.notes["ground_truth"]
    assert r.paths and matches(r.paths[0].nodes, gt["path"]), [p.nodes for p in r.paths]
    assert r.paths[0].effect.lo > 0
    heads = {n.split("->")[0] for n in r.names(r.circuit)}
    assert gt["heads"]["previous_token"] in heads and gt["heads"]["induction"] in heads
    assert r.circuit_faithfulness >= 0.9


@pytest.mark.slow
def test_threshold_circuit_holds_the_even_heads_only(tmp_path):
    from surgeon.analyses.circuit import discover
    from surgeon.models.loading import load_model

    case = load_case(f"{ROOT}/cases/threshold_organism.py")
    r = discover(case, load_model("organism:threshold"), target=1.0, n_paths=3)
    heads = {n.split("->")[0] for n in r.names(r.circuit)} | {n.split("->")[1].split("<")[0] for n in r.names(r.circuit)}
    heads = {h for h in heads if h.startswith("a0.h")}
    assert heads == set(case.notes["ground_truth"]["heads"]["repairing"])
    assert not heads & set(case.notes["ground_truth"]["heads"]["inert"])


def test_decimal_circuit_overlaps_the_best_patched_heads(decimal_model, decimal_case):
    """The heads with the largest repair fractions in `surgeon patch` appear in the failing format's circuit
    (an honest overlap: at least half of the top 4)."""
    import numpy as np

    from surgeon.analyses import patch_heads
    from surgeon.analyses.circuit import discover

    p = patch_heads(decimal_case, decimal_model)
    top = [f"a{L}.h{u}" for L, u, _ in p.top(4)]
    r = discover(decimal_case, decimal_model, method="eap", n_paths=0, verify=0)
    nodes = {n.split("->")[0] for n in r.names(r.circuit)}
    assert np.mean([h in nodes for h in top]) >= 0.5, (top, sorted(nodes))


# ---------------------------------------------------------------------------------------------- CLI, exports
@pytest.mark.slow
def test_circuit_cli_exports_and_eval(tmp_path):
    case = f"{ROOT}/cases/threshold_organism.py"
    files = [tmp_path / f"c{x}" for x in (".graphml", ".gexf", ".json", ".mib.json", ".dot", ".tex", ".png", ".svg", ".pdf")]
    r = surgeon_cli(["circuit", case, "--faithfulness", "1.0", "--paths", "2",
                        "--out", str(tmp_path / "out"), "--export", *map(str, files)])
    assert r.returncode == 0, r.stderr
    assert "faithfulness curve" in r.stdout and "CPR" in r.stdout
    for f in files:
        assert f.exists() and f.stat().st_size > 100, f
    assert (tmp_path / "out" / "faithfulness.png").exists() and (tmp_path / "out" / "circuit.png").exists()
    g = nx.read_graphml(files[0])
    assert g.number_of_nodes() > 32
    nx.read_gexf(files[1])
    mib = json.loads(files[3].read_text())
    assert {"cfg", "nodes", "edges"} <= set(mib) and mib["cfg"]["n_heads"] == 32 and mib["semantics"] == "kept"
    inside = [n for n, d in mib["edges"].items() if d["in_graph"]]
    # a kept circuit, ablated at the aligned positions (align="last"): the repair enters each even head's query
    # (or leaves through its
    # output); every edge of the circuit belongs to an even head, and every even head is in it
    heads = {p.split("<")[0] for e in inside for p in e.split("->")} - {"input", "logits"}
    assert heads == {f"a0.h{h}" for h in range(0, 32, 2)}
    assert {f"input->a0.h{h}<q>" for h in range(0, 32, 2)} <= set(inside)
    assert all("score" in d for d in mib["edges"].values())
    assert "rank=same" in files[4].read_text() and "\\begin{tikzpicture}" in files[5].read_text()
    assert files[7].read_bytes()[:200].lstrip().startswith(b"<?xml") and files[8].read_bytes()[:5] == b"%PDF-"
    for f in (files[2], files[3]):
        r = surgeon_cli(["circuit-eval", case, str(f)])
        assert r.returncode == 0, r.stderr
        assert "faithfulness = 1.000" in r.stdout


def test_circuit_cli_refuses_bad_exports_before_computing(tmp_path):
    r = surgeon_cli(["circuit", f"{ROOT}/cases/threshold_organism.py", "--export",
                        str(tmp_path / "c.xyz")])
    assert r.returncode == 2 and "--export" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------- circuits/ is current
def _numbers_and_text(report: str):
    import re

    nums = [float(x) for x in re.findall(r"[-+]?\d+\.\d+", report)]
    return nums, re.sub(r"[-+]?\d+\.\d+", "#", report)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["decimal_organism", "induction_organism", "threshold_organism"])
def test_shipped_circuits_are_current(tmp_path, name):
    """circuits/ holds what `python circuits/regenerate.py` makes now: same report, same scored graph, same circuit,
    every export format present and holding that circuit. Fails when the organisms, the cases or the code move
    on without regenerating."""
    import runpy

    shipped = Path(ROOT) / "circuits"
    regen = runpy.run_path(str(shipped / "regenerate.py"))
    report = regen["regenerate"](name, tmp_path, run_command=lambda argv: surgeon_cli(argv, cwd=ROOT))
    old = (shipped / f"{name}.txt").read_text()
    (new_nums, new_text), (old_nums, old_text) = _numbers_and_text(report), _numbers_and_text(old)
    stale = f"circuits/{name}.* are stale: run python circuits/regenerate.py"
    assert new_text == old_text, stale
    assert np.allclose(new_nums, old_nums, atol=2e-3, rtol=0), stale
    from tests.circuits.test_exports import opens_in_its_tool

    for fmt in regen["FORMATS"]:
        assert (shipped / f"{name}.{fmt}").exists(), f"circuits/{name}.{fmt} is missing: run python circuits/regenerate.py"
        opens_in_its_tool(shipped / f"{name}.{fmt}", tmp_path)
    new, cur = (json.loads((d / f"{name}.json").read_text())["edges"] for d in (tmp_path, shipped))
    assert list(new) == list(cur), stale
    assert [e["in_graph"] for e in new.values()] == [e["in_graph"] for e in cur.values()], stale
    assert np.allclose([e["score"] for e in new.values()], [e["score"] for e in cur.values()], atol=1e-4), stale
    inside = {n for n, e in cur.items() if e["in_graph"]}
    mib = json.loads((shipped / f"{name}.mib.json").read_text())
    assert {n for n, d in mib["edges"].items() if d["in_graph"]} == inside
    g = nx.read_graphml(shipped / f"{name}.graphml")
    assert {d["name"] for _, _, d in g.edges(data=True) if not d["internal"] and d["in_circuit"]} == inside


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_edge_gradients_of_a_float64_model_are_float64(charset, arch):
    """On a float64 model the q/k/v edges' gradients are contracted in float64 (not float32): EAP and EAP-IG
    equal their formula written with per-head inputs in float64 to 1e-9 of the largest score (float32
    contraction is off by ~1e-5 there)."""
    from surgeon.analyses.circuit import edge_scores
    from tests.reference import eap_ig_reference

    model = tiny_model(charset, dtype=torch.float64, **ARCHS[arch])
    fb, fs = LAYOUTS["index"]
    base, source = encode_rows(fb, ITEMS, charset, True), encode_rows(fs, ITEMS, charset, True)
    site = EdgeSite.of(model.cfg)
    c = Contrast(model, base, source, "index", sites=site.node_sites())
    for method, ref in (("eap", eap_ig_reference(model, base, source, "activations", 1)),
                        ("eap-ig-inputs", eap_ig_reference(model, base, source, "inputs", 3))):
        ours = edge_scores(c, site, method, 3)
        assert ours.dtype == np.float64, method
        ref = np.array([ref[n] for n in site.names])
        qkv = site.graph.qkv.numpy()
        err = np.abs(ours - ref)[qkv].max() / np.abs(ref).max()
        assert err < 1e-9, (method, err)
