"""A grammar of prompt formats (`surgeon scan`): a format composed from named parts, each with a few options.

The anchor is FormatSpread (Sclar et al., ICLR 2024): meaning-preserving variations of a prompt's form (field
descriptors, separators, spacing, casing) sampled from a grammar. Here the parts are the ones a chat model's failure
is usually blamed on, composed around the case's own question (its *body*: the text every case format shares that
holds every placeholder, or the case's `scan["body"]`):

    [chat template around] shots + instruction + question_cue + body + separator + answer_cue

- ``instruction``: a line before the question (none, or an instruction phrasing);
- ``question_cue`` / ``answer_cue``: the descriptors (none/Q:/Question:/User: and Answer:/A:/Assistant:/Output:);
- ``separator``: between the question and the answer cue (a newline, a space, a blank line);
- ``casing``: of the cues and the instruction (as written, lower case);
- ``shots``: 0, 1 or 3 solved examples before the question (other items, each with its correct answer);
- ``chat``: the tokenizer's own chat template around the prompt, with and without a system prompt (a part only
  where the tokenizer has a template).

A case narrows or replaces any part with `Case(scan={"question_cue": {"none": "", "Q": "Q: "}, "shots": [0],
"body": "..."})`: a part given replaces the default's options (a dict of option name -> text; `shots` a list of
counts; `casing` and `chat` a list of the option names below); a part given as one option is held fixed.
"""
from __future__ import annotations

import itertools
import random
import string
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from surgeon.case.case import Case, Chat, Format, Item
from surgeon.errors import CaseError

BUDGET = 40_000  # prompts a scan scores in discovery at most (each distinct (format, item) once)
TEXT_PARTS = ("instruction", "question_cue", "separator", "answer_cue")
PARTS = ("instruction", "question_cue", "separator", "answer_cue", "casing", "shots", "chat")
DEFAULT: dict[str, dict] = {
    "instruction": {"none": "", "instruct": "Answer the question.\n"},
    "question_cue": {"none": "", "Q:": "Q: ", "Question:": "Question: ", "User:": "User: "},
    "separator": {"newline": "\n", "space": " ", "blank line": "\n\n"},
    "answer_cue": {"Answer:": "Answer:", "A:": "A:", "Assistant:": "Assistant:", "Output:": "Output:"},
    "casing": {"as written": "as written", "lower": "lower"},
    "shots": {"0": 0, "1": 1, "3": 3},
    "chat": {"none": "none", "template": "template", "template+system": "template+system"},
}
CASINGS = ("as written", "lower", "upper")
CHATS = ("none", "template", "template+system")
SYSTEM = "You are a helpful assistant."
SHOT_END = "\n\n"  # after each solved example


@dataclass(frozen=True)
class Grammar:
    """The parts (name -> option name -> value) and the question they are composed around."""

    body: str
    parts: Mapping[str, Mapping[str, object]]
    system: str = SYSTEM
    dropped: tuple[str, ...] = ()  # parts left out, and why ("chat: the tokenizer has no chat template")

    @property
    def varied(self) -> list[str]:
        """The parts with more than one option (what a scan can say anything about)."""
        return [p for p in PARTS if len(self.parts.get(p, {})) > 1]

    @property
    def size(self) -> int:
        n = 1
        for p in PARTS:
            n *= max(1, len(self.parts.get(p, {})))
        return n

    def choices(self) -> list[dict[str, str]]:
        """Every combination of options: [{part: option name}], in a fixed order."""
        names = [p for p in PARTS if self.parts.get(p)]
        return [dict(zip(names, combo)) for combo in itertools.product(*(list(self.parts[p]) for p in names))]

    def describe(self) -> str:
        return "; ".join(f"{p}: {' | '.join(map(str, self.parts[p]))}" for p in PARTS if self.parts.get(p))


@dataclass(frozen=True)
class Composed:
    """One format of a grammar: which option of each part, the template (a str or a `Chat`), the few-shot items."""

    choice: Mapping[str, str]
    template: Format
    shots: tuple[int, ...] = field(default=())  # indices (into the case's items) of the solved examples

    @property
    def name(self) -> str:
        return " · ".join(f"{p}={v!r}" if p in TEXT_PARTS else f"{p}={v}" for p, v in self.choice.items())


def body_of(case: Case) -> str:
    """The question every case format asks: the case's `scan["body"]`, else the longest text all its (string)
    formats share that holds every placeholder, trimmed to end at the first line break or space after the last
    placeholder's sentence (so no answer cue is taken for part of the question)."""
    spec = case.scan or {}
    if spec.get("body"):
        return spec["body"]
    texts = [f.user if isinstance(f, Chat) else f for f in (case.formats or {}).values()]
    names = {n for t in texts for _, n, _, _ in string.Formatter().parse(t) if n}
    common = texts[0]
    for t in texts[1:]:
        common = _longest_common(common, t)
    if not names or not all("{" + n + "}" in common for n in names):
        raise CaseError("its formats share no text that holds every placeholder, so the scan cannot tell the question "
                        "from the format around it", where=case.source, field="scan",
                        fix='add scan={"body": "Which is bigger: {a} or {b}?"} to the case (the question alone)')
    last = max(common.rfind("}"), 0)
    end = len(common)
    for i in range(last + 1, len(common)):
        if common[i] in "\n":
            end = i
            break
    return common[:end].strip()


def _longest_common(a: str, b: str) -> str:
    """The longest common substring (dynamic programming; formats are short)."""
    best, at = 0, 0
    prev = [0] * (len(b) + 1)
    for i in range(1, len(a) + 1):
        cur = [0] * (len(b) + 1)
        for j in range(1, len(b) + 1):
            if a[i - 1] == b[j - 1]:
                cur[j] = prev[j - 1] + 1
                if cur[j] > best:
                    best, at = cur[j], i
        prev = cur
    return a[at - best: at]


def check_scan(spec, where: str | None = None) -> None:
    """A case's `scan=`: a dict of known parts (and `body`, `system`), each a non-empty set of options of its kind."""
    if spec is None:
        return
    if not isinstance(spec, Mapping):
        raise CaseError(f"scan must be a dict of parts, not {type(spec).__name__}", where=where, field="scan",
                        fix='e.g. scan={"question_cue": {"none": "", "Q": "Q: "}, "shots": [0, 1]}')
    for key, v in spec.items():
        f = f"scan[{key!r}]"
        if key in ("body", "system"):
            if not isinstance(v, str) or not v.strip():
                raise CaseError(f"{f} must be a non-empty text", where=where, field=f,
                                fix='e.g. "Which is bigger: {a} or {b}?"')
            continue
        if key not in PARTS:
            raise CaseError(f"{f} is not a part of the grammar", where=where, field=f,
                            fix=f"use the parts {', '.join(PARTS)} (and body, system)")
        if key in TEXT_PARTS:
            if not isinstance(v, Mapping) or not v or not all(isinstance(k, str) and isinstance(t, str)
                                                                for k, t in v.items()):
                raise CaseError(f"{f} must be a dict of option name -> text", where=where, field=f,
                                fix='e.g. {"none": "", "Q": "Q: "}')
            if any("{" in t or "}" in t for t in v.values()):
                raise CaseError(f"{f} has a brace: a part's text holds no placeholder", where=where, field=f,
                                fix="write the part's text without { }")
        elif key == "shots":
            if (isinstance(v, (str, Mapping)) or not isinstance(v, Sequence) or not v
                    or not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 8 for k in v)):
                raise CaseError(f"{f} must be a list of example counts in 0..8", where=where, field=f, fix="e.g. [0, 1, 3]")
        else:
            allowed = CASINGS if key == "casing" else CHATS
            if isinstance(v, str) or not isinstance(v, Sequence) or not v or not all(x in allowed for x in v):
                raise CaseError(f"{f} must be a list of {', '.join(allowed)}", where=where, field=f,
                                fix=f"e.g. {list(allowed[:2])}")


def grammar_of(case: Case, tokenizer) -> Grammar:
    """The case's grammar: the default parts with the case's own (`scan=`) in their place; `chat` only where the
    tokenizer has a chat template; `shots` limited to what the case's items can give."""
    spec = dict(case.scan or {})
    check_scan(spec, case.source)
    parts: dict[str, dict] = {}
    dropped = []
    for p in PARTS:
        v = spec.get(p)
        if v is None:
            parts[p] = dict(DEFAULT[p])
        elif p in TEXT_PARTS:
            parts[p] = dict(v)
        elif p == "shots":
            parts[p] = {str(k): int(k) for k in dict.fromkeys(v)}
        else:
            parts[p] = {k: k for k in dict.fromkeys(v)}
    if not getattr(tokenizer, "chat_template", None):
        if any(k != "none" for k in parts["chat"]):
            dropped.append("chat: the tokenizer has no chat template")
        parts["chat"] = {"none": "none"}
    most = len(case.items or ()) - 1
    if any(n > most for n in parts["shots"].values()):
        dropped.append(f"shots above {most}: the case has {most + 1} items")
        parts["shots"] = {k: n for k, n in parts["shots"].items() if n <= most} or {"0": 0}
    return Grammar(body_of(case), parts, spec.get("system", SYSTEM), tuple(dropped))


def _cased(text: str, how: str) -> str:
    return text.lower() if how == "lower" else text.upper() if how == "upper" else text


def compose(g: Grammar, choice: Mapping[str, str], items: Sequence[Item], seed: int = 0,
            exclude: Sequence[int] = ()) -> Composed:
    """The format of one choice. Few-shot examples are the first `shots` items of a seeded shuffle of `items` (never
    one of `exclude`, the items the format is scored on when they are the same list), written in the same format
    with their correct answer; the body's placeholders of the example are filled, the question's are left."""
    get = lambda p: g.parts[p][choice[p]] if p in choice else next(iter(g.parts[p].values()))  # noqa: E731
    case_how = get("casing")
    q = (_cased(get("instruction"), case_how) + _cased(get("question_cue"), case_how) + g.body + get("separator")
         + _cased(get("answer_cue"), case_how))
    n_shots = int(get("shots"))
    pool = [i for i in range(len(items)) if i not in set(exclude)]
    rng = random.Random(f"scan-shots-{seed}")
    rng.shuffle(pool)
    picked = tuple(pool[:n_shots])
    prefix = "".join(_escape(_fill(q, items[i].values)) + _answer(items[i]) + SHOT_END for i in picked)
    user = prefix + q
    chat = get("chat")
    template: Format = user if chat == "none" else Chat(user, g.system if chat == "template+system" else None)
    return Composed(dict(choice), template, picked)


def _fill(template: str, values: Mapping[str, str]) -> str:
    return template.format(**values)


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def _answer(it: Item) -> str:
    return it.correct if isinstance(it.correct, str) else it.correct[0]
