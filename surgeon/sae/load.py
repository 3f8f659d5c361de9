"""Finding and loading SAEs offline: pretrained sae-lens releases from the local Hugging Face cache, or
local directories (sae-lens's `save_model` layout: cfg.json + sae_weights.safetensors).

An `SAESource` names one SAE per layer with `{layer}` templating: `release="llama_scope_lxm_8x",
sae_id="l{layer}m_8x"` or `path="saes/blocks.{layer}.hook_mlp_out"`. A case file may name its SAEs as
`saes={"release": ..., "id": ...}` or `saes={"dir": ...}` (a relative directory is read from the case
file's folder). Nothing here touches the network.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from surgeon.errors import SurgeonError, optional_import
from surgeon.results import shown_path

# how surgeon loads a model (see surgeon.models): an SAE trained on a model loaded otherwise reads other activations
_OUR_MODEL_PROCESSING = dict(fold_ln=False, center_writing_weights=False, center_unembed=False,
                             fold_value_biases=False, refactor_factored_attn_matrices=False)


class SAEError(SurgeonError):
    """An SAE cannot be found, loaded, or used with this model."""


@dataclass(frozen=True)
class SAESource:
    release: str | None = None
    sae_id: str | None = None  # with {layer}
    path: str | None = None  # with {layer}

    def __post_init__(self):
        if (self.path is None) == (self.release is None):
            raise SAEError("name SAEs either by a sae-lens release and id or by a local directory", field="--sae-release",
                           fix="give --sae-release R --sae-id 'l{layer}m_8x', or --sae-dir 'DIR/blocks.{layer}.hook_mlp_out'")
        if self.release is not None and not self.sae_id:
            raise SAEError(f"release {self.release!r} needs an SAE id", field="--sae-id",
                           fix="e.g. --sae-id 'l{layer}m_8x' ({layer} is replaced by each layer)")

    def check_available(self, layers=None) -> None:
        """Refuse, before any model loads, a directory source with no SAE for the layers asked for (or, with no
        layers named, for any layer); and refuse where sae-lens, which loads every SAE, is missing."""
        optional_import("sae_lens", "SAEs")
        if self.path is None:
            return
        import glob

        if layers is not None:
            missing = [L for L in layers if not (Path(self.path.format(layer=L)).expanduser() / "cfg.json").is_file()]
            if missing:
                raise SAEError(f"{self.path.format(layer=missing[0])} is not an SAE directory (no cfg.json)",
                               field="--sae-dir", fix="point at directories written by sae-lens (cfg.json + "
                                                      "sae_weights.safetensors); use {layer} for the layer number")
        elif not glob.glob(str(Path(self.path.replace("{layer}", "*")).expanduser() / "cfg.json")):
            raise SAEError(f"no SAE directory matches {self.path}", field="--sae-dir",
                           fix="point at directories written by sae-lens; use {layer} for the layer number")

    def digest(self) -> dict:
        """What names these SAEs for a cache key: the release and id, or the directory pattern and a sha256 over every
        matching layer directory's files (an SAE retrained in place gives another digest)."""
        if self.path is None:
            return {"release": self.release, "id": self.sae_id}
        import glob
        import hashlib

        h = hashlib.sha256()
        for d in sorted(glob.glob(str(Path(self.path.replace("{layer}", "*")).expanduser()))):
            for f in sorted(Path(d).glob("*")) if Path(d).is_dir() else ():
                if f.is_file():
                    h.update(f"{Path(d).name}/{f.name}".encode() + b"\0" + f.read_bytes())
        return {"path": shown_path(self.path), "sha256": h.hexdigest()}

    def layers(self, n_layers: int, asked=None, field: str = "--layers") -> list[int]:
        """The layers to read: `asked` (checked against the model), else every layer with an SAE directory (a
        release: every layer)."""
        if asked is None:
            if self.path is None:
                return list(range(n_layers))
            asked = [L for L in range(n_layers) if (Path(self.path.format(layer=L)).expanduser() / "cfg.json").is_file()]
            if not asked:
                raise SAEError(f"no SAE directory matches {self.path} for any layer 0..{n_layers - 1}", field="--sae-dir",
                               fix="train them (surgeon sae train) or point --sae-dir at DIR/blocks.{layer}.hook_...")
        return model_layers(n_layers, asked, field)

    @staticmethod
    def from_case(case, release: str | None = None, sae_id: str | None = None, path: str | None = None) -> "SAESource":
        """Command-line choices first, then the case's `saes` (a relative dir from the case file's folder)."""
        if release or sae_id or path:
            return SAESource(release, sae_id, path)
        spec = dict(getattr(case, "saes", None) or {})
        if not spec:
            raise SAEError(f"case {case.name!r} names no SAEs and none were given", field="--sae-dir",
                           fix="give --sae-dir DIR (or --sae-release and --sae-id), or set saes={...} in the case file")
        if "dir" in spec:
            p = Path(str(spec["dir"])).expanduser()
            if not p.is_absolute() and case.source:
                p = Path(case.source).parent / p
            return SAESource(path=str(p))
        return SAESource(spec.get("release"), spec.get("id"))

    def describe(self, layer: int) -> str:
        return shown_path(self.path.format(layer=layer)) if self.path else f"{self.release}/{self.sae_id.format(layer=layer)}"

    def neuronpedia(self, layer: int) -> str | None:
        """The release's Neuronpedia id for this layer's SAE (feature pages are BASE/ID/FEATURE), if it has one."""
        if self.release is None:
            return None
        from sae_lens.loading.pretrained_saes_directory import (
            get_pretrained_saes_directory,
        )

        entry = get_pretrained_saes_directory().get(self.release)
        return (entry.neuronpedia_id or {}).get(self.sae_id.format(layer=layer)) if entry else None


def model_layers(n_layers: int, asked=None, field: str = "--layers") -> list[int]:
    """`asked` checked against a model of `n_layers` layers (None: all of them); `field` names the option."""
    if asked is None:
        return list(range(n_layers))
    for L in asked:
        if not 0 <= L < n_layers:
            raise SAEError(f"layer {L} is out of range (the model has layers 0..{n_layers - 1})", field=field,
                           fix=f"use layers between 0 and {n_layers - 1}")
    return list(asked)


def neuronpedia_url(np_id: str | None, feature: int) -> str | None:
    return f"https://www.neuronpedia.org/{np_id}/{feature}" if np_id else None


def load_sae(source: SAESource, layer: int, device: str = "cpu", dtype: str = "float32", d_model: int | None = None):
    """The sae-lens SAE for one layer, from the local disk or cache only, checked (`check_sae`) against the
    layer it is used at and, with `d_model`, the model's width."""
    sae = _load(source, layer, device, dtype)
    if source.path is not None:
        check_sae(sae, layer, d_model, source.path.format(layer=layer), "--sae-dir")
    else:
        check_sae(sae, layer, d_model, f"{source.release}/{source.sae_id.format(layer=layer)}", "--sae-id")
    return sae


def check_sae(sae, layer: int, d_model: int | None, where: str, field: str = "--sae-dir") -> None:
    """An SAE must read a hook point of the layer it is used at, as wide as the model writes there, with finite
    weights: anything else would give numbers that look fine and mean nothing."""
    import re

    import torch

    hook = getattr(getattr(sae.cfg, "metadata", None), "hook_name", None) or getattr(sae.cfg, "hook_name", None)
    m = re.fullmatch(r"blocks\.(\d+)\.(hook_resid_pre|hook_resid_mid|hook_resid_post|hook_mlp_out|hook_attn_out)",
                     hook or "")
    if m is None:
        raise SAEError(f"the SAE reads {hook!r}, which is not a residual, MLP-output or attention-output hook point",
                       where=where, field=field, fix="set metadata.hook_name in its cfg.json, e.g. blocks.3.hook_mlp_out")
    if int(m.group(1)) != layer:
        raise SAEError(f"the SAE was trained on {hook} (layer {m.group(1)}) but is used at layer {layer}", where=where,
                       field=field, fix="use {layer} in the SAE path or id, so each layer gets its own SAE")
    named = re.search(r"blocks\.\d+\.hook_\w+", Path(where).name) if field == "--sae-dir" else None
    if named and named.group(0) != hook:  # the folder says one hook point, its cfg.json another
        raise SAEError(f"the SAE's folder is named for {named.group(0)} but its cfg.json says it reads {hook}: one of "
                       "them is wrong, and the SAE would be used where it was not trained", where=where, field=field,
                       fix="check which hook point it was trained on; fix metadata.hook_name in cfg.json or rename "
                           "the folder")
    d_in = int(getattr(sae.cfg, "d_in", 0) or sae.W_enc.shape[0])
    if d_model is not None and d_in != d_model:
        raise SAEError(f"the SAE reads vectors of width {d_in}, but the model writes {d_model} at {hook}", where=where,
                       field=field, fix="use an SAE trained on this model")
    d_sae = int(getattr(sae.cfg, "d_sae", 0) or sae.W_enc.shape[1])
    k = getattr(sae.cfg, "k", None)
    if k is not None and not (isinstance(k, int) and 1 <= k <= d_sae):
        raise SAEError(f"the SAE keeps k = {k!r} features of its {d_sae}: a top-k SAE keeps 1 to d_sae", where=where,
                       field=field, fix="set k in its cfg.json to the k it was trained with (at most d_sae)")
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        w = getattr(sae, name, None)
        if isinstance(w, torch.Tensor) and not bool(torch.isfinite(w).all()):
            raise SAEError(f"the SAE's {name} holds NaN or infinite values", where=where, field=field,
                           fix="retrain or re-save the SAE")


def _load(source: SAESource, layer: int, device: str, dtype: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    SAE = optional_import("sae_lens", "loading an SAE").SAE

    if source.path is not None:
        p = Path(source.path.format(layer=layer)).expanduser()
        if not (p / "cfg.json").is_file():
            raise SAEError(f"{p} is not an SAE directory (no cfg.json)", field="--sae-dir",
                           fix="point at a directory written by sae-lens (cfg.json + sae_weights.safetensors); "
                               "use {layer} for the layer number")
        try:
            sae = SAE.load_from_disk(str(p), device=device, dtype=dtype)
        except Exception as e:  # a broken file: say which
            raise SAEError(f"cannot load the SAE in {p}: {type(e).__name__}: {e}", field="--sae-dir",
                           fix="re-save it with sae-lens (sae.save_model(DIR))") from None
        return sae
    sae_id = source.sae_id.format(layer=layer)
    _check_processing(source.release, sae_id)
    try:
        sae = SAE.from_pretrained(source.release, sae_id, device=device, dtype=dtype)
    except ValueError as e:
        raise SAEError(str(e).splitlines()[0], field="--sae-id",
                       fix="check the release and id against sae-lens's pretrained_saes.yaml") from None
    except Exception as e:
        from huggingface_hub.errors import LocalEntryNotFoundError

        if isinstance(e, (LocalEntryNotFoundError, FileNotFoundError, OSError)):
            raise SAEError(f"SAE {source.release}/{sae_id} is not in the local Hugging Face cache (and surgeon works "
                           "offline)", field="--sae-release",
                           fix="download it on a connected machine (huggingface-cli download REPO) into the cache, "
                               "or save it as a directory and use --sae-dir") from None
        raise
    return sae


def _check_processing(release: str, sae_id: str) -> None:
    """Refuse SAEs trained on a model loaded with weight processing surgeon does not do."""
    from sae_lens.loading.pretrained_saes_directory import get_pretrained_saes_directory

    entry = get_pretrained_saes_directory().get(release)
    overrides = (entry.config_overrides or {}) if entry else {}
    kwargs = overrides.get("model_from_pretrained_kwargs") or {}
    differ = {k: v for k, v in kwargs.items() if k in _OUR_MODEL_PROCESSING and v != _OUR_MODEL_PROCESSING[k]}
    if differ:
        raise SAEError(f"SAE {release}/{sae_id} was trained on a model loaded with {differ}; surgeon loads models "
                       "unprocessed, so its features would be read from other activations", field="--sae-release",
                       fix="use an SAE trained on the unprocessed model, or one you trained (surgeon sae train)")


def load_saes(source: SAESource, layers, device: str = "cpu", dtype: str = "float32",
              d_model: int | None = None) -> dict:
    """{layer: SAE} for the given layers."""
    return {L: load_sae(source, L, device, dtype, d_model) for L in layers}
