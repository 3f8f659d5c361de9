"""Circuit exports read by the tools they are named for: EAP-IG's loader (its naming written out here from
hannamw/EAP-IG `src/eap/graph.py`, `Graph.from_model` / `from_json`), networkx, Graphviz, pdflatex and
lualatex; the faithfulness MIB's evaluator gets from a file equals what `circuit-eval` reports; figures with
input and logits drawn, no overlapping nodes and no edge through a node."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch

from surgeon import load_case
from surgeon.analyses.circuit import discover, evaluate_circuit
from surgeon.circuits.export import (
    FORMATS,
    NO_INPUT_EDGE,
    NODE_H,
    NODE_W,
    check_targets,
    drawn,
    edges_for_model,
    figure,
    layout,
    read_circuit,
    tikz,
    tikz_caption,
    tikz_document,
    tikz_fit,
    write,
)
from surgeon.circuits.graph import CircuitGraph, build_graph
from surgeon.errors import AnalysisError
from surgeon.sites.edges import EdgeSite
from tests.conftest import ROOT
from tests.reference import graph_forward, row_score, sender_outputs
from tests.cli_in_process import surgeon as surgeon_cli

ORGANISMS = ["induction_organism", "threshold_organism", "decimal_organism"]


# ---------------------------------------------------------------------------------------------- EAP-IG's graph
def eap_ig_graph(cfg: dict):
    """The node and edge names EAP-IG's `Graph.from_model(cfg)` builds: nodes input, a{l}.h{h}, m{l}, logits (an
    MLP in every layer); each head reads q, k and v from everything before its layer; a (sequential) MLP reads
    everything before it including its own layer's heads; the logits read everything."""
    L, H = cfg["n_layers"], cfg["n_heads"]
    cfg["parallel_attn_mlp"], cfg["d_model"]  # noqa: B018 - from_model reads these: a file without them fails there
    nodes, edges, stream = {"input"}, set(), ["input"]
    for layer in range(L):
        heads, mlp = [f"a{layer}.h{h}" for h in range(H)], f"m{layer}"
        nodes |= set(heads) | {mlp}
        edges |= {f"{s}->{h}<{x}>" for s in stream for h in heads for x in "qkv"}
        if cfg["parallel_attn_mlp"]:
            edges |= {f"{s}->{mlp}" for s in stream}
            stream += heads
        else:
            stream += heads
            edges |= {f"{s}->{mlp}" for s in stream}
        stream.append(mlp)
    nodes.add("logits")
    edges |= {f"{s}->logits" for s in stream}
    return nodes, edges


def eap_ig_from_json(d: dict):
    """What `Graph.from_json` does with a file: KeyError on any node or edge its graph lacks; returns the edges
    in the graph and every edge's score."""
    assert all(k in d for k in ("cfg", "nodes", "edges")), "Bad input JSON format - Missing keys"
    nodes, edges = eap_ig_graph(dict(d["cfg"]))
    for name, nd in d["nodes"].items():
        if name == "logits":
            continue
        if name not in nodes:
            raise KeyError(name)
        bool(nd["in_graph"])
    scores = {}
    for name, info in d["edges"].items():
        if name not in edges:
            raise KeyError(name)
        scores[name] = float(info["score"])
        bool(info["in_graph"])
    return {n for n, i in d["edges"].items() if i["in_graph"]}, scores


def _random_graph(cfg, seed=0):
    site = EdgeSite.of(cfg)
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=len(site.edges))
    chosen = rng.choice(len(site.edges), size=max(3, len(site.edges) // 7), replace=False)
    return site, build_graph(site, scores, {int(chosen[0]): 0.5}, chosen, cfg), scores, sorted(int(c) for c in chosen)


def _models(random_model):
    from surgeon.models.loading import load_model

    return [random_model, *(load_model(f"organism:{n}") for n in ("decimal", "induction", "threshold"))]


def test_mib_export_loads_in_eap_ig(random_model, tmp_path):
    """GPT-2- and Llama-style (GQA) checkpoints and the three organisms (decimal: GQA with 2 key/value heads)."""
    for model in _models(random_model):
        cfg = model.cfg
        site, g, scores, chosen = _random_graph(cfg)
        path = tmp_path / "c.mib.json"
        write(g, path, cfg, semantics="kept")
        d = json.loads(path.read_text())
        inside, file_scores = eap_ig_from_json(d)
        _, theirs = eap_ig_graph(dict(d["cfg"]))
        H, G = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads
        ours = set(d["edges"])
        if cfg.attn_only:  # EAP-IG always builds MLPs; an attention-only model has none of their edges
            theirs = {e for e in theirs if not any(p.startswith("m") for p in e.split("->"))}
        assert ours == theirs, (ours ^ theirs)
        assert (d["cfg"].get("n_key_value_heads") == G) if G != H else "n_key_value_heads" not in d["cfg"]
        # a key/value head's edge once per query head of its group, each with the group's score and membership
        for e, name in enumerate(site.names):
            if ".g" in name:
                snd, rcv = name.split("->")
                layer, rest = rcv[1:].split(".g")
                grp, port = rest.rstrip(">").split("<")
                copies = [f"{snd}->a{layer}.h{h}<{port}>" for h in range(H) if h // (H // G) == int(grp)]
                assert len(copies) == H // G
            else:
                copies = [name]
            for c in copies:
                assert file_scores[c] == pytest.approx(scores[e])
                assert (c in inside) == (e in chosen)
        # and circuit-eval reads the same circuit back
        assert edges_for_model(read_circuit(path), site, cfg) == chosen


def _same_graph(a, b) -> None:
    """Equal nodes, edges, attributes (NaN equal to NaN) and graph attributes."""
    def norm(d):
        return {k: ("nan" if isinstance(v, float) and v != v else v) for k, v in d.items()}

    assert a.graph == b.graph
    assert {n: norm(d) for n, d in a.nodes(data=True)} == {n: norm(d) for n, d in b.nodes(data=True)}
    assert {(u, v): norm(d) for u, v, d in a.edges(data=True)} == {(u, v): norm(d) for u, v, d in b.edges(data=True)}


def test_one_graph_type_reads_back_what_it_writes(random_model, tmp_path):
    """`CircuitGraph.to_json` / `from_json` are symmetric (graph -> JSON -> graph and JSON -> graph -> JSON), the
    `.json` export read by `read_circuit` is the graph written (as `discover`'s circuits are: the fixture), and without
    grouped-query attention the file is one EAP-IG's `Graph.from_json` reads, with the circuit's edges."""
    for model in _models(random_model):
        site, g, scores, chosen = _random_graph(model.cfg)
        assert isinstance(g, CircuitGraph) and g.cfg["n_layers"] == model.cfg.n_layers
        g.graph["semantics"] = "kept"
        d = g.to_json()
        back = CircuitGraph.from_json(json.loads(json.dumps(d)))
        _same_graph(back, g)
        assert back.to_json() == d
        path = tmp_path / "c.json"
        write(g, path)
        _same_graph(read_circuit(path), g)
        assert edges_for_model(read_circuit(path), site, model.cfg) == chosen
        if not model.cfg.n_key_value_heads or model.cfg.n_key_value_heads == model.cfg.n_heads:
            inside, file_scores = eap_ig_from_json(json.loads(path.read_text()))
            assert inside == {site.names[e] for e in chosen}
            assert file_scores == pytest.approx({n: scores[e] for e, n in enumerate(site.names)})
        # a circuit file that names edges only gives a graph of those edges, nodes read from the names
        mib = tmp_path / "c.mib.json"
        write(g, mib)
        h = read_circuit(mib)
        assert edges_for_model(h, site, model.cfg) == chosen and h.semantics == "kept"
        if ".g" not in "".join(site.names):  # (EAP-IG's file ungroups key/value heads into per-head ports)
            assert {n: d["kind"] for n, d in h.nodes(data=True)} == {n: g.nodes[n]["kind"] for n in h.nodes}


def test_circuit_files_are_checked_against_the_model(decimal_model, tmp_path):
    cfg = decimal_model.cfg
    site, g, _, chosen = _random_graph(cfg)
    path = tmp_path / "c.mib.json"
    write(g, path, cfg, semantics="knockout")
    d = json.loads(path.read_text())
    kv = next(n for n in d["edges"] if n.endswith("<k>") and ".h1<" in n and n.startswith("input->a1."))
    mixed = dict(d, edges=dict(d["edges"], **{kv: {"score": 0.0, "in_graph": not d["edges"][kv]["in_graph"]}}))
    bad_cfg = dict(d, cfg=dict(d["cfg"], n_heads=12))
    unknown = dict(d, edges=dict(d["edges"], **{"a9.h0->logits": {"score": 1.0, "in_graph": True}}))
    for variant, words in [(mixed, "key/value head"), (bad_cfg, "n_heads"), (unknown, "no edge")]:
        p = tmp_path / "bad.mib.json"
        p.write_text(json.dumps(variant))
        with pytest.raises(AnalysisError, match=words):
            edges_for_model(read_circuit(p), site, cfg, str(p))
    for text, words in [("[1, 2]", "not an object"), ('{"edges": 3}', "no circuit edges"), ("{", "cannot read"),
                        ('{"result": {"edge_names": ["x"], "circuit": [5]}}', "indices"),
                        ('{"cfg": {}, "nodes": {}, "edges": {"a": {"score": 1}}}', "in_graph"),
                        ('{"cfg": {}, "nodes": {}, "edges": {"a": {"score": NaN, "in_graph": true}}}', "finite"),
                        ('{"cfg": {}, "nodes": {}, "edges": {"a": {"score": 1e308, "in_graph": true}}}', "never past"),
                        ("[" * 100000 + "]" * 100000, "cannot read")]:
        p = tmp_path / "junk.json"
        p.write_text(text)
        with pytest.raises(AnalysisError, match=words):
            read_circuit(p)


@pytest.fixture(scope="module")
def circuits():
    from surgeon.models.loading import load_model

    out = {}
    for name in ORGANISMS:
        case = load_case(f"{ROOT}/cases/{name}.py")
        model = load_model(case.model)
        r = discover(case, model, n_paths=0, verify=5)
        g = r.graph()
        assert isinstance(g, CircuitGraph) and g.semantics == r.options["semantics"]  # what discover finds is one
        out[name] = (case, model, r, g)
    return out


@pytest.mark.slow
def test_mib_evaluator_gets_the_faithfulness_circuit_eval_reports(circuits, tmp_path):
    """MIB's evaluator, written out with hooks from EAP-IG's `evaluate_graph`: run the clean input (the good
    format) and give every edge outside the circuit the corrupted run's sender output (the failing format).
    Under index alignment that is the circuit surgeon evaluates, so the file gives the same f."""
    case, model, r, g = circuits["induction_organism"]
    path = tmp_path / "c.mib.json"
    write(g, path, model.cfg, semantics=r.options["semantics"])
    got = evaluate_circuit(case, model, read_circuit(path), where=str(path))
    inside, _ = eap_ig_from_json(json.loads(path.read_text()))
    from surgeon.analyses.common import format_rows

    items = case.items_for(r.tag)
    clean = format_rows(case, model, case.good, items)
    corrupt = format_rows(case, model, case.bad_formats[0], items)
    from tests.reference import edge_name

    def m(circuit_edges):
        total = 0.0
        for c, x in zip(clean, corrupt):
            with torch.no_grad():
                ox = sender_outputs(model, torch.tensor(x.tokens))
                lg = graph_forward(model, torch.tensor(c.tokens), lambda s, rcv, cur: cur if edge_name(s, rcv, model.cfg)
                                   in circuit_edges else ox[s])
                total += float(row_score(lg, c))
        return total / len(items)

    everything = set(json.loads(path.read_text())["edges"])
    f = (m(inside) - m(set())) / (m(everything) - m(set()))
    assert f == pytest.approx(got["faithfulness"], abs=1e-4)
    assert f == pytest.approx(r.circuit_faithfulness, abs=1e-4)


@pytest.mark.slow
def test_semantics_are_written_read_back_and_legacy_files_handled(circuits, tmp_path):
    """Every export records what a circuit means; circuit-eval evaluates a file under the semantics it records (a
    knockout set as a knockout, giving discover's value back); files of 0.1 read "chain" as kept and refuse the
    retired edge-set reading."""
    from surgeon.analyses.circuit import discover

    case_c, model_c, r_c, g_c = circuits["induction_organism"]
    case_e, model_e, r_e, g_e = circuits["decimal_organism"]
    assert r_c.options["semantics"] == "kept" == r_e.options["semantics"]
    for g, model, r in [(g_e, model_e, r_e), (g_c, model_c, r_c)]:
        for ext in (".mib.json", ".json"):
            p = tmp_path / f"c{ext}"
            write(g, p, model.cfg, semantics=r.options["semantics"])
            assert read_circuit(p).semantics == "kept"
        assert evaluate_circuit(case_e if model is model_e else case_c, model, read_circuit(p))["faithfulness"] \
            == pytest.approx(r.circuit_faithfulness, abs=1e-5)
    ko = discover(case_c, model_c, semantics="knockout", n_paths=0, verify=0)
    p = tmp_path / "ko.mib.json"
    write(build_graph(EdgeSite.of(model_c.cfg), ko.scores, ko.exact, ko.circuit), p, model_c.cfg, semantics="knockout")
    got = evaluate_circuit(case_c, model_c, read_circuit(p))
    assert got["semantics"] == "knockout" and got["faithfulness"] == pytest.approx(ko.circuit_faithfulness, abs=1e-5)
    assert evaluate_circuit(case_c, model_c, read_circuit(p), semantics="kept")["faithfulness"] != pytest.approx(
        ko.circuit_faithfulness, abs=1e-3)
    d = json.loads(p.read_text())
    for old, ok in (("chain", True), ("edge-set", False)):
        d["semantics"] = old
        p.write_text(json.dumps(d))
        if ok:
            assert evaluate_circuit(case_c, model_c, read_circuit(p))["semantics"] == "kept"
        else:
            with pytest.raises(AnalysisError, match="edge-set"):
                evaluate_circuit(case_c, model_c, read_circuit(p), where=str(p))
    # the results.json of `surgeon circuit --out` is read too (the circuit is under "result")
    res = tmp_path / "results.json"
    res.write_text(json.dumps({"command": "circuit", "result": {"edge_names": r_c.edge_names, "circuit": r_c.circuit,
                                                                "options": r_c.options}}))
    assert evaluate_circuit(case_c, model_c, read_circuit(res))["faithfulness"] == pytest.approx(r_c.circuit_faithfulness, abs=1e-5)


# ---------------------------------------------------------------------------------------------- the files
@pytest.mark.slow
@pytest.mark.parametrize("name", ORGANISMS)
def test_every_export_opens_in_its_tool(circuits, name, tmp_path):
    case, model, r, g = circuits[name]
    files = {ext: tmp_path / f"c{ext}" for ext in FORMATS}
    check_targets(files.values())
    for ext, f in files.items():
        write(g, f, model.cfg, title=f"{name}: {len(r.circuit)} edges", semantics=r.options["semantics"])
    inside = set(r.names(r.circuit))
    for ext in (".graphml", ".gexf"):
        h = (nx.read_graphml if ext == ".graphml" else nx.read_gexf)(files[ext])
        scored = [d for *_, d in h.edges(data=True) if not d["internal"]]
        assert {d["name"] for d in scored if d["in_circuit"]} == inside
        measured = [d for d in scored if "exact" in d]
        assert len(measured) == len(r.exact) and all(d["exact"] != -1.0 for d in measured)  # missing, not -1
    data = json.loads(files[".json"].read_text())  # strict JSON: no NaN
    assert {n for n, e in data["edges"].items() if e["in_graph"]} == inside
    assert all(e["exact"] is None for e in data["edges"].values() if e["index"] not in r.exact)
    assert files[".png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert files[".pdf"].read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in files[".svg"].read_bytes()[:2000]
    if shutil.which("dot"):
        out = subprocess.run(["dot", "-Tsvg", str(files[".dot"])], capture_output=True, text=True)
        assert out.returncode == 0 and "<svg" in out.stdout, out.stderr
    for tex in ("pdflatex", "lualatex"):
        if shutil.which(tex):
            (tmp_path / "paper.tex").write_text(tikz_document(r"\input{" + files[".tex"].name + "}", "A circuit."))
            out = subprocess.run([tex, "-interaction=nonstopmode", "-halt-on-error", "paper.tex"],
                                 cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stdout[-2000:]
            assert (tmp_path / "paper.pdf").read_bytes()[:5] == b"%PDF-"


def opens_in_its_tool(path, tmp_path) -> None:
    """Open one export in the tool its suffix names (skipping only a program that is not installed)."""
    from pathlib import Path

    path = Path(path)
    name = path.name
    if name.endswith(".mib.json"):
        eap_ig_from_json(json.loads(path.read_text()))
    elif name.endswith(".json"):
        json.loads(path.read_text())  # strict: NaN would fail
    elif name.endswith(".graphml"):
        assert nx.read_graphml(path).number_of_edges() > 0
    elif name.endswith(".gexf"):
        assert nx.read_gexf(path).number_of_edges() > 0
    elif name.endswith(".png"):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    elif name.endswith(".pdf"):
        assert path.read_bytes()[:5] == b"%PDF-"
    elif name.endswith(".svg"):
        import xml.etree.ElementTree as ET

        assert ET.parse(path).getroot().tag.endswith("svg")
    elif name.endswith(".dot") and shutil.which("dot"):
        out = subprocess.run(["dot", "-Tsvg", str(path)], capture_output=True, text=True)
        assert out.returncode == 0 and "<svg" in out.stdout, out.stderr
    elif name.endswith(".tex") and shutil.which("pdflatex"):  # a tikzpicture, \input by a paper
        shutil.copy(path, tmp_path / "picture.tex")
        (tmp_path / "doc.tex").write_text(tikz_document(r"\input{picture.tex}", "The circuit."))
        out = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:]


def test_latex_and_graphviz_are_installed_where_the_suite_claims_them():
    """The two tests above skip their compile steps where the programs are missing; say so loudly."""
    missing = [p for p in ("dot", "pdflatex") if not shutil.which(p)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: apt-get install graphviz texlive-latex-base texlive-pictures")


@pytest.mark.parametrize("name", ORGANISMS)
def test_figures_draw_input_and_logits_and_route_edges_around_nodes(circuits, name):
    case, model, r, g = circuits[name]
    h = drawn(g)
    assert "input" in h and "logits" in h
    pos, routes = layout(h, model.cfg.n_layers)
    names = list(pos)
    for i, a in enumerate(names):  # boxes do not overlap
        for b in names[i + 1:]:
            assert abs(pos[a][0] - pos[b][0]) >= NODE_W or abs(pos[a][1] - pos[b][1]) >= NODE_H, (a, b)
    assert len(routes) == h.number_of_edges() > 0
    for (u, v), pts in routes.items():
        assert pts[0] == pos[u] and pts[-1] == pos[v]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            for t in np.linspace(0, 1, 41):
                x, y = x0 + t * (x1 - x0), y0 + t * (y1 - y0)
                for n, (nx_, ny) in pos.items():
                    if n in (u, v):
                        continue
                    inside = abs(x - nx_) < NODE_W / 2 and abs(y - ny) < NODE_H / 2
                    assert not inside, f"edge {u}->{v} passes through {n}"


def test_the_tex_export_is_a_picture_a_paper_inputs_with_its_caption(tmp_path):
    """The `.tex` export is a tikzpicture (no document around it, no title drawn in it) that a paper \\inputs in a
    figure; its opening comments say how and give the caption (the title, and the drawing's note). pdflatex compiles
    a paper that inputs it; the caption is under the picture and the title nowhere inside it."""
    g = read_circuit(Path(ROOT) / "circuits" / "decimal_organism.json")
    title = "the circuit: 81 edges"
    text = tikz(g, title)
    assert text.lstrip("% \n").startswith("A circuit drawn by surgeon")
    body = [x for x in text.splitlines() if not x.startswith("%")]
    assert body[0].startswith(r"\begin{tikzpicture}") and body[-1] == r"\end{tikzpicture}"
    assert "documentclass" not in "\n".join(body) and "81 edges" not in "\n".join(body)
    assert "% Caption (what the picture shows):" in text and "81 edges" in text
    if not shutil.which("pdflatex") or not shutil.which("pdftotext"):
        pytest.skip("needs pdflatex and pdftotext (apt-get install texlive-latex-base texlive-pictures poppler-utils)")
    (tmp_path / "circuit.tex").write_text(text)
    (tmp_path / "paper.tex").write_text(tikz_document(r"\input{circuit.tex}", tikz_caption(g, title), tikz_fit(g)))
    out = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "Overfull" not in out.stdout
    page = subprocess.run(["pdftotext", "-layout", "paper.pdf", "-"], cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout
    assert "Figure 1: The circuit: 81 edges." in " ".join(page.split())
    assert "L1H0" in page and "logits" in page
    assert page.index("logits") < page.index("Figure 1")  # the caption under the picture


def test_a_circuit_whose_input_keeps_no_edge_says_so_in_every_drawing(tmp_path):
    """The shipped decimal circuit keeps no edge from the input (its dead ends are not pruned under its ablation):
    the figure, the TikZ caption and the DOT label say so and why; a circuit with an
    input edge has no such note."""
    g = read_circuit(Path(ROOT) / "circuits" / "decimal_organism.json")
    h = drawn(g)
    assert h.out_degree("input") == 0
    assert h.graph["note"] == NO_INPUT_EDGE
    fig = figure(g, None)
    assert any("No edge from the input" in t.get_text() for t in fig.texts)
    assert "No edge from the input" in " ".join(tikz_caption(g).split())
    from surgeon.circuits.export import dot

    assert "No edge from the input" in dot(g)
    ind = read_circuit(Path(ROOT) / "circuits" / "induction_organism.json")
    assert drawn(ind).out_degree("input") > 0 and "note" not in drawn(ind).graph
    assert not any("No edge" in t.get_text() for t in figure(ind, None).texts)


def test_bad_export_targets_are_refused_before_any_work(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    (tmp_path / "d.png").mkdir()
    cases = [(tmp_path / "c.xyz", "cannot export"), (tmp_path / "d.png", "directory"),
             ([tmp_path / "a.png", tmp_path / "a.png"], "twice")]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append((ro / "c.png", "writable"))
    for target, words in cases:
        with pytest.raises(AnalysisError, match=words):
            check_targets(target if isinstance(target, list) else [target])
    # through the CLI: exit 2, no traceback, nothing written, before the model loads
    out = tmp_path / "out"
    r = surgeon_cli(["circuit", f"{ROOT}/cases/threshold_organism.py", "--out",
                        str(out), "--export", str(tmp_path / "ok.png"), str(tmp_path / "d.png")])
    assert r.returncode == 2 and "directory" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists() and not (tmp_path / "ok.png").exists()
    assert "torch" not in r.stderr


def test_circuit_eval_refuses_a_file_for_another_model_before_loading_it(decimal_model, tmp_path):
    """The file's cfg and edge names are checked against the case's model from its config alone: exit 2, one
    message naming the file and the field, no traceback, before the model loads (which the message's timing
    and the absence of any model output show)."""
    site, g, _, _ = _random_graph(decimal_model.cfg)
    p = tmp_path / "c.mib.json"
    write(g, p, decimal_model.cfg, semantics="kept")
    d = json.loads(p.read_text())
    d["cfg"]["n_layers"] = 5
    p.write_text(json.dumps(d))
    r = surgeon_cli(["circuit-eval", f"{ROOT}/cases/decimal_organism.py", str(p)])
    assert r.returncode == 2 and "cfg.n_layers" in r.stderr and str(p) in r.stderr and "Traceback" not in r.stderr


def test_an_export_format_is_a_registration(tmp_path):
    """A new circuit format is one `register_export` (no branch in `write`): the suffix is then accepted by the
    target check, listed in FORMATS' refusal, and written atomically by its writer; networkx reads the GML back. The
    longest registered suffix wins (".mib.json" over ".json")."""
    import surgeon.circuits.export as export

    g = read_circuit(Path(ROOT) / "circuits" / "induction_organism.json")
    with pytest.raises(AnalysisError, match="cannot export"):
        check_targets([tmp_path / "c.gml"])
    before = dict(export.EXPORTS)
    try:
        @export.register_export(".gml", "networkx.read_gml")
        def _gml(graph, tmp, cfg, title, semantics):
            nx.write_gml(export._clean(graph), tmp)

        check_targets([tmp_path / "c.gml"])
        write(g, tmp_path / "c.gml")
        back = nx.read_gml(tmp_path / "c.gml")
        assert len(back.edges) == len(g.edges) and not list(tmp_path.glob(".c.gml.*"))
    finally:
        export.EXPORTS.clear()
        export.EXPORTS.update(before)
    assert export.suffix(tmp_path / "c.mib.json") == ".mib.json" and export.suffix(tmp_path / "c.json") == ".json"
    assert [f.suffix for f in export.EXPORTS.values()] == list(FORMATS)
    assert all(f.reader for f in export.EXPORTS.values())
