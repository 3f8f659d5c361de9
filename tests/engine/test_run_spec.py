"""What a call to the engine does (read at a hook point, back-propagate, drop gradients, pool, catch an activation's
gradient) is its own `RunSpec`, handed down the call, never a flag set on the engine: two calls in different modes
interleaved (one made from inside the other's callback) give each the answers it gives alone. With the mode set on
the engine around a call, the inner call would read at the outer's hook point (and recurse), or reset the outer's
mode when it returns, so the outer's later chunks would run in the wrong mode."""
import torch

from surgeon.engine.contrast import Contrast
from surgeon.engine.readout import At
from surgeon.sites.nodes import Site
from tests.engine.test_contrast import ITEMS, LONG, SHORT, rows

HOOK = "blocks.2.hook_resid_pre"


def _read(x, items, valid, lo):
    return (x.float() * valid[None, :, :, None].to(x.device)).sum((2, 3)) / (1 + items[None].to(x.device))


def _setup(model):
    c = Contrast(model, rows(model, LONG), rows(model, SHORT), "last", batch_size=2)  # several buckets and chunks
    up, down = Site.of("z", 0), Site.of("z", 1)
    U = c.units(up)
    gen = torch.Generator().manual_seed(0)
    m_up = torch.rand(3, U, generator=gen)
    m_down = torch.rand(2, c.units(down), generator=gen)
    assert len(c.buckets) > 1
    return c, up, down, m_up, m_down


def test_a_plain_run_inside_a_gradient_reads_the_metric_and_leaves_the_gradient_whole(random_model):
    c, up, down, m_up, m_down = _setup(random_model)
    g_alone, s_alone = c.gradient({up: m_up}, read=At(HOOK, _read), drop=["blocks.1.hook_resid_pre"])
    plain_alone = c.run({down: m_down})
    inner = []

    def read_and_run(x, items, valid, lo):
        inner.append(c.run({down: m_down}))  # a plain run from inside the gradient's read
        return _read(x, items, valid, lo)

    g, s = c.gradient({up: m_up}, read=At(HOOK, read_and_run), drop=["blocks.1.hook_resid_pre"])
    assert len(inner) > 1
    for x in inner:
        torch.testing.assert_close(x, plain_alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s, s_alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g[Site.coerce(up)], g_alone[Site.coerce(up)], rtol=1e-5, atol=1e-6)


def test_a_gradient_inside_a_read_leaves_the_read_and_pooling_its_own(random_model):
    c, up, down, m_up, m_down = _setup(random_model)
    read_alone = c.run({up: m_up}, read=At(HOOK, _read))
    g_alone, _ = c.gradient({down: m_down}, pool=True)
    act_alone = c.activation_gradient({up: m_up[:1]}, HOOK)
    inner = []

    def read_and_differentiate(x, items, valid, lo):
        inner.append((c.gradient({down: m_down}, pool=True)[0], c.activation_gradient({up: m_up[:1]}, HOOK)))
        return _read(x, items, valid, lo)

    got = c.run({up: m_up}, read=At(HOOK, read_and_differentiate))
    assert len(inner) > 1
    torch.testing.assert_close(got, read_alone, rtol=1e-5, atol=1e-6)
    for g, a in inner:
        torch.testing.assert_close(g[Site.coerce(down)], g_alone[Site.coerce(down)], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a, act_alone, rtol=1e-5, atol=1e-6)


def test_the_contrast_holds_its_parts_and_frees_its_caches_when_dropped(random_model):
    """The parts (clean runs, sources, grouping, gradients, probes) are held, not mixed in, each with its own state,
    and reach the Contrast through a weak reference: with the collector off, dropping the last reference to the
    Contrast frees its cached activations at once (a part holding the Contrast strongly would make a cycle that only
    a collection frees, as the EAP-IG spec left on autograd's ctx once did)."""
    import gc
    import weakref

    c, up, down, m_up, m_down = _setup(random_model)
    assert Contrast.__bases__ == (object,)
    for part in (c.runs, c.sources, c.grouping, c.gradients, c.probes):
        assert isinstance(part.engine, weakref.ProxyType)
    c.run({up: m_up})
    cached = weakref.ref(c.buckets[0].resid[0])
    c.mean_activation(up)
    mean = weakref.ref(c.sources.means[up])
    gc.disable()
    try:
        del c
        assert cached() is None and mean() is None
    finally:
        gc.enable()
