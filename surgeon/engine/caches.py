"""The clean runs a Contrast caches per bucket (the base run's residual stream, keys/values and head outputs from
the first patched layer on; both runs' activations at the sites patched), how much it keeps, and the
out-of-memory backoff that halves the batch size."""
from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Sequence

import torch
from torch import Tensor

from surgeon.engine.kernels import fused_activations
from surgeon.engine.padding import masked_padding
from surgeon.engine.rows import Bucket, nbytes
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site, hook_layer, units_view


CACHE_BYTES = 2 * 2**30  # activations a Contrast keeps between calls on CPU; buckets past it recompute theirs


CACHE_FRACTION = 0.3  # on a GPU: this fraction of its free memory when the Contrast is built


def default_cache_bytes(device: torch.device) -> int:
    """How many bytes of cached activations a Contrast keeps by default on `device`."""
    if device.type == "cuda":
        return int(CACHE_FRACTION * torch.cuda.mem_get_info(device)[0])
    return CACHE_BYTES


def is_out_of_memory(e: BaseException) -> bool:
    """torch's out-of-memory error on any device: CUDA's type, or the CPU allocator's RuntimeError."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and ("can't allocate memory" in str(e) or "out of memory" in str(e).lower()))


class CleanRuns:
    """A `Contrast`'s clean runs and their caches: a part the Contrast holds (`contrast.runs`). It owns what bounds
    them: `batch_size` (halved on out-of-memory, `backoffs` times), `cache_bytes`, and how often a bucket's caches
    were dropped (`recomputed`); it reads the Contrast's model, buckets and score through a weak reference (no
    cycle: dropping the Contrast frees its caches at once)."""

    def __init__(self, engine, batch_size: int, cache_bytes: int):
        self.engine = weakref.proxy(engine)
        self.model, self.cfg, self.device = engine.model, engine.model.cfg, engine.device
        self.batch_size = max(1, int(batch_size))
        self.cache_bytes = int(cache_bytes)
        self.backoffs = 0  # how often out-of-memory halved the batch size
        self.recomputed = 0  # how often a bucket's caches were dropped to stay within cache_bytes
        self.forwards = 0  # unpatched forward passes (batched) run

    def trim(self, b: Bucket) -> None:
        """After bucket `b` was used: drop its caches if all buckets' caches together pass `cache_bytes`.

        Calls walk the buckets in order, so the first ones that fit stay cached and the later ones recompute
        theirs (one unpatched forward per run) each time: memory stays bounded whatever the number of items."""
        if sum(nbytes(x) for x in self.engine.buckets) > self.cache_bytes:
            b.drop_caches()
            self.recomputed += 1

    def ensure_base(self, b: Bucket, start: int, sites: Sequence[Site], score: bool = False):
        """Cache what patches of layers >= start need from the base run; with `score`, return clean scores."""
        layers = [L for L in range(start, self.cfg.n_layers) if L not in b.resid]
        sites = [s for s in sites if s not in b.base_acts]
        if not layers and not sites and not score:
            return None
        names = [f"blocks.{L}.hook_resid_pre" for L in layers]
        names += [f"blocks.{L}.attn.hook_{x}" for L in layers for x in "kvz"]
        names += [s.hook for s in sites]
        final, cache = self.run_clean(b.base_tokens, names, score, b.base_len)
        for L in layers:  # copies of the slices, so the full activations can be freed
            b.resid[L] = cache[f"blocks.{L}.hook_resid_pre"][:, b.p0:].clone()
            b.kv[L] = (cache[f"blocks.{L}.attn.hook_k"][:, : b.p0].clone(),
                       cache[f"blocks.{L}.attn.hook_v"][:, : b.p0].clone())
            b.z[L] = cache[f"blocks.{L}.attn.hook_z"][:, b.p0:].clone()
        for s in sites:
            b.base_acts[s] = self.gather(cache[s.hook], s, b.base_pos)
        if score:
            return self.engine.readout_scores(b, final, b.tgt_pos)[0]
        return None

    def ensure_source(self, b: Bucket, sites: Sequence[Site], score: bool = False):
        sites = [s for s in sites if s not in b.source_acts]
        if not sites and not score:
            return None
        for s in sites:
            if s.component.pattern_like and not b.equal_lengths:
                raise AnalysisError(
                    "patching attention patterns needs base and source prompts of equal length (the keys must "
                    "correspond), but they differ", field="component",
                    fix="patch head outputs (component z) instead, or use formats of equal length")
        final, cache = self.run_clean(b.source_tokens, [s.hook for s in sites], score, b.source_len)
        for s in sites:
            b.source_acts[s] = self.gather(cache[s.hook], s, b.source_pos)
        if score:
            return self.engine.readout_scores(b, final, b.source_tgt_pos)[0]
        return None

    def run_clean(self, tokens: Tensor, names: Sequence[str], final: bool, lengths: Tensor | None = None):
        """One forward over `tokens` (in batches), caching `names`; the final residual too if `final`. `lengths`
        [rows]: each row's real tokens, where the model reads padding (a bidirectional one's is masked)."""
        return self.with_backoff(lambda: self.run_clean_once(tokens, names, final, lengths))

    @torch.no_grad()
    def run_clean_once(self, tokens: Tensor, names: Sequence[str], final: bool, lengths: Tensor | None = None):
        names = list(dict.fromkeys(names))
        out: dict[str, list[Tensor]] = defaultdict(list)
        finals = []
        stop = self.cfg.n_layers if final else max(hook_layer(n) for n in names) + 1
        for lo in range(0, tokens.shape[0], self.batch_size):
            part = None if lengths is None else lengths[lo: lo + self.batch_size]
            with fused_activations(self.model), masked_padding(self.model, part):
                res, cache = self.model.run_with_cache(tokens[lo: lo + self.batch_size], names_filter=names,
                                                       stop_at_layer=stop)
            self.forwards += 1
            finals.append(res)
            for n in names:
                out[n].append(cache[n])
        return (torch.cat(finals) if final else None), {n: torch.cat(v) for n, v in out.items()}

    def gather(self, act: Tensor, site: Site, pos: Tensor) -> Tensor:
        x = units_view(act, site.component, site.n_units(self.cfg))
        idx = torch.arange(x.shape[0], device=x.device)[:, None]
        return x[idx, pos.to(x.device)]  # [n, S, unit, rest]

    def kv_cache(self, b: Bucket, start: int, copies: int):
        """A frozen TL key/value cache holding the shared prefix, repeated once per patch in the chunk.

        The repeated tensors are kept (for the largest chunk size seen) and reused by later calls."""
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
        from transformer_lens.cache.key_value_cache_entry import (
            TransformerLensKeyValueCacheEntry,
        )

        if b.p0 == 0:  # nothing before the first patched position: no cache to attend to
            return None
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

    def with_backoff(self, fn, restart=None):
        """Run fn; on out-of-memory (a GPU's, or the CPU allocator's) halve the batch size and try again (down to
        one row). `restart` is called before a retry (to undo what the failed attempt accumulated)."""
        while True:
            try:
                return fn()
            except (torch.OutOfMemoryError, RuntimeError) as e:
                if not is_out_of_memory(e):
                    raise
                for b in self.engine.buckets:
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


def node_sites(masks) -> list[Site]:
    """The node sites whose activations the masks need cached (a node site itself; edge sites their
    senders' outputs; feature sites the activation their SAE reads)."""
    return list(dict.fromkeys(n for s in masks for n in s.node_sites()))
