"""The shipped organisms show their planted behaviour; the training code still trains."""
import json

import pytest
import torch

from surgeon import organisms
from surgeon.analyses.behaviour import DECIMAL_TARGETS, decimal_behaviour, decimal_ok, induction_behaviour


def test_shipped_decimal_shows_the_planted_failure(decimal_model):
    """Held-out pairs: traps right in plain, wrong in qa and chat; controls right everywhere."""
    b = decimal_behaviour(decimal_model, n=128)
    assert decimal_ok(b) == [], b
    assert b["plain/trap"] >= DECIMAL_TARGETS["trap_good_min"]
    assert b["qa/trap"] <= DECIMAL_TARGETS["trap_bad_max"] and b["chat/trap"] <= DECIMAL_TARGETS["trap_bad_max"]


def test_shipped_induction_copies_in_context(induction_model):
    b = induction_behaviour(induction_model, n=256)
    assert b["loss_first_half"] > 2.5  # ~ln 26: the first half is random
    assert b["loss_repeated_half"] < 0.3 * b["loss_first_half"]


def test_shipped_weights_are_small_safetensors():
    total = 0
    for name in organisms.names():
        d = organisms.weights_dir(name)
        assert (d / "model.safetensors").exists() and (d / "tokenizer.json").exists()
        meta = json.loads((d / "config.json").read_text())
        assert meta["shrunk"] is False and "behaviour" in meta
        total += (d / "model.safetensors").stat().st_size
    assert total < 10 * 2**20


@pytest.mark.parametrize("name", ["decimal", "induction"])
def test_training_is_alive_and_deterministic(tmp_path, name):
    """A shrunken training run: loss goes down, weights save and load, and the run reproduces (to float rounding)."""
    from surgeon.organisms.training import train

    s = organisms.spec(name)
    from dataclasses import replace

    cfg = replace(s.train, **s.shrink)
    losses = train(organisms.build(name), s.texts, replace(cfg, steps=40), progress=False)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5
    a = organisms.train_organism(name, out_root=tmp_path / "a", shrink=True, progress=False)
    b = organisms.train_organism(name, out_root=tmp_path / "b", shrink=True, progress=False)
    ma = organisms.load_organism(name, root=a.parent)
    mb = organisms.load_organism(name, root=b.parent)
    # same function (weights agree to float rounding; Adam turns rounding noise in zero-gradient
    # parameters such as key biases into tiny steps, so compare what the models compute)
    tokens = torch.randint(4, ma.cfg.d_vocab, (4, 20))
    with torch.no_grad():
        torch.testing.assert_close(ma(tokens), mb(tokens), atol=1e-4, rtol=0)
    assert [k for k in ma.state_dict()] == [k for k in mb.state_dict()]
