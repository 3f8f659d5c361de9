"""Reading at a hook point (`Contrast.run(read=At(...))`) and the metric's gradient at an activation
(`Contrast.activation_gradient`), against hand-written TransformerLens hooks and autograd on the decimal organism's
rows one at a time (the aligned positions from `surgeon.case.encoding.align`, not from the engine's layout)."""
import numpy as np
import pytest
import torch

from tests.sae.test_sae import shipped


def _rows(case, model, n=6):
    """The case on n items and its rows in both formats (an item with a two-token answer has two rows, the engine
    one: the longer, scoring both tokens)."""
    from surgeon.analyses.common import format_rows

    items = case.items_for("trap")[:n]
    case = type(case)(**{**case.__dict__, "items": items, "focus": None})
    return case, format_rows(case, model, "qa", items), format_rows(case, model, "plain", items)


def _longest(rows_b, rows_s):
    last = {}
    for rb, rs in zip(rows_b, rows_s):
        last[rb.item] = (rb, rs)
    return list(last.values())


def _contrast(case, model, sites):
    from surgeon.analyses.common import make_contrast
    from surgeon.sites.nodes import Site

    c, _ = make_contrast(case, model, sites=[Site.coerce(s.hook) for s in sites], tag="all")
    return c


def test_read_at_a_hook_equals_hooks_written_by_hand(decimal_case, decimal_model):
    """Upstream feature j of the layer-1 SAE patched from plain into qa (one patch per j, in the batch dimension);
    the read: downstream feature k of the layer-2 SAE summed over the aligned positions. Each equals a hand-written
    run: the layer-1 activation at the aligned positions re-decoded with feature j moved, the layer-2 activation
    encoded, each slot weighted by its index."""
    from surgeon.engine.readout import At
    from surgeon.sites.features import FeatureSite
    from surgeon.case.encoding import align

    s1, s2 = shipped("decimal", 1), shipped("decimal", 2)
    case, rows_b, rows_s = _rows(decimal_case, decimal_model)
    up, h1, h2 = FeatureSite.of(s1), s1.cfg.metadata.hook_name, s2.cfg.metadata.hook_name
    c = _contrast(case, decimal_model, [up])
    F1, F2 = int(s1.cfg.d_sae), int(s2.cfg.d_sae)
    w = torch.randn(F2, generator=torch.Generator().manual_seed(0))
    moved = torch.zeros(F1)  # which upstream features differ between the formats (by hand)
    for rb, rs in zip(rows_b, rows_s):
        pb, ps = align(rb, rs, case.align)
        _, cb = decimal_model.run_with_cache(torch.tensor([rb.tokens]), names_filter=[h1])
        _, cs = decimal_model.run_with_cache(torch.tensor([rs.tokens]), names_filter=[h1])
        moved += (s1.encode(cs[h1][0, ps]) - s1.encode(cb[h1][0, pb])).abs().sum(0).detach()
    js = [int(j) for j in moved.argsort(descending=True)[:3]]

    def read(x, items, valid, lo):
        slot = torch.arange(1, x.shape[2] + 1, dtype=x.dtype)  # weighted by slot: a read at other positions fails
        return ((s2.encode(x) @ w.to(x.dtype)) * valid[None].to(x.dtype) * slot).sum(-1)

    got = c.run({up: torch.eye(F1)[js]}, read=At(h2, read)).double().numpy()
    assert c.execution["why"].get("read at a hook point")
    want = np.zeros((len(js), c.n_items))
    for rb, rs in _longest(rows_b, rows_s):
        pb, ps = align(rb, rs, case.align)
        _, cache = decimal_model.run_with_cache(torch.tensor([rs.tokens]), names_filter=[h1])
        f_src = s1.encode(cache[h1][0, ps])
        for a, j in enumerate(js):
            kept = {}

            def patch(act, hook, j=j):
                act = act.clone()
                cur = act[0, pb]
                f = s1.encode(cur)
                g = f.clone()
                g[:, j] = f_src[:, j]
                act[0, pb] = cur + s1.decode(g) - s1.decode(f)
                return act

            def keep(act, hook):
                kept["x"] = act[0, pb]
            with torch.no_grad():
                decimal_model.run_with_hooks(torch.tensor([rb.tokens]), fwd_hooks=[(h1, patch), (h2, keep)])
                want[a, rb.item] += float(((s2.encode(kept["x"]) @ w) * torch.arange(1, len(pb) + 1)).sum())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    clean = c.run({up: torch.zeros(1, F1)}, read=At(h2, read)).double().numpy()
    assert np.abs(want - clean).max() > 1e-3  # the patches move the read


def test_activation_gradient_equals_autograd_item_by_item(decimal_case, decimal_model):
    """d(item score)/d(activation at blocks.1.hook_mlp_out) at the aligned positions equals autograd through a
    hand-written forward of each base row (the metric: log P(right) - log P(wrong) at each answer token; an item's
    score sums its rows'), row by row."""
    from surgeon.engine.readout import final_batches, readout
    from surgeon.sites.features import FeatureSite
    from surgeon.case.encoding import align

    s1 = shipped("decimal", 1)
    case, rows_b, rows_s = _rows(decimal_case, decimal_model)
    site, h1 = FeatureSite.of(s1, error=True), s1.cfg.metadata.hook_name
    c = _contrast(case, decimal_model, [site])
    g = c.activation_gradient({site: torch.zeros(1, site.n_units())}, h1)
    assert g.shape[0] == c.n_items and g.shape[-1] == decimal_model.cfg.d_model
    want = {rb.item: torch.zeros(len(align(rb, rs, case.align)[0]), g.shape[-1])
            for rb, rs in _longest(rows_b, rows_s)}
    for rb, rs in zip(rows_b, rows_s):
        pb, _ = align(rb, rs, case.align)
        leaf = {}

        def grab(act, hook):
            act = act.detach().requires_grad_(True)
            leaf["x"] = act
            return act
        with decimal_model.hooks(fwd_hooks=[(h1, grab)]), torch.enable_grad():
            for batch, resid, pos, tok, sign in final_batches(decimal_model, [rb], 8, None):
                s = readout(decimal_model, resid, pos, tok, sign)[0]
            s.sum().backward()
        want[rb.item][: len(pb)] += leaf["x"].grad[0, pb]
    for i, w in want.items():
        np.testing.assert_allclose(g[i, : len(w)].numpy(), w.numpy(), atol=1e-4, rtol=1e-3)
        assert float(w.abs().max()) > 1e-4 and float(g[i, len(w):].abs().sum()) == 0


def test_gradient_of_a_read_with_a_hook_point_held_equals_autograd_by_hand(decimal_case, decimal_model):
    """d(read at blocks.2.hook_mlp_out)/d(mask) of the layer-0 SAE's features and error term, with blocks.1.hook_mlp_out
    held (`drop`: no gradient passes through it), equals autograd through hand-written hooks item by item; without
    holding it, the gradient differs (the path through layer 1's MLP is open)."""
    from surgeon.engine.readout import At
    from surgeon.sites.features import FeatureSite
    from surgeon.case.encoding import align

    s0, s2 = shipped("decimal", 0), shipped("decimal", 2)
    case, rows_b, rows_s = _rows(decimal_case, decimal_model)
    h0, h1, h2 = (f"blocks.{L}.hook_mlp_out" for L in range(3))
    up = FeatureSite.of(s0, error=True)
    c = _contrast(case, decimal_model, [up])
    F0, F2 = int(s0.cfg.d_sae), int(s2.cfg.d_sae)
    w = torch.randn(F2, generator=torch.Generator().manual_seed(1))

    def read(x, items, valid, lo):
        return ((s2.encode(x) @ w.to(x.dtype)) * valid[None].to(x.dtype)).sum(-1)

    grads, _ = c.gradient({up: torch.zeros(1, F0 + 1)}, drop=[h1], read=At(h2, read))
    opened, _ = c.gradient({up: torch.zeros(1, F0 + 1)}, read=At(h2, read))
    m = torch.zeros(F0 + 1, requires_grad=True)
    total = 0.0
    for rb, rs in _longest(rows_b, rows_s):
        pb, ps = align(rb, rs, case.align)
        _, cache = decimal_model.run_with_cache(torch.tensor([rs.tokens]), names_filter=[h0])
        src = cache[h0][0, ps].detach()
        f_src = s0.encode(src).detach()
        err_src = (src - s0.decode(f_src)).detach()
        kept = {}

        def patch(act, hook):
            act = act.clone()
            cur = act[0, pb]
            f = s0.encode(cur)
            rec = s0.decode(f)
            moved = s0.decode(f + m[:F0] * (f_src - f)) - rec + m[F0] * (err_src - (cur - rec))
            act[0, pb] = cur + moved
            return act

        def keep(act, hook):
            kept["x"] = act[0, pb]
        with torch.enable_grad():
            decimal_model.run_with_hooks(torch.tensor([rb.tokens]), fwd_hooks=[(h0, patch), (h1, lambda a, hook: a.detach()),
                                                                               (h2, keep)])
            total = total + (s2.encode(kept["x"]) @ w).sum()
    (total / c.n_items).backward()
    np.testing.assert_allclose(grads[up][0].numpy(), m.grad.numpy(), rtol=1e-3, atol=1e-4)
    assert float(m.grad.abs().max()) > 1e-3
    assert float((opened[up][0] - grads[up][0]).abs().max()) > 1e-3


def test_a_feature_site_with_a_source_of_its_own(decimal_case, decimal_model):
    """FeatureSite(source=X): the features move toward X's. With X the working format's activations at the aligned
    positions (gathered by hand, item by item) it scores what the default (the other run's) does; with X the failing
    format's own, patching changes nothing; one position off, it differs."""
    from surgeon.sites.features import FeatureSite
    from surgeon.case.encoding import align

    s1 = shipped("decimal", 1)
    h1 = s1.cfg.metadata.hook_name
    case, rows_b, rows_s = _rows(decimal_case, decimal_model)
    plain = FeatureSite.of(s1, error=True)
    c = _contrast(case, decimal_model, [plain])
    S = c.n_slots
    good, bad = torch.zeros(c.n_items, S, decimal_model.cfg.d_model), torch.zeros(c.n_items, S, decimal_model.cfg.d_model)
    for rb, rs in _longest(rows_b, rows_s):
        pb, ps = align(rb, rs, case.align)
        _, cs = decimal_model.run_with_cache(torch.tensor([rs.tokens]), names_filter=[h1])
        _, cb = decimal_model.run_with_cache(torch.tensor([rb.tokens]), names_filter=[h1])
        good[rb.item, : len(ps)], bad[rb.item, : len(pb)] = cs[h1][0, ps], cb[h1][0, pb]
    masks = torch.zeros(3, plain.n_units())
    masks[0, :] = 1
    masks[1, :-1] = 1
    masks[2, torch.randperm(plain.n_units() - 1, generator=torch.Generator().manual_seed(0))[:20]] = 1
    torch.set_grad_enabled(False)  # the SAE's parameters require grad
    try:
        _source_runs(c, s1, plain, masks, good, bad)
    finally:
        torch.set_grad_enabled(True)


def _source_runs(c, s1, plain, masks, good, bad):
    from surgeon.sites.features import FeatureSite

    want = c.run({plain: masks})
    got = c.run({FeatureSite.of(s1, error=True, source=good): masks})
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-4)
    same = c.run({FeatureSite.of(s1, error=True, source=bad): masks})
    np.testing.assert_allclose(same.numpy(), c.clean_base[None].expand_as(same).numpy(), rtol=1e-5, atol=1e-4)
    off = c.run({FeatureSite.of(s1, error=True, source=good.roll(1, dims=1)): masks})
    assert float((off - want).abs().max()) > 1e-3
