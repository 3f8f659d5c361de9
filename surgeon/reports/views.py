"""How each analysis result shows itself (`surgeon.show`): the report the CLI prints, the figures and tables it
writes with `--out`, under the command's name. The CLI prints and saves through these same views, so
`print(r)` and `r.save(dir)` in a notebook are what the command line gives."""
from __future__ import annotations

from surgeon.circuits.export import circuit_figure
from surgeon.reports import figures, html, text
from surgeon.show import View, register
from surgeon.spec.metrics import describe as describe_metric

VIEWS = {
    "Diagnosis": View("diagnose", text.diagnosis_text, {"accuracy.png": figures.diagnosis_figure},
                      {"items.csv": text.diagnosis_rows}),
    "PatchResult": View("patch", text.patch_text, {"heatmap.png": figures.patch_heatmap}),
    "PositionPatchResult": View("patch-positions", text.position_patch_text, {"positions.png": figures.position_heatmap}),
    "AttentionResult": View("attention", text.attention_text, {"attention.png": figures.attention_figure}),
    "AttributionResult": View("attribute", text.attribution_text, {"attribution.png": figures.attribution_heatmap}),
    "ThresholdResult": View("threshold", text.threshold_text, {"threshold.png": figures.threshold_figure},
                            {"subsets.csv": text.threshold_rows}),
    "BlendResult": View("blend", text.blend_text, {"blend.png": figures.blend_figure}),
    "CircuitResult": View("circuit", text.circuit_text, {"faithfulness.png": figures.faithfulness_figure,
                                                        "circuit.png": circuit_figure}),
    "OverlapResult": View("sae-overlap", text.overlap_text, {"overlap.png": figures.overlap_figure}),
    "AmplifiedResult": View("sae-amplified", text.amplified_text),
    "HeadFeatureResult": View("sae-heads", text.head_feature_text, {"heads_features.png": figures.head_feature_heatmap}),
    "FeatureRepairResult": View("sae-repair", text.feature_repair_text),
    "LogitAttributionResult": View("dla", text.logit_attribution_text, {"dla.png": figures.logit_attribution_figure}),
}



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
    if _name != "Diagnosis":  # which says it anyway
        _view.text = _saying_the_metric(_view.text)
    register(_name, _view)

register("Report", View("report", html.report_text, save=html.save_report))
