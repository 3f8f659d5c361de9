"""Edges as a site of the intervention core: masks over (sender, receiver) pairs.

The model's computation as a graph (EAP-IG / MIB conventions): senders are the input embedding
(`input`), every attention head's output (`a{l}.h{h}`, z_h @ W_O[h]) and every MLP (`m{l}`); receivers
are every head's query, key and value inputs (`a{l}.h{h}<q>`; under grouped-query attention the key and
value receivers are the key/value heads, `a{l}.g{g}<k>`), every MLP's input (`m{l}`) and the logits. An
edge s -> r exists when s writes the residual stream before r reads it.

Patching edge s -> r with mask value m means: r's input, at the case's aligned positions, becomes

    input_r + m * (source_s - current_s)

where current_s is sender s's output in this (possibly already patched) run and source_s its output in
the other run (or an ablation value: the mean over items, or zero). All other positions, and all
receivers of unpatched edges, read this run's values. With every edge patched, every receiver reads the
other run's residual stream: the full patch equals the source run; with none, the base run.

`EdgeSite` is the mask key `Contrast.run` accepts beside node sites: masks [P, n_edges] put P edge sets
in the batch dimension, and masks that require grad give d(score)/d(mask) for every edge from one
backward pass (edge attribution patching).
"""
from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from surgeon.errors import AnalysisError
from surgeon.sites.ablations import ABLATIONS, DIFFERENCES, EDGE_VALUES, FREEZE
from surgeon.sites.head_input_grads import edge_grads, projection, stash, supported_norm, uniform_values
from surgeon.sites.nodes import Site
from surgeon.sites.protocol import SiteKind, register


@dataclass(frozen=True)
class Receiver:
    name: str  # a1.h2<q>, a1.g0<k>, m1, logits
    layer: int  # the layer whose input it is (n_layers for the logits)
    kind: str  # q | k | v | mlp | logits
    unit: int  # head (q), key/value head (k, v), 0 otherwise


@dataclass(frozen=True)
class Sender:
    name: str  # input, a0.h1, m0
    layer: int  # -1 for the input
    kind: str  # input | head | mlp
    unit: int


def head_name(layer: int, head: int) -> str:
    return f"a{layer}.h{head}"


@dataclass(frozen=True, eq=False)
class EdgeGraph:
    """A model's graph: senders, receivers and edges in a fixed order, with the index tensors the engine
    needs, computed once per graph (shared by every site over it)."""

    senders: tuple[Sender, ...]
    receivers: tuple[Receiver, ...]
    edges: tuple[tuple[int, int], ...]  # (sender index, receiver index)
    n_layers: int

    @cached_property
    def names(self) -> list[str]:
        """EAP-IG edge names: `a0.h1->a1.h2<k>`, `input->m0`, `m1->logits`."""
        return [f"{self.senders[s].name}->{self.receivers[r].name}" for s, r in self.edges]

    @cached_property
    def position(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    @cached_property
    def index(self) -> Tensor:
        """[n_edges, 2] each edge's (sender, receiver) index."""
        return torch.tensor(self.edges, dtype=torch.long).view(-1, 2)

    def _per_receiver(self, f) -> Tensor:
        """f(receiver) per edge (one value per receiver, read through the edge index)."""
        return torch.tensor([f(r) for r in self.receivers])[self.index[:, 1]]

    @cached_property
    def first_layer(self) -> int:
        return int(self._per_receiver(lambda r: r.layer).min())

    @cached_property
    def orders(self) -> tuple[Tensor, Tensor, Tensor]:
        """Per edge: the computation order of its sender (input -1, heads of layer l 2l, MLP l 2l+1), of its
        receiver (q/k/v of layer l read before 2l, MLP l before 2l+1, logits last), and its receiver's layer."""
        so = {"input": lambda s: -1, "head": lambda s: 2 * s.layer, "mlp": lambda s: 2 * s.layer + 1}
        sender_order = torch.tensor([so[s.kind](s) for s in self.senders])[self.sender_of]
        return (sender_order, self._per_receiver(lambda r: 2 * r.layer + (1 if r.kind == "mlp" else 0)),
                self._per_receiver(lambda r: r.layer))

    @cached_property
    def sender_of(self) -> Tensor:
        """Per edge: its sender's index."""
        return self.index[:, 0].clone()

    @cached_property
    def qkv(self) -> Tensor:
        """Per edge: True where the receiver is a query, key or value input."""
        return self._per_receiver(lambda r: r.kind in "qkv")

    @cached_property
    def groups(self):
        """Per receiver group (layer, kind): receiver units, and the dense [sender, receiver] index of each edge
        (edges in their order)."""
        groups: dict[tuple[int, str], list[int]] = {}
        for ri, r in enumerate(self.receivers):
            groups.setdefault((r.layer, r.kind), []).append(ri)
        keys = list(groups)
        gid, within = torch.zeros(len(self.receivers), dtype=torch.long), torch.zeros(len(self.receivers), dtype=torch.long)
        for g, key in enumerate(keys):
            gid[groups[key]] = g
            within[groups[key]] = torch.arange(len(groups[key]))
        g_of = gid[self.index[:, 1]]
        order = torch.argsort(g_of, stable=True)  # edges grouped, in their order within a group
        counts = torch.bincount(g_of, minlength=len(keys)).tolist()
        out, lo = {}, 0
        for key, cnt in zip(keys, counts):
            if cnt:
                e = order[lo: lo + cnt]
                out[key] = (groups[key], e, self.index[e, 0], within[self.index[e, 1]])
            lo += cnt
        return out


@register("edges")
@dataclass(frozen=True, eq=False)
class EdgeSite(SiteKind):
    """Every edge of a model's graph with an ablation and a difference mode; the key of an edge mask
    [P, n_edges] in `Contrast.run`."""

    graph: EdgeGraph
    ablation: str = "resample"
    # "live": an edge carries (source - current) of its sender, current being what the sender computes in this
    # (possibly patched) pass; "fixed": (source - base), the two runs' own outputs (EAP-IG's differences)
    difference: str = "live"

    groupable = False  # each edge patch reads senders' outputs live: nothing below its last layer is shared
    split_by_first_layer = True  # a batch verifying edges one by one mostly starts at later layers

    # ------------------------------------------------------------------ construction
    @staticmethod
    def of(cfg, ablation: str = ABLATIONS[0]) -> "EdgeSite":
        if ablation not in ABLATIONS:
            raise AnalysisError(f"unknown ablation {ablation!r}", field="--ablation", fix=f"use one of: {', '.join(ABLATIONS)}")
        if getattr(cfg, "parallel_attn_mlp", False):
            raise AnalysisError("edge graphs of parallel attention/MLP blocks are not supported", field="model",
                                fix="use node patching (surgeon patch) for this architecture")
        L, H = cfg.n_layers, cfg.n_heads
        G = getattr(cfg, "n_key_value_heads", None) or H
        attn_only = bool(getattr(cfg, "attn_only", False))
        senders = [Sender("input", -1, "input", 0)]
        receivers: list[Receiver] = []
        for layer in range(L):
            receivers += [Receiver(f"{head_name(layer, h)}<q>", layer, "q", h) for h in range(H)]
            kv = (lambda g: head_name(layer, g)) if G == H else (lambda g: f"a{layer}.g{g}")
            receivers += [Receiver(f"{kv(g)}<{x}>", layer, x, g) for x in "kv" for g in range(G)]
            senders += [Sender(head_name(layer, h), layer, "head", h) for h in range(H)]
            if not attn_only:
                receivers.append(Receiver(f"m{layer}", layer, "mlp", 0))
                senders.append(Sender(f"m{layer}", layer, "mlp", 0))
        receivers.append(Receiver("logits", L, "logits", 0))
        edges = []
        for ri, r in enumerate(receivers):
            for si, s in enumerate(senders):
                if s.layer < r.layer or (r.kind == "mlp" and s.kind == "head" and s.layer == r.layer):
                    edges.append((si, ri))
        return EdgeSite(EdgeGraph(tuple(senders), tuple(receivers), tuple(edges), L), ablation)

    def variant(self, *, ablation: str | None = None, difference: str | None = None) -> "EdgeSite":
        """The same graph with another ablation or difference mode: a separate mask key."""
        if ablation is not None and ablation not in EDGE_VALUES:
            raise AnalysisError(f"unknown ablation {ablation!r}", field="--ablation", fix=f"use one of: {', '.join(ABLATIONS)}")
        if difference is not None and difference not in DIFFERENCES:
            raise AnalysisError(f"unknown difference mode {difference!r}", fix=f"use one of: {', '.join(DIFFERENCES)}")
        return EdgeSite(self.graph, ablation or self.ablation, difference or self.difference)

    senders = property(lambda self: self.graph.senders)
    receivers = property(lambda self: self.graph.receivers)
    edges = property(lambda self: self.graph.edges)
    n_layers = property(lambda self: self.graph.n_layers)
    names = property(lambda self: self.graph.names)

    @property
    def layer(self) -> int:
        """The first layer an edge acts at (receivers at layer 0 read the input)."""
        return self.graph.first_layer

    @property
    def name(self) -> str:
        return f"edges ({self.ablation}, {self.difference})"

    def n_units(self, cfg=None) -> int:
        return len(self.edges)

    def index(self, name: str) -> int:
        if name not in self.graph.position:
            raise AnalysisError(f"no edge {name!r} in this model's graph", field="edges",
                                fix="name edges as sender->receiver, e.g. a0.h1->a1.h2<k>, input->m0, m1->logits")
        return self.graph.position[name]

    def mask(self, edge_sets, device=None) -> Tensor:
        """[P, n_edges] 0/1 masks from P collections of edge names (or indices)."""
        m = torch.zeros(len(edge_sets), len(self.edges), device=device)
        for p, es in enumerate(edge_sets):
            ids = [self.index(e) if isinstance(e, str) else int(e) for e in es]
            m[p, torch.tensor(ids, dtype=torch.long, device=device)] = 1
        return m

    # ------------------------------------------------------------------ what the core needs
    # ------------------------------------------------------------------ the site protocol
    def node_sites(self) -> list[Site]:
        """Node sites whose activations (base and source, at the aligned positions) give the senders' outputs."""
        layers = sorted({s.layer for s in self.senders if s.layer >= 0})
        out = [Site.of("resid_pre", 0)] + [Site.of("z", L) for L in layers]
        out += [Site.of("mlp_out", L) for L in layers if any(s.kind == "mlp" and s.layer == L for s in self.senders)]
        return out

    def first_layers(self, mask: Tensor, n_layers: int) -> Tensor:
        """[P] the first layer each patch acts at (its earliest patched receiver; n_layers for an empty patch)."""
        _, _, rl = self.graph.orders
        return _per_patch(mask, rl, "amin", n_layers)

    def hooks(self, ctx, mask: Tensor, copies: int, offset: int, start: int) -> list:
        """Hooks that patch the edges of `mask` [copies, n_edges]; the senders' outputs in both runs are
        computed once per rows (kept in the rows' cache) from their node activations."""
        b = ctx.bucket
        key = ("edges", self.ablation, self.graph)
        if key not in b.site_cache:  # constants of the two clean runs (no graph to the weights, kept across passes)
            with torch.no_grad():
                base = sender_outputs(ctx.model, self, b.base_acts)
                if self.ablation == "mean":  # the mean over every item (or the reference set) per aligned position
                    S = b.slot_valid.shape[1]
                    mean = sender_outputs(ctx.model, self, {s: ctx.engine.mean_activation(s)[:S]
                                                            for s in self.node_sites()})
                    src = mean.to(base.device, base.dtype).expand_as(base).contiguous()
                else:
                    src = ablated_source(self, sender_outputs(ctx.model, self, b.source_acts), base)
                b.site_cache[key] = (src, base)
        src, base = b.site_cache[key]
        m = mask.to(src.device, src.dtype)
        shared = shared_values(ctx.model, self, m)  # under gradients: each sender's one value, or None
        pooled = bool(ctx.pooled and mask.requires_grad)
        if mask.requires_grad:
            ctx.note("edge gradients: " + ("q/k/v through the projections" if shared is not None
                                           else "per-head q/k/v inputs")
                     + (", fixed differences' gradients pooled over patches" if pooled else ""))
        return edge_hooks(ctx.model, self, m, src, base, copies, b.n, b.base_pos - offset, b.slot_valid, start, shared,
                          static=is_static(self, joint_mask(self, mask, ctx.masks)), pooled=pooled)

    def forward_context(self, model, mask: Tensor, masks=None):
        """Per-head query/key/value inputs where this mask patches them (all of them under gradients)."""
        return split_inputs(model, qkv_layers(self, mask, model, joint_mask(self, mask, masks)))


def joint_mask(site: EdgeSite, mask: Tensor, masks=None) -> Tensor:
    """`mask` with every edge that another edge site over the same graph patches in this pass set too (the static
    shortcut holds only when no patched receiver of *any* site feeds a patched sender: a frozen edge's sender
    changed by another site's patch must be read live)."""
    others = [m for s, m in (masks or {}).items() if s is not site and getattr(s, "graph", None) is site.graph]
    if not others or mask.requires_grad:
        return mask
    joint = mask.detach() != 0
    for m in others:
        joint = joint | (m.detach().to(joint.device) != 0)
    return joint.to(mask.dtype)


def is_static(site: EdgeSite, mask: Tensor) -> bool:
    """True when no patched edge's sender reads a patched receiver (per patch): every patched sender then keeps
    this run's output, so each edge adds a fixed (other - this run's) difference and nothing needs capturing.
    Always true for single edges; not used under gradients (EAP-IG evaluates along the mask)."""
    if mask.requires_grad:
        return False
    so, ro, _ = site.graph.orders
    inf = torch.iinfo(torch.long).max
    return bool((_per_patch(mask, so, "amax", -inf) < _per_patch(mask, ro, "amin", inf)).all())


def _per_patch(mask: Tensor, per_edge: Tensor, reduce: str, empty: int) -> Tensor:
    """[P] `reduce` (amin/amax) of `per_edge` over each patch's edges (`empty` for a patch of none), from the
    patched (patch, edge) pairs alone: no [P, n_edges] tensor of integers (1.3 GB for 200 patches of 805,681
    Llama-8B edges)."""
    p, e = torch.nonzero(mask.detach().cpu() != 0, as_tuple=True)
    out = torch.full((mask.shape[0],), empty, dtype=per_edge.dtype)
    return out.scatter_reduce_(0, p, per_edge[e], reduce)


def sender_outputs(model, site: EdgeSite, acts: dict[Site, Tensor]) -> Tensor:
    """[..., n_senders, d_model] sender outputs from node activations gathered at the aligned positions
    ([..., unit, rest] each): the input embedding, z_h @ W_O[h] per head, the MLP outputs."""
    outs = []
    cache: dict[int, Tensor] = {}
    for s in site.senders:
        if s.kind == "input":
            outs.append(acts[Site.of("resid_pre", 0)][..., 0, :])
        elif s.kind == "head":
            if s.layer not in cache:
                z = acts[Site.of("z", s.layer)]
                W_O = model.blocks[s.layer].attn.W_O  # [H, d_head, d_model]
                cache[s.layer] = torch.einsum("...hd,hdm->...hm", z, W_O.to(z.device, z.dtype))
            outs.append(cache[s.layer][..., s.unit, :])
        else:
            outs.append(acts[Site.of("mlp_out", s.layer)][..., 0, :])
    return torch.stack(outs, dim=-2)


@contextmanager
def split_inputs(model, layers=None):
    """TransformerLens's per-head query/key/value inputs and MLP-input hook, on while the block runs.

    Per-head inputs make a block's LayerNorm and projections run once per head; with `layers` (a set)
    they are on only in those blocks (where q/k/v receivers are patched), the MLP-input hook everywhere.
    The model's flags are restored on exit, and each block restores the value it found, so contexts nest
    (an enclosing context that switched per-head inputs on everywhere keeps them on)."""
    cfg = model.cfg
    old = (cfg.use_split_qkv_input, cfg.use_hook_mlp_in)
    cfg.use_split_qkv_input, cfg.use_hook_mlp_in = old[0] or layers is None, True
    handles, found = [], []
    if layers is not None and not cfg.use_split_qkv_input:
        def on(module, args):
            found.append(cfg.use_split_qkv_input)
            cfg.use_split_qkv_input = True

        def off(module, args, out):
            cfg.use_split_qkv_input = found.pop()

        for L in layers:
            handles += [model.blocks[L].register_forward_pre_hook(on), model.blocks[L].register_forward_hook(off)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        cfg.use_split_qkv_input, cfg.use_hook_mlp_in = old


def shared_values(model, site: EdgeSite, mask: Tensor) -> Tensor | None:
    """Under gradients, [P, n_senders] the value each sender's edges share in each row of `mask` when they
    share one (EAP, EAP-IG: every head of a layer then reads one input, and q/k/v edges' gradients are taken
    through the projections, `head_input_grads`); None otherwise or when a block's norm is not one it knows."""
    if not mask.requires_grad or not all(supported_norm(b.ln1) for b in model.blocks):
        return None
    return uniform_values(site.graph, mask)


def qkv_layers(site: EdgeSite, mask: Tensor, model=None, joint: Tensor | None = None):
    """The layers whose query/key/value receivers `mask` [P, n_edges] patches (under gradients: none where
    every sender's edges share one value, else all: None). `joint`: every edge patched in the pass by any site
    (`joint_mask`), which decides whether the static shortcut holds."""
    if mask.requires_grad:
        return set() if model is not None and shared_values(model, site, mask) is not None else None
    if model is not None and recomputes_heads(model) and is_static(site, mask if joint is None else joint):
        return set()  # each patched head's query/key/value is recomputed from its own input (`edge_hooks`)
    _, _, rl = site.graph.orders
    on = (mask.detach() != 0).any(0).cpu() & site.graph.qkv
    return set(rl[on].tolist())


def recomputes_heads(model) -> bool:
    """Whether a patched head's query/key/value can be recomputed from the block's input, norm and projection
    (TransformerLens computes them as ln1(resid_pre) @ W + b, nothing added between)."""
    cfg = model.cfg
    return (cfg.positional_embedding_type != "shortformer" and not getattr(cfg, "use_attn_in", False)
            and not getattr(cfg, "load_in_4bit", False) and not getattr(cfg, "use_split_qkv_input", False)
            and getattr(cfg, "original_architecture", None) not in POST_NORM
            and all(hasattr(b, "ln1") and hasattr(b.attn, "W_Q") for b in model.blocks))


POST_NORM = ("OlmoeForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM")


def edge_hooks(model, site: EdgeSite, mask: Tensor, source: Tensor, base: Tensor, copies: int, n: int,
               rel: Tensor, valid: Tensor, start: int, shared: Tensor | None = None, static: bool | None = None,
               pooled: bool = False) -> list:
    """Forward hooks that patch the edges of `mask` [copies, n_edges] in one forward pass from layer `start`.

    `source`, `base`: sender outputs [n, S, n_senders, d] of the other and of this run at the aligned
    positions; `rel` [n, S] those positions relative to the first position the pass computes; `valid`
    [n, S] 1 for real (not padded) slots. Senders before `start` keep this run's output; later ones are read
    live from the pass (their current output, which upstream patches may have changed) unless the mask
    is static (`is_static`: no patched receiver feeds a patched sender), when every patched edge adds a
    fixed difference and nothing is captured.

    Senders are in computation order (input, then per layer its heads and its MLP) and every receiver reads
    all senders before it, so a receiver's senders are a prefix of that order: the differences
    (source - current) are kept as per-layer blocks and a receiver combines them with one matrix product
    per block (or, for single edges, by adding each patched edge's difference to its copy).

    `pooled` (under `gradient(pool=True)`): only the masks' gradients summed over the copies are wanted; the fixed
    differences are the same in every copy, so their part is one product of the copies' summed input gradients
    (`pooled_product`), put in the first copy's row."""
    return EdgePass(model, site, mask, source, base, copies, n, rel, valid, start, shared, static, pooled).hooks()


class EdgePass:
    """One forward pass's edge patching (`edge_hooks`): what every hook of the pass shares (the senders' fixed
    differences, the live senders' blocks captured so far, the norm inputs and projections under gradients) and a
    method per kind of hook."""

    def __init__(self, model, site: EdgeSite, mask: Tensor, source: Tensor, base: Tensor, copies: int, n: int,
                 rel: Tensor, valid: Tensor, start: int, shared: Tensor | None = None, static: bool | None = None,
                 pooled: bool = False):
        self.model, self.site, self.mask, self.source, self.copies, self.n = model, site, mask, source, copies, n
        self.pooled = pooled
        self.rel, self.valid, self.start, self.shared = rel, valid, start, shared
        self.device = source.device
        self.idx = torch.arange(n, device=self.device)[:, None]
        self.S = rel.shape[1]
        self.static = is_static(site, mask) if static is None else static
        self.fixed = (source - base)  # [n, S, J, d]: the difference of every sender that keeps this run's output
        # sender-major [J, n * S * d], laid out once: each receiver's product reads a prefix of its rows (a view, so
        # under gradients every receiver's saved input is this one tensor, not a copy of the senders before it)
        self.fixed_rows = self.fixed.permute(2, 0, 1, 3).reshape(self.fixed.shape[2], -1)
        # senders from here on are live unless static, or every difference is fixed by the site
        self.first_live = len(site.senders) if site.difference == "fixed" else _first_sender_at(site, start)
        self.live: list[Tensor] = []  # per block of live senders, in order: [c, k, n * S * d]
        # `shared`: [copies, n_senders] under gradients at EAP/EAP-IG's masks (`shared_values`), else None
        self.ln_in: dict[int, tuple] = {}  # layer -> (the norm's input as given, as patched, the q/k/v gradients' store)
        self.projected: dict[int, dict] = defaultdict(dict)  # layer -> kind -> (its q/k/v edges' mask, projection weight)
        self.block_in: dict[int, Tensor] = {}  # layer -> its input in this pass (static edges into q/k/v read it)

    def hooks(self) -> list:
        """The pass's hooks: capturing live senders' outputs, then one per receiver group an edge of the mask
        enters (recomputed heads, the shared norm input under gradients, or a plain addition)."""
        model, site, mask, start = self.model, self.site, self.mask, self.start
        static, shared = self.static, self.shared
        hooks = []
        if not static and site.difference != "fixed":  # senders' current outputs, which upstream patches may change
            for L in range(start, site.n_layers):
                lo, hi = _sender_range(site, L, "head")
                hooks.append((f"blocks.{L}.attn.hook_z", self.capture(lo, hi, heads_of=L)))
                if _sender_range(site, L, "mlp") is not None:
                    lo, hi = _sender_range(site, L, "mlp")
                    hooks.append((f"blocks.{L}.hook_mlp_out", self.capture(lo, hi)))
        groups = site.graph.groups
        used = (mask != 0).any(0).cpu()
        for (L, kind), (units, e, *_rest) in sorted(groups.items()):
            if L < start or (not mask.requires_grad and not bool(used[e].any())):  # no edge of this chunk enters it
                continue
            name = {"q": f"blocks.{L}.hook_q_input", "k": f"blocks.{L}.hook_k_input", "v": f"blocks.{L}.hook_v_input",
                    "mlp": f"blocks.{L}.hook_mlp_in", "logits": f"blocks.{site.n_layers - 1}.hook_resid_post"}[kind]
            if static and kind in "qkv" and recomputes_heads(model):
                if not any(h[0] == f"blocks.{L}.hook_resid_pre" for h in hooks):
                    hooks.append((f"blocks.{L}.hook_resid_pre", self.keep_input(L)))
                hooks.append((f"blocks.{L}.attn.hook_{kind}", self.recompute(L, kind, units)))
                continue
            if shared is not None and kind in "qkv":
                k = int(groups[(L, kind)][2].max()) + 1
                if not any(h[0] == f"blocks.{L}.ln1:pre" for h in hooks):
                    hooks.append((f"blocks.{L}.ln1:pre", self.common_input(L, k)))
                hooks.append((f"blocks.{L}.attn.hook_{kind}", self.through_projection(L, kind, units)))
                continue
            hooks.append((name, self.patch((L, kind), units)))
        return hooks

    def dense_of(self, key) -> Tensor:
        """[copies, k, units] the mask of receiver group `key` (layer, kind) over the k senders its receivers read."""
        site, mask, copies = self.site, self.mask, self.copies
        units, e, si, ri = site.graph.groups[key]
        dense = mask.new_zeros(copies, int(si.max()) + 1, len(units))
        return dense.index_put((torch.arange(copies)[:, None], si[None], ri[None]), mask[:, e], accumulate=True)

    def gather(self, act: Tensor) -> Tensor:
        """[copies * n, Q, ...] -> [copies, n, S, ...] at the aligned positions."""
        copies, n, idx, rel = self.copies, self.n, self.idx, self.rel
        x = act.view(copies, n, *act.shape[1:])
        return x[:, idx, rel.to(act.device)]

    def capture(self, lo: int, hi: int, heads_of: int | None = None):
        """Records source - current for senders lo:hi (the heads of a layer from z, or one MLP)."""
        model, source, live, gather = self.model, self.source, self.live, self.gather

        def hook(x, hook):
            cur = gather(x)
            if heads_of is not None:
                W_O = model.blocks[heads_of].attn.W_O
                cur = torch.einsum("cnshd,hdm->cnshm", cur, W_O.to(x.device, x.dtype))
            else:
                cur = cur[:, :, :, None]
            diff = source[None, :, :, lo:hi].to(cur.dtype) - cur  # [c, n, S, k, d]
            # sender-major [c, k, n * S * d]: each receiver reads a prefix of the rows with one plain batched product
            # (no broadcast copy of its mask per block, which autograd would keep for every receiver)
            live.append(diff.permute(0, 3, 1, 2, 4).reshape(diff.shape[0], diff.shape[3], -1))
            return x
        return hook

    def patch(self, key, units):
        """Hook on the input of receiver group `key` (layer, kind): adds each copy's patched edges' differences."""
        device, static, copies, n, S = self.device, self.static, self.copies, self.n, self.S
        idx, rel, valid = self.idx, self.rel, self.valid
        fixed, fixed_rows, first_live, live = self.fixed, self.fixed_rows, self.first_live, self.live
        pooled = self.pooled
        dense = self.dense_of(key)
        k = dense.shape[1]  # the receiver reads senders 0..k-1
        nz = torch.nonzero(dense.detach()) if static else None  # (copy, sender, unit) of each patched edge

        def hook(act, hook):
            dt = act.dtype
            if static:  # a few single edges: add each patched edge's fixed difference to its copy and unit
                c_, j_, r_ = (t.to(device) for t in nz.unbind(1))
                w = dense.to(device)[c_, j_, r_].to(dt)[:, None, None, None]
                delta = act.new_zeros(copies, len(units), n, S, act.shape[-1])  # [c, r, n, S, d]
                delta.index_put_((c_, r_), w * fixed[:, :, j_].permute(2, 0, 1, 3).to(dt), accumulate=True)
                delta = delta.permute(0, 2, 3, 1, 4)
            else:
                lo = min(k, first_live)
                dm = dense.to(device, dt)
                # senders that keep this run's output: one product for all copies, into one [c, units, n * S * d]
                # buffer the live senders' products add to in place (block by block, per copy)
                if pooled:
                    acc = pooled_product(dm[:, :lo], fixed_rows[:lo].to(dt))
                else:
                    acc = torch.matmul(dm[:, :lo].transpose(1, 2), fixed_rows[:lo].to(dt))
                have = first_live
                for b in live:
                    if have >= k:
                        break
                    hi = min(k, have + b.shape[1])
                    acc = acc.baddbmm_(dm[:, have:hi].transpose(1, 2), b[:, : hi - have].to(dt))
                    have = hi
                acc = acc.view(copies, len(units), n, S, -1).mul_(valid.to(device, dt)[None, None, :, :, None])
                delta = acc.permute(0, 2, 3, 1, 4)
            if static:
                delta = delta * valid.to(device, dt)[None, :, :, None, None]
            out = act.clone()
            x = out.view(copies, n, *out.shape[1:])
            r = rel.to(act.device)
            if x.dim() == 5:  # [c, n, Q, heads, d]: one receiver per head
                x[:, idx, r] += delta.to(act.device)
            else:  # [c, n, Q, d]: one receiver
                x[:, idx, r] += delta[:, :, :, 0].to(act.device)
            return out
        return hook

    def common_input(self, L: int, k: int):
        """Forward pre-hook of layer L's attention norm: adds the one difference all its heads read,
        sum over senders s < k of shared[s] * diff_s, at the aligned positions; the patched input carries the
        layer's q/k/v edge masks, whose gradients its backward gives (`head_input_grads.edge_grads`)."""
        device, shared, copies, n, S = self.device, self.shared, self.copies, self.n, self.S
        idx, rel, valid = self.idx, self.rel, self.valid
        fixed_rows, first_live, live = self.fixed_rows, self.first_live, self.live
        ln_in, projected = self.ln_in, self.projected

        def pre(module, args):
            x = args[0]
            if L in ln_in and ln_in[L][0] is x:  # the norm runs once each for q, k and v on one tensor
                return (ln_in[L][1],) + tuple(args[1:])
            lo = min(k, first_live)
            w = shared[:, :k].detach().to(device, x.dtype)
            d = torch.matmul(w[:, :lo], fixed_rows[:lo].to(x.dtype))  # [c, n * S * d]
            have = first_live
            for b in live:
                if have >= k:
                    break
                hi = min(k, have + b.shape[1])
                d = d + torch.bmm(w[:, None, have:hi], b[:, : hi - have].to(x.dtype))[:, 0]
                have = hi
            d = d.view(copies, n, S, -1) * valid.to(device, x.dtype)[None, :, :, None]
            out = x.clone()
            v = out.view(copies, n, *out.shape[1:])
            r = rel.to(x.device)
            v[:, idx, r] = v[:, idx, r] + d.to(x.device)
            kinds = projected[L]
            store: dict = {}
            spec = {"copies": copies, "n": n, "idx": idx, "rel": r, "x": v[:, idx, r].detach(), "store": store,
                    "valid": valid.to(device, torch.float32), "fixed": fixed_rows.detach(), "live": live,
                    "first_live": first_live, "norm": module, "pooled": self.pooled,
                    "kinds": [(kind, W, dense.shape[1], dense.dtype) for kind, (dense, W) in kinds.items()]}
            out = edge_grads(out, spec, [dense.to(x.device) for dense, _ in kinds.values()])
            ln_in[L] = (x, out, store)
            return (out,) + tuple(args[1:])
        return pre

    def through_projection(self, L: int, kind: str, units):
        """Hook on layer L's q/k/v output: identity, whose backward keeps the gradient there for the norm's
        input to turn into the group's edge-mask gradients (through the projection and the norm)."""
        model, projected, ln_in = self.model, self.projected, self.ln_in
        projected[L][kind] = (self.dense_of((L, kind)), projection(model.blocks[L].attn, kind, model.cfg).detach())

        def hook(act, hook):
            return stash(act, ln_in[L][2], kind)
        return hook

    def keep_input(self, L: int):
        """Hook on layer L's input: kept for `recompute`."""
        block_in = self.block_in

        def hook(x, hook):
            block_in[L] = x
            return x
        return hook

    def recompute(self, L: int, kind: str, units):
        """Static edges into layer L's q, k or v: each patched (copy, head) gets its own input x + the sum of its
        edges' differences at the aligned positions, normed and projected for that head alone; nothing else in
        the block reads a per-head input."""
        model, device, copies, n, S = self.model, self.device, self.copies, self.n, self.S
        idx, rel, valid = self.idx, self.rel, self.valid
        fixed, block_in = self.fixed, self.block_in
        dense = self.dense_of((L, kind))
        U = dense.shape[2]
        c_, j_, r_ = torch.nonzero(dense).unbind(1)
        pairs, inv = torch.unique(c_ * U + r_, return_inverse=True)
        pc, pu = (pairs // U).to(device), (pairs % U).to(device)
        w = dense[c_, j_, r_].to(device)
        delta = fixed.new_zeros(len(pairs), n, S, fixed.shape[-1])
        delta.index_add_(0, inv.to(device), w[:, None, None, None] * fixed[:, :, j_.to(device)].permute(2, 0, 1, 3))
        delta = delta * valid.to(device, fixed.dtype)[None, :, :, None]
        attn = model.blocks[L].attn
        W = projection(attn, kind, model.cfg)[pu]  # [pairs, d_model, d_head]
        b = projection(attn, kind, model.cfg, bias=True)[pu]  # [pairs, d_head]

        def hook(act, hook):
            r = rel.to(act.device)
            x = block_in[L].view(copies, n, *block_in[L].shape[1:])[pc][:, idx, r]  # [pairs, n, S, d]
            h = model.blocks[L].ln1(x + delta.to(x.dtype))
            new = torch.einsum("pnsd,pdh->pnsh", h, W.to(h.dtype)) + b.to(h.dtype)[:, None, None]
            out = act.clone()
            v = out.view(copies, n, *out.shape[1:])
            v[pc[:, None, None], idx[None], r[None], pu[:, None, None]] = new.to(out.dtype)
            return out
        return hook


class _PooledProduct(torch.autograd.Function):
    """dm [c, k, units] transposed times rows [k, N] per copy ([c, units, N]); its backward gives dm only the
    copies' gradients summed, contracted once with the rows, in copy 0 (the other copies get zero)."""

    @staticmethod
    def forward(ctx, dm, rows):
        ctx.save_for_backward(rows)
        return torch.matmul(dm.transpose(1, 2), rows)

    @staticmethod
    def backward(ctx, g):
        (rows,) = ctx.saved_tensors
        out = g.new_zeros(g.shape[0], rows.shape[0], g.shape[1])
        out[0] = torch.matmul(rows, g.sum(0).transpose(0, 1))  # [k, units]
        return out, None


def pooled_product(dm: Tensor, rows: Tensor) -> Tensor:
    """`matmul(dm.transpose(1, 2), rows)` whose gradient w.r.t. dm is pooled over copies (`_PooledProduct`): what
    `gradient(pool=True)` reads costs one contraction with the rows instead of one per copy."""
    return _PooledProduct.apply(dm, rows)


def _sender_range(site: EdgeSite, layer: int, kind: str):
    """[lo, hi) of the senders of one kind at one layer (None if there are none)."""
    ids = [i for i, s in enumerate(site.senders) if s.layer == layer and s.kind == kind]
    return (ids[0], ids[-1] + 1) if ids else None


def _first_sender_at(site: EdgeSite, layer: int) -> int:
    """Index of the first sender computed at `layer` or later (the input counts as before layer 0 only when
    the pass starts after it)."""
    return next((i for i, s in enumerate(site.senders) if s.layer >= layer), len(site.senders))


def ablated_source(site: EdgeSite, source: Tensor, base: Tensor) -> Tensor:
    """The sender outputs edges carry: the other run's (resample), zero, or this run's own (freeze: path patching
    holds the edges off a path at it). Mean ablation's values come from the whole item set
    (`Contrast.mean_activation`), never from the rows at hand."""
    if site.ablation == "resample":
        return source
    if site.ablation == FREEZE:
        return base
    if site.ablation == "zero":
        return torch.zeros_like(source)
    raise AnalysisError(f"internal: no per-row values for ablation {site.ablation!r}")
