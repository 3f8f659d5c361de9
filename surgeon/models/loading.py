"""Finding and loading models offline: organisms, local checkpoints, the local Hugging Face cache.

A model spec is a string:
- `organism:NAME` - a model organism shipped with surgeon (see `surgeon.organisms`);
- a local directory holding a Hugging Face checkpoint (config.json + weights + tokenizer);
- a local directory holding a TransformerLens checkpoint: config.json with HookedTransformerConfig's fields (as
  `json.dumps(model.cfg.to_dict(), default=str)` writes them), model.safetensors with the model's state dict
  (`safetensors.torch.save_file(model.state_dict(), ...)`) and its tokenizer (`tokenizer.save_pretrained(dir)`):
  how tracr, InterpBench and most toy models are shared;
- a Hugging Face name (`meta-llama/Llama-3.1-8B-Instruct`) or a TransformerLens alias of one (`gpt2-small`), used
  from the local HF cache only.
Nothing here touches the network: hub lookups are `local_files_only`.
"""
from __future__ import annotations

import contextlib
import sys

import os
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from surgeon.causal import check_attention
from surgeon.errors import ModelError, did_you_mean
from surgeon.models.bridge import BridgeModel
from surgeon.models.protocol import missing

Kind = Literal["organism", "local", "tl", "hub"]


@dataclass(frozen=True)
class ModelRef:
    spec: str
    kind: Kind
    name: str  # organism name, or the directory the checkpoint lives in
    path: Path | None
    loader: str = "hooked"  # "bridge": TransformerLens's TransformerBridge (the spec's BRIDGE prefix)


BRIDGE = "bridge:"  # a model spec's prefix: load the Hugging Face checkpoint after it as a TransformerBridge


@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    attn_only: bool = False
    n_ctx: int | None = None  # the longest sequence the model reads (None: not stated)
    d_vocab: int | None = None  # token ids the embedding holds (None: not stated)


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def resolve(spec: str) -> ModelRef:
    """Turn a model spec into a reference to something on this machine, or raise ModelError. `bridge:SPEC`: the Hugging
    Face checkpoint SPEC names, to load as a TransformerLens TransformerBridge."""
    from surgeon import organisms

    if spec.startswith(BRIDGE):
        inner = resolve(spec[len(BRIDGE):])
        if inner.kind not in ("local", "hub"):
            what = "an organism" if inner.kind == "organism" else "a TransformerLens checkpoint"
            raise ModelError(f"{spec}: a TransformerBridge loads a Hugging Face checkpoint, and "
                             f"{spec[len(BRIDGE):]} is {what}", field="model",
                             fix=f"drop {BRIDGE!r}, or give a Hugging Face checkpoint directory or name after it")
        return ModelRef(spec, inner.kind, inner.name, inner.path, loader="bridge")

    if spec.startswith(organisms.PREFIX):
        name = spec[len(organisms.PREFIX):]
        if name not in organisms.names():
            raise ModelError(f"unknown organism {name!r}", field="model",
                             fix=f"use one of: {', '.join(organisms.PREFIX + n for n in organisms.names())}")
        if not organisms.is_available(name):
            raise ModelError(f"organism {name!r} has no trained weights in {organisms.weights_dir(name)}",
                             field="model", fix=f"train it: surgeon organisms train {name}")
        return ModelRef(spec, "organism", name, organisms.weights_dir(name))
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise ModelError(f"directory {p} has no config.json", field="model",
                             fix="point at a Hugging Face checkpoint directory (save_pretrained output) or a "
                                 "TransformerLens one (config.json of HookedTransformerConfig's fields + "
                                 "model.safetensors + the tokenizer's files)")
        tl = tl_config(p)
        if tl is not None:
            if not (p / "model.safetensors").is_file():
                raise ModelError(f"the TransformerLens checkpoint {p} has no model.safetensors", field="model",
                                 fix="save the weights with safetensors.torch.save_file(model.state_dict(), "
                                     "DIR/model.safetensors)")
            return ModelRef(spec, "tl", str(p), p.resolve())
        return ModelRef(spec, "local", str(p), p.resolve())
    if p.is_file():
        raise ModelError(f"{spec} is a file; a checkpoint is a directory (config.json, weights, tokenizer)", field="model",
                         fix="give the directory that holds the checkpoint's files")
    if spec.startswith((".", "/", "~")) or os.sep in spec and spec.count("/") != 1:
        raise ModelError(f"no such directory: {spec}", field="model",
                         fix="give an existing checkpoint directory, an organism:NAME or a Hugging Face name")
    _offline()
    try:
        from huggingface_hub import snapshot_download

        try:
            local = snapshot_download(spec, local_files_only=True)
        except Exception:
            official = _tl_official_name(spec)  # a TransformerLens alias (gpt2-small) of a Hugging Face name
            if official is None or official == spec:
                raise
            local = snapshot_download(official, local_files_only=True)
    except Exception:
        raise not_found(spec) from None
    return ModelRef(spec, "hub", spec, Path(local))


def not_found(spec: str, near: Path | None = None) -> ModelError:
    """The error for a model found nowhere: where it was looked for (a folder of that name in the current directory,
    and `near`'s, e.g. the case file's; the Hugging Face cache), a folder there with a similar name, and `hf
    download` only for a name the Hub could hold (organisation/name)."""
    from huggingface_hub.constants import HF_HUB_CACHE

    places = [Path.cwd()] + ([near] if near is not None and near.resolve() != Path.cwd().resolve() else [])
    looked = [f"{p / spec}" for p in places] + [f"the Hugging Face cache ({HF_HUB_CACHE})"]
    hint, fix = "", "set model to a local checkpoint directory, or to organism:decimal to try surgeon offline"
    for p in places:
        try:
            dirs = [d.name for d in p.iterdir() if d.is_dir() and not d.name.startswith(".")]
        except OSError:
            continue
        close = did_you_mean(Path(spec).name, dirs)
        if close:
            name = close.split("'")[1]
            hint = f" (did you mean the folder {str(p / name)!r}?)"
            fix = f"set model to {name!r} if that folder is the checkpoint; or " + fix
            break
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        fix = f"on a machine with network run `hf download {spec}` (it fills the cache); or " + fix
    return ModelError(f"{spec!r} is neither an organism, a local directory, nor in the local Hugging Face cache "
                      f"(looked for {', '.join(looked)}){hint}", field="model", fix=fix)


# fields only a TransformerLens config has (a Hugging Face config names them num_hidden_layers, hidden_size, ...)
TL_FIELDS = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "act_fn", "normalization_type",
             "positional_embedding_type", "attn_only")
TL_REQUIRED = ("n_layers", "d_model", "n_ctx", "d_head")  # what HookedTransformerConfig cannot do without
TL_COUNTS = ("n_layers", "d_model", "n_ctx", "d_head", "n_heads", "d_vocab", "d_mlp", "n_key_value_heads")
HF_FIELDS = ("num_hidden_layers", "hidden_size", "n_layer", "n_embd", "num_layers")


def tl_config(path: Path) -> dict | None:
    """HookedTransformerConfig's fields from a TransformerLens checkpoint's config.json (at its top level, or under
    "config"), or None when the file is a Hugging Face config (it names a model_type) or not such a config. A config
    with TransformerLens fields that cannot be one (a required field missing, a count that is not a positive
    integer, a Hugging Face model_type beside them) is refused naming the field. `n_heads` left out is
    d_model // d_head, as TransformerLens computes it."""
    import json

    where = str(Path(path) / "config.json")
    try:
        data = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    cfg = data.get("config") if isinstance(data.get("config"), dict) else data
    tl = [k for k in TL_FIELDS if k in cfg]
    if "model_type" in data:
        if len(tl) >= 2 and not any(k in data for k in HF_FIELDS):
            raise ModelError(f"config.json has TransformerLens fields ({', '.join(tl[:4])}) and a Hugging Face "
                             f"model_type ({data['model_type']!r}), so it is neither kind", where=where,
                             field="model_type", fix="for a TransformerLens checkpoint remove model_type; for a Hugging "
                                                     "Face one write the config with save_pretrained")
        return None
    if len(tl) < 2:
        return None
    missing = [k for k in TL_REQUIRED if k not in cfg]
    if missing:
        raise ModelError(f"this TransformerLens config has no {missing[0]!r}", where=where, field=missing[0],
                         fix=f"add {missing[0]!r} (required: {', '.join(TL_REQUIRED)}); write the config from the "
                             "model: json.dumps(model.cfg.to_dict(), default=str)")
    for k in TL_COUNTS:
        v = cfg.get(k)
        if v is None or (k in ("n_heads", "d_vocab", "d_mlp", "n_key_value_heads") and v == -1):
            continue  # TransformerLens fills these in
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ModelError(f"{k!r} is {v!r}, not a positive integer", where=where, field=k,
                             fix=f"write it as a number, e.g. \"{k}\": {8 if k != 'n_layers' else 2}")
    out = dict(cfg)
    if out.get("n_heads") in (None, -1):
        out["n_heads"] = out["d_model"] // out["d_head"]
    return out


def _tl_official_name(alias: str) -> str | None:
    """The Hugging Face name TransformerLens maps an alias to (gpt2-small -> gpt2), or None."""
    try:
        from transformer_lens.loading_from_pretrained import get_official_model_name

        return get_official_model_name(alias)
    except Exception:
        return None


def weights_sha256(ref: ModelRef) -> str | None:
    """sha256 over the model's weight files (an organism's model.safetensors; a checkpoint directory's
    *.safetensors and *.bin in name order), or None where there are none on disk."""
    import hashlib

    if ref.kind == "organism":
        from surgeon.organisms import weights_sha256 as organism_sha

        return organism_sha(ref.name)
    files = sorted(p for pat in ("*.safetensors", "*.bin") for p in Path(ref.path).glob(pat)) if ref.path else []
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


# model_digest's cache: per model object, the digest and what it was computed on (`_fingerprint`)
_DIGESTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_CHUNK = 1 << 26  # elements a checksum reduces at once (a multiple of 1,024; bounds its int64 temporaries)
_COPY = 1 << 28  # bytes a CUDA tensor moves to the host at once, through one pinned buffer


def model_digest(model) -> str:
    """sha256 over a model in memory: its TransformerLens config and every parameter's name, dtype, shape and bytes
    (exact). What a cache or resume key holds for the model: the same weights loaded differently, a weight edited in
    place, or another dtype give another digest.

    Computed once per model object and weights: the digest is kept beside a fingerprint of what it hashed (each
    parameter's name, storage, version counter, dtype, shape and device, and an exact, order-sensitive checksum of
    its bytes computed where the weights are, `_checksum`), and computed again only when that changes: the full hash
    reads every byte on the host, the fingerprint only reduces them on the device. CUDA tensors
    reach the host through one pinned buffer, a block at a time; bytes are hashed without a copy."""
    import torch

    params = list(model.named_parameters())
    with torch.no_grad():
        key = _fingerprint(model, params)
        hit = _DIGESTS.get(model)
        if hit is not None and hit[0] == key:
            return hit[1]
        digest = _full_digest(model, params)
    try:
        _DIGESTS[model] = (key, digest)
    except TypeError:  # not weak-referenceable: no cache
        pass
    return digest


def _config_json(model) -> bytes:
    import json

    cfg = model.cfg.to_dict() if hasattr(model.cfg, "to_dict") else vars(model.cfg)
    return json.dumps({k: v for k, v in cfg.items() if k not in ("device", "n_devices")}, sort_keys=True,
                      default=str).encode()


def _fingerprint(model, params) -> tuple:
    """What `model_digest` hashed, cheaply: the config, and per parameter its name, storage, version counter, dtype,
    shape, device and an exact checksum of its bytes (`_checksum`: an edit that bypasses the version counter, `.data`,
    is seen too)."""
    return (_config_json(model),) + tuple(
        (name, w.data_ptr(), w._version, str(w.dtype), tuple(w.shape), str(w.device), _checksum(w))
        for name, w in params)


def _checksum(w) -> int:
    """An exact, order-sensitive integer checksum of a tensor's bytes, computed where it is: its integer words in rows
    of 1,024, each word weighted by its place in the row and each row's sum by the row's place (int64, wrapping)."""
    import torch

    t = w.detach().contiguous().view(-1)
    if not t.numel():
        return 0
    words = t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}.get(t.element_size(), torch.uint8))
    col = torch.arange(1, 2049, 2, dtype=torch.int64, device=t.device)  # odd weights 1, 3, ..., 2047
    total = torch.zeros((), dtype=torch.int64, device=t.device)
    for lo in range(0, words.numel(), _CHUNK):
        block = words[lo: lo + _CHUNK].to(torch.int64)
        n = block.numel() // 1024 * 1024
        rows = (block[:n].view(-1, 1024) * col).sum(1)
        first = lo // 1024 + 1
        total += (rows * torch.arange(first, first + rows.numel(), dtype=torch.int64, device=t.device)).sum()
        total += (block[n:] * col[: block.numel() - n]).sum() * 7919
    return int(total)


def _full_digest(model, params) -> str:
    import hashlib

    import torch

    h = hashlib.sha256()
    h.update(_config_json(model))
    pinned = None
    for name, w in params:
        t = w.detach().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        if not t.numel():
            continue
        flat = t.view(-1).view(torch.uint8)
        if flat.device.type != "cuda":
            h.update(flat.numpy())
            continue
        if pinned is None:
            pinned = torch.empty(min(_COPY, max(p.numel() * p.element_size() for _, p in params)), dtype=torch.uint8,
                                 pin_memory=True)
        for lo in range(0, flat.numel(), pinned.numel()):
            part = flat[lo: lo + pinned.numel()]
            buf = pinned[: part.numel()]
            buf.copy_(part)  # synchronous: the buffer is hashed next
            h.update(buf.numpy())
    return h.hexdigest()


def shape(ref: ModelRef) -> ModelShape:
    """The model's layer and head counts, read from its config (no weights)."""
    if ref.kind == "organism":
        from surgeon.organisms import config_of

        c = config_of(ref.name)
        return ModelShape(c["n_layers"], c["n_heads"], c.get("n_key_value_heads") or c["n_heads"], c["d_model"],
                          bool(c.get("attn_only")), c.get("n_ctx"), c.get("d_vocab"))
    if ref.kind == "tl":
        c = tl_config(ref.path)
        n_heads = c["n_heads"]
        return ModelShape(c["n_layers"], n_heads, c.get("n_key_value_heads") or n_heads, c["d_model"],
                          bool(c.get("attn_only")), c.get("n_ctx"), c.get("d_vocab"))
    _offline()
    from transformers import AutoConfig

    try:
        c = AutoConfig.from_pretrained(str(ref.path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError) as e:
        if "custom code" in str(e):
            raise ModelError("the checkpoint asks to run its own code (auto_map in config.json); surgeon never runs "
                             "code from a checkpoint", where=str(ref.path), field="model",
                             fix="use an architecture transformers and TransformerLens support without custom code"
                             ) from None
        raise ModelError(f"cannot read the model's config.json: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                         where=str(ref.path), field="model",
                         fix="repair config.json (valid JSON with model_type, the layer and head counts)") from None
    c = getattr(c, "text_config", None) or c
    n_heads = c.num_attention_heads
    n_ctx = getattr(c, "max_position_embeddings", None) or getattr(c, "n_positions", None)
    return ModelShape(c.num_hidden_layers, n_heads, getattr(c, "num_key_value_heads", None) or n_heads,
                      c.hidden_size, n_ctx=n_ctx, d_vocab=getattr(c, "vocab_size", None))


def load_tokenizer(ref: ModelRef):
    if ref.kind == "organism":
        from surgeon.organisms.charset import load_tokenizer as load

        return load(ref.path / "tokenizer.json", f"surgeon-organism-{ref.name}")
    _offline()
    from transformers import AutoTokenizer

    try:
        if ref.kind == "tl":  # AutoTokenizer would read config.json, which is TransformerLens's here
            if not (Path(ref.path) / "tokenizer_config.json").is_file():
                raise OSError("a TransformerLens checkpoint needs its tokenizer's files (tokenizer.save_pretrained(DIR))")
            import json

            import transformers

            name = json.loads((Path(ref.path) / "tokenizer_config.json").read_text()).get("tokenizer_class")
            cls = getattr(transformers, str(name), None) or transformers.PreTrainedTokenizerFast
            return cls.from_pretrained(str(ref.path), local_files_only=True, add_bos_token=True,  # TL reloads it otherwise
                                       trust_remote_code=False)
        return AutoTokenizer.from_pretrained(str(ref.path), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ModelError(f"cannot load the tokenizer: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                         where=str(ref.path), field="model",
                         fix="the checkpoint needs its tokenizer files (tokenizer.json or tokenizer.model with "
                             "tokenizer_config.json)") from None


def _torch_dtype(dtype: str):
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise ModelError(f"unknown dtype {dtype!r}", field="dtype", fix=f"use one of: {', '.join(table)}")
    return table[dtype]


def load_model(ref: ModelRef | str, device: str = "cpu", dtype: str = "float32", n_devices: int = 1):
    """A HookedTransformer for `ref`, with weights exactly as trained (no folding or centering); for a `bridge:` spec,
    TransformerLens's TransformerBridge of the checkpoint (`surgeon.models.bridge.BridgeModel`)."""
    if isinstance(ref, str):
        ref = resolve(ref)
    tdtype = _torch_dtype(dtype)
    if ref.kind == "organism":
        from surgeon.organisms import load_organism

        model = load_organism(ref.name, device=device, dtype=dtype)
    elif ref.kind == "tl":
        model = _load_tl(ref, device, tdtype)
    elif ref.loader == "bridge":
        model = _load_bridge(ref, device, tdtype, n_devices)
    else:
        model = _load_hf(ref, device, tdtype, n_devices)
    # analyses differentiate w.r.t. masks, never weights: no weight gradients to store
    model.requires_grad_(False)
    check_finite(model, str(ref.path))
    check_attention(model, str(ref.path))
    return model


def _load_tl(ref: ModelRef, device: str, tdtype):
    """A TransformerLens checkpoint (see the module): its config, its tokenizer, its weights with safetensors (no
    pickle), every tensor of the state dict matched by name and shape."""
    import inspect

    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    fields = set(inspect.signature(HookedTransformerConfig).parameters)
    cfg = {k: v for k, v in tl_config(ref.path).items() if k in fields and k not in ("device", "dtype", "n_devices")}
    try:
        hcfg = HookedTransformerConfig(**cfg, device=device, dtype=tdtype)
    except Exception as e:
        raise ModelError(f"config.json is not a TransformerLens config: {type(e).__name__}: {str(e)[:200]}",
                         where=str(ref.path), field="model",
                         fix="write it from the model: json.dumps(model.cfg.to_dict(), default=str)") from None
    model = HookedTransformer(hcfg, tokenizer=load_tokenizer(ref), move_to_device=False,
                              default_padding_side="right")
    try:
        state = load_file(str(ref.path / "model.safetensors"))
    except Exception as e:
        raise ModelError(f"cannot read model.safetensors: {str(e)[:200]}", where=str(ref.path), field="model",
                         fix="save it again with safetensors.torch.save_file(model.state_dict(), ...)") from None
    own = model.state_dict()
    ints = [k for k, v in state.items() if not v.is_floating_point() and k in own and own[k].is_floating_point()]
    if ints:
        raise ModelError(f"the weight {ints[0]} is stored as {state[ints[0]].dtype}, not a floating-point type: it "
                         f"would load truncated ({len(ints)} such weight{'s' if len(ints) > 1 else ''})",
                         where=str(ref.path), field="model",
                         fix="save the float weights: safetensors.torch.save_file({k: v.float() for k, v in "
                             "model.state_dict().items()}, ...)")
    missing = [k for k in own if k not in state and not k.endswith(("IGNORE", ".mask"))]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        raise ModelError(f"model.safetensors does not match config.json (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}, other shapes {wrong[:3]})", where=str(ref.path), field="model",
                         fix="save the config and the state dict of the same model")
    model.load_state_dict({k: v.to(tdtype) if v.is_floating_point() else v for k, v in state.items()}, strict=False)
    with contextlib.redirect_stdout(sys.stderr):  # TransformerLens prints "Moving model to device" on stdout
        model.to(device)
    model.eval()
    return model




MAX_WEIGHT = 1e6  # no trained language model has a weight this large; a checkpoint that does is corrupt


def check_finite(model, where: str) -> None:
    """Refuse weights holding NaN or infinity (TransformerLens would turn NaN attention into zeros and report
    plausible scores) or values past `MAX_WEIGHT` (a scaled or corrupt tensor: attention saturates and the scores
    look plausible), naming the tensor."""
    import torch

    with torch.no_grad():
        for name, w in model.named_parameters():
            if not w.is_floating_point() or w.numel() == 0:
                continue
            top = float(w.detach().abs().max())
            if top != top or top == float("inf"):
                raise ModelError(f"the weight {name} holds NaN or infinite values", where=where, field="model",
                                 fix="use an intact checkpoint (re-download or re-save it)")
            if top > MAX_WEIGHT:
                raise ModelError(f"the weight {name} holds values up to {top:.3g}, past any trained model's "
                                 f"({MAX_WEIGHT:g}): the checkpoint is corrupt or was scaled", where=where,
                                 field="model", fix="use an intact checkpoint (re-download or re-save it)")


def _load_hf(ref: ModelRef, device: str, tdtype, n_devices: int):
    """Load a local Hugging Face checkpoint into TransformerLens (the path TL 3.9 supports offline)."""
    _offline()
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(ref)
    try:
        hf = AutoModelForCausalLM.from_pretrained(str(ref.path), dtype=tdtype, local_files_only=True,
                                                  trust_remote_code=False)  # a checkpoint's code never runs
    except Exception as e:
        raise ModelError(f"transformers could not load {ref.path}: {e}", field="model",
                         fix="check that the directory holds a complete checkpoint (config.json, weights)") from None
    cfg, state = _converted(hf, device, tdtype, n_devices, str(ref.path), ref.path)
    del hf  # its weights are in `state` now: never hold both models
    return _hooked(cfg, state, tok, n_devices)


def _load_bridge(ref: ModelRef, device: str, tdtype, n_devices: int):
    """A local Hugging Face checkpoint as a TransformerLens TransformerBridge (`boot_transformers`), through
    `BridgeModel`: refused, naming what it lacks, where it does not meet surgeon's model protocol."""
    if n_devices > 1:
        raise ModelError(f"{ref.spec}: a TransformerBridge is loaded on one device here", field="--n-devices",
                         fix="leave --n-devices at 1, or drop the bridge: prefix")
    _offline()
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        raise ModelError("this TransformerLens has no TransformerBridge", field="model",
                         fix="pip install 'transformer-lens>=3.9', or drop the bridge: prefix") from None
    import logging
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            bridge = TransformerBridge.boot_transformers(str(ref.path), device=device, dtype=tdtype)
        except Exception as e:  # noqa: BLE001  (TransformerLens's own refusal of an architecture, said as it is)
            raise ModelError(f"TransformerLens's TransformerBridge could not load {ref.path}: {e}", field="model",
                             fix="drop the bridge: prefix to load it as a HookedTransformer") from None
        finally:
            logging.disable(logging.NOTSET)
    model = BridgeModel(bridge)
    lacks = missing(model)
    if lacks:
        raise ModelError(f"{ref.spec}: the bridge lacks {len(lacks)} things surgeon needs from a model "
                         f"(surgeon/models/protocol.py): " + "; ".join(n.path for n in lacks[:8]), field="model",
                         fix="drop the bridge: prefix to load it as a HookedTransformer")
    return model


def from_hf(hf, tokenizer=None, *, device: str | None = None, n_devices: int = 1):
    """A HookedTransformer from a Hugging Face causal LM already in memory, converted as `load_model` converts a
    checkpoint (no folding or centering), on `device` (default: where `hf` is), in `hf`'s dtype. `tokenizer`:
    the model's (default: loaded from the local files `hf` was loaded from)."""
    from transformers import PreTrainedModel

    if not isinstance(hf, PreTrainedModel):
        raise ModelError(f"a {type(hf).__name__} is not a Hugging Face model", field="model",
                         fix="pass a transformers PreTrainedModel (e.g. AutoModelForCausalLM.from_pretrained(...)) "
                             "or a HookedTransformer")
    where = getattr(hf, "name_or_path", None) or ""
    if tokenizer is None:
        _offline()
        from transformers import AutoTokenizer

        try:
            if not where:
                raise OSError("no name or path")
            tokenizer = AutoTokenizer.from_pretrained(str(where), local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise ModelError(f"cannot find the model's tokenizer ({type(e).__name__}: the model was not loaded from "
                             "local files that hold one)", where=str(where) or type(hf).__name__, field="model",
                             fix="pass the tokenizer too: model=(hf_model, tokenizer)") from None
    where = where or type(hf).__name__
    p = next(hf.parameters())
    cfg, state = _converted(hf, device or str(p.device), p.dtype, n_devices, str(where), None)
    model = _hooked(cfg, state, tokenizer, n_devices)
    model.requires_grad_(False)
    check_finite(model, str(where))
    return model


def _converted(hf, device: str, tdtype, n_devices: int, where: str, src: Path | None):
    """TransformerLens's config and state dict for the Hugging Face model `hf` (its checkpoint files in `src`,
    when it has them)."""
    import tempfile

    from transformer_lens import loading

    hf_cfg = hf.config.to_dict()
    if hf_cfg.get("model_type") in ("llama", "gemma2", "gemma", "mistral") and hf_cfg.get("attention_bias"):
        raise ModelError(f"{where} is a {hf_cfg['model_type']} model with attention biases (attention_bias=true, as a "
                         "repair folded into a Hugging Face folder has), which TransformerLens's conversion drops: its "
                         "numbers would be the unbiased model's", field="model",
                         fix="load it with transformers directly, or fold the repair into a TransformerLens checkpoint "
                             "(surgeon repair --fold-format tl) for surgeon to read")
    if hf_cfg.get("model_type") == "gpt2" and "n_ctx" not in hf_cfg:
        # transformers 5 no longer saves n_ctx for GPT-2; TL reads it (it equals n_positions)
        hf_cfg["n_ctx"] = hf_cfg.get("n_positions", 1024)
    # TL picks architecture branches by substrings of the *name* ("llama", "gemma"); a neutral link
    # name makes it read the checkpoint's own config instead.
    with tempfile.TemporaryDirectory(prefix="surgeon-ckpt-") as tmp:
        neutral = _neutral_view(src, Path(tmp) / "checkpoint", hf_cfg)
        try:
            if hf_cfg.get("model_type") == "gemma2":
                cfg = _gemma2_config(hf_cfg, device, n_devices, tdtype)
            else:
                cfg = loading.get_pretrained_model_config(str(neutral), hf_cfg=hf_cfg, device=device,
                                                          n_devices=n_devices, dtype=tdtype, fold_ln=False,
                                                          local_files_only=True, trust_remote_code=False)
            state = loading.get_pretrained_state_dict(str(neutral), cfg, hf, dtype=tdtype)
        except Exception as e:
            raise ModelError(f"TransformerLens cannot convert {where} ({hf_cfg.get('architectures')}): {e}",
                             field="model", fix="use an architecture TransformerLens supports (GPT-2, Llama, Gemma, Qwen2, ...)") from None
    return cfg, state


def _hooked(cfg, state, tok, n_devices: int):
    """The HookedTransformer holding `state` (weights as they are: no folding or centering)."""
    from transformer_lens import HookedTransformer

    model = HookedTransformer(cfg, tokenizer=tok, move_to_device=False, default_padding_side="right")
    model.load_and_process_state_dict(state, fold_ln=False, center_writing_weights=False, center_unembed=False,
                                      fold_value_biases=False, refactor_factored_attn_matrices=False)
    del state
    if n_devices > 1:
        model.move_model_modules_to_device()  # TL spreads the layers over the GPUs
    else:
        model.to(cfg.device)
    model.eval()
    return model


def _gemma2_config(c: dict, device, n_devices: int, dtype):
    """TL 3.9 knows Gemma-2 only by official name (hard-coded sizes); build its config from the checkpoint's."""
    import math

    from transformer_lens import HookedTransformerConfig

    n = c["num_hidden_layers"]
    kinds = c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    return HookedTransformerConfig(
        d_model=c["hidden_size"], d_head=c["head_dim"], n_heads=c["num_attention_heads"], d_mlp=c["intermediate_size"],
        n_layers=n, n_ctx=min(c.get("max_position_embeddings", 8192), 8192), eps=c["rms_norm_eps"],
        d_vocab=c["vocab_size"], act_fn=c.get("hidden_activation") or "gelu_pytorch_tanh",
        normalization_type="RMS", rotary_base=c.get("rope_theta", 10000.0), rotary_dim=c["head_dim"],
        positional_embedding_type="rotary", use_attn_scale=True,
        attn_scale=math.sqrt(c.get("query_pre_attn_scalar") or c["head_dim"]),
        n_key_value_heads=c["num_key_value_heads"], window_size=c["sliding_window"], use_local_attn=True,
        attn_types=["local" if k == "sliding_attention" else "global" for k in kinds],
        attn_scores_soft_cap=c.get("attn_logit_softcapping") or -1.0,
        output_logits_soft_cap=c.get("final_logit_softcapping") or -1.0, gated_mlp=True, final_rms=True,
        use_normalization_before_and_after=True, original_architecture="Gemma2ForCausalLM",
        device=device, n_devices=n_devices, dtype=dtype, default_prepend_bos=True, init_weights=False,
        tokenizer_prepends_bos=True)


def _neutral_view(src: Path | None, dest: Path, hf_cfg: dict) -> Path:
    """A directory of links to the checkpoint's files (none for a model without files) under a name TL's
    name-based branches ignore, with config.json written from the loaded config (filling fields TL reads but new
    saves omit)."""
    import json

    dest.mkdir()
    for f in Path(src).iterdir() if src is not None else ():
        if f.name != "config.json":
            (dest / f.name).symlink_to(f.resolve())
    (dest / "config.json").write_text(json.dumps(hf_cfg, default=str))
    return dest


