"""AtP* (Kramár et al. 2024) against its formulas written out with TransformerLens hooks on the decimal organism
(3 layers, rotary, 8 query heads sharing 2 key/value heads):

- the QK fix: for a query (key) unit, sum over the heads it feeds of (A' - A) * dM/dA at its layer's pattern, A' the
  pattern with the unit's query (key) patched from the good format, dM/dA the gradient in the unpatched run;
- GradDrop: (1 / (L - 1)) * sum over layers l of |dM/dm with layer l's attention and MLP outputs detached|.

Rows come from the case's encoding (tokens and targets); everything else here is plain TransformerLens."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import surgeon
from surgeon.analyses.common import make_contrast
from surgeon.sites.nodes import Site
from surgeon.sites.qk_fix import QKFixSite
from surgeon.case.encoding import format_rows

LAYER = 1


@pytest.fixture(scope="module")
def case(decimal_case):
    return replace(decimal_case, items=[it for it in decimal_case.items if it.tag == "trap"][:6], focus=None)


def _rows(case, model):
    return format_rows(case, model, "qa", case.items), format_rows(case, model, "plain", case.items)


def _tail(row):
    """The aligned positions under align='last': the last prompt token and the continuation."""
    return list(range(row.n_prompt - 1, len(row.tokens)))


def _score(logits, row):
    lp = logits[0].log_softmax(-1)
    return sum(sign * lp[pos, tok] for pos, tok, sign in row.targets)


def _cache(model, row, name):
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([row.tokens]), names_filter=name)
    return cache[name][0]


def _hand_qk(model, case, comp):
    """[units] the QK-fixed estimate, mean over items, by hand."""
    cfg = model.cfg
    H = cfg.n_heads
    U = H if comp == "q" else cfg.n_key_value_heads
    feeds = torch.arange(H) // (H // U)
    pname, xname = f"blocks.{LAYER}.attn.hook_pattern", f"blocks.{LAYER}.attn.hook_{comp}"
    total = torch.zeros(U)
    base_rows, src_rows = _rows(case, model)
    for b, s in zip(base_rows, src_rows):
        tb, ts = _tail(b), _tail(s)
        toks = torch.tensor([b.tokens])
        leaf = {}

        def grad_at(pattern, hook):
            leaf["A"] = pattern.detach().clone().requires_grad_(True)
            return leaf["A"]

        _score(model.run_with_hooks(toks, fwd_hooks=[(pname, grad_at)]), b).backward()
        A, G = leaf["A"].detach()[0], leaf["A"].grad[0]  # [H, W, W]
        src = _cache(model, s, xname)
        for u in range(U):
            kept = {}

            def patch(x, hook, u=u):
                x[0, tb, u] = src[ts, u]
                return x

            def keep(pattern, hook):
                kept["A"] = pattern[0]

            with torch.no_grad():
                model.run_with_hooks(toks, fwd_hooks=[(xname, patch), (pname, keep)])
            heads = feeds == u
            total[u] += float(((kept["A"][heads] - A[heads]) * G[heads]).sum())
    return total / len(case.items)


@pytest.mark.parametrize("comp", ["q", "k"])
def test_the_qk_fix_is_its_formula(case, decimal_model, comp):
    site = Site.of(comp, LAYER)
    contrast, _ = make_contrast(case, decimal_model, sites=[site], tag="all")
    U = contrast.units(site)
    fixed = contrast.gradient({QKFixSite(site): torch.zeros(1, U)})[0][QKFixSite(site)][0]
    want = _hand_qk(decimal_model, case, comp)
    torch.testing.assert_close(fixed, want, atol=2e-5, rtol=1e-4)
    plain = contrast.gradient({site: torch.zeros(1, U)})[0][site][0]
    assert float((fixed - plain).abs().max()) > 0.05 * float(plain.abs().max())  # the fix changes the estimate


def _hand_drop_gradient(model, case, dropped: int):
    """[layers, heads] d(mean score)/d(mask of each head's z) at 0 with layer `dropped`'s outputs detached."""
    cfg = model.cfg
    base_rows, src_rows = _rows(case, model)
    grads = torch.zeros(cfg.n_layers, cfg.n_heads)
    for b, s in zip(base_rows, src_rows):
        tb, ts = _tail(b), _tail(s)
        masks = torch.zeros(cfg.n_layers, cfg.n_heads, requires_grad=True)
        hooks = []
        for L in range(cfg.n_layers):
            src = _cache(model, s, f"blocks.{L}.attn.hook_z")

            def mix(z, hook, L=L, src=src):
                z = z.clone()
                z[0, tb] = z[0, tb] + masks[L][None, :, None] * (src[ts] - z[0, tb])
                return z

            hooks.append((f"blocks.{L}.attn.hook_z", mix))
        hooks += [(f"blocks.{dropped}.hook_{x}", lambda a, hook: a.detach()) for x in ("attn_out", "mlp_out")]
        _score(model.run_with_hooks(torch.tensor([b.tokens]), fwd_hooks=hooks), b).backward()
        grads += masks.grad
    return grads / len(case.items)


def test_graddrop_is_its_formula(case, decimal_model):
    r = surgeon.attribute(case, decimal_model, method="atp*", tag="all")
    L = decimal_model.cfg.n_layers
    want = sum(_hand_drop_gradient(decimal_model, case, layer).abs() for layer in range(L)) / (L - 1)
    np.testing.assert_allclose(r.gradient, want.numpy(), atol=2e-5, rtol=1e-4)
    assert r.backward_passes == L and (r.estimate >= 0).all()
    # dropping a head's own layer leaves it no gradient; the other layers' drops differ from the plain gradient
    plain = surgeon.attribute(case, decimal_model, tag="all").gradient
    assert not np.allclose(r.gradient, np.abs(plain), atol=1e-4)


def test_atp_star_is_compared_with_the_exact_magnitudes(case, decimal_model):
    r = surgeon.attribute(case, decimal_model, method="atp*", component="q", compare=True, tag="all")
    a, b = r.estimate.ravel(), np.abs(r.exact).ravel()
    assert r.pearson == pytest.approx(float(np.corrcoef(a, b)[0, 1]), abs=1e-9)
    assert "AtP* with the QK fix" in str(r) and "(its magnitude)" in str(r)
