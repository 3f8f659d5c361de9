"""Case files: the shipped ones load; every kind of bad input gets one CaseError naming file, field, fix."""
import os

import pytest

from surgeon import CaseError, load_case
from tests.conftest import ROOT
from tests.cli_in_process import surgeon as surgeon_cli

HEADER = "from surgeon import Case, Item, Chat\n"
GOOD = dict(
    name='"t"', model='"organism:decimal"',
    formats='{"plain": "Which is bigger: {a} or {b}?\\nAnswer:", "qa": "Q: Which is bigger: {a} or {b}?\\nA:"}',
    good='"plain"', bad='["qa"]',
    items='[Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect=" 9.11", tag="trap")]',
)


def write_case(tmp_path, body=None, **fields):
    f = dict(GOOD)
    f.update(fields)
    args = ",\n    ".join(f"{k}={v}" for k, v in f.items() if v is not None)
    text = HEADER + (body if body is not None else f"case = Case(\n    {args}\n)\n")
    p = tmp_path / "case.py"
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", ["decimal_organism.py", "induction_organism.py"])
def test_shipped_organism_cases_load(name):
    c = load_case(os.path.join(ROOT, "cases", name))
    assert c.digest and len(c.items) >= 48


def test_valid_minimal_case(tmp_path):
    c = load_case(write_case(tmp_path))
    assert c.bad_formats == ("qa",) and c.items[0].tag == "trap"


BAD = [
    # (fields to change, field named in the error, words in the message)
    (dict(items=None), "items", "missing"),
    (dict(formats=None), "formats", "missing"),
    (dict(items="[]"), "items", "empty"),
    (dict(good='"simple"'), "good", "unknown format"),
    (dict(bad='["chat"]'), "bad", "unknown format"),
    (dict(bad='["plain"]'), "bad", "both good and bad"),
    (dict(formats='{"plain": "{a} vs {c}", "qa": "Q: {a} {b}"}'), "formats['plain']", "placeholder {c}"),
    (dict(items='[Item({"a": "9.8", "b": "9.11", "z": "1"}, correct=" 9.8", incorrect=" 9.11")]'), "items[0].values",
     "no format uses"),
    (dict(items='[Item({"a": "9.8", "b": "9.11"}, correct="", incorrect=" 9.11")]'), "items[0].correct", "non-empty"),
    (dict(items='[Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect=" 9.8")]'), "items[0]", "the same"),
    (dict(align='"middle"'), "align", "middle"),
    (dict(components='["zz"]'), "components", "unknown component"),
    (dict(layers="[0, 7]"), "layers", "out of range"),
    (dict(model='"organism:nope"'), "model", "unknown organism"),
    (dict(model='"/no/such/dir"'), "model", "no such directory"),
    (dict(model='"nobody/not-a-cached-model"'), "model", "neither an organism, a local directory, nor"),
    (dict(items='[Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect="\\u00e9")]'), "items[0].incorrect",
     "does not know"),
    (dict(formats='{"plain": "{a} {b}", "qa": Chat(user="{a} {b}")}'), "formats['qa']", "chat template"),
    (dict(focus='"nothing"'), "focus", "no item has tag"),
    (dict(good='["plain"]'), "good", "names one format"),
    (dict(bad='{"qa": 1}'), "bad", "names the failing formats"),
    (dict(items='{"x": Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect=" 9.11")}'), "items", "not a list"),
    (dict(items='[Item({"a": "9.8", "b": "9.11"}, correct="  ", incorrect=" 9.11")]'), "items[0].correct",
     "only whitespace"),
    (dict(items='[Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect=" 9.11")] * 2'), "items[1]",
     "repeats items[0]"),
    (dict(items='[Item({"a": "9.8", "b": "9.11"}, correct=" 9.8", incorrect=" 9.11", tag=None)]'), "items[0].tag",
     "NoneType"),
    (dict(saes='{"path": "x"}'), "saes", "release"),
    (dict(answer_end="3"), "answer_end", "is 3"),
    (dict(align='"index"'), "align", "needs prompts of equal length"),
]


@pytest.mark.parametrize("change,field,words", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_bad_case_names_file_field_and_fix(tmp_path, change, field, words):
    p = write_case(tmp_path, **change)
    with pytest.raises(CaseError) as e:
        load_case(p)
    msg = str(e.value)
    assert str(p) in msg and f"field '{field}'" in msg and words in msg and "fix:" in msg, msg


def test_file_problems(tmp_path):
    with pytest.raises(CaseError, match="no such case file"):
        load_case(tmp_path / "missing.py")
    p = write_case(tmp_path, body="x = 1\n")
    with pytest.raises(CaseError, match="defines no `case`"):
        load_case(p)
    p = write_case(tmp_path, body="case = Case(\n  name='t',\n  items=undefined_name)\n")
    with pytest.raises(CaseError, match=r"NameError.*line 4"):
        load_case(p)
    p = write_case(tmp_path, body="case = {'name': 't'}\n")
    with pytest.raises(CaseError, match="not a surgeon.Case"):
        load_case(p)
    p = write_case(tmp_path, body="import sys\nsys.exit(3)\n")
    with pytest.raises(CaseError, match=r"sys.exit\(3\)"):
        load_case(p)
    with pytest.raises(CaseError, match="is a directory"):
        load_case(tmp_path)


def test_relative_model_directory_is_read_from_the_case_folder(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    p = write_case(tmp_path, model='"ckpt"')
    monkeypatch.chdir("/")
    c = load_case(p, check_model=False)
    assert c.model == str(tmp_path / "ckpt")
    (tmp_path / "weights.bin").write_text("x")
    p = write_case(tmp_path, model=f'"{tmp_path / "weights.bin"}"')
    with pytest.raises(CaseError, match="is a file; a checkpoint is a directory"):
        load_case(p)


def test_cli_bad_case_exits_nonzero_without_traceback(tmp_path):
    p = write_case(tmp_path, good='"simple"')
    out = tmp_path / "out"
    r = surgeon_cli(["diagnose", str(p), "--out", str(out)])
    assert r.returncode == 2
    assert "field 'good'" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() or not any(out.iterdir())


def test_answer_traps_are_warned(tmp_path, capsys):
    load_case(write_case(tmp_path, items='[Item({"a": "9.8", "b": "9.11"}, correct="9.8", incorrect="9.11")]'))
    assert "answers start without a space" in capsys.readouterr().err
    load_case(write_case(tmp_path, items='[Item({"a": "4.5", "b": "4.53"}, correct=" 4.53", incorrect=" 4.5")]'))
    assert "one answer is a prefix of the other" in capsys.readouterr().err
    load_case(write_case(tmp_path, answer_end='"eos"',
                         items='[Item({"a": "4.5", "b": "4.53"}, correct=" 4.53", incorrect=" 4.5")]'))
    assert "warning" not in capsys.readouterr().err  # the documented fix silences it
    load_case(write_case(tmp_path))
    assert "warning" not in capsys.readouterr().err
    p = write_case(tmp_path, items='[Item({"a": "9.8\\u00e9", "b": "9.11"}, correct=" 9.8", incorrect=" 9.11")]')
    with pytest.raises(CaseError, match="does not know"):
        load_case(p)


def test_first_token_prefix_answers_refused_before_the_model_loads(tmp_path, monkeypatch):
    """score="first_token" with one answer a prefix of the other (4.5 / 4.53) has no token to read: refused from the
    case file (the command line) and from a Case in Python, and for items given to evaluate on, before any weight
    loads; it was refused only when the rows were encoded, after the model had loaded."""
    import dataclasses

    import surgeon
    from surgeon import api

    def no_weights(*a, **kw):
        raise AssertionError("weights loaded before the case was checked")

    items = '[Item({"a": "4.5", "b": "4.53"}, correct=" 4.53", incorrect=" 4.5")] + ' + GOOD["items"]
    p = write_case(tmp_path, score='"first_token"', items=items)
    with pytest.raises(CaseError, match=r"field 'score': items\[0\]: one answer .* is a prefix of the other"):
        load_case(p)
    r = surgeon_cli(["diagnose", str(p)])
    assert r.returncode == 2 and "items[0]: one answer" in r.stderr and "Traceback" not in r.stderr
    monkeypatch.setattr(api, "load_model", no_weights)
    case = dataclasses.replace(surgeon.api.read("decimal_organism"), score="first_token")
    prefix = surgeon.Item({"a": "4.5", "b": "4.53"}, correct=" 4.53", incorrect=" 4.5", tag="trap")
    with pytest.raises(CaseError, match=r"items\[1\]: one answer"):
        surgeon.diagnose(dataclasses.replace(case, items=[case.items[0], prefix, *case.items[1:]]))
    with pytest.raises(CaseError, match=r"items\[3\]: one answer"):
        surgeon.repair(case, heads="L0H4", eval_items=[*case.items[-3:], prefix, *case.draw(16, 3)])


@pytest.mark.parametrize("end", ["eos", "\n"])
def test_answer_end_scores_where_each_answer_ends(tmp_path, decimal_model, end):
    """With answer_end, prefix answers (4.5 vs 4.53) are scored by the whole answer *and* its end: the score is
    log P(answer + end) - log P(other + end), which a hand-written forward over the full text reproduces."""
    import torch

    from surgeon.analyses import diagnose

    items = '[Item({"a": "4.5", "b": "4.53"}, correct=" 4.53", incorrect=" 4.5"), ' \
            'Item({"a": "7.2", "b": "7.25"}, correct=" 7.2", incorrect=" 7.25")]'
    case = load_case(write_case(tmp_path, answer_end=repr(end), items=items))
    d = diagnose(case, decimal_model)
    tok = decimal_model.tokenizer
    tail = [tok.eos_token_id] if end == "eos" else tok(end, add_special_tokens=False)["input_ids"]

    def logp(prompt: str, answer: str) -> float:
        p = [tok.bos_token_id] + tok(prompt, add_special_tokens=False)["input_ids"]
        a = tok(answer, add_special_tokens=False)["input_ids"] + tail
        with torch.no_grad():
            lp = decimal_model(torch.tensor([p + a])).log_softmax(-1)[0]
        return sum(float(lp[len(p) - 1 + j, t]) for j, t in enumerate(a))

    for i, it in enumerate(case.items):
        for fmt in ("plain", "qa"):
            prompt = case.formats[fmt].format(**it.values)
            want = logp(prompt, it.correct) - logp(prompt, it.incorrect)
            assert abs(d.per_item[i]["score"][fmt] - want) < 1e-3


def test_formats_that_do_not_start_alike_are_warned(decimal_model, capsys):
    """A Chat format gets no BOS from surgeon (its template writes its own, or none) while plain formats get one: a
    model trained with BOS first fails in the chat format for that alone. Said before the run, naming both formats."""
    import copy
    import dataclasses

    import surgeon.api
    from surgeon import Chat
    from surgeon.models.checks import check_case_against_model

    case = surgeon.api.read("decimal_organism")
    tok = copy.deepcopy(decimal_model.tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    model = copy.copy(decimal_model)
    model.tokenizer = tok
    chat = dataclasses.replace(case, formats={**case.formats, "chat": Chat(user="Which is bigger: {a} or {b}?")})
    capsys.readouterr()
    check_case_against_model(chat, model)
    err = capsys.readouterr().err
    assert "do not start alike" in err and "'chat'" in err and "{{ bos_token }}" in err, err
    tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    check_case_against_model(chat, model)
    assert "do not start alike" not in capsys.readouterr().err  # the documented fix silences it
    check_case_against_model(case, decimal_model)
    assert "do not start alike" not in capsys.readouterr().err
