"""The patching commands: `patch`, `patch-positions`, `attribute` and `blend`; each declares its options beside the
function that runs it."""
from __future__ import annotations

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    EVAL_ITEMS,
    add_common,
    add_items,
    add_memory,
    add_metric,
    add_patching,
    ig_steps_ignored,
    layers_of,
    load_case_and_model,
    one_evaluation_choice,
    planned_batch_size,
    print_report,
    warn_if_no_failure,
)
from surgeon.cli.registry import command
from surgeon.circuits.methods import ATTRIBUTION_IG_STEPS, ATTRIBUTION_METHODS, MAX_IG_STEPS
from surgeon.sites.nodes import COMPONENTS

def _patch_positions_options(p) -> None:
    add_patching(p, COMPONENTS)


@command('patch-positions', "patch each unit of each layer at each aligned position alone "
         "(units x positions; --component resid_pre: the residual stream)", _patch_positions_options)
def cmd_patch_positions(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.positions import patch_positions

    r = patch_positions(case, model, layers=layers_of(args, case), component=args.component,
                        direction=args.direction, bad=args.bad, tag=args.tag, batch_size=args.batch_size,
                        progress=True)
    return print_report(args, r, case, device)


def _patch_options(p) -> None:
    add_patching(p, COMPONENTS)
    add_memory(p)
    p.add_argument("--holdout", type=cli_types.held_share, metavar="FRAC",
                   help="rank the units on a seeded, tag-stratified share of the items and report the top ones on the "
                        "held-out FRAC (e.g. 0.5)")
    p.add_argument("--eval-items", metavar="N|FILE", help="rank the units on every item and report the top ones on "
                                                         "these: " + EVAL_ITEMS)
    p.add_argument("--top", type=cli_types.positive, default=10, help="with --holdout/--eval-items: the units reported "
                                                                      "held out (default 10)")


@command('patch', "patch each head (unit) of each layer from one format into the other", _patch_options)
def cmd_patch(args) -> int:
    one_evaluation_choice(args)
    held = args.holdout is not None or args.eval_items is not None

    def split_check(case):  # too few items for the split, or evaluation items that do not fit, before the model loads
        if held:
            from surgeon.analyses.heldout import eval_split

            eval_split(case, args.tag, args.holdout, args.seed, args.eval_items)

    case, model, device = load_case_and_model(args, check=split_check)
    warn_if_no_failure(args, case, model)
    from surgeon.analyses import patch_heads, planning

    layers = layers_of(args, case)
    batch = planned_batch_size(args, planning.plan_patch, case, model, layers, args.component)
    if held:
        from surgeon.analyses.heldout import patch_heldout

        r = patch_heldout(case, model, holdout=args.holdout or 0.5, seed=args.seed, tag=args.tag, bad=args.bad,
                          top=args.top, eval_items=args.eval_items, layers=layers, component=args.component,
                          direction=args.direction, batch_size=batch)
        return print_report(args, r, case, device)
    r = patch_heads(case, model, layers=layers, component=args.component, direction=args.direction, bad=args.bad,
                    tag=args.tag, batch_size=batch, progress=True)
    return print_report(args, r, case, device)


def _attribute_options(p) -> None:
    add_common(p)
    p.add_argument("--layers", help="layers, e.g. 0,1,2 or 0-2 (default: the case's, else all)")
    p.add_argument("--component", default="z", choices=list(COMPONENTS), help="what to attribute (default: z)")
    p.add_argument("--direction", default="denoise", choices=["denoise", "noise"],
                   help="denoise: gradients of patching the good format into the failing one (repair); noise: the "
                        "reverse (default: denoise)")
    add_items(p)
    add_metric(p)
    p.add_argument("--compare", action="store_true", help="also run exact per-unit patching and correlate")
    p.add_argument("--method", default="gradient", choices=list(ATTRIBUTION_METHODS),
                   help="; ".join(f"{k}: {v}" for k, v in ATTRIBUTION_METHODS.items()) + " (default: gradient)")
    p.add_argument("--ig-steps", type=cli_types.bounded(1, MAX_IG_STEPS), default=ATTRIBUTION_IG_STEPS,
                   action=cli_types.Given, help=f"points of the integral for --method ig (default: {ATTRIBUTION_IG_STEPS})")


@command('attribute', "estimate every unit's patching effect from one backward pass "
         "(gradients w.r.t. the masks); --compare checks it against exact patching", _attribute_options)
def cmd_attribute(args) -> int:
    ig_steps_ignored(args, args.method == "ig")
    case, model, device = load_case_and_model(args)
    from surgeon.analyses import attribute

    layers = layers_of(args, case)
    r = attribute(case, model, layers=layers, component=args.component, direction=args.direction, bad=args.bad,
                  tag=args.tag, batch_size=args.batch_size, compare=args.compare, method=args.method,
                  ig_steps=args.ig_steps)
    return print_report(args, r, case, device)


def _blend_options(p) -> None:
    add_common(p)
    p.add_argument("--layer", type=cli_types.layer, required=True, help="the layer whose heads (or output) are blended")
    p.add_argument("--heads", help="heads to blend, e.g. 0,2,4 or L1H0,L1H2 (default: all heads of the layer)")
    p.add_argument("--component", default="z", choices=["z", "o_slices", "attn_out", "pattern", "mlp_out", "resid_pre"],
                   help="z: head outputs; attn_out: the whole layer output (the paper's 'pattern replacement'); "
                        "pattern: attention patterns (equal-length formats only) (default: z)")
    p.add_argument("--step", type=cli_types.fraction, default=0.01, help="grid step for a (default 0.01)")
    add_items(p)
    add_metric(p)


@command('blend', "blend (1-a)*failing + a*good for chosen heads: where does repair switch on?", _blend_options)
def cmd_blend(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.blend import blend

    r = blend(case, model, layer=args.layer, heads=args.heads, component=args.component,
              step=args.step, bad=args.bad, tag=args.tag, batch_size=args.batch_size)
    return print_report(args, r, case, device)
