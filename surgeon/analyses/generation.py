"""Generation-based scoring, as the original paper judged success: greedy continuations, matched
against the answers. Logit scores stay the default; this is the check beside them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from surgeon.case.select import pick_bad, pick_items
from surgeon.engine.contrast import Contrast
from surgeon.engine.readout import greedy
from surgeon.errors import AnalysisError
from surgeon.case.case import Case, Item
from surgeon.case.encoding import prompt_rows
from surgeon.stats import Estimate, wilson
from surgeon.case.encoding import prepend_bos

Verdict = Literal["correct", "incorrect", "other"]


def ends_cleanly(answer: str, rest: str, end: str | None = None) -> bool:
    """Whether `rest`, what follows `answer` in a continuation, ends it. With `end` (the case's answer_end as text)
    it must start with it. Without, nothing may continue the answer's last number or word: a digit after a digit (or
    '.'/',' and a digit: " 3.56" does not end " 3.5"), a letter after a word of two or more letters ("cats" does not
    end "cat"); an answer of one character is one symbol of a stream (an induction task's next letter) and any symbol
    may follow it. An empty rest (the generated tokens ran out) ends it."""
    if not rest:
        return True
    if end is not None:
        return rest.startswith(end)
    a = answer.strip()
    last, c = (a[-1] if a else ""), rest[0]
    number = last.isdigit() and (c.isdigit() or (c in ".," and rest[1:2].isdigit()))
    word = len(a) > 1 and last.isalpha() and (c.isalpha() or c == "_")
    return not (number or word)


def judge(text: str, item: Item, end: str | None = None) -> Verdict:
    """`correct` when the continuation is the correct answer, ended (`ends_cleanly`: by `end`, the case's answer_end
    as text, or by anything that does not continue its number or word), `incorrect` when it is the incorrect one so ended, else `other`
    (extra or missing characters are wrong). White space before the answer is ignored; when both answers match, the
    longer wins."""
    t = text.lstrip()
    hits = []
    for a, v in ((item.text("correct"), "correct"), (item.text("incorrect"), "incorrect")):
        a = a.strip()
        if t.startswith(a) and ends_cleanly(a, t[len(a):], end):
            hits.append((len(a), v))
    return max(hits)[1] if hits else "other"


def end_text(case: Case, tokenizer) -> str | None:
    """The case's answer_end as the text a continuation shows: None, the tokenizer's end token's text, or the text."""
    if case.answer_end is None:
        return None
    if case.answer_end == "eos":
        return getattr(tokenizer, "eos_token", None) or None
    return case.answer_end


@dataclass(frozen=True)
class Generations:
    format: str
    n_new: int
    texts: tuple[str, ...]
    verdicts: tuple[str, ...]
    accuracy: Estimate  # fraction judged correct

    def counts(self) -> dict[str, int]:
        return {v: self.verdicts.count(v) for v in ("correct", "incorrect", "other")}


def _judged(fmt: str, n_new: int, texts: list[str], items: Sequence[Item], end: str | None = None) -> Generations:
    verdicts = tuple(judge(t, it, end) for t, it in zip(texts, items))
    return Generations(fmt, n_new, tuple(texts), verdicts, wilson(verdicts.count("correct"), len(verdicts)))


def check_continuations(case: Case, items: Sequence[Item]) -> None:
    """Refuse to judge generations for items scored inside the prompt (`at`): they have no continuation."""
    inside = [i for i, it in enumerate(items) if it.at is not None]
    if inside:
        raise AnalysisError(f"generation judges what the model writes after the prompt, but item {inside[0]} is scored "
                            f"inside the prompt (at={items[inside[0]].at!r})", where=case.source, field="--generate",
                            fix="leave out --generate for this case (its scores are read at the positions it names)")


def check_generation(case: Case, model, items: Sequence[Item], n_new: int) -> None:
    """Everything that can be refused about judging `n_new` generated tokens, before any work: items with no
    continuation, fewer tokens than the longer answer needs (its right start would be judged `other`)."""
    check_continuations(case, items)
    if n_new < 1:
        raise AnalysisError(f"--generate {n_new} must be at least 1", field="--generate", fix="e.g. --generate 8")
    tok = model.tokenizer
    need, which = max((len(tok(it.text(a), add_special_tokens=False)["input_ids"]), (i, a))
                      for i, it in enumerate(items) for a in ("correct", "incorrect"))
    if n_new < need:
        i, a = which
        raise AnalysisError(f"--generate {n_new} writes fewer tokens than the answers need: item {i}'s {a} answer "
                            f"{items[i].text(a)!r} is {need} tokens, so a continuation that starts it would be judged "
                            "'other'", where=case.source, field="--generate", fix=f"use --generate {need} or more")


def check_room(model, rows, n_new: int) -> None:
    """Refuse a generation that would run past the model's context (before any of it runs)."""
    if n_new < 1:
        raise AnalysisError(f"--generate {n_new} must be at least 1", field="--generate", fix="e.g. --generate 8")
    longest = max(len(r.tokens) for r in rows)
    if longest + n_new > model.cfg.n_ctx:
        raise AnalysisError(f"generating {n_new} tokens after a prompt of {longest} would pass the model's context "
                            f"of {model.cfg.n_ctx} tokens", field="--generate",
                            fix=f"use --generate {max(1, model.cfg.n_ctx - longest)} or less")


def generate_format(case: Case, model, fmt: str, items: Sequence[Item], n_new: int = 8,
                    batch_size: int = 256) -> Generations:
    """Greedy continuations of every item's prompt in one format, unpatched."""
    import torch

    check_generation(case, model, items, n_new)
    rows = prompt_rows(case.formats[fmt], items, model.tokenizer, prepend_bos(case, model))
    check_room(model, rows, n_new)
    device = next(model.parameters()).device
    texts = [""] * len(rows)
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo: lo + batch_size]
        W = max(len(r.tokens) for r in chunk)
        tokens = torch.tensor([list(r.tokens) + [0] * (W - len(r.tokens)) for r in chunk], device=device)
        lengths = torch.tensor([len(r.tokens) for r in chunk], device=device)
        gen = greedy(model, tokens, lengths, n_new)
        for r, g in zip(chunk, gen.tolist()):
            texts[r.item] = model.tokenizer.decode(g)
    return _judged(fmt, n_new, texts, items, end_text(case, model.tokenizer))


def generate_patched(case: Case, model, masks: dict, n_new: int = 8, *, bad: str | None = None,
                     tag: str | None = None, batch_size: int = 256) -> list[Generations]:
    """Greedy continuations of the failing format with each of P patches (masks {site: [P, units]}) applied
    at the case's aligned prompt positions; one Generations per patch."""

    bad = pick_bad(case, bad)
    _, items = pick_items(case, tag)
    check_generation(case, model, items, n_new)
    pb = prepend_bos(case, model)
    base = prompt_rows(case.formats[bad], items, model.tokenizer, pb)
    source = prompt_rows(case.formats[case.good], items, model.tokenizer, pb)
    check_room(model, base, n_new)
    align = "end" if case.align == "last" else case.align  # prompts only: no answer tokens to match
    c = Contrast(model, base, source, align, batch_size=batch_size, base_name=bad, source_name=case.good,
                 clean=False)
    ids = c.generate(masks, n_new)
    end = end_text(case, model.tokenizer)
    return [_judged(bad, n_new, [model.tokenizer.decode(g) for g in ids[p].tolist()], items, end)
            for p in range(ids.shape[0])]
