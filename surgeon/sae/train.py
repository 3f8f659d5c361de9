"""Training SAEs for a case's model with sae-lens's own trainer (`SAETrainer`), on the model's activations
over the case's text in every format (each item's prompt with each answer, every position but BOS).

Deterministic: the SAE's initialisation and the batches drawn from the activations follow `seed`. The
organisms' SAEs are small (TopK, 4 x d_model features) and ship beside their weights; `surgeon sae train`
rebuilds them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from surgeon.engine.readout import cached_batches
from surgeon.errors import optional_import
from surgeon.results import follow_umask
from surgeon.case.encoding import format_rows, prepend_bos


@dataclass(frozen=True)
class TrainOptions:
    expansion: int = 4  # d_sae = expansion x d_in
    k: int = 8  # active features per token (TopK)
    steps: int = 2000
    batch: int = 256
    lr: float = 3e-3
    seed: int = 0


@torch.no_grad()
def collect_activations(case, model, hooks: Sequence[str], batch_size: int = 64) -> dict[str, Tensor]:
    """[tokens, d] activations at each hook over every format's rows (prompt + each answer), BOS dropped."""

    rows = [r for fmt in case.formats for r in format_rows(case, model, fmt, case.items)]
    skip = 1 if prepend_bos(case, model) else 0
    out: dict[str, list[Tensor]] = {h: [] for h in hooks}
    for chunk, acts in cached_batches(model, rows, hooks, batch_size):
        for h in hooks:
            out[h] += [acts[h][i, skip: len(r.tokens)].float().cpu() for i, r in enumerate(chunk)]
    return {h: torch.cat(v) for h, v in out.items()}


def float_environment() -> dict:
    """What decides the training's float arithmetic besides its inputs: torch's version and the CPU kernels it runs
    (AVX2, AVX512, ...). Training is deterministic where these are equal; elsewhere the same seed rounds differently
    and a TopK SAE's training, chaotic over thousands of steps, ends elsewhere."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def train_sae(acts: Tensor, hook: str, opts: TrainOptions = TrainOptions(), model_name: str = "", progress: bool = False):
    """A TopK SAE trained with sae-lens's SAETrainer on `acts` [tokens, d]; returned in training form."""
    optional_import("sae_lens", "training an SAE")
    from sae_lens.config import SAETrainerConfig
    from sae_lens.saes.sae import SAEMetadata
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    d = acts.shape[1]
    torch.manual_seed(opts.seed)
    cfg = TopKTrainingSAEConfig(d_in=d, d_sae=opts.expansion * d, k=opts.k,
                                metadata=SAEMetadata(hook_name=hook, model_name=model_name, prepend_bos=True))
    sae = TopKTrainingSAE(cfg)
    gen = torch.Generator().manual_seed(opts.seed)

    def batches():
        while True:
            yield acts[torch.randint(0, len(acts), (opts.batch,), generator=gen)]

    window = max(100, opts.steps // 4)
    tcfg = SAETrainerConfig(total_training_samples=opts.batch * opts.steps, train_batch_size_samples=opts.batch,
                            lr=opts.lr, lr_end=opts.lr / 10, lr_scheduler_name="cosineannealing",
                            dead_feature_window=window, feature_sampling_window=window)
    if progress:
        return SAETrainer(tcfg, sae, batches()).fit()
    import contextlib
    import io

    with contextlib.redirect_stderr(io.StringIO()):  # sae-lens's own bar: surgeon shows one per SAE
        return SAETrainer(tcfg, sae, batches()).fit()


def save(sae, path: Path, record: dict | None = None) -> None:
    """Write an SAE in the inference layout sae-lens loads (cfg.json + sae_weights.safetensors), atomically,
    with `record` (how it was trained) as training.json beside it."""
    import shutil
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        try:
            sae.save_inference_model(tmp)
        except Exception as e:  # safetensors reports a failed write as its own error type, not an OSError
            if isinstance(e, OSError) or not re.search(r"No space|os error 28|Disk quota|os error 122", str(e)):
                raise
            import errno

            raise OSError(errno.ENOSPC, "No space left on device", str(path)) from None
        if record is not None:
            import json

            (tmp / "training.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        follow_umask(tmp, directory=True)
        for f in tmp.iterdir():
            follow_umask(f)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def install(staged: Path, out: Path, names) -> None:
    """Move the SAE folders `names` from `staged` into `out` together, at the end of a run: an interrupted run
    leaves `out` as it was, never some layers new and the rest old."""
    import shutil
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    trash = Path(tempfile.mkdtemp(prefix=".replaced-", dir=out))
    try:
        for name in names:
            if (out / name).exists():
                (out / name).rename(trash / name)
            (staged / name).rename(out / name)
    finally:
        shutil.rmtree(trash, ignore_errors=True)
