"""A patched run's threads follow the cores other work leaves free (surgeon/engine/progress.py): with a real
competing process (a Python busy loop) beside a run of many chunks, the run drops to one thread, says so in its
execution record, gives the starting count back at the end, and scores as the same run with its threads fixed."""
import subprocess
import sys
import time

import pytest
import torch

from surgeon.engine.contrast import Contrast
from surgeon.sites.nodes import Site
from surgeon.threads import allowed_cores, sample
from tests.engine.test_contrast import LONG, SHORT, rows


@pytest.mark.skipif(allowed_cores() < 2 or sample() is None, reason="needs 2 cores and /proc/stat (Linux)")
@pytest.mark.parametrize("random_model", ["llamalike_gqa"], indirect=True)  # the governor is the same for any model
def test_a_run_beside_a_busy_process_drops_a_thread_and_scores_the_same(random_model, monkeypatch):
    site = Site.of("z", 1)
    masks = {site: torch.rand(1500, Site.coerce(site).n_units(random_model.cfg), generator=torch.Generator().manual_seed(0))}

    def run(adapt):
        monkeypatch.setenv("SURGEON_ADAPT_THREADS", adapt)
        c = Contrast(random_model, rows(random_model, LONG), rows(random_model, SHORT), "last", batch_size=4)
        return c.run(masks), c.execution

    start = torch.get_num_threads()
    torch.set_num_threads(2)
    fixed, quiet = run("0")
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        followed, busy = run("1")
        assert torch.get_num_threads() == 2  # given back when the run ends
    finally:
        other.kill()
        other.wait()
        torch.set_num_threads(start)
    assert "threads" not in quiet  # fixed: no change to record
    assert busy["threads"] and busy["threads"][-1][1] == 1 and busy["threads"][-1][0] > 0.3, busy["threads"]
    torch.testing.assert_close(followed, fixed, atol=1e-5, rtol=0)
