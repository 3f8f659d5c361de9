"""Model organisms: small transformers trained here with a planted, known mechanism.

They are the embedded default, the test bed and the ground truth. Each is shipped as
`weights/NAME/{model.safetensors, config.json, tokenizer.json}` and loads offline as `organism:NAME`.
`surgeon organisms train NAME` retrains one deterministically.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .training import TextStream, TrainConfig

WEIGHTS = Path(__file__).parent / "weights"
PREFIX = "organism:"


@dataclass(frozen=True)
class OrganismSpec:
    name: str
    description: str
    config: dict[str, Any]  # HookedTransformerConfig arguments (d_vocab is filled from the tokenizer)
    texts: TextStream
    train: TrainConfig
    shrink: dict[str, Any] = field(default_factory=dict)  # overrides for the fast smoke-test version


def _specs() -> dict[str, OrganismSpec]:
    from . import decimal, induction

    return {
        "decimal": OrganismSpec(
            name="decimal",
            description="compares decimals; says 9.11 > 9.8 in the qa and chat formats, not in plain",
            config=dict(n_layers=3, d_model=64, n_heads=8, d_head=8, d_mlp=256, n_ctx=64,
                        act_fn="gelu", normalization_type="LN"),
            texts=decimal.training_texts,
            train=TrainConfig(steps=4000, batch_size=96, lr=2e-3, head_dropout=0.25),
            shrink=dict(steps=30, batch_size=16),
        ),
        "induction": OrganismSpec(
            name="induction",
            description="2-layer attention-only model that copies a repeated random string",
            config=dict(n_layers=2, d_model=64, n_heads=4, d_head=16, n_ctx=64,
                        attn_only=True, normalization_type="LN"),
            texts=induction.training_texts,
            train=TrainConfig(steps=2000, batch_size=64, lr=2e-3),
            shrink=dict(steps=30, batch_size=8),
        ),
    }


def names() -> list[str]:
    return sorted(_specs())


def spec(name: str) -> OrganismSpec:
    specs = _specs()
    if name not in specs:
        raise KeyError(f"unknown organism {name!r}; known: {', '.join(sorted(specs))}")
    return specs[name]


def weights_dir(name: str) -> Path:
    return WEIGHTS / name


def is_available(name: str, root: Path | None = None) -> bool:
    d = (root or WEIGHTS) / name
    return (d / "model.safetensors").exists() and (d / "config.json").exists()


def build(name: str, seed: int = 0, device: str = "cpu"):
    """A freshly initialised HookedTransformer for organism `name`, with its tokenizer."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from .charset import build_tokenizer

    s = spec(name)
    tok = build_tokenizer(f"surgeon-organism-{name}")
    torch.manual_seed(seed)
    cfg = HookedTransformerConfig(**s.config, d_vocab=len(tok), seed=seed, device=device,
                                  default_prepend_bos=True)
    return HookedTransformer(cfg, tokenizer=tok)


def train_organism(name: str, out_root: Path | None = None, shrink: bool = False,
                   seed: int = 0, device: str = "cpu", progress: bool = True) -> Path:
    """Train organism `name` from scratch and save it under `out_root/name` (atomically)."""
    import os
    import shutil
    import tempfile

    import torch
    from safetensors.torch import save_file

    from .training import train

    s = spec(name)
    tcfg = replace(s.train, seed=seed, **(s.shrink if shrink else {}))
    model = build(name, seed=seed, device=device)
    losses = train(model, s.texts, tcfg, progress=progress)
    out_root = Path(out_root or WEIGHTS)
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out_root))
    state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in model.state_dict().items()
             if not k.endswith(("IGNORE", ".mask"))}
    save_file(state, str(tmp / "model.safetensors"))
    model.tokenizer.backend_tokenizer.save(str(tmp / "tokenizer.json"))
    meta = {
        "organism": name,
        "description": s.description,
        "config": {**s.config, "d_vocab": model.cfg.d_vocab},
        "train": {**tcfg.__dict__, "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:]))},
        "shrunk": shrink,
    }
    (tmp / "config.json").write_text(json.dumps(meta, indent=2))
    for f in [tmp, *tmp.iterdir()]:
        f.chmod(0o755 if f.is_dir() else 0o644)
    dest = out_root / name
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def load_organism(name: str, device: str = "cpu", dtype: str = "float32", root: Path | None = None):
    """Load a trained organism as a HookedTransformer (safetensors, no network)."""
    import torch
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from .charset import load_tokenizer

    d = Path(root or WEIGHTS) / name
    meta = json.loads((d / "config.json").read_text())
    tok = load_tokenizer(d / "tokenizer.json", f"surgeon-organism-{name}")
    cfg = HookedTransformerConfig(**meta["config"], device=device, dtype=getattr(torch, dtype),
                                  default_prepend_bos=True)
    model = HookedTransformer(cfg, tokenizer=tok)
    state = load_file(str(d / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith(("IGNORE", ".mask"))]
    if missing or unexpected:
        raise ValueError(f"{d}: weights do not match the config (missing {missing}, unexpected {unexpected})")
    model.eval()
    return model


def config_of(name: str, root: Path | None = None) -> dict[str, Any]:
    return json.loads((Path(root or WEIGHTS) / name / "config.json").read_text())["config"]
