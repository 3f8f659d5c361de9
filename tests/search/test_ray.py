"""The Ray backend on a local 2-CPU cluster the test starts: the same chunks and result as one process, a
worker killed mid-run loses nothing, and a stopped run resumes without Ray."""
import json

import pytest

from surgeon.analyses.threshold import threshold_search

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
pytestmark = pytest.mark.xdist_group("ray")  # one cluster, in one pytest-xdist worker


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def small_case(decimal_case):
    from dataclasses import replace

    return replace(decimal_case, items=decimal_case.items_for("trap")[:12], focus=None)


KW = dict(layer=1, groups=["even", "odd"], item_rate=0.5, chunk=40)


def same(a, b):
    """The same search result; how each process ran its chunks (`execution`) is its own."""
    a, b = ({k: v for k, v in r.__dict__.items() if k != "execution"} for r in (a, b))
    return json.dumps(a, default=str, sort_keys=True) == json.dumps(b, default=str, sort_keys=True)


def chunks(out):
    return sorted(p.name for p in (out / "parts").glob("chunk-*.npz"))


@pytest.mark.slow
def test_ray_equals_one_process_and_survives_a_lost_worker(cluster, decimal_model, small_case, tmp_path):
    import numpy as np

    from surgeon.search.ray import RayOptions

    single = threshold_search(small_case, decimal_model, out=tmp_path / "single", **KW)
    killed = []

    def kill_once(c, actors):
        if not killed:
            killed.append(c)
            ray.kill(actors[0])

    r = threshold_search(small_case, decimal_model, out=tmp_path / "ray", ray=RayOptions(workers=2), on_chunk=kill_once,
                         **KW)
    assert killed and r.complete
    assert same(single, r)
    # the Ray result records what its workers ran: every chunk's patched forwards once, the lost worker said
    assert r.execution["paths"] == single.execution["paths"] and r.execution["ray"]["workers_lost"] == 1
    assert r.execution["forwards"] > single.execution["forwards"]  # each worker's own clean runs besides
    assert chunks(tmp_path / "single") == chunks(tmp_path / "ray")
    for name in chunks(tmp_path / "single"):
        a, b = np.load(tmp_path / "single" / "parts" / name), np.load(tmp_path / "ray" / "parts" / name)
        assert (a["masks"] == b["masks"]).all()
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-5)


@pytest.mark.slow
def test_a_ray_run_resumes_without_ray_and_the_reverse(cluster, decimal_model, small_case, tmp_path):
    from surgeon.search.ray import RayOptions

    single = threshold_search(small_case, decimal_model, **KW)
    out = tmp_path / "run"
    assert threshold_search(small_case, decimal_model, out=out, shard="0/2", ray=RayOptions(workers=1), **KW) is None
    half = chunks(out)
    r = threshold_search(small_case, decimal_model, out=out, **KW)  # finishes locally
    assert len(chunks(out)) > len(half) and same(single, r)
    out2 = tmp_path / "run2"
    threshold_search(small_case, decimal_model, out=out2, shard="1/2", **KW)
    r2 = threshold_search(small_case, decimal_model, out=out2, ray=RayOptions(workers=2), **KW)  # finishes on Ray
    assert same(single, r2)


def test_without_ray_installed_the_error_says_how_to_install(monkeypatch):
    import sys

    from surgeon.errors import AnalysisError
    from surgeon.search.ray import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(AnalysisError, match=r"pip install -e \"\.\[ray\]\""):
        import_ray()
