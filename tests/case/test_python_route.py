"""A Case built or edited in Python is checked exactly as a case file is, at the same point (before any weight
loads), by the same code; and a case's identity for caching is its content, however it was made."""
import dataclasses

import pytest

import surgeon
import surgeon.api as api
from surgeon import Case, CaseError, Chat, Item, load_case
from surgeon.case.case import content_digest
from tests.case.test_case import BAD, GOOD, HEADER, write_case


def _no_weights(monkeypatch):
    """Any weight loading fails the test: every refusal below must come before it."""
    def load_model(*a, **kw):
        raise AssertionError("weights loaded before the case was checked")

    monkeypatch.setattr(api, "load_model", load_model)


def _python_case(fields: dict) -> Case:
    """The Case a case file with these fields defines, built in Python (the same source text, evaluated)."""
    ns: dict = {}
    exec(HEADER, ns)
    args = {k: eval(v, ns) for k, v in fields.items() if v is not None}
    return Case(**args)


@pytest.mark.parametrize("change,field,words", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_every_case_file_refusal_is_made_from_python_too(tmp_path, monkeypatch, change, field, words):
    with pytest.raises(CaseError) as from_file:
        load_case(write_case(tmp_path, **change))
    _no_weights(monkeypatch)
    with pytest.raises(CaseError) as from_python:
        surgeon.diagnose(_python_case({**GOOD, **change}))
    msg = str(from_python.value)
    assert from_python.value.message == from_file.value.message and from_python.value.field == field, msg
    assert f"field '{field}'" in msg and words in msg and "fix:" in msg and "built in Python" in msg, msg


def _decimal():
    return api.read("decimal_organism")


def _edit(**kw):
    case = _decimal()
    return dataclasses.replace(case, **kw)


def _item(**kw):
    return dataclasses.replace(_decimal().items[0], **kw)


REST = slice(1, 4)
# the scenarios (issue 50, item 1): each ran, was cut silently, or crashed from Python
SCENARIOS = [
    ("at=[]", lambda: _edit(items=[_item(at=[]), *_decimal().items[REST]]), "items[0].at", "lists 0 positions"),
    ("answer lists of different lengths", lambda: _edit(items=[Item({"a": "9.8", "b": "9.11"}, [" 9", ".8"], [" 9"]),
                                                               *_decimal().items[REST]]),
     "items[0]", "2 correct and 1 incorrect"),
    ("at shorter than the answers", lambda: _edit(items=[Item({"a": "9.8", "b": "9.11"}, [" 9", ".8"], [" 1", ".1"],
                                                              at=[-1]), *_decimal().items[REST]]),
     "items[0].at", "lists 1 positions for 2 answers"),
    ("prob at several positions", lambda: _edit(metric="prob", items=[
        Item({"a": "9.8", "b": "9.11"}, [" 9", ".8"], [" 1", ".1"], at=[-2, -1]), *_decimal().items[REST]]),
     "metric", "scored at several positions"),
    ("combine=max", lambda: _edit(combine="max"), "combine", "is 'max'"),
    ("duplicate items", lambda: _edit(items=[_decimal().items[0], *_decimal().items[0:3]]), "items[1]", "repeats items[0]"),
    ("correct == incorrect", lambda: _edit(items=[_item(incorrect=_decimal().items[0].correct), *_decimal().items[REST]]),
     "items[0]", "are the same"),
    ("a bad format equal to the good one", lambda: _edit(formats={**_decimal().formats, "qa": _decimal().formats["plain"]}),
     "formats", "are the same template"),
    ("align=middle", lambda: _edit(align="middle"), "align", "is 'middle'"),
    ("unused values", lambda: _edit(items=[_item(values={**_decimal().items[0].values, "zz": "1"}),
                                           *_decimal().items[REST]]), "items[0].values", "which no format uses"),
    ("good=nope", lambda: _edit(good="nope"), "good", "unknown format 'nope'"),
    ("a focus no item has", lambda: _edit(focus="nothing"), "focus", "no item has tag"),
    ("metric=accuracy", lambda: _edit(metric="accuracy"), "metric", "is 'accuracy'"),
    ("items=[]", lambda: _edit(items=[]), "items", "is empty"),
    ("at=True", lambda: _edit(items=[_item(at=True), *_decimal().items[REST]]), "items[0].at", "is True"),
    ("at a placeholder one format lacks", lambda: Case(
        name="t", model="organism:decimal", formats={"plain": "{a} or {b}?", "qa": "Q: {a}?"}, good="plain",
        bad="qa", items=[Item({"a": "9.8", "b": "9.11"}, [" 9"], [" 1"], at="b")]), "items[0].at", "format 'qa'"),
    ("a character the organism does not know", lambda: _edit(items=[_item(incorrect=" 9.1\u00e9"),
                                                                    *_decimal().items[REST]]),
     "items[0].incorrect", "does not know"),
]


@pytest.mark.parametrize("make,field,words", [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_a_case_edited_in_python_is_refused_before_any_weight_loads(monkeypatch, make, field, words):
    _no_weights(monkeypatch)
    for run in (surgeon.diagnose, surgeon.patch, surgeon.encode):
        with pytest.raises(CaseError) as e:
            run(make())
        msg = str(e.value)
        assert f"field '{field}'" in msg and words in msg and "fix:" in msg, msg
        assert "Python" in msg, msg  # not the file it was read from, which holds no such thing


def test_the_metric_refusal_for_positions_lists_only_metrics_that_combine():
    with pytest.raises(CaseError) as e:
        SCENARIOS[3][1]()
        surgeon.api.read(SCENARIOS[3][1]())
    fix = e.value.fix
    assert "logprob" in fix and "prob," not in fix.replace("logprob", "") and "kl" not in fix, fix


def test_a_model_given_by_name_is_checked_against_the_case_before_it_loads(monkeypatch):
    _no_weights(monkeypatch)
    case = dataclasses.replace(_decimal(), layers=[0, 7])
    with pytest.raises(CaseError, match="layer 7 is out of range"):
        surgeon.diagnose(case, "organism:decimal")
    with pytest.raises(CaseError, match="unknown organism"):
        surgeon.diagnose(_decimal(), "organism:nope")


def test_anything_else_is_not_a_case():
    with pytest.raises(CaseError, match="is a dict, not a case"):
        surgeon.diagnose({"name": "x"})


# the case's identity: its content (issue 49, item 3)

def test_the_same_case_from_a_file_or_from_python_has_one_digest(tmp_path):
    from_file = load_case(write_case(tmp_path), check_model=False)
    built = _python_case(GOOD)
    assert content_digest(from_file) == content_digest(built)
    assert from_file.digest != content_digest(from_file)  # the file's own hash is provenance, not identity


def _metric_a(logits, correct, incorrect):
    return logits.gather(1, correct[:, None])[:, 0] - logits.gather(1, incorrect[:, None])[:, 0]


def _metric_b(logits, correct, incorrect):
    return 2 * (logits.gather(1, correct[:, None])[:, 0] - logits.gather(1, incorrect[:, None])[:, 0])


EDITS = {
    "name": "other", "model": "organism:threshold", "good": "qa", "bad": ["plain"],
    "formats": {"plain": "Which is bigger: {a} or {b}?\nAnswer: ", "qa": "Q: Which is bigger: {a} or {b}?\nA:"},
    "items": [Item({"a": "9.8", "b": "9.12"}, correct=" 9.8", incorrect=" 9.12", tag="trap")],
    "align": "end", "score": "first_token", "answer_end": "eos", "metric": "logit", "focus": "trap",
    "layers": [0], "components": ("z", "q"), "prepend_bos": False, "description": "x",
    "saes": {"dir": "x/{layer}"}, "reference": [Item({"a": "1.2", "b": "1.3"}, correct=" 1.2", incorrect=" 1.3")],
    "combine": "sum", "notes": {"a": 1}, "neutral": ["The sun rose over the hills."], "scan": {"shots": [0]},
}


def test_every_field_that_can_change_a_number_changes_the_digest():
    from dataclasses import fields

    base = _python_case(GOOD)
    # draw (a generator of fresh items) changes no number computed on the case's items: not content, and checked so
    names = {f.name for f in fields(Case)} - {"source", "digest", "read_as", "draw"}
    assert names == set(EDITS), names ^ set(EDITS)  # a new field must be tried here
    assert content_digest(dataclasses.replace(base, draw=lambda n, seed: [])) == content_digest(base)
    d0 = content_digest(base)
    seen = {d0}
    for name, value in EDITS.items():
        d = content_digest(dataclasses.replace(base, **{name: value}))
        assert d not in seen, name
        seen.add(d)
    # an item's tag, a Chat against its text, a metric function's code
    assert content_digest(dataclasses.replace(base, items=[dataclasses.replace(base.items[0], tag="x")])) != d0
    chat = dict(base.formats, qa=Chat(user=base.formats["qa"]))
    assert content_digest(dataclasses.replace(base, formats=chat)) != d0
    fa, fb = (content_digest(dataclasses.replace(base, metric=f)) for f in (_metric_a, _metric_b))
    assert fa and fb and fa != fb and fa == content_digest(dataclasses.replace(base, metric=_metric_a))
    # a function whose source Python cannot show is not keyed at all: nothing computed with it is reused
    src = "def f(logits, correct, incorrect):\n    return logits[:, 0]\n"
    ns: dict = {}
    exec(compile(src, "<string>", "exec"), ns)
    assert content_digest(dataclasses.replace(base, metric=ns["f"])) is None


@pytest.mark.slow
def test_a_report_reruns_a_step_when_the_case_is_edited_in_python(tmp_path, decimal_model):
    case = _decimal()
    out = tmp_path / "rep"
    first = surgeon.report(case, decimal_model, out=out, steps=["diagnose"])
    assert surgeon.report(case, decimal_model, out=out, steps=["diagnose"]).reused == ["diagnose"]
    fewer = dataclasses.replace(case, items=case.items[: len(case.items) // 2])
    again = surgeon.report(fewer, decimal_model, out=out, steps=["diagnose"])
    assert again.reused == []
    n = lambda d: d.get("plain", "all").score.n  # noqa: E731
    assert n(again.steps["diagnose"]) == n(surgeon.diagnose(fewer, decimal_model)) != n(first.steps["diagnose"])
    assert surgeon.report(dataclasses.replace(case, metric="logit"), decimal_model, out=out,
                          steps=["diagnose"]).reused == []


def test_the_report_key_holds_the_case_content_and_the_metric(decimal_model):
    """Fast: the key every report step is reused by changes with the items and with the metric alone."""
    from surgeon.api import report_key

    case = _decimal()
    key = report_key(case, decimal_model, None)
    assert key == report_key(dataclasses.replace(case), decimal_model, None)
    assert report_key(dataclasses.replace(case, items=case.items[1:]), decimal_model, None) != key
    other = report_key(dataclasses.replace(case, metric="logit"), decimal_model, None)
    assert other["metric"] != key["metric"] and other["case_content_sha256"] != key["case_content_sha256"]


@pytest.mark.parametrize("ref,field,words", [
    (Item({"a": "9" * 300, "b": "1.2"}, correct=" 9.8", incorrect=" 1.2"), "reference[0]", "longer than the model's context"),
    (Item({"a": "9.8\u00e9", "b": "1.2"}, correct=" 9.8", incorrect=" 1.2"), "reference[0].values['a']", "does not know"),
    (Item({"a": "9.8", "b": "1.2"}, correct=" 9.8", incorrect=" 1.\u00e9"), "reference[0].incorrect", "does not know"),
    (Item({"a": "9", "b": "1"}, correct=" 9", incorrect=" 1"), "reference", "no mean at the last"),
])
def test_reference_items_are_checked_against_the_model_before_it_loads(monkeypatch, ref, field, words):
    """Mean ablation's reference items: the context, the organism's characters, and every position reached."""
    _no_weights(monkeypatch)
    with pytest.raises(CaseError) as e:
        surgeon.circuit(_edit(reference=[ref]), ablation="mean")
    assert e.value.field == field and words in e.value.message and e.value.fix, str(e.value)
