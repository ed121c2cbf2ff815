"""bench/harness/charts.py, the SVG charts committed beside the benchmarks' results: the same
data gives the same bytes (a chart changes in a diff only when its figures do), no date is
written, the text stays text, and what is asked for is drawn."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # bench.harness lives at the repository root, not in a distribution

from bench.harness.charts import bar_chart, line_chart  # noqa: E402
from bench.ops import Row, kind, read_rows, write_results  # noqa: E402
from tensorbits_protocol.dtypes import DataType  # noqa: E402

SERIES = {
    "tensorbits HTTP": [(1.0, 410.0), (4.0, 1210.5), (16.0, 2300.25), (64.0, 2410.0)],
    "Triton HTTP": [(64.0, 2105.0), (1.0, 380.0), (16.0, 1990.0), (4.0, 1100.0)],
}
GROUPS = {
    "BIT_AND": {"ours": 9.8, "numpy": 9.1, "copy": 11.0},
    "BIT_NOT": {"ours": 7.5, "copy": 11.0},
}
# A year, a W3C date or an ISO time, as matplotlib would write the time of the call.
DATE = re.compile(rb"(19|20)\d\d-\d\d-\d\d|<dc:date>|\d\d:\d\d:\d\d")


def draw_line(path: Path, *, log_y: bool = False) -> bytes:
    line_chart(
        path,
        title="Throughput against concurrency",
        x_label="concurrent requests",
        y_label="requests/s",
        series=SERIES,
        log_x=True,
        log_y=log_y,
    )
    return path.read_bytes()


def draw_bars(path: Path) -> bytes:
    bar_chart(path, title="Operator bandwidth, 16 MiB", y_label="GB/s", groups=GROUPS)
    return path.read_bytes()


def test_line_chart_is_the_same_bytes_twice_and_undated(tmp_path: Path) -> None:
    first = draw_line(tmp_path / "a.svg")
    second = draw_line(tmp_path / "b.svg")
    assert first == second
    assert first.startswith(b"<?xml")
    assert b"<svg" in first
    assert DATE.search(first) is None


def test_bar_chart_is_the_same_bytes_twice_and_undated(tmp_path: Path) -> None:
    first = draw_bars(tmp_path / "a.svg")
    assert draw_bars(tmp_path / "b.svg") == first
    assert DATE.search(first) is None


def test_line_chart_keeps_its_words_and_ticks_as_text(tmp_path: Path) -> None:
    svg = draw_line(tmp_path / "chart.svg").decode()
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    for words in (
        "Throughput against concurrency",
        "concurrent requests",
        "requests/s",
        "tensorbits HTTP",
        "Triton HTTP",
    ):
        assert words in texts
    # With a few distinct x values on a log axis, the ticks are those values, in plain numbers.
    assert {"1", "4", "16", "64"} <= set(texts)
    # 640 x 360 CSS px, written in points.
    assert 'width="480pt" height="270pt"' in svg


def test_bar_chart_draws_one_bar_per_value_and_names_the_groups(tmp_path: Path) -> None:
    svg = draw_bars(tmp_path / "bars.svg").decode()
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert {"BIT_AND", "BIT_NOT", "ours", "numpy", "copy", "GB/s"} <= set(texts)
    # The axes draw their background, then the bars, then the axis lines: one bar per value
    # (5; BIT_NOT has no numpy bar).
    before_axis = svg.split('<g id="axes_1">')[1].split('<g id="matplotlib.axis_1">')[0]
    assert len(re.findall(r'<g id="patch_\d+">', before_axis)) == 1 + 5


def test_different_figures_give_different_bytes(tmp_path: Path) -> None:
    assert draw_line(tmp_path / "linear.svg") != draw_line(tmp_path / "log.svg", log_y=True)


def test_charts_refuse_what_they_cannot_draw(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no points"):
        line_chart(tmp_path / "e.svg", title="empty", x_label="x", y_label="y", series={})
    with pytest.raises(ValueError, match="log axis"):
        line_chart(
            tmp_path / "z.svg",
            title="zero",
            x_label="x",
            y_label="y",
            series={"s": [(0.0, 1.0)]},
            log_x=True,
        )
    with pytest.raises(ValueError, match="no bars"):
        bar_chart(tmp_path / "n.svg", title="none", y_label="y", groups={"g": {}})
    assert not list(tmp_path.iterdir())


def cpu_row(label: str, datatype: DataType, mib: int, ours: float, cores: float = 1.9) -> Row:
    return Row(
        label=label,
        datatype=datatype,
        mib=mib,
        ours=ours,
        copy=12.345678,
        rounds=7,
        numpy=ours / 1.5,
        cores=cores,
    )


def test_cpu_results_round_trip_and_replot_gives_the_same_chart(tmp_path: Path) -> None:
    rows = [
        cpu_row("DML_OPERATOR_ELEMENT_WISE_BIT_AND", DataType.UINT8, 1, 9.87654),
        cpu_row("DML_OPERATOR_ELEMENT_WISE_BIT_AND", DataType.UINT8, 16, 18.5),
        cpu_row("onnx.BitShift-11 LEFT", DataType.UINT8, 16, 9.25, cores=1.1),  # busy
        cpu_row("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT ->UINT32", DataType.UINT16, 16, 6.0),
    ]
    data, chart = write_results(rows, tmp_path, machine="test", command="bench/ops.py", seconds=3)
    read = read_rows(data)
    assert [(r.label, r.datatype, r.mib) for r in read] == [
        (r.label, r.datatype, r.mib) for r in rows
    ]
    assert [r.ours for r in read] == [9.88, 18.5, 9.25, 6.0]  # rounded to 0.01 GB/s
    assert [r.busy for r in read] == [False, False, True, False]
    drawn = chart.read_bytes()
    svg = drawn.decode()
    # The chart shows 16 MiB (the 1 MiB row is left out), one group per kind, the busy row said.
    for words in ("AND/OR/XOR/NOT (1)", "shift 8-bit (1)", "count 16/32-bit -&gt;UINT32 (1)"):
        assert words in svg
    assert "16 MiB" in svg
    assert "1 of 3 rows measured while another process held a core" in svg
    # --replot draws from the file alone: the same bytes as the run that wrote it.
    write_results(read, tmp_path, machine="test", command="bench/ops.py", seconds=3)
    assert chart.read_bytes() == drawn


def test_kinds_follow_the_element_width_where_the_cpu_differs() -> None:
    assert kind("onnx.BitwiseXor-18", DataType.INT64) == "AND/OR/XOR/NOT"
    assert kind("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT", DataType.UINT8) == "shift 8-bit"
    assert kind("onnx.BitShift-11 RIGHT", DataType.UINT32) == "shift 16-64-bit"
    count = "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT ->UINT8"
    assert kind(count, DataType.INT64) == "count 8/64-bit ->UINT8"
    assert kind(count, DataType.INT16) == "count 16/32-bit ->UINT8"
