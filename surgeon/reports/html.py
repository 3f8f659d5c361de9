"""`surgeon report`'s page: one self-contained HTML file rendered from a `Report`'s results alone.

Every step's main table as an HTML table (columns sort on a click; the same table goes into the paper as LaTeX,
`tables`), its full printed report (n and 95% intervals) folded beneath, every figure as inline SVG with a generated
caption, a methods paragraph written from the run, and the circuit (`circuit_view`: a static SVG that a script makes
interactive, nothing fetched). No number is computed here that the results do not hold: the page formats them.
"""
from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from surgeon.analyses.heldout import HeldOutCircuit, HeldOutThreshold
from surgeon.analyses.pipeline import found_circuit
from surgeon.reports.figures import journal_width, save_figure
from surgeon.reports import circuit_view
from surgeon.reports.latex import CAPTIONS, main_tex, paper_tables, strip_titles
from surgeon.reports.tables import SORT_JS, step_tables
from surgeon.reports.text import model_info
from surgeon.results import manifest, staging, write_json
from surgeon.show import svg_of, view_of
from surgeon.reports.citations import METHOD_NAMES, bibtex, cite, cited
from surgeon.reports.citations import render as render_citations
from surgeon.case.metrics import describe as describe_metric

TITLES = {"diagnose": "Is the failure there?", "dla": "Direct logit attribution", "patch": "Per-head patching",
          "positions": "Patching by position", "attention": "Attention of the circuit's heads", "threshold": "Head subsets that repair",
          "blend": "Blending the layer's heads", "circuit": "The circuit", "sae_overlap": "SAE features: overlap",
          "sae_amplified": "SAE features: amplified in the failing format",
          "sae_heads": "Heads against SAE features", "sae_repair": "Feature-level repair",
          "sae_feature_circuit": "Feature circuit", "repair": "A repair that needs the failing prompt alone",
          "sinks": "Attention sinks and massive activations",
          "scan": "Where the model fails: formats scanned"}


def feature_conventions(o: dict) -> str:
    """How the report's feature circuit was attributed and checked, each convention named against Marks et al.'s."""
    steps, method = o.get("steps", 5), o.get("method", "ig")
    att = {"ig": f"attributed by integrated gradients at {steps} midpoints of the mask, one SAE at a time (Marks et "
                 f"al. take the points k/N from the run's own values)",
           "ig-marks": f"attributed by integrated gradients at Marks et al.'s points k/{steps}, one SAE at a time",
           "gradient": "attributed by the gradient at the run (attribution patching)"}.get(method, f"attributed by {method}")
    left = ("the downstream node's gradient averaged over the same points, as Marks et al." if method == "ig-marks"
            else "the downstream node's gradient in the unpatched run (Marks et al. average it over their points)")
    exact = ("each node patched at one aligned position at a time, the effects summed, as Marks et al."
             if o.get("exact") == "per-position" else
             "each node patched at every aligned position at once (Marks et al. sum one position at a time)")
    if o.get("threshold") is not None:
        chosen = (f"every node whose effect on one item at one aligned position reaches {o['threshold']:g} of the gap "
                  f"(surgeon's per-example node rule; Marks et al. threshold nodes on the aggregated effect)"
                  if o.get("threshold_over") == "example" else
                  f"every node whose attribution reaches {o['threshold']:g} of the gap (the aggregated effect, as "
                  f"Marks et al. threshold nodes)")
    else:
        chosen = (f"the smallest top-k by attribution with faithfulness at least {o.get('faithfulness') or 0.9:g} "
                  f"(Marks et al. keep every node whose aggregated effect reaches a threshold)")
    entries = ("computed from the downstream node's entries whose per-example effect reaches the threshold (Marks et "
               "al.'s edge rule)" if o.get("edge_rule") == "marks" else
               "computed from every entry of the downstream node (Marks et al. use only the entries whose per-example "
               "effect reaches their node threshold)")
    return (f"{att}; the top nodes verified by exact patching, {exact}; the circuit {chosen}; edges weighted by {left}, "
            f"{entries}")


def _patch_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if "patch" not in o:
        return []
    parts.append("Each attention head's output (before W_O) was patched alone from the good format's run into the "
                 f"failing one at the aligned positions (activation patching {cite('heimersheim2024patching')}); "
                 "repair fraction = (patched - failing) / (good - failing) of the mean score.")
    return parts


def _dla_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if not ("dla" in o and st.get("dla") is not None):
        return []
    do = st["dla"].options
    vb = ("each head's output including its value bias" if do.get("value_biases", "per-head") == "per-head" else
          "value biases folded into the attention bias")
    lb = "with" if do.get("lens_bias", "included") == "included" else "without"
    parts.append("Direct logit attribution split each format's logit difference (correct - incorrect answer) into "
                 "the direct effects of the embeddings, every head, every MLP and the biases, through the final "
                 f"norm's scale as measured on each item ({vb}) {cite('elhage2021framework')}; the logit lens "
                 f"read the residual stream after each layer through the final norm and unembedding, {lb} the "
                 f"unembedding bias {cite('nostalgebraist2020lens')}.")
    return parts


def _positions_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if "positions" not in o:
        return []
    parts.append(f"Layer {', '.join(map(str, o['positions']['layers']))}'s heads were also patched one aligned "
                 "position at a time, over the items that have the position.")
    return parts


def _attention_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if "attention" not in o:
        return []
    parts.append(f"The attention patterns of the circuit's {len(o['attention']['heads'])} strongest heads "
                 f"({', '.join(o['attention']['heads'])}, by the summed |score| of their circuit edges) are shown "
                 "on the first item in every format.")
    return parts


def _threshold_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if "threshold" not in o:
        return []
    t, r = o["threshold"], st.get("threshold")
    held = r if isinstance(r, HeldOutThreshold) else None
    r = held.search if held is not None else r
    rate = t.get("item_rate", 1.0)
    right = "every item" if rate >= 1 else f"at least {100 * rate:g}% of the items"
    n = len(r.units) if r is not None else None
    cands = (f"subsets of the {n} heads {t['heads']}" if t.get("heads") else
             f"subsets of layer {t['layer']}'s {n} heads")
    parts.append(f"Head {cands} were searched by size k, as in {cite('sandoval2025even')} (all subsets up to "
                 f"{t['budget']} per size, else a uniform sample of {t['budget']} drawn with seed {t.get('seed', 0)}"
                 + (f"; also within the {' and '.join(t['groups'])} heads" if t["groups"] else "")
                 + f"); a subset repairs when the model is right on {right}, and k* is the smallest k at "
                   f"which at least {100 * (r.x if r is not None else 0.5):g}% of the subsets repair.")
    if held is not None:
        parts.append(f"The search ran on discovery items and what it chose was evaluated on held-out items, the "
                     f"results reported (as MIB's circuit-localization track does {cite('mueller2025mib')}): "
                     f"{held.split.describe()}. Per size k, the subset best on the discovery items was patched "
                     "on the held-out items, and k* was measured there on the search's own subsets of the sizes "
                     "around it; rates on the discovery items are in-sample and overstated by the choice.")
    return parts


def _sinks_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if not ("sinks" in o and st.get("sinks") is not None):
        return []
    si = st["sinks"]
    eps = si.measured.epsilon if si.measured is not None else o["sinks"]["epsilon"]
    parts.append(f"Attention sinks {cite('xiao2024streaming')} were measured in every format over every item: "
                 f"each head's attention on the first token averaged over the prompt's later positions, and the "
                 f"share of heads above {eps:g} (the sink rate, {cite('gu2025sink')}); per layer the largest "
                 f"residual activation against the median, massive above 100 and 1000 times it "
                 f"{cite('sun2024massive')}, with the MLP neurons writing it (activation times output weight, "
                 f"the super neurons {cite('yu2024superweight')}), and the share of each head's query and key "
                 f"energy in one dimension {cite('jin2025massivevalues')}. Each was then tested as a cause of the "
                 f"failure by intervening at every position of every format on the {si.n_items} "
                 f"{si.tag or 'focus'} items: the sink heads' attention to the first token removed and the rest "
                 "renormalised, the largest dimension and its super neuron set to zero or their mean; repair "
                 "fraction (after - failing) / (good - failing) in the failing formats, damage in the good one.")
    return parts


def _blend_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if "blend" not in o:
        return []
    parts.append(f"Layer {o['blend']['layer']}'s head outputs were blended (1-a) failing + a good on a grid of "
                 f"step {o['blend']['step']}.")
    return parts


def _circuit_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if not ("circuit" in o and st.get("circuit") is not None):
        return []
    held = st["circuit"] if isinstance(st["circuit"], HeldOutCircuit) else None
    c = held.search if held is not None else st["circuit"]
    co = c.options
    name, keys = METHOD_NAMES.get(c.method, (c.method, ()))
    steps = f" with {co['ig_steps']} steps" if "ig" in c.method and co.get("ig_steps") else ""
    ablated = {"resample": f"the {c.base} run's value at the aligned positions (resample ablation)",
               "mean": "the sender's mean over " + (co.get("mean_over") or "items") + " at every position "
                       "(mean ablation)",
               "zero": "zero at every position (zero ablation)"}[c.ablation]
    kept = co.get("semantics", "kept") == "kept"
    meaning = (f"a circuit is the set of edges kept, every edge outside it ablated to {ablated}, as in MIB and "
               f"ACDC {cite('mueller2025mib', 'conmy2023acdc')}; its faithfulness is (m(C) - m(empty)) / "
               "(m(full) - m(empty))" if kept else
               f"a circuit is the set of edges knocked out (ablated to {ablated}), every other edge kept; its value "
               "is the share of the behaviour removed")
    verified = len(c.exact)
    target = (f"the smallest top-k prefix of the ranking by |score| reaching faithfulness {c.target}"
              if c.target is not None else f"the top {len(c.circuit)} edges by |score|")
    paths = (f" Its {len(c.paths)} strongest complete paths were measured by path patching "
             f"{cite('wang2023ioi', 'goldowskydill2023path')}." if c.paths else "")
    parts.append(f"The edges between the {c.source} run's components ({c.n_edges} in all) were scored by {name}"
                 f"{steps} {cite(*keys) if keys else ''}, "
                 + (f"the top {verified} verified by exact edge patching; " if verified and c.method != "exact"
                    else "")
                 + f"{meaning}. The circuit is {target}: {len(c.circuit)} edges, f = "
                   f"{c.circuit_faithfulness:.3f}" + (" on the discovery items (in-sample)." if held else ".")
                 + paths)
    if held is not None:
        h = held.held_out
        ci = h.get("faithfulness_ci")
        parts.append(f"The circuit was found on discovery items and measured on held-out items under the same "
                     f"ablation, semantics and direction, MIB's protocol {cite('mueller2025mib')}: "
                     f"{held.split.describe()}; on the held-out items f = {h['faithfulness']:.3f}"
                     + (f" (95% interval {ci[0]:.3f} to {ci[1]:.3f})" if ci else "") + ", the result.")
    return parts


def _sae_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    sae = [k for k in ("sae_overlap", "sae_amplified", "sae_heads", "sae_repair", "sae_feature_circuit") if k in o]
    if not sae:
        return []
    what = {"sae_overlap": f"the overlap of the formats' top {o.get('sae_overlap', {}).get('k', 20)} features per "
                           f"layer ({', '.join(map(str, o.get('sae_overlap', {}).get('layers', [])))})",
            "sae_amplified": f"the features amplified in the failing format at layer "
                             f"{o.get('sae_amplified', {}).get('layer')}",
            "sae_heads": f"the effect of layer {o.get('sae_heads', {}).get('layer')}'s heads on those features",
            "sae_repair": f"repair by patching features at layer {o.get('sae_repair', {}).get('layer')}",
            "sae_feature_circuit": "the feature circuit of each format (features and each SAE's error term as nodes, "
                                   f"{feature_conventions(o.get('sae_feature_circuit', {}))}; edges between "
                                   "nodes of different SAEs as direct effects, the SAE hook points between held, "
                                   f"the strongest verified by path patching {cite('marks2024sparse')})"}
    parts.append(f"Sparse autoencoder features, read with SAELens {cite('bloom2024saelens')}, gave "
                 + "; ".join(what[k] for k in sae) + ".")
    return parts


def _scan_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if not ("scan" in o and st.get("scan") is not None):
        return []
    s = st["scan"]
    held = "measured on held-out items" if not s.in_sample else "in-sample (no item held out)"
    parts.append(f"Formats were composed from a grammar of parts around the case's question ({s.n_formats} "
                 f"formats: {s.grammar}), as FormatSpread samples meaning-preserving formats "
                 f"{cite('sclar2024formatspread')}, and scored {s.search['method']} within "
                 f"{s.search['budget']:,} prompts; each part option's main effect on accuracy and each pair's "
                 "interaction came with paired bootstrap intervals over items and Holm's correction "
                 f"{cite('holm1979')}, chosen on discovery items and {held}.")
    return parts


def _repair_methods(o: dict, st: dict) -> list[str]:
    parts: list[str] = []
    if not ("repair" in o and st.get("repair") is not None):
        return []
    r = st["repair"]
    rp, b = r.repair, r.bounds
    split = r.split
    held = f"{split.describe()}" if split is not None else f"{r.n_evaluation} other items"
    parts.append("A repair that needs the failing prompt alone was built as mean patching: each chosen head's "
                 "output (before W_O) is replaced by the good format's mean output over the discovery items at "
                 "each position counted from the last prompt token (steering a chosen set of heads at inference, "
                 f"as inference-time intervention and contrastive activation addition do {cite('li2023iti', 'rimsky2024caa')}). "
                 f"Its heads were chosen on the discovery items by greedy forward selection over "
                 f"{len(b.get('pool', []))} heads, maximising the failing formats' repair rate under side-effect "
                 f"bounds (the good format's mean KL from the unrepaired model at most {b.get('max_kl')} nats, every "
                 f"other tag's accuracy at most {b.get('max_drop')} below unrepaired), and the smallest set reaching "
                 f"the best rate taken ({len(rp.heads)} heads: {', '.join(rp.heads)}). The split: {held}. It was "
                 "measured on the held-out items as model editing evaluates an edit (efficacy, generalization, "
                 f"specificity {cite('meng2022rome', 'meng2023memit', 'wang2024easyedit')}), with the KL divergence "
                 "of the next-token distribution from the unrepaired model as the side effect, beside the same "
                 "heads patched from each item's good-format twin.")
    bl = getattr(r, "baselines", None)
    if bl is not None:
        ship = bl.shipped()
        parts.append("Beside it, the field's steering baselines were built on the same discovery items and measured "
                     "on the same held-out items: activation addition in the residual stream at every layer "
                     f"{cite('turner2023actadd', 'rimsky2024caa')}, inference-time intervention on the heads a "
                     f"linear probe ranks {cite('li2023iti')}, and as controls as many random heads and every head "
                     "of one layer; each method's configurations were kept by their Pareto front on the discovery "
                     "items (efficacy against the good format's KL and control accuracy), and the front drawn on "
                     "the held-out items" + (f": the shipped repair is dominated by {len(bl.dominating(ship))} of "
                                             f"{len(bl.points) - 1} kept configurations." if ship else "."))
    verdict = r.verdict() if hasattr(r, "verdict") else []
    if verdict:
        parts.append("Its verdict on the held-out items: " + " ".join(verdict))
    return parts


# each step's sentences in a paper's methods section, in the order they are written: (step, sentences from the
# steps' options and results)
METHODS = (("patch", _patch_methods), ("dla", _dla_methods), ("positions", _positions_methods), ("attention", _attention_methods), ("threshold", _threshold_methods), ("sinks", _sinks_methods), ("blend", _blend_methods), ("circuit", _circuit_methods), ("sae", _sae_methods), ("scan", _scan_methods), ("repair", _repair_methods))


def methods_paragraph(rep, how: str = "text") -> str:
    """What a paper's methods section needs, every statement from what ran (the steps' results and options): model,
    items, formats, metric, alignment, each step's method as papers name it, ablation and circuit semantics, seeds,
    versions, with citations (`how`: "text", author-year; "latex", escaped with \\cite; "marked", the
    `surgeon.reports.citations` markers)."""
    f = rep.facts
    kv = f" sharing {f['n_kv_heads']} key/value heads" if f["n_kv_heads"] != f["n_heads"] else ""
    tags = ", ".join(f"{n} {t}" for t, n in sorted(f["tags"].items()))
    fmts = "; ".join(f"{k} ({'good' if k == f['good'] else 'failing'}): {v!r}" for k, v in f["formats"].items())
    parts = [f"We analysed {rep.model} ({f['n_layers']} layers, {f['n_heads']} attention heads per layer{kv}, "
             f"d_model {f['d_model']}, {f['dtype']}) with surgeon {f['versions']['surgeon']} and TransformerLens "
             f"{cite('nanda2022transformerlens')} on {f['items']} items ({tags}) in {len(f['formats'])} prompt "
             f"formats: {fmts}.",
             f"An item's score is {describe_metric(f['metric'])}. Positions were matched between formats by "
             f"alignment '{f['align']}'; patching analyses used "
             + (f"the {f['focus']} items." if f["focus"] else "all items."),
             f"Proportions carry Wilson 95% intervals {cite('wilson1927')} and means bootstrap 95% intervals "
             f"{cite('efron1979bootstrap')} over items."]
    o, st = rep.options, rep.steps
    for _, sentences in METHODS:
        parts += sentences(o, st)
    v = f["versions"]
    parts.append("Software: " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".")
    text = " ".join(parts).replace(" .", ".").replace("  ", " ")
    return text if how == "marked" else render_citations(text, how)


def example_items(d, per_tag: int = 3) -> str:
    """A table of the first `per_tag` items of each tag: the values, the answers, and each format's score."""
    formats = [d.good, *d.bad]
    head = "".join(f"<th>{html.escape(f)} score</th>" for f in formats)
    rows = []
    for tag in sorted({r["tag"] for r in d.per_item}):
        for r in [r for r in d.per_item if r["tag"] == tag][:per_tag]:
            vals = ", ".join(f"{k}={v!r}" for k, v in r["values"].items())
            cells = "".join(f"<td class='num'>{r['score'][f]:+.3f}</td>" for f in formats)
            rows.append(f"<tr><td>{html.escape(tag or '(untagged)')}</td><td>{r['item']}</td><td>{html.escape(vals)}</td>"
                        f"<td>{html.escape(repr(r['correct']))}</td><td>{html.escape(repr(r['incorrect']))}</td>{cells}</tr>")
    return (f"<table class='items'><caption>Example items: the first {per_tag} of each tag, with each format's score "
            f"(&gt; 0: the correct answer wins)</caption><thead><tr><th>tag</th><th>item</th><th>values</th>"
            f"<th>correct</th><th>incorrect</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _figures(rep) -> dict:
    """{(step, file name): Figure}: every step's figures, drawn once, each at a journal's column width."""
    out = {}
    for step, result in rep.steps.items():
        for fname, draw in view_of(result).figures.items():
            fig = draw(result, None)
            if fig is None:  # a figure this result does not have (a repair without baselines)
                continue
            journal_width(fig)  # figures drawn elsewhere (the circuit graph) too
            out[step, fname] = fig
    return out


def sink_heads(rep) -> dict:
    """{(layer, head): its largest attention on the first token over the formats} for the heads the report's sinks step
    found above its epsilon (none without the step)."""
    si = rep.steps.get("sinks")
    m = getattr(si, "measured", None)
    if m is None:
        return {}
    most = np.max(np.stack([np.asarray(f.mass, dtype=float) for f in m.formats]), axis=0)
    return {(int(l), int(h)): float(most[l, h]) for l, h in zip(*np.nonzero(most > m.epsilon))}


def render(rep, drawn: dict | None = None) -> str:
    """The report as one HTML page (no external resource); `drawn`: its figures, when already drawn (`_figures`)."""
    drawn = _figures(rep) if drawn is None else drawn
    tables = step_tables(rep)
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>surgeon report: "
           f"{html.escape(rep.case)}</title><style>{CSS}</style></head><body>",
           f"<h1>surgeon report: {html.escape(rep.case)}</h1>",
           f"<p class='meta'>model {html.escape(rep.model)} · steps: {', '.join(rep.steps)}"
           + (f" · reused from an earlier run: {', '.join(rep.reused)}" if rep.reused else "") + "</p>",
           "<h2>Methods</h2>", f"<p id='methods'>{html.escape(methods_paragraph(rep))}</p>"]
    for why in rep.skipped.items():
        out.append(f"<p class='skipped'>{html.escape(why[0])}: not run ({html.escape(why[1])})</p>")
    for name, result in rep.steps.items():
        v = view_of(result)
        out.append(f"<section id='{name}'><h2>{html.escape(TITLES.get(name, name))}</h2>")
        if name == "circuit":
            out.append(circuit_view.view(found_circuit(result), sink_heads(rep)))
        if name in tables:
            out.append(tables[name].html())
        if name == "diagnose":
            out.append(example_items(result))
        if v.widget is not None:
            out.append(v.widget(result))
        out.append(f"<details{'' if name in tables else ' open'}><summary>the step's full report (text)</summary>"
                   f"<pre>{html.escape(v.text(result))}</pre></details>")
        for fname in (f for f in v.figures if (name, f) in drawn):
            caption = CAPTIONS.get((name, fname), fname).replace("\\%", "%")
            out.append(f"<figure>{svg_of(drawn[name, fname])}<figcaption>{html.escape(caption)}</figcaption></figure>")
        out.append("</section>")
    out.append(f"<script>{JS}</script></body></html>")
    return "\n".join(out)


CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:12px;line-height:1.35}
details{margin:.5em 0}summary{cursor:pointer;color:#555;font-size:14px}
figure{margin:1em 0}figure svg{max-width:100%;height:auto}figcaption{font-size:12px;color:#666}
.meta,.hint,.skipped{color:#555;font-size:14px}
table.items,table.data{border-collapse:collapse;font-size:13px;margin:.5em 0}
table.items td,table.items th,table.data td,table.data th{border-bottom:1px solid #ddd;padding:.2em .6em;text-align:left}
table.items td.num,table.data td.num,table.data th.num{text-align:right;font-variant-numeric:tabular-nums}
table.items caption,table.data caption{text-align:left;color:#555;caption-side:top}
table.sortable th{cursor:pointer}table.sortable th[aria-sort=ascending]::after{content:" \\25B2"}
table.sortable th[aria-sort=descending]::after{content:" \\25BC"}
""" + circuit_view.CSS

JS = circuit_view.JS + SORT_JS


def report_text(rep) -> str:
    """What `print(report)` and `surgeon report` print: each step's report under its title."""
    head = [f"surgeon report · case {rep.case} · model {rep.model}",
            "steps: " + ", ".join(rep.steps) + (f" (reused from an earlier run: {', '.join(rep.reused)})"
                                                if rep.reused else "")]
    head += [f"{step}: not run ({why})" for step, why in rep.skipped.items()]
    body = [f"\n== {TITLES.get(name, name)} ==\n{view_of(result).text(result)}" for name, result in rep.steps.items()]
    return "\n".join(head + body)


def save_report(out, command: str, rep, case, *, options: dict, device: str | None, figures=None, tables=None,
                api: str | None = None) -> None:
    """report.html and every step's figures as PDF and SVG (figures/STEP-NAME.*), with a manifest; all or nothing."""
    drawn = _figures(rep)  # once, for the page and the files
    with staging(out) as tmp:
        (tmp / "report.html").write_text(render(rep, drawn), encoding="utf-8")
        # the methods paragraph for a paper: LaTeX with \cite, and the BibTeX entries it cites beside the page
        (tmp / "references.bib").write_text(bibtex(cited(methods_paragraph(rep, "marked"))), encoding="utf-8")
        (tmp / "paper").mkdir()
        (tmp / "paper" / "methods.tex").write_text(methods_paragraph(rep, "latex") + "\n", encoding="utf-8")
        (tmp / "figures").mkdir()
        shown = {}  # (step, name) -> (width in inches, the titles the paper's copy gives its caption instead)
        for (step, fname), fig in drawn.items():
            save_figure(fig, tmp / "figures" / f"{step}-{Path(fname).stem}.svg")
            titles = strip_titles(fig)
            save_figure(fig, tmp / "figures" / f"{step}-{Path(fname).stem}.pdf")
            shown[step, fname] = (float(fig.get_size_inches()[0]), titles)
        tables = paper_tables(rep)
        for name, tex in tables.items():
            (tmp / "paper" / name).write_text(tex, encoding="utf-8")
        (tmp / "paper" / "main.tex").write_text(main_tex(rep, list(tables), shown, TITLES), encoding="utf-8")
        m = manifest(command, case, seed=rep.options.get("threshold", {}).get("seed", 0), device=device, dtype=rep.facts.get("dtype"),
                     options={**options, "steps": rep.options, "reused": rep.reused}, model_info=model_info(case),
                     argv=[] if api else None)
        if api:
            m["api"] = api
        # what `surgeon.load(DIR)` needs to rebuild the Report besides the step folders
        m["report"] = {"case": rep.case, "model": rep.model, "steps": list(rep.steps), "skipped": rep.skipped,
                       "facts": rep.facts}
        write_json(tmp / "manifest.json", m)
