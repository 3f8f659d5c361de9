"""Case files: a failure described once, as Python.

A case file in `cases/` defines `case = Case(...)`:

    from surgeon import Case, Item
    case = Case(
        name="decimal_organism",
        model="organism:decimal",
        formats={"plain": "Which is bigger: {a} or {b}?\\nAnswer:",
                 "qa": "Q: Which is bigger: {a} or {b}?\\nA:"},
        good="plain", bad=["qa"],
        items=[Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect=" 9.11", tag="trap")],
    )

`load_case(path)` runs the file, checks every field, and raises one `CaseError` naming the file, the
field and the fix. Checks that need the model (layers in range, answers that tokenize to nothing) read
only its config and tokenizer, never its weights.
"""
from __future__ import annotations

import copy
import hashlib
import json
import runpy
import re
import string
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from surgeon.errors import CaseError, did_you_mean
from surgeon.case.metrics import METRICS
from surgeon.case.metrics import check as check_metric
from surgeon.case.metrics import metric_of
from surgeon.case.shipped import CASES_DIR, shipped_case

# last: the last prompt token and the answer tokens, matched from the end (default)
# end: the last prompt token only
# anchors: each placeholder's tokens, plus what "last" matches
# decision: only the position that predicts the first token where the answers differ
# index: position i to position i (prompts of equal length)
Align = Literal["last", "end", "decision", "anchors", "index"]
ALIGNS: tuple[str, ...] = ("last", "end", "decision", "anchors", "index")
# sequence: log P(correct) - log P(incorrect) over the whole continuations (teacher-forced)
# first_token: logit difference at the first token where the answers differ (the literature's usual metric)
SCORES: tuple[str, ...] = ("sequence", "first_token")
# how the scores at an item's several positions combine into its score (linear, so gradients and sums stay exact)
COMBINES: tuple[str, ...] = ("mean", "sum")


@dataclass(frozen=True)
class Item:
    """One question: the placeholder values, the correct and the incorrect answer.

    An answer is a text continuing the prompt (`correct=" 9.8"`), or one token per scored position for a task read
    at several positions (`correct=[" b", " c", " d"]`, `incorrect=[" x", " y", " z"]`). Where those positions
    are is `at`: None (after the prompt, teacher-forced on the correct answers: position j reads the prompt and
    the correct answers before j), a placeholder's name (the logits at each token of its value) or prompt positions
    (ints; negative counts from the prompt's end, -1 is its last token). The item's score is the case's metric at
    each position, combined as the case's `combine` says (mean or sum).
    """

    values: Mapping[str, str]
    correct: str | Sequence[str]
    incorrect: str | Sequence[str]
    tag: str = ""
    at: str | Sequence[int] | None = None

    @property
    def per_position(self) -> bool:
        """Scored at several positions (or at a named place), one answer token per position."""
        return self.at is not None or not isinstance(self.correct, str)

    def answers(self, which: str) -> tuple[str, ...]:
        """The per-position answers ("correct" or "incorrect"); a text answer is one."""
        a = getattr(self, which)
        return (a,) if isinstance(a, str) else tuple(a)

    def text(self, which: str) -> str:
        """An answer as text: per-position answers joined."""
        return "".join(self.answers(which))


@dataclass(frozen=True)
class Chat:
    """A prompt format made by the model's own chat template around `user` (with the assistant prefix).

    `user` is a template with placeholders like any format; `system` an optional system message.
    """

    user: str
    system: str | None = None


Format = str | Chat


@dataclass(frozen=True)
class Case:
    """A format-dependent failure: one model, prompt formats, items, and which format is good.

    Fields left out are reported by `load_case` as missing, with the fix.
    """

    name: str | None = None
    model: str | None = None
    formats: Mapping[str, Format] | None = None
    good: str | None = None
    bad: str | Sequence[str] | None = None
    items: Sequence[Item] | None = None
    align: str = "last"
    score: str = "sequence"
    # what ends an answer when it is scored: None (nothing: an answer is scored by its own tokens), "eos" (the
    # tokenizer's end-of-sequence token is scored after each answer) or any text, e.g. "\n" (appended to both
    # answers before tokenizing). Needed when one answer is a prefix of the other (4.5 vs 4.53).
    answer_end: str | None = None
    # what an item's score measures: "logprob" (default), "logit", "prob", "kl", or a function
    # f(logits, correct, incorrect) -> score per item (see surgeon.case.metrics)
    metric: Any = "logprob"
    focus: str | None = None  # tag of the items that patching analyses use by default (None: all)
    layers: Sequence[int] | None = None  # default layers to examine (None: all)
    components: Sequence[str] = ("z",)
    prepend_bos: bool | None = None  # None: the model's default
    description: str = ""
    saes: Mapping[str, str] | None = None  # {"dir": "saes/blocks.{layer}.hook_mlp_out"} or {"release": ..., "id": ...}
    # items whose mean activations mean ablation patches in (EAP-IG's reference dataset; None: the analysed items)
    reference: Sequence[Item] | None = None
    # how an item scored at several positions combines the metric at each (see Item): "mean" or "sum"
    combine: str = "mean"
    notes: Mapping[str, Any] = field(default_factory=dict)  # free-form: published results, sources
    # fresh items on demand: draw(n, seed) -> n Items from the distribution `items` came from (the organisms' cases
    # draw from their test splits); `--eval-items N` measures held-out numbers on N of them, none equal to an item
    draw: Callable[[int, int], Sequence[Item]] | None = None
    # texts unrelated to the task on which a repair's side effects are measured (`surgeon repair`: the KL of each
    # text's next-token distribution from the unrepaired model and the change in its cross-entropy); None: none
    neutral: Sequence[str] | None = None
    # the parts `surgeon scan` composes formats from, in place of its defaults (surgeon.case.grammar): e.g.
    # {"question_cue": {"none": "", "Q": "Q: "}, "shots": [0, 1], "body": "Which is bigger: {a} or {b}?"}
    scan: Mapping[str, Any] | None = None
    source: str | None = None  # set by load_case: the file it came from
    digest: str | None = None  # set by load_case: sha256 of that file
    read_as: str | None = None  # set by load_case: the content digest as read (an edit in Python no longer matches)

    def record(self) -> dict:
        """What a result's manifest says of the case: its name, its content's digest (`content_digest`), its model,
        and its file with that file's sha256 only while the case is as read from it (an edit in Python names the
        file it was read from as `edited_from`)."""
        as_read = self.source is not None and self.read_as is not None and self.read_as == content_digest(self)
        return {"name": self.name, "content_sha256": content_digest(self), "model": self.model,
                "file": self.source if as_read else None, "sha256": self.digest if as_read else None,
                **({"edited_from": self.source} if self.source and not as_read else {})}

    @property
    def bad_formats(self) -> tuple[str, ...]:
        return (self.bad,) if isinstance(self.bad, str) else tuple(self.bad or ())

    def items_for(self, tag: str | None) -> list[Item]:
        return [it for it in self.items or () if tag is None or it.tag == tag]

    @property
    def tags(self) -> list[str]:
        return sorted({it.tag for it in self.items or ()})


REQUIRED = ("name", "formats", "good", "bad", "items")  # `model` too, unless one is given to the analyses


def tag_indices(items: Sequence[Item]) -> dict[str, list[int]]:
    """The indices of `items` per tag, tags in the order they first appear (the one grouping every split and measure
    by tag uses; `by_tag` gives the items themselves)."""
    out: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        out.setdefault(it.tag, []).append(i)
    return out


def by_tag(items: Sequence[Item]) -> dict[str, list[Item]]:
    """`items` per tag, tags in the order they first appear (`tag_indices`)."""
    return {t: [items[i] for i in idx] for t, idx in tag_indices(items).items()}


def placeholders(fmt: Format) -> set[str]:
    text = fmt.user if isinstance(fmt, Chat) else fmt
    try:
        return {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError as e:
        raise ValueError(f"template {text!r} is not a valid format string ({e})") from None


def read_case(path: str | Path, model: str | None = None) -> Case:
    """Run a case file and validate its fields (no model is touched: `surgeon.load_case` also checks the
    case against its model's config).

    `model` replaces the case's model (e.g. a local checkpoint directory of the same architecture)."""
    path = Path(shipped_case(str(path)))  # a shipped case's name reads that case, as on the command line
    where = str(path)
    if not path.exists():
        hint = did_you_mean(path.stem, [f.stem for f in CASES_DIR.glob("*.py")]) if len(path.parts) == 1 else ""
        raise CaseError(f"no such case file{hint.replace('did you mean', 'did you mean the shipped case')}",
                        where=where, fix="give the path of a .py file that defines `case = Case(...)`, or the name "
                                         "of a shipped case (`surgeon cases` lists them), e.g. decimal_organism")
    if path.is_dir():
        raise CaseError("is a directory, not a case file", where=where,
                        fix="give the path of a .py file inside it, e.g. cases/decimal_organism.py")
    if path.suffix != ".py":
        raise CaseError("a case file is a Python file", where=where, fix="rename it to end in .py")
    try:
        ns = runpy.run_path(str(path), run_name="surgeon_case")
    except CaseError:
        raise
    except SystemExit as e:
        raise CaseError(f"the file called sys.exit({e.code!r}) while it was loaded", where=where,
                        fix="a case file only defines `case = Case(...)`; remove the exit") from None
    except Exception as e:  # the user's file raised: report it with its line
        import traceback

        tb = traceback.extract_tb(e.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == str(path)), None)
        at = f" (line {line})" if line else ""
        hint, fix = "", "make the file run on its own: python " + where
        m = re.search(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", str(e))
        if isinstance(e, TypeError) and m and m.group(1) in _FIELDS:
            hint = did_you_mean(m.group(2), _FIELDS[m.group(1)]())
            if hint:  # the did-you-mean is the fix
                fix = f"rename {m.group(2)}= to {hint.split(chr(39))[1]}={at.replace(' (', ' (at ')}"
        raise CaseError(f"running the file raised {type(e).__name__}: {e}{at}{hint}", where=where, fix=fix) from None
    case = ns.get("case")
    if case is None:
        raise CaseError("the file defines no `case`", where=where, field="case",
                        fix="end the file with `case = Case(name=..., model=..., formats=..., good=..., bad=..., items=...)`")
    if not isinstance(case, Case):
        raise CaseError(f"`case` is a {type(case).__name__}, not a surgeon.Case", where=where, field="case",
                        fix="build it with `from surgeon import Case, Item`")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    case = replace(case, source=where, digest=digest, **({"model": model} if model else {}))
    if isinstance(case.model, str) and not model:  # a relative checkpoint directory is read from the case's folder
        local = path.parent / Path(case.model).expanduser()
        if not Path(case.model).expanduser().is_absolute() and local.is_dir():
            case = replace(case, model=str(local))
    validate(case, where)
    return replace(case, read_as=content_digest(case))


def validate(case: Case, where: str | None = None) -> None:
    """Check a case's fields without touching the model. Raises CaseError."""
    where = where or origin(case)

    def fail(fld: str, msg: str, fix: str):
        raise CaseError(msg, where=where, field=fld, fix=fix)

    for f in REQUIRED:
        v = getattr(case, f)
        if v is None:
            fail(f, "is missing", f"add `{f}=...` to Case(...); required fields: {', '.join(REQUIRED)}")
    if not isinstance(case.name, str) or not case.name.strip():
        fail("name", "must be a non-empty string", 'e.g. name="decimal_organism"')
    if case.model is not None and (not isinstance(case.model, str) or not case.model.strip()):
        fail("model", "must be a string (or None when the model is given to the analyses)", 'an organism ("organism:decimal"), a Hugging Face name or a local directory')
    if not isinstance(case.formats, Mapping) or not case.formats:
        fail("formats", "must be a non-empty dict of name -> template", 'e.g. formats={"plain": "...{a}...", "qa": "Q: ...{a}...\\nA:"}')
    names = list(case.formats)
    fields_of: dict[str, set[str]] = {}
    for fname, fmt in case.formats.items():
        if not isinstance(fname, str) or not fname:
            fail("formats", f"has a key {fname!r} that is not a format name", 'name formats with strings, e.g. "qa"')
        if not isinstance(fmt, (str, Chat)):
            fail(f"formats[{fname!r}]", f"is a {type(fmt).__name__}", "use a template string or surgeon.Chat(user=...)")
        text = fmt.user if isinstance(fmt, Chat) else fmt
        if not isinstance(text, str) or not text.strip():
            fail(f"formats[{fname!r}]", "is empty", 'write the prompt, e.g. "{a} or {b}? Answer:"')
        try:
            fields_of[fname] = placeholders(fmt)
            specs = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(text) if f is not None]
        except ValueError as e:
            fail(f"formats[{fname!r}]", str(e), "placeholders are written {name}; write literal braces as {{ and }}")
        bad_names = [p for p in fields_of[fname] if not p.isidentifier()]
        if bad_names:
            fail(f"formats[{fname!r}]", f"has placeholders that are not plain names: {bad_names}",
                 "use simple names like {a} and {b}")
        fancy = [f for f, spec, conv in specs if spec or conv]
        if fancy:
            fail(f"formats[{fname!r}]", f"formats placeholder {{{fancy[0]}}} with a spec or conversion (:..., !r)",
                 "write plain {name} placeholders: the item's value is put in as it is")
        if not fields_of[fname] and isinstance(case.items, Sequence) and len(case.items) > 1:
            fail(f"formats[{fname!r}]", "has no placeholders, so every item would be the same prompt",
                 "put the item's values in the template, e.g. {a} and {b}")
    if not isinstance(case.good, str):
        fail("good", f"is a {type(case.good).__name__}; it names one format", f"e.g. good={names[0]!r}")
    if isinstance(case.bad, Mapping) or not (isinstance(case.bad, str) or (
            isinstance(case.bad, Sequence) and all(isinstance(b, str) for b in case.bad))):
        fail("bad", f"is a {type(case.bad).__name__}; it names the failing formats", 'e.g. bad=["qa", "chat"] or bad="qa"')
    if case.good not in case.formats:
        fail("good", f"names unknown format {case.good!r}", f"use one of: {', '.join(names)}")
    bads = case.bad_formats
    if not bads:
        fail("bad", "is empty", f"name at least one failing format from: {', '.join(names)}")
    for b in bads:
        if b not in case.formats:
            fail("bad", f"names unknown format {b!r}", f"use formats from: {', '.join(names)}")
        if b == case.good:
            fail("bad", f"format {b!r} is both good and bad", "list only the failing formats in bad")
        if case.formats[b] == case.formats[case.good]:
            fail("formats", f"formats {b!r} and {case.good!r} are the same template, so there is nothing to patch "
                 "between them", f"give the failing format {b!r} its own template (a copy-paste slip?)")
    if not isinstance(case.items, Sequence) or isinstance(case.items, str):
        fail("items", f"is a {type(case.items).__name__}, not a list of Items",
             "give a list: items=[Item(values={...}, correct=..., incorrect=...), ...]")
    if len(case.items) == 0:
        fail("items", "is empty", "give at least one Item(values={...}, correct=..., incorrect=...)")
    used = set().union(*fields_of.values())
    for i, it in enumerate(case.items):
        fld = f"items[{i}]"
        if not isinstance(it, Item):
            fail(fld, f"is a {type(it).__name__}", "build items with surgeon.Item(values, correct, incorrect)")
        if not isinstance(it.values, Mapping):
            fail(fld + ".values", "must be a dict of placeholder -> text", 'e.g. {"a": "9.8", "b": "9.11"}')
        for fname, ph in fields_of.items():
            missing = sorted(ph - set(it.values))
            if missing:
                fail(f"formats[{fname!r}]", f"uses placeholder {{{missing[0]}}} that {fld} does not define",
                     f"add {missing[0]!r} to the item's values, or remove it from the template")
        extra = sorted(set(it.values) - used)
        if extra:
            fail(fld + ".values", f"defines {extra[0]!r}, which no format uses",
                 f"placeholders in the formats: {', '.join(sorted(used)) or '(none)'}")
        for k, v in it.values.items():
            if not isinstance(v, str):
                fail(f"{fld}.values[{k!r}]", f"is a {type(v).__name__}", "values are strings, e.g. \"9.8\"")
        if isinstance(it.correct, str) != isinstance(it.incorrect, str):
            fail(fld, "gives one answer as text and the other as a list",
                 'both texts (correct=" 9.8", incorrect=" 9.11") or both lists of one token per scored position')
        if isinstance(it.correct, str):
            for ans in ("correct", "incorrect"):
                v = getattr(it, ans)
                if v == "":
                    fail(f"{fld}.{ans}", "must be a non-empty string", 'the continuation after the prompt, e.g. " 9.8"')
                if not v.strip():
                    fail(f"{fld}.{ans}", f"is only whitespace ({v!r})", 'give the answer text, e.g. " 9.8"')
            if it.correct == it.incorrect:
                fail(fld, f"correct and incorrect are the same ({it.correct!r})", "give two different answers")
        else:
            _check_positions(it, fld, fields_of, fail)
        if it.at is not None and not (isinstance(it.at, str) or (isinstance(it.at, Sequence) and all(
                isinstance(p, int) and not isinstance(p, bool) for p in it.at))):
            fail(fld + ".at", f"is {it.at!r}", "use a placeholder's name (at=\"x\"), prompt positions (at=[-3, -2, -1]) "
                 "or leave it out (after the prompt)")
        if isinstance(it.at, str):
            missing = [f for f, ph in fields_of.items() if it.at not in ph]
            if missing:
                fail(fld + ".at", f"names {{{it.at}}}, which format {missing[0]!r} does not have",
                     f"name a placeholder every format has: {', '.join(sorted(set.intersection(*fields_of.values()))) or '(none)'}")
        elif it.at is not None and len(it.at) != len(it.answers("correct")):
            fail(fld + ".at", f"lists {len(it.at)} positions for {len(it.answers('correct'))} answers",
                 "give one position per answer token")
        if not isinstance(it.tag, str):
            fail(fld + ".tag", f"is a {type(it.tag).__name__}", 'tags are strings, e.g. tag="trap" (or leave it out)')
    if case.neutral is not None and (isinstance(case.neutral, str) or not isinstance(case.neutral, Sequence)
                                     or not all(isinstance(t, str) and t.strip() for t in case.neutral)):
        fail("neutral", "must be a list of non-empty texts", 'e.g. neutral=["The sun rose over the hills.", ...]')
    if case.scan is not None and not isinstance(case.scan, Mapping):  # its parts are checked by surgeon.case.grammar
        fail("scan", f"must be a dict of the grammar's parts, not {type(case.scan).__name__}",
             'e.g. scan={"question_cue": {"none": "", "Q": "Q: "}, "shots": [0, 1]}')
    if case.draw is not None and not callable(case.draw):
        fail("draw", f"is a {type(case.draw).__name__}, not a function", "give draw=lambda n, seed: [Item(...), ...] "
             "(n fresh items from the distribution of `items`), or leave it out")
    if case.reference is not None:
        if not isinstance(case.reference, Sequence) or isinstance(case.reference, str) or not case.reference:
            fail("reference", f"is {type(case.reference).__name__ if case.reference else 'empty'}, not a list of Items",
                 "give the items mean ablation averages over: reference=[Item(values={...}, correct=..., "
                 "incorrect=...), ...], or leave it out (the case's items)")
        for i, it in enumerate(case.reference):
            if not isinstance(it, Item) or not isinstance(it.values, Mapping):
                fail(f"reference[{i}]", f"is a {type(it).__name__}", "build items with surgeon.Item(values, correct, incorrect)")
            for fname, ph in fields_of.items():
                missing = sorted(ph - set(it.values))
                if missing:
                    fail(f"reference[{i}].values", f"does not define placeholder {{{missing[0]}}} of format {fname!r}",
                         f"add {missing[0]!r} to the reference item's values")
            if not all(isinstance(getattr(it, a), str) and getattr(it, a).strip() for a in ("correct", "incorrect")):
                fail(f"reference[{i}]", "needs non-empty correct and incorrect answers (their tokens are read too)",
                     'e.g. correct=" 9.8", incorrect=" 9.11"')
    seen: dict = {}
    for i, it in enumerate(case.items):
        key = (tuple(sorted(it.values.items())), it.answers("correct"), it.answers("incorrect"),
               tuple(it.at) if isinstance(it.at, Sequence) and not isinstance(it.at, str) else it.at)
        if key in seen:
            fail(f"items[{i}]", f"repeats items[{seen[key]}] (same values and answers): it would count twice and "
                 "narrow every interval", "remove the duplicate")
        seen[key] = i
    if case.align not in ALIGNS:
        fail("align", f"is {case.align!r}", f"use one of: {', '.join(ALIGNS)}")
    if case.score not in SCORES:
        fail("score", f"is {case.score!r}", f"use one of: {', '.join(SCORES)}")
    if case.combine not in COMBINES:
        fail("combine", f"is {case.combine!r}", f"use one of: {', '.join(COMBINES)}")
    several = [i for i, it in enumerate(case.items) if it.per_position]
    if several and case.score != "sequence":
        fail("score", f"is {case.score!r}, but items[{several[0]}] is scored per position (its own positions, one "
             "answer token each), which no score option changes", 'leave score out (or "sequence") for a case whose '
             "items name their positions")
    if several and case.answer_end is not None:
        fail("answer_end", f"ends text answers, but items[{several[0]}] is scored per position (one token each)",
             "leave answer_end out: per-position answers are single tokens")
    why = check_metric(case.metric)
    if not why and several and not metric_of(case.metric).linear:
        why = (f"reads one position per item, but items[{several[0]}] is scored at several positions (its score "
               f"combines them: a {case.combine}); metrics that combine per position: "
               f"{', '.join(n for n, c in METRICS.items() if c.linear)}")
    if why and several and not check_metric(case.metric):  # the metric exists but cannot combine positions
        fail("metric", why, f"use one that combines per position: "
                            f"{', '.join(n for n, c in METRICS.items() if c.linear)}")
    if why:
        fail("metric", why, f"use one of: {', '.join(METRICS)}, or a function f(logits, correct, incorrect) -> "
                            "score per item")
    if case.answer_end is not None and (not isinstance(case.answer_end, str) or case.answer_end == ""):
        fail("answer_end", f"is {case.answer_end!r}", 'use None, "eos" (the tokenizer\'s end token) or text such as "\\n"')
    if case.focus is not None and case.focus not in case.tags:
        fail("focus", f"no item has tag {case.focus!r}", f"use one of the item tags: {', '.join(case.tags)} (or None)")
    from surgeon.sites.nodes import COMPONENTS

    for c in case.components:
        if c not in COMPONENTS:
            fail("components", f"unknown component {c!r}", f"use any of: {', '.join(COMPONENTS)}")
    if case.saes is not None:
        keys = set(case.saes) if isinstance(case.saes, Mapping) else None
        if keys not in ({"dir"}, {"release", "id"}) or not all(isinstance(v, str) and v for v in case.saes.values()):
            fail("saes", f"is {case.saes!r}", 'use saes={"dir": "path/blocks.{layer}.hook_mlp_out"} or '
                 'saes={"release": "llama_scope_lxm_8x", "id": "l{layer}m_8x"}')
    if case.prepend_bos is not None and not isinstance(case.prepend_bos, bool):
        fail("prepend_bos", f"is a {type(case.prepend_bos).__name__}", "use True, False or None (the model's default)")
    if case.layers is not None:
        if isinstance(case.layers, (str, bytes, Mapping)) or not isinstance(case.layers, Sequence):
            fail("layers", f"is a {type(case.layers).__name__}, not a list of layers", "e.g. layers=[8, 9, 10]")
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in case.layers):
            fail("layers", "must be a list of integers", "e.g. layers=[8, 9, 10]")


def _check_positions(it: Item, fld: str, fields_of, fail) -> None:
    """An item scored at several positions: lists of one answer each, as long as each other, differing everywhere."""
    good, bad = it.correct, it.incorrect
    for ans, v in (("correct", good), ("incorrect", bad)):
        if isinstance(v, Mapping) or not isinstance(v, Sequence) or not v:
            fail(f"{fld}.{ans}", f"is {v!r}", "give a text, or a non-empty list of one answer token per position")
        for j, a in enumerate(v):
            if not isinstance(a, str) or not a.strip():
                fail(f"{fld}.{ans}[{j}]", f"is {a!r}", 'each scored position\'s answer is a token\'s text, e.g. " b"')
    if len(good) != len(bad):
        fail(fld, f"has {len(good)} correct and {len(bad)} incorrect answers", "give one of each per scored position")
    same = [j for j, (a, b) in enumerate(zip(good, bad)) if a == b]
    if same:
        fail(fld, f"correct and incorrect are the same at position {same[0]} ({good[same[0]]!r})",
             "give two different answer tokens at every scored position")


def _canonical(x: Any) -> Any:
    """A case's field as plain JSON data, types named (a Chat is not its user text; a tuple of answers not a text)."""
    if isinstance(x, (Item, Chat)):
        return {"type": type(x).__name__, **{f.name: _canonical(getattr(x, f.name)) for f in fields(x)}}
    if isinstance(x, Mapping):
        return {"type": "dict", "items": sorted(([str(k), _canonical(v)] for k, v in x.items()), key=lambda kv: kv[0])}
    if isinstance(x, (list, tuple)):
        return [_canonical(v) for v in x]
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    return _metric_identity(x)


def _metric_identity(x: Any) -> Any:
    """A metric given as a function or a Metric object, by content: its class or function's source code (and the
    values a closure or an object holds); None when Python cannot show its source, so nothing can be cached on it."""
    import inspect

    fn = x if callable(x) and not hasattr(x, "score") else type(x)
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    held = {}
    for name, cell in zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()), getattr(fn, "__closure__", None) or ()):
        held[name] = repr(cell.cell_contents)
    if not callable(x) or hasattr(x, "score"):
        held.update({k: repr(v) for k, v in sorted(vars(x).items())})
    return {"type": "code", "name": getattr(fn, "__qualname__", "?"), "source": src, "held": held}


# where a case was read from, not what it is; and `draw`, which changes no number computed on the case's items (items
# drawn from it are recorded where they are used)
NOT_CONTENT = ("source", "digest", "read_as", "draw")


def content_digest(case: Case) -> str | None:
    """sha256 of everything in a case that can change a number: formats, items, metric (a function by its source),
    alignment, scoring, reference items, SAEs, ... (not where it was read from). The same for a case file and the
    same case built in Python; another for any edit. None when the metric is a function whose source Python cannot
    show (nothing computed with it can be reused)."""
    data = {f.name: _canonical(getattr(case, f.name)) for f in fields(case) if f.name not in NOT_CONTENT}
    for late in ("neutral", "scan"):  # a case without them keeps the digest it had before the fields existed
        if data.get(late) is None:
            data.pop(late, None)
    if data["metric"] is None and case.metric is not None:
        return None
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=repr).encode()).hexdigest()


def fresh_items(case: Case, n: int, seed: int) -> list[Item]:
    """`n` items from the case's `draw`, none equal (values and answers) to one of its items, checked as the case's
    own items are. Refused where the case defines no `draw` or it cannot give `n` fresh ones."""
    where = origin(case)
    if case.draw is None:
        raise CaseError("defines no draw(n, seed), so it has no fresh items to give", where=where, field="draw",
                        fix="add draw=lambda n, seed: [...] to the case (n fresh items), or evaluate on another case "
                            "file's items: --eval-items OTHER.py")
    if not isinstance(n, int) or n < 1:
        raise CaseError(f"{n!r} fresh items: give a positive number", where=where, field="--eval-items", fix="e.g. 128")
    seen = {(tuple(sorted(it.values.items())), it.correct, it.incorrect) for it in case.items}

    def drawn(k: int) -> list[Item]:
        try:
            got = list(case.draw(k, seed))
        except Exception as e:  # the user's function raised
            raise CaseError(f"draw({k}, {seed}) raised {type(e).__name__}: {e}", where=where, field="draw",
                            fix="make draw(n, seed) return a list of n Items") from None
        for it in got:
            if not isinstance(it, Item):
                raise CaseError(f"draw returned a {type(it).__name__}, not an Item", where=where, field="draw",
                                fix="return surgeon.Item(values, correct, incorrect) objects")
        return got

    want: dict[str, int] = {}
    for it in drawn(n):  # the tags in the proportions draw(n) gives them
        want[it.tag] = want.get(it.tag, 0) + 1
    out, keys = [], set(seen)
    for it in drawn(n + len(seen)):  # more, so that items equal to the case's can be left out
        key = (tuple(sorted(it.values.items())), it.correct, it.incorrect)
        if key not in keys and want.get(it.tag, 0) > 0:
            keys.add(key)
            want[it.tag] -= 1
            out.append(it)
    if len(out) < n:
        raise CaseError(f"draw gave {len(out)} items not already among the case's {len(case.items)} (asked for {n})",
                        where=where, field="--eval-items", fix=f"ask for at most {len(out)}, or widen the generator")
    out = out[:n]
    validate(replace(case, items=out, draw=None), where)  # as the case's own items are checked
    return out


def origin(case: Case) -> str:
    """Where messages about a case point: its file while the case is as read from it, else that it was built (or
    edited, from which file) in Python."""
    if case.source and case.read_as is not None and case.read_as == content_digest(case):
        return case.source
    if case.source:
        return f"case {case.name!r} (edited in Python, read from {case.source})"
    return f"case {case.name!r} (built in Python)"


def case_metric_of(case: Case):
    """The Metric a case scores by, labelled with how it combines positions where an item is scored at several."""
    metric = metric_of(case.metric)
    if any(it.per_position for it in case.items or ()):
        metric = copy.copy(metric)  # a Metric the case gives is not changed
        metric.positions = case.combine
    return metric


def case_field_names() -> list[str]:
    return [f.name for f in fields(Case)]


_FIELDS = {"Case": case_field_names, "Item": lambda: [f.name for f in fields(Item)],
           "Chat": lambda: [f.name for f in fields(Chat)]}
