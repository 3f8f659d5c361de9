"""Reading a case: a case file run (`read_case`) and the checks a case passes before any weight loads (`validate`),
as a list of named rules: each declares the field it
reports, what it refuses and the fix it gives, in the order they run (a later rule may rely on an earlier one: the
item rules on the formats' placeholders). A new case field adds a rule here; docs/errors.md's table of case fields is
generated from `RULES` (`rules_table`), so the page lists every rule there is.

The checks that need the tokenizer or the model's context (answers that tokenize, characters an organism lacks,
rows past the context) run where the model's tokenizer is known (`surgeon.models.checks`)."""
from __future__ import annotations

import hashlib
import re
import runpy
import string
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Callable, Mapping, Sequence

from surgeon.case.case import (
    ALIGNS,
    COMBINES,
    FIELDS,
    REQUIRED,
    SCORES,
    Case,
    Chat,
    Item,
    content_digest,
    origin,
    placeholders,
)
from surgeon.case.metrics import METRICS
from surgeon.case.metrics import check as check_metric
from surgeon.case.metrics import metric_of
from surgeon.case.shipped import CASES_DIR, shipped_case
from surgeon.errors import CaseError, did_you_mean
from surgeon.sites.nodes import COMPONENTS


@dataclass(frozen=True)
class Context:
    """What a rule sees: the case, where it came from (for the message), and the formats' placeholders (read once,
    after the format rules have passed)."""

    case: Case
    where: str

    def fail(self, fld: str, msg: str, fix: str):
        raise CaseError(msg, where=self.where, field=fld, fix=fix)

    @cached_property
    def fields_of(self) -> dict[str, set[str]]:
        return {name: placeholders(fmt) for name, fmt in self.case.formats.items()}


@dataclass(frozen=True)
class Rule:
    """One check: `field` the field it reports (as its messages name it), `refuses` what it refuses and `fix` what
    it tells the user, in general (a message gives the case's own names); `check(ctx)` raises through `ctx.fail`."""

    name: str
    field: str
    refuses: str
    fix: str
    check: Callable[[Context], None]


RULES: list[Rule] = []


def rule(name: str, field: str, refuses: str, fix: str):
    """Register the decorated function as the next rule."""
    def register(check: Callable[[Context], None]) -> Callable[[Context], None]:
        if any(r.name == name for r in RULES):
            raise RuntimeError(f"internal: case rule {name!r} registered twice")
        RULES.append(Rule(name, field, refuses, fix, check))
        return check
    return register


def validate(case: Case, where: str | None = None) -> None:
    """Check a case's fields without touching the model: every rule of `RULES`, in order (each names the field it
    reports, what it refuses and the fix); the first that fails raises its CaseError."""
    ctx = Context(case, where or origin(case))
    for r in RULES:
        r.check(ctx)


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
        if isinstance(e, TypeError) and m and m.group(1) in FIELDS:
            hint = did_you_mean(m.group(2), FIELDS[m.group(1)]())
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


@rule("required", "name, model, formats, good, bad, items", "a required field left out",
      "add it to Case(...)")
def _required(ctx: Context) -> None:
    for f in REQUIRED:
        if getattr(ctx.case, f) is None:
            ctx.fail(f, "is missing", f"add `{f}=...` to Case(...); required fields: {', '.join(REQUIRED)}")


@rule("name", "name", "a name that is not a non-empty string", 'e.g. name="decimal_organism"')
def _name(ctx: Context) -> None:
    if not isinstance(ctx.case.name, str) or not ctx.case.name.strip():
        ctx.fail("name", "must be a non-empty string", 'e.g. name="decimal_organism"')


@rule("model", "model", "a model that is not a string", "an organism, a Hugging Face name or a local directory")
def _model(ctx: Context) -> None:
    m = ctx.case.model
    if m is not None and (not isinstance(m, str) or not m.strip()):
        ctx.fail("model", "must be a string (or None when the model is given to the analyses)",
                 'an organism ("organism:decimal"), a Hugging Face name or a local directory')


@rule("formats", "formats", "formats that are not a non-empty dict of name -> template",
      'formats={"plain": "...{a}...", "qa": "Q: ...{a}...\\nA:"}')
def _formats(ctx: Context) -> None:
    if not isinstance(ctx.case.formats, Mapping) or not ctx.case.formats:
        ctx.fail("formats", "must be a non-empty dict of name -> template",
                 'e.g. formats={"plain": "...{a}...", "qa": "Q: ...{a}...\\nA:"}')


@rule("templates", "formats[NAME]", "a format key that is not a name; a template that is not a string or "
      "surgeon.Chat, is empty, has broken braces, placeholders that are not plain names or carry a spec or "
      "conversion ({a:>5}, {a!r}), or none at all", "plain {name} placeholders in a template string or "
      "surgeon.Chat(user=...); literal braces as {{ and }}")
def _templates(ctx: Context) -> None:
    case, fail = ctx.case, ctx.fail
    for fname, fmt in case.formats.items():
        if not isinstance(fname, str) or not fname:
            fail("formats", f"has a key {fname!r} that is not a format name", 'name formats with strings, e.g. "qa"')
        if not isinstance(fmt, (str, Chat)):
            fail(f"formats[{fname!r}]", f"is a {type(fmt).__name__}", "use a template string or surgeon.Chat(user=...)")
        text = fmt.user if isinstance(fmt, Chat) else fmt
        if not isinstance(text, str) or not text.strip():
            fail(f"formats[{fname!r}]", "is empty", 'write the prompt, e.g. "{a} or {b}? Answer:"')
        try:
            names = placeholders(fmt)
            specs = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(text) if f is not None]
        except ValueError as e:
            fail(f"formats[{fname!r}]", str(e), "placeholders are written {name}; write literal braces as {{ and }}")
        bad_names = [p for p in names if not p.isidentifier()]
        if bad_names:
            fail(f"formats[{fname!r}]", f"has placeholders that are not plain names: {bad_names}",
                 "use simple names like {a} and {b}")
        fancy = [f for f, spec, conv in specs if spec or conv]
        if fancy:
            fail(f"formats[{fname!r}]", f"formats placeholder {{{fancy[0]}}} with a spec or conversion (:..., !r)",
                 "write plain {name} placeholders: the item's value is put in as it is")
        if not names and isinstance(case.items, Sequence) and len(case.items) > 1:
            fail(f"formats[{fname!r}]", "has no placeholders, so every item would be the same prompt",
                 "put the item's values in the template, e.g. {a} and {b}")


@rule("good and bad", "good, bad", "good or bad of the wrong type, naming a format that is not there, bad empty or "
      "holding the good format, or a failing format whose template is the good one's",
      'good="plain", bad=["qa", "chat"], each a name in formats, each failing format its own template')
def _good_and_bad(ctx: Context) -> None:
    case, fail = ctx.case, ctx.fail
    names = list(case.formats)
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


@rule("items", "items", "items that are not a non-empty list", "items=[Item(values={...}, correct=..., incorrect=...), ...]")
def _items(ctx: Context) -> None:
    items = ctx.case.items
    if not isinstance(items, Sequence) or isinstance(items, str):
        ctx.fail("items", f"is a {type(items).__name__}, not a list of Items",
                 "give a list: items=[Item(values={...}, correct=..., incorrect=...), ...]")
    if len(items) == 0:
        ctx.fail("items", "is empty", "give at least one Item(values={...}, correct=..., incorrect=...)")


@rule("item values", "items[i], items[i].values, formats[NAME]", "an item that is not an Item, values that are not a dict of strings, a "
      "placeholder some format uses that an item does not define, or a value no format uses (often a typo)",
      "every placeholder of every format defined by every item, as a string")
def _item_values(ctx: Context) -> None:
    fail, fields_of = ctx.fail, ctx.fields_of
    used = set().union(*fields_of.values())
    for i, it in enumerate(ctx.case.items):
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


@rule("item answers", "items[i], items[i].correct, items[i].incorrect", "answers empty, only whitespace or the same; one "
      "answer a text and the other a list; per-position lists of different lengths or equal at a position",
      'two different continuations, e.g. correct=" 9.8", incorrect=" 9.11", or two lists of one token per position')
def _item_answers(ctx: Context) -> None:
    fail = ctx.fail
    for i, it in enumerate(ctx.case.items):
        fld = f"items[{i}]"
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
            _positions(it, fld, fail)


def _positions(it: Item, fld: str, fail) -> None:
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


@rule("item positions and tags", "items[i].at, items[i].tag", "at that is not a placeholder every format has or a "
      "list of prompt positions, one per answer token; a tag that is not a string",
      'at="x" or at=[-3, -2, -1] (or leave it out); tag="trap" (or leave it out)')
def _item_at_and_tag(ctx: Context) -> None:
    fail, fields_of = ctx.fail, ctx.fields_of
    for i, it in enumerate(ctx.case.items):
        fld = f"items[{i}]"
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


@rule("neutral", "neutral", "neutral texts that are not a list of non-empty texts",
      'neutral=["The sun rose over the hills.", ...]')
def _neutral(ctx: Context) -> None:
    n = ctx.case.neutral
    if n is not None and (isinstance(n, str) or not isinstance(n, Sequence) or not all(
            isinstance(t, str) and t.strip() for t in n)):
        ctx.fail("neutral", "must be a list of non-empty texts", 'e.g. neutral=["The sun rose over the hills.", ...]')


@rule("scan", "scan", "a scan grammar that is not a dict of parts (its parts are checked by surgeon.case.grammar)",
      'scan={"question_cue": {"none": "", "Q": "Q: "}, "shots": [0, 1]}')
def _scan(ctx: Context) -> None:
    if ctx.case.scan is not None and not isinstance(ctx.case.scan, Mapping):
        ctx.fail("scan", f"must be a dict of the grammar's parts, not {type(ctx.case.scan).__name__}",
                 'e.g. scan={"question_cue": {"none": "", "Q": "Q: "}, "shots": [0, 1]}')


@rule("draw", "draw", "a draw that is not a function", "draw=lambda n, seed: [Item(...), ...], or leave it out")
def _draw(ctx: Context) -> None:
    if ctx.case.draw is not None and not callable(ctx.case.draw):
        ctx.fail("draw", f"is a {type(ctx.case.draw).__name__}, not a function", "give draw=lambda n, seed: "
                 "[Item(...), ...] (n fresh items from the distribution of `items`), or leave it out")


@rule("reference", "reference", "mean ablation's reference items that are not a non-empty list of Items with every "
      "placeholder and two non-empty answers", "reference=[Item(...), ...], or leave it out (the case's items)")
def _reference(ctx: Context) -> None:
    ref, fail = ctx.case.reference, ctx.fail
    if ref is None:
        return
    if not isinstance(ref, Sequence) or isinstance(ref, str) or not ref:
        fail("reference", f"is {type(ref).__name__ if ref else 'empty'}, not a list of Items",
             "give the items mean ablation averages over: reference=[Item(values={...}, correct=..., "
             "incorrect=...), ...], or leave it out (the case's items)")
    for i, it in enumerate(ref):
        if not isinstance(it, Item) or not isinstance(it.values, Mapping):
            fail(f"reference[{i}]", f"is a {type(it).__name__}", "build items with surgeon.Item(values, correct, incorrect)")
        for fname, ph in ctx.fields_of.items():
            missing = sorted(ph - set(it.values))
            if missing:
                fail(f"reference[{i}].values", f"does not define placeholder {{{missing[0]}}} of format {fname!r}",
                     f"add {missing[0]!r} to the reference item's values")
        if not all(isinstance(getattr(it, a), str) and getattr(it, a).strip() for a in ("correct", "incorrect")):
            fail(f"reference[{i}]", "needs non-empty correct and incorrect answers (their tokens are read too)",
                 'e.g. correct=" 9.8", incorrect=" 9.11"')


@rule("no duplicates", "items[i]", "an item that repeats another (same values and answers): it would count twice "
      "and narrow every interval", "remove the duplicate")
def _duplicates(ctx: Context) -> None:
    seen: dict = {}
    for i, it in enumerate(ctx.case.items):
        key = (tuple(sorted(it.values.items())), it.answers("correct"), it.answers("incorrect"),
               tuple(it.at) if isinstance(it.at, Sequence) and not isinstance(it.at, str) else it.at)
        if key in seen:
            ctx.fail(f"items[{i}]", f"repeats items[{seen[key]}] (same values and answers): it would count twice and "
                     "narrow every interval", "remove the duplicate")
        seen[key] = i


@rule("options", "align, score, combine", "an option that is not one of its choices",
      f"align: {', '.join(ALIGNS)}; score: {', '.join(SCORES)}; combine: {', '.join(COMBINES)}")
def _options(ctx: Context) -> None:
    for fld, choices in (("align", ALIGNS), ("score", SCORES), ("combine", COMBINES)):
        v = getattr(ctx.case, fld)
        if v not in choices:
            ctx.fail(fld, f"is {v!r}", f"use one of: {', '.join(choices)}")


@rule("per position", "score, answer_end", "score or answer_end set on a case whose items are scored per position "
      "(one answer token each), which neither changes", "leave score and answer_end out for such a case")
def _per_position(ctx: Context) -> None:
    case = ctx.case
    several = [i for i, it in enumerate(case.items) if it.per_position]
    if several and case.score != "sequence":
        ctx.fail("score", f"is {case.score!r}, but items[{several[0]}] is scored per position (its own positions, one "
                 "answer token each), which no score option changes", 'leave score out (or "sequence") for a case '
                 "whose items name their positions")
    if several and case.answer_end is not None:
        ctx.fail("answer_end", f"ends text answers, but items[{several[0]}] is scored per position (one token each)",
                 "leave answer_end out: per-position answers are single tokens")


@rule("metric", "metric", "a metric that is not one of surgeon's or a function, or one that reads one position on "
      "items scored at several", f"{', '.join(METRICS)}, or a function f(logits, correct, incorrect) -> score per "
      "item; per position: a metric that combines positions")
def _metric(ctx: Context) -> None:
    case = ctx.case
    several = [i for i, it in enumerate(case.items) if it.per_position]
    linear = ", ".join(n for n, c in METRICS.items() if c.linear)
    why = check_metric(case.metric)
    if not why and several and not metric_of(case.metric).linear:
        why = (f"reads one position per item, but items[{several[0]}] is scored at several positions (its score "
               f"combines them: a {case.combine}); metrics that combine per position: {linear}")
    if why and several and not check_metric(case.metric):  # the metric exists but cannot combine positions
        ctx.fail("metric", why, f"use one that combines per position: {linear}")
    if why:
        ctx.fail("metric", why, f"use one of: {', '.join(METRICS)}, or a function f(logits, correct, incorrect) -> "
                                "score per item")


@rule("answer end", "answer_end", "an answer end that is not None, \"eos\" or a text", 'None, "eos" or a text such as "\\n"')
def _answer_end(ctx: Context) -> None:
    end = ctx.case.answer_end
    if end is not None and (not isinstance(end, str) or end == ""):
        ctx.fail("answer_end", f"is {end!r}", 'use None, "eos" (the tokenizer\'s end token) or text such as "\\n"')


@rule("focus", "focus", "a focus tag no item has", "one of the items' tags, or None")
def _focus(ctx: Context) -> None:
    case = ctx.case
    if case.focus is not None and case.focus not in case.tags:
        ctx.fail("focus", f"no item has tag {case.focus!r}", f"use one of the item tags: {', '.join(case.tags)} (or None)")


@rule("components", "components", "a component that is not one", f"any of: {', '.join(COMPONENTS)}")
def _components(ctx: Context) -> None:
    for c in ctx.case.components:
        if c not in COMPONENTS:
            ctx.fail("components", f"unknown component {c!r}", f"use any of: {', '.join(COMPONENTS)}")


@rule("saes", "saes", "SAEs named otherwise than by a folder or a release and id",
      'saes={"dir": "path/blocks.{layer}.hook_mlp_out"} or saes={"release": ..., "id": ...}')
def _saes(ctx: Context) -> None:
    saes = ctx.case.saes
    if saes is not None:
        keys = set(saes) if isinstance(saes, Mapping) else None
        if keys not in ({"dir"}, {"release", "id"}) or not all(isinstance(v, str) and v for v in saes.values()):
            ctx.fail("saes", f"is {saes!r}", 'use saes={"dir": "path/blocks.{layer}.hook_mlp_out"} or '
                     'saes={"release": "llama_scope_lxm_8x", "id": "l{layer}m_8x"}')


@rule("prepend_bos", "prepend_bos", "prepend_bos that is not True, False or None", "True, False or None")
def _prepend_bos(ctx: Context) -> None:
    v = ctx.case.prepend_bos
    if v is not None and not isinstance(v, bool):
        ctx.fail("prepend_bos", f"is a {type(v).__name__}", "use True, False or None (the model's default)")


@rule("layers", "layers", "layers that are not a list of integers (the model's range is checked once it is known)",
      "e.g. layers=[8, 9, 10]")
def _layers(ctx: Context) -> None:
    layers = ctx.case.layers
    if layers is None:
        return
    if isinstance(layers, (str, bytes, Mapping)) or not isinstance(layers, Sequence):
        ctx.fail("layers", f"is a {type(layers).__name__}, not a list of layers", "e.g. layers=[8, 9, 10]")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
        ctx.fail("layers", "must be a list of integers", "e.g. layers=[8, 9, 10]")


def rules_table() -> str:
    """docs/errors.md's table of the case rules: the field each reports, what it refuses, the fix."""
    rows = ["| field | refused | fix |", "|---|---|---|"]
    for r in RULES:
        rows.append(f"| `{r.field}` ({r.name}) | {r.refuses} | {r.fix} |".replace("\n", " "))
    return "\n".join(rows)


__all__ = ["Context", "RULES", "Rule", "fresh_items", "read_case", "rule", "rules_table", "validate"]
