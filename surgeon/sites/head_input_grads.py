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
`_EdgeGrads` (at the norm's input, once a layer's q, k and v gradients are all in) returns the above for the
masks and passes g on unchanged. Gradients w.r.t. everything else
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
    acc = torch.promote_types(torch.promote_types(x.dtype, g.dtype), torch.float32)  # float64 stays float64
    x = x.to(acc)
    g = g.to(acc)
    if kind in ("Identity",):
        return g
    w = getattr(norm, "w", None)
    if w is not None:
        g = g * w.to(acc)
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


class _Stash(torch.autograd.Function):
    """Identity on a layer's q, k or v; its backward keeps the gradient there in `store` for `_EdgeGrads`."""

    @staticmethod
    def forward(ctx, act, store, kind):
        ctx.store, ctx.kind = store, kind
        return act.view_as(act)

    @staticmethod
    def backward(ctx, g):
        ctx.store[ctx.kind] = g
        return g, None, None


class _EdgeGrads(torch.autograd.Function):
    """Identity on the attention norm's (patched) input, which feeds the layer's q, k and v: autograd runs its
    backward after theirs, so the gradients `_Stash` kept there are all in, and it gives each kind's masks
    dm [copies, k, units] their gradient (the module docstring's formula) from one product per block of senders
    for all of the layer's q/k/v units (each block of sender differences read once, not once per kind)."""

    @staticmethod
    def forward(ctx, x, spec, *dms):
        ctx.spec = spec
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        # taken off ctx: the spec holds tensors of this graph (the layer's live senders), so kept there it would make a
        # cycle through autograd's nodes, which Python's collector cannot see, and every batch's graph would stay
        spec, ctx.spec = ctx.spec, None
        return (g, None, *_mask_grads(spec))


def _mask_grads(spec: dict) -> list[Tensor]:
    c, n, kinds, store = spec["copies"], spec["n"], spec["kinds"], spec["store"]
    x = spec["x"]  # [c, n, S, d] the norm's input at the aligned positions
    valid, fixed, live, first_live = spec["valid"], spec["fixed"], spec["live"], spec["first_live"]
    K = max(k for _, _, k, _ in kinds)
    lo = min(K, first_live)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32  # half models contract in float32
    outs = [x.new_zeros(c, k, W.shape[0], dtype=acc) for _, W, k, _ in kinds]
    grads = {}
    for kind, *_ in kinds:
        gk = store.pop(kind, None)
        if gk is not None:
            grads[kind] = gk.view(c, n, *gk.shape[1:])[:, spec["idx"], spec["rel"]]  # [c, n, S, U, d_head]
    units = [(i, u) for i, (kind, W, _, _) in enumerate(kinds) if kind in grads for u in range(W.shape[0])]
    step = unit_chunk(c * n, x.shape[2], x.shape[3], max(1, len(units)))
    fixed_acc = fixed[:lo].to(acc) if lo else None  # once per layer, not once per chunk of units (a half model's
    # sender differences converted to float32 for every chunk took most of EAP's time on a GPU)
    for a in range(0, len(units), step):
        chunk = units[a: a + step]
        parts: list[list[int]] = []  # [kind index, u0, u1]: runs of one kind's units in this chunk
        for i, u in chunk:
            if parts and parts[-1][0] == i:
                parts[-1][2] = u + 1
            else:
                parts.append([i, u, u + 1])
        dxr = x.new_empty(c, len(chunk), n * x.shape[2] * x.shape[3], dtype=acc)  # [c, u, nSd]
        off = 0
        for i, u0, u1 in parts:  # each kind's units through its projection and the norm, into the chunk's buffer
            G = torch.einsum("cnsuh,udh->cnsud", grads[kinds[i][0]][:, :, :, u0:u1].to(acc), kinds[i][1][u0:u1].to(acc))
            dx = norm_vjp(spec["norm"], x[:, :, :, None], G) * valid[None, :, :, None, None]
            dxr[:, off: off + u1 - u0] = dx.permute(0, 3, 1, 2, 4).reshape(c, u1 - u0, -1)
            off += u1 - u0
        dxr = dxr.transpose(1, 2)  # [c, nSd, u]
        if lo and spec.get("pooled"):  # the copies' gradients summed, contracted once with the fixed differences
            first = dxr.new_zeros(c, lo, dxr.shape[2])
            first[0] = torch.matmul(fixed_acc, dxr.sum(0))
            blocks = [first]
        else:
            blocks = [torch.matmul(fixed_acc, dxr)] if lo else []  # [c, lo, u]
        have = first_live
        for b in live:
            if have >= K:
                break
            hi = min(K, have + b.shape[1])
            blocks.append(torch.bmm(b[:, : hi - have].to(acc), dxr))
            have = hi
        res = torch.cat(blocks, dim=1) if len(blocks) > 1 else blocks[0]  # [c, K, u]
        off = 0
        for i, u0, u1 in parts:
            k = kinds[i][2]
            outs[i][:, :, u0:u1] = res[:, :k, off: off + u1 - u0]
            off += u1 - u0
    return [o.to(dt) for o, (_, _, _, dt) in zip(outs, kinds)]


def stash(act: Tensor, store: dict, kind: str) -> Tensor:
    """`act` (a layer's q, k or v) unchanged; its gradient kept in `store[kind]` during the backward pass."""
    return _Stash.apply(act, store, kind)


def edge_grads(x: Tensor, spec: dict, dms: list[Tensor]) -> Tensor:
    """`x` (the attention norm's input) unchanged; in the backward pass the masks `dms` of the layer's q/k/v
    edges (`spec["kinds"]`: (kind, weight [units, d_model, d_head], senders read, dtype) each) get their
    gradient from the q/k/v gradients `stash` kept in `spec["store"]`."""
    return _EdgeGrads.apply(x, spec, *dms)
