"""One analysis result as a section of the HTML report: heading, labels, what is missing, facts, chart, table."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import orjson

from xstack.analyze.result import (
    Result,
    Unit,
    format_ns,
    format_value,
    literal_parts,
    missing_by_level,
    not_available_lead,
)
from xstack.report._charts import render_chart
from xstack.report._html_table import table_html
from xstack.report._svg import clip, esc
from xstack.text import counted

_RATES: tuple[tuple[re.Pattern[str], Unit], ...] = (
    (re.compile(r"(^|_)bytes_per_s($|_)|(^|_)bandwidth($|_)"), "bytes/s"),
    (re.compile(r"(^|_)flops?_per_s($|_)"), "flop/s"),
)
"""Rates, read from anywhere in a fact's key (``peak_dram_bytes_per_s``, ``dtoh_bandwidth``; not
``bytes_per_step``)."""

_IDS = {"pid", "tid", "id"}
"""Last words of keys whose values are identifiers, shown as they are (no thousands separators)."""

_UNIT_WORDS: dict[str, Unit] = {"ns": "ns", "pct": "pct", "bytes": "bytes", "flops": "flops"}
"""Units named by a word of a fact's key, the last such word winning (``launch_ns_per_step``, ``bytes_read``,
``dataloader_pct_of_steps``)."""

_SECONDS = {"s": 1e9, "ms": 1e6, "us": 1e3}
"""Durations named by the last word of a key (``interval_ms``, ``run_time_s``), as nanoseconds per unit."""

_SUFFIXES = {"c": "°C", "w": "W", "mhz": "MHz"}
"""Other units named by the last word of a key (``temp_max_c``)."""


LONG_FACT_CHARS = 80
"""Facts longer than this (in characters) are set as a paragraph rather than a headline number."""


def anchor(result_id: str, prefix: str = "r") -> str:
    """The HTML id of a result's section: ``r-A8``, ``r-timeline-breakdown``; comparison results use ``cmp``."""
    return f"{prefix}-" + re.sub(r"[^A-Za-z0-9_-]", "-", result_id)


def fact_text(key: str, value: Any) -> str:
    """A fact's value as text for people: its unit taken from the key (``_ns``, ``_pct``, ``bytes``, ``_ms``...)
    and the value scaled to it, else a plain number with thousands separators and no exponent."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return _number_text(key, value)
    if isinstance(value, str):
        return value
    return clip(orjson.dumps(value, default=str).decode(), 200)


def _number_text(key: str, value: float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "-"
    last = key.lower().split("_")[-1]
    if last in _IDS:
        return str(value)
    unit = fact_unit(key)
    if unit in ("bytes/s", "flop/s"):
        return format_value(value, unit)
    if last in _SECONDS:
        return format_ns(value * _SECONDS[last])
    if last in _SUFFIXES:
        return f"{plain_number(value)} {_SUFFIXES[last]}"
    return format_value(value, unit) if unit else plain_number(value)


def fact_unit(key: str) -> Unit:
    """The unit a fact's key names in its words (``""`` where none; durations in ``_s``/``_ms`` aside)."""
    low = key.lower()
    for pattern, unit in _RATES:
        if pattern.search(low):
            return unit
    return next((_UNIT_WORDS[w] for w in reversed(low.split("_")) if w in _UNIT_WORDS), "")


def plain_number(value: float) -> str:
    """A number without a unit: integers with thousands separators, others to three significant digits (whole
    numbers from 100 up), never in exponent notation."""
    if isinstance(value, int) or value.is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1e-4:
        return f"{value:.3g}"  # no exponent in this range
    return f"{value:.10f}".rstrip("0")


def fact_label(key: str) -> str:
    """A fact's key as a label, without the unit its value shows: ``busy_ns`` -> "busy", ``busy_pct`` ->
    "busy %", ``launch_ns_per_step`` -> "launch per step", ``interval_ms`` -> "interval"."""
    words = key.split("_")
    if words[-2:] == ["per", "s"] and len(words) > 2:  # a rate: its value says "/s"
        words = words[:-2]
    elif len(words) > 1 and words[-1].lower() in {*_SECONDS, *_SUFFIXES, "bytes"}:
        words = words[:-1]
    words = [w for w in words if w != "ns"] or words
    return " ".join("%" if w == "pct" else w for w in words)


def facts_html(facts: dict[str, Any], limit: int = 24, labels: Sequence[str] = ()) -> str:
    """A result's headline numbers as a definition list: the first ``limit`` plain values (nested ones, such
    as per-device breakdowns, are in the JSON report); a text that one of the result's ``labels`` (shown beside
    it) already says is left out."""
    plain = [(k, v) for k, v in facts.items() if v is None or isinstance(v, (str, int, float, bool))]
    plain = [(k, v) for k, v in plain if not (isinstance(v, str) and len(v) > 20 and any(v in lb for lb in labels))]
    items = plain[:limit]
    if not items:
        return ""
    labels = [fact_label(k) for k, _ in items]
    # a duration and the word that says what it measures ("window": "steps", "window_ns") would read the same
    labels = [f"{lb} length" if labels.count(lb) > 1 and k.split("_")[-1] in {"ns", *_SECONDS} else lb
              for lb, (k, _) in zip(labels, items, strict=True)]  # fmt: skip
    body = "".join(_fact(lb, fact_text(k, v)) for lb, (k, v) in zip(labels, items, strict=True))
    left = len(facts) - len(items)
    more = f'<p class="note">{left:,} more facts in the JSON report (--format json)</p>' if left else ""
    return f'<dl class="facts">{body}</dl>{more}'


def prose_html(text: str) -> str:
    """Text from a docstring or notes as HTML: escaped, its reST ``literals`` as ``<code>``."""
    return "".join(f"<code>{esc(p)}</code>" if literal else esc(p) for p, literal in literal_parts(text))


def _fact(label: str, text: str) -> str:
    # a long name (a kernel's full template signature) takes a line of its own in plain type, wrapped anywhere
    cls = "fact long" if len(text) > LONG_FACT_CHARS else "fact"
    return f'<div class="{cls}"><dt>{esc(label)}</dt><dd>{esc(text)}</dd></div>'


def labels_html(labels: Sequence[str]) -> str:
    """The result's caveats (e.g. "FLOPs and bytes: analytic") as badges shown beside it."""
    return "".join(f'<span class="label">{esc(lb)}</span>' for lb in labels)


def result_section(result: Result, prefix: str = "r") -> str:
    """A result's whole section: a missing result says what is missing and how to get it; an empty one says so."""
    sid = anchor(result.id, prefix)
    status = "missing" if result.missing else ("empty" if not result.rows else "ok")
    head = (
        f'<section class="result {status}" id="{esc(sid)}" data-result="{esc(result.id)}">'
        f'<h3><span class="rid">{esc(result.id)}</span> {esc(result.title)}</h3>'
    )
    parts = [head]
    if result.labels:
        parts.append(f'<div class="labels">{labels_html(result.labels)}</div>')
    if result.missing:
        parts.append(
            f'<div class="missing"><strong>Not available:</strong> missing {esc(", ".join(result.missing))}.'
            f'<p class="hint">How to get it: {esc(result.hint or "record the missing levels")}</p></div>'
        )
    if result.notes:
        notes = f"<p>{prose_html(result.notes)}</p>"
        parts.append(f'<details class="notes"><summary>How this is computed</summary>{notes}</details>')
    if not result.missing:
        parts.append(facts_html(result.facts, labels=result.labels))
        if result.rows:
            parts.append(render_chart(result))
            parts.append(table_html(f"{sid}-table", result))
        else:
            parts.append('<p class="note">No rows: nothing of this kind in the run.</p>')
    parts.append("</section>")
    return "".join(parts)


def missing_section(results: Sequence[Result], prefix: str = "r") -> str:
    """The results the run lacks a level (or input) for, in one section after the others: a row per missing
    level with how to get it and the results that need it, each result's name carrying its anchor (the index
    links to it); empty when none is missing."""
    missing = [r for r in results if r.missing]
    if not missing:
        return ""
    seen: set[str] = set()
    rows = []
    for level, (hint, rs) in missing_by_level(missing).items():
        names = []
        for r in rs:  # the anchor on a result's first mention (a result missing two levels is named twice)
            at = f' id="{esc(anchor(r.id, prefix))}" data-result="{esc(r.id)}"' if r.id not in seen else ""
            seen.add(r.id)
            names.append(f'<span class="needed"{at}><span class="rid">{esc(r.id)}</span> {esc(r.title)}</span>')
        rows.append(f"<tr><th>{esc(level)}</th><td>{esc(hint)}</td><td>{'; '.join(names)}</td></tr>")
    lead = not_available_lead(len(missing)) + "."
    return (
        f'<section class="result missing" id="{esc(anchor("not-available", prefix))}">'
        f'<h3>Not available for this run</h3><p class="note">{esc(lead)}</p>'
        '<table class="missing-levels"><thead><tr><th>missing</th><th>how to get it</th><th>needed by</th></tr>'
        f"</thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def results_index(results: Sequence[Result], prefix: str = "r") -> str:
    """A compact list of the results, each linking to its section and saying whether it is available."""
    items = []
    for r in results:
        state = "missing " + ", ".join(r.missing) if r.missing else counted(len(r.rows), "row")
        cls = "missing" if r.missing else "ok"
        items.append(
            f'<li class="{cls}"><a href="#{esc(anchor(r.id, prefix))}">{esc(r.id)}</a> {esc(r.title)} '
            f'<span class="state">({esc(state)})</span></li>'
        )
    return f'<ul class="index">{"".join(items)}</ul>'
