"""The notebook's surgeon: one function per command, with the command's name and defaults.

    import surgeon
    d = surgeon.diagnose("cases/decimal_organism.py")   # or a Case, or a shipped case's name
    print(d)                                            # the report `surgeon diagnose` prints
    r = surgeon.patch(case, model)                      # a model you already hold (HookedTransformer)
    r.figure(); r.save("out/patch")                     # what `surgeon patch --out out/patch` writes

`case` is a case file, a shipped case's name (`surgeon cases`) or a `Case`; `model` is None (the case's model,
loaded on `device` in `dtype`), a model spec ("organism:decimal", a checkpoint directory, a Hugging Face id in
the local cache), a HookedTransformer already in memory, or a Hugging Face model in memory (converted as
checkpoints are; pass `(hf_model, tokenizer)` when it was not loaded from local files). With a model given, the
case may leave out its own. Every result prints as its report, shows its
tables and figures in Jupyter, and has `.figure()` and `.save(dir)`; circuits also `.export(path, ...)`.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from surgeon.analyses.attention import AttentionResult, attention_patterns
from surgeon.analyses.pipeline import STEPS, Report, run_report
from surgeon.analyses.attribution import AttributionResult
from surgeon.analyses.attribution import attribute as attribute_units
from surgeon.analyses.blend import BlendResult
from surgeon.analyses.blend import blend as blend_heads
from surgeon.analyses.circuit import (
    CircuitResult,
    check_options,
    default_method,
    discover,
    evaluate_circuit,
)
from surgeon.analyses.diagnose import Diagnosis, failure_check
from surgeon.analyses.encode import Encoding
from surgeon.analyses.generation import check_generation
from surgeon.analyses.heldout import (
    evaluation_choice,
    FoldsCircuit,
    FoldsThreshold,
    HeldOutCircuit,
    HeldOutFeatureCircuit,
    HeldOutFeatureRepair,
    HeldOutPatch,
    HeldOutThreshold,
    circuit_folds,
    circuit_heldout,
    eval_items_of,
    eval_split,
    feature_circuit_heldout,
    fold_items,
    patch_heldout,
    sae_repair_heldout,
    threshold_folds,
    threshold_heldout,
)
from surgeon.analyses.heldout import evaluate_subsets as evaluate_named
from surgeon.analyses.scan import ScanResult, check_scan_options, scan_formats, write_found
from surgeon.analyses.scan import BUDGET as SCAN_BUDGET
from surgeon.case.grammar import check_scan
from surgeon.case.writer import check_write_target
from surgeon.analyses.sink_interventions import SinkInterventionResult
from surgeon.analyses.sink_interventions import sink_interventions as sink_interventions_of
from surgeon.analyses.sinks import SinkResult
from surgeon.analyses.sinks import sinks as sinks_of
from surgeon.analyses.repair import (RepairResult, check_heads, check_repairable, check_sites, measure_saved,
                                    repair_case, search_repair)
from surgeon.analyses.steering_baselines import compare_baselines
from surgeon.analyses.feature_circuit import EXACT, FeatureCircuitResult, check_edge_rule, check_threshold_over
from surgeon.analyses.feature_circuit import feature_circuit as feature_circuit_of
from surgeon.analyses.encode import encode as encode_case
from surgeon.analyses.diagnose import diagnose as diagnose_case
from surgeon.analyses.logit_attribution import LogitAttributionResult, logit_attribution
from surgeon.analyses.patching import PatchResult, patch_heads
from surgeon.analyses.planning import plan_circuit, plan_feature_circuit, plan_patch, plan_threshold, planned_batch_size
from surgeon.analyses.positions import PositionPatchResult
from surgeon.analyses.positions import patch_positions as patch_by_position
from surgeon.analyses.sae_features import AmplifiedResult, OverlapResult, amplified, overlap
from surgeon.analyses.sae_heads import HeadFeatureResult, head_feature_effects
from surgeon.analyses.sae_repair import FeatureRepairResult, feature_repair
from surgeon.circuits.export import read_circuit as read_circuit_file
from surgeon.circuits.methods import ATTRIBUTION_IG_STEPS, IG_STEPS
from surgeon.models.devices import device_of
from surgeon.case.select import pick_items
from surgeon.case.shipped import shipped_case
from surgeon.models.bridge import BridgeModel, cache_named, is_bridge, unwrapped
from surgeon.models.checks import check_bare, check_case_against_model, check_runnable, load_case
from surgeon.models.loading import BRIDGE, from_hf, load_model, model_digest
from surgeon.repairs.artifact import MODES, Repair, check_fits, read_repair
from surgeon.repairs.fold import check_rule, save_folded
from surgeon.repairs.artifact import apply as apply_repair
from surgeon.reports.html import render as render_report
from surgeon.results import from_jsonable, to_jsonable, versions, write_json
from surgeon.sae.load import SAESource, load_sae
from surgeon.search.subsets import ThresholdResult
from surgeon.analyses.threshold import threshold_search
from surgeon.show import VIEWS, view_of
from surgeon.sites.ablations import ABLATIONS
from surgeon.errors import AnalysisError, CaseError, ModelError, SurgeonError, warn
from surgeon.version import __version__
from surgeon.case.case import Case, case_metric_of, content_digest
from surgeon.case.reading import validate

__all__ = ["diagnose", "scan", "encode", "dla", "attention", "patch", "patch_positions", "attribute", "threshold",
           "evaluate_subsets", "repair", "apply", "sinks", "blend", "circuit",
           "circuit_eval", "sae_overlap", "sae_amplified", "sae_heads", "sae_repair", "feature_circuit", "report", "render_report",
           "read_circuit", "case_and_model", "read", "load"]


def read(case, model=None) -> Case:
    """A Case as given, or read and checked from a case file or a shipped case's name (`model`, when a spec,
    replaces the case's)."""
    if isinstance(case, Case):  # built or edited in Python: the same checks as a case file, before any weight loads
        validate(case)
        return case
    if not isinstance(case, (str, Path)):
        raise CaseError(f"is a {type(case).__name__}, not a case", field="case",
                        fix="give a surgeon.Case, the path of a case file, or a shipped case's name (`surgeon cases` lists them)")
    return load_case(shipped_case(str(case)), model=str(model) if isinstance(model, (str, Path)) else None)


def case_and_model(case, model=None, *, device: str | None = None, dtype: str = "float32", metric=None):
    """(Case, model): the case read and checked (a path, a shipped case's name, or a Case), and the model: the
    case's when None, loaded by spec when a string, else the model given: a HookedTransformer, a Hugging Face
    model (converted as checkpoints are; its tokenizer from the files it was loaded from) or (model, tokenizer)
    (a HookedTransformer gets the tokenizer set on it). A case may leave out `model` when one is given here.
    `metric` (a name or a function) replaces the case's (see `surgeon.case.metrics`)."""
    built = isinstance(case, Case)  # a case file was checked against its model when it was read
    case = read(case, model)
    if metric is not None:
        case = replace(case, metric=metric)
        validate(case)
    if model is None or isinstance(model, (str, Path)):
        if built or case.model is None:  # its config and tokenizer, before the weights load (says what to do without one)
            check_case_against_model(replace(case, model=str(model)) if model is not None else case)
        model = load_model(str(model or case.model), device=device_of(device), dtype=dtype)
        return case, model
    if isinstance(model, tuple) and len(model) == 2 and hasattr(model[0], "run_with_hooks"):
        model[0].set_tokenizer(model[1])  # (HookedTransformer, tokenizer): the tokenizer goes on the model
        model = model[0]
    if is_bridge(model):
        model = BridgeModel(model)
    elif isinstance(model, tuple):
        model = from_hf(*model, device=device)
    elif not hasattr(model, "run_with_hooks"):
        model = from_hf(model, device=device)
    check_runnable(model)
    check_bare(model)
    check_case_against_model(case, model)
    return case, model


def check_eval_items(case, model, eval_items, seed: int = 0) -> None:
    """Items given to evaluate on (`eval_items_of`'s spec: a number of fresh items, a case file, Items), checked as the
    case's own items are and against the model (its config and tokenizer, before any weight loads; or the model in
    memory): a refusal the encoder would give after the work started comes before it."""
    if eval_items is None:
        return
    case = read(case, model)
    items, _ = eval_items_of(case, eval_items, seed)
    checked = replace(case, items=items, draw=None)
    if model is None or isinstance(model, (str, Path)):
        check_case_against_model(replace(checked, model=str(model)) if model is not None else checked)
    elif hasattr(model, "run_with_hooks"):
        check_case_against_model(checked, model)


def _warn_if_no_failure(case: Case, model, bad, tag, batch_size: int) -> None:
    """The command line's warning before work on a format that does not fail (`failure_check`), from Python too."""
    why = failure_check(case, model, bad=bad, tag=tag, batch_size=batch_size)
    if why:
        warn(why)


def _layers(case: Case, layers):
    return list(case.layers) if layers is None and case.layers is not None else layers


def diagnose(case, model=None, *, batch_size: int = 256, generate: int = 0, metric=None, device: str | None = None,
             dtype: str = "float32"):
    """Accuracy and score per format, with intervals: is the failure there? (`surgeon diagnose`)"""

    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    return diagnose_case(case, model, batch_size=batch_size, generate=generate)


def scan(case, model=None, *, budget: int = SCAN_BUDGET, tag: str | None = None, holdout: float | None = None,
         eval_items=None, seed: int = 0, write_case: str | Path | None = None, batch_size: int = 256, metric=None,
         progress: bool = False, device: str | None = None, dtype: str = "float32"):
    """Find where the model fails (`surgeon scan`): formats composed from a grammar of parts (`surgeon.case.grammar`:
    the answer and question cues, separators, casing, an instruction, few-shot examples, the chat template; the
    case's `scan=` narrows or replaces them) scored on the case's items (`tag`; default its focus), exhaustively
    within `budget` prompts or by successive halving; the worst and best formats and the spread, each part's effect
    on accuracy (Holm-corrected), and the minimal pair (formats a part apart, one working, one failing). Chosen on
    discovery items (`holdout`, default 0.5; or every item with `eval_items`) and measured on the evaluation items,
    the result (`holdout=0`: in-sample, and said so). `write_case="cases/found.py"`: the minimal pair written as a
    case file (good: the working format, bad: the failing one) that loads the scanned case's items."""
    holdout = evaluation_choice(holdout, eval_items, default=0.5)
    check_scan_options(budget)
    if write_case is not None:
        check_write_target(write_case)  # a .py file not there yet
    c = read(case, model)
    check_scan(c.scan, c.source)  # the case's own parts, before any weight loads
    if write_case is not None:
        check_write_target(write_case, c)
    check_eval_items(c, model, eval_items, seed)
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    r = scan_formats(case, model, budget=budget, tag=tag, holdout=holdout, eval_items=eval_items, seed=seed,
                     batch_size=batch_size, progress=progress)
    if write_case is not None:
        r = write_found(r, case, write_case)
    return r


def patch(case, model=None, *, layers: Sequence[int] | None = None, component: str = "z",
          direction: str = "denoise", bad: str | None = None, tag: str | None = None, batch_size: int = 256,
          max_memory: int | str | None = None, metric=None, device: str | None = None, dtype: str = "float32",
          holdout: float | None = None, eval_items=None, seed: int = 0, top: int = 10):
    """Patch every head (unit) of each layer alone from one format into the other (`surgeon patch`). The batch size
    is lowered to fit `max_memory` ("80GB"; default: the device's free memory), the plan printed to stderr.
    `holdout` (e.g. 0.5, seeded by `seed`) or `eval_items`: the units are ranked on discovery items and the `top` of
    them reported on the held-out ones, the result (a `HeldOutPatch`)."""
    holdout = evaluation_choice(holdout, eval_items)
    if holdout is not None or eval_items is not None:  # refused before any weight loads
        eval_split(read(case, model), tag, holdout, seed, eval_items)
        check_eval_items(case, model, eval_items, seed)
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    _warn_if_no_failure(case, model, bad, tag, batch_size)
    layers = _layers(case, layers)
    batch_size = planned_batch_size(plan_patch, case, model, layers, component, batch_size=batch_size,
                                    max_memory=max_memory, bad=bad, direction=direction, tag=tag)
    if holdout is not None or eval_items is not None:
        return patch_heldout(case, model, holdout=holdout or 0.5, seed=seed, tag=tag, bad=bad, top=top,
                             eval_items=eval_items, layers=layers, component=component, direction=direction,
                             batch_size=batch_size)
    return patch_heads(case, model, layers=layers, component=component, direction=direction, bad=bad,
                       tag=tag, batch_size=batch_size)


def encode(case, model=None, *, bad: str | None = None, tag: str | None = "all", items: Sequence[int] | None = None,
           device: str | None = None, dtype: str = "float32"):
    """What the model reads (`surgeon encode`): per item and format the token ids and strings, the scored positions
    and the answer token each scores, and the aligned position pairs patching moves between; `.to_pandas()` gives
    one row per item x format x position."""
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    return encode_case(case, model, bad=bad, tag=tag, items=items)


def dla(case, model=None, *, tag: str | None = None, batch_size: int = 256, value_biases: str = "per-head",
        lens_bias: str = "included", device: str | None = None, dtype: str = "float32"):
    """Direct logit attribution per head and layer, and the logit lens, in every format (`surgeon dla`);
    `value_biases="folded"` and `lens_bias="excluded"` give TransformerLens's conventions."""
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    return logit_attribution(case, model, tag=tag, batch_size=batch_size, value_biases=value_biases,
                             lens_bias=lens_bias)


def patch_positions(case, model=None, *, layers: Sequence[int] | None = None, component: str = "z",
                    direction: str = "denoise", bad: str | None = None, tag: str | None = None,
                    batch_size: int = 256, metric=None, device: str | None = None, dtype: str = "float32"):
    """Every unit of each layer patched at each aligned position alone; `component="resid_pre"`: the residual
    stream x positions (`surgeon patch-positions`)."""
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    return patch_by_position(case, model, layers=_layers(case, layers), component=component, direction=direction,
                             bad=bad, tag=tag, batch_size=batch_size)


def attention(case, model=None, *, heads, items: Sequence[int] = (0,), tag: str | None = None,
              batch_size: int = 256, device: str | None = None, dtype: str = "float32"):
    """Attention patterns of chosen heads ("L1H0,L1H1") on chosen items, every format side by side
    (`surgeon attention`)."""
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    return attention_patterns(case, model, heads=heads, items=items, tag=tag, batch_size=batch_size)


def attribute(case, model=None, *, layers: Sequence[int] | None = None, component: str = "z",
              direction: str = "denoise", bad: str | None = None, tag: str | None = None, batch_size: int = 256,
              compare: bool = False, method: str = "gradient", ig_steps: int = ATTRIBUTION_IG_STEPS,
              metric=None, device: str | None = None, dtype: str = "float32"):
    """Gradient attribution over the units' masks, optionally against exact patching (`surgeon attribute`)."""

    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    return attribute_units(case, model, layers=_layers(case, layers), component=component, direction=direction,
                                 bad=bad, tag=tag, batch_size=batch_size, compare=compare, method=method,
                                 ig_steps=ig_steps)


def threshold(case, model=None, *, layer: int | None = None, heads: str | None = None,
              groups: Sequence[str] = ("even", "odd"), grid: tuple[str, str] | None = None, budget: int = 20000,
              grid_budget: int = 200, item_rate: float = 1.0, x: float = 0.5, component: str = "z",
              bad: str | None = None, tag: str | None = None, batch_size: int = 256, chunk: int = 256, seed: int = 0,
              out: str | Path | None = None, generate: int = 0, max_memory: int | str | None = None, metric=None,
              holdout: float | None = None, eval_items=None, folds: int | None = None, device: str | None = None,
              dtype: str = "float32"):
    """Search head subsets that repair: the fraction repairing per size k, the threshold k*, minimal subsets
    (`surgeon threshold`). With `out`, finished chunks are kept there and a rerun resumes. The batch size is
    lowered to fit `max_memory` (default: the device's free memory).

    `holdout` (e.g. 0.5): the search runs on a seeded, tag-stratified share of the items (discovery) and each
    family's best subset per size is evaluated on the rest (held-out, the headline): a `HeldOutThreshold`.
    `eval_items` instead: the search on every item, the evaluation on these (a number: fresh items from the case's
    `draw`; a case file's path; a list of Items). `folds` (e.g. 5): cross-validated, a `FoldsThreshold`: k* per
    fold, how often each subset is the best of its size, the held-out rate per fold."""
    holdout = evaluation_choice(holdout, eval_items, folds)
    check_eval_items(case, model, eval_items, seed)  # refused before the model loads
    if folds is not None:
        fold_items(pick_items(read(case, model), tag)[1], folds, seed)  # refused before the model loads
    if holdout is not None:
        eval_split(read(case, model), tag, holdout, seed, None)  # too few items for the split: refused now
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    if generate:  # refused before the search, not after it
        check_generation(case, model, pick_items(case, tag)[1], generate)
    _warn_if_no_failure(case, model, bad, tag, batch_size)
    batch_size = planned_batch_size(plan_threshold, case, model, layer or 0, chunk, chunk, batch_size=batch_size,
                                    max_memory=max_memory, bad=bad, tag=tag)
    if folds is not None:
        return threshold_folds(case, model, folds=folds, seed=seed, tag=tag, bad=bad, component=component,
                               batch_size=batch_size, layer=layer, heads=heads, groups=list(groups), grid=grid,
                               budget=budget, grid_budget=grid_budget, item_rate=item_rate, x=x, chunk=chunk)
    if holdout is not None or eval_items is not None:
        if generate:
            raise AnalysisError("--generate judges the search's minimal subsets on the items it ran on; with a holdout "
                                "it would judge them in-sample", field="--generate",
                                fix="leave out --generate with --holdout (or evaluate named subsets with --eval)")
        return threshold_heldout(case, model, holdout=holdout or 0.5, seed=seed, tag=tag, bad=bad, component=component,
                                 eval_items=eval_items,
                                 batch_size=batch_size, out=out, layer=layer, heads=heads, groups=list(groups),
                                 grid=grid, budget=budget, grid_budget=grid_budget, item_rate=item_rate, x=x,
                                 chunk=chunk)
    return threshold_search(case, model, layer=layer, heads=heads, groups=list(groups), grid=grid, budget=budget,
                            grid_budget=grid_budget, item_rate=item_rate, x=x, component=component, bad=bad, tag=tag,
                            batch_size=batch_size, chunk=chunk, seed=seed, out=out, generate=generate)


def evaluate_subsets(case, model=None, subsets=(), *, component: str = "z", bad: str | None = None,
                     tag: str | None = None, batch_size: int = 256, metric=None, device: str | None = None,
                     dtype: str = "float32"):
    """Named head subsets ("L0H4,L0H6", or lists of labels), each patched from the good format into the failing one
    on the case's items (`tag`), batched as the subset search patches: per subset the rate of items right with its
    95% interval and the repair fraction (`surgeon threshold --eval`). Give the items to evaluate on as the case's
    (e.g. `dataclasses.replace(case, items=fresh)`): numbers on items a subset was not chosen on are held-out."""
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    return evaluate_named(case, model, list(subsets), component=component, bad=bad, tag=tag, batch_size=batch_size)


def repair(case, model=None, *, heads=None, mode: str = "mean", strength: float | None = None, search: bool = False,
           strengths: Sequence[float] | None = None, max_heads: int = 8, max_kl: float = 0.1,
           max_kl_q90: float | None = None, max_drop: float = 0.05,
           holdout: float | None = None, seed: int = 0, eval_items=None, neutral: Sequence[str] | None = None,
           generate: int = 0, bad: str | None = None, tag: str | None = None, batch_size: int = 256, metric=None,
           baselines: bool = False, fold: str | None = None, sites="z", device: str | None = None,
           dtype: str = "float32"):
    """A repair that needs the failing prompt alone (`surgeon repair`): `heads` ("L0H4,L0H6") get the good format's
    mean output (`mode="mean"`) or the mean good-minus-failing difference times `strength` (`mode="steer"`) at the
    last prompt token and the tokens after it, built on a seeded discovery split of the items (`holdout`, or every
    item when `eval_items` are given) and measured on the held-out ones: efficacy, generalization, specificity (KL
    from the unrepaired model; `neutral` texts), `generate` tokens of greedy generation, and the paired interchange of
    the same heads beside it. `search=True`: choose the heads (from `heads`, default every head) and strength on the
    discovery items under `max_kl` (the mean), `max_kl_q90` (the items' 90th percentile) and `max_drop`, then
    measure; `result.verdict()` says why not to ship it (no held-out efficacy above unrepaired, a bound not met). `result.repair` is the `Repair`: `surgeon.apply(model,
    result.repair)`, `result.repair.save(DIR)`. `baselines=True`: the field's steering baselines (CAA, ITI, random
    heads, one layer's heads) built on the same discovery items and measured beside it on the same held-out items
    (`result.baselines`: the Pareto front; `surgeon.analyses.steering_baselines.compare_baselines` for other grids).
    `sites` (with `search=True`): what the search may write, "z" (heads) and one vector per layer of "mlp_out",
    "attn_out" or "resid_pre" (e.g. "z,mlp_out"). `fold="slot0"` (or "mean"): also measure it as a model file acts, folded into the weights at every position
    (`result.fold`); `surgeon.fold(result, model, DIR)` writes that model file."""
    sites = check_sites(sites)  # before anything is read or loaded
    holdout = evaluation_choice(holdout, eval_items, default=0.5)  # measured held out: 0.5 unless told
    if holdout is None and eval_items is None:
        raise AnalysisError("a repair is measured on items it was not built on; holdout=0 holds none out",
                            field="--holdout", fix="give holdout=FRAC (e.g. 0.5), or items to evaluate on (eval_items=)")
    if sites != ("z",) and not search:
        raise AnalysisError("sites= says what the search may write; named heads are heads", field="sites",
                            fix="pass search=True, or leave sites out")
    check_heads(heads, max_heads=max_heads, strength=strength, strengths=strengths, search=search, max_kl=max_kl,
                max_drop=max_drop, max_kl_q90=max_kl_q90)
    check_repairable(read(case, model), mode, "z", holdout=holdout, eval_items=eval_items)  # before any weight loads
    check_eval_items(case, model, eval_items, seed)  # a number of fresh items, a case file or Items
    if fold is not None:
        check_rule(fold)
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    if generate:
        check_generation(case, model, list(case.items), generate)
    for b in ([bad] if bad is not None else list(case.bad_formats)):  # a repair of nothing is said before the work
        _warn_if_no_failure(case, model, b, tag, batch_size)
    if search:
        r = search_repair(case, model, heads=heads, mode=mode, strengths=strengths, max_heads=max_heads,
                          max_kl=max_kl, max_kl_q90=max_kl_q90, max_drop=max_drop, bad=bad, tag=tag, holdout=holdout,
                          seed=seed, eval_items=eval_items, neutral=neutral, generate=generate, batch_size=batch_size,
                          fold=fold, sites=sites)
    elif heads is None:
        raise AnalysisError("name the heads to repair, or search for them", field="heads",
                            fix='give heads="L0H4,L0H6" (e.g. a subset from surgeon threshold), or search=True')
    else:
        r = repair_case(case, model, heads=heads, mode=mode, strength=1.0 if strength is None else strength, bad=bad,
                        tag=tag, holdout=holdout, seed=seed, eval_items=eval_items, neutral=neutral, generate=generate,
                        batch_size=batch_size, fold=fold)
    if baselines:
        r = replace(r, baselines=compare_baselines(case, model, r, holdout=holdout, seed=seed, eval_items=eval_items,
                                                   bad=bad, tag=tag, batch_size=batch_size))
    return r


def sinks(case, model=None, *, tag: str | None = None, epsilon: float = 0.3, batch_size: int = 64,
          intervene: bool = False, heads=None, amplify: tuple | None = None, device: str | None = None,
          dtype: str = "float32"):
    """Attention sinks and massive activations in every format over the same items (`surgeon sinks`): per head the
    attention to the first token (Gu et al.'s mass and sink rate at `epsilon`), from the last prompt token, the
    strongest other sink; per layer the first token's residual norm against the others', the largest activation
    with Sun et al.'s massive criterion and the super neurons that write it; per head the concentration of its
    queries and keys. With `intervene`, the sinks tested as causes of the failure (a `SinkInterventionResult`):
    each sink removed (`heads`: these heads' instead, e.g. "L1H0,L1H6"), the massive dimension and its super neuron
    ablated, and (`amplify=(position, factor, layer)`) a token's residual stream amplified, each in every format.
    `tag`: only these items (default: every item measured; the effects of interventions on the case's focus)."""
    if not 0 < epsilon < 1:
        raise AnalysisError(f"epsilon {epsilon} is not in (0, 1)", field="--epsilon", fix="e.g. 0.3 (Gu et al.'s)")
    if heads is not None and not intervene:
        raise AnalysisError("heads name the sinks to remove, which only intervene=True does", field="heads",
                            fix="pass intervene=True, or leave heads out")
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    if intervene:
        return sink_interventions_of(case, model, tag=tag, heads=_head_list(heads), amplify=amplify, epsilon=epsilon,
                                     batch_size=batch_size)
    return sinks_of(case, model, tag=tag or "all", epsilon=epsilon, batch_size=batch_size)


def _head_list(heads) -> list[str] | None:
    """Heads as "L1H0,L1H6", ["L1H0", "L1H6"] or None."""
    if heads is None:
        return None
    return [h.strip() for h in (heads.split(",") if isinstance(heads, str) else heads) if h.strip()]


def _as_repair(repair) -> Repair:
    """A `Repair`, a result holding one, or a folder written by `repair.save(DIR)` / `surgeon repair --out DIR`."""
    if isinstance(repair, Repair):
        return repair
    if isinstance(repair, (str, Path)):
        return read_repair(repair)
    if isinstance(getattr(repair, "repair", None), Repair):
        return repair.repair
    raise AnalysisError(f"cannot apply a {type(repair).__name__}: it holds no repair", field="repair",
                        fix="give a Repair, a RepairResult (surgeon.repair(...)) or a folder written by "
                            "surgeon repair --out DIR")


def measure(repair, case, model=None, *, bad: str | None = None, tag: str | None = None, eval_items=None,
            seed: int = 0, neutral: Sequence[str] | None = None, generate: int = 0, batch_size: int = 256,
            any_model: bool = False, device: str | None = None, dtype: str = "float32"):
    """A saved repair (a folder, a `Repair` or a result holding one) measured on `case`'s items or formats (or
    `eval_items`), with every measure `surgeon.repair` takes (`surgeon repair --from DIR CASE`): how it generalizes
    to formats, items and tasks it was not built on. Items it was built on are left out (by their prompts' values).
    `any_model=True`: measured on weights other than those it was built on, on purpose (refused otherwise)."""
    repair = _as_repair(repair)  # before any weight loads
    c = read(case, model)
    if repair.mode not in MODES:
        raise AnalysisError(f"unknown repair mode {repair.mode!r}", field="repair", fix="give a repair surgeon saved")
    check_eval_items(c, model, eval_items, seed)
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    if generate:
        check_generation(case, model, list(case.items), generate)
    return measure_saved(case, model, repair, bad=bad, tag=tag, eval_items=eval_items, seed=seed, neutral=neutral,
                         generate=generate, batch_size=batch_size, any_model=any_model)


def fold(repair, model, out, *, rule: str = "slot0", format: str = "auto", strength: float | None = None,
         any_model: bool = False, device: str | None = None, dtype: str = "float32") -> str:
    """Write the model with `repair` folded into its weights (acting at every position, `rule`: "slot0" or "mean") to
    folder `out`: a Hugging Face folder that transformers loads (for a model given as its Hugging Face folder, or
    `format="hf"`), else a TransformerLens checkpoint (`--model DIR` reads it). `model`: a spec (organism:NAME, a
    folder) or a HookedTransformer. Returns the format written. `surgeon.repairs.fold` says what is exact and why.
    A repair built on other weights of the same shape is refused unless `any_model=True`."""
    repair = _as_repair(repair)
    check_rule(rule)
    if is_bridge(model) or isinstance(model, BridgeModel) or str(model).startswith(BRIDGE):
        raise ModelError("a repair folds into a HookedTransformer's weights, and the model is a TransformerLens "
                         "TransformerBridge (its parameters are the Hugging Face modules', named otherwise)",
                         field="model",
                         fix="fold into the checkpoint itself: surgeon.fold(repair, 'DIR', out, any_model=True) (a "
                             "repair built on the bridge records the bridge's digest)")
    source = str(model) if isinstance(model, (str, Path)) else None
    if source is not None:
        model = load_model(source, device=device_of(device), dtype=dtype)
    check_fits(repair, model, any_model)
    if any_model:  # checked here, on purpose: the folded model records the weights it was folded into instead
        repair = replace(repair, built_on={**repair.built_on, "model_sha256": model_digest(model)})
    return save_folded(repair, model, out, rule=rule, fmt=format, source=source, strength=strength)


def apply(model, repair, strength: float | None = None, last=None, any_model: bool = False):
    """A context manager under which `model` (a HookedTransformer) runs with `repair` applied (see
    `surgeon.repairs.artifact.apply`): ``model.generate`` as it is; any other forward with `last`, each row's last
    prompt position (an int, one per row, or "end"), without which such a forward is refused. `repair`: a `Repair`, a
    result holding one, or a folder written by `repair.save(DIR)` / `surgeon repair --out DIR`. A repair built on other
    weights of the same shape is refused unless `any_model=True`."""
    model = unwrapped(model)  # a BridgeModel: the bridge it wraps, where the repair's hooks and generate wrapper go
    if is_bridge(model):  # a bridge's cached generate reads its cache only with this on (cache_named)
        return _bridge_applied(model, _as_repair(repair), strength, last, any_model)
    return apply_repair(model, _as_repair(repair), strength, last, any_model)


@contextmanager
def _bridge_applied(bridge, repair, strength, last, any_model):
    with cache_named(bridge), apply_repair(bridge, repair, strength, last, any_model) as applied:
        yield applied


def blend(case, model=None, *, layer: int, heads=None, component: str = "z",
          step: float = 0.01, bad: str | None = None, tag: str | None = None, batch_size: int = 256,
          metric=None, device: str | None = None, dtype: str = "float32"):
    """Blend (1-a) failing + a good for chosen heads (numbers, "0,2", "L0H6" or a list of labels; default every head
    of `layer`): where does repair switch on? (`surgeon blend`)"""

    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    return blend_heads(case, model, layer=layer, heads=heads,
                          component=component, step=step, bad=bad, tag=tag, batch_size=batch_size)


def circuit(case, model=None, *, method: str | None = None, ig_steps: int = IG_STEPS, ablation: str = ABLATIONS[0],
            semantics: str = "kept", direction: str = "denoise", faithfulness: float = 0.9, edges: int | None = None, paths: int = 10,
            verify: int = 50, bad: str | None = None, tag: str | None = None, batch_size: int = 256,
            max_memory: int | str | None = None, metric=None, holdout: float | None = None, eval_items=None,
            folds: int | None = None, seed: int = 0,
            device: str | None = None, dtype: str = "float32"):
    """Path-level circuit discovery: score every edge, prune the smallest faithful circuit, rank complete paths
    by path patching (`surgeon circuit`); `r.export("c.mib.json", "c.svg", ...)` writes the graph. `semantics`:
    "kept" (MIB's: keep the circuit, ablate the rest) or "knockout" (ablate the circuit). The batch size is
    lowered to fit `max_memory` (default: the device's free memory).

    `holdout` (e.g. 0.5): the circuit is found on a seeded, tag-stratified discovery share of the items (`seed`) and
    its faithfulness measured on the rest (the result; MIB's protocol): a `HeldOutCircuit` (`.search` is the circuit,
    `.search.export(...)` writes it). `eval_items` instead: found on every item, measured on these (a number: fresh
    items from the case's `draw`; a case file's path; a list of Items)."""
    holdout = evaluation_choice(holdout, eval_items, folds)
    case = read(case, model)
    check_eval_items(case, model, eval_items, seed)  # refused before the model loads
    if folds is not None:
        fold_items(pick_items(case, tag)[1], folds, seed)
    if holdout is not None:
        eval_split(case, tag, holdout, seed, None)  # too few items for the split: refused now
    method = method or default_method(case, ablation)
    check_options(method, ablation, ig_steps, None if edges else faithfulness, edges, semantics)
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    _warn_if_no_failure(case, model, bad, tag, batch_size)
    batch_size = planned_batch_size(plan_circuit, case, model, method, ig_steps, verify, ablation, batch_size=batch_size,
                                    max_memory=max_memory, bad=bad, direction=direction, tag=tag)
    if folds is not None:
        return circuit_folds(case, model, folds=folds, seed=seed, tag=tag, bad=bad, batch_size=batch_size,
                             method=method, ablation=ablation, semantics=semantics, direction=direction,
                             target=None if edges else faithfulness, n_edges=edges, n_paths=0, ig_steps=ig_steps,
                             verify=verify)
    if holdout is not None or eval_items is not None:
        return circuit_heldout(case, model, holdout=holdout or 0.5, eval_items=eval_items, seed=seed, tag=tag, bad=bad, batch_size=batch_size,
                               method=method, ablation=ablation, semantics=semantics, direction=direction,
                               target=None if edges else faithfulness, n_edges=edges, n_paths=paths,
                               ig_steps=ig_steps, verify=verify)
    return discover(case, model, method=method, ablation=ablation, semantics=semantics, direction=direction,
                    bad=bad, tag=tag, target=None if edges else faithfulness, n_edges=edges, n_paths=paths, ig_steps=ig_steps,
                    verify=verify, batch_size=batch_size)


def circuit_eval(case, graph, model=None, *, ablation: str | None = None, semantics: str | None = None,
                 direction: str | None = None,
                 bad: str | None = None, tag: str | None = None, batch_size: int = 256, metric=None, device: str | None = None,
                 dtype: str = "float32") -> dict:
    """The faithfulness of a circuit file (any JSON export, or a circuit's results.json), with its interval
    (`surgeon circuit-eval`). `ablation`, `semantics`, `direction` and `bad` default to what the file records the
    circuit was found under (else resample, kept, denoise, the case's first failing format); the result's `notes`
    say every choice that differs from the file's record or that the file does not record."""

    edges = read_circuit_file(Path(graph), edges_only=True)
    case, model = case_and_model(case, model, device=device, dtype=dtype, metric=metric)
    return evaluate_circuit(case, model, edges, ablation=ablation, semantics=semantics, direction=direction, bad=bad,
                            tag=tag, batch_size=batch_size, where=str(graph))


# SAE features: the SAEs come from sae_release + sae_id (a sae-lens release in the local cache), sae_dir (local
# sae-lens directories; {layer} is replaced) or, when none is given, the case's `saes`.

def _saes(case, model, layers, sae_release, sae_id, sae_dir, device, dtype, field: str = "--layers"):
    """{layer: SAE}, {layer: where it came from} and the source, for the layers asked (None: every layer with one);
    `field` names the option that asked for them."""
    source = SAESource.from_case(case, sae_release, sae_id, sae_dir)
    layers = source.layers(model.cfg.n_layers, layers, field)
    source.check_available(layers)
    dev = str(next(model.parameters()).device) if device is None else device_of(device)
    saes = {L: load_sae(source, L, dev, dtype, model.cfg.d_model) for L in layers}
    _warn_other_model(case, saes, source)
    return saes, {L: source.describe(L) for L in layers}, source


def _warn_other_model(case, saes: dict, source) -> None:
    """Warn when an SAE's cfg.json names another model than the case runs (a copied folder, a wrong release):
    its features would be read from activations it was not trained on. Names are compared loosely (the last part of
    a path or hub id, lower case, one containing the other: gpt2 and gpt2-small agree)."""
    def norm(name: str) -> str:
        return str(name).lower().removeprefix("organism:").rstrip("/").split("/")[-1]

    if not isinstance(case.model, str):
        return
    ours = norm(case.model)
    for L, sae in saes.items():
        theirs = getattr(getattr(sae.cfg, "metadata", None), "model_name", None)
        if theirs and ours and norm(theirs) not in ours and ours not in norm(theirs):
            warn(f"the SAE for layer {L} ({source.describe(L)}) was trained on {theirs!r} (its cfg.json), but the case "
                 f"runs {case.model!r}: its features read activations it was not trained on unless the two are the "
                 "same model")


def sae_overlap(case, model=None, *, layers: Sequence[int] | None = None, top_k: int = 20, position: str = "last",
                bad: str | None = None, tag: str | None = None, sae_release: str | None = None,
                sae_id: str | None = None, sae_dir: str | None = None, batch_size: int = 256,
                device: str | None = None, dtype: str = "float32"):
    """Per layer: top-k feature overlap, Jaccard and weighted Jaccard between the good and each failing format,
    with intervals over items (`surgeon sae overlap`; every item unless `tag`)."""
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    saes, where, _ = _saes(case, model, layers, sae_release, sae_id, sae_dir, device, dtype)
    return overlap(case, model, saes, k=top_k, position=position, bad=bad, tag=tag or "all", batch_size=batch_size,
                   sources=where)


def sae_amplified(case, model=None, *, layer: int, position: str = "last", labels=None, top: int = 20,
                  min_items: int | None = None, bad: str | None = None, tag: str | None = None,
                  sae_release: str | None = None, sae_id: str | None = None, sae_dir: str | None = None,
                  batch_size: int = 256, device: str | None = None, dtype: str = "float32"):
    """Features active in both formats ranked by activation ratio failing/good, and features active in one format
    only (`surgeon sae amplified`). `labels`: {feature: label}, or the path of a JSON file holding them."""
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    saes, where, source = _saes(case, model, [layer], sae_release, sae_id, sae_dir, device, dtype, "--layer")
    if isinstance(labels, (str, Path)):
        try:
            labels = json.loads(Path(labels).read_text())
            labels = {str(k): str(v) for k, v in labels.items()}
        except (OSError, ValueError, AttributeError) as e:
            raise SurgeonError(f"cannot read labels from {labels}: {e}", field="--labels",
                               fix='give a JSON object {"123": "label of feature 123", ...}') from None
    return amplified(case, model, saes[layer], layer, bad=bad, position=position, tag=tag or "all",
                     min_items=min_items, top=top, labels=labels, neuronpedia=source.neuronpedia(layer),
                     batch_size=batch_size, source=where[layer])


def sae_heads(case, model=None, *, layer: int, sae_layer: int, top: int = 10, groups: Sequence[str] = ("even", "odd"),
              bad: str | None = None, tag: str | None = None, batch_size: int = 256, sae_release: str | None = None,
              sae_id: str | None = None, sae_dir: str | None = None, device: str | None = None,
              dtype: str = "float32"):
    """How much each head of `layer` (and each head group), patched from the good format into the failing one,
    moves the top SAE features at `sae_layer` (`surgeon sae heads`)."""
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    saes, where, _ = _saes(case, model, [sae_layer], sae_release, sae_id, sae_dir, device, dtype, "--sae-layer")
    return head_feature_effects(case, model, saes[sae_layer], layer=layer, groups=list(groups), bad=bad, tag=tag,
                                top=top, batch_size=batch_size, source=where[sae_layer])


def sae_repair(case, model=None, *, layer: int, top: int = 8, budget: int = 2000, item_rate: float = 1.0,
               direction: str = "denoise", bad: str | None = None, tag: str | None = None, batch_size: int = 256,
               sae_release: str | None = None, sae_id: str | None = None, sae_dir: str | None = None,
               device: str | None = None, dtype: str = "float32", progress: bool = False,
               holdout: float | None = None, eval_items=None, seed: int = 0):
    """Feature-level repair: attribution over all features of the SAE at `layer`, then subsets of the top ones,
    against patching the whole activation (`surgeon sae repair`). `holdout` (e.g. 0.5, seeded by `seed`) or
    `eval_items`: the features are chosen on discovery items and patched on the held-out ones (a
    `HeldOutFeatureRepair`)."""
    holdout = evaluation_choice(holdout, eval_items)
    if holdout is not None or eval_items is not None:  # refused before any weight loads
        eval_split(read(case, model), tag, holdout, seed, eval_items)
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    saes, where, _ = _saes(case, model, [layer], sae_release, sae_id, sae_dir, device, dtype, "--layer")
    if holdout is not None or eval_items is not None:
        return sae_repair_heldout(case, model, saes[layer], holdout=holdout or 0.5, seed=seed, tag=tag, bad=bad,
                                  batch_size=batch_size, eval_items=eval_items, top=top, direction=direction,
                                  budget=budget, item_rate=item_rate, source=where[layer], progress=progress)
    return feature_repair(case, model, saes[layer], top=top, direction=direction, bad=bad, tag=tag, budget=budget,
                          item_rate=item_rate, batch_size=batch_size, source=where[layer], progress=progress)


def feature_circuit(case, model=None, *, layers: Sequence[int] | None = None, method: str = "ig", steps: int = 5,
                    verify: int = 20, faithfulness: float | None = None, threshold: float | None = None,
                    bad: str | None = None, tag: str | None = None, batch_size: int = 256,
                    sae_release: str | None = None, sae_id: str | None = None, sae_dir: str | None = None,
                    by_position: bool = False, max_memory: int | str | None = None, device: str | None = None,
                    dtype: str = "float32", progress: bool = False, holdout: float | None = None, eval_items=None,
                    seed: int = 0, exact: str = "joint", threshold_over: str = "mean", edge_rule: str = "all"):
    """The feature circuit (SAE features and each SAE's error term as nodes) of the failing format and of the
    working one, their difference and the repair it suggests (`surgeon feature-circuit`; every layer with an SAE
    unless `layers`; `by_position`: a node per feature and error term at each aligned position). The batch size is
    lowered to fit `max_memory` (default: the device's free memory): the plan counts the SAEs' feature tensors.
    `holdout` (e.g. 0.5, seeded by `seed`) or `eval_items`: found on discovery items and measured on the held-out ones
    (a `HeldOutFeatureCircuit`). `exact`: a node's exact effect patched at every aligned position at once ("joint")
    or at one position at a time and summed ("per-position", Marks et al.'s). `threshold_over`: "mean" keeps every
    node whose attribution reaches `threshold` (the aggregated effect, as Marks et al. threshold nodes), "example"
    every node whose effect on one item at one aligned position does (surgeon's own rule). `edge_rule`: "all" computes
    each edge from every (item, position) entry of its downstream node, "marks" only from the entries whose own effect
    reaches `threshold` (Marks et al.'s: their per-example threshold chooses the entries `jvp` runs on)."""
    check_threshold_over(threshold_over, threshold, field="threshold_over")  # refused before any weight loads
    check_edge_rule(edge_rule, threshold, field="edge_rule")
    if exact not in EXACT:  # refused before any weight loads
        raise AnalysisError(f"exact effects {exact!r} are not one of {', '.join(EXACT)}", field="exact",
                            fix="joint (every aligned position at once) or per-position (Marks et al.'s, summed)")
    holdout = evaluation_choice(holdout, eval_items)
    if holdout is not None or eval_items is not None:  # refused before any weight loads
        eval_split(read(case, model), tag, holdout, seed, eval_items)
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    saes, where, _ = _saes(case, model, layers, sae_release, sae_id, sae_dir, device, dtype)
    batch_size = planned_batch_size(plan_feature_circuit, case, model, saes, method, steps, verify, by_position,
                                    batch_size=batch_size, max_memory=max_memory, bad=bad, tag=tag)
    if holdout is not None or eval_items is not None:
        return feature_circuit_heldout(case, model, saes, holdout=holdout or 0.5, seed=seed, tag=tag, bad=bad,
                                       batch_size=batch_size, eval_items=eval_items, method=method, steps=steps,
                                       verify=verify, target=faithfulness, threshold=threshold, sources=where,
                                       by_position=by_position, progress=progress, exact=exact,
                                       threshold_over=threshold_over, edge_rule=edge_rule)
    return feature_circuit_of(case, model, saes, method=method, steps=steps, verify=verify, target=faithfulness,
                              threshold=threshold, bad=bad, tag=tag, batch_size=batch_size, sources=where,
                              by_position=by_position, progress=progress, exact=exact, threshold_over=threshold_over,
                              edge_rule=edge_rule)


# One command from a case to a paper

class _StepFolders:
    """Each report step's result in its own folder under the report's (what the command writes for it, plus
    step.json: the options it ran with and its key: every input that changes a number, i.e. the case's content
    (`content_digest`: formats, items, metric, ..., however the case was made),
    the model's (config and weights, `model_digest`), its dtype, the device type, the SAEs' sources and files, and the
    versions of surgeon and the libraries); a step whose folder holds the same options and key is reused."""

    def __init__(self, out: Path, case: Case, device: str | None, key: dict):
        self.out, self.case, self.device, self.key = Path(out), case, device, to_jsonable(key)

    def get(self, step: str, options: dict):
        meta = self.out / step / "step.json"
        if not meta.is_file() or not (self.out / step / "manifest.json").is_file():
            return None  # never finished
        if self.key.get("case_content_sha256") is None:
            return None  # the case's content cannot be keyed (a metric function without source): always computed
        try:
            m = json.loads(meta.read_text())
            if (not isinstance(m, dict) or m.get("options") != to_jsonable(options) or m.get("key") != self.key
                    or m.get("type") not in RESULT_TYPES):
                return None
            return _step_result(m["type"], self.out / step)
        except (OSError, ValueError, KeyError, TypeError, SurgeonError):  # unreadable: the step runs again, rewritten
            return None

    def put(self, step: str, result, options: dict) -> None:
        result.save(self.out / step, self.case, device=self.device)
        write_json(self.out / step / "step.json", {"type": type(result).__name__, "options": options, "key": self.key})


def report_key(case: Case, model, source: SAESource | None) -> dict:
    """Every input of a report step that changes a number besides its options (see `_StepFolders`)."""
    p = next(model.parameters())
    if source is None and case.saes:
        try:
            source = SAESource.from_case(case)
        except SurgeonError:
            source = None
    # the case by content (formats, items, metric with a function's source, ...): an edit in Python is another case;
    # None (a metric function without source) is never reused
    return {"case_content_sha256": content_digest(case), "metric": case_metric_of(case).label,
            "model_sha256": model_digest(model), "dtype": str(p.dtype),
            "device_type": p.device.type, "saes": source.digest() if source is not None else None,
            "versions": versions()}


RESULT_TYPES = {cls.__name__: cls for cls in (Diagnosis, LogitAttributionResult, PatchResult, PositionPatchResult,
                                                ThresholdResult, HeldOutThreshold, HeldOutCircuit, HeldOutPatch, HeldOutFeatureCircuit, HeldOutFeatureRepair, BlendResult, CircuitResult, AttentionResult,
                                                OverlapResult, AmplifiedResult, HeadFeatureResult, FeatureRepairResult,
                                                FeatureCircuitResult, RepairResult, FoldsThreshold,
                                                FoldsCircuit, SinkResult, SinkInterventionResult, ScanResult)}


def _step_result(type_name: str, folder: Path):
    """A saved result of type `type_name` read back from `folder` (a repair's tensors from its safetensors)."""
    data = json.loads((folder / "results.json").read_text())["result"]
    if type_name == "RepairResult":
        data.pop("repair", None)
        return replace(from_jsonable(RepairResult, {**data, "repair": None}), repair=read_repair(folder))
    return from_jsonable(RESULT_TYPES[type_name], data)


LOADABLE = {cls.__name__: cls for cls in (*RESULT_TYPES.values(), AttributionResult, Encoding)}


def read_circuit(path):
    """A circuit file as a `CircuitGraph` (`surgeon.circuits.graph`): the `.json` or `.mib.json` that `surgeon circuit
    --export` writes, the results.json of `surgeon circuit --out`, or an EAP-IG / MIB circuit JSON. A networkx
    `DiGraph` with the scores, exact effects and circuit marks (`.marks()`, `.circuit_names()`), the model's shape
    (`.cfg`) and semantics; `.to_json()` gives the file's data back, and `circuits.export.write(g, PATH)` writes it in
    any export format."""
    return read_circuit_file(Path(path))


def load(path):
    """A result saved by `r.save(DIR)` or `surgeon COMMAND --out DIR` (DIR/results.json), or a whole report
    folder (`surgeon report --out DIR`: its `Report`, every step read back from its folder), rebuilt as the
    analysis returned it: it prints, draws and saves as before."""
    path = Path(path)
    bad = dict(where=str(path), field="load", fix="give a folder written by r.save(DIR), surgeon COMMAND --out DIR "
                                                  "or surgeon report --out DIR")
    manifest_file = path / "manifest.json"
    if not path.is_dir():
        raise AnalysisError("cannot read it: it is not a folder", **bad)
    if not manifest_file.is_file():
        raise AnalysisError("holds no manifest.json: surgeon writes it last, so this is not a finished result "
                            "(an interrupted run, or a folder surgeon did not write)", **bad)
    try:
        m = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as e:
        raise AnalysisError(f"its manifest.json cannot be read ({type(e).__name__})", **bad) from None
    if not isinstance(m, dict) or not isinstance(m.get("command"), str):
        raise AnalysisError("its manifest.json is not one surgeon wrote (no command recorded)", **bad)
    wrote = str((m.get("versions") or {}).get("surgeon", "")) if isinstance(m.get("versions"), dict) else ""
    def series(v: str) -> tuple:  # what may change formats: the major version, and the minor while it is 0.x
        parts = v.split(".")
        return tuple(parts[:2]) if parts[0] == "0" else tuple(parts[:1])

    if wrote and series(wrote) != series(__version__):
        kind = "another minor version of 0.x" if __version__.startswith("0.") else "another major version"
        raise AnalysisError(f"was written by surgeon {wrote}; this is surgeon {__version__}, {kind} whose "
                            "results may mean other things", **{**bad, "fix": f"read it with surgeon {wrote}, "
                                                                             "or run the analysis again"})
    if isinstance(m.get("report"), dict):
        return _load_report(path, m["report"], bad)
    if m.get("command") == "repair":  # a repair (repair.save) or a measured one (surgeon repair --out)
        if not (path / "results.json").is_file():
            return read_repair(path)
        try:
            return _step_result("RepairResult", path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise AnalysisError(f"{path / 'results.json'} does not hold a repair's measures ({type(e).__name__})",
                                **bad) from None
    if isinstance(m, dict) and m.get("command") == "report":  # written before the manifest said more
        steps = [p.name for p in sorted(path.iterdir()) if (p / "step.json").is_file()]
        if not steps:
            raise AnalysisError("its manifest says report, but the folder holds no step (no STEP/step.json): an "
                                "interrupted report, or a folder surgeon did not write", **bad)
        order = [*STEPS[:-1], "sae_overlap", "sae_amplified", "sae_heads", "sae_repair", "sae_feature_circuit", "repair"]
        steps.sort(key=lambda s: order.index(s) if s in order else len(order))
        case = (m.get("case") or {}).get("name", "?") if isinstance(m.get("case"), dict) else "?"
        return _load_report(path, {"case": case, "model": (m.get("model") or {}).get("spec", "?")
                                   if isinstance(m.get("model"), dict) else "?", "steps": steps}, bad)
    try:
        saved = json.loads((path / "results.json").read_text())
    except (OSError, ValueError) as e:
        raise AnalysisError(f"cannot read {path / 'results.json'} ({type(e).__name__})", **bad) from None
    view_of(Diagnosis.__new__(Diagnosis))  # the views are registered the first time one is needed
    by_command = {VIEWS[name].command: cls for name, cls in LOADABLE.items() if name in VIEWS}
    cls = by_command.get(saved.get("command")) if isinstance(saved, dict) else None
    if cls is None or not isinstance(saved.get("result"), dict):
        raise AnalysisError(f"{path / 'results.json'} holds no result surgeon can read back (command "
                            f"{saved.get('command') if isinstance(saved, dict) else None!r})", **bad)
    try:
        return from_jsonable(cls, saved["result"])
    except (TypeError, ValueError, KeyError) as e:
        raise AnalysisError(f"{path / 'results.json'} does not hold a {cls.__name__} ({type(e).__name__}: "
                            f"{str(e)[:120]})", **bad) from None


def _load_report(path: Path, meta: dict, bad: dict):
    rep = Report(meta.get("case", "?"), meta.get("model", "?"), skipped=meta.get("skipped") or {},
                 facts=meta.get("facts") or {})
    for step in meta.get("steps") or []:
        if not isinstance(step, str) or not step or step != Path(step).name or step in (".", ".."):
            raise AnalysisError(f"the report's manifest names a step {str(step)[:60]!r} that is not a folder inside "
                                "it", **bad)
        try:
            info = json.loads((path / step / "step.json").read_text())
            rep.steps[step] = _step_result(info["type"], path / step)
            rep.options[step] = info.get("options") or {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise AnalysisError(f"the report's step {step!r} cannot be read back ({type(e).__name__})",
                                **{**bad, "where": str(path / step)}) from None
    return rep


def report(case, model=None, *, out: str | Path | None = None, steps: Sequence[str] = STEPS, layer: int | None = None,
           budget: int = 200, verify: int = 50, paths: int = 10, sae_release: str | None = None,
           sae_id: str | None = None, sae_dir: str | None = None, batch_size: int = 256, device: str | None = None,
           dtype: str = "float32", bad: str | None = None, tag: str | None = None, item_rate: float = 1.0,
           heads: str | None = None, groups: Sequence[str] | None = None, seed: int = 0,
           holdout: float | None = None, eval_items=None, progress: bool = False):
    """The whole pipeline on a case (`surgeon report`): diagnose, per-head patching, the subset search and the blend
    at the layer patching repairs most (or `layer`), the circuit, and the SAE analyses where there are SAEs. With
    `out`, each step's results go to out/STEP (an interrupted report resumes from them) and the page to
    out/report.html, with every figure as PDF and SVG under out/figures. The subset search takes `heads`, `groups`,
    `item_rate` and `seed` as `threshold` does. The subset search and the circuit run on discovery items and are
    reported on held-out ones, the result: `holdout` the share held out (seeded by `seed`, stratified by tag; default
    0.5; 0: every item, in-sample, and no repair step), or `eval_items` other items (a number of fresh items from the case's `draw`, a
    case file, or Items). Returns the `Report` (its `.save(dir)` writes the page again)."""
    holdout = evaluation_choice(holdout, eval_items, default=0.5)
    if "repair" in steps and holdout is None and eval_items is None:
        raise AnalysisError("the repair step measures the repair on items it was not built on; holdout=0 holds none "
                            "out", field="holdout", fix="give holdout=FRAC or eval_items, or leave the repair step out")
    if "scan" in steps:  # the case's scan= parts, before the weights load
        c = read(case, model)
        check_scan(c.scan, c.source)
    if {"threshold", "circuit", "repair", "scan"} & set(steps) and (holdout or eval_items is not None):  # before weights load
        eval_split(read(case, model), tag, holdout, seed, eval_items)
    if "repair" in steps:  # a case the repair step cannot run on is refused before any step runs, not after them
        check_repairable(read(case, model), "mean", "z", holdout=holdout, eval_items=eval_items)
    case, model = case_and_model(case, model, device=device, dtype=dtype)
    source = SAESource.from_case(case, sae_release, sae_id, sae_dir) if (sae_release or sae_id or sae_dir) else None
    store = _StepFolders(Path(out), case, device, report_key(case, model, source)) if out is not None else None
    rep = run_report(case, model, steps=steps, layer=layer, budget=budget, verify=verify, paths=paths,
                     sae_source=source, batch_size=batch_size, store=store, bad=bad, tag=tag, item_rate=item_rate,
                     heads=heads, groups=groups, seed=seed, holdout=holdout, eval_items=eval_items, progress=progress)
    if out is not None:
        rep.save(out, case, device=device)
    return rep
