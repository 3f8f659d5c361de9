"""Commands registered beside their handlers (`surgeon.cli.registry`): every command's options are declared in the
module of the function that runs it, `build_parser` assembles them, no function in `surgeon/cli` runs past 80 lines,
and `surgeon --help` and every command's help read as the snapshot in tests/cli/help.txt (regenerate it with
`python tests/cli/test_registry.py` after a change meant to be seen, and read the diff)."""
import argparse
import ast
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SNAPSHOT = HERE / "help.txt"
CLI = HERE.parent.parent / "surgeon" / "cli"


def help_text() -> str:
    """Every parser's --help at 120 columns, `surgeon` first, then each command and subcommand in the order shown."""
    from surgeon.cli.commands import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "120"
    try:
        out = []

        def walk(parser, path):
            out.append("=" * 20 + " " + " ".join(path) + "\n" + parser.format_help())
            for a in parser._actions:
                if isinstance(a, argparse._SubParsersAction):
                    for name, sp in a.choices.items():
                        walk(sp, path + [name])

        walk(build_parser(), ["surgeon"])
        return "\n".join(out)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def test_every_help_reads_as_its_snapshot():
    assert help_text() == SNAPSHOT.read_text(), ("a command's help changed: if that was meant, regenerate with "
                                                 "python tests/cli/test_registry.py and read the diff")


def test_each_command_declares_its_options_beside_its_handler_and_every_one_is_listed():
    from surgeon.cli.commands import build_parser
    from surgeon.cli.registry import COMMANDS, ORDER

    build_parser()
    assert list(ORDER) == list(dict.fromkeys(ORDER)) and set(ORDER) == set(COMMANDS)
    for name, c in COMMANDS.items():
        assert c.options.__module__ == c.run.__module__ != "surgeon.cli.commands", name
        assert c.help and not c.help.endswith("."), name  # argparse's one-line style
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(ORDER)


def test_no_function_in_the_cli_runs_past_80_lines():
    long = []
    for f in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{f.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent.parent))
    SNAPSHOT.write_text(help_text())
    print(f"wrote {SNAPSHOT}")
