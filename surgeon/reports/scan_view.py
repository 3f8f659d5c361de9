"""How a format scan (`surgeon scan`, `surgeon.analyses.scan.ScanResult`) shows itself: the text the CLI prints, the
figure of each part's effect, and the tables of every format and every effect."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from surgeon.analyses.scan import ALPHA
from surgeon.reports.figures import finish, pyplot


def _acc(e) -> str:
    return f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}]"


def _pts(e) -> str:
    return f"{100 * e.value:+6.1f} points [{100 * e.lo:+.1f}, {100 * e.hi:+.1f}]"


def _template(t: str) -> str:
    return repr(t)


def scan_text(r) -> str:
    sp = r.split
    held = not r.in_sample
    lines = [f"surgeon scan on case {r.case!r} · model {r.model} · score = {r.metric}",
             f"grammar: {r.n_formats:,} formats around {r.body!r} ({r.grammar})"]
    if r.dropped:
        lines.append("left out: " + "; ".join(r.dropped))
    rungs = " -> ".join(f"{x['formats']} formats x {x['items']} items" for x in r.search["rungs"])
    lines.append(f"search: {r.search['method']} ({rungs}) within {r.search['budget']:,} prompts; items tagged "
                 f"{sp['tag']!r}: {sp['discovery']} discovery" + (f", {sp['evaluation']} evaluation (holdout "
                 f"{sp['holdout']}, seed {sp['seed']}" + (f", {sp['evaluated_on']}" if sp['evaluated_on'] else "")
                 + ")" if held else " (no item held out: every number below is in-sample)")
                 + (f", {sp['shots']} set aside as few-shot examples" if sp["shots"] else ""))
    w = r.work
    lines.append(f"work: {w['format_items']:,} (format, item) scores from {w['prompts_run']:,} distinct prompts, "
                 f"each run once")
    where = (f"held out ({sp['evaluation']} evaluation items)" if held else
             f"in-sample ({sp['discovery']} items the formats were chosen on)")
    shown = list(r.held_out) if held else sorted(r.discovery, key=lambda f: (f.accuracy.value, f.mean_score.value))
    if not held:
        shown = shown[:5] + shown[-5:] if len(shown) > 10 else shown
    lines += ["", f"formats, worst to best, {where} (chosen on the discovery items):"]
    for f in sorted(shown, key=lambda f: (f.accuracy.value, f.mean_score.value)):
        lines.append(f"  {_acc(f.accuracy)}  {_template(f.template)}   ({f.name})")
    lines.append(f"  spread: {100 * r.spread:.1f} points (best - worst, {where.split(' (')[0]})")
    if r.case_formats:
        lines.append("the case's own formats, same items: " + ", ".join(
            f"{f.name.removeprefix('case format ')} {100 * f.accuracy.value:.1f}%" for f in r.case_formats))
    tested = len(r.effects)
    lines += ["", f"which part: each option's main effect on accuracy (the formats with it minus those with another "
                  f"option of the part; 95% bootstrap interval over items; Holm over the {tested} options tested, "
                  f"alpha {ALPHA}), chosen on discovery ({r.search['effects_over']})"
                  + (f", measured held out over {r.search['held_out_effects_over']}:" if held else ", in-sample:")]
    chosen = sorted([e for e in r.effects if e.chosen], key=lambda e: -abs(e.held_out.value if held and e.held_out
                                                                               else e.discovery.value))
    for e in chosen:
        num = e.held_out if held and e.held_out is not None else e.discovery
        lines.append(f"  {e.part:<12} {e.option!r:<14} {_pts(num)}   (discovery {100 * e.discovery.value:+.1f}, "
                     f"Holm p {e.p_holm:.3g})")
    rest = [e for e in r.effects if not e.chosen]
    if rest:
        lines.append("  not significant after Holm on discovery: " + ", ".join(f"{e.part} {e.option!r}" for e in rest))
    lines += _interaction_lines(r, held)
    if r.pair is None:
        lines += ["", "minimal pair: none (no two formats where one's interval lies above the other's)"]
    else:
        p = r.pair
        differs = ", ".join(f"{k} {a!r} / {b!r}" for k, (a, b) in p["differs"].items())
        lines += ["", f"minimal pair ({len(p['differs'])} part{'s' if len(p['differs']) != 1 else ''} apart: {differs}; "
                      f"prompts {p['length_difference']:.1f} tokens apart):"]
        num = p.get("held_out") or p["discovery"]
        lines.append(f"  works {_acc(num['works'])}  {_template(p['works_template'])}")
        lines.append(f"  fails {_acc(num['fails'])}  {_template(p['fails_template'])}")
        if held:
            lines.append("  confirmed held out: the working format's interval lies above the failing one's" if
                         p.get("confirmed") else "  NOT confirmed held out: the two intervals overlap on the "
                                                 "evaluation items")
    if r.written:
        lines += ["", f"wrote {r.written}: surgeon diagnose {r.written} (then patch, threshold, circuit, repair)"]
    return "\n".join(lines)


def _interaction_lines(r, held: bool, top: int = 5) -> list[str]:
    """The interactions significant after Holm (over the pairs, a family apart), largest first."""
    if not r.interactions:
        return []
    chosen = sorted([x for x in r.interactions if x.chosen],
                    key=lambda x: -abs(x.held_out.value if held and x.held_out else x.discovery.value))
    lines = ["", f"interactions: two options of different parts together, (both - the first alone) - (the second alone "
                 f"- neither), 95% bootstrap interval over items; Holm over the {len(r.interactions)} pairs tested, "
                 f"alpha {ALPHA}: {len(chosen)} significant on discovery" + (":" if chosen else "")]
    for x in chosen[:top]:
        num = x.held_out if held and x.held_out is not None else x.discovery
        lines.append(f"  {x.part_a} {x.option_a!r} x {x.part_b} {x.option_b!r}  {_pts(num)}   (discovery "
                     f"{100 * x.discovery.value:+.1f}, Holm p {x.p_holm:.3g})")
    if len(chosen) > top:
        lines.append(f"  ... {len(chosen) - top} more (interactions.csv with --out)")
    return lines


def interaction_rows(r) -> list:
    rows = [["part_a", "option_a", "part_b", "option_b", "discovery", "lo", "hi", "p", "p_holm", "held_out",
             "held_lo", "held_hi", "p_held_out"]]
    for x in r.interactions:
        h = x.held_out
        rows.append([x.part_a, x.option_a, x.part_b, x.option_b, x.discovery.value, x.discovery.lo, x.discovery.hi,
                     x.p, x.p_holm, None if h is None else h.value, None if h is None else h.lo,
                     None if h is None else h.hi, x.p_held_out])
    return rows


def scan_figure(r, path: Path | None):
    """Each option's effect on accuracy with its 95% interval (held out where items were held out), the options
    significant after Holm filled."""
    plt = pyplot()
    held = not r.in_sample
    es = [e for e in r.effects if (e.held_out is not None or not held)]
    es = sorted(es, key=lambda e: (e.part, e.option))
    fig, ax = plt.subplots(figsize=(5, 0.28 * len(es) + 1.2))
    y = np.arange(len(es))
    for i, e in enumerate(es):
        num = e.held_out if held else e.discovery
        ax.errorbar(100 * num.value, i, xerr=[[100 * (num.value - num.lo)], [100 * (num.hi - num.value)]], fmt="o",
                    color="C3" if e.chosen else "0.6", mfc="C3" if e.chosen else "white", capsize=2)
    ax.axvline(0, color="0.3", lw=0.8)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{e.part} = {e.option}" for e in es], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("effect on accuracy (points)" + (", held out" if held else ", in-sample"))
    ax.set_title(f"{r.case}: what each part of the format does (filled: Holm-significant on discovery)", fontsize=9)
    return finish(fig, path)


def format_rows(r) -> list:
    rows = [["split", "format", "template", "accuracy", "lo", "hi", "n", "mean_score", "n_tokens", "rung"]]
    for split, fs in (("discovery", r.discovery), ("evaluation", r.held_out), ("evaluation (case format)",
                                                                             r.case_formats)):
        for f in fs:
            rows.append([split, f.name, f.template, f.accuracy.value, f.accuracy.lo, f.accuracy.hi, f.accuracy.n,
                         f.mean_score.value, f.n_tokens, f.rung])
    return rows


def effect_rows(r) -> list:
    rows = [["part", "option", "discovery", "lo", "hi", "p", "p_holm", "held_out", "held_lo", "held_hi", "p_held_out"]]
    for e in r.effects:
        h = e.held_out
        rows.append([e.part, e.option, e.discovery.value, e.discovery.lo, e.discovery.hi, e.p, e.p_holm,
                     None if h is None else h.value, None if h is None else h.lo, None if h is None else h.hi,
                     e.p_held_out])
    return rows


def headline(r) -> str:
    worst, best = r.worst, r.best
    return (f"spread {100 * r.spread:.1f} points ({'held out' if not r.in_sample else 'in-sample'}): worst "
            f"{100 * worst.accuracy.value:.1f}%, best {100 * best.accuracy.value:.1f}%")
