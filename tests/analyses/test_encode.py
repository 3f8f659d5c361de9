"""`surgeon.encode`: what the engine runs, shown. Checked against the tokenizer called directly, against a plain
forward pass that reproduces diagnose's scores from the rows it gives, and against the alignment's definition."""
import numpy as np
import torch

import surgeon
from surgeon.cli import main


def test_the_rows_are_the_tokenizers_and_reproduce_the_scores(decimal_model):
    case = surgeon.load_case("decimal_organism")
    e = surgeon.encode(case, decimal_model, items=[0, 70])
    d = surgeon.diagnose(case, decimal_model)
    tok = decimal_model.tokenizer
    for i in (0, 70):
        it = case.items[i]
        for fmt in case.formats:
            rows = [r for r in e.rows if r.item == i and r.format == fmt]
            assert {r.answer for r in rows} == {"correct", "incorrect"}
            prompt = case.formats[fmt].format(**it.values)
            for r in rows:
                answer = it.correct if r.answer == "correct" else it.incorrect
                ids = [tok.bos_token_id] + tok(prompt + answer, add_special_tokens=False)["input_ids"]
                assert r.tokens == ids[:-1] and r.strings == [tok.decode([t]) for t in r.tokens]  # the last is predicted
                assert r.n_prompt == 1 + len(tok(prompt, add_special_tokens=False)["input_ids"])
                for p, t, s in r.targets:  # each scored position predicts the next token of the answer
                    assert ids[p + 1] == t and s == (1.0 if r.answer == "correct" else -1.0)
            # one plain forward per row gives the item's score in this format: sum of sign * log P(target)
            score = 0.0
            for r in rows:
                with torch.no_grad():
                    logp = decimal_model(torch.tensor([r.tokens])).log_softmax(-1)[0]
                score += sum(s * float(logp[p, t]) for p, t, s in r.targets)
            want = next(x for x in d.per_item if x["item"] == i)["score"][fmt]
            assert abs(score - want) < 1e-4, (i, fmt, score, want)
    # align="last": the failing row's last prompt token and its continuation, matched in order to the good row's
    for r in e.rows:
        if r.role == "bad":
            good = next(g for g in e.rows if g.item == r.item and g.format == e.good and g.answer == r.answer)
            assert r.pairs == list(zip(range(r.n_prompt - 1, len(r.tokens)), range(good.n_prompt - 1, len(good.tokens))))
    df = e.to_pandas()
    assert len(df) == sum(len(r.tokens) + len(r.targets) - len({p for p, _, _ in r.targets}) for r in e.rows)
    assert set(df.columns) >= {"item", "format", "row", "position", "token_id", "token", "scores_token_id",
                               "patched_from"}
    scored = df.dropna(subset=["scores_token_id"])
    assert len(scored) == sum(len(r.targets) for r in e.rows)
    assert np.array_equal(df[df.format == "qa"].patched_from.dropna().astype(int).to_numpy(),
                          np.concatenate([[g for _, g in r.pairs] for r in e.rows if r.format == "qa"]))


def test_the_command_prints_the_rows(capsys):
    assert main(["encode", "--items", "0", "--bad", "qa"]) == 0
    out = capsys.readouterr().out
    assert "item 0 (trap) qa (bad), the correct answer's row" in out and "patched from 'plain': 37<-39" in out


def test_a_position_that_scores_both_answers_keeps_both_in_the_frame(decimal_model):
    """First-token scoring reads the correct and the incorrect token at one position: the frame has both."""
    import dataclasses

    import surgeon.api

    case = dataclasses.replace(surgeon.api.read("decimal_organism"), score="first_token")
    e = surgeon.encode(case, decimal_model, items=[0], bad="qa")
    df = e.to_pandas()
    for r in e.rows:
        want = sorted((p, t, s) for p, t, s in r.targets)
        got = df[(df.format == r.format) & (df.row == r.answer)].dropna(subset=["scores_token_id"])
        assert sorted(zip(got.position, got.scores_token_id.astype(int), got.sign)) == want
        assert len(want) == 2 and want[0][0] == want[1][0] and {s > 0 for *_, s in want} == {True, False}
