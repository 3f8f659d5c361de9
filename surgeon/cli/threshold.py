"""The subset search: `threshold` (subsets that repair, the threshold k*, held out, sharded, on Ray) and `merge` (its
shards into one result); each declares its options beside the function that runs it."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    EVAL_ITEMS,
    add_common,
    add_items,
    add_memory,
    add_metric,
    eval_items_check,
    load_case_and_model,
    one_evaluation_choice,
    planned_batch_size,
    print_report,
    warn_if_no_failure,
)
from surgeon.cli.registry import command
from surgeon.errors import SurgeonError

def _threshold_options(p) -> None:
    add_common(p, out_help="where the search, its checkpoints (for --resume) and results go (default: print only; "
                        "the checkpoints then live in a temporary folder)")
    add_memory(p)
    p.add_argument("--layer", type=cli_types.layer, help="candidate heads: every head of this layer (or pick with --heads)")
    p.add_argument("--heads", help="candidate heads: 0,2,5 (of --layer) or L1H0,L2H3")
    p.add_argument("--groups", default="even,odd",
                   help="built-in groups to search within: even,odd,first_half,second_half,random (a seeded random half, "
                        "a control) or none (default: even,odd)")
    p.add_argument("--groups-file", type=Path, help='JSON {"name": ["L1H0", ...], ...}: your own groups')
    p.add_argument("--grid", help="two groups A,B: also search mixed subsets (i heads from A, j from B)")
    p.add_argument("--budget", type=cli_types.positive, default=20000,
                   help="per size k: enumerate all C(n, k) subsets up to this many, else sample this many (default 20000)")
    p.add_argument("--grid-budget", type=cli_types.positive, default=200, help="subsets per grid cell (default 200)")
    p.add_argument("--item-rate", type=cli_types.fraction, default=1.0,
                   help="a subset repairs when it fixes at least this fraction of items (default 1.0: all)")
    p.add_argument("--x", type=cli_types.fraction, default=0.5,
                   help="threshold k*: the smallest k where at least this fraction of subsets repairs (default: 0.5)")
    p.add_argument("--component", default="z", choices=["z", "o_slices", "q", "k", "v"],
                   help="what a head's patch replaces: z (head output before W_O), o_slices (its slice after W_O), "
                        "q, k or v (its query, key or value input) (default: z)")
    add_items(p)
    add_metric(p)
    p.add_argument("--chunk", type=cli_types.positive, default=256, help="subsets per saved chunk (default 256)")
    p.add_argument("--shard", help="i/n: evaluate only every n-th chunk (merge shards with surgeon merge)")
    p.add_argument("--resume", action="store_true", help="continue the search saved in --out")
    p.add_argument("--generate", type=cli_types.nonnegative, default=0, metavar="N",
                   help="also check the minimal subsets and all candidates by greedy generation of N tokens")
    p.add_argument("--holdout", type=cli_types.held_share, metavar="FRAC",
                   help="search on a seeded, tag-stratified share of the items and evaluate each family's best subset "
                        "per size on the held-out FRAC of them (e.g. 0.5): held-out rates beside the in-sample ones")
    p.add_argument("--folds", type=cli_types.positive, metavar="K",
                   help="cross-validate: K searches, each on all but one fold of the items (seeded, stratified by tag) "
                        "with its best subsets evaluated on that fold; prints k* per fold, how often each subset is "
                        "the best of its size and the held-out rate per fold")
    p.add_argument("--eval-items", metavar="N|FILE",
                   help="search on every item and evaluate each family's best subset per size on these: " + EVAL_ITEMS)
    p.add_argument("--eval", action="append", metavar="SUBSET",
                   help="no search: evaluate this named subset (L0H4,L0H6) on the items, as the search patches; "
                        "repeat for several")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run the chunks on Ray workers: alone, a local cluster on this machine; with an address "
                        "(auto, or HOST:6379 of `ray start --head`) that cluster (needs pip install -e \".[ray]\")")
    p.add_argument("--ray-workers", type=cli_types.positive, metavar="N",
                   help="Ray workers, each loading the model once (default: one per GPU of the cluster, else per CPU)")


@command('threshold', "search head subsets that repair: fraction repairing per size k, "
         "threshold k*, minimal subsets, per-head necessity", _threshold_options)
def cmd_threshold(args) -> int:
    groups, spec, grid, ray = _search_inputs(args)
    one_evaluation_choice(args)
    _refuse_clashes(args)
    out = args.out  # None: print only (threshold_search keeps its checkpoints in a temporary folder)
    case, model, device = load_case_and_model(args, out=out, check=lambda c: eval_items_check(args, c))
    if args.eval:
        from surgeon.analyses.heldout import evaluate_subsets

        rates = evaluate_subsets(case, model, args.eval, component=args.component, bad=args.bad, tag=args.tag,
                                 batch_size=args.batch_size)
        from surgeon.reports.threshold_view import subset_rates_text

        print(subset_rates_text(rates, case, args.bad, args.tag))
        return 0
    if args.generate:  # refused before the search, not after it
        from surgeon.analyses.generation import check_generation
        from surgeon.case.select import pick_items

        check_generation(case, model, pick_items(case, args.tag)[1], args.generate)
    warn_if_no_failure(args, case, model)
    from surgeon.analyses import planning

    batch = planned_batch_size(args, planning.plan_threshold, case, model, args.layer or 0, args.chunk, args.chunk)
    search = dict(component=args.component, batch_size=batch, layer=args.layer, heads=args.heads, groups=groups,
                  groups_spec=spec, grid=grid, budget=args.budget, grid_budget=args.grid_budget,
                  item_rate=args.item_rate, x=args.x, chunk=args.chunk, seed=args.seed, tag=args.tag, bad=args.bad)
    if args.folds is not None:
        from surgeon.analyses.heldout import threshold_folds

        return print_report(args, threshold_folds(case, model, folds=args.folds, **search), case, device)
    if args.holdout is not None or args.eval_items is not None:
        from surgeon.analyses.heldout import threshold_heldout

        r = threshold_heldout(case, model, holdout=args.holdout or 0.5, eval_items=args.eval_items, out=out,
                              progress=True, **search)
        return print_report(args, r, case, device)
    return _search(args, case, device, model, out, ray, search)


def _search_inputs(args):
    """The search's groups, groups file, grid and Ray options read from the command line (refused before anything
    loads where they cannot be read, or where --out cannot hold the search)."""
    if not args.out and (args.resume or args.shard):
        raise SurgeonError(f"{'--resume' if args.resume else '--shard'} needs the search's folder", field="--out",
                           fix="give --out DIR (the folder the search writes its checkpoints to)")
    from surgeon.search.subsets import read_groups

    out = args.out  # None: print only (threshold_search keeps its checkpoints in a temporary folder)
    if out is not None and (out / "parts").exists() and not args.resume and not args.shard:
        raise SurgeonError(f"{out} already holds a search", field="--out",
                           fix="add --resume to continue it, or choose another --out")
    groups = [] if args.groups in ("", "none") else [g.strip() for g in args.groups.split(",") if g.strip()]
    spec = read_groups(args.groups_file) if args.groups_file else None
    grid = None
    if args.grid:
        grid = tuple(g.strip() for g in args.grid.split(","))
        if len(grid) != 2:
            raise SurgeonError("--grid takes two group names", field="--grid", fix="e.g. --grid even,odd")
    ray = None
    if args.ray:
        from surgeon.search.ray import RayOptions, import_ray

        import_ray()
        if args.ray_workers is not None and args.ray_workers < 1:
            raise SurgeonError(f"--ray-workers {args.ray_workers} must be at least 1", field="--ray-workers",
                               fix="e.g. --ray-workers 2")
        ray = RayOptions(address=None if args.ray == "local" else args.ray, workers=args.ray_workers,
                         threads=args.threads or 1)
    return groups, spec, grid, ray


def _refuse_clashes(args) -> None:
    """Options that do not combine with --folds, --eval, --holdout or --eval-items, refused with which and why."""
    if args.folds is not None and (args.eval or args.shard or args.resume or args.ray or args.generate or args.out):
        raise SurgeonError("--folds runs its own searches in one process and prints them", field="--folds",
                           fix="run --folds on its own (without --eval, --out, --shard, --resume, --ray, --generate)")
    if args.eval or args.holdout is not None or args.eval_items is not None:
        clash = [o for o, on in (("--shard", args.shard), ("--resume", args.resume), ("--ray", args.ray),
                                 ("--generate", args.generate)) if on]
        if args.eval and (args.holdout is not None or args.eval_items is not None):
            clash.insert(0, "--holdout" if args.holdout is not None else "--eval-items")
        if args.eval and args.out:
            clash.append("--out")
        if clash:
            what = "--eval" if args.eval else ("--holdout" if args.holdout is not None else "--eval-items")
            raise SurgeonError(f"{what} does not combine with {clash[0]}", field=what,
                               fix=f"run {what} on its own (--eval prints the named subsets' rates; --holdout runs one "
                                   "search in one process)")
        for name in args.eval or ():
            if not all(re.fullmatch(r"\s*L\d+H\d+\s*", h) for h in name.split(",")):
                raise SurgeonError(f"cannot read the subset {name!r}", field="--eval",
                                   fix="name heads with their layers: --eval L0H4,L0H6")


def _search(args, case, device, model, out, ray, search: dict) -> int:
    """The search itself (checkpointed in `out`, sharded, on Ray), its text and its files; an interrupted search
    keeps its partial results."""
    from surgeon.analyses.threshold import Interrupted, threshold_search
    from surgeon.reports.threshold_view import save_threshold, threshold_text

    try:
        r = threshold_search(case, model, out=out, shard=args.shard, generate=args.generate, progress=True, ray=ray,
                             **search)
    except Interrupted as e:
        from surgeon.results import reset_interrupts

        reset_interrupts()  # the signal arrived where it was meant to: the partial results are kept on purpose
        print(threshold_text(e.partial))
        if out is None:
            print("\ninterrupted (to continue an interrupted search later, give it --out)", file=sys.stderr)
            return 130
        save_threshold(out, e.partial, case, args, device)
        print(f"\ninterrupted: partial results in {out}; continue with --resume", file=sys.stderr)
        return 130
    if r is None:
        print(f"shard {args.shard} done: parts in {out}/parts; merge the shards with: surgeon merge DIR... --out DIR")
        return 0
    print(threshold_text(r))
    if out is not None:
        save_threshold(out, r, case, args, device)
        print(f"\nwrote {out}/results.json, manifest.json, subsets.csv, threshold.png")
    return 0


def _merge_options(p) -> None:
    p.add_argument("dirs", nargs="+", type=Path, help="the --out directories of the shards")
    p.add_argument("--out", type=cli_types.directory, required=True, help="write the merged results.json, subsets.csv and figure here")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


@command('merge', "merge threshold shards into the result one run gives", _merge_options)
def cmd_merge(args) -> int:
    from surgeon.reports.threshold_view import save_threshold, threshold_text
    from surgeon.search.shards import merge

    r = merge(args.dirs, args.out)
    save_threshold(args.out, r, None, args, None)
    print(threshold_text(r))
    print(f"\nmerged {len(args.dirs)} shards into {args.out}")
    return 0
