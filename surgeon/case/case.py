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
import string
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Literal, Mapping, Sequence

from surgeon.case.metrics import metric_of

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


FIELDS = {"Case": case_field_names, "Item": lambda: [f.name for f in fields(Item)],
           "Chat": lambda: [f.name for f in fields(Chat)]}
