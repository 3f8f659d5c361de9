"""How a diagnosis and an encoding print: the accuracy per format and tag, and the tokens the engine runs."""
from __future__ import annotations

from surgeon.reports.text import interval
from surgeon.case.metrics import describe as describe_metric
from surgeon.show import View
from surgeon.reports import figures
from surgeon.reports import tables


def diagnosis_text(d, case=None) -> str:
    tags = {}
    for it in d.per_item:
        tags[it["tag"] or "(untagged)"] = tags.get(it["tag"] or "(untagged)", 0) + 1
    lines = [f"case {d.case} · model {d.model} · {len(d.per_item)} items ("
             + ", ".join(f"{k} {v}" for k, v in sorted(tags.items())) + ")",
             f"score = {describe_metric(d.metric)}; accuracy = fraction right",
             "",
             f"{'format':10s} {'role':5s} {'items':9s} {'accuracy [95% CI]':32s} {'mean score [95% CI]'}"]
    for s in d.stats:
        sc = s.score
        lines.append(f"{s.format:10s} {s.role:5s} {s.tag:9s} {s.accuracy.pct():32s} "
                     f"{sc.value:+7.2f} {interval(sc.lo, sc.hi, '+.2f')}")
    focus = d.focus or "all"
    lines.append("")
    g = d.get(d.good, focus).accuracy
    for b, yes in d.reproduced.items():
        a = d.get(b, focus).accuracy
        if yes:
            verdict = "REPRODUCED"
        elif a.value >= g.value:
            verdict = f"not reproduced ({b!r} is not less accurate than {d.good!r})"
        else:
            verdict = (f"not reproduced (less accurate, but the 95% intervals overlap: {a.n} item{'s' * (a.n != 1)} "
                       f"cannot separate them; add items)")
        lines.append(f"failure in {b!r} on {focus} items: {verdict} — accuracy {a.pct()} vs {g.pct()} in {d.good!r}")
    if any(s.score.n < 2 for s in d.stats):
        lines.append("(a mean over one item has no interval)")
    if d.generations:
        lines += ["", f"greedy generation ({d.generations[0].n_new} new tokens) on {focus} items, judged against the answers:"]
        for g in d.generations:
            c = g.counts()
            lines.append(f"{g.format:10s} correct {g.accuracy.pct()}   incorrect {c['incorrect']}, other {c['other']}   "
                         f"e.g. " + ", ".join(repr(t) for t in g.texts[:3]))
    return "\n".join(lines)


def diagnosis_rows(d) -> list[list]:
    """items.csv: one row per item with its score in every format (accuracy = score > 0)."""
    formats = [d.good, *d.bad]
    rows = [["item", "tag", "correct", "incorrect", *(f"score_{f}" for f in formats)]]
    for it in d.per_item:
        rows.append([it["item"], it["tag"], it["correct"], it["incorrect"], *(f"{it['score'][f]:.6g}" for f in formats)])
    return rows


def encoding_text(e, shown: int = 3) -> str:
    """The first `shown` items: each format's tokens (position:token), the scored positions with the answer token
    each scores, and the aligned pairs patching moves between (failing <- good)."""
    lines = [f"case {e.case} · what the model reads · {e.n_items} item{'s' * (e.n_items != 1)} ({e.tag or 'all'}) · "
             f"align {e.align} · good {e.good!r}, failing {', '.join(map(repr, e.bad))}",
             "tokens as position:text (| ends the prompt); scored: position -> answer token id (+ correct, - incorrect)"]
    items = sorted({r.item for r in e.rows})
    for i in items[:shown]:
        lines.append("")
        for r in (r for r in e.rows if r.item == i):
            toks = " ".join(f"{p}:{t!r}" + (" |" if p == r.n_prompt - 1 else "") for p, t in enumerate(r.strings))
            lines.append(f"item {i} ({r.tag or 'untagged'}) {r.format} ({r.role}), the {r.answer} answer's row, "
                         f"{len(r.tokens)} tokens: {toks}")
            lines.append("  scored: " + ", ".join(f"{p} -> {t} ({'+' if s > 0 else '-'})" for p, t, s in r.targets))
            if r.pairs:
                lines.append(f"  patched from {e.good!r}: " + ", ".join(f"{b}<-{g}" for b, g in r.pairs))
    if len(items) > shown:
        lines.append(f"\n... {len(items) - shown} more items (surgeon.encode(...).to_pandas() holds every row)")
    return "\n".join(lines)


def diagnosis_line(d) -> str:
    said = []
    for b, yes in d.reproduced.items():
        on = d.focus or "all"
        a, g = d.get(b, on).accuracy, d.get(d.good, on).accuracy
        said.append(f"{b!r} {'fails' if yes else 'does not fail'}: {100 * a.value:.1f}% right vs {100 * g.value:.1f}% "
                    f"in {d.good!r} ({on} items, n={a.n})")
    return "; ".join(said)


# how each result of this module's analyses prints, draws and saves (registered by surgeon.reports.views)
VIEWS = {
    "Diagnosis": View("diagnose", diagnosis_text, {"accuracy.png": figures.diagnosis_figure},
                      {"items.csv": diagnosis_rows}, table=tables.diagnose_table, headline=diagnosis_line),
    "Encoding": View("encode", encoding_text),
}
