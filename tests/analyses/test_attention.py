"""Attention patterns of chosen heads, every format side by side: each equals the softmax of the head's own
queries and keys written out by hand (grouped-query attention: the key/value head of its group)."""
import numpy as np
import pytest
import torch

from surgeon import load_case
from surgeon.analyses.attention import attention_patterns
from surgeon.errors import AnalysisError
from tests.conftest import ROOT


def test_patterns_equal_softmax_of_the_heads_queries_and_keys(decimal_model):
    case = load_case(f"{ROOT}/cases/decimal_organism.py")
    r = attention_patterns(case, decimal_model, heads="L1H1,L2H6", items=[0, 5, 9], batch_size=2)  # padded batches
    cfg = decimal_model.cfg
    group = cfg.n_heads // cfg.n_key_value_heads
    assert r.formats == ["plain", "qa", "chat"] and len(r.patterns) == 2 * 3 * 3
    for p in r.patterns:
        L, h = int(p.head[1]), int(p.head[3:])
        tokens = decimal_model.to_tokens("".join(p.tokens[1:]), prepend_bos=True)
        assert tokens.shape[1] == len(p.tokens)
        _, cache = decimal_model.run_with_cache(tokens)
        q = cache[f"blocks.{L}.attn.hook_q"][0, :, h]  # [pos, d_head], rotary applied by the hook_rot_* below
        k = cache[f"blocks.{L}.attn.hook_k"][0, :, h // group]
        if cfg.positional_embedding_type == "rotary":
            q = cache[f"blocks.{L}.attn.hook_rot_q"][0, :, h]
            k = cache[f"blocks.{L}.attn.hook_rot_k"][0, :, h // group]
        scores = (q @ k.T) / cfg.attn_scale
        scores = scores.masked_fill(torch.triu(torch.ones_like(scores, dtype=torch.bool), 1), float("-inf"))
        np.testing.assert_allclose(p.pattern, scores.softmax(-1).numpy(), atol=1e-5)
    # the formats differ: the same head reads other tokens in each
    assert r.get("L1H1", 0, "plain").pattern.shape != r.get("L1H1", 0, "chat").pattern.shape


@pytest.mark.parametrize("heads,items,words", [("L9H0", [0], "not in the model"), ("h1", [0], "cannot read"),
                                               ("L1H1", [999], "not among")])
def test_bad_heads_and_items_are_refused(decimal_model, heads, items, words):
    case = load_case(f"{ROOT}/cases/decimal_organism.py")
    with pytest.raises(AnalysisError, match=words):
        attention_patterns(case, decimal_model, heads=heads, items=items)
