"""Case files: the shipped ones load; every kind of bad input gets one CaseError naming file, field, fix."""
import os
import subprocess
import sys

import pytest

from surgeon import CaseError, load_case

from .conftest import ROOT

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


def test_cli_bad_case_exits_nonzero_without_traceback(tmp_path):
    p = write_case(tmp_path, good='"simple"')
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "surgeon", "diagnose", str(p), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "field 'good'" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() or not any(out.iterdir())
