"""Commands registered beside their handlers: a command module declares, next to the function that runs a command,
its name, its one-line help and the function adding its options (`@command`); `commands.build_parser` assembles the
registered commands in `ORDER`, and `main` dispatches through the same registry. Option groups several commands
share (the case and model, items, metric, memory, patching, held-out choices) are defined once, in `common`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# the order `surgeon --help` lists the commands in: the user's way through a case
ORDER = ("diagnose", "scan", "dla", "encode", "patch-positions", "attention", "patch", "attribute", "threshold",
         "repair", "sinks", "merge", "blend", "circuit", "circuit-eval", "report", "sae", "feature-circuit", "cases",
         "organisms")


@dataclass(frozen=True)
class Command:
    """One `surgeon` command: `options(parser)` adds its options to its subparser; `run(args)` runs it and returns the
    exit status."""

    name: str
    help: str
    options: Callable
    run: Callable


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, options: Callable):
    """Register the decorated function as the handler of command `name`, with its help and its options."""
    def register(run: Callable) -> Callable:
        if name in COMMANDS:
            raise RuntimeError(f"internal: the command {name!r} is registered twice")
        COMMANDS[name] = Command(name, help, options, run)
        return run
    return register
