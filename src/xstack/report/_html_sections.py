"""The report's fixed sections: overview, recommendations, the system level, per-level overhead and trace
health."""

from __future__ import annotations

from collections.abc import Sequence

from xstack.analyze._io_common import recording_text
from xstack.analyze.pipeline import Analysis, Recommendation
from xstack.analyze.recommend import order
from xstack.analyze.result import Chart, Column, Result, format_ns
from xstack.analyze.summary import RunSummary, TopRow
from xstack.leveled.occasional import occasional_line
from xstack.report._charts import render_chart
from xstack.report._html_results import anchor, facts_html, labels_html, result_section, results_index
from xstack.report._html_table import static_table
from xstack.report._svg import esc
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
    system_line,
    top_caption,
    wall_line,
)

HEADLINE_RESULTS = (
    "A1",
    "timeline.breakdown",
    "A13",
    "timeline.launches",
    "timeline.syncs",
    "timeline.memory",
    "io.input_bound",
)
"""Results whose facts the overview shows first: step latency, busy and idle time, launches, syncs, memory, and
the time the loop waits for input."""

SYSTEM_PREFIX = "system."
"""Ids of the results the System section holds."""

LEVEL_TITLES = {"layer": "Top layers (inclusive time)", "op": "Top operators", "kernel": "Top GPU kernels"}


def overview(analysis: Analysis) -> str:
    """Where the time goes at a glance: the run, its step latency, headline facts and the top layers/kernels."""
    s = analysis.summary
    parts = ['<section id="overview"><h2>Overview</h2>', _cards(analysis)]
    for r in analysis.results:
        if r.id in HEADLINE_RESULTS and not r.missing and r.facts:
            parts.append(
                f'<div class="headline"><h4><a href="#{esc(anchor(r.id))}">{esc(r.id)}</a> {esc(r.title)}'
                f"{labels_html(r.labels)}</h4>{facts_html(r.facts, limit=12, labels=r.labels)}</div>"
            )
    parts.append('<div class="tops">')
    for level, title in LEVEL_TITLES.items():
        rows = s.top.get(level) or []
        if rows:
            chart = _top_chart(level, rows, s.share_of.get(level))
            captions = [c for c in (share_caption(s, level), top_caption(s, level)) if c]
            note = f'<p class="meta">{esc("; ".join(captions))}</p>' if captions else ""
            parts.append(f'<div class="top" data-level="{level}"><h4>{esc(title)}</h4>{note}{chart}</div>')
    parts.append("</div></section>")
    return "".join(parts)


def _cards(analysis: Analysis) -> str:
    s = analysis.summary
    cards = [("run", f"{s.run_id}: {s.name}")]
    if status := status_line(s):
        cards.append(("status", status))
    cards.append(("host wall time", wall_line(s)))
    if s.overhead and s.overhead[0].get("step_median_ns") is not None:
        first = s.overhead[0]
        cards.append((f"step latency ({first.get('pass')} pass median)", format_ns(first["step_median_ns"])))
    cards.append(("devices", devices_line(s)))
    if s.distributed and (rank := distributed_line(s.distributed)):
        cards.append(("distributed", rank))
    cards.append(("levels", ", ".join(s.levels) or ", ".join(s.span_counts) or "-"))
    cards.append(("spans", f"{sum(s.span_counts.values()):,}"))
    kernel_rows = s.top.get("kernel") or []
    if kernel_rows and kernel_rows[0].pct is not None:
        share = s.share_of.get("kernel", "of kernel time")
        cards.append(("top kernel share", f"{kernel_rows[0].pct:.1f}% {share}"))
    cards.append(("health findings", health_headline(s)))
    cards.append(("recommendations", f"{len(analysis.recommendations):,}"))
    body = "".join(
        f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>' for k, v in cards
    )
    size = batch_size_line(s)
    meta = [f"pass: {s.pass_name}" if s.pass_name else "", f"batch size: {size}" if size else "",
            f"source: {s.source}" if s.source else ""]  # fmt: skip
    if s.iterations:
        meta.append(f"iterations: {iterations_line(s.iterations)}")
    line = " · ".join(m for m in meta if m)
    system = f'<p class="meta">system: {esc(system_line(s.system))}</p>' if s.system else ""
    if s.io:
        system += f'<p class="meta">file I/O: {esc(io_line(s.io))}</p>'
    others = runs_line(s, "report")
    runs = f'<p class="meta runs">store: {esc(others)}</p>' if others else ""
    return f'<div class="cards">{body}</div>' + (f'<p class="meta">{esc(line)}</p>' if line else "") + runs + system


def share_caption(s: RunSummary, level: str) -> str | None:
    """What a level's shares are of, as the terminal's share column names it ("% of step (model+layer)"), where
    not of the wall time; in a merged run, that each level is timed in a pass of its own, so that a layer's time
    is not comparable with a model stage's or an operator's."""
    share = s.share_of.get(level)
    if not share:
        return None
    if s.pass_name == "merged" and level != "kernel":
        return f"each level is timed in a pass of its own (the levels below slow those above); shares are % {share}"
    return f"shares are % {share}"


def _top_chart(level: str, rows: Sequence[TopRow], share_of: str | None = None) -> str:
    share = f"% {share_of}" if share_of else "% of kernel time" if level == "kernel" else "% of wall"
    if all(r.total_ns is None for r in rows):  # kernels known by their counters only, untimed: their FLOPs
        result = Result(
            id=f"top.{level}",
            title=LEVEL_TITLES[level],
            columns=[Column("name"), Column("calls", "count"), Column("FLOPs", "flops")],
            rows=[(r.name, r.calls, r.flops) for r in rows],
            chart=Chart("hbar", "name", ("FLOPs",)),
        )
        return render_chart(result)
    # layers and ops whose calls nest: each bar its self time, then what the calls inside it took
    own = any(r.passed_on_ns for r in rows)
    nested = "in the calls inside it"
    columns = [Column("name"), Column("calls", "count"), Column("total", "ns"), Column(share, "pct")]
    chart = Chart("hbar", "name", ("total",), extra={"tip": (share,), "share": share})
    if own:
        columns += [Column("self", "ns"), Column(nested, "ns")]
        chart = Chart("stacked", "name", ("self", nested), extra={"tip": (share, "total"), "share": share})
    backward = any(r.backward_ns is not None for r in rows)  # layers of a training step: named in the tooltips
    if backward:
        columns.append(Column("backward", "ns"))
        chart = Chart(chart.kind, chart.x, chart.y, extra={**chart.extra, "tip": (*chart.extra["tip"], "backward")})
    result = Result(
        id=f"top.{level}",
        title=LEVEL_TITLES[level],
        columns=columns,
        rows=[
            (
                f"{r.name} ({r.type})" if r.type else r.name,
                r.calls,
                r.total_ns,
                r.pct,
                *([r.self_ns, r.passed_on_ns] if own else []),
                *([r.backward_ns] if backward else []),
            )
            for r in rows
        ],  # fmt: skip
        chart=chart,
    )
    return render_chart(result)


def system_results(results: Sequence[Result]) -> list[Result]:
    """The results the System section shows: the system analyses, when at least one of them has data (else they
    stay among the other analyses, each saying what is missing)."""
    chosen = [r for r in results if r.id.startswith(SYSTEM_PREFIX)]
    return chosen if any(not r.missing for r in chosen) else []


def system(analysis: Analysis) -> str:
    """The System section: the run's system figures in brief, then each system analysis with its chart and
    table; empty when the run has no system data."""
    chosen = system_results(analysis.results)
    if not chosen:
        return ""
    s = analysis.summary.system or {}
    runs = [f"counters from run {s['counters_run']}" if s.get("counters_run") is not None else "",
            f"system calls from run {s['syscalls_run']}" if s.get("syscalls_run") is not None else ""]  # fmt: skip
    lead = system_line(s) if s else "System level data."
    where = "; ".join(r for r in runs if r)
    body = "".join(result_section(r) for r in chosen)
    return (
        f'<section id="system"><h2>System</h2><p class="note">{esc(lead)}</p>'
        + (f'<p class="meta">{esc(where)}</p>' if where else "")
        + f"{results_index(chosen)}{body}</section>"
    )


def recommendations(recs: Sequence[Recommendation], results: Sequence[Result]) -> str:
    """Each rule that fired: severity, evidence, the action, the analyses it read (linked) and the time at stake."""
    parts = ['<section id="recommendations"><h2>Recommendations</h2>']
    if not recs:
        ran = ", ".join(r.id for r in results if not r.missing) or "none"
        parts.append(f'<p class="note">No rule fired on this run (analyses with data: {esc(ran)}).</p>')
    known = {r.id for r in results}
    ordered = sorted(recs, key=order)
    for rec in ordered:
        sources = ", ".join(
            f'<a href="#{esc(anchor(src))}">{esc(src)}</a>' if src in known else esc(src) for src in rec.sources
        )
        stake = f"At stake: about {format_ns(rec.impact_ns)} per {rec.impact_per}" if rec.impact_ns else ""
        impact = f'<p class="impact">{esc(stake)}</p>' if stake else ""
        evidence = "".join(f"<li>{esc(e)}</li>" for e in rec.evidence)
        parts.append(
            f'<article class="rec {esc(rec.severity)}" data-rule="{esc(rec.rule)}">'
            f'<h3><span class="sev">{esc(rec.severity)}</span> {esc(rec.title)}</h3>'
            f'<ul class="evidence">{evidence}</ul><p class="action"><strong>Do:</strong> {esc(rec.action)}</p>'
            f'{impact}<p class="sources">From: {sources or "-"}</p></article>'
        )
    parts.append("</section>")
    return "".join(parts)


def overhead(summary: RunSummary) -> str:
    """What each leveled pass's levels add to the step latency (``summary.overhead``), and noisy spans."""
    parts = ['<section id="overhead"><h2>Per-level overhead</h2>']
    io = summary.io or {}
    if io.get("recording_ns") is not None and io.get("recording_cpu_ns"):
        parts.append(
            f'<p class="note" id="io-recording">The io level measured its own cost in the processes it recorded: '
            f"{esc(recording_text(io['recording_ns'], io['recording_cpu_ns']))}, its work on the calls' path "
            "(io.processes, column recording); what its memory traffic costs the program's own code is not in it.</p>"
        )
    if not summary.overhead:
        parts.append(
            '<p class="note">Not a leveled measurement, so no per-level overhead: <code>xstack profile</code> runs '
            "one pass per level and merges them, measuring what each level adds to the step latency.</p></section>"
        )
        return "".join(parts)
    rows = []
    for o in summary.overhead:
        added, pct = o.get("added_ns"), o.get("added_pct")
        rows.append([
            str(o.get("pass")),
            overhead_adds(o),
            str(o.get("iterations", "-")),
            format_ns(o.get("step_median_ns") or 0),
            "reference" if added is None else ("+" if added >= 0 else "") + format_ns(added),
            "-" if pct is None else f"{pct:+.1f}%",
            overhead_note(o),
        ])  # fmt: skip
    head = ["pass", "adds levels", "iterations", "step median", "added", "added %", "vs noise"]
    parts.append(static_table(head, rows, numeric=(2, 3, 4, 5)))
    noisy = ", ".join(f"{lv} {n:,} of {total:,}" for lv, (n, total) in summary.noisy_spans.items() if n)
    if summary.pass_name == "merged":
        parts.append(f'<p class="note">Noisy spans (p95 - p5 over half the median): {esc(noisy or "none")}.</p>')
    if summary.occasional:
        parts.append(f'<p class="note">Only in some iterations: {esc(occasional_line(summary.occasional))}.</p>')
    parts.append("</section>")
    return "".join(parts)


def health(summary: RunSummary, results: Sequence[Result]) -> str:
    """The trace's health: the findings (what the trace missed: orphans, dropped events, unpaired flows, caps
    hit), then the informational rows, which are not findings."""
    parts = ['<section id="health"><h2>Trace health</h2>']
    head = ["check", "count", "what it means"]
    if summary.health:
        parts.append(f'<p class="note">{esc(health_headline(summary).capitalize())}.</p>')
        rows = [[check, f"{count:,}", detail] for check, count, detail in summary.health]
        parts.append(static_table(head, rows, numeric=(1,)))
    else:
        parts.append('<p class="note ok">No findings: every span was attributed and no events were dropped.</p>')
    if summary.health_info:
        rows = [[check, f"{count:,}", detail] for check, count, detail in summary.health_info]
        parts.append("<h4>For information (not findings)</h4>" + static_table(head, rows, numeric=(1,)))
    if any(r.id == "health" for r in results):
        parts.append(f'<p class="note">Details per check: <a href="#{anchor("health")}">the health analysis</a>.</p>')
    parts.append("</section>")
    return "".join(parts)
