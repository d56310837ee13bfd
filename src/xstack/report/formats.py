"""Reports for CI and scripts: an analysis as markdown, JSON or CSV text.

- ``md``: the run, the recommendations, and every result as a table (all its rows, cells formatted with
  units as in the terminal); a missing result is one line saying what is missing and how to get it. Trace
  health closes the document, once: its findings, the informational rows, and the unattributed device time.
- ``json``: one object: ``summary`` (the ``RunSummary`` fields), ``recommendations``, ``results`` (each
  ``Result.to_dict()``: columns with units, raw rows, facts, missing and hint) and, with a comparison,
  ``comparison`` (its results the same way).
- ``csv``: one table for every result: the columns ``analysis``, ``missing`` and ``hint``, then the union of
  all results' columns named ``name [unit]``. A result's rows are the lines whose ``analysis`` is its id (raw
  values; cells of other results' columns stay empty); a missing result is one line with ``missing`` and
  ``hint`` set. Comparison results have ids prefixed ``compare/``. Recommendations are in md and json only.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from xstack.analyze.pipeline import Analysis, Recommendation
from xstack.analyze.result import Result, cell_units, format_cell, format_ns, missing_by_level, not_available_lead
from xstack.analyze.summary import RunSummary
from xstack.errors import UsageError
from xstack.report.html import COMPARISON_LEAD, Comparison
from xstack.report.terminal import (
    batch_size_line,
    devices_line,
    distributed_line,
    health_headline,
    io_line,
    iterations_line,
    overhead_adds,
    overhead_note,
    runs_line,
    status_line,
    wall_line,
)

HEALTH = "health"
"""The id of the health analysis, which markdown shows once, in its closing Trace health section."""

FORMATS = ("md", "json", "csv")
"""The text formats (``html`` is written by ``xstack.report.html.write_report``)."""

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\|<>*[]`&"} | {"\n": " ", "\r": " "})


def render_text(analysis: Analysis, fmt: str, *, compare: Comparison | None = None) -> str:
    """The analysis as ``md``, ``json`` or ``csv`` text."""
    if fmt == "md":
        return render_markdown(analysis, compare=compare)
    if fmt == "json":
        return render_json(analysis, compare=compare)
    if fmt == "csv":
        return render_csv(analysis, compare=compare)
    raise UsageError(f"unknown report format {fmt!r} (choose from html, {', '.join(FORMATS)})")


def write_format(analysis: Analysis, out: str | os.PathLike[str], fmt: str, *,
                 compare: Comparison | None = None) -> Path:  # fmt: skip
    """Write the analysis as ``md``, ``json`` or ``csv`` to ``out`` (UTF-8); returns the path written."""
    path = Path(out)
    text = render_text(analysis, fmt, compare=compare)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def render_json(analysis: Analysis, *, compare: Comparison | None = None) -> str:
    """One JSON object: summary, recommendations and results (``Result.to_dict``), and the comparison."""
    doc: dict[str, Any] = {
        "summary": dataclasses.asdict(analysis.summary),
        "recommendations": [dataclasses.asdict(r) for r in analysis.recommendations],
        "results": [r.to_dict() for r in analysis.results],
    }
    if compare is not None:
        doc["comparison"] = [r.to_dict() for r in compare.results]
    return orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"


def render_csv(analysis: Analysis, *, compare: Comparison | None = None) -> str:
    """Every result's rows in one CSV, told apart by the ``analysis`` column (see the module's notes)."""
    results = [(r.id, r) for r in analysis.results]
    if compare is not None:
        results += [(f"compare/{r.id}", r) for r in compare.results]
    header: dict[str, int] = {}
    for _, r in results:
        for c in r.columns:
            header.setdefault(f"{c.name} [{c.unit}]" if c.unit else c.name, len(header))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["analysis", "missing", "hint", *header])
    for rid, r in results:
        if r.missing:
            w.writerow([rid, ", ".join(r.missing), r.hint] + [""] * len(header))
            continue
        where = [header[f"{c.name} [{c.unit}]" if c.unit else c.name] for c in r.columns]
        for row in r.rows:
            cells: list[Any] = [""] * len(header)
            for pos, value in zip(where, row, strict=True):
                cells[pos] = _csv_value(value)
            w.writerow([rid, "", "", *cells])
    return buf.getvalue()


def render_markdown(analysis: Analysis, *, compare: Comparison | None = None) -> str:
    """The report as markdown: run, recommendations, every result as a table, overhead and health."""
    s = analysis.summary
    out = [f"# xstack report: {md(s.name)} (run {s.run_id})", ""]
    facts = [
        ("source", s.source or "-"),
        ("pass", s.pass_name or "-"),
        ("host wall time", wall_line(s)),
        *([("iterations", iterations_line(s.iterations))] if s.iterations else []),
        ("devices", devices_line(s)),
        *([("distributed", rank)] if s.distributed and (rank := distributed_line(s.distributed)) else []),
        ("spans", ", ".join(f"{lv} {n:,}" for lv, n in s.span_counts.items()) or "none"),
        *([("file I/O", io_line(s.io))] if s.io else []),
    ]
    if status := status_line(s):
        facts.insert(2, ("status", status))
    if others := runs_line(s, "report"):
        facts.insert(2, ("store", others))
    if size := batch_size_line(s):
        facts.insert(2, ("batch size", size))
    out += ["| run | |", "|---|---|", *(f"| {k} | {md(v)} |" for k, v in facts), ""]
    out += ["## Recommendations", ""]
    out += _md_recommendations(analysis.recommendations) or ["No rule fired on this run.", ""]
    out += ["## Analyses", ""]
    shown = [r for r in analysis.results if r.id != HEALTH]  # the closing Trace health section shows it
    for r in shown:
        if not r.missing:
            out += md_result(r)
    out += _md_not_available([r for r in shown if r.missing])
    if compare is not None:
        out += ["## Comparison", "", md(COMPARISON_LEAD), ""]
        out += [f"- {md(line)}" for line in compare.heading().splitlines()] + [""]
        for r in compare.results:
            out += md_result(r)
    if s.overhead:
        out += ["## Per-level overhead", "", "| pass | adds levels | step median | added | vs noise |",
                "|---|---|--:|--:|---|"]  # fmt: skip
        for o in s.overhead:
            added = o.get("added_ns")
            out.append(
                f"| {md(o.get('pass'))} | {md(overhead_adds(o))} | "
                f"{format_ns(o.get('step_median_ns') or 0)} | {'reference' if added is None else format_ns(added)} | "
                f"{md(overhead_note(o))} |"
            )
        out.append("")
    return "\n".join(out + _md_health(s, next((r for r in analysis.results if r.id == HEALTH), None)))


def _md_health(s: RunSummary, result: Result | None) -> list[str]:
    """The findings (what the trace missed), then the informational rows, which are not findings; with the
    health analysis, the unattributed share of device time."""
    out = ["## Trace health", "", health_headline(s).capitalize() + ".", ""]
    pct = result.facts.get("unattributed_device_pct") if result is not None else None
    if pct is not None:
        out += [f"Device time with no launching call (charged to no op or layer): {pct:.1f}%.", ""]
    head = ["| check | count | what it means |", "|---|--:|---|"]
    if s.health:
        out += head + [f"| {md(c)} | {n:,} | {md(d)} |" for c, n, d in s.health] + [""]
    if s.health_info:
        out += ["For information (not findings):", "", *head]
        out += [f"| {md(c)} | {n:,} | {md(d)} |" for c, n, d in s.health_info] + [""]
    return out


def _md_not_available(results: Sequence[Result]) -> list[str]:
    """The analyses the run lacks a level (or input) for, in one table after the others: a row per missing level
    with how to get it and every analysis that needs it, instead of a section each repeating the hint."""
    if not results:
        return []
    out = ["### Not available for this run", "", not_available_lead(len(results)) + ":", ""]
    out += ["| missing | how to get it | needed by |", "|---|---|---|"]
    for level, (hint, rs) in missing_by_level(results).items():
        out.append(f"| {md(level)} | {md(hint)} | {md('; '.join(f'{r.id} {r.title}' for r in rs))} |")
    return [*out, ""]


def md_result(r: Result) -> list[str]:
    """One result in markdown: heading, labels, then its table, or one line saying what is missing."""
    lines = [f"### {md(r.id)} {md(r.title)}", ""]
    if r.labels:
        lines += ["_" + md("; ".join(r.labels)) + "_", ""]
    if r.missing:
        return [*lines, f"Not available: missing {md(', '.join(r.missing))}. {md(r.hint)}", ""]
    if not r.rows:
        return [*lines, "No rows: nothing of this kind in the run.", ""]
    head = [md(c.name + (" (%)" if c.unit == "pct" else "")) for c in r.columns]
    align = ["--:" if c.numeric else "---" for c in r.columns]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(md(format_cell(v, c, u)) for v, c, u in zip(row, r.columns, units, strict=True))
              + " |" for row, units in zip(r.rows, cell_units(r.columns, r.rows), strict=True)]  # fmt: skip
    if r.truncated:
        lines += ["", f"{r.truncated:,} more rows left out by the analysis."]
    return [*lines, ""]


def md(text: object) -> str:
    """Text for a markdown table cell or heading: the characters markdown would read as markup escaped."""
    return str(text).translate(_MD_SPECIAL)


def _md_recommendations(recs: Sequence[Recommendation]) -> list[str]:
    lines: list[str] = []
    for rec in recs:
        lines += [f"### [{rec.severity.upper()}] {md(rec.title)}", ""]
        lines += [f"- {md(e)}" for e in rec.evidence]
        lines += ["", f"**Do:** {md(rec.action)}", ""]
        stake = f"; at stake: about {format_ns(rec.impact_ns)} per {rec.impact_per}" if rec.impact_ns else ""
        lines += [f"From: {md(', '.join(rec.sources) or '-')}{stake}", ""]
    return lines


def _csv_value(v: Any) -> Any:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, (list, tuple, dict)):
        return orjson.dumps(v, default=str).decode()
    return v
