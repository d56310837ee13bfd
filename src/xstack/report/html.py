"""The HTML report: one self-contained file that works offline, written by ``write_report``.

Sections: overview, recommendations, every analysis (chart and sortable, paginated table), the system level's
analyses (when the run has system data), the comparison with another profile when given, per-level overhead,
trace health, and the Perfetto trace to download. Charts are inline SVG drawn in Python; the page's own small
script and style sheet (``assets/``) are inlined; a Content-Security-Policy forbids the page any request. Every
name from a trace is escaped, in the markup and in the JSON the tables are drawn from.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal, Protocol

from xstack import __version__
from xstack.analyze.pipeline import Analysis
from xstack.analyze.result import Result
from xstack.errors import XstackError
from xstack.outfile import cannot_write, check_output, partial_file
from xstack.report._html_results import anchor, missing_section, result_section, results_index
from xstack.report._html_sections import health, overhead, overview, recommendations, system, system_results
from xstack.report._html_trace import DEFAULT_TRACE_CAP_BYTES, trace_section
from xstack.report._svg import esc
from xstack.trace.store import Store

__all__ = ["COMPARISON_LEAD", "DEFAULT_TRACE_CAP_BYTES", "Comparison", "Written", "render_html", "write_report"]

COMPARISON_LEAD = "This report's run is B; A is the baseline given with --compare."

CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:"
"""The page may run and style only what it carries: no request can leave it (downloads are navigations)."""


class Comparison(Protocol):
    """What the report needs of a comparison of two profiles (``xstack.analyze.diff``): its results, and a
    heading that names both runs (``A: path run N "name" (pass)``, then ``B: ...``)."""

    @property
    def results(self) -> Sequence[Result]: ...

    def heading(self) -> str: ...


@dataclass
class Written:
    """What ``write_report`` wrote: the report, its size, and where the Perfetto trace went."""

    path: Path
    bytes: int
    trace: Literal["embedded", "beside", "none"]
    trace_path: Path | None = None

    def describe(self) -> str:
        """One line for the terminal."""
        where = {"embedded": "trace embedded", "none": "no trace"}.get(self.trace) or f"trace beside: {self.trace_path}"
        return f"{self.path} ({self.bytes / 2**20:.1f} MiB, {where})"


def write_report(
    analysis: Analysis,
    out_path: str | os.PathLike[str],
    *,
    store: Store | None = None,
    compare: Comparison | None = None,
    trace_cap_bytes: int = DEFAULT_TRACE_CAP_BYTES,
) -> Written:
    """Write the HTML report of ``analysis`` to ``out_path``.

    ``store`` (the analysed store) lets the report carry the run's Perfetto trace: embedded when its gzipped
    size is at most ``trace_cap_bytes``, else written beside the report as ``<name>.perfetto.json.gz``.
    ``compare`` (a ``ProfileDiff``) adds a Comparison section with its results. The file is written as
    ``out_path.partial`` and renamed into place once complete.
    """
    out = Path(out_path)
    check_output(out)
    summary = analysis.summary
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        trace = trace_section(store, summary.run_id, summary.name, out, trace_cap_bytes)
    except OSError as exc:
        raise cannot_write(out, exc) from exc
    page = render_html(analysis, compare=compare, trace_html=trace.html)
    with partial_file(out) as partial:
        partial.write_text(page, encoding="utf-8")
    return Written(out, out.stat().st_size, trace.mode, trace.path)


def render_html(analysis: Analysis, *, compare: Comparison | None = None, trace_html: str = "") -> str:
    """The report page as one string (``write_report`` adds the trace section and writes it)."""
    s = analysis.summary
    in_system = {id(r) for r in system_results(analysis.results)}
    system_html = system(analysis)
    sections = [
        overview(analysis),
        recommendations(analysis.recommendations, analysis.results),
        _analyses([r for r in analysis.results if id(r) not in in_system]),
        system_html,
    ]
    if compare is not None:
        sections.append(_comparison(compare))
    sections += [overhead(s), health(s, analysis.results), trace_html]
    nav = [("overview", "Overview"), ("recommendations", "Recommendations"), ("analyses", "Analyses")]
    io = next((r for r in analysis.results if r.id.startswith("io.") and not r.missing), None)
    if io is not None:  # a run with I/O: a link straight to its I/O analyses, which follow the timeline ones
        nav.append((anchor(io.id), "I/O"))
    if system_html:
        nav.append(("system", "System"))
    if compare is not None:
        nav.append(("comparison", "Comparison"))
    nav += [("overhead", "Overhead"), ("health", "Health")] + ([("trace", "Trace")] if trace_html else [])
    title = f"xstack report: {s.name} (run {s.run_id})"
    links = "".join(f'<a href="#{i}">{t}</a>' for i, t in nav)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_asset('report.css')}</style></head><body>"
        f"<header><h1>{esc(title)}</h1><nav>{links}</nav></header>"
        f"<main>{''.join(sections)}</main>"
        f"<footer>Written by xstack {esc(__version__)}. Works offline; nothing here makes a request.</footer>"
        f"<script>{_asset('report.js')}</script></body></html>\n"
    )


def _analyses(results: Sequence[Result]) -> str:
    body = "".join(result_section(r) for r in results if not r.missing) + missing_section(results)
    missing = sum(1 for r in results if r.missing)
    lead = f"{len(results)} analyses" + (f"; {missing} not available for this run (listed last, with what they need)"
                                         if missing else "")  # fmt: skip
    return (
        f'<section id="analyses"><h2>Analyses</h2><p class="note">{esc(lead)}.</p>'
        f"{results_index(results)}{body}</section>"
    )


def _comparison(compare: Comparison) -> str:
    results = list(compare.results)
    body = "".join(result_section(r, prefix="cmp") for r in results)
    return (
        f'<section id="comparison"><h2>Comparison</h2><p class="note">{esc(COMPARISON_LEAD)}</p>'
        f'<pre class="note">{esc(compare.heading())}</pre>'
        f"{results_index(results, prefix='cmp')}{body}</section>"
    )


def _asset(name: str) -> str:
    """A bundled asset's text; a ``</`` inside it would end the element it is inlined in, so it has none."""
    text = resources.files("xstack.report").joinpath("assets", name).read_text(encoding="utf-8")
    if "</" in text:  # pragma: no cover - guarded by the package's own tests
        raise XstackError(f"xstack/report/assets/{name} contains '</', which would end its inline element")
    return text
