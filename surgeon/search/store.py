"""Long jobs in chunks: each finished chunk is a file, so a run can stop anywhere and resume, be split into
shards that run on different machines, and be merged back into the result a single run gives."""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from surgeon.errors import AnalysisError, warn
from surgeon.results import follow_umask


def parse_shard(text: str | None) -> tuple[int, int]:
    if not text:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise AnalysisError(f"cannot read shard {text!r}", field="--shard",
                            fix="write i/n with 0 <= i < n, e.g. --shard 0/4") from None
    return i, n


class ChunkStore:
    """`DIR/parts/chunk-NNNNNN.npz`, one per finished chunk, beside `DIR/parts/plan.json`.

    The plan digest guards against resuming or merging work that was planned differently."""

    def __init__(self, root: Path, digest: str, plan: dict | None = None, shape: tuple[int, int] | None = None):
        self.dir = Path(root) / "parts"
        self.digest = digest
        self.shape = shape  # (units, items) of each chunk's masks and scores, where known
        if self.dir.exists() and not self.dir.is_dir():
            raise AnalysisError(f"{self.dir} is a file, not the folder of a search's parts", field="--out",
                                fix=f"delete {self.dir}, or give another --out")
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "plan.json"
        if meta.exists():
            old = read_plan(Path(root))
            if old.get("digest") != digest:
                raise AnalysisError(f"{self.dir} holds parts of a different search ({differs(old, plan or {})})",
                                    field="--out",
                                    fix="use a fresh --out directory, or the same case, model and options as the "
                                        "earlier run")
        else:
            _atomic_write(meta, json.dumps({"digest": digest, **(plan or {})}, indent=2).encode())

    def done(self) -> set[int]:
        """Indices of the chunks on disk; a chunk file that cannot be read (cut short by a kill or a full disk) or
        does not hold what a chunk of this search holds (`chunk_problem`) is set aside as `*.broken` with a
        warning, so the run evaluates it again."""
        out = set()
        for i, p in self.files().items():
            why = chunk_problem(p, self.shape)
            if why:
                warn(f"{p} {why}; it is set aside as {p.name}.broken and evaluated again")
                os.replace(p, p.with_name(p.name + ".broken"))
                continue
            out.add(i)
        return out

    def save(self, index: int, **arrays) -> None:
        """Write a finished chunk atomically; a failed write (a full disk) leaves no temporary file behind."""
        fd, tmp = tempfile.mkstemp(prefix=".chunk-", suffix=".npz", dir=self.dir)
        os.close(fd)
        try:
            np.savez(tmp, **arrays)
            follow_umask(tmp)
            os.replace(tmp, self.dir / f"chunk-{index:06d}.npz")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def files(self) -> dict[int, Path]:
        """{chunk index: file}; a file named like a chunk without a chunk number is refused, naming it."""
        return chunk_files(self.dir)

    def iter(self, files: dict[int, Path] | None = None):
        """Finished chunks one at a time (never all in memory)."""
        for _, p in sorted((files or self.files()).items()):
            with np.load(p) as z:
                yield {k: z[k] for k in z.files}

    @staticmethod
    def digest_of(root: Path) -> str | None:
        meta = Path(root) / "parts" / "plan.json"
        return json.loads(meta.read_text()).get("digest") if meta.exists() else None


def differs(old: dict, new: dict) -> str:
    """What makes two searches' parts different, in words: the inputs (case content, formats, model, ...) or the
    plan's options that differ."""
    oi, ni = old.get("inputs"), new.get("inputs")
    if isinstance(oi, dict) and isinstance(ni, dict) and oi and ni:
        keys = [k for k in sorted(set(oi) | set(ni)) if oi.get(k) != ni.get(k)]
        if keys:
            shown = []
            for k in keys:
                a, b = oi.get(k), ni.get(k)
                if isinstance(a, str) and len(a) > 24 or isinstance(b, str) and len(b) > 24:
                    shown.append(f"{k} differs")
                else:
                    shown.append(f"{k} {a!r} there, {b!r} here")
            return "; ".join(shown)
    elif not oi and ni:
        return ("it was saved without the inputs it was computed from (an earlier surgeon, or a run without --out), so "
                "it cannot be matched to this case and model")
    keys = [k for k in ("options", "chunk", "metric", "component") if old.get(k) != new.get(k)]
    opts = old.get("options"), new.get("options")
    if "options" in keys and all(isinstance(o, dict) for o in opts):
        return "plan options differ: " + ", ".join(k for k in sorted(set(opts[0]) | set(opts[1]))
                                                    if opts[0].get(k) != opts[1].get(k))
    return ", ".join(f"{k} differs" for k in keys) or f"plan {old.get('digest', '?')[:12]}"


def read_plan(root: Path) -> dict:
    """`ROOT/parts/plan.json`, checked: a search folder without one, or with one cut short or edited, is refused
    naming the file."""
    p = Path(root) / "parts" / "plan.json"
    if not p.is_file():
        raise AnalysisError(f"{root} holds no search parts (no parts/plan.json)", field="merge",
                            fix="give the --out directories of threshold runs")
    try:
        plan = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise AnalysisError(f"{p} cannot be read ({type(e).__name__})", field="--resume",
                            fix="start the search again in a fresh --out (the chunks cannot be matched to a plan)"
                            ) from None
    if not isinstance(plan, dict) or not isinstance(plan.get("digest"), str) or "options" not in plan:
        raise AnalysisError(f"{p} is not a search plan", field="--resume",
                            fix="start the search again in a fresh --out")
    return plan


CHUNK = re.compile(r"chunk-(\d{1,9})\.npz")


def chunk_files(folder: Path) -> dict[int, Path]:
    """{index: path} of the chunk files in a parts folder; one named chunk-*.npz without a number is refused."""
    out = {}
    for p in sorted(Path(folder).glob("chunk-*.npz")):
        m = CHUNK.fullmatch(p.name)
        if m is None:
            raise AnalysisError(f"{p} is not a chunk of a search (its name has no chunk number)", field="--out",
                                fix=f"delete {p}: only surgeon writes chunk-NNNNNN.npz files there")
        out[int(m.group(1))] = p
    return out


def chunk_problem(p: Path, shape: tuple[int, int] | None = None) -> str | None:
    """Why a chunk file is not one (None when it is): unreadable, without its masks and scores, of the wrong shape
    (`shape`: the search's units and items), or with scores that are not finite."""
    try:
        with np.load(p) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as e:
        return f"cannot be read ({type(e).__name__}: it was cut short)"
    missing = [k for k in ("masks", "scores") if k not in arrays]
    if missing:
        return f"has no {' or '.join(missing)} array"
    masks, scores = arrays["masks"], arrays["scores"]
    if masks.ndim != 2 or scores.ndim != 2 or masks.shape[0] != scores.shape[0] or masks.dtype != bool:
        return f"holds masks {masks.dtype}{list(masks.shape)} and scores {list(scores.shape)}, not one row per subset"
    if shape is not None and (masks.shape[1], scores.shape[1]) != tuple(shape):
        return (f"is for {masks.shape[1]} units and {scores.shape[1]} items, but this search has {shape[0]} units "
                f"and {shape[1]} items")
    if not np.isfinite(scores).all():
        return "holds scores that are not finite"
    return None


def check_chunk(p: Path, shape: tuple[int, int] | None = None) -> None:
    """Refuse a chunk file that is not one (`chunk_problem`), naming it and the fix."""
    why = chunk_problem(p, shape)
    if why:
        raise AnalysisError(f"the chunk {p} {why}", field="merge",
                            fix="rerun that shard with --resume (it evaluates the chunk again), then merge")


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    follow_umask(tmp)
    os.replace(tmp, path)
