"""Small SVG charts of the benchmarks' figures, written beside their data in bench/results/:
``line_chart`` (a line per series of (x, y) points) and ``bar_chart`` (grouped bars).

The same data gives the same bytes, so a chart changes in a diff only when its figures do
(``STYLE``, ``METADATA``). Drawn on the Agg canvas, without pyplot: no GUI backend is looked
for, and no figure is left behind in a global registry.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import matplotlib.style
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
from matplotlib.typing import RcKeyType

# 640 x 360 CSS px: SVG sizes are written in points (1/72 in), a browser shows 96 px per inch.
SIZE_IN = (640 / 96, 360 / 96)
STYLE: dict[RcKeyType, object] = {
    "svg.hashsalt": "tensorbits-charts",  # ids from this salt, not from random numbers
    "svg.fonttype": "none",  # <text> elements: smaller files, searchable, sharp at any zoom
    # DejaVu Sans ships with matplotlib: the same text extents on any machine (the viewer falls
    # back to its own sans-serif where it lacks it)
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9.0,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
}
# SVG metadata: no date (matplotlib writes the time of the call by default).
METADATA: dict[str, str | None] = {"Date": None}
# With this many distinct x values or fewer, the ticks go exactly at them (sizes, concurrencies).
MAX_DATA_TICKS = 12
# With more groups than this, a bar chart's group labels are slanted.
SLANT_GROUPS = 6
# The y axis of a bar chart with a legend: this much above the tallest bar.
LEGEND_ROOM = 1.18


@contextmanager
def _figure(title: str) -> Iterator[tuple[Figure, Axes]]:
    with matplotlib.style.context("default"), matplotlib.rc_context(STYLE):
        figure = Figure(figsize=SIZE_IN, layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        axes.set_title(title)
        yield figure, axes


def _save(figure: Figure, path: Path) -> None:
    # Rendered inside _figure's style (the salt and the font type are read at save time).
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", metadata=METADATA)
    path.write_bytes(buffer.getvalue())


def _number(value: float, _position: float | None = None) -> str:
    return f"{value:g}"


def line_chart(
    path: Path,
    *,
    title: str,
    x_label: str,
    y_label: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    log_x: bool = False,
    log_y: bool = False,
) -> None:
    """Write an SVG line chart to ``path``: one line with markers per series (label -> its
    (x, y) points, drawn in x order), in the mapping's order. A log axis is labelled with plain
    numbers (1, 16, 64, not 10^0); with few distinct x values, the x ticks are those values."""
    if not series or not any(series.values()):
        raise ValueError(f"{title}: no points to draw")
    points = [p for pts in series.values() for p in pts]
    if (log_x and any(x <= 0 for x, _ in points)) or (log_y and any(y <= 0 for _, y in points)):
        raise ValueError(f"{title}: a log axis needs values above 0")
    with _figure(title) as (figure, axes):
        for label, pts in series.items():
            ordered = sorted(pts)
            axes.plot([x for x, _ in ordered], [y for _, y in ordered], marker="o", label=label)
        if log_x:
            axes.set_xscale("log")
        if log_y:
            axes.set_yscale("log")
            axes.yaxis.set_major_formatter(FuncFormatter(_number))
        xs = sorted({x for x, _ in points})
        if len(xs) <= MAX_DATA_TICKS:
            axes.xaxis.set_major_locator(FixedLocator(xs))
            axes.xaxis.set_minor_locator(NullLocator())
            axes.xaxis.set_major_formatter(FuncFormatter(_number))
        elif log_x:
            axes.xaxis.set_major_formatter(FuncFormatter(_number))
        if not log_y:
            axes.set_ylim(bottom=0)
        axes.set_xlabel(x_label)
        axes.set_ylabel(y_label)
        if len(series) > 1:
            axes.legend()
        _save(figure, path)


def bar_chart(
    path: Path,
    *,
    title: str,
    y_label: str,
    groups: Mapping[str, Mapping[str, float]],
) -> None:
    """Write an SVG grouped bar chart to ``path``: ``groups`` maps a group's label (along the x
    axis) to its bars (series label -> value). Each series keeps one colour across the groups,
    in the order series first appear; a group without a series leaves that bar's place empty."""
    labels = list(dict.fromkeys(name for bars in groups.values() for name in bars))
    if not labels:
        raise ValueError(f"{title}: no bars to draw")
    width = 0.8 / len(labels)
    with _figure(title) as (figure, axes):
        for k, label in enumerate(labels):
            placed = [(g, bars[label]) for g, bars in enumerate(groups.values()) if label in bars]
            offset = (k - (len(labels) - 1) / 2) * width
            axes.bar([g + offset for g, _ in placed], [v for _, v in placed], width, label=label)
        # Many groups (operators): their labels slanted, so that long names do not overlap.
        slant = len(groups) > SLANT_GROUPS
        axes.set_xticks(
            range(len(groups)),
            list(groups),
            rotation=30 if slant else 0,
            ha="right" if slant else "center",
        )
        axes.grid(False, axis="x")
        axes.set_ylabel(y_label)
        if len(labels) > 1:
            # The legend in a row above the tallest bar (bars fill the width: "best" hides some).
            top = max(v for bars in groups.values() for v in bars.values())
            axes.set_ylim(0, top * LEGEND_ROOM)
            axes.legend(ncols=len(labels), loc="upper center")
        _save(figure, path)
