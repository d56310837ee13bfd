"""Text forms of a profile diff's tables for CI logs and spreadsheets: markdown and one combined CSV."""

from __future__ import annotations

import csv
import io
from typing import Any

from xstack.analyze.result import Column, Result, cell_units, format_value, markdown_text


def markdown(heading: str, results: list[Result]) -> str:
    """A markdown document: the heading lines, then per result a title, its table, labels and notes."""
    out = ["# xstack diff", "", *(f"- {line}" for line in heading.splitlines())]
    for r in results:
        out += ["", f"## {r.id}: {_cell(r.title)}", ""]
        if r.missing:
            out.append(f"Not available: missing {', '.join(r.missing)}. {_cell(r.hint)}")
            continue
        if not r.rows:
            out.append("No rows: nothing of this kind in either run.")
        else:
            out.append("| " + " | ".join(_header(c) for c in r.columns) + " |")
            out.append("|" + "|".join("---:" if c.numeric else "---" for c in r.columns) + "|")
            for row, units in zip(r.rows, cell_units(r.columns, r.rows), strict=True):
                out.append("| " + " | ".join(_cell(format_value(v, u)) for v, u in zip(row, units, strict=True)) + " |")
        if r.truncated:
            out.append(f"\n{r.truncated:,} more rows ({r.more or '--format csv or json for all'})")
        out += [f"\n> {_cell(label)}" for label in r.labels]
        if r.notes:
            out += ["", f"_{markdown_text(r.notes, _cell)}_"]
    return "\n".join(out) + "\n"


def csv_text(results: list[Result]) -> str:
    """Every result's rows in one CSV: a ``table`` column (the result's id), then the union of the columns
    (a column the row's table lacks is empty). Units follow the column names in brackets."""
    columns: dict[str, Column] = {}  # by header: a name in two units is two columns (A [ns], A with a unit per row)
    for r in results:
        for c in r.columns:
            columns.setdefault(_csv_header(c), c)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["table", *columns])
    for r in results:
        for row in r.rows:
            cells = {_csv_header(c): v for c, v in zip(r.columns, row, strict=True)}
            w.writerow([r.id, *(_csv_value(cells.get(header)) for header in columns)])
    return buf.getvalue()


def _csv_header(c: Column) -> str:
    return f"{c.name} [{c.unit}]" if c.unit else c.name


def _header(c: Column) -> str:
    unit = "%" if c.unit == "pct" else c.unit
    return _cell(f"{c.name} ({unit})" if unit and unit not in ("ns", "count") else c.name)


def _cell(text: str) -> str:
    """Text safe in a markdown table cell: pipes escaped, newlines and markup characters neutralised."""
    return (
        text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")
        .replace("_", "\\_").replace("*", "\\*")
    )  # fmt: skip


def _csv_value(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float):
        return round(v, 3)
    return v
