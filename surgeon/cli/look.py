"""The commands that look before patching: `diagnose` (is the failure there?), `scan` (where does the model fail?),
`dla`, `encode`, `attention` and `sinks`; each declares its options beside the function that runs it."""
from __future__ import annotations

import sys
from pathlib import Path

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    EVAL_ITEMS,
    add_common,
    add_memory,
    add_metric,
    eval_items_check,
    int_list,
    load_case_and_model,
    one_evaluation_choice,
    print_report,
)
from surgeon.cli.registry import command
from surgeon.case.grammar import BUDGET as SCAN_BUDGET
from surgeon.errors import SurgeonError

def _diagnose_options(p) -> None:
    add_common(p)
    add_metric(p)
    p.add_argument("--generate", type=cli_types.nonnegative, default=0, metavar="N",
                   help="also generate N tokens greedily per focus item and judge them (what the paper did)")


@command('diagnose', "accuracy and score per format, with intervals: is the failure there?", _diagnose_options)
def cmd_diagnose(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses import diagnose

    d = diagnose(case, model, batch_size=args.batch_size, generate=args.generate, progress=True)
    return print_report(args, d, case, device)


def _scan_options(p) -> None:
    add_common(p)
    add_metric(p)
    p.add_argument("--tag", help="only items with this tag ('all' for every item; default: the case's focus)")
    p.add_argument("--budget", type=cli_types.positive, default=SCAN_BUDGET, metavar="PROMPTS",
                   help=f"prompts scored in discovery at most: every format when they fit, else successive halving "
                        f"(default {SCAN_BUDGET:,})")
    p.add_argument("--holdout", type=cli_types.holdout, metavar="FRAC",
                   help="choose on a seeded, tag-stratified share of the items and measure on the held-out FRAC "
                        "(default 0.5; 0: every item, in-sample)")
    p.add_argument("--eval-items", metavar="N|FILE", help="choose on every item and measure on these: " + EVAL_ITEMS)
    p.add_argument("--write-case", type=Path, metavar="FILE.py",
                   help="write the minimal pair as a case file (good: the working format, bad: the failing one) that "
                        "loads this case's items (default: none written)")


@command('scan', "find where the model fails: formats composed from a grammar of parts (cues, "
         "separators, casing, instruction, few-shot, chat template) scored on the case's "
         "items; the worst and best formats, each part's effect, the minimal pair; held out", _scan_options)
def cmd_scan(args) -> int:
    from surgeon.analyses.heldout import eval_split, evaluation_choice
    from surgeon.case.grammar import check_scan
    from surgeon.case.writer import check_write_target

    one_evaluation_choice(args)
    holdout = evaluation_choice(args.holdout, args.eval_items, default=0.5)
    if args.write_case is not None:
        check_write_target(args.write_case)  # a .py file not there yet, before anything is read

    def checks(case):  # the case's parts, the file to write and the split, before the model loads
        check_scan(case.scan, case.source)
        if args.write_case is not None:
            check_write_target(args.write_case, case)
        if holdout or args.eval_items is not None:
            eval_split(case, args.tag, holdout, args.seed, args.eval_items)
        eval_items_check(args, case)

    case, model, device = load_case_and_model(args, check=checks)
    from surgeon.analyses.scan import scan_formats, write_found

    r = scan_formats(case, model, budget=args.budget, tag=args.tag, holdout=holdout, eval_items=args.eval_items,
                     seed=args.seed, batch_size=args.batch_size, progress=True)
    if args.write_case is not None:
        r = write_found(r, case, args.write_case)
    return print_report(args, r, case, device)


def _dla_options(p) -> None:
    add_common(p)
    p.add_argument("--tag", help="only items with this tag ('all' for every item; default: the case's focus)")
    p.add_argument("--value-biases", default="per-head", choices=["per-head", "folded"],
                   help="per-head: each head's output includes its value bias (the raw weights); folded: moved into "
                        "the attention bias, as TransformerLens's default model (default: per-head)")
    p.add_argument("--lens-bias", default="included", choices=["included", "excluded"],
                   help="the logit lens with the unembedding bias (its last layer is the model's output) or without "
                        "it, as TransformerLens's (default: included)")


@command('dla', "direct logit attribution per head and layer, and the logit lens, in every "
         "format: the first look before patching", _dla_options)
def cmd_dla(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.logit_attribution import logit_attribution

    r = logit_attribution(case, model, tag=args.tag, batch_size=args.batch_size, value_biases=args.value_biases,
                          lens_bias=args.lens_bias)
    return print_report(args, r, case, device)


def _encode_options(p) -> None:
    add_common(p)
    p.add_argument("--items", default="0,1,2", help="item indices among the items shown, e.g. 0,3 (default: 0,1,2)")
    p.add_argument("--tag", default="all", help="only items with this tag (default: all: every item)")
    p.add_argument("--bad", help="only this failing format (default: every failing format)")


@command('encode', "what the model reads: each item's tokens per format, the scored positions "
         "and answer tokens, and the aligned positions patching moves between", _encode_options)
def cmd_encode(args) -> int:
    items = int_list(args.items, "--items")
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.encode import encode

    r = encode(case, model, bad=args.bad, tag=args.tag, items=items)
    return print_report(args, r, case, device)


def _attention_options(p) -> None:
    add_common(p)
    p.add_argument("--heads", required=True, help="heads, e.g. L1H0,L1H1")
    p.add_argument("--items", default="0", help="item indices among the items analysed, e.g. 0,3 (default: 0)")
    p.add_argument("--tag", help="only items with this tag ('all' for every item; default: the case's focus)")


@command('attention', "attention patterns of chosen heads on chosen items, every format side "
         "by side", _attention_options)
def cmd_attention(args) -> int:
    items = int_list(args.items, "--items")
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.attention import attention_patterns

    r = attention_patterns(case, model, heads=args.heads, items=items, tag=args.tag, batch_size=args.batch_size)
    return print_report(args, r, case, device)


def _sinks_options(p) -> None:
    add_common(p)
    p.add_argument("--epsilon", type=cli_types.fraction, default=0.3,
                   help="a head is a sink head when its mean attention to the first token passes this (default 0.3, "
                        "Gu et al.'s)")
    p.add_argument("--tag", help="only items with this tag (default: every item; with --intervene, the effects on "
                                 "the case's focus items)")
    add_memory(p)
    p.add_argument("--intervene", action="store_true",
                   help="also test the sinks as causes of the failure, each in every format: remove each sink head's "
                        "attention to the first token (renormalised), ablate the massive dimension and its super "
                        "neuron (zero, mean)")
    p.add_argument("--heads", help="with --intervene: remove the sinks of these heads (e.g. L1H0,L1H6) instead of "
                                   "the measured sink heads")
    p.add_argument("--amplify", type=cli_types.amplify, metavar="POS:FACTOR@LAYER",
                   help="with --intervene: also scale position POS's residual stream by FACTOR entering LAYER "
                        "(e.g. 3:10@1), the papers' way to make a sink of a token")


@command('sinks', "attention sinks and massive activations per head, layer and format: the "
         "attention on the first token (sink rate), the strongest other sinks, the first "
         "token's residual norm, the largest activations (Sun et al.'s criterion)", _sinks_options)
def cmd_sinks(args) -> int:
    if not 0 < args.epsilon < 1:
        raise SurgeonError(f"--epsilon {args.epsilon} is not in (0, 1)", field="--epsilon", fix="e.g. 0.3")
    if (args.heads or args.amplify) and not args.intervene:
        raise SurgeonError("--heads and --amplify choose interventions, which only --intervene runs",
                           field="--intervene", fix="add --intervene, or leave --heads and --amplify out")
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.sinks import plan, sinks
    from surgeon.case.select import pick_items

    p, budget = plan(case, model, pick_items(case, "all")[1], min(args.batch_size, 64), args.max_memory)
    print(f"plan: {p.line(budget)}", file=sys.stderr)
    if args.intervene:
        from surgeon.analyses.sink_interventions import sink_interventions

        heads = [h.strip() for h in args.heads.split(",") if h.strip()] if args.heads else None
        return print_report(args, sink_interventions(case, model, tag=args.tag, heads=heads, amplify=args.amplify,
                                                     epsilon=args.epsilon, batch_size=p.batch_size), case, device)
    return print_report(args, sinks(case, model, tag=args.tag or "all", epsilon=args.epsilon,
                                    batch_size=p.batch_size), case, device)
