"""Marks et al.'s feature-circuit conventions where they differ from surgeon's (issue 49 item 5), on ground truth that
can tell them apart: a small model with GELU MLPs between its SAEs (so the score bends along the IG path), random
TopK SAEs whose error terms are far from zero, and prompts of equal length aligned at every position (several
aligned positions). The expected numbers come from their `_pe_ig` written here with TransformerLens hooks and the SAE
weights (`attribution.py` of `saprmarks/feature-circuits`: f = (1 - a) clean + a patch for a = k/N, k = 0..N-1, the
features and the error term alike, one submodule at a time with the others clean; the metric summed over the steps,
the gradients averaged, effect = grad . (patch - clean)), never from surgeon's masks or engine."""
import random
import string
import sys
from pathlib import Path

import pytest
import torch

from surgeon import Item
from surgeon.analyses.feature_circuit import POINTS
from surgeon.analyses.scoring import FEATURE_METHODS
from surgeon.case.encoding import align, encode_rows
from surgeon.engine.contrast import Contrast
from surgeon.organisms.charset import build_tokenizer
from surgeon.sites.features import FeatureSite
from tests.conftest import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
from features import make_saes  # noqa: E402

LAYERS = (0, 1)
FAILING = "Q: is {a} {b} or {b} {a}?\nA:"
WORKING = "Q: is {b} {a} or {a} {b}?\nA:"


@pytest.fixture(scope="module")
def setup():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    tok = build_tokenizer("marks-conventions")
    cfg = HookedTransformerConfig(n_layers=3, d_model=32, n_heads=4, d_head=8, d_mlp=64, n_ctx=64, d_vocab=len(tok),
                                  act_fn="gelu_new", normalization_type="LN", seed=3, default_prepend_bos=True)
    model = HookedTransformer(cfg, tokenizer=tok)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    saes = make_saes(model, LAYERS, k=6, expansion=4)  # bench/features.py's random TopK SAEs, at this width
    rng = random.Random(0)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(2))  # noqa: E731
    items = [Item({"a": word(), "b": word()}, correct=" x", incorrect=" y") for _ in range(4)]
    base = encode_rows(FAILING, items, tok, True, "first_token")
    source = encode_rows(WORKING, items, tok, True, "first_token")
    return model, saes, base, source


def _aligned(base, source):
    tokens = torch.tensor([r.tokens for r in base])
    src_tokens = torch.tensor([r.tokens for r in source])
    pairs = [align(b, s, "index") for b, s in zip(base, source)]
    pos, spos = torch.tensor([p for p, _ in pairs]), torch.tensor([q for _, q in pairs])
    return tokens, src_tokens, pos, spos, torch.arange(len(base))[:, None]


def _mean_score(model, tokens, base, hooks):
    lp = model.run_with_hooks(tokens, fwd_hooks=hooks).float().log_softmax(-1)
    score = torch.stack([sum(sign * lp[i, p, t] for p, t, sign in row.targets) for i, row in enumerate(base)])
    return score.sum() / len(base)


def _marks_pe_ig(model, saes, base, source, L, points):
    """Their `_pe_ig` for submodule L at the IG points `points`: the gradients of the mean score with respect to the
    features and the error term averaged over the points [n, S, d_sae], [n, S, d], and both runs' values."""
    sae, hook = saes[L], saes[L].cfg.metadata.hook_name
    tokens, src_tokens, pos, spos, idx = _aligned(base, source)
    with torch.no_grad():
        _, cb = model.run_with_cache(tokens, names_filter=[hook])
        _, cs = model.run_with_cache(src_tokens, names_filter=[hook])
    clean, patch = cb[hook][idx, pos], cs[hook][idx, spos]  # [n, S, d]
    f_c, f_p = sae.encode(clean), sae.encode(patch)
    r_c, r_p = clean - sae.decode(f_c), patch - sae.decode(f_p)
    g_f, g_r = torch.zeros_like(f_c), torch.zeros_like(r_c)
    for a in points:
        f = ((1 - a) * f_c + a * f_p).requires_grad_(True)
        r = ((1 - a) * r_c + a * r_p).requires_grad_(True)
        value = sae.decode(f) + r

        def put(act, hook, value=value):
            act = act.clone()
            act[idx, pos] = value.to(act.dtype)
            return act

        with torch.enable_grad():
            _mean_score(model, tokens, base, [(hook, put)]).backward()
        g_f += f.grad / len(points)
        g_r += r.grad / len(points)
    return dict(g_f=g_f, g_r=g_r, df=f_p - f_c, dr=r_p - r_c, f_c=f_c, r_c=r_c)


def _marks_ig(model, saes, base, source, L, steps):
    """Their `_pe_ig` for submodule L: [d_sae] effects on the mean score, and the error node's."""
    m = _marks_pe_ig(model, saes, base, source, L, [k / steps for k in range(steps)])
    return (m["g_f"] * m["df"]).sum((0, 1)), (m["g_r"] * m["dr"]).sum()


def _marks_jvp(model, saes, base, source, steps, down, keep=None):
    """Their `jvp` from submodule LAYERS[0] into node `down` of LAYERS[1] ((unit, error)), the left vector their
    `_pe_ig`'s averaged gradient at LAYERS[1]: [d_sae + 1] edges from every upstream feature and the error term.
    `keep` [n, S]: only those (example, position) entries of the downstream node (their `features_by_submod`)."""
    up_sae, down_sae = saes[LAYERS[0]], saes[LAYERS[1]]
    hu, hd = up_sae.cfg.metadata.hook_name, down_sae.cfg.metadata.hook_name
    tokens, _, pos, _, idx = _aligned(base, source)
    left = _marks_pe_ig(model, saes, base, source, LAYERS[1], [k / steps for k in range(steps)])
    upm = _marks_pe_ig(model, saes, base, source, LAYERS[0], [0.0])  # the upstream values and deltas
    f = upm["f_c"].clone().requires_grad_(True)
    r = upm["r_c"].clone().requires_grad_(True)
    seen = {}

    def put(act, hook):
        act = act.clone()
        act[idx, pos] = (up_sae.decode(f) + r).to(act.dtype)
        return act

    def grab(act, hook):
        seen["x"] = act[idx, pos]
        return act

    unit, error = down
    with torch.enable_grad():
        model.run_with_hooks(tokens, fwd_hooks=[(hu, put), (hd, grab)])
        x = seen["x"]
        fd = down_sae.encode(x)
        if error:
            per = (left["g_r"] * (x - down_sae.decode(fd))).sum(-1)  # [n, S]
        else:
            per = left["g_f"][..., unit] * fd[..., unit]
        objective = (per if keep is None else per * keep.to(per.dtype)).sum()
        gf, gr = torch.autograd.grad(objective, (f, r))
    return torch.cat([(gf * upm["df"]).sum((0, 1)), (gr * upm["dr"]).sum()[None]])


@pytest.mark.parametrize("steps", [3, 10])
def test_ig_marks_is_their_pe_ig_and_differs_from_the_midpoints_here(setup, steps):
    model, saes, base, source = setup
    sites = [FeatureSite.of(saes[L], error=True) for L in LAYERS]
    c = Contrast(model, base, source, "index", sites=[s.node_sites()[0] for s in sites])
    assert c.n_slots > 1  # several aligned positions
    theirs = FEATURE_METHODS["ig-marks"].score(c, sites, steps, None)
    mid = FEATURE_METHODS["ig"].score(c, sites, steps, None)
    F = 128
    for k, L in enumerate(LAYERS):
        feats, err = _marks_ig(model, saes, base, source, L, steps)
        got = torch.tensor(theirs[k * (F + 1): (k + 1) * (F + 1)])
        torch.testing.assert_close(got[:F], feats.double(), atol=1e-5, rtol=1e-3)
        torch.testing.assert_close(got[F], err.double(), atol=1e-5, rtol=1e-3)
        assert float(err.abs()) > 1e-3  # the error term is not zero here
        assert float(feats.abs().max()) > 1e-3
    # the two conventions give other numbers on this model (the score bends between the SAEs)
    diff = float(abs(torch.tensor(theirs) - torch.tensor(mid)).max())
    assert diff > 1e-3 * float(abs(torch.tensor(mid)).max()), diff


def _marks_exact(model, saes, base, source, L, feature):
    """Their `_pe_exact` for one feature of submodule L, node effects summed over positions: at each aligned position
    alone, the feature moved to the other run's value there (the rest of the activation, error term included, left
    as it is), the change in the mean score; summed over the positions."""
    sae, hook = saes[L], saes[L].cfg.metadata.hook_name
    tokens = torch.tensor([r.tokens for r in base])
    src_tokens = torch.tensor([r.tokens for r in source])
    pairs = [align(b, s, "index") for b, s in zip(base, source)]
    n = len(base)

    def mean_score(hooks=()):
        lp = model.run_with_hooks(tokens, fwd_hooks=list(hooks)).float().log_softmax(-1)
        return float(sum(sign * lp[i, p, t] for i, row in enumerate(base) for p, t, sign in row.targets)) / n

    with torch.no_grad():
        _, cs = model.run_with_cache(src_tokens, names_filter=[hook])
        clean = mean_score()
        total = 0.0
        for j in range(len(pairs[0][0])):
            def put(act, hook, j=j):
                act = act.clone()
                for i, (pb, ps) in enumerate(pairs):
                    f_here = sae.encode(act[i, pb[j]])[feature]
                    f_there = sae.encode(cs[hook.name][i, ps[j]])[feature]
                    act[i, pb[j]] += (f_there - f_here) * sae.W_dec[feature]
                return act

            total += mean_score([(hook, put)]) - clean
    return total


def test_per_position_exact_is_their_pe_exact_summed_and_differs_from_joint_here(setup):
    """exact="per-position" gives Marks et al.'s node effect (each position alone, summed), checked against their
    loop written with hooks; on this model (GELU between the SAEs, several aligned positions) patching every position
    at once gives another number."""
    from surgeon.analyses.feature_circuit import per_position_exact, run_nodes

    model, saes, base, source = setup
    sites = [FeatureSite.of(saes[L], error=True) for L in LAYERS]
    c = Contrast(model, base, source, "index", sites=[s.node_sites()[0] for s in sites])
    clean = c.clean_base.double().cpu().numpy()
    F = 128
    # features that move here: the largest difference between the runs' encodings at the first SAE
    L0 = LAYERS[0]
    top = [int(i) for i in torch.argsort(-torch.tensor(FEATURE_METHODS["gradient"].score(c, sites, 1, None))[:F].abs())[:3]]
    per = per_position_exact(c, sites, top, clean)  # [top, items]
    joint = run_nodes(c, sites, [[i] for i in top])
    for k, f in enumerate(top):
        theirs = _marks_exact(model, saes, base, source, L0, f)
        assert float((per[k] - clean).mean()) == pytest.approx(theirs, abs=1e-5, rel=1e-4)
    gaps = [abs(float((per[k] - joint[k]).mean())) for k in range(len(top))]
    assert max(gaps) > 1e-4, gaps


def _surgeon(setup):
    model, saes, base, source = setup
    sites = [FeatureSite.of(saes[L], error=True) for L in LAYERS]
    return sites, Contrast(model, base, source, "index", sites=[s.node_sites()[0] for s in sites])


def test_ig_marks_edges_weight_by_their_ig_averaged_gradient(setup):
    """Edges under --method ig-marks are Marks et al.'s `jvp` with their left vector (the downstream node's gradient
    averaged over their IG points), written here with hooks, into a feature and into the error node; the edges of
    the other methods (the gradient in the unpatched run) and a left vector at the midpoints differ from it here."""
    from surgeon.analyses.feature_circuit import node_list
    from surgeon.analyses.feature_edges import edge_attribution

    model, saes, base, source = setup
    sites, c = _surgeon(setup)
    nodes = node_list(sites)
    F = 128
    steps = 4
    fd = saes[LAYERS[1]].encode(c.activations(saes[LAYERS[1]].cfg.metadata.hook_name, "base")[:, :, 0])
    active = int(fd.sum((0, 1)).argmax())  # a downstream feature that is on
    pts = POINTS["ig-marks"].edges(steps)
    for unit, error in [(active, False), (F, True)]:
        d = (F + 1) + unit
        theirs = _marks_jvp(model, saes, base, source, steps, (unit, error)).double()
        got = edge_attribution(c, sites, nodes, down=[d], left_points=pts)
        mine = torch.tensor([got[(u, d)] for u in range(F + 1)], dtype=torch.float64)
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-3)
        assert float(theirs.abs().max()) > 1e-3
        for other in (None, (torch.arange(steps) + 0.5) / steps):  # the unpatched gradient, the midpoints
            o = edge_attribution(c, sites, nodes, down=[d], left_points=other)
            diff = float((torch.tensor([o[(u, d)] for u in range(F + 1)]) - theirs).abs().max())
            assert diff > 1e-3 * float(theirs.abs().max()), diff
    assert [float(a) for a in POINTS["ig"].edges(steps)] == [0.0] == [float(a) for a in POINTS["gradient"].edges(steps)]


@pytest.mark.parametrize("method", ["ig-marks", "ig", "gradient"])
def test_per_example_effects_are_their_per_example_effects(setup, method):
    """Each node's effect on each item at each aligned position (what --threshold-over example thresholds) is Marks
    et al.'s per-example, per-position effect (their `_pe_ig` at the method's points: theirs for ig-marks, the
    midpoints for ig, 0 for the gradient), sums to the method's attribution (so the points registered beside a method
    are the ones its attribution uses, for every method registered), and on this model picks nodes that a threshold on
    the attribution does not."""
    assert set(POINTS) == set(FEATURE_METHODS)
    from surgeon.analyses.feature_circuit import per_example_effects, per_example_peak

    model, saes, base, source = setup
    sites, c = _surgeon(setup)
    steps = 5
    n, F = len(base), 128
    eff = per_example_effects(c, sites, method, steps)  # [n, S, nodes of one slot]
    assert eff.shape == (n, c.n_slots, 2 * (F + 1))
    points = [float(a) for a in POINTS[method].nodes(steps)]
    for k, L in enumerate(LAYERS):
        m = _marks_pe_ig(model, saes, base, source, L, points)
        theirs = torch.cat([m["g_f"] * m["df"], (m["g_r"] * m["dr"]).sum(-1, keepdim=True)], -1) * n  # per item
        torch.testing.assert_close(eff[..., k * (F + 1): (k + 1) * (F + 1)], theirs.double(), atol=1e-6, rtol=1e-3)
    attr = torch.tensor(FEATURE_METHODS[method].score(c, sites, steps, None))
    torch.testing.assert_close(eff.sum((0, 1)) / n, attr, atol=1e-6, rtol=1e-3)
    peak = torch.tensor(per_example_peak(eff, False))
    torch.testing.assert_close(peak, eff.abs().flatten(0, 1).max(0).values)
    T = float(attr.abs().sort(descending=True).values[9])  # the mean threshold keeps the top 10 nodes
    by_example = set(torch.nonzero(peak >= T).flatten().tolist())
    assert by_example - set(torch.nonzero(attr.abs() >= T).flatten().tolist())  # nodes whose effect is on few items


def test_marks_edge_rule_computes_edges_from_the_entries_their_threshold_keeps(setup):
    """--edge-rule marks: an edge into d is computed only from d's (item, position) entries whose per-example effect
    reaches the node threshold, as their `features_by_submod` chooses the entries `jvp` runs on (written here with
    hooks); on this model it moves the edges away from those of every entry."""
    from surgeon.analyses.feature_circuit import node_list, per_example_effects
    from surgeon.analyses.feature_edges import edge_attribution, marks_entries

    model, saes, base, source = setup
    sites, c = _surgeon(setup)
    nodes = node_list(sites)
    F, steps, n = 128, 4, len(base)
    pts = POINTS["ig-marks"].edges(steps)
    eff = per_example_effects(c, sites, "ig-marks", steps)  # [n, S, nodes of one slot], score units
    m = _marks_pe_ig(model, saes, base, source, LAYERS[1], [k / steps for k in range(steps)])
    theirs_eff = torch.cat([m["g_f"] * m["df"], (m["g_r"] * m["dr"]).sum(-1, keepdim=True)], -1) * n  # per example
    fd = saes[LAYERS[1]].encode(c.activations(saes[LAYERS[1]].cfg.metadata.hook_name, "base")[:, :, 0])
    active = int(fd.sum((0, 1)).argmax())
    for unit, error in [(active, False), (F, True)]:
        d = (F + 1) + unit
        e = theirs_eff[..., unit].abs()
        v = e[e > 0].sort().values
        T = float(v[len(v) // 2 - 1] + v[len(v) // 2]) / 2  # between two entries: half kept, the rule changes something
        keep_theirs = e >= T
        keep = marks_entries(eff, nodes, [d], T)[d]
        assert torch.equal(keep, keep_theirs) and 0 < int(keep.sum()) < keep.numel()
        theirs = _marks_jvp(model, saes, base, source, steps, (unit, error), keep_theirs).double()
        got = edge_attribution(c, sites, nodes, down=[d], left_points=pts, keep={d: keep})
        mine = torch.tensor([got[(u, d)] for u in range(F + 1)], dtype=torch.float64)
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-3)
        every = _marks_jvp(model, saes, base, source, steps, (unit, error)).double()
        assert float((every - theirs).abs().max()) > 0.05 * float(every.abs().max())


def _case_of_setup(model):
    """The setup's items as a Case (the same draw), for the whole feature circuit."""
    from surgeon import Case

    rng = random.Random(0)
    word = lambda: "".join(rng.choice(string.ascii_lowercase) for _ in range(2))  # noqa: E731
    items = [Item({"a": word(), "b": word()}, correct=" x", incorrect=" y") for _ in range(4)]
    return Case(name="marks", formats={"working": WORKING, "failing": FAILING}, good="working", bad=["failing"],
                items=items, align="index", score="first_token")


@pytest.mark.parametrize("threshold_over", ["mean", "example"])
def test_which_nodes_each_threshold_rule_keeps(setup, threshold_over):
    """The nodes kept under --threshold T: 'mean' keeps those whose aggregated effect (their per-example effects,
    written with hooks, summed over positions and averaged over items) reaches T of the gap, as Marks et al. threshold
    nodes; 'example' (surgeon's own) those whose effect on one item at one position does. On this model the two
    sets differ."""
    from surgeon.analyses.feature_circuit import feature_circuit

    model, saes, base, source = setup
    case = _case_of_setup(model)
    steps, n = 4, len(base)
    tokens, src_tokens, *_ = _aligned(base, source)
    with torch.no_grad():
        gap = float(_mean_score(model, src_tokens, source, []) - _mean_score(model, tokens, base, []))
    per = []
    for L in LAYERS:
        m = _marks_pe_ig(model, saes, base, source, L, [k / steps for k in range(steps)])
        per.append(torch.cat([m["g_f"] * m["df"], (m["g_r"] * m["dr"]).sum(-1, keepdim=True)], -1) * n)
    eff = torch.cat(per, -1).double()  # [n, S, nodes]
    agg = eff.sum(1).mean(0).abs() / abs(gap)
    peak = eff.abs().amax((0, 1)) / abs(gap)
    top = agg.sort(descending=True).values
    T = float(top[5] + top[6]) / 2  # between two nodes' values: no node sits on the threshold
    want = {"mean": set(torch.nonzero(agg >= T).flatten().tolist()),
            "example": set(torch.nonzero(peak >= T).flatten().tolist())}
    assert want["mean"] != want["example"]
    r = feature_circuit(case, model, saes, method="ig-marks", steps=steps, verify=0, threshold=T,
                        threshold_over=threshold_over)
    assert set(r.directions["denoise"].circuit) == want[threshold_over]
