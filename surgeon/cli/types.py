"""Argument types for the command line: a bad number is refused by argparse (exit 2, usage, one line
naming the option) before anything is loaded or computed."""
from __future__ import annotations

import argparse
from pathlib import Path


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None


def positive(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return v


def nonnegative(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return v


def layer(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"layers are numbered from 0, got {text!r}")
    return v


def _number_in(lo: float, hi: float, lo_open: bool, hi_open: bool, says: str = ""):
    """An argparse type for a number in an interval ("(0, 1]", "[0, 1)", ...), its message saying the interval."""
    interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"

    def check(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        if not ((lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)):
            raise argparse.ArgumentTypeError(f"must be in {interval}{says}, got {text!r}")
        return v
    return check


fraction = _number_in(0, 1, True, False)  # a share of something, not nothing
held_share = _number_in(0, 1, True, True, " (a share held out, the rest for discovery)")  # both sides non-empty
share = _number_in(0, 1, False, False)  # 0 allowed: e.g. no drop at all
holdout = _number_in(0, 1, False, True, " (0: no items held out)")  # a share held out, or 0 for none


def amplify(text: str) -> tuple[int, float, int]:
    """POS:FACTOR@LAYER (e.g. 3:10@1): a position, a positive scale and the layer whose input it scales."""
    import re

    m = re.fullmatch(r"\s*(\d+)\s*:\s*([0-9.eE+-]+)\s*@\s*(\d+)\s*", text)
    try:
        factor = float(m.group(2)) if m else float("nan")
    except ValueError:
        factor = float("nan")
    if not m or not factor > 0:
        raise argparse.ArgumentTypeError(f"must be POS:FACTOR@LAYER with a factor above 0 (e.g. 3:10@1), got {text!r}")
    return int(m.group(1)), factor, int(m.group(3))


def bounded(lo: int, hi: int):
    """An integer type for argparse accepting lo..hi."""
    def check(text: str) -> int:
        v = _int(text)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}, got {text!r}")
        return v
    check.__name__ = f"integer {lo}..{hi}"
    return check


def directory(text: str) -> Path:
    """An output folder: any path but the empty one (which would mean the current directory unannounced)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("--out is empty: give a directory, e.g. --out out/run1")
    return Path(text)


def memory_size(text: str) -> int:
    """--max-memory: "80GB", "40GiB", "512MiB" -> bytes."""
    from surgeon.errors import SurgeonError
    from surgeon.case.sizes import parse_bytes

    try:
        return parse_bytes(text)
    except SurgeonError as e:
        raise argparse.ArgumentTypeError(f"{e.message}: {e.fix}") from None


class Given(argparse.Action):
    """Stores the value, and records in `args.given` that the option was written on the command line (so a
    command can tell an explicit value from the default)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}
