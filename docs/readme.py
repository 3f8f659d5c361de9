"""The generated blocks of the README and the documentation site: every command output, table and number in
README.md and docs/*.md comes from here.

README.md and the pages under docs/ hold cog blocks (cogapp, https://nedbatchelder.com/code/cog/) that call the helpers below:

    <!-- [[[cog from readme import run; run("surgeon diagnose") ]]] -->
    ...output, rewritten by cog...
    <!-- [[[end]]] -->

    python docs/readme.py            # rerun every command, rewrite README.md (and docs/timings.json)
    python docs/readme.py --suite    # the same, then time the test suite and write its times in
    python docs/readme.py --suite-only   # only time the suite (after a regeneration) and write its times in
    python docs/readme.py --check    # exit 1 when README.md differs from what the commands print today

`--check` (and tests/test_readme.py) reruns the fast commands; blocks marked `slow=True` (minutes of
work) keep their text in a check and are rerun only by a full regeneration; benchmark tables are rendered
from the files the benches saved (`python bench/NAME.py --save` writes `bench/results/NAME.txt`), so a
table in the README is always what a bench printed. Wall times measured by a full regeneration are kept in
`docs/timings.json` and rendered from there.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = ROOT / "docs" / "timings.json"
BENCH = ROOT / "bench" / "results"
FAST = os.environ.get("SURGEON_README") == "check"  # set by --check: slow blocks keep their text
# the files whose blocks are generated: every page of the documentation site and the README, in this order
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]  # the README last: it quotes times measured there
RESULTS: dict[str, dict] = {}  # --out results of the commands run so far, by the name given to `run`
_WORK = Path(tempfile.mkdtemp(prefix="surgeon-readme-"))


def _cog():
    import cog  # only inside a cog run

    return cog


def _timings() -> dict:
    return json.loads(TIMINGS.read_text()) if TIMINGS.exists() else {}


_RAN: dict[str, tuple[str, str | None]] = {}  # command line -> (its stdout as shown, the RESULTS name it has)


def execute(cmd: str, name: str | None = None) -> str:
    """Run a `surgeon ...` command line from the repository root; its stdout (progress bars go to stderr).
    With `name`, the command also writes --out and its results.json is kept in RESULTS[name]. A command line run
    before in this pass is not run again: its output, and its results when that run kept them, are the same."""
    if cmd in _RAN and (name is None or _RAN[cmd][1] is not None):
        text, had = _RAN[cmd]
        if name is not None:
            RESULTS[name] = RESULTS[had]
        return text
    text = _execute(cmd, name)
    _RAN[cmd] = (text, name)
    return text


def _execute(cmd: str, name: str | None) -> str:
    argv = shlex.split(cmd)
    if argv[0] == "surgeon":
        argv = [sys.executable, "-m", "surgeon", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    out = None
    if name:
        out = _WORK / name
        argv += ["--out", str(out)]
    if FAST and argv[1:3] == ["-m", "surgeon"]:
        # a check runs the commands in this interpreter (the same code, without a start-up per command)
        r = _in_this_process(argv[1:], ROOT)
        dt = None
    else:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200")
        t0 = time.perf_counter()
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"README command failed ({r.returncode}): {cmd}\n{r.stderr[-3000:]}")
    if dt is not None:
        t = _timings()
        t[cmd.replace(str(_WORK) + os.sep, "")] = round(dt, 1)  # no machine's folder in a committed file
        TIMINGS.write_text(json.dumps(t, indent=1, sort_keys=True) + "\n")
    if out is not None:
        RESULTS[name] = json.loads((out / "results.json").read_text())["result"]
    # what differs between machines stays out: the checkout's path, the --out folder's "wrote ..." line
    text = r.stdout.replace(str(ROOT) + os.sep, "")
    return "\n".join(ln for ln in text.split("\n") if not (out is not None and ln.startswith("wrote ")))


def pick(text: str, keep=None, drop=()) -> str:
    """Lines of `text`: `keep` a list of (start, stop) line slices and literal strings (an elision such as
    "..."), or None for all; lines matching any regex in `drop` are left out first."""
    lines = [ln for ln in text.rstrip("\n").split("\n") if not any(re.search(d, ln) for d in drop)]
    if keep is None:
        return "\n".join(lines)
    out = []
    for k in keep:
        out += [k] if isinstance(k, str) else lines[slice(*k)]
    return "\n".join(out)


def run(cmd: str, *, show: str | None = None, keep=None, drop=(), slow: bool = False, name: str | None = None,
        prompt: bool = True) -> None:
    """Write a fenced block: `$ cmd` (or `show`) and its output (see `pick`). A slow block keeps its previous
    text in a check."""
    cog = _cog()
    if slow and FAST:
        cog.out(cog.previous)
        return
    text = pick(execute(cmd, name), keep, drop)
    cog.outl("```")
    if prompt:
        cog.outl(f"$ {show or cmd}")
    cog.outl(text)
    cog.outl("```")


def report_example(cmd: str, page: str, png: str, keep=None, paper_png: str | None = None) -> None:
    """Run `surgeon report` (a slow block: a check keeps the previous text) into an empty folder, then photograph its
    page's circuit view in headless Chromium (Selenium) into `png`; with `paper_png`, compile its paper/main.tex (a
    copy, in a temporary folder) and render the first page to that image."""
    cog = _cog()
    if FAST:
        cog.out(cog.previous)
        return
    import shutil

    shutil.rmtree(ROOT / Path(page).parent, ignore_errors=True)  # a fresh run into an empty folder: its time is real
    run(cmd, keep=keep)
    if paper_png:
        paper_page(ROOT / Path(page).parent, ROOT / paper_png)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1150,1000"):
        opts.add_argument(a)
    b = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        b.get((ROOT / page).resolve().as_uri())
        b.find_element("id", "circuit-view").screenshot(str(ROOT / png))
    finally:
        b.quit()


def paper_page(report_dir: Path, png: Path) -> None:
    """Compile a report's paper/main.tex as its README says (pdflatex, bibtex, pdflatex twice) in a copy of the report
    folder, and render the page holding Table 1 (the first of the results) to `png` (pdftoppm)."""
    import shutil

    work = _WORK / f"paper-{report_dir.name}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(report_dir, work)
    paper = work / "paper"
    for argv in (["pdflatex", "-interaction=nonstopmode", "main"], ["bibtex", "main"],
                 ["pdflatex", "-interaction=nonstopmode", "main"], ["pdflatex", "-interaction=nonstopmode", "main"]):
        r = subprocess.run(argv, cwd=paper, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"{' '.join(argv)} failed in {paper}:\n{r.stdout[-3000:]}")
    pages = int(re.search(r"Pages:\s+(\d+)", subprocess.run(["pdfinfo", "main.pdf"], cwd=paper, capture_output=True,
                                                             text=True, check=True).stdout).group(1))
    first = next((k for k in range(1, pages + 1) if "Table 1" in subprocess.run(
        ["pdftotext", "-f", str(k), "-l", str(k), "main.pdf", "-"], cwd=paper, capture_output=True, text=True).stdout), 2)
    subprocess.run(["pdftoppm", "-png", "-r", "70", "-f", str(first), "-l", str(first), "-singlefile", "main.pdf", str(png.with_suffix(""))],
                   cwd=paper, check=True)


def report_times(cases: list[tuple[str, str]]) -> None:
    """A table of `surgeon report` wall times: each command run fresh into an empty folder, then again over the same
    folder (every step reused: the resume); both measured now (a slow block: a check keeps the previous table)."""
    cog = _cog()
    if FAST:
        cog.out(cog.previous)
        return
    import shutil

    out("| case | `surgeon report`, fresh | rerun over the same folder (every step reused) |\n|---|---|---|")
    for case, cmd in cases:
        folder = ROOT / shlex.split(cmd)[shlex.split(cmd).index("--out") + 1]
        if not str(folder).startswith(str(ROOT / "docs")):  # the committed example is written by report_example
            shutil.rmtree(folder, ignore_errors=True)
            execute(cmd)
        fresh = _timings()[cmd]
        execute(cmd)  # over the finished folder: execute records this time under cmd ...
        t = _timings()
        t[cmd + "  # rerun"], t[cmd] = t[cmd], fresh  # ... kept as the rerun's, the fresh one put back
        TIMINGS.write_text(json.dumps(t, indent=1, sort_keys=True) + "\n")
        out(f"| {case} | {timing(cmd)} | {timing(cmd + '  # rerun')} |")


def _in_empty_folder(path: str, name: str, argv: list[str]) -> tuple[str, str]:
    """(the file's code, stdout): the file at `path` copied as `name` into an empty folder, `argv` run there in a
    fresh interpreter (what it writes lands there, not in the checkout); a failure stops the generation."""
    code = (ROOT / path).read_text().strip("\n")
    folder = _WORK / f"{Path(path).stem}-{abs(hash(code)) % 10**8}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(code + "\n")
    if FAST:  # a check runs it in this interpreter, in that folder (the same code, without a start-up)
        r = _in_this_process(argv, folder)
    else:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", COLUMNS="200")
        r = subprocess.run([sys.executable, *argv], cwd=folder, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{path} failed ({r.returncode}) under {argv}:\n{r.stderr[-3000:]}")
    return code, r.stdout.replace(str(ROOT) + os.sep, "")


def _in_this_process(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """`python *argv` (a script, or `-m surgeon ...`) run in this interpreter from `cwd`, its output captured."""
    import contextlib
    import io
    import runpy

    from surgeon.cli.commands import main as surgeon_main

    buf, err, code = io.StringIO(), io.StringIO(), 0
    here, args = os.getcwd(), sys.argv
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
            if argv[:2] == ["-m", "surgeon"]:
                code = surgeon_main(argv[2:])
            else:
                sys.argv = list(argv)
                try:
                    runpy.run_path(argv[0], run_name="__main__")
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else 1
    finally:
        os.chdir(here)
        sys.argv = args
    return subprocess.CompletedProcess(argv, code, buf.getvalue(), err.getvalue())


def example(path: str, keep=None, slow: bool = False) -> None:
    """A Python example (a file under docs/examples), shown as it is, and what it prints when run (see `pick`). A
    slow one keeps its previous text in a check."""
    if slow and FAST:
        _cog().out(_cog().previous)
        return
    code, stdout = _in_empty_folder(path, "example.py", ["example.py"])
    _cog().outl("\n".join(["```python", code, "```", "prints", "```", pick(stdout, keep), "```"]))


def case_example(path: str, keep=None, command: str = "surgeon diagnose mine.py") -> None:
    """A case file (under docs/examples), shown as it is, and what `command` prints on it saved as mine.py."""
    code, stdout = _in_empty_folder(path, "mine.py", ["-m", "surgeon", *shlex.split(command)[1:]])
    _cog().outl("\n".join(["```python", code, "```", "```", f"$ {command}", pick(stdout, keep), "```"]))


def llama_memory() -> None:
    """One sentence: the peak memory bench/scale.py predicts for the paper's Llama-3.1-8B workload, and what
    bench/gpu.py measured of it on a GPU (bench/results/gpu.json), labelled with the device."""
    sys.path.insert(0, str(ROOT / "bench"))
    from scale import llama_8b_workload

    lines = llama_8b_workload()
    peaks = {m.group(1): m.group(2).strip() for m in (re.match(r"(.*): batch size \d+, predicted peak ([^(]*)", ln)
                                                      for ln in lines[1:]) if m}
    weights = re.search(r"weights ([^;]*);", lines[0]).group(1)
    g = gpu_measured()
    out(f"Each command predicts its peak memory before the work and fits the batch to the GPU: for this case in "
        f"bfloat16, {peaks['per-head patching']} for `patch` and {peaks['EAP']} for the circuit's edge scores, of which "
        f"the weights are {weights}. Measured on an {g['device']} (`bench/gpu.py`, random weights at the full width): "
        f"{g['patch']} for per-head patching (its last 8 layers: one chunk of 256 patches; predicted {g['patch_pred']}) but "
        f"{g['eap']} for the edge scores (predicted {g['eap_pred']}): the plan under-counts EAP at full width, where TransformerLens keeps a transposed copy of "
        f"every weight matrix for the backward pass ([benchmarks](docs/benchmarks.md#on-a-gpu); "
        f"[real models](docs/real-models.md) has the table, `--max-memory`, several GPUs and Ray).")


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f} GiB"


def gpu_measured() -> dict:
    """bench/gpu.py's saved run, as the README and docs say it: the device, the memory of the paper's workload
    (part B) measured and predicted, and per job of part A surgeon's time beside its baseline's."""
    d = json.loads((BENCH / "gpu.json").read_text())
    part_b = {j["job"].split(" (")[0]: j for j in d["jobs"] if j.get("part") == "memory"}
    p, e = part_b["per-head patching, layers 24-31"], part_b["EAP"]
    return {"device": d["device_name"], "patch": _gib(p["peak"]), "patch_pred": _gib(p["predicted"]),
            "eap": _gib(e["peak"]), "eap_pred": _gib(e["predicted"]), "data": d}


GPU_PAIRS = (("per-head sweep", "careful TL sweep"), ("EAP", "floor"), ("EAP-IG (5 steps)", "floor"),
             ("exact top-200", "careful TL edge loop"))


def gpu_summary() -> None:
    """docs/benchmarks.md's GPU table: per model and job, surgeon's time, its baseline's on the same GPU, the ratio,
    the share of the GPU's matmul peak, and the measured peak against surgeon's prediction."""
    g = gpu_measured()
    d = g["data"]
    rate = {k: v / 1e12 for k, v in d["matmul_peak"].items()}
    shape = re.search(r"(\d+) items x (\d+) positions", (BENCH / "gpu.txt").read_text())
    o = _cog().outl
    o(f"{d['device_name']}, torch {d['torch']}, TransformerLens {d['transformer_lens']}; its matmul peak measured in "
      f"the same run: {rate['torch.bfloat16']:.0f} TFLOP/s in bfloat16, {rate['torch.float32']:.0f} in float32; "
      f"{shape.group(1)} items x {shape.group(2)} positions (`scale.make_rows`), the careful baselines of bench/careful.py; memory: "
      f"surgeon's predicted peak over the measured one (the weights included)")
    o("")
    o("| model | job | surgeon | baseline | surgeon against it | share of peak | memory pred / meas |")
    o("|---|---|---|---|---|---|---|")
    jobs = {(j["model"], j["job"].strip()): j for j in d["jobs"]}
    for model in ("llama8b", "gpt2"):
        for job, base in GPU_PAIRS + (("subsets", None), ("repair", None)):
            j = next((v for (m, k), v in jobs.items() if m == model and k.startswith(job)), None)
            if j is None:
                continue
            b = jobs.get((model, base)) if base else None
            share = f"{j['flops'] / j['seconds'] / d['peaks'][model]:.0%}" if j.get("flops") else ""
            mem = f"{j['predicted'] / j['peak']:.2f}" if j.get("predicted") else ""
            if b is None:
                x = ""
            elif base == "floor":
                x = f"{j['seconds'] / b['seconds']:.1f}x the floor"
            else:
                r = b["seconds"] / j["seconds"]
                x = f"{r:.2f}x faster" if r >= 1 else f"{1 / r:.2f}x slower"
            o(f"| {model} | {j['job'].strip()} | {j['seconds']:.2f} s | "
              + (f"{base} {b['seconds']:.2f} s" if b else "") + f" | {x} | {share} | {mem} |")
    o("")
    o(ran_on("gpu"))


def sinks_line() -> None:
    """One sentence: what the decimal organism's formats do to its attention sinks, and what intervening on them does
    (`surgeon sinks --intervene`, run now)."""
    execute("surgeon sinks --intervene", name="readme_sinks")
    r = RESULTS["readme_sinks"]
    m = r["measured"]
    rates = ", ".join(f"{f['format']} {100 * f['sink_rate']['value']:.1f}%" for f in m["formats"])
    ratio = max(x["ratio"] for f in m["formats"] for x in f["massive"] if x["ratio"] is not None)  # None: median 0
    bad = next(f["format"] for f in m["formats"] if f["format"] != m["good"])

    def frac(name_start: str) -> str:
        e = next(e for e in r["effects"] if e["intervention"].startswith(name_start) and e["format"] == bad)
        f = e["fraction"]
        return f"{f['value']:+.3f} [{f['lo']:+.3f}, {f['hi']:+.3f}]"

    sup = next(n for n in r["interventions"] if n.startswith("zero-ablate the super neuron"))
    out(f"On the decimal organism `surgeon sinks --intervene` finds sink rates of {rates} and a largest activation "
        f"{ratio:.0f} times its layer's median (massive is 1000): removing the first-token attention of the heads that "
        f"attend to it most moves {bad}'s repair fraction by {frac('remove the sinks of')}, and the {sup.split('the ')[-1]} "
        f"(zeroed) by {frac('zero-ablate the super neuron')} ([tutorial](docs/tutorial.md#attention-sinks)).")


def scan_example(keep=None) -> None:
    """`surgeon scan --write-case found.py` on the decimal organism, the case file written into the run's folder."""
    run(f"surgeon scan --write-case {_WORK / 'found.py'}", show="surgeon scan --write-case found.py", keep=keep,
        name="docs_scan")
    (_WORK / "found.py").unlink(missing_ok=True)


def scan_line() -> None:
    """One sentence: what `surgeon scan` finds on the decimal organism (run now): the formats scored, the held-out
    worst and best, the part that costs most, the minimal pair."""
    if "docs_scan" in RESULTS:  # docs/scan.md ran the same scan (and wrote its case file): its results, not a rerun
        r = RESULTS["docs_scan"]
    else:
        execute("surgeon scan", name="readme_scan")
        r = RESULTS["readme_scan"]
    held = r["held_out"]
    worst = min(f["accuracy"]["value"] for f in held)
    best = max(f["accuracy"]["value"] for f in held)
    chosen = [e for e in r["effects"] if e["p_holm"] < 0.05 and e["held_out"]]
    e = min(chosen, key=lambda e: e["held_out"]["value"])
    h = e["held_out"]
    p = r["pair"]
    (part, (works, fails)), = p["differs"].items()
    w, f = p["held_out"]["works"]["value"], p["held_out"]["fails"]["value"]
    out(f"`surgeon scan` finds where a model fails: on the decimal organism it scores "
        f"{r['n_formats']} formats composed from question and answer cues, separators and casing, and on held-out items "
        f"the worst answers {100 * worst:.0f}% of traps and the best {100 * best:.0f}%; the {e['part'].replace('_', ' ')} "
        f"`{e['option']}` costs {-100 * h['value']:.1f} points [{-100 * h['hi']:.1f}, {-100 * h['lo']:.1f}] (Holm-corrected), "
        f"and the minimal pair differs only in the {part.replace('_', ' ')} ({works} {100 * w:.0f}%, {fails} "
        f"{100 * f:.0f}%): the case file `--write-case` writes, which the lines above run on ([scan](docs/scan.md)).")


def case_rules() -> None:
    """docs/errors.md's table of the case rules, from the rules themselves (`surgeon.case.reading.RULES`)."""
    from surgeon.case.reading import rules_table

    out(rules_table())


def bridge_needs() -> None:
    """docs/install.md: what a TransformerLens `TransformerBridge` lacks of what surgeon needs from a model
    (`surgeon.models.protocol.missing`), as TransformerLens builds it and through surgeon's adapter
    (`surgeon.models.bridge.BridgeModel`), on the TransformerLens installed here."""
    from importlib.metadata import version

    from transformer_lens.model_bridge import TransformerBridge

    from surgeon.models.bridge import BridgeModel
    from surgeon.models.protocol import NEEDS, missing

    bridge = TransformerBridge.boot_native({"n_layers": 1, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32,
                                            "d_vocab": 64, "n_ctx": 32, "act_fn": "gelu", "seed": 0})
    raw = missing(bridge)
    adapted = BridgeModel(bridge)
    lacks, slower = missing(adapted), missing(adapted, speedups=True)
    need = sum(not n.speedup for n in NEEDS)
    rows = _bridges_of_checkpoints()
    out(f"What surgeon reaches on a model is declared in `surgeon/models/protocol.py`: {len(NEEDS)} attributes, hook "
        f"points and calls, {need} needed and {len(NEEDS) - need} speedups the engine uses where a model has them "
        f"(`tests/models/test_protocol.py` reads surgeon's sources to keep the list whole). On TransformerLens "
        f"{version('transformer-lens')}, a `TransformerBridge` built from a config (`boot_native`) has "
        f"{need - len(raw)} of the {need} needs as TransformerLens builds it and {need - len(lacks)} through surgeon's "
        f"adapter, which still lacks:\n")
    out("\n".join(f"- `{n.path}`: {n.why}" for n in lacks) or "- nothing")
    out(f"\nand {len(slower)} speedups: " + ", ".join(f"`{n.path}`" for n in slower) + ".")
    out("\nBooted from tiny random Hugging Face checkpoints of real architectures (`TransformerBridge.boot_transformers`; "
        "`tests/checkpoints.py`), as TransformerLens builds them (compatibility mode on) and through the adapter:\n")
    out("| architecture | needs met | lacks | through the adapter: lacks | speedups lacking |\n|---|---|---|---|---|")
    for arch, raw_, lacks_, slower_ in rows:
        out(f"| {arch} | {need - len(raw_)} of {need} | {', '.join(f'`{n.path}`' for n in raw_) or 'nothing'} | "
            f"{', '.join(f'`{n.path}`' for n in lacks_) or 'nothing'} | {len(slower_)} |")


def _bridges_of_checkpoints() -> list[tuple[str, list, list]]:
    """(architecture, needs missing, needs missing through the adapter, speedups missing through it) of a
    TransformerBridge booted from each tiny checkpoint."""
    import contextlib
    import io
    import logging

    from transformer_lens.model_bridge import TransformerBridge

    from surgeon.models.bridge import BridgeModel
    from surgeon.models.protocol import missing
    from tests.checkpoints import make_gemma2, make_gpt2, make_llama, make_qwen2

    out = []
    for arch, make in (("GPT-2", make_gpt2), ("Llama (GQA)", make_llama), ("Qwen2", make_qwen2),
                       ("Gemma-2", make_gemma2)):
        path = make(_WORK / f"bridge-{make.__name__}")
        with contextlib.redirect_stderr(io.StringIO()):
            logging.disable(logging.WARNING)
            try:
                bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
            finally:
                logging.disable(logging.NOTSET)
        bridge.enable_compatibility_mode()
        raw = missing(bridge)
        adapted = BridgeModel(bridge)
        out.append((arch, raw, missing(adapted), missing(adapted, speedups=True)))
    return out


def out(text: str) -> None:
    """Write generated text (a sentence whose numbers come from RESULTS); kept as is in a check of a slow block."""
    _cog().outl(text)


def keep_previous() -> bool:
    """True (and the previous text written) in a check: for prose that depends on a slow block."""
    cog = _cog()
    if FAST:
        cog.out(cog.previous)
        return True
    return False


def bench(name: str) -> None:
    """The output a bench saved (`python bench/NAME.py --save`), verbatim."""
    path = BENCH / f"{name}.txt"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run python bench/{name}.py --save")
    _cog().outl(path.read_text().rstrip("\n"))
    _cog().outl(ran_on(name))


BASELINES = {"patch": ("careful-patch", "careful TL sweep"), "eap": ("floor", "floor"), "eap-ig": ("floor", "floor"),
             "exact": ("careful-edge-loop", "careful TL loop"), "curve": (None, ""), "subsets-512": (None, "")}
JOB_NAMES = {"patch": "per-head sweep", "eap": "EAP", "eap-ig": "EAP-IG (5 steps)", "exact": "exact top-200 edges",
             "curve": "faithfulness curve (11)", "subsets-512": "subset search (512)"}


def bench_summary(items: int = 2, positions_letters: int = 10) -> None:
    """A table per job from bench/scale.json's raw measurements (bench/scale.py --save): surgeon's time, the careful
    baseline's (or the floor's), their ratio, and surgeon's predicted memory above the weights over the measured, on
    GPT-2 small and the Llama-shaped model, at one size; then the line saying which commit it ran on."""
    data = json.loads((BENCH / "scale.json").read_text())
    models = [m for m in ("gpt2", "llama") if m in data]
    titles = {"gpt2": "GPT-2 small", "llama": "Llama-3.1-8B-shaped"}
    cog = _cog()
    by = {m: {r["job"]: r for r in data[m]["jobs"] if r["items"] == items and r["letters"] == positions_letters}
          for m in models}
    pos = next(iter(by[models[0]].values()))["positions"]
    head = "| job | baseline | " + " | ".join(f"{titles[m]}: surgeon | baseline | x | memory pred / meas"
                                             for m in models) + " |"
    cog.outl(f"{items} items x {pos} positions, 2 CPU threads; x = baseline / surgeon; memory: surgeon's predicted "
             f"peak above the weights over the measured one")
    cog.outl("")
    cog.outl(head)
    cog.outl("|" + "---|" * (2 + 4 * len(models)))
    for job, name in JOB_NAMES.items():
        base, label = BASELINES[job]
        row = [name, label or "--"]
        for m in models:
            r = by[m][job]
            b = by[m].get(base) if base else None
            mem = ((r["predicted"] - r["weights"]) / (r["measured"] - r["weights"])
                   if "predicted" in r and r["measured"] > r["weights"] else float("nan"))
            row += [f"{r['seconds']:.2f} s", f"{b['seconds']:.2f} s" if b else "--",
                    f"{b['seconds'] / r['seconds']:.1f}" if b else "--", f"{mem:.2f}" if mem == mem else "--"]
        cog.outl("| " + " | ".join(row) + " |")
    cog.outl("")
    cog.outl(ran_on("scale"))
    goal = [ln.strip() for ln in (BENCH / "memory.txt").read_text().splitlines() if ln.strip().startswith("goal:")]
    held = json.loads((BENCH / "memory.json").read_text()).get("held_out", {})
    if held:
        shapes = list(held)
        first = next(iter(held[shapes[0]].values()))
        cog.outl("")
        cog.outl(f"Memory on shapes the predictor was not fitted to (`bench/memory.py`: {', '.join(shapes)}; "
                 f"{first['items']} items x {first['positions']} positions): surgeon's predicted peak above the "
                 f"weights over the measured one")
        cog.outl("")
        cog.outl("| job | " + " | ".join(shapes) + " |")
        cog.outl("|" + "---|" * (1 + len(shapes)))
        for job, name in JOB_NAMES.items():
            cells = []
            for sh in shapes:
                r = _held_row(held[sh], job)
                cells.append(f"{_above(r):.2f}" if r else "--")
            cog.outl(f"| {'subset search (half the heads)' if job.startswith('subsets') else name} | "
                     + " | ".join(cells) + " |")
    if goal:
        cog.outl("")
        cog.outl(f"On shapes the memory predictor was not fitted to (`bench/memory.py`), {goal[0][len('goal: '):]}.")
        cog.outl(ran_on("memory"))


# the goals against the machine's limit (bench/limit.py) and, where a careful baseline exists, against it
WORK_GOAL, SHARE_GOAL = 1.2, 0.5
PEER_GOAL = {"patch": "careful-patch", "exact": "careful-edge-loop"}


def _limit_cells(by: dict, data: dict, job: str) -> tuple[str, str, str]:
    """Per model (GPT-2 small / Llama-shaped): surgeon's work over the least its method needs, its share of the
    matrix-multiply peak at the model's shapes, and the goals' verdict; '--' where the saved result did not count."""
    works, shares, verdict = [], [], []
    for m in ("gpt2", "llama"):
        r, lim = by[m][job], data[m].get("limit")
        if not lim or not r.get("flops"):
            works.append("--")
            shares.append("--")
            continue
        work = r["flops"] / r["least"] if r.get("least") else None
        share = r["flops"] / r["seconds"] / lim["peak"]
        large = lim["large_enough"]  # bench/limit.py: the model's products at a clean run's rows reach half the limit
        works.append(f"{work:.2f}x" if work else "--")
        shares.append(f"{share:.0%}" + ("" if large else "*"))
        if work:
            verdict.append(work <= WORK_GOAL)
        if large:
            verdict.append(share >= SHARE_GOAL)
    peer = PEER_GOAL.get(job)
    if peer:
        verdict += [by[m][peer]["seconds"] >= by[m][job]["seconds"] for m in ("gpt2", "llama")]
    goal = "--" if not verdict else ("met" if all(verdict) else "missed")
    return " / ".join(works), " / ".join(shares), goal


FLOOR_GOALS = {"eap": ("EAP", 1, 1.5), "eap-ig": ("EAP-IG (5 steps)", 5, 1.3)}  # issue 73: x the floor (n floors)


def eap_floor_reason(positions_letters: int = 10) -> None:
    """EAP and EAP-IG against their floor, from bench/results/scale.json: per model, the least work each needs (the
    floor, the other run's forward, every edge's dot product where its sender's difference can be nonzero) over the
    floor's work (one forward and backward; five for EAP-IG's 5 steps), beside its time over the floor's, and whether
    the goal of issue 73 (EAP within 1.5x its floor, EAP-IG within 1.3x five floors) is within reach of the work."""
    data = json.loads((BENCH / "scale.json").read_text())
    cog = _cog()
    lines = []
    for m, name in (("gpt2", "GPT-2 small"), ("llama", "Llama-shaped")):
        by = {r["job"]: r for r in data[m]["jobs"] if r["letters"] == positions_letters and r.get("least")}
        floor = by["floor"]
        for job, (label, n, goal) in FLOOR_GOALS.items():
            r = by[job]
            least, took = r["least"] / (n * floor["flops"]), r["seconds"] / (n * floor["seconds"])
            reach = (f"the least work alone is {least:.2f}x, past the goal" if least > goal else
                     "met" if took <= goal else f"within reach of the work ({least:.2f}x), missed by speed")
            lines.append(f"| {name} | {label} | {least:.2f}x | {took:.2f}x | {took / least:.2f} | {goal}x: {reach} |")
    cog.outl("| model | job | least work / floor's | time / floor's | time / least work's (at the floor's speed) | goal |")
    cog.outl("|---|---|---|---|---|---|")
    for ln in lines:
        cog.outl(ln)
    cog.outl("")
    cog.outl(ran_on("scale"))


def _versus(x: float | None, base: str | None) -> str:
    """baseline / surgeon as words: times faster than a baseline, or times the floor (the least the job needs)."""
    if x is None:
        return "--"
    if base == "floor":
        return f"{1 / x:.2f}x the floor"
    return f"{x:.2f}x faster" if x >= 1 else f"{1 / x:.2f}x slower"


def _held_row(shape: dict, job: str) -> dict | None:
    """bench/memory.py's measurement of `job` on one held-out shape (its subset search has the shape's own count)."""
    return next((r for j, r in shape.items() if j == job or (job.startswith("subsets") and j.startswith("subsets"))),
                None)


def _above(r: dict) -> float:
    """Predicted / measured memory above the weights."""
    return (r["predicted"] - r["weights"]) / (r["measured"] - r["weights"])


def _held_out(job: str) -> str:
    """The range of predicted / measured memory above the weights over bench/memory.py's held-out shapes."""
    held = json.loads((BENCH / "memory.json").read_text()).get("held_out", {})
    vals = [_above(r) for r in (_held_row(shape, job) for shape in held.values()) if r]
    return _span(vals) if vals else "--"


def _span(vals) -> str:
    """The range of ratios, to two decimals (one number where both ends print alike)."""
    lo, hi = f"{min(vals):.2f}", f"{max(vals):.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def _limit_words(data: dict) -> str:
    """The README's words for the work and peak columns (bench/limit.py), with the peaks measured in scale's run."""
    lims = {m: data[m].get("limit") for m in ("gpt2", "llama")}
    if not all(lims.values()):
        return ""
    g, ll = lims["gpt2"], lims["llama"]
    return (f"; work / least: the matrix-multiply FLOPs surgeon computes over the least its method needs (GPT-2 small / "
            f"Llama-shaped); of peak: its FLOP/s over this machine's matrix-multiply peak at the model's shapes "
            f"({g['peak'] / 1e9:,.0f} / {ll['peak'] / 1e9:,.0f} GFLOP/s; {g['limit'] / 1e9:,.0f} at a 2,048-square "
            f"product; * where at a clean run's rows the model's products reach under half of that, so the peak goal does not apply); goal: work <= {WORK_GOAL}x the least, >= "
            f"{SHARE_GOAL:.0%} of the peak where the shapes reach the limit, and ahead of the careful baseline")


def bench_readme(items: int = 2, positions_letters: int = 10) -> None:
    """The README's benchmark section: per job, surgeon's time on GPT-2 small, the careful TransformerLens baseline's
    or the floor's, their ratio on GPT-2 small and on the Llama-shaped model against the job's goal, and the predicted
    memory over the measured on the held-out shapes; every number read from bench/results (scale, memory,
    subset_search), each with the line saying which commit it ran on."""
    data = json.loads((BENCH / "scale.json").read_text())
    by = {m: {r["job"]: r for r in data[m]["jobs"] if r["items"] == items and r["letters"] == positions_letters}
          for m in ("gpt2", "llama")}
    pos = by["gpt2"]["patch"]["positions"]
    held = list(json.loads((BENCH / "memory.json").read_text()).get("held_out", {}))
    cog = _cog()
    cog.outl(f"Per job at {items} items x {pos} positions on 2 CPU threads (`bench/scale.py`, random weights): surgeon's "
             f"time on GPT-2 small, the careful TransformerLens baseline's (prefix in a KV cache, patches in the batch) "
             f"or EAP's floor (one forward and backward, weights frozen), then surgeon against it on GPT-2 small and on "
             f"the Llama-3.1-8B-shaped model (32 layers, 805,681 edges); memory: surgeon's predicted peak above the "
             f"weights over the measured one on shapes the predictor was not fitted to ({', '.join(held)}){_limit_words(data)}:")
    cog.outl("")
    peer = _peer_rates()
    cog.outl(f"The auto-circuit column is its own bench (`bench/peer_auto_circuit.py`: GPT-2 small's shape, "
             f"{peer['items']} items, every edge; auto-circuit 1.0.1's time over surgeon's for EAP, surgeon's rate over "
             f"its for exact edges, each patched alone).")
    cog.outl("")
    cog.outl("| job | surgeon | baseline | GPT-2 small | Llama-shaped | auto-circuit | work / least | of peak | goal | "
             "memory pred / meas |")
    cog.outl("|---|---|---|---|---|---|---|---|---|---|")
    for job, name in JOB_NAMES.items():
        base, label = BASELINES[job]
        r, b = by["gpt2"][job], by["gpt2"].get(base) if base else None
        xs = [by[m][base]["seconds"] / by[m][job]["seconds"] if base else None for m in ("gpt2", "llama")]
        work, share, goal = _limit_cells(by, data, job)
        vs_peer = {"eap": peer["eap"][1] / peer["eap"][0], "exact": peer["rate"][0] / peer["rate"][1]}.get(job)
        cells = [name, f"{r['seconds']:.2f} s", f"{label} {b['seconds']:.2f} s" if b else "--",
                 *(_versus(x, base) for x in xs), f"{vs_peer:.1f}x faster" if vs_peer else "--", work, share, goal,
                 _held_out(job)]
        cog.outl("| " + " | ".join(cells) + " |")
    cog.outl("")
    ratios = [ln.split("ratio")[1].strip() for ln in (BENCH / "subset_search.txt").read_text().splitlines()
              if ln.startswith("TransformerLens careful")]
    goal = [ln for ln in (BENCH / "subset_search.txt").read_text().splitlines() if "against the careful" in ln]
    if ratios:
        cog.outl(f"The subset search against the careful TransformerLens search (12,870 subsets of 16 heads, "
                 f"`bench/subset_search.py`): {' and '.join(ratios)} ({goal[0].split(':')[-1].strip() if goal else ''}). "
                 f"{_contended_sentence()}{_features_sentence()} {_peer_sentence()} "
                 f"Why the misses, where the work grows and the extrapolation to Llama-3.1-8B on one 80 GB GPU: "
                 f"[benchmarks](docs/benchmarks.md). "
                 f"{ran_on_many(['scale', 'memory', 'subset_search', 'features', 'peer_auto_circuit'])}")


def _peer_rates() -> dict:
    """bench/peer_auto_circuit.py's saved medians: each side's EAP seconds and exact edges per second."""
    d = json.loads((BENCH / "peer_auto_circuit.json").read_text())
    us, them = d["surgeon"], d["auto_circuit"]
    return {**d, "eap": (us["eap_s"], them["eap_s"]),
            "rate": (d["top"] / us["exact_s"], d["peer_top"] / them["exact_s"])}


def _peer_sentence() -> str:
    """bench/peer_auto_circuit.py's saved numbers in one sentence: surgeon against auto-circuit 1.0.1, the tool a
    researcher would otherwise install for edge attribution, on the same model, items and edges."""
    d = _peer_rates()
    (us, them), (r_us, r_them) = d["eap"], d["rate"]
    return (f"Against the field's own tool for edge attribution, auto-circuit 1.0.1 (`bench/peer_auto_circuit.py`: "
            f"GPT-2 small's shape, {d['edges']:,} edges, {d['items']} items, its scores checked equal to surgeon's "
            f"first, to {max(d['eap_error'], d['exact_error']):.0e}; medians of {d['rounds']} interleaved rounds): "
            f"EAP over every edge {us:.2f} s against {them:.2f} s ({them / us:.1f}x); exact scores, each edge patched "
            f"alone, {r_us:.1f} edges/s against {r_them:.2f} ({r_us / r_them:.0f}x; auto-circuit's one forward per "
            f"edge timed on {d['peer_top']} of surgeon's top {d['top']}).")


def bridge_speed() -> None:
    """bench/bridge.py's saved times in sentences, a layout each: each job on a TransformerBridge over the
    HookedTransformer of the same checkpoint; the forward alone; the jobs against the HookedTransformer with the
    engine's shared-prefix attention off, and that less the adapter's setup per call; what is left above 1.2x."""
    d = json.loads((BENCH / "bridge.json").read_text())
    names = {"patch": "the per-head sweep", "eap": "EAP", "exact": "exact edges"}
    for layout, v in sorted(d["layouts"].items()):
        r = {row["job"]: (row["hooked_s"], row["bridge_s"]) for row in v["rows"]}
        jobs = [j for j in names if j in r]
        extra = r["setup"][1] - r["setup"][0]
        ratio = {j: b / h for j, (h, b) in r.items()}
        copied = {j: ratio[f"{j}, copied"] for j in jobs}
        less = {j: (r[j][1] - extra) / r[f"{j}, copied"][0] for j in jobs}
        above = [names[j] for j in jobs if less[j] > 1.2]
        if all(copied[j] <= 1.2 for j in jobs):
            why = ("the gap is that attention, which the engine runs on TransformerLens's own attention classes only "
                   "(the bridge's are Hugging Face's).")
        elif not above:
            why = ("the gap is that attention and the adapter's setup, a fixed cost per call: a larger share the "
                   "smaller the job.")
        else:
            h1, b1 = r["1-token forward"]
            n = v["passes"].get("patch / bridge")
            gap = r["patch"][1] - r["patch"][0]
            listed = " and ".join([", ".join(above[:-1]), above[-1]] if len(above) > 1 else above)
            why = (f"{listed} {'stays' if len(above) == 1 else 'stay'} above 1.2x even so. A forward "
                   f"pass's fixed cost (one token, almost no arithmetic) is {1e3 * b1:.1f} ms on the bridge against "
                   f"{1e3 * h1:.1f} ms"
                   + (f"; the per-head sweep runs {n} passes, so {n * (b1 - h1):.3f} s of its {gap:.3f} s gap "
                      f"({100 * n * (b1 - h1) / gap:.0f}%)" if n and gap > 0 else "")
                   + "; the rest (hooks on the bridge's hook points, Hugging Face's modules) is not broken down here.")
        out(f"On the tiny {layout.split()[0].replace('gpt2', 'GPT-2').replace('llama', 'Llama')} checkpoint "
            f"({v['shape']}), the bridge's time over the HookedTransformer's: "
            + ", ".join(f"{names[j]} {ratio[j]:.2f}x" for j in jobs)
            + f"; the forward alone {ratio['forward']:.2f}x, forward and backward {ratio['fwd+bwd']:.2f}x. Against "
            f"the HookedTransformer with the engine's shared-prefix attention off too: "
            + ", ".join(f"{copied[j]:.2f}x" for j in jobs)
            + f"; and less the adapter's setup, {extra:.3f} s a call (built with one forward, surgeon's protocol "
            f"checked with another): " + ", ".join(f"{less[j]:.2f}x" for j in jobs) + f". So {why}")
        out("")


def _contended_sentence() -> str:
    """bench/subset_search.py's run beside one other busy process, in one sentence (empty where it did not run)."""
    lines = (BENCH / "subset_search.txt").read_text().splitlines()
    said = [ln for ln in lines if ln.startswith("contended, following the free cores:")]
    if not said:
        return ""
    return (f"Beside one other busy process on the 2 cores (decision setting), with torch's threads following the "
            f"cores left free: {said[0].split(':', 1)[1].strip()}. ")


def _features_sentence() -> str:
    """bench/features.py's saved numbers in one sentence: each feature-circuit job's time against the TransformerLens
    + sae-lens loop, and the plan's memory above the weights over the measured on the shapes it was not fitted to."""
    data = json.loads((BENCH / "features.json").read_text())
    sh = data["shape"]
    times = ", ".join(f"{j['job']} {j['surgeon']:.1f} s against {j['loop']:.1f} s ({j['loop'] / j['surgeon']:.1f}x)"
                      for j in data["jobs"])
    held = {k: v for k, v in data["held_out"].items() if k != data["fitted"]}
    jobs = list(next(iter(held.values())))
    mem = ", ".join(f"{job} {_span([_above(held[shape][job]) for shape in held])}" for job in jobs)
    return (f"Feature circuits (`bench/features.py`: GPT-2 small's shape, {sh['saes']} TopK SAEs of {sh['d_sae']:,} "
            f"features, {sh['items']} items x {sh['positions']} positions) against the TransformerLens + sae-lens loop "
            f"Marks et al.'s code runs: {times}; the plan's memory above the weights over the measured on held-out "
            f"shapes ({', '.join(held)}): {mem}.")


def install_line() -> None:
    """One sentence from bench/install.py's saved output: how long a fresh install takes and how big it is."""
    rows = {ln[:32].strip(): ln[32:].split() for ln in (BENCH / "install.txt").read_text().splitlines()
            if ln.startswith(("python -m venv", "pip install"))}
    torch_s, base_s, test_s = (rows[k][0] for k in ("pip install torch==2.13.0", "pip install -e .",
                                                     'pip install -e ".[test]"'))
    first = (BENCH / "install.txt").read_text().splitlines()[0]
    size = " ".join(rows['pip install -e ".[test]"'][1:3])
    _cog().outl(f"A fresh install here took {torch_s} for torch, {base_s} for surgeon and {test_s} more for the test "
                f"extras ({size} in all; `bench/install.py`, {first.split('(')[1].rstrip(')')}); {ran_on('install')}")


def _run(name: str) -> tuple[str, str, bool]:
    """A saved result's record: its commit (and whether the tree differed from it), its date, and whether the code
    it timed (the engine, the sites, the case scoring and the bench's SOURCES) is still this one."""
    sys.path.insert(0, str(ROOT / "bench"))
    from saving import stale

    run = json.loads((BENCH / f"{name}.json").read_text())["run"]
    commit = f"commit {run['commit'][:7]}{' with uncommitted changes' if run['uncommitted_changes'] else ''}"
    return commit, run["date"], not stale(name)


CODE_TIMED = "the code it times (surgeon/engine, surgeon/sites, surgeon/case's scoring, bench/saving.py's SOURCES)"


def ran_on_many(names: list[str]) -> str:
    """`ran_on` for several benches in one sentence."""
    runs = {n: _run(n) for n in names}
    each = ", ".join(f"`bench/{n}.py` on {commit} ({date})" for n, (commit, date, _) in runs.items())
    stale = [n for n, (*_, same) in runs.items() if not same]
    return (f"[ran: {each}; {CODE_TIMED.replace('it times', 'they time')} "
            + (f"changed since {', '.join(stale)} ran: rerun with python bench/all.py]" if stale
               else "unchanged since]"))


def ran_on(name: str) -> str:
    """The line under a bench's output: the commit it ran on and whether the code it timed is still this one."""
    commit, date, same = _run(name)
    rerun = "python bench/gpu.py --save on a GPU" if name == "gpu" else "python bench/all.py"
    return f"[ran on {commit}, {date}; {CODE_TIMED} {'unchanged since' if same else f'changed since: rerun with {rerun}'}]"


def _collect() -> tuple[int, int]:
    """(tests, slow tests): one collection, deselecting the slow ones ("1029/1159 tests collected (130 deselected)")."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-m", "not slow"], cwd=ROOT,
                       capture_output=True, text=True)
    m = re.search(r"(\d+)/(\d+) tests? (?:collected|selected)", r.stdout)
    if not m:
        raise SystemExit(f"pytest --collect-only printed no count:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return int(m.group(2)), int(m.group(2)) - int(m.group(1))


def machine() -> str:
    """This machine in a few words, for a wall time measured on it: the CPU's model name (/proc/cpuinfo), the widest
    vector instructions torch's CPU kernels use on it, and its cores. Sessions get different machines, and the same
    test command took twice as long on one as on another, so a time says where it was taken."""
    import torch

    name = "an unnamed CPU"
    try:
        name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} cores of {name} ({torch.backends.cpu.get_cpu_capability()})"


def suite() -> dict:
    """The test suite's size (collected now) and wall times (measured by `python docs/readme.py --suite`), with the
    machine they were measured on."""
    t = _timings()
    total, slow = _collect()
    unmeasured = "(not measured yet: python docs/readme.py --suite)"
    timed = t.get("suite-tests", total)  # how many tests the timed run had (the suite grows between timings)
    return {"tests": total, "slow": slow, "machine": t.get("suite-machine", "2 CPU cores (the machine not recorded)"),
            "when": "" if timed == total else f" (timed when it had {timed} tests)",
            "time": _minutes(t["suite"]) if "suite" in t else unmeasured,
            "fast_time": _minutes(t["suite-fast"]) if "suite-fast" in t else unmeasured}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} minutes" if seconds >= 90 else f"{seconds:.0f} s"


SLOWEST = 20  # the slowest tests docs/install.md lists, each with why it takes what it takes
DURATIONS = 40  # the slowest tests recorded
# why each of the slowest tests takes what it takes, by test file (a slow test in a file not named here fails the
# docs check: say why, or make it faster)
SLOW_WHY = {
    "tests/models/test_bridge_numbers.py":
        "every analysis (the whole report here) on a TransformerLens TransformerBridge and on the HookedTransformer of "
        "the same checkpoint, GPT-2, Llama, Qwen2 and Gemma-2 layouts: each model booted from its folder, each "
        "analysis run twice and compared number by number",
    "tests/test_readme.py::test_readme_is_regenerated_from_real_runs":
        "reruns every fast command block and example of the README and the docs pages (dozens of `surgeon` commands "
        "and Python examples on the organisms, in its one process) and compares what they print",
    "tests/test_readme_blocks.py::test_the_own_model_block_runs_on_a_standin":
        "the README's own-model block as written, on a checkpoint of Llama-3.1-8B's layout (32 layers x 32 heads, "
        "grouped-query, heads of 2 dimensions): `surgeon patch` sweeps its 1,024 heads in a subprocess (over 16 of the case's "
        "64 traps, edited as the block says a user edits the case)",
    "tests/engine/test_memory.py":
        "peak memory measured per job on shapes held out of the memory plan's fit (two of them again in the suite; "
        "every job by bench/memory.py, whose saved result another test holds to the same bounds), large enough that "
        "the activations, not the weights, set the peak",
    "tests/analyses/test_repair_table.py":
        "the repair of each row of the table measured on the organism's test split (384 items; the hand-written "
        "ground truth beside it, TransformerLens hooks on prompts of one length at a time, takes a tenth of it)",
    "tests/sae/test_feature_memory.py":
        "feature circuits' memory plan against the measured peak on a held-out grouped-query shape with TopK SAEs "
        "of 16x at three layers (the exact step again in the suite; every step by bench/features.py, checked)",
    "tests/engine/test_execution.py":
        "EAP-IG and the faithfulness curve over 8x the items, each in a fresh process, so their peak memory is "
        "measured alone",
    "tests/analyses/test_repair.py":
        "`surgeon report` with the repair step and the steering baselines on the report's split, then a rerun that "
        "reuses them",
    "tests/test_api_options.py": "refusals on every route, and options that reach the analyses they name",
    "tests/models/test_models.py":
        "the shipped Llama-3.1 case and Hugging Face cache layouts, run from the command line on stand-in checkpoints",
    "tests/circuits/test_circuits.py": "`surgeon circuit` with every export, then `circuit-eval` on it, as commands",
    "tests/reports/test_report_page.py": "`surgeon report`'s every step, then a rerun and a start from a scan",
    "tests/test_invariance.py": "every analysis run at two batch sizes (or item orders, or chunk sizes)",
    "tests/models/test_fit.py": "a TransformerLens checkpoint folder written, then loaded and run from the command line",
    "tests/cli/test_reliability.py": "commands run as processes side by side on one output folder",
    "tests/test_bench.py": "every job of bench/gpu.py beside its TransformerLens baseline, on a small model on the CPU",
    "tests/search/test_threshold.py": "subset searches from the command line, stopped by a signal and resumed",
    "tests/sae/test_sae.py": "SAEs trained, or read from a Hugging Face cache layout, then used",
    "tests/analyses/test_scan.py": "`surgeon scan` from the command line: formats composed and tested on the organism",
    "tests/search/test_ray.py": "a local Ray cluster started, a worker killed, the run resumed without Ray",
    "tests/reports/test_report_key.py": "reports rerun with one input changed at a time, to see each enter the key",
    "tests/test_smoke.py": "the README's quick start, its commands as processes",
    "tests/analyses/test_repair_saved_checks.py":
        "a repair built and measured in float16 and bfloat16 on the CPU, whose half-precision products are slow",
    "tests/cli/test_first_hour.py": "a new user's first commands, as processes",
    "tests/analyses/test_repair_measure.py": "repairs built, saved and measured from the command line",
    "tests/cli/test_robustness.py": "signals sent to commands while they import and run",
    "tests/organisms/test_organisms.py": "the organisms' data drawn and their mechanisms measured",
    "tests/engine/test_progress.py":
        "1,500 patches run twice, once beside a real busy process, so the thread governor has chunks to act between",
    "tests/test_api.py": "every analysis run through the Python API, saved and read back",
    "tests/analyses/test_heldout.py": "searches and circuits found on one half of the items and measured on the other",
    "tests/analyses/test_intervals.py": "every analysis's intervals, in both directions, on two organisms",
    "tests/analyses/test_sinks.py": "attention sinks measured and intervened on, from the command line too",
    "tests/sae/test_feature_circuit.py": "feature circuits on the organisms' SAEs, against hand-written hooks",
    "tests/reports/test_figures_read.py": "every figure of a report rendered and read back in a real browser",
    "tests/reports/test_figures_journal.py": "a report's figures built and checked for a journal's column and fonts",
    "tests/engine/test_contrast.py": "the engine against TransformerLens's own patching on every organism",
    "tests/test_docs_site.py": "the documentation site built with MkDocs and read offline",
}


def slowest_tests() -> None:
    """docs/install.md's table of the suite's slowest tests (timed by `python docs/readme.py --suite-only`), each with
    why it is slow."""
    t = _timings()
    rows = t.get("suite-slowest")
    if not rows:
        out("(not measured yet: python docs/readme.py --suite-only)")
        return
    out(f"On {t.get('suite-machine', '2 CPU cores (the machine not recorded)')}:")
    out("")
    out("| s | phase | test | why |")
    out("|---|---|---|---|")
    for sec, phase, node in rows[:SLOWEST]:
        f = node.split("::")[0]
        why = SLOW_WHY.get(node.split("[")[0], SLOW_WHY.get(f))
        if why is None:
            raise SystemExit(f"{node} is among the {SLOWEST} slowest tests and docs/readme.py's SLOW_WHY does not say "
                             f"why: add its file or test there, or make it faster")
        out(f"| {sec:.1f} | {phase} | `{node}` | {why} |")


def measure_suite() -> None:
    """Run the whole suite and the fast part, then record their wall times in docs/timings.json (written once
    both have passed: the README check inside them compares against the timings as they were)."""
    new = {}
    for key, extra in (("suite", ["--durations", str(DURATIONS)]), ("suite-fast", ["-m", "not slow"])):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", *extra], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        sys.stdout.write(r.stdout)
        if r.returncode:
            raise SystemExit(f"the suite failed ({key}): fix it before regenerating the README")
        new[key] = round(time.perf_counter() - t0, 1)
        if key == "suite":  # pytest's --durations lines: "12.34s call     tests/x.py::test_y"
            new["suite-slowest"] = [[float(m.group(1)), m.group(2), m.group(3)] for m in
                                    re.finditer(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+)$", r.stdout, re.M)]
    new["suite-tests"] = _collect()[0]
    new["suite-machine"] = machine()
    t = _timings()
    t.update(new)
    TIMINGS.write_text(json.dumps(t, indent=1, sort_keys=True) + "\n")


def timing(cmd: str) -> str:
    t = _timings().get(cmd)
    if t is None:
        return "not measured yet (python docs/readme.py)"
    return f"{t / 60:.1f} min" if t >= 120 else f"{t:.1f} s"


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md is not what the commands print now")
    ap.add_argument("--suite", action="store_true",
                    help="then time the test suite (about 15 minutes) and rewrite the README with those times")
    ap.add_argument("--suite-only", action="store_true",
                    help="time the test suite and write its times in, without rerunning the commands first")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "docs") + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def cog(flags, check_mode):
        e = dict(env, SURGEON_README="check") if check_mode else env
        return subprocess.run([sys.executable, "-m", "cogapp", *flags, "-I", str(ROOT / "docs"),
                               *map(str, PAGES)], cwd=ROOT, env=e).returncode

    if args.check:
        return cog(["--check", "--diff"], True) and 1
    if args.suite_only:
        measure_suite()
        return cog(["-r"], True) and 1
    if cog(["-r"], False):
        return 1
    # the timing table sits above commands timed later in the same pass: render it again from the times just
    # measured (a check-mode pass: fast commands in-process, slow blocks kept, no timing written)
    if cog(["-r"], True):
        return 1
    if args.suite:  # the suite passes against the README just written, then its times go in (slow blocks kept)
        measure_suite()
        return cog(["-r"], True) and 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# which prompts each ablation x direction x semantics runs, and the convention each follows
_FOLLOWS = {
    ("resample", "denoise"): "auto-circuit's and ACDC's resample ablation, EAP-IG/MIB with the good format as clean",
    ("resample", "noise"): "the noising direction (the failing run explained, the good run's values patched in)",
    ("mean", "denoise"): "EAP-IG's and MIB's mean ablation (per-position mean; a `reference` set when the case names one)",
    ("mean", "noise"): "as mean ablation, on the failing prompts (no tool runs this by default)",
    ("zero", "denoise"): "auto-circuit's zero ablation (it runs the clean prompts)",
    ("zero", "noise"): "zero ablation on the failing prompts: not auto-circuit's, which runs the clean prompts",
}


def ablation_table() -> None:
    """For every ablation x direction x semantics: the prompts run (the items whose score the circuit explains), what
    an ablated edge carries there, and the convention it follows; read from `circuit_runs` on the decimal organism
    (its 'qa' format against 'plain'), so the table is what the code does."""
    from surgeon.analyses.circuit_runs import circuit_runs
    from surgeon.api import read
    from surgeon.models.loading import load_model
    from surgeon.sites.edges import EdgeSite

    case, model = read("decimal_organism"), load_model("organism:decimal")
    out("| `--ablation` | `--direction` | prompts run | an ablated edge carries | `kept` ablates | `knockout` ablates | follows |")
    out("|---|---|---|---|---|---|---|")
    for abl in ("resample", "mean", "zero"):
        for d in ("denoise", "noise"):
            r = circuit_runs(case, model, EdgeSite.of(model.cfg, abl), direction=d, bad="qa")
            src, base = r.info["source"], r.info["base"]
            carries = {"resample": f"the {base!r} run's sender output at the aligned positions",
                       "mean": f"the sender's mean over the {src!r} items (or the reference items in {src!r}), per "
                               "position, at every position",
                       "zero": "zero, at every position"}[abl]
            assert f"on the {src!r} items" in r.describe(), r.describe()  # the code says the same
            out(f"| {abl} | {d} | the {src!r} ({'good' if src == case.good else 'failing'}) format's | {carries} | "
                f"every edge outside the circuit | the circuit's edges | {_FOLLOWS[abl, d]} |")
