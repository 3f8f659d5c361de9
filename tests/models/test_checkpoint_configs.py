"""TransformerLens checkpoint folders that cannot be what they claim: each refused with one message naming the
field, before any weight loads where the config alone shows it (issue 50, items 4-7)."""
import json

import pytest
import torch

import surgeon
from surgeon.errors import CaseError, ModelError
from surgeon.models.loading import load_model, resolve
from tests.conftest import tiny_model
from tests.models.test_fit import _case, save_tl_checkpoint


@pytest.fixture
def folder(charset, tmp_path):
    return save_tl_checkpoint(tiny_model(charset), tmp_path / "toy")


def _edit_config(folder, change):
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))


def _no_weights(monkeypatch):
    import safetensors.torch

    def load_file(*a, **kw):
        raise AssertionError("weights read before the config was checked")

    monkeypatch.setattr(safetensors.torch, "load_file", load_file)


@pytest.mark.parametrize("change,field,words", [
    (lambda c: c.pop("n_ctx"), "n_ctx", "has no 'n_ctx'"),
    (lambda c: c.pop("d_head"), "d_head", "has no 'd_head'"),
    (lambda c: c.update(n_heads="2"), "n_heads", "'2', not a positive integer"),
    (lambda c: c.update(n_layers=0), "n_layers", "0, not a positive integer"),
    (lambda c: c.update(model_type="gpt2"), "model_type", "neither kind"),
])
def test_a_config_that_cannot_be_a_transformer_lens_one_names_its_field(folder, monkeypatch, change, field, words):
    _edit_config(folder, change)
    with pytest.raises(ModelError) as e:
        resolve(str(folder))
    assert e.value.field == field and words in e.value.message and e.value.fix, str(e.value)
    _no_weights(monkeypatch)
    with pytest.raises(CaseError) as e:  # from Python, with the case: before the weights
        surgeon.diagnose(_case(" {a}:"), str(folder))
    assert words in e.value.message and "Traceback" not in str(e.value)


def test_n_heads_left_out_is_d_model_over_d_head_as_transformer_lens_computes_it(folder, charset):
    _edit_config(folder, lambda c: c.pop("n_heads"))
    model = load_model(str(folder))
    assert model.cfg.n_heads == tiny_model(charset).cfg.n_heads


def test_an_unknown_attention_direction_is_refused_from_its_config(charset, tmp_path, monkeypatch):
    """Before any weight loads: a folder whose config says an attention direction the engine cannot run."""
    import json

    bi = save_tl_checkpoint(tiny_model(charset), tmp_path / "odd")
    cfg = json.loads((bi / "config.json").read_text())
    cfg["attention_dir"] = "sideways"
    (bi / "config.json").write_text(json.dumps(cfg))
    _no_weights(monkeypatch)
    with pytest.raises(CaseError, match="sideways"):
        surgeon.diagnose(_case(" {a}:"), str(bi))


def test_integer_weights_are_refused_not_truncated(folder):
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    state["blocks.0.attn.W_Q"] = (state["blocks.0.attn.W_Q"] * 100).to(torch.int32)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ModelError) as e:
        load_model(str(folder))
    assert "blocks.0.attn.W_Q" in e.value.message and "torch.int32" in e.value.message and "truncated" in e.value.message
