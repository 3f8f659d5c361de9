"""SAE features as a site of the intervention core: masks over an SAE's features at one hook point.

An SAE reading hook point h splits the activation there into its reconstruction and an error term,

    act = decode(f) + err,   f = encode(act),   err = act - decode(f).

Patching features with mask m (one value per feature) keeps the error term and moves the features:

    act <- act + decode(f + m * (f_source - f)) - decode(f)

with f the features of this run's *current* activation (upstream patches may have changed it) and
f_source those of the other run at the aligned positions. An empty mask leaves the activation exactly
as it was (the two decodes are of the same tensor); a full mask on an SAE with a linear decoder moves
the reconstruction to the other run's and keeps this run's error. `FeatureSite` is the mask key
`Contrast.run` accepts beside node and edge sites: masks [P, d_sae] put P feature sets in the batch
dimension, and masks that require grad give d(score)/d(mask) for every feature from one backward pass.

With `error=True` the site has one more unit, the SAE's error term (Marks et al. 2024's error node): its
mask value e moves this run's error toward the other run's,

    act <- act + decode(f + m * (f_source - f)) - decode(f) + e * (err_source - err),

so masks are [P, d_sae + 1]; a full mask (every feature and the error) gives the other run's activation
exactly, whatever the SAE reconstructs.

With `source` (an activation per item [n_items, S, d] at the aligned positions, e.g. read under another patch)
the features move toward that activation's features instead of the other run's: a feature edge's exact path
patching sets one downstream feature to the value an upstream patch gave it, and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site, after_z, hook_component, hook_layer
from surgeon.sites.protocol import SiteKind, register


@register("sae_features")
@dataclass(frozen=True, eq=False)
class FeatureSite(SiteKind):
    """An SAE's features at its hook point; the key of a feature mask [P, d_sae] in `Contrast.run`."""

    sae: object  # a sae-lens SAE (encode, decode, cfg.d_sae)
    hook: str
    error: bool = False  # one more unit, the last: the SAE's error term
    source: Tensor | None = None  # [n_items, S, d] what the features move toward (default: the other run's)

    @staticmethod
    def of(sae, hook: str | None = None, error: bool = False, source: Tensor | None = None) -> "FeatureSite":
        hook = hook or sae_hook(sae)
        comp = hook_component(hook)
        if comp.units != "whole":
            raise AnalysisError(f"SAEs on {hook} are not supported as a patching site", field="--sae-id",
                                fix="use SAEs that read the residual stream, the MLP output or the attention output")
        return FeatureSite(sae, hook, error, source)

    @property
    def layer(self) -> int:
        return hook_layer(self.hook)

    @property
    def component(self):
        return hook_component(self.hook)

    @property
    def name(self) -> str:
        return f"{self.hook} (SAE features{' and error' if self.error else ''})"

    def n_units(self, cfg=None) -> int:
        return int(self.sae.cfg.d_sae) + int(self.error)

    def keeps_head_outputs(self, layer: int) -> bool:
        return self.layer > layer or self.hook in after_z(layer)

    def hooks(self, ctx, mask: Tensor, copies: int, offset: int, start: int) -> list:
        b = ctx.bucket
        rel = (b.base_pos - offset).to(ctx.device)
        if self.source is None:
            src = b.source_acts[self.node_sites()[0]]
        else:  # [n_items, S, d] -> this bucket's rows [n, S, 1, d]
            src = self.source[b.items.to(self.source.device), : rel.shape[1]][:, :, None].to(ctx.device)
        live = moving(mask, self.n_units())
        if live is not None:
            ctx.note("sae_features: only the patches that move a feature here encoded and decoded")
        return feature_hooks(self, mask, src, copies, b.n, rel, b.slot_valid, live)

    def node_sites(self) -> list[Site]:
        """The node site whose activations (base and source, at the aligned positions) the features read."""
        return [Site(self.hook, self.component)]

    def encode(self, act: Tensor) -> Tensor:
        sae = self.sae
        return sae.encode(act.to(sae.W_enc.device, sae.W_enc.dtype))

    def decode(self, f: Tensor) -> Tensor:
        return self.sae.decode(f)


def sae_hook(sae) -> str:
    hook = getattr(getattr(sae.cfg, "metadata", None), "hook_name", None) or getattr(sae.cfg, "hook_name", None)
    if not hook:
        raise AnalysisError("the SAE does not say which hook point it reads (cfg.metadata.hook_name)", field="SAE config",
                            fix="set metadata.hook_name in the SAE's cfg.json, e.g. blocks.3.hook_mlp_out")
    return hook


def moving(mask: Tensor, units: int) -> Tensor | None:
    """The patches [k] whose mask moves something at this site, where some do not (and the mask needs no gradient):
    a patch whose mask here is zero leaves the activation as it is (decode(f) - decode(f)), so its rows need neither
    the SAE's encoder nor its decoder. None: every patch moves something (or gradients flow through the mask)."""
    if mask.requires_grad:
        return None
    nz = (mask.reshape(mask.shape[0], -1, units) != 0).any(-1).any(-1)
    return None if bool(nz.all()) else torch.nonzero(nz).flatten()


def feature_hooks(site: FeatureSite, mask: Tensor, source_act: Tensor, copies: int, n: int, rel: Tensor,
                  valid: Tensor, live: Tensor | None = None) -> list:
    """The hook that patches features of mask [copies, units] (or [copies, S, units]) at the aligned positions
    (units: d_sae, and the error term last when the site has one).

    `source_act`: the other run's activation there [n, S, 1, d]; `rel` [n, S] the positions relative to
    the first position the pass computes; `valid` [n, S] 1 for real (not padded) slots; `live` (`moving`): the
    only patches that move anything here (the others' rows are left as they are, unencoded)."""
    src = source_act[:, :, 0]
    f_src = site.encode(src)  # [n, S, F]
    # [c, 1, S|1, units]; a per-slot mask may name more slots than these rows have (other rows' later slots)
    m = mask[:, None, None, :] if mask.dim() == 2 else mask[:, None, : rel.shape[1]]
    m = m.to(f_src.device, f_src.dtype) * valid.to(f_src.device, f_src.dtype)[None, :, :, None]
    F = f_src.shape[-1]
    m, e = m[..., :F], (m[..., F:] if site.error else None)  # e: [c, 1, S|1, 1], the error term's
    err_src = (src.to(f_src.device, f_src.dtype) - site.decode(f_src)) if site.error else None
    idx = torch.arange(n)[:, None]

    if live is not None:
        m, e = m[live.to(m.device)], (None if e is None else e[live.to(e.device)])

    def hook(act, hook):
        out = act.clone() if torch.is_grad_enabled() else act
        x = out.view(copies, n, *out.shape[1:])
        i, r = idx.to(x.device), rel.to(x.device)
        if live is None:
            cur = x[:, i, r]  # [c, n, S, d]
        else:
            k = live.to(x.device)
            cur = x[k[:, None, None], i, r]  # [k, n, S, d]: the patches that move something here
        f = site.encode(cur)
        rec = site.decode(f)
        moved = site.decode(f + m.to(f.device) * (f_src.to(f.device) - f)) - rec
        if e is not None:  # the error term toward the other run's: err = act - decode(encode(act))
            err = cur.to(rec.device, rec.dtype) - rec
            moved = moved + e.to(f.device) * (err_src.to(f.device) - err)
        if live is None:
            x[:, i, r] = cur + moved.to(x.device, x.dtype)
        else:
            x[k[:, None, None], i, r] = cur + moved.to(x.device, x.dtype)
        return out

    return [(site.hook, hook)]
