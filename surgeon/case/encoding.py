"""From case items to token rows: rendering formats, answer targets and position alignment.

A *row* is one token sequence to score. An item whose answers differ in a single token (after their
common prefix) is one row scored by logit difference at that position; otherwise it is two rows,
prompt + correct and prompt + incorrect, scored by teacher-forced log-probability of the whole
continuation. Either way the item's score is log P(correct) - log P(incorrect) (> 0: correct wins).
An item scored at several positions (a sequence task) is one row whose targets pair a correct and an incorrect
token at each position, weighted as the case combines them (`positions_row`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from surgeon.errors import AnalysisError, CaseError
from surgeon.case.case import Case, Chat, Format, Item, case_metric_of


@dataclass(frozen=True)
class Row:
    item: int
    tokens: tuple[int, ...]  # what the model reads (a scored answer's last token is predicted, not read)
    n_prompt: int  # prompt tokens, BOS included
    targets: tuple[tuple[int, int, float], ...]  # (position whose logits score, token id, sign)
    anchors: Mapping[str, tuple[int, int]]  # placeholder -> token span [start, end)


def render(fmt: Format, values: Mapping[str, str], tokenizer) -> tuple[str, dict[str, tuple[int, int]]]:
    """The prompt text and the character span of each placeholder's value in it."""
    template = fmt.user if isinstance(fmt, Chat) else fmt
    import string

    text, spans = "", {}
    for literal, name, spec, conv in string.Formatter().parse(template):
        text += literal
        if name is not None:
            value = format(values[name], spec or "")
            spans[name] = (len(text), len(text) + len(value))
            text += value
    if isinstance(fmt, Chat):
        messages = ([{"role": "system", "content": fmt.system}] if fmt.system else []) + [
            {"role": "user", "content": text}]
        full = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        offset = full.find(text)
        if offset < 0:
            raise AnalysisError("the chat template does not contain the user message verbatim",
                                fix="use a plain template string for this format")
        spans = {k: (a + offset, b + offset) for k, (a, b) in spans.items()}
        text = full
    return text, spans


def _tokenize(tokenizer, text: str):
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=getattr(tokenizer, "is_fast", False))
    return list(enc["input_ids"]), enc.get("offset_mapping")


def encode_prompt(fmt: Format, values: Mapping[str, str], tokenizer, prepend_bos: bool):
    """Token ids of the prompt and each placeholder's token span."""
    text, spans = render(fmt, values, tokenizer)
    ids, offsets = _tokenize(tokenizer, text)
    bos = prepend_bos and not isinstance(fmt, Chat)  # a chat template writes its own BOS
    if bos:
        ids = [tokenizer.bos_token_id] + ids
    anchors = {}
    if offsets is not None:
        shift = 1 if bos else 0
        for name, (a, b) in spans.items():
            toks = [i for i, (s, e) in enumerate(offsets) if s < b and e > a and e > s]
            if toks:
                anchors[name] = (toks[0] + shift, toks[-1] + 1 + shift)
    return ids, anchors


def answer_tokens(tokenizer, answer: str, end: str | None = None) -> list[int]:
    """An answer's token ids as scored: followed by the tokenizer's EOS (end="eos"), by the text `end`
    (tokenized with the answer), or by nothing (end=None)."""
    if end == "eos":
        if tokenizer.eos_token_id is None:
            raise CaseError("answer_end='eos', but the tokenizer has no end-of-sequence token", field="answer_end",
                            fix='end answers with text instead, e.g. answer_end="\\n"')
        return _tokenize(tokenizer, answer)[0] + [tokenizer.eos_token_id]
    return _tokenize(tokenizer, answer + (end or ""))[0]


def one_token(tokenizer, text: str, i: int, which: str, j: int) -> int:
    """The token id of a per-position answer (it must be exactly one token)."""
    ids = _tokenize(tokenizer, text)[0]
    if len(ids) != 1:
        raise CaseError(f"item {i}: its {which} answer at scored position {j} ({text!r}) is {len(ids)} tokens, but a "
                        "per-position answer is one token", field=f"items[{i}].{which}",
                        fix="give one token per scored position (a longer answer is a text: correct=\" 9.8\")")
    return ids[0]


def positions_row(i: int, it: Item, prompt: list[int], anchors, tokenizer, combine: str = "mean") -> Row:
    """One row scoring an item at several positions: at each, its correct answer token (sign +w) against its
    incorrect one (sign -w), w = 1/k for combine="mean" (k positions) and 1 for "sum". A linear metric (logprob,
    logit) summed over these targets is the combined score."""
    good = [one_token(tokenizer, a, i, "correct", j) for j, a in enumerate(it.answers("correct"))]
    bad = [one_token(tokenizer, a, i, "incorrect", j) for j, a in enumerate(it.answers("incorrect"))]
    k = len(good)
    w = 1.0 / k if combine == "mean" else 1.0
    tokens = list(prompt)
    if it.at is None:  # after the prompt, teacher-forced: position j reads the correct answers before j
        tokens += good[:-1]
        pos = [len(prompt) - 1 + j for j in range(k)]
    elif isinstance(it.at, str):
        if it.at not in anchors:
            raise CaseError(f"item {i}: at={it.at!r} reads the tokens of placeholder {{{it.at}}}, which this tokenizer "
                            "cannot locate (it needs a fast tokenizer's offsets)", field=f"items[{i}].at",
                            fix="give prompt positions instead, e.g. at=[-3, -2, -1]")
        a, b = anchors[it.at]
        if b - a != k:
            raise CaseError(f"item {i}: placeholder {{{it.at}}} is {b - a} tokens here, but the item has {k} answers "
                            "per position (one per token it reads)", field=f"items[{i}].at",
                            fix=f"give {b - a} correct and incorrect answers, or a value of {k} tokens")
        pos = list(range(a, b))
    else:
        n = len(prompt)
        outside = [p for p in it.at if not -n <= p < n]
        if outside:
            raise CaseError(f"item {i}: scored position {outside[0]} is outside its prompt of {n} tokens",
                            field=f"items[{i}].at", fix=f"use positions from {-n} to {n - 1} (-1: the last prompt token)")
        pos = [p % n for p in it.at]
    targets = tuple(t for p, g, x in zip(pos, good, bad) for t in ((p, g, w), (p, x, -w)))
    return Row(i, tuple(tokens), len(prompt), targets, anchors)


def encode_rows(fmt: Format, items: Sequence[Item], tokenizer, prepend_bos: bool,
                score: str = "sequence", end: str | None = None, combine: str = "mean") -> list[Row]:
    """Rows for `items` in one format. `score="sequence"`: log-probability of the whole continuation;
    `score="first_token"`: logit difference at the first token where the answers differ (one row each).
    `end`: what ends each answer when it is scored (see `answer_tokens`). An item scored per position is one row
    whatever `score` says (`positions_row`), its positions combined as `combine` says."""
    rows: list[Row] = []
    for i, it in enumerate(items):
        prompt, anchors = encode_prompt(fmt, it.values, tokenizer, prepend_bos)
        if it.per_position:
            rows.append(positions_row(i, it, prompt, anchors, tokenizer, combine))
            continue
        good = answer_tokens(tokenizer, it.correct, end)
        bad = answer_tokens(tokenizer, it.incorrect, end)
        common = 0
        while common < min(len(good), len(bad)) and good[common] == bad[common]:
            common += 1
        head = prompt + good[:common]
        last = len(head) - 1
        if score == "first_token":
            if common == min(len(good), len(bad)):
                raise CaseError(f"item {i}: one answer ({it.correct!r} / {it.incorrect!r}) is a prefix of the other, so "
                                "they have no first differing token", field="score",
                                fix='use score="sequence" with answer_end="eos" (scores where each answer ends)')
            rows.append(Row(i, tuple(head), len(prompt), ((last, good[common], 1.0), (last, bad[common], -1.0)), anchors))
            continue
        if len(good) == common + 1 and len(bad) == common + 1:
            rows.append(Row(i, tuple(head), len(prompt), ((last, good[common], 1.0), (last, bad[common], -1.0)), anchors))
            continue
        if common == len(good) or common == len(bad):
            # one answer is a prefix of the other: score both whole continuations
            common = 0
            head, last = prompt, len(prompt) - 1
        for cont, sign in ((good, 1.0), (bad, -1.0)):
            rest = cont[common:]
            toks = tuple(head + rest[:-1])  # the last answer token is only predicted, never read
            targets = tuple((last + j, t, sign) for j, t in enumerate(rest))
            rows.append(Row(i, toks, len(prompt), targets, anchors))
    return rows


def align(base: Row, source: Row, how: str, base_fmt: str = "base", source_fmt: str = "source"):
    """Matched positions (base_positions, source_positions) to patch, for one pair of rows."""
    nb, ns = len(base.tokens), len(source.tokens)
    tail_b = list(range(base.n_prompt - 1, nb))
    tail_s = list(range(source.n_prompt - 1, ns))
    if len(tail_b) != len(tail_s):  # same continuation in both formats, so this cannot differ
        raise AnalysisError("internal: continuations differ between formats")
    if how == "last":
        return tail_b, tail_s
    if how == "end":
        return tail_b[:1], tail_s[:1]
    if how == "decision":  # the position whose output predicts the first token where the answers differ
        return [base.targets[0][0]], [source.targets[0][0]]
    if how == "index":
        if nb != ns:
            raise CaseError(f"align='index' needs prompts of equal length, but item {base.item} has {nb} tokens in "
                            f"{base_fmt!r} and {ns} in {source_fmt!r}", field="align",
                            fix="use align='last' or align='anchors' for formats of different length")
        return list(range(nb)), list(range(ns))
    # anchors: every placeholder's tokens, then the last prompt token and the continuation
    pb, ps = [], []
    for name in sorted(set(base.anchors) & set(source.anchors)):
        (b0, b1), (s0, s1) = base.anchors[name], source.anchors[name]
        if b1 - b0 != s1 - s0:
            raise CaseError(f"placeholder {{{name}}} of item {base.item} is {b1 - b0} tokens in {base_fmt!r} but "
                            f"{s1 - s0} in {source_fmt!r}, so its positions cannot be matched", field="align",
                            fix="use align='last', or put a space or punctuation before the placeholder in both formats")
        pb += range(b0, b1)
        ps += range(s0, s1)
    if not pb:
        raise CaseError("align='anchors' found no placeholder positions shared by the two formats (it needs a "
                        "fast tokenizer and placeholders in both)", field="align", fix="use align='last'")
    pairs = sorted({(b, s) for b, s in zip(pb + tail_b, ps + tail_s)})
    return [b for b, _ in pairs], [s for _, s in pairs]


def prompt_rows(fmt: Format, items: Sequence[Item], tokenizer, prepend_bos: bool) -> list[Row]:
    """One row per item holding just the prompt, for generation; its one target marks the last prompt
    token (token 0, sign 0: it scores nothing)."""
    rows = []
    for i, it in enumerate(items):
        prompt, anchors = encode_prompt(fmt, it.values, tokenizer, prepend_bos)
        rows.append(Row(i, tuple(prompt), len(prompt), ((len(prompt) - 1, 0, 0.0),), anchors))
    return rows


def prepend_bos(case: Case, model) -> bool:
    return case.prepend_bos if case.prepend_bos is not None else bool(model.cfg.default_prepend_bos)


def format_rows(case: Case, model, fmt: str, items):
    """The rows that score `items` in format `fmt`: by the case's `score`, or where the answers first differ
    when its metric reads only that position (kl, a function)."""
    metric = case_metric_of(case)
    score = "first_token" if metric.decision else case.score
    try:
        return encode_rows(case.formats[fmt], items, model.tokenizer, prepend_bos(case, model), score,
                           case.answer_end, case.combine)
    except CaseError as e:
        if not metric.decision or case.score == "first_token" or e.field != "score":
            raise
        raise CaseError(f"metric {metric.label!r} reads where the answers first differ, but {e.message}",
                        where=case.source, field="metric",
                        fix='set answer_end="eos" (the answers then differ at the end token), or use metric '
                            '"logprob" or "prob"') from None
