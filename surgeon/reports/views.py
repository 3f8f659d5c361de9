"""How each analysis result shows itself (`surgeon.show`): the report the CLI prints, the figures and tables it
writes with `--out`, under the command's name. The CLI prints and saves through these same views, so
`print(r)` and `r.save(dir)` in a notebook are what the command line gives."""
from __future__ import annotations

from surgeon.reports import (attention_view, attribution_view, circuit_view, diagnose_view, feature_view, frames, html,
                             patch_view, repair_view, scan_view, sinks_view, tables, text, threshold_view)
from surgeon.show import View, register
from surgeon.case.metrics import describe as describe_metric


def _report_line(r) -> str:
    return "steps: " + ", ".join(r.steps) + (f"; not run: {', '.join(r.skipped)}" if r.skipped else "")


# each result type's view is declared beside its text renderer, in the module of its analyses
VIEWS = {**diagnose_view.VIEWS, **patch_view.VIEWS, **attention_view.VIEWS, **attribution_view.VIEWS,
         **threshold_view.VIEWS, **sinks_view.VIEWS, **circuit_view.VIEWS, **feature_view.VIEWS}

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
