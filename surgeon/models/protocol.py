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
}


@dataclass(frozen=True)
class Need:
    path: str
    kind: str
    why: str
    when: str | None = None  # a key of WHEN

    def applies(self, cfg) -> bool:
        return WHEN[self.when](cfg)


def _n(kind: str, why: str, *paths: str, when: str | None = None) -> tuple[Need, ...]:
    return tuple(Need(p, kind, why, when) for p in paths)


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
    *_n("attribute", "the tokenizer every case is encoded with (a (model, tokenizer) pair given to the API sets it)",
        "tokenizer", "set_tokenizer"),
    *_n("attribute", "weights and devices: memory plans, dtypes, folded repairs", "parameters", "buffers", "modules",
        "state_dict", "get_submodule"),
    *_n("attribute", "hooks checked for strays", "hook_dict"),
    *_n("attribute", "the read-out: the unembedding applied to a cached residual stream", "unembed", "unembed.W_U",
        "unembed.b_U", "unembed.hook_in", "unembed.hook_out", "W_U", "b_U", "W_O", "b_O"),
    *_n("attribute", "the tokens after a shared prefix embedded on their own, to run from the prefix's cache",
        "input_to_embed"),
    *_n("attribute", "the final norm before the read-out", "ln_final", when="norm"),
    *_n("attribute", "the final norm's scale (direct logit attribution)", "ln_final.w", when="norm_w"),
    *_n("attribute", "the final norm's bias (direct logit attribution)", "ln_final.b", when="norm_b"),
    *_n("attribute", "per-block modules the sites hook and the prefix cache re-enters", "blocks", "blocks[]",
        "blocks[].attn", "blocks[].ln1", "blocks[].register_forward_hook", "blocks[].register_forward_pre_hook"),
    *_n("attribute", "the MLP module", "blocks[].mlp", when="mlp"),
    *_n("attribute", "per-head weights: edge differences through W_O, direct logit attribution",
        "blocks[].attn.W_O", "blocks[].attn.b_O", "blocks[].attn.b_V"),
    *_n("attribute", "attention re-entered with a shared prefix's cached keys and values (engine/prefix_attention.py)",
        "blocks[].attn.attn_scale", "blocks[].attn.IGNORE", "blocks[].attn.cfg", "blocks[].attn.forward",
        "blocks[].attn.calculate_qkv_matrices", "blocks[].attn._make_causal_mask", "blocks[].attn.hook_attn_scores",
        "blocks[].attn.hook_pattern", "blocks[].attn.hook_z"),
    *_n("attribute", "rotary attention re-entered from a cached prefix", "blocks[].attn.apply_rotary",
        "blocks[].attn.hook_rot_q", "blocks[].attn.hook_rot_k", when="rotary"),
    *_n("attribute", "the MLP's kernels (frozen weights, a fused activation: engine/kernels.py) and the sinks' "
        "massive activations", "blocks[].mlp.W_in", "blocks[].mlp.b_in", "blocks[].mlp.W_out", "blocks[].mlp.b_out",
        "blocks[].mlp.act_fn", "blocks[].mlp.forward", "blocks[].mlp.modules", "blocks[].mlp.hook_pre", "blocks[].mlp.hook_post", when="mlp"),
    *_n("attribute", "gated MLPs", "blocks[].mlp.W_gate", "blocks[].mlp.hook_pre_linear", when="gated"),
    *_n("attribute", "SoLU MLPs", "blocks[].mlp.ln", when="solu"),
    *_n("hook", "the sites: what a patch reads and writes, by TransformerLens's hook names",
        "blocks.{i}.hook_resid_pre", "blocks.{i}.hook_resid_post",
        "blocks.{i}.hook_attn_out", "blocks.{i}.attn.hook_z", "blocks.{i}.attn.hook_q", "blocks.{i}.attn.hook_k",
        "blocks.{i}.attn.hook_v", "blocks.{i}.attn.hook_pattern", "blocks.{i}.attn.hook_attn_scores",
        "blocks.{i}.hook_q_input", "blocks.{i}.hook_k_input", "blocks.{i}.hook_v_input", "blocks.{i}.ln1:pre"),
    *_n("hook", "the residual stream between attention and MLP", "blocks.{i}.hook_resid_mid", when="resid_mid"),
    *_n("hook", "the final norm's scale, frozen or read", "ln_final.hook_scale", when="norm"),
    *_n("hook", "the MLP's sites", "blocks.{i}.hook_mlp_in", "blocks.{i}.hook_mlp_out", "blocks.{i}.mlp.hook_post",
        when="mlp"),
    *_n("call", "every patched pass starts from a cached residual stream at its first patched layer",
        "forward(start_at_layer, stop_at_layer)"),
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
    """Whether `model(residual, start_at_layer=...)` runs: tried on one position through the last block, as a class may
    take the keyword and refuse it (TransformerLens 3.9's TransformerBridge raises NotImplementedError)."""
    import torch

    if not _takes(getattr(model, "forward", None), ("start_at_layer", "stop_at_layer")):
        return False
    p = next(iter(model.parameters()), None)
    x = torch.zeros(1, 1, model.cfg.d_model, device=p.device if p is not None else "cpu",
                    dtype=p.dtype if p is not None else torch.float32)
    try:
        with torch.no_grad():
            model(x, start_at_layer=model.cfg.n_layers - 1)
    except (NotImplementedError, TypeError, ValueError, RuntimeError):
        return False
    return True


def _met(model, need: Need) -> bool:
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
        return name in (getattr(model, "hook_dict", None) or {})
    method, _, args = need.path.partition("(")
    names = [a.strip() for a in args.rstrip(")").split(",") if a.strip()]
    if need.path == "forward(start_at_layer, stop_at_layer)":
        return _has_start_at_layer(model)
    return _takes(getattr(model, method, None), names)


def missing(model) -> list[Need]:
    """The needs that apply to `model`'s config and that it does not meet (empty: surgeon can run it)."""
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        return [n for n in NEEDS if n.path == "cfg.n_layers"] + [n for n in NEEDS if n.kind == "call"]
    return [n for n in NEEDS if n.applies(cfg) and not _met(model, n)]
