"""From diagnosis to surgery: a repair that needs the failing prompt alone, built on discovery items and measured as
model editing measures an edit, on items it was not built on.

Every other repair surgeon measures is a paired interchange (each item's good-format activations copied into its
failing run): it shows which heads carry the difference, but in use there is no good-format twin. A `Repair`
(`surgeon.repairs.artifact`) writes a constant into the chosen heads instead, at positions counted from the last prompt
token: ``mean`` puts the good format's mean output over the discovery items in place of the head's own (mean patching),
``steer`` adds the mean good-minus-failing difference times a strength (ITI, Li et al. 2023; contrastive activation
addition, Rimsky et al. 2024). The engine runs it as it runs mean ablation: a mask on the one `Contrast` whose source is
a constant (`surgeon.repairs.site.ConstantSite`), so many candidates (heads x strengths) run in one batched pass.

Measured on the held-out items, each a rate or mean with n and a 95% interval, following model editing's evaluation
(ROME / MEMIT on CounterFact, EasyEdit): **efficacy** (the failing formats' focus items), **generalization** (the
failing formats' other tags), **specificity** (the good format's accuracy, and the KL divergence of the next-token
distribution at the first answer position from the unrepaired model's, in every format; on neutral texts the KL and
the change in cross-entropy of the text's next token), and **generation** (greedy continuations with the repair's
hooks, judged as ``--generate`` judges). Beside them, the same heads as a paired interchange (which needs the twin).

`search_repair` chooses the heads and strength to ship on the discovery items only: a greedy forward selection over a
pool of heads and strengths that maximises the failing formats' repair rate under the user's side-effect bounds (the
good format's KL, the other tags' accuracy); the chosen repair is then measured on the held-out items.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from surgeon.analyses.common import case_metric
from surgeon.analyses.generation import end_text, judge
from surgeon.analyses.pareto import Baselines
from surgeon.analyses.selection import Step, forward_selection, smallest_best
from surgeon.analyses.heldout import (MIN_PER_SPLIT, Split, SubsetRunner, eval_items_of, eval_split, evaluate_subsets,
                                     split_items)
from surgeon.engine.contrast import Contrast
from surgeon.engine.readout import greedy, reference_logprobs, score_rows
from surgeon.errors import AnalysisError
from surgeon.models.loading import model_digest
from surgeon.repairs.artifact import MODES, Repair, check_fits
from surgeon.repairs.fold import check_rule, every_position_hooks
from surgeon.repairs.site import ConstantSite
from surgeon.search.subsets import Unit, parse_units
from surgeon.show import Shows
from surgeon.sites.nodes import Site, hook_component, unit_label
from surgeon.case.case import Case, Item, content_digest, tag_indices
from surgeon.case.encoding import Row, prompt_rows
from surgeon.case.metrics import METRICS
from surgeon.case.select import pick_bad, pick_items
from surgeon.stats import Estimate, bootstrap_mean, wilson
from surgeon.case.encoding import answer_tokens, encode_prompt, format_rows, prepend_bos

COMPONENTS = ("z",)  # head outputs before W_O: what the subset search patches and a mean or steer repair writes
# the sites a repair search may write beyond heads (`sites=`), each a whole vector per layer, and the kind of their
# units (`Unit.kind`): where the circuit puts the effect, on the same engine
KINDS = {"z": "H", "mlp_out": "M", "attn_out": "A", "resid_pre": "R"}
COMPONENT_OF = {k: c for c, k in KINDS.items()}
STRENGTHS = {"mean": (1.0,), "steer": (0.5, 1.0, 2.0, 4.0)}  # what `search_repair` tries by default
Q90_PER_MEAN = 5.0  # the default bound on the items' 90th-percentile KL, as a multiple of the bound on the mean
SLOT_ALIGNS = ("last", "end")  # align rules under which slot j is the position j tokens after the last prompt token


# ----------------------------------------------------------------------------------------------- building


def check_heads(heads, *, max_heads: int = 8, strength=None, strengths=None, search: bool = False,
                max_kl: float = 0.1, max_drop: float = 0.05, max_kl_q90: float | None = None) -> None:
    """What can be refused about a repair's options without the model: the heads' spelling, the numbers' ranges."""
    import math

    if heads is not None and heads != "all":
        spec = heads if isinstance(heads, str) else ",".join(map(str, heads))
        if not spec.strip():
            raise AnalysisError("no heads to repair", field="--heads", fix="name heads, e.g. --heads L0H4,L0H6")
        for part in spec.split(","):
            if not re.fullmatch(r"\s*L\d+H\d+\s*", part, re.I):
                raise AnalysisError(f"cannot read head {part!r}", field="--heads",
                                    fix="name heads with their layers: --heads L0H4,L0H6")
    if not search and heads is None:
        raise AnalysisError("name the heads to repair, or search for them", field="--heads",
                            fix="give --heads L0H4,L0H6 (e.g. a subset from surgeon threshold), or --search")
    for name, v in (("--strength", strength), *(("--strengths", x) for x in (strengths or ()))):
        if v is not None and (not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise AnalysisError(f"{name} {v!r} is not a positive number", field=name, fix="e.g. 1 (mean: full "
                                "replacement; steer: the difference added once)")
    if strengths and not search:
        raise AnalysisError("--strengths are the strengths the search tries, but no search is asked for",
                            field="--strengths", fix="add --search (search=True), or give one --strength")
    if search and strength is not None:
        raise AnalysisError("--strength fixes the strength, but --search chooses it", field="--strength",
                            fix="give the strengths to search with --strengths, or leave out --search")
    if not (isinstance(max_heads, int) and max_heads >= 1):
        raise AnalysisError(f"--max-heads {max_heads!r} must be at least 1", field="--max-heads", fix="e.g. 8")
    if max_kl_q90 is not None and not (isinstance(max_kl_q90, (int, float)) and max_kl_q90 >= 0):
        raise AnalysisError(f"--max-kl-q90 {max_kl_q90!r} must be >= 0 nats", field="--max-kl-q90", fix="e.g. 0.5")
    if not (max_kl >= 0 and 0 <= max_drop <= 1):
        raise AnalysisError("--max-kl must be >= 0 nats and --max-drop in [0, 1]", field="--max-kl",
                            fix="e.g. --max-kl 0.1 --max-drop 0.05")


def check_repairable(case: Case, mode: str, component: str, *, holdout=0.5, eval_items=None) -> None:
    if mode not in MODES:
        raise AnalysisError(f"unknown repair mode {mode!r}", field="--mode",
                            fix=f"use one of: {', '.join(MODES)} (mean: the good format's mean output in place of the "
                                "heads' own; steer: the good-minus-failing difference added)")
    if component not in COMPONENTS:
        raise AnalysisError(f"a repair writes head outputs, not {component!r}", field="--component",
                            fix="use --component z")
    if case.align not in SLOT_ALIGNS:
        raise AnalysisError(f"a repair acts at positions counted from the last prompt token, but the case aligns "
                            f"positions by {case.align!r}", where=case.source, field="align",
                            fix='set align="last" in the case (the last prompt token and the answer tokens)')
    if eval_items is None:
        if holdout is None:
            raise AnalysisError("a repair is measured on items it was not built on", field="--holdout",
                                fix="give --holdout FRAC (e.g. 0.5), or items to evaluate on (eval_items=)")
        split_items(list(case.items), holdout)  # too few items, or a share outside (0, 1): refused now


def unit_name(u: Unit) -> str:
    """A repair unit's one name: L0H4 (a head), L1.mlp_out (a whole vector)."""
    return u.label if u.kind == "H" else unit_label(COMPONENT_OF[u.kind], u.layer, u.head)


def hook_of(u: Unit) -> str:
    return Site.of(COMPONENT_OF[u.kind], u.layer).hook


def check_sites(sites) -> tuple[str, ...]:
    """The components a repair search may write (`--sites z,mlp_out`): known ones, heads or whole vectors."""
    spec = sites.split(",") if isinstance(sites, str) else list(sites)
    out = tuple(dict.fromkeys(x.strip() for x in spec if x.strip()))
    bad = [x for x in out if x not in KINDS]
    if bad or not out:
        raise AnalysisError(f"a repair cannot write {bad[0] if bad else 'nothing'!r}", field="--sites",
                            fix=f"use some of: {', '.join(KINDS)} (z: head outputs; the others one vector per layer)")
    return out


def _units(model, heads: str | Sequence[str] | None, sites: Sequence[str] = ("z",)) -> list[Unit]:
    """The candidate units: the heads named (every head when None), and one unit per layer of each other component
    in `sites`."""
    out = [] if "z" not in sites else _head_units(model, heads)
    for c in sites:
        if c != "z":
            out += [Unit(L, 0, KINDS[c]) for L in range(model.cfg.n_layers)]
    return out


def _head_units(model, heads: str | Sequence[str] | None) -> list[Unit]:
    if heads is None or heads == "all":
        return [Unit(L, h) for L in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    spec = heads if isinstance(heads, str) else ",".join(heads)
    if not spec.strip():
        raise AnalysisError("no heads to repair", field="--heads", fix="name heads, e.g. --heads L0H4,L0H6")
    return parse_units(spec, None, model.cfg.n_layers, model.cfg.n_heads)


@dataclass
class Pool:
    """Every candidate head's constant: per hook point [slots, heads, d_head] for the mode (mean: the good format's
    mean; steer: good mean minus the failing formats' mean), from the discovery items."""

    mode: str
    values: dict  # hook -> Tensor
    units: list[Unit]
    formats: dict  # good, bad (the failing formats pooled for steer)
    n_items: int

    @staticmethod
    def hook(u: Unit) -> str:
        return hook_of(u)

    @property
    def components(self) -> list[str]:
        return list(dict.fromkeys(COMPONENT_OF[u.kind] for u in self.units))

    def repair(self, units: Sequence[Unit], strength: float, built_on: dict) -> Repair:
        chosen: dict[str, list[int]] = {}
        for u in units:
            chosen.setdefault(self.hook(u), []).append(u.head)
        values = {}
        for h, heads in chosen.items():
            v = self.values[h].clone()
            keep = np.zeros(v.shape[1], dtype=bool)
            keep[heads] = True
            v[:, ~keep] = 0
            values[h] = v
        order = sorted(units, key=lambda u: (u.layer, "RHAM".index(u.kind), u.head))  # the order they run in
        comps = list(dict.fromkeys(COMPONENT_OF[u.kind] for u in order))
        return Repair(tuple(unit_name(u) for u in order), self.mode, float(strength), values,
                      {h: tuple(sorted(x)) for h, x in chosen.items()}, "+".join(comps), built_on=built_on)


def _mean_of(model, rows_a: list[Row], rows_b: list[Row], align: str, sites, batch_size: int) -> dict:
    """The engine's per-slot mean over items of `rows_b`'s run at each site (`Contrast.mean_activation`, the mean
    ablation takes)."""
    c = Contrast(model, rows_a, rows_b, align, batch_size=batch_size, sites=sites, clean=False)
    return {s.hook: c.mean_activation(s).detach().float().cpu() for s in sites}


def build_pool(case: Case, model, items: Sequence[Item], units: Sequence[Unit], *, mode: str, bads: Sequence[str],
               batch_size: int = 256) -> Pool:
    """The constants of `units` (heads, kind H; or Unit(layer, 0, kind) of a whole vector: `KINDS`) from `items`: per
    aligned position the good format's mean (mode mean) or good minus the failing formats' mean (steer)."""
    import torch

    sites = [Site.coerce(h) for h in dict.fromkeys(hook_of(u) for u in units)]
    good = format_rows(case, model, case.good, items)
    per_bad = {b: format_rows(case, model, b, items) for b in bads}
    anyb = per_bad[bads[0]]
    good_mean = _mean_of(model, anyb, good, case.align, sites, batch_size)
    values = good_mean
    if mode == "steer":
        bad_means = [_mean_of(model, good, rows, case.align, sites, batch_size) for rows in per_bad.values()]
        values = {}
        for h, g in good_mean.items():
            S = min([g.shape[0]] + [m[h].shape[0] for m in bad_means])
            values[h] = g[:S] - torch.stack([m[h][:S] for m in bad_means]).mean(0)
    return Pool(mode, values, list(units), {"good": case.good, "bad": list(bads)}, len(items))


# ----------------------------------------------------------------------------------------------- measuring


@dataclass(frozen=True)
class RateRow:
    """Items right in one format and tag, repaired and not."""

    measure: str  # efficacy, generalization, specificity, paired
    format: str
    tag: str
    repaired: Estimate
    unrepaired: Estimate


@dataclass(frozen=True)
class ShiftRow:
    """How far the repair moves the next-token distribution where nothing should change (or anywhere: a side
    effect), against the unrepaired model: KL(unrepaired || repaired) in nats at every scored position of an item
    (its correct answer teacher-forced: the last prompt token and each answer token), averaged within the item first,
    then over items; on neutral texts over each text's continuation, with the mean change in the continuation's
    cross-entropy (positive: worse)."""

    where: str  # a format name, or "neutral"
    kl: Estimate  # the mean over items of each item's mean KL over its scored positions
    ce: Estimate | None = None
    q90: float = float("nan")  # the 90th percentile of the items' KL: one item broken badly shows here
    worst: tuple = ()  # ((item label, its KL), ...) the three largest


@dataclass(frozen=True)
class CompareRow:
    """One head set, as the paired diagnosis would choose it or as shipped, on the held-out items of one failing
    format: the paired interchange's rate (needs each item's good-format twin) and the shippable repair's."""

    chosen_by: str  # "paired" (the greedy best paired subset) or "shippable" (`search_repair`'s choice)
    heads: tuple[str, ...]
    format: str
    paired: Estimate
    shippable: Estimate
    kl_good: Estimate  # the shippable repair's mean KL from the unrepaired model in the good format


@dataclass(frozen=True)
class GenRow:
    format: str
    tag: str
    repaired: Estimate  # greedy continuations judged correct (strictly: the answer, then its end)
    unrepaired: Estimate
    other: int  # repaired continuations that are neither answer
    broken: tuple = ()  # items right unrepaired, wrong repaired: (item label, repaired continuation), at most 5


class Scorer:
    """One Contrast per (format, tag) of an item set, built once (its clean passes once) and run for any number of
    candidate masks: the repaired scores, the unrepaired ones, and the metric's notion of right."""

    def __init__(self, case: Case, model, items: Sequence[Item], fmt: str, batch_size: int, kl: bool = False):
        self.n = len(items)
        self.owner = None
        if kl:
            rows, self.owner = scored_positions(case, model, fmt, items)
            ref = reference_logprobs(model, rows, batch_size)
            self.metric = METRICS["kl"]()
            # no clean scores: a KL scorer only runs candidates (its reference is the unrepaired run), so the two clean
            # passes a Contrast makes up front (base and source, here the same rows) would be thrown away
            self.c = Contrast(model, rows, rows, case.align, batch_size=batch_size, metric=self.metric, reference=ref,
                              clean=False)
        else:
            rows = format_rows(case, model, fmt, items)
            metric, ref = case_metric(case, model, items, batch_size)
            self.metric = metric
            good = format_rows(case, model, case.good, items)
            self.c = Contrast(model, rows, good, case.align, batch_size=batch_size, metric=metric, reference=ref)

    def run(self, masks: dict) -> np.ndarray:
        import torch

        with torch.no_grad():
            x = self.c.run(masks).float().cpu().numpy()  # [P, n] (KL: [P, scored positions])
        return x if self.owner is None else per_item(x, self.owner, self.n)

    def kl(self, masks: dict) -> np.ndarray:
        """[P, n]: each item's KL(unrepaired || repaired), averaged over its scored positions."""
        return np.maximum(-self.run(masks), 0)

    def rates(self, scores: np.ndarray) -> np.ndarray:
        return np.asarray(self.metric.right(scores)).mean(-1)

    def accuracy(self, scores: np.ndarray) -> Estimate:
        r = np.asarray(self.metric.right(scores))
        return wilson(int(r.sum()), int(r.size))

    def clean_scores(self) -> np.ndarray:
        """[n] the unrepaired scores (the base format's clean run); a KL scorer has none (its unrepaired KL is 0)."""
        if self.c.clean_base is None:
            raise AnalysisError("internal: a KL Scorer makes no clean pass: it has no unrepaired scores")
        return self.c.clean_base.float().cpu().numpy()

    @property
    def unrepaired(self) -> Estimate:
        return self.accuracy(self.clean_scores())


def per_item(x: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """x [P, rows] averaged within each owner (item) -> [P, n]: an item scored at several positions is one item."""
    counts = np.bincount(owner, minlength=n).astype(float)
    out = np.zeros((x.shape[0], n))
    np.add.at(out.T, owner, x.T)
    return out / np.maximum(counts, 1)


def scored_positions(case: Case, model, fmt: str, items: Sequence[Item]) -> tuple[list[Row], np.ndarray]:
    """One row per position whose next-token distribution an item scores: its prompt with its correct answer (and
    the case's answer_end) teacher-forced, read at the last prompt token and at each answer token but the last (an
    item scored inside the prompt: at its last prompt token). Returns the rows (each its own row index) and each
    row's item."""
    bos = prepend_bos(case, model)
    rows, owner = [], []
    for i, it in enumerate(items):
        prompt, anchors = encode_prompt(case.formats[fmt], it.values, model.tokenizer, bos)
        ans = [] if (it.per_position or it.at is not None) else answer_tokens(model.tokenizer, it.correct,
                                                                               case.answer_end)
        for k in range(max(1, len(ans))):
            toks = tuple(prompt + ans[:k])
            nxt = ans[k] if k < len(ans) else 0
            rows.append(Row(len(rows), toks, len(prompt), ((len(toks) - 1, nxt, 1.0),), anchors))
            owner.append(i)
    return rows, np.asarray(owner, dtype=int)


def shift_row(where: str, kl: np.ndarray, labels: Sequence[str], ce: np.ndarray | None = None) -> ShiftRow:
    """A ShiftRow from per-item KLs [n] (and cross-entropy changes): mean with its interval, the 90th percentile and
    the three worst items by name."""
    kl = np.asarray(kl, dtype=float)
    order = np.argsort(-kl, kind="stable")[:3]
    return ShiftRow(where, bootstrap_mean(kl), None if ce is None else bootstrap_mean(ce),
                    float(np.quantile(kl, 0.9)) if kl.size else float("nan"),
                    tuple((labels[i], float(kl[i])) for i in order))


def item_label(item: Item) -> str:
    return " / ".join(f"{v}" for v in item.values.values()) or item.correct.strip()


def _site_masks(sites: dict[str, ConstantSite], cand: Sequence[tuple[Sequence[Unit], float]], cfg) -> dict:
    """Masks [P, units] per constant site (by hook point) for candidates (units, strength)."""
    import torch

    out = {}
    for h, site in sites.items():
        m = torch.zeros(len(cand), site.n_units(cfg))
        for p, (units, a) in enumerate(cand):
            for u in units:
                if hook_of(u) == h:
                    m[p, u.head] = a
        out[site] = m
    return out


def repair_masks(repair: Repair, cfg, strength: float | None = None) -> dict:
    """The engine's masks [1, units] on the repair's own constant sites: its units at its strength."""
    import torch

    a = repair.strength if strength is None else float(strength)
    out = {}
    for h, site in repair.sites().items():
        m = torch.zeros(1, site.n_units(cfg))
        m[0, list(repair.units.get(h, ()))] = a
        out[site] = m
    return out


def neutral_rows(model, texts: Sequence[str], bos: bool) -> tuple[list[Row], np.ndarray]:
    """Each neutral text as a prompt (its first half of tokens, at least one) and a continuation (the rest, at least
    one token), one row per continuation token predicted: the repair acts from the prompt's last token on, as it does
    while generating. Returns the rows and each row's text."""
    rows, owner = [], []
    for i, t in enumerate(texts):
        ids = list(model.tokenizer.encode(t, add_special_tokens=False))
        if bos and model.tokenizer.bos_token_id is not None:
            ids = [model.tokenizer.bos_token_id] + ids
        if len(ids) < 2:
            raise AnalysisError(f"the neutral text {t[:40]!r} is shorter than two tokens", field="neutral",
                                fix="give texts of a few words or more")
        if len(ids) > model.cfg.n_ctx:
            raise AnalysisError(f"the neutral text {t[:40]!r} is {len(ids)} tokens, more than the model's context of "
                                f"{model.cfg.n_ctx}", field="neutral", fix=f"give texts of at most {model.cfg.n_ctx} tokens")
        unk = getattr(model.tokenizer, "unk_token_id", None)
        if unk is not None and unk in ids[1 if bos else 0:]:
            raise AnalysisError(f"the neutral text {t[:40]!r} holds characters the model's tokenizer does not know "
                                "(they read as its unknown token, which says nothing about the repair's harm)",
                                field="neutral", fix="give texts in the model's own alphabet")
        n_prompt = max(1 + int(bos), (len(ids) + 1) // 2)
        n_prompt = min(n_prompt, len(ids) - 1)
        for k in range(n_prompt, len(ids)):
            rows.append(Row(len(rows), tuple(ids[:k]), n_prompt, ((k - 1, ids[k], 1.0),), {}))
            owner.append(i)
    return rows, np.asarray(owner, dtype=int)


def _neutral(model, repair: Repair, texts: Sequence[str], bos: bool, batch_size: int) -> ShiftRow:
    import torch

    rows, owner = neutral_rows(model, texts, bos)
    masks = repair_masks(repair, model.cfg)
    ref = reference_logprobs(model, rows, batch_size)  # each row's unrepaired next-token log-probabilities
    # the unrepaired run is `ref`: its KL is 0 and its log-probability of the text's next token is read from it, so
    # neither Contrast makes clean passes (their base and source would be these same rows, run again)
    nxt = torch.tensor([r.targets[0][1] for r in rows], device=ref.device)
    unrepaired = ref[torch.arange(len(rows), device=ref.device), nxt]
    kl = Contrast(model, rows, rows, "last", batch_size=batch_size, metric=METRICS["kl"](), reference=ref, clean=False)
    lp = Contrast(model, rows, rows, "last", batch_size=batch_size, metric=METRICS["logprob"](), clean=False)
    with torch.no_grad():
        k = np.maximum(-kl.run(masks)[:1].float().cpu().numpy(), 0)
        d = -(lp.run(masks)[:1].to(unrepaired.device) - unrepaired).float().cpu().numpy()
    n = len(texts)
    return shift_row("neutral", per_item(k, owner, n)[0], [t[:24] for t in texts], per_item(d, owner, n)[0])


def _generation(case: Case, model, repair: Repair, fmt: str, tag: str, items: Sequence[Item], n_new: int,
                batch_size: int) -> GenRow:
    import torch

    rows = prompt_rows(case.formats[fmt], items, model.tokenizer, prepend_bos(case, model))
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    end = end_text(case, model.tokenizer)
    verdicts: dict = {True: {}, False: {}}
    texts: dict = {}
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo: lo + batch_size]
        W = max(len(r.tokens) for r in chunk)
        tokens = torch.tensor([list(r.tokens) + [pad] * (W - len(r.tokens)) for r in chunk],
                              device=next(model.parameters()).device)
        lengths = torch.tensor([len(r.tokens) for r in chunk], device=tokens.device)
        for on in (True, False):
            hooks = repair.hooks(lengths - 1) if on else []
            gen = greedy(model, tokens, lengths, n_new, hooks)
            for r, g in zip(chunk, gen.tolist()):
                text = model.tokenizer.decode(g)
                verdicts[on][r.item] = judge(text, items[r.item], end)
                if on:
                    texts[r.item] = text
    order = sorted(verdicts[True])
    v = {on: [verdicts[on][i] for i in order] for on in (True, False)}
    rate = {on: wilson(x.count("correct"), len(x)) for on, x in v.items()}
    broken = tuple((item_label(items[i]), texts[i]) for i in order
                   if verdicts[False][i] == "correct" and verdicts[True][i] != "correct")
    return GenRow(fmt, tag, rate[True], rate[False], v[True].count("other"), broken[:5])


@dataclass(frozen=True)
class FoldCost:
    """The repair as a model file acts at every position (`surgeon.repairs.fold`): its measures on the same held-out
    items, beside the slot rule's (`RepairResult.held_out`, `.shifts`)."""

    rule: str  # a key of surgeon.repairs.fold.RULES
    rows: list[RateRow]  # efficacy, generalization, specificity under the every-position rule (unrepaired beside)
    kl_good: ShiftRow  # the good format's KL from the unrepaired model under the every-position rule


def fold_cost(case: Case, model, repair: Repair, items: Sequence[Item], *, focus: str, bads: Sequence[str],
              rule: str = "slot0", batch_size: int = 256) -> FoldCost:
    """The folded repair's efficacy and harm on `items`, run as the weights run it: the same edit at every position
    (`every_position_hooks`, equal to the folded weights' logits: tested), each format's scores and the good format's
    KL from the unrepaired model (its log-probabilities taken before the edit)."""
    check_rule(rule)
    hooks = every_position_hooks(repair, rule)
    tags = tag_indices(items)
    metric, ref = case_metric(case, model, items, batch_size)
    krows, owner = scored_positions(case, model, case.good, items)
    kref = reference_logprobs(model, krows, batch_size)  # the unrepaired model's, before the edit
    # each format's clean scores (as `diagnose` scores them: one pass, nothing patched), without the edit and then
    # under it
    fmt_rows = {fmt: format_rows(case, model, fmt, items) for fmt in [*bads, case.good]}

    def scores(fmt):
        return score_rows(model, fmt_rows[fmt], batch_size, metric=metric, reference=ref).float().cpu().numpy()

    unrepaired = {fmt: scores(fmt) for fmt in fmt_rows}
    rows = []

    def rate(x):
        right = np.asarray(metric.right(x))
        return wilson(int(right.sum()), int(right.size))

    with model.hooks(fwd_hooks=hooks):
        for fmt in fmt_rows:
            folded = scores(fmt)
            for tag, idx in tags.items():
                measure = "specificity" if fmt == case.good else ("efficacy" if focus in ("all", tag) else "generalization")
                rows.append(RateRow(measure, fmt, tag or "all", rate(folded[idx]), rate(unrepaired[fmt][idx])))
        k = np.maximum(-score_rows(model, krows, batch_size, metric=METRICS["kl"](), reference=kref)
                       .float().cpu().numpy()[None], 0)
    kl = per_item(k, owner, len(items))[0]
    return FoldCost(rule, rows, shift_row(case.good, kl, [item_label(it) for it in items]))


@dataclass
class RepairResult(Shows):
    """A repair and how it does on the held-out items (the result) and on the discovery items it was built on
    (in-sample, labelled so)."""

    case: str
    repair: Repair
    split: Split | None
    focus: str
    held_out: list[RateRow] = field(default_factory=list)  # efficacy, generalization, specificity, paired
    shifts: list[ShiftRow] = field(default_factory=list)
    generation: list[GenRow] = field(default_factory=list)
    discovery: list[RateRow] = field(default_factory=list)  # efficacy on the items it was built on: in-sample
    search: list[dict] = field(default_factory=list)  # `search_repair`'s steps (discovery numbers: in-sample)
    bounds: dict = field(default_factory=dict)
    n_discovery: int = 0
    n_evaluation: int = 0
    # `search_repair`: the best paired subset and the repair to ship, each measured both ways on the held-out items
    compare: list[CompareRow] = field(default_factory=list)
    # `surgeon.analyses.steering_baselines.compare_baselines`: CAA, ITI and controls on the same held-out items
    baselines: Baselines | None = None
    # `measure_saved`: a saved repair measured on a case's items: where it was built and what was left out
    origin: str = ""
    # `fold_cost`: the repair folded into the weights (every position) on the same held-out items
    fold: FoldCost | None = None

    def rows(self, measure: str) -> list[RateRow]:
        return [r for r in self.held_out if r.measure == measure]

    def repairs(self) -> list[str]:
        """The failing formats where the repair works on the held-out items: its efficacy's 95% interval lies above
        the unrepaired rate."""
        return [r.format for r in self.rows("efficacy") if r.repaired.lo > r.unrepaired.value]

    def verdict(self) -> list[str]:
        """Why this repair should not be shipped (empty: nothing against it): no held-out efficacy above unrepaired,
        a search bound not met on the held-out items; then what a user should know before widening the search (a
        choice at a limit of its grid)."""
        out = []
        eff = self.rows("efficacy")
        if eff and not self.repairs():
            why = ""
            paired = [r for r in self.held_out if r.measure == "paired" and r.repaired.lo > r.unrepaired.value]
            if paired:
                why = (f" The same heads patched paired (each item's own good-format activations) do repair "
                       f"({', '.join(r.format for r in paired)}): the heads carry the item as well as the format, and "
                       "a constant, the same for every prompt, cannot carry the item.")
            out.append("no repair found: on the held-out items no failing format's efficacy is above unrepaired (its "
                       "95% interval's lower end is at or below the unrepaired rate)." + why)
        b = self.bounds
        if b:
            good = next((x for x in self.shifts if x.where == self.repair.built_on.get("good")), None)
            if good is not None and good.kl.value > b.get("max_kl", float("inf")):
                out.append(f"bound not met on the held-out items: good-format KL {good.kl.value:.4f} > {b['max_kl']}")
            if good is not None and good.q90 > b.get("max_kl_q90", float("inf")):
                out.append(f"bound not met on the held-out items: good-format KL's 90th percentile over items "
                           f"{good.q90:.4f} > {b['max_kl_q90']}")
            for row in self.held_out:
                if row.measure in ("generalization", "specificity") and self.focus != "all" and row.tag != self.focus:
                    drop = row.unrepaired.value - row.repaired.value
                    if drop > b.get("max_drop", 1) + 1e-12:
                        out.append(f"bound not met on the held-out items: {row.format} {row.tag} accuracy drops "
                                   f"{100 * drop:.1f} points > {100 * b['max_drop']:.0f}")
        return out

    def limits(self) -> list[str]:
        """Choices the search made at an edge of what it was allowed to try (a wider grid may do better)."""
        b, out = self.bounds, []
        if not b:
            return out
        if len(self.repair.heads) >= b.get("max_heads", 10 ** 9):
            out.append(f"the repair has --max-heads {b['max_heads']} heads, the most allowed: try a larger --max-heads")
        grid = sorted(b.get("strengths", []))
        if len(grid) > 1 and self.repair.strength in (grid[0], grid[-1]):
            side = "largest" if self.repair.strength == grid[-1] else "smallest"
            out.append(f"the strength chosen ({self.repair.strength:g}) is the {side} of the grid {grid}: try "
                       "--strengths reaching past it")
        return out

    def efficacy(self, fmt: str | None = None) -> RateRow:
        rows = self.rows("efficacy")
        return next(r for r in rows if fmt is None or r.format == fmt)


def measure_repair(case: Case, model, repair: Repair, items: Sequence[Item], *, focus: str, bads: Sequence[str],
                   neutral: Sequence[str] | None = None, generate: int = 0, batch_size: int = 256,
                   paired: bool = True) -> tuple[list[RateRow], list[ShiftRow], list[GenRow]]:
    """The repair on `items` (held out from its building): efficacy per failing format on the focus tag,
    generalization to the failing formats' other tags, specificity (the good format's accuracy per tag; KL from the
    unrepaired model in every format; neutral texts), generation, and the same heads as a paired interchange."""
    masks = repair_masks(repair, model.cfg)
    rows: list[RateRow] = []
    tags = tag_indices(items)
    unrepaired = {}  # per format: the items' scores without the repair
    for fmt in [*bads, case.good]:  # one Scorer a format (its clean passes once), its items' scores split by tag
        s = Scorer(case, model, items, fmt, batch_size)
        repaired, unrepaired[fmt] = s.run(masks)[0], s.clean_scores()
        for tag, idx in tags.items():
            mine = focus == "all" or tag == focus
            measure = "specificity" if fmt == case.good else ("efficacy" if mine else "generalization")
            rows.append(RateRow(measure, fmt, tag or "all", s.accuracy(repaired[idx]),
                                s.accuracy(unrepaired[fmt][idx])))
    if paired and all(hook_component(h).name == "z" for h in repair.values):  # a paired patch of heads only
        for fmt in bads:
            idx = list(range(len(items))) if focus == "all" else tags.get(focus, [])
            if idx:
                e = evaluate_subsets(replace(case, items=[items[i] for i in idx], focus=None), model,
                                     [",".join(repair.heads)], bad=fmt, tag=None, batch_size=batch_size)[0]
                rows.append(RateRow("paired", fmt, focus, e.rate, s.accuracy(unrepaired[fmt][idx])))  # one metric
    shifts = []
    labels = [item_label(it) for it in items]
    for fmt in [case.good, *bads]:
        k = Scorer(case, model, items, fmt, batch_size, kl=True)
        shifts.append(shift_row(fmt, k.kl(masks)[0], labels))
    if neutral:
        shifts.append(_neutral(model, repair, neutral, prepend_bos(case, model), batch_size))
    gens = []
    if generate:
        for fmt in [*bads, case.good]:
            for tag, idx in tags.items():
                gens.append(_generation(case, model, repair, fmt, tag or "all", [items[i] for i in idx], generate,
                                        batch_size))
    return rows, shifts, gens


# ----------------------------------------------------------------------------------------------- the entry points


def _split(case: Case, holdout: float | None, seed: int, eval_items=None):
    if eval_items is None and holdout is None:
        raise AnalysisError("a repair is measured on items it was not built on", field="--holdout",
                            fix="give --holdout FRAC (e.g. 0.5), or items to evaluate on (eval_items=)")
    return eval_split(case, "all", holdout, seed, eval_items)


def item_key(item: Item) -> str:
    """An item by its prompt's values (16 hex digits of their sha256): what says that another case's item is one a
    repair was built on, without keeping the items themselves."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(sorted((str(k), str(v)) for k, v in item.values.items())).encode()).hexdigest()[:16]


def _built_on(case: Case, model, split: Split | None, focus: str, n: int, pool: Pool, disc: Sequence[Item] = ()) -> dict:
    return {"case": case.name, "case_sha256": content_digest(case), "good": case.good, "bad": pool.formats["bad"],
            "model_sha256": model_digest(model),  # the weights it was built on: applied to others only when asked
            "tag": focus, "n_items": n, "mode": pool.mode,
            # every item the building or the search read (its means, its bounds): never measured as held out
            "discovery_items": sorted({item_key(it) for it in disc}),
            "split": None if split is None else {"holdout": split.holdout, "seed": split.seed,
                                                 "discovery": len(split.discovery), "evaluation": len(split.evaluation),
                                                 "stratified_by": split.stratified_by,
                                                 "evaluated_on": split.evaluated_on}}


def setup_split(case: Case, mode: str, bad, tag, holdout, seed: int, eval_items):
    """What building and searching share: the failing formats (one, or all), the focus tag ("all" without one), the
    split and the discovery items of the focus tag."""
    check_repairable(case, mode, "z")
    bads = [pick_bad(case, bad)] if bad is not None else list(case.bad_formats)
    focus = pick_items(case, tag)[0] or "all"
    split, disc, ev = _split(case, holdout, seed, eval_items)
    disc_focus = [it for it in disc if focus == "all" or it.tag == focus]
    if not disc_focus:
        raise AnalysisError(f"no discovery items have tag {focus!r}", field="tag", fix="add items with that tag")
    return bads, focus, split, disc, ev, disc_focus


def repair_case(case: Case, model, *, heads: str | Sequence[str] | None, mode: str = "mean", strength: float = 1.0,
                bad: str | None = None, tag: str | None = None, holdout: float | None = 0.5, seed: int = 0,
                eval_items: Sequence[Item] | None = None, neutral: Sequence[str] | None = None, generate: int = 0,
                batch_size: int = 256, fold: str | None = None) -> RepairResult:
    """Build a `Repair` of `heads` from the discovery items of the focus tag (`tag`) and measure it on the held-out
    items (`holdout`, seeded and stratified by tag; or `eval_items`); `fold` (a rule of `surgeon.repairs.fold.RULES`):
    also measure it folded into the weights, at every position (`fold_cost`)."""
    bads, focus, split, disc, ev, disc_focus = setup_split(case, mode, bad, tag, holdout, seed, eval_items)
    units = _head_units(model, heads)
    pool = build_pool(case, model, disc_focus, units, mode=mode, bads=bads, batch_size=batch_size)
    repair = pool.repair(units, strength, _built_on(case, model, split, focus, len(disc_focus), pool, disc))
    held, shifts, gens = measure_repair(case, model, repair, ev, focus=focus, bads=bads,
                                        neutral=case.neutral if neutral is None else neutral,
                                        generate=generate, batch_size=batch_size)
    disc_rows = _discovery_rows(case, model, repair, disc_focus, focus, bads, batch_size)
    folded = None if fold is None else fold_cost(case, model, repair, ev, focus=focus, bads=bads, rule=fold,
                                                 batch_size=batch_size)
    return RepairResult(case.name, repair, split, focus, held, shifts, gens, disc_rows,
                        n_discovery=len(disc), n_evaluation=len(ev), fold=folded)


def _discovery_rows(case, model, repair, items, focus, bads, batch_size) -> list[RateRow]:
    masks = repair_masks(repair, model.cfg)
    out = []
    for fmt in bads:
        s = Scorer(case, model, items, fmt, batch_size)
        out.append(RateRow("efficacy", fmt, focus, s.accuracy(s.run(masks)[0]), s.unrepaired))
    return out


def control_scorers(case: Case, model, items: Sequence[Item], focus: str, bads: Sequence[str], batch_size: int,
              max_drop: float) -> list[tuple[Scorer, list[tuple[list[int], float]]]]:
    """The items a repair must not harm while it is chosen (every format's items of the tags other than the focus):
    one Scorer a format over them all, each tag's positions among them and its floor (its unrepaired rate less
    `max_drop`)."""
    if focus == "all":
        return []
    ctl, spans = [], []
    for t, idx in tag_indices(items).items():
        if t != focus:
            spans.append(list(range(len(ctl), len(ctl) + len(idx))))
            ctl += [items[i] for i in idx]
    out = []
    for f in ([*bads, case.good] if ctl else []):
        s = Scorer(case, model, ctl, f, batch_size)
        clean = s.clean_scores()
        out.append((s, [(span, s.accuracy(clean[span]).value - max_drop) for span in spans]))
    return out


def within_floors(controls, masks: dict, P: int) -> np.ndarray:
    """[P] True where, under each of the P candidates, every control tag's rate in every format (`control_scorers`)
    is at least its floor."""
    ok = np.ones(P, dtype=bool)
    for s, checks in controls:
        x = s.run(masks)
        for span, floor in checks:
            ok &= s.rates(x[:, span]) >= floor - 1e-12
    return ok


def search_repair(case: Case, model, *, heads: str | Sequence[str] | None = None, mode: str = "mean",
                  strengths: Sequence[float] | None = None, max_heads: int = 8, max_kl: float = 0.1,
                  max_kl_q90: float | None = None, max_drop: float = 0.05, bad: str | None = None, tag: str | None = None, holdout: float | None = 0.5,
                  seed: int = 0, eval_items: Sequence[Item] | None = None, neutral: Sequence[str] | None = None,
                  generate: int = 0, batch_size: int = 256, progress: bool = False,
                  fold: str | None = None, sites: Sequence[str] = ("z",)) -> RepairResult:
    """Choose the repair to ship on the discovery items, then measure it on the held-out ones.

    Greedy forward selection over the pool `heads` (default: every head; `sites` adds one unit per layer of other
    components, e.g. ("z", "mlp_out", "resid_pre"): a layer's MLP output or its residual stream) and `strengths`: each step adds the head
    (and strength) that most raises the failing formats' mean repair rate on the discovery focus items (ties: the
    higher mean score), among the candidates whose side effects stay within bounds there: the good format's mean KL
    from the unrepaired model at most `max_kl` nats and its items' 90th percentile at most `max_kl_q90` (default
    Q90_PER_MEAN x max_kl), and every other tag's accuracy in every format at most
    `max_drop` below unrepaired. Stops at `max_heads`, or when no admissible candidate raises the rate or the mean
    score; the repair is the smallest set on the path that reaches its best rate. Every candidate of a step runs in
    one batched pass per Contrast."""
    bads, focus, split, disc, ev, disc_focus = setup_split(case, mode, bad, tag, holdout, seed, eval_items)
    sites_arg = sites
    strengths = tuple(strengths or STRENGTHS[mode])
    max_kl_q90 = Q90_PER_MEAN * max_kl if max_kl_q90 is None else max_kl_q90
    pool_units = _units(model, heads, check_sites(sites))
    pool = build_pool(case, model, disc_focus, pool_units, mode=mode, bads=bads, batch_size=batch_size)
    sites = {h: ConstantSite.at(h, v, MODES[mode]) for h, v in pool.values.items()}
    focus_scorers = [Scorer(case, model, disc_focus, f, batch_size) for f in bads]
    kl_scorer = Scorer(case, model, disc, case.good, batch_size, kl=True)
    others = control_scorers(case, model, disc, focus, bads, batch_size, max_drop)
    start = (float(np.mean([s.unrepaired.value for s in focus_scorers])),
             float(np.mean([s.c.clean_base.float().mean().item() for s in focus_scorers])))
    kls = []  # each step's candidates' KL (mean, 90th percentile), for the record

    def score(cand):  # the failing formats' rate and mean score; admissible: within every side-effect bound
        masks = _site_masks(sites, cand, model.cfg)
        scores = [s.run(masks) for s in focus_scorers]
        rate = np.mean([s.rates(x) for s, x in zip(focus_scorers, scores)], axis=0)  # [P]
        mean = np.mean([x.mean(-1) for x in scores], axis=0)
        kl_items = kl_scorer.kl(masks)
        kl, kl_q = kl_items.mean(-1), np.quantile(kl_items, 0.9, axis=-1)
        ok = (kl <= max_kl) & (kl_q <= max_kl_q90)
        ok &= within_floors(others, masks, len(ok))
        kls.append((kl, kl_q))
        return rate, mean, ok

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=max_heads, desc="repair search", unit="head", leave=False)
    path = forward_selection(pool_units, max_heads, score, start, strengths, bar)
    if bar is not None:
        bar.close()
    steps = [_step_record(st, kl, kl_q) for st, (kl, kl_q) in zip(path, kls)]
    best = smallest_best(path)
    if best is None:
        raise AnalysisError(f"no head of the pool raises the discovery items' repair within the bounds (good-format KL "
                            f"<= {max_kl:g} nats, other tags' accuracy no more than {max_drop:g} below unrepaired)",
                            field="--max-kl", fix="loosen --max-kl or --max-drop, widen --heads, or try --mode steer")
    chosen, best_strength = list(best.chosen), best.option  # the smallest set that reaches the best rate
    for st in steps:
        st["chosen"] = st.get("k") == len(chosen) and "added" in st
    repair = pool.repair(chosen, best_strength, _built_on(case, model, split, focus, len(disc_focus), pool, disc))
    held, shifts, gens = measure_repair(case, model, repair, ev, focus=focus, bads=bads,
                                        neutral=case.neutral if neutral is None else neutral,
                                        generate=generate, batch_size=batch_size)
    disc_rows = _discovery_rows(case, model, repair, disc_focus, focus, bads, batch_size)
    paired_units = best_paired(case, model, disc_focus, [u for u in pool_units if u.kind == "H"], bads, max_heads,
                               batch_size)
    compare = _compare(case, model, ev, focus, bads, held, shifts, repair, "shippable", batch_size)
    if paired_units and [u.label for u in paired_units] != list(repair.heads):
        as_shipped = pool.repair(paired_units, best_strength, repair.built_on)
        p_held, p_shifts, _ = measure_repair(case, model, as_shipped, ev, focus=focus, bads=bads,
                                             batch_size=batch_size)
        compare = _compare(case, model, ev, focus, bads, p_held, p_shifts, as_shipped, "paired", batch_size) + compare
    else:  # the same heads: one row says both
        compare = [replace(r, chosen_by="paired and shippable") for r in compare]
    return RepairResult(case.name, repair, split, focus, held, shifts, gens, disc_rows, steps,
                        {"max_kl": max_kl, "max_kl_q90": max_kl_q90, "max_drop": max_drop, "max_heads": max_heads, "strengths": list(strengths),
                         "pool": [unit_name(u) for u in pool_units], "sites": list(check_sites(sites_arg))},
                        n_discovery=len(disc), n_evaluation=len(ev), compare=compare,
                        fold=None if fold is None else fold_cost(case, model, repair, ev, focus=focus, bads=bads,
                                                                 rule=fold, batch_size=batch_size))


def measure_saved(case: Case, model, repair: Repair, *, bad: str | None = None, tag: str | None = None,
                  eval_items=None, seed: int = 0, neutral: Sequence[str] | None = None, generate: int = 0,
                  batch_size: int = 256, fold: str | None = None, any_model: bool = False) -> RepairResult:
    """A saved repair measured on `case`'s items (or `eval_items`), with every measure `surgeon repair` takes:
    generalization to a case, formats or items it was not built on. Items the repair was built or searched on (by
    their prompt's values, `repair.built_on["discovery_items"]`) are left out and counted; a repair saved without
    that list, measured on its own case, is measured on its own held-out split (`built_on["split"]`). `any_model`: on
    weights other than those it was built on, on purpose (refused otherwise)."""
    check_fits(repair, model, any_model)
    if case.align not in SLOT_ALIGNS:
        raise AnalysisError(f"a repair acts at positions counted from the last prompt token, but the case aligns "
                            f"positions by {case.align!r}", where=case.source, field="align",
                            fix='set align="last" in the case')
    bads = [pick_bad(case, bad)] if bad is not None else list(case.bad_formats)
    focus = pick_items(case, tag)[0] or "all"
    b = repair.built_on or {}
    if eval_items is not None:
        items, where = eval_items_of(case, eval_items, seed)
    else:
        items, where = list(case.items), "the case's items"
    seen = set(b.get("discovery_items") or ())
    left = 0
    if seen:
        left = sum(item_key(it) in seen for it in items)
        items = [it for it in items if item_key(it) not in seen]
    elif b.get("case_sha256") and b.get("case_sha256") == content_digest(case) and eval_items is None:
        sp = b.get("split") or {}
        if sp.get("holdout"):
            s_ = split_items(list(case.items), sp["holdout"], sp.get("seed", 0))
            left = len(s_.discovery)
            items = [case.items[i] for i in s_.evaluation]
    if left:
        where += f", {left} the repair was built on left out"
    if len(items) < MIN_PER_SPLIT:
        raise AnalysisError(f"{len(items)} items to measure the repair on{' once the ones it was built on are left out' if left else ''}; "
                            f"at least {MIN_PER_SPLIT} are needed", where=case.source, field="items",
                            fix="measure it on another case's items, or on fresh ones (eval_items= / --eval-items N)")
    held, shifts, gens = measure_repair(case, model, repair, items, focus=focus, bads=bads,
                                        neutral=case.neutral if neutral is None else neutral, generate=generate,
                                        batch_size=batch_size)
    origin = (f"a saved repair built on case {b.get('case', '?')!r} ({b.get('n_items', '?')} discovery items of tag "
              f"{b.get('tag', '?')!r}, failing formats {', '.join(b.get('bad') or ['?'])}), measured on {len(items)} "
              f"items of case {case.name!r} ({where}), failing formats {', '.join(bads)}, focus tag {focus!r}")
    split = Split((), tuple(range(len(items))), 0.0, seed, "", evaluated_on=where)
    folded = None if fold is None else fold_cost(case, model, repair, items, focus=focus, bads=bads, rule=fold,
                                                 batch_size=batch_size)
    return RepairResult(case.name, repair, split, focus, held, shifts, gens, n_discovery=int(b.get("n_items") or 0),
                        n_evaluation=len(items), origin=origin, fold=folded)


def best_paired(case: Case, model, items: Sequence[Item], pool: Sequence[Unit], bads: Sequence[str], max_heads: int,
                batch_size: int) -> list[Unit]:
    """The head set a paired diagnosis would pick from `pool`: greedy forward selection (`selection`) of the failing
    formats' mean paired repair rate on `items` (ties: the higher mean repair fraction), no side-effect bound, up to
    `max_heads`; the smallest set on the path reaching its best rate."""
    sub = replace(case, items=list(items), focus=None)
    # one Contrast per failing format (its clean runs once), every step's candidates a batch of masks on it
    runners = [SubsetRunner(sub, model, [u.layer for u in pool], bad=f, batch_size=batch_size) for f in bads]

    def score(cand):
        got = [run.rates([c for c, _ in cand]) for run in runners]
        rate = np.mean([[r.rate.value for r in g] for g in got], axis=0)
        frac = np.nan_to_num(np.mean([[r.repair_fraction for r in g] for g in got], axis=0), nan=-np.inf)
        return rate, frac, np.ones(len(cand), bool)

    best = smallest_best(forward_selection(pool, max_heads, score, (-1.0, -np.inf)))
    return [] if best is None else list(best.chosen)


def _step_record(st: Step, kl: np.ndarray, kl_q: np.ndarray) -> dict:
    """A step of the repair search as its result records it."""
    if st.index is None:
        return {"k": st.k, "stopped": STOPPED[st.stopped], "admissible": st.admissible, "candidates": st.candidates}
    u = st.chosen[-1]
    return {"k": st.k, "added": unit_name(u), "unit": [u.layer, u.head, u.kind], "strength": st.option,
            "discovery_rate": st.primary, "discovery_mean_score": st.secondary,
            "discovery_kl_good": float(kl[st.index]), "discovery_kl_good_q90": float(kl_q[st.index]),
            "admissible": st.admissible, "candidates": st.candidates}


STOPPED = {"none admissible": "every candidate breaks a side-effect bound",
           "no gain": "no admissible head raises the rate or the mean score"}


def _compare(case, model, ev, focus, bads, held, shifts, repair, chosen_by, batch_size) -> list[CompareRow]:
    kl = next(s.kl for s in shifts if s.where == case.good)
    eff = {r.format: r.repaired for r in held if r.measure == "efficacy" and (focus == "all" or r.tag == focus)}
    paired = {r.format: r.repaired for r in held if r.measure == "paired"}
    return [CompareRow(chosen_by, tuple(repair.heads), f, paired[f], eff[f], kl) for f in bads if f in eff and f in paired]


__all__ = ["CompareRow", "FoldCost", "GenRow", "fold_cost", "RateRow", "RepairResult", "ShiftRow", "build_pool", "measure_repair", "measure_saved", "repair_case",
           "search_repair", "best_paired"]
