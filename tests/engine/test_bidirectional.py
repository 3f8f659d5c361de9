"""Bidirectional attention (TransformerLens's attention_dir="bidirectional": tracr's compiled models, BERT-style
encoders) runs exactly: every row whole and alone, its padding masked for every query. Checked against each prompt
run alone through plain TransformerLens hooks (no padding to mask), with ragged lengths 2-5, the pad being BOS or a
compiler's own pad token, and several scored positions per row."""
import pytest
import torch

from surgeon import Item
from surgeon.case.encoding import align, encode_rows
from surgeon.engine.contrast import Contrast
from surgeon.sites.nodes import Site


def tracr_style(tok, seed: int = 0):
    """A model laid out as tracr's compiled models are in TransformerLens: bidirectional attention, no norms, ReLU
    MLPs, random weights (large enough that attention is far from uniform and the padding would move every score)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=3, d_model=24, n_heads=3, d_head=8, d_mlp=32, n_ctx=16, d_vocab=len(tok),
                                  act_fn="relu", normalization_type=None, attention_dir="bidirectional", seed=seed)
    torch.manual_seed(seed)
    m = HookedTransformer(cfg, tokenizer=tok)
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)
    m.eval()
    return m


ITEMS = [Item({"a": "x", "b": "o"}, correct="pq", incorrect="rs"),
         Item({"a": "xy", "b": "on"}, correct="pq", incorrect="r"),
         Item({"a": "xyz", "b": "onm"}, correct="p", incorrect="rs"),
         Item({"a": "wxyz", "b": "onml"}, correct="pq", incorrect="rs")]
# scored at positions inside the prompt (as tracr's models are read: an output at every position), with tokens after
# them that a bidirectional model reads and a causal layout would cut
AT = [Item({"a": "xyz", "b": "onm"}, correct=["p", "q"], incorrect=["r", "s"], at=[1, 2]),
      Item({"a": "wxyz", "b": "onml"}, correct=["p", "q"], incorrect=["s", "r"], at=[2, 3]),
      Item({"a": "xy", "b": "on"}, correct=["q"], incorrect=["p"], at=[1])]
KINDS = {"answers": (ITEMS, "last"), "positions": (AT, "decision")}


def _rows(model, kind="answers"):
    items, _ = KINDS[kind]
    base = encode_rows("{a}", items, model.tokenizer, True, "sequence")  # BOS and the word: 2-5 tokens
    source = encode_rows("{b}", items, model.tokenizer, True, "sequence")
    return base, source


def _cut(row, p):
    """The tokens a bidirectional model may read to score position p: the prompt and the answer tokens before p + 1,
    never the token p predicts (a position inside the prompt reads the whole prompt, as tracr's outputs are read)."""
    return row.tokens[:max(row.n_prompt, p + 1)]


def _alone_score(model, row, hooks=()):
    """sign x log P summed over a row's targets, each read from the row cut before the answer it predicts (`_cut`),
    run alone (its own length: nothing to pad)."""
    total = 0.0
    for p, t, s in row.targets:
        logp = model.run_with_hooks(torch.tensor([_cut(row, p)]), fwd_hooks=list(hooks))[0].log_softmax(-1)
        total += s * float(logp[p, t])
    return total


def _whole_score(model, row):
    """The same, every target read from the whole row (which shows each answer token to the position predicting it)."""
    logp = model(torch.tensor([row.tokens]))[0].log_softmax(-1)
    return sum(s * float(logp[p, t]) for p, t, s in row.targets)


@pytest.fixture(params=["bos", "compiler pad"])
def model(request, charset):
    m = tracr_style(charset)
    pad = charset.bos_token_id if request.param == "bos" else charset.convert_tokens_to_ids("~")
    m.tokenizer = charset
    old = charset.pad_token_id
    charset.pad_token_id = pad
    yield m
    charset.pad_token_id = old


def test_rows_are_ragged_and_several_positions_are_scored(model):
    base, _ = _rows(model)
    assert sorted({r.n_prompt for r in base}) == [2, 3, 4, 5]  # prompt lengths 2-5 (BOS and the word)
    assert max(len(r.targets) for r in base) == 2
    at, _ = _rows(model, "positions")
    assert all(max(t[0] for t in r.targets) < len(r.tokens) - 1 for r in at)  # tokens after the last one read
    assert max(len({t[0] for t in r.targets}) for r in at) == 2  # two positions read in one row


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_clean_scores_equal_each_prompt_run_alone(model, kind):
    base, source = _rows(model, kind)
    c = Contrast(model, base, source, KINDS[kind][1], batch_size=3)
    with torch.no_grad():
        want_b = torch.zeros(len(KINDS[kind][0]))
        want_s = torch.zeros(len(KINDS[kind][0]))
        for rb, rs in zip(base, source):
            want_b[rb.item] += _alone_score(model, rb)
            want_s[rs.item] += _alone_score(model, rs)
    torch.testing.assert_close(c.clean_base.cpu().float(), want_b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(c.clean_source.cpu().float(), want_s, atol=1e-4, rtol=1e-4)
    assert "bidirectional" in c.execution["attention"]


def test_no_scored_position_reads_the_answer_it_predicts(model):
    """A row holding a teacher-forced answer of two tokens shows the second token to the position that predicts the
    first, and reading it moves the score: the engine's clean scores are those of the cut rows, not the whole."""
    base, source = _rows(model)
    c = Contrast(model, base, source, "last", batch_size=3)
    with torch.no_grad():
        cut = torch.zeros(len(ITEMS))
        whole = torch.zeros(len(ITEMS))
        for r in base:
            cut[r.item] += _alone_score(model, r)
            whole[r.item] += _whole_score(model, r)
    assert (cut - whole).abs().max() > 1e-2 * cut.abs().max()
    torch.testing.assert_close(c.clean_base.cpu().float(), cut, atol=1e-4, rtol=1e-4)


def test_diagnose_scores_read_no_answer_either(model):
    """The clean scoring outside the engine (`score_rows`, what diagnose runs) cuts the rows the same way."""
    from surgeon.engine.readout import score_rows

    base, _ = _rows(model)
    with torch.no_grad():
        cut = torch.zeros(len(ITEMS))
        for r in base:
            cut[r.item] += _alone_score(model, r)
        got = score_rows(model, base, batch_size=3)
    torch.testing.assert_close(got.cpu().float(), cut, atol=1e-4, rtol=1e-4)


def test_the_pad_would_move_the_scores_were_it_not_masked(model):
    """The check above is not vacuous: a row padded and run without the mask scores differently."""
    base, _ = _rows(model)
    short = min(base, key=lambda r: len(r.tokens))
    W = max(len(r.tokens) for r in base)
    padded = list(short.tokens) + [model.tokenizer.pad_token_id] * (W - len(short.tokens))
    with torch.no_grad():
        logp = model(torch.tensor([padded]))[0].log_softmax(-1)
        unmasked = sum(s * float(logp[p, t]) for p, t, s in short.targets)
        alone = _alone_score(model, short)
    assert abs(unmasked - alone) > 1e-3


@pytest.mark.parametrize("batch_size", [1, 3, 256])
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("layer", [0, 2])
def test_per_head_patching_equals_each_prompt_patched_alone(model, layer, kind, batch_size):
    """Every head of a layer patched alone at the aligned positions (answers: the last prompt token and the answer;
    positions: the first position read, with later tokens after it), from the good format's run of the same item into
    the failing one's: each row run alone with one hand-written hook. At one row per pass, a prime number, and the
    default (every row and every patch in one pass: copies of the rows whose padding must be masked copy by copy);
    to a tolerance relative to the scores' scale (they reach 1e5 here)."""
    base, source = _rows(model, kind)
    items, how = KINDS[kind]
    H = model.cfg.n_heads
    c = Contrast(model, base, source, how, batch_size=batch_size, sites=[Site.of("z", layer)])
    with torch.no_grad():
        got = c.run({Site.of("z", layer): torch.eye(H)})  # [H, items]
        want = torch.zeros(H, len(items))
        name = f"blocks.{layer}.attn.hook_z"
        for rb, rs in zip(base, source):
            pb, ps = align(rb, rs, how)
            for (p, t, sg), (q, _, _) in zip(rb.targets, rs.targets):  # each target from its own cut rows
                tb, ts = _cut(rb, p), _cut(rs, q)
                keep = [(i, j) for i, j in zip(pb, ps) if i < len(tb) and j < len(ts)]
                _, cache = model.run_with_cache(torch.tensor([ts]), names_filter=[name])
                for h in range(H):
                    def patch(z, hook, h=h, src=cache[name]):
                        for i, j in keep:
                            z[0, i, h] = src[0, j, h]
                        return z

                    logp = model.run_with_hooks(torch.tensor([tb]), fwd_hooks=[(name, patch)])[0].log_softmax(-1)
                    want[h, rb.item] += sg * float(logp[p, t])
    scale = float(want.abs().max())
    torch.testing.assert_close(got.cpu().float(), want, atol=1e-5 * scale, rtol=0)
    assert (want - c.clean_base.cpu().float()).abs().max() > 1e-3 * scale  # the patches move the scores


def test_generation_is_refused_with_the_reason(model):
    from surgeon.errors import AnalysisError

    base, source = _rows(model)
    c = Contrast(model, base, source, "last", batch_size=3, clean=False)
    with pytest.raises(AnalysisError, match="bidirectional"):
        c.generate({Site.of("z", 0): torch.zeros(1, model.cfg.n_heads)}, 2)


def test_a_kl_metric_reference_reads_no_answer(model):
    """The reference log-probabilities a KL metric compares against: each item's next-token distribution at its first
    scored position, from the row cut before the answer (by hand: `_cut`)."""
    from surgeon.engine.readout import reference_logprobs

    base, _ = _rows(model)
    with torch.no_grad():
        got = reference_logprobs(model, base, batch_size=3)
        for r in base:
            p = r.targets[0][0]
            want = model(torch.tensor([_cut(r, p)]))[0, p].log_softmax(-1)
            torch.testing.assert_close(got[r.item].cpu().float(), want.float(), atol=1e-4, rtol=1e-4)
