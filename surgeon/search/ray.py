"""A chunked plan's chunks as Ray tasks (`pip install -e ".[ray]"`; imported only when asked for).

Each worker is a Ray actor that builds its evaluator once (loads the model, encodes the case, caches the
clean runs) and then evaluates chunks; the driver streams finished chunks into the same `ChunkStore` a
local run uses, so a run stopped with Ctrl-C, or one whose worker died, resumes with or without Ray and
gives the result of a single process. A lost worker's chunks go back in the queue and a new worker takes
its place; the driver is the only writer, so nothing is counted twice.

    evaluate_on_ray(factory, todo, store, sizes, address=None, workers=None)

`factory()` runs on the worker and returns `evaluate(chunk) -> dict of arrays` (what `store.save` takes).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

from surgeon.errors import AnalysisError

INSTALL = 'pip install -e ".[ray]"  (or pip install "ray>=2.40")'


def import_ray():
    try:
        import ray
    except ImportError:
        raise AnalysisError("--ray needs the ray package, which is not installed", field="--ray",
                            fix=f"install it: {INSTALL}") from None
    return ray


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # None: start a local cluster on this machine; else ray.init(address=...)
    workers: int | None = None  # default: one per GPU of the cluster, else one per CPU
    threads: int = 1  # torch threads per CPU worker


class _Worker:
    """One per Ray actor: the evaluator, built once."""

    def __init__(self, factory: Callable[[], Callable[[int], dict]], threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        self.evaluate = factory()

    def run(self, chunk: int) -> tuple[int, dict, dict]:
        """The chunk's arrays, and this worker's execution record so far (`Contrast.execution`, where the evaluator
        keeps one)."""
        arrays = self.evaluate(chunk)
        return chunk, arrays, dict(getattr(self.evaluate, "execution", None) or {})


def merge_execution(records: Iterable[dict]) -> dict:
    """Execution records of several contrasts as one: counts summed (forwards, back-offs, recomputed caches, each
    path's forwards), the rest as the first record says."""
    out: dict = {}
    for rec in records:
        for k, v in rec.items():
            if k in ("forwards", "backoffs", "caches_recomputed") and isinstance(v, int):
                out[k] = out.get(k, 0) + v
            elif k == "paths" and isinstance(v, dict):
                paths = out.setdefault("paths", {})
                for name, n in v.items():
                    paths[name] = paths.get(name, 0) + n
            else:
                out.setdefault(k, v)
    return out


def connect(opts: RayOptions):
    """ray.init once per process: a local cluster, or the one at `opts.address`."""
    ray = import_ray()
    if not ray.is_initialized():
        try:
            if opts.address:
                ray.init(address=opts.address, log_to_driver=False)
            else:
                ray.init(include_dashboard=False, log_to_driver=False)
        except ConnectionError as e:
            raise AnalysisError(f"cannot reach a Ray cluster at {opts.address!r}: {e}", field="--ray",
                                fix="start one with `ray start --head` (then --ray auto or --ray HOST:6379), "
                                    "or give --ray without an address for a local one") from None
    return ray


def evaluate_on_ray(factory: Callable[[], Callable[[int], dict]], todo: Iterable[int], store, sizes: dict[int, int],
                    opts: RayOptions = RayOptions(), progress: bool = False, desc: str = "chunks", unit: str = "item",
                    on_chunk: Callable[[int, list], None] | None = None, max_lost: int | None = None) -> dict:
    """Evaluate chunks `todo` on Ray actors, saving each to `store` as it arrives.

    `sizes[c]` is what chunk c adds to the progress bar; `on_chunk(c, actors)` is called after each save (tests
    use it to kill a worker). Returns counts: chunks done, workers lost."""
    ray = connect(opts)
    try:
        from ray.exceptions import RayActorError, RayTaskError
    except ImportError:  # pragma: no cover - very old ray
        RayActorError = RayTaskError = Exception  # noqa: N806
    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    n = opts.workers or (gpus or max(1, int(resources.get("CPU", 1)) // max(1, opts.threads)))
    if n < 1:
        raise AnalysisError(f"--ray-workers {n} must be at least 1", field="--ray-workers", fix="e.g. --ray-workers 2")
    per_actor = {"num_gpus": 1} if gpus else {"num_cpus": opts.threads}
    Actor = ray.remote(**per_actor)(_Worker)  # noqa: N806
    queue = deque(todo)
    n_chunks = len(queue)
    actors = [Actor.remote(factory, opts.threads) for _ in range(min(n, max(1, n_chunks)))]
    pending: dict = {}  # object ref -> (chunk, actor)
    seen: dict = {}  # actor -> its latest execution record (cumulative on that worker)
    lost, done = 0, 0
    max_lost = 2 * len(actors) + 2 if max_lost is None else max_lost
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(sizes[c] for c in queue), desc=desc, unit=unit)

    def submit(actor):
        if queue:
            c = queue.popleft()
            pending[actor.run.remote(c)] = (c, actor)

    try:
        for a in actors:  # two chunks in flight per worker: the next is queued while one runs
            submit(a)
            submit(a)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            c, actor = pending.pop(ready[0])
            try:
                _, arrays, execution = ray.get(ready[0])
            except RayActorError:
                # the worker died: requeue everything it held, replace it
                queue.appendleft(c)
                for ref, (c2, a2) in list(pending.items()):
                    if a2 is actor:
                        pending.pop(ref)
                        queue.appendleft(c2)
                if actor in actors:
                    actors.remove(actor)
                    lost += 1
                    if lost > max_lost:
                        raise AnalysisError(f"{lost} Ray workers died; giving up (finished chunks are saved)",
                                            field="--ray", fix="look at the workers' logs (ray logs); rerun with "
                                                               "--resume to continue, with or without --ray") from None
                    new = Actor.remote(factory, opts.threads)
                    actors.append(new)
                    submit(new)
                    submit(new)
                continue
            except RayTaskError as e:
                raise AnalysisError(f"a Ray worker failed on chunk {c}: {e.cause if hasattr(e, 'cause') else e}",
                                    field="--ray", fix="the same error happens without --ray: run it locally to see it") from None
            store.save(c, **arrays)
            seen[actor] = execution
            done += 1
            if bar is not None:
                bar.update(sizes[c])
            if on_chunk is not None:
                on_chunk(c, actors)
            submit(actor)
    finally:
        if bar is not None:
            bar.close()
        for a in actors:
            ray.kill(a)
    return {"chunks": done, "workers_lost": lost, "workers": len(actors),
            "execution": merge_execution(seen.values())}
