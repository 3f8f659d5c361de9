"""A new kind of site is one module plus a registration: a site that patches the residual stream along one
direction, written here against the protocol alone, runs in the engine (batched, with gradients) and gives
the scores of hand-written TransformerLens hooks."""
from dataclasses import dataclass

import pytest
import torch

from surgeon import load_case
from surgeon.engine import Contrast
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site, hook_layer
from surgeon.sites.protocol import KINDS, SiteKind, coerce, register
from surgeon.case.encoding import align
from surgeon.case.encoding import format_rows
from tests.conftest import ROOT


@register("test_direction")
@dataclass(frozen=True, eq=False)
class DirectionSite(SiteKind):
    """The residual stream entering a layer, patched along a unit direction d only:
    act <- act + m * ((source - act) . d) d."""

    hook: str
    direction: torch.Tensor

    @property
    def layer(self) -> int:
        return hook_layer(self.hook)

    @property
    def name(self) -> str:
        return f"{self.hook} along a direction"

    def n_units(self, cfg) -> int:
        return 1

    def node_sites(self):
        return [Site.coerce(self.hook)]

    def keeps_head_outputs(self, layer: int) -> bool:
        return self.layer > layer

    def hooks(self, ctx, mask, copies, offset, start):
        b = ctx.bucket
        src = b.source_acts[self.node_sites()[0]][:, :, 0]  # [n, S, d]
        rel = (b.base_pos - offset).to(ctx.device)
        idx = torch.arange(b.n)[:, None]
        m = mask[:, None, None, :] * b.slot_valid[None, :, :, None]  # [c, n, S, 1]
        d = self.direction

        def hook(act, hook):
            out = act.clone() if torch.is_grad_enabled() else act
            x = out.view(copies, b.n, *out.shape[1:])
            cur = x[:, idx, rel]  # [c, n, S, d]
            x[:, idx, rel] = cur + m * (((src - cur) @ d)[..., None] * d)
            return out

        return [(self.hook, hook)]


def hand_written(model, base_rows, source_rows, how, hook, d, m):
    """One hooked forward per row, written out with TransformerLens hooks."""
    out = torch.zeros(max(r.item for r in base_rows) + 1)
    for b, s in zip(base_rows, source_rows):
        pb, ps = align(b, s, how)
        _, cache = model.run_with_cache(torch.tensor([s.tokens]), names_filter=[hook])
        src = cache[hook][0]

        def patch(act, hook):
            act = act.clone()
            for p, q in zip(pb, ps):
                act[0, p] += m * ((src[q] - act[0, p]) @ d) * d
            return act

        logp = model.run_with_hooks(torch.tensor([b.tokens]), fwd_hooks=[(hook, patch)])[0].float().log_softmax(-1)
        out[b.item] += sum(sign * logp[p, t] for p, t, sign in b.targets)
    return out


def test_a_new_site_kind_runs_in_the_engine(decimal_model):
    case = load_case(f"{ROOT}/cases/decimal_organism.py")
    items = case.items_for("trap")[:6]
    rb = format_rows(case, decimal_model, case.bad_formats[0], items)
    rs = format_rows(case, decimal_model, case.good, items)
    c = Contrast(decimal_model, rb, rs, case.align)
    g = torch.Generator().manual_seed(0)
    d = torch.randn(decimal_model.cfg.d_model, generator=g)
    site = DirectionSite("blocks.1.hook_resid_pre", d / d.norm())
    masks = torch.tensor([[0.0], [1.0], [0.5]])
    scores = c.run({site: masks})  # three patches in the batch dimension
    torch.testing.assert_close(scores[0], c.clean_base, atol=1e-5, rtol=0)
    for p in (1, 2):
        want = hand_written(decimal_model, rb, rs, case.align, site.hook, site.direction, float(masks[p, 0]))
        torch.testing.assert_close(scores[p], want, atol=2e-4, rtol=0)
    assert (scores[1] - scores[0]).abs().max() > 1e-3  # the direction matters
    # gradients w.r.t. the mask: attribution for free, equal to a finite difference
    m = torch.zeros(1, 1, requires_grad=True)
    c.run({site: m}).mean().backward()
    eps = 1e-2
    fd = (c.run({site: torch.full((1, 1), eps)}).mean() - c.run({site: torch.full((1, 1), -eps)}).mean()) / (2 * eps)
    assert abs(float(m.grad) - float(fd)) < 1e-2 * max(1.0, abs(float(fd)))
    # mixed with a node site in one run; the engine recorded how it ran
    both = c.run({site: torch.ones(2, 1), Site.of("z", 2): torch.eye(2, c.units(Site.of("z", 2)))})
    assert both.shape == (2, c.n_items) and "plain" in c.execution["paths"]


def test_the_registry():
    assert KINDS["test_direction"] is DirectionSite and DirectionSite.kind == "test_direction"
    with pytest.raises(ValueError, match="registered twice"):
        register("test_direction")(type("Other", (SiteKind,), {}))
    assert isinstance(coerce("blocks.0.attn.hook_z"), Site)
    with pytest.raises(AnalysisError):
        coerce(3)
