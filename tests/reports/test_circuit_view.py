"""The report's circuit view in a real browser (headless Chromium): on the threshold organism the page opens on the
circuit found, labelled, every k reachable; a click lands on the node clicked; the tooltip says each edge's numbers as
the result holds them; without JavaScript the same circuit is drawn at the same places. At 32 heads per layer (a
Llama-shaped checkpoint with grouped key/value heads) no node, port or label overlaps another, and a view of only
the nodes the shown edges touch opens by default."""
import time
from dataclasses import replace

import numpy as np
import pytest

import surgeon
from surgeon.analyses.pipeline import found_circuit
from surgeon.reports.circuit_view import circuit_data, edge_tip, k_label, layout, shown_nodes
from tests.browser import browser
from tests.conftest import ROOT, tiny_model

THRESHOLD = f"{ROOT}/cases/threshold_organism.py"

POSITIONS = """return Array.prototype.map.call(document.querySelectorAll('#circuit-svg g.node'), function(g){
  var c = g.querySelector('circle'); return [g.getAttribute('data-id'), +c.getAttribute('cx'), +c.getAttribute('cy')]; });"""

# for each drawn node: the node group found at the centre of its circle on screen (after scrolling it into view)
HITS = """var out = [];
Array.prototype.forEach.call(document.querySelectorAll('#circuit-svg g.node'), function(g){
  var c = g.querySelector('circle'); c.scrollIntoView({block: 'center', inline: 'center'});
  var r = c.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
  var hit = document.elementFromPoint(x, y), owner = hit && hit.closest('g.node');
  out.push([g.getAttribute('data-id'), owner ? owner.getAttribute('data-id') : null]); });
return out;"""


def _set_k(b, k):
    b.execute_script(f"var s = document.getElementById('k'); s.value = {k}; s.dispatchEvent(new Event('input'));")


def _shown(b):
    return len([e for e in b.find_elements("css selector", "#circuit-svg path.edge")
                if e.value_of_css_property("display") != "none"])


def _click_at_centre(b, node_id):
    """A real pointer click at the centre of the node's circle (not a dispatched event)."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    x, y = b.execute_script(
        "var c = document.querySelector('#circuit-svg g.node[data-id=\"' + arguments[0] + '\"] circle');"
        "c.scrollIntoView({block: 'center', inline: 'center'}); var r = c.getBoundingClientRect();"
        "return [r.left + r.width / 2, r.top + r.height / 2];", node_id)
    builder = ActionBuilder(b)
    builder.pointer_action.move_to_location(int(round(x)), int(round(y))).click()
    builder.perform()
    return b.execute_script("var g = document.querySelector('#circuit-svg g.node.on'); "
                            "return g ? g.getAttribute('data-id') : null;")


@pytest.fixture(scope="module")
def threshold_page(tmp_path_factory, threshold_model):
    out = tmp_path_factory.mktemp("report") / "threshold"
    rep = surgeon.report(THRESHOLD, threshold_model, out=out, steps=["circuit"], verify=20, paths=2)
    return out / "report.html", found_circuit(rep.steps["circuit"])


@pytest.mark.slow
def test_the_threshold_circuit_is_shown_and_clicks_land_on_the_node_clicked(threshold_page):
    page, c = threshold_page
    data = circuit_data(c)
    prefix = c.search.get("prefix", len(c.circuit))
    b = browser()
    try:
        b.get(page.resolve().as_uri())
        time.sleep(0.3)
        assert not [e for e in b.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
        label = b.find_element("id", "k-label").text
        # the page opens on the circuit found: its prefix of the ranking, marked, with f and its interval
        assert int(b.find_element("id", "k").get_attribute("value")) == prefix == data["circuit_k"]
        assert _shown(b) == prefix
        lo, hi = c.circuit_faithfulness_ci
        assert f"f = {c.circuit_faithfulness:.3f} [{lo:.3f}, {hi:.3f}] (the circuit: {len(c.circuit)} edges)" in label
        assert label.endswith(f", in-sample (the {c.n_items} items it was found on)")  # said, not only implied
        assert label == k_label(data, prefix)  # the script's label is the page's Python one
        # the edges drawn solid at the circuit's k are exactly the circuit's (dashed: in the prefix, not the circuit)
        solid = b.execute_script("return Array.prototype.filter.call(document.querySelectorAll('#circuit-svg path.edge'),"
                                 " function(p){ return p.style.display !== 'none' && !p.getAttribute('stroke-dasharray'); })"
                                 ".map(function(p){ return +p.getAttribute('data-rank') - 1; });")
        order = np.argsort(-np.abs(np.asarray(c.scores, float)), kind="stable")
        assert sorted(int(order[i]) for i in solid) == sorted(c.circuit)
        # every k is reachable
        for k in (0, 1, prefix - 1, prefix + 1, len(data["edges"])):
            _set_k(b, k)
            assert _shown(b) == k
        _set_k(b, prefix)
        # each node's circle centre is that node's (no node or port covers another), and a real click there selects it
        hits = b.execute_script(HITS)
        assert {a for a, _ in hits} == shown_nodes(data, prefix, data["touched"])
        assert all(a == h for a, h in hits), [x for x in hits if x[0] != x[1]]
        b.execute_script("var t = document.getElementById('touched'); t.checked = false;"
                         "t.dispatchEvent(new Event('change'));")
        hits = b.execute_script(HITS)
        assert len(hits) == len(data["nodes"]) and all(a == h for a, h in hits), [x for x in hits if x[0] != x[1]]
        for node in ("a0.h4<q>", "a0.h4<k>", "a0.h4<v>", "a0.h5<q>", "a0.h4", "logits"):
            assert _click_at_centre(b, node) == node
            _click_at_centre(b, node)  # click again: cleared
        # the tooltip says each shown edge's numbers as the result holds them (the same words as the static titles)
        for i in range(min(prefix, 12)):
            b.execute_script("var p = document.querySelector('#circuit-svg path.edge[data-rank=\"" + str(i + 1) + "\"]');"
                             "p.dispatchEvent(new MouseEvent('mousemove', {clientX: 50, clientY: 50}));")
            tip = b.find_element("id", "tip")
            assert tip.is_displayed()
            text = b.execute_script("return document.getElementById('tip').textContent;")
            assert text == edge_tip(data, i, data["edges"][i])
            e = int(order[i])
            if e in c.exact:
                lo, hi = c.exact_ci[e]
                assert f"exact {c.exact[e]:+.4f} [{lo:+.4f}, {hi:+.4f}], " in text
                assert f"{100 * c.exact[e] / (c.full - c.empty):.1f}% of the gap" in text
        b.execute_script("var t = document.getElementById('touched'); t.checked = true;"
                         "t.dispatchEvent(new Event('change'));")
        js_positions = {n: (x, y) for n, x, y in b.execute_script(POSITIONS)}
    finally:
        b.quit()
    # without scripts: the same circuit at the same places, its label said
    b = browser(javascript=False)
    try:
        b.get(page.resolve().as_uri())
        circles = b.find_elements("css selector", "#circuit-svg g.node")
        static = {g.get_attribute("data-id"): (float(g.find_element("css selector", "circle").get_attribute("cx")),
                                               float(g.find_element("css selector", "circle").get_attribute("cy")))
                  for g in circles}
        assert len(b.find_elements("css selector", "#circuit-svg path.edge")) == prefix
        assert "(the circuit:" in b.find_element("id", "k-label").text
        assert not b.find_element("id", "k").is_displayed()  # no slider that cannot move
    finally:
        b.quit()
    assert static.keys() == js_positions.keys()
    for n in static:
        assert np.allclose(static[n], js_positions[n], atol=0.11), n


@pytest.fixture(scope="module")
def wide_page(tmp_path_factory, charset):
    """A Llama-shaped random checkpoint with 32 query heads per layer sharing 8 key/value heads."""
    model = tiny_model(charset, n_layers=2, d_model=64, n_heads=32, d_head=2, n_key_value_heads=8,
                       normalization_type="RMS", positional_embedding_type="rotary", act_fn="silu", gated_mlp=True,
                       rotary_dim=2)
    case = replace(surgeon.load_case("decimal_organism", check_model=False), model=None)
    case = replace(case, items=case.items[:24])
    out = tmp_path_factory.mktemp("report") / "wide"
    rep = surgeon.report(case, model, out=out, steps=["circuit"], verify=5, paths=0)
    return out / "report.html", found_circuit(rep.steps["circuit"])


@pytest.mark.slow
def test_32_heads_per_layer_are_readable_and_clickable(wide_page):
    page, c = wide_page
    data = circuit_data(c)
    assert data["touched"]  # many heads: the view opens on the nodes the circuit touches
    b = browser()
    try:
        b.get(page.resolve().as_uri())
        time.sleep(0.3)
        k = data["circuit_k"]
        drawn = {g.get_attribute("data-id") for g in b.find_elements("css selector", "#circuit-svg g.node")}
        assert drawn == shown_nodes(data, k, True) and len(drawn) < len(data["nodes"])
        # every node of the model, with every label: none covers another
        b.execute_script("var t = document.getElementById('touched'); t.checked = false;"
                         "t.dispatchEvent(new Event('change'));")
        hits = b.execute_script(HITS)
        assert len(hits) == len(data["nodes"]) and all(a == h for a, h in hits), [x for x in hits if x[0] != x[1]]
        boxes = b.execute_script("return Array.prototype.map.call(document.querySelectorAll('#circuit-svg g.node text'),"
                                 " function(t){ var r = t.getBBox(); return [r.x, r.y, r.width, r.height]; });")
        assert len(boxes) == sum(1 for n in data["nodes"] if n["label"])
        for i, (x, y, w, h) in enumerate(boxes):
            for x2, y2, w2, h2 in boxes[i + 1:]:
                assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y, (x, y, x2, y2)
        # the issue's case: L0H24's q port, and its group's k and v ports, each selected by a click on it
        for node in ("a0.h24<q>", "a0.g6<k>", "a0.g6<v>", "a0.h23", "a1.h31<q>"):
            assert _click_at_centre(b, node) == node
            _click_at_centre(b, node)
    finally:
        b.quit()
    # the script's placement is the module's
    pos, _ = layout(data, shown_nodes(data, data["circuit_k"], False))
    assert len(pos) == len(data["nodes"])


def test_sink_heads_are_marked_in_the_circuit_view(tmp_path):
    """The report's sinks step marks the circuit's sink heads: a ring in the static SVG and in the script's drawing,
    their attention on the first token in the tooltip, and a line of the hint; heads that are not sinks are not."""
    from pathlib import Path

    from surgeon.reports.circuit_view import view
    from surgeon.reports.html import CSS, JS

    rep = surgeon.load(Path(ROOT) / "docs" / "report-decimal")
    c = found_circuit(rep.steps["circuit"])
    data = circuit_data(c)
    heads = sorted({(n["layer"], n["order"]) for n in data["nodes"] if n["kind"] == "head"})
    marked = heads[0]
    html_ = view(c, {marked: 0.812})
    assert html_.count("class='node sink'") == 1 and "0.812 of its attention on the first token" in html_
    assert "ringed heads are sink heads" in html_ and "ringed heads" not in view(c)
    page = tmp_path / "v.html"
    page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'><style>{CSS}</style></head><body>{html_}"
                    f"<script>{JS}</script></body></html>")
    b = browser()
    try:
        b.get(page.resolve().as_uri())
        time.sleep(0.4)
        rings = b.find_elements("css selector", "#circuit-svg g.node.sink")
        assert len(rings) == 1  # drawn again by the script, still marked
        assert rings[0].find_element("css selector", "circle").value_of_css_property("stroke-width") == "3px"
    finally:
        b.quit()
