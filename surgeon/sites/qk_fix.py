"""AtP*'s QK fix as a site: a layer's attention patterns moved toward the patterns a query or key patch gives.

Attribution patching linearises the score in every activation. For queries and keys that is poor: they act
through the attention softmax, which saturates, so the gradient at the unpatched run can say "nothing" about a
patch that moves the pattern a lot (Kramár et al. 2024, "AtP*", section 3.1.1). The fix computes the pattern
under the patch exactly and linearises only from the pattern on:

    I_QK(u) = sum over heads h that unit u feeds, query and key positions of (A'_u - A)[h] * dM/dA[h]

with A the unpatched run's pattern at the unit's layer and A'_u the pattern when unit u's query (or key: a
key/value head, under grouped-query attention, feeds several query heads) is fully patched from the other run.
As a site: mask m [P, units of the q or k site]; at the layer's `hook_pattern`, each head's pattern becomes
A + m_u (A'_u - A) for the unit u that feeds it. The derivative w.r.t. m at 0 is I_QK; the patched patterns
A'_u come from one pass of the q/k patches over the same rows (`engine.capture`), kept with the rows' caches.
"""
from __future__ import annotations

from dataclasses import dataclass

from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site
from surgeon.sites.protocol import SiteKind, register


@register("qk_fix")
@dataclass(frozen=True)
class QKFixSite(SiteKind):
    """The key of a QK-fixed mask in `Contrast.run`: units are those of `of` (a q or k node site)."""

    of: Site

    def __post_init__(self):
        if self.of.component.name not in ("q", "k"):
            raise AnalysisError(f"the QK fix is for queries and keys, not {self.of.component.name}",
                                field="--component", fix="use q or k (other components need no fix)")

    @property
    def layer(self) -> int:
        return self.of.layer

    @property
    def name(self) -> str:
        return f"{self.of.name} (QK-fixed: through its layer's attention patterns)"

    def n_units(self, cfg) -> int:
        return self.of.n_units(cfg)

    def node_sites(self) -> list:
        return []  # the patched patterns are computed from the q/k site's own activations (see `patterns`)

    def heads(self, cfg):
        """[H] the unit feeding each query head (itself for q; its key/value head for k)."""
        import torch

        H, U = cfg.n_heads, self.n_units(cfg)
        return torch.arange(H) // (H // U)

    def patterns(self, ctx):
        """[n, H, Q, K] each head's pattern (queries from the first computed position on) when the unit feeding it
        is fully patched; computed once per rows."""
        import torch

        b, key = ctx.bucket, ("qk_fix", self.of)
        if key not in b.site_cache:
            cfg = ctx.model.cfg
            unit = self.heads(cfg)
            U = self.n_units(cfg)

            def own_heads(x, lo):  # x [c, n, H, Q, K] under patches lo..: keep each head's pattern under its unit
                return torch.stack([x[u - lo, :, unit == u] for u in range(lo, lo + x.shape[0])])

            per_unit = ctx.engine.capture(b, {self.of: torch.eye(U)}, f"blocks.{self.layer}.attn.hook_pattern",
                                          own_heads)  # [U, n, heads of the unit, Q, K]
            out = torch.empty(b.n, cfg.n_heads, *per_unit.shape[3:], dtype=per_unit.dtype, device=per_unit.device)
            for u in range(U):
                out[:, unit == u] = per_unit[u]
            b.site_cache[key] = out
        return b.site_cache[key]

    def hooks(self, ctx, mask, copies: int, offset: int, start: int) -> list:
        target = self.patterns(ctx)  # computed before the forward pass these hooks join
        n = ctx.bucket.n
        m = mask[:, self.heads(ctx.model.cfg).to(mask.device)]  # [c, H]

        def toward(pattern, hook):  # [c * n, H, Q, K]
            x = pattern.view(copies, n, *pattern.shape[1:])
            t = target.to(x.device, x.dtype)
            w = m.to(x.device, x.dtype)[:, None, :, None, None]
            return (x + w * (t - x)).view_as(pattern)

        return [(f"blocks.{self.layer}.attn.hook_pattern", toward)]
