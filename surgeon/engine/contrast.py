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

The parts, a module each: `rows` (alignment, merging, buckets), `caches` (the clean runs and what they keep),
`sources` (mean ablation's means, the unpatched activations), `grouping` (patches that share work), `gradients`
(attribution's backward passes), `probes` (activations and generation under patches), `readout` (where a score is
read), `kernels` (how TransformerLens's blocks run), `prefix_attention` (attention over a shared prefix). This
module composes them: `Contrast` builds the buckets, holds the parts (`runs`, `sources`, `grouping`, `gradients`,
`probes`: each owns its state and reaches the Contrast through a weak reference) and runs the patched forward
passes; what a call does (gradients, pooling, a read-out hook, a caught activation) is its `RunSpec`, handed down."""
from __future__ import annotations

import functools
from collections import Counter
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch
from torch import Tensor

from surgeon.causal import check_attention
from surgeon.engine import prefix_attention
from surgeon.engine.caches import CleanRuns, default_cache_bytes, node_sites
from surgeon.engine.gradients import Gradients
from surgeon.engine.grouping import Grouping, Groups
from surgeon.engine.kernels import detached, fused_activations, hooked, last_mlp_at
from surgeon.engine.padding import bidirectional, pad_hooks
from surgeon.engine.probes import Probes
from surgeon.engine.progress import Progress
from surgeon.engine.readout import LOGPROB, PLAIN, At, RunSpec, check_scores, readout
from surgeon.engine.rows import Bucket, buckets, merged_rows, row_slice, to_items
from surgeon.engine.sources import Sources
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site, hook_layer
from surgeon.sites.protocol import SiteKind, coerce
from surgeon.case.encoding import Row
from surgeon.case.metrics import Metric


def _part(part: str, method):
    """A Contrast method that calls `method` on the part held as `part` (the part's signature and docstring)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return method(getattr(self, part), *args, **kwargs)
    return call


@dataclass
class HookContext:
    """What a site's hooks see of one chunk of rows: the model, the rows (with their caches), the device, and the
    engine (a site that needs another patched pass over these rows first asks `engine.capture`)."""

    model: object
    bucket: Bucket
    device: torch.device
    engine: object = None
    masks: Mapping = field(default_factory=dict)  # every site's mask of this pass (this chunk's)
    # under `gradient(pool=True)` (the call's `RunSpec.pool`): only the sum over the chunk's patches of each mask's
    # gradient is wanted (a site may put it in the chunk's first row)
    pooled: bool = False

    def note(self, path: str) -> None:
        """Record which of its ways a site's hooks took (counted per forward pass in `execution["sites"]`)."""
        if self.engine is not None:
            self.engine.log["sites"][path] += 1


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
        check_attention(model)
        self.model = model
        self.cfg = model.cfg
        self.metric = metric or LOGPROB
        if self.metric.reference and reference is None:
            raise AnalysisError(f"internal: metric {self.metric.name!r} needs reference log-probabilities")
        # [n_items, vocab] per item; kept on the device of the first use
        self.reference = reference
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
        self.log = {"prefix": prefix, "paths": Counter(), "why": Counter(), "forwards": 0, "sites": Counter(),
                    "threads": []}
        self.device = next(model.parameters()).device
        self.n_items = max(r.item for r in base_rows) + 1
        self.align = align
        self.runs = CleanRuns(self, batch_size, default_cache_bytes(self.device) if cache_bytes is None else cache_bytes)
        # mean ablation's means: over `mean_rows` (rows in the source format) where given, else the source rows
        self.sources = Sources(self, mean_rows)
        self.grouping, self.gradients, self.probes = Grouping(self), Gradients(self), Probes(self)
        sites = [Site.coerce(x) for x in sites]
        if start_layer is None:
            start_layer = min((x.layer for x in sites), default=0)
        pad = getattr(model.tokenizer, "pad_token_id", None) or 0
        both_ways = bidirectional(model)
        if both_ways:
            self.log["attention"] = ("bidirectional: every row whole and alone (no shared prefix, no row cut after "
                                      "its last read position, none merged), its padded keys masked for every query")
        base_rows, source_rows, aligned = merged_rows(base_rows, source_rows, align, base_name, source_name,
                                                      bidirectional=both_ways)
        self.buckets: list[Bucket] = buckets(base_rows, source_rows, aligned, self.runs.batch_size, both_ways, pad,
                                             self.device)
        self.clean_base = self.clean_source = None  # without `clean` (generation needs neither)
        if not clean:
            return
        base_scores, source_scores = [], []
        with torch.no_grad():
            for b in self.buckets:
                base_scores.append(self.runs.ensure_base(b, start_layer, sites, score=True)[None])
                source_scores.append(self.runs.ensure_source(b, sites, score=True)[None])
                self.runs.trim(b)
        self.clean_base = self._to_items(base_scores)[0]
        self.clean_source = self._to_items(source_scores)[0]
        check_scores(self.clean_base, base_name)
        check_scores(self.clean_source, source_name)

    # the parts' calls, as the analyses make them (signatures and docstrings the parts')
    gradient, activation_gradient = _part("gradients", Gradients.gradient), _part("gradients", Gradients.activation_gradient)
    probe, capture, generate = (_part("probes", f) for f in (Probes.probe, Probes.capture, Probes.generate))
    mean_activation, activations, deltas = (_part("sources", f) for f in (Sources.mean_activation, Sources.activations,
                                                                          Sources.deltas))

    @property
    def batch_size(self) -> int:
        """Rows per forward pass (halved on out-of-memory: `backoffs`)."""
        return self.runs.batch_size

    @property
    def backoffs(self) -> int:
        return self.runs.backoffs

    def _to_items(self, per_bucket: list[Tensor]) -> Tensor:
        return to_items(self.buckets, per_bucket, self.n_items)

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

    @property
    def execution(self) -> dict:
        """Which execution paths the calls so far took and why faster ones were not taken (recorded in every
        result and manifest): `prefix` says whether patches share the unpatched prefix; `paths` counts the
        runs by path (grouped: patches agreeing below their last layer share that work; split: patches
        grouped by the first layer they act at; plain: every patch from the first patched layer); `why`
        counts the reasons a run was not grouped; `backoffs` is how often out-of-memory halved the batch;
        `caches_recomputed` how often a bucket's caches were dropped to stay within `cache_bytes`; `forwards` how
        many forward passes (batched) ran; `sites` which way sites' hooks went, per pass (e.g. edge gradients
        through the projections or per-head inputs); `metric` what the scores measure; `attention`, for a
        bidirectional model, how its rows ran (whole, alone, padding masked); `threads`, where other work held this
        process's cores during a run, each change of torch's thread count ([cores busy elsewhere, threads])."""
        log, runs = self.log, self.runs
        return {"metric": self.metric.label, "prefix": log["prefix"], "paths": dict(log["paths"]), "why": dict(log["why"]),
                "batch_size": runs.batch_size, "backoffs": runs.backoffs, "buckets": len(self.buckets),
                "cache_bytes": runs.cache_bytes, "caches_recomputed": runs.recomputed,
                "forwards": log["forwards"] + runs.forwards, "sites": dict(log["sites"]),
                **({"attention": log["attention"]} if "attention" in log else {}),
                **({"threads": [list(t) for t in log["threads"]]} if log["threads"] else {})}

    def run(self, masks: Mapping[Site | str, Tensor], progress: bool | str = False, read: "At | None" = None) -> Tensor:
        """Item scores [P, n_items] with each of P patches applied.

        `masks[site]` is [P, units] (the same mask at every patched position) or [P, slots, units]. Masks
        may require grad: the scores are differentiable w.r.t. them (attribution). With `read` (an `At`), the
        scores are what it reads at its hook point (the pass stops after that layer), not the metric.
        """
        return self.run_spec(masks, RunSpec(read=read), progress)

    def run_spec(self, masks: Mapping[Site | str, Tensor], spec: RunSpec, progress: bool | str = False,
             _start: int | None = None) -> Tensor:
        """`run` under `spec` (what the call does: see `RunSpec`), from layer `_start` on where given."""
        read = spec.read
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
        if read is not None and start > hook_layer(read.hook):
            raise AnalysisError(f"{read.hook} is computed before the patched sites (layer {start}): no patch "
                                "can change it", fix=f"read at layer {start} or later")
        split = None if read is not None else self.grouping.by_first_layer(masks, P, start)
        if split is not None:  # patches that act only at later layers start there
            self.log["paths"]["split by first layer"] += 1
            out = None
            for L, idx in split:
                sub = self.run_spec({s: m[idx] for s, m in masks.items()}, spec, progress, _start=L)
                out = sub.new_empty(P, sub.shape[1]) if out is None else out
                out[idx.to(out.device)] = sub
            return out
        if _start is not None:
            start = max(start, _start)
        groups, why = (None, "read at a hook point") if read is not None else self.grouping.groups(masks, start, P)
        self.log["paths"]["grouped" if groups is not None else "plain"] += 1
        if why:
            self.log["why"][why] += 1
        per_bucket = []
        nodes = node_sites(masks)
        desc = (progress if isinstance(progress, str) else "patching") if progress else None
        with Progress(P * sum(b.n for b in self.buckets), desc, self.log["threads"]) as bar:
            for b in self.buckets:
                self.runs.ensure_base(b, start, nodes)
                self.runs.ensure_source(b, nodes)
                per_bucket.append(self.runs.with_backoff(
                    lambda: self._bucket_scores(b, start, masks, P, bar, spec, groups),
                    restart=self.gradients.restore_grads(spec)))
                self.runs.trim(b)
        return self._to_items(per_bucket)

    def _bucket_scores(self, b: Bucket, start: int, masks: Mapping[Site, Tensor], P: int, bar: Progress, spec: RunSpec,
                       groups: "Groups | None" = None) -> Tensor:
        """[P, n] scores for one bucket: rows in slices of at most batch_size, patches in chunks that fill it."""
        cols = []
        for r0 in range(0, b.n, self.runs.batch_size):
            sb = b if b.n <= self.runs.batch_size else row_slice(b, r0, min(b.n, r0 + self.runs.batch_size))
            # a patch recomputes only the W - p0 positions from p0 on, so with the prefix shared (not
            # copied per patch) as many patched rows fit in a forward pass as positions of batch_size
            # full rows would: its memory stays that of a full pass
            width = sb.base_tokens.shape[1]
            per_row = width - sb.p0 if self.shared_prefix else width
            chunk = max(1, self.runs.batch_size * width // (sb.n * per_row))
            if groups is not None:
                cols.append(self.grouping.scores(sb, start, groups, chunk, bar, spec))
                continue
            outs, kv = [], {}
            for lo in range(0, P, chunk):
                sub = {s: m[lo: lo + chunk] for s, m in masks.items()}
                c = min(chunk, P - lo)
                if c not in kv:
                    kv = {c: prefix_attention.prefix_cache(self.model, sb.p0, start) if self.shared_prefix
                          else self.runs.kv_cache(sb, start, c)}
                outs.append(self.gradients.backward_now(self.run_chunk(sb, start, sub, c, kv[c], spec, lo=lo), spec))
                bar.update(c * sb.n)
            cols.append(torch.cat(outs))
        return torch.cat(cols, dim=1)

    def mix_hooks(self, b: Bucket, masks: Mapping[SiteKind, Tensor], copies: int, offset: int, start: int = 0,
                   pooled: bool = False) -> list:
        """Every site's hooks for one chunk of `copies` patches (positions relative to `offset`, the first
        position the forward pass sees; `pooled`: see `HookContext`)."""
        ctx = HookContext(self.model, b, self.device, self, masks, pooled=pooled)
        return [h for site, m in masks.items() for h in site.hooks(ctx, m, copies, offset, start)]

    def run_chunk(self, b: Bucket, start: int, masks: Mapping[Site, Tensor], copies: int, kv_cache, spec: RunSpec,
                   resid: Tensor | None = None, z: Tensor | None = None, lo: int = 0) -> Tensor:
        """[copies, n] scores under `copies` patches (patches lo.. of the call)."""
        read = spec.read
        if read is not None:
            kept = {}

            def keep(act, hook):
                kept["x"] = act

            self.patched_forward(b, start, masks, copies, kv_cache, resid=resid, z=z, stop=hook_layer(read.hook) + 1,
                          extra_hooks=[(read.hook, keep)], spec=spec)
            x = kept["x"].view(copies, b.n, *kept["x"].shape[1:])
            rel, idx = (b.base_pos - b.p0).to(x.device), torch.arange(b.n, device=x.device)[:, None]
            with torch.set_grad_enabled(bool(spec.leaves)):  # SAE parameters may require grad
                return read.fn(x[:, idx, rel], b.items, b.slot_valid, lo)
        final = self.patched_forward(b, start, masks, copies, kv_cache, resid=resid, z=z, read=b.tgt_pos - b.p0, spec=spec)
        return self.readout_scores(b, final, b.tgt_pos - b.p0)

    def readout_scores(self, b: Bucket, final: Tensor, tgt_pos: Tensor) -> Tensor:
        """[copies, n] scores of the bucket's rows from final residuals (targets at `tgt_pos`)."""
        ref = None
        if self.metric.reference:
            ref = self.reference[b.items.to(self.reference.device)]
        return readout(self.model, final, tgt_pos, b.tgt_tok, b.tgt_sign, max_rows=self.runs.batch_size,
                       metric=self.metric, ref=ref)

    def patched_forward(self, b: Bucket, start: int, masks: Mapping[Site, Tensor], copies: int, kv_cache, *,
                 resid: Tensor | None = None, z: Tensor | None = None, stop: int | None = None,
                 extra_hooks: Sequence = (), read: Tensor | None = None, spec: RunSpec = PLAIN) -> Tensor:
        """Layers start..stop of the patched positions under `copies` patches, from the base run's residual
        stream (or `resid`, and head outputs `z` at layer `start`, per patched row where they differ). `read`
        [n, T]: the only positions the caller reads of the last layer's output (its MLP runs there alone). `spec`:
        the call's mode (its dropped gradients, caught activation, pooling)."""
        hooks = self.mix_hooks(b, masks, copies, offset=b.p0, start=start, pooled=spec.pool) + list(extra_hooks)
        hooks += [(name, detached) for name in spec.drop]
        if b.base_len is not None:  # a bidirectional model: each copy of a row masks its own padding
            hooks += pad_hooks(self.model, b.base_len)
        if spec.catch is not None:
            hooks.append((spec.catch[0], self.gradients.catch_hook(b, spec.catch[1])))
        if resid is None:
            resid = b.resid[start].repeat(copies, 1, 1)
        self.log["forwards"] += 1
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
            return nullcontext()
        # patches that act at or after the head outputs of the first layer leave everything before them in
        # that layer as in the base run: start from its cached head outputs
        if z is None and all(s.keeps_head_outputs(start) for s in masks):
            z = b.z[start]
        return prefix_attention.shared_prefix(self.model, b.kv, b.n, b.p0, start, z_start=z)
