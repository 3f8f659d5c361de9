"""What a patch puts in besides the other run's activation: the mean over items per aligned position (mean ablation,
over the case's items or a reference set), and the unpatched activations and their differences per unit."""
from __future__ import annotations

import weakref
from typing import Sequence

import torch
from torch import Tensor

from surgeon.engine.padding import bidirectional
from surgeon.engine.rows import padded
from surgeon.sites.nodes import Site, units_view
from surgeon.case.encoding import align as align_rows


class Sources:
    """A `Contrast`'s ablation sources: a part the Contrast holds (`contrast.sources`). It owns the reference rows
    mean ablation averages over (`mean_rows`: None for the Contrast's own source rows) and the means computed so far;
    it reads the Contrast's buckets and clean runs through a weak reference."""

    def __init__(self, engine, mean_rows=None):
        self.engine = weakref.proxy(engine)
        self.mean_rows = list(mean_rows) if mean_rows is not None else None
        self.means: dict[Site, Tensor] = {}

    def mean_activation(self, site: Site | str) -> Tensor:
        """[n_slots, unit, rest] the source run's activation at `site` averaged over items at each aligned position
        (slot): each item's rows averaged first, then the items that have the slot, over every bucket (or over
        `mean_rows`, a reference set, when the Contrast was given one). What mean ablation patches in: the mean over
        the whole item set per position, as EAP-IG's `compute_mean_activations(per_position=True)` takes it over a
        dataloader, so it is the same whatever the batch size or bucket layout. Summed in float64; computed once."""
        site = Site.coerce(site)
        if site in self.means:
            return self.means[site]
        e, runs = self.engine, self.engine.runs
        S = e.n_slots
        if self.mean_rows is not None:
            total, have = self.reference_sums(site, S)
        else:
            items = [b.items.cpu() for b in e.buckets]
            valid = [b.slot_valid.cpu().double() for b in e.buckets]
            per_item = torch.zeros(e.n_items, S, dtype=torch.float64)  # rows of each item that have each slot
            for it, v in zip(items, valid):
                per_item[:, : v.shape[1]].index_add_(0, it, v)
            total = None
            for b, it, v in zip(e.buckets, items, valid):
                runs.ensure_source(b, [site])
                x = b.source_acts[site].cpu().double()  # [n, S_b, unit, rest]
                w = v / per_item[it, : v.shape[1]].clamp_min(1)  # each item's rows share its weight
                part = (x * w[:, :, None, None]).sum(0)
                if total is None:
                    total = torch.zeros(S, *x.shape[2:], dtype=torch.float64)
                total[: part.shape[0]] += part
                runs.trim(b)
            have = (per_item > 0).sum(0).double()
        self.means[site] = (total / have.clamp_min(1)[:, None, None]).to(e.device, e.cfg.dtype)
        return self.means[site]

    @torch.no_grad()
    def reference_sums(self, site: Site, S: int) -> tuple[Tensor, Tensor]:
        """Sums over the items of `mean_rows` of `site`'s activation at each aligned position (each item's rows
        averaged first), and how many items have each position; positions past the Contrast's slots are dropped."""
        e, runs = self.engine, self.engine.runs
        rows = self.mean_rows
        pos = [align_rows(r, r, e.align)[0][:S] for r in rows]
        n_items = max(r.item for r in rows) + 1
        per_item = torch.zeros(n_items, S, dtype=torch.float64)
        for r, p in zip(rows, pos):
            per_item[r.item, : len(p)] += 1
        pad = getattr(e.model.tokenizer, "pad_token_id", None) or 0
        total = None
        for lo in range(0, len(rows), runs.batch_size):
            chunk, cpos = rows[lo: lo + runs.batch_size], pos[lo: lo + runs.batch_size]
            W = max(len(r.tokens) for r in chunk)
            lengths = torch.tensor([len(r.tokens) for r in chunk], device=e.device)
            _, cache = runs.run_clean_once(padded([r.tokens for r in chunk], W, pad, e.device), [site.hook], False,
                                       lengths if bidirectional(e.model) else None)
            x = units_view(cache[site.hook], site.component, site.n_units(e.cfg)).cpu().double()
            for i, (r, p) in enumerate(zip(chunk, cpos)):
                part = x[i, p] / per_item[r.item, : len(p)].clamp_min(1)[:, None, None]
                if total is None:
                    total = torch.zeros(S, *x.shape[2:], dtype=torch.float64)
                total[: len(p)] += part
        return total, (per_item > 0).sum(0).double()

    def activations(self, site: Site | str, run: str = "source") -> Tensor:
        """The unpatched activation of one run ("source" or "base") at the aligned positions,
        [n_items, S, unit, rest] (one row per item: prompt rows; padded slots are zero)."""
        e, runs = self.engine, self.engine.runs
        site = Site.coerce(site)
        S = max(b.base_pos.shape[1] for b in e.buckets)
        out = None
        for b in e.buckets:
            if run == "source":
                runs.ensure_source(b, [site])
                x = b.source_acts[site]
            else:
                runs.ensure_base(b, site.layer, [site])
                x = b.base_acts[site]
            if out is None:
                out = torch.zeros(e.n_items, S, *x.shape[2:], dtype=x.dtype)
            out[b.items.cpu(), : x.shape[1]] = (x * b.slot_valid[:, :, None, None].to(x.dtype)).cpu()
            runs.trim(b)
        return out

    def deltas(self, sites: Sequence[Site | str]) -> dict[Site, Tensor]:
        """Mean norm of (source - base) activation per unit at the patched positions: 0 means a no-op patch."""
        e, runs = self.engine, self.engine.runs
        out = {}
        for s in map(Site.coerce, sites):
            tot, cnt = 0.0, 0
            for b in e.buckets:
                runs.ensure_base(b, s.layer, [s])
                runs.ensure_source(b, [s])
                d = (b.source_acts[s].float() - b.base_acts[s].float()).norm(dim=-1)  # [n, S, U]
                tot = tot + (d * b.slot_valid[..., None]).sum(dim=(0, 1))
                cnt += float(b.slot_valid.sum())
                runs.trim(b)
            out[s] = tot / cnt
        return out
