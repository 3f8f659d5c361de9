"""A TransformerLens `TransformerBridge` gives every analysis the numbers a `HookedTransformer` holding the same weights
gives (issue 72 item 2), on tiny random checkpoints of four real layouts: GPT-2, Llama (grouped keys and values),
Qwen2 (biased q/k/v) and Gemma-2 (soft-capped, sandwich-normed). The HookedTransformer is loaded from the checkpoint
folder by surgeon (TransformerLens's own conversion); the bridge is booted from the same folder by TransformerLens and
given to the API as it is. Each result is compared through its long data frame (`to_pandas()`): every column, every
row, in order."""
from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch

import surgeon
from surgeon.models.bridge import BridgeModel
from surgeon.models.loading import load_model
from surgeon.organisms import sae_dir
from tests.checkpoints import BRIDGE_CASE as CASE
from tests.checkpoints import make_gemma2, make_gpt2, make_llama, make_qwen2

bridge_module = pytest.importorskip("transformer_lens.model_bridge",
                                    reason="this TransformerLens has no TransformerBridge")

pytestmark = pytest.mark.slow

MAKERS = {"gpt2": make_gpt2, "llama": make_llama, "qwen2": make_qwen2, "gemma2": make_gemma2}
# float32 through two implementations; fractions of the small gaps of random weights magnify its noise
RTOL, ATOL = 1e-3, 1e-4
# a TopK SAE's code is discontinuous (a feature at the k-th activation flips under float noise), so its analyses
# match to a wider tolerance; a fraction of a format gap at float32's noise (|gap| < 1e-5) is noise on both sides
SAE_RTOL, SAE_ATOL, NOISE_GAP = 5e-3, 1e-3, 1e-5
# what hashes the model's parameter names and config (by design another digest for the same weights loaded differently)
DIGESTS = {".repair.built_on.model_sha256"}
# SAEs of the width of the checkpoints' residual stream (64): the decimal organism's, on MLP outputs (random for
# these weights, which is all a comparison of two implementations needs)
SAES = str(sae_dir("decimal")) + "/blocks.{layer}.hook_mlp_out"
# (analysis, keywords): every analysis of the API that reads a model and needs no SAE
CALLS = [
    ("diagnose", {}),
    ("diagnose", {"generate": 6}),
    ("patch", {}),
    ("patch", {"component": "mlp_out"}),
    ("patch_positions", {"layers": [1]}),
    ("attention", {"heads": "L1H0,L1H3", "items": (0, 4)}),
    ("dla", {}),
    ("dla", {"value_biases": "folded"}),
    ("attribute", {}),
    ("threshold", {"layer": 1, "budget": 200}),
    ("blend", {"layer": 1, "heads": "L1H1,L1H2"}),
    ("circuit", {"method": "eap", "verify": 12}),
    ("circuit", {"method": "eap-ig-masks", "verify": 12}),
    ("circuit", {"method": "exact", "verify": 12}),
    ("sinks", {}),
    ("sae_overlap", {"layers": [0, 1], "sae_dir": SAES}),
    ("sae_amplified", {"layer": 1, "sae_dir": SAES}),
    ("sae_heads", {"layer": 1, "sae_layer": 1, "sae_dir": SAES}),
    ("sae_repair", {"layer": 1, "budget": 50, "sae_dir": SAES}),
    ("feature_circuit", {"layers": [0, 1], "verify": 5, "sae_dir": SAES}),
    ("repair", {"heads": "L1H0,L1H1", "holdout": 0.5}),
    ("repair", {"heads": "L1H2", "holdout": 0.5, "mode": "steer", "strength": 2.0, "generate": 6}),
]


@pytest.fixture(scope="module", params=sorted(MAKERS))
def pair(request, tmp_path_factory):
    """(HookedTransformer, TransformerBridge) holding one checkpoint's weights."""
    path = MAKERS[request.param](tmp_path_factory.mktemp(request.param) / "ckpt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            bridge = bridge_module.TransformerBridge.boot_transformers(str(path), device="cpu")
        finally:
            logging.disable(logging.NOTSET)
    return load_model(str(path)), bridge


def _number(v):
    if isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _numbers(x):
    """The column as floats where every value is a number (or a number written as text), else None."""
    out = [_number(v) for v in x]
    return None if any(v is None for v in out) else np.array(out)


def _frames_equal(a, b, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Every column equal: numbers to float tolerance, the rest exactly. Edges rank by |score|, and a rank among
    magnitudes equal to float tolerance is arbitrary: ranks are compared where the magnitudes say the order."""
    assert list(a.columns) == list(b.columns) and len(a) == len(b), what
    for col in a.columns:
        x, y = _numbers(a[col]), _numbers(b[col])
        if col == "rank" and "score" in a.columns:
            s = np.abs(a["score"].to_numpy(float))
            apart = np.abs(s[:, None] - s[None, :]) > ATOL
            assert ((np.sign(x[:, None] - x[None, :]) == np.sign(y[:, None] - y[None, :])) | ~apart).all(), what
        elif col == "fraction" and "effect" in a.columns:  # effect / gap
            with np.errstate(divide="ignore", invalid="ignore"):
                real = ~(np.abs(a["effect"].to_numpy(float) / x) < NOISE_GAP)
            assert real.any(), what
            np.testing.assert_allclose(y[real], x[real], rtol=rtol, atol=atol, err_msg=f"{what}: {col}")
        elif x is not None and y is not None:
            np.testing.assert_allclose(y, x, rtol=rtol, atol=atol, err_msg=f"{what}: {col}")
        else:
            for i, (u, v) in enumerate(zip(a[col], b[col])):
                if _number(u) is not None and _number(v) is not None:
                    np.testing.assert_allclose(_number(v), _number(u), rtol=rtol, atol=atol,
                                               err_msg=f"{what}: {col}[{i}]")
                else:
                    assert u == v, f"{what}: {col}[{i}]"


def _flat(obj, path: str = ""):
    """(path, value) for every number and text in a result object, depth first."""
    import dataclasses

    if isinstance(obj, torch.Tensor):
        obj = obj.detach().cpu().double().numpy()
    if dataclasses.is_dataclass(obj):
        obj = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flat(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)) or (isinstance(obj, np.ndarray) and obj.dtype == object):
        for i, v in enumerate(obj):
            yield from _flat(v, f"{path}[{i}]")
    elif isinstance(obj, np.ndarray):
        yield from ((f"{path}[{i}]", float(v)) for i, v in enumerate(obj.ravel()))
    elif obj is not None:
        yield path, obj


def _frame(r):
    """A result's long data frame; for one with no table form (sinks, a repair), its fields as one."""
    import pandas as pd

    try:
        return r.to_pandas()
    except TypeError:
        pass
    rows = [(p, v) for p, v in _flat(r) if p not in DIGESTS]
    return pd.DataFrame({"path": [p for p, _ in rows], "value": [v for _, v in rows]})


@pytest.mark.parametrize("call", CALLS, ids=[f"{n}-{'-'.join(str(v) for x, v in k.items() if x != 'sae_dir')}" if k
                                             else n for n, k in CALLS])
def test_every_analysis_gives_the_hooked_transformers_numbers(pair, call):
    ht, bridge = pair
    name, kwargs = call
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = getattr(surgeon, name)(CASE, (ht, ht.tokenizer), **kwargs)
        got = getattr(surgeon, name)(CASE, bridge, **kwargs)
    sae = name.startswith("sae") or name == "feature_circuit"
    _frames_equal(_frame(want), _frame(got), name, *((SAE_RTOL, SAE_ATOL) if sae else (RTOL, ATOL)))


@pytest.mark.parametrize("start", [0, 1])
def test_the_forward_from_a_layer_with_a_prefix_cache_is_hooked_transformers(pair, start):
    """What the engine calls: `model(residual, start_at_layer, stop_at_layer=n_layers, past_kv_cache)` with the prefix's
    keys and values in a TransformerLens cache, on rows of different tokens; equal to HookedTransformer's and to its
    own unpatched run, and the blocks before `start` do not run."""
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
    from transformer_lens.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

    ht, bridge = pair
    model = BridgeModel(bridge)
    tokens, p0, n = torch.tensor([[1, 5, 9, 12, 33, 40, 7, 8], [1, 6, 19, 2, 3, 4, 5, 9]]), 3, ht.cfg.n_layers
    with torch.no_grad():
        _, cache = ht.run_with_cache(tokens)

        def kv():
            return TransformerLensKeyValueCache(entries=[None] * start + [TransformerLensKeyValueCacheEntry(
                cache[f"blocks.{L}.attn.hook_k"][:, :p0], cache[f"blocks.{L}.attn.hook_v"][:, :p0], frozen=True)
                for L in range(start, n)], previous_attention_mask=torch.ones(2, p0, dtype=torch.int), frozen=True)

        resid = cache[f"blocks.{start}.hook_resid_pre"][:, p0:]
        want = ht(resid, start_at_layer=start, stop_at_layer=n, past_kv_cache=kv())
        ran = []
        handle = bridge.blocks[0].attn.register_forward_hook(lambda *a: ran.append(0))
        try:
            got = model(resid, start_at_layer=start, stop_at_layer=n, past_kv_cache=kv())
        finally:
            handle.remove()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got, cache[f"blocks.{n - 1}.hook_resid_post"][:, p0:], rtol=1e-4, atol=1e-5)
    assert len(ran) == (start == 0)
    # the adapter converts a cache entry once and reuses it while the entry is the same: one changed in place, or
    # another entry, is converted anew (each pass compared with HookedTransformer's on that cache)
    with torch.no_grad():
        same = kv()
        for step in ("first", "again", "changed in place"):
            if step == "changed in place":
                for e in same.entries[start:]:
                    e.past_keys.mul_(0.5)
            torch.testing.assert_close(model(resid, start_at_layer=start, stop_at_layer=n, past_kv_cache=same),
                                       ht(resid, start_at_layer=start, stop_at_layer=n, past_kv_cache=same),
                                       rtol=1e-4, atol=1e-5, msg=step)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # their random weights generate varied tokens, gpt2's and
def test_generation_on_a_bridge_is_the_hooked_transformers(arch, tmp_path):  # gemma2's one token repeated
    """Cached generation (`generate`'s default), plain through the adapter and under `surgeon.apply(bridge, repair)`
    around the user's own `bridge.generate`: the HookedTransformer's tokens. (TransformerLens 3.9's bridge under
    transformers 5 reads its key/value cache only inside surgeon's context: alone it repeats one token.) Neither
    side generates one token repeated, and the repair changes what is generated: the comparisons are not vacuous."""
    path = MAKERS[arch](tmp_path / arch)
    ht = load_model(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = bridge_module.TransformerBridge.boot_transformers(str(path), device="cpu")
        tokens = ht.tokenizer("Q: Which is bigger: 9.8 or 9.11?\nA:", return_tensors="pt").input_ids

        def gen(m):
            return m.generate(tokens, max_new_tokens=6, do_sample=False, verbose=False)[0, -6:].tolist()

        plain = gen(ht)
        assert gen(BridgeModel(bridge)) == plain and len(set(plain)) > 2
        repair = surgeon.repair(CASE, bridge, heads="L1H0,L1H1", mode="mean", holdout=0.5)
        with surgeon.apply(ht, repair, any_model=True):
            want = gen(ht)
        with surgeon.apply(bridge, repair, any_model=True):
            got = gen(bridge)
        wrapped = BridgeModel(bridge)  # the adapter given instead: applied to the bridge it wraps
        with surgeon.apply(wrapped, repair, any_model=True):
            got_wrapped = gen(wrapped)
    assert got == want == got_wrapped and want != plain and len(set(want)) > 2
    assert "generate" not in vars(bridge) and not [n for n, h in bridge.hook_dict.items() if h._forward_hooks]


def test_the_bridge_is_left_as_it_was_given(pair):
    """Nothing the engine sets inside a call (a module's forward, the config's switches, hooks) stays on the user's
    bridge: its logits and its modules' attributes after every analysis are as before."""
    ht, bridge = pair
    tokens = torch.tensor([[1, 5, 9, 12, 33, 40]])
    with torch.no_grad():
        before = bridge(tokens)
    forwards = {n for n, m in bridge.named_modules() if "forward" in vars(m)}
    cfg = (bridge.cfg.use_split_qkv_input, bridge.cfg.use_hook_mlp_in)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        surgeon.circuit(CASE, bridge, method="exact", verify=6)
        surgeon.patch(CASE, bridge)
    with torch.no_grad():
        after = bridge(tokens)
    assert torch.equal(before, after)
    assert {n for n, m in bridge.named_modules() if "forward" in vars(m)} == forwards
    assert (bridge.cfg.use_split_qkv_input, bridge.cfg.use_hook_mlp_in) == cfg
    assert not [n for n, h in bridge.hook_dict.items() if h._forward_hooks or h._backward_hooks]
    assert isinstance(surgeon.api.case_and_model(CASE, bridge)[1], BridgeModel)


def test_the_adapters_hooks_and_cache_are_the_bridges_own(pair):
    """The adapter's `hooks` and `run_with_cache` (which read the bridge's hook points once, bench/bridge.py) hook
    what the bridge's own context hooks: a filter reaches the same points, under the same names, switched-off ones
    skipped; names and aliases cache the same activations; everything is removed at the end."""
    _, bridge = pair
    model = BridgeModel(bridge)
    tokens = torch.tensor([[1, 5, 9, 12, 33, 40], [2, 7, 3, 8, 21, 30]])
    picks = (lambda n: True, lambda n: n.endswith(("hook_z", "hook_q_input", "hook_resid_pre")))

    def seen_under(context, pick):
        seen = []
        with warnings.catch_warnings(), context(fwd_hooks=[(pick, lambda x, hook: seen.append(hook.name))]):
            warnings.simplefilter("ignore")
            hooked = sorted(n for n, h in bridge.hook_dict.items() for _ in h._forward_hooks)  # once per hook added
            with torch.no_grad():
                bridge(tokens)
        return hooked, seen

    for pick in picks:
        ours, theirs = seen_under(model.hooks, pick), seen_under(bridge.hooks, pick)
        assert ours == theirs and any(n.endswith("hook_z") for n in ours[1])
        assert not any("q_input" in n for n in ours[0])  # switched off: skipped, not hooked
    names = ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_z", "blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"]
    with torch.no_grad():
        out, cache = model.run_with_cache(tokens, names_filter=names)
        ref_out, ref = bridge.run_with_cache(tokens, names_filter=names)
    torch.testing.assert_close(out, ref_out)
    for n in names:
        torch.testing.assert_close(cache[n], ref[n], rtol=0, atol=0)
    assert not [n for n, h in bridge.hook_dict.items() if h._forward_hooks or h._backward_hooks]


def test_the_command_line_loads_a_checkpoint_as_a_bridge(tmp_path, capsys):
    """`--loader bridge` (and a `bridge:` model spec, on every route) loads the checkpoint as a TransformerBridge: the
    same numbers as the HookedTransformer the default loader converts; an organism or a TransformerLens folder is
    refused before any weight loads, naming the field and the fix."""
    import json

    from surgeon.cli import main

    path = make_llama(tmp_path / "llama")
    case = tmp_path / "case.py"
    case.write_text("from tests.models.test_bridge_numbers import CASE as case\n")
    got = {}
    for loader in ("hooked", "bridge"):
        argv = ["patch", str(case), "--model", str(path), "--loader", loader, "--out", str(tmp_path / loader)]
        assert main(argv) == 0
        got[loader] = json.loads((tmp_path / loader / "results.json").read_text())["result"]
    np.testing.assert_allclose(got["bridge"]["per_item"], got["hooked"]["per_item"], rtol=RTOL, atol=ATOL)
    by_spec = surgeon.patch(CASE, f"bridge:{path}")
    np.testing.assert_allclose(by_spec.per_item, np.asarray(got["hooked"]["per_item"]), rtol=RTOL, atol=ATOL)
    capsys.readouterr()
    assert main(["patch", str(case), "--model", "organism:decimal", "--loader", "bridge"]) == 2
    err = capsys.readouterr().err
    assert "field 'model'" in err and "is an organism" in err and "fix: drop 'bridge:'" in err
    assert "Traceback" not in err


def test_a_repair_does_not_fold_into_a_bridge_but_into_its_checkpoint(pair, tmp_path):
    """Folding writes a HookedTransformer's weights: a bridge (object or `bridge:` spec) is refused naming the field
    and the fix, with nothing written; the bridge's repair folds into the HookedTransformer of the same weights as the
    fix says (the bridge's digest is another: any_model)."""
    ht, bridge = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        repair = surgeon.repair(CASE, bridge, heads="L1H0,L1H1", holdout=0.5)
    for model in (bridge, BridgeModel(bridge)):
        with pytest.raises(surgeon.SurgeonError) as e:
            surgeon.fold(repair, model, tmp_path / "out")
        assert e.value.field == "model" and "any_model=True" in e.value.fix
    assert not (tmp_path / "out").exists()
    with pytest.raises(surgeon.SurgeonError):  # built on the bridge: another digest
        surgeon.fold(repair, ht, tmp_path / "ht")
    assert surgeon.fold(repair, ht, tmp_path / "ht", any_model=True) and (tmp_path / "ht").is_dir()


def test_the_report_on_a_bridge_is_the_hooked_transformers(tmp_path):
    """`surgeon.report` (every step, saved): each step's results.json holds the HookedTransformer's numbers and text,
    but for how the run went (its execution record: paths, timings, memory) and the model's digest."""
    import json

    path = make_llama(tmp_path / "llama")
    ht = load_model(str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = bridge_module.TransformerBridge.boot_transformers(str(path), device="cpu")
        surgeon.report(CASE, (ht, ht.tokenizer), out=tmp_path / "hooked")
        surgeon.report(CASE, bridge, out=tmp_path / "bridge")
    steps = sorted(p.parent.name for p in (tmp_path / "hooked").glob("*/results.json"))
    assert steps == sorted(p.parent.name for p in (tmp_path / "bridge").glob("*/results.json")) and len(steps) >= 8
    for step in steps:
        want, got = (json.loads((tmp_path / side / step / "results.json").read_text()) for side in ("hooked", "bridge"))
        rows = [(p, v) for p, v in _flat(want) if ".execution" not in p and "sha256" not in p]
        got = dict(_flat(got))
        for p, v in rows:
            if _number(v) is not None and not isinstance(v, str):
                np.testing.assert_allclose(_number(got[p]), _number(v), rtol=RTOL, atol=ATOL, err_msg=f"{step}{p}")
            else:
                assert got[p] == v, f"{step}{p}"
