"""A case file written for the user (`surgeon scan --write-case`): the scanned case with the formats found.

The file loads the case it was found on (its items, model, metric, draw, SAEs: everything the scan did not change)
by a path relative to itself and replaces its formats, so nothing the user wrote is copied or lost; it is written
atomically and read back with `load_case` before it is kept.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

from surgeon.case.case import Case, Chat, Format
from surgeon.case.reading import read_case
from surgeon.errors import CaseError
from surgeon.results import atomic_text

TEMPLATE = '''"""{doc}"""
import dataclasses
from pathlib import Path

from surgeon import Chat, load_case  # noqa: F401 (Chat: for chat-template formats)

_found_on = load_case(Path(__file__).parent / {rel!r})  # the items, model and metric of the case it was found on
case = dataclasses.replace(
    _found_on,
    name={name!r},
    formats={{
{formats}
    }},
    good={good!r},
    bad={bad!r},
    description={description!r},
    source=None, digest=None, read_as=None,  # set again when this file is loaded
)
'''


def _literal(f: Format) -> str:
    if isinstance(f, Chat):
        return f"Chat(user={f.user!r}, system={f.system!r})"
    return repr(f)


def check_write_target(path, found_on: Case | None = None) -> None:
    """Refuse a case file that cannot be written, before any work: not .py, already there, or a case not read from
    a file (the written case loads the scanned one's items from it)."""
    path = Path(path)
    if path.suffix != ".py":
        raise CaseError(f"{path} is not a .py file", field="--write-case", fix="give a path ending in .py, e.g. "
                                                                              "cases/found.py")
    if path.exists():
        raise CaseError(f"{path} exists; a scan does not overwrite a case file", field="--write-case",
                        fix="give a new path, or remove the old file first")
    if found_on is not None and (not found_on.source or not Path(found_on.source).is_file()):
        raise CaseError("the scanned case was not read from a file, so the written case cannot load its items",
                        field="--write-case", fix="scan a case file (surgeon scan cases/NAME.py), or build the Case "
                                                  "in Python with dataclasses.replace(case, formats=...)")


def write_case(path, found_on: Case, formats: Mapping[str, Format], good: str, bad: list[str], *, name: str,
               description: str, doc: str) -> Path:
    """Write the case file at `path` (refused when it exists), then read it back to check it loads."""
    path = Path(path)
    check_write_target(path, found_on)
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(Path(found_on.source).resolve(), path.parent.resolve())
    body = "\n".join(f"        {k!r}: {_literal(v)}," for k, v in formats.items())
    text = TEMPLATE.format(doc=doc.replace('"""', "'''"), rel=rel, name=name, formats=body, good=good, bad=bad,
                           description=description)
    atomic_text(path, text)
    try:  # the file must load as any case does

        read_case(path)
    except Exception:
        path.unlink(missing_ok=True)
        raise
    return path
