"""`surgeon scan` against ground truth that does not lean on it: the formats it composes against hand-written
strings, its scores against a hand-written forward, the decimal organism's planted failure (trained in the Q&A and
chat formats, not the plain one), Holm against statsmodels, the paired effect against its closed form."""
import dataclasses

import numpy as np
import pytest
import torch

import surgeon
from surgeon.analyses.scan import scan_formats
from surgeon.case.grammar import body_of, compose, grammar_of
from surgeon.errors import SurgeonError
from surgeon.stats import holm, paired_difference
from tests.cli.test_reliability import refused
from tests.conftest import ROOT
from tests.cli_in_process import surgeon as surgeon_cli

DECIMAL = f"{ROOT}/cases/decimal_organism.py"
SMALL = {"question_cue": {"none": "", "Q:": "Q: "}, "separator": {"newline": "\n", "blank line": "\n\n"},
         "answer_cue": {"Answer:": "Answer:", "A:": "A:"}, "casing": ["as written"], "shots": [0],
         "instruction": {"none": ""}}


@pytest.fixture(scope="module")
def case():
    return surgeon.load_case(DECIMAL)


@pytest.fixture(scope="module")
def small(case):
    return dataclasses.replace(case, scan=SMALL)


@pytest.fixture(scope="module")
def scanned(small, decimal_model):
    return scan_formats(small, decimal_model, seed=0)


def hand_score(model, text: str, correct: str, incorrect: str) -> float:
    """log P(correct) - log P(incorrect), each answer's tokens teacher-forced after the prompt, by a plain forward."""
    tok = model.tokenizer
    bos = [tok.bos_token_id] if model.cfg.default_prepend_bos and tok.bos_token_id is not None else []
    out = 0.0
    for ans, sign in ((correct, 1), (incorrect, -1)):
        p = bos + tok(text, add_special_tokens=False)["input_ids"]
        a = tok(ans, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            lp = model(torch.tensor([p + a]))[0].double().log_softmax(-1)
        out += sign * sum(float(lp[len(p) - 1 + j, t]) for j, t in enumerate(a))
    return out


def test_the_body_and_the_composed_formats_are_the_hand_written_ones(case, decimal_model):
    assert body_of(case) == "Which is bigger: {a} or {b}?"
    g = grammar_of(case, decimal_model.tokenizer)
    want = {("none", "newline", "Answer:"): case.formats["plain"], ("Q:", "newline", "A:"): case.formats["qa"],
            ("User:", "newline", "Assistant:"): case.formats["chat"],
            ("Question:", "blank line", "Output:"): "Question: Which is bigger: {a} or {b}?\n\nOutput:"}
    for (q, sep, a), text in want.items():
        f = compose(g, {"question_cue": q, "separator": sep, "answer_cue": a}, [])
        assert f.template == text
    f = compose(g, {"question_cue": "Q:", "separator": "space", "answer_cue": "A:", "casing": "lower"}, [])
    assert f.template == "q: Which is bigger: {a} or {b}? a:"
    it = case.items[0]
    f = compose(g, {"question_cue": "Q:", "separator": "newline", "answer_cue": "A:", "shots": "1"}, [it])
    assert f.template == (f"Q: Which is bigger: {it.values['a']} or {it.values['b']}?\nA:{it.correct}\n\n"
                          "Q: Which is bigger: {a} or {b}?\nA:")
    assert "chat: the tokenizer has no chat template" in g.dropped


def test_scores_equal_a_hand_written_forward(scanned, small, decimal_model):
    """Every format's held-out accuracy is the share of evaluation items whose hand-computed score is above 0."""
    r = scanned
    n = r.split["evaluation"]
    items = [it for it in small.items if it.tag == "trap"]
    from surgeon.analyses.heldout import eval_split

    _, _, ev = eval_split(dataclasses.replace(small, items=items), None, 0.5, 0)
    assert len(ev) == n
    for f in r.held_out[:3]:
        right = [hand_score(decimal_model, f.template.format(**it.values), it.correct, it.incorrect) > 0 for it in ev]
        assert f.accuracy.n == n and f.accuracy.value == pytest.approx(np.mean(right)), f.name


def test_the_planted_failure_is_found_and_blamed_on_the_answer_cue(scanned):
    """Construction: the organism was trained to fail on traps in 'Q: ...\\nA:' and 'User: ...\\nAssistant:', and to
    answer in 'Which is bigger: ...\\nAnswer:'; the scan finds those formats at the extremes, held out, and the
    answer cue 'A:' significant and negative."""
    r = scanned
    by = {f.template: f for f in r.held_out + r.case_formats}
    plain, qa = "Which is bigger: {a} or {b}?\nAnswer:", "Q: Which is bigger: {a} or {b}?\nA:"
    assert by[qa].accuracy.value <= 0.05 and r.worst.accuracy.value <= 0.05
    assert r.best.accuracy.value >= 0.95 and r.spread >= 0.9
    assert {f.name: f.accuracy.value for f in r.case_formats}["case format 'plain'"] >= 0.95
    a = next(e for e in r.effects if (e.part, e.option) == ("answer_cue", "A:"))
    assert a.chosen and a.held_out.hi < 0 and a.discovery.hi < 0
    assert r.pair is not None and r.pair["confirmed"] and len(r.pair["differs"]) == 1
    assert not r.in_sample and "held out" in str(r)
    assert plain in {f.template for f in r.discovery}


def test_holm_equals_statsmodels_and_its_definition():
    multitest = pytest.importorskip("statsmodels.stats.multitest")
    rng = np.random.default_rng(0)
    for m in (1, 2, 7, 30):
        p = rng.uniform(0, 0.2, m)
        p[rng.integers(0, m)] = p.min()  # a tie
        np.testing.assert_allclose(holm(p), multitest.multipletests(p, method="holm")[1])
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])  # by hand: 3x, then 2x, made monotone


def test_the_paired_effect_is_its_closed_form():
    x = np.array([[1, 1, 0, 1], [1, 0, 0, 1], [0, 0, 0, 1], [0, 1, 0, 0]], float)
    w = np.array([True, True, False, False])
    e, p = paired_difference(x, w)
    assert e.value == pytest.approx(x[:2].mean() - x[2:].mean()) and e.n == 4 and e.lo <= e.value <= e.hi
    same, p_same = paired_difference(np.ones((4, 5)), w)
    assert same.value == 0 and p_same == 1.0


def test_a_prompt_two_formats_share_runs_once(small, decimal_model):
    twin = dataclasses.replace(small, scan={**SMALL, "question_cue": {"none": "", "empty": "", "Q:": "Q: "}})
    r = scan_formats(twin, decimal_model, holdout=0)
    assert r.in_sample and "in-sample" in str(r)
    n = r.split["discovery"]
    # 12 formats and the case's 3 scored; distinct: 8 (the 'empty' cue's are 'none''s) and the case's chat format
    # (its plain and qa are two of the 8)
    assert r.work["format_items"] == 15 * n and r.work["prompts_run"] == 9 * n
    acc = {(f.choice["question_cue"], f.choice["separator"], f.choice["answer_cue"]): f.accuracy.value
           for f in r.discovery}
    for (q, s, a), v in acc.items():
        if q == "empty":
            assert v == acc[("none", s, a)]


@pytest.mark.parametrize("batch_size", [1, 7])
def test_numbers_do_not_depend_on_the_batch_size(scanned, small, decimal_model, batch_size):
    r = scan_formats(small, decimal_model, seed=0, batch_size=batch_size)
    for a, b in zip(scanned.discovery, r.discovery):
        assert a.name == b.name and a.accuracy.value == b.accuracy.value
        assert a.mean_score.value == pytest.approx(b.mean_score.value, abs=1e-4)


def test_successive_halving_within_a_small_budget(case, decimal_model):
    """Over budget, rung 0 scores a sample of the formats on a few items and later rungs keep the extremes on more
    items; the worst format it ends with fails as badly as the worst of the exhaustive scan."""
    r = scan_formats(case, decimal_model, budget=800, seed=1)
    assert r.search["method"] == "successive halving"
    rungs = r.search["rungs"]
    assert rungs[0]["items"] == 8 and all(b["formats"] < a["formats"] and b["items"] > a["items"]
                                          for a, b in zip(rungs, rungs[1:]))
    assert r.search["sampled"] and rungs[0]["formats"] == 800 // 16 < 96
    assert sum(f.accuracy.n for f in r.discovery) <= 800  # discovery's distinct (format, item) scores: the budget
    assert r.worst.accuracy.value <= 0.1 and r.best.accuracy.value >= 0.9


def test_the_written_case_loads_and_reproduces(scanned, small, decimal_model, tmp_path):
    from surgeon.analyses.scan import write_found

    small_file = dataclasses.replace(small, source=DECIMAL)
    r = write_found(scanned, small_file, tmp_path / "sub" / "found.py")
    c = surgeon.load_case(r.written)
    assert c.good == "works" and c.bad == ["fails"]
    assert c.formats["works"] == r.pair["works_format"] and c.formats["fails"] == r.pair["fails_format"]
    assert len(c.items) == len(small.items)
    d = surgeon.diagnose(c, decimal_model)
    assert d.reproduced["fails"]
    with pytest.raises(SurgeonError) as e:
        write_found(scanned, small_file, tmp_path / "sub" / "found.py")
    assert "exists" in str(e.value)


def test_bad_scans_are_refused_before_the_model_loads(tmp_path, capsys, case):
    bad = dataclasses.replace(case, scan={"cue": {"x": "X: "}})
    with pytest.raises(SurgeonError) as e:
        surgeon.scan(bad, "no/such/model")
    assert e.value.field == "scan['cue']"
    for kw, field in ((dict(budget=3), "budget"), (dict(holdout=0.5, eval_items=8), "eval_items"),
                      (dict(write_case=tmp_path / "x.txt"), "--write-case")):
        with pytest.raises(SurgeonError) as e:
            surgeon.scan(DECIMAL, "no/such/model", **kw)
        assert e.value.field == field, kw
    (tmp_path / "there.py").write_text("")
    refused(capsys, ["scan", DECIMAL, "--write-case", str(tmp_path / "there.py"), "--model", "no/such/model"],
            "exists")
    refused(capsys, ["scan", DECIMAL, "--holdout", "0.5", "--eval-items", "8"], "--eval-items")


def test_a_scan_with_few_shot_examples_sets_them_aside(charset):
    """On a model with room for examples: the examples are items never scored, the same ones in every format, and
    the prompts are the examples then the question."""
    from tests.conftest import tiny_model

    model = tiny_model(charset, n_ctx=256)
    items = [surgeon.Item({"a": a, "b": b}, correct=f" {a}", incorrect=f" {b}", tag="t")
             for a, b in [("1.2", "1.1"), ("2.5", "2.4"), ("3.3", "3.1"), ("4.7", "4.2"), ("5.5", "5.1"),
                          ("6.6", "6.2"), ("7.7", "7.1"), ("8.8", "8.3"), ("9.9", "9.1"), ("1.9", "1.3"),
                          ("2.8", "2.1"), ("3.9", "3.2")]]
    c = surgeon.Case(name="t", formats={"p": "Which is bigger: {a} or {b}?\nAnswer:", "q": "Q: Which is bigger: "
                                        "{a} or {b}?\nA:"}, good="p", bad=["q"], items=items,
                     scan={"question_cue": {"none": "", "Q:": "Q: "}, "shots": [0, 3], "casing": ["as written"],
                           "separator": {"newline": "\n"}, "answer_cue": {"A:": "A:"}, "instruction": {"none": ""}})
    r = scan_formats(c, model, holdout=0.5)
    assert r.split["shots"] == 3 and r.split["discovery"] + r.split["evaluation"] + 3 == len(items)
    three = [f for f in r.discovery if f.choice["shots"] == "3"]
    assert three and all(f.template.count("Which is bigger") == 4 for f in three)


@pytest.mark.slow
def test_the_cli_scan_writes_results_and_a_case(tmp_path):
    out = surgeon_cli(["scan", DECIMAL, "--out", str(tmp_path / "o"),
                          "--write-case", str(tmp_path / "found.py")])
    assert out.returncode == 0, out.stderr
    assert "minimal pair" in out.stdout and "held out" in out.stdout
    assert {p.name for p in (tmp_path / "o").iterdir()} >= {"results.json", "manifest.json", "effects.png",
                                                             "formats.csv", "effects.csv"}
    assert surgeon.load_case(tmp_path / "found.py").good == "works"


def test_fresh_evaluation_items_are_of_the_scanned_tag(small, decimal_model):
    """--eval-items N draws items of every tag; the scan measures its chosen formats on those of the tag it scanned."""
    r = scan_formats(small, decimal_model, holdout=None, eval_items=24, seed=2)
    from surgeon.analyses.heldout import eval_items_of

    drawn, _ = eval_items_of(small, 24, 2)
    traps = sum(it.tag == "trap" for it in drawn)
    assert 0 < traps < len(drawn)
    assert r.split["evaluation"] == traps and all(f.accuracy.n == traps for f in r.held_out)


def test_a_chat_models_own_template_is_one_of_the_parts(tmp_path):
    """On a tiny Llama checkpoint with Llama 3's chat template: the grammar keeps the chat part, and each chat option's
    prompts are the tokenizer's own rendering of the question (written here with apply_chat_template, the system
    prompt where asked; BOS from the template, not added again), its mean score a hand-written forward of them."""
    import random

    import surgeon
    from surgeon import Case, Item
    from surgeon.case.grammar import SYSTEM
    from surgeon.models.loading import load_model
    from tests.checkpoints import make_llama

    path = make_llama(tmp_path / "llama")
    rng = random.Random(0)
    word = lambda: "".join(rng.choice("abcdefgh") for _ in range(3))  # noqa: E731
    items = [Item({"a": word(), "b": word()}, correct="x", incorrect="y") for _ in range(6)]
    case = Case(name="chat", model=str(path), formats={"plain": "{a} or {b}?\nAnswer:", "qa": "Q: {a} or {b}?\nA:"},
                good="plain", bad=["qa"], items=items,
                scan={"body": "{a} or {b}?", "instruction": {"none": ""}, "question_cue": {"Q": "Q: "},
                      "separator": {"newline": "\n"}, "answer_cue": {"A": "A:"}, "casing": ["as written"],
                      "shots": [0]})
    model = load_model(str(path))
    r = surgeon.scan(case, model, holdout=0)
    chats = {f.choice["chat"]: f for f in r.discovery}
    assert sorted(chats) == ["none", "template", "template+system"]
    tok = model.tokenizer
    x, y = (tok(c, add_special_tokens=False)["input_ids"][0] for c in "xy")
    for option, f in chats.items():
        scores = []
        for it in items:
            q = f"Q: {it.values['a']} or {it.values['b']}?\nA:"
            if option == "none":
                ids = [tok.bos_token_id] + tok(q, add_special_tokens=False)["input_ids"]
            else:
                msgs = ([{"role": "system", "content": SYSTEM}] if option == "template+system" else []) + [
                    {"role": "user", "content": q}]
                text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                assert text.count("<|begin_of_text|>") == 1 and "<|start_header_id|>assistant" in text
                ids = tok(text, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = model(torch.tensor([ids]))[0, -1].float().log_softmax(-1)
            scores.append(float(logp[x] - logp[y]))
        assert f.mean_score.value == pytest.approx(np.mean(scores), abs=1e-4), option
