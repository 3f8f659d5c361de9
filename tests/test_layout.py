"""The house: the way through the package reads case -> model -> engine -> analyses -> report -> CLI with no
arrow back, no import cycle (function-local imports count), no private name imported across modules, an
engine that knows no site kind by name, and tests that mirror the package's folders."""
import ast
import re
from pathlib import Path

from tests.conftest import ROOT as _ROOT

ROOT = Path(_ROOT)

PKG = ROOT / "surgeon"
# lowest first; a module may import its own layer and those below it, never one above (docs/layout.md draws them)
LAYERS = [
    ("surgeon.version", "surgeon.errors", "surgeon.stats", "surgeon.results", "surgeon.show", "surgeon.causal",
     "surgeon.threads"),
    ("surgeon.sites",),  # the vocabulary of sites (a case names components) and the protocol the engine calls
    ("surgeon.case",),  # a case described once: no model
    ("surgeon.engine",),  # masks between runs of a HookedTransformer it is given: no loading
    ("surgeon.models", "surgeon.organisms"),  # loading a model (an organism knows no engine)
    ("surgeon.repairs",),  # a shippable repair: the constant-source site the engine runs, and the artifact a model wears
    ("surgeon.circuits", "surgeon.search", "surgeon.sae"),  # graphs, subset plans and stores, SAEs: what analyses use
    ("surgeon.analyses",),  # plain functions over a case and a model: orchestration above what it orchestrates
    ("surgeon.organisms.measure",),  # measuring an organism uses the engine
    ("surgeon.reports",),
    ("surgeon.api",),  # the notebook's functions; the command line is thin over them
    ("surgeon.cli",),
    ("surgeon", "surgeon.__main__"),
]
def modules():
    out = {}
    for f in PKG.rglob("*.py"):
        if "cases" in f.relative_to(ROOT).parts:
            continue
        parts = f.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def imports(name, f, mods):
    """(target module, imported name) for every import in the module, TYPE_CHECKING blocks left out."""
    tree = ast.parse(f.read_text())
    skip = {id(n) for t in ast.walk(tree) if isinstance(t, ast.If) and "TYPE_CHECKING" in ast.unparse(t.test)
            for n in ast.walk(t)}
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.Import):
            for a in n.names:
                yield a.name, None
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = name.split(".")
                keep = len(base) - n.level + (1 if f.name == "__init__.py" else 0)
                target = ".".join(base[:keep] + ([n.module] if n.module else []))
            else:
                target = n.module or ""
            for a in n.names:
                yield (f"{target}.{a.name}" if f"{target}.{a.name}" in mods else target), a.name


def owner(name, mods):
    while name and name not in mods and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in mods else None


def graph():
    mods = modules()
    g, private = {m: set() for m in mods}, []
    for name, f in mods.items():
        for tgt, nm in imports(name, f, mods):
            t = owner(tgt, mods)
            if t and t != name:
                g[name].add(t)
                if nm and nm.startswith("_") and not nm.startswith("__"):
                    private.append(f"{name} imports {t}.{nm}")
    return g, private


def layer(mod):
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    assert best is not None, f"{mod} is in no layer: add its folder to LAYERS"
    return best[0]


def test_no_arrow_back_no_cycle_no_private_import():
    g, private = graph()
    assert not private
    back = {f"{a} -> {b}" for a, ts in g.items() for b in ts if layer(b) > layer(a)}
    assert not back, sorted(back)  # an import from a lower floor to a higher one
    # a cycle would need an arrow back or a cycle inside one layer: find any by depth-first search
    state = {}

    def visit(v, path):
        state[v] = 1
        for w in g[v]:
            assert state.get(w) != 1, "import cycle: " + " -> ".join(path + [w])
            if w not in state:
                visit(w, path + [w])
        state[v] = 2

    for v in g:
        if v not in state:
            visit(v, [v])


def test_the_checker_sees_an_arrow_back_and_a_cycle(tmp_path):
    """The layer rule is not vacuous: the engine importing an analysis would be caught."""
    assert layer("surgeon.engine.contrast") < layer("surgeon.analyses.patching")
    assert layer("surgeon.engine") < layer("surgeon.models.loading") < layer("surgeon.organisms.measure")
    assert layer("surgeon.search.subsets") < layer("surgeon.analyses.threshold")  # a driver in search/ is caught
    g, _ = graph()
    assert "surgeon.engine.contrast" in g["surgeon.analyses.common"]  # edges are seen, local imports too
    assert "surgeon.case.encoding" in g["surgeon.analyses.common"]


def test_the_engine_knows_no_site_kind_by_name():
    src = "\n".join(f.read_text() for f in (PKG / "engine").glob("*.py"))
    assert not re.search(r"EdgeSite|FeatureSite|isinstance\([^)]*Site", src)
    from surgeon.sites import edges, features, nodes, protocol  # noqa: F401 (each registers its kind)

    assert {"node", "edges", "sae_features"} <= set(protocol.KINDS)


def test_no_class_over_300_lines_no_function_over_100():
    long = []
    for f in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            n = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
            if (isinstance(node, ast.ClassDef) and n > 300) or (
                    isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and n > 100):
                long.append(f"{f.relative_to(ROOT)}:{node.name} ({n} lines)")
    assert not long


def test_tests_mirror_the_package():
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    tests = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert tests <= folders, tests - folders
    for t in (ROOT / "tests").rglob("test_*.py"):  # tests drive the CLI through its entry point only
        for line in t.read_text().splitlines():
            m = re.match(r"\s*from surgeon\.cli(\.\w+)? import (.+)", line)
            if m:
                names = set(re.split(r",\s*", m.group(2)))
                assert (m.group(1) in (None, ".commands") and names <= {"main", "build_parser"}) or (
                    m.group(1) == ".registry" and names <= {"COMMANDS", "ORDER"}), line  # or the registry's shape


def test_the_docs_layout_shows_every_folder_once():
    text = (ROOT / "docs" / "layout.md").read_text()
    tree = text
    tree = tree[tree.index("```\n") + 4:]
    tree = tree[:tree.index("```")]
    lines = [line.strip().split()[0] for line in tree.splitlines() if line.startswith("  ")]
    folders = sorted(str(p.parent.relative_to(PKG)) + "/" for p in PKG.rglob("__init__.py")
                     if p.parent != PKG and "cases" not in p.parts)
    assert sorted(x for x in lines if x.endswith("/")) == folders
    # drawn floor by floor, lowest first, as LAYERS orders them
    floors = [layer("surgeon." + x.rstrip("/").replace("/", ".")) for x in lines if x.endswith("/")]
    assert floors == sorted(floors), lines


# the one way lazy imports are done: only the modules `import surgeon` and `surgeon --help` load (and the CLI,
# which imports each command's code when the command runs) import the package inside functions; everything
# else imports at the top, where its dependencies can be read
STARTUP = {"surgeon", "surgeon.__main__", "surgeon.errors", "surgeon.results", "surgeon.case.case",
           "surgeon.case.encoding", "surgeon.models", "surgeon.models.loading", "surgeon.models.checks",
           "surgeon.sites.nodes", "surgeon.sites.protocol", "surgeon.organisms", "surgeon.causal"}


def test_lazy_imports_only_on_the_start_up_path():
    local = []
    for name, f in modules().items():
        if name in STARTUP or name.startswith("surgeon.cli"):
            continue
        for fn in ast.walk(ast.parse(f.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local += [f"{name}: {ast.unparse(n)}" for n in ast.walk(fn)
                          if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("surgeon")]
    assert not local, local


def test_data_is_never_unpickled():
    """Every input but a case file is data: no pickle, torch.load only with weights_only=True, np.load never
    with allow_pickle=True."""
    for name, f in modules().items():
        src = f.read_text()
        assert "import pickle" not in src and "allow_pickle=True" not in src, name
        for call in re.findall(r"torch\.load\([^)]*\)", src):
            assert "weights_only=True" in call, (name, call)
