"""Bad arguments are refused before any work, results are written whole or not at all, and the default runs
from any directory."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from surgeon.cli.commands import main
from surgeon.results import check_out
from tests.conftest import ROOT

CASE = f"{ROOT}/cases/decimal_organism.py"
THRESHOLD = f"{ROOT}/cases/threshold_organism.py"


@pytest.mark.parametrize("argv,words", [
    (["threshold", CASE, "--layer", "1", "--chunk", "0"], "--chunk: must be a positive integer"),
    (["patch", CASE, "--threads", "-2"], "--threads: must be a positive integer"),
    (["patch", CASE, "--batch-size", "-5"], "--batch-size: must be a positive integer"),
    (["patch", CASE, "--n-devices", "0"], "--n-devices: must be a positive integer"),
    (["diagnose", CASE, "--generate", "-1"], "--generate: must be 0 or more"),
    (["blend", CASE, "--layer", "-1"], "--layer: layers are numbered from 0"),
    (["threshold", CASE, "--layer", "1", "--x", "0"], "--x: must be in (0, 1]"),
])
def test_bad_numbers_are_refused_by_the_parser(tmp_path, capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        main(argv + ["--out", str(tmp_path / "o")])
    assert e.value.code == 2 and words in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,words", [
    (["patch", CASE, "--device", "tpu9"], "unknown device 'tpu9'"),
    (["patch", CASE, "--layers", "2-0"], "runs backwards"),
])
def test_bad_values_get_one_message(tmp_path, capsys, argv, words):
    assert main(argv + ["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert words in err and "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_out_is_checked_before_computing_and_locked(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    t0 = time.perf_counter()
    assert main(["patch", CASE, "--out", str(f)]) == 2
    assert main(["patch", CASE, "--out", str(f / "below")]) == 2
    assert time.perf_counter() - t0 < 5  # refused before the model is loaded
    err = capsys.readouterr().err
    assert "exists and is a file" in err and "is a file, so" in err
    check_out(tmp_path / "busy")  # this process now holds the lock, as a running job would
    r = subprocess.run([sys.executable, "-m", "surgeon", "diagnose", CASE, "--out", str(tmp_path / "busy")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "another surgeon run is writing" in r.stderr


@pytest.mark.slow
def test_default_case_runs_from_another_directory(tmp_path):
    r = subprocess.run([sys.executable, "-m", "surgeon", "diagnose", "--out", "o"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "REPRODUCED" in r.stdout and (tmp_path / "o" / "manifest.json").exists()
    r = subprocess.run([sys.executable, "-m", "surgeon", "cases"], capture_output=True, text=True, cwd=tmp_path)
    assert "threshold_organism" in r.stdout and "llama31_decimal" in r.stdout


def test_a_case_whose_items_all_carry_the_focus_tag_runs(tmp_path, capsys):
    p = tmp_path / "case.py"
    p.write_text("from surgeon import Case, Item\n"
                 "case = Case(name='t', model='organism:decimal', formats={'plain': 'Which is bigger: {a} or {b}?\\nAnswer:',"
                 " 'qa': 'Q: Which is bigger: {a} or {b}?\\nA:'}, good='plain', bad='qa', focus='trap',"
                 " items=[Item({'a': '9.8', 'b': '9.11'}, correct=' 9.8', incorrect=' 9.11', tag='trap')])\n")
    assert main(["diagnose", str(p)]) == 0
    assert "on trap items" in capsys.readouterr().out


def test_broken_chunks_are_set_aside_and_checkpoints_follow_the_umask(tmp_path, capsys):
    from surgeon.search.store import ChunkStore

    store = ChunkStore(tmp_path, "d" * 64, {})
    store.save(0, masks=np.zeros((2, 3), bool), scores=np.zeros((2, 4), np.float32))
    (store.dir / "chunk-000001.npz").write_bytes(b"PK\x03\x04 cut short")
    assert store.done() == {0}
    assert (store.dir / "chunk-000001.npz.broken").exists() and "evaluated again" in capsys.readouterr().err
    umask = os.umask(0)
    os.umask(umask)
    assert (store.dir / "chunk-000000.npz").stat().st_mode & 0o777 == 0o666 & ~umask


def test_stale_staging_is_cleaned_and_the_manifest_comes_last(tmp_path):
    from surgeon.results import staging

    out = tmp_path / "r"
    (out / ".staging-old").mkdir(parents=True)
    (out / "manifest.json").write_text("{}")
    order = []
    real = os.replace

    def spy(a, b):
        order.append(os.path.basename(b))
        return real(a, b)
    os.replace = spy
    try:
        with staging(out) as tmp:
            (tmp / "manifest.json").write_text("{}")
            (tmp / "results.json").write_text("{}")
            (tmp / "z.png").write_text("")
    finally:
        os.replace = real
    assert order[-1] == "manifest.json" and sorted(order) == ["manifest.json", "results.json", "z.png"]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "results.json", "z.png"]


@pytest.mark.slow
def test_sigterm_keeps_finished_chunks_like_ctrl_c(tmp_path):
    out = tmp_path / "t"
    p = subprocess.Popen([sys.executable, "-m", "surgeon", "threshold", THRESHOLD, "--layer", "0", "--budget", "3000",
                          "--chunk", "64", "--threads", "1", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not list((out / "parts").glob("chunk-*.npz")):
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-2000:]
    assert "continue with --resume" in err
    res = json.loads((out / "results.json").read_text())["result"]
    assert res["complete"] is False and res["chunks_done"] >= 1


def test_bad_case_files_and_help_are_answered_without_importing_torch(tmp_path):
    """What a newcomer gets wrong first is answered at once: the case file is checked before torch,
    transformers' models or transformer-lens are imported (bench/startup.py measures what those cost)."""
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\n")
    code = ("import sys; from surgeon.cli import main; rc = main(['diagnose', sys.argv[1]]); "
            "print(rc, *(m in sys.modules for m in ('torch', 'transformer_lens')))")
    r = subprocess.run([sys.executable, "-c", code, str(bad)], capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.split() == ["2", "False", "False"] and "defines no `case`" in r.stderr
    code = ("import sys; from surgeon import load_case; load_case(sys.argv[1]); "
            "print(*(m in sys.modules for m in ('torch', 'transformer_lens')))")
    r = subprocess.run([sys.executable, "-c", code, CASE], capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.split() == ["False", "False"], r.stderr  # the shipped case, its tokenizer checked, no torch


def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "surgeon", "diagnose", CASE, "--out", str(tmp_path / "o")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)  # loading the case or importing torch / transformer-lens
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted; no results were written" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_that_python_drops_still_ends_the_run_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """Python drops the KeyboardInterrupt a signal handler raises inside a finaliser ("Exception ignored in"): the
    CLI's handler remembers the signal, so the run still ends with 130 and no results folder is left."""
    import surgeon.models.loading as loading
    from surgeon.results import on_interrupt

    class Finaliser:
        def __del__(self):  # the handler runs here, as Python runs it at the next bytecode in any frame
            on_interrupt(signal.SIGINT, None)

    real = loading.load_model

    def load_model(*a, **kw):
        obj = Finaliser()
        del obj  # the KeyboardInterrupt is raised in __del__ and dropped
        return real(*a, **kw)

    monkeypatch.setattr(loading, "load_model", load_model)
    assert main(["diagnose", CASE, "--out", str(tmp_path / "o")]) == 130
    assert "interrupted; no results were written" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # and the next run in the same process starts with no signal remembered
    monkeypatch.setattr(loading, "load_model", real)
    assert main(["diagnose", CASE, "--out", str(tmp_path / "o")]) == 0 and (tmp_path / "o" / "manifest.json").exists()


def test_a_signal_during_an_import_arrives_when_the_import_is_done(tmp_path, monkeypatch):
    """Importing torch runs C++ that calls back into Python, and a KeyboardInterrupt raised there aborts the process
    (SIGABRT, "terminate called after throwing ... pybind11::error_already_set"): the CLI's handler holds a signal
    that lands inside an import and delivers it again once the import is done."""
    from surgeon.results import on_interrupt, reset_interrupts

    (tmp_path / "interrupted_import.py").write_text(
        "import signal, time\nsignal.raise_signal(signal.SIGINT)\nfor _ in range(20):\n    time.sleep(0.01)\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            import interrupted_import  # noqa: F401
            time.sleep(10)  # the signal, delivered again after the import, ends this
        assert sys.modules["interrupted_import"].DONE
    finally:
        signal.signal(signal.SIGINT, previous)
        reset_interrupts()
        sys.modules.pop("interrupted_import", None)


def test_a_held_signal_is_not_delivered_after_the_run_answered_it(tmp_path, monkeypatch):
    """The CLI's main cancels a signal held during an import before it puts the previous handler back: the handler
    it restores never sees the signal this run already ended on."""
    from surgeon.results import cancel_redelivery, on_interrupt, reset_interrupts

    (tmp_path / "quick_interrupted_import.py").write_text("import signal\nsignal.raise_signal(signal.SIGINT)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        import quick_interrupted_import  # noqa: F401  (held: it lands inside the import)

        cancel_redelivery()
        signal.signal(signal.SIGINT, lambda *a: seen.append(a))
        time.sleep(0.3)
        assert seen == []
    finally:
        signal.signal(signal.SIGINT, previous)
        reset_interrupts()
        sys.modules.pop("quick_interrupted_import", None)


DROPPED = """
import runpy, signal, sys
import surgeon.models.loading as loading

class Finaliser:
    def __del__(self):  # the signal lands while a finaliser runs (in CI: regex's, as transformer-lens imported)
        signal.raise_signal(signal.SIGINT)

real = loading.load_model

def load_model(*a, **kw):
    obj = Finaliser()
    del obj
    return real(*a, **kw)

loading.load_model = load_model
sys.argv = ["surgeon", "diagnose", sys.argv[1], "--out", sys.argv[2]]
runpy.run_module("surgeon", run_name="__main__")  # python -m surgeon
"""


def test_a_ctrl_c_dropped_in_a_finaliser_prints_no_traceback(tmp_path):
    """The signal as a user sends it, landing in a finaliser: Python would report the dropped KeyboardInterrupt
    ("Exception ignored in ... Traceback") on the terminal; the CLI ends with 130, its one line and nothing else."""
    r = subprocess.run([sys.executable, "-c", DROPPED, CASE, str(tmp_path / "o")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 130, r.stderr[-2000:]
    assert r.stderr.strip() == "surgeon: interrupted; no results were written", r.stderr[-2000:]
    assert not (tmp_path / "o").exists()


def test_cases_list_shows_the_shipped_cases(capsys):
    assert main(["cases", "list"]) == 0
    out = capsys.readouterr().out
    assert "decimal_organism" in out and "threshold_organism" in out and "llama31_decimal" in out
