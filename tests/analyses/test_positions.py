"""Per-position patching against TransformerLens's own by-position sweeps (`transformer_lens.patching`), which run
one hooked forward per (layer, position[, head]); and on formats of different length, slot by slot."""
from collections import Counter

import numpy as np
import pytest
import torch
from transformer_lens import patching

import surgeon
from surgeon import load_case
from surgeon.analyses.positions import patch_positions
from surgeon.case.encoding import format_rows
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def same_length(induction_model):
    """The induction case's items of its most common prompt length (TransformerLens patches one batch of equal
    shapes), with their rows in both formats."""
    case = load_case(f"{ROOT}/cases/induction_organism.py")
    rows = format_rows(case, induction_model, case.bad_formats[0], case.items)
    width = Counter(len(r.tokens) for r in rows).most_common(1)[0][0]
    items = [it for it, r in zip(case.items, rows) if len(r.tokens) == width]
    case = type(case)(**{**case.__dict__, "items": items})
    base = format_rows(case, induction_model, case.bad_formats[0], items)
    source = format_rows(case, induction_model, case.good, items)
    assert len(items) >= 4 and all(len(r.targets) == 2 for r in base)
    return case, base, source


def _metric(rows):
    pos = torch.tensor([r.targets[0][0] for r in rows])
    good = torch.tensor([r.targets[0][1] for r in rows])
    bad = torch.tensor([r.targets[1][1] for r in rows])

    def metric(logits):
        lp = logits.log_softmax(-1)[torch.arange(len(rows)), pos]
        return (lp[torch.arange(len(rows)), good] - lp[torch.arange(len(rows)), bad]).mean()
    return metric


@pytest.mark.parametrize("component,tl_fn", [("resid_pre", "get_act_patch_resid_pre"),
                                             ("z", "get_act_patch_attn_head_out_by_pos")])
def test_by_position_equals_transformer_lens(induction_model, same_length, component, tl_fn):
    case, base, source = same_length
    r = patch_positions(case, induction_model, component=component)
    _, cache = induction_model.run_with_cache(torch.tensor([s.tokens for s in source]))
    with torch.no_grad():
        want = getattr(patching, tl_fn)(induction_model, torch.tensor([b.tokens for b in base]), cache,
                                        _metric(base)).numpy()  # [layer, pos(, head)]
    got = r.per_item.mean(-1)  # [layer, slot, unit]
    S = got.shape[1]
    want = want[:, :S] if component == "z" else want[:, :S, None]
    np.testing.assert_allclose(got, want, atol=2e-4)
    assert r.slots[0].startswith("0: ") and all(n == len(case.items) for n in r.slot_items)


def test_positions_of_formats_of_different_length(decimal_model):
    """align="last": slot 0 is the last prompt token, then the answer's tokens; answers differ in length, so the
    last slot exists for some items only: the others keep their unpatched score there and are left out of its
    fraction (n says how many have it); the API gives the command's numbers."""
    from surgeon.analyses.common import make_contrast

    case = load_case(f"{ROOT}/cases/decimal_organism.py")
    r = patch_positions(case, decimal_model, layers=[1], component="resid_pre")
    assert r.slots[0].startswith("last prompt") and r.n_units == 1
    c, _ = make_contrast(case, decimal_model)
    has = c.slot_items().numpy()
    assert list(has.sum(1)) == r.slot_items and min(r.slot_items) < max(r.slot_items) == r.n_items
    j = int(np.argmin(r.slot_items))
    np.testing.assert_allclose(r.per_item[0, j, 0, ~has[j]], c.clean_base.numpy()[~has[j]], atol=1e-5)
    assert not np.allclose(r.per_item[0, j, 0, has[j]], c.clean_base.numpy()[has[j]], atol=1e-3)
    api = surgeon.patch_positions(case, decimal_model, layers=[1], component="resid_pre")
    np.testing.assert_allclose(api.per_item, r.per_item)
