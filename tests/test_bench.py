"""The benches' own machinery: the careful TransformerLens baseline computes what a full forward computes, and every
saved bench output says which commit and which engine sources it ran on."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

sys.path.insert(0, str(Path(ROOT) / "bench"))
from careful import prefix_cache, repeated, suffix_residual  # noqa: E402
from saving import ENGINE, RESULTS, engine_sha256  # noqa: E402


@pytest.mark.parametrize("start", [0, 1, 2])
def test_the_careful_baseline_equals_the_full_patched_forward(decimal_model, start):
    """Prefix in a frozen KV cache, layers below `start` skipped, three patches in the batch: each copy's logits at the
    suffix equal one full forward with the same hook (written directly, without the cache)."""
    model = decimal_model
    g = torch.Generator().manual_seed(0)
    toks = torch.randint(3, model.cfg.d_vocab, (4, 12), generator=g)
    p, H = 7, 3
    src = torch.randn(H, 4, model.cfg.d_head, generator=g)
    name = f"blocks.{start}.attn.hook_z"
    with torch.no_grad():
        kv = prefix_cache(model, toks[:, :p])
        resid = suffix_residual(model, toks[:, p:], kv, start).repeat(H, 1, 1)

        def batched(z, hook):
            for h in range(H):
                z.view(H, 4, *z.shape[1:])[h, :, 0, h] = src[h]
            return z

        with model.hooks(fwd_hooks=[(name, batched)]):
            got = model(resid, start_at_layer=start, past_kv_cache=repeated(kv, H)).view(H, 4, 12 - p, -1)
        for h in range(H):
            def one(z, hook, h=h):
                z[:, p, h] = src[h]
                return z

            want = model.run_with_hooks(toks, fwd_hooks=[(name, one)])[:, p:]
            torch.testing.assert_close(got[h], want, atol=1e-4, rtol=1e-4)
        # and the cut is not vacuous: an unpatched copy differs from a patched one
        plain = model(toks)[:, p:]
        assert (got[0] - plain).abs().max() > 1e-3


def test_every_saved_bench_output_says_what_it_ran_on():
    txts = sorted(RESULTS.glob("*.txt"))
    assert {t.stem for t in txts} >= {"patch_sweep", "subset_search", "edges", "scale", "startup"}
    for t in txts:
        run = json.loads(t.with_suffix(".json").read_text())["run"]
        assert len(run["commit"]) == 40 and len(run["engine_sha256"]) == 64, t.name
        assert run["date"][:2] == "20", t.name


def test_the_engine_hash_sees_every_engine_and_site_source(tmp_path):
    for folder in ENGINE:
        shutil.copytree(Path(ROOT) / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert engine_sha256(tmp_path) == engine_sha256()
    for folder in ENGINE:
        f = sorted((tmp_path / folder).rglob("*.py"))[-1]
        before = engine_sha256(tmp_path)
        f.write_text(f.read_text() + "\n")
        assert engine_sha256(tmp_path) != before, f
