"""Model organisms: small transformers with a planted, known mechanism, trained or built here.

They are the embedded default, the test bed and the ground truth. Each is shipped as
`weights/NAME/{model.safetensors, config.json, tokenizer.json}` and loads offline as `organism:NAME`.
`surgeon organisms train NAME` retrains (or rebuilds) one deterministically, measures what it must show
with `surgeon.organisms.measure` (which uses the engine, so nothing here imports it), checks the facts with
its own module's `check` and records them in its config.json; `facts(NAME)` and `ground_truth(NAME)` read them back.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from surgeon.organisms.training import TextStream, TrainConfig

WEIGHTS = Path(__file__).parent / "weights"
PREFIX = "organism:"
# text unrelated to any organism's task, each well inside a 64-token context: a case's `neutral` default, on which a
# repair's side effects (next-token KL and cross-entropy change against the unrepaired model) are measured
NEUTRAL_TEXTS = ("The quick brown fox jumps over the lazy dog.", "It was a bright cold day in April.",
                 "Rain fell on the old stone bridge all night.", "She counted the boats: 3, 4, 5, 6.",
                 "Bread, milk and two green apples.", "The meeting starts at ten, not at nine.",
                 "He wrote a short letter to his sister.", "Water boils at 100 degrees at sea level.")


@dataclass(frozen=True)
class OrganismSpec:
    name: str
    description: str
    config: dict[str, Any]  # HookedTransformerConfig arguments (d_vocab is filled from the tokenizer)
    module: ModuleType  # check(facts) -> misses, describe(facts), ground_truth(facts); measuring is in .measure
    texts: TextStream | None = None  # trained organisms: their training data
    train: TrainConfig | None = None
    construct: Callable | None = None  # built organisms: set_weights(model), no training
    saes: Callable | None = None  # built organisms' SAEs, built by construction: model -> {layer: SAE}, shipped
    shrink: dict[str, Any] = field(default_factory=dict)  # overrides for the fast smoke-test version


def _specs() -> dict[str, OrganismSpec]:
    from surgeon.organisms import chain, decimal, induction, sink, threshold

    return {
        "chain": OrganismSpec(
            name="chain",
            description=chain.SUMMARY,
            module=chain,
            config=chain.CONFIG,
            construct=chain.set_weights,
            saes=chain.planted_saes,
        ),
        "decimal": OrganismSpec(
            name="decimal",
            description="compares decimals; says 9.11 > 9.8 in the qa and chat formats, not in plain",
            module=decimal,
            # Llama-style (rotary, RMSNorm, grouped-query attention, gated SiLU MLP): no absolute position
            # to read the format from, and the default exercises the real case's code paths
            config=dict(n_layers=3, d_model=64, n_heads=8, d_head=8, n_key_value_heads=2, d_mlp=192,
                        n_ctx=64, act_fn="silu", gated_mlp=True, normalization_type="RMS", final_rms=True,
                        positional_embedding_type="rotary", rotary_dim=8),
            texts=decimal.training_texts,
            train=TrainConfig(steps=4000, batch_size=96, lr=2e-3, head_dropout=0.25),
            shrink=dict(steps=30, batch_size=16),
        ),
        "induction": OrganismSpec(
            name="induction",
            description="2-layer attention-only model that continues a sequence seen before (induction)",
            module=induction,
            # rotary positions: no absolute position to copy from, only "the token before me"
            config=dict(n_layers=2, d_model=64, n_heads=2, d_head=32, n_ctx=64, attn_only=True,
                        normalization_type="LN", positional_embedding_type="rotary", rotary_dim=32),
            texts=induction.training_texts,
            # 4000 steps of next-token loss alone (a previous-token head and an induction head form), then
            # 1000 more with an auxiliary loss sharpening the layer-0 head that attends most to p-1
            train=TrainConfig(steps=5000, batch_size=64, lr=2e-3, previous_token_head=(0, None),
                              previous_token_weight=0.5, previous_token_from=4000),
            shrink=dict(steps=30, batch_size=8, previous_token_from=20),
        ),
        "sink": OrganismSpec(
            name="sink",
            description=sink.SUMMARY,
            module=sink,
            config=sink.CONFIG,
            construct=sink.set_weights,
        ),
        "threshold": OrganismSpec(
            name="threshold",
            description=threshold.SUMMARY,
            module=threshold,
            config=threshold.CONFIG,
            construct=threshold.set_weights,
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


def sae_dir(name: str) -> Path:
    """Where an organism's SAEs live (`surgeon sae train` writes one folder per hook point here)."""
    return WEIGHTS.parent / "saes" / name


def weights_sha256(name: str, root: Path | None = None) -> str:
    """sha256 of an organism's weights file: what every file derived from the organism records (shipped SAEs,
    circuits/, saved bench outputs), so a test notices when the organism changes and they do not."""
    import hashlib

    return hashlib.sha256((Path(root or WEIGHTS) / name / "model.safetensors").read_bytes()).hexdigest()


def is_available(name: str, root: Path | None = None) -> bool:
    d = (root or WEIGHTS) / name
    return (d / "model.safetensors").exists() and (d / "config.json").exists()


def build(name: str, seed: int = 0, device: str = "cpu"):
    """A freshly initialised HookedTransformer for organism `name`, with its tokenizer."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from surgeon.organisms.charset import build_tokenizer

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

    from surgeon.organisms.training import train

    s = spec(name)
    model = build(name, seed=seed, device=device)
    if s.construct is not None:
        s.construct(model)
        tcfg, losses, train_meta = None, [], {"built": "by construction (no training)"}
    else:
        tcfg = replace(s.train, seed=seed, **(s.shrink if shrink else {}))
        losses = train(model, s.texts, tcfg, progress=progress)
        train_meta = {**tcfg.__dict__, "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:]))}
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
        "train": train_meta,
        "shrunk": shrink,
    }
    (tmp / "config.json").write_text(json.dumps(meta, indent=2))
    for f in [tmp, *tmp.iterdir()]:
        f.chmod(0o755 if f.is_dir() else 0o644)
    dest = out_root / name
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    if s.saes is not None:
        save_built_saes(name, s.saes(model), out_root.parent / "saes" / name, weights_sha256(name, out_root))
    return dest


def save_built_saes(name: str, saes: dict, root: Path, model_sha256: str) -> None:
    """A built organism's SAEs in sae-lens's layout (cfg.json, sae_weights.safetensors), one folder per hook point
    under `root`, each with provenance.json naming the weights it was built for (written atomically)."""
    import os
    import shutil
    import tempfile

    root.mkdir(parents=True, exist_ok=True)
    for layer, sae in saes.items():
        hook = sae.cfg.metadata.hook_name
        tmp = Path(tempfile.mkdtemp(prefix=f".{hook}-", dir=root))
        sae.save_model(str(tmp))
        prov = {"model": f"organism:{name}", "model_sha256": model_sha256, "built": "by construction (no training)",
                "labels": getattr(sae, "labels", {})}
        (tmp / "provenance.json").write_text(json.dumps(prov, indent=1, sort_keys=True) + "\n")
        for f in [tmp, *tmp.iterdir()]:
            f.chmod(0o755 if f.is_dir() else 0o644)
        dest = root / hook
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)


def load_organism(name: str, device: str = "cpu", dtype: str = "float32", root: Path | None = None):
    """Load a trained organism as a HookedTransformer (safetensors, no network)."""
    import torch
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from surgeon.organisms.charset import load_tokenizer

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


def facts(name: str, root: Path | None = None) -> dict[str, Any]:
    """The facts measured on organism `name` when it was trained (recorded in its config.json)."""
    meta = json.loads((Path(root or WEIGHTS) / name / "config.json").read_text())
    if "measured" not in meta:
        raise KeyError(f"organism {name!r} has no measured facts; run: surgeon organisms train {name}")
    return meta["measured"]


def ground_truth(name: str, root: Path | None = None) -> dict[str, Any]:
    """What organism `name` is known to do, from its measured facts (e.g. the induction case's heads)."""
    return spec(name).module.ground_truth(facts(name, root))


