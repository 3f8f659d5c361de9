"""The case's metric (logprob, logit, prob, kl, a function over logits), used the same way by diagnose, patch,
attribute, threshold, blend and circuit: checked against values computed by hand on the decimal organism (its
answers are several tokens with a common prefix, " 9.8" vs " 9.11", and its formats differ in length).

The reference below tokenizes with the tokenizer itself, runs whole sequences through the model, and patches with
TransformerLens hooks written here; none of surgeon's encoding, rows or engine is used."""
from dataclasses import replace

import numpy as np
import pytest
import torch

import surgeon
from surgeon import Item
from surgeon.errors import CaseError
from surgeon.case.reading import validate

LAYER = 1


def margin(logits, correct, incorrect):
    """A user's metric: the probability margin of the correct first token over the incorrect one, minus 0.1."""
    p = logits.softmax(-1)
    return p.gather(1, correct[:, None])[:, 0] - p.gather(1, incorrect[:, None])[:, 0] - 0.1


@pytest.fixture(scope="module")
def case(decimal_case):
    items = [it for it in decimal_case.items if it.tag == "trap"][:5] + [
        it for it in decimal_case.items if it.tag == "control"][:3]
    return replace(decimal_case, items=items, focus=None)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _sequences(model, case, fmt, item):
    """(prompt ids, correct answer ids, incorrect answer ids, length of the answers' common prefix)."""
    tok = model.tokenizer
    prompt = [tok.bos_token_id] + _ids(tok, case.formats[fmt].format(**item.values))
    good, bad = _ids(tok, item.correct), _ids(tok, item.incorrect)
    common = 0
    while good[common] == bad[common]:
        common += 1
    return prompt, good, bad, common


def _logits(model, ids, hooks=()):
    with torch.no_grad():
        return model.run_with_hooks(torch.tensor([ids]), fwd_hooks=list(hooks))[0].float()


def _patch_hook(model, good_ids, n_good_prompt, head):
    """Hook replacing head `head`'s output at LAYER at the last prompt token and the continuation (the case's
    align='last': matched from the end), with the good format's run on the same continuation."""
    name = f"blocks.{LAYER}.attn.hook_z"
    with torch.no_grad():
        _, cache = model.run_with_cache(torch.tensor([good_ids]), names_filter=name)
    src = cache[name][0]
    k = len(good_ids) - n_good_prompt + 1

    def hook(z, hook):
        z[0, -k:, head] = src[-k:, head]
        return z

    return name, hook


def hand_score(model, case, fmt, item, metric, head=None):
    """One item's score by hand in format `fmt` (with `head` of LAYER patched from the good format)."""
    prompt, good, bad, common = _sequences(model, case, fmt, item)
    gprompt = _sequences(model, case, case.good, item)[0]

    def run(ids_tail):
        ids = prompt + ids_tail
        hooks = ()
        if head is not None:
            hooks = [_patch_hook(model, gprompt + ids_tail, len(gprompt), head)]
        return _logits(model, ids, hooks)

    def logp_of(answer):  # log P(answer's tokens after the common prefix | prompt + prefix), teacher-forced
        lp = run(answer[:-1]).log_softmax(-1)
        return sum(float(lp[len(prompt) - 1 + j, answer[j]]) for j in range(common, len(answer)))

    if metric == "logprob":
        return logp_of(good) - logp_of(bad)
    if metric == "prob":
        return float(np.exp(logp_of(good)) - np.exp(logp_of(bad)))
    at = len(prompt) + common - 1  # the position that predicts the first differing token
    logits = run(good[:common])[at]
    if metric == "logit":
        return float(logits[good[common]] - logits[bad[common]])
    if metric == "margin":
        return float(margin(logits[None], torch.tensor([good[common]]), torch.tensor([bad[common]]))[0])
    assert metric == "kl"
    g = _logits(model, gprompt + good[:common])[len(gprompt) + common - 1].log_softmax(-1)
    lp = logits.log_softmax(-1)
    return -float((g.exp() * (g - lp)).sum())


METRICS = ["logprob", "logit", "prob", "kl", margin]


def _name(m):
    return m if isinstance(m, str) else "margin"


@pytest.mark.parametrize("metric", METRICS, ids=_name)
def test_diagnose_scores_every_format_as_computed_by_hand(case, decimal_model, metric):
    d = surgeon.diagnose(case, decimal_model, metric=metric)
    assert d.metric == ("function margin" if callable(metric) else metric)
    for fmt in [case.good, *case.bad_formats]:
        got = np.array([it["score"][fmt] for it in d.per_item])
        want = np.array([hand_score(decimal_model, case, fmt, it, _name(metric)) for it in case.items])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # accuracy counts the items the metric calls right: score > 0, or KL below 0.1 nats
    qa = np.array([it["score"]["qa"] for it in d.per_item])
    right = qa > (-0.1 if metric == "kl" else 0.0)
    assert d.get("qa").accuracy.value == pytest.approx(right.mean())
    if metric == "kl":
        assert np.allclose([it["score"]["plain"] for it in d.per_item], 0, atol=1e-5)  # the good run is its reference


@pytest.mark.parametrize("metric", METRICS, ids=_name)
def test_patching_a_head_scores_as_a_hand_written_hook_does(case, decimal_model, metric):
    r = surgeon.patch(case, decimal_model, layers=[LAYER], metric=metric, tag="all")
    assert r.execution["metric"] == ("function margin" if callable(metric) else metric)
    for head in (0, 5):
        want = [hand_score(decimal_model, case, "qa", it, _name(metric), head=head) for it in case.items]
        np.testing.assert_allclose(r.per_item[0, head], want, rtol=1e-4, atol=1e-5)
    clean = [hand_score(decimal_model, case, "qa", it, _name(metric)) for it in case.items]
    assert r.clean_base.value == pytest.approx(np.mean(clean), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("metric", ["kl", "prob"])
def test_attribute_threshold_blend_and_circuit_measure_with_the_metric(case, decimal_model, metric):
    """Every analysis starts from the same unpatched scores under the metric, and counts items right by it."""
    base = np.array([hand_score(decimal_model, case, "qa", it, metric) for it in case.items])
    good = np.array([hand_score(decimal_model, case, "plain", it, metric) for it in case.items])
    kw = dict(metric=metric, tag="all")
    a = surgeon.attribute(case, decimal_model, layers=[LAYER], **kw)
    assert a.execution["metric"] == metric and a.gap == pytest.approx(good.mean() - base.mean(), rel=1e-4)
    t = surgeon.threshold(case, decimal_model, layer=LAYER, groups=(), budget=8, **kw)
    assert t.clean_base_mean == pytest.approx(base.mean(), rel=1e-4) and t.clean_source_mean == pytest.approx(good.mean(), abs=1e-5)
    b = surgeon.blend(case, decimal_model, layer=LAYER, step=0.5, **kw)
    assert b.mean_score[0] == pytest.approx(base.mean(), rel=1e-4)
    assert b.rate[0] == pytest.approx((base > (-0.1 if metric == "kl" else 0)).mean())
    c = surgeon.circuit(case, decimal_model, method="eap", edges=5, paths=0, verify=0, **kw)
    assert c.execution["metric"] == metric and c.empty == pytest.approx(base.mean(), rel=1e-4)


def test_a_bad_metric_is_refused_naming_the_field(case, decimal_model, tmp_path, capsys):
    with pytest.raises(CaseError) as e:
        validate(replace(case, metric="accuracy"))
    assert e.value.field == "metric" and "logprob" in e.value.fix

    def scalar(logits, correct, incorrect):
        return logits.sum()

    with pytest.raises(CaseError) as e:
        surgeon.diagnose(case, decimal_model, metric=scalar)
    assert e.value.field == "metric" and "one score per item" in str(e.value)

    # kl reads the first token where the answers differ: " 4.5" / " 4.53" have none, unless an end token follows
    prefix = replace(case, items=[Item({"a": "4.5", "b": "4.53"}, correct=" 4.53", incorrect=" 4.5")])
    with pytest.raises(CaseError) as e:
        surgeon.diagnose(prefix, decimal_model, metric="kl")
    assert e.value.field == "metric" and 'answer_end="eos"' in e.value.fix
    assert surgeon.diagnose(replace(prefix, answer_end="eos"), decimal_model, metric="kl").metric == "kl"
