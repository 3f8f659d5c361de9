"""What ships with surgeon: `cases` (the case files) and `organisms` (list, describe, retrain); each declares its
options beside the function that runs it."""
from __future__ import annotations

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    setup,
)
from surgeon.cli.registry import command
from surgeon.case.shipped import CASES_DIR
from surgeon.errors import SurgeonError

def _cases_options(p) -> None:
    p.add_argument("action", nargs="?", choices=["list"], help="list them (what `surgeon cases` does anyway)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


@command('cases', "the case files shipped with surgeon (copy one to start your own)", _cases_options)
def cmd_cases(args) -> int:
    import ast

    print(f"shipped cases (in {CASES_DIR.resolve()}; run one by name, e.g. `surgeon diagnose threshold_organism`):")
    for f in sorted(CASES_DIR.glob("*.py")):
        doc = (ast.get_docstring(ast.parse(f.read_text())) or "").strip().splitlines()
        print(f"  {f.stem:<22} {doc[0] if doc else ''}")
    return 0


def _organisms_options(p) -> None:
    osub = p.add_subparsers(dest="action", required=True)
    q = osub.add_parser("list", help="the organisms, their state and their measured facts")
    q.add_argument("--debug", action="store_true", help="show tracebacks")
    q = osub.add_parser("describe", help="an organism's planted mechanism, measured facts and ground truth")
    q.add_argument("name", help="the organism, e.g. induction")
    q.add_argument("--debug", action="store_true", help="show tracebacks")
    q = osub.add_parser("train", help="retrain (or rebuild) an organism deterministically and measure it")
    q.add_argument("name", help="the organism, e.g. decimal")
    q.add_argument("--out", type=cli_types.directory, help="write weights under OUT/NAME (default: the package's weights)")
    q.add_argument("--shrink", action="store_true", help="a few steps only (smoke test)")
    q.add_argument("--seed", type=cli_types.bounded(0, 2**32 - 1), default=0,
                   help="random seed, 0 .. 2^32-1 (default: 0)")
    q.add_argument("--device", default="cpu", help="device to train on (default: cpu)")
    q.add_argument("--threads", type=cli_types.positive, default=None, help="CPU threads for torch (default: torch's choice)")
    q.add_argument("--debug", action="store_true", help="show tracebacks")


@command('organisms', "list, describe or retrain the model organisms", _organisms_options)
def cmd_organisms(args) -> int:
    from surgeon import organisms

    if args.action == "list":
        print(f"{'organism':22s} {'weights':8s} what it is / what was measured")
        for name in organisms.names():
            s = organisms.spec(name)
            state = "present" if organisms.is_available(name) else "missing"
            print(f"organism:{name:13s} {state:8s} {s.description}")
            if state == "missing":
                print(f"{'':31s} run: surgeon organisms train {name}")
                continue
            try:
                lines = s.module.describe(organisms.facts(name))
            except KeyError:
                lines = [f"not measured yet; run: surgeon organisms train {name}"]
            for line in lines:
                print(f"{'':31s} {line}")
        return 0
    if args.name not in organisms.names():
        raise SurgeonError(f"unknown organism {args.name!r}", field="name", fix=f"use one of: {', '.join(organisms.names())}")
    if args.action == "describe":
        import json

        s = organisms.spec(args.name)
        print(f"organism:{args.name} - {s.description}\n")
        print((s.module.__doc__ or "").strip() + "\n")
        if not organisms.is_available(args.name):
            print(f"no weights; run: surgeon organisms train {args.name}")
            return 0
        f = organisms.facts(args.name)
        print("measured:")
        for line in s.module.describe(f):
            print(f"  {line}")
        print("\nground truth:\n" + json.dumps(organisms.ground_truth(args.name), indent=2))
        return 0
    setup(args)
    dest = organisms.train_organism(args.name, out_root=args.out, shrink=args.shrink, seed=args.seed,
                                    device=args.device, progress=True)
    print(f"saved {dest}")
    from surgeon.organisms.measure import measure

    facts, miss = measure(args.name, root=dest.parent, write=True)
    print(f"measured organism:{args.name}:")
    for line in organisms.spec(args.name).module.describe(facts):
        print(f"  {line}")
    print("  targets met" if not miss else "  targets MISSED: " + "; ".join(miss))
    return 0
