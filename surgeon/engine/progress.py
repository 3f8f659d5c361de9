"""A patched run's progress: its tqdm bar where one is asked for, and torch's thread count following the cores other
work leaves free (`surgeon.threads.ThreadGovernor`), measured after each chunk of patches; the bar says when the
machine is contended. The starting thread count is given back when the run ends."""
from __future__ import annotations

from surgeon.threads import ThreadGovernor


class Progress:
    """`with Progress(total, desc, log) as p: ... p.update(rows)` after each chunk; `desc` None: no bar, threads still
    follow the machine; each change of the thread count is appended to `log`."""

    def __init__(self, total: int, desc: str | None, log: list | None = None):
        self.log = log  # where the thread counts chosen are recorded: (cores busy elsewhere, threads) per change
        self.bar = None
        if desc is not None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit="run", leave=False, desc=desc)
        self.governor = ThreadGovernor()

    def __enter__(self) -> "Progress":
        self.governor.__enter__()
        return self

    def __exit__(self, *exc) -> bool:
        self.governor.__exit__(*exc)
        if self.log is not None:
            self.log.extend(self.governor.history)
        if self.bar is not None:
            self.bar.close()
        return False

    def update(self, rows: int) -> None:
        self.governor.step()
        if self.bar is not None:
            self.bar.set_postfix_str(self.governor.note, refresh=False)
            self.bar.update(rows)
