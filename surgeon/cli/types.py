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


def fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return v


def held_share(text: str) -> float:
    """A share of items held out: in (0, 1), both sides non-empty."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1) (a share held out, the rest for discovery), got {text!r}")
    return v


def share(text: str) -> float:
    """A share in [0, 1] (0 allowed: e.g. no drop at all)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return v


def holdout(text: str) -> float:
    """A share of items held out, or 0 for none."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (0: no items held out), got {text!r}")
    return v


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
