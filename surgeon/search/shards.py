"""A head-subset search's saved chunks collected into its result (`collect`), and the shards of one search (run
with `--shard i/n`, each into its own folder) merged into one folder and result (`merge`): the same result one run
gives. The search itself is `surgeon.analyses.threshold`."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from surgeon.errors import AnalysisError
from surgeon.results import check_out
from surgeon.search.store import ChunkStore, check_chunk, chunk_files, read_plan
from surgeon.search.subsets import ThresholdResult, aggregate, plan_from_options, summarize_chunks


def _meta(root: Path) -> dict:
    return read_plan(root)


def collect(root: Path, item_rate: float | None = None, x: float | None = None, extra_roots: Sequence[Path] = ()
            ) -> ThresholdResult:
    """Aggregate the finished chunks under `root` (and `extra_roots`, for shards) into a result."""
    meta = _meta(root)
    plan = plan_from_options(meta["options"])
    files = {}
    for r in [root, *extra_roots]:
        m = _meta(r)
        if m["digest"] != meta["digest"]:
            raise AnalysisError(f"{r} was planned differently from {root}", field="merge",
                                fix="merge only shards of one search (same case, heads, groups, budget and seed)")
        files.update(ChunkStore(Path(r), m["digest"]).files())
    base, source = np.array(meta["clean_base"]), np.array(meta["clean_source"])
    per_subset = summarize_chunks(ChunkStore(Path(root), meta["digest"]).iter(files), base, source,
                                  meta.get("right_above", 0.0))
    chunks = files
    total = math.ceil(len(plan.unique) / meta["chunk"])
    result = aggregate(plan, per_subset, case=meta["case"], component=meta["component"], base=meta["base"],
                       source=meta["source"], tag=meta["tag"], n_items=meta["n_items"],
                       item_rate=item_rate if item_rate is not None else meta["item_rate"],
                       x=x if x is not None else meta["x"], base_mean=float(base.mean()),
                       source_mean=float(source.mean()), chunks_done=len(chunks), chunks_total=total)
    # every evaluated subset's numbers, for subsets.csv (kept beside the result, not in results.json)
    result.subset_scores = per_subset
    return result


def merge(roots: Sequence[Path], out: Path) -> ThresholdResult:
    """Copy the shards' chunks into `out` and aggregate: the same result one run gives. Everything is checked
    first (`out` writable and not being written by another run, every shard of the same plan, every chunk
    readable), so a refused merge writes nothing."""
    import shutil

    check_out(out)
    roots = [Path(r) for r in roots]
    seen = {}
    for r in roots:
        if r.resolve() in seen:
            raise AnalysisError(f"the shard {r} is given twice ({seen[r.resolve()]} is the same folder)", field="merge",
                                fix="give each shard's folder once")
        seen[r.resolve()] = r
    if Path(out).resolve() in seen:
        raise AnalysisError(f"--out {out} is one of the shards being merged", field="--out",
                            fix="merge into a fresh --out (the shards are left as they are)")
    meta = _meta(roots[0])
    chunks = []
    for r in roots:
        if _meta(r)["digest"] != meta["digest"]:
            raise AnalysisError(f"{r} was planned differently from {roots[0]}", field="merge",
                                fix="merge only shards of one search (same case, heads, groups, budget and seed)")
        shape = (len(plan_from_options(meta["options"]).units), meta["n_items"])
        for p in chunk_files(r / "parts").values():
            check_chunk(p, shape)
            chunks.append(p)
    if Path(out).exists() and ChunkStore.digest_of(Path(out)) not in (None, meta["digest"]):
        raise AnalysisError(f"{out} holds parts of a different search", field="--out", fix="merge into a fresh --out")
    store = ChunkStore(Path(out), meta["digest"], {k: v for k, v in meta.items() if k != "digest"})
    for p in chunks:
        dest = store.dir / p.name
        if Path(p).resolve() != dest.resolve():
            shutil.copyfile(p, dest)
    return collect(Path(out))


