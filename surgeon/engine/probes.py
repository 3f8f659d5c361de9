"""Patched runs read otherwise than by a score: the activation at a hook point under each patch (`probe`,
`capture`) and greedy continuations of the patched prompts (`generate`)."""
from __future__ import annotations

import weakref
from typing import Mapping

import torch
from torch import Tensor

from surgeon.engine import prefix_attention
from surgeon.engine.readout import greedy
from surgeon.engine.caches import node_sites
from surgeon.engine.rows import Bucket
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site, hook_layer
from surgeon.sites.protocol import coerce


class Probes:
    """A `Contrast`'s probes and generation: a part the Contrast holds (`contrast.probes`), with no state of its own;
    it uses the Contrast's clean runs, patched forward pass and hooks through a weak reference."""

    def __init__(self, engine):
        self.engine = weakref.proxy(engine)

    @torch.no_grad()
    def probe(self, masks: Mapping[Site | str, Tensor], hook: str) -> tuple[Tensor, Tensor]:
        """The activation at `hook` under each of P patches, at the aligned positions, instead of scores.

        Returns ([P, n_items, S, d] activations, [n_items, S] 1 for real slots). The pass stops after
        `hook`'s layer. Build the Contrast from prompt-only rows (one row per item), as for `generate`."""
        e = self.engine
        masks = {coerce(k): v for k, v in masks.items()}
        P = next(iter(masks.values())).shape[0]
        start = min(s.layer for s in masks)
        at = hook_layer(hook)
        if at < start or (at == start and hook.endswith(("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v"))):
            raise AnalysisError(f"{hook} is computed before the patched sites (layer {start}): no patch can change it",
                                field="--sae-layer", fix=f"read features at layer {start} or later")
        S = max(b.base_pos.shape[1] for b in e.buckets)
        out = valid = None
        for b in e.buckets:
            if len({int(i) for i in b.items}) != b.n:
                raise AnalysisError("internal: probe needs one row per item (prompt rows)")
            rel = (b.base_pos - b.p0).to(e.device)
            idx = torch.arange(b.n, device=e.device)[:, None]
            x = self.capture(b, masks, hook, lambda x, lo: x[:, idx.to(x.device), rel.to(x.device)].cpu())
            if out is None:
                out = torch.zeros(P, e.n_items, S, x.shape[-1], dtype=x.dtype)
                valid = torch.zeros(e.n_items, S)
            out[:, b.items.cpu(), : x.shape[2]] = x
            valid[b.items.cpu(), : b.slot_valid.shape[1]] = b.slot_valid.cpu()
            e.runs.trim(b)
        return out, valid

    @torch.no_grad()
    def capture(self, b: Bucket, masks: Mapping[Site | str, Tensor], hook: str, reduce=None) -> Tensor:
        """The activation at `hook` [P, n, positions from p0 on, ...] for the rows of bucket `b` under each of P
        patches (the pass stops after `hook`'s layer); `reduce(x, lo)` turns each chunk of patches lo.. into what
        is kept (default: all of it)."""
        e = self.engine
        masks = {coerce(k): v for k, v in masks.items()}
        P = next(iter(masks.values())).shape[0]
        start, at = min(s.layer for s in masks), hook_layer(hook)
        nodes = node_sites(masks)
        e.runs.ensure_base(b, start, nodes)
        e.runs.ensure_source(b, nodes)
        chunk = max(1, e.runs.batch_size // b.n)
        parts = []
        for lo in range(0, P, chunk):
            c = min(chunk, P - lo)
            kept = {}

            def keep(act, hook):
                kept["x"] = act.view(c, b.n, *act.shape[1:])

            kv = (prefix_attention.prefix_cache(e.model, b.p0, start) if e.shared_prefix
                  else e.runs.kv_cache(b, start, c))
            e.patched_forward(b, start, {s: m[lo: lo + c] for s, m in masks.items()}, c, kv, stop=at + 1,
                          extra_hooks=[(hook, keep)])
            parts.append(kept["x"] if reduce is None else reduce(kept["x"], lo))
        return torch.cat(parts)

    @torch.no_grad()
    def generate(self, masks: Mapping[Site | str, Tensor], n_new: int) -> Tensor:
        """Greedy continuations [P, n_items, n_new] of the base prompts with each patch applied to the
        prompt's patched positions (generated positions are not patched). Build the Contrast from
        prompt-only rows (`surgeon.case.encoding.prompt_rows`): one row per item."""
        e = self.engine
        masks = {coerce(k): v for k, v in masks.items()}
        P = next(iter(masks.values())).shape[0]
        out = torch.zeros(P, e.n_items, n_new, dtype=torch.long)
        for b in e.buckets:
            e.runs.ensure_source(b, node_sites(masks))
            lengths = b.tgt_pos[:, 0] + 1  # prompt rows: the target marks the last prompt token
            chunk = max(1, e.runs.batch_size // b.n)
            for lo in range(0, P, chunk):
                c = min(chunk, P - lo)
                hooks = e.mix_hooks(b, {s: m[lo: lo + c] for s, m in masks.items()}, c, offset=0)
                gen = greedy(e.model, b.base_tokens.repeat(c, 1), lengths.repeat(c), n_new, hooks)
                out[lo: lo + c, b.items.cpu()] = gen.view(c, b.n, n_new).cpu()
            e.runs.trim(b)
        return out
