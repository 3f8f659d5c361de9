"""How each analysis result shows itself (`surgeon.show`): the report the CLI prints, the figures and tables it
writes with `--out`, under the command's name. The CLI prints and saves through these same views, so
`print(r)` and `r.save(dir)` in a notebook are what the command line gives."""
from __future__ import annotations

import numpy as np

from surgeon.circuits.export import circuit_figure
from surgeon.reports import attention_view, feature_view, figures, frames, html, repair_view, scan_view, tables, text
from surgeon.show import View, register
from surgeon.case.metrics import describe as describe_metric


def _diagnosis_line(d) -> str:
    said = []
    for b, yes in d.reproduced.items():
        on = d.focus or "all"
        a, g = d.get(b, on).accuracy, d.get(d.good, on).accuracy
        said.append(f"{b!r} {'fails' if yes else 'does not fail'}: {100 * a.value:.1f}% right vs {100 * g.value:.1f}% "
                    f"in {d.good!r} ({on} items, n={a.n})")
    return "; ".join(said)


def _patch_line(p) -> str:
    f = np.nan_to_num(np.asarray(p.fraction, dtype=float), nan=-np.inf)
    li, u = np.unravel_index(int(np.argmax(f)), f.shape)
    return (f"best single unit L{p.layers[li]}H{u}: repair fraction {p.fraction[li, u]:+.3f} "
            f"[{p.fraction_lo[li, u]:+.3f}, {p.fraction_hi[li, u]:+.3f}] over {p.n_items} items")


def _threshold_line(r) -> str:
    t = r.threshold("all")
    return (f"k* = {t.k_star} of {len(r.units)} heads" if t.k_star is not None else
            f"no subset size k reaches {100 * t.x:g}% repairing ({len(r.units)} heads)")


def _circuit_line(c) -> str:
    lo, hi = c.circuit_faithfulness_ci
    return (f"{len(c.circuit)} of {c.n_edges} edges, f = {c.circuit_faithfulness:.3f} [{lo:.3f}, {hi:.3f}] "
            f"({c.method}, {c.ablation} ablation)")


def _heldout_line(r) -> str:
    t = next((t for t in r.k_star if t.family == "all"), None)
    if t is None:
        return f"{len(r.rows)} best subsets evaluated on {r.n_evaluation} held-out items"
    return (f"k* = {'-' if t.held_out is None else t.held_out} held out on {r.n_evaluation} items "
            f"({'-' if t.discovery is None else t.discovery} in-sample on {r.n_discovery})")


def _heldout_circuit_line(r) -> str:
    h, c = r.held_out, r.search
    ci = h.get("faithfulness_ci")
    return (f"{len(c.circuit)} of {c.n_edges} edges, f = {h['faithfulness']:.3f}"
            + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            + f" held out on {r.n_evaluation} items ({c.circuit_faithfulness:.3f} in-sample)")


def _feature_circuit_line(r) -> str:
    d = r.directions["denoise"]
    return (f"{len(d.circuit)} of {len(r.nodes)} nodes, faithfulness {d.faithfulness.value:.3f} "
            f"[{d.faithfulness.lo:.3f}, {d.faithfulness.hi:.3f}], error nodes {d.error_share:.0%} of its attribution")


def _report_line(r) -> str:
    return "steps: " + ", ".join(r.steps) + (f"; not run: {', '.join(r.skipped)}" if r.skipped else "")

VIEWS = {
    "Diagnosis": View("diagnose", text.diagnosis_text, {"accuracy.png": figures.diagnosis_figure},
                      {"items.csv": text.diagnosis_rows}, table=tables.diagnose_table, headline=_diagnosis_line),
    "PatchResult": View("patch", text.patch_text, {"heatmap.png": figures.patch_heatmap}, table=tables.patch_table,
                        headline=_patch_line),
    "PositionPatchResult": View("patch-positions", text.position_patch_text, {"positions.png": figures.position_heatmap},
                                table=tables.positions_table),
    "AttentionResult": View("attention", text.attention_text, {"attention.png": figures.attention_figure},
                            widget=attention_view.widget),
    "AttributionResult": View("attribute", text.attribution_text, {"attribution.png": figures.attribution_heatmap}),
    "ThresholdResult": View("threshold", text.threshold_text, {"threshold.png": figures.threshold_figure},
                            {"subsets.csv": text.threshold_rows}, table=tables.threshold_table,
                            headline=_threshold_line),
    "HeldOutThreshold": View("threshold-heldout", text.heldout_text,
                             {"heldout.png": figures.heldout_figure,
                              "search.png": lambda r, p: figures.threshold_figure(r.search, p)},
                             table=tables.heldout_threshold_table, headline=_heldout_line),
    "HeldOutCircuit": View("circuit-heldout", text.heldout_circuit_text,
                           {"faithfulness_discovery.png": lambda r, p: figures.faithfulness_figure(r.search, p),
                            "circuit.png": lambda r, p: circuit_figure(r.search, p)},
                           table=tables.heldout_circuit_table, headline=_heldout_circuit_line),
    "HeldOutPatch": View("patch-heldout", text.heldout_patch_text,
                         headline=lambda r: f"top unit {r.top[0].unit}: {r.top[0].held_out.value:+.3f} held out, "
                                            f"{r.top[0].discovery.value:+.3f} in-sample; Spearman {r.spearman:.3f}"
                         if r.top else "no unit"),
    "HeldOutFeatureCircuit": View("feature-circuit-heldout", text.heldout_feature_circuit_text),
    "HeldOutFeatureRepair": View("sae-repair-heldout", text.heldout_feature_repair_text),
    "FoldsThreshold": View("threshold-folds", text.folds_text),
    "FoldsCircuit": View("circuit-folds", text.folds_circuit_text),
    "SinkResult": View("sinks", text.sinks_text, {"sinks.png": figures.sinks_figure}),
    "SinkInterventionResult": View("sinks-intervene", text.sink_interventions_text,
                                   {"sinks.png": lambda r, p: figures.sinks_figure(r.measured, p)},
                                   table=tables.sinks_table),
    "BlendResult": View("blend", text.blend_text, {"blend.png": figures.blend_figure}, table=tables.blend_table),
    "CircuitResult": View("circuit", text.circuit_text, {"faithfulness.png": figures.faithfulness_figure,
                                                        "circuit.png": circuit_figure}, table=tables.circuit_table,
                          headline=_circuit_line),
    "OverlapResult": View("sae-overlap", text.overlap_text, {"overlap.png": figures.overlap_figure},
                          table=tables.overlap_table),
    "AmplifiedResult": View("sae-amplified", text.amplified_text, table=tables.amplified_table),
    "HeadFeatureResult": View("sae-heads", text.head_feature_text, {"heads_features.png": figures.head_feature_heatmap},
                              table=tables.head_feature_table),
    "FeatureRepairResult": View("sae-repair", text.feature_repair_text, table=tables.feature_repair_table),
    "FeatureCircuitResult": View("feature-circuit", text.feature_circuit_text,
                                 {"feature_curve.png": figures.feature_circuit_figure},
                                 table=tables.feature_circuit_table, headline=_feature_circuit_line,
                                 widget=feature_view.widget),
    "Encoding": View("encode", text.encoding_text),
    "LogitAttributionResult": View("dla", text.logit_attribution_text, {"dla.png": figures.logit_attribution_figure},
                                   table=tables.dla_table),
}

# each result as a pandas DataFrame (`r.to_pandas()`; Encoding builds its own)
FRAMES = {"Diagnosis": frames.diagnosis_frame, "PatchResult": frames.patch_frame,
          "PositionPatchResult": frames.positions_frame, "AttentionResult": frames.attention_frame,
          "AttributionResult": frames.attribution_frame, "ThresholdResult": frames.threshold_frame,
          "HeldOutThreshold": frames.heldout_frame,
          "BlendResult": frames.blend_frame, "CircuitResult": frames.circuit_frame,
          "OverlapResult": frames.overlap_frame, "AmplifiedResult": frames.amplified_frame,
          "HeadFeatureResult": frames.head_feature_frame, "FeatureRepairResult": frames.feature_repair_frame,
          "FeatureCircuitResult": frames.feature_circuit_frame,
          "LogitAttributionResult": frames.dla_frame}


def _saying_the_metric(report):
    """A report that, under a metric other than the default, says on its second line what the scores measure."""
    def text_of(r, *args, **kwargs):
        out = report(r, *args, **kwargs)
        metric = (getattr(r, "execution", None) or {}).get("metric", "logprob")
        if metric == "logprob":
            return out
        first, _, rest = out.partition("\n")
        return f"{first}\nscore = {describe_metric(metric)}\n{rest}"

    return text_of


for _name, _view in VIEWS.items():
    _view.save = text.save_result
    _view.frame = FRAMES.get(_name)
    if _name != "Diagnosis":  # which says it anyway
        _view.text = _saying_the_metric(_view.text)
    register(_name, _view)

register("Baselines", View("repair", repair_view.baselines_text, figures={"pareto.png": repair_view.pareto_figure},
                           headline=lambda b: f"{len(b.points)} configurations held out, "
                                              f"{sum(p.front for p in b.points)} on the front"))
register("RepairResult", View("repair", repair_view.repair_text, save=repair_view.save_repair, table=tables.repair_table,
                              figures={"pareto.png": repair_view.pareto_of},
                              headline=lambda r: f"{'+'.join(r.repair.heads)} ({r.repair.mode}): held-out efficacy "
                                                 f"{100 * r.efficacy().repaired.value:.1f}%"))
register("ScanResult", View("scan", scan_view.scan_text, figures={"effects.png": scan_view.scan_figure},
                            tables={"formats.csv": scan_view.format_rows, "effects.csv": scan_view.effect_rows,
                                    "interactions.csv": scan_view.interaction_rows},
                            save=text.save_result, headline=scan_view.headline))
register("Report", View("report", html.report_text, save=html.save_report, headline=_report_line,
                        frame=frames.report_frames))
