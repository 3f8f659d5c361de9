"""Issue 52's hand-written table, reproduced: each head of a subset gets its mean good-format output (over the case's
trap items, at each offset from the last prompt token) with no good-format prompt, read at the answers' first differing
token on fresh items of the organism's test split. The expected counts come from TransformerLens hooks written here,
on the prompts of one length at a time (the tokens built from the templates, the means taken here), never from
surgeon's rows or means;
the published rates must fall inside surgeon's 95% intervals.

Reproduced: the qa and chat traps, the plain traps and the paired column of the k=2 and k=5 rows; the KL on plain
equals the hand-written KL(unrepaired || repaired) at every position an item scores, averaged within the item. Not reproduced, and so checked against the
hooks only: the issue's KL column (0.007 and 0.021 against 0.0001 and 0.002 here: its definition is not recoverable
from the issue), its qa controls (it counted the 5 of 128 controls whose answers are one another's prefix, which
first-token scoring cannot read: 123/128 = 96.1% unrepaired) and its all-24-heads row (95.7% of traps; here, with
the issue's stated rule, 70.5% on the surgeon and the hooks alike, 56-75% with the mean over any 32 of the 64 traps)."""
import dataclasses

import pytest
import torch

import surgeon
import surgeon.api
from surgeon.organisms import decimal as organism
from tests.analyses.test_repair import _tokens

# the table (mean patch, fresh traps): heads -> (qa, chat, plain traps, paired qa) rates; all 24 heads: None
PUBLISHED = {((0, 4), (0, 6)): (0.457, 0.629, 1.0, 0.738),
             ((0, 2), (0, 4), (0, 5), (0, 6), (1, 2)): (0.738, 0.676, 1.0, 0.996),
             tuple((L, h) for L in range(3) for h in range(8)): None}


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


def _mean_hook(units, means, last):
    """A hand-written hook: each unit's mean at the position j tokens after the last prompt token, in every row of a
    batch whose rows share that position."""
    def hook(z, hook):
        L = hook.layer()
        heads = [h for UL, h in units if UL == L]
        for (LL, j), v in means.items():
            if LL == L and last + j < z.shape[1]:
                z[:, last + j, heads] = v[heads]
        return z
    return hook


def _by_shape(rows):
    """Rows (ids, last, *rest) grouped by (length, last prompt position): each group one batch, no padding."""
    groups = {}
    for r in rows:
        groups.setdefault((len(r[0]), r[1]), []).append(r)
    return groups.values()


def _hand_right(model, case, fmt, items, units, means):
    """How many items the mean patch makes right (prompts of one length and last position run as one batch)."""
    right = 0
    layers = sorted({L for L, _ in units})
    for group in _by_shape([_tokens(model, case, fmt, it) for it in items]):
        ids, last = torch.tensor([g[0] for g in group]), group[0][1]
        hook = _mean_hook(units, means, last)
        lp = model.run_with_hooks(ids, fwd_hooks=[(f"blocks.{L}.attn.hook_z", hook) for L in layers])
        lp = lp[:, -1].log_softmax(-1)
        right += sum(int(lp[b, c] > lp[b, i]) for b, (_, _, c, i) in enumerate(group))
    return right


@pytest.mark.slow
def test_the_hand_written_mean_patch_table_is_reproduced(decimal_model):
    case = dataclasses.replace(surgeon.api.read("decimal_organism"), score="first_token")
    fresh = [it for it in organism.held_out_items(256, 128, seed=11)
             if not (it.correct.startswith(it.incorrect) or it.incorrect.startswith(it.correct))]
    disc = [it for it in case.items if it.tag == "trap"]
    seen = {tuple(sorted(it.values.items())) for it in case.items}
    every = [it for it in fresh if tuple(sorted(it.values.items())) not in seen]
    held = [it for it in every if it.tag == "trap"]
    with torch.no_grad():
        means = _hand_means(decimal_model, case, disc, [0, 1, 2])
        for units, published in PUBLISHED.items():
            heads = ",".join(f"L{L}H{h}" for L, h in units)
            r = surgeon.repair(case, decimal_model, heads=heads, eval_items=fresh, neutral=())  # no neutral texts: not read here
            assert r.repair.built_on["n_items"] == len(disc)
            assert "6 whose prompt is a discovery item's left out" in r.split.evaluated_on
            cells = [("efficacy", "qa"), ("efficacy", "chat"), ("specificity", "plain"), ("paired", "qa")]
            for k, (measure, fmt) in enumerate(cells):
                got = next(x.repaired for x in r.held_out if x.measure == measure and x.format == fmt
                           and x.tag == "trap")
                assert got.n == len(held)
                if measure != "paired":
                    want = _hand_right(decimal_model, case, fmt, held, units, means)
                    assert round(got.value * got.n) == want, (heads, fmt)
                if published is not None:
                    assert got.lo <= published[k] <= got.hi, (heads, measure, fmt, got, published[k])
            kl = next(s.kl for s in r.shifts if s.where == "plain")
            assert kl.n == len(every)
            assert kl.value == pytest.approx(_hand_kl(decimal_model, case, "plain", every, units, means),
                                             rel=1e-3, abs=1e-5), heads


def _hand_kl(model, case, fmt, items, units, means):
    """The mean over items of each item's mean KL(unrepaired || repaired) over the positions it scores: its correct
    answer teacher-forced, read at the last prompt token and each answer character but the last."""
    tok, kls = model.tokenizer, []
    layers = sorted({L for L, _ in units})
    rows = []
    for it in items:
        prompt = case.formats[fmt].format(**it.values)
        rows.append(([tok.bos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in prompt + it.correct[:-1]],
                     len(prompt)))
    for group in _by_shape(rows):
        ids, last = torch.tensor([g[0] for g in group]), group[0][1]
        hook = _mean_hook(units, means, last)
        rep = model.run_with_hooks(ids, fwd_hooks=[(f"blocks.{L}.attn.hook_z", hook) for L in layers]).log_softmax(-1)
        base = model(ids).log_softmax(-1)
        pos = range(last, ids.shape[1])
        for b in range(len(group)):
            kls.append(sum(float((base[b, p].exp() * (base[b, p] - rep[b, p])).sum()) for p in pos) / len(pos))
    return sum(kls) / len(kls)
