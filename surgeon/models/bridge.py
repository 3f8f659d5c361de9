"""TransformerLens's `TransformerBridge` as a model surgeon runs: `BridgeModel` wraps a bridge and supplies what
surgeon's model protocol (`surgeon/models/protocol.py`) needs and TransformerLens 3.9's bridge lacks or means
otherwise, on the bridge's own hook points and modules, touching no Hugging Face code:

- `forward(residual, start_at_layer=L, stop_at_layer=M, past_kv_cache=C)`: the bridge runs its model on placeholder
  tokens of the residual's shape; the blocks before L pass their input through (their forward is not run), the
  residual replaces block L's input at its hook point (before any other hook there), and the run stops at block M's
  input, or at the final norm's input when M is the number of layers (HookedTransformer's contract: the last residual
  stream, not logits). A TransformerLens key/value cache of a shared prefix becomes a Hugging Face cache (keys
  rotated to their positions where the model is rotary) and the new positions follow the prefix;
- `run_with_cache(stop_at_layer=n_layers)` returns that residual stream too, not logits;
- `hooks()` takes hooks on the per-head and MLP inputs while their switches are off, as HookedTransformer's does;
- the blocks, attention, MLPs and final norm read as HookedTransformer's do: per-query-head `W_K`/`W_V` and their
  biases, `_W_K`/`_W_V` per key/value head, zero biases where the architecture has none (`b_O` stacked at the
  top), and the final norm's `w` the scale it applies (Gemma's norms store it minus one);
- a forward the engine sets on a block's module for one pass lands on that module, not on the Hugging Face module
  it wraps (where the bridge passes it, and where it would stay).

The bridge is put in compatibility mode (HookedTransformer's hook names) without weight processing (the weights as
trained, as surgeon loads a HookedTransformer), unless it is already. Everything else is the bridge's own, read
through. `tests/models/test_bridge_numbers.py` checks every analysis equal to a HookedTransformer's holding the same
weights, on GPT-2, Llama, Qwen2 and Gemma-2 layouts.
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where it is used: the command line checks a case file before torch loads
    import torch


def is_bridge(model) -> bool:
    """Whether `model` is a TransformerLens TransformerBridge (by class name: no TransformerLens import)."""
    return any(c.__name__ == "TransformerBridge" for c in type(model).__mro__)


def unwrapped(given):
    """The TransformerBridge a `BridgeModel` wraps, or `given` itself (hooks and generate wrappers go on the bridge)."""
    return given.__dict__["bridge"] if isinstance(given, BridgeModel) else given


class _Stop(Exception):
    def __init__(self, value):
        self.value = value


class BridgeModel:
    """A TransformerBridge that meets surgeon's model protocol (see the module). Attributes not defined here are the
    bridge's."""

    def __init__(self, bridge):
        if not getattr(bridge, "compatibility_mode", False):  # HookedTransformer's hook names and weight layouts, and
            bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)  # the weights as trained
        self.__dict__["bridge"] = bridge
        self.__dict__["blocks"] = [_Block(b, bridge.cfg) for b in bridge.blocks]
        self.__dict__["_tuple_blocks"] = self._blocks_return_tuples()
        norm = getattr(bridge, "ln_final", None)
        self.__dict__["ln_final"] = None if norm is None else _Norm(norm, bridge.cfg, _norm_scale(norm, bridge.cfg))

    def __getattr__(self, name):
        return getattr(self.__dict__["bridge"], name)

    def __setattr__(self, name, value):
        setattr(self.bridge, name, value)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def __repr__(self) -> str:
        return f"BridgeModel({type(self.bridge).__name__}, {self.cfg.n_layers} layers)"

    @property
    def b_O(self) -> torch.Tensor:
        """The attention output biases of every layer, [n_layers, d_model] (zeros where a block has none)."""
        import torch

        return torch.stack([block.attn.b_O for block in self.blocks])

    def _blocks_return_tuples(self) -> bool:
        """Whether the bridge's blocks hand their model a tuple (older Hugging Face layers) or the tensor."""
        import torch

        seen = []
        handle = self.bridge.blocks[0].register_forward_hook(lambda m, a, out: seen.append(isinstance(out, tuple)))
        try:
            with torch.no_grad():
                self.bridge(torch.ones(1, 1, dtype=torch.long, device=self.bridge.W_U.device), return_type=None)
        finally:
            handle.remove()
        return bool(seen and seen[0])

    @contextmanager
    def hooks(self, fwd_hooks=(), bwd_hooks=(), reset_hooks_end=True, clear_contexts=False):
        """The bridge's `hooks` context (each hook on the hook point its name or alias names, or on every point a
        filter accepts but those switched off; removed at the end by its context level), with two differences:
        hooks on the per-head and MLP inputs are taken while their config switches are off, as HookedTransformer's
        are (the engine switches them on block by block, inside the pass); and the hook points are read once per
        adapter (`hook_dict`), where the bridge's context rebuilds its whole dictionary of them for every hook
        added (most of a per-head sweep's time on a small model, bench/bridge.py)."""
        bridge, points = self.bridge, self.hook_dict
        level = bridge.context_level + 1
        added = []

        def add(point, fn, direction):
            point.add_hook(fn, dir=direction, level=level)
            added.append((point, direction))

        try:
            bridge.context_level = level
            for hooks, direction in ((fwd_hooks, "fwd"), (bwd_hooks, "bwd")):
                for name, fn in hooks:
                    if isinstance(name, str):
                        if name in points:
                            add(points[name], fn, direction)
                        continue
                    seen = set()
                    for key, point in points.items():
                        if id(point) not in seen and name(key) and not _gated(bridge, point.name or key):
                            seen.add(id(point))
                            add(point, fn, direction)
            yield self
        finally:
            if reset_hooks_end:
                for point, direction in added:
                    point.remove_hooks(dir=direction, level=level)
                    if clear_contexts:
                        point.clear_context()
            bridge.context_level = level - 1

    @property
    def hook_dict(self) -> dict:
        """The bridge's hook points by name and by alias (its `hook_dict`), read once: the points are made with the
        bridge, and a switch (e.g. split q/k/v inputs) gates hooks on them, not the points themselves."""
        if "_hook_points" not in self.__dict__:
            self.__dict__["_hook_points"] = self.bridge.hook_dict
        return self.__dict__["_hook_points"]

    @contextmanager
    def _skipped(self, layers):
        """The blocks `layers` pass their hidden states through as they are (their own forward not run)."""
        tuples = self._tuple_blocks

        def through(*args, **kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            return (x,) if tuples else x

        blocks = [self.bridge.blocks[i] for i in layers]
        try:
            for b in blocks:  # on the block itself: a bridge component passes attributes set on it to its HF module
                object.__setattr__(b, "forward", through)
            yield
        finally:
            for b in blocks:
                vars(b).pop("forward", None)

    def forward(self, input, *, start_at_layer: int | None = None, stop_at_layer: int | None = None,
                past_kv_cache=None, return_type: str | None = "logits", **kwargs):
        """The bridge's forward, with HookedTransformer's `start_at_layer` (`input` is then the residual stream
        [batch, pos, d_model] entering that block) and `stop_at_layer` (the residual stream entering that block, or
        the last one, before the final norm, at the number of layers)."""
        import torch

        n = self.cfg.n_layers
        start = 0 if start_at_layer is None else start_at_layer % n
        stop = None if stop_at_layer is None else (stop_at_layer if stop_at_layer >= 0 else n + stop_at_layer)
        if start_at_layer is None and stop is None and past_kv_cache is None:
            return self.bridge(input, return_type=return_type, **kwargs)
        with ExitStack() as stack:
            if past_kv_cache is not None:
                kwargs.update(self._hf_cache(past_kv_cache, input.shape[:2]))
                stack.enter_context(cache_named(self.bridge))
            if start_at_layer is not None:
                resid = input
                input = torch.ones(resid.shape[:2], dtype=torch.long, device=resid.device)
                stack.enter_context(self._skipped(range(start)))
                handle = self.bridge.blocks[start].hook_in.register_forward_hook(lambda m, a, out: resid,
                                                                                 prepend=True)
                stack.callback(handle.remove)
            if stop is not None:
                point = self.bridge.ln_final.hook_in if stop >= n else self.bridge.blocks[stop].hook_in

                def halt(m, a, out):
                    raise _Stop(out)

                handle = point.register_forward_hook(halt)  # after every other hook there (HookedTransformer's order)
                stack.callback(handle.remove)
            try:
                return self.bridge(input, return_type=return_type, **kwargs)
            except _Stop as s:
                return s.value

    def _hf_cache(self, tl_cache, shape) -> dict:
        """The keyword arguments that hand the bridge's model a TransformerLens key/value cache (a prefix's keys
        and values per layer, as `hook_k` and `hook_v` give them: [rows, prefix, kv heads, d_head]; None for a layer
        not run) as a Hugging Face cache: keys rotated to their positions where the model is rotary, positions of
        the new tokens after the prefix. A fresh cache each call: the bridge appends to it, and the engine reuses
        its cache (frozen) across calls."""
        import torch

        from transformers import DynamicCache

        entries = tl_cache.entries
        first = next(e for e in entries if e is not None)
        rows, p0, kv_heads, d_head = first.past_keys.shape
        device, dtype = first.past_keys.device, first.past_keys.dtype
        cache = DynamicCache(config=self.bridge.original_model.config)
        for layer, e in enumerate(entries):
            if e is None:  # a block the call skips: never read
                k = v = torch.zeros(rows, kv_heads, p0, d_head, device=device, dtype=dtype)
            else:
                k, v = self._prefix_kv(layer, e, p0)
            cache.update(k, v, layer)
        positions = torch.arange(p0, p0 + shape[1], device=device)
        import inspect

        name = "cache" if "cache" in inspect.signature(self.bridge.original_model.forward).parameters else \
            "past_key_values"  # transformers 5 renames it
        return {name: cache, "use_cache": True, "position_ids": positions[None].expand(shape[0], -1)}

    def _prefix_kv(self, layer: int, entry, p0: int):
        """A cache entry's keys and values as the bridge's cache holds them ([rows, kv heads, prefix, d_head], keys
        rotated to their positions where the model is rotary), converted once per entry: the engine hands the same
        frozen prefix to every patched pass of a call, and rotating it each pass was a sixth of an exact edge
        search's time (bench/bridge.py). The cache only appends to them (a new tensor), so they are reused as
        they are while the entry's tensors are the same and unchanged."""
        keys, values = entry.past_keys, entry.past_values
        memo = self.__dict__.setdefault("_prefix_memo", {})
        hit = memo.get(layer)
        if hit is not None and hit[0] is keys and hit[1] is values and hit[2] == (keys._version, values._version):
            return hit[3], hit[4]
        k, v = keys.transpose(1, 2), values.transpose(1, 2)
        if self.cfg.positional_embedding_type == "rotary":
            k = _rotate(k, *self._rotary(p0, keys))
        memo[layer] = (keys, values, (keys._version, values._version), k, v)
        return k, v

    def _rotary(self, p0: int, like: torch.Tensor):
        """(cos, sin) of positions 0..p0-1 from the model's own rotary embedding."""
        import torch

        rotary = self.bridge.original_model.model.rotary_emb
        return rotary(like.transpose(1, 2), torch.arange(p0, device=like.device)[None])

    def generate(self, *args, **kwargs):
        """The bridge's `generate`, its key/value cache read by every layer (`cache_named`)."""
        with cache_named(self.bridge):
            return self.bridge.generate(*args, **kwargs)

    def run_with_cache(self, input, *, names_filter=None, stop_at_layer: int | None = None, **kwargs):
        """HookedTransformer's `run_with_cache` for the names given (a name or a list of names, as the engine asks):
        the activations detached, under the names asked for; with `stop_at_layer` the residual stream entering that
        block, or the last one (before the final norm) at the number of layers, not logits. Hooked through `hooks`
        and `forward` rather than the bridge's own, which reads its hook points anew on every call. Other
        arguments (a filter function, `remove_batch_dim`, ...) go to the bridge's `run_with_cache`."""
        names = [names_filter] if isinstance(names_filter, str) else names_filter
        if kwargs or not isinstance(names, (list, tuple)):
            return self._bridge_run_with_cache(input, names_filter, stop_at_layer, **kwargs)
        from transformer_lens import ActivationCache

        cache = {}

        def keeper(name):
            def keep(x, hook):
                cache[name] = x.detach()
            return keep

        with self.hooks(fwd_hooks=[(n, keeper(n)) for n in names]):
            out = self.forward(input, stop_at_layer=stop_at_layer)
        return out, ActivationCache(cache, self.bridge)

    def _bridge_run_with_cache(self, input, names_filter, stop_at_layer, **kwargs):
        if stop_at_layer is None or stop_at_layer < self.cfg.n_layers:
            return self.bridge.run_with_cache(input, names_filter=names_filter, stop_at_layer=stop_at_layer, **kwargs)
        from transformer_lens.model_bridge.exceptions import StopAtLayerException

        def halt(m, a, out):
            raise StopAtLayerException(out)

        handle = self.bridge.ln_final.hook_in.register_forward_hook(halt)
        try:
            return self.bridge.run_with_cache(input, names_filter=names_filter, **kwargs)
        finally:
            handle.remove()

    def run_with_hooks(self, input, *, fwd_hooks=(), return_type: str | None = "logits", **kwargs):
        with self.hooks(fwd_hooks=fwd_hooks):
            return self.forward(input, return_type=return_type, **kwargs)


class _View:
    """A bridge component as HookedTransformer's counterpart reads: attributes are the component's, except those the
    subclass defines; `vars()` is the component's, and a forward set on the view is set on the component itself (a
    bridge component passes attributes set on it to the Hugging Face module it wraps, where removing the attribute
    from the component would leave it, and where the component's own forward would call it)."""

    __slots__ = ("_real", "_cfg")

    def __init__(self, real, cfg):
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_cfg", cfg)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_real"), name)

    def __setattr__(self, name, value):
        if name == "forward":
            object.__setattr__(self._real, name, value)
        else:
            setattr(self._real, name, value)

    @property
    def __dict__(self):
        return vars(self._real)

    def __call__(self, *args, **kwargs):
        return self._real(*args, **kwargs)

    def forward(self, *args, **kwargs):
        """The component's class forward (not one set on it): what `type(module).forward` is for a module."""
        return type(self._real).forward(self._real, *args, **kwargs)

    def _zeros(self, *shape):
        import torch

        w = next(self._real.parameters())
        return torch.zeros(*shape, device=w.device, dtype=w.dtype)


class _Attention(_View):
    """HookedTransformer's attention weights: `W_K`, `W_V` (and their biases) per query head, `_W_K`, `_W_V` per
    key/value head where the model groups them (None elsewhere), zero biases where the architecture has none."""

    __slots__ = ()

    @property
    def _groups(self) -> int:
        return self._cfg.n_heads // (getattr(self._cfg, "n_key_value_heads", None) or self._cfg.n_heads)

    def _per_head(self, name: str):
        w = getattr(self._real, name, None)
        if w is None:
            return self._zeros(self._cfg.n_heads, self._cfg.d_head)
        return w.repeat_interleave(self._groups, 0) if w.shape[0] != self._cfg.n_heads else w

    def _grouped(self, name: str):
        if self._groups == 1:
            return None
        w = getattr(self._real, name, None)
        return self._zeros(self._cfg.n_heads // self._groups, self._cfg.d_head) if w is None else w

    W_K = property(lambda self: self._per_head("W_K"))
    W_V = property(lambda self: self._per_head("W_V"))
    b_Q = property(lambda self: self._per_head("b_Q"))
    b_K = property(lambda self: self._per_head("b_K"))
    b_V = property(lambda self: self._per_head("b_V"))
    _W_K = property(lambda self: self._grouped("W_K"))
    _W_V = property(lambda self: self._grouped("W_V"))
    _b_K = property(lambda self: self._grouped("b_K"))
    _b_V = property(lambda self: self._grouped("b_V"))

    @property
    def b_O(self):
        b = getattr(self._real, "b_O", None)
        return self._zeros(self._cfg.d_model) if b is None else b


class _MLP(_View):
    """HookedTransformer's MLP biases: zeros where the architecture has none. No `act_fn`: the bridge's MLP calls its
    Hugging Face module, whose activation is a submodule, so the engine's fused activation (a speedup it takes where
    an MLP has `act_fn`) does not apply."""

    __slots__ = ()

    def __getattr__(self, name):
        if name == "act_fn":
            raise AttributeError(name)
        return super().__getattr__(name)

    @property
    def b_in(self):
        b = getattr(self._real, "b_in", None)
        return self._zeros(self._cfg.d_mlp) if b is None else b

    @property
    def b_out(self):
        b = getattr(self._real, "b_out", None)
        return self._zeros(self._cfg.d_model) if b is None else b


class _Norm(_View):
    """A norm whose `w` is the scale it applies (HookedTransformer's convention): for an RMS norm, read off the module
    (Gemma's Hugging Face norms store the scale minus one and add the one in their forward)."""

    __slots__ = ("_w",)

    def __init__(self, real, cfg, w):
        super().__init__(real, cfg)
        object.__setattr__(self, "_w", w)

    @property
    def w(self):
        return self._w


def _norm_scale(norm, cfg):
    """The scale an RMS norm applies: its output on a constant input (whose root mean square is the constant, eps
    aside: 1e-12 relative at 1e3); a LayerNorm's own weight."""
    import torch

    w = getattr(norm, "w", None)
    if w is None or getattr(cfg, "normalization_type", None) not in ("RMS", "RMSPre"):
        return w
    with torch.no_grad():
        return norm(torch.full((1, 1, w.shape[-1]), 1e3, dtype=w.dtype, device=w.device))[0, 0].detach()


class _Block(_View):
    __slots__ = ()

    @property
    def attn(self):
        return _Attention(self._real.attn, self._cfg)

    @property
    def mlp(self):
        mlp = getattr(self._real, "mlp", None)
        return None if mlp is None else _MLP(mlp, self._cfg)


@contextmanager
def cache_named(bridge):
    """While it is open, every attention of `bridge` reads the key/value cache its layer is handed (`_named_cache`):
    without it, TransformerLens 3.9's bridge under transformers 5 attends to the new positions alone whenever a cache
    is used, and its cached `generate` (the default) repeats one token."""
    handles = [block.attn.register_forward_pre_hook(_named_cache, with_kwargs=True) for block in bridge.blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _gated(bridge, name: str) -> bool:
    """Whether a hook a filter picks on `name` is skipped: the point is switched off (the bridge's own rule)."""
    reason = getattr(bridge, "_gated_hook_reason", None)
    return reason is not None and reason(name) is not None


def _named_cache(module, args, kwargs):
    """Hugging Face layers (transformers 5) hand attention its cache as `cache`; TransformerLens 3.9's attention
    bridges read `past_key_values` (or `layer_past`) and, finding neither, attend to the new positions alone."""
    if "cache" in kwargs and kwargs.get("past_key_values") is None:
        kwargs = {**kwargs, "past_key_values": kwargs["cache"]}
    return args, kwargs


def _rotate(k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Keys [rows, heads, pos, d_head] rotated as the bridge's attention rotates them (all of d_head, or its first
    `cos.shape[-1]` dimensions; a half-width cos is the first half of a full one)."""
    import torch

    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d_head, width = k.shape[-1], cos.shape[-1]
    if width * 2 == d_head:
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        width = d_head
    if width < d_head:
        return torch.cat([apply_rotary_pos_emb(k[..., :width], k[..., :width], cos, sin)[1], k[..., width:]], dim=-1)
    return apply_rotary_pos_emb(k, k, cos, sin)[1]
