"""`surgeon scan` on constructed organisms whose failure is known by construction: a model that fails exactly when one
named part of the format is present (a question cue holding '#'), and one that fails only when two parts are present
together ('#' in the question cue and '*' in the answer cue). The weights are set by hand (no training): uniform
attention averages a trigger's indicator over the prompt, a first MLP saturates it to 0 or 1 (present or not, at any
prompt length up to the context), a second MLP takes the AND of the two for the interaction organism, and the
unembedding favours the correct answer 'x' by 2 logits unless the signal adds 4 to the wrong answer 'y'.

The scan must name the part with the right sign, nothing else after correction, on held-out items; the minimal pair
must differ in that part; and the interaction organism's failure must show as the interaction of the two options,
larger than either's main effect."""
import random

import pytest
import torch

import surgeon
from surgeon import Case, Item

GRAMMAR = {"body": "{a} or {b}?", "instruction": {"none": ""}, "question_cue": {"none": "", "Q": "Q: ", "hash": "# "},
           "separator": {"newline": "\n", "space": " "}, "answer_cue": {"A": "A:", "star": "*:", "Answer": "Answer:"},
           "casing": ["as written"], "shots": [0]}
# residual directions: 0, 1 the triggers' mean indicators; 2, 3 saturated (0 or 1); 4 the failure signal; 5, 6 the
# triggers' own indicators at their positions
D, C = 8, 64.0  # C x a mean indicator >= 1 whenever the trigger appears once in a prompt of at most 64 tokens


def organism(tok, both: bool):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=D, n_heads=1, d_head=D, d_mlp=4, n_ctx=64, d_vocab=len(tok),
                                  act_fn="relu", normalization_type=None, positional_embedding_type="standard",
                                  default_prepend_bos=True)
    m = HookedTransformer(cfg, tokenizer=tok)
    hash_, star, x, y = (tok.convert_tokens_to_ids(c) for c in "#*xy")
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.W_E[hash_, 5] = 1.0
        m.W_E[star, 6] = 1.0
        a = m.blocks[0].attn  # q = k = 0: every position attends uniformly to itself and all before it
        a.W_V[0, 5, 0], a.W_V[0, 6, 1] = 1.0, 1.0
        a.W_O[0, 0, 0], a.W_O[0, 1, 1] = 1.0, 1.0
        mlp = m.blocks[0].mlp  # saturate: min(1, C x mean) = relu(C x mean) - relu(C x mean - 1)
        for j, src in ((0, 0), (2, 1)):
            mlp.W_in[src, j], mlp.W_in[src, j + 1] = C, C
            mlp.b_in[j + 1] = -1.0
            mlp.W_out[j, 2 + src], mlp.W_out[j + 1, 2 + src] = 1.0, -1.0
        mlp = m.blocks[1].mlp
        if both:  # AND: relu(hash + star - 1)
            mlp.W_in[2, 0], mlp.W_in[3, 0], mlp.b_in[0] = 1.0, 1.0, -1.0
        else:  # the hash alone
            mlp.W_in[2, 0] = 1.0
        mlp.W_out[0, 4] = 1.0
        m.b_U[x] = 2.0
        m.W_U[4, y] = 4.0
    m.eval()
    return m


def _case(charset):
    rng = random.Random(0)
    word = lambda: "".join(rng.choice("abcdefgh") for _ in range(3))  # noqa: E731
    items = [Item({"a": word(), "b": word()}, correct="x", incorrect="y") for _ in range(24)]
    return Case(name="constructed", model=None, formats={"plain": "{a} or {b}?\nAnswer:", "qa": "Q: {a} or {b}?\nA:"},
                good="plain", bad=["qa"], items=items, scan=GRAMMAR)


@pytest.fixture(scope="module")
def scans(charset):
    case = _case(charset)
    return {kind: surgeon.scan(case, organism(charset, kind == "both"), holdout=0.5)
            for kind in ("hash", "both")}


def test_the_organisms_fail_as_constructed(charset):
    """By hand, on single prompts: the hash organism answers y exactly when '#' is in the prompt, the interaction
    organism exactly when both '#' and '*' are."""
    for both in (False, True):
        m = organism(charset, both)
        for text, fails in (("Q: abc or def?\nA:", False), ("# abc or def?\nA:", not both),
                            ("Q: abc or def?\n*:", False), ("# abc or def? *:", True)):
            ids = torch.tensor([[charset.bos_token_id] + charset(text, add_special_tokens=False)["input_ids"]])
            logits = m(ids)[0, -1]
            assert (logits[charset.convert_tokens_to_ids("y")] > logits[charset.convert_tokens_to_ids("x")]) == fails


def test_the_named_part_is_found_with_its_sign_and_nothing_else(scans):
    r = scans["hash"]
    chosen = [e for e in r.effects if e.chosen]
    # only the named part's options (the others of the part gain what hash costs); the one that costs is hash
    assert {e.part for e in chosen} == {"question_cue"}
    assert [e.option for e in chosen if e.discovery.value < 0] == ["hash"]
    e = next(e for e in r.effects if e.option == "hash")
    assert e.held_out.value == pytest.approx(-1.0) and e.held_out.hi < 0  # every format with it fails, held out
    assert all(e.held_out.value == 0 for e in r.effects if e.option != "hash" and e.part != "question_cue")
    assert list(r.pair["differs"]) == ["question_cue"] and r.pair["differs"]["question_cue"][1] == "hash"
    assert r.pair["confirmed"]
    assert not any(x.chosen and "hash" not in (x.option_a, x.option_b) for x in r.interactions)


def test_two_parts_together_are_found_as_their_interaction(scans):
    r = scans["both"]
    inter = {(x.option_a, x.option_b): x for x in r.interactions}
    x = inter[("hash", "star")]
    assert x.chosen and x.discovery.value == pytest.approx(-1.0) and x.held_out.value == pytest.approx(-1.0)
    assert x.held_out.hi < 0
    # a difference in differences, not a difference: no question cue with '*' works (1) as it does with other
    # answer cues (1), where the other question cues with '*' work half the time (Q yes, hash no) against 1 without
    assert inter[("none", "star")].discovery.value == pytest.approx(0.5)
    strongest = min(r.interactions, key=lambda i: i.discovery.value)
    assert (strongest.option_a, strongest.option_b) == ("hash", "star")
    main = {e.option: e for e in r.effects}
    # each alone fails only a third of its formats (those with the other): its main effect is a third of the interaction
    for o in ("hash", "star"):
        assert main[o].discovery.value == pytest.approx(-1 / 3) and abs(main[o].discovery.value) < abs(x.discovery.value)
    assert set(r.pair["differs"]) <= {"question_cue", "answer_cue"} and len(r.pair["differs"]) == 1
