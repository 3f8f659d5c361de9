"""What a patch puts in besides the other run's activation: the mean over items per aligned position (mean ablation,
over the case's items or a reference set), and the unpatched activations and their differences per unit."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from surgeon.engine.padding import bidirectional
from surgeon.engine.rows import padded
from surgeon.sites.nodes import Site, units_view
from surgeon.case.encoding import align as align_rows


class Sources:
    """A `Contrast`'s ablation sources (mixed into `Contrast`: its buckets and clean runs)."""

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
            lengths = torch.tensor([len(r.tokens) for r in chunk], device=self.device)
            _, cache = self._pass_once(padded([r.tokens for r in chunk], W, pad, self.device), [site.hook], False,
                                       lengths if bidirectional(self.model) else None)
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
