"""Models that the engine cannot run exactly are refused before any work, and the context check counts what the
model is actually fed."""
import pytest
import torch

import surgeon
from surgeon import Case, Item
from surgeon.errors import ModelError
from tests.conftest import tiny_model
from tests.cli_in_process import surgeon as surgeon_cli


def _case(prompt: str, answers=(" x", " y")):
    return Case(name="fit", formats={"good": "G" + prompt, "bad": "B" + prompt}, good="good", bad="bad",
                items=[Item({"a": "ab"}, correct=answers[0], incorrect=answers[1]),
                       Item({"a": "cd"}, correct=answers[0], incorrect=answers[1])])


def test_an_attention_direction_the_engine_cannot_run_is_refused_before_any_work(charset):
    """Causal and bidirectional attention both run exactly (tests/engine/test_bidirectional.py); a direction the
    engine does not know is refused with one message naming the field, by the analyses and the engine alike."""
    model = tiny_model(charset)
    model.cfg.attention_dir = "sideways"
    with pytest.raises(ModelError, match="sideways") as e:
        surgeon.diagnose(_case(" {a}:"), model)
    assert e.value.field == "attention_dir" and "bidirectional" in e.value.fix
    from surgeon.engine.readout import score_rows
    from surgeon.case.encoding import encode_rows

    rows = encode_rows("G {a}:", _case(" {a}:").items, charset, True)
    with pytest.raises(ModelError, match="sideways"):  # the engine itself refuses too
        score_rows(model, rows)


def test_the_context_check_counts_the_tokens_fed(charset):
    """A prompt of n_ctx tokens with a one-token answer is fed n_ctx tokens (the answer is only predicted): it fits.
    One more prompt token does not, and the message counts what is fed."""
    from surgeon.models.checks import check_case_against_model

    model = tiny_model(charset, n_ctx=8)
    fits = _case(" {a}:--", ("x", "y"))  # BOS + "G ab:--": 8 tokens; the one-token answer is predicted, not fed
    from surgeon.case.encoding import encode_rows

    rows = encode_rows(fits.formats["good"], fits.items, charset, True)
    assert max(len(r.tokens) for r in rows) == 8 == rows[0].n_prompt
    check_case_against_model(fits, model)  # was refused: "10 tokens with its answer"
    long = _case(" {a}:---", ("x", "y"))
    with pytest.raises(surgeon.errors.CaseError, match="context of 8") as e:
        check_case_against_model(long, model)
    assert "feeds the model 9 tokens" in e.value.message and e.value.field.startswith("items[")


def save_tl_checkpoint(model, path):
    """A TransformerLens model shared as tracr / InterpBench / toy models are: config JSON, safetensors, tokenizer."""
    import json

    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.cfg.to_dict(), default=str))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    model.tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_a_transformer_lens_checkpoint_folder_loads_and_runs_from_the_cli(charset, tmp_path):
    """--model takes a TransformerLens checkpoint folder: the same up-front checks as the other routes, the same
    scores as the model in memory."""

    from surgeon.models.loading import load_model, resolve, shape
    from tests.conftest import ROOT

    model = tiny_model(charset)
    folder = save_tl_checkpoint(model, tmp_path / "toy")
    ref = resolve(str(folder))
    assert ref.kind == "tl" and shape(ref).n_layers == model.cfg.n_layers
    loaded = load_model(str(folder))
    for (n, a), (_, b) in zip(sorted(model.state_dict().items()), sorted(loaded.state_dict().items())):
        assert torch.equal(a, b), n
    case = _case(" {a}:")
    d1, d2 = surgeon.diagnose(case, model), surgeon.diagnose(case, str(folder))
    assert d1.get("good").score.value == pytest.approx(d2.get("good").score.value, abs=1e-6)
    case_file = tmp_path / "toy_case.py"
    case_file.write_text("from surgeon import Case, Item\ncase = Case(name='toy', formats={'good': 'G {a}:', "
                         "'bad': 'B {a}:'}, good='good', bad='bad', items=[Item({'a': 'ab'}, ' x', ' y'), "
                         "Item({'a': 'cd'}, ' x', ' y')])\n")
    r = surgeon_cli(["diagnose", str(case_file), "--model", str(folder)], cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "good" in r.stdout and "Traceback" not in r.stderr
    # a tracr-style bidirectional TransformerLens checkpoint runs from the command line, scoring as in memory
    from tests.engine.test_bidirectional import tracr_style

    tracr = tracr_style(charset)
    bi = save_tl_checkpoint(tracr, tmp_path / "bi")
    r = surgeon_cli(["diagnose", str(case_file), "--model", str(bi)], cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    d = surgeon.diagnose(case, str(bi))  # the folder from Python: its scores, as the model in memory gives them
    assert d.get("good").score.value == pytest.approx(surgeon.diagnose(case, tracr).get("good").score.value, rel=1e-6)
    assert "accuracy" in r.stdout
    r = surgeon_cli(["patch", str(case_file), "--model", str(bi)], cwd=ROOT)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    # weights that do not match the config
    (folder / "config.json").write_text((folder / "config.json").read_text().replace('"d_mlp": 128', '"d_mlp": 64'))
    with pytest.raises(ModelError, match="does not match"):
        load_model(str(folder))
