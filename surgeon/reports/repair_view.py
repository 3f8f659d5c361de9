"""How a repair shows itself: the held-out measures as the result (efficacy, generalization, specificity, side
effects, generation), the paired interchange of the same heads beside them, and the discovery numbers labelled
in-sample; saved as results.json plus the shippable repair itself (repair.safetensors, repair.json)."""
from __future__ import annotations

from pathlib import Path

from surgeon.analyses.pareto import FAMILIES, NAMES
from surgeon.repairs.artifact import FILE, TENSORS
from surgeon.repairs.fold import RULES
from surgeon.reports.figures import pareto_figure
from surgeon.reports.text import model_info
from surgeon.results import manifest, staging, write_json


def _pct(e) -> str:
    return f"{100 * e.value:5.1f}% [{100 * e.lo:5.1f}, {100 * e.hi:5.1f}]"


def _mean(e) -> str:
    if e.n < 2 or e.lo != e.lo:
        return f"{e.value:.4f} (n={e.n}, no interval)"
    return f"{e.value:.4f} [{e.lo:.4f}, {e.hi:.4f}]"


WHAT = {"efficacy": "a failing format, the focus tag: should become right",
        "generalization": "a failing format, the other tags",
        "specificity": "the good format: should stay right",
        "paired": "the same heads as a paired interchange (each item's own good-format activations: needs the twin, "
                  "not shippable)"}


def repair_text(r) -> str:
    rep = r.repair
    where = (r.split.describe() if r.split is not None else f"{r.n_discovery} items; evaluated on {r.n_evaluation} "
             "other items given")
    a = rep.strength
    mode = ("the mean good-minus-failing difference added" if rep.mode != "mean" else
            "the good format's mean output over the discovery items in place of the heads' own" if a == 1 else
            f"the heads' own output moved {a:g} of the way to the good format's mean over the discovery items"
            + (" (past the mean: extrapolated, z + a (mean - z) with a > 1)" if a > 1 else " (a blend)"))
    built = (f"{r.origin}; it needs only the failing prompt" if r.origin else
             f"built on {rep.built_on.get('n_items', '?')} discovery items of tag {r.focus!r} ({where}); needs only the "
             "failing prompt")
    lines = [f"case {r.case} · repair {'+'.join(rep.heads)} · mode {rep.mode} ({mode}), strength {rep.strength:g}",
             built + ": it acts at the last prompt token and the answer (or generated) tokens after it",
             f"measured on the {r.n_evaluation} held-out items (the result; 95% Wilson intervals over items):", "",
             f"{'measure':<16} {'format':<10} {'tag':<10} {'repaired':<24} {'unrepaired':<24} n"]
    for row in r.held_out:
        lines.append(f"{row.measure:<16} {row.format:<10} {row.tag:<10} {_pct(row.repaired):<24} "
                     f"{_pct(row.unrepaired):<24} {row.repaired.n}")
    lines += [""] + [f"  {k:<14} {v}" for k, v in WHAT.items() if any(row.measure == k for row in r.held_out)]
    lines += ["", "side effects: KL(unrepaired || repaired) of the next-token distribution, nats, at every scored "
                  "position of an item (the correct answer teacher-forced; neutral texts: their second half), averaged "
                  "within each item, then mean [95% bootstrap CI] over items, the 90th percentile and the worst item"]
    for s in r.shifts:
        extra = f"; cross-entropy {'+' if s.ce.value >= 0 else ''}{_mean(s.ce)} nats" if s.ce else ""
        what = "neutral texts" if s.where == "neutral" else f"format {s.where!r}"
        worst = f"; worst {s.worst[0][0]!r} {s.worst[0][1]:.4f}" if s.worst else ""
        lines.append(f"  {what:<18} KL {_mean(s.kl)} (n={s.kl.n}), 90th pct {s.q90:.4f}{worst}{extra}")
    if r.generation:
        lines += ["", "generation (greedy, the repair applied as surgeon.apply applies it; judged strictly: the answer, "
                      "then its end, extra or missing characters wrong):"]
        for g in r.generation:
            lines.append(f"  {g.format:<10} {g.tag:<10} repaired {_pct(g.repaired)}  unrepaired {_pct(g.unrepaired)}  "
                         f"other {g.other} (n={g.repaired.n})")
        broken = [(g, b) for g in r.generation for b in g.broken]
        if broken:
            lines.append("  right unrepaired, wrong repaired (first ones):")
            for g, (label, text) in broken[:6]:
                lines.append(f"    {g.format:<8} {g.tag:<8} {label}: wrote {text!r}")
    if r.compare:
        lines += ["", "the best paired subset (greedy on the paired repair rate, no side-effect bound) and the repair "
                      "to ship, each both ways on the held-out items: paired needs each item's good-format twin, "
                      "shippable the failing prompt alone",
                  f"  {'chosen by':<22} {'format':<10} {'paired':<24} {'shippable':<24} {'good-format KL':<16} heads"]
        for c in r.compare:
            lines.append(f"  {c.chosen_by:<22} {c.format:<10} {_pct(c.paired):<24} {_pct(c.shippable):<24} "
                         f"{c.kl_good.value:<16.4f} {'+'.join(c.heads)}")
    if r.discovery and not r.origin:
        lines += ["", f"in-sample (the {rep.built_on.get('n_items', '?')} discovery items it was built on):"]
        for row in r.discovery:
            lines.append(f"  efficacy {row.format:<10} {_pct(row.repaired)} (n={row.repaired.n})")
    if r.search:
        b = r.bounds
        lines += ["", f"search on the discovery items (in-sample): greedy over {len(b.get('pool', []))} heads x "
                      f"strengths {b.get('strengths')}, good-format KL <= {b.get('max_kl')} nats (mean) and "
                      f"<= {b.get('max_kl_q90')} (items' 90th percentile), other tags' accuracy "
                      f"at most {b.get('max_drop')} below unrepaired"]
        for s in r.search:
            if "added" in s:
                lines.append(f"  k={s['k']}: + {s['added']} (strength {s['strength']:g}): rate {100 * s['discovery_rate']:.1f}%, "
                             f"mean score {s['discovery_mean_score']:+.2f}, good-format KL {s['discovery_kl_good']:.4f} "
                             f"({s['admissible']}/{s['candidates']} candidates within bounds)"
                             + ("  <- chosen: the smallest set with the best rate" if s.get("chosen") else ""))
            else:
                lines.append(f"  k={s['k']}: stopped: {s['stopped']}")
        lines += ["", "the bounds on the held-out items (where they were not chosen):"]
        good_kl = next((x.kl for x in r.shifts if x.where == r.repair.built_on.get("good")), None)
        good = next((x for x in r.shifts if x.where == r.repair.built_on.get("good")), None)
        if good_kl is not None:
            met = "met" if good_kl.value <= b.get("max_kl", float("inf")) else "NOT met"
            lines.append(f"  good-format KL {good_kl.value:.4f} against <= {b.get('max_kl')}: {met}")
        if good is not None and b.get("max_kl_q90") is not None:
            met = "met" if good.q90 <= b["max_kl_q90"] else "NOT met"
            lines.append(f"  good-format KL's 90th percentile {good.q90:.4f} against <= {b['max_kl_q90']}: {met}")
        for row in r.held_out:
            if row.measure in ("generalization", "specificity") and r.focus != "all" and row.tag != r.focus:
                drop = row.unrepaired.value - row.repaired.value
                met = "met" if drop <= b.get("max_drop", 1) + 1e-12 else "NOT met"
                lines.append(f"  {row.format} {row.tag} accuracy drop {100 * drop:+.1f} points against <= "
                             f"{100 * b.get('max_drop', 0):.0f}: {met}")
    if r.fold is not None:
        lines += ["", fold_text(r)]
    if r.baselines is not None:
        lines += ["", baselines_text(r.baselines)]
    problems, limits = r.verdict(), r.limits()
    if problems or limits:
        lines.append("")
    lines += [f"verdict: {p}" for p in problems]
    lines += [f"note: {x}" for x in limits]
    return "\n".join(lines)


def fold_text(r) -> str:
    """What the model file (the repair at every position, in the weights) costs against the slot rule, held out."""
    f = r.fold
    lines = [f"as a model file (folded into W_O and b_O: {RULES[f.rule]}; the slot rule cannot be put in weights), on "
             "the same held-out items:",
             f"  {'measure':<16} {'format':<10} {'tag':<10} {'slot rule':<24} {'every position':<24} unrepaired"]
    slot = {(x.measure, x.format, x.tag): x.repaired for x in r.held_out}
    for row in f.rows:
        s = slot.get((row.measure, row.format, row.tag))
        lines.append(f"  {row.measure:<16} {row.format:<10} {row.tag:<10} {_pct(s) if s else '':<24} "
                     f"{_pct(row.repaired):<24} {_pct(row.unrepaired)}")
    good = next((x for x in r.shifts if x.where == f.kl_good.where), None)
    lines.append(f"  good-format KL   slot rule {_mean(good.kl) if good else '?'}, every position {_mean(f.kl_good.kl)} "
                 f"(90th pct {f.kl_good.q90:.4f})")
    return "\n".join(lines)


def pareto_of(r, path=None):
    """The repair beside the steering baselines (`pareto_figure`), or None for a repair measured without them."""
    return None if r.baselines is None else pareto_figure(r.baselines, path)


def result_record(r) -> dict:
    """results.json's result: everything but the tensors (they are in repair.safetensors)."""
    d = {k: v for k, v in vars(r).items() if k != "repair"}
    d["repair"] = r.repair.record()
    return d


def save_repair(out: Path, command: str, result, case, *, options: dict, device: str | None, figures=None,
                tables=None, api: str | None = None) -> None:
    """results.json (the measures) + the repair (repair.safetensors, repair.json) + manifest.json, all or nothing."""
    from safetensors.torch import save_file

    with staging(out) as tmp:
        write_json(tmp / "results.json", {"command": command, "result": result_record(result)})
        save_file({h: v.detach().float().contiguous().cpu() for h, v in result.repair.values.items()},
                  str(tmp / TENSORS))
        write_json(tmp / FILE, result.repair.record())
        if result.baselines is not None:
            pareto_of(result, tmp / "pareto.png")
        m = manifest(command, case, seed=options.get("seed"), device=device, dtype=options.get("dtype"),
                     options=options, model_info=model_info(case), argv=[] if api else None)
        if api:
            m["api"] = api
        write_json(tmp / "manifest.json", m)


# ----------------------------------------------------------------------------------------------- the baselines



def _kl(e) -> str:
    return f"{e.value:.4f} [{e.lo:.4f}, {e.hi:.4f}]" if e.n >= 2 and e.lo == e.lo else f"{e.value:.4f}"


def baselines_text(b) -> str:
    """The repair beside CAA, ITI and the controls: every kept configuration held out, the front, and who wins where."""
    lines = [f"beside the field's steering baselines, on the same {b.n_evaluation} held-out items (each method built "
             f"on the same {b.n_discovery} discovery items; {b.kept_by}):"]
    for fam, (what, who) in FAMILIES.items():
        if fam in b.tried:
            lines.append(f"  {NAMES[fam]:<13} {what} [{who}]; {b.tried[fam]} tried: {b.grids.get(fam, '')}"
                         if fam != "surgeon" else f"  {NAMES[fam]:<13} {what}; {b.tried[fam]} configurations")
    un = b.unrepaired
    lines += ["  efficacy: the failing formats' focus items right (pooled over failing formats); KL: the good format's "
              "KL(unrepaired || repaired), nats, mean over items [95% bootstrap CI]; control: the good format's items "
              "and the failing formats' other tags right (95% Wilson intervals)",
              f"  unrepaired: efficacy {_pct(un['efficacy'])}, control {_pct(un['control'])}", "",
              f"  {'method':<13} {'configuration':<44} {'efficacy':<24} {'good-format KL':<26} {'control':<24} front"]
    for p in b.points:
        lab = p.label if len(p.label) <= 44 else p.label[:41] + "..."
        lines.append(f"  {NAMES[p.family]:<13} {lab:<44} {_pct(p.efficacy):<24} {_kl(p.kl):<26} {_pct(p.control):<24} "
                     + ("*" if p.front else "") + ("  <- shipped" if p.shipped else ""))
    ship = b.shipped()
    if ship is not None:
        lines += ["", f"  at the shipped repair's side effects or less (good-format KL <= {ship.kl.value:.4f}, control >= "
                      f"{100 * ship.control.value:.1f}%), each method's best held-out efficacy (picked on these held-out "
                      "numbers: a comparison of the kept configurations, in-sample as a choice):"]
        for fam in b.tried:
            best = b.best_within(fam, ship)
            if best is None:
                lines.append(f"    {NAMES[fam]:<13} none of its kept configurations")
                continue
            tie = ""
            if best is not ship:
                overl = best.efficacy.lo <= ship.efficacy.hi and ship.efficacy.lo <= best.efficacy.hi
                tie = "  (intervals overlap the shipped repair's)" if overl else ""
            lines.append(f"    {NAMES[fam]:<13} {best.label[:44]:<44} {_pct(best.efficacy)}{tie}")
        over = b.dominating(ship)
        under = b.dominated_by(ship)
        lines.append(f"  the shipped repair is dominated by {len(over)} kept configuration(s)"
                     + (": " + "; ".join(f"{NAMES[p.family]} {p.label[:30]}" for p in over) if over else "")
                     + f", and dominates {len(under)} of the {len(b.points) - 1} others")
    fr = sorted((p for p in b.points if p.front), key=lambda p: (p.kl.value, -p.efficacy.value))
    if fr:
        lines.append("  the held-out front, by good-format KL (who holds it where):")
        runs: list[list] = []
        for p in fr:
            if runs and runs[-1][0] == p.family:
                runs[-1][1].append(p)
            else:
                runs.append([p.family, [p]])
        for fam, ps in runs:
            lo, hi = ps[0].kl.value, ps[-1].kl.value
            span = f"KL {lo:.4f}" if lo == hi else f"KL {lo:.4f} to {hi:.4f}"
            lines.append(f"    {span:<26} {NAMES[fam]:<13} efficacy up to {100 * max(p.efficacy.value for p in ps):.1f}%, "
                         f"control down to {100 * min(p.control.value for p in ps):.1f}%")
    for fam, g in b.grids.items():
        grid = (g.get("strengths") or g.get("alpha")) if isinstance(g, dict) else None
        ps = [p for p in b.family(fam) if p.front]
        if not grid or not ps:
            continue
        best = max(ps, key=lambda p: p.efficacy.value)
        if max(grid) in (best.params.get("strength"), best.params.get("alpha")):
            lines.append(f"  note: {NAMES[fam]}'s best point on the front ({best.label}) is at its grid's largest "
                         "strength: a wider grid may reach further")
    return "\n".join(lines)
