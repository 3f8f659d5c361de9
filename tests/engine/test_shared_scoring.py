"""Clean scoring with shared prefixes (`score_rows(share_prefixes=True)`, what `surgeon scan` runs): rows that share a
long token prefix (few-shot examples, an instruction) are batched together and the prefix runs once per batch. Checked
against each row run alone through plain TransformerLens (`tests.reference.clean_scores`), on a model with learned
positions and one with rotary positions and grouped-query attention, at several batch sizes; a row scored inside
the common prefix bounds what is shared."""
import pytest
import torch

from surgeon import Item
from surgeon.case.encoding import Row, encode_rows
from surgeon.engine.readout import SHARED_PREFIX, prefix_batches, score_rows
from tests.reference import clean_scores

SHOTS = "Q: 1.5 or 1.25?\nA: 1.5\n"
ITEMS = [Item({"a": a, "b": b}, correct=c, incorrect=d) for a, b, c, d in [
    ("9.8", "9.11", " 9.8", " 9.11"), ("2.4", "2.35", " 2.4", " 2.35"), ("1.2", "1.3", " 1.3", " 1.2"),
    ("5.5", "5.6", " 5.6", " 5.5"), ("7.1", "7.05", " 7.1", " 7.05"), ("6.2", "6.12", " 6.2", " 6.12")]]


def _rows(model):
    """Rows of two few-shot formats (a long shared prefix each), one plain format (little shared), as one list with
    distinct items."""
    out = []
    for k, fmt in enumerate([SHOTS + "Q: {a} or {b}?\nA:", SHOTS + "Question: {a} or {b}?\nAnswer:", "{a} vs {b}:"]):
        rows = encode_rows(fmt, ITEMS, model.tokenizer, True)
        out += [Row(r.item + k * len(ITEMS), r.tokens, r.n_prompt, r.targets, r.anchors) for r in rows]
    return out


@pytest.mark.parametrize("batch_size", [1, 5, 256])
def test_shared_prefix_scores_equal_each_row_run_alone(random_model, batch_size):
    rows = _rows(random_model)
    work = {}
    with torch.no_grad():
        got = score_rows(random_model, rows, batch_size, share_prefixes=True, work=work)
        want = clean_scores(random_model, rows)
    torch.testing.assert_close(got.cpu().float(), want, atol=1e-4, rtol=1e-5)
    if batch_size > 1:  # batches of several rows sharing a prefix: fewer positions run
        shared = [p for _, p in prefix_batches(rows, batch_size) if p]
        assert shared and min(shared) >= len(random_model.tokenizer(SHOTS)["input_ids"])
        assert work["positions"] < 0.7 * work["positions_whole"]


def test_a_score_inside_the_common_prefix_bounds_what_is_shared(random_model):
    """Rows that share 40 tokens, one scored at position 12: the batch shares 12 positions (its score is read from
    the positions run after them), and every score equals the row run alone."""
    tok = random_model.tokenizer
    ids = tok(SHOTS + SHOTS)["input_ids"][:40]
    rows = [Row(i, tuple(ids) + (10 + i, 11, 12), 43, ((41, 20 + i, 1.0), (42, 30, -1.0)), {}) for i in range(5)]
    rows.append(Row(5, tuple(ids) + (40, 41), 42, ((12, 7, 1.0), (41, 9, -1.0)), {}))
    (_, p), = prefix_batches(rows, 256)
    assert p == 12 >= SHARED_PREFIX
    with torch.no_grad():
        got = score_rows(random_model, rows, 256, share_prefixes=True)
        want = clean_scores(random_model, rows)
    torch.testing.assert_close(got.cpu().float(), want, atol=1e-4, rtol=1e-5)


def test_nothing_is_shared_unless_asked_or_where_little_is_common(random_model):
    rows = _rows(random_model)
    plain = [r for r in rows if r.item >= 2 * len(ITEMS)]
    assert all(p == 0 for _, p in prefix_batches(plain, 256))
    work = {}
    score_rows(random_model, rows, 256, work=work)
    assert work["positions"] == work["positions_whole"]


def test_a_float64_model_is_scored_in_float64(random_model):
    """A float64 model's clean scores and a KL metric's reference come back in float64, equal to a float64 forward
    run row by row to 1e-12 (they were accumulated into float32 and, for scores, refused: index_add of Double into
    Float)."""
    import copy

    from surgeon.engine.readout import reference_logprobs

    model = copy.deepcopy(random_model).to(torch.float64)
    rows = _rows(model)
    with torch.no_grad():
        got = score_rows(model, rows, 5, share_prefixes=True)
        ref = reference_logprobs(model, rows, 5)
        want = torch.zeros(len(got), dtype=torch.float64)
        want_ref = torch.zeros_like(ref)
        for r in rows:
            logp = model(torch.tensor([r.tokens]))[0].log_softmax(-1)
            want[r.item] += sum(sign * logp[p, t] for p, t, sign in r.targets)
            want_ref[r.item] = logp[r.targets[0][0]]
    assert got.dtype == ref.dtype == torch.float64
    torch.testing.assert_close(got.cpu(), want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(ref.cpu(), want_ref, atol=1e-12, rtol=1e-12)
