"""The case files shipped with surgeon (the package's cases/ folder, so they run from anywhere), by name."""
from __future__ import annotations

from pathlib import Path

from surgeon.errors import SHOWN_WHERE

CASES_DIR = Path(__file__).parent.parent / "cases"


DEFAULT_CASE = "cases/decimal_organism.py"


def shown(where: str) -> str:
    """How an error names a place: a shipped case file by its name (`the shipped case 'decimal_organism'`), not by
    its absolute path inside the install; anything else as it is."""
    try:
        p = Path(where)
        if p.suffix == ".py" and p.resolve().parent == CASES_DIR.resolve():
            return f"the shipped case {p.stem!r}"
    except (OSError, ValueError):
        pass
    return where


SHOWN_WHERE.append(shown)


def shipped_case(name: str) -> str:
    """A case path as given, or the shipped case of that name when the path does not exist here."""
    p = Path(name)
    if p.exists():
        return name
    for cand in (CASES_DIR / p.name, CASES_DIR / f"{p.name}.py"):
        if cand.is_file():
            return str(cand)
    return name
