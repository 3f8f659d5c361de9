"""Whether a figure reads, measured on the figure as laid out (matplotlib's own renderer): no drawn text smaller than
`MIN_POINTS`, no two drawn texts overlapping, none cut at the figure's edge, and no legend covering the data.

`problems(fig)` says what is wrong in words (an empty list: nothing); `place_legends(fig)` moves a legend that covers
data below its panel. The browser test measures the same on the page's SVG (tests/reports/test_figures_read.py)."""
from __future__ import annotations

import numpy as np

# the smallest type a figure may set, in points at its printed width (journals ask for 5-7 pt; 6 pt is 8 px on a
# screen at 96 px per inch, where the page shows the figure at that width)
MIN_POINTS = 6.0
_SLACK = 1.0  # points: boxes touching within this are not counted as overlapping (glyph boxes have side bearings)


def layout_renderer(fig):
    """Lay `fig` out as a draw would (on an Agg canvas where it has none: a closed figure), painting nothing, and return
    the renderer that measured it: every artist's draw runs (tick labels placed, a legend's best place found, text
    measured), only the rasterizing is skipped, so extents read from it are those of a painted draw."""
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()



def _drawn_texts(fig):
    """The texts a draw of `fig` actually paints (visible, not empty; ticks outside the view are not drawn), with the
    renderer that drew them."""
    from matplotlib.text import Text

    seen, ids = [], set()
    draw = Text.draw

    def recording(self, renderer):
        if self.get_visible() and self.get_text().strip() and id(self) not in ids:
            ids.add(id(self))
            seen.append(self)
        return draw(self, renderer)

    Text.draw = recording
    try:
        renderer = layout_renderer(fig)
    finally:
        Text.draw = draw
    return seen, renderer


def _overlap(a, b, slack: float) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > slack and min(a.y1, b.y1) - max(a.y0, b.y0) > slack


def _data_points(ax, renderer) -> np.ndarray:
    """Display coordinates of what an axes draws as data: line vertices (segments sampled every few pixels), scatter
    and error-bar collections, bars' corners and centres; only what lies inside the axes."""
    from matplotlib.collections import LineCollection, PathCollection
    from matplotlib.patches import Rectangle

    pts = []

    def segments(xy):
        xy = xy[np.all(np.isfinite(xy), axis=1)]
        for a, b in zip(xy[:-1], xy[1:]):
            n = max(2, int(np.hypot(*(b - a)) / 3))
            pts.append(a + np.linspace(0, 1, n)[:, None] * (b - a))
        if len(xy):
            pts.append(xy)

    for line in ax.get_lines():
        if not line.get_visible():
            continue
        xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float))
        if line.get_linestyle() not in ("None", "", " ") and len(xy) > 1:
            segments(xy)
        else:
            pts.append(xy)
    for c in ax.collections:
        if not c.get_visible():
            continue
        if isinstance(c, LineCollection):
            for seg in c.get_segments():
                segments(c.get_transform().transform(np.asarray(seg, dtype=float)))
        elif isinstance(c, PathCollection) and len(c.get_offsets()):
            pts.append(c.get_offset_transform().transform(np.asarray(c.get_offsets(), dtype=float)))
    for p in ax.patches:
        if isinstance(p, Rectangle) and p.get_visible() and p.get_width() and p.get_height():
            e = p.get_window_extent(renderer)
            xs, ys = np.linspace(e.x0, e.x1, 5), np.linspace(e.y0, e.y1, 5)
            pts.append(np.array([(x, y) for x in xs for y in ys]))
    if not pts:
        return np.zeros((0, 2))
    xy = np.concatenate(pts)
    box = ax.get_window_extent(renderer)
    inside = (xy[:, 0] >= box.x0) & (xy[:, 0] <= box.x1) & (xy[:, 1] >= box.y0) & (xy[:, 1] <= box.y1)
    return xy[inside]


def legends_over_data(fig) -> list[str]:
    """Each panel whose legend covers a point of its data, named by its title (or its number)."""
    renderer = layout_renderer(fig)
    out = []
    for i, ax in enumerate(fig.axes):
        leg = ax.get_legend()
        if leg is not None and leg.get_visible() and _covers(ax, leg, renderer):
            out.append(f"the legend of panel {i + 1} ({ax.get_title() or 'untitled'!r}) covers its data")
    return out


def problems(fig) -> list[str]:
    """What keeps `fig` from reading, each in words: type under `MIN_POINTS`, two texts overlapping, a text cut at the
    figure's edge, a legend over the data. Empty: it reads."""
    texts, renderer = _drawn_texts(fig)
    scale = 72.0 / fig.dpi  # display pixels -> points
    canvas = fig.bbox
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    out = []
    for t, _ in boxes:
        if t.get_fontsize() < MIN_POINTS - 1e-6:
            out.append(f"{t.get_text()!r} is set in {t.get_fontsize():.1f} pt, under {MIN_POINTS:g} pt")
    for t, e in boxes:
        if e.x0 < canvas.x0 - 0.5 or e.y0 < canvas.y0 - 0.5 or e.x1 > canvas.x1 + 0.5 or e.y1 > canvas.y1 + 0.5:
            out.append(f"{t.get_text()!r} is cut at the figure's edge")
    slack = _SLACK / scale
    for i, (t, e) in enumerate(boxes):
        for u, f in boxes[i + 1:]:
            if _overlap(e, f, slack):
                out.append(f"{t.get_text()!r} overlaps {u.get_text()!r}")
    return out + legends_over_data(fig)


def _below(ax, leg, renderer, fig) -> None:
    """Put legend `leg` under `ax`'s tick labels and axis label, in as many columns as fit the panel's width."""
    handles, labels = leg.legend_handles, [t.get_text() for t in leg.get_texts()]
    size = leg.get_texts()[0].get_fontsize() if leg.get_texts() else MIN_POINTS
    box = ax.get_window_extent(renderer)
    widest = max((t.get_window_extent(renderer).width for t in leg.get_texts()), default=0) + 3 * size * fig.dpi / 72
    ncol = max(1, min(len(labels), int(box.width // max(widest, 1))))
    old = ax.get_legend()
    old.set_visible(False)  # out of the tight box measured next
    tight = ax.get_tightbbox(renderer, for_layout_only=True)
    old.set_visible(True)
    below = (tight.y0 - box.y0) / box.height - 0.02
    ax.legend(handles, labels, fontsize=size, loc="upper center", bbox_to_anchor=(0.5, below), ncol=ncol,
              frameon=False)


def place_legends(fig, layout=None) -> bool:
    """Move each legend that covers its panel's data below the panel (under its tick labels and axis label), in as
    many columns as fit; `layout` (e.g. `fig.tight_layout`), where given, is run after the move and the legends
    re-anchored to the panels' new sizes until they hold still. Whether one moved."""
    renderer = layout_renderer(fig)
    moved = [ax for ax in fig.axes if ax.get_legend() is not None and _covers(ax, ax.get_legend(), renderer)]
    for ax in moved:
        _below(ax, ax.get_legend(), renderer, fig)
    for _ in range(3 if moved and layout is not None else 0):
        layout()
        renderer = layout_renderer(fig)
        for ax in moved:
            _below(ax, ax.get_legend(), renderer, fig)
    if moved and layout is not None:
        layout()
    return bool(moved)


def _covers(ax, leg, renderer) -> bool:
    """Whether legend `leg` covers a point of `ax`'s data."""
    e = leg.get_window_extent(renderer)
    xy = _data_points(ax, renderer)
    return bool(len(xy)) and bool(np.any((xy[:, 0] > e.x0) & (xy[:, 0] < e.x1) & (xy[:, 1] > e.y0) & (xy[:, 1] < e.y1)))
