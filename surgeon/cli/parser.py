"""The command line's parser: abbreviations are off (`--layer` is not taken for `--layers`), and an unknown
option or command is answered with the subcommand's own usage and the closest name it has."""
from __future__ import annotations

import argparse

from surgeon.errors import did_you_mean


class Parser(argparse.ArgumentParser):
    """argparse.ArgumentParser with allow_abbrev off, for the top-level command and every subcommand."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def options(self) -> list[str]:
        return [s for action in self._actions for s in action.option_strings if s.startswith("--")]

    def subparser(self, args: argparse.Namespace) -> "Parser":
        """The innermost subcommand parser that `args` went through (this parser when it has none)."""
        p = self
        while True:
            subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
            if not subs:
                return p
            name = getattr(args, subs[0].dest, None)
            if name not in subs[0].choices:
                return p
            p = subs[0].choices[name]

    def parse_args(self, args=None, namespace=None):
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            p = self.subparser(ns)
            unknown = [x for x in extra if x.startswith("-")]
            if unknown:
                word = unknown[0].split("=", 1)[0]
                hint = did_you_mean(word, p.options())
                p.error(f"unrecognized option {word}{hint}" + (f" (and {' '.join(extra[1:])})" if len(extra) > 1 else ""))
            p.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            hint = did_you_mean(value, action.choices)
            what = "command" if isinstance(action, argparse._SubParsersAction) else "choice"
            raise argparse.ArgumentError(action, f"invalid {what}: {value!r}{hint} (choose from "
                                                 + ", ".join(map(repr, action.choices)) + ")")
