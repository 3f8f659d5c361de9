"""The README is what the commands print today: `python docs/readme.py --check` reruns every fast command
block and fails on any difference (slow blocks and bench tables are compared with their saved sources)."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_readme_is_regenerated_from_real_runs():
    r = subprocess.run([sys.executable, "docs/readme.py", "--check"], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800)
    assert r.returncode == 0, ("README.md differs from what the commands print now: run python docs/readme.py\n"
                               + r.stdout[-4000:] + r.stderr[-2000:])


def test_the_check_fails_on_a_typed_number(tmp_path):
    """A README whose generated block was edited by hand fails the check (the check is not vacuous)."""
    import shutil

    text = open(f"{ROOT}/docs/circuits.md").read()
    marker = "| `exact` | exact edge patching"
    assert marker in text
    work = tmp_path / "repo"
    (work / "docs").mkdir(parents=True)
    shutil.copy(f"{ROOT}/docs/readme.py", work / "docs" / "readme.py")
    block = text.split("<!-- [[[cog\nfrom surgeon.circuits.methods import METHODS")[1].split("<!-- [[[end]]] -->")[0]
    only = "<!-- [[[cog\nfrom surgeon.circuits.methods import METHODS" + block + "<!-- [[[end]]] -->\n"
    (work / "README.md").write_text(only.replace(marker, "| `exact` | typed by hand"))
    r = subprocess.run([sys.executable, "docs/readme.py", "--check"], cwd=work, capture_output=True, text=True)
    assert r.returncode != 0 and "typed by hand" in r.stdout + r.stderr


@pytest.mark.parametrize("page", ["README.md", *sorted(p.name for p in (Path(ROOT) / "docs").glob("*.md"))])
def test_every_generated_block_closes_its_comment(page):
    """`<!-- [[[end]]]` without `-->` would hide the text after it on GitHub, up to the next `-->`."""
    text = (Path(ROOT) / page if page == "README.md" else Path(ROOT) / "docs" / page).read_text()
    if "[[[cog" not in text:
        return
    ends = [ln for ln in text.splitlines() if "[[[end]]]" in ln]
    assert ends and all(ln == "<!-- [[[end]]] -->" for ln in ends), [ln for ln in ends if ln != "<!-- [[[end]]] -->"]
    for block in text.split("<!-- [[[cog")[1:]:  # a generator's source is hidden, its output shown
        assert "]]] -->" in block.split("[[[end]]]")[0]
