"""The intervention core against slow references and TransformerLens's own patching utilities."""
import pytest
import torch
from transformer_lens import patching

from surgeon.engine.contrast import Contrast
from surgeon.errors import AnalysisError
from surgeon.sites.nodes import Site
from surgeon.case.case import Item
from surgeon.case.encoding import encode_rows
from tests.reference import clean_scores, direct_patch_scores

ITEMS = [Item({"a": a, "b": b}, correct=c, incorrect=d) for a, b, c, d in [
    ("9.8", "9.11", " 9.8", " 9.11"),  # multi-token answers of different length
    ("3.4", "3.25", " 3.4", " 3.25"),
    ("1.2", "1.3", " 1.3", " 1.2"),  # single differing token after the common prefix
    ("5.5", "5.6", " 5.6", " 5.5"),
    ("12.5", "2.5", " 12.5", " 2.5"),  # answers of different length after a shared space
]]
SHORT, LONG = "A {a} vs {b}?", "Question: is {a} more than {b}? Answer:"


def rows(model, fmt, items=ITEMS):
    return encode_rows(fmt, items, model.tokenizer, True)


def test_zero_mask_is_clean_and_clean_matches_direct(random_model):
    b, s = rows(random_model, LONG), rows(random_model, SHORT)
    c = Contrast(random_model, b, s, "last", batch_size=7)
    torch.testing.assert_close(c.clean_base, clean_scores(random_model, b), atol=1e-4, rtol=0)
    torch.testing.assert_close(c.clean_source, clean_scores(random_model, s), atol=1e-4, rtol=0)
    for comp in ("z", "mlp_out", "resid_pre"):
        site = Site.of(comp, 1)
        out = c.run({site: torch.zeros(1, c.units(site))})
        torch.testing.assert_close(out[0], c.clean_base, atol=1e-5, rtol=0)


@pytest.mark.parametrize("how", ["last", "anchors", "index"])
def test_an_answer_row_read_within_another_is_computed_once(random_model, how):
    """Whole-answer scoring gives an item a row per answer (one, where the answers differ only in their
    last token). " 9.8" reads ' 9.', a prefix of what " 9.11" reads; " 12.5" / " 2.5" part at their
    first digit. So the 8 rows become 6, and the scores stay those of one forward per original row."""
    b, s = rows(random_model, LONG), rows(random_model, LONG.replace("Question", "Querying"))
    assert len(b) == 8
    c = Contrast(random_model, b, s, how)
    assert sum(bk.n for bk in c.buckets) == 6
    torch.testing.assert_close(c.clean_base, clean_scores(random_model, b), atol=1e-4, rtol=0)
    torch.testing.assert_close(c.clean_source, clean_scores(random_model, s), atol=1e-4, rtol=0)
    site = Site.of("z", 1)
    got = c.run({site: torch.eye(c.units(site))[:2]})
    for u in range(2):
        want = direct_patch_scores(random_model, b, s, how, site, torch.eye(c.units(site))[u])
        torch.testing.assert_close(got[u], want, atol=2e-4, rtol=0)


@pytest.mark.parametrize("how", ["last", "anchors"])
@pytest.mark.parametrize("comp", ["z", "q", "k", "v", "attn_out", "o_slices", "mlp_out", "resid_pre"])
def test_every_unit_equals_direct_hooked_forward(random_model, how, comp):
    """Formats of different length; each unit patched alone equals one hooked forward per row."""
    b, s = rows(random_model, LONG), rows(random_model, SHORT)
    c = Contrast(random_model, b, s, how, batch_size=16)  # small batches: chunking is exercised
    layer = 1
    site = Site.of(comp, layer)
    U = c.units(site)
    got = c.run({site: torch.eye(U)})
    for u in range(U):
        want = direct_patch_scores(random_model, b, s, how, site, torch.eye(U)[u])
        torch.testing.assert_close(got[u], want, atol=2e-4, rtol=0)


def test_blend_and_multi_site_masks(random_model):
    b, s = rows(random_model, LONG), rows(random_model, SHORT)
    c = Contrast(random_model, b, s, "last")
    site = Site.of("z", 2)
    m = torch.tensor([[0.3, 0.0, 0.7, 1.0]])
    torch.testing.assert_close(c.run({site: m})[0], direct_patch_scores(random_model, b, s, "last", site, m[0]),
                               atol=2e-4, rtol=0)
    # a full residual-stream patch at layer 0 over the last positions, with a head patch above it: equal to
    # the hand-written hooks, and it changes the score
    r = c.run({Site.of("resid_pre", 0): torch.ones(1, 1), Site.of("z", 2): torch.ones(1, 4)})
    want = direct_patch_scores(random_model, b, s, "last", Site.of("resid_pre", 0), torch.ones(1),
                               extra=[(Site.of("z", 2), torch.ones(4))])
    torch.testing.assert_close(r[0], want, atol=2e-4, rtol=0)
    assert (r[0] - c.clean_base).abs().max() > 1e-2


@pytest.mark.parametrize("how", ["last", "decision"])
def test_patches_agreeing_below_the_last_layer_share_work_and_give_the_same_scores(random_model, how):
    """Masks at layers 0 and 2 where 12 patches share 3 lower-layer masks: the core computes the lower
    layers once per group; every score equals that patch run on its own (the ungrouped path)."""
    score = "first_token" if how == "decision" else "sequence"
    b, s = (encode_rows(f, ITEMS, random_model.tokenizer, True, score) for f in (LONG, SHORT))
    c = Contrast(random_model, b, s, how, batch_size=4)  # row slices, several chunks of groups and of patches
    g = torch.Generator().manual_seed(0)
    lo, hi, mlp = Site.of("v", 0), Site.of("z", 2), Site.of("mlp_out", 2)
    masks = {lo: torch.rand(3, c.units(lo), generator=g)[torch.arange(12) % 3],
             hi: (torch.rand(12, c.units(hi), generator=g) > 0.5).float(), mlp: torch.rand(12, 1, generator=g)}
    together = c.run(masks)
    assert c.execution["paths"] == {"grouped": 1} and c.execution["why"] == {}  # the grouped path ran
    alone = torch.cat([c.run({k: m[i: i + 1] for k, m in masks.items()}) for i in range(12)])
    assert c.execution["paths"] == {"grouped": 1, "plain": 12}  # one patch each: nothing to share
    assert c.execution["why"] == {"not grouped: fewer than two patches per group": 12}
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    one = {k: m[5] for k, m in masks.items()}  # and one of them against one hooked forward per row
    want = direct_patch_scores(random_model, b, s, how, hi, one[hi], extra=[(lo, one[lo]), (mlp, one[mlp])])
    torch.testing.assert_close(together[5], want, atol=2e-4, rtol=0)


def test_matches_transformer_lens_patching(random_model):
    """Equal-length prompts, index alignment: per-head, per-position and pattern patching equal TL's utilities."""
    items = [it for it in ITEMS if len(it.values["a"]) == 3 and len(it.values["b"]) == 3]
    b, s = rows(random_model, "X: {a} or {b}?", items), rows(random_model, "Y; {a} vs {b}:", items)
    assert len({len(r.tokens) for r in b + s}) == 1
    _tl_check(random_model, b, s, pattern=True)


def test_mask_gradients_are_attribution(random_model):
    """d score / d mask at m = 0 is what one backward pass gives; it matches a finite difference."""
    b, s = rows(random_model, LONG), rows(random_model, SHORT)
    c = Contrast(random_model, b, s, "last")
    site = Site.of("z", 1)
    m = torch.zeros(1, 4, requires_grad=True)
    c.run({site: m}).sum().backward()
    eps = 1e-2
    fd = (c.run({site: eps * torch.eye(4)}).sum(-1) - c.run({site: -eps * torch.eye(4)}).sum(-1)) / (2 * eps)
    torch.testing.assert_close(m.grad[0], fd.detach(), atol=2e-3, rtol=2e-2)


def test_noop_patch_is_reported(random_model):
    """Patching a format into itself moves nothing: every delta is zero."""
    b = rows(random_model, LONG)
    c = Contrast(random_model, b, rows(random_model, LONG), "last")
    d = c.deltas([Site.of("z", 0)])[Site.of("z", 0)]
    assert torch.all(d == 0)
    d2 = Contrast(random_model, b, rows(random_model, SHORT), "last").deltas([Site.of("z", 0)])[Site.of("z", 0)]
    assert torch.all(d2 > 0)


def test_pattern_needs_equal_lengths(random_model):
    c = Contrast(random_model, rows(random_model, LONG), rows(random_model, SHORT), "last")
    with pytest.raises(AnalysisError, match="equal length"):
        c.run({Site.of("pattern", 1): torch.eye(4)})


def test_out_of_memory_halves_the_batch_and_gives_the_same_numbers(random_model):
    """A forward pass over more than 6 rows 'runs out of memory' (raised from a real hook, as CUDA would);
    the core halves its batch size until it fits, and the scores do not change."""
    b, s = rows(random_model, LONG), rows(random_model, SHORT)
    site = Site.of("z", 1)
    want = Contrast(random_model, b, s, "last", batch_size=256).run({site: torch.eye(4)})

    def limit(module, inputs, output):
        if output.shape[0] > 6:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    handle = random_model.blocks[1].register_forward_hook(limit)
    try:
        c = Contrast(random_model, b, s, "last", batch_size=256)
        got = c.run({site: torch.eye(4)})
    finally:
        handle.remove()
    assert c.backoffs >= 5 and c.batch_size <= 6
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_bfloat16_model_gives_the_float32_answer(decimal_case):
    """The organism in bfloat16: same verdicts, patch effects close to float32's."""
    from surgeon.analyses import diagnose, patch_heads
    from surgeon.models.loading import load_model

    m32, m16 = load_model("organism:decimal"), load_model("organism:decimal", dtype="bfloat16")
    assert next(m16.parameters()).dtype == torch.bfloat16
    assert diagnose(decimal_case, m16).reproduced == {"qa": True, "chat": True}
    a = patch_heads(decimal_case, m32, layers=[0])
    b = patch_heads(decimal_case, m16, layers=[0])
    assert abs(b.clean_base.value - a.clean_base.value) < 0.2
    assert float(abs(b.fraction - a.fraction).max()) < 0.05


def _tl_check(model, b, s, pattern=False):
    """Our per-head patching (all positions, per position, and optionally attention patterns) equals
    TransformerLens's patching utilities on equal-length rows."""
    c = Contrast(model, b, s, "index")
    corrupted = torch.tensor([r.tokens for r in b])
    _, clean_cache = model.run_with_cache(torch.tensor([r.tokens for r in s]))
    idx = torch.arange(len(b))[:, None]
    tp = torch.tensor([[p for p, _, _ in r.targets] for r in b])
    tt = torch.tensor([[t for _, t, _ in r.targets] for r in b])
    ts = torch.tensor([[g for _, _, g in r.targets] for r in b])
    item = torch.tensor([r.item for r in b])
    n_items = c.n_items

    def metric(logits):
        per_row = (logits.log_softmax(-1)[idx, tp, tt] * ts).sum(-1)
        return torch.zeros(n_items).index_add(0, item, per_row).mean()

    H, L, P = model.cfg.n_heads, model.cfg.n_layers, corrupted.shape[1]
    tl_all = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, clean_cache, metric)
    ours = torch.stack([c.run({Site.of("z", l): torch.eye(H)}).mean(-1) for l in range(L)])
    torch.testing.assert_close(ours, tl_all, atol=1e-4, rtol=0)
    tl_pos = patching.get_act_patch_attn_head_out_by_pos(model, corrupted, clean_cache, metric)
    masks = torch.zeros(P * H, P, H)
    for p in range(P):
        masks[p * H: (p + 1) * H, p] = torch.eye(H)
    ours = torch.stack([c.run({Site.of("z", l): masks}).mean(-1).view(P, H) for l in range(L)])
    torch.testing.assert_close(ours, tl_pos, atol=1e-4, rtol=0)
    if pattern:
        tl_pat = patching.get_act_patch_attn_head_pattern_all_pos(model, corrupted, clean_cache, metric)
        ours = torch.stack([c.run({Site.of("pattern", l): torch.eye(H)}).mean(-1) for l in range(L)])
        torch.testing.assert_close(ours, tl_pat, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_organisms_match_transformer_lens_patching(decimal_model, induction_model, decimal_case):
    from surgeon.organisms import decimal as org

    # decimal: the Q&A prompt against itself with the numbers swapped (equal length), one length group
    qa = org.FORMATS["qa"]
    swapped = qa.replace("{a}", "{X}").replace("{b}", "{a}").replace("{X}", "{b}")
    items = [it for it in decimal_case.items_for("trap") if len(it.values["a"]) + len(it.values["b"]) == 7]
    items = [it for it in items if len(it.correct) == 4][:6]
    b, s = (encode_rows(f, items, decimal_model.tokenizer, True, "first_token") for f in (qa, swapped))
    assert len({len(r.tokens) for r in b + s}) == 1 and len(items) >= 3
    _tl_check(decimal_model, b, s)
    # induction: repeated vs fresh first half, one cue length
    from surgeon import load_case
    from tests.conftest import ROOT

    case = load_case(f"{ROOT}/cases/induction_organism.py")
    length = lambda it: sum(len(v) for k, v in it.values.items() if k != "z")
    items = [it for it in case.items if length(it) == length(case.items[0])][:6]
    assert len(items) >= 2
    b, s = (encode_rows(case.formats[f], items, induction_model.tokenizer, True) for f in ("fresh", "repeat"))
    _tl_check(induction_model, b, s)


@pytest.mark.parametrize("difference", ["fixed", "live"])
def test_pooled_edge_gradients_are_the_mean_of_the_per_patch_ones(random_model, difference):
    """`gradient(pool=True)` (what EAP-IG reads: the mean over its steps) sums the patches' gradients before they
    meet the fixed sender differences: one contraction, not one per patch. It must return exactly the mean of the
    per-patch gradients, at masks where every sender's edges share a value (q/k/v gradients through the projections)
    and at masks where they do not (per-head inputs), with senders read live or fixed."""
    from surgeon.sites.edges import EdgeSite

    b, s = rows(random_model, LONG), rows(random_model, SHORT)
    c = Contrast(random_model, b, s, "last", batch_size=4)  # chunks of patches: each puts its sum in its own row
    site = EdgeSite.of(random_model.cfg).variant(difference=difference)
    E, sender = len(site.edges), site.graph.sender_of
    g = torch.Generator().manual_seed(0)
    shared = torch.rand(5, len(site.senders), generator=g)[:, sender]  # one value per sender per patch
    uneven = torch.rand(5, E, generator=g)
    for masks in (shared, uneven):
        per_patch, scores = c.gradient({site: masks})
        pooled, pooled_scores = c.gradient({site: masks}, pool=True)
        assert pooled[site].shape == (1, E)
        torch.testing.assert_close(pooled[site][0], per_patch[site].mean(0), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(pooled_scores, scores)
    assert any("pooled over patches" in k for k in c.execution["sites"])
