"""The exceptions surgeon raises on bad input. Each carries where the problem is and how to fix it."""
from __future__ import annotations


# how an error names where it happened: functions from `where` to what is printed, registered by the layers that
# know better (surgeon.case.shipped: a shipped case by its name, not by its path inside the install)
SHOWN_WHERE: list = []


class SurgeonError(Exception):
    """Base class: a problem with the user's input or environment, reported without a traceback."""

    def __init__(self, message: str, *, where: str | None = None, field: str | None = None,
                 fix: str | None = None):
        self.message, self.where, self.field, self.fix = message, where, field, fix
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.where
        for show in SHOWN_WHERE:  # e.g. a shipped case by its name, not its path inside the install
            where = show(where) if where else where
        loc = ""
        if where and self.field:
            loc = f"{where}: field '{self.field}': "
        elif where:
            loc = f"{where}: "
        elif self.field:
            loc = f"field '{self.field}': "
        out = loc + self.message
        if self.fix:
            out += f"\n  fix: {self.fix}"
        return out


class CaseError(SurgeonError):
    """A case file is missing a field, has a wrong value, or does not fit its model."""


class ModelError(SurgeonError):
    """A model cannot be found or loaded (offline)."""


class AnalysisError(SurgeonError):
    """An analysis was asked for something the case or model cannot give."""


def warn(message: str) -> None:
    """A warning for the user: one line on stderr, no traceback (tests capture it like any output)."""
    import sys

    print(f"surgeon: warning: {message}", file=sys.stderr)


def did_you_mean(word: str, choices) -> str:
    """' (did you mean 'chat'?)' when a choice is close to `word` (difflib's ratio >= 0.6), else ''."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# optional packages: the line that installs each where it is missing. sae-lens 6 pins transformer-lens below 4, so
# beside TransformerLens 4 it is absent (or, installed anyway, fails at import): docs/install.md says what works with what
OPTIONAL = {"sae_lens": ("sae-lens", "pip install 'sae-lens>=6.54,<7' 'transformer-lens>=3.9,<4' (sae-lens 6 does not "
                                   "support transformer-lens 4 yet)")}


def optional_import(module: str, what: str):
    """`module` imported, or one clear error (exit 2, no traceback) where it is missing or does not import here:
    `what` needs it, and the line that installs it (`OPTIONAL`)."""
    import importlib

    package, install = OPTIONAL[module]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        how = ("is not installed" if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == module
               else f"does not import here ({type(e).__name__}: {e})")
        raise SurgeonError(f"{what} needs {package}, which {how}", field=package,
                           fix=install) from None
