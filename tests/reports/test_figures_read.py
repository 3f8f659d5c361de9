"""Figures that read: in a real browser (headless Chromium) the report page's figures set no text under 6 pt (8 px at
the page's width), no two texts of a figure overlap and none is cut at its edge; matplotlib's renderer says the same
of every figure a report view draws, and no legend covers data. The checks themselves are tested on figures built to
fail them."""
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import surgeon  # noqa: E402
from surgeon.reports.legibility import MIN_POINTS, legends_over_data, place_legends, problems  # noqa: E402
from surgeon.show import view_of  # noqa: E402
from tests.browser import browser  # noqa: E402

SHIPPED = Path(__file__).resolve().parents[2] / "docs" / "report-decimal"

# each figure's texts as the page shows them: box, font size in CSS pixels (font-size x the SVG's scale on screen)
MEASURE = """
var out = [];
document.querySelectorAll('figure svg').forEach(function(svg) {
  var texts = [], frame = svg.getBoundingClientRect();
  svg.querySelectorAll('text').forEach(function(t) {
    var s = t.textContent.trim(); if (!s) return;
    var r = t.getBoundingClientRect(); if (r.width === 0 || r.height === 0) return;
    var m = t.getScreenCTM();
    texts.push({s: s, x0: r.left, y0: r.top, x1: r.right, y1: r.bottom,
                px: parseFloat(getComputedStyle(t).fontSize) * Math.sqrt(Math.abs(m.a * m.d - m.b * m.c))});
  });
  var cap = svg.closest('figure').querySelector('figcaption');
  out.push({caption: cap ? cap.textContent.slice(0, 60) : '', texts: texts,
            frame: [frame.left, frame.top, frame.right, frame.bottom]});
});
return out;
"""


@pytest.fixture(scope="module")
def shipped():
    """The shipped decimal report's results (every step, the attention and logit-attribution views included)."""
    return surgeon.load(SHIPPED)


def _overlaps(texts, slack=1.0):
    out = []
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if (min(a["x1"], b["x1"]) - max(a["x0"], b["x0"]) > slack
                    and min(a["y1"], b["y1"]) - max(a["y0"], b["y0"]) > slack):
                out.append((a["s"], b["s"]))
    return out


@pytest.mark.slow
def test_the_report_pages_figures_read_in_a_real_browser(shipped, tmp_path):
    from surgeon.reports.html import render

    page = tmp_path / "report.html"
    page.write_text(render(shipped), encoding="utf-8")
    b = browser(width=1300, height=1000)
    try:
        b.get(page.resolve().as_uri())
        time.sleep(0.5)
        figures = b.execute_script(MEASURE)
    finally:
        b.quit()
    assert len(figures) >= 12 and all(f["texts"] for f in figures)  # text kept as text on the page, so it is measured
    px = MIN_POINTS * 96 / 72
    for f in figures:
        small = [(t["s"], round(t["px"], 2)) for t in f["texts"] if t["px"] < px - 0.05]
        assert not small, (f["caption"], small)
        assert not _overlaps(f["texts"]), (f["caption"], _overlaps(f["texts"])[:5])
        x0, y0, x1, y1 = f["frame"]
        cut = [t["s"] for t in f["texts"] if t["x0"] < x0 - 1 or t["x1"] > x1 + 1 or t["y0"] < y0 - 1 or t["y1"] > y1 + 1]
        assert not cut, (f["caption"], cut)


def test_every_figure_of_the_shipped_report_reads(shipped):
    drawn = 0
    for step, result in shipped.steps.items():
        for name, draw in view_of(result).figures.items():
            fig = draw(result, None)
            assert problems(fig) == [], (step, name, problems(fig)[:5])
            drawn += 1
    assert drawn >= 12


def test_the_attention_figure_labels_the_keys_that_receive_attention(shipped):
    """Forty-odd tokens do not fit one label each: the labels kept are readable and include each panel's most attended
    key (not just every k-th position)."""
    r = shipped.steps["attention"]
    fig = view_of(r).figures["attention.png"](r, None)
    pairs = [(h, i) for h in r.heads for i in r.items]
    for ax, (h, i, fmt) in zip(fig.axes, [(h, i, f) for h, i in pairs for f in r.formats]):
        p = r.get(h, i, fmt)
        ticks = list(ax.get_xticks())
        assert 1 < len(ticks) < len(p.tokens)
        top = int(np.argmax(np.asarray(p.pattern)[:, 1:].sum(axis=0))) + 1  # the most attended key after the first
        assert any(abs(top - t) < 1 for t in ticks) or any(
            abs(top - t) < len(p.tokens) / len(ticks) for t in ticks), (h, i, fmt, top, ticks)
        assert all(t.get_fontsize() >= MIN_POINTS for t in ax.get_xticklabels())


def test_the_logit_attribution_heatmaps_share_one_colour_scale(shipped):
    r = shipped.steps["dla"]
    fig = view_of(r).figures["dla.png"](r, None)
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == len(r.formats)
    lim = max(float(np.nanmax(np.abs(f.heads[..., 0]))) for f in r.formats)
    assert all(np.isclose(im.get_clim(), (-lim, lim)).all() for im in images)


# the checks, on figures built to fail them

def test_the_check_sees_overlapping_small_and_cut_text():
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.text(0.5, 0.5, "first label", fontsize=8)
    ax.text(0.52, 0.5, "second label", fontsize=8)
    ax.text(0.1, 0.1, "tiny", fontsize=5)
    ax.text(0.9, 0.9, "runs off the right edge of the figure", fontsize=8)
    found = problems(fig)
    assert any("overlaps" in p and "first label" in p for p in found)
    assert any("'tiny' is set in 5.0 pt" in p for p in found)
    assert any("is cut at the figure's edge" in p for p in found)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.text(0.1, 0.5, "apart", fontsize=8)
    ax.text(0.6, 0.5, "apart too", fontsize=8)
    fig.tight_layout()
    assert problems(fig) == []
    plt.close(fig)


def test_a_legend_over_the_data_is_seen_and_moved_below_the_panel():
    fig, ax = plt.subplots(figsize=(3.25, 2.4))
    x = np.linspace(0, 1, 20)
    ax.plot(x, np.ones_like(x) * 0.95, label="a line along the top")
    ax.plot(x, x, label="a diagonal")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right")
    assert legends_over_data(fig)
    assert place_legends(fig)
    fig.tight_layout()
    assert legends_over_data(fig) == [] and problems(fig) == []
    leg, box = ax.get_legend(), ax.get_window_extent()
    assert leg.get_window_extent().y1 <= box.y0  # below the panel
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(3.25, 2.4))
    ax.plot(x, x * 0.2, label="low")
    ax.legend(loc="upper left")
    assert legends_over_data(fig) == [] and not place_legends(fig)  # a legend on empty ground stays
    plt.close(fig)


@pytest.mark.parametrize("which", ["threshold with and without each head", "attribution against exact"])
def test_figures_with_many_units_or_two_panels_read(which, decimal_model):
    """The threshold organism's 32 heads under the with/without bars (labels thinned to what fits), and the
    attribution heatmap beside its scatter against exact patching (a long axis label, a legend moved off the data)."""
    if which.startswith("threshold"):
        r = surgeon.threshold("threshold_organism", layer=0, budget=60)
        fig = view_of(r).figures["threshold.png"](r, None)
        assert 1 < len(fig.axes[1].get_xticks()) <= 32
    else:
        r = surgeon.attribute("decimal_organism", decimal_model, compare=True)
        fig = view_of(r).figures["attribution.png"](r, None)
    assert problems(fig) == []
