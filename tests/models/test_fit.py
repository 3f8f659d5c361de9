"""Models that the engine cannot run exactly are refused before any work, and the context check counts what the
model is actually fed."""
import pytest

import surgeon
from surgeon import Case, Item
from surgeon.errors import ModelError
from tests.conftest import tiny_model


def _case(prompt: str, answers=(" x", " y")):
    return Case(name="fit", formats={"good": "G" + prompt, "bad": "B" + prompt}, good="good", bad="bad",
                items=[Item({"a": "ab"}, correct=answers[0], incorrect=answers[1]),
                       Item({"a": "cd"}, correct=answers[0], incorrect=answers[1])])


def test_bidirectional_attention_is_refused_before_any_work(charset):
    """Right padding, cutting rows after the last read position, merged rows and shared prefixes are exact only for
    causal attention: a bidirectional model (which reads the pad after each row) is refused with one message."""
    model = tiny_model(charset, attention_dir="bidirectional")
    with pytest.raises(ModelError, match="bidirectional") as e:
        surgeon.diagnose(_case(" {a}:"), model)
    assert e.value.field == "model" and "causal" in e.value.fix
    from surgeon.engine.contrast import score_rows
    from surgeon.spec.encoding import encode_rows

    rows = encode_rows("G {a}:", _case(" {a}:").items, charset, True)
    with pytest.raises(ModelError, match="bidirectional"):  # the engine itself refuses too
        score_rows(model, rows)


def test_the_context_check_counts_the_tokens_fed(charset):
    """A prompt of n_ctx tokens with a one-token answer is fed n_ctx tokens (the answer is only predicted): it fits.
    One more prompt token does not, and the message counts what is fed."""
    from surgeon.models.checks import check_case_against_model

    model = tiny_model(charset, n_ctx=8)
    fits = _case(" {a}:--", ("x", "y"))  # BOS + "G ab:--": 8 tokens; the one-token answer is predicted, not fed
    from surgeon.spec.encoding import encode_rows

    rows = encode_rows(fits.formats["good"], fits.items, charset, True)
    assert max(len(r.tokens) for r in rows) == 8 == rows[0].n_prompt
    check_case_against_model(fits, model)  # was refused: "10 tokens with its answer"
    long = _case(" {a}:---", ("x", "y"))
    with pytest.raises(surgeon.errors.CaseError, match="context of 8") as e:
        check_case_against_model(long, model)
    assert "feeds the model 9 tokens" in e.value.message and e.value.field.startswith("items[")
