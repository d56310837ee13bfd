"""Tables of the HTML report: a result's rows embedded as JSON, drawn a page at a time by ``assets/report.js``.

A result can hold 10^5 rows (one per kernel call), far more than a browser lays out quickly as HTML. So the
page carries the rows as JSON in a ``<script type="application/json">`` block inside the table's box, with
each numeric cell's text formatted here by ``format_value`` (so the page shows exactly what the terminal and
the markdown show) and its raw value kept beside it for sorting. The script renders 50 rows at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from xstack.analyze.result import Column, Result, cell_units, format_cell
from xstack.report._svg import esc
from xstack.text import counted

PAGE_ROWS = 50
"""Rows shown per page of a table."""


def script_json(value: Any) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element: ``<``, ``>`` and ``&`` are escaped as
    ``\\u003c``... so no name in a trace (``</script>``, ``<!--``) can end the element or open markup."""
    try:
        data = orjson.dumps(value, default=_fallback, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # an integer past 64 bits, which JSON numbers (and orjson) cannot hold
        data = orjson.dumps(_raw(value), default=_fallback, option=orjson.OPT_NON_STR_KEYS)
    return data.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026").decode()


def table_payload(columns: Sequence[Column], rows: Sequence[Sequence[Any]], truncated: int = 0) -> dict[str, Any]:
    """What the page's script needs to draw, sort and page a table.

    ``cols[i].fmt`` marks columns whose cells show formatted text (``disp``, in the order of those columns)
    rather than the raw value: numbers with units, and anything that is not plain text. ``cols[i].by``, for a
    column whose unit comes per row (``Column.unit_from``), is the index of the column holding the unit: raw
    bytes, counts and ns do not compare, so the script sorts such a column by unit first, then by value.
    """
    fmt = [c.numeric or any(v is not None and not isinstance(v, str) for v in _column(rows, i))
           for i, c in enumerate(columns)]  # fmt: skip
    shown = [i for i, f in enumerate(fmt) if f]
    names = {c.name: i for i, c in enumerate(columns)}
    return {
        "cols": [
            {"name": c.name, "unit": c.unit, "help": c.help, "fmt": f, "num": c.numeric}
            | ({"by": names[c.unit_from]} if c.unit_from else {})
            for c, f in zip(columns, fmt, strict=True)
        ],
        "rows": rows,  # serialised as they are (NaN as null, tuples as lists): converting each cell costs seconds
        "disp": _display(columns, rows, shown),
        "truncated": truncated,
        "page": PAGE_ROWS,
    }


def _display(columns: Sequence[Column], rows: Sequence[Sequence[Any]], shown: Sequence[int]) -> list[list[str]]:
    """The text of the ``shown`` columns' cells, as ``format_cell`` gives it. A table of 10^5 rows repeats most of
    its values (iterations, layers, sizes), so each column keeps the text of a value it has formatted, by type,
    value and unit; not of a float zero, whose sign (``-0.0 == 0.0``) can show."""
    cols: list[tuple[int, Column, dict[tuple[type, Any, str], str]]] = [(i, columns[i], {}) for i in shown]
    out: list[list[str]] = []
    for r, units in zip(rows, cell_units(columns, rows), strict=True):
        line: list[str] = []
        for i, column, cache in cols:
            value, unit = r[i], units[i]
            kind = type(value)
            if kind is int or kind is str or (kind is float and value != 0):
                key = (kind, value, unit)
                text = cache.get(key)
                if text is None:
                    text = cache[key] = format_cell(value, column, unit)
            else:
                text = format_cell(value, column, unit)
            line.append(text)
        out.append(line)
    return out


def table_html(table_id: str, result: Result) -> str:
    """A box the page's script turns into a sortable, filterable, paginated table of the result's rows."""
    payload = script_json(table_payload(result.columns, result.rows, result.truncated))
    note = counted(len(result.rows), "row")
    if result.truncated:
        note += f"; {result.truncated:,} more left out by the analysis"
    return (
        f'<div class="xtable" id="{esc(table_id)}" data-rows="{len(result.rows)}">'
        f'<script type="application/json" class="xtable-data">{payload}</script>'
        f'<noscript><p class="note">{esc(note)}: this table needs JavaScript (or use xstack report --format csv)'
        "</p></noscript></div>"
    )


def static_table(head: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A small plain HTML table (cells escaped here); ``numeric`` columns are right-aligned."""
    th = "".join(f"<th{_num_class(i, numeric)}>{esc(h)}</th>" for i, h in enumerate(head))
    body = "".join(
        "<tr>" + "".join(f"<td{_num_class(i, numeric)}>{esc(v)}</td>" for i, v in enumerate(r)) + "</tr>" for r in rows
    )
    return f'<table class="static"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _num_class(i: int, numeric: Sequence[int]) -> str:
    return ' class="num"' if i in numeric else ""


def _column(rows: Sequence[Sequence[Any]], i: int) -> Any:
    return (r[i] for r in rows)


def _raw(v: Any) -> Any:
    """``v`` with integers past 64 bits made floats, inside lists, tuples and dictionaries too."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 1 << 63:
        return float(v)
    if isinstance(v, (list, tuple)):
        return [_raw(x) for x in v]
    if isinstance(v, dict):
        return {k: _raw(x) for k, x in v.items()}
    return v


def _fallback(v: Any) -> Any:
    """Values orjson does not know (dates, decimals, sets...) as text, as the terminal prints them."""
    return str(v)
