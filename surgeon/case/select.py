"""Which failing format and which items an analysis runs on, from a case alone (no model, no torch): the
command line checks --bad and --tag with these before anything loads."""
from __future__ import annotations

from surgeon.errors import AnalysisError, did_you_mean
from surgeon.case.case import Case


def pick_bad(case: Case, bad: str | None) -> str:
    """The failing format `bad` (the case's first failing format when None), or a clear error."""
    if bad is None:
        return case.bad_formats[0]
    if bad not in case.bad_formats:
        hint = did_you_mean(bad, case.bad_formats)
        if bad == case.good:
            hint = f" ({bad!r} is the case's good format)"
        raise AnalysisError(f"{bad!r} is not one of the case's failing formats{hint}", field="bad",
                            fix=f"use one of: {', '.join(case.bad_formats)}")
    return bad


def pick_items(case: Case, tag: str | None):
    """(tag, items): the items with `tag` ('all': every item; None: the case's focus), or a clear error."""
    tag = case.focus if tag is None else (None if tag == "all" else tag)
    items = case.items_for(tag)
    if not items:
        raise AnalysisError(f"no items have tag {tag!r}{did_you_mean(tag, case.tags)}", field="tag",
                            fix=f"use one of: {', '.join(case.tags)}, or 'all'")
    return tag, items
