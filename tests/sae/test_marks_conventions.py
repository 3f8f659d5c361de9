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


def _marks_ig(model, saes, base, source, L, steps):
    """Their `_pe_ig` for submodule L: [d_sae] effects on the mean score, and the error node's."""
    sae, hook = saes[L], saes[L].cfg.metadata.hook_name
    tokens = torch.tensor([r.tokens for r in base])
    src_tokens = torch.tensor([r.tokens for r in source])
    pairs = [align(b, s, "index") for b, s in zip(base, source)]
    pos, spos = torch.tensor([p for p, _ in pairs]), torch.tensor([q for _, q in pairs])
    n, idx = len(base), torch.arange(len(base))[:, None]
    with torch.no_grad():
        _, cb = model.run_with_cache(tokens, names_filter=[hook])
        _, cs = model.run_with_cache(src_tokens, names_filter=[hook])
    clean, patch = cb[hook][idx, pos], cs[hook][idx, spos]  # [n, S, d]
    f_c, f_p = sae.encode(clean), sae.encode(patch)
    r_c, r_p = clean - sae.decode(f_c), patch - sae.decode(f_p)
    g_f, g_r = torch.zeros_like(f_c), torch.zeros_like(r_c)
    for k in range(steps):
        a = k / steps
        f = ((1 - a) * f_c + a * f_p).requires_grad_(True)
        r = ((1 - a) * r_c + a * r_p).requires_grad_(True)
        value = sae.decode(f) + r

        def put(act, hook, value=value):
            act = act.clone()
            act[idx, pos] = value.to(act.dtype)
            return act

        with torch.enable_grad():
            lp = model.run_with_hooks(tokens, fwd_hooks=[(hook, put)]).float().log_softmax(-1)
            score = torch.stack([sum(sign * lp[i, p, t] for p, t, sign in row.targets) for i, row in enumerate(base)])
            (score.sum() / n).backward()
        g_f += f.grad / steps
        g_r += r.grad / steps
    return (g_f * (f_p - f_c)).sum((0, 1)), (g_r * (r_p - r_c)).sum()


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
