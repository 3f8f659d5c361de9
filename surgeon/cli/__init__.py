"""The surgeon command: a thin layer over the library. Each command is registered beside its handler with its
options (`registry`) in a module of its kind: `look` (diagnose, scan, dla, encode, attention, sinks), `patching`
(patch, patch-positions, attribute, blend), `threshold` (threshold, merge), `repair`, `circuit` (circuit,
circuit-eval), `report`, `sae` (the sae subcommands, feature-circuit), `shipped` (cases, organisms); `commands`
assembles the parser and runs them, `common` holds the option groups and checks they share, `types` argument checks."""
from surgeon.cli.commands import build_parser, console, main

__all__ = ["build_parser", "console", "main"]
