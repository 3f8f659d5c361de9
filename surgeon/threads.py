"""Torch's thread count on a machine whose cores other work may be holding.

torch's CPU kernels run in OpenMP parallel regions whose threads meet at a barrier after every operation. With a
thread per core (torch's default) and one other busy process, the scheduler shares a core between the other
process and one of ours; every operation then waits at its barrier for the thread that is off its core, a
scheduler slice at a time. A job of many small operations (the subset search in decision mode: matrices of 32 to a
few thousand rows) spends most of its time waiting: bench/subset_search.py measures it, with a competing process
beside the quiet run.

`ThreadGovernor` measures, between steps of a long loop (the subset search's chunks of subsets, a patched run's
chunks of patches: every `Contrast.run` and gradient), how many of this
process's cores other processes kept busy (the machine's busy time from /proc/stat over the cores this process
may run on, less this process's own CPU time), and runs the next step with the cores left: never more threads than
were in force when it started (the user's `--threads` or torch's default), at least one, the starting count given
back at the end. It says what it sees (`note`) for the progress line. Set SURGEON_ADAPT_THREADS=0 to keep the
starting count whatever the machine does (the note is still made). Where /proc/stat cannot be read (not Linux), it
does nothing.
"""
from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import dataclass


def allowed_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota where one is set."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            n = min(n, max(1, math.floor(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return n


def _cpu_ids() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


@dataclass(frozen=True)
class Sample:
    """The machine's busy CPU seconds over this process's cores, this process's own CPU seconds, and the time."""
    busy: float
    own: float
    wall: float


def sample(cpus: set[int] | None = None) -> Sample | None:
    """Busy seconds (every state but idle and iowait) summed over `cpus` (all when None) from /proc/stat, this
    process's CPU seconds (every thread) and the monotonic time; None where /proc/stat cannot be read."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    busy = 0
    try:
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *vals = line.split()
                if cpus is not None and int(name[3:]) not in cpus:
                    continue
                v = [int(x) for x in vals[:8]]
                busy += sum(v) - v[3] - v[4]  # all but idle and iowait
    except (OSError, ValueError):
        return None
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return Sample(busy / tick, ru.ru_utime + ru.ru_stime, time.monotonic())


def others_busy(a: Sample, b: Sample) -> float:
    """Cores other processes kept busy between two samples (this process's own CPU time taken out), >= 0."""
    wall = b.wall - a.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((b.busy - a.busy) - (b.own - a.own)) / wall)


TAKEN = 0.3  # other work holding more than this share of a core takes that core


def threads_for(cores: int, busy_elsewhere: float, ceiling: int) -> int:
    """The thread count for the next step: the cores less those other work takes (a core is taken once other work
    holds more than `TAKEN` of it: while we run a thread per core, a process that wants a whole core gets about 2/3
    of one on 2 cores, and less when our threads spin), between 1 and `ceiling`."""
    taken = max(0, math.ceil(busy_elsewhere - TAKEN))
    return max(1, min(ceiling, cores - taken))


class ThreadGovernor:
    """Between the steps of a loop, the thread count set from the cores other work leaves free.

        with ThreadGovernor() as gov:
            for chunk in chunks:
                run(chunk)
                gov.step()          # measured over the step just run; sets torch's threads for the next
                bar.set_postfix_str(gov.note)

    `adapt`: None reads SURGEON_ADAPT_THREADS (adapt unless it is 0); False only measures and notes."""

    def __init__(self, adapt: bool | None = None, min_interval: float = 0.2):
        import torch

        self._torch = torch
        self.adapt = os.environ.get("SURGEON_ADAPT_THREADS", "1") != "0" if adapt is None else adapt
        self.min_interval = min_interval
        self.cores = allowed_cores()
        self.ceiling = torch.get_num_threads()
        self._cpus = _cpu_ids()
        self._last = None
        self.busy_elsewhere = 0.0
        self.history: list[tuple[float, int]] = []  # (cores busy elsewhere, threads chosen) at each change

    def __enter__(self):
        self._last = sample(self._cpus)
        return self

    def __exit__(self, *exc):
        self._torch.set_num_threads(self.ceiling)
        return False

    def step(self) -> int:
        """Measure since the last step (when at least `min_interval` s passed) and set the threads for the next;
        returns the thread count in force."""
        if self._last is None or time.monotonic() - self._last.wall < self.min_interval:
            return self._torch.get_num_threads()  # too soon to measure: /proc/stat not read
        now = sample(self._cpus)
        if now is None:
            return self._torch.get_num_threads()
        self.busy_elsewhere = others_busy(self._last, now)
        self._last = now
        if self.adapt:
            n = threads_for(self.cores, self.busy_elsewhere, self.ceiling)
            if n != self._torch.get_num_threads():
                self._torch.set_num_threads(n)
                self.history.append((round(self.busy_elsewhere, 2), n))
        return self._torch.get_num_threads()

    @property
    def contended(self) -> bool:
        return self.busy_elsewhere > TAKEN

    @property
    def note(self) -> str:
        """For the progress line: empty on a quiet machine, else what other work holds and the threads used."""
        if not self.contended:
            return ""
        n = self._torch.get_num_threads()
        how = "" if self.adapt or n < self.ceiling else " (fixed: SURGEON_ADAPT_THREADS=0)"
        return (f"machine contended: {self.busy_elsewhere:.1f} of {self.cores} cores busy with other work, "
                f"{n} thread{'s' if n != 1 else ''}{how}")
