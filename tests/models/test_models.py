"""Real architectures through the path users take: a checkpoint directory on disk -> load_model."""
import os

import numpy as np
import pytest
import torch

from surgeon import CaseError, load_case
from surgeon.analyses import diagnose
from surgeon.engine.contrast import Contrast
from surgeon.models.loading import load_model
from surgeon.sites.nodes import Site
from surgeon.case.encoding import format_rows
from tests.checkpoints import make_gemma2, make_gpt2, make_llama, make_qwen2
from tests.conftest import ROOT
from tests.reference import direct_patch_scores

MAKERS = {"gpt2": make_gpt2, "tiny-llama-gqa": make_llama, "qwen2": make_qwen2, "gemma-2-local": make_gemma2}
LLAMA_CASE = os.path.join(ROOT, "cases", "llama31_decimal.py")


@pytest.fixture(scope="module", params=sorted(MAKERS))
def checkpoint(request, tmp_path_factory):
    # a directory name containing "llama" exercises TransformerLens's name-based branch trap
    return MAKERS[request.param](tmp_path_factory.mktemp("ckpt") / request.param)


@pytest.fixture(scope="module")
def llama31_standin(tmp_path_factory):
    """Llama-3.1-8B's layout (32 layers, 32 query heads sharing 8 key/value heads), tiny widths."""
    return make_llama(tmp_path_factory.mktemp("ckpt") / "llama-3.1-standin", n_layers=32, n_heads=32,
                      n_kv_heads=8, hidden=64)


def test_logits_equal_huggingface(checkpoint):
    from transformers import AutoModelForCausalLM

    model = load_model(str(checkpoint))
    hf = AutoModelForCausalLM.from_pretrained(str(checkpoint))
    tokens = torch.randint(2, model.cfg.d_vocab, (3, 90))  # longer than Gemma-2's sliding window (64)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_llama31_case_loads_validates_and_runs_on_standin(llama31_standin):
    case = load_case(LLAMA_CASE, model=str(llama31_standin))
    assert case.model == str(llama31_standin) and len(case.items) == 96
    model = load_model(case.model)
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.n_key_value_heads) == (32, 32, 8)
    # the chat format is the tokenizer's template around the question, with the assistant header
    rows = format_rows(case, model, "chat", case.items[:1])
    text = model.tokenizer.decode(list(rows[0].tokens[: rows[0].n_prompt]))
    assert text.startswith("<|begin_of_text|><|start_header_id|>user") and "9.8 or 9.11" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    d = diagnose(case, model)
    assert {s.format for s in d.stats} == {"simple", "qa", "chat"}
    assert all(s.accuracy.n in (96, 64, 32) for s in d.stats)


def test_llama31_case_layers_checked_against_the_model(tmp_path):
    small = make_llama(tmp_path / "small-llama")
    with pytest.raises(CaseError, match=r"field 'layers'.*out of range"):
        load_case(LLAMA_CASE, model=str(small))


def test_gqa_query_head_patching_equals_direct_forward(tmp_path):
    """Heads are query heads: patching one patches only its output, whatever key/value head it shares."""
    path = make_llama(tmp_path / "gqa", n_layers=2, n_heads=4, n_kv_heads=2)
    model = load_model(str(path))
    case = load_case(LLAMA_CASE, model=str(path), check_model=False)
    items = case.items[:6]
    for bad in ("qa", "chat"):
        b, s = format_rows(case, model, bad, items), format_rows(case, model, "simple", items)
        c = Contrast(model, b, s, "last")
        for comp, units in (("z", 4), ("k", 2)):
            site = Site.of(comp, 1)
            assert c.units(site) == units
            got = c.run({site: torch.eye(units)})
            for u in range(units):
                want = direct_patch_scores(model, b, s, "last", site, torch.eye(units)[u])
                torch.testing.assert_close(got[u], want, atol=2e-4, rtol=0)


def test_answer_that_tokenizes_to_nothing(tmp_path):
    """A tokenizer without byte fallback drops characters it does not know: such an answer is refused."""
    path = make_llama(tmp_path / "t")
    p = tmp_path / "case.py"
    p.write_text("from surgeon import Case, Item\n"
                 f"case = Case(name='t', model={str(path)!r}, formats={{'a': 'x {{v}}', 'b': 'y {{v}}'}}, good='a',\n"
                 "    bad=['b'], items=[Item({'v': '1'}, correct=' 1', incorrect='\\u00e9')])\n")
    with pytest.raises(CaseError, match=r"field 'items\[0\].incorrect'.*tokenizes to nothing"):
        load_case(p)


@pytest.mark.slow
def test_hub_name_is_read_from_the_local_cache(tmp_path):
    """A Hugging Face name works offline when the model is in the local cache (HF_HUB_CACHE)."""
    import subprocess
    import sys

    snap = tmp_path / "hub" / "models--tiny-org--tiny-model" / "snapshots" / "0123abc"
    make_llama(snap)
    (tmp_path / "hub" / "models--tiny-org--tiny-model" / "refs").mkdir()
    (tmp_path / "hub" / "models--tiny-org--tiny-model" / "refs" / "main").write_text("0123abc")
    case = tmp_path / "case.py"
    case.write_text("from surgeon import Case, Item\n"
                    "case = Case(name='t', model='tiny-org/tiny-model', formats={'a': 'x {v} =', 'b': 'yy {v} ='},\n"
                    "    good='a', bad=['b'], items=[Item({'v': str(i)}, correct=' 1', incorrect=' 2') for i in range(4)])\n")
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "surgeon", "diagnose", str(case)], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "model tiny-org/tiny-model" in r.stdout
    env["HF_HUB_CACHE"] = str(tmp_path / "empty")
    r = subprocess.run([sys.executable, "-m", "surgeon", "diagnose", str(case)], capture_output=True, text=True,
                       env=env, cwd=ROOT)
    assert r.returncode == 2 and "nor in the local Hugging Face cache" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("name", ["gpt2_ioi", "gpt2_greater_than"])
def test_gpt2_cases_validate_and_patch_on_standin(tmp_path, name):
    """The GPT-2 cases load, validate and run per-head patching on a stand-in with GPT-2 small's layout."""
    from surgeon.analyses import patch_heads
    from tests.checkpoints import make_gpt2_standin

    path = os.path.join(ROOT, "cases", f"{name}.py")
    draft = load_case(path, check_model=False)
    standin = make_gpt2_standin(tmp_path / "gpt2-standin", draft)
    case = load_case(path, model=str(standin))
    model = load_model(case.model)
    assert (model.cfg.n_layers, model.cfg.n_heads) == (12, 12)
    assert "circuit" in case.notes
    r = patch_heads(case, model, layers=[9, 10], component="z")  # index alignment: equal-length formats
    assert r.fraction.shape == (2, 12) and np.isfinite(r.score).all()


def test_patching_through_the_core_on_every_architecture(checkpoint):
    """Per-head patching through the core (with and without the shared-prefix attention) equals one
    hooked forward per row, on GPT-2, Llama (GQA), Qwen2 and Gemma-2 (soft-capping, sliding window:
    the prompts are longer than its window of 64)."""
    from surgeon import Item
    from surgeon.case.encoding import encode_rows

    model = load_model(str(checkpoint))
    filler = "it was a long day and the sun was low over the hills when they came back "
    items = [Item({"a": a, "b": b}, correct=f" {c}", incorrect=f" {d}") for a, b, c, d in
             [("9.8", "9.11", "9.8", "9.11"), ("3.4", "3.25", "3.4", "3.25"), ("1.2", "1.3", "1.3", "1.2")]]
    bad_fmt, good_fmt = filler + "Q: is {a} or {b} bigger?\nA:", filler + "which of {a} and {b} is bigger? answer:"
    bad, good = encode_rows(bad_fmt, items, model.tokenizer, True), encode_rows(good_fmt, items, model.tokenizer, True)
    assert max(len(r.tokens) for r in bad) > 64
    assert Contrast(model, bad, good, "last").shared_prefix  # these architectures use the shared-prefix attention
    for shared in (True, False):
        c = Contrast(model, bad, good, "last", shared_prefix=shared, batch_size=5)
        for comp in ("z", "v"):
            site = Site.of(comp, 1)
            U = c.units(site)
            got = c.run({site: torch.eye(U)})
            for u in range(U):
                want = direct_patch_scores(model, bad, good, "last", site, torch.eye(U)[u])
                torch.testing.assert_close(got[u], want, atol=3e-4, rtol=0)
    # the decision setting: first-token scores, patched where that token is predicted; the core then
    # recomputes that one position only (no causal mask needed, except where Gemma-2's window cuts in)
    bad, good = (encode_rows(f, items, model.tokenizer, True, score="first_token") for f in (bad_fmt, good_fmt))
    c = Contrast(model, bad, good, "decision", batch_size=5)
    assert all(b.base_tokens.shape[1] - b.p0 == 1 for b in c.buckets)
    site = Site.of("z", 1)
    U = c.units(site)
    got = c.run({site: torch.eye(U)})
    for u in range(U):
        want = direct_patch_scores(model, bad, good, "decision", site, torch.eye(U)[u])
        torch.testing.assert_close(got[u], want, atol=3e-4, rtol=0)
    # head subsets over two layers: patches that agree on layer 0 share its work, with the same scores
    lo, hi = Site.of("z", 0), Site.of("z", 1)
    masks = {lo: torch.eye(U)[torch.arange(8) % 2], hi: torch.eye(U)[torch.arange(8) % U]}
    assert c.grouping.groups(masks, 0, 8)[0] is not None
    alone = torch.cat([c.run({k: m[i: i + 1] for k, m in masks.items()}) for i in range(8)])
    torch.testing.assert_close(c.run(masks), alone, atol=1e-5, rtol=0)


# reliability, family 5: a broken checkpoint gets one clear error, never plausible numbers
@pytest.mark.parametrize("tensor,name", [("model.layers.0.self_attn.q_proj.weight", "blocks.0.attn.W_Q"),
                                         ("model.layers.1.mlp.up_proj.weight", "blocks.1.mlp.W_in")])
def test_non_finite_weights_are_refused_naming_the_tensor(tmp_path, tensor, name):
    from safetensors.torch import load_file, save_file

    from surgeon.errors import ModelError
    from surgeon.models.loading import load_model

    path = make_llama(tmp_path / "nan")
    f = next(path.glob("*.safetensors"))
    state = load_file(str(f))
    state[tensor][0, 0] = float("nan")
    save_file(state, str(f), metadata={"format": "pt"})
    with pytest.raises(ModelError, match=f"the weight {name} holds NaN or infinite values"):
        load_model(str(path))


@pytest.mark.parametrize("breakage,phrase", [("config", "cannot read the model's config.json"),
                                             ("tokenizer", "cannot load the tokenizer")])
def test_broken_checkpoint_folders_get_one_error(tmp_path, breakage, phrase):
    from surgeon.errors import ModelError
    from surgeon.models.loading import load_tokenizer, resolve, shape

    path = make_llama(tmp_path / "broken")
    if breakage == "config":
        (path / "config.json").write_text("{not json")
        with pytest.raises(ModelError, match=phrase):
            shape(resolve(str(path)))
    else:
        for f in path.glob("tokenizer*"):
            f.unlink()
        with pytest.raises(ModelError, match=phrase):
            load_tokenizer(resolve(str(path)))
