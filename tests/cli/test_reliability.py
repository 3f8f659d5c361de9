"""Reliability families: bad input gets exit 2 and one message naming the file or option, the field and the
fix, before the model loads wherever the input can be checked without it; nothing is left behind."""
import json
import os
import subprocess
import sys

import pytest

from surgeon.cli import main
from tests.conftest import ROOT

THRESHOLD = f"{ROOT}/cases/threshold_organism.py"
DECIMAL = f"{ROOT}/cases/decimal_organism.py"

CASE = '''from surgeon import Case, Item
case = Case(name="t", model="organism:threshold", formats={formats}, good="plain", bad=["qa"],
            items=[Item({{"x": "a", "y": "b"}}, correct="a", incorrect="b"),
                   Item({{"x": "c", "y": "d"}}, correct="c", incorrect="d")]{extra})
'''
OK_FORMATS = '{"plain": "{x} or {y}:", "qa": "{x} or {y}?"}'


def refused(capsys, argv, *phrases):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    for p in phrases:
        assert p in err, (p, err)
    return err


def code_of(capsys, argv):
    try:
        return main(argv), capsys.readouterr().err
    except SystemExit as e:
        return e.code, capsys.readouterr().err


# family 6: case content that parses but cannot mean anything
@pytest.mark.parametrize("formats,extra,field,phrase", [
    ('{"plain": "{x} or {y}:", "qa": ""}', "", "formats['qa']", "is empty"),
    ('{"plain": "{x} or {y}:", "qa": "{x:>5} or {y}?"}', "", "formats['qa']", "with a spec or conversion"),
    ('{"plain": "{x} or {y}:", "qa": "{x!r} or {y}?"}', "", "formats['qa']", "with a spec or conversion"),
    ('{"plain": "{x} or {y}:", "qa": "which one?"}', "", "formats['qa']", "has no placeholders"),
    ('{"plain": "{x} or {y}:", "qa": "{x} or {y}?", 3: "{x}"}', "", "formats", "is not a format name"),
    (OK_FORMATS, ", prepend_bos='yes'", "prepend_bos", "is a str"),
    (OK_FORMATS, ", layers=0", "layers", "not a list of layers"),
    ('{"plain": "{x} or {y}:", "qa": "{x} or {y}?" + " pad" * 40}', "", "items[0]", "longer than the model's context"),
])
def test_case_content_that_cannot_mean_anything(tmp_path, capsys, formats, extra, field, phrase):
    f = tmp_path / "case.py"
    f.write_text(CASE.format(formats=formats, extra=extra))
    code, err = code_of(capsys, ["diagnose", str(f), "--out", str(tmp_path / "out")])
    assert code == 2 and "Traceback" not in err, err
    assert str(f) in err and f"field '{field}'" in err and phrase in err and "fix:" in err, err
    assert not (tmp_path / "out").exists()


# family 3: absurd sizes, refused by what the model and the case allow
@pytest.mark.slow
@pytest.mark.parametrize("argv,phrases", [
    (["diagnose", THRESHOLD, "--seed", str(10 ** 23)], ["--seed", "between 0 and 4294967295"]),
    (["diagnose", THRESHOLD, "--n-devices", "2", "--device", "cpu"], ["--n-devices", "the device is cpu"]),
    (["diagnose", THRESHOLD, "--generate", "500"], ["--generate", "pass the model's context", "fix: use --generate"]),
    (["circuit", THRESHOLD, "--edges", str(10 ** 9)], ["--edges", "more than the model's"]),
    (["sae", "overlap", THRESHOLD, "--top-k", "100000"], ["--top-k", "is not below the SAE's"]),
    (["diagnose", THRESHOLD, "--out", ""], ["--out is empty"]),
])
def test_absurd_sizes_are_refused(capsys, argv, phrases):
    code, err = code_of(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    for p in phrases:
        assert p in err, (p, err)


# families 8 and 9: late errors, leftovers, locks that follow no symlink
def test_a_planted_lock_symlink_is_not_followed(tmp_path, capsys):
    target = tmp_path / "elsewhere" / "created-by-surgeon"
    target.parent.mkdir()
    (tmp_path / ".out.surgeon-lock").symlink_to(target)
    code, err = code_of(capsys, ["diagnose", THRESHOLD, "--out", str(tmp_path / "out")])
    assert code == 2 and "is a symbolic link" in err and "Traceback" not in err
    assert not target.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_no_lock_file_is_left_and_another_command_leaves_no_files_of_its_own(tmp_path):
    out = tmp_path / "out"
    run = lambda *a: subprocess.run([sys.executable, "-m", "surgeon", *a], capture_output=True, text=True,
                                    cwd=tmp_path)
    r = run("blend", THRESHOLD, "--layer", "0", "--component", "z", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "blend.png").exists()
    r = run("patch", THRESHOLD, "--layers", "0", "--out", str(out))
    assert r.returncode == 0, r.stderr
    man = json.loads((out / "manifest.json").read_text())
    assert man["command"] == "patch" and sorted(os.listdir(out)) == sorted(man["files"])
    assert not (out / "blend.png").exists()  # the old command's figure is gone with its manifest
    assert [p.name for p in tmp_path.iterdir() if "surgeon-lock" in p.name] == []


@pytest.mark.slow
def test_threshold_writes_only_with_out_and_groups_files_are_read_as_lists(tmp_path, capsys):
    groups = tmp_path / "groups.json"
    groups.write_text(json.dumps({"mine": "L0H0"}))
    err = refused_code(capsys, ["threshold", THRESHOLD, "--layer", "0", "--groups-file", str(groups),
                                "--out", str(tmp_path / "t")])
    assert "field '--groups-file['mine']'" in err and "not a non-empty list of head labels" in err
    groups.write_text(json.dumps(["L0H0"]))
    err = refused_code(capsys, ["threshold", THRESHOLD, "--layer", "0", "--groups-file", str(groups),
                                "--out", str(tmp_path / "t")])
    assert "a groups file holds a JSON object of groups" in err
    assert not (tmp_path / "t").exists()
    r = subprocess.run([sys.executable, "-m", "surgeon", "threshold", THRESHOLD, "--layer", "0", "--groups", "none",
                        "--budget", "10"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "threshold k*" in r.stdout and "wrote" not in r.stdout
    assert list(tmp_path.iterdir()) == [groups]  # no --out: printed only, nothing written (issue 33 item 8)
    r = subprocess.run([sys.executable, "-m", "surgeon", "threshold", THRESHOLD, "--layer", "0", "--resume"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "--resume needs the search's folder" in r.stderr and "Traceback" not in r.stderr


def refused_code(capsys, argv):
    code, err = code_of(capsys, argv)
    assert code == 2 and "Traceback" not in err, err
    return err


@pytest.mark.slow
def test_a_full_disk_is_reported_and_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    """Family 7: the disk fills up after the first chunk: exit 2 with the fix, the finished chunk kept, no hidden
    temporary file, and --resume then finishes the search."""
    import errno

    import numpy as np

    real, calls = np.savez, {"n": 0}

    def full(path, **arrays):
        calls["n"] += 1
        if calls["n"] > 1:
            open(path, "wb").write(b"partial")  # what a full disk leaves of a file
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, **arrays)

    out = tmp_path / "t"
    argv = ["threshold", THRESHOLD, "--layer", "0", "--groups", "none", "--budget", "120", "--chunk", "32",
            "--out", str(out)]
    monkeypatch.setattr(np, "savez", full)
    code, err = code_of(capsys, argv)
    assert code == 2 and "No space left on device" in err and "--resume continues" in err and "Traceback" not in err
    parts = out / "parts"
    assert list(parts.glob(".chunk-*")) == [] and len(list(parts.glob("chunk-*.npz"))) == 1
    assert not (out / "manifest.json").exists()
    monkeypatch.setattr(np, "savez", real)
    code, err = code_of(capsys, [*argv, "--resume"])
    assert code == 0, err
    assert json.loads((out / "manifest.json").read_text())["command"] == "threshold"
