"""How the engine runs TransformerLens's blocks: torch's fused kernels for the MLP activation and the norms, the last
MLP only where it is read, hooks on and off, and a hook that passes no gradient back. (Attention over a shared
prefix is `prefix_attention`.)"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import Sequence

import torch
from torch import Tensor


FUSED = {"gelu_new": functools.partial(torch.nn.functional.gelu, approximate="tanh"),
         "gelu_pytorch_tanh": functools.partial(torch.nn.functional.gelu, approximate="tanh")}


def _fused_norm(norm):
    """A forward for TransformerLens's norm `norm` by torch's fused layer_norm / rms_norm (float32 and float64 models,
    where TransformerLens computes in the model's dtype too), falling back to its own forward whenever a hook is on
    its scale or normalised output (those hook points exist only in TransformerLens's)."""
    kind = type(norm).__name__
    own = type(norm).forward.__get__(norm)
    points = [norm.hook_scale, norm.hook_normalized]
    F = torch.nn.functional

    def forward(x):
        if any(p._forward_hooks or p._backward_hooks or p._forward_pre_hooks for p in points):
            return own(x)
        d = (x.shape[-1],)
        w = getattr(norm, "w", None)
        if kind in ("LayerNorm", "LayerNormPre"):
            return F.layer_norm(x, d, w, getattr(norm, "b", None), norm.eps)
        return F.rms_norm(x, d, w, norm.eps)
    return forward


class FrozenLinear(torch.autograd.Function):
    """`x @ W + b` for a frozen weight `W` [d_in, d_out] (TransformerLens's layout), computed as TransformerLens
    computes it (`F.linear(x, W.T.contiguous(), b)`: the same kernel on the same operands, so the same numbers, bf16's
    rounding included) but keeping `W` itself for the backward pass rather than the transposed copy: the gradient
    of the input needs only `grad @ W.T`. TransformerLens's own forward keeps the copy, a second copy of every weight
    matrix alive from the forward to the backward pass (bench/gpu.py: 15 GiB on Llama-3.1-8B's shape)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, b: Tensor | None):
        ctx.save_for_backward(w)
        return torch.nn.functional.linear(x, w.T.contiguous(), b)

    @staticmethod
    def backward(ctx, grad: Tensor):
        w, = ctx.saved_tensors
        return grad @ w.T, None, None


def _gated_mlp(mlp):
    """A forward for TransformerLens's GatedMLP that keeps no copy of its weights for the backward pass
    (`FrozenLinear`); its own forward whenever a weight requires a gradient or the MLP has a norm inside
    (SoLU's), and always with its hook points, in its order."""
    own = type(mlp).forward.__get__(mlp)
    weights = (mlp.W_gate, mlp.W_in, mlp.W_out)

    def forward(x):
        if any(w.requires_grad for w in weights) or getattr(mlp, "ln", None) is not None:
            return own(x)
        if mlp.W_gate.device != x.device:
            x = x.to(mlp.W_gate.device)
        pre_act = mlp.hook_pre(FrozenLinear.apply(x, mlp.W_gate, None))
        pre_linear = mlp.hook_pre_linear(FrozenLinear.apply(x, mlp.W_in, None))
        post_act = mlp.hook_post((mlp.act_fn(pre_act) * pre_linear) + mlp.b_in)
        return FrozenLinear.apply(post_act, mlp.W_out, mlp.b_out)
    return forward


@contextmanager
def fused_activations(model):
    """TransformerLens's MLP activation (`FUSED`) and norms as torch's fused kernels while the engine runs the model
    (the same formulas, equal to float rounding; the activation is 4x faster on CPU, the norms are several passes
    each in TransformerLens), and its gated MLPs keeping no copy of their weights for a backward pass (`_gated_mlp`);
    restored on exit."""
    fn = FUSED.get(getattr(model.cfg, "act_fn", None))
    mlps = [b.mlp for b in getattr(model, "blocks", []) if hasattr(getattr(b, "mlp", None), "act_fn")] if fn else []
    old = [m.act_fn for m in mlps]
    gated = [b.mlp for b in getattr(model, "blocks", []) if type(getattr(b, "mlp", None)).__name__ == "GatedMLP"
             and "forward" not in vars(b.mlp)]
    norms = []
    if getattr(model.cfg, "dtype", torch.float32) in (torch.float32, torch.float64):
        norms = [m for m in model.modules()
                 if type(m).__name__ in ("LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre")
                 and hasattr(m, "hook_scale") and hasattr(m, "hook_normalized") and "forward" not in vars(m)]
    try:
        for m in mlps:
            m.act_fn = fn
        for m in norms:
            m.forward = _fused_norm(m)
        for m in gated:
            m.forward = _gated_mlp(m)
        yield
    finally:
        for m, f in zip(mlps, old):
            m.act_fn = f
        for m in norms + gated:
            vars(m).pop("forward", None)


@contextmanager
def last_mlp_at(model, read: Tensor, copies: int):
    """The last block's MLP computed only at the positions `read` [n, T] (per row; rows are `copies` copies of
    the n) and zero elsewhere: nothing after the last layer reads the other positions but the caller, who reads
    only these (an MLP is position-wise). Its own forward whenever a hook is on a module inside it."""
    mlp = getattr(model.blocks[-1], "mlp", None)
    if mlp is None:
        yield
        return
    prev = vars(mlp).get("forward")  # the engine's own forward of a gated MLP (`fused_activations`), if set
    own = prev or type(mlp).forward.__get__(mlp)
    inner = list(mlp.modules())

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dim() != 3 or any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                                                 for m in inner):
            return own(x, *args, **kwargs)
        pos = read.to(x.device).repeat(copies, 1)  # [rows, T] (a position may repeat: several targets read it)
        at = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
        at[torch.arange(x.shape[0], device=x.device)[:, None], pos] = True
        y = own(x[at][None])[0]  # each read position once (so its gradient is counted once)
        out = y.new_zeros(x.shape[0], x.shape[1], y.shape[-1])
        out[at] = y
        return out

    mlp.forward = forward
    try:
        yield
    finally:
        if prev is None:
            vars(mlp).pop("forward", None)
        else:
            mlp.forward = prev


@contextmanager
def hooked(model, hooks: Sequence):
    """Sites' hooks on while the model runs: (TransformerLens hook point, fn(act, hook)) pairs, and forward
    pre-hooks on modules named `path:pre` (fn(module, args) -> args). Every one is removed on exit."""
    handles = []
    try:
        for name, fn in hooks:
            if name.endswith(":pre"):
                handles.append(model.get_submodule(name[: -len(":pre")]).register_forward_pre_hook(fn))
        with model.hooks(fwd_hooks=[(n, f) for n, f in hooks if not n.endswith(":pre")]):
            yield
    finally:
        for h in handles:
            h.remove()


def detached(act: Tensor, hook) -> Tensor:
    """A forward hook: the same value, with no gradient flowing back through it."""
    return act.detach()
