"""Results that show themselves: `print(r)` is the report the CLI prints, `r._repr_html_()` its tables and
figures in Jupyter, `r.figure()` a matplotlib Figure, `r.save(dir)` what the CLI writes with `--out`.

Results are plain dataclasses of the analyses; how each is shown is a `View` registered by the report layer
(`surgeon.reports.views`), so nothing here or in the analyses imports the layers above them. The package root
installs the loader that registers the views the first time one is needed (sae-lens's registry is the model).
"""
from __future__ import annotations

import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

VIEWS: dict[str, "View"] = {}  # result class name -> how it is shown
_loader: list[Callable[[], None]] = []  # installed by the package root: imports the report layer's views


@dataclass
class View:
    """How one kind of result is shown and saved."""

    command: str  # the CLI command that writes it (results.json's "command", the manifest's)
    text: Callable  # result -> the printed report
    figures: dict[str, Callable] = field(default_factory=dict)  # file name -> draw(result, path or None) -> Figure
    tables: dict[str, Callable] = field(default_factory=dict)  # file name -> rows(result) (CSV)
    save: Callable | None = None  # save(out, command, result, case, options=, device=, figures=, tables=, api=)
    table: Callable | None = None  # result -> its main table (an object with .html()), for Jupyter
    headline: Callable | None = None  # result -> one line: what it found (the repr's second part)
    frame: Callable | None = None  # result -> a pandas DataFrame in long format (`to_pandas`)
    widget: Callable | None = None  # result -> an interactive HTML view, shown in Jupyter instead of the figures


def register(cls_name: str, view: View) -> None:
    VIEWS[cls_name] = view


def install_loader(load: Callable[[], None]) -> None:
    _loader[:] = [load]


def view_of(result) -> View:
    name = type(result).__name__
    if name not in VIEWS:
        for load in _loader:
            load()
    if name not in VIEWS:
        raise TypeError(f"no view is registered for {name}")
    return VIEWS[name]


def svg_of(fig) -> str:
    """A matplotlib figure as inline SVG (for HTML), its text kept as text (selectable, searchable, measurable); the
    same figure gives the same text (no date, fixed ids)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": "surgeon", "svg.fonttype": "none"}):  # text kept as text
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.find("<svg"):]  # drop the XML prolog and doctype: inline SVG in HTML


class Shows:
    """Mixed into every analysis result (dataclasses): printing, Jupyter display, figures and saving."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # the short repr below, put on each result class before @dataclass runs (which then keeps it instead of
        # writing its field-by-field dump, kilobytes of arrays)
        cls.__repr__ = Shows.__repr__

    def __str__(self) -> str:
        return view_of(self).text(self)

    def figure(self, name: str | None = None):
        """The result's figure (the first, or the one whose file name is `name`) as a matplotlib Figure."""
        figs = view_of(self).figures
        if not figs:
            raise ValueError(f"{type(self).__name__} has no figure")
        if name is not None and name not in figs:
            raise ValueError(f"no figure {name!r}; this result draws: {', '.join(figs)}")
        return figs[name or next(iter(figs))](self, None)

    def __repr__(self) -> str:
        """One or two lines: the analysis, the case and what it found (`print(r)` gives the whole report)."""
        v = view_of(self)
        case = getattr(self, "case", None)
        head = f"<{type(self).__name__}: surgeon {v.command}" + (f" on case {case!r}" if case else "") + ">"
        line = v.headline(self) if v.headline else None
        return head + (f"\n  {line}" if line else "")

    def _repr_html_(self) -> str:
        """The headline, the main table (an HTML table whose columns sort on a click), the figures, and the full
        report folded beneath."""
        v = view_of(self)
        parts = [f"<p><b>{html.escape(repr(self).splitlines()[0])}</b>"
                 + (f"<br>{html.escape(v.headline(self))}" if v.headline else "") + "</p>"]
        if v.table is not None:
            parts.append(v.table(self).html())
        if v.widget is not None:
            parts.append(v.widget(self))
        else:
            for draw in v.figures.values():
                fig = draw(self, None)  # None: a figure this result does not have (a repair without baselines)
                if fig is not None:
                    parts.append(f"<div>{svg_of(fig)}</div>")
        parts.append(f"<details><summary>the full report</summary><pre>{html.escape(v.text(self))}</pre></details>")
        return "\n".join(parts)

    def to_pandas(self):
        """The result as a pandas DataFrame in long format: one row per unit x item x format where the analysis
        keeps per-item values, else one row per unit (`surgeon.reports.frames` says what each holds)."""
        v = view_of(self)
        if v.frame is None:
            raise TypeError(f"{type(self).__name__} has no table form")
        return v.frame(self)

    def save(self, out, case=None, *, device: str | None = None) -> Path:
        """Write what `surgeon COMMAND --out DIR` writes: results.json, manifest.json (with the case and its
        model's facts when `case` is given), the figures and the tables; all or nothing (staged, then moved into
        place). The manifest records the options the result was computed with and that it came from Python."""
        v = view_of(self)
        out = Path(out)
        options = dict(getattr(self, "options", None) or {})
        v.save(out, v.command, self, case, options=options, device=device, figures=v.figures,
               tables={n: rows(self) for n, rows in v.tables.items()}, api=f"{type(self).__name__}.save")
        return out
