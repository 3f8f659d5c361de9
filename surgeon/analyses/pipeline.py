"""One command from a case to a paper: the analyses in order, each step reusing a finished earlier run.

    diagnose -> dla (direct logit attribution per head and layer, the logit lens) -> patch (every head of every
    layer) -> positions (that layer's heads patched at each aligned position) -> threshold (subsets at the layer
    patching repairs most; even/odd groups when it has at least 4 heads) -> blend (that layer's heads) -> circuit
    (edges scored, the top ones verified exactly, the smallest faithful prefix, its strongest paths) -> attention
    (the patterns of the circuit's strongest heads on the first item, every format) -> sinks (attention sinks, massive
    activations and their super neurons in every format, and each tested as a cause of the failure by intervening on
    it: `surgeon sinks --intervene`) -> sae (where the case has SAEs:
    overlap per layer; amplified features and feature repair at the layer whose features overlap least; the
    patched layer's heads against those features; the feature circuit over every SAE), each step under one progress
    bar over the steps

Each step's result is handed to `store.put` and asked of `store.get` first (the API keeps them in the report's
folder, so an interrupted report resumes); what the steps did and with which options is the `Report`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence

import numpy as np

from surgeon.analyses.attention import attention_patterns
from surgeon.analyses.blend import blend
from surgeon.analyses.circuit import default_method, discover
from surgeon.analyses.diagnose import diagnose
from surgeon.analyses.feature_circuit import feature_circuit
from surgeon.analyses.heldout import HeldOutCircuit, circuit_heldout, eval_items_of, threshold_heldout
from surgeon.analyses.logit_attribution import logit_attribution
from surgeon.analyses.patching import patch_heads
from surgeon.analyses.positions import patch_positions
from surgeon.analyses.repair import search_repair
from surgeon.analyses.scan import BUDGET as SCAN_BUDGET
from surgeon.analyses.scan import scan_formats
from surgeon.analyses.steering_baselines import compare_baselines
from surgeon.analyses.sae_features import amplified, overlap
from surgeon.analyses.sae_heads import head_feature_effects
from surgeon.analyses.sae_repair import feature_repair
from surgeon.analyses.sink_interventions import sink_interventions
from surgeon.analyses.sinks import EPSILON
from surgeon.errors import AnalysisError
from surgeon.results import versions
from surgeon.sae.load import SAESource, load_sae
from surgeon.analyses.threshold import threshold_search
from surgeon.show import Shows
from surgeon.case.case import Case, content_digest

STEPS = ("diagnose", "dla", "patch", "positions", "threshold", "blend", "circuit", "attention", "sinks", "sae")
# steps a report runs only when asked (--steps ...,repair): the repair search adds a minute on the decimal organism
OPTIONAL_STEPS = ("scan", "repair")
ATTENTION_HEADS = 4  # the circuit's heads whose patterns the report shows


class Store(Protocol):
    def get(self, step: str, options: dict): ...  # the result of a finished step run with these options, or None

    def put(self, step: str, result, options: dict) -> None: ...


class _Memory:
    def get(self, step, options):
        return None

    def put(self, step, result, options):
        pass


@dataclass
class Report(Shows):
    """What `surgeon report` found: each step's result (in `STEPS` order) and the options it ran with."""

    case: str
    model: str
    steps: dict = field(default_factory=dict)  # step -> result (sae: {"overlap": ..., "amplified": ..., ...})
    options: dict = field(default_factory=dict)  # step -> its options
    reused: list = field(default_factory=list)  # steps taken from an earlier run's results
    skipped: dict = field(default_factory=dict)  # step -> why it did not run
    facts: dict = field(default_factory=dict)  # the model's shape, the items, versions: for the methods paragraph


SAE_STEPS = ("sae_overlap", "sae_amplified", "sae_heads", "sae_repair", "sae_feature_circuit")  # what "sae" runs


def bar_total(steps: Sequence[str], saes: bool) -> int:
    """How many steps the progress bar counts: as the page's header lists them, the SAE step as its five parts (none
    where there are no SAEs: it is skipped)."""
    return len([s for s in steps if s != "sae"]) + (len(SAE_STEPS) if "sae" in steps and saes else 0)


def repair_layer(patch) -> int:
    """The layer where patching single heads repairs most: the largest sum of positive repair fractions."""
    frac = np.nan_to_num(np.asarray(patch.fraction, dtype=float), nan=0.0)
    return int(patch.layers[int(np.argmax(np.clip(frac, 0, None).sum(1)))])


def run_report(case: Case, model, *, steps=STEPS, layer: int | None = None, budget: int = 200,
               blend_step: float = 0.02, circuit_method: str | None = None, verify: int = 50, paths: int = 10,
               sae_source: SAESource | None = None, batch_size: int = 256, store: Store | None = None,
               bad: str | None = None, tag: str | None = None, item_rate: float = 1.0, heads: str | None = None,
               groups: Sequence[str] | None = None, seed: int = 0, holdout: float | None = 0.5, eval_items=None,
               progress: bool = False) -> Report:
    """Run `steps` on `case` (see the module's docstring); `layer` fixes the threshold and blend layer; `bad` and
    `tag` pick the failing format and the items (default: the case's first failing format and its focus; the SAE
    comparisons default to every item). The subset search: `heads` its candidates (default: every head of the
    layer), `groups` the built-in groups searched within (default: even, odd and a random half, with 4 heads or
    more), `item_rate` the fraction of items a repairing subset gets right, `seed` its sampling and the split's.

    The steps that select (the subset search and the circuit) run on discovery items and report what they chose on
    held-out items, the result (`heldout`): `holdout` the share of the items held out (seeded by `seed`, stratified by
    tag), or `eval_items` other items to evaluate on (a number of fresh items from the case's `draw`, a case file, or
    Items); `holdout=None` (or 0) with no `eval_items` runs them on every item, every number in-sample."""
    unknown = [s for s in steps if s not in STEPS + OPTIONAL_STEPS]
    if unknown:
        raise AnalysisError(f"unknown report steps {unknown}", field="--steps",
                            fix=f"choose from: {', '.join(STEPS + OPTIONAL_STEPS)}")
    store = store or _Memory()
    rep = Report(case.name, case.model or "(given in memory)", facts=_facts(case, model))

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=bar_total(steps, sae_source is not None or bool(case.saes)), desc="report", unit="step")

    def step(name, options, run):
        if bar is not None:
            bar.set_postfix_str(name)
        got = store.get(name, options)
        if got is not None:
            rep.reused.append(name)
        else:
            got = run()
            store.put(name, got, options)
        rep.steps[name], rep.options[name] = got, options
        if bar is not None and (name in steps or name.startswith("sae_")):  # each SAE step counts, as listed
            bar.update(1)
        return got

    H = model.cfg.n_heads
    sel = {"bad": bad, "tag": tag}  # in every step's options: a stored step is reused only for the same choice
    held = bool(holdout) or eval_items is not None
    # how the selecting steps split the items (in their options: a stored step is reused only for the same split)
    split = ({"holdout": holdout if eval_items is None else None, "split_seed": seed,
              "eval_items": _eval_key(case, eval_items, seed)} if held else {"holdout": None})
    if "scan" in steps:  # where the model fails and which part of the format causes it, chosen and measured held out
        opts = {"budget": SCAN_BUDGET, "seed": seed, "tag": tag, **split}
        step("scan", opts, lambda: scan_formats(case, model, tag=tag, holdout=holdout if held and eval_items is None
                                                else None, eval_items=eval_items, seed=seed, batch_size=batch_size,
                                                progress=progress))
    if "diagnose" in steps:
        step("diagnose", {"batch_size": batch_size}, lambda: diagnose(case, model, batch_size=batch_size,
                                                                      progress=progress))
    if "dla" in steps:
        step("dla", {"tag": tag}, lambda: logit_attribution(case, model, tag=tag, batch_size=batch_size))
    patch = None
    if "patch" in steps or (layer is None and {"positions", "threshold", "blend", "sae"} & set(steps)):
        opts = {"layers": list(case.layers) if case.layers else None, "component": "z", **sel}
        patch = step("patch", opts, lambda: patch_heads(case, model, layers=opts["layers"], batch_size=batch_size,
                                                        progress=progress, **sel))
    L = layer if layer is not None else (repair_layer(patch) if patch is not None else None)  # None: no step needs it
    if groups is None:
        groups = ["even", "odd", "random"] if H >= 4 and heads is None else []  # random: a half at random, the control
    groups = list(groups)
    if "positions" in steps:
        opts = {"layers": [L], "component": "z", **sel}
        step("positions", opts, lambda: patch_positions(case, model, layers=[L], component="z", batch_size=batch_size,
                                                        **sel))
    if "threshold" in steps:
        opts = {"layer": L, "heads": heads, "groups": groups, "budget": budget,
                "item_rate": item_rate, "seed": seed, **sel, **split}
        search = dict(layer=L, heads=heads, groups=groups, budget=budget, item_rate=item_rate, seed=seed,
                      batch_size=batch_size, progress=progress, bad=bad, tag=tag)
        step("threshold", opts, lambda: threshold_heldout(case, model, holdout=holdout or 0.5, eval_items=eval_items,
                                                          **search) if held else threshold_search(case, model, **search))
    if "blend" in steps:
        opts = {"layer": L, "step": blend_step, **sel}
        step("blend", opts, lambda: blend(case, model, layer=L, step=blend_step, batch_size=batch_size, **sel))
    if "circuit" in steps or "attention" in steps:  # the attention step shows the circuit's heads
        _circuit_steps(rep, step, steps, case, model, method=circuit_method or default_method(case), verify=verify,
                       paths=paths, sel=sel, split=split, held=held, holdout=holdout, eval_items=eval_items,
                       seed=seed, batch_size=batch_size)
    if "sinks" in steps:  # measured over every item; the interventions' effects on the focus items
        opts = {"epsilon": EPSILON, "tag": tag}
        step("sinks", opts, lambda: sink_interventions(case, model, tag=tag, epsilon=EPSILON,
                                                       batch_size=min(batch_size, 64)))
    if "sae" in steps:
        _sae_steps(rep, step, case, model, L, sae_source, batch_size, bad, tag)
    if "repair" in steps:  # a repair that needs the failing prompt alone, chosen on discovery items, measured held out
        _repair_step(step, case, model, sel=sel, split=split, held=held, holdout=holdout, eval_items=eval_items,
                     seed=seed, batch_size=batch_size, progress=progress)
    if bar is not None:
        bar.close()
    return rep


def _circuit_steps(rep: Report, step, steps, case: Case, model, *, method: str, verify: int, paths: int, sel: dict,
                   split: dict, held: bool, holdout, eval_items, seed: int, batch_size: int) -> None:
    """The report's circuit step (found on discovery items, measured held out, where `held`) and the attention step
    that shows the circuit's heads."""
    bad, tag = sel["bad"], sel["tag"]
    opts = {"method": method, "verify": verify, "paths": paths, "faithfulness": 0.9, **sel, **split}
    found = dict(method=method, verify=verify, n_paths=paths, batch_size=batch_size, bad=bad, tag=tag)
    step("circuit", opts, lambda: circuit_heldout(case, model, holdout=holdout or 0.5, seed=seed,
                                                  eval_items=eval_items, **found) if held else
         discover(case, model, **found))
    if "attention" in steps:
        heads = circuit_heads(found_circuit(rep.steps["circuit"]))
        if heads:
            opts = {"heads": heads, "items": [0], **sel}
            step("attention", opts, lambda: attention_patterns(case, model, heads=heads, items=[0], tag=tag,
                                                               batch_size=batch_size))
        else:
            rep.skipped["attention"] = "the circuit holds no attention head"


def _repair_step(step, case: Case, model, *, sel: dict, split: dict, held: bool, holdout, eval_items, seed: int,
                 batch_size: int, progress: bool) -> None:
    """The report's repair step: a repair that needs the failing prompt alone, chosen on discovery items by the
    repair search, measured held out beside the field's steering baselines."""
    bad, tag = sel["bad"], sel["tag"]
    if not held:
        raise AnalysisError("the repair step measures the repair on items it was not built on; holdout=0 holds "
                            "none out", field="--holdout", fix="give --holdout FRAC or --eval-items, or leave the "
                                                               "repair step out")
    rsplit = dict(holdout=holdout if eval_items is None else None, eval_items=eval_items)
    opts = {"mode": "mean", "seed": seed, "max_kl": 0.1, "max_drop": 0.05, "max_heads": 8,
            "baselines": True, **sel, **split}

    def repair_step():
        r = search_repair(case, model, mode="mean", seed=seed, max_kl=0.1, max_drop=0.05,
                          max_heads=8, bad=bad, tag=tag, batch_size=batch_size, progress=progress, **rsplit)
        return replace(r, baselines=compare_baselines(case, model, r, seed=seed, bad=bad, tag=tag,
                                                      batch_size=batch_size, progress=progress, **rsplit))

    step("repair", opts, repair_step)


def found_circuit(result):
    """The circuit a circuit step found: the step's `CircuitResult`, or a held-out one's search on the discovery
    items."""
    return result.search if isinstance(result, HeldOutCircuit) else result


def _eval_key(case: Case, eval_items, seed: int):
    """`eval_items` as a step option: the items it gives, by content (a case file's or a draw's items, not its name
    or the number asked: an edited file or `draw` is other items)."""
    if eval_items is None:
        return None
    items, _ = eval_items_of(case, eval_items, seed)
    return content_digest(replace(case, items=items, draw=None))


def circuit_heads(circuit, n: int = ATTENTION_HEADS) -> list[str]:
    """The `n` heads the circuit's edges touch most (by the sum of their |score|), as "L1H0" names, strongest first."""

    weight: dict[tuple[int, int], float] = {}
    for e in circuit.circuit:
        for end in re.findall(r"a(\d+)\.h(\d+)", circuit.edge_names[int(e)]):
            key = (int(end[0]), int(end[1]))
            weight[key] = weight.get(key, 0.0) + abs(float(circuit.scores[int(e)]))
    best = sorted(weight, key=lambda h: (-weight[h], h))[:n]
    return [f"L{ly}H{h}" for ly, h in best]


def _sae_steps(rep: Report, step, case: Case, model, layer: int, source, batch_size: int, bad: str | None,
               tag: str | None) -> None:
    every = "all" if tag is None else tag  # the feature comparisons read every item unless a tag is chosen
    sel = {"bad": bad, "tag": tag}
    if source is None:
        if not case.saes:
            rep.skipped["sae"] = "the case names no SAEs (give --sae-dir, or saes= in the case)"
            return
        source = SAESource.from_case(case)
    n = model.cfg.n_layers
    layers = source.layers(n)
    dev, dtype = str(next(model.parameters()).device), str(model.cfg.dtype).removeprefix("torch.")
    saes = {L: load_sae(source, L, dev, dtype, model.cfg.d_model) for L in layers}
    where = {L: source.describe(L) for L in layers}
    ov = step("sae_overlap", {"layers": layers, "k": 20, **sel},
              lambda: overlap(case, model, saes, k=20, bad=bad, tag=every, batch_size=batch_size, sources=where))
    at = [L for L in layers if L >= layer] or layers
    lowest = min(at, key=lambda L: _mean_overlap(ov, L))  # where the formats' features differ most
    step("sae_amplified", {"layer": lowest, **sel},
         lambda: amplified(case, model, saes[lowest], lowest, bad=bad, tag=every, batch_size=batch_size,
                           source=where[lowest]))
    step("sae_heads", {"layer": layer, "sae_layer": lowest, **sel},
         lambda: head_feature_effects(case, model, saes[lowest], layer=layer, batch_size=batch_size,
                                      source=where[lowest], **sel))
    step("sae_repair", {"layer": lowest, **sel},
         lambda: feature_repair(case, model, saes[lowest], batch_size=batch_size, source=where[lowest], **sel))
    step("sae_feature_circuit", {"layers": layers, "method": "ig", "steps": 5, "verify": 20, **sel},
         lambda: feature_circuit(case, model, saes, method="ig", steps=5, verify=20, batch_size=batch_size,
                                 sources=where, **sel))


def _mean_overlap(ov, layer: int) -> float:
    """The top-k overlap at `layer`, averaged over the failing formats."""
    i = list(ov.layers).index(layer)
    vals = [m["overlap"][i].value for m in ov.metrics.values()]
    return float(np.mean(vals)) if vals else float("inf")


def _facts(case: Case, model) -> dict:
    cfg = model.cfg
    tags: dict = {}
    for it in case.items:
        tags[it.tag or "(untagged)"] = tags.get(it.tag or "(untagged)", 0) + 1
    return {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "n_kv_heads": getattr(cfg, "n_key_value_heads", None)
            or cfg.n_heads, "d_model": cfg.d_model, "dtype": str(cfg.dtype).removeprefix("torch."),
            "items": len(case.items), "tags": tags, "formats": {k: str(getattr(v, "user", v)) for k, v in case.formats.items()},
            "good": case.good, "bad": list(case.bad_formats), "align": case.align, "focus": case.focus,
            "metric": case.metric if isinstance(case.metric, str) else f"function {getattr(case.metric, '__name__', '')}",
            "versions": versions()}
