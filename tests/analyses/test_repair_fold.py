"""A repair shipped as a model file (issue 68 item 5): folded into W_O and b_O, acting at every position. The expected
logits come from hand-written TransformerLens hooks on hook_z (each repaired head's output set towards, or shifted
by, its constant at every position), never from surgeon's fold; the Hugging Face folders are read by transformers
alone. A fold that forgets to scale W_O, adds the constant through the wrong head's rows, or takes another slot's
constant changes the logits (checked by hand)."""
import dataclasses

import pytest
import torch

import surgeon
from surgeon.errors import AnalysisError, ModelError
from surgeon.repairs.artifact import Repair
from surgeon.repairs.fold import fold, save_folded, save_hf
from tests.analyses.test_repair import _case, _tokens
from tests import checkpoints
from tests.cli_in_process import surgeon as surgeon_cli


def _hand_hooks(values: dict, units: dict, mode: str, a: float):
    """hook_z at every position: z_h <- z_h + a (c_h - z_h) (mean) or z_h + a c_h (steer), c_h = values[hook][h]."""
    hooks = []
    for hook, c in values.items():
        def fn(z, hook, c=c, us=units[hook]):
            for h in us:
                if mode == "mean":
                    z[:, :, h] = z[:, :, h] + a * (c[h].to(z.dtype) - z[:, :, h])
                else:
                    z[:, :, h] = z[:, :, h] + a * c[h].to(z.dtype)
            return z
        hooks.append((hook, fn))
    return hooks


@pytest.fixture(scope="module")
def decimal_repair(decimal_model):
    return surgeon.repair(_case(n_trap=16, n_control=8, seed=5), decimal_model, heads="L0H4,L0H6,L1H5", bad="qa")


TOKENS = torch.tensor([[1, 20, 33, 41, 12, 9, 55, 60, 7, 3, 14], [1, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]])


@pytest.mark.parametrize("mode,strength,rule", [("mean", 1.0, "slot0"), ("mean", 0.6, "mean"), ("steer", 2.0, "slot0")])
def test_the_folded_organism_equals_hand_written_hooks(decimal_model, decimal_repair, mode, strength, rule):
    rep = dataclasses.replace(decimal_repair.repair, mode=mode, strength=strength)
    const = {h: (v[0] if rule == "slot0" else v.mean(0)) for h, v in rep.values.items()}
    with torch.no_grad():
        want = decimal_model.run_with_hooks(TOKENS, fwd_hooks=_hand_hooks(const, rep.units, mode, strength))
        got = fold(decimal_model, rep, rule)(TOKENS)
        bare = decimal_model(TOKENS)
    assert (want - bare).abs().max() > 0.1  # the repair changes the logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_transformer_lens_checkpoint_loads_and_runs_repaired(decimal_model, decimal_repair, tmp_path):
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from safetensors.torch import load_file
    import json

    out = tmp_path / "folded"
    assert save_folded(decimal_repair.repair, decimal_model, out, fmt="auto", source="organism:decimal") == \
        "transformer_lens"
    cfg = json.loads((out / "config.json").read_text())
    model = HookedTransformer(HookedTransformerConfig(**{k: v for k, v in cfg.items() if k in
                                                         HookedTransformerConfig.__dataclass_fields__
                                                         and k not in ("device", "dtype", "n_devices")}))
    model.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    rep = decimal_repair.repair
    const = {h: v[0] for h, v in rep.values.items()}
    with torch.no_grad():
        want = decimal_model.run_with_hooks(TOKENS, fwd_hooks=_hand_hooks(const, rep.units, "mean", 1.0))
        torch.testing.assert_close(model(TOKENS), want, atol=1e-4, rtol=1e-4)
    fold_json = json.loads((out / "fold.json").read_text())
    assert fold_json["rule"] == "slot0" and fold_json["repair"]["heads"] == list(rep.heads)
    ran = surgeon_cli(["diagnose", "decimal_organism", "--model", str(out)])
    assert ran.returncode == 0, ran.stderr


def _random_repair(model, mode, strength):
    g = torch.Generator().manual_seed(3)
    values, units = {}, {}
    for L, heads in ((0, (1,)), (1, (0, 3))):
        h = f"blocks.{L}.attn.hook_z"
        v = torch.zeros(2, model.cfg.n_heads, model.cfg.d_head)
        for u in heads:
            v[:, u] = torch.randn(2, model.cfg.d_head, generator=g)
        values[h], units[h] = v, heads
    return Repair(("L0H1", "L1H0", "L1H3"), mode, strength, values, units)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma2"])
@pytest.mark.parametrize("mode,strength", [("mean", 0.8), ("steer", 1.5)])
def test_the_hugging_face_folder_runs_repaired_in_transformers(tmp_path, arch, mode, strength):
    from transformers import AutoModelForCausalLM
    from surgeon.models.loading import load_model

    src = getattr(checkpoints, f"make_{arch}")(tmp_path / "src")
    tl = load_model(str(src))
    rep = _random_repair(tl, mode, strength)
    out = tmp_path / "folded"
    assert save_folded(rep, tl, out, source=str(src)) == "huggingface"
    hf = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True, dtype=torch.float32)
    toks = torch.tensor([[0, 20, 33, 41, 12, 9, 55, 60], [0, 8, 9, 10, 11, 12, 13, 14]])
    with torch.no_grad():
        want = tl.run_with_hooks(toks, fwd_hooks=_hand_hooks({h: v[0] for h, v in rep.values.items()}, rep.units,
                                                             mode, strength))
        assert (want - tl(toks)).abs().max() > 1e-3
        torch.testing.assert_close(hf(toks).logits, want, atol=2e-4, rtol=2e-4)
        gen = hf.generate(toks[:1], max_new_tokens=4, do_sample=False)
    assert gen.shape == (1, 12)


def test_a_fold_that_cannot_be_exact_is_refused(tmp_path):
    from surgeon.models.loading import load_model

    src = checkpoints.make_qwen2(tmp_path / "qwen")
    tl = load_model(str(src))
    with pytest.raises(AnalysisError, match="no bias and no switch"):
        save_hf(src, _random_repair(tl, "mean", 1.0), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    llama = checkpoints.make_llama(tmp_path / "llama")
    folded = tmp_path / "llama-folded"
    save_hf(llama, _random_repair(load_model(str(llama)), "mean", 1.0), folded)
    with pytest.raises(ModelError, match="TransformerLens's conversion drops"):
        load_model(str(folded))  # surgeon would read it without the biases: refused, not silently wrong


def test_fold_cost_equals_hand_written_every_position_hooks(decimal_model):
    case = _case(n_trap=16, n_control=8, seed=5)
    r = surgeon.repair(case, decimal_model, heads="L0H4,L0H6", bad="qa", fold="slot0")
    rep = r.repair
    held = [case.items[i] for i in r.split.evaluation]
    hooks = _hand_hooks({h: v[0] for h, v in rep.values.items()}, rep.units, "mean", 1.0)
    for row in r.fold.rows:
        its = [it for it in held if it.tag == row.tag]
        right = before = 0
        with torch.no_grad():
            for it in its:
                ids, last, c, i = _tokens(decimal_model, case, row.format, it)
                lp = decimal_model.run_with_hooks(torch.tensor([ids]), fwd_hooks=hooks)[0, -1].log_softmax(-1)
                right += int(lp[c] > lp[i])
                lp = decimal_model(torch.tensor([ids]))[0, -1].log_softmax(-1)
                before += int(lp[c] > lp[i])
        assert round(row.repaired.value * row.repaired.n) == right and row.repaired.n == len(its), row
        assert round(row.unrepaired.value * row.unrepaired.n) == before and row.unrepaired.n == len(its), row
    # the good format's KL(unrepaired || folded): each item's correct answer teacher-forced, read at the last prompt
    # token and each answer character but the last, averaged within the item, then over items
    tok, kls = decimal_model.tokenizer, []
    with torch.no_grad():
        for it in held:
            prompt = case.formats[case.good].format(**it.values)
            ids = torch.tensor([[tok.bos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in prompt + it.correct[:-1]]])
            un = decimal_model(ids)[0].log_softmax(-1)
            rep = decimal_model.run_with_hooks(ids, fwd_hooks=hooks)[0].log_softmax(-1)
            pos = range(len(prompt), ids.shape[1])
            kls.append(sum(float((un[p].exp() * (un[p] - rep[p])).sum()) for p in pos) / len(pos))
    assert r.fold.kl_good.kl.n == len(held) and min(kls) >= 0 and max(kls) > 1e-6
    assert r.fold.kl_good.kl.value == pytest.approx(sum(kls) / len(kls), rel=1e-3, abs=1e-6)
    assert "as a model file" in str(r)
