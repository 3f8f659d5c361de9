"""The same numbers whatever the execution: every analysis at one row per pass, a prime batch size and the default;
items in another order; the subset search's chunk sizes; the shared prefix on and off. To float tolerance relative to
the numbers' own scale (a score of 1e5 is not compared at 1e-4 absolute). What varies here changes only how the work
is cut, so any difference is a bug in the cutting (a row paired with another's mask, a copy-major order read
item-major, a prefix shared that differs, a chunk's patches shifted)."""
import dataclasses

import numpy as np
import pytest
import torch

import surgeon.api
from surgeon.analyses.circuit import discover
from surgeon.analyses.common import make_contrast
from surgeon.analyses.diagnose import diagnose
from surgeon.analyses.feature_circuit import attribution
from surgeon.analyses.patching import patch_heads
from surgeon.analyses.positions import patch_positions
from surgeon.analyses.repair import repair_case
from surgeon.analyses.sinks import sinks
from surgeon.analyses.threshold import threshold_search
from surgeon.organisms import decimal as organism
from surgeon.sae.load import SAESource, load_saes
from surgeon.sites.features import FeatureSite
from surgeon.sites.nodes import Site

BATCHES = (1, 2, 5)  # beside the default, 256: one row per pass, and primes that cut every bucket (a few rows each) unevenly


@pytest.fixture(scope="module")
def case():
    """Traps and controls whose numbers have the lengths most of them have: buckets (rows of one length) of many
    rows, so that batch sizes 2 and 5 cut them into slices."""
    from collections import Counter

    c = surgeon.api.read("decimal_organism")
    pool = organism.held_out_items(60, 40, seed=11)
    length = lambda it: len(it.values["a"]) + len(it.values["b"])  # noqa: E731
    common = Counter(length(it) for it in pool).most_common(1)[0][0]
    same = [it for it in pool if length(it) == common]
    items = [it for it in same if it.tag == "trap"][:10] + [it for it in same if it.tag == "control"][:6]
    return dataclasses.replace(c, items=items)


def _diagnose(case, model, bs):
    d = diagnose(case, model, batch_size=bs)
    return np.array([[it["score"][f] for f in it["score"]] for it in d.per_item]).ravel()


def _patch(case, model, bs):
    r = patch_heads(case, model, layers=[0, 2], batch_size=bs)
    return np.concatenate([r.score.ravel(), r.fraction.ravel(), r.accuracy.ravel()])


def _positions(case, model, bs):
    r = patch_positions(case, model, layers=[1], batch_size=bs)
    return np.nan_to_num(np.asarray(r.fraction, dtype=float).ravel(), nan=-9.0)


def _threshold(case, model, bs, chunk=256):
    r = threshold_search(case, model, layer=0, groups=["even"], budget=300, batch_size=bs, chunk=chunk)
    return np.array([[s.evaluated, s.repairing, s.mean_item_rate, s.mean_repair_fraction] for s in r.sizes]).ravel()


def _circuit(method):
    def run(case, model, bs):
        r = discover(case, model, method=method, bad="chat", n_paths=0, verify=5, n_edges=10, batch_size=bs)
        return np.concatenate([r.scores, [r.exact[k] for k in sorted(r.exact)]])
    return run


def _features(case, model, bs):
    saes = load_saes(SAESource.from_case(case), [0, 1], d_model=model.cfg.d_model)
    sites = [FeatureSite.of(saes[L], error=True) for L in sorted(saes)]
    c, _ = make_contrast(case, model, batch_size=bs, sites=[Site.coerce(s.hook) for s in sites])
    return np.asarray(attribution(c, sites, "ig", 3), dtype=float)


def _sinks(case, model, bs):
    r = sinks(case, model, batch_size=bs)
    return np.concatenate([np.concatenate([f.mass.ravel(), f.last.ravel()]) for f in r.formats])


def _repair(case, model, bs):
    r = repair_case(case, model, heads="L0H4,L0H6", holdout=0.5, seed=0, batch_size=bs)
    return np.array([x.repaired.value for x in r.held_out] + [s.kl.value for s in r.shifts])


ANALYSES = {"diagnose": _diagnose, "patch": _patch, "positions": _positions, "threshold": _threshold,
            "circuit eap": _circuit("eap"), "circuit eap-ig": _circuit("eap-ig-masks"),
            "circuit exact": _circuit("exact"), "feature attribution": _features, "sinks": _sinks, "repair": _repair}
# analyses whose result does not depend on which items sit where (a held-out split is drawn by position: not these)
ORDER_FREE = ("patch", "positions", "threshold", "circuit eap", "circuit eap-ig", "feature attribution", "sinks")


def _close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    a, b = np.asarray(a, float), np.asarray(b, float)
    assert a.shape == b.shape, what
    scale = max(1.0, float(np.nanmax(np.abs(a))) if a.size else 1.0)
    np.testing.assert_allclose(a, b, atol=2e-4 * scale, rtol=0, err_msg=what)


@pytest.fixture(scope="module")
def at_default(case, decimal_model):
    return {}


@pytest.mark.parametrize("name", sorted(ANALYSES))
def test_every_analysis_gives_the_same_numbers_at_any_batch_size(case, decimal_model, at_default, name):
    fn = ANALYSES[name]
    with torch.no_grad() if name not in ("circuit eap", "circuit eap-ig", "feature attribution") else torch.enable_grad():
        base = at_default.setdefault(name, fn(case, decimal_model, 256))
        for bs in BATCHES:
            _close(fn(case, decimal_model, bs), base, f"{name} at batch size {bs}")


@pytest.mark.parametrize("name", ORDER_FREE)
def test_order_free_analyses_give_the_same_numbers_with_the_items_reversed(case, decimal_model, at_default, name):
    fn = ANALYSES[name]
    base = at_default.setdefault(name, fn(case, decimal_model, 256))
    rev = dataclasses.replace(case, items=list(reversed(case.items)))
    _close(fn(rev, decimal_model, 256), base, f"{name} with the items reversed")


def test_the_subset_search_gives_the_same_numbers_at_any_chunk_size(case, decimal_model):
    base = _threshold(case, decimal_model, 256, chunk=256)
    for chunk in (1, 13):
        _close(_threshold(case, decimal_model, 256, chunk=chunk), base, f"chunk {chunk}")


def test_the_shared_prefix_gives_the_same_numbers_as_a_copied_one(case, decimal_model):
    from surgeon.case.encoding import format_rows
    from surgeon.engine.contrast import Contrast

    items = case.items_for(case.focus)
    b, s = (format_rows(case, decimal_model, f, items) for f in ("qa", "plain"))
    site = Site.of("z", 1)
    masks = torch.rand(6, decimal_model.cfg.n_heads, generator=torch.Generator().manual_seed(0))
    out = {}
    for shared in (True, False):
        c = Contrast(decimal_model, b, s, case.align, shared_prefix=shared, sites=[site])
        assert c.execution["prefix"].startswith("shared") == shared
        with torch.no_grad():
            out[shared] = c.run({site: masks}).double().numpy()
    _close(out[True], out[False], "shared prefix vs copied")
