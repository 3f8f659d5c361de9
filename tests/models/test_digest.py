"""`model_digest`: sha256 over a model's config and every parameter's name, dtype, shape and bytes, the key every
cache and saved repair holds for the weights. Checked against that definition written here with hashlib, computed
once per model object and weights (a Llama-3.1-8B took 40 s a call on a GPU machine, and a repair called it on every
build, apply and report step), and computed again on every change of the weights, including one that bypasses
the version counter."""
import copy
import hashlib
import json

import pytest
import torch

import surgeon.models.loading as loading
from surgeon.models.loading import model_digest


def _by_hand(model) -> str:
    h = hashlib.sha256()
    cfg = model.cfg.to_dict()
    h.update(json.dumps({k: v for k, v in cfg.items() if k not in ("device", "n_devices")}, sort_keys=True,
                        default=str).encode())
    for name, w in model.named_parameters():
        t = w.detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.fixture
def model(random_model):
    return copy.deepcopy(random_model)


@pytest.fixture
def full_digests(monkeypatch):
    calls = []
    inner = loading._full_digest

    def counted(*a):
        calls.append(1)
        return inner(*a)

    monkeypatch.setattr(loading, "_full_digest", counted)
    return calls


def test_the_digest_is_sha256_over_the_config_and_every_parameter(model):
    assert model_digest(model) == _by_hand(model)
    half = copy.deepcopy(model).to(torch.bfloat16)
    assert model_digest(half) == _by_hand(half) != model_digest(model)


def test_computed_once_per_model_and_weights(model, full_digests):
    d = model_digest(model)
    assert model_digest(model) == d and len(full_digests) == 1
    other = copy.deepcopy(model)  # another object, the same weights: computed for it, the same digest
    assert model_digest(other) == d and len(full_digests) == 2


@pytest.mark.parametrize("edit", ["no_grad", "data", "swap", "replace"])
def test_every_change_of_the_weights_is_seen(model, full_digests, monkeypatch, edit):
    """An edit through the version counter, one through `.data` (which bypasses it), two entries of one matrix
    swapped in different blocks of the checksum (its sums unchanged), a parameter replaced: each gives the digest
    of the edited weights."""
    monkeypatch.setattr(loading, "_CHUNK", 4096)  # several chunks and blocks, and a remainder, on a small model
    before = model_digest(model)
    w = dict(model.named_parameters())["blocks.0.attn.W_Q"]
    with torch.no_grad():
        if edit == "no_grad":
            w.mul_(1.5)
        elif edit == "data":
            w.data.add_(0.25)
        elif edit == "swap":
            flat = w.data.view(-1)
            a, b = flat[3].clone(), flat[flat.numel() - 5].clone()
            assert a != b
            flat[3], flat[flat.numel() - 5] = b, a
        else:
            model.blocks[0].attn.W_Q = torch.nn.Parameter(w.detach() * 2)
    after = model_digest(model)
    assert after != before and after == _by_hand(model) and len(full_digests) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the pinned transfer path)")
def test_a_cuda_model_has_its_host_copy_s_digest(model, monkeypatch):
    monkeypatch.setattr(loading, "_COPY", 1000)  # several blocks through the pinned buffer
    assert model_digest(copy.deepcopy(model).cuda()) == _by_hand(model)
