"""The circuit commands: `circuit` (discover, prune, verify, export) and `circuit-eval` (a circuit read from a file);
each declares its options beside the function that runs it."""
from __future__ import annotations

from pathlib import Path

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    EVAL_ITEMS,
    add_common,
    add_items,
    add_memory,
    add_metric,
    eval_items_check,
    ig_steps_ignored,
    load_case_and_model,
    one_evaluation_choice,
    planned_batch_size,
    print_report,
    warn_if_no_failure,
)
from surgeon.cli.registry import command
from surgeon.circuits.methods import MAX_IG_STEPS, SEMANTICS
from surgeon.errors import SurgeonError
from surgeon.sites.ablations import ABLATIONS

def _circuit_options(p) -> None:
    add_common(p)
    add_memory(p)
    p.add_argument("--holdout", type=cli_types.held_share, metavar="FRAC",
                   help="find the circuit on a seeded, tag-stratified share of the items and measure its faithfulness "
                        "on the held-out FRAC of them (e.g. 0.5; MIB's train/test protocol)")
    p.add_argument("--folds", type=cli_types.positive, metavar="K",
                   help="cross-validate: K circuits, each found on all but one fold of the items (seeded, stratified by "
                        "tag) and measured on that fold; prints each edge's selection frequency and the held-out "
                        "faithfulness per fold")
    p.add_argument("--eval-items", metavar="N|FILE",
                   help="find the circuit on every item and measure it on these: " + EVAL_ITEMS)
    from surgeon.circuits.methods import IG_STEPS, METHODS

    p.add_argument("--method", choices=list(METHODS),
                   help="edge scores: " + "; ".join(f"{k}: {v}" for k, v in METHODS.items())
                        + " (default: eap-ig-inputs where the formats' prompts have equal length, else eap-ig-masks)")
    p.add_argument("--ig-steps", type=cli_types.bounded(1, MAX_IG_STEPS), default=IG_STEPS, action=cli_types.Given,
                   help=f"integration steps of the eap-ig-* methods, 1..{MAX_IG_STEPS} (default: {IG_STEPS}, MIB's)")
    p.add_argument("--ablation", default=ABLATIONS[0], choices=ABLATIONS,
                   help="what an ablated edge carries: the other format's sender output at the aligned positions "
                        "(resample, default), its mean over the items per position (mean), or zero; mean and zero "
                        "at every position of the explained format's run")
    p.add_argument("--semantics", default="kept", choices=list(SEMANTICS),
                   help="kept (default; MIB, ACDC, auto-circuit): the circuit is kept, every edge outside it ablated; "
                        "knockout: the circuit is ablated, the rest kept (necessity; the value is the share removed)")
    p.add_argument("--direction", default="denoise", choices=["denoise", "noise"],
                   help="denoise: the circuit carries the good format's run, ablated edges the failing one's "
                        "(default); noise: the reverse")
    p.add_argument("--faithfulness", type=cli_types.fraction, default=0.9,
                   help="prune to the smallest top-scoring edge set with at least this faithfulness (default: 0.9)")
    p.add_argument("--edges", type=cli_types.positive, help="keep the top N edges instead of a faithfulness target")
    p.add_argument("--paths", type=cli_types.bounded(0, 1000), default=10, help="complete paths to rank and verify by path patching, 0 for none (default: 10)")
    p.add_argument("--verify", type=cli_types.nonnegative, default=50, help="top edges whose estimate is checked by exact patching (default: 50)")
    p.add_argument("--export", nargs="+", type=Path, default=[], metavar="FILE",
                   help="write the circuit graph; format from the suffix: .graphml .gexf .json .mib.json .dot .svg .pdf .tex .png")
    add_items(p)
    add_metric(p)


@command('circuit', "path-level circuit discovery: score every edge, prune a faithful circuit, "
         "rank complete paths by path patching, export the graph", _circuit_options)
def cmd_circuit(args) -> int:
    from surgeon.circuits.export import check_targets

    check_targets(args.export)  # refuse before loading anything
    ig_steps_ignored(args, args.method is None or "ig" in args.method)
    one_evaluation_choice(args)
    if args.folds is not None and args.export:
        raise SurgeonError("--folds finds one circuit per fold: there is no one circuit to export", field="--export",
                           fix="export a circuit found with --holdout, or on every item")

    case, model, device = load_case_and_model(args, check=lambda c: eval_items_check(args, c))
    warn_if_no_failure(args, case, model)
    from surgeon.analyses import planning
    from surgeon.analyses.circuit import default_method, discover

    method = args.method or default_method(case, args.ablation)
    batch = planned_batch_size(args, planning.plan_circuit, case, model, method, args.ig_steps, args.verify,
                                args.ablation)
    options = dict(method=method, ablation=args.ablation, semantics=args.semantics, direction=args.direction,
                   target=None if args.edges else args.faithfulness, n_edges=args.edges, n_paths=args.paths,
                   ig_steps=args.ig_steps, verify=args.verify)
    if args.folds is not None:
        from surgeon.analyses.heldout import circuit_folds

        return print_report(args, circuit_folds(case, model, folds=args.folds, seed=args.seed, tag=args.tag,
                                                bad=args.bad, batch_size=batch, **{**options, "n_paths": 0}),
                            case, device)
    if args.holdout is not None or args.eval_items is not None:
        from surgeon.analyses.heldout import circuit_heldout

        held = circuit_heldout(case, model, holdout=args.holdout or 0.5, eval_items=args.eval_items, seed=args.seed,
                               tag=args.tag, bad=args.bad,
                               batch_size=batch, **options)
        code, r = print_report(args, held, case, device), held.search
    else:
        r = discover(case, model, bad=args.bad, tag=args.tag, batch_size=batch, **options)
        code = print_report(args, r, case, device)
    if args.export:
        r.export(*args.export)
        print("exported " + ", ".join(str(f) for f in args.export))
    return code


def _circuit_eval_options(p) -> None:
    add_common(p)
    p.add_argument("graph", type=Path, help="the circuit file (.json or .mib.json)")
    p.add_argument("--ablation", choices=ABLATIONS,
                   help="what an ablated edge carries (default: what the file records it was found under; resample "
                        "where it records nothing)")
    p.add_argument("--semantics", choices=list(SEMANTICS),
                   help="kept or knockout (default: what the file records; kept where it records nothing)")
    p.add_argument("--direction", choices=["denoise", "noise"],
                   help="default: what the file records; denoise where it records nothing")
    add_items(p)
    add_metric(p)


@command('circuit-eval', "faithfulness of a circuit read from a file (our JSON exports, "
         "or an EAP-IG / MIB circuit JSON)", _circuit_eval_options)
def cmd_circuit_eval(args) -> int:
    from surgeon.analyses.circuit import check_circuit_file, evaluate_circuit, evaluation_options
    from surgeon.circuits.export import read_circuit

    circuit = read_circuit(args.graph, edges_only=True)  # refused before the model loads

    def against_the_model(case):  # names, cfg and GQA copies checked from the model's config alone
        ablation = evaluation_options(circuit, case, ablation=args.ablation, semantics=args.semantics,
                                      direction=args.direction, bad=args.bad, where=str(args.graph))[0]
        check_circuit_file(circuit, case.model, ablation, str(args.graph))

    case, model, device = load_case_and_model(args, check=against_the_model)
    from surgeon.reports.circuit_view import circuit_eval_text
    from surgeon.reports.text import save

    r = evaluate_circuit(case, model, circuit, ablation=args.ablation, semantics=args.semantics,
                         direction=args.direction, bad=args.bad,
                         tag=args.tag, batch_size=args.batch_size, where=str(args.graph))
    print(circuit_eval_text(r, args.graph))
    if args.out:
        save(args.out, "circuit-eval", r, case, args, device)
        print(f"\nwrote {args.out}/results.json, manifest.json")
    return 0
