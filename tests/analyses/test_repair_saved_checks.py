"""A saved repair is read whole or refused with what is wrong (never applied half-right), is applied only to the
weights it was built on unless asked, is never applied twice at once, and runs on half-precision models."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import surgeon
from surgeon.errors import SurgeonError
from surgeon.repairs.artifact import read_repair
from tests.conftest import ROOT

DECIMAL = f"{ROOT}/cases/decimal_organism.py"
HOOK = "blocks.0.attn.hook_z"


@pytest.fixture(scope="module")
def built(decimal_model, tmp_path_factory):
    r = surgeon.repair(DECIMAL, decimal_model, heads="L0H4,L0H6", mode="steer")
    out = tmp_path_factory.mktemp("saved") / "rep"
    r.repair.save(out)
    return r, out


def _meta(d, f):
    m = json.loads((d / "repair.json").read_text())
    m = f(m)
    (d / "repair.json").write_text(json.dumps(m))


def _tensor(d, f):
    v = load_file(str(d / "repair.safetensors"))
    save_file({k: f(t).contiguous() for k, t in v.items()}, str(d / "repair.safetensors"))


def _slot_value(t, x):
    t = t.clone()
    t[0, 4, 0] = x
    return t


CORRUPT = {
    "truncated": (lambda d: (d / "repair.safetensors").write_bytes((d / "repair.safetensors").read_bytes()[:50]),
                  "holds no repair"),
    "garbage json": (lambda d: (d / "repair.json").write_text("{not json"), "holds no repair"),
    "a json list": (lambda d: (d / "repair.json").write_text("[1, 2]"), "JSON list"),
    "no heads": (lambda d: _meta(d, lambda m: {k: v for k, v in m.items() if k != "heads"}), "no 'heads'"),
    "strength abc": (lambda d: _meta(d, lambda m: {**m, "strength": "abc"}), "strength 'abc'"),
    "strength nan": (lambda d: (d / "repair.json").write_text(
        (d / "repair.json").read_text().replace('"strength": 1.0', '"strength": NaN')), "strength nan"),
    "units out of range": (lambda d: _meta(d, lambda m: {**m, "units": {HOOK: [4, 99]}}), "outside its"),
    "units edited": (lambda d: _meta(d, lambda m: {**m, "units": {HOOK: [4]}, "heads": ["L0H4"]}),
                     "units it does not name"),
    "heads relabelled": (lambda d: _meta(d, lambda m: {**m, "heads": ["L0H4", "L0H7"]}), "relabelled"),
    "nan values": (lambda d: _tensor(d, lambda t: _slot_value(t, float("nan"))), "NaN"),
    "int32 values": (lambda d: _tensor(d, lambda t: t.to(torch.int32)), "int32"),
    "0 slots": (lambda d: _tensor(d, lambda t: t[:0]), "slots >= 1"),
    "unknown mode": (lambda d: _meta(d, lambda m: {**m, "mode": "swap"}), "mode 'swap'"),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_a_corrupted_saved_repair_is_refused_with_what_is_wrong(built, tmp_path, name):
    _, out = built
    d = tmp_path / "rep"
    shutil.copytree(out, d)
    read_repair(d)  # whole before it is corrupted
    corrupt, phrase = CORRUPT[name]
    corrupt(d)
    with pytest.raises(SurgeonError) as e:
        read_repair(d)
    assert phrase in str(e.value) and e.value.field == "repair", str(e.value)


def test_the_cli_refuses_a_corrupted_repair_before_the_model_loads(built, tmp_path, capsys):
    from tests.cli.test_reliability import refused

    _, out = built
    d = tmp_path / "rep"
    shutil.copytree(out, d)
    _meta(d, lambda m: {**m, "heads": ["L0H4", "L0H7"]})
    refused(capsys, ["repair", "--from", str(d), DECIMAL, "--model", "no/such/model"], "relabelled")


def test_a_repair_is_applied_only_to_the_weights_it_was_built_on(decimal_model, built):
    r, out = built
    import copy

    other = copy.deepcopy(decimal_model)
    with torch.no_grad():
        other.blocks[1].mlp.W_out.mul_(1.01)  # same shape, other weights
    with pytest.raises(SurgeonError) as e:
        with surgeon.apply(other, out):
            pass
    assert "other weights" in str(e.value) and "any_model=True" in str(e.value)
    with pytest.raises(SurgeonError):
        surgeon.measure(out, DECIMAL, other)
    with surgeon.apply(other, out, any_model=True):  # on purpose: allowed
        pass
    with surgeon.apply(decimal_model, out):  # its own weights
        pass


def test_a_repair_applied_inside_another_is_refused_not_doubled(decimal_model, built):
    _, out = built
    tokens = decimal_model.to_tokens(["Q: Which is bigger: 9.11 or 9.8?\nA:"])
    with surgeon.apply(decimal_model, out, last="end"):
        once = decimal_model(tokens)
        with pytest.raises(SurgeonError) as e:
            with surgeon.apply(decimal_model, out, last="end"):
                pass
        assert "already applied" in str(e.value)
        torch.testing.assert_close(decimal_model(tokens), once)  # the refused one left nothing behind
    with surgeon.apply(decimal_model, out, last="end"):  # and the outer one let go
        torch.testing.assert_close(decimal_model(tokens), once)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_repair_builds_and_measures_on_a_half_precision_model(dtype):
    """Constants, masks and the model's activations meet in the model's dtype (an index_put of float32 into a half
    activation raised before): the repair's held-out efficacy is float32's to within a few items."""
    full = surgeon.repair(DECIMAL, heads="L0H4,L0H6")
    half = surgeon.repair(DECIMAL, heads="L0H4,L0H6", dtype=dtype)
    assert [(r.measure, r.format, r.tag) for r in full.held_out] == [(r.measure, r.format, r.tag) for r in half.held_out]
    for a, b in zip(full.held_out, half.held_out):
        assert abs(a.repaired.value - b.repaired.value) <= 0.1, (a, b)
