"""Gradients w.r.t. the masks of query/key/value edges without per-head inputs.

An edge into head h's query input adds m[s, h] * (source_s - current_s) to that head's own copy of the
residual stream, so patching edges into q/k/v receivers needs per-head inputs (TransformerLens's
`use_split_qkv_input`): every block's LayerNorm and projections then run on [rows, positions, heads,
d_model], and under gradients all of it is kept for the backward pass. EAP and EAP-IG take gradients at
masks where every sender's edges share one value (zero, or one interpolation coefficient per sender):
there every head of a layer reads the same input, x + d, with d = sum_s m[s] diff_s. So the forward pass
runs unsplit with d added to the layer-norm's input, and the gradient w.r.t. each edge's own mask value
comes from the gradient at the head's projection output, carried back by hand:

    d score / d m[s, h] = sum over rows, aligned positions of  diff_s . J_norm(x + d)^T W[h] g[h]

where g[h] is d score / d (q, k or v of head h) and J_norm the layer-norm's Jacobian. In the forward pass
this is a term of value zero at the hook (it is J (d_h - d) W[h], and d_h = d there); in the backward pass
`_EdgeGrad` returns the above for the masks and passes g on unchanged. Gradients w.r.t. everything else
(the residual stream, upstream masks through live senders) flow through the unsplit pass, where they are
the same (sum over heads of identical Jacobians). Values are exact; gradients are exact first derivatives.
"""
from __future__ import annotations

import torch
from torch import Tensor

# the backward pass builds d_model-wide gradients for as many units at once as keep one such tensor within this
# many elements (at least one unit)
CHUNK_ELEMENTS = 1 << 22


def unit_chunk(rows: int, positions: int, d_model: int, units: int) -> int:
    """Units whose input gradients [rows, positions, units, d_model] the backward pass builds at once."""
    return max(1, min(units, CHUNK_ELEMENTS // max(1, rows * positions * d_model)))


def uniform_values(graph, mask: Tensor) -> Tensor | None:
    """[P, n_senders] the one value each sender's edges carry in each row of `mask` [P, n_edges], or None
    when some sender's edges differ (receivers then read different inputs: per-head inputs are needed)."""
    m = mask.detach()
    idx = graph.sender_of.to(m.device)[None].expand_as(m)
    J = len(graph.senders)
    hi = m.new_full((m.shape[0], J), -float("inf")).scatter_reduce(1, idx, m, "amax")
    lo = m.new_full((m.shape[0], J), float("inf")).scatter_reduce(1, idx, m, "amin")
    has = torch.isfinite(hi)
    if not bool((hi[has] == lo[has]).all()):
        return None
    return torch.where(has, hi, torch.zeros_like(hi))


def norm_vjp(norm, x: Tensor, g: Tensor) -> Tensor:
    """d/dx of <norm(x), g> for TransformerLens's LayerNorm, LayerNormPre, RMSNorm and RMSNormPre (or no
    norm): x [..., 1, d] (broadcast over g's unit axis), g [..., units, d]."""
    kind = type(norm).__name__
    x = x.float()
    g = g.float()
    if kind in ("Identity",):
        return g
    w = getattr(norm, "w", None)
    if w is not None:
        g = g * w.float()
    eps = norm.eps
    if kind in ("LayerNorm", "LayerNormPre"):
        xc = x - x.mean(-1, keepdim=True)
        scale = (xc.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        xh = xc / scale
        return (g - g.mean(-1, keepdim=True) - xh * (g * xh).mean(-1, keepdim=True)) / scale
    if kind in ("RMSNorm", "RMSNormPre"):
        scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        xh = x / scale
        return (g - xh * (g * xh).mean(-1, keepdim=True)) / scale
    raise NotImplementedError(f"no layer-norm Jacobian for {kind}")


def supported_norm(norm) -> bool:
    return type(norm).__name__ in ("Identity", "LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre")


def projection(attn, kind: str, cfg, bias: bool = False) -> Tensor:
    """[units, d_model, d_head] the weight mapping a (normalised) input to the hook's q, k or v per unit (with
    `bias`: [units, d_head], its bias)."""
    name = ("b_" if bias else "W_") + kind.upper()
    if kind != "q" and not getattr(cfg, "ungroup_grouped_query_attention", False):
        w = getattr(attn, "_" + name, None)
        if w is not None:
            return w
    return getattr(attn, name)


class _EdgeGrad(torch.autograd.Function):
    """Identity on the projection output `act`; its backward gives the masks `dm` [copies, k, units] the
    gradient of the edges into each unit (the module docstring's formula)."""

    @staticmethod
    def forward(ctx, act, dm, info):
        ctx.info = info
        return act.view_as(act)

    @staticmethod
    def backward(ctx, g):
        info = ctx.info
        c, n, U = info["copies"], info["n"], info["units"]
        k = info["k"]
        gq = g.view(c, n, *g.shape[1:])[:, info["idx"], info["rel"]]  # [c, n, S, U, d_head]
        x = info["x"]()  # [c, n, S, d] the layer-norm's input at the aligned positions
        W = info["W"]
        valid = info["valid"]
        out = g.new_zeros(c, k, U, dtype=torch.float32)
        fixed, lo, live = info["fixed"], info["lo"], info["live"]
        step = unit_chunk(c * n, x.shape[2], x.shape[3], U)
        for u0 in range(0, U, step):
            u1 = min(U, u0 + step)
            G = torch.einsum("cnsuh,udh->cnsud", gq[:, :, :, u0:u1].float(), W[u0:u1].float())
            dx = norm_vjp(info["norm"], x[:, :, :, None], G) * valid[None, :, :, None, None]
            dxr = dx.permute(0, 3, 1, 2, 4).reshape(c, u1 - u0, -1).transpose(1, 2)  # [c, nSd, u]
            if lo:
                out[:, :lo, u0:u1] = torch.matmul(fixed[:lo].float(), dxr)
            have = info["first_live"]
            for b in live:
                if have >= k:
                    break
                hi = min(k, have + b.shape[1])
                out[:, have:hi, u0:u1] = torch.bmm(b[:, : hi - have].float(), dxr)
                have = hi
        return g, out.to(info["dtype"]), None


def edge_grad(act: Tensor, dm: Tensor, info: dict) -> Tensor:
    return _EdgeGrad.apply(act, dm, info)
