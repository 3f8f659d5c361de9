"""Attention sinks and massive activations (issue 54, items 1 and 3): the measures against hand-written
TransformerLens hooks over one prompt at a time, the threshold organism's attention to BOS from its construction
(after '?' each even head puts weight 1 - W_BAD on BOS from the last position; after ':' none), and every measure on
the sink organism (a planted super neuron, its massive activation and a sink head) against its closed form."""
import dataclasses

import numpy as np
import pytest
import torch

import surgeon
import surgeon.api
from surgeon.analyses.sinks import sinks
from tests.conftest import ROOT
from tests.cli_in_process import surgeon as surgeon_cli


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
    # one-hot embeddings: the median |activation| is 0, the ratio infinite, said as such (and read back as such)
    assert "median 0" in str(r) and not qa.massive[0]["massive"]


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

    bad = surgeon_cli(["sinks", "--epsilon", "0"])
    assert bad.returncode == 2 and "--epsilon" in bad.stderr and "Traceback" not in bad.stderr
    ok = surgeon_cli(["sinks", "--out", str(tmp_path / "s")])
    assert ok.returncode == 0, ok.stderr
    r = surgeon.load(tmp_path / "s")
    assert [f.format for f in r.formats] == ["plain", "qa", "chat"] and "sink rate" in ok.stdout
    # read back whole: the super neurons and the query/key concentrations (nan where a head has no signal) print as
    # they did, and the figure is written beside the results
    assert "super neurons" in ok.stdout and "rot_q" in ok.stdout
    assert r.formats[0].qk["rot_k"].share.shape == (3, 2) and len(r.formats[0].super_neurons) == 3
    printed = [x for x in ok.stdout.splitlines() if x.strip() and not x.startswith("wrote")]
    assert str(r).splitlines()[-4:] == printed[-4:]
    assert (tmp_path / "s" / "sinks.png").exists()


def _sink_case():
    from surgeon import Case, Item
    from surgeon.organisms import sink as O

    return Case(name="sink_organism", model="organism:sink", formats=dict(O.FORMATS), good="plain", bad=["chat"],
                items=[Item({"x": x, "y": y}, correct=y, incorrect=x) for x, y in O.items_values()], align="last")


@pytest.fixture(scope="module")
def sink_model():
    from surgeon.models.loading import load_model

    return load_model("organism:sink")


def test_sink_organism_measures_equal_its_closed_form(sink_model):
    """Every number `sinks` reports on the sink organism, against the organism's closed form (numpy from the
    construction; no model run, no engine): per-head sink mass and last-position mass, the strongest other sink and
    its token, the sink rate, the first token's norm ratio, the massive activation (value, dimension, position, ratio
    to the median), the super neurons and their shares, and the query/key concentration."""
    from surgeon.organisms import sink as O

    case = _sink_case()
    r = sinks(case, sink_model, batch_size=7)
    tok = sink_model.tokenizer
    flagged, bos = O.flagged_ids(tok), tok.convert_tokens_to_ids("<bos>")
    L, H = O.CONFIG["n_layers"], O.CONFIG["n_heads"]
    for fmt in ("plain", "chat"):
        mass, last, other = np.zeros((L, H)), np.zeros((L, H)), np.zeros((L, H))
        ratio, top, med = np.zeros(L), [None] * L, [[] for _ in range(L)]
        writes = {}
        for it in case.items:
            ids = _prompt(sink_model, case, fmt, it)
            cf = O.closed_form(ids, flagged, bos)
            T = len(ids)
            for l in range(L):
                A = cf["pattern"][l]
                mass[l] += A[:, 1:, 0].mean(1)
                last[l] += A[:, T - 1, 0]
                seen = np.stack([[A[h, k:, k].mean() for k in range(1, T)] for h in range(H)])
                other[l] += seen.max(1)
                x = cf["resid_post"][l]
                n = np.linalg.norm(x, axis=1)
                ratio[l] += n[0] / np.median(n[1:])
                p, d = np.unravel_index(np.abs(x).argmax(), x.shape)
                if top[l] is None or abs(x[p, d]) > top[l][0]:
                    top[l] = (abs(x[p, d]), int(d), int(p))
                med[l].append(np.abs(x).ravel())
            post = cf["post"][0][0]  # layer 0's neurons at position 0 (the massive activation's)
            writes.setdefault("n0", []).append(post[O.SUPER] * O.M)
            writes.setdefault("n1", []).append(post[O.SMALL_NEURON] * O.SMALL)
            writes.setdefault("x", []).append(cf["resid_post"][0][0, O.MASSIVE])
        k = len(case.items)
        got = r.of(fmt)
        np.testing.assert_allclose(got.mass, mass / k, atol=2e-6)
        np.testing.assert_allclose(got.last, last / k, atol=2e-6)
        np.testing.assert_allclose(got.other_mass, other / k, atol=2e-6)
        assert got.sink_rate.value == float((mass / k > 0.3).mean()) == 0.25  # the sink head alone
        np.testing.assert_allclose([e.value for e in got.first_norm_ratio], ratio / k, rtol=1e-5)
        for l in range(L):
            m = got.massive[l]
            assert (m["dim"], m["position"], m["token"]) == (O.MASSIVE, 0, "<bos>")
            assert m["value"] == pytest.approx(top[l][0], rel=1e-6) == O.M + O.SMALL * 0.5
            assert m["ratio"] == pytest.approx(top[l][0] / np.median(np.concatenate(med[l])), rel=1e-6)
            assert m["massive"]
            first, second = got.super_neurons[l][:2]
            assert (first["layer"], first["neuron"], second["layer"], second["neuron"]) == (0, O.SUPER, 0, O.SMALL_NEURON)
            assert first["write"] == pytest.approx(np.mean(writes["n0"]), rel=1e-6)
            assert second["write"] == pytest.approx(np.mean(writes["n1"]), rel=1e-5)
            assert first["share"] == pytest.approx(np.mean(writes["n0"]) / np.mean(writes["x"]), rel=1e-6)
        q, kk = got.qk["q"], got.qk["k"]
        assert q.share[1, 0] == pytest.approx(1.0) and q.dim[1][0] == 0 and kk.share[1, 0] == pytest.approx(1.0)
        assert np.isnan(q.share[0]).all() and np.isnan(q.share[1, 1]) and q.dim[0][0] is None  # no signal: said so
    # the chat template's '#' after BOS is a second sink: the sink head splits its attention between the two
    plain, chat = r.of("plain"), r.of("chat")
    assert plain.mass[1, 0] > 0.95 and 0.45 < chat.mass[1, 0] < 0.5 and chat.other_token[1][0] == "#"
    assert chat.other_mass[1, 0] == pytest.approx(chat.mass[1, 0], abs=0.01)
    # a mutation reading key 1 as the sink (the wrong position) would report the plain sink head near 0, not 0.97
    assert plain.other_mass[1, 0] < 0.05


def test_super_neurons_and_query_key_values_equal_hand_written_hooks(decimal_model):
    """On the decimal organism (rotary, grouped-query attention, gated MLPs): each layer's super neurons (activation x
    W_out on the massive dimension at its position, mean over items) and the query/key energy shares before and after
    rotary, with plain TransformerLens hooks one prompt at a time."""
    case = dataclasses.replace(surgeon.api.read("decimal_organism"), items=surgeon.api.read("decimal_organism").items[:10])
    r = sinks(case, decimal_model, batch_size=4)
    L = decimal_model.cfg.n_layers
    got = r.of("qa")
    for l in range(L):
        d, p = got.massive[l]["dim"], got.massive[l]["position"]
        want = {}
        xs = []
        with torch.no_grad():
            for it in case.items:
                ids = _prompt(decimal_model, case, "qa", it)
                if len(ids) <= p:
                    continue
                _, cache = decimal_model.run_with_cache(torch.tensor([ids]))
                xs.append(float(cache[f"blocks.{l}.hook_resid_post"][0, p, d]))
                for m in range(l + 1):
                    post = cache[f"blocks.{m}.mlp.hook_post"][0, p].double()
                    w = post * decimal_model.blocks[m].mlp.W_out[:, d].double()
                    for i, v in enumerate(w.tolist()):
                        want.setdefault((m, i), []).append(v)
        n = len(xs)
        best = sorted(want.items(), key=lambda kv: -abs(sum(kv[1])))[:3]
        for s_, ((m, i), vs) in zip(got.super_neurons[l], best):
            assert (s_["layer"], s_["neuron"]) == (m, i)
            assert s_["write"] == pytest.approx(np.mean(vs), rel=1e-5, abs=1e-7)
            half = 1.959964 * np.std(vs, ddof=1) / np.sqrt(n)  # a normal 95% interval over the items
            assert (s_["lo"], s_["hi"]) == (pytest.approx(np.mean(vs) - half, abs=1e-6),
                                            pytest.approx(np.mean(vs) + half, abs=1e-6))
            assert s_["share"] == pytest.approx(np.mean(vs) / (sum(xs) / n), rel=1e-5)
    for kind, hook in (("q", "hook_q"), ("k", "hook_k"), ("rot_q", "hook_rot_q"), ("rot_k", "hook_rot_k")):
        shares = []
        with torch.no_grad():
            for it in case.items:
                ids = _prompt(decimal_model, case, "qa", it)
                _, cache = decimal_model.run_with_cache(torch.tensor([ids]))
                e = torch.stack([cache[f"blocks.{l}.attn.{hook}"][0].double().pow(2).sum(0) for l in range(L)])
                shares.append((e.max(-1).values / e.sum(-1)).numpy())
        np.testing.assert_allclose(got.qk[kind].share, np.mean(shares, axis=0), rtol=1e-6)


# ------------------------------------------------------------------------------------------- interventions

def _hand_scores(model, rows, hooks) -> np.ndarray:
    """Each row's score (sum of sign x log P(target) over its targets) with `hooks` installed: plain TransformerLens,
    one row at a time, every position of the row intervened."""
    out = np.zeros(max(r.item for r in rows) + 1)
    with torch.no_grad():
        for r in rows:
            logits = model.run_with_hooks(torch.tensor([list(r.tokens)]), fwd_hooks=hooks)[0].double()
            logp = logits.log_softmax(-1)
            out[r.item] += float(sum(sign * logp[p, t] for p, t, sign in r.targets))
    return out


def _remove(head, key=0, renormalise=True):
    def hook(p, hook):
        orig, p = p, p.clone()
        p[:, head, :, key] = 0
        if renormalise:  # a query with no other key (the first position) keeps its pattern
            total = p.sum(-1, keepdim=True)
            p = torch.where(total > 0, p / total.clamp_min(1e-30), orig)
        return p
    return hook


def _set(unit, value, position=None):
    def hook(x, hook):
        x = x.clone()
        if position is None:
            x[..., unit] = value
        else:
            x[:, position, unit] = value
        return x
    return hook


def _scale(position, factor):
    def hook(x, hook):
        x = x.clone()
        x[:, position] = x[:, position] * factor
        return x
    return hook


def test_every_intervention_equals_hand_written_hooks(decimal_model):
    """Each intervention's scores from the one engine (all candidates batched) equal a plain TransformerLens run of
    the same intervention by hand, row by row, on the decimal organism (rotary, grouped-query attention): a sink
    removed and renormalised, a residual dimension and an MLP neuron set to zero or a mean at every position, a
    token's residual stream scaled. A removal that does not renormalise, or removes key 1, gives other scores."""
    from surgeon.analyses.common import case_metric, format_rows
    from surgeon.analyses.sink_interventions import Candidate, run_candidates
    from surgeon.engine.contrast import Contrast
    from surgeon.sites.sinks import SinkRemoval, TokenScale, UnitValue

    case = surgeon.api.read("decimal_organism")
    items = case.items_for("trap")[:8]
    rows = format_rows(case, decimal_model, "qa", items)
    metric, ref = case_metric(case, decimal_model, items)
    c = Contrast(decimal_model, rows, rows, "index", batch_size=16, metric=metric, reference=ref)
    cfg = decimal_model.cfg

    def one(n, unit):
        m = torch.zeros(1, n)
        m[0, unit] = 1.0
        return m

    v = torch.zeros(cfg.d_model)
    v[56] = 0.7
    w = torch.zeros(cfg.d_mlp)
    cands = [Candidate("remove L1H6", SinkRemoval(1), one(cfg.n_heads, 6)),
             Candidate("remove L2H3", SinkRemoval(2), one(cfg.n_heads, 3)),
             Candidate("d56 := 0.7", UnitValue("blocks.0.hook_resid_post", v), one(cfg.d_model, 56)),
             Candidate("neuron 5 := 0", UnitValue("blocks.0.mlp.hook_post", w), one(cfg.d_mlp, 5)),
             Candidate("d56 := 0.7 at position 2", UnitValue("blocks.1.hook_resid_post", v, 2), one(cfg.d_model, 56)),
             Candidate("position 3 x10", TokenScale(1, 3, 10.0), torch.ones(1, 1))]
    got = run_candidates(c, cands)
    hands = [[("blocks.1.attn.hook_pattern", _remove(6))], [("blocks.2.attn.hook_pattern", _remove(3))],
             [("blocks.0.hook_resid_post", _set(56, 0.7))], [("blocks.0.mlp.hook_post", _set(5, 0.0))],
             [("blocks.1.hook_resid_post", _set(56, 0.7, position=2))],
             [("blocks.1.hook_resid_pre", _scale(3, 10.0))]]
    for p, hooks in enumerate(hands):
        np.testing.assert_allclose(got[p], _hand_scores(decimal_model, rows, hooks), atol=2e-4, err_msg=cands[p].name)
    clean = _hand_scores(decimal_model, rows, [])
    np.testing.assert_allclose(c.clean_base.numpy(), clean, atol=2e-4)
    assert np.abs(got - clean[None]).max() > 1e-2  # the interventions do something here
    # mutations: not renormalised, or the wrong key, are other numbers
    for wrong in (_remove(6, renormalise=False), _remove(6, key=1)):
        assert np.abs(_hand_scores(decimal_model, rows, [("blocks.1.attn.hook_pattern", wrong)]) - got[0]).max() > 1e-3


def test_sink_organism_interventions_move_attention_as_constructed(sink_model):
    """On the sink organism, from its construction: removing the sink of L1H0 leaves it no attention on BOS; zeroing
    the massive dimension after layer 0 (or the super neuron) leaves the sink head's scores flat, so it attends
    uniformly, 1/(p+1) from position p, as the head beside it does; nothing writes the answer, so the effects on
    the failure say there is no gap to repair."""
    from surgeon.analyses.sink_interventions import sink_interventions
    from surgeon.organisms import sink as O

    case = _sink_case()
    r = sink_interventions(case, sink_model, tag="all")
    assert r.interventions[0] == "remove the sink of L1H0"
    assert any(n.startswith("zero-ablate the massive dimension d1 after layer 0") for n in r.interventions)
    assert any(n.startswith("zero-ablate the super neuron L0N0") for n in r.interventions)
    tok = sink_model.tokenizer
    T = len(_prompt(sink_model, case, "plain", case.items[0]))
    uniform = float(np.mean([1 / (p + 1) for p in range(1, T)]))
    moved = {(m.intervention, m.format): m for m in r.moved if m.head == "L1H0"}
    plain_before = moved["remove the sink of L1H0", "plain"].before
    cf = O.closed_form(_prompt(sink_model, case, "plain", case.items[0]), O.flagged_ids(tok),
                       tok.convert_tokens_to_ids("<bos>"))["pattern"][1][0]
    assert plain_before == pytest.approx(cf[1:, 0].mean(), abs=1e-6)
    for fmt in ("plain", "chat"):
        assert moved["remove the sink of L1H0", fmt].after == pytest.approx(0.0, abs=1e-7)
        zeroed = moved["zero-ablate the massive dimension d1 after layer 0", fmt]
        T_f = len(_prompt(sink_model, case, fmt, case.items[0]))
        assert zeroed.after == pytest.approx(float(np.mean([1 / (p + 1) for p in range(1, T_f)])), abs=1e-6)
    assert moved["zero-ablate the massive dimension d1 after layer 0", "plain"].after == pytest.approx(uniform, abs=1e-6)
    # the super neuron zeroed: BOS keeps the small neuron's 0.25, a score of S x 0.25 / M: almost flat
    assert moved["zero-ablate the super neuron L0N0", "plain"].after < uniform + 0.01
    assert all(np.isnan(e.fraction.value) for e in r.effects)  # the organism answers nothing: no gap to repair


def test_cli_sinks_intervene(tmp_path):

    bad = surgeon_cli(["sinks", "--heads", "L1H0"])
    assert bad.returncode == 2 and "--intervene" in bad.stderr and "Traceback" not in bad.stderr
    bad = surgeon_cli(["sinks", "--intervene", "--amplify", "3x10"])
    assert bad.returncode == 2 and "POS:FACTOR@LAYER" in bad.stderr
    ok = surgeon_cli(["sinks", "--intervene", "--heads", "L1H6", "--amplify", "3:10@1",
                         "--out", str(tmp_path / "i")])
    assert ok.returncode == 0, ok.stderr
    assert "remove the sink of L1H6" in ok.stdout and "amplify position 3 x10 entering layer 1" in ok.stdout
    r = surgeon.load(tmp_path / "i")
    assert r.interventions[0] == "remove the sink of L1H6" and r.measured is not None
    assert {e.format for e in r.effects} == {"plain", "qa", "chat"} and r.n_items == 64  # the focus: trap items
    printed = [x for x in ok.stdout.splitlines() if x.strip() and not x.startswith("wrote")]
    assert str(r).splitlines()[-3:] == printed[-3:]


@pytest.mark.parametrize("layout", ["tiny-llama-gqa", "qwen2", "gemma-2-local"])
def test_sinks_and_interventions_on_real_layouts(layout, tmp_path):
    """Llama (rotary, grouped-query attention, RMSNorm), Qwen2 (q/k/v biases) and Gemma-2 (soft-capping, sliding
    window, sandwich norms) layouts from Hugging Face checkpoints: the measures and a sink removal equal
    hand-written TransformerLens hooks, and every intervention runs in every format."""
    import os

    from surgeon import load_case
    from surgeon.analyses.common import case_metric, format_rows
    from surgeon.analyses.sink_interventions import Candidate, run_candidates, sink_interventions
    from surgeon.engine.contrast import Contrast
    from surgeon.models.loading import load_model
    from surgeon.sites.sinks import SinkRemoval
    from tests.checkpoints import make_gemma2, make_llama, make_qwen2
    from tests.conftest import ROOT

    path = {"tiny-llama-gqa": make_llama, "qwen2": make_qwen2, "gemma-2-local": make_gemma2}[layout](tmp_path / layout)
    model = load_model(str(path))
    case = load_case(os.path.join(ROOT, "cases", "llama31_decimal.py"), model=str(path), check_model=False)
    case = dataclasses.replace(case, items=case.items[:6], layers=None)
    if not getattr(model.tokenizer, "chat_template", None):  # a checkpoint without a chat template: no chat format
        case = dataclasses.replace(case, formats={k: v for k, v in case.formats.items() if k != "chat"},
                                   bad=[b for b in case.bad_formats if b != "chat"])
    r = sinks(case, model, batch_size=4)
    L = model.cfg.n_layers
    for fmt in r.formats:
        rows = format_rows(case, model, fmt.format, case.items)  # prompts as the case encodes them (chat template)
        mass = np.zeros_like(fmt.mass)
        with torch.no_grad():
            for it in range(len(case.items)):
                ids = next(x for x in rows if x.item == it).tokens[: next(x for x in rows if x.item == it).n_prompt]
                _, cache = model.run_with_cache(torch.tensor([list(ids)]))
                for layer in range(L):
                    A = cache[f"blocks.{layer}.attn.hook_pattern"][0].double()
                    mass[layer] += A[:, 1:, 0].mean(1).numpy()
        np.testing.assert_allclose(fmt.mass, mass / len(case.items), atol=1e-5, err_msg=fmt.format)
        assert set(fmt.qk) == {"q", "k", "rot_q", "rot_k"}
    bad = case.bad_formats[0]
    rows = format_rows(case, model, bad, case.items)
    metric, ref = case_metric(case, model, case.items)
    c = Contrast(model, rows, rows, "index", batch_size=8, metric=metric, reference=ref)
    m = torch.zeros(1, model.cfg.n_heads)
    m[0, 1] = 1.0
    got = run_candidates(c, [Candidate("remove L1H1", SinkRemoval(1), m)])[0]
    np.testing.assert_allclose(got, _hand_scores(model, rows, [("blocks.1.attn.hook_pattern", _remove(1))]), atol=2e-4)
    res = sink_interventions(case, model, tag="all", measured=r, batch_size=4)
    assert {e.format for e in res.effects} == set(case.formats) and len(res.interventions) >= 3


def test_the_sinks_memory_plan_counts_what_a_pass_keeps_and_fits_max_memory(decimal_model, tmp_path):
    """The plan's kept activations per row are what a batch of the longest rows holds (patterns, residual stream,
    queries and keys of every layer, counted from the tensors); a smaller --max-memory lowers the batch size without
    changing a number, and one that cannot hold a row is refused before the work."""

    from surgeon.analyses.sinks import plan
    from surgeon.analyses.common import prepend_bos
    from surgeon.engine.readout import cached_batches
    from surgeon.case.encoding import prompt_rows

    case = surgeon.api.read("decimal_organism")
    items = case.items[:16]
    p, _ = plan(case, decimal_model, items, 64, None)
    rows = sorted((r for f in [case.good, *case.bad_formats]
                   for r in prompt_rows(case.formats[f], items, decimal_model.tokenizer, prepend_bos(case, decimal_model))),
                  key=lambda r: -len(r.tokens))[:3]
    kinds = ["q", "k", "rot_q", "rot_k"]
    L = decimal_model.cfg.n_layers
    hooks = [f"blocks.{l}.attn.hook_pattern" for l in range(L)] + [f"blocks.{l}.hook_resid_post" for l in range(L)]
    hooks += [f"blocks.{l}.attn.hook_{k}" for l in range(L) for k in kinds]
    with torch.no_grad():
        _, acts = next(cached_batches(decimal_model, rows, hooks, 3))
    held = sum(a.numel() * a.element_size() for a in acts.values())
    assert p.parts["kept activations"] / p.batch_size * 3 == held
    # --max-memory: a smaller batch, the same numbers; too small: refused before the work
    small, _ = plan(case, decimal_model, items, 64, p.parts["weights"] + 3 * (p.peak - p.parts["weights"]) // p.batch_size)
    assert small.batch_size == 3 < p.batch_size
    a, b = sinks(dataclasses.replace(case, items=items), decimal_model, batch_size=p.batch_size), \
        sinks(dataclasses.replace(case, items=items), decimal_model, batch_size=small.batch_size)
    np.testing.assert_allclose(a.of("qa").mass, b.of("qa").mass, atol=1e-6)
    r = surgeon_cli(["sinks", "--max-memory", "1MB", "--out", str(tmp_path / "o")])
    assert r.returncode == 2 and "at batch size 1" in r.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("kw,phrase", [
    ({"amplify": (3, 1e39, 1)}, "overflowing"),
    ({"amplify": (3, float("nan"), 1)}, "overflowing"),
    ({"amplify": (99, 10.0, 0)}, "would change nothing"),
    ({"amplify": (3, 10.0, 99)}, "the model has"),
    ({"heads": ["L9H9"]}, "not a head of this model"),
])
def test_interventions_that_mean_nothing_are_refused_before_the_sinks_are_measured(decimal_model, monkeypatch, kw,
                                                                                  phrase):
    import surgeon.analyses.sink_interventions as si
    from surgeon.errors import SurgeonError

    def measured(*a, **k):
        raise AssertionError("the sinks were measured before the interventions were checked")

    monkeypatch.setattr(si, "sinks", measured)
    case = surgeon.load_case(f"{ROOT}/cases/decimal_organism.py")
    with pytest.raises(SurgeonError) as e:
        si.sink_interventions(case, decimal_model, **kw)
    assert phrase in str(e.value), str(e.value)


def test_the_sink_effects_interval_pairs_the_formats_on_the_same_items():
    """An intervention that turns every failing score into the same item's good one repairs exactly 1 on every
    resample of the items: the interval is [1, 1] when the formats are resampled together (paired), and not when
    the good format is resampled apart."""
    from surgeon.analyses.sink_interventions import _ratio

    rng = np.random.default_rng(3)
    good = rng.normal(5, 3, 40)
    bad = good - rng.normal(4, 2, 40)
    e = _ratio(good.copy(), bad, good, bad, damage=False)
    assert e.value == pytest.approx(1.0) and e.lo == pytest.approx(1.0) and e.hi == pytest.approx(1.0)
