"""The `surgeon` command: a thin layer over the same functions a notebook calls.

Heavy libraries (torch, transformer-lens) are imported inside commands so `surgeon --help` is instant.
Bad input ends with one clear message and exit status 2; `--debug` shows the traceback.
"""
from __future__ import annotations

import argparse
import re
import os
import sys
from dataclasses import replace
from pathlib import Path

from surgeon.cli import types as cli_types
from surgeon.cli.common import (
    add_common,
    add_items,
    add_memory,
    add_metric,
    layers_of,
    one_evaluation_choice,
    load_case_and_model,
    planned_batch_size,
    print_report,
    setup,
    warn_if_no_failure,
)
from surgeon.cli.parser import Parser
from surgeon.errors import SurgeonError, warn
from surgeon.case.shipped import CASES_DIR
from surgeon.version import __version__

REPORT_STEPS = ("diagnose", "dla", "patch", "positions", "threshold", "blend", "circuit", "attention", "sinks",
                "sae")  # = analyses.pipeline.STEPS (a test checks)
REPORT_OPTIONAL = ("repair",)
# what --eval-items takes, in threshold's, circuit's and repair's help
EVAL_ITEMS = ("N fresh items from the case's draw (none equal to its own items), or the path of a case file whose "
              "items fit the formats")  # = analyses.pipeline.OPTIONAL_STEPS: run only when --steps names them
from surgeon.circuits.methods import SEMANTICS
from surgeon.case.grammar import BUDGET as SCAN_BUDGET
from surgeon.sites.ablations import ABLATIONS


def add_patching(p: argparse.ArgumentParser, components) -> None:
    """The options of a patching command: layers, component, direction, failing format and items."""
    add_common(p)
    p.add_argument("--layers", help="layers to patch, e.g. 0,1,2 or 0-2 (default: the case's, else all)")
    p.add_argument("--component", default="z", choices=list(components), help="what to patch (default: z)")
    p.add_argument("--direction", default="denoise", choices=["denoise", "noise"],
                   help="denoise: good format into the failing one (repair); noise: the reverse (default: denoise)")
    add_items(p)
    add_metric(p)


def build_parser() -> argparse.ArgumentParser:
    from surgeon.circuits.methods import (
        ATTRIBUTION_IG_STEPS,
        ATTRIBUTION_METHODS,
        MAX_IG_STEPS,
    )
    from surgeon.sites.nodes import COMPONENTS

    parser = Parser(prog="surgeon", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"surgeon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("diagnose", help="accuracy and score per format, with intervals: is the failure there?")
    add_common(p)
    add_metric(p)
    p.add_argument("--generate", type=cli_types.nonnegative, default=0, metavar="N",
                   help="also generate N tokens greedily per focus item and judge them (what the paper did)")

    p = sub.add_parser("scan", help="find where the model fails: formats composed from a grammar of parts (cues, "
                                    "separators, casing, instruction, few-shot, chat template) scored on the case's "
                                    "items; the worst and best formats, each part's effect, the minimal pair; held out")
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

    p = sub.add_parser("dla", help="direct logit attribution per head and layer, and the logit lens, in every "
                                   "format: the first look before patching")
    add_common(p)
    p.add_argument("--tag", help="only items with this tag ('all' for every item; default: the case's focus)")
    p.add_argument("--value-biases", default="per-head", choices=["per-head", "folded"],
                   help="per-head: each head's output includes its value bias (the raw weights); folded: moved into "
                        "the attention bias, as TransformerLens's default model (default: per-head)")
    p.add_argument("--lens-bias", default="included", choices=["included", "excluded"],
                   help="the logit lens with the unembedding bias (its last layer is the model's output) or without "
                        "it, as TransformerLens's (default: included)")

    p = sub.add_parser("encode", help="what the model reads: each item's tokens per format, the scored positions "
                                      "and answer tokens, and the aligned positions patching moves between")
    add_common(p)
    p.add_argument("--items", default="0,1,2", help="item indices among the items shown, e.g. 0,3 (default: 0,1,2)")
    p.add_argument("--tag", default="all", help="only items with this tag (default: all: every item)")
    p.add_argument("--bad", help="only this failing format (default: every failing format)")

    p = sub.add_parser("patch-positions", help="patch each unit of each layer at each aligned position alone "
                                               "(units x positions; --component resid_pre: the residual stream)")
    add_patching(p, COMPONENTS)

    p = sub.add_parser("attention", help="attention patterns of chosen heads on chosen items, every format side "
                                         "by side")
    add_common(p)
    p.add_argument("--heads", required=True, help="heads, e.g. L1H0,L1H1")
    p.add_argument("--items", default="0", help="item indices among the items analysed, e.g. 0,3 (default: 0)")
    p.add_argument("--tag", help="only items with this tag ('all' for every item; default: the case's focus)")

    p = sub.add_parser("patch", help="patch each head (unit) of each layer from one format into the other")
    add_patching(p, COMPONENTS)
    add_memory(p)
    p.add_argument("--holdout", type=cli_types.held_share, metavar="FRAC",
                   help="rank the units on a seeded, tag-stratified share of the items and report the top ones on the "
                        "held-out FRAC (e.g. 0.5)")
    p.add_argument("--eval-items", metavar="N|FILE", help="rank the units on every item and report the top ones on "
                                                         "these: " + EVAL_ITEMS)
    p.add_argument("--top", type=cli_types.positive, default=10, help="with --holdout/--eval-items: the units reported "
                                                                      "held out (default 10)")

    p = sub.add_parser("attribute", help="estimate every unit's patching effect from one backward pass "
                                         "(gradients w.r.t. the masks); --compare checks it against exact patching")
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

    p = sub.add_parser("threshold", help="search head subsets that repair: fraction repairing per size k, "
                                         "threshold k*, minimal subsets, per-head necessity")
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

    p = sub.add_parser("repair", help="a repair that needs the failing prompt alone (the heads' mean good-format "
                                      "output, or a steering difference), built on discovery items and measured on "
                                      "held-out ones for efficacy, generalization and side effects; --out keeps it")
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

    p = sub.add_parser("sinks", help="attention sinks and massive activations per head, layer and format: the "
                                     "attention on the first token (sink rate), the strongest other sinks, the first "
                                     "token's residual norm, the largest activations (Sun et al.'s criterion)")
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

    p = sub.add_parser("merge", help="merge threshold shards into the result one run gives")
    p.add_argument("dirs", nargs="+", type=Path, help="the --out directories of the shards")
    p.add_argument("--out", type=cli_types.directory, required=True, help="write the merged results.json, subsets.csv and figure here")
    p.add_argument("--debug", action="store_true", help="show tracebacks")

    p = sub.add_parser("blend", help="blend (1-a)*failing + a*good for chosen heads: where does repair switch on?")
    add_common(p)
    p.add_argument("--layer", type=cli_types.layer, required=True, help="the layer whose heads (or output) are blended")
    p.add_argument("--heads", help="heads to blend, e.g. 0,2,4 or L1H0,L1H2 (default: all heads of the layer)")
    p.add_argument("--component", default="z", choices=["z", "o_slices", "attn_out", "pattern", "mlp_out", "resid_pre"],
                   help="z: head outputs; attn_out: the whole layer output (the paper's 'pattern replacement'); "
                        "pattern: attention patterns (equal-length formats only) (default: z)")
    p.add_argument("--step", type=cli_types.fraction, default=0.01, help="grid step for a (default 0.01)")
    add_items(p)
    add_metric(p)

    p = sub.add_parser("circuit", help="path-level circuit discovery: score every edge, prune a faithful circuit, "
                                       "rank complete paths by path patching, export the graph")
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

    p = sub.add_parser("circuit-eval", help="faithfulness of a circuit read from a file (our JSON exports, "
                                            "or an EAP-IG / MIB circuit JSON)")
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

    p = sub.add_parser("report", help="the whole pipeline on a case, each step reusing an earlier run's finished "
                                      "results in --out; one self-contained HTML page with an interactive circuit")
    add_common(p, out_help="where the page (report.html), each step's results and the figures go (default: "
                           "out/report-CASE under the current directory)")
    p.add_argument("--steps", default=",".join(REPORT_STEPS),
                   help=f"steps to run, in order (default: {','.join(REPORT_STEPS)}; also: {','.join(REPORT_OPTIONAL)}, a "
                        "repair that needs the failing prompt alone, chosen and measured on held-out items)")
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

    from surgeon.cli.sae import add_feature_circuit
    from surgeon.cli.sae import add_parser as add_sae

    add_sae(sub, add_common, add_items)
    add_feature_circuit(sub, add_common, add_items)

    p = sub.add_parser("cases", help="the case files shipped with surgeon (copy one to start your own)")
    p.add_argument("action", nargs="?", choices=["list"], help="list them (what `surgeon cases` does anyway)")
    p.add_argument("--debug", action="store_true", help="show tracebacks")

    p = sub.add_parser("organisms", help="list, describe or retrain the model organisms")
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
    return parser


def cmd_diagnose(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses import diagnose

    d = diagnose(case, model, batch_size=args.batch_size, generate=args.generate, progress=True)
    return print_report(args, d, case, device)


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


def cmd_dla(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.logit_attribution import logit_attribution

    r = logit_attribution(case, model, tag=args.tag, batch_size=args.batch_size, value_biases=args.value_biases,
                          lens_bias=args.lens_bias)
    return print_report(args, r, case, device)


def cmd_encode(args) -> int:
    items = _int_list(args.items, "--items")
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.encode import encode

    r = encode(case, model, bad=args.bad, tag=args.tag, items=items)
    return print_report(args, r, case, device)


def cmd_patch_positions(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.positions import patch_positions

    r = patch_positions(case, model, layers=layers_of(args, case), component=args.component,
                        direction=args.direction, bad=args.bad, tag=args.tag, batch_size=args.batch_size,
                        progress=True)
    return print_report(args, r, case, device)


def cmd_attention(args) -> int:
    items = _int_list(args.items, "--items")
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.attention import attention_patterns

    r = attention_patterns(case, model, heads=args.heads, items=items, tag=args.tag, batch_size=args.batch_size)
    return print_report(args, r, case, device)


def _ig_steps(args, uses: bool) -> None:
    """A warning (before anything loads) where --ig-steps was given to a method that ignores it."""
    if "ig_steps" in getattr(args, "given", ()) and not uses:
        warn(f"--ig-steps {args.ig_steps} is ignored: --method {args.method} does not integrate")


def cmd_attribute(args) -> int:
    _ig_steps(args, args.method == "ig")
    case, model, device = load_case_and_model(args)
    from surgeon.analyses import attribute

    layers = layers_of(args, case)
    r = attribute(case, model, layers=layers, component=args.component, direction=args.direction, bad=args.bad,
                  tag=args.tag, batch_size=args.batch_size, compare=args.compare, method=args.method,
                  ig_steps=args.ig_steps)
    return print_report(args, r, case, device)


def _int_list(text: str | None, field: str):
    if text is None:
        return None
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SurgeonError(f"cannot read {text!r}", field=field, fix="write e.g. 0,2,4") from None
    if not out:  # an empty list would run on nothing and print "0 items"
        raise SurgeonError(f"{text!r} names no item", field=field, fix="write e.g. 0,2,4, or leave it out")
    return out


def cmd_threshold(args) -> int:
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
    one_evaluation_choice(args)
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
    case, model, device = load_case_and_model(args, out=out, check=lambda c: eval_items_check(args, c))
    if args.eval:
        from surgeon.analyses.heldout import evaluate_subsets

        rates = evaluate_subsets(case, model, args.eval, component=args.component, bad=args.bad, tag=args.tag,
                                 batch_size=args.batch_size)
        from surgeon.reports import text as report

        print(report.subset_rates_text(rates, case, args.bad, args.tag))
        return 0
    if args.generate:  # refused before the search, not after it
        from surgeon.analyses.generation import check_generation
        from surgeon.case.select import pick_items

        check_generation(case, model, pick_items(case, args.tag)[1], args.generate)
    warn_if_no_failure(args, case, model)
    from surgeon.analyses import planning
    from surgeon.reports import text as report
    from surgeon.analyses.threshold import Interrupted, threshold_search

    batch = planned_batch_size(args, planning.plan_threshold, case, model, args.layer or 0, args.chunk, args.chunk)
    if args.folds is not None:
        from surgeon.analyses.heldout import threshold_folds

        r = threshold_folds(case, model, folds=args.folds, seed=args.seed, tag=args.tag, bad=args.bad,
                            component=args.component, batch_size=batch, layer=args.layer, heads=args.heads,
                            groups=groups, groups_spec=spec, grid=grid, budget=args.budget,
                            grid_budget=args.grid_budget, item_rate=args.item_rate, x=args.x, chunk=args.chunk)
        return print_report(args, r, case, device)
    if args.holdout is not None or args.eval_items is not None:
        from surgeon.analyses.heldout import threshold_heldout

        r = threshold_heldout(case, model, holdout=args.holdout or 0.5, eval_items=args.eval_items, seed=args.seed,
                              tag=args.tag, bad=args.bad,
                              component=args.component, batch_size=batch, out=out, layer=args.layer, heads=args.heads,
                              groups=groups, groups_spec=spec, grid=grid, budget=args.budget,
                              grid_budget=args.grid_budget, item_rate=args.item_rate, x=args.x, chunk=args.chunk,
                              progress=True)
        return print_report(args, r, case, device)
    try:
        r = threshold_search(case, model, layer=args.layer, heads=args.heads, groups=groups, groups_spec=spec, grid=grid,
                             budget=args.budget, grid_budget=args.grid_budget, item_rate=args.item_rate, x=args.x,
                             component=args.component, bad=args.bad, tag=args.tag, batch_size=batch,
                             chunk=args.chunk, seed=args.seed, out=out, shard=args.shard, generate=args.generate,
                             progress=True, ray=ray)
    except Interrupted as e:
        from surgeon.results import reset_interrupts

        reset_interrupts()  # the signal arrived where it was meant to: the partial results are kept on purpose
        print(report.threshold_text(e.partial))
        if out is None:
            print("\ninterrupted (to continue an interrupted search later, give it --out)", file=sys.stderr)
            return 130
        report.save_threshold(out, e.partial, case, args, device)
        print(f"\ninterrupted: partial results in {out}; continue with --resume", file=sys.stderr)
        return 130
    if r is None:
        print(f"shard {args.shard} done: parts in {out}/parts; merge the shards with: surgeon merge DIR... --out DIR")
        return 0
    print(report.threshold_text(r))
    if out is not None:
        report.save_threshold(out, r, case, args, device)
        print(f"\nwrote {out}/results.json, manifest.json, subsets.csv, threshold.png")
    return 0


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


def cmd_repair(args) -> int:
    from surgeon.analyses.repair import check_heads, check_repairable

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
    neutral = None
    if args.neutral is not None:
        try:
            neutral = [line for line in args.neutral.read_text().splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise SurgeonError(f"cannot read {args.neutral} ({type(e).__name__})", field="--neutral",
                               fix="give a text file, one neutral text per line") from None
        if not neutral:
            raise SurgeonError(f"{args.neutral} holds no text", field="--neutral", fix="one neutral text per line")
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
    from surgeon.analyses.repair import measure_saved, repair_case, search_repair
    from surgeon.repairs.fold import save_folded
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
    from surgeon.reports.repair_view import repair_text, save_repair

    print(repair_text(r))
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
    return 0


def cmd_merge(args) -> int:
    from surgeon.reports import text as report
    from surgeon.search.shards import merge

    r = merge(args.dirs, args.out)
    report.save_threshold(args.out, r, None, args, None)
    print(report.threshold_text(r))
    print(f"\nmerged {len(args.dirs)} shards into {args.out}")
    return 0


def cmd_blend(args) -> int:
    case, model, device = load_case_and_model(args)
    from surgeon.analyses.blend import blend

    r = blend(case, model, layer=args.layer, heads=args.heads, component=args.component,
              step=args.step, bad=args.bad, tag=args.tag, batch_size=args.batch_size)
    return print_report(args, r, case, device)


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


def cmd_circuit(args) -> int:
    from surgeon.circuits.export import check_targets

    check_targets(args.export)  # refuse before loading anything
    _ig_steps(args, args.method is None or "ig" in args.method)
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
        if {"threshold", "circuit", "repair"} & set(steps) and (holdout or args.eval_items is not None):
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


def cmd_circuit_eval(args) -> int:
    from surgeon.analyses.circuit import check_circuit_file, evaluate_circuit, evaluation_options
    from surgeon.circuits.export import read_circuit

    circuit = read_circuit(args.graph, edges_only=True)  # refused before the model loads

    def against_the_model(case):  # names, cfg and GQA copies checked from the model's config alone
        ablation = evaluation_options(circuit, case, ablation=args.ablation, semantics=args.semantics,
                                      direction=args.direction, bad=args.bad, where=str(args.graph))[0]
        check_circuit_file(circuit, case.model, ablation, str(args.graph))

    case, model, device = load_case_and_model(args, check=against_the_model)
    from surgeon.reports import text as report

    r = evaluate_circuit(case, model, circuit, ablation=args.ablation, semantics=args.semantics,
                         direction=args.direction, bad=args.bad,
                         tag=args.tag, batch_size=args.batch_size, where=str(args.graph))
    print(report.circuit_eval_text(r, args.graph))
    if args.out:
        report.save(args.out, "circuit-eval", r, case, args, device)
        print(f"\nwrote {args.out}/results.json, manifest.json")
    return 0


def cmd_cases(args) -> int:
    import ast

    print(f"shipped cases (in {CASES_DIR.resolve()}; run one by name, e.g. `surgeon diagnose threshold_organism`):")
    for f in sorted(CASES_DIR.glob("*.py")):
        doc = (ast.get_docstring(ast.parse(f.read_text())) or "").strip().splitlines()
        print(f"  {f.stem:<22} {doc[0] if doc else ''}")
    return 0


def cmd_sae(args) -> int:
    from surgeon.cli.sae import run

    return run(args)


def cmd_feature_circuit(args) -> int:
    from surgeon.cli.sae import run_feature_circuit

    return run_feature_circuit(args)


COMMANDS = {"scan": cmd_scan, "report": cmd_report, "cases": cmd_cases, "sae": cmd_sae, "feature-circuit": cmd_feature_circuit, "diagnose": cmd_diagnose, "circuit": cmd_circuit, "circuit-eval": cmd_circuit_eval, "patch": cmd_patch, "attribute": cmd_attribute, "dla": cmd_dla, "encode": cmd_encode, "attention": cmd_attention, "patch-positions": cmd_patch_positions, "threshold": cmd_threshold,
            "merge": cmd_merge, "repair": cmd_repair, "sinks": cmd_sinks,
            "blend": cmd_blend, "organisms": cmd_organisms}


def main(argv: list[str] | None = None) -> int:
    import signal

    from surgeon.results import (
        cancel_redelivery,
        interrupted,
        on_interrupt,
        quiet_dropped_interrupts,
        reset_interrupts,
    )

    parser = build_parser()
    args = parser.parse_args(argv)
    reset_interrupts()
    previous = {}
    unraisable = sys.unraisablehook
    sys.unraisablehook = quiet_dropped_interrupts(unraisable)
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGTERM (what schedulers send) ends a run as Ctrl-C does
        try:
            previous[sig] = signal.signal(sig, on_interrupt)
        except ValueError:  # not the main thread
            pass
    try:
        code = COMMANDS[args.command](args)
        if interrupted():  # a Ctrl-C whose KeyboardInterrupt was dropped (in a finaliser): the run still ends so
            raise KeyboardInterrupt
        return code
    except SurgeonError as e:
        if getattr(args, "debug", False):
            raise
        print(f"surgeon: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the disk filled up or a folder vanished while writing: nothing half-written is kept
        import errno

        if getattr(args, "debug", False) or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise
        print(f"surgeon: error: writing {e.filename or 'results'} failed: {e.strerror}\n"
              "  fix: free space or choose another --out; finished search chunks are kept (--resume continues)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        out = getattr(args, "out", None)
        parts = Path(out) / "parts" if out else None
        if parts is not None and any(parts.glob("chunk-*.npz")):
            print(f"surgeon: interrupted; the finished chunks in {parts} are kept (--resume continues)", file=sys.stderr)
        else:
            print("surgeon: interrupted; no results were written", file=sys.stderr)
        return 130
    finally:
        cancel_redelivery()  # a signal held during an import, not yet delivered again: this run has answered it
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = unraisable


def console() -> None:
    """The `surgeon` command and `python -m surgeon`: main's exit code; an interrupted run (130) ends at once,
    after its message, without the interpreter's finalisers (a Ctrl-C that landed while torch was importing
    could otherwise end the process by the signal itself, not with 130)."""
    code = main()
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
