"""How attention patterns print, and their interactive view.

Attention patterns as an interactive view (Jupyter and the report page): per item, a grid of heads (rows) by
formats (columns), each cell the tokens read up to the scored position. Hovering a token makes it the query and
shades every token by the weight that query gives it; the view opens on the scored position (the query whose
attention reaches the logits the metric reads), outlined. Self-contained HTML and JavaScript, nothing fetched; the
weights are the result's (rounded to 4 decimals for the page), nothing is computed here."""
from __future__ import annotations

import hashlib
import html
import json

import numpy as np
from surgeon.show import View
from surgeon.reports import figures

CSS = """
.attn-view{font-family:system-ui,sans-serif;font-size:12px}.attn-view table{border-collapse:collapse;margin:.4em 0}
.attn-view td,.attn-view th{border:1px solid #ddd;padding:.3em;vertical-align:top;text-align:left}
.attn-view .tok{display:inline-block;padding:0 1px;margin:1px 0;font-family:ui-monospace,monospace;white-space:pre;
cursor:default;border-radius:2px}.attn-view .tok.q{outline:2px solid #d62728}.attn-view .tok.s{text-decoration:underline}
.attn-view .note{color:#555}
"""

JS = r"""
(function(){
  document.querySelectorAll('.attn-view').forEach(function(view){
    if (view.dataset.ready) return; view.dataset.ready = 1;
    var d = JSON.parse(view.querySelector('script.attn-data').textContent);
    view.querySelectorAll('td.attn-cell').forEach(function(cell){
      var p = d.panels[+cell.dataset.panel], toks = cell.querySelectorAll('.tok');
      var note = cell.querySelector('.note');
      function show(q){
        toks.forEach(function(t, k){ var w = k <= q ? p.pattern[q][k] : 0;
          t.style.background = 'rgba(31,119,180,' + w + ')'; t.dataset.weight = w;
          t.classList.toggle('q', k === q); });
        note.textContent = 'query ' + q + (q === p.scored ? ' (scored)' : '') + ': ' + JSON.stringify(p.tokens[q]);
      }
      toks.forEach(function(t, k){ t.addEventListener('mouseenter', function(){ show(k); }); });
      cell.addEventListener('mouseleave', function(){ show(p.scored); });
      show(p.scored);
    });
  });
})();
"""


def _shown(token: str) -> str:
    return html.escape(token.replace("\n", "\\n"))


def widget(r) -> str:
    """The attention result as one HTML fragment (styles, data and script inline)."""
    panels = [{"head": p.head, "item": p.item, "format": p.format, "tokens": list(p.tokens),
               "scored": int(p.scored if p.scored is not None else len(p.tokens) - 1),
               "pattern": [[round(float(w), 4) for w in row] for row in p.pattern]} for p in r.patterns]
    blob = json.dumps({"panels": panels}).replace("</", "<\\/")
    uid = "attn-" + hashlib.sha256(blob.encode()).hexdigest()[:10]
    index = {(p["head"], p["item"], p["format"]): i for i, p in enumerate(panels)}
    out = [f"<div class='attn-view' id='{uid}'><style>{CSS}</style>",
           "<p class='note'>hover a token: it becomes the query, and every token is shaded by the weight it gets "
           "(the outlined token); the view opens on the scored position (underlined)</p>"]
    for item in r.items:
        out.append(f"<table><caption>item {item}</caption><tr><th>head</th>"
                   + "".join(f"<th>{html.escape(f)}</th>" for f in r.formats) + "</tr>")
        for head in r.heads:
            cells = []
            for f in r.formats:
                i = index.get((head, item, f))
                if i is None:
                    cells.append("<td></td>")
                    continue
                p = panels[i]
                toks = "".join(f"<span class='tok{' s' if k == p['scored'] else ''}'>{_shown(t)}</span>"
                               for k, t in enumerate(p["tokens"]))
                cells.append(f"<td class='attn-cell' data-panel='{i}'>{toks}<div class='note'></div></td>")
            out.append(f"<tr><th>{html.escape(head)}</th>{''.join(cells)}</tr>")
        out.append("</table>")
    out.append(f"<script type='application/json' class='attn-data'>{blob}</script><script>{JS}</script></div>")
    return "".join(out)


def attention_text(r, top: int = 3) -> str:
    lines = [f"case {r.case} · attention patterns of {', '.join(r.heads)} · items {r.items} ({r.tag or 'all'}) · "
             f"formats {', '.join(r.formats)}",
             f"from the last prompt token: the {top} keys attended most (weight)"]
    for head in r.heads:
        for i in r.items:
            lines.append("")
            for fmt in r.formats:
                p = r.get(head, i, fmt)
                row = p.pattern[-1]
                best = np.argsort(-row, kind="stable")[:top]
                lines.append(f"{head} item {i:<3d} {fmt:8s} " + "  ".join(f"{k}:{p.tokens[k]!r} {row[k]:.2f}"
                                                                         for k in best))
    return "\n".join(lines)


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "AttentionResult": View("attention", attention_text, {"attention.png": figures.attention_figure},
                            widget=widget),
}
