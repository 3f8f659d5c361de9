"""Items scored at several positions (sequence tasks): every number checked against plain TransformerLens.

The references below build token ids from the item's strings with the tokenizer alone and read the logits with
hand-written hooks; they do not use surgeon's encoding (`Row`), its alignment or its engine.
"""
import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from surgeon import Case, Item, load_case
from surgeon.analyses.diagnose import diagnose
from surgeon.analyses.logit_attribution import logit_attribution
from surgeon.analyses.patching import patch_heads
from surgeon.errors import AnalysisError, CaseError
from surgeon.models.checks import check_case_against_model
from tests.conftest import ROOT

CASE = os.path.join(ROOT, "cases", "induction_sequence.py")


@pytest.fixture(scope="module")
def seq_case():
    return load_case(CASE)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def prompt_ids(case, fmt, it, tok):
    return [tok.bos_token_id] + ids(tok, case.formats[fmt].format(**it.values))


def teacher_forced(case, fmt, it, tok):
    """(tokens fed, [(position, correct id, incorrect id)]) for an item scored after its prompt."""
    p = prompt_ids(case, fmt, it, tok)
    good = [ids(tok, a)[0] for a in it.correct]
    bad = [ids(tok, a)[0] for a in it.incorrect]
    return p + good[:-1], [(len(p) - 1 + j, g, b) for j, (g, b) in enumerate(zip(good, bad))]


def hand_score(logits, reads, metric="logprob", combine="mean"):
    x = logits.float().log_softmax(-1) if metric == "logprob" else logits.float()
    per = [float(x[p, g] - x[p, b]) for p, g, b in reads]
    return float(np.mean(per)) if combine == "mean" else float(np.sum(per))


def test_the_shipped_sequence_case_scores_the_mean_over_positions(seq_case, induction_model):
    """diagnose's per-item score = the mean over the item's k positions of log P(correct) - log P(incorrect),
    teacher-forced, computed from the strings with one forward per item; and the failure reproduces."""
    tok = induction_model.tokenizer
    d = diagnose(seq_case, induction_model)
    assert d.reproduced and d.metric == "logprob per position (mean)"
    assert all(len(it.correct) >= 3 for it in seq_case.items)
    for fmt in ("repeat", "fresh"):
        want = []
        for it in seq_case.items:
            toks, reads = teacher_forced(seq_case, fmt, it, tok)
            with torch.no_grad():
                want.append(hand_score(induction_model(torch.tensor([toks]))[0], reads))
        got = [r["score"][fmt] for r in d.per_item]
        np.testing.assert_allclose(got, want, atol=1e-4)
    # the sum reads k times the mean, item by item; the logit metric reads logits, not log-probabilities
    s = diagnose(replace(seq_case, combine="sum"), induction_model)
    k = np.array([len(it.correct) for it in seq_case.items])
    np.testing.assert_allclose([r["score"]["fresh"] for r in s.per_item],
                               k * np.array([r["score"]["fresh"] for r in d.per_item]), atol=1e-3)
    g = diagnose(replace(seq_case, metric="logit", items=seq_case.items[:6]), induction_model)
    for it, r in zip(seq_case.items[:6], g.per_item):
        toks, reads = teacher_forced(seq_case, "fresh", it, tok)
        with torch.no_grad():
            assert r["score"]["fresh"] == pytest.approx(
                hand_score(induction_model(torch.tensor([toks]))[0], reads, "logit"), abs=1e-4)


def test_patching_a_head_reads_every_scored_position(seq_case, induction_model):
    """Per head: z patched from `repeat` into `fresh` at every position (equal lengths, index alignment), each
    item's patched score read at all of its positions, equal to hand-written hooks."""
    tok = induction_model.tokenizer
    items = seq_case.items[:10]
    case = replace(seq_case, items=items)
    r = patch_heads(case, induction_model)
    for layer, head in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        for i, it in enumerate(items):
            bt, reads = teacher_forced(case, "fresh", it, tok)
            st, _ = teacher_forced(case, "repeat", it, tok)
            hook = f"blocks.{layer}.attn.hook_z"
            with torch.no_grad():
                _, cache = induction_model.run_with_cache(torch.tensor([st]), names_filter=[hook])

                def put(z, hook, src=cache[hook]):
                    z = z.clone()
                    z[:, :, head] = src[:, :, head]
                    return z

                logits = induction_model.run_with_hooks(torch.tensor([bt]), fwd_hooks=[(hook, put)])[0]
            assert r.per_item[layer, head, i] == pytest.approx(hand_score(logits, reads), abs=1e-4)
    # the induction head repairs the failure; the mean over positions is what moved
    gt = seq_case.notes["ground_truth"]["heads"]["induction"]
    L, H = int(gt[1]), int(gt.split(".h")[1])
    assert r.fraction[L, H] > 0.8 and r.fraction[L, H] == r.fraction.max()


def _inside_case(at, align="index"):
    """The induction organism read *inside* its prompt: after A + filler + A[:m], the logits at each token of the
    second copy predict A's next letter there."""
    import random

    rng = random.Random(1)
    items = []
    for _ in range(6):
        symbols = rng.sample("abcdefghijklmnopqrstuvwxyz", 24)
        a, other, filler = "".join(symbols[:10]), "".join(symbols[10:20]), "".join(symbols[20:23])
        where = at if at != "ints" else [-4, -3, -2, -1]
        items.append(Item({"a": a, "o": other, "g": filler, "again": a[:4]}, correct=list(a[1:5]),
                          incorrect=list(a[2:6]), at=where))
    return Case(name="inside", model="organism:induction", formats={"rep": "{a}{g}{again}", "fresh": "{o}{g}{again}"},
                good="rep", bad="fresh", items=items, align=align)


@pytest.mark.parametrize("at", ["again", "ints"])
def test_scores_read_inside_the_prompt(induction_model, at):
    """at= a placeholder (its value's tokens) or prompt positions counted from the end: the logits at those
    prompt positions, no answer tokens fed; both name the same positions here and agree with the reference."""
    tok = induction_model.tokenizer
    case = _inside_case(at)
    check_case_against_model(case, induction_model)
    d = diagnose(case, induction_model)
    for it, row in zip(case.items, d.per_item):
        for fmt in ("rep", "fresh"):
            p = prompt_ids(case, fmt, it, tok)
            reads = [(len(p) - 4 + j, ids(tok, g)[0], ids(tok, b)[0]) for j, (g, b) in enumerate(zip(it.correct, it.incorrect))]
            with torch.no_grad():
                want = hand_score(induction_model(torch.tensor([p]))[0], reads)
            assert row["score"][fmt] == pytest.approx(want, abs=1e-4)
    assert d.reproduced


def test_a_position_scored_before_the_first_patch_is_computed_and_left_unchanged(induction_model):
    """align="end" patches only the last prompt token; the positions scored before it read what no patch
    reaches (causal attention), so only the last position's share of the mean moves, as the reference says."""
    tok = induction_model.tokenizer
    case = _inside_case("ints", align="end")
    r = patch_heads(case, induction_model, layers=[1])
    for i, it in enumerate(case.items):
        bt, st = prompt_ids(case, "fresh", it, tok), prompt_ids(case, "rep", it, tok)
        reads = [(len(bt) - 4 + j, ids(tok, g)[0], ids(tok, b)[0]) for j, (g, b) in enumerate(zip(it.correct, it.incorrect))]
        with torch.no_grad():
            _, cache = induction_model.run_with_cache(torch.tensor([st]), names_filter=["blocks.1.attn.hook_z"])
            clean = hand_score(induction_model(torch.tensor([bt]))[0], reads[:3], combine="sum")
        for h in range(2):
            with torch.no_grad():
                def put_h(z, hook, src=cache["blocks.1.attn.hook_z"], h=h):
                    z = z.clone()
                    z[:, -1, h] = src[:, -1, h]
                    return z

                lg = induction_model.run_with_hooks(torch.tensor([bt]), fwd_hooks=[("blocks.1.attn.hook_z", put_h)])[0]
            assert r.per_item[r.layers.index(1), h, i] == pytest.approx(hand_score(lg, reads), abs=1e-4)
            # the three earlier positions read what the patch cannot reach
            assert hand_score(lg, reads[:3], combine="sum") == pytest.approx(clean, abs=1e-5)


def test_direct_logit_attribution_combines_positions_as_the_score_does(seq_case, induction_model):
    """DLA of an item scored at k positions: each part is the mean over positions of its direct logit difference;
    the parts still sum to the model's own mean logit difference, which equals the reference."""
    tok = induction_model.tokenizer
    case = replace(seq_case, items=seq_case.items[:8])
    r = logit_attribution(case, induction_model)
    want = []
    for it in case.items:
        toks, reads = teacher_forced(case, "fresh", it, tok)
        with torch.no_grad():
            want.append(hand_score(induction_model(torch.tensor([toks]))[0], reads, "logit"))
    fresh = next(f for f in r.formats if f.format == "fresh")
    assert fresh.logit_diff[0] == pytest.approx(np.mean(want), abs=1e-4)
    assert fresh.max_residual < 1e-3


@pytest.mark.parametrize("change, field, words", [
    (dict(correct=["b", "c"], incorrect=["x"]), "items[0]", "2 correct and 1 incorrect"),
    (dict(correct=["b", "c"], incorrect=["x", "c"]), "items[0]", "the same at position 1"),
    (dict(correct=["b", "c"], incorrect=" x"), "items[0]", "one answer as text and the other as a list"),
    (dict(correct=["b", ""], incorrect=["x", "y"]), "items[0].correct[1]", "''"),
    (dict(at=[0, 1, 2]), "items[0].at", "3 positions for 2 answers"),
    (dict(at="nope"), "items[0].at", "{nope}"),
    (dict(at=1.5), "items[0].at", "1.5"),
])
def test_per_position_items_are_checked_without_a_model(change, field, words):
    base = dict(values={"a": "abc"}, correct=["b", "c"], incorrect=["x", "y"])
    case = Case(name="t", formats={"p": "{a}", "q": "Q{a}"}, good="p", bad="q", items=[Item(**{**base, **change})])
    from surgeon.case.reading import validate

    with pytest.raises(CaseError) as e:
        validate(case)
    assert e.value.field == field and words in e.value.message


def test_what_cannot_combine_over_positions_is_refused():
    from surgeon.case.reading import validate

    it = Item({"a": "abc"}, correct=["b", "c"], incorrect=["x", "y"])
    case = Case(name="t", formats={"p": "{a}", "q": "Q{a}"}, good="p", bad="q", items=[it])
    for metric in ("kl", "prob", lambda lg, c, i: lg[:, 0]):
        with pytest.raises(CaseError) as e:
            validate(replace(case, metric=metric))
        assert e.value.field == "metric" and "logprob, logit" in e.value.message
    with pytest.raises(CaseError, match="per position"):
        validate(replace(case, answer_end="eos"))
    with pytest.raises(CaseError) as e:
        validate(replace(case, combine="max"))
    assert e.value.field == "combine"


def test_the_model_checks_catch_what_needs_the_tokenizer(induction_model):
    """Before any work: an answer of two tokens, a placeholder of the wrong length, a position past the prompt."""
    case = _inside_case("again")
    it = case.items[0]
    for bad_item, words in [
        (replace(it, correct=["ab", *it.correct[1:]]), "is 2 tokens"),
        (replace(it, correct=it.correct[:3], incorrect=it.incorrect[:3]), "is 4 tokens here, but the item has 3"),
        (replace(it, at=[-99, -3, -2, -1]), "outside its prompt"),
    ]:
        with pytest.raises(CaseError, match=words):
            check_case_against_model(replace(case, items=[bad_item, *case.items[1:]]), induction_model)


def test_generation_is_refused_for_items_read_inside_the_prompt(induction_model):
    with pytest.raises(AnalysisError, match="inside the prompt"):
        diagnose(_inside_case("again"), induction_model, generate=4)
