"""Each result as a pandas DataFrame in long format (`r.to_pandas()`): one row per unit x item x format where the
analysis keeps per-item values, else one row per unit with its mean and 95% interval. Columns are named for what
they hold; nothing is computed here but the reshaping."""
from __future__ import annotations

import numpy as np

from surgeon.reports.threshold_view import threshold_rows
from surgeon.show import view_of


def _df(records: list[dict], columns: list[str] | None = None):
    """A frame of the records; `columns` name them even when there is none."""
    import pandas as pd

    return pd.DataFrame.from_records(records, columns=columns)


def _nan(x):
    return None if x is None else float(x)


def diagnosis_frame(d):
    """item, tag, values, answers, format, role, score."""
    recs = []
    for r in d.per_item:
        for fmt, score in r["score"].items():
            recs.append({"item": r["item"], "tag": r["tag"], "format": fmt, "role": "good" if fmt == d.good else "bad",
                         "score": float(score), "correct": r["correct"], "incorrect": r["incorrect"],
                         **{f"value_{k}": v for k, v in r["values"].items()}})
    return _df(recs)


def patch_frame(p):
    """layer, unit, item, patched score (the base run's mean is `p.clean_base`)."""
    per = np.asarray(p.per_item, dtype=float)  # [layer, unit, item]
    return _df([{"layer": int(p.layers[li]), "unit": u, "head": f"L{int(p.layers[li])}H{u}", "item": i,
                 "format": p.base, "patched_from": p.source, "score": float(per[li, u, i])}
                for li in range(per.shape[0]) for u in range(per.shape[1]) for i in range(per.shape[2])])


def positions_frame(r):
    """layer, position (its token label), unit, item, patched score (unpatched for items without the position)."""
    per = np.asarray(r.per_item, dtype=float)  # [layer, slot, unit, item]
    return _df([{"layer": int(r.layers[li]), "position": r.slots[si], "slot": si, "unit": u, "item": i,
                 "score": float(per[li, si, u, i])}
                for li in range(per.shape[0]) for si in range(per.shape[1]) for u in range(per.shape[2])
                for i in range(per.shape[3])])


def attribution_frame(r):
    """layer, unit, gradient, estimated repair fraction, exact (with --compare): per unit (the gradient of the mean
    score over the items; masks are shared by the items, so there is no per-item value)."""
    ex = None if r.exact is None else np.asarray(r.exact, dtype=float)
    return _df([{"layer": int(L), "unit": u, "gradient": float(r.gradient[li, u]), "estimate": float(r.estimate[li, u]),
                 "exact": None if ex is None else float(ex[li, u])}
                for li, L in enumerate(r.layers) for u in range(r.n_units)])


def threshold_frame(r):
    """Every evaluated subset once: its members, size, families, share of items right, mean score, repair fraction
    (subsets.csv as a frame)."""
    import pandas as pd

    rows = threshold_rows(r)
    return pd.DataFrame(rows[1:], columns=rows[0])


def heldout_frame(r):
    """Per family and size k: the best subset on the discovery items, its held-out rate (the result) and its in-sample
    rate, each with its Wilson 95% interval and n."""
    return _df([{"family": row.family, "k": row.k, "subset": "+".join(row.subset),
                 **{f"{side}_{part}": getattr(getattr(row, side), part) for side in ("held_out", "discovery")
                    for part in ("value", "lo", "hi", "n")}} for row in r.rows])


def blend_frame(b):
    """item, the blend fraction a* where its score crosses into right, and how often its sign changes."""
    return _df([{"item": i, "switch": _nan(b.switch[i]), "crossings": int(b.crossings[i])}
                for i in range(len(b.switch))])


def circuit_frame(c):
    """One row per edge: rank by |score|, estimated effect, exact effect and its interval (verified edges), in the
    circuit or not."""
    order = np.argsort(-np.abs(np.asarray(c.scores, dtype=float)), kind="stable")
    rank = {int(e): k + 1 for k, e in enumerate(order)}
    exact = {int(k): v for k, v in c.exact.items()}
    ci = {int(k): v for k, v in (c.exact_ci or {}).items()}
    inside = {int(e) for e in c.circuit}
    return _df([{"edge": name, "index": e, "rank": rank[e], "score": float(c.scores[e]), "exact": exact.get(e),
                 "exact_lo": ci.get(e, (None, None))[0], "exact_hi": ci.get(e, (None, None))[1],
                 "in_circuit": e in inside} for e, name in enumerate(c.edge_names)])


def dla_frame(r):
    """format, component (head, attention layer, MLP, embeddings, biases, logit lens), layer, head, mean, lo, hi."""
    recs = []
    for f in r.formats:
        for L in range(r.n_layers):
            for h in range(r.n_heads):
                recs.append({"format": f.format, "component": "head", "layer": L, "head": h,
                             **dict(zip(("mean", "lo", "hi"), map(float, f.heads[L, h])))})
            for name, arr in (("attention", f.attn), ("mlp", f.mlp), ("logit lens", f.lens)):
                recs.append({"format": f.format, "component": name, "layer": L, "head": None,
                             **dict(zip(("mean", "lo", "hi"), map(float, arr[L])))})
        for name, v in f.other.items():
            recs.append({"format": f.format, "component": name, "layer": None, "head": None,
                         **dict(zip(("mean", "lo", "hi"), map(float, v)))})
    return _df(recs)


def attention_frame(r):
    """head, item, format, query and key positions with their tokens, weight."""
    recs = []
    for p in r.patterns:
        w = np.asarray(p.pattern, dtype=float)
        for q in range(w.shape[0]):
            for k in range(w.shape[1]):
                recs.append({"head": p.head, "item": p.item, "format": p.format, "query": q, "key": k,
                             "query_token": p.tokens[q], "key_token": p.tokens[k], "weight": float(w[q, k])})
    return _df(recs)


def overlap_frame(o):
    """failing format, metric, layer, item, value."""
    return _df([{"format": b, "metric": m, "layer": int(L), "item": i, "value": float(v)}
                for b, metrics in o.per_item.items() for m, per_layer in metrics.items()
                for L, values in zip(o.layers, per_layer) for i, v in enumerate(values)])


def amplified_frame(a):
    """feature, ratio (failing / good) with its interval, items active in both, mean activations, label."""
    return _df([{"feature": f.feature, "ratio": f.ratio.value, "ratio_lo": f.ratio.lo, "ratio_hi": f.ratio.hi,
                 "items_both": f.n_both, "mean_good": f.mean_good, "mean_bad": f.mean_bad, "label": f.label}
                for f in a.ranked], ["feature", "ratio", "ratio_lo", "ratio_hi", "items_both", "mean_good", "mean_bad",
                                     "label"])


def head_feature_frame(r):
    """unit, feature, mean effect on the feature with its interval, and the share of the format gap it closes."""
    return _df([{"unit": u, "feature": int(f), "effect": float(r.effect[i, j]), "lo": float(r.lo[i, j]),
                 "hi": float(r.hi[i, j]), "fraction": float(r.fraction[i, j])}
                for i, u in enumerate(r.units) for j, f in enumerate(r.features)])


def feature_repair_frame(r):
    """feature, attribution estimate, exact single-feature repair fraction."""
    return _df([{"feature": int(f), "estimate": _nan(est), "exact": _nan(ex)} for f, est, ex in r.top],
               ["feature", "estimate", "exact"])


def feature_circuit_frame(r):
    """direction, node, kind, layer, attribution, exact effect and interval, in circuit."""
    rows = []
    for d in r.directions.values():
        inside = set(d.circuit)
        for i, n in enumerate(r.nodes):
            e = d.exact.get(i)
            rows.append({"direction": d.direction, "node": n.name, "kind": "error" if n.error else "feature",
                         "layer": n.layer, "unit": n.unit, "attribution": float(d.attribution[i]),
                         "exact": _nan(e.value if e else None), "exact_lo": _nan(e.lo if e else None),
                         "exact_hi": _nan(e.hi if e else None), "in_circuit": i in inside})
    return _df(rows, ["direction", "node", "kind", "layer", "unit", "attribution", "exact", "exact_lo", "exact_hi",
                      "in_circuit"])


def report_frames(rep) -> dict:
    """{step: its frame} for every step of a report."""
    return {step: view_of(r).frame(r) for step, r in rep.steps.items() if view_of(r).frame is not None}
