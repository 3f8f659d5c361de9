"""How attribution patching and direct logit attribution print."""
from __future__ import annotations

import math

import numpy as np

from surgeon.reports.text import num
from surgeon.sites.nodes import unit_label
from surgeon.show import View
from surgeon.reports import figures
from surgeon.reports import tables


def attribution_text(r, top: int = 10) -> str:
    what = "repair" if r.direction == "denoise" else "damage"
    qk = " with the QK fix" if r.component in ("q", "k") else ""
    how = {"gradient": ("one forward and one backward pass", "gradient w.r.t. its mask at 0"),
           "ig": (f"integrated gradients, {r.ig_steps} points",
                  "gradient w.r.t. its mask integrated as every mask goes from 0 to 1"),
           "atp*": (f"AtP*{qk}, GradDrop: {r.backward_passes} backward passes",
                    "magnitude: mean over layers l of |gradient at 0 with layer l's outputs dropped|"
                    + (", through the exact attention patterns" if qk else ""))}[r.method]
    lines = [f"case {r.case} · attribution of {r.component} from {r.source!r} into {r.base!r} ({r.direction}) · "
             f"{r.n_items} items ({r.tag or 'all'}) · {how[0]}",
             f"estimated {what} fraction of patching each unit alone ({how[1]}, over the gap):",
             "layer " + "".join(f"{u:>7d}" for u in range(r.n_units))]
    if abs(r.gap) <= 1e-12:
        lines[-2:] = ["warning: the two formats score the same on these items (no gap): estimated repair "
                      "fractions are undefined; the raw gradients are in results.json"]
        return "\n".join(lines)
    for i, L in enumerate(r.layers):
        lines.append(f"{L:5d} " + "".join(num(v, "7.2f") if np.isfinite(v) else "    nan" for v in r.estimate[i]))
    if r.exact is not None:
        corr = ("correlation undefined (one side is constant)" if r.pearson is None
                else f"Pearson r = {r.pearson:.3f}, Spearman rho = {r.spearman:.3f}")
        mag = r.method == "atp*"  # magnitudes: against the exact effect's magnitude
        lines += ["", f"against exact per-unit patching{' (its magnitude)' if mag else ''}: {corr}",
                  f"top {min(top, r.exact.size)} units by exact {what} fraction{' magnitude' if mag else ''}:",
                  f"{'unit':10s} {'estimate':>9s} {'exact':>9s}"]
        order = np.argsort(-np.nan_to_num(np.abs(r.exact) if mag else r.exact, nan=-np.inf), axis=None)[:top]
    else:
        lines += ["", f"top {min(top, r.estimate.size)} units by estimated {what} fraction "
                      f"(--compare checks them against exact patching):", f"{'unit':10s} {'estimate':>9s}"]
        order = np.argsort(-np.nan_to_num(r.estimate, nan=-np.inf), axis=None)[:top]
    for k in order:
        i, u = divmod(int(k), r.n_units)
        lines.append(f"{unit_label(r.component, r.layers[i], u):10s} {r.estimate[i, u]:+9.3f}"
                     + (f" {r.exact[i, u]:+9.3f}" if r.exact is not None else ""))
    return "\n".join(lines)


def _dla_conventions(options: dict) -> str:
    vb, lb = options.get("value_biases", "per-head"), options.get("lens_bias", "included")
    return ("conventions: value biases " + ("in each head's output (raw weights; TransformerLens's default model folds "
                                            "them into the attention bias: --value-biases folded)" if vb == "per-head"
                                            else "folded into the attention bias, as TransformerLens's default model")
            + "; logit lens " + ("with the unembedding bias (TransformerLens's has none: --lens-bias excluded)"
                                 if lb == "included" else "without the unembedding bias, as TransformerLens's"))


def logit_attribution_text(r, top: int = 10) -> str:
    def ci(v) -> str:
        return f"{v[0]:+.2f} [{v[1]:+.2f}, {v[2]:+.2f}]" if np.isfinite(v[1]) else f"{v[0]:+.2f} (no interval)"

    names = [f.format for f in r.formats]
    lines = [f"case {r.case} · direct logit attribution and logit lens · {r.n_items} items ({r.tag or 'all'}) · "
             "logit difference correct - incorrect at the first token where the answers differ, 95% CI over items",
             _dla_conventions(r.options),
             "", f"{'':24s}" + "".join(f"{n + (' (good)' if f.role == 'good' else ''):>26s}"
                                       for n, f in zip(names, r.formats)),
             f"{'logit difference':24s}" + "".join(f"{ci(f.logit_diff):>26s}" for f in r.formats),
             "", "logit lens (the residual stream after each layer, read through the final norm and unembedding):"]
    for L in range(r.n_layers):
        lines.append(f"{'after layer ' + str(L):24s}" + "".join(f"{ci(f.lens[L]):>26s}" for f in r.formats))
    gap = max(f.max_residual for f in r.formats)
    bound = f"below {10 ** math.ceil(math.log10(gap)):.0e}" if gap > 0 else "0"
    lines += ["", f"direct effect on the logit difference, per layer (the parts sum to it; largest gap {bound}):"]
    for key, label in (("embed", "embeddings"),):
        lines.append(f"{label:24s}" + "".join(f"{ci(f.other[key]):>26s}" for f in r.formats))
    for L in range(r.n_layers):
        lines.append(f"{f'L{L} attention':24s}" + "".join(f"{ci(f.attn[L]):>26s}" for f in r.formats))
        if np.any([f.mlp[L, 0] != 0 for f in r.formats]):
            lines.append(f"{f'L{L} MLP':24s}" + "".join(f"{ci(f.mlp[L]):>26s}" for f in r.formats))
    lines.append(f"{'biases (norm, unembed)':24s}"
                 + "".join(f"{ci(f.other['norm and unembedding biases']):>26s}" for f in r.formats))
    good = r.formats[0]
    for bad, diff in r.head_difference.items():
        b = next(f for f in r.formats if f.format == bad)
        order = np.argsort(-np.abs(diff[..., 0]), axis=None)[:top]
        lines += ["", f"heads whose direct effect differs most between {bad!r} and {good.format!r}:",
                  f"{'head':8s} {good.format:>10s} {bad:>10s} {bad + ' - ' + good.format + ' [95% CI]':>32s}"]
        for k in order:
            L, h = divmod(int(k), r.n_heads)
            lines.append(f"{f'L{L}H{h}':8s} {good.heads[L, h, 0]:+10.3f} {b.heads[L, h, 0]:+10.3f} "
                         f"{ci(diff[L, h]):>32s}")
    return "\n".join(lines)


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "AttributionResult": View("attribute", attribution_text, {"attribution.png": figures.attribution_heatmap}),
    "LogitAttributionResult": View("dla", logit_attribution_text, {"dla.png": figures.logit_attribution_figure},
                                   table=tables.dla_table),
}
