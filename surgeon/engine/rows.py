"""Row layout: a case's rows aligned, merged where one row's computation is a prefix of another's, and held in
buckets of rows that share their first patched position (what the engine allocates follows from `layout`).
Merging, sharing a prefix and cutting a row after its last read position are exact only for causal attention: for
a bidirectional model every row is kept alone, from position 0 (`engine.padding` masks its padding), and cut, per
position it scores, before the answer tokens that position predicts (`unseen_answers`)."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch
from torch import Tensor

from surgeon.sites.nodes import Site
from surgeon.case.encoding import Row
from surgeon.case.encoding import align as align_rows




@dataclass
class Bucket:
    """Rows that share their first patched position p0, right-padded to one width.

    Right padding is exact for a causal model: real positions never attend to the padding after
    them. Columns after the last position patched or scored are cut off. Padded patch slots point at
    an extra last column and their masks are zeroed; padded targets have sign 0.
    """

    items: Tensor  # [n] item index of each row
    base_tokens: Tensor  # [n, W]
    source_tokens: Tensor  # [n, W]
    base_pos: Tensor  # [n, S] positions patched in the base run
    source_pos: Tensor  # [n, S] the positions they are taken from in the source run
    tgt_pos: Tensor  # [n, T] base positions whose logits score
    source_tgt_pos: Tensor  # [n, T] the same targets in the source rows
    tgt_tok: Tensor  # [n, T]
    tgt_sign: Tensor  # [n, T] (0 for padding)
    slot_valid: Tensor  # [n, S] 1 for real patch slots, 0 for padding
    equal_lengths: bool  # every base row is as long as its source row (needed to patch patterns)
    p0: int = 0  # first patched position: everything before is shared by all patches
    base_len: Tensor | None = None  # [n] real tokens per base row (the rest is padding), where the model reads padding
    source_len: Tensor | None = None  # [n] the same for the source rows
    # caches, filled on demand
    resid: dict[int, Tensor] = field(default_factory=dict)  # layer -> resid_pre[:, p0:]
    kv: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # layer -> keys/values[:, :p0]
    z: dict[int, Tensor] = field(default_factory=dict)  # layer -> head outputs z[:, p0:]
    source_acts: dict[Site, Tensor] = field(default_factory=dict)  # site -> [n, S, unit, rest]
    base_acts: dict[Site, Tensor] = field(default_factory=dict)  # site -> [n, S, unit, rest]
    site_cache: dict = field(default_factory=dict)  # what a site kind computes once per rows (edge senders)
    kv_rep: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # kv repeated kv_copies times
    kv_copies: int = 0

    @property
    def n(self) -> int:
        return self.base_tokens.shape[0]

    def drop_caches(self) -> None:
        """Forget every cached activation (they are recomputed on demand)."""
        self.resid, self.kv, self.z, self.source_acts, self.base_acts = {}, {}, {}, {}, {}
        self.site_cache, self.kv_rep, self.kv_copies = {}, {}, 0


def _merge_rows(base: Sequence[Row], source: Sequence[Row], aligned: Sequence[tuple]):
    """Rows of one item whose computation is a prefix of another's, merged into it (targets joined).

    Scoring whole answers gives each item a row per answer; " 9.8" and " 9.11" read the same tokens up
    to the point where the shorter answer's row ends, so that row's positions are computed once, in the
    longer row, under every patch. Exact for a causal model: the merged row reads the same tokens and
    gets the same patches at those positions, in the base and in the source run alike."""
    from dataclasses import replace

    out_b, out_s, out_a = list(base), list(source), list(aligned)
    alive = [True] * len(base)
    by_item: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(base):
        by_item[r.item].append(i)
    for ids in by_item.values():
        ids = sorted(ids, key=lambda i: len(base[i].tokens))
        for k, a in enumerate(ids):
            na, sa = len(base[a].tokens), len(source[a].tokens)
            for c in ids[k + 1:]:
                pairs_c = [(p, q) for p, q in zip(*out_a[c]) if p < na]
                if (alive[c] and base[c].tokens[:na] == base[a].tokens and source[c].tokens[:sa] == source[a].tokens
                        and pairs_c == list(zip(*aligned[a]))):
                    out_b[c] = replace(out_b[c], targets=out_b[c].targets + out_b[a].targets)
                    out_s[c] = replace(out_s[c], targets=out_s[c].targets + out_s[a].targets)
                    alive[a] = False
                    break
    keep = [i for i in range(len(base)) if alive[i]]
    return [out_b[i] for i in keep], [out_s[i] for i in keep], [out_a[i] for i in keep]


@dataclass(frozen=True)
class BucketShape:
    """Where a bucket's rows go and how wide it is: what the engine allocates for it follows from this."""

    ids: tuple[int, ...]  # the (merged) rows in it
    p0: int  # first patched position
    slots: int  # patch slots (aligned positions) per row, padded
    base_width: int
    source_width: int
    targets: int
    equal_lengths: bool
    positions: int = 1  # positions whose logits are read per row: 1 where all of a row's targets read one

    @property
    def n(self) -> int:
        return len(self.ids)


def answer_cuts(row: Row) -> list[int]:
    """Where a bidirectional model's row is cut for each position it scores: after the prompt and the answer tokens
    before that position (every position reads the whole row, so a row holding a teacher-forced answer would show
    each answer token to the position predicting it). A position inside the prompt (an output read at every
    position, as tracr's are) reads the whole prompt. Ascending; one cut per distinct scored position."""
    return sorted({max(row.n_prompt, p + 1) for p, _, _ in row.targets})


def cut_row(row: Row, cut: int) -> Row:
    """`row` ending at `cut` and scoring only the targets whose cut that is (`answer_cuts`)."""
    return replace(row, tokens=row.tokens[:cut],
                   targets=tuple(t for t in row.targets if max(row.n_prompt, t[0] + 1) == cut))


def unseen_answers(rows: Sequence[Row]) -> list[Row]:
    """A bidirectional model's rows cut so that no scored position reads the answer tokens it predicts
    (`answer_cuts`): a row per distinct scored position; rows that hold no answer token are kept as they are."""
    return [cut_row(r, c) if c < len(r.tokens) or len(cuts) > 1 else r for r in rows
            for cuts in [answer_cuts(r) or [len(r.tokens)]] for c in cuts]


def _unseen_pairs(base: Sequence[Row], source: Sequence[Row], aligned: Sequence[tuple]):
    """`unseen_answers` for aligned pairs of rows: base and source cut at the same scored position (their answers
    are the same tokens), each keeping the aligned positions before its cut (a prefix of its slots)."""
    out_b, out_s, out_a = [], [], []
    for b, s, (pb, ps) in zip(base, source, aligned):
        cb, cs = answer_cuts(b) or [len(b.tokens)], answer_cuts(s) or [len(s.tokens)]
        if len(cb) != len(cs):
            raise AssertionError("internal: base and source rows score different numbers of positions")
        for x, y in zip(cb, cs):
            keep = [j for j in range(len(pb)) if pb[j] < x and ps[j] < y]
            if keep != list(range(len(keep))):
                raise AssertionError("internal: the aligned positions kept by a cut are not a prefix of the slots")
            out_b.append(cut_row(b, x) if len(cb) > 1 or x < len(b.tokens) else b)
            out_s.append(cut_row(s, y) if len(cs) > 1 or y < len(s.tokens) else s)
            out_a.append(([pb[j] for j in keep], [ps[j] for j in keep]))
    return out_b, out_s, out_a


def merged_rows(base_rows: Sequence[Row], source_rows: Sequence[Row], align: str, base_name: str = "base",
                source_name: str = "source", bidirectional: bool = False):
    """The rows aligned (`align`) and merged where one row's computation is a prefix of another's (never for a
    bidirectional model, whose every position reads the whole row: its rows are cut instead, so that no scored
    position reads the answer it predicts, `unseen_answers`)."""
    aligned = [align_rows(b, s, align, base_name, source_name) for b, s in zip(base_rows, source_rows)]
    if bidirectional:
        return _unseen_pairs(base_rows, source_rows, aligned)
    return _merge_rows(base_rows, source_rows, aligned)


def layout(base_rows: Sequence[Row], source_rows: Sequence[Row], aligned: Sequence[tuple], batch_size: int,
           bidirectional: bool = False) -> list[BucketShape]:
    """Rows grouped by their first patched (or scored) position p0, in buckets of at most `batch_size` rows, each cut after
    its last position patched or scored (a causal model never reads past it). For a bidirectional model every row
    starts at p0 = 0 and keeps all its positions (a patch anywhere moves every position, and every position reads the
    ones after it)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (pb, _) in enumerate(aligned):  # a row scored before its first patch computes from its first target on
        groups[0 if bidirectional else min(min(pb), *(t[0] for t in base_rows[i].targets))].append(i)
    out = []
    for p0, ids in sorted(groups.items()):
        for lo in range(0, len(ids), batch_size):
            chunk = ids[lo: lo + batch_size]
            S = max(len(aligned[i][0]) for i in chunk)
            ragged = any(len(aligned[i][0]) < S for i in chunk)  # padded slots need a column of their own
            Wb = max(max(*aligned[i][0], *(t[0] for t in base_rows[i].targets)) for i in chunk) + 1 + int(ragged)
            Ws = max(max(*aligned[i][1], *(t[0] for t in source_rows[i].targets)) for i in chunk) + 1 + int(ragged)
            if bidirectional:  # whole rows (and a column for padded slots past the longest)
                Wb = max(Wb, max(len(base_rows[i].tokens) for i in chunk) + int(ragged))
                Ws = max(Ws, max(len(source_rows[i].tokens) for i in chunk) + int(ragged))
            equal = all(len(base_rows[i].tokens) == len(source_rows[i].tokens) for i in chunk)
            if equal:  # patterns are patched key by key: keep the key positions of both runs alike
                Wb = Ws = max(Wb, Ws)
            T = max(len(base_rows[i].targets) for i in chunk)
            one = all(len(base_rows[i].targets) == T and len({t[0] for t in base_rows[i].targets}) == 1 for i in chunk)
            out.append(BucketShape(tuple(chunk), p0, S, Wb, Ws, T, equal, 1 if one else T))
    return out


def padded(seqs: Sequence[Sequence], width: int, fill, device, dtype=torch.long) -> Tensor:
    return torch.tensor([list(x) + [fill] * (width - len(x)) for x in seqs], device=device, dtype=dtype)


def row_slice(b: Bucket, r0: int, r1: int) -> Bucket:
    """Rows r0:r1 of a bucket, with views of its caches (for buckets larger than a batch)."""
    rows = slice(r0, r1)
    return Bucket(
        items=b.items[rows], base_tokens=b.base_tokens[rows],
        source_tokens=b.source_tokens[rows], base_pos=b.base_pos[rows], source_pos=b.source_pos[rows],
        tgt_pos=b.tgt_pos[rows], source_tgt_pos=b.source_tgt_pos[rows], tgt_tok=b.tgt_tok[rows],
        tgt_sign=b.tgt_sign[rows], slot_valid=b.slot_valid[rows], equal_lengths=b.equal_lengths, p0=b.p0,
        base_len=None if b.base_len is None else b.base_len[rows],
        source_len=None if b.source_len is None else b.source_len[rows],
        resid={L: x[rows] for L, x in b.resid.items()}, kv={L: (k[rows], v[rows]) for L, (k, v) in b.kv.items()},
        z={L: x[rows] for L, x in b.z.items()},
        source_acts={s: x[rows] for s, x in b.source_acts.items()}, base_acts={s: x[rows] for s, x in b.base_acts.items()})


def to_items(buckets: Sequence[Bucket], per_bucket: list[Tensor], n_items: int) -> Tensor:
    """[P, rows of bucket] per bucket -> [P, n_items] (the rows of one item are summed)."""
    P = per_bucket[0].shape[0]
    out = torch.zeros(P, n_items, device=per_bucket[0].device, dtype=per_bucket[0].dtype)
    for b, s in zip(buckets, per_bucket):
        out = out.index_add(1, b.items.to(out.device), s)
    return out


def nbytes(b: Bucket) -> int:
    """Bytes held by a bucket's caches (tensors in its cache dicts, nested tuples and dicts included)."""
    def size(x) -> int:
        if isinstance(x, Tensor):
            return x.numel() * x.element_size()
        if isinstance(x, dict):
            return sum(size(v) for v in x.values())
        if isinstance(x, (tuple, list)):
            return sum(size(v) for v in x)
        return 0

    return size([b.resid, b.kv, b.z, b.source_acts, b.base_acts, b.site_cache, b.kv_rep])


def buckets(base_rows: Sequence[Row], source_rows: Sequence[Row], aligned: Sequence[tuple], batch_size: int,
            bidirectional: bool, pad: int, device) -> list[Bucket]:
    """The rows (already merged, `merged_rows`) in buckets of at most `batch_size` that share their first patched
    position (`layout`), as tensors on `device`: tokens padded with `pad`, aligned positions, targets, valid slots;
    a bidirectional model's rows keep their real lengths (its padding is masked)."""
    out = []
    for shape in layout(base_rows, source_rows, aligned, batch_size, bidirectional):
        ids, p0, S, Wb, Ws, T = shape.ids, shape.p0, shape.slots, shape.base_width, shape.source_width, shape.targets
        B, Sr = [base_rows[i] for i in ids], [source_rows[i] for i in ids]
        out.append(Bucket(
            items=torch.tensor([r.item for r in B], device=device),
            base_tokens=padded([r.tokens[:Wb] for r in B], Wb, pad, device),
            source_tokens=padded([r.tokens[:Ws] for r in Sr], Ws, pad, device),
            base_pos=padded([aligned[i][0] for i in ids], S, Wb - 1, device),
            source_pos=padded([aligned[i][1] for i in ids], S, Ws - 1, device),
            tgt_pos=padded([[t[0] for t in r.targets] for r in B], T, p0, device),
            source_tgt_pos=padded([[t[0] for t in r.targets] for r in Sr], T, Ws - 1, device),
            tgt_tok=padded([[t[1] for t in r.targets] for r in B], T, 0, device),
            tgt_sign=padded([[t[2] for t in r.targets] for r in B], T, 0.0, device, torch.float32),
            slot_valid=padded([[1.0] * len(aligned[i][0]) for i in ids], S, 0.0, device, torch.float32),
            equal_lengths=shape.equal_lengths,
            p0=p0,
            base_len=torch.tensor([min(len(r.tokens), Wb) for r in B], device=device) if bidirectional else None,
            source_len=torch.tensor([min(len(r.tokens), Ws) for r in Sr], device=device) if bidirectional else None,
        ))
    return out
