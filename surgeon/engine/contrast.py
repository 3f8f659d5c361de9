"""The intervention core: one batched mechanism behind every analysis.

At named hook points, for each patch p and each row of a base run,

    act[p, row, pos_base] <- act + m[p, slot, unit] * (source_act[row, pos_source] - act)

with `m` a mask (0 = leave alone, 1 = replace, in between = blend) over *units* (heads, key/value
heads, slices, the whole vector) and optionally over patch slots (aligned positions). Per-head
patching, subset search, blends and attribution (gradients w.r.t. `m`) are different masks here.

Compute only what changes: a patch at layer L and positions >= p0 leaves layers < L and positions
< p0 untouched. So the base run is computed once per bucket of rows that share p0, caching the residual
stream entering each layer (at positions >= p0), the head outputs there, and the keys/values of
positions < p0; a batch of patches then runs only layers >= L on positions >= p0 (none after the last
position patched or scored), attending to the cached keys/values, with all patches stacked in the
batch dimension. Further:
- a patch that acts at or after layer L's head outputs starts from the cached ones (no attention at L);
- patches that agree below their last patched layer share the work up to that layer's head outputs;
- an answer row whose tokens another row of the same item reads is merged into it.

Memory does not grow with the number of items: rows are held in buckets of at most `batch_size`, their caches
are kept while they fit in `cache_bytes` (later buckets recompute theirs on each call), and `gradient`
back-propagates each chunk of rows as soon as it is scored.
"""
from __future__ import annotations

import functools
from collections import Counter, defaultdict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch
from torch import Tensor

from surgeon.engine import prefix_attention
from surgeon.errors import AnalysisError
from surgeon.models.loading import check_causal
from surgeon.sites.nodes import Site, hook_layer, units_view
from surgeon.sites.protocol import SiteKind, coerce
from surgeon.spec.encoding import Row
from surgeon.spec.encoding import align as align_rows
from surgeon.spec.metrics import LogProb, Metric

LOGPROB = LogProb()

CACHE_BYTES = 2 * 2**30  # activations a Contrast keeps between calls on CPU; buckets past it recompute theirs
CACHE_FRACTION = 0.3  # on a GPU: this fraction of its free memory when the Contrast is built


def default_cache_bytes(device: torch.device) -> int:
    """How many bytes of cached activations a Contrast keeps by default on `device`."""
    if device.type == "cuda":
        return int(CACHE_FRACTION * torch.cuda.mem_get_info(device)[0])
    return CACHE_BYTES


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


@dataclass
class _Groups:
    """Patches grouped by their masks below the last patched layer (see `Contrast._groups`)."""

    last: int  # the last patched layer
    lower: dict[Site, Tensor]  # masks below it, one per group [G, ...]
    upper: dict[Site, Tensor]  # masks at it, one per patch [P, ...]
    group: Tensor  # [P] each patch's group
    order: Tensor  # [P] patches sorted by group
    ends: Tensor  # [G] cumulative group sizes


@dataclass
class HookContext:
    """What a site's hooks see of one chunk of rows: the model, the rows (with their caches), the device, and the
    engine (a site that needs another patched pass over these rows first asks `engine.capture`)."""

    model: object
    bucket: Bucket
    device: torch.device
    engine: object = None
    masks: Mapping = field(default_factory=dict)  # every site's mask of this pass (this chunk's)

    def note(self, path: str) -> None:
        """Record which of its ways a site's hooks took (counted per forward pass in `execution["sites"]`)."""
        if self.engine is not None:
            self.engine._log["sites"][path] += 1


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


def merged_rows(base_rows: Sequence[Row], source_rows: Sequence[Row], align: str, base_name: str = "base",
                source_name: str = "source"):
    """The rows aligned (`align`) and merged where one row's computation is a prefix of another's."""
    aligned = [align_rows(b, s, align, base_name, source_name) for b, s in zip(base_rows, source_rows)]
    return _merge_rows(base_rows, source_rows, aligned)


def layout(base_rows: Sequence[Row], source_rows: Sequence[Row], aligned: Sequence[tuple], batch_size: int
           ) -> list[BucketShape]:
    """Rows grouped by their first patched (or scored) position p0, in buckets of at most `batch_size` rows, each cut after
    its last position patched or scored (a causal model never reads past it)."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (pb, _) in enumerate(aligned):  # a row scored before its first patch computes from its first target on
        groups[min(min(pb), *(t[0] for t in base_rows[i].targets))].append(i)
    out = []
    for p0, ids in sorted(groups.items()):
        for lo in range(0, len(ids), batch_size):
            chunk = ids[lo: lo + batch_size]
            S = max(len(aligned[i][0]) for i in chunk)
            ragged = any(len(aligned[i][0]) < S for i in chunk)  # padded slots need a column of their own
            Wb = max(max(*aligned[i][0], *(t[0] for t in base_rows[i].targets)) for i in chunk) + 1 + int(ragged)
            Ws = max(max(*aligned[i][1], *(t[0] for t in source_rows[i].targets)) for i in chunk) + 1 + int(ragged)
            equal = all(len(base_rows[i].tokens) == len(source_rows[i].tokens) for i in chunk)
            if equal:  # patterns are patched key by key: keep the key positions of both runs alike
                Wb = Ws = max(Wb, Ws)
            T = max(len(base_rows[i].targets) for i in chunk)
            one = all(len(base_rows[i].targets) == T and len({t[0] for t in base_rows[i].targets}) == 1 for i in chunk)
            out.append(BucketShape(tuple(chunk), p0, S, Wb, Ws, T, equal, 1 if one else T))
    return out


def _padded(seqs: Sequence[Sequence], width: int, fill, device, dtype=torch.long) -> Tensor:
    return torch.tensor([list(x) + [fill] * (width - len(x)) for x in seqs], device=device, dtype=dtype)


class Contrast:
    """Items run in a base format, with activations from a source format ready to patch in.

    Denoising (repair) is base = failing format, source = good format; noising is the reverse.
    `run(masks)` returns each item's score (`metric`, default log P(correct) - log P(incorrect)) under each patch.
    `sites` and `start_layer` say up front what will be patched, so one forward pass per format
    fills every cache (they are filled lazily otherwise). `clean=False` skips the clean scores (and
    the passes that compute them) where only `generate` is needed. `cache_bytes` bounds the activations kept
    between calls (default `default_cache_bytes`): buckets past it recompute theirs.
    """

    def __init__(self, model, base_rows: Sequence[Row], source_rows: Sequence[Row], align: str = "last",
                 *, batch_size: int = 256, base_name: str = "base", source_name: str = "source",
                 sites: Sequence[Site | str] = (), start_layer: int | None = None,
                 shared_prefix: bool | None = None, clean: bool = True, cache_bytes: int | None = None,
                 metric: Metric | None = None, reference: Tensor | None = None,
                 mean_rows: Sequence[Row] | None = None):
        if len(base_rows) != len(source_rows) or not base_rows:
            raise AnalysisError("internal: base and source rows differ in number, or there are none")
        check_causal(model)
        self.model = model
        self.cfg = model.cfg
        self.metric = metric or LOGPROB
        if self.metric.reference and reference is None:
            raise AnalysisError(f"internal: metric {self.metric.name!r} needs reference log-probabilities")
        # [n_items, vocab] per item; kept on the device of the first use
        self.reference = reference
        self.batch_size = max(1, int(batch_size))
        self.backoffs = 0  # how often out-of-memory halved the batch size
        # attend to the shared prefix without copying it per patch, where the architecture allows
        why_not = prefix_attention.unsupported(model)
        self.shared_prefix = why_not is None if shared_prefix is None else shared_prefix
        if self.shared_prefix:
            prefix = "shared: every patch attends to one copy of the unpatched prefix's keys and values"
        elif why_not is not None:
            prefix = f"copied per patch ({why_not})"
        else:
            prefix = "copied per patch (asked for)"
        # which execution path each call took, and why a faster one was not taken (see `execution`)
        self._log = {"prefix": prefix, "paths": Counter(), "why": Counter(), "recomputed": 0, "forwards": 0,
                     "sites": Counter()}
        self._grad_leaves: list[Tensor] = []  # set while `gradient` runs: the masks whose .grad it accumulates
        self._drop: list[str] = []  # set while `gradient` runs: hook points whose outputs pass no gradient back
        self._read: At | None = None  # set while `run(read=...)` runs: scores read at a hook point, not the logits
        self._catch = None  # set while `activation_gradient` runs: (hook, where its gradients go)
        self.device = next(model.parameters()).device
        self.cache_bytes = default_cache_bytes(self.device) if cache_bytes is None else int(cache_bytes)
        self.n_items = max(r.item for r in base_rows) + 1
        self.align = align
        # rows (in the source format) whose mean activation per aligned position mean ablation patches in; None: the
        # source rows themselves (`mean_activation`)
        self.mean_rows = list(mean_rows) if mean_rows is not None else None
        self._means: dict[Site, Tensor] = {}
        sites = [Site.coerce(x) for x in sites]
        if start_layer is None:
            start_layer = min((x.layer for x in sites), default=0)
        pad = getattr(model.tokenizer, "pad_token_id", None) or 0
        base_rows, source_rows, aligned = merged_rows(base_rows, source_rows, align, base_name, source_name)
        self.buckets: list[Bucket] = []
        dev = self.device
        for shape in layout(base_rows, source_rows, aligned, self.batch_size):
            ids, p0, S, Wb, Ws, T = shape.ids, shape.p0, shape.slots, shape.base_width, shape.source_width, shape.targets
            B, Sr = [base_rows[i] for i in ids], [source_rows[i] for i in ids]
            bucket = Bucket(
                items=torch.tensor([r.item for r in B], device=dev),
                base_tokens=_padded([r.tokens[:Wb] for r in B], Wb, pad, dev),
                source_tokens=_padded([r.tokens[:Ws] for r in Sr], Ws, pad, dev),
                base_pos=_padded([aligned[i][0] for i in ids], S, Wb - 1, dev),
                source_pos=_padded([aligned[i][1] for i in ids], S, Ws - 1, dev),
                tgt_pos=_padded([[t[0] for t in r.targets] for r in B], T, p0, dev),
                source_tgt_pos=_padded([[t[0] for t in r.targets] for r in Sr], T, Ws - 1, dev),
                tgt_tok=_padded([[t[1] for t in r.targets] for r in B], T, 0, dev),
                tgt_sign=_padded([[t[2] for t in r.targets] for r in B], T, 0.0, dev, torch.float32),
                slot_valid=_padded([[1.0] * len(aligned[i][0]) for i in ids], S, 0.0, dev, torch.float32),
                equal_lengths=shape.equal_lengths,
                p0=p0,
            )
            self.buckets.append(bucket)
        self.clean_base = self.clean_source = None  # without `clean` (generation needs neither)
        if not clean:
            return
        base_scores, source_scores = [], []
        with torch.no_grad():
            for b in self.buckets:
                base_scores.append(self._ensure_base(b, start_layer, sites, score=True)[None])
                source_scores.append(self._ensure_source(b, sites, score=True)[None])
                self._trim(b)
        self.clean_base = self._to_items(base_scores)[0]
        self.clean_source = self._to_items(source_scores)[0]
        check_scores(self.clean_base, base_name)
        check_scores(self.clean_source, source_name)

    def _to_items(self, per_bucket: list[Tensor]) -> Tensor:
        return _to_items(self.buckets, per_bucket, self.n_items)

    # ----------------------------------------------------------------- caches
    def _trim(self, b: Bucket) -> None:
        """After bucket `b` was used: drop its caches if all buckets' caches together pass `cache_bytes`.

        Calls walk the buckets in order, so the first ones that fit stay cached and the later ones recompute
        theirs (one unpatched forward per run) each time: memory stays bounded whatever the number of items."""
        if sum(_nbytes(x) for x in self.buckets) > self.cache_bytes:
            b.drop_caches()
            self._log["recomputed"] += 1

    def _ensure_base(self, b: Bucket, start: int, sites: Sequence[Site], score: bool = False):
        """Cache what patches of layers >= start need from the base run; with `score`, return clean scores."""
        layers = [L for L in range(start, self.cfg.n_layers) if L not in b.resid]
        sites = [s for s in sites if s not in b.base_acts]
        if not layers and not sites and not score:
            return None
        names = [f"blocks.{L}.hook_resid_pre" for L in layers]
        names += [f"blocks.{L}.attn.hook_{x}" for L in layers for x in "kvz"]
        names += [s.hook for s in sites]
        final, cache = self._pass(b.base_tokens, names, score)
        for L in layers:  # copies of the slices, so the full activations can be freed
            b.resid[L] = cache[f"blocks.{L}.hook_resid_pre"][:, b.p0:].clone()
            b.kv[L] = (cache[f"blocks.{L}.attn.hook_k"][:, : b.p0].clone(),
                       cache[f"blocks.{L}.attn.hook_v"][:, : b.p0].clone())
            b.z[L] = cache[f"blocks.{L}.attn.hook_z"][:, b.p0:].clone()
        for s in sites:
            b.base_acts[s] = self._gather(cache[s.hook], s, b.base_pos)
        if score:
            return self._readout(b, final, b.tgt_pos)[0]
        return None

    def _ensure_source(self, b: Bucket, sites: Sequence[Site], score: bool = False):
        sites = [s for s in sites if s not in b.source_acts]
        if not sites and not score:
            return None
        for s in sites:
            if s.component.pattern_like and not b.equal_lengths:
                raise AnalysisError(
                    "patching attention patterns needs base and source prompts of equal length (the keys must "
                    "correspond), but they differ", field="component",
                    fix="patch head outputs (component z) instead, or use formats of equal length")
        final, cache = self._pass(b.source_tokens, [s.hook for s in sites], score)
        for s in sites:
            b.source_acts[s] = self._gather(cache[s.hook], s, b.source_pos)
        if score:
            return self._readout(b, final, b.source_tgt_pos)[0]
        return None

    def _pass(self, tokens: Tensor, names: Sequence[str], final: bool):
        """One forward over `tokens` (in batches), caching `names`; the final residual too if `final`."""
        return self._with_backoff(lambda: self._pass_once(tokens, names, final))

    @torch.no_grad()
    def _pass_once(self, tokens: Tensor, names: Sequence[str], final: bool):
        names = list(dict.fromkeys(names))
        out: dict[str, list[Tensor]] = defaultdict(list)
        finals = []
        stop = self.cfg.n_layers if final else max(hook_layer(n) for n in names) + 1
        for lo in range(0, tokens.shape[0], self.batch_size):
            with fused_activations(self.model):
                res, cache = self.model.run_with_cache(tokens[lo: lo + self.batch_size], names_filter=names,
                                                       stop_at_layer=stop)
            self._log["forwards"] += 1
            finals.append(res)
            for n in names:
                out[n].append(cache[n])
        return (torch.cat(finals) if final else None), {n: torch.cat(v) for n, v in out.items()}

    def _gather(self, act: Tensor, site: Site, pos: Tensor) -> Tensor:
        x = units_view(act, site.component, site.n_units(self.cfg))
        idx = torch.arange(x.shape[0], device=x.device)[:, None]
        return x[idx, pos.to(x.device)]  # [n, S, unit, rest]

    def _kv_cache(self, b: Bucket, start: int, copies: int):
        """A frozen TL key/value cache holding the shared prefix, repeated once per patch in the chunk.

        The repeated tensors are kept (for the largest chunk size seen) and reused by later calls."""
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
        from transformer_lens.cache.key_value_cache_entry import (
            TransformerLensKeyValueCacheEntry,
        )

        if b.kv_copies < copies:
            b.kv_rep, b.kv_copies = {}, copies
        for L in range(start, self.cfg.n_layers):
            if L not in b.kv_rep:
                k, v = b.kv[L]
                b.kv_rep[L] = (k.repeat(b.kv_copies, 1, 1, 1), v.repeat(b.kv_copies, 1, 1, 1))
        rows = copies * b.n  # patch-major layout: the first `copies` copies are the first rows
        entries = [None] * start + [TransformerLensKeyValueCacheEntry(b.kv_rep[L][0][:rows], b.kv_rep[L][1][:rows],
                                                                      frozen=True)
                                    for L in range(start, self.cfg.n_layers)]
        mask = torch.ones((b.n * copies, b.p0), dtype=torch.int, device=self.device)
        return TransformerLensKeyValueCache(entries=entries, previous_attention_mask=mask, frozen=True)

    # ----------------------------------------------------------------- the core
    @property
    def n_slots(self) -> int:
        """The most aligned positions (patch slots) any row has: a per-slot mask is [P, n_slots, units]."""
        return max(b.base_pos.shape[1] for b in self.buckets)

    def slot_items(self) -> Tensor:
        """[n_slots, n_items] True where some row of the item has that slot (an aligned position)."""
        out = torch.zeros(self.n_slots, self.n_items, dtype=torch.bool)
        for b in self.buckets:
            v = b.slot_valid.cpu() > 0  # [n, S]
            for j in range(v.shape[1]):
                out[j, b.items.cpu()[v[:, j]]] = True
        return out

    def slot_tokens(self) -> list[list[int]]:
        """Per slot, the base run's token at that position in each row that has it."""
        out: list[list[int]] = [[] for _ in range(self.n_slots)]
        for b in self.buckets:
            pos, v = b.base_pos.cpu(), b.slot_valid.cpu() > 0
            tok = b.base_tokens.cpu()
            for r in range(b.n):
                for j in range(pos.shape[1]):
                    if v[r, j]:
                        out[j].append(int(tok[r, pos[r, j]]))
        return out

    def units(self, site: Site | str) -> int:
        """Number of units a mask at `site` addresses."""
        return coerce(site).n_units(self.cfg)

    def deltas(self, sites: Sequence[Site | str]) -> dict[Site, Tensor]:
        """Mean norm of (source - base) activation per unit at the patched positions: 0 means a no-op patch."""
        out = {}
        for s in map(Site.coerce, sites):
            tot, cnt = 0.0, 0
            for b in self.buckets:
                self._ensure_base(b, s.layer, [s])
                self._ensure_source(b, [s])
                d = (b.source_acts[s].float() - b.base_acts[s].float()).norm(dim=-1)  # [n, S, U]
                tot = tot + (d * b.slot_valid[..., None]).sum(dim=(0, 1))
                cnt += float(b.slot_valid.sum())
                self._trim(b)
            out[s] = tot / cnt
        return out

    def _by_first_layer(self, masks: Mapping, P: int, start: int):
        """[(layer, patch indices)] grouping patches by the first layer they act at, or None.

        Done where a site kind asks for it (edges: a batch verifying the top edges one by one mostly acts
        at later layers; each group then runs from its own first layer, not from the earliest of the batch)."""
        if (not any(s.split_by_first_layer for s in masks) or any(m.requires_grad for m in masks.values())
                or P < 2):
            return None
        first = torch.full((P,), self.cfg.n_layers, dtype=torch.long)
        for s, m in masks.items():
            first = torch.minimum(first, s.first_layers(m, self.cfg.n_layers))
        first = first.clamp(min=start, max=self.cfg.n_layers - 1)
        layers = torch.unique(first).tolist()
        if len(layers) < 2:
            return None
        return [(L, torch.nonzero(first == L).flatten()) for L in layers]

    @property
    def execution(self) -> dict:
        """Which execution paths the calls so far took and why faster ones were not taken (recorded in every
        result and manifest): `prefix` says whether patches share the unpatched prefix; `paths` counts the
        runs by path (grouped: patches agreeing below their last layer share that work; split: patches
        grouped by the first layer they act at; plain: every patch from the first patched layer); `why`
        counts the reasons a run was not grouped; `backoffs` is how often out-of-memory halved the batch;
        `caches_recomputed` how often a bucket's caches were dropped to stay within `cache_bytes`; `forwards` how
        many forward passes (batched) ran; `sites` which way sites' hooks went, per pass (e.g. edge gradients
        through the projections or per-head inputs); `metric` what the scores measure."""
        return {"metric": self.metric.label, "prefix": self._log["prefix"], "paths": dict(self._log["paths"]), "why": dict(self._log["why"]),
                "batch_size": self.batch_size, "backoffs": self.backoffs, "buckets": len(self.buckets),
                "cache_bytes": self.cache_bytes, "caches_recomputed": self._log["recomputed"],
                "forwards": self._log["forwards"], "sites": dict(self._log["sites"])}

    def run(self, masks: Mapping[Site | str, Tensor], progress: bool | str = False, _start: int | None = None,
            read: "At | None" = None) -> Tensor:
        """Item scores [P, n_items] with each of P patches applied.

        `masks[site]` is [P, units] (the same mask at every patched position) or [P, slots, units]. Masks
        may require grad: the scores are differentiable w.r.t. them (attribution). With `read` (an `At`), the
        scores are what it reads at its hook point (the pass stops after that layer), not the metric.
        """
        if read is not None:
            if self._read is not None:
                raise AnalysisError("internal: a read at a hook point is already under way")
            self._read = read
            try:
                return self.run(masks, progress, _start)
            finally:
                self._read = None
        masks = {coerce(k): v for k, v in masks.items()}
        if not masks:
            raise AnalysisError("no masks given")
        Ps = {m.shape[0] for m in masks.values()}
        if len(Ps) != 1:
            raise AnalysisError(f"masks disagree on the number of patches: {sorted(Ps)}")
        P = Ps.pop()
        for s, m in masks.items():
            if m.shape[-1] != s.n_units(self.cfg):
                raise AnalysisError(f"mask for {s.name} has {m.shape[-1]} units, the site has {s.n_units(self.cfg)}")
        start = min(s.layer for s in masks)
        if self._read is not None and start > hook_layer(self._read.hook):
            raise AnalysisError(f"{self._read.hook} is computed before the patched sites (layer {start}): no patch "
                                "can change it", fix=f"read at layer {start} or later")
        split = None if self._read is not None else self._by_first_layer(masks, P, start)
        if split is not None:  # patches that act only at later layers start there
            self._log["paths"]["split by first layer"] += 1
            out = None
            for L, idx in split:
                sub = self.run({s: m[idx] for s, m in masks.items()}, progress=progress, _start=L)
                out = sub.new_empty(P, sub.shape[1]) if out is None else out
                out[idx.to(out.device)] = sub
            return out
        if _start is not None:
            start = max(start, _start)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=P * sum(b.n for b in self.buckets), unit="run", leave=False,
                       desc=progress if isinstance(progress, str) else "patching")
        groups, why = (None, "read at a hook point") if self._read is not None else self._groups(masks, start, P)
        self._log["paths"]["grouped" if groups is not None else "plain"] += 1
        if why:
            self._log["why"][why] += 1
        per_bucket = []
        nodes = _node_sites(masks)
        for b in self.buckets:
            self._ensure_base(b, start, nodes)
            self._ensure_source(b, nodes)
            per_bucket.append(self._with_backoff(lambda: self._bucket_scores(b, start, masks, P, bar, groups),
                                                 restart=self._restore_grads()))
            self._trim(b)
        if bar is not None:
            bar.close()
        return self._to_items(per_bucket)

    def gradient(self, masks: Mapping[Site | str, Tensor], progress: bool | str = False, drop: Sequence[str] = (),
                 read: "At | None" = None) -> tuple[dict[SiteKind, Tensor], Tensor]:
        """d/d(mask) of the sum over patches of the mean score over items, at the given masks; and the scores
        [P, n_items]. Each chunk of rows is back-propagated as soon as it is scored, so memory holds one chunk's
        graph, not every item's (what `run(masks).mean(1).sum().backward()` would keep). `drop`: hook points whose
        output passes no gradient back (its value is unchanged): AtP*'s GradDrop drops a layer's outputs, a feature
        edge the SAEs' hook points between its ends. `read`: the scores read at a hook point (see `run`)."""
        leaves = {coerce(k): v.detach().clone().requires_grad_(True) for k, v in masks.items()}
        self._grad_leaves = list(leaves.values())
        self._drop = list(drop)
        try:
            with torch.enable_grad():
                scores = self.run(leaves, progress, read=read)
        finally:
            self._grad_leaves, self._drop = [], []
        return {s: (m.grad if m.grad is not None else torch.zeros_like(m)) for s, m in leaves.items()}, scores

    def activation_gradient(self, masks: Mapping[Site | str, Tensor], hook: str, progress: bool | str = False
                            ) -> Tensor:
        """[n_items, S, ...] d(item score)/d(activation at `hook`) at the aligned positions (the base run's), under
        one patch (masks [1, units]; zeros: the run as it is). What an edge's downstream end needs: the metric's
        gradient at a node, item by item (Marks et al.'s left vector), from one backward pass per chunk."""
        masks = {coerce(k): v for k, v in masks.items()}
        if any(m.shape[0] != 1 for m in masks.values()):
            raise AnalysisError("internal: activation_gradient takes one patch (masks [1, units])")
        S = max(b.base_pos.shape[1] for b in self.buckets)
        out: dict[str, Tensor] = {}

        def store(b: Bucket, g: Tensor):
            rel, idx = (b.base_pos - b.p0).to(g.device), torch.arange(b.n, device=g.device)[:, None]
            x = g.view(-1, b.n, *g.shape[1:]).sum(0)[idx, rel].float().cpu() * self.n_items  # [n, S', ...]
            if "g" not in out:
                out["g"] = torch.zeros(self.n_items, S, *x.shape[2:])
            out["g"].index_add_(0, b.items.cpu(), torch.nn.functional.pad(
                x, [0, 0] * (x.dim() - 2) + [0, S - x.shape[1]]))

        self._catch = (hook, store)
        try:
            self.gradient(masks, progress)
        finally:
            self._catch = None
        return out["g"]

    def _catch_hook(self, b: Bucket, copies: int):
        def catch(act, hook):
            if not act.requires_grad:
                act = act.detach().requires_grad_(True)
            act.register_hook(lambda g: self._catch[1](b, g))
            return act
        return catch

    def _backward_now(self, scores: Tensor) -> Tensor:
        """Within `gradient`: back-propagate one chunk's share of the mean score and keep only the values."""
        if not self._grad_leaves or not scores.requires_grad:
            return scores
        (scores.sum() / self.n_items).backward()
        return scores.detach()

    def _restore_grads(self):
        """Within `gradient`: a function putting the masks' gradients back to what they are now (before a bucket
        is retried after out-of-memory, so its rows are not counted twice)."""
        if not self._grad_leaves:
            return None
        saved = [None if m.grad is None else m.grad.clone() for m in self._grad_leaves]

        def restore():
            for m, g in zip(self._grad_leaves, saved):
                m.grad = g
        return restore

    def _bucket_scores(self, b: Bucket, start: int, masks: Mapping[Site, Tensor], P: int, bar,
                       groups: "_Groups | None" = None) -> Tensor:
        """[P, n] scores for one bucket: rows in slices of at most batch_size, patches in chunks that fill it."""
        cols = []
        for r0 in range(0, b.n, self.batch_size):
            sb = b if b.n <= self.batch_size else _row_slice(b, r0, min(b.n, r0 + self.batch_size))
            # a patch recomputes only the W - p0 positions from p0 on, so with the prefix shared (not
            # copied per patch) as many patched rows fit in a forward pass as positions of batch_size
            # full rows would: its memory stays that of a full pass
            width = sb.base_tokens.shape[1]
            per_row = width - sb.p0 if self.shared_prefix else width
            chunk = max(1, self.batch_size * width // (sb.n * per_row))
            if groups is not None:
                cols.append(self._grouped_scores(sb, start, groups, chunk, bar))
                continue
            outs, kv = [], {}
            for lo in range(0, P, chunk):
                sub = {s: m[lo: lo + chunk] for s, m in masks.items()}
                c = min(chunk, P - lo)
                if c not in kv:
                    kv = {c: prefix_attention.prefix_cache(self.model, sb.p0, start) if self.shared_prefix
                          else self._kv_cache(sb, start, c)}
                outs.append(self._backward_now(self._run_chunk(sb, start, sub, c, kv[c], lo=lo)))
                if bar is not None:
                    bar.update(c * sb.n)
            cols.append(torch.cat(outs))
        return torch.cat(cols, dim=1)

    def _groups(self, masks: Mapping[SiteKind, Tensor], start: int, P: int) -> "tuple[_Groups | None, str | None]":
        """How patches that also act at a later layer share work, or (None, why not) where that does not pay.

        Patches whose masks agree below the last patched layer `last` agree on everything up to that
        layer's head outputs. When every patch at `last` acts at or after them, those are computed once
        per group of agreeing patches, and each patch runs only from there on (a subset search over the
        heads of two layers computes the lower layer's 2^8 head combinations, not one per subset)."""
        last = max(s.layer for s in masks)
        if last == start:
            return None, None  # one layer: nothing below it to share
        if not self.shared_prefix:
            return None, "not grouped: the prefix is copied per patch"
        kinds = sorted({s.kind for s in masks if not s.groupable})
        if kinds:
            return None, f"not grouped: {', '.join(kinds)} sites do not group"
        if any(m.requires_grad for m in masks.values()):
            return None, "not grouped: gradients w.r.t. the masks"
        if not all(s.keeps_head_outputs(last) for s in masks if s.layer == last):
            return None, f"not grouped: a site at layer {last} acts before its head outputs"
        lower = {s: m for s, m in masks.items() if s.layer < last}
        key = torch.cat([m.reshape(P, -1) for m in lower.values()], dim=1)
        _, group = torch.unique(key, dim=0, return_inverse=True)
        G = int(group.max()) + 1
        if 2 * G > P:
            return None, "not grouped: fewer than two patches per group"
        first = torch.full((G,), P, dtype=torch.long, device=group.device).scatter_reduce(
            0, group, torch.arange(P, device=group.device), "amin")
        return _Groups(last, {s: m[first] for s, m in lower.items()},
                       {s: m for s, m in masks.items() if s.layer == last}, group,
                       torch.argsort(group, stable=True), torch.bincount(group, minlength=G).cumsum(0)), None

    def _grouped_scores(self, b: Bucket, start: int, g: "_Groups", chunk: int, bar) -> Tensor:
        """[P, n] scores, each group's state at its last layer computed once (see `_groups`)."""
        G, n, out, done = len(g.ends), b.n, None, 0
        for g0 in range(0, G, chunk):
            g1 = min(G, g0 + chunk)
            resid, z = self._group_states(b, start, g.last, {s: m[g0:g1] for s, m in g.lower.items()}, g1 - g0)
            resid, z = resid.view(g1 - g0, n, *resid.shape[1:]), z.view(g1 - g0, n, *z.shape[1:])
            ids = g.order[done: int(g.ends[g1 - 1])]
            done = int(g.ends[g1 - 1])
            kv = prefix_attention.prefix_cache(self.model, b.p0, g.last)
            for lo in range(0, len(ids), chunk):
                p = ids[lo: lo + chunk]
                sel = (g.group[p] - g0).to(resid.device)
                c = len(p)
                scores = self._run_chunk(b, g.last, {s: m[p] for s, m in g.upper.items()}, c, kv,
                                         resid=resid[sel].flatten(0, 1), z=z[sel.to(z.device)].flatten(0, 1))
                if out is None:
                    out = torch.empty(len(g.group), n, device=scores.device, dtype=scores.dtype)
                out[p.to(out.device)] = scores
                if bar is not None:
                    bar.update(c * n)
        return out

    def _group_states(self, b: Bucket, start: int, last: int, masks: Mapping[Site, Tensor], copies: int):
        """Residual stream entering layer `last` and head outputs there [copies * n, ...] under each patch."""
        names = (f"blocks.{last}.hook_resid_pre", f"blocks.{last}.attn.hook_z")
        kept = {}

        def keep(act, hook):
            kept[hook.name] = act

        self._forward(b, start, masks, copies, prefix_attention.prefix_cache(self.model, b.p0, start),
                      stop=last + 1, extra_hooks=[(name, keep) for name in names])
        return kept[names[0]], kept[names[1]]

    def _with_backoff(self, fn, restart=None):
        """Run fn; on out-of-memory (a GPU's, or the CPU allocator's) halve the batch size and try again (down to
        one row). `restart` is called before a retry (to undo what the failed attempt accumulated)."""
        while True:
            try:
                return fn()
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not is_out_of_memory(e):
                    raise
                for b in self.buckets:
                    b.kv_rep, b.kv_copies = {}, 0
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                if self.batch_size == 1:
                    raise AnalysisError("out of memory with a single row per forward pass", field="--batch-size",
                                        fix="use --dtype bfloat16, fewer or shorter items, or a device with more memory"
                                        ) from None
                self.batch_size = max(1, self.batch_size // 2)
                self.backoffs += 1
                if restart is not None:
                    restart()

    def _mix_hooks(self, b: Bucket, masks: Mapping[SiteKind, Tensor], copies: int, offset: int, start: int = 0) -> list:
        """Every site's hooks for one chunk of `copies` patches (positions relative to `offset`, the first
        position the forward pass sees)."""
        ctx = HookContext(self.model, b, self.device, self, masks)
        return [h for site, m in masks.items() for h in site.hooks(ctx, m, copies, offset, start)]

    def _run_chunk(self, b: Bucket, start: int, masks: Mapping[Site, Tensor], copies: int, kv_cache,
                   resid: Tensor | None = None, z: Tensor | None = None, lo: int = 0) -> Tensor:
        """[copies, n] scores under `copies` patches (patches lo.. of the call)."""
        if self._read is not None:
            kept = {}

            def keep(act, hook):
                kept["x"] = act

            self._forward(b, start, masks, copies, kv_cache, resid=resid, z=z, stop=hook_layer(self._read.hook) + 1,
                          extra_hooks=[(self._read.hook, keep)])
            x = kept["x"].view(copies, b.n, *kept["x"].shape[1:])
            rel, idx = (b.base_pos - b.p0).to(x.device), torch.arange(b.n, device=x.device)[:, None]
            with torch.set_grad_enabled(bool(self._grad_leaves)):  # SAE parameters may require grad
                return self._read.fn(x[:, idx, rel], b.items, b.slot_valid, lo)
        final = self._forward(b, start, masks, copies, kv_cache, resid=resid, z=z, read=b.tgt_pos - b.p0)
        return self._readout(b, final, b.tgt_pos - b.p0)

    def _readout(self, b: Bucket, final: Tensor, tgt_pos: Tensor) -> Tensor:
        """[copies, n] scores of the bucket's rows from final residuals (targets at `tgt_pos`)."""
        ref = None
        if self.metric.reference:
            ref = self.reference[b.items.to(self.reference.device)]
        return readout(self.model, final, tgt_pos, b.tgt_tok, b.tgt_sign, max_rows=self.batch_size,
                       metric=self.metric, ref=ref)

    def _forward(self, b: Bucket, start: int, masks: Mapping[Site, Tensor], copies: int, kv_cache, *,
                 resid: Tensor | None = None, z: Tensor | None = None, stop: int | None = None,
                 extra_hooks: Sequence = (), read: Tensor | None = None) -> Tensor:
        """Layers start..stop of the patched positions under `copies` patches, from the base run's residual
        stream (or `resid`, and head outputs `z` at layer `start`, per patched row where they differ). `read`
        [n, T]: the only positions the caller reads of the last layer's output (its MLP runs there alone)."""
        hooks = self._mix_hooks(b, masks, copies, offset=b.p0, start=start) + list(extra_hooks)
        hooks += [(name, _detached) for name in self._drop]
        if self._catch is not None:
            hooks.append((self._catch[0], self._catch_hook(b, copies)))
        if resid is None:
            resid = b.resid[start].repeat(copies, 1, 1)
        self._log["forwards"] += 1
        with ExitStack() as stack:
            stack.enter_context(hooked(self.model, hooks))
            stack.enter_context(fused_activations(self.model))
            stack.enter_context(self._prefix_mode(b, start, masks, z))
            for s, m in masks.items():
                stack.enter_context(s.forward_context(self.model, m, masks))
            if read is not None and (stop or self.cfg.n_layers) == self.cfg.n_layers:
                stack.enter_context(last_mlp_at(self.model, read, copies))
            return self.model(resid, start_at_layer=start, stop_at_layer=stop or self.cfg.n_layers,
                              past_kv_cache=kv_cache)

    def _prefix_mode(self, b: Bucket, start: int, masks: Mapping[Site, Tensor], z: Tensor | None = None):
        if not self.shared_prefix:
            from contextlib import nullcontext

            return nullcontext()
        # patches that act at or after the head outputs of the first layer leave everything before them in
        # that layer as in the base run: start from its cached head outputs
        if z is None and all(s.keeps_head_outputs(start) for s in masks):
            z = b.z[start]
        return prefix_attention.shared_prefix(self.model, b.kv, b.n, b.p0, start, z_start=z)

    def mean_activation(self, site: Site | str) -> Tensor:
        """[n_slots, unit, rest] the source run's activation at `site` averaged over items at each aligned position
        (slot): each item's rows averaged first, then the items that have the slot, over every bucket (or over
        `mean_rows`, a reference set, when the Contrast was given one). What mean ablation patches in: the mean over
        the whole item set per position, as EAP-IG's `compute_mean_activations(per_position=True)` takes it over a
        dataloader, so it is the same whatever the batch size or bucket layout. Summed in float64; computed once."""
        site = Site.coerce(site)
        if site in self._means:
            return self._means[site]
        S = self.n_slots
        if self.mean_rows is not None:
            total, have = self._reference_sums(site, S)
        else:
            items = [b.items.cpu() for b in self.buckets]
            valid = [b.slot_valid.cpu().double() for b in self.buckets]
            per_item = torch.zeros(self.n_items, S, dtype=torch.float64)  # rows of each item that have each slot
            for it, v in zip(items, valid):
                per_item[:, : v.shape[1]].index_add_(0, it, v)
            total = None
            for b, it, v in zip(self.buckets, items, valid):
                self._ensure_source(b, [site])
                x = b.source_acts[site].cpu().double()  # [n, S_b, unit, rest]
                w = v / per_item[it, : v.shape[1]].clamp_min(1)  # each item's rows share its weight
                part = (x * w[:, :, None, None]).sum(0)
                if total is None:
                    total = torch.zeros(S, *x.shape[2:], dtype=torch.float64)
                total[: part.shape[0]] += part
                self._trim(b)
            have = (per_item > 0).sum(0).double()
        self._means[site] = (total / have.clamp_min(1)[:, None, None]).to(self.device, self.cfg.dtype)
        return self._means[site]

    @torch.no_grad()
    def _reference_sums(self, site: Site, S: int) -> tuple[Tensor, Tensor]:
        """Sums over the items of `mean_rows` of `site`'s activation at each aligned position (each item's rows
        averaged first), and how many items have each position; positions past the Contrast's slots are dropped."""
        rows = self.mean_rows
        pos = [align_rows(r, r, self.align)[0][:S] for r in rows]
        n_items = max(r.item for r in rows) + 1
        per_item = torch.zeros(n_items, S, dtype=torch.float64)
        for r, p in zip(rows, pos):
            per_item[r.item, : len(p)] += 1
        pad = getattr(self.model.tokenizer, "pad_token_id", None) or 0
        total = None
        for lo in range(0, len(rows), self.batch_size):
            chunk, cpos = rows[lo: lo + self.batch_size], pos[lo: lo + self.batch_size]
            W = max(len(r.tokens) for r in chunk)
            _, cache = self._pass_once(_padded([r.tokens for r in chunk], W, pad, self.device), [site.hook], False)
            x = units_view(cache[site.hook], site.component, site.n_units(self.cfg)).cpu().double()
            for i, (r, p) in enumerate(zip(chunk, cpos)):
                part = x[i, p] / per_item[r.item, : len(p)].clamp_min(1)[:, None, None]
                if total is None:
                    total = torch.zeros(S, *x.shape[2:], dtype=torch.float64)
                total[: len(p)] += part
        return total, (per_item > 0).sum(0).double()

    def activations(self, site: Site | str, run: str = "source") -> Tensor:
        """The unpatched activation of one run ("source" or "base") at the aligned positions,
        [n_items, S, unit, rest] (one row per item: prompt rows; padded slots are zero)."""
        site = Site.coerce(site)
        S = max(b.base_pos.shape[1] for b in self.buckets)
        out = None
        for b in self.buckets:
            if run == "source":
                self._ensure_source(b, [site])
                x = b.source_acts[site]
            else:
                self._ensure_base(b, site.layer, [site])
                x = b.base_acts[site]
            if out is None:
                out = torch.zeros(self.n_items, S, *x.shape[2:], dtype=x.dtype)
            out[b.items.cpu(), : x.shape[1]] = (x * b.slot_valid[:, :, None, None].to(x.dtype)).cpu()
            self._trim(b)
        return out

    @torch.no_grad()
    def probe(self, masks: Mapping[Site | str, Tensor], hook: str) -> tuple[Tensor, Tensor]:
        """The activation at `hook` under each of P patches, at the aligned positions, instead of scores.

        Returns ([P, n_items, S, d] activations, [n_items, S] 1 for real slots). The pass stops after
        `hook`'s layer. Build the Contrast from prompt-only rows (one row per item), as for `generate`."""
        masks = {coerce(k): v for k, v in masks.items()}
        P = next(iter(masks.values())).shape[0]
        start = min(s.layer for s in masks)
        at = hook_layer(hook)
        if at < start or (at == start and hook.endswith(("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v"))):
            raise AnalysisError(f"{hook} is computed before the patched sites (layer {start}): no patch can change it",
                                field="--sae-layer", fix=f"read features at layer {start} or later")
        S = max(b.base_pos.shape[1] for b in self.buckets)
        out = valid = None
        for b in self.buckets:
            if len({int(i) for i in b.items}) != b.n:
                raise AnalysisError("internal: probe needs one row per item (prompt rows)")
            rel = (b.base_pos - b.p0).to(self.device)
            idx = torch.arange(b.n, device=self.device)[:, None]
            x = self.capture(b, masks, hook, lambda x, lo: x[:, idx.to(x.device), rel.to(x.device)].cpu())
            if out is None:
                out = torch.zeros(P, self.n_items, S, x.shape[-1], dtype=x.dtype)
                valid = torch.zeros(self.n_items, S)
            out[:, b.items.cpu(), : x.shape[2]] = x
            valid[b.items.cpu(), : b.slot_valid.shape[1]] = b.slot_valid.cpu()
            self._trim(b)
        return out, valid

    @torch.no_grad()
    def capture(self, b: Bucket, masks: Mapping[Site | str, Tensor], hook: str, reduce=None) -> Tensor:
        """The activation at `hook` [P, n, positions from p0 on, ...] for the rows of bucket `b` under each of P
        patches (the pass stops after `hook`'s layer); `reduce(x, lo)` turns each chunk of patches lo.. into what
        is kept (default: all of it)."""
        masks = {coerce(k): v for k, v in masks.items()}
        P = next(iter(masks.values())).shape[0]
        start, at = min(s.layer for s in masks), hook_layer(hook)
        nodes = _node_sites(masks)
        self._ensure_base(b, start, nodes)
        self._ensure_source(b, nodes)
        chunk = max(1, self.batch_size // b.n)
        parts = []
        for lo in range(0, P, chunk):
            c = min(chunk, P - lo)
            kept = {}

            def keep(act, hook):
                kept["x"] = act.view(c, b.n, *act.shape[1:])

            kv = (prefix_attention.prefix_cache(self.model, b.p0, start) if self.shared_prefix
                  else self._kv_cache(b, start, c))
            self._forward(b, start, {s: m[lo: lo + c] for s, m in masks.items()}, c, kv, stop=at + 1,
                          extra_hooks=[(hook, keep)])
            parts.append(kept["x"] if reduce is None else reduce(kept["x"], lo))
        return torch.cat(parts)

    @torch.no_grad()
    def generate(self, masks: Mapping[Site | str, Tensor], n_new: int) -> Tensor:
        """Greedy continuations [P, n_items, n_new] of the base prompts with each patch applied to the
        prompt's patched positions (generated positions are not patched). Build the Contrast from
        prompt-only rows (`surgeon.spec.encoding.prompt_rows`): one row per item."""
        masks = {coerce(k): v for k, v in masks.items()}
        P = next(iter(masks.values())).shape[0]
        out = torch.zeros(P, self.n_items, n_new, dtype=torch.long)
        for b in self.buckets:
            self._ensure_source(b, _node_sites(masks))
            lengths = b.tgt_pos[:, 0] + 1  # prompt rows: the target marks the last prompt token
            chunk = max(1, self.batch_size // b.n)
            for lo in range(0, P, chunk):
                c = min(chunk, P - lo)
                hooks = self._mix_hooks(b, {s: m[lo: lo + c] for s, m in masks.items()}, c, offset=0)
                gen = greedy(self.model, b.base_tokens.repeat(c, 1), lengths.repeat(c), n_new, hooks)
                out[lo: lo + c, b.items.cpu()] = gen.view(c, b.n, n_new).cpu()
            self._trim(b)
        return out


@torch.no_grad()
def greedy(model, tokens: Tensor, lengths: Tensor, n_new: int, hooks: Sequence = ()) -> Tensor:
    """Greedy decoding of right-padded rows (`lengths` real tokens each), `hooks` active on every step.
    Full forward passes (no key/value cache), so position-indexed hooks stay valid. Returns [rows, n_new]."""
    rows = tokens.shape[0]
    cur = torch.cat([tokens, torch.zeros((rows, n_new), dtype=tokens.dtype, device=tokens.device)], dim=1)
    lengths = lengths.clone().to(tokens.device)
    ar = torch.arange(rows, device=tokens.device)
    out = []
    first = tokens.shape[1]  # never narrower than the padded prompts: hooks may index their padding
    with hooked(model, list(hooks)):
        for _ in range(n_new):
            width = max(first, int(lengths.max()))
            logits = model(cur[:, :width])
            nxt = logits[ar, lengths - 1].argmax(-1)
            cur[ar, lengths] = nxt
            lengths += 1
            out.append(nxt)
    return torch.stack(out, dim=1)


# TransformerLens activations written as several elementwise passes, and torch's one-kernel equal (the same formula:
# GPT-2's tanh-approximated GELU; values equal to float rounding, 5e-7 at most in float32)
FUSED = {"gelu_new": functools.partial(torch.nn.functional.gelu, approximate="tanh"),
         "gelu_pytorch_tanh": functools.partial(torch.nn.functional.gelu, approximate="tanh")}


def _fused_norm(norm):
    """A forward for TransformerLens's norm `norm` by torch's fused layer_norm / rms_norm (float32 and float64 models,
    where TransformerLens computes in the model's dtype too), falling back to its own forward whenever a hook is on
    its scale or normalised output (those hook points exist only in TransformerLens's)."""
    kind = type(norm).__name__
    own = type(norm).forward.__get__(norm)
    points = [norm.hook_scale, norm.hook_normalized]
    F = torch.nn.functional

    def forward(x):
        if any(p._forward_hooks or p._backward_hooks or p._forward_pre_hooks for p in points):
            return own(x)
        d = (x.shape[-1],)
        w = getattr(norm, "w", None)
        if kind in ("LayerNorm", "LayerNormPre"):
            return F.layer_norm(x, d, w, getattr(norm, "b", None), norm.eps)
        return F.rms_norm(x, d, w, norm.eps)
    return forward


@contextmanager
def fused_activations(model):
    """TransformerLens's MLP activation (`FUSED`) and norms as torch's fused kernels while the engine runs the model
    (the same formulas, equal to float rounding; the activation is 4x faster on CPU, the norms are several passes
    each in TransformerLens); restored on exit."""
    fn = FUSED.get(getattr(model.cfg, "act_fn", None))
    mlps = [b.mlp for b in getattr(model, "blocks", []) if hasattr(getattr(b, "mlp", None), "act_fn")] if fn else []
    old = [m.act_fn for m in mlps]
    norms = []
    if getattr(model.cfg, "dtype", torch.float32) in (torch.float32, torch.float64):
        norms = [m for m in model.modules()
                 if type(m).__name__ in ("LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre")
                 and hasattr(m, "hook_scale") and hasattr(m, "hook_normalized") and "forward" not in vars(m)]
    try:
        for m in mlps:
            m.act_fn = fn
        for m in norms:
            m.forward = _fused_norm(m)
        yield
    finally:
        for m, f in zip(mlps, old):
            m.act_fn = f
        for m in norms:
            vars(m).pop("forward", None)


@contextmanager
def last_mlp_at(model, read: Tensor, copies: int):
    """The last block's MLP computed only at the positions `read` [n, T] (per row; rows are `copies` copies of
    the n) and zero elsewhere: nothing after the last layer reads the other positions but the caller, who reads
    only these (an MLP is position-wise). Its own forward whenever a hook is on a module inside it."""
    mlp = getattr(model.blocks[-1], "mlp", None)
    if mlp is None or "forward" in vars(mlp):
        yield
        return
    own = type(mlp).forward.__get__(mlp)
    inner = list(mlp.modules())

    def forward(x, *args, **kwargs):
        if args or kwargs or x.dim() != 3 or any(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                                                 for m in inner):
            return own(x, *args, **kwargs)
        pos = read.to(x.device).repeat(copies, 1)  # [rows, T] (a position may repeat: several targets read it)
        at = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
        at[torch.arange(x.shape[0], device=x.device)[:, None], pos] = True
        y = own(x[at][None])[0]  # each read position once (so its gradient is counted once)
        out = y.new_zeros(x.shape[0], x.shape[1], y.shape[-1])
        out[at] = y
        return out

    mlp.forward = forward
    try:
        yield
    finally:
        vars(mlp).pop("forward", None)


@contextmanager
def hooked(model, hooks: Sequence):
    """Sites' hooks on while the model runs: (TransformerLens hook point, fn(act, hook)) pairs, and forward
    pre-hooks on modules named `path:pre` (fn(module, args) -> args). Every one is removed on exit."""
    handles = []
    try:
        for name, fn in hooks:
            if name.endswith(":pre"):
                handles.append(model.get_submodule(name[: -len(":pre")]).register_forward_pre_hook(fn))
        with model.hooks(fwd_hooks=[(n, f) for n, f in hooks if not n.endswith(":pre")]):
            yield
    finally:
        for h in handles:
            h.remove()


def is_out_of_memory(e: BaseException) -> bool:
    """torch's out-of-memory error on any device: CUDA's type, or the CPU allocator's RuntimeError."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and ("can't allocate memory" in str(e) or "out of memory" in str(e).lower()))


def _detached(act: Tensor, hook) -> Tensor:
    """A forward hook: the same value, with no gradient flowing back through it."""
    return act.detach()


def _node_sites(masks) -> list[Site]:
    """The node sites whose activations the masks need cached (a node site itself; edge sites their
    senders' outputs; feature sites the activation their SAE reads)."""
    return list(dict.fromkeys(n for s in masks for n in s.node_sites()))


def _row_slice(b: Bucket, r0: int, r1: int) -> Bucket:
    """Rows r0:r1 of a bucket, with views of its caches (for buckets larger than a batch)."""
    rows = slice(r0, r1)
    return Bucket(
        items=b.items[rows], base_tokens=b.base_tokens[rows],
        source_tokens=b.source_tokens[rows], base_pos=b.base_pos[rows], source_pos=b.source_pos[rows],
        tgt_pos=b.tgt_pos[rows], source_tgt_pos=b.source_tgt_pos[rows], tgt_tok=b.tgt_tok[rows],
        tgt_sign=b.tgt_sign[rows], slot_valid=b.slot_valid[rows], equal_lengths=b.equal_lengths, p0=b.p0,
        resid={L: x[rows] for L, x in b.resid.items()}, kv={L: (k[rows], v[rows]) for L, (k, v) in b.kv.items()},
        z={L: x[rows] for L, x in b.z.items()},
        source_acts={s: x[rows] for s, x in b.source_acts.items()}, base_acts={s: x[rows] for s, x in b.base_acts.items()})


@dataclass(frozen=True)
class At:
    """Scores read at a hook point instead of the logits (`Contrast.run(masks, read=At(...))`): `fn(x, items, valid,
    lo)` turns the activation there at the base run's aligned positions, x [c, n, S, ...] under patches lo..lo+c of
    the call, into [c, n] scores (items [n]: each row's item; valid [n, S]: 1 for real slots). The pass stops after
    the hook's layer; grouping and splitting by first layer are not taken (why: "read at a hook point")."""

    hook: str
    fn: Callable


def final_logits(model, h: Tensor) -> Tensor:
    """float32 logits from final-layer residuals [..., d]: the final norm, the unembedding and the model's logit
    soft-cap where it has one."""
    if model.cfg.normalization_type is not None:
        h = model.ln_final(h)
    u = model.unembed
    if u.hook_in._forward_hooks or u.hook_out._forward_hooks:
        logits = u(h).float()
    else:  # TransformerLens's Unembed copies W_U transposed on every call (the size of the unembedding): not here
        logits = (torch.matmul(h, u.W_U) + u.b_U).float()
    cap = getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0
    return cap * torch.tanh(logits / cap) if cap > 0 else logits


def readout(model, resid: Tensor, tgt_rel: Tensor, tok: Tensor, sign: Tensor, max_rows: int | None = None,
            metric: Metric | None = None, ref: Tensor | None = None) -> Tensor:
    """Scores [chunk, n] from final-layer residuals [chunk * n, pos, d]: the metric (default: sum of sign *
    log P(token)) over the logits at the target positions (given relative to the residual's first position);
    `ref` [n, vocab]: the metric's reference log-probabilities per row. Unembeds only those positions, at most
    `max_rows` rows at a time (the logits over a large vocabulary dominate memory)."""
    metric = metric or LOGPROB
    n = tok.shape[0]
    r = resid.view(-1, n, *resid.shape[1:])
    idx = torch.arange(n, device=r.device)[:, None]
    tgt_rel = tgt_rel.to(r.device)
    if tgt_rel.shape[1] > 1 and bool((tgt_rel == tgt_rel[:, :1]).all()):
        tgt_rel = tgt_rel[:, :1]  # every target of a row at one position: its logits once (metrics view them per target)
    sel = r[:, idx, tgt_rel]  # [chunk, n, T or 1, d]
    c, _, T, d = sel.shape
    x = sel.reshape(c * n, T, d)
    toks = tok.to(x.device).repeat(c, 1)
    signs = sign.to(x.device).float().repeat(c, 1)
    refs = ref.to(x.device).repeat(c, 1) if ref is not None else None
    step = max_rows or c * n
    picked = []
    for lo in range(0, c * n, step):
        logits = final_logits(model, x[lo: lo + step])
        picked.append(metric.score(logits, toks[lo: lo + step], signs[lo: lo + step],
                                   None if refs is None else refs[lo: lo + step]))
    return torch.cat(picked).view(c, n)


@torch.no_grad()
def score_rows(model, rows: Sequence[Row], batch_size: int = 256, progress: str | None = None,
               metric: Metric | None = None, reference: Tensor | None = None) -> Tensor:
    """Clean (unpatched) item scores [n_items]: the metric per item (default: log P(correct) - log P(incorrect));
    `reference` [n_items, vocab]: the metric's reference log-probabilities per item.

    Rows are sorted by length and right-padded per batch (exact for a causal model). `progress`: a tqdm bar
    with this description when there is more than one batch."""
    check_causal(model)
    device = next(model.parameters()).device
    n_items = max(r.item for r in rows) + 1
    out = torch.zeros(n_items, device=device)
    for batch, resid, pos, tok, sign in _final_batches(model, rows, batch_size, progress):
        items = torch.tensor([r.item for r in batch], device=device)
        ref = reference[items.to(reference.device)] if reference is not None else None
        out = out.index_add(0, items, readout(model, resid, pos, tok, sign, metric=metric, ref=ref)[0])
    check_scores(out, "unpatched")
    return out


@torch.no_grad()
def reference_logprobs(model, rows: Sequence[Row], batch_size: int = 256) -> Tensor:
    """[n_items, vocab]: each item's next-token log-probabilities at its first target position (where its
    answers first differ, for rows encoded by first token), the reference a KL metric compares against."""
    device = next(model.parameters()).device
    n_items = max(r.item for r in rows) + 1
    out = torch.zeros(n_items, model.cfg.d_vocab_out, device=device)
    for batch, resid, pos, _, _ in _final_batches(model, rows, batch_size, None):
        logits = final_logits(model, resid[torch.arange(len(batch), device=device), pos[:, 0]][:, None])[:, 0]
        out[torch.tensor([r.item for r in batch], device=device)] = logits.log_softmax(-1)
    return out


def _final_batches(model, rows: Sequence[Row], batch_size: int, progress: str | None):
    """Rows sorted by length, right-padded per batch: (rows, final residual, target positions, tokens, signs)."""
    device = next(model.parameters()).device
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    order = sorted(range(len(rows)), key=lambda i: len(rows[i].tokens))
    starts = range(0, len(order), batch_size)
    if progress and len(starts) > 1:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=progress, unit="batch")
    for lo in starts:
        batch = [rows[i] for i in order[lo: lo + batch_size]]
        W, T = max(len(r.tokens) for r in batch), max(len(r.targets) for r in batch)
        tokens = _padded([r.tokens for r in batch], W, pad, device)
        pos = _padded([[t[0] for t in r.targets] for r in batch], T, 0, device)
        tok = _padded([[t[1] for t in r.targets] for r in batch], T, 0, device)
        sign = _padded([[t[2] for t in r.targets] for r in batch], T, 0.0, device, torch.float32)
        yield batch, model(tokens, stop_at_layer=model.cfg.n_layers), pos, tok, sign


def check_scores(scores: Tensor, run: str) -> None:
    """Refuse scores that are NaN or infinite: every number after them would be meaningless."""
    if not bool(torch.isfinite(scores).all()):
        raise AnalysisError(f"the model's scores in the {run} run are not finite (NaN or infinity in its logits)",
                            field="model", fix="check the checkpoint's weights; under float16 activations can "
                                               "overflow: use --dtype bfloat16 or float32")


@torch.no_grad()
def cached_batches(model, rows: Sequence[Row], hooks: Sequence[str], batch_size: int = 64, width: int | None = None):
    """Run `rows` right-padded (to `width`, else to each batch's longest) in batches of `batch_size`; yield each
    batch's rows and its activations {hook: [batch, width, ...]} (real positions never read the pad after them)."""
    device = next(model.parameters()).device
    pad = getattr(model.tokenizer, "pad_token_id", None) or 0
    for lo in range(0, len(rows), batch_size):
        chunk = rows[lo: lo + batch_size]
        W = width or max(len(r.tokens) for r in chunk)
        _, cache = model.run_with_cache(_padded([r.tokens for r in chunk], W, pad, device), names_filter=list(hooks))
        yield chunk, {h: cache[h] for h in hooks}


def _to_items(buckets: Sequence[Bucket], per_bucket: list[Tensor], n_items: int) -> Tensor:
    """[P, rows of bucket] per bucket -> [P, n_items] (the rows of one item are summed)."""
    P = per_bucket[0].shape[0]
    out = torch.zeros(P, n_items, device=per_bucket[0].device, dtype=per_bucket[0].dtype)
    for b, s in zip(buckets, per_bucket):
        out = out.index_add(1, b.items.to(out.device), s)
    return out


def _nbytes(b: Bucket) -> int:
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
