"""A format scan against what a user would otherwise write: a loop of `surgeon.diagnose` calls, one per format.

On the decimal organism's grammar (every format that fits its 64-token context: question and answer cues,
separators, casing; 96 formats), on its 64 trap items:
  scan        `surgeon.scan`'s scoring: every format on the discovery items, the chosen ones and the effects' formats
              on the evaluation items, each distinct prompt once, in batched passes;
  loop        for each of the same formats, `surgeon.diagnose` on a case with that format as its failing one beside
              the good format (what a user writes who has only `diagnose`): every item of the case (traps and
              controls) in both formats, as diagnose scores them.
The work is counted in prompts scored: the loop's, the scan's (format, item) scores and the distinct prompts it ran,
the least (each distinct prompt the scan's numbers need, once); and in token positions: the scan shares prefixes
between prompts (`surgeon.engine.readout.prefix_batches`), so it runs fewer positions than its prompts hold.

    python bench/scan.py [--repeats 3] [--threads 2] [--save]
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--save", action="store_true", help="also write bench/results/scan.txt (the docs')")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from saving import best_of, saved

    from surgeon import load_case
    from surgeon.analyses.diagnose import diagnose
    from surgeon.analyses.scan import scan_formats
    from surgeon.models.loading import load_model

    case = load_case("cases/decimal_organism.py")
    model = load_model(case.model)
    with saved("scan", args.save, organisms=("decimal",)):
        t_scan, r = best_of(args.repeats, lambda: scan_formats(case, model))
        templates = list(dict.fromkeys(f.template for f in r.discovery))

        def loop():
            for t in templates:
                diagnose(replace(case, formats={case.good: case.formats[case.good], "try": t}, bad=["try"]), model)

        t_loop, _ = best_of(args.repeats, loop)
        n_loop = len(templates) * 2 * len(case.items)
        w = r.work
        print(f"decimal organism: {r.n_formats} formats, {r.split['discovery']} discovery and {r.split['evaluation']} "
              f"evaluation trap items; best of {args.repeats} runs, {args.threads} threads")
        print(f"\n  scan (search, effects, pair, held out)  {t_scan:7.2f} s   {w['format_items']:,} (format, item) "
              f"scores from {w['prompts_run']:,} distinct prompts")
        print(f"  loop of diagnose, one call per format   {t_loop:7.2f} s   {n_loop:,} prompts ({len(templates)} "
              f"formats x {len(case.items)} items x 2 formats per call)")
        print(f"  ratio loop / scan: {t_loop / t_scan:.2f}x; the scan's distinct prompts are {w['prompts_run']:,} of "
              f"its {w['format_items']:,} scores (the least: each distinct prompt once), and with prefixes shared "
              f"it runs {w['positions_run']:,} token positions of their {w['positions_whole']:,} "
              f"({100 * w['positions_run'] / w['positions_whole']:.0f}%)")
        print(f"  what the loop gives: accuracy per format; what the scan adds: the held-out measure of the chosen "
              f"formats, {len(r.effects)} options' effects with Holm's correction, the minimal pair")
        from limit import case_rows, counted_section

        counted_section("work and speed against this machine's limit (work: matrix-multiply FLOPs of one more run of "
                        "each under torch's FlopCounterMode, apart from the timings)",
                        [(model.cfg, case_rows(case, model))], [
                            ("scan", "surgeon", t_scan, lambda: scan_formats(case, model), None),
                            ("loop of diagnose", "baseline", t_loop, loop, None)],
                        ["least: each distinct prompt once is the scan's own count (prompts_run above)"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
