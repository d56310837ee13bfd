"""The x-y chart kinds as inline SVG: scatter, line (downsampled) and roofline (log-log, with the device roofs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from xstack.analyze.result import Chart, Result, format_value
from xstack.report._charts import Cols, Drawn, axis_title, first_rows, selected_rows, series_index, tooltip
from xstack.report._svg import (
    WIDTH,
    Scale,
    axis_margin,
    clip,
    color,
    esc,
    legend,
    legend_height,
    num,
    open_svg,
    x_axis,
    y_axis,
)
from xstack.text import counted

Point = tuple[float, float, tuple[Any, ...]]


def scatter(result: Result, chart: Chart) -> Drawn:
    """One point per row at (``x``, first ``y``), coloured by ``series``; at most the first 2,000 rows."""
    c = Cols.of(result, chart)
    rows, notes = first_rows(result, chart)
    points, dropped = _points(rows, c.x, c.ys[0], chart.log_x, chart.log_y)
    if dropped:
        value = "a value above zero" if chart.log_x or chart.log_y else "a value"
        notes.append(f"{counted(dropped, 'row')} without {value} left out")
    return _xy_plot(result, chart, c, points, notes)


def roofline(result: Result, chart: Chart) -> Drawn:
    """Points at (arithmetic intensity ``x``, achieved FLOP/s ``y``) under the device's roofs, log-log.

    The roofs come from ``extra``: ``peak_flops`` (FLOP/s: a number, or a mapping of precision to number; keys
    ``peak_flops_<name>`` also count) and ``peak_bandwidth`` (bytes/s; also ``peak_bytes_per_s``). A roof is
    ``min(peak, AI * bandwidth)``; its ridge is where the two meet.
    """
    c = Cols.of(result, chart)
    rows, notes = first_rows(result, chart)
    points, dropped = _points(rows, c.x, c.ys[0], True, True)
    if dropped:
        notes.append(f"{counted(dropped, 'row')} without a positive intensity and rate left out")
    peaks, bandwidth = roofs(chart.extra)
    if not peaks and bandwidth is None:
        notes.append("no device peaks known: roofs not drawn")
    extra_x = [p / bandwidth for _, p in peaks] if bandwidth else []
    log_chart = replace(chart, log_x=True, log_y=True)
    return _xy_plot(result, log_chart, c, points, notes, extra_x=extra_x, extra_y=[p for _, p in peaks],
                    roofs=(peaks, bandwidth))  # fmt: skip


def line(result: Result, chart: Chart) -> Drawn:
    """One line per ``y`` column over ``x`` (numeric, else the row order), or with ``series`` one line per
    value of that column (a device, say); columns named in ``extra["secondary_y"]`` get their own scale on the
    right. Past 2,000 rows a line is downsampled by keeping each bucket's lowest and highest point, so that
    peaks stay visible."""
    secondary = [n for n in chart.extra.get("secondary_y") or [] if any(c.name == n for c in result.columns)]
    c = Cols.of(result, replace(chart, y=tuple(chart.y) + tuple(n for n in secondary if n not in chart.y)))
    rows, notes, _ = selected_rows(result, chart)  # every row of those: downsampled below, not cut
    xs_raw = [num(r[c.x]) for r in rows]
    by_index = any(v is None for v in xs_raw)
    order = sorted(range(len(rows)), key=lambda k: k if by_index else (xs_raw[k] or 0.0))
    group_of: list[int] = []
    names: list[str] = []
    if chart.series and len(c.ys) == 1 and any(col.name == chart.series for col in result.columns):
        group_of, names = series_index(result, chart.series, rows)
    buckets = [[k for k in order if group_of[k] == g] for g in range(len(names))] if group_of else [order]
    keeps = [_downsample(b, [num(rows[k][c.ys[0]]) for k in b]) for b in buckets]
    if sum(map(len, keeps)) < len(order):
        notes.append(f"{len(order):,} points drawn as {sum(map(len, keeps)):,}: each bucket's lowest and highest kept")
    right = [j for j, name in enumerate(c.names) if name in secondary]
    if not group_of and len(c.ys) > 1:
        names = [n + (" (right axis)" if j in right else "") for j, n in enumerate(c.names)]
    top, plot_h = 12.0 + legend_height(names, 90.0), 260.0
    sides = [s for s in ([j for j in range(len(c.ys)) if j not in right], right) if s]
    scales = []
    for side in sides:  # first the value scales: their tick labels set the margins
        values = [v for keep in keeps for k in keep for j in side if (v := num(rows[k][c.ys[j]])) is not None]
        unit = c.units[side[0]]
        scales.append(Scale.fit(values, top + plot_h, top, log=chart.log_y, zero=not chart.log_y, unit=unit))
    left = axis_margin(scales[0], c.units[sides[0][0]])
    plot_x1 = WIDTH - (axis_margin(scales[-1], c.units[right[0]], right=True) if right else 20)

    def x_of(k: int) -> float:
        return float(k) if by_index else float(xs_raw[k] or 0.0)

    x_unit = "count" if by_index else result.columns[c.x].unit
    sx = Scale.fit([x_of(k) for keep in keeps for k in keep], left, plot_x1, log=chart.log_x, zero=False, unit=x_unit)
    parts = [open_svg(top + plot_h + 50, chart.title or result.title), legend(names, left, 12.0)]
    x_title = axis_title(["row" if by_index else result.columns[c.x].name], x_unit)
    parts.append(x_axis(sx, top, top + plot_h, x_unit, x_title))
    for side, sy in zip(sides, scales, strict=True):
        unit = c.units[side[0]]
        parts.append(y_axis(sy, left, plot_x1, unit, axis_title([c.names[j] for j in side], unit), right=side is right))
        for j in side:
            for g, keep in enumerate(keeps):
                path = [(x_of(k), v) for k in keep if (v := num(rows[k][c.ys[j]])) is not None]
                parts.append(_polyline(path, sx, sy, color(g if group_of else j)))
    parts.append("</svg>")
    return Drawn("".join(parts), notes)


def _polyline(points: list[tuple[float, float]], sx: Scale, sy: Scale, stroke: str) -> str:
    path = [f"{sx(x):.1f},{sy(v):.1f}" for x, v in points if not (sy.log and v <= 0)]
    return f'<path class="mark line" d="M{" L".join(path)}" stroke="{stroke}" fill="none"/>' if path else ""


def roofs(extra: dict[str, Any]) -> tuple[list[tuple[str, float]], float | None]:
    """The named peak FLOP/s and the peak bandwidth (bytes/s) a roofline chart's ``extra`` gives: keys with
    ``bytes`` or ``bandwidth`` in their name give the bandwidth (``peak_dram_bytes_per_s``); keys with ``flop``
    give peaks, a number or a mapping of precision to number (``peak_flops_per_s: {"fp32": ...}``)."""
    peaks: list[tuple[str, float]] = []
    bandwidth = None
    for key, value in extra.items():
        lowered = key.lower()
        if "bytes" in lowered or "bandwidth" in lowered:
            bandwidth = num(value)
        elif "flop" in lowered and isinstance(value, dict):
            peaks += [(str(k), v) for k, raw in value.items() if (v := num(raw)) and v > 0]
        elif "flop" in lowered and (v := num(value)) and v > 0:
            peaks.append(("peak", v))
    return peaks, bandwidth if bandwidth and bandwidth > 0 else None


def _points(rows: Sequence[tuple[Any, ...]], xi: int, yi: int, log_x: bool, log_y: bool) -> tuple[list[Point], int]:
    points, dropped = [], 0
    for r in rows:
        x, y = num(r[xi]), num(r[yi])
        if x is None or y is None or (log_x and x <= 0) or (log_y and y <= 0):
            dropped += 1
            continue
        points.append((x, y, r))
    return points, dropped


def _xy_plot(result: Result, chart: Chart, c: Cols, points: list[Point], notes: list[str], *,
             extra_x: Sequence[float] = (), extra_y: Sequence[float] = (),
             roofs: tuple[list[tuple[str, float]], float | None] | None = None) -> Drawn:  # fmt: skip
    groups, series_names = _series(result, chart, points)
    top, plot_h = 12.0 + legend_height(series_names, 90.0), 300.0
    xs = [p[0] for p in points] + list(extra_x)
    ys = [p[1] for p in points] + list(extra_y)
    x_unit = result.columns[c.x].unit
    sy = Scale.fit(ys, top + plot_h, top, log=chart.log_y, zero=False, unit=c.units[0])
    left = axis_margin(sy, c.units[0])
    sx = Scale.fit(xs, left, WIDTH - 20, log=chart.log_x, zero=False, unit=x_unit)
    parts = [open_svg(top + plot_h + 50, chart.title or result.title), legend(series_names, left, 12.0)]
    parts.append(y_axis(sy, left, WIDTH - 20, c.units[0], axis_title(c.names[:1], c.units[0])))
    parts.append(x_axis(sx, top, top + plot_h, x_unit, axis_title([result.columns[c.x].name], x_unit)))
    if roofs is not None:
        parts.append(_roof_lines(sx, sy, *roofs))
    shown = _tooltip_columns(result, chart, c)
    for x, y, row, g in ((x, y, row, g) for g, pts in enumerate(groups) for x, y, row in pts):
        parts.append(
            f'<circle class="mark" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color(g)}" fill-opacity="0.7">'
            f"{tooltip(result, row, shown)}</circle>"
        )
    parts.append("</svg>")
    return Drawn("".join(parts), notes)


def _series(result: Result, chart: Chart, points: list[Point]) -> tuple[list[list[Point]], list[str]]:
    if not chart.series or not any(c.name == chart.series for c in result.columns):
        return [points], []
    index, names = series_index(result, chart.series, [p[2] for p in points])
    if names == ["-"]:  # the series column is empty (e.g. no peaks, so no bound): nothing to tell apart
        return [points], []
    groups: list[list[Point]] = [[] for _ in names]
    for p, g in zip(points, index, strict=True):
        groups[g].append(p)
    return groups, names


def _tooltip_columns(result: Result, chart: Chart, c: Cols) -> list[int]:
    """A label column (the first text column) and the plotted ones, for each point's tooltip."""
    text = [i for i, col in enumerate(result.columns) if col.unit == "" and i not in (c.x, c.ys[0])][:1]
    return [*text, c.x, c.ys[0]]


def _roof_lines(sx: Scale, sy: Scale, peaks: list[tuple[str, float]], bandwidth: float | None) -> str:
    x_lo, x_hi = sx.lo, sx.hi
    parts = []
    for j, (name, peak) in enumerate(peaks):
        ridge = peak / bandwidth if bandwidth else x_lo
        start = f"{sx(x_lo):.1f},{sy(x_lo * bandwidth):.1f} L{sx(ridge):.1f}" if bandwidth and ridge > x_lo else ""
        d = f"M{start or f'{sx(x_lo):.1f}'},{sy(peak):.1f} L{sx(x_hi):.1f},{sy(peak):.1f}"
        parts.append(f'<path class="roof" d="{d}" stroke="{color(j + 3)}" fill="none"/>')
        label = f"{clip(name, 20)} {format_value(peak, 'flop/s')}"
        parts.append(f'<text class="roof-label" x="{sx(x_hi) - 4:.1f}" y="{sy(peak) - 4:.1f}" '
                     f'text-anchor="end">{esc(label)}</text>')  # fmt: skip
        if bandwidth and x_lo < ridge < x_hi:  # the ridge point: memory-bound left of it, compute-bound right
            tip = f"{name} ridge: {ridge:.3g} FLOP/byte (left: memory-bound, right: compute-bound)"
            parts.append(f'<circle class="ridge" cx="{sx(ridge):.1f}" cy="{sy(peak):.1f}" r="3.5" '
                         f'fill="{color(j + 3)}"><title>{esc(tip)}</title></circle>'
                         f'<text class="roof-label" x="{sx(ridge) + 5:.1f}" y="{sy(peak) + 13:.1f}">'
                         f"{esc(f'ridge {ridge:.3g}')}</text>")  # fmt: skip
    if bandwidth and not peaks:
        d = f"M{sx(x_lo):.1f},{sy(x_lo * bandwidth):.1f} L{sx(x_hi):.1f},{sy(x_hi * bandwidth):.1f}"
        parts.append(f'<path class="roof" d="{d}" stroke="{color(3)}" fill="none"/>')
    if bandwidth:
        parts.append(
            f'<text class="roof-label" x="{sx(x_lo) + 4:.1f}" y="{sy(x_lo * bandwidth) - 6:.1f}">'
            f"{esc(format_value(bandwidth, 'bytes/s'))}</text>"
        )
    return "".join(parts)


def _downsample(order: list[int], ys: list[float | None]) -> list[int]:
    """Row positions to draw: all when few, else per bucket the lowest and highest ``y`` in row order."""
    cap = 2000
    if len(order) <= cap:
        return order
    buckets = cap // 2
    keep: list[int] = []
    for b in range(buckets):
        lo_k, hi_k = b * len(order) // buckets, (b + 1) * len(order) // buckets
        chunk = [(ys[k] if ys[k] is not None else 0.0, k) for k in range(lo_k, hi_k)]
        if chunk:
            a, z = min(chunk)[1], max(chunk)[1]
            keep += sorted({a, z})
    return [order[k] for k in keep]
