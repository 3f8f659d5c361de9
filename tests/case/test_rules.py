"""The case rules (`surgeon.case.reading.RULES`): each one, broken alone on an otherwise good case, is the rule that
refuses it, with a field it declares; the rules run in their order (a case broken twice is refused by the earlier
rule); docs/errors.md's table is theirs."""
import re
from dataclasses import replace
from pathlib import Path

import pytest

from surgeon import Chat, Item
from surgeon.case.reading import RULES, read_case, rules_table, validate
from surgeon.errors import CaseError

ROOT = Path(__file__).resolve().parents[2]
GOOD = read_case("decimal_organism")
ITEMS = list(GOOD.items)

BROKEN = {  # rule -> the fields replaced to break it alone
    "required": dict(items=None),
    "name": dict(name=" "),
    "model": dict(model=3),
    "formats": dict(formats={}),
    "templates": dict(formats={**GOOD.formats, "qa": "Q: {a!r} or {b}\nA:"}),
    "good and bad": dict(good="nope"),
    "items": dict(items=[]),
    "item values": dict(items=[Item({"a": "1.5"}, correct=" 1.5", incorrect=" 1.25")] + ITEMS[1:]),
    "item answers": dict(items=[Item(ITEMS[0].values, correct=" 9.8", incorrect=" 9.8")] + ITEMS[1:]),
    "item positions and tags": dict(items=[replace(ITEMS[0], tag=3)] + ITEMS[1:]),
    "neutral": dict(neutral="a text"),
    "scan": dict(scan=["shots"]),
    "draw": dict(draw=3),
    "reference": dict(reference=[]),
    "no duplicates": dict(items=ITEMS + ITEMS[:1]),
    "options": dict(align="middle"),
    "per position": dict(answer_end="eos", items=[Item(ITEMS[0].values, correct=[" 9"], incorrect=[" 1"])]),
    "metric": dict(metric="accuracy"),
    "answer end": dict(answer_end=""),
    "focus": dict(focus="nope"),
    "components": dict(components=("zz",)),
    "saes": dict(saes={"path": "x"}),
    "prepend_bos": dict(prepend_bos="yes"),
    "layers": dict(layers=3),
}


def _fields(rule) -> list[str]:
    """The declared fields as patterns: items[i] is any item's, formats[NAME] any format's."""
    return [re.escape(f.strip()).replace(r"\[i\]", r"\[\d+\]").replace(r"\[NAME\]", r"\[.+\]")
            for f in rule.field.split(",")]


def test_every_rule_is_broken_here_once():
    assert sorted(BROKEN) == sorted(r.name for r in RULES)


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_each_rule_refuses_its_own_breakage_with_a_field_it_declares(rule):
    validate(GOOD)  # the good case passes every rule
    with pytest.raises(CaseError) as e:
        validate(replace(GOOD, **BROKEN[rule.name]))
    hit = next(r for r in RULES if any(re.fullmatch(p, e.value.field or "") for p in _fields(r)))
    assert any(re.fullmatch(p, e.value.field) for p in _fields(rule)), (e.value.field, str(e.value))
    assert RULES.index(hit) <= RULES.index(rule) and e.value.fix


def test_rules_run_in_order():
    """Broken twice (a duplicate item and an unknown align), the earlier rule answers."""
    with pytest.raises(CaseError) as e:
        validate(replace(GOOD, items=ITEMS + ITEMS[:1], align="middle"))
    assert e.value.field.startswith("items[")
    assert [r.name for r in RULES].index("no duplicates") < [r.name for r in RULES].index("options")


def test_a_chat_format_passes_the_template_rule():
    validate(replace(GOOD, formats={**GOOD.formats, "chat": Chat(user="{a} or {b}?")}))


def test_the_errors_page_lists_every_rule():
    page = (ROOT / "docs" / "errors.md").read_text()
    assert rules_table() in page
