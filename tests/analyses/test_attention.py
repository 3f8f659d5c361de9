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


def test_the_patterns_reach_the_scored_position(decimal_model):
    """The last query is the position whose logits the metric reads (`surgeon.encode`'s first scored position):
    the prompt, then the answers' common prefix."""
    import surgeon

    case = load_case(f"{ROOT}/cases/decimal_organism.py")
    r = attention_patterns(case, decimal_model, heads="L1H2", items=[0, 3])
    e = surgeon.encode(case, decimal_model, tag=None, items=[0, 3])
    for p in r.patterns:
        row = next(x for x in e.rows if x.item == p.item and x.format == p.format and x.answer == "correct")
        first = min(t[0] for x in e.rows if x.item == p.item and x.format == p.format for t in x.targets)
        assert p.scored == first == len(p.tokens) - 1 and p.tokens == row.strings[:first + 1]
        assert p.scored >= row.n_prompt  # past the prompt: the answers share a prefix here (" 13.")


@pytest.mark.slow
def test_the_interactive_view_shades_keys_by_the_hovered_querys_weights(decimal_model, tmp_path):
    """In a real browser: the view opens on the scored position; hovering a token makes it the query and every key is
    shaded by that query's weight (as the result holds it), in every cell."""
    from selenium.webdriver.common.action_chains import ActionChains

    from tests.browser import browser

    case = load_case(f"{ROOT}/cases/decimal_organism.py")
    r = attention_patterns(case, decimal_model, heads="L0H6,L1H2", items=[0])
    page = tmp_path / "attn.html"
    page.write_text("<!DOCTYPE html><html><body>" + r._repr_html_() + "</body></html>")
    b = browser()
    try:
        b.get(page.resolve().as_uri())
        assert not [x for x in b.get_log("browser") if x["level"] == "SEVERE"]
        cells = b.find_elements("css selector", "td.attn-cell")
        assert len(cells) == len(r.patterns)
        weights = lambda cell: [float(t.get_attribute("data-weight"))  # noqa: E731
                                for t in cell.find_elements("css selector", ".tok")]
        for cell in cells:
            p = r.patterns[int(cell.get_attribute("data-panel"))]
            np.testing.assert_allclose(weights(cell), p.pattern[p.scored], atol=1e-4)  # opens on the scored query
        cell = cells[-1]
        p = r.patterns[int(cell.get_attribute("data-panel"))]
        q = 20
        ActionChains(b).move_to_element(cell.find_elements("css selector", ".tok")[q]).perform()
        np.testing.assert_allclose(weights(cell), np.where(np.arange(len(p.tokens)) <= q, p.pattern[q], 0), atol=1e-4)
        assert f"query {q}:" in cell.find_element("css selector", ".note").text
    finally:
        b.quit()
