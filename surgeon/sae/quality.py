"""Quality before trust: is an SAE good enough for its feature numbers to mean anything on this case?

Measured on the case's own text in every format (the activations `surgeon.sae.train.collect_activations`
gives): L0 (active features per token), explained variance 1 - Var(x - x_hat) / Var(x), reconstruction
MSE, the fraction of features never active; and what the case's score does when the SAE's reconstruction
replaces the activation at every position but BOS (mean change per format, against the good-bad gap).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from surgeon.engine.readout import score_rows
from surgeon.case.encoding import format_rows, prepend_bos

# an SAE below these is flagged: its features are not a faithful account of the activation here
MIN_EXPLAINED_VARIANCE = 0.7
MAX_SCORE_SHIFT = 0.25  # |mean score change| as a fraction of the good-bad gap, in any format
MAX_DEAD_FRACTION = 0.9


@dataclass(frozen=True)
class Quality:
    layer: int
    hook: str
    sae: str  # where it came from
    d_sae: int
    n_tokens: int
    l0: float
    explained_variance: float
    mse: float
    dead_fraction: float
    clean_score: dict  # format -> mean item score
    spliced_score: dict  # format -> mean item score with the reconstruction spliced in
    gap: float  # mean score good - first failing format (clean)
    warnings: list = field(default_factory=list)


@torch.no_grad()
def reconstruction_stats(sae, acts: torch.Tensor, batch: int = 4096) -> dict:
    """L0, explained variance, MSE and dead fraction of `sae` on activations [tokens, d]."""
    p = next(sae.parameters())
    sq_err = tot_l0 = 0.0
    fired = None
    for lo in range(0, len(acts), batch):
        x = acts[lo: lo + batch].to(p.device, p.dtype)
        f = sae.encode(x)
        err = (sae.decode(f) - x).float()
        sq_err += float((err ** 2).sum())
        tot_l0 += float((f > 0).sum())
        a = (f > 0).any(0)
        fired = a if fired is None else fired | a
    x = acts.float()
    var = float(((x - x.mean(0)) ** 2).sum())
    n = len(acts)
    return dict(l0=tot_l0 / n, explained_variance=1 - sq_err / var if var > 0 else float("nan"),
                mse=sq_err / (n * acts.shape[1]), dead_fraction=float(1 - fired.float().mean()))


def splice_hook(sae, skip: int):
    """A hook replacing the activation with the SAE's reconstruction at positions >= skip."""
    def hook(act, hook):
        out = act.clone()
        x = act[:, skip:]
        out[:, skip:] = sae.decode(sae.encode(x.to(next(sae.parameters()).dtype))).to(act.dtype)
        return out
    return hook


def measure(case, model, sae, layer: int, hook: str, acts: torch.Tensor, where: str, batch_size: int = 256) -> Quality:
    stats = reconstruction_stats(sae, acts)
    clean, spliced = {}, {}
    skip = 1 if prepend_bos(case, model) else 0
    for fmt in [case.good, *case.bad_formats]:
        rows = format_rows(case, model, fmt, case.items)
        clean[fmt] = float(score_rows(model, rows, batch_size).mean())
        with model.hooks(fwd_hooks=[(hook, splice_hook(sae, skip))]):
            spliced[fmt] = float(score_rows(model, rows, batch_size).mean())
    gap = clean[case.good] - clean[case.bad_formats[0]]
    warn = []
    if not stats["explained_variance"] >= MIN_EXPLAINED_VARIANCE:
        warn.append(f"explains {100 * stats['explained_variance']:.0f}% of the variance (< {100 * MIN_EXPLAINED_VARIANCE:.0f}%)")
    shift = max(abs(spliced[f] - clean[f]) for f in clean)
    if abs(gap) > 1e-9 and shift > MAX_SCORE_SHIFT * abs(gap):
        warn.append(f"splicing its reconstruction moves a format's mean score by {shift:.2f}, "
                    f"{100 * shift / abs(gap):.0f}% of the good-bad gap {gap:.2f} (> {100 * MAX_SCORE_SHIFT:.0f}%)")
    if stats["dead_fraction"] > MAX_DEAD_FRACTION:
        warn.append(f"{100 * stats['dead_fraction']:.0f}% of its features never fire on this case's text")
    return Quality(layer, hook, where, int(sae.cfg.d_sae), len(acts), stats["l0"], stats["explained_variance"],
                   stats["mse"], stats["dead_fraction"], clean, spliced, gap, warn)


def quality_text(qs) -> str:
    lines = ["SAE quality on the case's text (every format, every position but BOS):",
             f"{'layer':>5}  {'hook':<26} {'d_sae':>6} {'L0':>6} {'expl.var':>8} {'MSE':>9} {'dead':>6}  score shift (spliced - clean)"]
    for q in qs:
        shifts = ", ".join(f"{f} {q.spliced_score[f] - q.clean_score[f]:+.2f}" for f in q.clean_score)
        lines.append(f"{q.layer:>5}  {q.hook:<26} {q.d_sae:>6} {q.l0:>6.2f} {q.explained_variance:>8.3f} {q.mse:>9.2e} "
                     f"{100 * q.dead_fraction:>5.0f}%  {shifts}")
    bad = [q for q in qs if q.warnings]
    for q in bad:
        lines.append(f"WARNING: the SAE at layer {q.layer} ({q.sae}) is too poor for its feature numbers to mean much: "
                     + "; ".join(q.warnings))
    if not bad:
        lines.append(f"every SAE passes: explained variance >= {MIN_EXPLAINED_VARIANCE}, score shift <= "
                     f"{100 * MAX_SCORE_SHIFT:.0f}% of the gap, dead features <= {100 * MAX_DEAD_FRACTION:.0f}%")
    return "\n".join(lines)
