"""What every command shares: the shipped cases, layers and devices from the command line, case -> model,
and printing (and with --out saving) a report."""
from __future__ import annotations

import argparse
import re

from surgeon.cli import types as cli_types
from surgeon.errors import SurgeonError, did_you_mean, warn
from surgeon.models.devices import device_of
from surgeon.models.loading import BRIDGE, resolve, shape
from surgeon.search.subsets import BUILTIN_GROUPS, parse_units
from surgeon.case.reading import read_case
from surgeon.case.select import pick_bad, pick_items
from surgeon.case.shipped import DEFAULT_CASE, shipped_case


LOADERS = ("hooked", "bridge")


def add_common(p: argparse.ArgumentParser, case: bool = True,
            out_help: str = "write results.json, manifest.json, figures and tables here (default: print only)") -> None:
    if case:
        p.add_argument("case", nargs="?", default=DEFAULT_CASE, type=shipped_case,
                       help=f"case file, or the name of a shipped case (see `surgeon cases`; default: {DEFAULT_CASE})")
    p.add_argument("--model", help="run the case on this model instead (organism:NAME, a checkpoint directory, "
                                   "or a Hugging Face name in the local cache)")
    p.add_argument("--loader", choices=LOADERS, default="hooked",
                   help="how a Hugging Face checkpoint loads: hooked (TransformerLens's HookedTransformer, "
                        "converted) or bridge (TransformerLens's TransformerBridge over the checkpoint's own "
                        "modules; the same as giving the model as bridge:NAME_OR_DIR) (default: hooked)")
    p.add_argument("--out", type=cli_types.directory, help=out_help)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 (default: float32)")
    p.add_argument("--n-devices", type=cli_types.positive, default=1,
                   help="split the model's layers over this many GPUs (TransformerLens n_devices; default 1)")
    p.add_argument("--batch-size", type=cli_types.positive, default=256,
                   help="rows per forward pass (default: 256); patched runs that recompute only the last positions "
                        "fit proportionally more rows in the same memory")
    p.add_argument("--seed", type=cli_types.bounded(0, 2**32 - 1), default=0,
                   help="random seed, 0 .. 2^32-1 (default: 0)")
    p.add_argument("--threads", type=cli_types.positive, default=None,
                   help="CPU threads for torch, at most (default: torch's choice); fewer while other processes hold "
                        "cores (SURGEON_ADAPT_THREADS=0 keeps them)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def add_memory(p: argparse.ArgumentParser) -> None:
    """--max-memory, for the commands that plan their memory before the work."""
    p.add_argument("--max-memory", type=cli_types.memory_size, default=None,
                   help="memory the run may use on its device, weights included, e.g. 80GB, 40GiB (default: what is "
                        "free there): the peak is predicted, the batch size lowered to fit, and the run refused before "
                        "the work when batch size 1 does not")


def add_items(p: argparse.ArgumentParser) -> None:
    """Which failing format and which items an analysis runs on."""
    p.add_argument("--bad", help="which failing format (default: the case's first)")
    p.add_argument("--tag", help="only items with this tag ('all' for every item; default: the case's focus)")


def add_metric(p: argparse.ArgumentParser) -> None:
    """What an item's score measures, instead of the case's metric."""
    from surgeon.case.metrics import METRICS

    p.add_argument("--metric", choices=list(METRICS),
                   help="what an item's score measures: logprob (log P(correct) - log P(incorrect)), logit (logit "
                        "difference), prob (probability difference), kl (-KL from the good format's next-token "
                        "distribution) (default: the case's metric, else logprob; a function is a case field)")


MAX_LAYERS = 100_000  # a layer number past this is a typo, not a model


def parse_layers(text: str | None):
    if text is None:
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                if int(b) < int(a):
                    raise SurgeonError(f"layer range {part!r} runs backwards", field="--layers",
                                       fix=f"write it low to high: {b}-{a}")
                if int(b) >= MAX_LAYERS:
                    raise SurgeonError(f"layer range {part!r} runs past any model's layers", field="--layers",
                                       fix="give the layers of your model, e.g. 0-31")
                out += range(int(a), int(b) + 1)
            elif part:
                out.append(int(part))
    except ValueError:
        raise SurgeonError(f"cannot read layers {text!r}", field="--layers", fix="write e.g. 3 or 0,2,5 or 0-4") from None
    if not out:
        raise SurgeonError(f"--layers {text!r} names no layer", field="--layers",
                           fix="write e.g. 3 or 0,2,5 or 0-4, or leave --layers out for every layer")
    if any(L < 0 for L in out):
        raise SurgeonError(f"layers are numbered from 0, got {text!r}", field="--layers", fix="write e.g. 3 or 0,2,5 or 0-4")
    if len(set(out)) < len(out):
        twice = sorted({L for L in out if out.count(L) > 1})
        warn(f"--layers {text} names layer{'s' if len(twice) > 1 else ''} {', '.join(map(str, twice))} more than "
             "once; each layer runs once")
        out = list(dict.fromkeys(out))
    return out


def check_options(args, case) -> None:
    """Every option that the case and the model's config decide, checked before the tokenizer or torch loads:
    --bad and --tag (with did-you-mean), --component, --layers, --layer and --heads against the model's config."""
    for option, pick in (("bad", pick_bad), ("tag", pick_items)):
        if getattr(args, option, None) is not None:
            try:
                pick(case, getattr(args, option))
            except SurgeonError as e:
                raise SurgeonError(e.message, where=case.source, field=f"--{option}", fix=e.fix) from None
    layers = parse_layers(getattr(args, "layers", None))
    if case.model is None:
        return
    try:
        shp = shape(resolve(case.model))
    except SurgeonError:
        return  # the case check that follows says what is wrong with the model
    top = shp.n_layers - 1
    if getattr(args, "component", None) == "mlp_out" and shp.attn_only:
        raise SurgeonError("the model is attention-only and has no MLP", where=case.source, field="--component",
                           fix="choose a component the model has, e.g. --component z")
    for L in layers or ():
        if L > top:
            raise SurgeonError(f"layer {L} is out of range: the model has layers 0..{top}", field="--layers",
                               fix=f"use layers between 0 and {top}, e.g. --layers 0-{top}")
    layer = getattr(args, "layer", None)
    if layer is not None and layer > top:
        raise SurgeonError(f"layer {layer} is out of range: the model has layers 0..{top}", field="--layer",
                           fix=f"use a layer between 0 and {top}")
    heads = getattr(args, "heads", None)
    if heads == "all" and getattr(args, "command", None) == "repair":
        heads = None
    if heads is not None and getattr(args, "command", None) in ("threshold", "blend", "attention", "report", "repair"):
        n = shp.n_kv_heads if getattr(args, "component", "z") in ("k", "v") else shp.n_heads
        if args.command == "attention":  # L1H0 names only; the analysis says what else is wrong
            heads = ",".join(h for h in heads.split(",") if re.fullmatch(r"\s*L\d+H\d+\s*", h)) or None
        if heads is not None:
            parse_units(heads, layer, shp.n_layers, n)
    groups = getattr(args, "groups", None)
    if getattr(args, "command", None) == "report" and groups and groups.strip() != "none":
        for g in (x.strip() for x in groups.split(",") if x.strip()):
            if g not in BUILTIN_GROUPS:
                raise SurgeonError(f"unknown group {g!r}{did_you_mean(g, BUILTIN_GROUPS)}", field="--groups",
                                   fix=f"use {', '.join(BUILTIN_GROUPS)} or none")


def setup(args):
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    torch.manual_seed(getattr(args, "seed", 0))


def load_case_and_model(args, check=None, out=None):
    """case -> model, for the analysis commands; `check(case)` refuses bad input before the model loads."""
    from surgeon.models.checks import check_case_against_model
    from surgeon.models.loading import load_model
    from surgeon.results import check_out

    check_out(out if out is not None else getattr(args, "out", None))
    case = read_case(args.case, model=args.model)  # before torch is imported: a bad case file is refused at once
    if getattr(args, "loader", "hooked") == "bridge" and case.model and not case.model.startswith(BRIDGE):
        from dataclasses import replace

        from surgeon.case.case import content_digest

        case = replace(case, model=BRIDGE + case.model)  # as if the file named it so (messages point at the file)
        case = replace(case, read_as=content_digest(case))
    check_options(args, case)  # the options against the case and the model's config: well under a second
    if case.model is not None:
        check_case_against_model(case)  # its tokenizer: answers, templates, context
    if getattr(args, "metric", None):
        from dataclasses import replace

        case = replace(case, metric=args.metric)
    if case.model is None:
        raise SurgeonError("the case names no model", where=case.source, field="model",
                           fix="run it with --model (organism:NAME, a checkpoint directory or a Hugging Face name), or "
                               "add model=... to the case")
    if check is not None:
        check(case)
    setup(args)
    device = device_of(args.device)
    if args.n_devices > 1 and not device.startswith("cuda"):
        raise SurgeonError(f"--n-devices {args.n_devices} spreads layers over GPUs, but the device is {device}",
                           field="--n-devices", fix="use --device cuda with as many GPUs, or leave --n-devices at 1")
    model = load_model(case.model, device=device, dtype=args.dtype, n_devices=args.n_devices)
    return case, model, device


def warn_if_no_failure(args, case, model) -> None:
    """A clear warning (stderr) before patch, threshold and circuit work on a format that does not fail."""
    from surgeon.analyses.diagnose import failure_check

    why = failure_check(case, model, bad=getattr(args, "bad", None), tag=getattr(args, "tag", None),
                        batch_size=args.batch_size)
    if why:
        warn(why)


def print_report(args, result, case, device, text: str | None = None) -> int:
    """Print a result's report (its view's, or `text`); with --out, save what `result.save` saves (results,
    manifest, figures, tables) with the command line's options, and say so."""
    from surgeon.reports import text as report
    from surgeon.show import view_of

    v = view_of(result)
    print(v.text(result) if text is None else text)
    if args.out:
        report.save(args.out, v.command, result, case, args, device, figures=v.figures,
                    tables={n: rows(result) for n, rows in v.tables.items()})
        print(f"\nwrote {args.out}/" + ", ".join(["results.json", "manifest.json", *v.figures, *v.tables]))
    return 0


def layers_of(args, case):
    """--layers if given, else the case's default layers, else None (all)."""
    layers = parse_layers(args.layers)
    return list(case.layers) if layers is None and case.layers is not None else layers


def planned_batch_size(args, plan, case, model, *a, **kw) -> int:
    """The batch size that fits --max-memory by `plan` (one of surgeon.analyses.planning's), its plan printed in one
    line (stderr) before the work; exit 2 when none fits."""
    from surgeon.analyses.planning import planned_batch_size as planned

    return planned(plan, case, model, *a, batch_size=args.batch_size, max_memory=args.max_memory,
                   bad=getattr(args, "bad", None), direction=getattr(args, "direction", "denoise"),
                   tag=getattr(args, "tag", None), **kw)


def one_evaluation_choice(args) -> None:
    """At most one of --holdout, --eval-items and --folds (each chooses the evaluation items)."""
    chosen = [o for o, on in (("--holdout", getattr(args, "holdout", None) is not None),
                              ("--eval-items", getattr(args, "eval_items", None) is not None),
                              ("--folds", getattr(args, "folds", None) is not None)) if on]
    if len(chosen) > 1:
        raise SurgeonError(f"{chosen[0]} and {chosen[1]} are two ways to choose the evaluation items", field=chosen[1],
                           fix="give one: --holdout FRAC, --eval-items N|FILE or --folds K")

# what --eval-items takes, in the help of every command that has it
EVAL_ITEMS = ("N fresh items from the case's draw (none equal to its own items), or the path of a case file whose "
              "items fit the formats")


def add_patching(p: argparse.ArgumentParser, components) -> None:
    """The options of a patching command: layers, component, direction, failing format and items."""
    add_common(p)
    p.add_argument("--layers", help="layers to patch, e.g. 0,1,2 or 0-2 (default: the case's, else all)")
    p.add_argument("--component", default="z", choices=list(components), help="what to patch (default: z)")
    p.add_argument("--direction", default="denoise", choices=["denoise", "noise"],
                   help="denoise: good format into the failing one (repair); noise: the reverse (default: denoise)")
    add_items(p)
    add_metric(p)


def eval_items_check(args, case) -> None:
    """--eval-items and --folds checked against the case before the model loads (fresh items drawn, a case file
    read, the folds dealt)."""
    if getattr(args, "eval_items", None) is not None:
        from surgeon.analyses.heldout import eval_items_of

        eval_items_of(case, args.eval_items, args.seed)
    if getattr(args, "folds", None) is not None:
        from surgeon.analyses.heldout import fold_items
        from surgeon.case.select import pick_items

        fold_items(pick_items(case, args.tag)[1], args.folds, args.seed)


def int_list(text: str | None, field: str):
    if text is None:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SurgeonError(f"cannot read {text!r}", field=field, fix="write e.g. 0,2,4") from None
    if not out:  # an empty list would run on nothing and print "0 items"
        raise SurgeonError(f"{text!r} names no item", field=field, fix="write e.g. 0,2,4, or leave it out")
    return out


def ig_steps_ignored(args, uses: bool) -> None:
    """A warning (before anything loads) where --ig-steps was given to a method that ignores it."""
    if "ig_steps" in getattr(args, "given", ()) and not uses:
        warn(f"--ig-steps {args.ig_steps} is ignored: --method {args.method} does not integrate")
