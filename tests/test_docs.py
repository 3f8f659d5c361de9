"""docs/errors.md quotes messages the tool really prints: every quoted message's fixed words are in the code."""
import re
from pathlib import Path

from .conftest import ROOT


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
