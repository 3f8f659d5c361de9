"""Direct logit attribution and the logit lens: the first look before patching.

At the position that predicts the first token where the two answers differ (the prompt plus the answers'
common prefix), the logit difference correct - incorrect is a sum over what writes into the residual stream:
the embeddings, every head's output (z @ W_O), each layer's attention bias and MLP output, through the final
norm with its scale frozen at this position (LayerNorm: each part centred; the norm's bias and the unembedding's
bias are their own parts). The parts sum exactly to the model's logit difference (checked per item), so a head's
share says how much it writes toward the correct answer directly, in each format.

The logit lens reads the residual stream after each layer through the final norm (its own scale) and the
unembedding: how the logit difference builds up, layer by layer, in each format.

An item scored at several positions (see `surgeon.Item`) is attributed at each of them, and its parts combined as
its score is (the mean or the sum over positions: `Case.combine`), so they still sum to the model's own number.

Conventions (recorded in the result and said in its report), each selectable:
- `value_biases="per-head"` (default, the raw weights): a head's output z @ W_O includes its value bias b_V @ W_O
  (the attention weights sum to 1). `"folded"` is TransformerLens's default model (`fold_value_biases`): b_V @ W_O is
  moved into the layer's attention bias, so each head's part is (z - b_V) @ W_O and the bias part grows by their sum.
- `lens_bias="included"` (default): the logit lens reads logits with the unembedding bias, so its last layer is the
  model's own logit difference. `"excluded"` is TransformerLens's logit lens (the residual stack through the final
  norm and W_U, no b_U): every layer's value moves by the constant b_U[correct] - b_U[incorrect].
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from surgeon.case.select import pick_items
from surgeon.engine.readout import cached_batches
from surgeon.errors import AnalysisError, CaseError
from surgeon.show import Shows
from surgeon.case.case import Case
from surgeon.case.encoding import encode_rows
from surgeon.stats import bootstrap_means
from surgeon.case.encoding import prepend_bos


@dataclass
class FormatLogits:
    """One format's numbers, each a mean over items with a 95% bootstrap interval ([..., 3]: mean, lo, hi)."""

    format: str
    role: str  # good | bad
    logit_diff: list[float]  # the model's logit difference [mean, lo, hi]
    heads: np.ndarray  # [layers, heads, 3] each head's direct effect
    attn: np.ndarray  # [layers, 3] every head of the layer plus its output bias
    mlp: np.ndarray  # [layers, 3] the layer's MLP output (zeros for an attention-only model)
    other: dict  # "embed", "norm and unembedding biases": [mean, lo, hi]
    lens: np.ndarray  # [layers, 3] logit lens after each layer (the last one is the model's output)
    max_residual: float  # largest |sum of the parts - the model's logit difference| over items


@dataclass
class LogitAttributionResult(Shows):
    case: str
    tag: str | None
    n_items: int
    n_layers: int
    n_heads: int
    formats: list[FormatLogits]
    # per failing format: (failing - good) per head [layers, heads, 3], paired over items
    head_difference: dict[str, np.ndarray] = field(default_factory=dict)
    options: dict = field(default_factory=dict)


def _rows(case: Case, model, fmt: str, items):
    """(rows, weights): the rows that score `items` (one per item), and per scored position, in row order, its
    weight in its item's score (1 where an item has one position)."""
    try:
        rows = encode_rows(case.formats[fmt], items, model.tokenizer, prepend_bos(case, model), "first_token",
                           combine=case.combine)
    except CaseError as e:
        raise AnalysisError(f"direct logit attribution reads the first token where the answers differ: {e.message}",
                            where=case.source, field="items",
                            fix="give answers that differ in some token (not one a prefix of the other)") from None
    return rows, np.array([abs(t[2]) for r in rows for t in r.targets[::2]])


def _pairs(rows):
    """Per scored position: (row, position, correct, incorrect). A row's targets come in pairs (position, correct,
    +w), (position, incorrect, -w)."""
    return [(i, r.targets[j][0], r.targets[j][1], r.targets[j + 1][1])
            for i, r in enumerate(rows) for j in range(0, len(r.targets), 2)]


def _combined(parts: dict, rows, weights: np.ndarray, n_items: int) -> dict:
    """Per-position parts [positions, ...] -> per item [items, ...], weighted as the item's score combines them."""
    items = np.array([rows[i].item for i, *_ in _pairs(rows)])
    out = {}
    for k, v in parts.items():
        acc = np.zeros((n_items, *v.shape[1:]))
        np.add.at(acc, items, v * weights.reshape(-1, *[1] * (v.ndim - 1)))
        out[k] = acc
    return out


VALUE_BIASES = ("per-head", "folded")
LENS_BIAS = ("included", "excluded")


@torch.no_grad()
def _parts(model, rows, batch_size: int, value_biases: str = "per-head", lens_bias: str = "included"):
    """Per scored position (`_pairs`, in row order): the direct parts [positions, layers, heads], attention biases and
    MLPs [positions, layers], embedding and biases [positions], the model's logit difference [positions] and the logit
    lens [positions, layers]."""
    cfg = model.cfg
    L = cfg.n_layers
    ln = cfg.normalization_type
    hooks = [f"blocks.{x}.attn.hook_z" for x in range(L)] + [f"blocks.{x}.hook_resid_post" for x in range(L)]
    hooks += ["blocks.0.hook_resid_pre"]
    if not cfg.attn_only:
        hooks += [f"blocks.{x}.hook_mlp_out" for x in range(L)]
    if ln is not None:
        hooks.append("ln_final.hook_scale")
    out = {k: [] for k in ("heads", "attn_bias", "mlp", "embed", "bias", "total", "lens")}
    for chunk, cache in cached_batches(model, rows, hooks, batch_size):  # each row run once, all its positions read
        pairs = _pairs(chunk)
        n = len(pairs)
        row = torch.tensor([i for i, *_ in pairs])
        pos = torch.tensor([p for _, p, _, _ in pairs])
        good = torch.tensor([g for _, _, g, _ in pairs])
        bad = torch.tensor([b for *_, b in pairs])
        idx = torch.arange(n)
        at = lambda name: cache[name][row, pos]  # noqa: E731 - [n, ...] at each scored position
        direction = (model.W_U[:, good] - model.W_U[:, bad]).T  # [n, d_model]
        w = getattr(model.ln_final, "w", None) if ln is not None else None
        w = torch.ones(cfg.d_model) if w is None else w
        scale = at("ln_final.hook_scale") if ln is not None else torch.ones(n, 1)

        def read(x):  # [n, ..., d_model] -> its direct logit difference through the frozen final norm
            if ln in ("LN", "LNPre"):
                x = x - x.mean(-1, keepdim=True)
            return ((x / scale.view(-1, *[1] * (x.dim() - 1))) * w * direction.view(n, *[1] * (x.dim() - 2),
                                                                                     -1)).sum(-1)

        folded = value_biases == "folded"
        b_v = [model.blocks[x].attn.b_V for x in range(L)]  # [H, d_head] (a key/value head's repeated per query head)
        heads = torch.stack([read(torch.einsum("nhd,hdm->nhm", at(f"blocks.{x}.attn.hook_z") - (b_v[x] if folded else 0),
                                               model.W_O[x])) for x in range(L)], 1)  # [n, L, H]
        attn_bias = torch.stack([read((model.b_O[x] + (torch.einsum("hd,hdm->m", b_v[x], model.W_O[x]) if folded else 0)
                                       ).expand(n, -1)) for x in range(L)], 1)
        mlp = (torch.stack([read(at(f"blocks.{x}.hook_mlp_out")) for x in range(L)], 1) if not cfg.attn_only
               else torch.zeros(n, L))
        embed = read(at("blocks.0.hook_resid_pre"))
        bias = (model.b_U[good] - model.b_U[bad])
        if ln in ("LN", "LNPre") and getattr(model.ln_final, "b", None) is not None:
            bias = bias + (model.ln_final.b * direction).sum(-1)
        final = at(f"blocks.{L - 1}.hook_resid_post")
        logits = model.unembed(model.ln_final(final[:, None]))[:, 0] if ln is not None else model.unembed(final[:, None])[:, 0]
        total = logits[idx, good] - logits[idx, bad]
        lens = []
        for x in range(L):
            h = at(f"blocks.{x}.hook_resid_post")[:, None]
            lg = model.unembed(model.ln_final(h) if ln is not None else h)[:, 0]
            lens.append(lg[idx, good] - lg[idx, bad] - (model.b_U[good] - model.b_U[bad] if lens_bias == "excluded" else 0))
        for k, v in (("heads", heads), ("attn_bias", attn_bias), ("mlp", mlp), ("embed", embed), ("bias", bias),
                     ("total", total), ("lens", torch.stack(lens, 1))):
            out[k].append(v.float().cpu())
    return {k: torch.cat(v).numpy().astype(float) for k, v in out.items()}


def _ci(x: np.ndarray) -> np.ndarray:
    """[items, ...] -> [..., 3] mean, lo, hi over items."""
    flat = x.reshape(x.shape[0], -1).T  # [cells, items]
    m, lo, hi = bootstrap_means(flat)
    return np.stack([m, lo, hi], -1).reshape(*x.shape[1:], 3)


def logit_attribution(case: Case, model, *, tag: str | None = None, batch_size: int = 256,
                      value_biases: str = "per-head", lens_bias: str = "included") -> LogitAttributionResult:
    """Direct logit attribution per head and per layer, and the logit lens, in every format of the case, under the
    conventions named (see the module's docstring)."""
    for value, name, choices in ((value_biases, "--value-biases", VALUE_BIASES), (lens_bias, "--lens-bias", LENS_BIAS)):
        if value not in choices:
            raise AnalysisError(f"unknown convention {value!r}", field=name, fix=f"choose from: {', '.join(choices)}")
    tag, items = pick_items(case, tag)
    cfg = model.cfg
    formats, parts = [], {}
    for fmt in [case.good, *case.bad_formats]:
        rows, weights = _rows(case, model, fmt, items)
        p = _combined(_parts(model, rows, batch_size, value_biases, lens_bias), rows, weights, len(items))
        parts[fmt] = p
        attn = p["heads"].sum(-1) + p["attn_bias"]
        summed = attn.sum(-1) + p["mlp"].sum(-1) + p["embed"] + p["bias"]
        formats.append(FormatLogits(
            fmt, "good" if fmt == case.good else "bad", _ci(p["total"][:, None])[0].tolist(), _ci(p["heads"]),
            _ci(attn), _ci(p["mlp"]), {"embed": _ci(p["embed"][:, None])[0].tolist(),
                                       "norm and unembedding biases": _ci(p["bias"][:, None])[0].tolist()},
            _ci(p["lens"]), float(np.abs(summed - p["total"]).max())))
    diff = {b: _ci(parts[b]["heads"] - parts[case.good]["heads"]) for b in case.bad_formats}
    return LogitAttributionResult(case.name, tag, len(items), cfg.n_layers, cfg.n_heads, formats, diff,
                                  options=dict(tag=tag, batch_size=batch_size, value_biases=value_biases,
                                               lens_bias=lens_bias))
