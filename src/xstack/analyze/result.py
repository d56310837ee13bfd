"""What every analysis returns: a table with units, a chart spec, the facts rules read, and what is missing.

An analysis is a plain function ``(store, run_id, **options) -> Result``. A result prints as a rich table,
converts to a pandas DataFrame (``to_dataframe``) or plain records (``to_records``), and carries enough for the
HTML report to draw its chart. When the levels an analysis needs are absent, the result has no rows and says
which levels are missing and how to record them (``missing``, ``hint``): never a table of zeros.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from xstack.text import counted as counted  # the analyses' name for it
from xstack.text import format_ns as format_ns  # a duration cell's text, shared with every report
from xstack.text import format_ns_in_steps, three_digits

if TYPE_CHECKING:
    import pandas as pd

_LITERAL = re.compile(r"``(.+?)``")

Unit = Literal["", "ns", "bytes", "flops", "flop/s", "bytes/s", "pct", "count", "ratio", "flop/byte"]
ChartKind = Literal["bar", "hbar", "stacked", "scatter", "line", "box", "roofline"]


@dataclass(frozen=True)
class Column:
    """A column: its name, unit (drives formatting) and, optionally, what it means."""

    name: str
    unit: Unit = ""
    help: str = ""
    unit_from: str = ""
    """For a table whose rows measure different things (counts, bytes, times): the column holding each row's
    unit, which then formats this column's cell in that row (``unit`` stays empty)."""
    bin_ns: int | None = None
    """For a ``ns`` column of equal time bins' starts: the bins' width, so that every cell prints in one unit with
    the same decimals (``format_cell``)."""

    @property
    def numeric(self) -> bool:
        """True for a column of numbers (a unit, or a unit per row): right-aligned, sorted largest first."""
        return self.unit != "" or self.unit_from != ""


@dataclass(frozen=True)
class Chart:
    """How the report draws a result: ``x`` and ``y`` name columns of the result's rows.

    ``y`` may name several columns (stacked or grouped series). ``series`` names a column whose values split
    the points into groups (e.g. ``bound``). ``extra`` carries kind-specific values (a roofline's peaks; a
    box plot's quantile columns); for bars, ``extra["mark"]`` names a column whose non-empty value marks a row
    (its bars drawn faded, the column's name after its label: ``1 (warm-up)``) and ``extra["mark_note"]`` says why;
    ``extra["filter"]`` names a column whose true rows alone are drawn, and ``extra["exclude"]`` maps column names
    to a value, or a tuple of values, whose rows are not drawn (``{"kind": ("warm-up", "warm-up step")}``), the
    caption saying how many are drawn, or ``extra["exclude_note"]``;
    ``extra["tell_apart"]`` names a column whose value follows a category's label where two drawn rows share it
    (``step (user)`` beside ``step``), and is named in the bars' tooltips, as are the columns ``extra["tip"]``
    lists; ``extra["share"]`` names a percentage column shown after a horizontal bar's value (``49.9 ms (28.3%)``).
    """

    kind: ChartKind
    x: str
    y: tuple[str, ...]
    title: str = ""
    log_x: bool = False
    log_y: bool = False
    series: str | None = None
    limit: int | None = None
    """Draw only the first ``limit`` rows (the rows are sorted so that these matter most)."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Result:
    """One analysis's answer for one run."""

    id: str
    """Stable identifier: ``A1`` .. ``A15`` for XSP's analyses, ``timeline.syncs``, ``health``, ..."""
    title: str
    columns: list[Column] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    notes: str = ""
    """How the answer was computed (one short paragraph); code is marked as docstrings mark it, in reST
    ``double backticks`` (``literal_parts`` cuts it for each report)."""
    run_id: int | None = None
    missing: list[str] = field(default_factory=list)
    """Levels (or inputs such as ``device peaks``) the analysis needs and the run lacks."""
    hint: str = ""
    """How to get what is missing, e.g. "run with the metrics level"."""
    hints: dict[str, str] = field(default_factory=dict)
    """How to get each of ``missing``, by level, where known apart (``hint`` is then their sentences in turn,
    "level: how."): the reports' closing table of unavailable analyses has a row per missing level."""
    chart: Chart | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    """Headline numbers (totals, peaks, shares) that the overview and the recommendation rules read."""
    labels: list[str] = field(default_factory=list)
    """Caveats shown wherever the result appears, e.g. ``FLOPs and bytes: analytic``."""
    truncated: int = 0
    """Rows left out of ``rows`` (the analysis was asked for a limit)."""
    more: str = ""
    """How to list the rows left out (``truncated``), said beside their count; empty: ``--format csv``."""

    @property
    def available(self) -> bool:
        """True unless a level the analysis needs is missing."""
        return not self.missing

    def column_index(self, name: str) -> int:
        """Position of a column by name (KeyError when absent)."""
        for i, c in enumerate(self.columns):
            if c.name == name:
                return i
        raise KeyError(f"{self.id}: no column {name!r} (columns: {', '.join(c.name for c in self.columns)})")

    def column(self, name: str) -> list[Any]:
        """The values of one column, in row order."""
        i = self.column_index(name)
        return [r[i] for r in self.rows]

    def to_records(self) -> list[dict[str, Any]]:
        """Rows as dictionaries keyed by column name."""
        names = [c.name for c in self.columns]
        return [dict(zip(names, r, strict=True)) for r in self.rows]

    def to_dataframe(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame (pandas must be installed), with the result's metadata in ``attrs``."""
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from xstack.errors import UsageError

            raise UsageError("Result.to_dataframe needs pandas: pip install pandas") from exc
        frame = pd.DataFrame.from_records(self.rows, columns=[c.name for c in self.columns])
        frame.attrs.update(
            id=self.id, title=self.title, units={c.name: c.unit for c in self.columns}, labels=self.labels
        )
        if self.missing:
            frame.attrs.update(missing=self.missing, hint=self.hint)
        return frame

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: metadata, columns with units, rows as lists, facts."""
        return {
            "id": self.id,
            "title": self.title,
            "run_id": self.run_id,
            "available": self.available,
            "missing": self.missing,
            "hint": self.hint,
            "hints": self.hints,
            "notes": self.notes,
            "labels": self.labels,
            "columns": [_column_dict(c) for c in self.columns],
            "rows": [[_json_value(v) for v in r] for r in self.rows],
            "truncated": self.truncated,
            "facts": {k: _json_value(v) for k, v in self.facts.items()},
        }

    def to_csv(self) -> str:
        """The rows as CSV text with a header row (units in brackets)."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([f"{c.name} [{c.unit}]" if c.unit else c.name for c in self.columns])
        w.writerows([["" if v is None else _json_value(v) for v in r] for r in self.rows])
        return buf.getvalue()

    def __rich__(self) -> RenderableType:
        return render_result(self)


def _column_dict(c: Column) -> dict[str, str]:
    out = {"name": c.name, "unit": c.unit, "help": c.help}
    return {**out, "unit_from": c.unit_from} if c.unit_from else out


def cell_units(columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> list[list[Unit]]:
    """The unit of each cell of ``rows``: its column's, or where the column takes its unit from another
    (``Column.unit_from``), that column's value in the row."""
    plain = [c.unit for c in columns]
    if not any(c.unit_from for c in columns):
        return [plain] * len(rows)
    names = {c.name: i for i, c in enumerate(columns)}
    source = [names[c.unit_from] if c.unit_from else -1 for c in columns]
    return [
        [cast(Unit, str(row[k] or "")) if k >= 0 else u for u, k in zip(plain, source, strict=True)] for row in rows
    ]


def missing_result(id: str, title: str, run_id: int, hints: dict[str, str], notes: str = "") -> Result:
    """A result saying which levels (or inputs) are missing and how to get each (``hints``, by level, in order)."""
    hint = " ".join(f"{m}: {how}." for m, how in hints.items())
    return Result(id=id, title=title, run_id=run_id, missing=list(hints), hint=hint, hints=dict(hints), notes=notes)


def missing_by_level(results: Sequence[Result]) -> dict[str, tuple[str, list[Result]]]:
    """Per missing level (or input) of ``results``, in order of first need: how to get it (the result's hint for
    that level; its whole hint where it has none apart), and the results that need it (a result missing two
    levels is under both)."""
    needs: dict[str, tuple[str, list[Result]]] = {}
    for r in results:
        for level in r.missing:
            hint = r.hints.get(level) or r.hint or "record it"
            needs.setdefault(level, (hint, []))[1].append(r)
    return needs


def not_available_lead(n: int) -> str:
    """The sentence over the table of ``n`` results that lack a level: "3 analyses need what this run did not
    record"."""
    return f"{n:,} {'analysis needs' if n == 1 else 'analyses need'} what this run did not record"


def notes_of(fn: Any) -> str:
    """An analysis's Notes paragraph from its docstring (the whole docstring when it has none), on one line."""
    doc = str(fn.__doc__ or "")
    return " ".join(doc.split("Notes:", 1)[-1].split())


def literal_parts(text: str) -> list[tuple[str, bool]]:
    """``text`` cut into pieces, each with whether it is a literal: code marked in reST ``double backticks``, as
    docstrings and notes mark it, for reports to render as code (HTML ``<code>``, markdown backticks)."""
    parts: list[tuple[str, bool]] = []
    pos = 0
    for m in _LITERAL.finditer(text):
        if m.start() > pos:
            parts.append((text[pos : m.start()], False))
        parts.append((m.group(1), True))
        pos = m.end()
    if pos < len(text):
        parts.append((text[pos:], False))
    return parts


def markdown_text(text: str, escape: Callable[[str], str]) -> str:
    """``text`` as markdown: literals as code spans (`io_files`), the rest passed through ``escape``."""
    out = []
    for piece, literal in literal_parts(text):
        if not literal:
            out.append(escape(piece))
        elif "`" in piece:  # a code span holding a backtick needs a longer fence, and spaces inside it
            out.append(f"`` {piece} ``")
        else:
            out.append(f"`{piece}`")
    return "".join(out)


def bin_column(bin_ns: int) -> Column:
    """The ``time`` column of a result in equal time bins ``bin_ns`` wide: each bin's start, from the run's first
    event."""
    help = f"start of the bin, from the run's first event; bins of {format_ns(bin_ns)}"
    return Column("time", "ns", help, bin_ns=bin_ns)


def bin_label(bin_ns: int) -> str:
    """The label that states the bins' width of a result in equal time bins (its ``bin_column`` gives their
    starts)."""
    return f"time bins of {format_ns(bin_ns)}, each labelled by its start"


def format_cell(value: Any, column: Column, unit: Unit | None = None) -> str:
    """A cell of ``column`` as text: as ``format_value`` has it in ``unit`` (default: the column's; a row's own
    from ``cell_units``), but a time bin's start in the unit of the bins' width (``0.00 ms``, ``2.40 ms``), so the
    column reads alike from the first bin to the last."""
    if column.bin_ns and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format_ns_in_steps(value, column.bin_ns)
    return format_value(value, column.unit if unit is None else unit)


def format_value(value: Any, unit: Unit) -> str:
    """A cell as text: durations, bytes, FLOPs and rates scaled to a readable unit."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if unit == "ns":
        return format_ns(value)
    if unit in ("bytes", "bytes/s"):
        return _scaled(value, 1024.0, ("B", "KiB", "MiB", "GiB", "TiB"), "/s" if unit == "bytes/s" else "")
    if unit in ("flops", "flop/s"):
        return _scaled(value, 1000.0, ("", "K", "M", "G", "T", "P"), "FLOP/s" if unit == "flop/s" else "FLOP")
    if unit == "pct":
        text = f"{value:.1f}"
        return "0.0" if text == "-0.0" else text  # a change too small to show has no direction
    if unit in ("ratio", "flop/byte"):
        return _significant(value, 3)
    if unit == "count":
        return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
    if isinstance(value, float):
        return _significant(value, 4)
    if isinstance(value, (list, tuple)):
        return str(list(value))
    return str(value)


def _significant(value: float, digits: int) -> str:
    """``value`` to ``digits`` significant digits, but a number too large for them in whole units with thousands
    separators (12,346, not 1.235e+04): tables are read by people."""
    text = f"{value:.{digits}g}"
    return f"{value:,.0f}" if "e+" in text else text


def render_result(result: Result, max_rows: int = 25) -> RenderableType:
    """A result as a rich renderable: its table (first ``max_rows`` rows), labels and what is missing."""
    heading = f"{result.id}  {result.title}"
    if result.missing:
        return Text.assemble(
            (heading, "bold"),
            (f"\n  not available: missing {', '.join(result.missing)}. ", "yellow"),
            (result.hint, "dim"),
        )
    table = Table(
        title=Text(heading, style="bold"),
        title_justify="left",
        caption=_caption(result, max_rows),
        caption_justify="left",
    )
    for c in result.columns:
        numeric = c.numeric
        table.add_column(
            c.name + (f" ({_unit_label(c.unit)})" if c.unit in ("pct",) else ""),
            justify="right" if numeric else "left",
            overflow="fold",
            max_width=None if numeric else 70,
        )
    shown = result.rows[:max_rows]
    for row, units in zip(shown, cell_units(result.columns, shown), strict=True):
        # Text, not str: names from traces ("[param|cuda]") must not be read as rich markup
        table.add_row(*(Text(format_cell(v, c, u)) for v, c, u in zip(row, result.columns, units, strict=True)))
    if not result.rows:
        return Group(Text(heading, style="bold"), Text("  no rows: nothing of this kind in the run", style="dim"))
    return table


def _caption(result: Result, max_rows: int) -> str | None:
    parts = list(result.labels)
    hidden = max(0, len(result.rows) - max_rows) + result.truncated
    if hidden:
        parts.append(
            f"{hidden:,} more rows ({result.more if result.truncated and result.more else '--format csv for all'})"
        )
    return "; ".join(parts) or None


def _unit_label(unit: Unit) -> str:
    return "%" if unit == "pct" else unit


def _scaled(value: float, base: float, prefixes: tuple[str, ...], suffix: str) -> str:
    v, i = float(value), 0
    while abs(v) >= base and i < len(prefixes) - 1:
        v, i = v / base, i + 1
    if i == 0 and float(value).is_integer():
        number = f"{v:.0f}"
    else:  # three significant digits, never an exponent (1010 KiB, not 1.01e+03 KiB), rounded first (10237 B is
        # "10.0 KiB", not "10.00 KiB"; 1048575 B is "1.00 MiB", not "1024 KiB")
        number = three_digits(v).replace(",", "")
        if abs(float(number)) >= base and i < len(prefixes) - 1:
            v, i = v / base, i + 1
            number = three_digits(v)
    if suffix in ("FLOP", "FLOP/s"):
        return f"{number} {prefixes[i]}{suffix}"
    return f"{number} {prefixes[i]}{suffix}" if suffix else f"{number} {prefixes[i]}"


def _json_value(v: Any) -> Any:
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, tuple):
        return list(v)
    return v
