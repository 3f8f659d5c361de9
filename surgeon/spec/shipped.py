"""The case files shipped with surgeon (the package's cases/ folder, so they run from anywhere), by name."""
from __future__ import annotations

from pathlib import Path

CASES_DIR = Path(__file__).parent.parent / "cases"


DEFAULT_CASE = "cases/decimal_organism.py"


def shipped_case(name: str) -> str:
    """A case path as given, or the shipped case of that name when the path does not exist here."""
    p = Path(name)
    if p.exists():
        return name
    for cand in (CASES_DIR / p.name, CASES_DIR / f"{p.name}.py"):
        if cand.is_file():
            return str(cand)
    return name
