"""What the engine runs, shown: per item and format the token ids and strings the model reads, the positions whose
logits are scored and the answer token each one scores (with its sign: + correct, - incorrect), and the aligned
position pairs patching moves activations between (failing format <- good format). The rows are the ones every
analysis builds (`format_rows`), the pairs the engine's own `align`, so a number can be reproduced by hand from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from surgeon.errors import AnalysisError
from surgeon.show import Shows
from surgeon.case.case import Case
from surgeon.case.encoding import align
from surgeon.case.select import pick_bad, pick_items
from surgeon.case.encoding import format_rows


@dataclass
class EncodedRow:
    item: int  # index among the chosen items
    tag: str | None
    format: str
    role: str  # good | bad
    tokens: list[int]  # what the model reads (a scored answer's last token is predicted, not read)
    strings: list[str]  # each token as text
    n_prompt: int  # prompt tokens, BOS included
    targets: list[tuple[int, int, float]]  # (position whose logits score, answer token id, sign: +1 correct, -1 ...)
    answer: str = ""  # which continuation the row reads: correct, incorrect, or both (one row scoring both)
    pairs: list[tuple[int, int]] = field(default_factory=list)  # bad rows: (this position, the good row's position)


@dataclass
class Encoding(Shows):
    case: str
    good: str
    bad: list[str]
    align: str
    tag: str | None
    n_items: int
    rows: list[EncodedRow]
    options: dict = field(default_factory=dict)

    def row(self, item: int, fmt: str) -> EncodedRow:
        return next(r for r in self.rows if r.item == item and r.format == fmt)

    def to_pandas(self):
        """One row per item x format x position and answer token scored there: the token, whether it is prompt, the
        answer token its logits score (and the sign: + for the correct answer's, - for the incorrect's), and, in a
        failing format, the good format's position it is patched from. A position that scores both answers' tokens
        (first-token scoring, per-position items) has a row for each; a position that scores nothing has one row."""
        import pandas as pd

        recs = []
        for r in self.rows:
            scored: dict[int, list] = {}
            for p, t, s in r.targets:
                scored.setdefault(p, []).append((t, s))
            patched = dict(r.pairs)
            for p, (t, text) in enumerate(zip(r.tokens, r.strings)):
                for tid, sign in scored.get(p, [(None, None)]):
                    recs.append({"item": r.item, "tag": r.tag, "format": r.format, "role": r.role, "row": r.answer,
                                 "position": p, "token_id": t, "token": text, "prompt": p < r.n_prompt,
                                 "scores_token_id": tid, "sign": sign, "patched_from": patched.get(p)})
        return pd.DataFrame.from_records(recs)


def encode(case: Case, model, *, bad: str | None = None, tag: str | None = "all", items=None) -> Encoding:
    """The rows and aligned pairs of `items` (indices among the tag's items; all when None) in the good format and
    each failing one (`bad`: only that one)."""
    bads = [pick_bad(case, bad)] if bad else list(case.bad_formats)
    tag, pool = pick_items(case, tag)
    chosen = list(range(len(pool))) if items is None else list(items)
    if not chosen:
        raise AnalysisError("no item to show: items is empty", field="--items", fix="name items, e.g. [0, 2], or leave "
                                                                                 "items out for every item")
    outside = [i for i in chosen if not 0 <= i < len(pool)]
    if outside:
        raise AnalysisError(f"items {outside} are not among the {len(pool)} items", field="--items",
                            fix=f"indices 0..{len(pool) - 1}")
    picked = [pool[i] for i in chosen]
    tok = model.tokenizer
    by_format = {f: format_rows(case, model, f, picked) for f in [case.good, *bads]}
    rows = []
    for f, frows in by_format.items():
        for k, r in enumerate(frows):
            pairs = []
            if f != case.good:
                good = by_format[case.good][k]
                pb, ps = align(r, good, case.align, f, case.good)
                pairs = list(zip(pb, ps))
            signs = {s > 0 for _, _, s in r.targets if s != 0}
            answer = "both" if len(signs) > 1 else ("correct" if signs == {True} else "incorrect")
            rows.append(EncodedRow(chosen[r.item], picked[r.item].tag, f, "good" if f == case.good else "bad",
                                   list(r.tokens), [tok.decode([t]) for t in r.tokens], r.n_prompt,
                                   [(int(p), int(t), float(s)) for p, t, s in r.targets], answer=answer,
                                   pairs=pairs))
    return Encoding(case.name, case.good, bads, case.align, tag, len(chosen), rows,
                    options={"bad": bad, "tag": tag, "items": items})
