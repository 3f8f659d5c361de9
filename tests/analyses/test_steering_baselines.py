"""The field's steering baselines beside the repair (issue 68 item 4): CAA in the residual stream, ITI on probe-ranked
heads and the controls, built on the repair's discovery items and measured on its held-out items.

The expected numbers come from TransformerLens hooks written here, one prompt at a time: the CAA vector is the good
format's resid_pre minus the failing format's at each offset from the last prompt token, averaged here; ITI's shift is
sigma x theta from each chosen head's output at the last prompt token, computed here. A baseline placed one position
late, its difference taken the wrong way round, or ITI's direction from another head changes them (checked by hand)."""
import dataclasses

import pytest
import torch

import surgeon
from surgeon.analyses.pareto import front, key
from surgeon.organisms import decimal as organism
from tests.analyses.test_repair import _case, _tokens
from tests.analyses.test_repair_sites import _hand_diff


@pytest.fixture(scope="module")
def compared(decimal_model):
    case = _case(n_trap=24, n_control=8, seed=5)
    fresh = organism.held_out_items(24, 8, seed=9)
    r = surgeon.repair(case, decimal_model, heads="L0H4,L0H6", bad="qa", eval_items=fresh, baselines=True)
    return case, r



def _hand_caa(model, case, items, L):
    """Per offset j from the last prompt token: mean over items of resid_pre L in the good format minus in qa."""
    return {j: v.float() for j, v in _hand_diff(model, case, items, f"blocks.{L}.hook_resid_pre").items()}


def _items(case):
    """(the held-out traps, the discovery traps) of the comparison."""
    return ([it for it in organism.held_out_items(24, 8, seed=9) if it.tag == "trap"],
            [it for it in case.items if it.tag == "trap"])


def _hand_right(model, case, items, hook_name, add):
    """How many of `items` the qa prompt gets right with `add(last, width)` [width, ...] added at `hook_name`."""
    right = 0
    for it in items:
        ids, last, c, i = _tokens(model, case, "qa", it)

        def hook(x, hook, last=last):
            return x + add(last, x.shape[1]).to(x.dtype)

        lp = model.run_with_hooks(torch.tensor([ids]), fwd_hooks=[(hook_name, hook)])[0, -1].log_softmax(-1)
        right += int(lp[c] > lp[i])
    return right


def test_caa_points_equal_hand_written_activation_addition(decimal_model, compared):
    case, r = compared
    model = decimal_model
    held, disc = _items(case)
    caa = r.baselines.family("caa")
    assert caa and any(p.efficacy.value > 0 for p in caa)
    with torch.no_grad():
        for p in caa:
            L, a = p.params["layer"], p.params["strength"]
            v = _hand_caa(model, case, disc, L)

            def add(last, width, v=v, a=a):
                d = torch.zeros(width, model.cfg.d_model)
                for j, x in v.items():
                    if last + j < width:
                        d[last + j] = a * x
                return d

            want = _hand_right(model, case, held, f"blocks.{L}.hook_resid_pre", add)
            assert p.efficacy.n == len(held)
            assert round(p.efficacy.value * p.efficacy.n) == want, p.label


def test_iti_points_equal_hand_written_iti(decimal_model, compared):
    case, r = compared
    model = decimal_model
    held, disc = _items(case)
    iti = r.baselines.family("iti")
    assert iti
    n_slots = max(len(_tokens(model, case, "plain", it)[0]) - _tokens(model, case, "plain", it)[1] for it in disc)
    acts = {}
    with torch.no_grad():
        for fmt in ("plain", "qa"):
            for it in disc:
                prompt = case.formats[fmt].format(**it.values)
                ids = [model.tokenizer.bos_token_id] + [model.tokenizer.convert_tokens_to_ids(ch) for ch in prompt]
                _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=lambda n: n.endswith("hook_z"))
                for L in range(model.cfg.n_layers):
                    acts.setdefault((fmt, L), []).append(cache[f"blocks.{L}.attn.hook_z"][0, -1].double())
        for p in iti:
            heads = [(int(x[1:].split("H")[0]), int(x.split("H")[1])) for x in p.params["heads"]]
            shift = {}
            for L, h in heads:
                g = torch.stack(acts["plain", L])[:, h]
                b = torch.stack(acts["qa", L])[:, h]
                theta = g.mean(0) - b.mean(0)
                theta = theta / theta.norm()
                sigma = (torch.cat([g, b]) @ theta).std(unbiased=False)
                shift[L, h] = (p.params["alpha"] * sigma * theta).float()
            want = 0
            for it in held:
                ids, last, c, i = _tokens(model, case, "qa", it)

                def hook(z, hook):
                    for (L, h), s in shift.items():
                        if L == hook.layer():
                            z[0, last: last + n_slots, h] += s
                    return z

                lp = model.run_with_hooks(torch.tensor([ids]), fwd_hooks=[
                    (f"blocks.{L}.attn.hook_z", hook) for L in sorted({L for L, _ in heads})])[0, -1].log_softmax(-1)
                want += int(lp[c] > lp[i])
            assert round(p.efficacy.value * p.efficacy.n) == want, p.label


def test_the_comparison_holds_the_shipped_repair_and_a_true_front(compared):
    _, r = compared
    b = r.baselines
    ship = b.shipped()
    assert ship is not None and ship.label.startswith("L0H4+L0H6")
    # the shipped point's numbers are the repair's own held-out numbers
    assert ship.efficacy.value == pytest.approx(r.efficacy("qa").repaired.value)
    assert ship.kl.value == pytest.approx(next(s.kl.value for s in r.shifts if s.where == "plain"), rel=1e-4, abs=1e-6)
    # the front: no point on it is dominated, every point off it is (by construction of dominance, checked here)
    pts = [(p.efficacy.value, p.kl.value, p.control.value) for p in b.points]
    for p, (e, k, c) in zip(b.points, pts):
        dominated = any(e2 >= e and k2 <= k and c2 >= c and (e2, k2, c2) != (e, k, c) for e2, k2, c2 in pts)
        assert p.front == (not dominated and (e, k, c) not in pts[: b.points.index(p)])
    assert {"surgeon", "caa", "iti", "random", "layer"} <= set(b.tried)
    text = str(r)
    assert "beside the field's steering baselines" in text and "Rimsky" in text and "Li et al." in text


def test_front_treats_equal_points_once():
    ks = [key(0.5, 0.1, 1.0), key(0.5, 0.1, 1.0), key(0.4, 0.2, 1.0), key(0.9, 0.3, 0.9)]
    assert front(ks) == [True, False, False, True]


def test_baselines_save_and_load(compared, tmp_path):
    _, r = compared
    out = tmp_path / "rep"
    r.save(out)
    assert (out / "pareto.png").stat().st_size > 1000
    back = surgeon.load(out)
    assert [dataclasses.astuple(p.efficacy) for p in back.baselines.points] == \
        [dataclasses.astuple(p.efficacy) for p in r.baselines.points]
    assert str(back) == str(r)
