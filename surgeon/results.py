"""Writing results: atomically, with a manifest (versions, seed, case hash, model) beside them."""
from __future__ import annotations

import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Iterator

from surgeon.errors import SurgeonError
from surgeon.version import __version__


PACKAGE = Path(__file__).resolve().parent


def shown_path(path) -> str:
    """A path as results record it: inside the installed package as surgeon/... (the shipped organisms and
    SAEs: the same on every machine, so committed results hold no machine's folders), inside the current
    directory relative to it, elsewhere as given."""
    p = Path(str(path)).expanduser()
    for root, prefix in ((PACKAGE, Path("surgeon")), (Path.cwd().resolve(), Path("."))):
        try:
            return str(prefix / p.resolve().relative_to(root)) if p.is_absolute() else str(path)
        except ValueError:
            continue
    return str(path)


def versions() -> dict[str, str]:
    """The versions of Python, surgeon and the libraries whose code computes the numbers."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "surgeon": __version__}
    for pkg in ("torch", "transformer-lens", "sae-lens", "transformers", "numpy", "networkx"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def manifest(command: str, case=None, *, seed: int | None = None, device: str | None = None,
             dtype: str | None = None, options: dict | None = None, model_info: dict | None = None,
             execution: dict | None = None, argv: list[str] | None = None) -> dict:
    """What made a result: the command (and its command line; from Python, `argv` is None and `api` says so)."""
    m: dict[str, Any] = {
        "command": command,
        "argv": [shown_path(sys.argv[0]), *sys.argv[1:]] if argv is None else argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "versions": versions(),
        "seed": seed,
        "device": device,
        "dtype": dtype,
        "options": options or {},
    }
    if case is not None:
        m["case"] = case.record()
    if model_info:
        m["model"] = model_info
    if execution:  # which execution path the engine took, and why (analyses that patch)
        m["execution"] = execution
    return m


def to_jsonable(x: Any) -> Any:
    if is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(asdict(x))
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "tolist"):
        return to_jsonable(x.tolist())
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, Path):
        return str(x)
    return x


def from_jsonable(cls, data: Any) -> Any:
    """A result dataclass `cls` rebuilt from what `to_jsonable` wrote (results.json's "result"): nested dataclasses
    by their annotations, arrays as float arrays (null -> NaN), tuples as tuples; what it cannot type stays as read.
    """
    import typing
    from dataclasses import fields

    import numpy as np

    def build(tp, v):
        if v is None:
            return None
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Union or type(tp).__name__ == "UnionType":
            inner = [a for a in args if a is not type(None)]
            return build(inner[0], v) if len(inner) == 1 else v
        if isinstance(tp, type) and is_dataclass(tp) and isinstance(v, dict):
            hints = typing.get_type_hints(tp)
            return tp(**{f.name: build(hints.get(f.name, Any), v[f.name]) for f in fields(tp) if f.name in v})
        if tp is np.ndarray:
            a = np.asarray(v, dtype=object)
            return np.where(a == None, np.nan, a).astype(float)  # noqa: E711 - elementwise
        if origin is tuple or tp is tuple:
            if args and len(args) == 2 and args[1] is Ellipsis:
                return tuple(build(args[0], x) for x in v)
            if args and len(args) == len(v):
                return tuple(build(a, x) for a, x in zip(args, v))
            return tuple(tuple(x) if isinstance(x, list) else x for x in v)
        if origin is list and args and isinstance(v, list):
            return [build(args[0], x) for x in v]
        if origin is dict and isinstance(v, dict) and len(args) == 2:
            key = args[0] if args[0] in (int, float) else (lambda k: k)
            return {key(k): build(args[1], x) for k, x in v.items()}
        if tp is float:
            return float(v)
        return v

    return build(cls, data)


# signals the CLI's handler has seen: Python drops the KeyboardInterrupt a handler raises where it cannot raise
# (inside a finaliser or a callback), so a Ctrl-C that lands there would otherwise be lost and the run go on
_signals: list[int] = []


def on_interrupt(signum, frame) -> None:
    """The CLI's SIGINT and SIGTERM handler: remember the signal, then raise KeyboardInterrupt.

    Not inside an import: importing torch runs C++ that calls back into Python, and an exception raised there ends
    the process with "terminate called after throwing an instance of 'pybind11::error_already_set'" (SIGABRT, a
    C++ stack on the terminal). There the signal is delivered again a moment later, until the import is done."""
    _signals.append(signum)
    if _importing(frame):
        _deliver_later(signum)
        return
    raise KeyboardInterrupt


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_later: list = []  # the timers of signals to deliver again (cancelled when the CLI's handler is removed)


def _deliver_later(signum: int, seconds: float = 0.05) -> None:
    import _thread
    import threading

    t = threading.Timer(seconds, _thread.interrupt_main, args=(signum,))
    t.daemon = True
    _later.append(t)
    t.start()


def quiet_dropped_interrupts(report):
    """A `sys.unraisablehook` for the CLI: a KeyboardInterrupt that `on_interrupt` raised where Python drops it (a
    finaliser, a weakref callback) is remembered already, so it is not reported ("Exception ignored in ...",
    a traceback on the user's terminal); every other unraisable exception goes to `report`, the hook before."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _signals:
            return
        report(unraisable)

    return hook


def cancel_redelivery() -> None:
    """Cancel the signals held during an import and not yet delivered again (the CLI's `main`, before it puts the
    previous handlers back: its run has answered them)."""
    while _later:
        _later.pop().cancel()


def reset_interrupts() -> None:
    """Forget earlier signals (the CLI's `main` starts each run with none)."""
    _signals.clear()
    cancel_redelivery()


def interrupted() -> bool:
    """Whether the CLI's handler saw SIGINT or SIGTERM in this process."""
    return bool(_signals)


@contextmanager
def staging(out_dir: str | Path) -> Iterator[Path]:
    """A temporary folder next to `out_dir`; its files replace those in `out_dir` only if the block succeeds.

    Nothing half-written is ever left in `out_dir`: on error or Ctrl-C the staging folder is removed.
    """
    out = Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(".staging-*"):  # left by a killed run (the CLI holds a lock on out while it writes)
        shutil.rmtree(old, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        yield tmp
        if interrupted():  # a Ctrl-C whose KeyboardInterrupt was dropped on its way: keep nothing
            raise KeyboardInterrupt
        files = sorted((f for f in tmp.rglob("*") if f.is_file()), key=lambda f: f.name == "manifest.json")
        names = sorted(str(f.relative_to(tmp)) for f in files)
        if (tmp / "manifest.json").is_file():  # the manifest lists the files of its set
            m = json.loads((tmp / "manifest.json").read_text())
            m["files"] = names
            write_json(tmp / "manifest.json", m)
        old = _listed(out / "manifest.json")
        # manifest.json marks a complete set: it goes first and comes back last, so a kill while the files
        # move leaves a folder without a manifest (incomplete), never a new manifest beside old results
        (out / "manifest.json").unlink(missing_ok=True)
        for f in old - set(names):  # what an earlier run (of another command) wrote and this one does not
            (out / f).unlink(missing_ok=True)
        for f in files:
            dest = out / f.relative_to(tmp)
            dest.parent.mkdir(parents=True, exist_ok=True)
            follow_umask(f)
            os.replace(f, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if created and not any(out.iterdir()):  # a folder this run made and filled with nothing
            out.rmdir()


def _listed(manifest_path: Path) -> set[str]:
    """The files an earlier manifest in this folder listed (only plain relative names inside the folder)."""
    try:
        files = json.loads(manifest_path.read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return set()
    return {f for f in files if isinstance(f, str) and f and not Path(f).is_absolute() and ".." not in Path(f).parts}


def follow_umask(path, directory: bool = False) -> None:
    """mkstemp/mkdtemp (and safetensors) create private files; give them the mode a plain open() or mkdir()
    would, so other users can read results and merge shards."""
    m = os.umask(0)
    os.umask(m)
    os.chmod(path, (0o777 if directory else 0o666) & ~m)


def atomic_text(path: Path, text: str) -> None:
    """`text` written to `path` whole or not at all (a temporary file beside it, then renamed over it)."""
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(to_jsonable(data), indent=2, allow_nan=False) + "\n")


def check_out(out) -> None:
    """Refuse an --out that cannot be written before any work is done, and take a lock on it so that a
    second run writing the same folder is refused. The lock file (`.NAME.surgeon-lock` beside the folder) is
    opened without following symlinks and removed when this process ends."""
    import atexit
    import errno
    import fcntl

    if out is None:
        return
    if not str(out).strip():
        raise SurgeonError("--out is empty", field="--out", fix="give a directory, e.g. --out out/run1")
    out = Path(out).expanduser().absolute()
    if out.is_symlink() and not out.exists():  # a dangling link: mkdir would fail only after the first step ran
        raise SurgeonError(f"{out} is a symbolic link to {os.readlink(out)}, which does not exist", field="--out",
                           fix="make the folder it points to, remove the link, or give another directory")
    if out.exists() and not out.is_dir():
        raise SurgeonError(f"{out} exists and is a file", field="--out", fix="give a directory (new or existing)")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise SurgeonError(f"{parent} is a file, so {out} cannot be made", field="--out", fix="choose another directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SurgeonError(f"{parent} is not writable", field="--out", fix="choose a directory you can write to")
    lock_dir = out.parent if out.parent.exists() else parent
    lock = lock_dir / f".{out.name}.surgeon-lock"
    if any(held == lock for _, held in _LOCKS):  # this process holds it already
        return
    try:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SurgeonError(f"{lock} is a symbolic link, which surgeon will not follow", field="--out",
                               fix=f"remove {lock} (surgeon makes its lock files itself)") from None
        raise SurgeonError(f"cannot make the lock file {lock}: {e.strerror}", field="--out",
                           fix="choose a directory you can write to") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise SurgeonError(f"another surgeon run is writing {out}", field="--out",
                           fix="wait for it to finish, or use another --out") from None
    if not _LOCKS:
        atexit.register(_release_locks)
    _LOCKS.append((fd, lock))


def _release_locks() -> None:
    """Remove this process's lock files (only the holder does; a refused run never touches them)."""
    while _LOCKS:
        fd, lock = _LOCKS.pop()
        try:
            lock.unlink()
        except OSError:
            pass
        os.close(fd)


_LOCKS: list[tuple[int, Path]] = []
