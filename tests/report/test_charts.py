"""The report's SVG charts, parsed back as XML: one mark per drawn row, caps said out loud, names escaped."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from xstack.analyze.result import Chart, Column, Result, format_value
from xstack.report._charts import render_chart
from xstack.report._charts_xy import roofs
from xstack.report._svg import TICK_CHAR, Scale, clip_label, clip_labels

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert(1)</script> & \"q\" 'a' </svg>"


def parse(figure: str) -> tuple[ET.Element, str]:
    """The chart's ``<svg>`` element (which must be well-formed XML) and its caption text."""
    svg = re.search(r"<svg.*</svg>", figure, re.S)
    assert svg, figure[:300]
    caption = re.search(r"<figcaption>(.*?)</figcaption>", figure, re.S)
    return ET.fromstring(svg[0]), caption[1] if caption else ""


def marks(svg: ET.Element) -> list[ET.Element]:
    return [e for e in svg.iter() if "mark" in (e.get("class") or "").split()]


def result(kind: str, rows: list[tuple[Any, ...]], columns: list[Column], x: str, y: tuple[str, ...],
           **chart: Any) -> Result:  # fmt: skip
    return Result("T1", "test", columns, rows, chart=Chart(kind, x, y, **chart))


NAMED = [Column("name"), Column("total", "ns"), Column("other", "ns")]


@pytest.mark.parametrize("kind", ["bar", "hbar", "stacked"])
def test_one_mark_per_row_and_value_with_names_escaped(kind: str) -> None:
    rows = [(HOSTILE if i == 3 else f"kernel_{i}", 1000 * (i + 1), 10 * i) for i in range(12)]
    svg, caption = parse(render_chart(result(kind, rows, NAMED, "name", ("total", "other"))))
    drawn = marks(svg)
    positive = sum(1 for r in rows for v in r[1:] if v > 0)  # a zero has no extent: stacked charts skip it
    assert len(drawn) == (positive if kind == "stacked" else 2 * len(rows))
    tips = [e.findtext(f"{SVG}title") or "" for e in drawn]
    assert any(HOSTILE in t for t in tips)  # the exact name, as text, after XML parsing
    assert caption == ""
    heights = [float(e.get("width" if kind != "bar" else "height") or 0) for e in drawn]
    assert all(h >= 0 and math.isfinite(h) for h in heights)


def test_bar_lengths_are_proportional_to_values() -> None:
    rows = [(f"k{i}", v, 0) for i, v in enumerate([100, 250, 400, 1000])]
    svg, _ = parse(render_chart(result("hbar", rows, NAMED, "name", ("total",))))
    widths = [float(e.get("width") or 0) for e in marks(svg)]
    for (_, v, _), w in zip(rows, widths, strict=True):
        assert w / widths[-1] == pytest.approx(v / 1000, abs=0.01)


def test_limit_and_caps_are_said() -> None:
    rows = [(f"k{i}", 5000 - i, 0) for i in range(500)]
    svg, caption = parse(render_chart(result("hbar", rows, NAMED, "name", ("total",), limit=25)))
    assert len(marks(svg)) == 25 and "first 25 of 500 rows" in caption
    svg, caption = parse(render_chart(result("hbar", rows, NAMED, "name", ("total",))))
    assert len(marks(svg)) == 40 and "first 40 of 500" in caption  # hbar's own cap
    big = result("stacked", rows, NAMED, "name", ("total", "other"), limit=300)
    svg, caption = parse(render_chart(big))
    assert len(marks(svg)) == 300 and "one label in" in caption  # past 40 rows: vertical columns


def test_filter_column_selects_rows() -> None:
    cols = [Column("path"), Column("latency", "ns"), Column("leaf")]
    rows = [(f"m.l{i}", 100 + i, i % 3 == 0) for i in range(30)]
    chart = {"extra": {"filter": "leaf"}}
    svg, caption = parse(render_chart(result("bar", rows, cols, "path", ("latency",), **chart)))
    assert len(marks(svg)) == 10 and "10 of 30" in caption


def test_scatter_caps_points_and_says_so() -> None:
    cols = [Column("kernel"), Column("AI", "flop/byte"), Column("FLOP/s", "flop/s"), Column("bound")]
    rows = [(f"k{i}", 0.1 * (i + 1), 1e9 * (i + 1), "memory" if i % 2 else "compute") for i in range(12_000)]
    svg, caption = parse(render_chart(result("scatter", rows, cols, "AI", ("FLOP/s",), series="bound")))
    assert len(marks(svg)) == 5000 and "first 5,000 of 12,000" in caption
    fills = {e.get("fill") for e in marks(svg)}
    assert len(fills) == 2  # one colour per series


def test_roofline_draws_roofs_from_the_kernel_analyses_extra() -> None:
    extra = {"peak_flops_per_s": {"fp32": 60e12, "bf16": 900e12}, "peak_dram_bytes_per_s": 3e12}
    peaks, bandwidth = roofs(extra)
    assert sorted(peaks) == [("bf16", 900e12), ("fp32", 60e12)] and bandwidth == 3e12
    cols = [Column("kernel"), Column("AI", "flop/byte"), Column("FLOP/s", "flop/s")]
    rows = [("a", 1.0, 1e12), ("b", 100.0, 5e13), ("c", 0.0, 1e12)]  # c: AI 0 cannot sit on a log axis
    figure = render_chart(result("roofline", rows, cols, "AI", ("FLOP/s",), extra=extra))
    svg, caption = parse(figure)
    assert len(marks(svg)) == 2 and "1 row without a positive intensity and rate left out" in caption
    assert len([e for e in svg.iter(f"{SVG}path") if e.get("class") == "roof"]) == 2
    assert "bf16" in figure and format_value(3e12, "bytes/s") in figure


def test_a_single_row_left_out_is_one_row() -> None:
    cols = [Column("kernel"), Column("AI", "flop/byte"), Column("FLOP/s", "flop/s")]
    rows = [("a", 1.0, 1e12), ("b", None, 2e12), ("c", None, 3e12)]
    _, caption = parse(render_chart(result("scatter", rows, cols, "AI", ("FLOP/s",))))
    assert caption == "2 rows without a value left out"
    _, caption = parse(render_chart(result("scatter", rows[:2], cols, "AI", ("FLOP/s",))))
    assert caption == "1 row without a value left out"


def test_line_downsampling_keeps_the_peak() -> None:
    cols = [Column("t", "ns"), Column("allocated", "bytes")]
    rows = [(i * 1000, 1e6 + (5e8 if i == 7777 else i % 10)) for i in range(20_000)]
    svg, caption = parse(render_chart(result("line", rows, cols, "t", ("allocated",))))
    (path,) = marks(svg)
    ys = [float(p.split(",")[1]) for p in (path.get("d") or "")[1:].split(" L")]
    assert len(ys) <= 2000 and "20,000 points drawn as" in caption
    # The 5e8 spike (one row in 20,000) still reaches the top of the plot; every other point sits at the bottom.
    assert min(ys) < 40 and sorted(ys)[1] > 200


def test_secondary_axis_and_box_roles() -> None:
    cols = [Column("batch size", "count"), Column("throughput", "count"), Column("latency", "ns")]
    rows = [(b, 100.0 * b, 1e6 * b) for b in (1, 2, 4, 8)]
    figure = render_chart(result("line", rows, cols, "batch size", ("throughput",), extra={"secondary_y": ["latency"]}))
    svg, _ = parse(figure)
    assert len(marks(svg)) == 2 and "(right axis)" in figure
    cols = [Column("path"), Column("latency", "ns"), Column("p5", "ns"), Column("p95", "ns")]
    rows = [("a", 100, 90, 130), ("b", 200, None, None)]
    svg, _ = parse(render_chart(result("box", rows, cols, "path", ("latency",), extra={"low": "p5", "high": "p95"})))
    kinds = sorted(e.tag.removeprefix(SVG) for e in marks(svg))
    assert kinds == ["circle", "g"]  # a box with whiskers, and a bare median where the spread is missing


def test_unknown_column_is_a_note_not_a_crash() -> None:
    figure = render_chart(result("bar", [("a", 1, 2)], NAMED, "name", ("nope",)))
    assert figure.startswith('<p class="chart-note">chart not drawn') and "nope" in figure


def test_no_chart_without_rows_or_spec() -> None:
    assert render_chart(Result("T", "t", NAMED, [])) == ""
    assert render_chart(result("bar", [], NAMED, "name", ("total",))) == ""


def test_scale_ticks_are_round_and_cover_the_data() -> None:
    s = Scale.fit([0, 3.7e6], 0, 100, unit="ns")
    assert s.lo == 0 and s.hi >= 3.7e6 and s.ticks() == [0, 1e6, 2e6, 3e6, 4e6]
    b = Scale.fit([0, 1.9 * 2**30], 0, 100, unit="bytes")
    assert all(t % 2**27 == 0 for t in b.ticks())  # binary steps for bytes (128 MiB multiples)
    lg = Scale.fit([0.3, 700], 0, 100, log=True)
    assert lg.ticks()[0] == 0.1 and lg.ticks()[-1] == 1000 and lg(lg.lo) == 0 and lg(lg.hi) == 100


def test_labels_keep_the_informative_end() -> None:
    assert clip_label("bert.encoder.layer.11.attention.self.query", 20).endswith("attention.self.query"[-19:])
    assert clip_label("void gemm<float, 128>(Params) with a long tail", 12).startswith("void gemm<f")


ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, ...>(int)"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&)>(int)"


@pytest.mark.parametrize("kind", ["hbar", "bar", "box"])
def test_names_cut_alike_get_labels_that_tell_them_apart(kind: str) -> None:
    # two kernels that share their first 60 characters: cut at the start alone, both would read the same
    rows = [(ADD, 3000, 0), (GELU, 2000, 0), ("short_kernel", 1000, 0)]
    svg, _ = parse(render_chart(result(kind, rows, NAMED, "name", ("total",))))
    ticks = [t.text or "" for t in svg.iter(f"{SVG}text") if (t.text or "").startswith(("void", "short"))]
    assert len(ticks) == 3 and len(set(ticks)) == 3, ticks
    assert "CUDAFunc" in ticks[0] and "GeluCUDA" in ticks[1] and ticks[2] == "short_kernel"
    assert all(len(t) <= (42 if kind == "hbar" else 26) for t in ticks)


def test_apart_labels_keep_their_length_and_plain_ones_stay() -> None:
    names = ["a.b.layer.3.attention.self.query", "a.b.layer.11.attention.self.query", "x" * 50, "y" * 50, "z"]
    labels = clip_labels(names, 20)
    assert len(set(labels)) == 5 and all(len(s) <= 20 for s in labels)
    assert labels[2:] == [clip_label("x" * 50, 20), clip_label("y" * 50, 20), "z"]  # apart already: as they were
    assert "layer.3" in labels[0] and "layer.11" in labels[1]
    assert clip_label("/data/train/shard_000123/file_0456.pt (STDIO)", 24).endswith("file_0456.pt (STDIO)")


def test_bars_say_their_share_after_their_value_and_it_fits() -> None:
    # the overview's top layers: the caption says what the shares are of, so each bar shows its share
    cols = [Column("name"), Column("total", "ns"), Column("% of step", "pct")]
    rows = [("Sequential", 49_900_000, 28.37), ("0 (Conv2d)", 21_200_000, 12.1), ("3 (Flatten)", 58_500, None)]
    chart = result("hbar", rows, cols, "name", ("total",), extra={"share": "% of step"})
    svg, _ = parse(render_chart(chart))
    values = [t for t in svg.iter(f"{SVG}text") if t.get("class") == "value"]
    assert [t.text for t in values] == ["49.9 ms (28.4%)", "21.2 ms (12.1%)", "58.5 us"]
    width = float((svg.get("viewBox") or "").split()[2])
    assert all(float(t.get("x") or 0) + TICK_CHAR * len(t.text or "") <= width for t in values)


def test_series_colour_bars_and_split_lines() -> None:
    cols = [Column("kernel"), Column("delta", "ns"), Column("status")]
    rows = [("a", 500, "slower"), ("b", -300, "faster"), ("c", 200, "slower"), ("d", 100, "added")]
    figure = render_chart(result("hbar", rows, cols, "kernel", ("delta",), series="status"))
    svg, _ = parse(figure)
    fills = [e.get("fill") for e in marks(svg)]
    assert fills[0] == fills[2] != fills[1] != fills[3]  # one colour per status
    assert [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "legend"] == ["slower", "faster", "added"]
    cols = [Column("time", "ns"), Column("device"), Column("allocated", "bytes")]
    rows = [(t, d, 1000 * t + (5 if d == "cuda:1" else 0)) for t in range(10) for d in ("cuda:0", "cuda:1")]
    svg, _ = parse(render_chart(result("line", rows, cols, "time", ("allocated",), series="device")))
    paths = marks(svg)
    assert len(paths) == 2 and all(len((p.get("d") or "").split(" L")) == 10 for p in paths)


def test_time_ticks_read_evenly_and_count_ticks_whole() -> None:
    # Resident memory at each step's end 3.30 s to 3.45 s into a real run: quarter steps of 25 ms, which three
    # significant digits round unevenly (3.33 s, 3.35 s, 3.38 s)
    cols = [Column("time", "ns"), Column("rss", "bytes")]
    rows = [(3_316_000_000 + 15_000_000 * i, 2**28 + i) for i in range(8)]
    svg, _ = parse(render_chart(result("line", rows, cols, "time", ("rss",))))
    ticks = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "tick" and "s" in (t.text or "")[-2:]]
    assert ticks == ["3.300 s", "3.325 s", "3.350 s", "3.375 s", "3.400 s", "3.425 s"]
    rows = [(i * 2_000_000, 1) for i in range(6)]  # 0 to 10 ms: one unit, as many decimals as the step has
    svg, _ = parse(render_chart(result("line", rows, cols, "time", ("rss",))))
    ticks = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "tick" and (t.text or "").endswith("ms")]
    assert ticks == ["0 ms", "2 ms", "4 ms", "6 ms", "8 ms", "10 ms"]
    # five layer types called once each: the calls axis counts whole calls, not 0.2 of one
    counts = [Column("type"), Column("calls", "count")]
    svg, _ = parse(render_chart(result("hbar", [(t, 1) for t in "ABCDE"], counts, "type", ("calls",))))
    ticks = [t.text for t in svg.iter(f"{SVG}text") if t.get("class") == "tick" and t.get("text-anchor") == "middle"]
    assert ticks == ["0", "1"]
