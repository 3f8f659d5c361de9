"""`surgeon sae ...`: the SAE commands (train, quality, overlap, amplified, heads, repair), thin over
`surgeon.sae` and `surgeon.analyses.sae_*`."""
from __future__ import annotations

from pathlib import Path

from surgeon.circuits.methods import FEATURE_METHODS
from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    add_common,
    add_items,
    add_memory,
    load_case_and_model,
    one_evaluation_choice,
    parse_layers,
    print_report,
)
from surgeon.cli.registry import command
from surgeon.errors import SurgeonError, optional_import


def _sae_options(p) -> None:
    common, items = add_common, add_items
    ssub = p.add_subparsers(dest="action", required=True)

    def sae_opts(q, layers=True):
        common(q)
        q.add_argument("--sae-release", help="a sae-lens pretrained release, e.g. llama_scope_lxm_8x (local HF cache only)")
        q.add_argument("--sae-id", help="the SAE id within the release; {layer} is replaced, e.g. 'l{layer}m_8x'")
        q.add_argument("--sae-dir", help="local SAE directories (sae-lens layout); {layer} is replaced, "
                                         "e.g. saes/blocks.{layer}.hook_mlp_out (default: the case's saes)")
        if layers:
            q.add_argument("--layers", help="layers, e.g. 7,10 or 0-31 (default: every layer with an SAE)")

    q = ssub.add_parser("train", help="train SAEs on the case's text in every format with sae-lens's trainer")
    common(q)
    q.add_argument("--layers", help="layers (default: all)")
    q.add_argument("--component", default="mlp_out", choices=["mlp_out", "attn_out", "resid_pre", "resid_post"],
                   help="which activation the SAEs read (default: mlp_out, as Llama Scope's lxm SAEs)")
    q.add_argument("--k", type=cli_types.positive, default=8, help="active features per token (TopK; default 8)")
    q.add_argument("--expansion", type=cli_types.positive, default=4, help="features per input dimension (default 4)")
    q.add_argument("--steps", type=cli_types.positive, default=2000, help="training steps of 256 activations (default 2000)")
    q.add_argument("--sae-out", type=cli_types.directory, help="write SAEs under this directory, one folder per hook "
                                                 "(default: the organism's SAE folder for organism models)")

    q = ssub.add_parser("quality", help="L0, explained variance, MSE, dead features and the score shift when the "
                                        "reconstruction replaces the activation")
    sae_opts(q)

    q = ssub.add_parser("overlap", help="per layer: top-k feature overlap, Jaccard and weighted Jaccard between the "
                                        "good and each failing format, with intervals over items")
    sae_opts(q)
    q.add_argument("--top-k", type=cli_types.positive, default=20, help="features per set (default 20, the paper's)")
    q.add_argument("--position", default="last", choices=["last", "aligned"],
                   help="last prompt token (default) or every position the case's align matches")
    items(q)

    q = ssub.add_parser("amplified", help="features active in both formats ranked by activation ratio failing/good, "
                                          "and features active in one format only")
    sae_opts(q, layers=False)
    q.add_argument("--layer", type=cli_types.layer, required=True, help="the SAE's layer")
    q.add_argument("--position", default="last", choices=["last", "aligned"], help="default: last")
    q.add_argument("--labels", type=Path, help="JSON {feature: label} to print beside features")
    q.add_argument("--top", type=cli_types.positive, default=20, help="features to list (default 20)")
    q.add_argument("--min-items", type=cli_types.positive, help="rank only features active in both formats on at least this many "
                                                  "items (default: 10%% of the items, at least 3)")
    items(q)

    q = ssub.add_parser("heads", help="how much each head (and head group), patched from the good format into the "
                                      "failing one, moves the top SAE features")
    sae_opts(q, layers=False)
    q.add_argument("--layer", type=cli_types.layer, required=True, help="the heads' layer")
    q.add_argument("--sae-layer", type=cli_types.layer, required=True, help="the SAE's layer (at or after --layer)")
    q.add_argument("--top", type=cli_types.positive, default=10, help="features: the ones differing most between formats (default 10)")
    q.add_argument("--groups", default="even,odd", help="head groups to patch together (default: even,odd)")
    items(q)

    q = ssub.add_parser("repair", help="feature-level repair: attribution over all features, then subsets of the top "
                                       "ones, against patching the whole activation")
    sae_opts(q, layers=False)
    q.add_argument("--layer", type=cli_types.layer, required=True, help="the SAE's layer")
    q.add_argument("--top", type=cli_types.positive, default=8, help="features to search subsets of (default 8, at most 24)")
    q.add_argument("--budget", type=cli_types.positive, default=2000, help="subsets per size (default 2000)")
    q.add_argument("--item-rate", type=cli_types.fraction, default=1.0,
                   help="a subset repairs when it fixes at least this fraction of items, as in threshold (default 1.0: all)")
    q.add_argument("--direction", default="denoise", choices=["denoise", "noise"], help="default: denoise")
    add_heldout(q, "choose the features", "patch them")
    items(q)


def add_heldout(q, chosen: str, measured: str) -> None:
    """--holdout and --eval-items: `chosen` ("choose the features") on discovery items, `measured` on the others."""
    q.add_argument("--holdout", type=cli_types.held_share, metavar="FRAC",
                   help=f"{chosen} on a seeded, tag-stratified share of the items and {measured} on the held-out FRAC "
                        "(e.g. 0.5; --seed seeds it)")
    q.add_argument("--eval-items", metavar="N|FILE",
                   help=f"{chosen} on every item and {measured} on these: N fresh items from the case's draw, or the "
                        "path of a case file whose items fit the formats")


def _feature_circuit_options(q) -> None:
    """`surgeon feature-circuit`: SAE features and error terms as the nodes of a circuit, per format."""
    add_common(q)
    add_memory(q)
    q.add_argument("--sae-release", help="a sae-lens pretrained release (local HF cache only)")
    q.add_argument("--sae-id", help="the SAE id within the release; {layer} is replaced")
    q.add_argument("--sae-dir", help="local SAE directories (sae-lens layout); {layer} is replaced (default: the case's)")
    q.add_argument("--layers", help="the SAEs' layers, e.g. 0,2 or 0-2 (default: every layer with an SAE)")
    q.add_argument("--method", default="ig", choices=list(FEATURE_METHODS),
                   help="node attribution (default ig): " + "; ".join(f"{k}: {v}" for k, v in FEATURE_METHODS.items()))
    q.add_argument("--steps", type=cli_types.bounded(1, 64), default=5, action=cli_types.Given,
                   help="integration steps of ig and ig-marks (default 5)")
    q.add_argument("--verify", type=cli_types.nonnegative, default=20,
                   help="top nodes whose attribution is checked by exact patching, per direction (default 20)")
    q.add_argument("--faithfulness", type=cli_types.fraction,
                   help="the smallest top-k circuit with at least this faithfulness (default 0.9)")
    q.add_argument("--threshold", type=cli_types.fraction,
                   help="instead: every node whose |attribution| is at least this fraction of the gap")
    q.add_argument("--edge-rule", default="all", choices=["all", "marks"],
                   help="which entries of a downstream node its edges are computed from: all (every item and aligned "
                        "position) or marks (Marks et al.'s: the entries whose per-example effect reaches --threshold) "
                        "(default: all)")
    q.add_argument("--threshold-over", default="mean", choices=["mean", "example"],
                   help="what --threshold applies to: the attribution (mean over items, default) or a node's largest "
                        "effect on one item at one aligned position (example: surgeon's own rule; Marks et al. "
                        "threshold nodes on the aggregated effect, as mean does, and use the per-example threshold "
                        "only to choose which downstream entries their edges are computed from)")
    q.add_argument("--by-position", action="store_true",
                   help="a node per feature and per error term at each aligned position (default: one node patched at "
                        "every aligned position at once)")
    q.add_argument("--exact", default="joint", choices=["joint", "per-position"],
                   help="a node's exact effect: patched at every aligned position at once (joint, default) or at one "
                        "position at a time, the effects summed (per-position: Marks et al.'s)")
    q.add_argument("--export", nargs="+", type=Path, default=[], metavar="FILE",
                   help="write the failing format's circuit; format from the suffix: .json .graphml .gexf .dot .tex "
                        ".svg .pdf .png")
    add_heldout(q, "find the circuits", "measure them")
    add_items(q)


@command("feature-circuit", "the feature circuit (SAE features and each SAE's error term) of the failing format and "
         "of the working one, their difference and the repair it suggests", _feature_circuit_options)
def run_feature_circuit(args) -> int:

    if "steps" in getattr(args, "given", ()) and not args.method.startswith("ig"):
        raise SurgeonError(f"--steps {args.steps} integrates, but --method {args.method} does not", field="--steps",
                           fix="leave out --steps, or use --method ig / ig-marks")

    if args.faithfulness is not None and args.threshold is not None:
        raise SurgeonError("give --faithfulness or --threshold, not both", field="--threshold",
                           fix="--faithfulness F keeps the smallest circuit with faithfulness >= F; --threshold T "
                               "every node with |attribution| >= T of the gap")
    if args.edge_rule == "marks" and args.threshold is None:
        raise SurgeonError("--edge-rule marks chooses downstream entries by the node threshold, and none is given",
                           field="--edge-rule", fix="give --threshold T (a fraction of the gap), or leave --edge-rule out")
    if args.threshold_over != "mean" and args.threshold is None:
        raise SurgeonError(f"--threshold-over {args.threshold_over} needs a threshold", field="--threshold-over",
                           fix="give --threshold T (a fraction of the gap), or leave --threshold-over out")
    from surgeon.circuits.export import check_targets

    check_targets(args.export)  # refuse before loading anything
    mib = [f for f in args.export if str(f).endswith(".mib.json")]
    if mib:
        raise SurgeonError(f"{mib[0]}: a feature circuit has no EAP-IG / MIB form", field="--export",
                           fix="export .json, .graphml, .gexf, .dot, .tex, .svg, .pdf or .png")
    layers = parse_layers(args.layers)
    one_evaluation_choice(args)
    held = args.holdout is not None or args.eval_items is not None

    def check(case):  # the SAEs on disk, and the split (or the evaluation items), before the model loads
        _source(args, case).check_available(layers)
        if held:
            from surgeon.analyses.heldout import eval_split

            eval_split(case, args.tag, args.holdout, args.seed, args.eval_items)

    case, model, device = load_case_and_model(args, check=check)
    import surgeon.api as api

    r = api.feature_circuit(case, model, layers=layers, method=args.method, steps=args.steps, verify=args.verify,
                            faithfulness=args.faithfulness, threshold=args.threshold, bad=args.bad, tag=args.tag,
                            batch_size=args.batch_size, sae_release=args.sae_release, sae_id=args.sae_id,
                            sae_dir=args.sae_dir, by_position=args.by_position, max_memory=args.max_memory,
                            device=device, dtype=args.dtype, progress=True, holdout=args.holdout,
                            eval_items=args.eval_items, seed=args.seed, exact=args.exact,
                            threshold_over=args.threshold_over, edge_rule=args.edge_rule)
    code = print_report(args, r, case, device)
    if args.export:
        (r.search if held else r).export(*args.export)
        print("exported " + ", ".join(str(f) for f in args.export))
    return code


def _source(args, case):
    from surgeon.sae.load import SAESource

    return SAESource.from_case(case, args.sae_release, args.sae_id, args.sae_dir)


@command("sae", "SAE features across formats (sae-lens): train, quality, overlap, amplified, heads, repair",
         _sae_options)
def run(args) -> int:

    def sae_first(case):  # sae-lens, the SAEs named and on disk, and a held-out split, before the model loads
        optional_import("sae_lens", f"surgeon sae {args.action}")
        if args.action != "train":
            layers = [args.sae_layer] if args.action == "heads" else (
                [args.layer] if getattr(args, "layer", None) is not None else parse_layers(getattr(args, "layers", None)))
            _source(args, case).check_available(layers)
        if getattr(args, "holdout", None) is not None or getattr(args, "eval_items", None) is not None:
            from surgeon.analyses.heldout import eval_split
            one_evaluation_choice(args)
            eval_split(case, args.tag, args.holdout, args.seed, args.eval_items)

    case, model, device = load_case_and_model(args, check=sae_first)
    from surgeon.reports.feature_view import amplified_text
    from surgeon.reports.text import save

    if args.action == "train":
        return _train(args, case, model, device, save)
    import surgeon.api as api

    sae = dict(sae_release=args.sae_release, sae_id=args.sae_id, sae_dir=args.sae_dir, device=device, dtype=args.dtype)
    if args.action == "quality":
        return _quality(args, case, model, device, save)
    if args.action == "overlap":
        r = api.sae_overlap(case, model, layers=parse_layers(args.layers), top_k=args.top_k, position=args.position,
                            bad=args.bad, tag=args.tag, batch_size=args.batch_size, **sae)
        return print_report(args, r, case, device)
    if args.action == "amplified":
        r = api.sae_amplified(case, model, layer=args.layer, position=args.position, labels=args.labels, top=args.top,
                              min_items=args.min_items, bad=args.bad, tag=args.tag, batch_size=args.batch_size,
                              **sae)
        return print_report(args, r, case, device, amplified_text(r, args.top))
    if args.action == "heads":
        r = api.sae_heads(case, model, layer=args.layer, sae_layer=args.sae_layer, top=args.top,
                          groups=[g for g in args.groups.split(",") if g.strip()], bad=args.bad, tag=args.tag,
                          batch_size=args.batch_size, **sae)
        return print_report(args, r, case, device)
    r = api.sae_repair(case, model, layer=args.layer, top=args.top, budget=args.budget, item_rate=args.item_rate,
                       direction=args.direction, bad=args.bad, tag=args.tag, batch_size=args.batch_size, progress=True,
                       holdout=args.holdout, eval_items=args.eval_items, seed=args.seed, **sae)
    return print_report(args, r, case, device)


def _quality(args, case, model, device, save) -> int:
    """`surgeon sae quality`: each SAE's L0, explained variance and the score shift when it replaces the
    activation."""
    from surgeon.sae.load import load_sae
    from surgeon.sae.quality import measure, quality_text
    from surgeon.sae.train import collect_activations
    from surgeon.sites.features import sae_hook

    source = _source(args, case)
    layers = source.layers(model.cfg.n_layers, parse_layers(args.layers))
    saes = {L: load_sae(source, L, device, args.dtype, model.cfg.d_model) for L in layers}
    hooks = {L: sae_hook(s) for L, s in saes.items()}
    acts = collect_activations(case, model, sorted(set(hooks.values())))
    qs = [measure(case, model, saes[L], L, hooks[L], acts[hooks[L]], source.describe(L), args.batch_size)
          for L in layers]
    print(quality_text(qs))
    if args.out:
        save(args.out, "sae-quality", qs, case, args, device)
        print(f"\nwrote {args.out}/results.json, manifest.json")
    return 0


def _train(args, case, model, device, report_fn) -> int:
    import shutil
    import tempfile

    from surgeon import organisms
    from surgeon.models.loading import resolve
    from surgeon.results import check_out
    from surgeon.sae.load import SAESource, load_sae, model_layers
    from surgeon.sae.quality import measure, quality_text
    from surgeon.sae.train import (
        TrainOptions,
        collect_activations,
        float_environment,
        install,
        save,
        train_sae,
    )

    out = args.sae_out
    if out is None:
        ref = resolve(case.model)
        if ref.kind != "organism":
            raise SurgeonError("where should the SAEs go?", field="--sae-out", fix="give --sae-out DIR")
        out = organisms.sae_dir(ref.name)
    check_out(out)  # a file, a read-only folder or another run writing there: refused before any training
    width = args.expansion * model.cfg.d_model
    if args.k >= width:
        raise SurgeonError(f"--k {args.k} active features is not below the dictionary's {width} features "
                           f"(--expansion {args.expansion} x d_model {model.cfg.d_model})", field="--k",
                           fix=f"use --k {max(1, width // 32)} or so, or a larger --expansion")
    layers = model_layers(model.cfg.n_layers, parse_layers(args.layers))
    hooks = {L: f"blocks.{L}.hook_{args.component}" for L in layers}
    acts = collect_activations(case, model, list(hooks.values()))
    opts = TrainOptions(expansion=args.expansion, k=args.k, steps=args.steps, seed=args.seed)
    from surgeon.models.loading import weights_sha256

    model_sha = weights_sha256(resolve(case.model))
    from tqdm.auto import tqdm

    qs = []
    Path(out).mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))  # every layer first, then all of them in at once
    try:
        for L in tqdm(layers, desc="training SAEs", unit="SAE"):
            sae = train_sae(acts[hooks[L]], hooks[L], opts, model_name=case.model)
            save(sae, staged / hooks[L], dict(case=case.name, model=case.model, model_sha256=model_sha,
                                              hook=hooks[L], component=args.component,
                                              n_activations=int(acts[hooks[L]].shape[0]), **opts.__dict__,
                                              float_environment=float_environment(),
                                              command=f"surgeon sae train {args.case} --layers {L} --component "
                                                      f"{args.component} --k {opts.k} --expansion {opts.expansion} "
                                                      f"--steps {opts.steps} --seed {opts.seed}"))
            inf = load_sae(SAESource(path=str(staged / hooks[L])), L, d_model=model.cfg.d_model)
            qs.append(measure(case, model, inf, L, hooks[L], acts[hooks[L]], str(Path(out) / hooks[L]),
                              args.batch_size))
        install(staged, Path(out), [hooks[L] for L in layers])
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    text = (f"trained {len(layers)} SAEs ({acts[hooks[layers[0]]].shape[0]:,} activations each, {opts}) into {out}\n"
            + quality_text(qs))
    result = {"sae_out": str(out), "layers": layers, "hooks": [hooks[L] for L in layers], "options": opts.__dict__,
              "quality": qs}
    print(text)
    if args.out:
        report_fn(args.out, "sae-train", result, case, args, device)
        print(f"\nwrote {args.out}/results.json, manifest.json")
    return 0
