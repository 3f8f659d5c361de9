"""The `surgeon` command: a thin layer over the same functions a notebook calls.

Each command is registered beside the function that runs it, with its options (`registry.command`, in the modules
`look`, `patching`, `threshold`, `repair`, `circuit`, `report`, `sae`, `shipped`); `build_parser` assembles them and
`main` dispatches to them. Heavy libraries (torch, transformer-lens) are imported inside commands so `surgeon --help`
is instant. Bad input ends with one clear message and exit status 2; `--debug` shows the traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from surgeon.cli import circuit, look, patching, repair, report, sae, shipped, threshold  # noqa: F401 (registers)
from surgeon.cli.parser import Parser
from surgeon.cli.registry import COMMANDS, ORDER
from surgeon.errors import SurgeonError
from surgeon.version import __version__


def build_parser() -> argparse.ArgumentParser:
    """The parser of every registered command, in `ORDER`."""
    if set(ORDER) != set(COMMANDS):
        raise RuntimeError(f"internal: commands registered {sorted(COMMANDS)} and ordered {sorted(ORDER)} differ")
    parser = Parser(prog="surgeon", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"surgeon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ORDER:
        c = COMMANDS[name]
        c.options(sub.add_parser(name, help=c.help))
    return parser


def main(argv: list[str] | None = None) -> int:
    import signal

    from surgeon.results import (
        cancel_redelivery,
        interrupted,
        on_interrupt,
        quiet_dropped_interrupts,
        reset_interrupts,
    )

    parser = build_parser()
    args = parser.parse_args(argv)
    reset_interrupts()
    previous = {}
    unraisable = sys.unraisablehook
    sys.unraisablehook = quiet_dropped_interrupts(unraisable)
    for sig in (signal.SIGINT, signal.SIGTERM):  # SIGTERM (what schedulers send) ends a run as Ctrl-C does
        try:
            previous[sig] = signal.signal(sig, on_interrupt)
        except ValueError:  # not the main thread
            pass
    try:
        code = COMMANDS[args.command].run(args)
        if interrupted():  # a Ctrl-C whose KeyboardInterrupt was dropped (in a finaliser): the run still ends so
            raise KeyboardInterrupt
        return code
    except SurgeonError as e:
        if getattr(args, "debug", False):
            raise
        print(f"surgeon: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the disk filled up or a folder vanished while writing: nothing half-written is kept
        import errno

        if getattr(args, "debug", False) or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise
        print(f"surgeon: error: writing {e.filename or 'results'} failed: {e.strerror}\n"
              "  fix: free space or choose another --out; finished search chunks are kept (--resume continues)",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        out = getattr(args, "out", None)
        parts = Path(out) / "parts" if out else None
        if parts is not None and any(parts.glob("chunk-*.npz")):
            print(f"surgeon: interrupted; the finished chunks in {parts} are kept (--resume continues)", file=sys.stderr)
        else:
            print("surgeon: interrupted; no results were written", file=sys.stderr)
        return 130
    finally:
        cancel_redelivery()  # a signal held during an import, not yet delivered again: this run has answered it
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = unraisable


def console() -> None:
    """The `surgeon` command and `python -m surgeon`: main's exit code; an interrupted run (130) ends at once,
    after its message, without the interpreter's finalisers (a Ctrl-C that landed while torch was importing
    could otherwise end the process by the signal itself, not with 130)."""
    code = main()
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
