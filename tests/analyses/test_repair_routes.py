"""A repair is right on every route it runs by (issue 68, item 1): `surgeon.apply` under `model.generate` with and
without a key/value cache, a teacher-forced prompt + answer, a right-padded batch; the search's own `--generate`
reports what `apply` + `generate` does; a forward it cannot place is refused, and so is an analysis of a hooked model.
Expected values come from hand-written TransformerLens hooks over one prompt at a time that write slot j of the saved
tensor at the position j tokens after the last prompt token, never from surgeon's hooks."""
import dataclasses

import pytest
import torch

import surgeon
import surgeon.api
from surgeon.analyses.generation import ends_cleanly, judge
from surgeon.case.case import Item
from surgeon.errors import AnalysisError, SurgeonError
from surgeon.organisms import decimal as organism
from tests.cli_in_process import surgeon as surgeon_cli

HEADS = "L0H0,L0H1,L0H4,L0H6,L1H2,L1H5,L2H0,L2H3"  # the searched repair the issue measured by hand


@pytest.fixture(scope="module")
def searched(decimal_model):
    case = surgeon.api.read("decimal_organism")
    items = organism.held_out_items(16, 8, seed=4)
    case = dataclasses.replace(case, items=items)
    with torch.no_grad():
        r = surgeon.repair(case, decimal_model, heads=HEADS, holdout=0.5, seed=0, generate=6)
    return case, r


def _ids(model, case, fmt, item):
    tok = model.tokenizer
    return [tok.bos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in case.formats[fmt].format(**item.values)]


def _hand_hooks(repair, last, shift=0):
    """Hand-written: slot j of each saved tensor at position last + j (+ shift, a mutation) of row 0, when there."""
    out = []
    for h, v in repair.values.items():
        heads = [int(x) for x in repair.units[h]]

        def fn(z, hook, v=v, heads=heads):
            for j in range(v.shape[0]):
                p = last + j + shift
                if 0 <= p < z.shape[1]:
                    z[0, p, heads] = v[j, heads]
            return z
        out.append((h, fn))
    return out


def _hand_greedy(model, ids, repair, n_new, shift=0):
    """Greedy decoding, one full forward per token, the hand-written hooks on."""
    last, cur = len(ids) - 1, list(ids)
    for _ in range(n_new):
        logits = model.run_with_hooks(torch.tensor([cur]), fwd_hooks=_hand_hooks(repair, last, shift))
        cur.append(int(logits[0, -1].argmax()))
    return cur[len(ids):]


def test_generation_measure_is_what_apply_and_generate_do(decimal_model, searched):
    """The result's generation rates are what `surgeon.apply` + `model.generate` give (KV-cached, and not), which are
    what hand-written hooks give; slots after the first matter here (answers of several tokens), so a repair one
    token late, or slot 0's write lost at the predicting position (the clamp defect), generates other text."""
    case, r = searched
    ev = [case.items[i] for i in r.split.evaluation]
    rep = r.repair
    moved = 0
    with torch.no_grad():
        for fmt in ("qa", "chat", "plain"):
            for tag in ("trap", "control"):
                its = [it for it in ev if it.tag == tag]
                right = 0
                for it in its:
                    ids = _ids(decimal_model, case, fmt, it)
                    hand = _hand_greedy(decimal_model, ids, rep, 6)
                    with surgeon.apply(decimal_model, rep):
                        cached = decimal_model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                                                        verbose=False, use_past_kv_cache=True)[0, len(ids):].tolist()
                        full = decimal_model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False,
                                                      verbose=False, use_past_kv_cache=False)[0, len(ids):].tolist()
                    assert cached == hand == full, (fmt, it.values)
                    right += judge(decimal_model.tokenizer.decode(hand), it) == "correct"
                    if fmt == "qa" and tag == "trap":
                        moved += _hand_greedy(decimal_model, ids, rep, 6, shift=1) != hand
                row = next(g for g in r.generation if g.format == fmt and g.tag == tag)
                assert round(row.repaired.value * row.repaired.n) == right, (fmt, tag)
    assert moved > 0  # the hand-written check can tell a repair one token late


def test_teacher_forced_and_right_padded_forwards_take_last(decimal_model, searched):
    """A prompt + answer in one forward: slot 0 at the last prompt token (given as last=), not the last token; a
    right-padded batch of two prompts of different lengths: each row at its own last position; without last= such a
    forward is refused with what to pass."""
    case, r = searched
    rep = r.repair
    a, b = case.items[0], case.items[1]
    ids = _ids(decimal_model, case, "qa", a)
    full = ids + [decimal_model.tokenizer.convert_tokens_to_ids(ch) for ch in a.correct]
    with torch.no_grad():
        want = decimal_model.run_with_hooks(torch.tensor([full]), fwd_hooks=_hand_hooks(rep, len(ids) - 1))
        with surgeon.apply(decimal_model, rep, last=len(ids) - 1):
            got = decimal_model(torch.tensor([full]))
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        with surgeon.apply(decimal_model, rep, last="end"):  # the old default: slot 0 on the answer's last token
            assert not torch.allclose(decimal_model(torch.tensor([full])), want, atol=1e-3)
        with pytest.raises(AnalysisError, match="last="):
            with surgeon.apply(decimal_model, rep):
                decimal_model(torch.tensor([full]))
        rows = [_ids(decimal_model, case, "chat", a), _ids(decimal_model, case, "qa", b)]
        W = max(map(len, rows))
        batch = torch.tensor([x + [0] * (W - len(x)) for x in rows])
        with surgeon.apply(decimal_model, rep, last=[len(x) - 1 for x in rows]):
            got = decimal_model(batch)
        for k, x in enumerate(rows):
            alone = decimal_model.run_with_hooks(torch.tensor([x]), fwd_hooks=_hand_hooks(rep, len(x) - 1))
            torch.testing.assert_close(got[k, len(x) - 1], alone[0, -1], atol=1e-4, rtol=1e-4)
    with pytest.raises(AnalysisError, match="rows"):
        with torch.no_grad(), surgeon.apply(decimal_model, rep, last=[3, 4, 5]):
            decimal_model(batch)


def test_analyses_refuse_a_model_carrying_a_repair(decimal_model, searched):
    """`surgeon.diagnose(case, model)` inside `with surgeon.apply(...)` printed the unrepaired numbers as the model's:
    refused, saying what to do; the same call after the block runs."""
    case, r = searched
    with surgeon.apply(decimal_model, r.repair):
        with pytest.raises(SurgeonError, match="hooks surgeon did not install") as e:
            surgeon.diagnose(case, decimal_model)
    assert e.value.field == "model"
    assert surgeon.diagnose(case, decimal_model) is not None
    with pytest.raises(AnalysisError, match="holds no repair"):
        with surgeon.apply(decimal_model, surgeon.diagnose(case, decimal_model)):
            pass


def test_generation_is_judged_strictly():
    """The answer, then its end: " 3.56" is not " 3.5"; a case's answer_end must follow; a one-letter answer in a
    stream of letters may be followed by any."""
    it = Item({}, correct=" 3.5", incorrect=" 3.25")
    assert judge(" 3.56", it) == "other" and judge(" 3.5\n", it) == "correct" and judge(" 3.5", it) == "correct"
    assert judge(" 3.5.7", it) == "other" and judge(" 3.5. Yes", it) == "correct" and judge(" 3.25 is", it) == "incorrect"
    assert judge(" 3.5 and", it, end="\n") == "other" and judge(" 3.5\nQ", it, end="\n") == "correct"
    word = Item({}, correct=" cat", incorrect=" dog")
    assert judge(" cats", word) == "other" and judge(" cat.", word) == "correct"
    assert ends_cleanly("q", "GF") and not ends_cleanly("12", "3")


def test_kl_counts_each_item_once(decimal_model, searched):
    """Items whose answers are scored as two rows (sequence scoring, answers of different lengths) are one item each
    in the KL: n is the number of items, and the mean is over items."""
    case, r = searched
    for s in r.shifts:
        if s.where != "neutral":
            assert s.kl.n == r.n_evaluation
            assert len(s.worst) == 3 and s.worst[0][1] >= s.worst[1][1] >= s.worst[2][1] >= 0
            assert s.q90 <= s.worst[0][1] + 1e-9


def test_the_threshold_organism_search_says_no(threshold_model, tmp_path):
    """On the threshold organism no single head repairs by a constant (closed form: every head's mean output is a
    mixture over letters), so a search that adds heads one at a time finds nothing: the verdict says so, with why
    (the paired patch of the same heads does not help either, or does), and --out saves nothing unless asked."""

    case = surgeon.api.read("threshold_organism")
    with torch.no_grad():
        r = surgeon.repair(case, threshold_model, search=True, max_heads=2, holdout=0.5, seed=0)
    assert any(v.startswith("no repair found") for v in r.verdict())
    assert all(row.repaired.lo <= row.unrepaired.value for row in r.rows("efficacy"))
    out = tmp_path / "rep"
    run = surgeon_cli(["repair", "threshold_organism", "--search", "--max-heads",
                          "2", "--out", str(out)])
    assert run.returncode == 0, run.stderr
    assert "verdict: no repair found" in run.stdout and "not saved" in run.stdout and not out.exists()
