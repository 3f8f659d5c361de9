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


@contextmanager
def fused_activations(model):
    """TransformerLens's MLP activation (`FUSED`) and norms as torch's fused kernels while the engine runs the model
    (the same formulas, equal to float rounding; the activation is 4x faster on CPU, the norms are several passes
    each in TransformerLens); restored on exit."""
    fn = FUSED.get(getattr(model.cfg, "act_fn", None))
    mlps = [b.mlp for b in getattr(model, "blocks", []) if hasattr(getattr(b, "mlp", None), "act_fn")] if fn else []
    old = [m.act_fn for m in mlps]
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
        yield
    finally:
        for m, f in zip(mlps, old):
            m.act_fn = f
        for m in norms:
            vars(m).pop("forward", None)


@contextmanager
def last_mlp_at(model, read: Tensor, copies: int):
    """The last block's MLP computed only at the positions `read` [n, T] (per row; rows are `copies` copies of
    the n) and zero elsewhere: nothing after the last layer reads the other positions but the caller, who reads
    only these (an MLP is position-wise). Its own forward whenever a hook is on a module inside it."""
    mlp = getattr(model.blocks[-1], "mlp", None)
    if mlp is None or "forward" in vars(mlp):
        yield
        return
    own = type(mlp).forward.__get__(mlp)
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
        vars(mlp).pop("forward", None)


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
