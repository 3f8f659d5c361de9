"""Attention sinks and massive activations (issue 54, item 1 in part): the measures against hand-written
TransformerLens hooks over one prompt at a time, and the threshold organism's attention to BOS from its construction
(after '?' each even head puts weight 1 - W_BAD on BOS from the last position; after ':' none)."""
import dataclasses

import numpy as np
import pytest
import torch

import surgeon
import surgeon.api
from surgeon.analyses.sinks import sinks


def _prompt(model, case, fmt, item):
    tok = model.tokenizer
    text = case.formats[fmt].format(**item.values)
    return [tok.bos_token_id] + [tok.convert_tokens_to_ids(c) for c in text]


def test_threshold_organism_sinks_as_constructed(threshold_model):
    from surgeon.organisms import threshold as T

    r = sinks(surgeon.api.read("threshold_organism"), threshold_model)
    qa, plain = r.of("qa"), r.of("plain")
    for h in T.EVEN:
        assert qa.last[0, h] == pytest.approx(1 - T.W_BAD, abs=1e-6)  # y with W_BAD, BOS with the rest
        assert plain.last[0, h] == pytest.approx(0.0, abs=1e-6)  # x alone
    for h in T.ODD:  # the marker itself
        assert qa.last[0, h] == pytest.approx(0.0, abs=1e-6) and plain.last[0, h] == pytest.approx(0.0, abs=1e-6)


def test_decimal_measures_equal_hand_written_hooks(decimal_model):
    case = dataclasses.replace(surgeon.api.read("decimal_organism"), items=surgeon.api.read("decimal_organism").items[:12])
    r = sinks(case, decimal_model, epsilon=0.3, batch_size=5)  # batches of 5: padding must not matter
    L, H = decimal_model.cfg.n_layers, decimal_model.cfg.n_heads
    for fmt in ("plain", "chat"):
        mass, last, ratio, top = np.zeros((L, H)), np.zeros((L, H)), np.zeros(L), np.zeros(L)
        with torch.no_grad():
            for it in case.items:
                ids = _prompt(decimal_model, case, fmt, it)
                _, cache = decimal_model.run_with_cache(torch.tensor([ids]))
                for layer in range(L):
                    A = cache[f"blocks.{layer}.attn.hook_pattern"][0]  # [head, query, key]
                    for h in range(H):
                        mass[layer, h] += float(sum(A[h, q, 0] for q in range(1, len(ids))) / (len(ids) - 1))
                        last[layer, h] += float(A[h, len(ids) - 1, 0])
                    x = cache[f"blocks.{layer}.hook_resid_post"][0]
                    n = x.norm(dim=-1)
                    ratio[layer] += float(n[0] / n[1:].median())
                    top[layer] = max(top[layer], float(x.abs().max()))
        k = len(case.items)
        got = r.of(fmt)
        np.testing.assert_allclose(got.mass, mass / k, atol=1e-6)
        np.testing.assert_allclose(got.last, last / k, atol=1e-6)
        np.testing.assert_allclose([e.value for e in got.first_norm_ratio], ratio / k, rtol=1e-5)
        np.testing.assert_allclose([m["value"] for m in got.massive], top, rtol=1e-6)
        assert got.sink_rate.value == float((mass / k > 0.3).mean())
    # a mutation that reads the wrong key (position 1) or leaves the first query in gives other numbers
    assert not np.allclose(r.of("plain").mass, r.of("plain").other_mass)


def test_cli_sinks_saves_and_refuses_a_bad_epsilon(tmp_path):
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "surgeon", "sinks", "--epsilon", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--epsilon" in bad.stderr and "Traceback" not in bad.stderr
    ok = subprocess.run([sys.executable, "-m", "surgeon", "sinks", "--out", str(tmp_path / "s")], capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stderr
    r = surgeon.load(tmp_path / "s")
    assert [f.format for f in r.formats] == ["plain", "qa", "chat"] and "sink rate" in ok.stdout
