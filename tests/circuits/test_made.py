"""Every circuit export says how the circuit was found (method, ablation and the prompts it acts on, semantics,
formats, items), and `circuit-eval` evaluates a file under what it says unless told otherwise, saying so."""
import json
import shutil
import subprocess

import networkx as nx
import pytest

import surgeon
import surgeon.api
from surgeon.analyses.circuit import discover
from surgeon.circuits.export import FORMATS, read_circuit
from surgeon.cli import main
from surgeon.errors import AnalysisError


@pytest.fixture(scope="module")
def mean_circuit(decimal_model):
    case = surgeon.api.read("decimal_organism")
    return case, discover(case, decimal_model, ablation="mean", bad="chat", n_paths=0, verify=0, n_edges=30)


@pytest.mark.slow
def test_every_export_records_how_the_circuit_was_found(mean_circuit, tmp_path):
    case, r = mean_circuit
    files = [tmp_path / f"c{ext}" for ext in FORMATS]
    r.export(*files)
    want = {"method": r.method, "ablation": "mean", "semantics": "kept", "direction": "denoise",
            "failing_format": "chat", "good_format": "plain", "prompts_run": "plain", "case": "decimal_organism",
            "n_items": r.n_items, "tag": r.tag, "metric": "logprob"}
    for ext in (".json", ".mib.json"):
        made = json.loads((tmp_path / f"c{ext}").read_text())["made"]
        assert {k: made[k] for k in want} == want, (ext, made)
        assert "mean over the 'plain' items" in made["ablated_values"] and made["tool"].startswith("surgeon ")
        assert read_circuit(tmp_path / f"c{ext}").made["ablation"] == "mean"
    g = nx.read_graphml(tmp_path / "c.graphml")
    assert g.graph["made_ablation"] == "mean" and g.graph["made_failing_format"] == "chat", g.graph
    import xml.etree.ElementTree as ET

    ns = {"g": "http://www.gexf.net/1.2draft"}
    desc = ET.parse(tmp_path / "c.gexf").getroot().find("g:meta/g:description", ns)
    assert desc is not None and "ablation=mean" in desc.text and "failing_format=chat" in desc.text
    assert len(nx.read_gexf(tmp_path / "c.gexf").edges) == len(r.graph().edges)  # networkx still reads it
    dot = (tmp_path / "c.dot").read_text()
    assert dot.startswith("// made: ") and "ablation=mean" in dot.splitlines()[0]
    if shutil.which("dot"):  # Graphviz reads the comment as a comment
        p = subprocess.run(["dot", "-Tsvg", str(tmp_path / "c.dot")], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    assert "\n% made: " in (tmp_path / "c.tex").read_text()
    assert "ablation=mean" in (tmp_path / "c.svg").read_text()
    assert b"ablation=mean" in (tmp_path / "c.pdf").read_bytes()


@pytest.mark.slow
def test_circuit_eval_uses_what_the_file_says_and_says_what_differs(mean_circuit, decimal_model, tmp_path):
    case, r = mean_circuit
    r.export(tmp_path / "c.json", tmp_path / "c.mib.json")
    for f in ("c.json", "c.mib.json"):
        got = surgeon.circuit_eval(case, tmp_path / f, decimal_model)
        assert got["ablation"] == "mean" and got["failing_format"] == "chat" and got["notes"] == []
        assert got["faithfulness"] == pytest.approx(r.circuit_faithfulness, abs=1e-5)
    asked = surgeon.circuit_eval(case, tmp_path / "c.json", decimal_model, ablation="resample", bad="qa")
    assert asked["ablation"] == "resample" and asked["failing_format"] == "qa"
    assert any("found under ablation 'mean'" in n for n in asked["notes"])
    assert any("failing format 'chat'" in n and "'qa'" in n for n in asked["notes"])
    assert asked["faithfulness"] != pytest.approx(r.circuit_faithfulness, abs=1e-3)
    # an EAP-IG file records nothing: the defaults are used and said
    d = json.loads((tmp_path / "c.mib.json").read_text())
    del d["made"]
    (tmp_path / "bare.json").write_text(json.dumps(d))
    bare = surgeon.circuit_eval(case, tmp_path / "bare.json", decimal_model)
    assert bare["ablation"] == "resample" and any("does not record its ablation" in n for n in bare["notes"])


@pytest.mark.slow
def test_the_command_line_prints_the_record_and_the_notes(mean_circuit, tmp_path, capsys):
    from surgeon.cli import main

    case, r = mean_circuit
    r.export(tmp_path / "c.json")
    assert main(["circuit-eval", "decimal_organism", str(tmp_path / "c.json"), "--ablation", "zero"]) == 0
    out = capsys.readouterr().out
    assert "found by " in out and "mean ablation" in out and "note: the circuit was found under ablation 'mean'" in out
    assert "(zero ablation," in out


def test_a_feature_circuit_file_is_named_for_what_it_is(tmp_path, decimal_model):
    from surgeon.circuits.graph import CircuitGraph
    from surgeon.circuits.export import write

    g = CircuitGraph(n_layers=3, cfg=None, semantics="feature nodes, kept (denoise: ...)")
    g.add_node("blocks.0.hook_mlp_out[3]", kind="feature", layer=0, label="L0 f3", in_circuit=True)
    write(g, tmp_path / "f.json")
    (tmp_path / "results.json").write_text(json.dumps({"command": "feature-circuit", "result": {"nodes": [],
                                                                                                "directions": {}}}))
    assert {n for n, d in read_circuit(tmp_path / "f.json").nodes(data=True) if d["in_circuit"]} == set(g.nodes)
    for f in ("f.json", "results.json"):  # read back as what it is; refused where edges are needed
        with pytest.raises(AnalysisError) as e:
            read_circuit(tmp_path / f, edges_only=True)
        assert "this is a feature circuit" in e.value.message and "feature-circuit" in e.value.fix
        with pytest.raises(AnalysisError, match="this is a feature circuit"):
            surgeon.circuit_eval("decimal_organism", tmp_path / f, decimal_model)
        assert main(["circuit-eval", "decimal_organism", str(tmp_path / f)]) == 2


@pytest.mark.parametrize("direction", ["denoise", "noise"])
def test_the_record_names_the_runs_the_numbers_come_from_under_resample(decimal_model, direction):
    """Resample ablation (the default), kept semantics: the run the record says is run is the one whose clean score is
    the circuit's 'full' end, and the run whose outputs it says the ablated senders carry is the one whose clean score
    is its 'empty' end (every edge ablated), from each format's clean scores computed apart."""
    from surgeon.analyses.circuit_runs import circuit_runs
    from surgeon.case.encoding import format_rows
    from surgeon.engine.readout import score_rows
    from surgeon.sites.edges import EdgeSite

    case = surgeon.api.read("decimal_organism")
    r = discover(case, decimal_model, bad="chat", direction=direction, n_paths=0, verify=0, n_edges=10)
    made = r.made()
    assert made["ablation"] == "resample"
    items = case.items_for(case.focus)
    clean = {f: float(score_rows(decimal_model, format_rows(case, decimal_model, f, items)).mean())
             for f in ("plain", "chat")}
    runs = circuit_runs(case, decimal_model, EdgeSite.of(decimal_model.cfg), semantics="kept", direction=direction,
                        bad="chat")
    run, other = made["prompts_run"], ({"plain", "chat"} - {made["prompts_run"]}).pop()
    assert float(runs.full.mean()) == pytest.approx(clean[run], abs=1e-3)
    assert float(runs.empty.mean()) == pytest.approx(clean[other], abs=1e-3)
    assert made["ablated_values"] == f"the {other!r} run's sender outputs at the aligned positions"
    assert run == ("plain" if direction == "denoise" else "chat")
