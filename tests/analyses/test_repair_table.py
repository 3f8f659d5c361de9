"""Issue 52's hand-written table, reproduced: each head of a subset gets its mean good-format output (over the case's
trap items, at each offset from the last prompt token) with no good-format prompt, read at the answers' first differing
token on fresh items of the organism's test split. The expected counts come from TransformerLens hooks written here,
one prompt at a time (the tokens built from the templates, the means taken here), never from surgeon's rows or means;
the published rates must fall inside surgeon's 95% intervals."""
import dataclasses

import pytest
import torch

import surgeon
import surgeon.api
from surgeon.organisms import decimal as organism
from tests.analyses.test_repair import _tokens

# the table (mean patch, fresh traps): heads -> (qa, chat) rates
PUBLISHED = {((0, 4), (0, 6)): (0.457, 0.629), ((0, 2), (0, 4), (0, 5), (0, 6), (1, 2)): (0.738, 0.676)}


def _hand_means(model, case, items, layers):
    """Per layer and offset j from the last prompt token: the plain format's mean z over the items."""
    names = [f"blocks.{L}.attn.hook_z" for L in layers]
    sums, counts = {}, {}
    for it in items:
        ids, last, _, _ = _tokens(model, case, "plain", it)
        _, cache = model.run_with_cache(torch.tensor([ids]), names_filter=lambda n: n in names)
        for L in layers:
            z = cache[f"blocks.{L}.attn.hook_z"][0]
            for p in range(last, len(ids)):
                sums[L, p - last] = sums.get((L, p - last), 0) + z[p].double()
                counts[L, p - last] = counts.get((L, p - last), 0) + 1
    return {k: (sums[k] / counts[k]).float() for k in sums}


def _hand_right(model, case, fmt, items, units, means):
    right = 0
    for it in items:
        ids, last, c, i = _tokens(model, case, fmt, it)

        def hook(z, hook):
            L = hook.layer()
            for (LL, j), v in means.items():
                if LL == L and last + j < z.shape[1]:
                    for (UL, h) in units:
                        if UL == L:
                            z[0, last + j, h] = v[h]
            return z

        layers = sorted({L for L, _ in units})
        lp = model.run_with_hooks(torch.tensor([ids]), fwd_hooks=[(f"blocks.{L}.attn.hook_z", hook) for L in layers])
        lp = lp[0, -1].log_softmax(-1)
        right += int(lp[c] > lp[i])
    return right


@pytest.mark.slow
def test_the_hand_written_mean_patch_table_is_reproduced(decimal_model):
    case = dataclasses.replace(surgeon.api.read("decimal_organism"), score="first_token")
    fresh = [it for it in organism.held_out_items(256, 128, seed=11)
             if not (it.correct.startswith(it.incorrect) or it.incorrect.startswith(it.correct))]
    disc = [it for it in case.items if it.tag == "trap"]
    seen = {tuple(sorted(it.values.items())) for it in case.items}
    held = [it for it in fresh if it.tag == "trap" and tuple(sorted(it.values.items())) not in seen]
    with torch.no_grad():
        means = _hand_means(decimal_model, case, disc, [0, 1])
        for units, published in PUBLISHED.items():
            heads = ",".join(f"L{L}H{h}" for L, h in units)
            r = surgeon.repair(case, decimal_model, heads=heads, eval_items=fresh)
            assert r.repair.built_on["n_items"] == len(disc)
            assert "6 whose prompt is a discovery item's left out" in r.split.evaluated_on
            for fmt, want in zip(("qa", "chat"), published):
                got = next(x.repaired for x in r.held_out if x.measure == "efficacy" and x.format == fmt)
                assert got.n == len(held)
                assert round(got.value * got.n) == _hand_right(decimal_model, case, fmt, held, units, means), (heads, fmt)
                assert got.lo <= want <= got.hi, (heads, fmt, got, want)
