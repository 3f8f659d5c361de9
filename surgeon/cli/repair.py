"""`surgeon repair`: a repair that needs the failing prompt alone, built on discovery items and measured held out,
beside the field's steering baselines, saved and folded into the weights; its options beside the function that runs it."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    EVAL_ITEMS,
    add_common,
    eval_items_check,
    load_case_and_model,
    one_evaluation_choice,
)
from surgeon.cli.registry import command
from surgeon.errors import SurgeonError, warn

def _repair_options(p) -> None:
    add_common(p, out_help="write results.json, manifest.json and the repair (repair.safetensors, repair.json) here")
    p.add_argument("--heads", help="the heads to repair, e.g. L0H4,L0H6 (with --search: the pool to choose from; "
                                   "default every head)")
    p.add_argument("--from", dest="from_dir", type=Path, metavar="DIR",
                   help="measure the repair saved in DIR (surgeon repair --out DIR) on this case's items and formats "
                        "instead of building one: every measure below, items it was built on left out")
    p.add_argument("--any-model", action="store_true",
                   help="with --from: measure it on weights other than those it was built on, on purpose (default: "
                        "refused)")
    p.add_argument("--mode", default="mean", choices=["mean", "steer"],
                   help="mean: the heads' output replaced by the good format's mean over the discovery items; steer: "
                        "the mean good-minus-failing difference added, times --strength (ITI / CAA) (default: mean)")
    p.add_argument("--strength", type=float, help="mean: 1 replaces fully, less blends; steer: the multiple of the "
                                                  "difference added (default 1)")
    p.add_argument("--search", action="store_true",
                   help="choose the heads (from --heads) and the strength on the discovery items, greedily, under "
                        "--max-kl and --max-drop; then measure the choice on the held-out items")
    p.add_argument("--strengths", action=cli_types.Given, help="with --search: strengths to try, e.g. 0.5,1,2,4 (default: 1 for mean; "
                                       "0.5,1,2,4 for steer)")
    p.add_argument("--sites", default="z", help="with --search: what it may write: z (heads) and one vector per layer "
                                                "of mlp_out, attn_out or resid_pre, e.g. z,mlp_out (default z)")
    p.add_argument("--max-heads", type=cli_types.positive, default=8, action=cli_types.Given, help="with --search: at most this many heads "
                                                                          "(default 8)")
    p.add_argument("--max-kl", type=float, default=0.1, action=cli_types.Given,
                   help="with --search: the good format's mean KL from the unrepaired model, at most (nats, default 0.1)")
    p.add_argument("--max-kl-q90", type=float, default=None, action=cli_types.Given, metavar="NATS",
                   help="with --search: the 90th percentile over items of the good format's KL, at most (default: 5 x "
                        "--max-kl): one item broken badly shows here, not in the mean")
    p.add_argument("--max-drop", type=cli_types.share, default=0.05, action=cli_types.Given,
                   help="with --search: every other tag's accuracy in every format at most this far below unrepaired "
                        "(default 0.05)")
    p.add_argument("--save-anyway", action="store_true",
                   help="with --out: save the repair even when its verdict says not to ship it (no held-out efficacy "
                        "above unrepaired, a bound not met on the held-out items)")
    p.add_argument("--holdout", type=cli_types.held_share, metavar="FRAC",
                   help="build on a seeded, tag-stratified share of the items and measure on the held-out FRAC "
                        "(default 0.5; not with --eval-items)")
    p.add_argument("--eval-items", metavar="N|FILE",
                   help="build on every item and measure on these: " + EVAL_ITEMS)
    p.add_argument("--neutral", type=Path, metavar="FILE",
                   help="a text file, one neutral text per line: the repair's KL and cross-entropy change on them (default: "
                        "the case's neutral texts, where it names some)")
    p.add_argument("--generate", type=cli_types.nonnegative, default=0, metavar="N",
                   help="also judge N greedily generated tokens per held-out item with the repair applied")
    p.add_argument("--baselines", action="store_true",
                   help="also build the field's steering baselines on the same discovery items (CAA in the residual "
                        "stream at every layer, ITI on probe-ranked heads, random heads, one layer's heads) and place "
                        "them beside the repair on the same held-out items: a Pareto front of efficacy against KL and "
                        "control accuracy (the text, and pareto.png with --out)")
    p.add_argument("--fold-out", type=Path, metavar="DIR",
                   help="also fold the repair into the weights (acting at every position: exact for head outputs) and "
                        "save the model there: a Hugging Face folder for a model loaded from one, else a "
                        "TransformerLens checkpoint (--model DIR reads both); prints what the every-position rule costs "
                        "against the slot rule on the held-out items")
    p.add_argument("--fold-rule", default="slot0", choices=["slot0", "mean"],
                   help="with --fold-out: the constant at every position: slot 0's (the last prompt token's; default) "
                        "or the mean over the repair's slots")
    p.add_argument("--fold-format", default="auto", choices=["auto", "tl", "hf"],
                   help="with --fold-out: hf (a Hugging Face folder: needs a model loaded from one), tl (a "
                        "TransformerLens checkpoint), auto (hf where the model came from a Hugging Face folder; default)")
    p.add_argument("--bad", help="build and measure on this failing format only (default: every failing format)")
    p.add_argument("--tag", help="the items the repair is built on and judged by for efficacy (default: the focus)")


@command('repair', "a repair that needs the failing prompt alone (the heads' mean good-format "
         "output, or a steering difference), built on discovery items and measured on "
         "held-out ones for efficacy, generalization and side effects; --out keeps it", _repair_options)
def cmd_repair(args) -> int:
    from surgeon.analyses.repair import check_repairable

    strengths, saved = _repair_inputs(args)
    neutral = _neutral_texts(args.neutral)
    case, model, device = load_case_and_model(
        args, check=lambda c: (check_repairable(c, saved.mode if saved else args.mode, "z",
                                                holdout=args.holdout, eval_items=args.eval_items),
                               eval_items_check(args, c)))
    if args.generate:
        from surgeon.analyses.generation import check_generation

        check_generation(case, model, list(case.items), args.generate)
    if saved is None:  # a repair of a format that does not fail is said before the work, as the other analyses say it
        from surgeon.analyses.diagnose import failure_check

        for b in ([args.bad] if args.bad is not None else list(case.bad_formats)):
            why = failure_check(case, model, bad=b, tag=args.tag, batch_size=args.batch_size)
            if why:
                warn(why)
    r = _repair(args, case, model, strengths, saved, neutral)
    from surgeon.reports.repair_view import repair_text

    print(repair_text(r))
    _keep(args, r, case, model, device)
    return 0


def _repair_inputs(args):
    """The strengths to search and the saved repair to measure (`--from`), read and checked against the other options
    before anything loads."""
    from surgeon.analyses.repair import check_heads

    one_evaluation_choice(args)
    if args.holdout is None and args.eval_items is None:
        args.holdout = 0.5
    if not args.search:  # the search's own options do nothing without it
        for flag in ("strengths", "max_heads", "max_kl", "max_kl_q90", "max_drop"):
            if flag in getattr(args, "given", ()):
                name = "--" + flag.replace("_", "-")
                raise SurgeonError(f"{name} bounds the search, but no --search is asked for", field=name,
                                   fix=f"add --search, or leave out {name}")
    strengths = None
    if args.strengths:
        try:
            strengths = [float(x) for x in args.strengths.split(",") if x.strip()]
        except ValueError:
            raise SurgeonError(f"cannot read --strengths {args.strengths!r}", field="--strengths",
                               fix="numbers separated by commas, e.g. 0.5,1,2,4") from None
    saved = None
    if args.from_dir is not None:
        from surgeon.repairs.artifact import read_repair

        for flag, given in (("--heads", args.heads), ("--search", args.search), ("--strength", args.strength),
                            ("--strengths", args.strengths), ("--baselines", args.baselines)):
            if given:
                raise SurgeonError(f"{flag} builds a repair, but --from measures the one saved in {args.from_dir}",
                                   field=flag, fix=f"leave out {flag}, or leave out --from to build a repair")
        saved = read_repair(args.from_dir)  # before the model loads
    elif args.any_model:
        raise SurgeonError("--any-model says a saved repair may act on other weights, but no --from DIR is given",
                           field="--any-model", fix="add --from DIR, or leave out --any-model")
    else:
        check_heads(args.heads, max_heads=args.max_heads, strength=args.strength, strengths=strengths,
                    search=args.search, max_kl=args.max_kl, max_drop=args.max_drop, max_kl_q90=args.max_kl_q90)
        from surgeon.analyses.repair import check_sites

        check_sites(args.sites)
        if args.sites != "z" and not args.search:
            raise SurgeonError("--sites says what --search may write; --heads names heads", field="--sites",
                               fix="add --search, or leave --sites out")
    return strengths, saved


def _neutral_texts(path: Path | None) -> list[str] | None:
    """--neutral's texts, one per line (refused when the file cannot be read or holds none)."""
    if path is None:
        return None
    try:
        neutral = [line for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise SurgeonError(f"cannot read {path} ({type(e).__name__})", field="--neutral",
                           fix="give a text file, one neutral text per line") from None
    if not neutral:
        raise SurgeonError(f"{path} holds no text", field="--neutral", fix="one neutral text per line")
    return neutral


def _repair(args, case, model, strengths, saved, neutral):
    """The repair measured (`--from`), searched (`--search`) or built on the heads given; with the baselines beside
    it (`--baselines`)."""
    from surgeon.analyses.repair import measure_saved, repair_case, search_repair
    from surgeon.analyses.steering_baselines import compare_baselines

    common = dict(mode=args.mode, bad=args.bad, tag=args.tag, holdout=args.holdout, seed=args.seed, neutral=neutral,
                  eval_items=args.eval_items, fold=args.fold_rule if args.fold_out is not None else None,
                  generate=args.generate, batch_size=args.batch_size)
    if saved is not None:
        r = measure_saved(case, model, saved, bad=args.bad, tag=args.tag, eval_items=args.eval_items, seed=args.seed,
                          neutral=neutral, generate=args.generate, batch_size=args.batch_size, any_model=args.any_model,
                          fold=args.fold_rule if args.fold_out is not None else None)
    elif args.search:
        r = search_repair(case, model, heads=args.heads, strengths=strengths, max_heads=args.max_heads,
                          max_kl=args.max_kl, max_kl_q90=args.max_kl_q90, max_drop=args.max_drop, progress=True,
                          sites=args.sites.split(","), **common)
    else:
        r = repair_case(case, model, heads=args.heads, strength=1.0 if args.strength is None else args.strength,
                        **common)
    if args.baselines:
        r = replace(r, baselines=compare_baselines(case, model, r, holdout=args.holdout, seed=args.seed, bad=args.bad,
                                                   tag=args.tag, eval_items=args.eval_items,
                                                   batch_size=args.batch_size, progress=True))
    return r


def _keep(args, r, case, model, device) -> None:
    """The repair saved (`--out`) and folded into the weights (`--fold-out`), unless its verdict says not to ship it
    (`--save-anyway` does both anyway)."""
    from surgeon.reports.repair_view import save_repair
    from surgeon.repairs.fold import save_folded

    if args.out and r.verdict() and not args.save_anyway:
        print(f"\nnot saved to {args.out}: the verdict above says not to ship this repair (--save-anyway saves it)")
    elif args.out:
        opts = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                if k not in ("debug", "out", "case")}
        save_repair(args.out, "repair", r, case, options=opts, device=device)
        print(f"\nwrote {args.out}/results.json, manifest.json, repair.safetensors, repair.json "
              "(apply it with surgeon.apply(model, surgeon.load(DIR)))")
    if args.fold_out is not None and r.verdict() and not args.save_anyway:
        print(f"\nnot folded into {args.fold_out}: the verdict above says not to ship this repair (--save-anyway "
              "folds it)")
    elif args.fold_out is not None:
        fmt = save_folded(r.repair, model, args.fold_out, rule=args.fold_rule, fmt=args.fold_format,
                          source=case.model)
        print(f"\nwrote {args.fold_out}: the repaired model ({fmt}, every position: {args.fold_rule}), loaded with no "
              "surgeon and no hooks" + (" by transformers.AutoModelForCausalLM" if fmt == "huggingface" else
                                        " (a TransformerLens checkpoint: HookedTransformer from its config.json and model.safetensors, or surgeon --model DIR)"))
