"""surgeon/threads.py: torch's threads follow the cores other work leaves free.

The arithmetic is checked on samples written by hand; the measurement on this machine with a real competing
process (a Python busy loop); the subset search's scores with the threads following the cores against the same
search with them fixed."""
import itertools
import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from surgeon.threads import Sample, ThreadGovernor, allowed_cores, others_busy, sample, threads_for


def test_other_work_is_the_machines_busy_time_less_this_processs_own():
    a = Sample(busy=100.0, own=10.0, wall=50.0)
    # 2 s of wall time: the machine's cores were busy 3.5 s, 1.5 s of it this process's threads
    assert others_busy(a, Sample(busy=103.5, own=11.5, wall=52.0)) == pytest.approx(1.0)
    # this process alone busy: nothing elsewhere (never negative, however the clocks round)
    assert others_busy(a, Sample(busy=103.0, own=13.1, wall=52.0)) == 0.0
    assert others_busy(a, a) == 0.0


@pytest.mark.parametrize("cores,busy,ceiling,want", [
    (2, 0.0, 2, 2),  # quiet: the starting count
    (2, 0.2, 2, 2),  # a short burst elsewhere does not cost a thread
    (2, 0.4, 2, 1),  # a process sharing a core with two spinning threads of ours may get less than half of it
    (2, 0.67, 2, 1),  # one process sharing a core with two of ours gets about 2/3 of it: it costs a thread
    (2, 1.2, 2, 1),
    (4, 1.4, 4, 2),
    (2, 1.0, 2, 1),
    (2, 2.0, 2, 1),  # never below one
    (8, 3.0, 8, 5),
    (8, 0.0, 4, 4),  # never above the count in force at the start (the user's --threads)
])
def test_the_thread_count_is_the_cores_left_rounded_between_one_and_the_ceiling(cores, busy, ceiling, want):
    assert threads_for(cores, busy, ceiling) == want


def _spin(seconds):
    x = torch.randn(64, 64)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        x = torch.tanh(x @ x)


@pytest.mark.skipif(allowed_cores() < 2 or sample() is None, reason="needs 2 cores and /proc/stat (Linux)")
def test_a_busy_process_beside_the_loop_costs_a_thread_and_the_count_comes_back_at_the_end():
    start = torch.get_num_threads()
    torch.set_num_threads(2)
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        with ThreadGovernor(adapt=True, min_interval=0.3) as gov:
            seen = []
            for _ in range(8):  # the first steps may still see the process starting
                _spin(0.4)
                seen.append(gov.step())
                if seen[-1] == 1 and len(seen) >= 2:
                    break
            assert seen[-1] == 1, (seen, gov.busy_elsewhere)
            assert gov.contended and gov.busy_elsewhere > 0.5
            assert "machine contended" in gov.note and "1 thread" in gov.note
        assert torch.get_num_threads() == 2  # given back
        with ThreadGovernor(adapt=False, min_interval=0.3) as gov:  # SURGEON_ADAPT_THREADS=0: measured, not acted on
            for _ in range(2):
                _spin(0.4)
                assert gov.step() == 2
            assert "fixed" in gov.note
    finally:
        other.kill()
        other.wait()
        torch.set_num_threads(start)


def test_the_environment_switch_turns_adaptation_off(monkeypatch):
    monkeypatch.setenv("SURGEON_ADAPT_THREADS", "0")
    assert ThreadGovernor().adapt is False
    monkeypatch.delenv("SURGEON_ADAPT_THREADS")
    assert ThreadGovernor().adapt is True


@pytest.mark.skipif(allowed_cores() < 2 or sample() is None, reason="needs 2 cores and /proc/stat (Linux)")
def test_the_subset_search_gives_the_same_scores_when_its_threads_follow_a_busy_machine(decimal_model, monkeypatch,
                                                                                        tmp_path):
    from surgeon import load_case
    from surgeon.analyses.common import make_contrast
    from surgeon.search.store import ChunkStore
    from surgeon.search.subsets import Unit, evaluate, make_plan
    from surgeon.sites.nodes import Site

    case = load_case("cases/decimal_organism.py")
    case = replace(case, items=case.items_for("trap")[:8], focus=None, score="first_token", align="decision")
    units = [Unit(L, h) for L in (1, 2) for h in range(4)]
    subsets = [sum(1 << i for i in c) for c in itertools.combinations(range(8), 4)]
    plan = replace(make_plan(units, {}, budget=len(subsets)), unique=tuple(subsets))

    def scores(name, **env):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        contrast, _ = make_contrast(case, decimal_model, batch_size=64, sites=[Site.of("z", 1), Site.of("z", 2)])
        store = ChunkStore(tmp_path / name, "t")
        evaluate(contrast, plan, store, chunk=7)
        return np.concatenate([c["scores"] for c in store.iter()])

    start = torch.get_num_threads()
    torch.set_num_threads(2)
    fixed = scores("fixed", SURGEON_ADAPT_THREADS="0")
    other = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        followed = scores("followed", SURGEON_ADAPT_THREADS="1")
    finally:
        other.kill()
        other.wait()
        torch.set_num_threads(start)
    np.testing.assert_allclose(followed, fixed, atol=1e-5)
    assert os.environ["SURGEON_ADAPT_THREADS"] == "1"
