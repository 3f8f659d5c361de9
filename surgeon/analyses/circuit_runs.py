"""What a circuit means, run on the intervention core: the runs a circuit of edges is evaluated in.

A circuit C is a set of edges of the model's graph (`surgeon.sites.edges`). It explains the *source* run (the good
format when denoising, the failing one when noising): the model runs on the source format's items, and at the
ablated positions each edge carries either its sender's current output (this run's, computed under the
intervention) or its ablation value:

- resample: the other format's sender output at the matched position (the base run's), at the case's aligned
  positions (every position under align="index", where this is exactly MIB's, ACDC's and auto-circuit's
  interchange ablation);
- mean: the sender's mean over the items (or the case's `reference` items) in the source format at each position
  (EAP-IG's `mean-positional`), at every position;
- zero: zero, at every position (ACDC's zero ablation, as its tracr circuits are defined).

Two readings (`SEMANTICS`):
- kept (default; MIB, ACDC, auto-circuit): the circuit is what is kept; every edge outside it carries its ablation
  value, every edge inside its current output. faithfulness f(C) = (m(C) - m(empty)) / (m(full) - m(empty)), with
  m(full) the unablated source run and m(empty) every edge ablated.
- knockout (necessity; Marks et al.'s completeness is the faithfulness of what is left): the circuit's edges carry
  their ablation value, every other edge its current output; reported as the share of the behaviour removed,
  (m(full) - m(without C)) / (m(full) - m(empty)).

Edge scores keep their own frame (`scoring`): under resample the base run with the other run patched in (what
EAP-IG and auto-circuit score), under mean and zero the source run with each edge ablated.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from surgeon.analyses.common import (
    Direction,
    case_metric,
    contrast_rows,
    make_contrast,
    pick_bad,
    pick_items,
)
from surgeon.circuits.methods import SEMANTICS
from surgeon.engine.contrast import Contrast
from surgeon.errors import AnalysisError
from surgeon.sites.edges import EdgeSite
from surgeon.case.case import Case
from surgeon.case.encoding import format_rows


def check_semantics(semantics: str) -> None:
    if semantics not in SEMANTICS:
        raise AnalysisError(f"unknown circuit semantics {semantics!r}", field="semantics",
                            fix=f"use one of: {', '.join(SEMANTICS)}")


@dataclass
class CircuitRuns:
    """The contrasts a circuit is scored and evaluated on, and how an edge set becomes a mask there.

    `scoring`: the Contrast edge scores and path patching run on, with `site` (the ablation's edge site).
    `explained`: the Contrast whose base run is the source run the circuit explains, with `ablate` (the edge site
    whose mask 1 puts an edge at its ablation value). Under mean and zero they are the same Contrast."""

    scoring: object
    site: EdgeSite
    explained: object
    ablate: EdgeSite
    semantics: str
    ablation: str
    info: dict

    @property
    def positions(self) -> str:
        """Where edges are ablated: the aligned positions (resample) or every position (mean, zero)."""
        if self.ablation == "resample" and self.explained.align != "index":
            return f"aligned positions (align={self.explained.align!r})"
        return "every position"

    @cached_property
    def full(self) -> np.ndarray:
        """[items] m(full): the source run, nothing ablated."""
        return self.explained.clean_base.cpu().numpy()

    @cached_property
    def empty(self) -> np.ndarray:
        """[items] m(empty): every edge at its ablation value."""
        return self.ablated([range(len(self.ablate.edges))], "knockout")[0]

    def ablated(self, edge_sets: Sequence[Sequence[int]], semantics: str | None = None) -> np.ndarray:
        """[P, items] scores with each edge set run as a circuit under `semantics` (default: this one's): kept, every
        edge outside the set ablated; knockout, every edge inside it."""
        import torch

        inside = self.ablate.mask([list(x) for x in edge_sets])
        m = inside if (semantics or self.semantics) == "knockout" else 1 - inside
        with torch.no_grad():
            return self.explained.run({self.ablate: m}).cpu().numpy()

    def value(self, edge_sets: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """(per circuit, [P, items] scores): kept, the faithfulness (m(C) - m(empty)) / (m(full) - m(empty)); knockout,
        the share removed (m(full) - m(without C)) / (m(full) - m(empty)); means over items."""
        scores = self.ablated(edge_sets)
        full, empty = float(self.full.mean()), float(self.empty.mean())
        gap = full - empty
        if abs(gap) <= 1e-12:
            return np.full(len(edge_sets), np.nan), scores
        m = scores.mean(1)
        return ((m - empty) if self.semantics == "kept" else (full - m)) / gap, scores

    def per_item(self, scores: np.ndarray) -> np.ndarray:
        """[items] each item's contribution to `value` (before dividing by the gap) for one circuit's scores."""
        return scores - self.empty if self.semantics == "kept" else self.full - scores

    def patched_all(self) -> np.ndarray:
        """[items] the scoring run with every edge at the site's value (the total effect paths share)."""
        import torch

        with torch.no_grad():
            return self.scoring.run({self.site: torch.ones(1, len(self.site.edges))})[0].cpu().numpy()

    def describe(self) -> str:
        what = {"resample": f"the {self.info['base']!r} run's sender output", "mean": "its mean over items",
                "zero": "zero"}[self.ablation]
        if self.semantics == "kept":
            return (f"kept (MIB/ACDC/auto-circuit): on the {self.info['source']!r} items, every edge outside the circuit "
                    f"carries {what} at {self.positions}, every edge inside its current output")
        return (f"knockout (necessity): on the {self.info['source']!r} items, the circuit's edges carry {what} at "
                f"{self.positions}, every other edge its current output; the value is the share of the behaviour "
                f"removed")


def circuit_runs(case: Case, model, site: EdgeSite, *, semantics: str = "kept", direction: Direction = "denoise",
                 bad: str | None = None, tag: str | None = None, batch_size: int = 256) -> CircuitRuns:
    """The runs a circuit of `site`'s edges (its ablation) is scored and evaluated on (see the module)."""
    check_semantics(semantics)
    if site.ablation == "resample":
        scoring, info = make_contrast(case, model, bad=bad, direction=direction, tag=tag, batch_size=batch_size,
                                      sites=site.node_sites())
        # the source run explained, the base run's values for the edges ablated: the same rows, the other way round
        rows_b, rows_s = info.pop("rows")
        explained = Contrast(model, rows_s, rows_b, case.align, batch_size=batch_size, base_name=info["source"],
                             source_name=info["base"], sites=site.node_sites(), metric=scoring.metric,
                             reference=scoring.reference)
        return CircuitRuns(scoring, site, explained, site, semantics, site.ablation, info)
    explained, info = source_contrast(case, model, site, direction=direction, bad=bad, tag=tag,
                                      batch_size=batch_size)
    return CircuitRuns(explained, site, explained, site, semantics, site.ablation, info)


def source_contrast(case: Case, model, site: EdgeSite, *, direction: Direction = "denoise", bad: str | None = None,
                    tag: str | None = None, batch_size: int = 256):
    """The source format's items against themselves, every position aligned (align="index"): the run mean and zero
    ablation act on (the other format plays no part), the mean over the case's `reference` items when it names
    them."""
    bad = pick_bad(case, bad)
    tag, items = pick_items(case, tag)
    base, source, _, rows = contrast_rows(case, model, bad, direction, items)
    reference = format_rows(case, model, source, case.reference) if case.reference else None
    metric, ref = case_metric(case, model, items, batch_size)
    c = Contrast(model, rows, rows, "index", batch_size=batch_size, base_name=source, source_name=source,
                 sites=site.node_sites(), metric=metric, reference=ref, mean_rows=reference)
    return c, dict(base=base, source=source, bad=bad, tag=tag, n_items=len(items), direction=direction)
