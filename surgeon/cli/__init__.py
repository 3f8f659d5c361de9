"""The surgeon command: a thin layer over the library. `commands` builds the parser and runs the analysis
commands, `sae` the sae subcommands, `common` what they share, `types` argument checks."""
from surgeon.cli.commands import build_parser, console, main

__all__ = ["build_parser", "console", "main"]
