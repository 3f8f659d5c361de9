"""A repair that needs the failing prompt alone (issue 52): built on discovery items, measured on held-out ones, applied
to a model and saved. The expected numbers come from hand-written TransformerLens hooks over one prompt at a time
(the tokens built here from the templates, the good format's mean per offset from the last prompt token taken here),
never from the engine's rows, buckets or means; a mutation that moves the constant one position, or takes the mean
from the failing format, changes them (checked), so the equality is a test."""
import dataclasses
import json
import subprocess

import numpy as np
import pytest
import torch

import surgeon
import surgeon.api
from surgeon.analyses.repair import Scorer, repair_masks
from surgeon.errors import AnalysisError
from surgeon.organisms import decimal as organism
from tests.cli_in_process import surgeon as surgeon_cli

HEADS = (4, 6)  # L0H4, L0H6: the best paired k=2 subset of the tutorial's search


def _case(n_trap=12, n_control=8, seed=5):
    case = surgeon.api.read("decimal_organism")
    items = organism.held_out_items(n_trap, n_control, seed=seed)
    return dataclasses.replace(case, items=items, score="first_token")


def _tokens(model, case, fmt, item):
    """BOS + the prompt's characters + the answers' common prefix (first-token scoring), the last prompt token's
    position, and the two answers' first differing tokens; written from the template, not by surgeon's encoder."""
    tok = model.tokenizer
    prompt = case.formats[fmt].format(**item.values)
    c, i = item.correct, item.incorrect
    k = 0
    while c[k] == i[k]:
        k += 1
    ids = [tok.bos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in prompt + c[:k]]
    return ids, len(prompt), tok.convert_tokens_to_ids(c[k]), tok.convert_tokens_to_ids(i[k])


def _z(model, ids):
    _, cache = model.run_with_cache(torch.tensor([ids]), names_filter="blocks.0.attn.hook_z")
    return cache["blocks.0.attn.hook_z"][0]  # [pos, head, d_head]


def hand_means(model, case, fmt, items):
    """Per offset j from the last prompt token: the mean over items (that have it) of layer 0's z in `fmt`."""
    sums, counts = {}, {}
    for it in items:
        ids, last, _, _ = _tokens(model, case, fmt, it)
        z = _z(model, ids)
        for j, p in enumerate(range(last, len(ids))):
            sums[j] = sums.get(j, 0) + z[p].double()
            counts[j] = counts.get(j, 0) + 1
    return {j: (sums[j] / counts[j]).float() for j in sums}


def hand_scores(model, case, fmt, items, value, how="replace", strength=1.0, shift=0):
    """log P(correct) - log P(incorrect) per item with heads HEADS of layer 0 given value[j] at the position j tokens
    after the last prompt token (`shift` moves it: a mutation)."""
    out = []
    for it in items:
        ids, last, c, i = _tokens(model, case, fmt, it)

        def hook(z, hook):
            for j in value:
                p = last + j + shift
                if 0 <= p < z.shape[1]:
                    for h in HEADS:
                        new = value[j][h] if how == "replace" else z[0, p, h] + strength * value[j][h]
                        z[0, p, h] = z[0, p, h] + strength * (new - z[0, p, h]) if how == "replace" else new
            return z

        logits = model.run_with_hooks(torch.tensor([ids]), fwd_hooks=[("blocks.0.attn.hook_z", hook)])
        lp = logits[0, -1].log_softmax(-1)
        out.append(float(lp[c] - lp[i]))
    return torch.tensor(out)


def _split_items(case, r):
    disc = [case.items[i] for i in r.split.discovery]
    ev = [case.items[i] for i in r.split.evaluation]
    return [it for it in disc if it.tag == "trap"], ev


@pytest.fixture(scope="module")
def mean_repair(decimal_model):
    case = _case()
    with torch.no_grad():
        r = surgeon.repair(case, decimal_model, heads="L0H4,L0H6", mode="mean", holdout=0.5, seed=1)
    return case, r


def test_mean_repair_equals_hand_written_hooks(decimal_model, mean_repair):
    case, r = mean_repair
    disc_traps, ev = _split_items(case, r)
    with torch.no_grad():
        good = hand_means(decimal_model, case, "plain", disc_traps)
        for fmt in ("qa", "chat", "plain"):
            for tag in ("trap", "control"):
                its = [it for it in ev if it.tag == tag]
                want = int((hand_scores(decimal_model, case, fmt, its, good) > 0).sum())
                row = next(x for x in r.held_out if x.format == fmt and x.tag == tag and x.measure != "paired")
                assert round(row.repaired.value * row.repaired.n) == want, (fmt, tag)
                assert row.repaired.n == len(its)
        # the constant itself: the saved tensor at each offset is the hand-taken mean, zero outside the heads
        v = r.repair.values["blocks.0.attn.hook_z"]
        for j, m in good.items():
            torch.testing.assert_close(v[j, list(HEADS)], m[list(HEADS)], atol=1e-5, rtol=1e-5)
        assert float(v[:, [h for h in range(decimal_model.cfg.n_heads) if h not in HEADS]].abs().max()) == 0
        # the hand-written check can tell: a constant one position late, or the failing format's mean, scores otherwise
        traps = [it for it in ev if it.tag == "trap"]
        right = hand_scores(decimal_model, case, "qa", traps, good)
        assert not torch.allclose(right, hand_scores(decimal_model, case, "qa", traps, good, shift=1), atol=1e-3)
        bad_mean = hand_means(decimal_model, case, "qa", disc_traps)
        assert not torch.allclose(right, hand_scores(decimal_model, case, "qa", traps, bad_mean), atol=1e-3)
    assert r.repair.built_on["split"]["evaluation"] == len(ev)
    assert not set(r.split.discovery) & set(r.split.evaluation)


def test_the_cases_neutral_texts_measure_its_side_effects(decimal_model, mean_repair):
    """The case's `neutral` texts (the decimal organism names twelve of its own domain) are where a repair's side
    effects on other text are measured by default: each text's first half of tokens as the prompt, the repair's constant from its last
    token on (slot j at j tokens after it), KL(unrepaired || repaired) of the next token at every position of the
    second half, averaged within the text, then over texts; written here with one hooked forward per text."""
    case, r = mean_repair
    row = next(s for s in r.shifts if s.where == "neutral")
    assert case.neutral and row.kl.n == len(case.neutral)
    v = r.repair.values["blocks.0.attn.hook_z"]
    tok = decimal_model.tokenizer

    def per_text(shift=0, last_only=False):
        kls, ces = [], []
        for text in case.neutral:
            ids = [tok.bos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in text]
            n_prompt = min(max(2, (len(ids) + 1) // 2), len(ids) - 1)
            toks = torch.tensor([ids[:-1]])

            def write(z, hook):
                for j in range(v.shape[0]):
                    p = n_prompt - 1 + j + shift
                    if p < z.shape[1]:
                        z[0, p, list(HEADS)] = v[j, list(HEADS)]
                return z

            un = decimal_model(toks)[0].log_softmax(-1)
            rep = decimal_model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_z", write)])[0].log_softmax(-1)
            pos = list(range(n_prompt - 1, len(ids) - 1))[-1 if last_only else 0:]
            kl = [float((un[p].exp() * (un[p] - rep[p])).sum()) for p in pos]
            ce = [float(un[p, ids[p + 1]] - rep[p, ids[p + 1]]) for p in pos]
            kls.append(sum(kl) / len(kl))
            ces.append(sum(ce) / len(ce))
        return torch.tensor(kls), torch.tensor(ces)

    with torch.no_grad():
        kls, ces = per_text()
        assert row.kl.value == pytest.approx(float(kls.mean()), abs=1e-4) and float(kls.max()) > 1e-6
        assert row.ce.value == pytest.approx(float(ces.mean()), abs=1e-4)
        assert row.q90 == pytest.approx(float(torch.quantile(kls.double(), 0.9)), abs=1e-4)
        assert row.worst[0][1] == pytest.approx(float(kls.max()), abs=1e-4)
        # the hand-written check can tell: a constant one position late, or the last position alone, gives another KL
        assert abs(float(per_text(shift=1)[0].mean()) - row.kl.value) > 1e-3
        assert abs(float(per_text(last_only=True)[0].mean()) - row.kl.value) > 1e-3
    for bad in ("one text", ["ok", ""], [3]):
        with pytest.raises(surgeon.errors.CaseError, match="field 'neutral'"):
            surgeon.api.read(dataclasses.replace(case, neutral=bad))


def test_repair_is_measured_on_held_out_items_only(decimal_model, mean_repair):
    """Mutation guard: the efficacy row is the evaluation items' (its n), and the in-sample row is labelled apart."""
    case, r = mean_repair
    disc_traps, ev = _split_items(case, r)
    eff = r.efficacy("qa")
    assert eff.repaired.n == sum(it.tag == "trap" for it in ev)
    assert r.discovery[0].repaired.n == len(disc_traps)
    text = str(r)
    assert "held-out" in text and "in-sample" in text and "paired interchange" in text and "not shippable" in text


def test_apply_save_load_and_generate(decimal_model, mean_repair, tmp_path):
    """The repair saved as safetensors named by hook point, read back with hand-written code and applied with
    hand-written hooks, scores as the result says; surgeon.apply gives the same logits and `model.generate` runs
    repaired."""
    from safetensors.torch import load_file

    case, r = mean_repair
    _, ev = _split_items(case, r)
    traps = [it for it in ev if it.tag == "trap"]
    r.repair.save(tmp_path / "rep")
    meta = json.loads((tmp_path / "rep" / "repair.json").read_text())
    tensors = load_file(str(tmp_path / "rep" / "repair.safetensors"))
    assert set(tensors) == {"blocks.0.attn.hook_z"} and meta["heads"] == ["L0H4", "L0H6"] and meta["mode"] == "mean"
    value = {j: tensors["blocks.0.attn.hook_z"][j] for j in range(tensors["blocks.0.attn.hook_z"].shape[0])}
    with torch.no_grad():
        hand = hand_scores(decimal_model, case, "qa", traps, value)
    assert int((hand > 0).sum()) == round(r.efficacy("qa").repaired.value * len(traps))
    back = surgeon.load(tmp_path / "rep")
    assert back.heads == r.repair.heads
    it = traps[0]
    ids, last, c, i = _tokens(decimal_model, case, "qa", it)
    prompt = torch.tensor([ids[: last + 1]])  # the prompt alone: slot 0 at its last token
    with torch.no_grad():
        with surgeon.apply(decimal_model, back, last="end"):
            got = decimal_model(prompt)[0, -1]
        plain = decimal_model(prompt)[0, -1]

        def hook(z, hook):
            z[0, -1, list(HEADS)] = value[0][list(HEADS)]
            return z

        want = decimal_model.run_with_hooks(prompt, fwd_hooks=[("blocks.0.attn.hook_z", hook)])[0, -1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-4)  # the repair does something, and is gone after the block
    with torch.no_grad(), surgeon.apply(decimal_model, back):
        out = decimal_model.generate(prompt, max_new_tokens=5, do_sample=False, verbose=False, use_past_kv_cache=True)
    with torch.no_grad():  # the same tokens with full forwards and the repair's own position hooks (engine's greedy)
        from surgeon.engine.readout import greedy

        ref = greedy(decimal_model, prompt, torch.tensor([prompt.shape[1]]), 5, back.hooks(torch.tensor([last])))
    assert out[0, prompt.shape[1]:].tolist() == ref[0].tolist()


def test_steer_repair_equals_hand_written_hooks(decimal_model):
    case = _case(n_trap=10, n_control=4, seed=7)
    with torch.no_grad():
        r = surgeon.repair(case, decimal_model, heads="L0H4,L0H6", mode="steer", strength=2.0, holdout=0.5, seed=0,
                           bad="qa")
        disc_traps, ev = _split_items(case, r)
        good = hand_means(decimal_model, case, "plain", disc_traps)
        bad = hand_means(decimal_model, case, "qa", disc_traps)
        diff = {j: good[j] - bad[j] for j in good}
        traps = [it for it in ev if it.tag == "trap"]
        want = hand_scores(decimal_model, case, "qa", traps, diff, how="add", strength=2.0)
    assert round(r.efficacy("qa").repaired.value * len(traps)) == int((want > 0).sum())
    v = r.repair.values["blocks.0.attn.hook_z"]
    torch.testing.assert_close(v[0, list(HEADS)], diff[0][list(HEADS)], atol=1e-5, rtol=1e-5)


def test_search_chooses_on_discovery_items_within_bounds(decimal_model):
    case = _case(n_trap=12, n_control=8, seed=3)
    with torch.no_grad():
        r = surgeon.repair(case, decimal_model, search=True, heads="L0H2,L0H4,L0H5,L0H6", max_heads=3,
                           max_kl=0.05, holdout=0.5, seed=0)
    steps = [s for s in r.search if "added" in s]
    assert steps and len(steps) <= 3
    assert all(s["discovery_kl_good"] <= 0.05 for s in steps)
    rates = [s["discovery_rate"] for s in steps]
    means = [s["discovery_mean_score"] for s in steps]
    assert all((b, mb) > (a, ma) for (a, ma), (b, mb) in zip(zip(rates, means), zip(rates[1:], means[1:])))
    k = rates.index(max(rates)) + 1  # the smallest set on the path with the best rate is the one shipped
    assert len(r.repair.heads) == k and [s["k"] for s in steps if s["chosen"]] == [k]
    assert set(r.repair.heads) == {s["added"] for s in steps[:k]}
    assert r.n_evaluation and r.efficacy("qa").repaired.n == sum(case.items[i].tag == "trap" for i in r.split.evaluation)
    # side by side: the best paired subset and the repair to ship, each measured both ways on the held-out items
    from tests.analyses.test_heldout import hand_rate

    ev = [case.items[i] for i in r.split.evaluation if case.items[i].tag == "trap"]
    shipped = [c for c in r.compare if "shippable" in c.chosen_by]
    assert {c.format for c in shipped} == set(case.bad) and all(c.heads == r.repair.heads for c in shipped)
    for c in shipped:
        assert c.shippable == r.efficacy(c.format).repaired
        assert c.kl_good == next(x.kl for x in r.shifts if x.where == case.good)
    for c in r.compare:  # the paired rate of each head set, from hand-written hooks on the held-out traps
        assert c.paired.value == pytest.approx(hand_rate(case, decimal_model, ev, c.heads, bad=c.format), abs=1e-6)
    assert "the best paired subset" in str(r)


@pytest.mark.parametrize("kwargs,field", [
    (dict(heads="L0X4"), "--heads"),
    (dict(heads="L0H4", mode="patch"), "--mode"),
    (dict(heads="L0H4", strength=-1.0), "--strength"),
    (dict(search=True, strength=2.0), "--strength"),
    (dict(), "--heads"),
    (dict(heads="L0H4", holdout=0), "--holdout"),
])
def test_bad_options_refused_before_the_model_loads(kwargs, field, monkeypatch):
    import surgeon.models.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    monkeypatch.setattr(surgeon.api, "load_model", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises(AnalysisError) as e:
        surgeon.repair("decimal_organism", **kwargs)
    assert e.value.field == field


def test_a_case_aligned_otherwise_is_refused(decimal_model):
    case = dataclasses.replace(_case(), align="index")
    with pytest.raises(AnalysisError, match="counted from the last prompt token"):
        surgeon.repair(case, decimal_model, heads="L0H4")


def test_cli_repair_writes_a_repair_and_refuses_bad_heads(tmp_path):
    bad = surgeon_cli(["repair", "--heads", "L0H99"])
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--heads" in bad.stderr
    out = tmp_path / "rep"
    ok = surgeon_cli(["repair", "--heads", "L0H4,L0H6", "--out", str(out)])
    assert ok.returncode == 0, ok.stderr
    assert "efficacy" in ok.stdout and "held-out" in ok.stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["command"] == "repair" and set(m["files"]) == {"manifest.json", "results.json", "repair.json", "repair.safetensors"}
    r = surgeon.load(out)
    assert r.repair.heads == ("L0H4", "L0H6") and r.efficacy("qa").repaired.n == 32
    assert str(r) == ok.stdout.split("\n\nwrote")[0].rstrip("\n")


# ------------------------------------------------------------------ ground truth from the threshold organism's construction


def _threshold_predictions(case, r, heads, mode, a):
    """Items right (failing format, good format) by the organism's construction, not by running it: each even head h
    writes UNIT * WEIGHTS[h] * GAIN[l] on letter l's logit per unit of its output's letter-l coordinate; in 'plain' its
    output is e_x, in 'qa' W_BAD * e_y (the rest reads BOS, which carries nothing); odd heads write where the
    unembedding does not read. A mean repair puts (f_l) in place of the output, f_l the share of discovery items whose
    x is l; a steer adds a * (f_l - W_BAD * f'_l), f'_l the share whose y is l. Returns, per format, the indices (into
    the held-out items) of the items right, and how many items there are."""
    from surgeon.organisms import threshold as T

    disc = [case.items[i] for i in r.split.discovery]
    ev = [case.items[i] for i in r.split.evaluation]
    L = T.LETTERS
    f = {l: sum(it.values["x"] == l for it in disc) / len(disc) for l in L}
    f2 = {l: sum(it.values["y"] == l for it in disc) / len(disc) for l in L}
    g = {l: T.GAIN[i] for i, l in enumerate(L)}
    W, u = T.W_BAD, T.UNIT
    VS = sum(T.WEIGHTS[h] for h in heads if h in T.WEIGHTS)
    right = {"qa": set(), "plain": set()}
    for k, it in enumerate(ev):
        x, y = it.values["x"], it.values["y"]
        for fmt in right:
            own = {x: 1.0} if fmt == "plain" else {y: W}  # the unrepaired output's letter coordinates
            score = 0.0
            for h, v in T.WEIGHTS.items():
                out = dict(own)
                if h in heads:
                    if mode == "mean":
                        out = dict(f)
                    else:
                        out = {l: own.get(l, 0.0) + a * (f[l] - W * f2[l]) for l in L}
                score += u * v * (out.get(x, 0.0) * g[x] - out.get(y, 0.0) * g[y])
            if score > 0:
                right[fmt].add(k)
    return right, len(ev)


@pytest.mark.parametrize("which,mode,a,seed", [("even", "mean", 1.0, 2), ("heaviest", "mean", 1.0, 2),
                                               ("even", "steer", 1.0, 2), ("even", "steer", 100.0, 2),
                                               ("odd", "mean", 1.0, 2), ("even", "mean", 1.0, 0),
                                               ("even", "steer", 100.0, 5), ("heaviest", "mean", 1.0, 7)])
def test_threshold_organism_repairs_as_its_construction_says(threshold_model, which, mode, a, seed):
    """A constant cannot carry which letter is x: the paired patch of the even heads repairs every item, but their
    mean repairs only the items where f_x g_x > f_y g_y, a steer of strength 1 none, and odd heads nothing. Which
    items the repair gets right (not only how many) equals the closed form's, derived from the weights' construction
    above, over several splits."""
    from surgeon.organisms import threshold as T

    heads = {"even": T.EVEN, "odd": T.ODD,
             "heaviest": sorted(T.WEIGHTS, key=T.WEIGHTS.get)[-T.K_MIN:]}[which]
    case = surgeon.api.read("threshold_organism")
    with torch.no_grad():
        r = surgeon.repair(case, threshold_model, heads=",".join(f"L0H{h}" for h in heads), mode=mode, strength=a,
                           holdout=0.5, seed=seed)
    want, n = _threshold_predictions(case, r, set(heads), mode, a)
    got = {row.format: round(row.repaired.value * row.repaired.n) for row in r.held_out if row.measure != "paired"}
    assert got == {f: len(v) for f, v in want.items()}, (got, want)
    ev = [case.items[i] for i in r.split.evaluation]
    with torch.no_grad():  # the items themselves: the repair's masks on the engine, item by item
        for fmt in ("qa", "plain"):
            sc = Scorer(case, threshold_model, ev, fmt, 256)
            right = np.asarray(sc.metric.right(sc.run(repair_masks(r.repair, threshold_model.cfg))[0]))
            assert set(np.flatnonzero(right).tolist()) == want[fmt], fmt
    paired = next(row for row in r.held_out if row.measure == "paired")
    assert paired.repaired.n == n
    if which in ("even", "heaviest"):  # every even-weight sum >= 69 repairs every item when patched paired
        assert paired.repaired.value == 1.0
        assert len(want["qa"]) < n  # ... and no constant does
    if which == "odd":
        assert not want["qa"] and paired.repaired.value == 0.0


def test_report_repair_step_page_paper_and_resume(tmp_path):
    """`surgeon report --steps ...,repair`: the repair's held-out table on the page and in the paper, beside the steering
    baselines (text, figure, methods), methods text citing ITI, CAA, ActAdd and the model-editing evaluation; a rerun
    reuses it; surgeon.load reads it back with its tensors. The repair is built and measured on the report's split
    (holdout and seed), not a fixed 0.5."""
    import shutil

    out = tmp_path / "rep"
    with torch.no_grad():
        rep = surgeon.report("decimal_organism", out=out, steps=["diagnose", "repair"], holdout=0.25, seed=3)
    r = rep.steps["repair"]
    # the repair (and its baselines) built and measured on the report's split, not a fixed 0.5
    split = r.repair.built_on["split"]
    assert (split["holdout"], split["seed"]) == (0.25, 3) and rep.options["repair"]["holdout"] == 0.25
    assert abs(split["evaluation"] - 0.25 * len(surgeon.load_case("decimal_organism").items)) <= 2, split
    page = (out / "report.html").read_text()
    assert "<section id='repair'>" in page and "paired" in page
    # beside the field's steering baselines: the text, the figure on the page and in figures/, the methods sentence
    assert r.baselines is not None and "beside the field&#x27;s steering baselines" in page
    assert "efficacy against harm: KL" in page and (out / "figures" / "repair-pareto.pdf").is_file()
    methods = (out / "paper" / "methods.tex").read_text()
    assert "steering baselines" in methods
    for key in ("li2023iti", "rimsky2024caa", "turner2023actadd", "meng2022rome", "wang2024easyedit"):
        assert key in methods and key in (out / "references.bib").read_text()
    assert (out / "paper" / "repair.tex").is_file() and (out / "repair" / "repair.safetensors").is_file()
    again = surgeon.report("decimal_organism", out=out, steps=["diagnose", "repair"], holdout=0.25, seed=3)
    assert "repair" in again.reused
    back = surgeon.load(out).steps["repair"]
    assert back.repair.heads == r.repair.heads
    torch.testing.assert_close(back.repair.values["blocks.0.attn.hook_z"], r.repair.values["blocks.0.attn.hook_z"])
    assert [x.repaired for x in back.held_out] == [x.repaired for x in r.held_out]
    if shutil.which("pdflatex") and shutil.which("bibtex"):
        paper = out / "paper"
        for cmd in (["pdflatex", "-interaction=nonstopmode", "main.tex"], ["bibtex", "main"],
                    ["pdflatex", "-interaction=nonstopmode", "main.tex"]):
            subprocess.run(cmd, cwd=paper, capture_output=True, timeout=120)
        assert (paper / "main.pdf").is_file()


def test_a_case_naming_one_failing_format_repairs_that_format(decimal_model):
    """`bad` may be one format's name (a string) or a list of them: the repair is built and measured on that format
    (it was built from the name's letters, each looked up as a format)."""
    case = dataclasses.replace(_case(), bad="qa")
    r = surgeon.repair(case, decimal_model, heads=[f"L0H{h}" for h in HEADS])
    assert {row.format for row in r.rows("efficacy")} == {"qa"}


def test_the_search_reads_its_kl_bound_on_the_discovery_items(decimal_model):
    """The KL the search bounds (each accepted step's `discovery_kl_good`) is the good format's KL(unrepaired ||
    repaired) on the discovery items, every tag, written here with one hooked forward per item; not the held-out
    items' (a search that read its bound there would choose on them)."""
    case = _case(n_trap=12, n_control=8, seed=3)
    with torch.no_grad():
        r = surgeon.repair(case, decimal_model, search=True, heads="L0H2,L0H4,L0H5,L0H6", max_heads=3,
                           max_kl=1.0, holdout=0.5, seed=0)
    chosen = next(s for s in r.search if s.get("chosen"))
    heads = [int(h.split("H")[1]) for h in r.repair.heads]
    v = r.repair.values["blocks.0.attn.hook_z"]

    tok = decimal_model.tokenizer

    def hand_kl(items):
        """Per item: the prompt and its correct answer teacher-forced, KL at the last prompt token and each answer
        token but the last, averaged within the item; then over items."""
        out = []
        for it in items:
            prompt = case.formats["plain"].format(**it.values)
            ids = [tok.bos_token_id] + [tok.convert_tokens_to_ids(ch) for ch in prompt + it.correct[:-1]]
            last = len(prompt)  # BOS first: the last prompt token's index

            def write(z, hook):
                for j in range(v.shape[0]):
                    if last + j < z.shape[1]:
                        z[0, last + j, heads] = v[j, heads]
                return z

            toks = torch.tensor([ids])
            un = decimal_model(toks)[0, last:].log_softmax(-1)
            rep = decimal_model.run_with_hooks(toks, fwd_hooks=[("blocks.0.attn.hook_z", write)])[0, last:]
            rep = rep.log_softmax(-1)
            out.append(float((un.exp() * (un - rep)).sum(-1).mean()))
        return float(np.mean(out))

    disc = [case.items[i] for i in r.split.discovery]
    ev = [case.items[i] for i in r.split.evaluation]
    with torch.no_grad():
        on_disc, on_ev = hand_kl(disc), hand_kl(ev)
    assert chosen["discovery_kl_good"] == pytest.approx(on_disc, rel=1e-3, abs=1e-6)
    assert abs(on_disc - on_ev) > 1e-3 * max(on_disc, on_ev)  # the two item sets tell the reads apart


def test_the_searchs_control_floors_are_each_tags_own(decimal_model, mean_repair):
    """While a repair is chosen, every control tag (each tag but the focus) in every format keeps its rate within
    max_drop of its unrepaired rate. `control_scorers` scores all control tags in one Scorer a format; each tag's rate
    under a repair and its floor equal those of a Scorer built on that tag's items alone, and `within_floors` is their
    conjunction."""
    from surgeon.analyses.repair import control_scorers, within_floors
    from surgeon.case.case import tag_indices

    case, r = mean_repair
    # two control tags, interleaved with the focus's items: "control" (answered right in every format) and "other"
    # (half its items traps: its rate is neither 0 nor 1, so a rate or floor read from the wrong items shows)
    items = [dataclasses.replace(it, tag="other") if i % 2 else it for i, it in enumerate(case.items)]
    assert {it.tag for it in items} == {"trap", "control", "other"}
    case = dataclasses.replace(case, items=items)
    masks = {k: torch.cat([v, 0 * v]) for k, v in repair_masks(r.repair, decimal_model.cfg).items()}  # P = 2
    with torch.no_grad():
        controls = control_scorers(case, decimal_model, items, "trap", list(case.bad), 64, max_drop=0.05)
        assert len(controls) == len(case.bad) + 1 and all(len(checks) == 2 for _, checks in controls)
        rates = []
        want = np.ones(2, dtype=bool)
        for f, (s, checks) in zip([*case.bad, case.good], controls):
            x = s.run(masks)
            for tag, (span, floor) in zip([t for t in tag_indices(items) if t != "trap"], checks):  # tags in order
                alone = Scorer(case, decimal_model, [it for it in items if it.tag == tag], f, 64)
                np.testing.assert_allclose(s.rates(x[:, span]), alone.rates(alone.run(masks)), atol=1e-12)
                assert floor == pytest.approx(alone.unrepaired.value - 0.05, abs=1e-12)
                want &= alone.rates(alone.run(masks)) >= floor - 1e-12
                rates.append(alone.unrepaired.value)
        assert (within_floors(controls, masks, 2) == want).all()
        assert any(0 < v < 1 for v in rates)  # the data can tell the items apart
