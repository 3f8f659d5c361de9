"""A repair folded into the weights: a model file that runs repaired with no surgeon and no hooks.

A repair written by the slot rule acts from the last prompt token on, which no weight can express (a weight acts at
every position alike). Acting at every position instead, a head repair is exact in the weights: a head's output
``z_h`` enters the residual stream only through ``z_h @ W_O[h]`` (plus the layer's ``b_O``), so

- mean (replace, strength a): ``z_h <- (1 - a) z_h + a c_h``  gives  ``W_O[h] <- (1 - a) W_O[h]`` and
  ``b_O <- b_O + a c_h @ W_O[h]`` (a = 1: the head's rows removed, its constant's image added to the bias);
- steer (add, strength a): ``z_h <- z_h + a d_h``  gives  ``b_O <- b_O + a d_h @ W_O[h]``.

The constant at every position is one per head: `RULES` says which (slot 0's, the last prompt token's, by default;
or the mean over the repair's slots). What the every-position rule costs against the slot rule (efficacy and harm)
is measured by `surgeon.analyses.repair.fold_cost`; `every_position_hooks` are the same edit as hooks, for that.

Saved as a TransformerLens checkpoint (`save_tl`: config.json of HookedTransformerConfig's fields, model.safetensors,
the tokenizer's files; `surgeon.models.loading` and ``--model DIR`` read it), or, for a model loaded from a Hugging
Face folder, as a Hugging Face folder (`save_hf`: ``AutoModelForCausalLM.from_pretrained`` loads it; the attention's
output bias switched on where the architecture has a switch for it, refused where it has none). Each folder holds
``fold.json`` (the repair, the rule, the formulas) and a manifest written last.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from surgeon.errors import AnalysisError
from surgeon.repairs.artifact import Repair, check_fits
from surgeon.results import manifest, staging, write_json
from surgeon.sites.nodes import hook_component, hook_layer

if TYPE_CHECKING:
    from torch import Tensor

RULES = {"slot0": "slot 0's constant (the last prompt token's) at every position",
         "mean": "the mean of the repair's slot constants at every position"}
HF_BIAS = {  # model_type -> the config switch that gives the attention's output projection a bias
    "gpt2": None,  # c_proj has one already
    "llama": "attention_bias", "mistral": None, "gemma2": "attention_bias", "gemma": "attention_bias",
}


def check_rule(rule: str) -> None:
    if rule not in RULES:
        raise AnalysisError(f"unknown every-position rule {rule!r}", field="--fold-rule",
                            fix=f"use one of: {', '.join(RULES)} ({'; '.join(f'{k}: {v}' for k, v in RULES.items())})")


def constants(repair: Repair, rule: str = "slot0") -> dict[str, "Tensor"]:
    """Per hook point the constant acting at every position [heads, d_head] under `rule`."""
    check_rule(rule)
    for h in repair.values:
        if hook_component(h).name != "z":
            raise AnalysisError(f"the repair acts at {h}; only head outputs (hook_z) fold into the weights exactly",
                                field="repair", fix="fold a head repair (surgeon repair --heads ...)")
    return {h: (v[0] if rule == "slot0" else v.mean(0)).float() for h, v in repair.values.items()}


def deltas(repair: Repair, W_O: dict, rule: str = "slot0", strength: float | None = None) -> dict:
    """layer -> (scale [heads], bias delta [d_model]) from the layer's W_O [heads, d_head, d_model] (float64 sums)."""
    import torch

    a = repair.strength if strength is None else float(strength)
    out = {}
    for h, c in constants(repair, rule).items():
        L = hook_layer(h)
        w = W_O[L].detach().double()
        scale = torch.ones(w.shape[0], dtype=torch.float64)
        bias = torch.zeros(w.shape[-1], dtype=torch.float64)
        for u in repair.units.get(h, ()):
            if repair.mode == "mean":
                scale[u] = 1.0 - a
            bias += a * c[u].double().to(w.device).cpu() @ w[u].cpu()
        out[L] = (scale, bias)
    return out


def folded_state(model, repair: Repair, rule: str = "slot0", strength: float | None = None) -> dict:
    """The TransformerLens state dict of `model` with `repair` folded in (only W_O and b_O of the repaired layers are
    new tensors; the model itself is not changed)."""
    check_fits(repair, model)
    state = dict(model.state_dict())
    W = {L: state[f"blocks.{L}.attn.W_O"] for L in {hook_layer(h) for h in repair.values}}
    for L, (scale, bias) in deltas(repair, W, rule, strength).items():
        w, b = state[f"blocks.{L}.attn.W_O"], state[f"blocks.{L}.attn.b_O"]
        state[f"blocks.{L}.attn.W_O"] = (w.double() * scale.to(w.device)[:, None, None]).to(w.dtype)
        state[f"blocks.{L}.attn.b_O"] = (b.double() + bias.to(b.device)).to(b.dtype)
    return state


def fold(model, repair: Repair, rule: str = "slot0", strength: float | None = None):
    """A copy of `model` with `repair` folded into its weights (the original unchanged)."""
    import copy

    new = copy.deepcopy(model)
    new.load_state_dict(folded_state(model, repair, rule, strength))
    return new


def every_position_hooks(repair: Repair, rule: str = "slot0", strength: float | None = None) -> list:
    """The folded edit as forward hooks on hook_z (every position of every forward): what the weights do."""
    a = repair.strength if strength is None else float(strength)
    out = []
    for h, c in constants(repair, rule).items():
        units = list(repair.units.get(h, ()))

        def fn(z, hook, c=c, units=units):
            v = c[units].to(z.device, z.dtype)
            if repair.mode == "mean":
                z[:, :, units] = z[:, :, units] + a * (v - z[:, :, units])
            else:
                z[:, :, units] = z[:, :, units] + a * v
            return z

        out.append((h, fn))
    return out


def _record(repair: Repair, rule: str, strength, fmt: str) -> dict:
    return {"format": fmt, "repair": repair.record(), "rule": rule, "rule_means": RULES[rule],
            "strength": repair.strength if strength is None else float(strength),
            "how": ("mean: W_O[h] <- (1 - a) W_O[h], b_O <- b_O + a c_h W_O[h]; steer: b_O <- b_O + a d_h W_O[h] "
                    "(exact: the head's output enters the residual stream only through W_O)"),
            "positions": "every position (the slot rule, from the last prompt token on, cannot be put in weights)"}


def save_tl(model, repair: Repair, out, rule: str = "slot0", strength: float | None = None) -> Path:
    """The folded model as a TransformerLens checkpoint folder (`--model DIR` loads it)."""
    from safetensors.torch import save_file

    state = folded_state(model, repair, rule, strength)
    cfg = {k: v for k, v in model.cfg.to_dict().items() if k not in ("device", "dtype", "n_devices")}
    out = Path(out)
    with staging(out) as tmp:
        save_file({k: v.detach().contiguous().cpu() for k, v in state.items()
                   if not k.endswith(("IGNORE", ".mask"))}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(cfg, default=str, indent=1))
        model.tokenizer.save_pretrained(str(tmp))
        write_json(tmp / "fold.json", _record(repair, rule, strength, "transformer_lens"))
        write_json(tmp / "manifest.json", manifest("repair-fold", options={"fold": _record(repair, rule, strength,
                                                                                          "transformer_lens")}))
    return out


def save_hf(src, repair: Repair, out, rule: str = "slot0", strength: float | None = None) -> Path:
    """The Hugging Face checkpoint in folder `src` with `repair` folded in, saved to `out` (save_pretrained, with the
    tokenizer): ``transformers`` loads and generates with it, repaired, with no surgeon and no hooks."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(src)
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(src), local_files_only=True, trust_remote_code=False,
                                                  dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(src), local_files_only=True, trust_remote_code=False)
    except Exception as e:
        raise AnalysisError(f"transformers cannot load {src} ({type(e).__name__})", where=str(src), field="model",
                            fix="fold into a Hugging Face folder the repair's model was loaded from") from None
    kind = hf.config.model_type
    if kind not in HF_BIAS:
        raise AnalysisError(f"a {kind} model's attention output projection has no bias and no switch for one, so the "
                            "repair's constant cannot be put in its weights exactly", where=str(src), field="model",
                            fix="save it as a TransformerLens checkpoint instead (surgeon repair --fold-out DIR "
                                f"--fold-format tl); folds into Hugging Face: {', '.join(HF_BIAS)}")
    n_heads = hf.config.num_attention_heads
    layers = hf.transformer.h if kind == "gpt2" else hf.model.layers
    check = {h for h in repair.values if hook_layer(h) >= len(layers)}
    if check:
        raise AnalysisError(f"the repair acts at {sorted(check)[0]}, which this model does not have", field="repair",
                            fix="fold a repair into the model it was built for")
    W = {}
    for h in repair.values:
        L = hook_layer(h)
        if kind == "gpt2":
            w = layers[L].attn.c_proj.weight  # Conv1D [n_heads * d_head, d_model]
            W[L] = w.detach().reshape(n_heads, -1, w.shape[1])
        else:
            w = layers[L].self_attn.o_proj.weight  # Linear [d_model, n_heads * d_head]
            W[L] = w.detach().T.reshape(n_heads, -1, w.shape[0])
    switch = HF_BIAS[kind]
    if switch is not None and not getattr(hf.config, switch, False):
        setattr(hf.config, switch, True)  # q, k, v and o get biases: zeros, but o's
        grown = AutoModelForCausalLM.from_config(hf.config, dtype=torch.float32)
        missing = grown.load_state_dict(hf.state_dict(), strict=False).missing_keys
        with torch.no_grad():
            for k in missing:
                if not k.endswith(".bias"):
                    raise AnalysisError(f"internal: switching {switch} on added {k}, not a bias")
                grown.get_parameter(k).zero_()
        hf = grown
        layers = hf.model.layers
    with torch.no_grad():
        for L, (scale, bias) in deltas(repair, W, rule, strength).items():
            if kind == "gpt2":
                p = layers[L].attn.c_proj
                d = p.weight.shape[0] // n_heads
                p.weight.mul_(scale.repeat_interleave(d).to(p.weight)[:, None])
            else:
                p = layers[L].self_attn.o_proj
                d = p.weight.shape[1] // n_heads
                p.weight.mul_(scale.repeat_interleave(d).to(p.weight)[None, :])
            p.bias.add_(bias.to(p.bias))
    out = Path(out)
    with staging(out) as tmp:
        hf.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        write_json(tmp / "fold.json", _record(repair, rule, strength, "huggingface"))
        write_json(tmp / "manifest.json", manifest("repair-fold", options={"fold": _record(repair, rule, strength,
                                                                                          "huggingface")}))
    return out




def hf_source(source) -> Path | None:
    """The Hugging Face folder a model spec names (a folder whose config.json has a model_type), else None."""
    if source is None:
        return None
    p = Path(str(source)).expanduser()
    try:
        return p if json.loads((p / "config.json").read_text()).get("model_type") else None
    except (OSError, ValueError, AttributeError):
        return None


def save_folded(repair: Repair, model, out, *, rule: str = "slot0", fmt: str = "auto", source=None,
                strength: float | None = None) -> str:
    """Fold `repair` into `model` and save it to `out`: ``fmt`` "hf" (the Hugging Face folder `source` the model was
    loaded from, edited), "tl" (a TransformerLens checkpoint of `model`), or "auto" (hf when `source` is a Hugging Face
    folder). Returns the format written ("huggingface" or "transformer_lens")."""
    check_rule(rule)
    if fmt not in ("auto", "tl", "hf"):
        raise AnalysisError(f"unknown model-file format {fmt!r}", field="--fold-format", fix="use auto, tl or hf")
    src = hf_source(source)
    if fmt == "hf" and src is None:
        raise AnalysisError("a Hugging Face folder is written from the Hugging Face folder the model was loaded from, "
                            "and this model was not loaded from one", field="--fold-format",
                            fix="use --fold-format tl (a TransformerLens checkpoint), or load the model from its folder")
    constants(repair, rule)  # a repair that cannot fold is refused before anything is written
    if fmt == "hf" or (fmt == "auto" and src is not None):
        save_hf(src, repair, out, rule, strength)
        return "huggingface"
    save_tl(model, repair, out, rule, strength)
    return "transformer_lens"


__all__ = ["HF_BIAS", "RULES", "check_rule", "constants", "deltas", "every_position_hooks", "fold", "folded_state",
           "hf_source", "save_folded", "save_hf", "save_tl"]
