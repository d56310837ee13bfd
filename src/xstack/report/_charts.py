"""A result's chart (``Result.chart``) as inline SVG: the categorical kinds here, the x-y kinds in ``_charts_xy``.

``render_chart`` draws any result whose chart names existing columns. Charts draw at most a few dozen categories
or a few thousand points: ``Chart.limit`` when the analysis sets it, else a cap per kind; the rows are sorted by
the analysis so that the first ones matter most, and the caption says how many of how many are shown.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from xstack.analyze.result import Chart, Result, Unit, format_cell, format_value
from xstack.report._svg import (
    NAME_CHAR,
    TICK_CHAR,
    WIDTH,
    Scale,
    axis_margin,
    clip_labels,
    color,
    esc,
    legend,
    legend_height,
    num,
    open_svg,
    title_tag,
    x_axis,
    y_axis,
)

CAPS = {"bar": 300, "stacked": 300, "box": 300, "hbar": 40, "scatter": 5000, "roofline": 5000, "line": 2000}
"""Most categories (bar, stacked, box, hbar), points (scatter, roofline) or line vertices a chart draws."""

MAX_SERIES = 8
"""Series a chart colours apart; the rest are drawn together as "other"."""

HBAR_MAX = 40
"""Stacked charts with more rows than this are drawn as vertical columns (one row of the chart per column)."""


class ChartError(Exception):
    """The chart spec does not fit the result (a column it names is absent)."""


@dataclass
class Drawn:
    """A drawn chart: the SVG and caption notes (what was left out and why)."""

    svg: str
    notes: list[str] = field(default_factory=list)


@dataclass
class Cols:
    """The chart's columns resolved to positions and units."""

    x: int
    ys: list[int]
    units: list[Unit]
    names: list[str]

    @classmethod
    def of(cls, result: Result, chart: Chart) -> Cols:
        try:
            x = result.column_index(chart.x)
            ys = [result.column_index(y) for y in chart.y]
        except KeyError as exc:
            raise ChartError(str(exc.args[0])) from None
        if not ys:
            raise ChartError(f"{result.id}: the chart names no y column")
        return cls(x, ys, [result.columns[i].unit for i in ys], [result.columns[i].name for i in ys])


def render_chart(result: Result) -> str:
    """The result's chart as a ``<figure>``; empty when it has none or no rows, a note when it cannot be drawn."""
    chart = result.chart
    if chart is None or not result.rows:
        return ""
    from xstack.report._charts_xy import line, roofline, scatter

    kinds: dict[str, Callable[[Result, Chart], Drawn]] = {
        "bar": bars,
        "hbar": hbars,
        "stacked": stacked,
        "box": boxes,
        "scatter": scatter,
        "line": line,
        "roofline": roofline,
    }
    try:
        drawn = kinds[chart.kind](result, chart)
    except ChartError as exc:
        return f'<p class="chart-note">chart not drawn: {esc(exc)}</p>'
    title = f'<div class="chart-title">{esc(chart.title)}</div>' if chart.title else ""
    caption = f"<figcaption>{esc('; '.join(drawn.notes))}</figcaption>" if drawn.notes else ""
    return f'<figure class="chart-box" data-kind="{esc(chart.kind)}">{title}{drawn.svg}{caption}</figure>'


def first_rows(result: Result, chart: Chart) -> tuple[list[tuple[Any, ...]], list[str]]:
    """The rows a chart draws and a note when some are left out: those ``selected_rows`` keeps, then the first
    ``Chart.limit`` (at most the kind's cap)."""
    rows, notes, selected = selected_rows(result, chart)
    cap = CAPS[chart.kind]
    limit = min(chart.limit, cap) if chart.limit else cap
    total = len(rows) + (0 if selected else result.truncated)
    if total > limit:
        table = "them all" if selected or not result.truncated else f"the first {len(result.rows):,}"
        notes.append(f"showing the first {min(limit, len(rows)):,} of {total:,} rows (the table has {table})")
    return rows[:limit], notes


def selected_rows(result: Result, chart: Chart) -> tuple[list[tuple[Any, ...]], list[str], bool]:
    """The rows a chart may draw, a note for each choice that left some out, and whether any choice was made:
    those whose ``extra["filter"]`` column is true (when it names one), less those whose column has the value (or
    one of the values) ``extra["exclude"]`` gives it (when any does; the note names the values the rows hold, or
    the column of a flag, ``yes``: "rows not marked warm-up"; ``extra["exclude_note"]`` where it says why
    instead)."""
    rows, notes = result.rows, []
    key = chart.extra.get("filter")
    if isinstance(key, str) and any(c.name == key for c in result.columns):
        i = result.column_index(key)
        rows = [r for r in rows if r[i] not in (None, "", False, 0, "no")]
        notes.append(f"rows where {key} is true: {len(rows):,} of {len(result.rows):,}")
    exclude = chart.extra.get("exclude")
    selected = isinstance(key, str)
    for name, value in exclude.items() if isinstance(exclude, dict) else ():
        if any(c.name == name for c in result.columns):
            i = result.column_index(name)
            values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
            kept = [r for r in rows if r[i] not in values]
            if len(kept) < len(rows):
                left = [str(v) for v in values if any(r[i] == v for r in rows)]  # those the table has
                named = f"{', '.join(left[:-1])} or {left[-1]}" if len(left) > 1 else left[0]
                which = f"not marked {name}" if left == ["yes"] else f"where {name} is not {named}"  # a flag column
                why = chart.extra.get("exclude_note")
                notes.append(why if isinstance(why, str) else f"rows {which}: {len(kept):,} of {len(rows):,}")
                rows, selected = kept, True
    return rows, notes, selected


def category(value: object, unit: Unit) -> str:
    """A category label (an axis tick): the value formatted in its column's unit."""
    return format_value(value, unit)


def tooltip(result: Result, row: Sequence[Any], cols: Sequence[int]) -> str:
    """A ``<title>`` naming the row's values in ``cols`` with their column names and units."""
    return title_tag([f"{result.columns[i].name}: {format_cell(row[i], result.columns[i])}" for i in cols])


def tip_columns(result: Result, chart: Chart) -> list[int]:
    """The columns a bar's tooltip names between its category and its value: ``extra["tell_apart"]`` and those
    ``extra["tip"]`` lists, where the result has them."""
    names = [chart.extra.get("tell_apart"), *(chart.extra.get("tip") or ())]
    have = {c.name for c in result.columns}
    return [result.column_index(n) for n in dict.fromkeys(names) if isinstance(n, str) and n in have]


def bars(result: Result, chart: Chart) -> Drawn:
    """Vertical bars, one group per row, one bar per ``y`` column."""
    return _columns(result, chart, stack=False)


def hbars(result: Result, chart: Chart) -> Drawn:
    """Horizontal bars, one row per result row (long names read well on the left), one bar per ``y`` column."""
    return _hbars(result, chart, stack=False)


def stacked(result: Result, chart: Chart) -> Drawn:
    """Stacked bars, one segment per ``y`` column (negative parts drawn as zero): horizontal for up to 40 rows,
    else vertical columns."""
    rows, _ = first_rows(result, chart)
    return _hbars(result, chart, stack=True) if len(rows) <= HBAR_MAX else _columns(result, chart, stack=True)


def _columns(result: Result, chart: Chart, *, stack: bool) -> Drawn:
    c = Cols.of(result, chart)
    rows, notes = first_rows(result, chart)
    groups, names = bar_colors(result, chart, rows, c)
    labels = clip_labels(category_labels(result, chart, rows, c.x), 26)
    tips = tip_columns(result, chart)
    top, plot_h = 12.0 + legend_height(names, 90.0), 220.0
    bottom = 30.0 + 6.0 * max((len(s) for s in labels), default=4)
    stacks = [_stack(r, c.ys, stack) for r in rows]
    ends = [v for st in stacks for _, lo, hi in st for v in (lo, hi)]
    sy = Scale.fit(ends, top + plot_h, top, log=chart.log_y and not stack, unit=c.units[0]).below(ends)
    left = max(slant_margin(labels), axis_margin(sy, c.units[0]))
    every = label_step((WIDTH - left - 10) / max(len(rows), 1))
    band = (WIDTH - left - 10) / max(len(rows), 1)
    inner = band * 0.8 / (1 if stack else len(c.ys))
    parts = [open_svg(top + plot_h + bottom, chart.title or result.title), legend(names, left, 12.0)]
    parts.append(y_axis(sy, left, WIDTH - 10, c.units[0], axis_title(["total"] if stack else c.names, c.units[0])))
    for k, (row, st) in enumerate(zip(rows, stacks, strict=True)):
        x0 = left + k * band + band * 0.1
        for j, lo, hi in st:
            if sy.log and lo <= 0:
                lo = sy.lo
            y0, y1 = sy(lo), sy(hi)
            x = x0 if stack else x0 + j * inner
            parts.append(
                f'<rect class="mark" x="{x:.1f}" y="{min(y0, y1):.1f}" width="{max(inner - 1, 0.6):.1f}" '
                f'height="{abs(y0 - y1):.1f}" fill="{color(groups[k] if groups else j)}"{faded(result, chart, row)}>'
                f"{tooltip(result, row, [c.x, *tips, c.ys[j]])}</rect>"
            )
        if k % every == 0:
            cx, cy = x0 + band * 0.4, top + plot_h + 12
            parts.append(
                f'<text class="tick" transform="translate({cx:.1f},{cy:.1f}) rotate(-40)" text-anchor="end">'
                f"{esc(labels[k])}</text>"
            )
    if every > 1:
        notes.append(f"one label in {every} shown")
    parts.append("</svg>")
    return Drawn("".join(parts), notes + mark_notes(result, chart, rows))


def _hbars(result: Result, chart: Chart, *, stack: bool) -> Drawn:
    c = Cols.of(result, chart)
    rows, notes = first_rows(result, chart)
    groups, names = bar_colors(result, chart, rows, c)
    left, top, row_h = 300.0, 12.0 + legend_height(names, 300.0), 22.0
    plot_h = row_h * len(rows)
    stacks = [_stack(r, c.ys, stack) for r in rows]
    values = [value_text(result, chart, r, st, c, stack) for r, st in zip(rows, stacks, strict=True)]
    right = max(70.0, 10.0 + TICK_CHAR * max(map(len, values), default=0))  # the longest value fits after its bar
    log = (chart.log_x or chart.log_y) and not stack
    ends = [v for st in stacks for _, lo, hi in st for v in (lo, hi)]
    sx = Scale.fit(ends, left, WIDTH - right, log=log, unit=c.units[0]).below(ends)
    bar_h = (row_h - 6) / (1 if stack else len(c.ys))
    parts = [open_svg(top + plot_h + 44, chart.title or result.title), legend(names, left, 12.0)]
    parts.append(x_axis(sx, top, top + plot_h, c.units[0], axis_title(["total"] if stack else c.names, c.units[0])))
    labels, tips = category_labels(result, chart, rows, c.x), tip_columns(result, chart)
    shorts = clip_labels(labels, 42)
    for k, (row, st, label, short, text) in enumerate(zip(rows, stacks, labels, shorts, values, strict=True)):
        y0 = top + k * row_h + 3
        parts.append(
            f'<text class="tick" x="{left - 6:.1f}" y="{y0 + row_h / 2 + 1:.1f}" text-anchor="end">'
            f"{esc(short)}{title_tag([label])}</text>"
        )
        for j, lo, hi in st:
            if sx.log and lo <= 0:
                lo = sx.lo
            x0, x1 = sx(lo), sx(hi)
            y = y0 if stack else y0 + j * bar_h
            parts.append(
                f'<rect class="mark" x="{min(x0, x1):.1f}" y="{y:.1f}" width="{abs(x1 - x0):.1f}" '
                f'height="{max(bar_h - 1, 1):.1f}" fill="{color(groups[k] if groups else j)}"'
                f"{faded(result, chart, row)}>{tooltip(result, row, [c.x, *tips, c.ys[j]])}</rect>"
            )
        if text:
            end = max(hi for _, _, hi in st)
            parts.append(
                f'<text class="value" x="{max(sx(end), sx(sx.lo if sx.log else 0.0)) + 4:.1f}" '
                f'y="{y0 + row_h / 2 + 1:.1f}">{esc(text)}</text>'
            )
    parts.append("</svg>")
    return Drawn("".join(parts), notes + mark_notes(result, chart, rows))


def value_text(result: Result, chart: Chart, row: Sequence[Any], st: Sequence[tuple[int, float, float]], c: Cols,
               stack: bool) -> str:  # fmt: skip
    """The text after a horizontal bar: its value (a stack's total), then the ``extra["share"]`` column's
    percentage where the result has it (``49.9 ms (28.3%)``); empty for grouped bars and rows with no value."""
    if not st or not (stack or len(c.ys) == 1):
        return ""
    text = format_value(max(hi for _, _, hi in st) if stack else row[c.ys[0]], c.units[0])
    key = chart.extra.get("share")
    if isinstance(key, str) and any(col.name == key for col in result.columns):
        share = row[result.column_index(key)]
        text += f" ({format_value(share, 'pct')}%)" if share is not None else ""
    return text


def category_labels(result: Result, chart: Chart, rows: Sequence[Sequence[Any]], x: int) -> list[str]:
    """The rows' category labels, each with its mark (``marked_label``); where two drawn rows would read alike,
    each whose ``extra["tell_apart"]`` column holds another word than its label has that word after it (a user's
    span named like the iteration, ``step`` of kind ``user``, reads ``step (user)`` beside the iteration's
    ``step``)."""
    labels = [marked_label(result, chart, r, category(r[x], result.columns[x].unit)) for r in rows]
    key = chart.extra.get("tell_apart")
    if not isinstance(key, str) or not any(c.name == key for c in result.columns):
        return labels
    i, seen = result.column_index(key), Counter(labels)
    words = [format_cell(r[i], result.columns[i]) for r in rows]
    return [
        f"{label} ({word})" if seen[label] > 1 and word not in ("", "-", label) else label
        for label, word in zip(labels, words, strict=True)
    ]


def _mark(result: Result, chart: Chart, row: Sequence[Any]) -> str:
    """The name of the ``extra["mark"]`` column (``warm-up``, say) when its value marks the row, else ``""``."""
    key = chart.extra.get("mark")
    if not isinstance(key, str) or not any(c.name == key for c in result.columns):
        return ""
    return key if row[result.column_index(key)] not in (None, "", False, 0, "no") else ""


def marked_label(result: Result, chart: Chart, row: Sequence[Any], label: str) -> str:
    """A category label with the row's mark after it: ``1 (warm-up)``."""
    mark = _mark(result, chart, row)
    return f"{label} ({mark})" if mark else label


def faded(result: Result, chart: Chart, row: Sequence[Any]) -> str:
    """SVG attributes that draw a marked row's bars faded (shown, and told apart from the others)."""
    return ' fill-opacity="0.4"' if _mark(result, chart, row) else ""


def mark_notes(result: Result, chart: Chart, rows: Sequence[Sequence[Any]]) -> list[str]:
    """The chart's ``extra["mark_note"]`` when a row drawn is marked."""
    note = chart.extra.get("mark_note")
    return [note] if isinstance(note, str) and any(_mark(result, chart, r) for r in rows) else []


def bar_colors(result: Result, chart: Chart, rows: Sequence[tuple[Any, ...]], c: Cols) -> tuple[list[int], list[str]]:
    """Colours of single-series bars by ``chart.series`` (a diff's status, say): each row's colour index and the
    legend; without a series, no per-row colours and a legend of the ``y`` columns when there are several."""
    if len(c.ys) > 1 or not chart.series or not any(col.name == chart.series for col in result.columns):
        return [], c.names if len(c.ys) > 1 else []
    return series_index(result, chart.series, rows)


def series_index(result: Result, column: str, rows: Sequence[tuple[Any, ...]]) -> tuple[list[int], list[str]]:
    """For each row, the index of its value of ``column`` among the first eight distinct values (the rest
    share a ninth, "other"), and those names in order."""
    i = result.column_index(column)
    unit = result.columns[i].unit
    values = [format_value(r[i], unit) for r in rows]
    names = list(dict.fromkeys(values))
    named = names[:MAX_SERIES]
    index = {name: k for k, name in enumerate(named)}
    groups = [index.get(v, len(named)) for v in values]
    return groups, named + (["other"] if len(names) > len(named) else [])


def slant_margin(labels: Sequence[str]) -> float:
    """Left margin that keeps the slanted category labels inside the chart: a label ends under the middle of its
    category's band and, slanted at 40 degrees, reaches its length times cos 40 to the left of it, and some 9
    units more for the height of its letters; the k-th label starts k bands further right. At least the value
    axis's 90, at most 170 (labels are cut to 26 characters)."""
    left = 90.0
    for _ in range(3):  # a wider margin narrows the bands: settle on one that fits them
        band = (WIDTH - left - 10) / max(len(labels), 1)
        reach = max((NAME_CHAR * len(s) * math.cos(math.radians(40)) + 9 - (k + 0.5) * band
                     for k, s in enumerate(labels)), default=0.0)  # fmt: skip
        left = min(170.0, max(90.0, reach))
    return left


def label_step(band: float) -> int:
    """Label every n-th of categories ``band`` units apart: labels slanted at 40 degrees need 20 units between
    them not to overlap."""
    return max(1, math.ceil(20 / band)) if band > 0 else 1


def _stack(row: Sequence[Any], ys: Sequence[int], stack: bool) -> list[tuple[int, float, float]]:
    """Segments ``(series, low, high)`` of one row: stacked from zero (negative values count as zero), or each
    bar from zero to its value."""
    out, acc = [], 0.0
    for j, i in enumerate(ys):
        v = num(row[i])
        if v is None:
            continue
        if stack:
            if v > 0:
                out.append((j, acc, acc + v))
                acc += v
        else:
            out.append((j, 0.0, v))
    return out


def boxes(result: Result, chart: Chart) -> Drawn:
    """A box plot per row. The columns: ``extra["quantiles"]`` (five: whisker low, lower quartile, median, upper
    quartile, whisker high; or three: low, median, high), else the roles ``extra["low"]``, ``extra["q1"]``,
    ``y`` (the median), ``extra["q3"]``, ``extra["high"]`` that name columns. A row whose quantiles are missing
    is drawn as a point at its median."""
    quantiles = tuple(chart.extra.get("quantiles") or ())
    if not quantiles:
        roles = [chart.extra.get("low"), chart.extra.get("q1"), chart.y[0] if chart.y else None,
                 chart.extra.get("q3"), chart.extra.get("high")]  # fmt: skip
        quantiles = tuple(str(q) for q in roles if q)
    if len(quantiles) not in (1, 3, 5):
        raise ChartError(f"{result.id}: a box plot needs 1, 3 or 5 quantile columns, not {len(quantiles)}")
    c = Cols.of(result, replace(chart, y=quantiles))
    rows, notes = first_rows(result, chart)
    labels = clip_labels(category_labels(result, chart, rows, c.x), 26)
    top, plot_h = 12.0, 220.0
    bottom = 30.0 + 6.0 * max((len(s) for s in labels), default=4)
    values = [v for r in rows for i in c.ys if (v := num(r[i])) is not None]
    sy = Scale.fit(values, top + plot_h, top, log=chart.log_y, zero=False, unit=c.units[0])
    left = max(slant_margin(labels), axis_margin(sy, c.units[0]))
    band = (WIDTH - left - 10) / max(len(rows), 1)
    every = label_step(band)
    mid = len(c.ys) // 2
    parts = [open_svg(top + plot_h + bottom, chart.title or result.title)]
    parts.append(y_axis(sy, left, WIDTH - 10, c.units[0], axis_title([result.columns[c.ys[mid]].name], c.units[0])))
    for k, row in enumerate(rows):
        q = [num(row[i]) for i in c.ys]
        cx, half = left + (k + 0.5) * band, max(min(band * 0.3, 14.0), 0.5)
        tip = tooltip(result, row, [c.x, *c.ys])
        if all(v is not None for v in q):
            parts.append(_box(sy, cx, half, [float(v) for v in q if v is not None], tip))
        elif (m := q[mid]) is not None:
            parts.append(_box(sy, cx, half, [m], tip))
        if k % every == 0:
            parts.append(
                f'<text class="tick" transform="translate({cx:.1f},{top + plot_h + 12:.1f}) rotate(-40)" '
                f'text-anchor="end">{esc(labels[k])}</text>'
            )
    parts.append("</svg>")
    return Drawn("".join(parts), notes)


def _box(sy: Scale, cx: float, half: float, q: list[float], tip: str) -> str:
    ys = [sy(v) for v in q]
    if len(ys) == 1:
        return f'<circle class="mark" cx="{cx:.1f}" cy="{ys[0]:.1f}" r="3" fill="{color(0)}">{tip}</circle>'
    lo, hi, mid = ys[0], ys[-1], ys[len(ys) // 2]
    box_lo, box_hi = (ys[1], ys[3]) if len(ys) == 5 else (mid, mid)
    return (
        f'<g class="mark">{tip}'
        f'<line class="whisker" x1="{cx:.1f}" x2="{cx:.1f}" y1="{lo:.1f}" y2="{hi:.1f}" stroke="{color(0)}"/>'
        f'<rect x="{cx - half:.1f}" y="{min(box_lo, box_hi):.1f}" width="{2 * half:.1f}" '
        f'height="{abs(box_lo - box_hi):.1f}" fill="{color(0)}" fill-opacity="0.35" stroke="{color(0)}"/>'
        f'<line class="median" x1="{cx - half:.1f}" x2="{cx + half:.1f}" y1="{mid:.1f}" y2="{mid:.1f}"/></g>'
    )


def axis_title(names: Sequence[str], unit: Unit) -> str:
    """An axis title: the column names, with the unit only where the tick labels do not carry it."""
    text = ", ".join(names)
    suffix = {"pct": "%", "flop/byte": "FLOP/byte", "ratio": "ratio"}.get(unit)
    return f"{text} ({suffix})" if suffix and suffix not in text else text
