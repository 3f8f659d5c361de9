"""Issue 33: the README is short and the rest is a documentation site that MkDocs builds without a warning,
with the API reference generated from the docstrings; the README's own-model block runs."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

ROOT = Path(ROOT)


def test_the_readme_is_short_and_shows_the_own_model_path_and_the_report():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, len(text.splitlines())
    for must in ("pip install torch==2.13.0", "--index-url https://download.pytorch.org/whl/cpu", "surgeon-circuits",
                 "hf download meta-llama/Llama-3.1-8B-Instruct", "![The decimal organism's circuit",
                 "https://arxiv.org/abs/2508.19414", "--bad"):
        assert must in text, must
    first_screen = "\n".join(text.splitlines()[:70])
    assert "hf download" in first_screen and "![The decimal organism's circuit" in first_screen
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|png|html|cff))\)", text) + ["LICENSE", "CHANGELOG.md"]:
        assert (ROOT / link).exists(), link
    # the report's circuit view and a page of its compiled paper, both images written by docs/readme.py
    assert "docs/report-decimal-paper.png" in text
    from PIL import Image

    for png in ("docs/report-decimal.png", "docs/report-decimal-paper.png"):
        colours = Image.open(ROOT / png).convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is None or len(colours) > 20, png  # not blank


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it, and what mkdocs printed."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e \".[docs]\"")
    pytest.importorskip("mkdocstrings")
    site = tmp_path_factory.mktemp("docs") / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                       capture_output=True, text=True, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    return site, r


def test_the_site_builds_without_a_warning(built):
    site, r = built
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "WARNING" not in r.stderr, r.stderr[-3000:]
    nav = re.findall(r":\s+(\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(nav) == pages  # every page is in the navigation, and nothing else
    api = (site / "api" / "index.html").read_text()
    import surgeon

    for name in surgeon.API:  # every notebook function is documented, from its docstring
        assert f'id="surgeon.api.{name}"' in api, name
    assert (site / "report-decimal" / "report.html").exists() and (site / "report-decimal.png").exists()


def test_the_site_reads_offline(built):
    """No page asks anything of the network (fonts, figures, the repository's stars): no external resource in the
    HTML, and in a real browser every page of the built site requests only its own files, and every image loads."""
    import json
    import time

    from tests.browser import browser

    site, r = built
    assert r.returncode == 0
    pages = sorted(site.rglob("index.html"))
    assert len(pages) >= 16
    for page in pages:
        text = page.read_text()
        external = re.findall(r'<(?:link|script|img)\b[^>]*\b(?:href|src)="(https?://[^"]*)"', text)
        assert not [u for u in external if not re.match(r"https?://[^/]*github\.com/gussand/", u)], (page, external)
    assert (ROOT / "docs" / "induction_organism.png").read_bytes() == (ROOT / "circuits" / "induction_organism.png").read_bytes()
    b = browser()
    try:
        for page in pages:
            b.get(page.as_uri())
            time.sleep(0.4)
            urls = {json.loads(e["message"])["message"]["params"]["request"]["url"] for e in b.get_log("performance")
                    if json.loads(e["message"])["message"]["method"] == "Network.requestWillBeSent"}
            assert all(u.startswith(("file:", "data:", "about:", "blob:")) for u in urls), (page, urls)
            broken = b.execute_script("return Array.prototype.filter.call(document.images, function(i) {"
                                      "return !i.complete || i.naturalWidth === 0; }).map(function(i) { return i.src; });")
            assert not broken, (page, broken)
    finally:
        b.quit()


def test_the_version_is_one_number_everywhere(tmp_path):
    import surgeon

    cff = (ROOT / "CITATION.cff").read_text()
    assert re.search(r"^version: (\S+)$", cff, re.M).group(1) == surgeon.__version__
    assert f"## {surgeon.__version__}" in (ROOT / "CHANGELOG.md").read_text()
    r = subprocess.run([sys.executable, "-m", "surgeon", "--version"], capture_output=True, text=True)
    assert r.stdout.strip() == f"surgeon {surgeon.__version__}"


@pytest.mark.slow
def test_a_wheel_carries_the_distribution_name_and_the_organisms(tmp_path):
    src = tmp_path / "src"  # setuptools builds in the source's build/ folder: a copy keeps the checkout clean
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "site", "build", "__pycache__",
                                                               "*.egg-info", "out", "bench", "tests", "docs"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path), "-q"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    import surgeon
    import zipfile

    wheel = next(tmp_path.glob("*.whl"))
    assert wheel.name.startswith(f"surgeon_circuits-{surgeon.__version__}-"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert "surgeon/organisms/weights/decimal/model.safetensors" in names or any(
        n.startswith("surgeon/organisms/weights/decimal/") and n.endswith(".safetensors") for n in names)
    assert "surgeon/cases/decimal_organism.py" in names


def test_committed_files_hold_no_machine_paths():
    """Results, pages and bench outputs in the repository name no folder of the machine that made them (the
    shipped organisms and SAEs are recorded as surgeon/..., a run's folder relative to where it ran)."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    machine = re.compile(r"(?<![\w.])(/work/|/home/|/root/|/tmp/|/Users/|" + re.escape(str(ROOT)) + ")")
    found = []
    for name in tracked.stdout.splitlines():
        p = ROOT / name
        if p.suffix not in (".json", ".html", ".md", ".txt", ".csv", ".tex", ".dot", ".graphml", ".gexf", ".svg"):
            continue
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if machine.search(line):
                found.append(f"{name}:{i}: {line.strip()[:120]}")
    assert not found, "\n".join(found[:20])
