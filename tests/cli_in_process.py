"""`python -m surgeon ARGS` run in the test's own process: the same `main` the console script calls, its stdout and
stderr captured and its exit code returned as a `subprocess.CompletedProcess`, without the 4-5 s a new interpreter
spends importing torch and TransformerLens (a third of the suite's time went to those imports). A test of what only a
process shows keeps `subprocess.run`: signals, commands side by side, an environment of its own, the interpreter's
own exit (no traceback printed by Python itself), imports in a fresh interpreter."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import torch


def surgeon(args, cwd=None, **_ignored) -> subprocess.CompletedProcess:
    """`args`: the command line after `surgeon` (strings or paths); `cwd`: where it runs (restored after)."""
    from surgeon.cli.commands import main

    argv = [str(a) for a in args]
    out, err, code = io.StringIO(), io.StringIO(), 0
    here, threads, argv0 = os.getcwd(), torch.get_num_threads(), sys.argv
    if cwd is not None:
        os.chdir(cwd)
    try:
        sys.argv = ["surgeon", *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse's usage errors, and a command that exits
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(here)
        sys.argv = argv0
        torch.set_num_threads(threads)  # a command sets the threads it runs on: the worker's count comes back
    return subprocess.CompletedProcess(["surgeon", *argv], code or 0, out.getvalue(), err.getvalue())
