"""The benches' own machinery: the careful TransformerLens baselines compute what a full forward computes (and what
surgeon computes), the floor's gradient is the full forward's, every saved bench output says which commit and which
engine sources it ran on, and none predates the engine it timed."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
import scale  # noqa: E402
from careful import forward_backward, prefix_cache, read_at, repeated, suffix_residual  # noqa: E402
from saving import ENGINE, RESULTS, SOURCES, engine_sha256, sources_sha256, stale  # noqa: E402


@pytest.mark.parametrize("start", [0, 1, 2])
def test_the_careful_baseline_equals_the_full_patched_forward(decimal_model, start):
    """Prefix in a frozen KV cache, layers below `start` skipped, three patches in the batch: each copy's logits at the
    suffix equal one full forward with the same hook (written directly, without the cache)."""
    model = decimal_model
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(3, model.cfg.d_vocab, (4, 12), generator=g)
    p, H = 7, 3
    src = torch.randn(H, 4, model.cfg.d_head, generator=g)
    name = f"blocks.{start}.attn.hook_z"
    with torch.no_grad():
        kv = prefix_cache(model, toks[:, :p])
        resid = suffix_residual(model, toks[:, p:], kv, start).repeat(H, 1, 1)

        def batched(z, hook):
            for h in range(H):
                z.view(H, 4, *z.shape[1:])[h, :, 0, h] = src[h]
            return z

        with model.hooks(fwd_hooks=[(name, batched)]):
            got = model(resid, start_at_layer=start, past_kv_cache=repeated(kv, H)).view(H, 4, 12 - p, -1)
        for h in range(H):
            def one(z, hook, h=h):
                z[:, p, h] = src[h]
                return z

            want = model.run_with_hooks(toks, fwd_hooks=[(name, one)])[:, p:]
            torch.testing.assert_close(got[h], want, atol=1e-4, rtol=1e-4)
        # and the cut is not vacuous: an unpatched copy differs from a patched one
        plain = model(toks)[:, p:]
        assert (got[0] - plain).abs().max() > 1e-3


def test_every_saved_bench_output_says_what_it_ran_on():
    txts = sorted(RESULTS.glob("*.txt"))
    assert {t.stem for t in txts} >= {"patch_sweep", "subset_search", "edges", "scale", "startup"}
    for t in txts:
        run = json.loads(t.with_suffix(".json").read_text())["run"]
        assert len(run["commit"]) == 40 and len(run["engine_sha256"]) == 64, t.name
        assert len(run["sources_sha256"]) == 64, t.name
        assert run["date"][:2] == "20", t.name


def test_the_engine_hash_sees_every_engine_and_site_source(tmp_path):
    files = [p for entry in ENGINE for p in ((Path(ROOT) / entry).rglob("*.py") if (Path(ROOT) / entry).is_dir()
                                             else [Path(ROOT) / entry])]
    for f in files:
        (tmp_path / f.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, tmp_path / f.relative_to(ROOT))
    assert engine_sha256(tmp_path) == engine_sha256()
    for f in files:
        g = tmp_path / f.relative_to(ROOT)
        before = engine_sha256(tmp_path)
        g.write_text(g.read_text() + "\n")
        assert engine_sha256(tmp_path) != before, f


def _surgeon_imports(path: Path) -> set[str]:
    import ast

    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("surgeon.")}


def test_every_site_module_the_benches_can_run_is_in_the_engine_key():
    """ENGINE lists surgeon/sites file by file: every site module imported by the engine, by a site module in the
    key, by a source a bench times (SOURCES) or by a bench script is in it, so a site kind left out (e.g.
    surgeon/sites/sinks.py, the sink interventions) is one no bench can run."""
    listed = {e for e in ENGINE if e.startswith("surgeon/sites/")}
    paths = [p for p in (Path(ROOT) / "surgeon" / "engine").rglob("*.py")]
    paths += [Path(ROOT) / e for e in listed]
    for srcs in SOURCES.values():
        for src in srcs:
            q = Path(ROOT) / src
            paths += list(q.rglob("*.py")) if q.is_dir() else [q] if q.suffix == ".py" else []
    paths += list((Path(ROOT) / "bench").glob("*.py"))
    for p in paths:
        for m in _surgeon_imports(p):
            parts = m.split(".")
            if parts[:2] == ["surgeon", "sites"] and len(parts) >= 3 and (Path(ROOT) / "surgeon/sites" / f"{parts[2]}.py").exists():
                assert f"surgeon/sites/{parts[2]}.py" in listed, (p.relative_to(ROOT), m)
    assert "surgeon/sites/sinks.py" not in listed


def test_a_bench_is_stale_when_a_source_it_times_changes_and_only_then(tmp_path):
    """Each bench's key covers the engine, the sites, the case scoring and its SOURCES: an edit to
    surgeon/analyses/feature_edges.py moves the features bench's key and not the subset search's, one to the metrics or
    the encoding of rows moves every bench's; every SOURCES path exists."""
    assert set(SOURCES) == {p.stem for p in RESULTS.glob("*.json")}
    for name, paths in SOURCES.items():
        for p in paths:
            assert (Path(ROOT) / p).exists(), (name, p)
    for p in ("surgeon/engine", "surgeon/sites", "surgeon/analyses", "surgeon/search", "surgeon/circuits", "surgeon/cli",
              "surgeon/case", "surgeon/repairs", "surgeon/models"):
        shutil.copytree(Path(ROOT) / p, tmp_path / p, ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("surgeon/__init__.py", "surgeon/api.py", "surgeon/threads.py", "pyproject.toml"):
        shutil.copy(Path(ROOT) / f, tmp_path / f)
    before = {n: sources_sha256(n, tmp_path) for n in SOURCES}
    assert before == {n: sources_sha256(n) for n in SOURCES}
    f = tmp_path / "surgeon/analyses/feature_edges.py"
    f.write_text(f.read_text() + "\n")
    after = {n: sources_sha256(n, tmp_path) for n in SOURCES}
    assert after["features"] != before["features"] and after["subset_search"] == before["subset_search"]
    # the case's scoring (surgeon/case: rows, metrics) is timed by every bench: a change there makes each stale
    for src in ("surgeon/case/metrics.py", "surgeon/case/encoding.py"):
        g = tmp_path / src
        g.write_text(g.read_text() + "\n")
        again = {n: sources_sha256(n, tmp_path) for n in SOURCES}
        assert all(again[n] != after[n] for n in SOURCES), src
        after = again


# modules a bench imports without timing their code: planning.graph_size (EdgeSite's graph size, under ENGINE);
# scale.py's circuit code, which features.py imports scale.py beside (for its models and rows), not to run
_GRAPH = {"surgeon.analyses.planning"}
_NOT_TIMED = {"scale": _GRAPH, "growth": _GRAPH, "memory": _GRAPH, "gpu": _GRAPH,
              "features": {"surgeon.analyses.circuit", "surgeon.analyses.circuit_runs", "surgeon.circuits.graph"}}


def _imports(name: str, seen=None) -> set[str]:
    """The surgeon modules bench `name` imports, with those of the bench scripts it imports (scale, careful, ...)."""
    import ast

    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    out = set()
    for node in ast.walk(ast.parse((Path(ROOT) / "bench" / f"{name}.py").read_text())):
        mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for m in mods:
            if m.startswith("surgeon"):
                out.add(m)
                if isinstance(node, ast.ImportFrom):
                    out |= {f"{m}.{a.name}" for a in node.names}
            elif (Path(ROOT) / "bench" / f"{m}.py").exists():
                out |= _imports(m, seen)
    return out


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_analysis_a_bench_imports_is_in_its_key(name):
    """A bench that imports surgeon.analyses, surgeon.search or surgeon.circuits code (itself or through scale.py,
    careful.py, ...) has that module's file in its SOURCES (or under ENGINE): the staleness key sees what it times."""
    covered = ENGINE + SOURCES[name]
    for m in _imports(name):
        parts = m.split(".")
        if parts[:2] not in (["surgeon", "analyses"], ["surgeon", "search"], ["surgeon", "circuits"]) or len(parts) < 3:
            continue
        path = "/".join(parts[:3]) + ".py"
        if not (Path(ROOT) / path).exists() or ".".join(parts[:3]) in _NOT_TIMED.get(name, ()):
            continue  # a name imported from a package, not a module; or setup only
        assert any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered), (name, path)


def _tiny(kind: str):
    """A small random model of scale.py's families with the benches' character tokenizer."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from surgeon.organisms.charset import build_tokenizer

    tok = build_tokenizer("bench-test")
    extra = dict(normalization_type="LN") if kind == "gpt2" else dict(
        n_key_value_heads=2, gated_mlp=True, act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        rotary_dim=8, final_rms=True)
    cfg = HookedTransformerConfig(**{"n_layers": 3, "d_model": 32, "n_heads": 4, "d_head": 8, "d_mlp": 64, "n_ctx": 64,
                                     "d_vocab": len(tok), "act_fn": "gelu_new", "seed": 0, "default_prepend_bos": True,
                                     **extra})
    model = HookedTransformer(cfg, tokenizer=tok)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.mark.parametrize("kind", ["gpt2", "gqa-rotary"])
def test_the_careful_per_head_sweep_equals_surgeons(kind):
    """bench/scale.py's careful sweep (KV cache of the common prefix, start_at_layer, heads in the batch, logits at the
    read position) gives surgeon's per-head scores on every layer; an unpatched run does not."""
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.nodes import Site

    model = _tiny(kind)
    base, source = scale.make_rows(model, 3, 2)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    got = scale.careful_patch(model, base, source)  # [L, H, rows]; one row per item here
    c = Contrast(model, base, source, "index", sites=[Site.of("z", layer) for layer in range(L)])
    with torch.no_grad():
        want = torch.stack([c.run({Site.of("z", layer): torch.eye(H)}) for layer in range(L)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (want - c.clean_base).abs().max() > 1e-3  # the patches move the scores: the comparison is not vacuous


@pytest.mark.parametrize("kind", ["gpt2", "gqa-rotary"])
def test_the_careful_per_edge_loop_equals_surgeons_exact_edges(kind):
    """bench/scale.py's careful per-edge loop (KV cache of the common prefix, each edge from its receiver's layer, a
    layer's edges in the batch, logits at the read position) gives surgeon's exact edge scores, for edges into
    queries, keys, values, MLPs and the logits; an unpatched run does not."""
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.edges import EdgeSite

    model = _tiny(kind)
    base, source = scale.make_rows(model, 3, 2)
    site = EdgeSite.of(model.cfg)
    kinds = {}
    for e, (_, r) in enumerate(site.edges):  # a few edges of every receiver kind, at several layers
        kinds.setdefault((site.receivers[r].kind, site.receivers[r].layer), []).append(e)
    top = [e for es in kinds.values() for e in es[:2]]
    got = scale.careful_edge_loop(model, site, base, source, top, batch_size=8)  # chunks of 2 edges
    c = Contrast(model, base, source, "index", sites=site.node_sites())
    onehot = torch.zeros(len(top), len(site.edges))
    onehot[torch.arange(len(top)), torch.tensor(top)] = 1
    with torch.no_grad():
        want = c.run({site: onehot})
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert (want - c.clean_base).abs().max() > 1e-3


def test_the_floor_takes_the_gradient_a_full_forward_gives():
    """The EAP floor (logits only at the read positions, weights frozen) back-propagates the same gradient to the
    embedding as a full forward with every position's logits, and leaves no weight gradient."""
    model = _tiny("gpt2")
    base, _ = scale.make_rows(model, 2, 2)
    tokens = torch.tensor([r.tokens for r in base])
    pos, tok = read_at(base)
    grads = []

    def keep(x, hook):  # the first block's input: its gradient is what every later block sends back
        x.retain_grad()
        grads.append(x)
        return x

    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", keep)]):
        forward_backward(model, tokens, pos, tok)
    leaf = lambda x, hook: x.detach().requires_grad_(True)  # noqa: E731
    with model.hooks(fwd_hooks=[("hook_embed", leaf), ("blocks.0.hook_resid_pre", keep)]):
        logp = model(tokens).log_softmax(-1)
    logp[torch.arange(len(tokens))[:, None], pos, tok].sum().backward()
    torch.testing.assert_close(grads[0].grad, grads[1].grad, atol=1e-5, rtol=1e-5)
    assert grads[0].grad.abs().max() > 0 and all(p.grad is None for p in model.parameters())


def test_no_saved_bench_result_predates_the_engine():
    """Every bench block in the README and its pages ran on today's surgeon/engine, surgeon/sites and the sources
    the bench times (bench/saving.py's SOURCES): a change there makes this fail until `python bench/all.py` reruns
    the benches it moves."""
    from all import BENCHES

    old = [b for b in BENCHES if stale(b)]
    assert not old, f"bench results older than the code they time ({' '.join(old)}): rerun python bench/all.py --stale"


def test_the_feature_loop_equals_surgeons_feature_circuit():
    """bench/features.py's TransformerLens + sae-lens loop (Marks et al.'s IG, each node patched alone, their jvp edges
    with the SAE hook points between held) computes what surgeon's feature methods, node patches and edges do, on a
    small model with random TopK SAEs at every layer; the patches and edges are not vacuous."""
    import features

    from surgeon.analyses.feature_circuit import node_list, run_nodes
    from surgeon.analyses.feature_edges import edge_attribution
    from surgeon.analyses.scoring import FEATURE_METHODS
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.features import FeatureSite

    model = _tiny("gpt2")
    layers = (0, 1, 2)
    saes = features.make_saes(model, layers, k=8)
    base, source = scale.make_rows(model, 3, 2)
    sites = [FeatureSite.of(saes[L], error=True) for L in layers]
    nodes = node_list(sites)
    F = int(saes[0].cfg.d_sae)
    loop = features.Loop(model, saes, base, source)
    c = Contrast(model, base, source, "index", sites=[s.node_sites()[0] for s in sites])
    ours = FEATURE_METHODS["ig"].score(c, sites, 3, None)
    theirs = loop.ig(3)
    for k, L in enumerate(layers):
        torch.testing.assert_close(torch.tensor(ours[k * (F + 1): k * (F + 1) + F]), theirs[L].double(), atol=1e-5,
                                   rtol=1e-3)
    assert max(float(v.abs().max()) for v in theirs.values()) > 1e-4
    top = [int(i) for i in torch.tensor(ours).abs().argsort(descending=True) if not nodes[int(i)].error][:4]
    with torch.no_grad():
        want = torch.tensor(run_nodes(c, sites, [[i] for i in top]))
    got = loop.exact([(nodes[i].layer, nodes[i].unit) for i in top]).double()
    torch.testing.assert_close(got, want.double(), atol=1e-4, rtol=1e-4)
    assert (want - c.clean_base.double()).abs().max() > 1e-4
    down = [i for i in top if nodes[i].layer == 2] or [2 * (F + 1) + 1]
    att = edge_attribution(c, sites, nodes, down=down, up=None)
    got = loop.edges(2, 0, [nodes[i].unit for i in down]).double()  # layer 1's hook point held between
    mine = torch.tensor([[att[(u, d)] for u in range(F)] for d in down], dtype=torch.float64)
    torch.testing.assert_close(mine, got, atol=1e-5, rtol=1e-3)
    assert float(got.abs().max()) > 1e-5


def _tiny_llama():
    """A small random model with Llama's layout (grouped-query attention, gated MLP, RMSNorm, rotary)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=4, d_model=128, n_heads=8, d_head=16, n_key_value_heads=2, d_mlp=384,
                                  n_ctx=256, d_vocab=256, act_fn="silu", gated_mlp=True, normalization_type="RMS",
                                  positional_embedding_type="rotary", rotary_dim=16, final_rms=True, seed=0)
    model = HookedTransformer(cfg)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_the_work_count_is_what_the_engine_multiplies():
    """bench/growth.py's column (c) counts the matrix-multiply work of the engine's calls from its job description
    (no fit); torch's FLOP counter, run around the engine itself on the Llama workload's rows (prompts of 45 and 15
    tokens, answers of 3, aligned at the last prompt token and the answer), agrees within 20% for the per-head sweep,
    a subset search and EAP; for exact edges the count (from layer 0) is an upper bound. A count that recomputed every
    position under a patch, or forgot the clean runs, fails."""
    import numpy as np
    from torch.utils.flop_counter import FlopCounterMode

    import growth

    from surgeon.analyses.circuit import edge_scores
    from surgeon.analyses.planning import graph_size
    from surgeon.engine import memory
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.edges import EdgeSite
    from surgeon.sites.nodes import Site

    model = _tiny_llama()
    cfg = model.cfg
    base, source = scale.llama_rows(45, 4), scale.llama_rows(15, 4)
    site, graph = EdgeSite.of(cfg), graph_size(cfg)
    heads = [Site.of("z", layer) for layer in range(cfg.n_layers)]

    def patch():
        c = Contrast(model, base, source, "last", sites=heads)
        with torch.no_grad():
            for s in heads:
                c.run({s: torch.eye(cfg.n_heads)})

    def subsets():
        c = Contrast(model, base, source, "last", sites=[heads[2]])
        with torch.no_grad():
            c.run({heads[2]: (torch.rand(64, cfg.n_heads, generator=torch.Generator().manual_seed(0)) > 0.5).float()})

    def eap():
        edge_scores(Contrast(model, base, source, "last", sites=site.node_sites()), site, "eap")

    def exact():
        c = Contrast(model, base, source, "last", sites=site.node_sites())
        top = torch.as_tensor(np.random.default_rng(0).permutation(len(site.edges))[:200])
        with torch.no_grad():
            c.run({site: torch.zeros(200, len(site.edges)).index_put_((torch.arange(200), top), torch.tensor(1.0))})

    jobs = {patch: memory.per_head(cfg), subsets: memory.subsets(cfg, 2, 64), eap: memory.eap(cfg, graph, 1),
            exact: memory.exact_edges(cfg, graph, 200)}
    for run, job in jobs.items():
        with FlopCounterMode(display=False) as fc:
            run()
        counted = growth.job_flops(cfg, base, source, "last", job, 256)
        if run is exact:
            assert fc.get_total_flops() <= counted, (run.__name__, fc.get_total_flops(), counted)
        else:
            assert abs(counted / fc.get_total_flops() - 1) < 0.2, (run.__name__, fc.get_total_flops(), counted)
    # and the floor the ratios divide by: a forward and a backward of every row at every position
    with FlopCounterMode(display=False) as fc:
        forward_backward(model, torch.tensor([r.tokens for r in base]), *read_at(base))
    assert abs(growth.floor_flops(cfg, base) / fc.get_total_flops() - 1) < 0.2, fc.get_total_flops()


def test_stale_compares_the_code_a_result_ran_on_not_only_that_it_exists(monkeypatch):
    """A staleness check that only asked whether the result file exists would pass every edit: a result is stale
    exactly when the sources it records differ from today's, and fresh when they are the same."""
    import json

    import saving

    name = "subset_search"
    recorded = json.loads((RESULTS / f"{name}.json").read_text())["run"]["sources_sha256"]
    monkeypatch.setattr(saving, "sources_sha256", lambda n, root=None: recorded)
    assert not saving.stale(name)
    monkeypatch.setattr(saving, "sources_sha256", lambda n, root=None: "0" * 64)
    assert saving.stale(name)


def test_the_circuit_benches_never_run_the_export_code_their_key_leaves_out(induction_model):
    """bench/saving.py's _CIRCUIT key leaves surgeon/circuits/export.py out (file formats and drawing): traced, the
    code the circuit benches time (circuit runs, every scoring method, the faithfulness curve, pruning to a target,
    the graph) executes no function of it; the held-out bench, whose discover() checks output paths, keeps it."""
    import sys

    import numpy as np

    import surgeon
    from surgeon.analyses.circuit import METHODS, edge_scores, faithfulness_curve, prune
    from surgeon.analyses.circuit_runs import circuit_runs
    from surgeon.circuits.graph import build_graph
    from surgeon.sites.edges import EdgeSite

    assert "surgeon/circuits/export.py" not in SOURCES["scale"] and "surgeon/circuits/export.py" in SOURCES["heldout"]
    ran = set()

    def trace(frame, event, arg):
        if event == "call":
            ran.add((frame.f_code.co_filename, frame.f_code.co_name))

    case = surgeon.load_case("induction_organism")
    site = EdgeSite.of(induction_model.cfg)
    sys.setprofile(trace)
    try:
        runs = circuit_runs(case, induction_model, site)
        scores = {m: edge_scores(runs.scoring, site, m) for m in METHODS if m != "exact" or len(site.edges) < 400}
        order = np.argsort(-np.abs(scores["eap"]), kind="stable")
        g = build_graph(site, scores["eap"])
        faithfulness_curve(runs, order)
        prune(runs, g, order, 0.8, None)
    finally:
        sys.setprofile(None)
    files = {f for f, _ in ran}
    assert any(f.endswith("surgeon/analyses/circuit.py") for f in files)  # the trace saw the circuit code run
    assert not [name for f, name in ran if f.endswith("surgeon/circuits/export.py")]


def test_the_least_work_counts_what_patches_share_by_hand():
    """bench/limit.py's least for head patches, against a count written out by hand: a layer's attention runs once per
    distinct nonempty patch below it, the rest of the layer once per distinct nonempty patch up to it, the logits once
    per patch, and the clean runs through every layer."""
    from types import SimpleNamespace

    from limit import head_patch_least, layer_parts, unembed_flops

    cfg = SimpleNamespace(n_layers=3, d_model=8, n_heads=2, d_head=4, d_mlp=32, gated_mlp=False, d_vocab=10)
    mlp, after_z = layer_parts(cfg)
    assert mlp == 2 * 8 * 32 * 2 and after_z == 2 * 2 * 4 * 8 + mlp
    lp = 5000.0
    pre = lp - after_z
    patches = [{0: "a"}, {0: "b"}, {0: "a", 1: "c"}, {1: "c"}, {2: "d"}]
    # layer 0: nothing below; up to it {a}, {b}                       -> 2 x after_z
    # layer 1: below {a}, {b} (the {1: c} patch is clean below 1)      -> 2 x pre
    #          up to it {a}, {b}, {a, c}, {c}                          -> 4 x after_z
    # layer 2, the last, at the 3 read positions only: below {a}, {b}, {a, c}, {c} -> 4 x pre; up to it those and {d}
    #                                                                                                 -> 5 x after_z
    # the logits: 5 patches x 3 reads; the clean runs: 11 row-positions through layers 0-1, the 3 reads at layer 2
    by_hand = (7 * (2 * after_z + 2 * pre + 4 * after_z) + 3 * (4 * pre + 5 * after_z) + 5 * 3 * unembed_flops(cfg)
               + 11 * 2 * lp + 3 * (lp + unembed_flops(cfg)))
    assert head_patch_least(cfg, lp, span=7, patches=patches, reads=3, clean=11) == pytest.approx(by_hand)


def test_the_edges_dot_products_are_what_scoring_each_edge_by_hand_counts():
    """bench/limit.py's edge_dot_least against torch's own count of scoring each edge by hand: its receiver's
    gradient dotted with its sender's difference over the row-positions and d_model, one product per edge."""
    import torch

    from limit import count_flops, edge_dot_least

    senders, receivers, span, d = 3, 4, 5, 8
    edges = [(s, r) for s in range(senders) for r in range(receivers) if s <= r]
    diff, grad = torch.randn(senders, span * d), torch.randn(receivers, span * d)
    counted = count_flops(lambda: [diff[s][None] @ grad[r][:, None] for s, r in edges])
    assert counted == edge_dot_least(len(edges), span, d) == 2 * len(edges) * span * d


def test_products_written_in_place_are_counted():
    """torch's FlopCounterMode counts baddbmm and addmm but not baddbmm_ and addmm_ (0 FLOPs), which the engine's edge
    patching accumulates with: bench/limit.py's count_flops counts them, each as its out-of-place form, 2 x m x n x k
    per product (closed form)."""
    import torch

    from limit import count_flops

    acc, a, b = torch.zeros(3, 4, 5), torch.randn(3, 4, 6), torch.randn(3, 6, 5)
    m, x, y = torch.zeros(4, 5), torch.randn(4, 6), torch.randn(6, 5)
    assert count_flops(lambda: acc.baddbmm_(a, b)) == count_flops(lambda: torch.baddbmm(acc, a, b)) == 2 * 3 * 4 * 5 * 6
    assert count_flops(lambda: m.addmm_(x, y)) == count_flops(lambda: torch.addmm(m, x, y)) == 2 * 4 * 5 * 6


@pytest.mark.parametrize("job", ["patch", "careful-patch", "exact", "careful-edge-loop", "eap", "eap-ig", "curve",
                                 "subsets-16"])
def test_the_least_is_a_lower_bound_on_the_counted_work(job):
    """On a small GPT-2-shaped model, every way bench/scale.py runs a job (surgeon's and the careful TransformerLens
    baselines) computes at least the least work bench/scale.py says the method needs, counted by torch's
    FlopCounterMode, and not many times more: a least that overstated would let a job meet its goal unearned."""
    r = scale.measure("gpt2-L3-d64", job, 2, 4, batch_size=64, count=True)
    assert r["flops"] >= 0.97 * r["least"], (r["flops"], r["least"])
    assert r["flops"] <= 4 * r["least"], (r["flops"], r["least"])


def test_the_gpu_bench_runs_every_job_on_a_small_model(tmp_path):
    """bench/gpu.py is run only where a GPU is lent, a few minutes at a time: every code path it takes (the models'
    jobs beside their baselines, the repair, the README's memory claim at the planned batch size, the results written
    as it goes) runs here first on a small model of the same layout, on the CPU, with no job failing."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(Path(ROOT) / "bench" / "gpu.py"), "--device", "cpu", "--models", "tiny",
                        "--items", "2", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads((tmp_path / "gpu.json").read_text())
    assert d["failed"] == [] and d["skipped"] == []
    names = [j["job"].strip() for j in d["jobs"]]
    for want in ("floor", "per-head sweep", "careful TL sweep", "EAP", "EAP-IG (5 steps)", "exact top-200",
                 "careful TL edge loop", "subsets", "repair", "per-head patching", "EAP (batch size"):
        assert any(n.startswith(want) for n in names), (want, names)
    assert all(j["seconds"] > 0 for j in d["jobs"]) and d["run"]["sources_sha256"]
    assert (tmp_path / "gpu.txt").read_text().startswith("== cpu")
