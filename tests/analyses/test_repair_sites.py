"""A repair beyond heads (issue 68 item 3): the search may write a layer's MLP output or its residual stream, on the
same engine, where the circuit puts the effect. The expected counts come from TransformerLens hooks written here: the
good-minus-failing difference of the component at each offset from the last prompt token, averaged here over the
discovery items, added times the chosen strength at those offsets, one prompt at a time."""
import pytest
import torch

import surgeon
from surgeon.errors import AnalysisError
from surgeon.repairs.fold import fold
from tests.analyses.test_repair import _case, _tokens


def _hand_diff(model, case, items, hook):
    out = {}
    for fmt, sign in (("plain", 1.0), ("qa", -1.0)):
        sums, counts = {}, {}
        for it in items:
            ids, last, _, _ = _tokens(model, case, fmt, it)
            _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=hook)
            for j, p in enumerate(range(last, len(ids))):
                sums[j] = sums.get(j, 0) + cache[hook][0, p].double()
                counts[j] = counts.get(j, 0) + 1
        for j in sums:
            out[j] = out.get(j, 0) + sign * sums[j] / counts[j]
    return out


@pytest.mark.parametrize("site,hook", [("mlp_out", "blocks.{L}.hook_mlp_out"), ("resid_pre", "blocks.{L}.hook_resid_pre")])
def test_a_search_over_mlp_outputs_or_the_residual_stream_equals_hand_written_hooks(decimal_model, site, hook):
    case = _case(n_trap=16, n_control=8, seed=5)
    r = surgeon.repair(case, decimal_model, search=True, mode="steer", bad="qa", max_kl=1.0, max_heads=1,
                       heads=None, sites=site)
    (label,) = r.repair.heads
    assert label.endswith("." + site) and r.repair.component == site
    L = int(label[1:].split(".")[0])
    h = hook.format(L=L)
    disc = [case.items[i] for i in r.split.discovery if case.items[i].tag == "trap"]
    held = [case.items[i] for i in r.split.evaluation if case.items[i].tag == "trap"]
    a = r.repair.strength
    with torch.no_grad():
        diff = _hand_diff(decimal_model, case, disc, h)
        right = 0
        for it in held:
            ids, last, c, i = _tokens(decimal_model, case, "qa", it)

            def add(x, hook, last=last):
                for j, d in diff.items():
                    if last + j < x.shape[1]:
                        x[0, last + j] += a * d.to(x.dtype)
                return x

            lp = decimal_model.run_with_hooks(torch.tensor([ids]), fwd_hooks=[(h, add)])[0, -1].log_softmax(-1)
            right += int(lp[c] > lp[i])
    eff = r.efficacy("qa").repaired
    assert eff.n == len(held) and round(eff.value * eff.n) == right
    assert right > 0  # it repairs: the equality is not of two zeros
    with pytest.raises(AnalysisError, match="only head outputs"):
        fold(decimal_model, r.repair)  # a whole vector at every position is not a weight edit here: refused


def test_unknown_sites_are_refused_before_the_model_loads():
    with pytest.raises(AnalysisError, match="--sites"):
        surgeon.repair("decimal_organism", "organism:nonexistent", search=True, sites="z,mlp_in")  # the model is never looked up
