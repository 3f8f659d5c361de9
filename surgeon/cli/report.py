"""`surgeon report`: the whole pipeline into one page; its options beside the function that runs it."""
from __future__ import annotations

from pathlib import Path

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    EVAL_ITEMS,
    add_common,
    add_items,
    add_metric,
    load_case_and_model,
    one_evaluation_choice,
)
from surgeon.cli.registry import command
from surgeon.errors import SurgeonError

REPORT_STEPS = ("diagnose", "dla", "patch", "positions", "threshold", "blend", "circuit", "attention", "sinks",
                "sae")  # = analyses.pipeline.STEPS (a test checks)
REPORT_OPTIONAL = ("scan", "repair")  # = analyses.pipeline.OPTIONAL_STEPS: run only when --steps names them

def _report_options(p) -> None:
    add_common(p, out_help="where the page (report.html), each step's results and the figures go (default: "
                           "out/report-CASE under the current directory)")
    p.add_argument("--steps", default=",".join(REPORT_STEPS),
                   help=f"steps to run, in order (default: {','.join(REPORT_STEPS)}; also: scan, where the model fails and which "
                        "part of the format causes it, and repair, a repair that needs the failing prompt alone, each "
                        "chosen and measured on held-out items)")
    p.add_argument("--layer", type=cli_types.layer,
                   help="the layer of the subset search and the blend (default: where patching single heads repairs most)")
    p.add_argument("--budget", type=cli_types.positive, default=200,
                   help="subsets per size in the threshold search (default 200: all of them up to that many)")
    p.add_argument("--heads", help="the subset search's candidate heads: 0,2,5 (of --layer) or L1H0,L2H3 (default: every "
                                   "head of the layer)")
    p.add_argument("--groups", help="built-in groups the subset search also searches within: even,odd,first_half,"
                                    "second_half,random or none (default: even,odd,random)")
    p.add_argument("--item-rate", type=cli_types.fraction, default=1.0,
                   help="a subset repairs when it fixes at least this fraction of items (default 1.0: all)")
    p.add_argument("--verify", type=cli_types.nonnegative, default=50, help="top edges verified by exact patching (default 50)")
    p.add_argument("--paths", type=cli_types.bounded(0, 1000), default=10, help="complete paths measured (default 10)")
    p.add_argument("--sae-release", help="a sae-lens release for the SAE steps (default: the case's saes)")
    p.add_argument("--sae-id", help="the SAE id within the release; {layer} is replaced")
    p.add_argument("--sae-dir", help="local SAE directories; {layer} is replaced")
    p.add_argument("--holdout", type=cli_types.holdout, metavar="FRAC",
                   help="the subset search and the circuit run on discovery items and are reported on the held-out "
                        "FRAC, seeded by --seed and stratified by tag (default 0.5; 0: every item, in-sample)")
    p.add_argument("--eval-items", metavar="N|FILE",
                   help="the subset search and the circuit run on every item and are reported on these: " + EVAL_ITEMS)
    add_items(p)
    add_metric(p)


@command('report', "the whole pipeline on a case, each step reusing an earlier run's finished "
         "results in --out; one self-contained HTML page with an interactive circuit", _report_options)
def cmd_report(args) -> int:
    steps = [x.strip() for x in args.steps.split(",") if x.strip()]
    unknown = [x for x in steps if x not in REPORT_STEPS + REPORT_OPTIONAL]
    if unknown or not steps:
        raise SurgeonError(f"unknown report steps {unknown}" if unknown else "no report step given", field="--steps",
                           fix=f"choose from: {','.join(REPORT_STEPS + REPORT_OPTIONAL)}")
    out = args.out or Path("out") / f"report-{Path(args.case).stem}"
    one_evaluation_choice(args)
    holdout = 0.5 if args.holdout is None and args.eval_items is None else args.holdout
    if "repair" in steps and not holdout and args.eval_items is None:
        raise SurgeonError("the repair step measures the repair on items it was not built on; --holdout 0 holds none "
                           "out", field="--holdout", fix="give --holdout FRAC or --eval-items, or leave the repair "
                                                         "step out")

    def split_check(case):  # too few items for the split, or evaluation items that do not fit, before the model loads
        if "repair" in steps:  # a case the repair step cannot run on (align="index"), before any step runs
            from surgeon.analyses.repair import check_repairable

            check_repairable(case, "mean", "z", holdout=holdout, eval_items=args.eval_items)
        if "scan" in steps:  # the case's scan= parts
            from surgeon.case.grammar import check_scan

            check_scan(case.scan, case.source)
        if {"threshold", "circuit", "repair", "scan"} & set(steps) and (holdout or args.eval_items is not None):
            from surgeon.analyses.heldout import eval_split

            eval_split(case, args.tag, holdout, args.seed, args.eval_items)

    case, model, device = load_case_and_model(args, out=out, check=split_check)
    import surgeon.api as api

    rep = api.report(case, model, out=out, steps=steps, layer=args.layer, budget=args.budget, verify=args.verify,
                     paths=args.paths, sae_release=args.sae_release, sae_id=args.sae_id, sae_dir=args.sae_dir,
                     batch_size=args.batch_size, device=device, dtype=args.dtype, bad=args.bad, tag=args.tag,
                     item_rate=args.item_rate, heads=args.heads, seed=args.seed, progress=True,
                     holdout=holdout, eval_items=args.eval_items, groups=None if args.groups is None else [] if args.groups.strip() in ("", "none") else
                     [g.strip() for g in args.groups.split(",") if g.strip()])
    print(rep)
    print(f"\nwrote {out}/report.html, figures/ and one folder per step")
    return 0
