"""What surgeon needs from a model, in one place: every attribute, hook point and call that the engine, the sites and
the analyses reach on the model object (`NEEDS`), and `missing(model)`, which checks an instance against them.

TransformerLens's `HookedTransformer` is the class every need is written against. A model of another class (e.g.
TransformerLens's `TransformerBridge`) runs only when it meets every need that applies to its config, and is refused
otherwise, naming the needs it misses (`surgeon.models.checks.check_runnable`). `tests/models/test_protocol.py`
reads surgeon's own sources and fails when code reaches a part of the model not declared here, or when a declared
need is used nowhere. What builds models (`surgeon/models/loading.py`, `surgeon/organisms/`) is outside: it makes
the implementation. In the consumers, the model object is named `model` (or `self.model`) and its config `cfg`.

Paths: attributes from the model, `blocks[]` for every block; a hook: its name, `{i}` for the layer
(`blocks.{i}.ln1:pre` is a forward pre-hook on that module); a call: the method and the keywords it is passed.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

KINDS = ("config", "attribute", "hook", "call")
# when a need applies, from the model's config (a need that does not apply to a model is not checked on it)
WHEN = {
    None: lambda cfg: True,
    "mlp": lambda cfg: not getattr(cfg, "attn_only", False),
    "gated": lambda cfg: bool(getattr(cfg, "gated_mlp", False)) and not getattr(cfg, "attn_only", False),
    "rotary": lambda cfg: getattr(cfg, "positional_embedding_type", None) == "rotary",
    "solu": lambda cfg: str(getattr(cfg, "act_fn", "")).startswith("solu") and not getattr(cfg, "attn_only", False),
    "resid_mid": lambda cfg: not getattr(cfg, "attn_only", False) and not getattr(cfg, "parallel_attn_mlp", False),
    "norm": lambda cfg: getattr(cfg, "normalization_type", None) is not None,
    "norm_w": lambda cfg: getattr(cfg, "normalization_type", None) in ("LN", "RMS"),
    "norm_b": lambda cfg: getattr(cfg, "normalization_type", None) == "LN",
    "never": lambda cfg: False,  # read with a default (getattr(cfg, name, default)): absent is a valid answer
    "pair": lambda cfg: False,  # only where the API is given a (model, tokenizer) pair
}


@dataclass(frozen=True)
class Need:
    path: str
    kind: str
    why: str
    when: str | None = None  # a key of WHEN
    speedup: bool = False  # used where present: the engine checks for it and takes a slower path without it

    def applies(self, cfg) -> bool:
        return WHEN[self.when](cfg)


def _n(kind: str, why: str, *paths: str, when: str | None = None, speedup: bool = False) -> tuple[Need, ...]:
    return tuple(Need(p, kind, why, when, speedup) for p in paths)


PREFIX = ("attention re-entered with a shared prefix's cached keys and values (engine/prefix_attention.py, where "
          "it supports the attention class; elsewhere each patch copies the prefix's keys and values)")
KERNELS = "the MLP's fused activation and frozen weights (engine/kernels.py, where the MLP has them)"


NEEDS: tuple[Need, ...] = (
    *_n("config", "the model's shape: the sites, the edge graph, memory plans and the checks of a case",
        "cfg.n_layers", "cfg.n_heads", "cfg.d_model", "cfg.d_head", "cfg.d_mlp", "cfg.d_vocab", "cfg.d_vocab_out",
        "cfg.n_ctx", "cfg.dtype", "cfg.normalization_type", "cfg.positional_embedding_type",
        "cfg.default_prepend_bos"),
    *_n("config", "read with a default: absent means the HookedTransformer default", "cfg.n_key_value_heads",
        "cfg.attn_only", "cfg.gated_mlp", "cfg.parallel_attn_mlp", "cfg.rotary_dim", "cfg.act_fn", "cfg.attention_dir",
        "cfg.original_architecture", "cfg.output_logits_soft_cap", "cfg.attn_scores_soft_cap", "cfg.clip_qkv",
        "cfg.load_in_4bit", "cfg.use_attn_in", "cfg.use_split_qkv_input", "cfg.use_hook_mlp_in",
        "cfg.ungroup_grouped_query_attention", when="never"),
    *_n("config", "a folded repair writes the config beside the weights", "cfg.to_dict"),
    *_n("attribute", "the config the shape is read from", "cfg"),
    *_n("attribute", "the tokenizer every case is encoded with", "tokenizer"),
    *_n("attribute", "a (model, tokenizer) pair given to the API puts the tokenizer on the model", "set_tokenizer",
        when="pair"),
    *_n("attribute", "weights and devices: memory plans, dtypes, folded repairs", "parameters", "buffers", "modules",
        "state_dict", "get_submodule"),
    *_n("attribute", "hooks checked for strays", "hook_dict"),
    *_n("attribute", "the read-out: the unembedding applied to a cached residual stream", "unembed", "unembed.W_U",
        "unembed.b_U", "unembed.hook_in", "unembed.hook_out", "W_U", "b_U", "W_O", "b_O"),
    *_n("attribute", PREFIX, "input_to_embed", speedup=True),
    *_n("attribute", "the final norm before the read-out", "ln_final", when="norm"),
    *_n("attribute", "the final norm's scale (direct logit attribution)", "ln_final.w", when="norm_w"),
    *_n("attribute", "the final norm's bias (direct logit attribution)", "ln_final.b", when="norm_b"),
    *_n("attribute", "per-block modules the sites hook and the prefix cache re-enters", "blocks", "blocks[]",
        "blocks[].attn", "blocks[].ln1", "blocks[].register_forward_hook", "blocks[].register_forward_pre_hook"),
    *_n("attribute", "the MLP module", "blocks[].mlp", when="mlp"),
    *_n("attribute", "per-head weights: edge differences through W_O, direct logit attribution",
        "blocks[].attn.W_O", "blocks[].attn.b_O", "blocks[].attn.b_V"),
    *_n("attribute", PREFIX, "blocks[].attn.attn_scale", "blocks[].attn.IGNORE", "blocks[].attn.cfg",
        "blocks[].attn.forward", "blocks[].attn.calculate_qkv_matrices", "blocks[].attn._make_causal_mask",
        "blocks[].attn.hook_attn_scores", "blocks[].attn.hook_pattern", "blocks[].attn.hook_z", speedup=True),
    *_n("attribute", PREFIX + ", rotary", "blocks[].attn.apply_rotary", "blocks[].attn.hook_rot_q",
        "blocks[].attn.hook_rot_k", when="rotary", speedup=True),
    *_n("attribute", "the sinks' massive activations (what each MLP writes)", "blocks[].mlp.W_out", when="mlp"),
    *_n("attribute", KERNELS, "blocks[].mlp.W_in", "blocks[].mlp.b_in", "blocks[].mlp.b_out", "blocks[].mlp.act_fn",
        "blocks[].mlp.forward", "blocks[].mlp.modules", "blocks[].mlp.hook_pre", "blocks[].mlp.hook_post", when="mlp",
        speedup=True),
    *_n("attribute", KERNELS + ", gated", "blocks[].mlp.W_gate", "blocks[].mlp.hook_pre_linear", when="gated",
        speedup=True),
    *_n("attribute", KERNELS + ", SoLU", "blocks[].mlp.ln", when="solu", speedup=True),
    *_n("hook", "the sites: what a patch reads and writes, by TransformerLens's hook names",
        "blocks.{i}.hook_resid_pre", "blocks.{i}.hook_resid_post",
        "blocks.{i}.hook_attn_out", "blocks.{i}.attn.hook_z", "blocks.{i}.attn.hook_q", "blocks.{i}.attn.hook_k",
        "blocks.{i}.attn.hook_v", "blocks.{i}.attn.hook_pattern", "blocks.{i}.attn.hook_attn_scores",
        "blocks.{i}.ln1:pre"),
    *_n("hook", "edges into a head: its own query, key and value input (the engine switches them on with "
        "cfg.use_split_qkv_input)", "blocks.{i}.hook_q_input", "blocks.{i}.hook_k_input", "blocks.{i}.hook_v_input"),
    *_n("hook", "the sinks' queries and keys after the rotary embedding", "blocks.{i}.attn.hook_rot_q",
        "blocks.{i}.attn.hook_rot_k", when="rotary"),
    *_n("hook", "the residual stream between attention and MLP", "blocks.{i}.hook_resid_mid", when="resid_mid"),
    *_n("hook", "the final norm's scale, frozen or read", "ln_final.hook_scale", when="norm"),
    *_n("hook", "the MLP's sites", "blocks.{i}.hook_mlp_out", "blocks.{i}.mlp.hook_post", when="mlp"),
    *_n("hook", "edges into an MLP: its input (the engine switches it on with cfg.use_hook_mlp_in)",
        "blocks.{i}.hook_mlp_in", when="mlp"),
    *_n("call", "every patched pass starts from a cached residual stream at its first patched layer and stops at the "
        "last block's residual stream (stop_at_layer=n_layers: the read-out applies the final norm and unembedding "
        "itself)", "forward(start_at_layer, stop_at_layer)"),
    *_n("call", "the prompts' common prefix runs once into a key/value cache", "forward(past_kv_cache)"),
    *_n("call", "clean runs cache the activations the sites read", "run_with_cache(names_filter, stop_at_layer)"),
    *_n("call", "the sinks' interventions", "run_with_hooks(fwd_hooks, return_type)"),
    *_n("call", "hooks installed for one pass (the sites, a repair, the padding masks)", "hooks(fwd_hooks)"),
)


def _resolve(model, path: str):
    obj = model
    for part in path.replace("[]", ".[]").split("."):
        obj = obj[0] if part == "[]" else getattr(obj, part)
    return obj


def _takes(fn, names) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):  # passed on (run_with_cache's **kwargs)
        return True
    return all(n in params for n in names)


def _has_start_at_layer(model) -> bool:
    """Whether `model(residual, start_at_layer=n_layers - 1, stop_at_layer=n_layers)` runs the last block on a residual
    stream and returns its residual stream ([1, 1, d_model]), tried on one position: a class may take the keywords and
    refuse them (TransformerLens 3.9's TransformerBridge raises NotImplementedError) or read stop_at_layer=n_layers as
    "to the end" and return logits."""
    import torch

    if not _takes(getattr(model, "forward", None), ("start_at_layer", "stop_at_layer")):
        return False
    p = next(iter(model.parameters()), None)
    d, n = model.cfg.d_model, model.cfg.n_layers
    x = torch.zeros(1, 1, d, device=p.device if p is not None else "cpu",
                    dtype=p.dtype if p is not None else torch.float32)
    try:
        with torch.no_grad():
            out = model(x, start_at_layer=n - 1, stop_at_layer=n)
    except (NotImplementedError, TypeError, ValueError, RuntimeError):
        return False
    return isinstance(out, torch.Tensor) and tuple(out.shape) == (1, 1, d)


def _cache_keys(model, switched: bool) -> set[str]:
    import torch

    cfg = model.cfg
    flags = ("use_split_qkv_input", "use_hook_mlp_in")
    old = {k: getattr(cfg, k, None) for k in flags}
    p = next(iter(model.parameters()), None)
    try:
        if switched:
            for k in flags:
                setattr(cfg, k, True)
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.zeros(1, 2, dtype=torch.long,
                                                        device=p.device if p is not None else "cpu"))
        return set(cache.keys())
    except Exception:  # noqa: BLE001  (what cannot run fires nothing surgeon can hook; the need names it)
        return set()
    finally:
        for k, v in old.items():
            try:
                setattr(cfg, k, v)
            except Exception:  # noqa: BLE001  (a class that refused the switch keeps its own value)
                pass


def fired_hooks(model) -> set[str]:
    """The hook points a forward of two tokens fires (`run_with_cache`), once as it is and once with the per-head q/k/v
    inputs and the MLP input switched on as the engine switches them (`cfg.use_split_qkv_input`,
    `cfg.use_hook_mlp_in`, restored after; a class that refuses the switch fires those inputs nowhere): a hook point a
    class lists and never fires is no site."""
    return _cache_keys(model, False) | _cache_keys(model, True)


def _met(model, need: Need, fired: set[str] | None = None) -> bool:
    if need.kind in ("config", "attribute"):
        try:
            _resolve(model, need.path)
        except (AttributeError, IndexError, KeyError, TypeError):
            return False
        return True
    if need.kind == "hook":
        name = need.path.replace("{i}", "0")
        if name.endswith(":pre"):
            return _met(model, Need(name[:-4].replace(".0.", "[]."), "attribute", need.why))
        return name in (getattr(model, "hook_dict", None) or {}) and (fired is None or name in fired)
    method, _, args = need.path.partition("(")
    names = [a.strip() for a in args.rstrip(")").split(",") if a.strip()]
    if need.path == "forward(start_at_layer, stop_at_layer)":
        return _has_start_at_layer(model)
    return _takes(getattr(model, method, None), names)


def missing(model, speedups: bool = False) -> list[Need]:
    """The needs that apply to `model`'s config and that it does not meet (empty: surgeon can run it); with `speedups`,
    the speedups it lacks instead (the engine runs without them, on its slower path)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return [] if speedups else [n for n in NEEDS if n.path == "cfg.n_layers" or n.kind == "call"]
    fired = None if speedups else fired_hooks(model)
    lacks = [n for n in NEEDS if n.speedup == speedups and n.applies(cfg) and not _met(model, n, fired)]
    return sorted(lacks, key=lambda n: KINDS.index(n.kind) if n.kind != "call" else -1)  # the calls first
