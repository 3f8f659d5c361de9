"""docs/errors.md quotes messages the tool really prints: every quoted message's fixed words are in the code."""
import re
from pathlib import Path

from tests.conftest import ROOT


def _source() -> str:
    text = "\n".join(p.read_text() for p in Path(ROOT, "surgeon").rglob("*.py"))
    return re.sub(r'"\s*\n\s*f?"', "", text)  # join implicitly concatenated string literals across lines


def _phrases(message: str):
    """The fixed parts of a quoted message: runs of 3+ plain words (no quotes, numbers, paths or placeholders)."""
    message = re.sub(r"^field '[^']*': ", "", message)
    for part in re.split(r"'[^']*'|\{[^}]*\}|\.\.\.|\S*[0-9/.]\S*|\(|\)|`", message):
        words = part.strip(" :;,").split()
        if len(words) >= 3:
            yield " ".join(words)


def test_every_documented_message_is_printed_by_the_code():
    src = _source()
    doc = Path(ROOT, "docs", "errors.md").read_text()
    missing, checked = [], 0
    for row in doc.splitlines():
        if not row.startswith("| `"):
            continue
        first = row.split("|")[1]
        for msg in re.findall(r"`([^`]+)`", first):
            for phrase in _phrases(msg):
                checked += 1
                if phrase not in src:
                    missing.append(phrase)
    assert checked > 40
    assert not missing, missing


def _options(parser, path=()):
    import argparse

    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _options(sub, (*path, name))
        elif not isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(path), a


def test_every_option_has_help_and_states_its_default():
    import argparse

    from surgeon.cli.commands import build_parser

    missing = []
    options = list(_options(build_parser()))
    for where, a in options:
        name = "/".join(a.option_strings) or a.dest
        has_default = a.default not in (None, False, [], argparse.SUPPRESS) and not a.required and a.nargs != "+"
        if not a.help:
            missing.append(f"{where} {name}: no help")
        elif has_default and "default" not in a.help.lower():
            missing.append(f"{where} {name}: default {a.default!r} not stated")
    assert len(options) > 150 and not missing, missing
