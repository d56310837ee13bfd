"""Temporal breakdown per device: busy, idle, and the idle time split by what the device waited for."""

from __future__ import annotations

from typing import Any

from xstack.analyze._runtime_api import class_params, class_sql
from xstack.analyze._timeline_common import (
    ACTIVITY_CTE,
    DATALOADER,
    DEVICE_ACTIVITY,
    NEG,
    POS,
    SYNC_CALLS,
    SYNC_FILTER,
    as_int,
    measured_window,
    notes_of,
    pct,
    rows,
)
from xstack.analyze.context import DEVICE_LEVELS, merged, run_context
from xstack.analyze.result import Chart, Column, Result
from xstack.trace.store import Store

ID = "timeline.breakdown"
TITLE = "Temporal breakdown per device"
CAUSES = ("host_wait", "sync_wait", "input_wait", "other_idle")

_PIECES = """
CREATE OR REPLACE TEMP TABLE {table} AS
WITH {activity},
windows AS (SELECT s, e FROM {window}),
busy_rows AS (
    SELECT device, s, e, launch, sum(CASE WHEN s > prev THEN 1 ELSE 0 END)
        OVER (PARTITION BY device ORDER BY s, launch NULLS LAST, e ROWS UNBOUNDED PRECEDING) AS grp
    FROM (SELECT *, coalesce(max(e) OVER (PARTITION BY device ORDER BY s, launch NULLS LAST, e
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), s - 1) AS prev
          FROM activity)
),
busy AS (
    -- a busy stretch, and the launch of the activity that opened it (the one the gap before it waited for)
    SELECT device, min(s) AS s, max(e) AS e, arg_min(launch, (s, coalesce(launch, {pos}))) AS next_launch
    FROM busy_rows GROUP BY device, grp
),
gaps AS (
    SELECT device, coalesce(lag(e) OVER (PARTITION BY device ORDER BY s), {neg}) AS g0, s AS g1, next_launch,
        false AS trailing
    FROM busy
    UNION ALL
    SELECT device, max(e), {pos}, NULL, true FROM busy GROUP BY device
),
pieces AS (
    SELECT g.device, greatest(g.g0, w.s) AS p0, least(g.g1, w.e) AS p1, g.next_launch, g.trailing
    FROM gaps g JOIN windows w ON g.g0 < w.e AND g.g1 > w.s
),
syncs AS (
    -- how far the host was held in a sync call that started by each instant (calls on several threads overlap;
    -- the default RANGE frame gives calls that start together the same reach)
    SELECT start_ns AS s, max(start_ns + dur_ns) OVER (ORDER BY start_ns) AS reach
    FROM spans WHERE run_id = $run AND {sync_filter}
)
SELECT p.device, p.p0, p.p1,
    CASE WHEN coalesce(sy.reach >= p.p0, false) THEN 'sync_wait'
         WHEN p.trailing OR p.next_launch >= p.p0 THEN 'host_wait'
         ELSE 'other_idle' END AS cause
FROM pieces p ASOF LEFT JOIN syncs sy ON sy.s <= p.p0
WHERE p.p1 > p.p0
"""
"""Every idle piece of the window per device, with its cause (before the input-wait split), as a temp table."""

_LOADER = "loader_spans AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans WHERE run_id = $run AND {loader})"

_IDLE = """
WITH {loader_spans},
loading AS ({loading}),
input AS (
    SELECT c.device, c.p0, sum(least(c.p1, l.e) - greatest(c.p0, l.s)) AS ns
    FROM {pieces} c JOIN loading l ON l.s < c.p1 AND l.e > c.p0 GROUP BY c.device, c.p0
),
idle AS (
    SELECT c.device, sum(c.p1 - c.p0) AS idle_ns, sum(coalesce(i.ns, 0)) AS input_wait,
        sum(c.p1 - c.p0 - coalesce(i.ns, 0)) FILTER (WHERE c.cause = 'host_wait') AS host_wait,
        sum(c.p1 - c.p0 - coalesce(i.ns, 0)) FILTER (WHERE c.cause = 'sync_wait') AS sync_wait,
        sum(c.p1 - c.p0 - coalesce(i.ns, 0)) FILTER (WHERE c.cause = 'other_idle') AS other_idle
    FROM {pieces} c LEFT JOIN input i USING (device, p0) GROUP BY c.device
)
SELECT d.device, coalesce(idle_ns, 0), coalesce(host_wait, 0),
    coalesce(sync_wait, 0), coalesce(input_wait, 0), coalesce(other_idle, 0)
FROM (SELECT DISTINCT device FROM spans WHERE run_id = $run AND level IN {device_levels}) d
LEFT JOIN idle USING (device)
ORDER BY d.device
"""

_WAITED = """
waits AS (
    -- the device's host waits (disjoint), each with the wait time before it: the wait up to an instant t is
    -- F(t) = before + least(t, p1) - p0 for the last wait with p0 <= t, and the wait inside [s, e) is F(e) - F(s)
    SELECT p0, p1, coalesce(sum(p1 - p0) OVER (ORDER BY p0 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
        AS before
    FROM {pieces} WHERE device = $device AND cause = 'host_wait'
)"""
"""The waits of ``$device`` for its host, with the cumulative wait before each (``_in_waits``)."""


def _in_waits(source: str) -> str:
    """SQL: the rows of ``source`` (with ``s``, ``e``) and ``waited``, the time of the host waits inside each
    interval ``[s, e)``, by two ASOF joins on the cumulative wait (an inequality join of every interval with
    every wait cost seconds on 10^5 of each)."""
    return f"""SELECT x.*, coalesce(b.before + least(x.e, b.p1) - b.p0, 0)
                   - coalesce(a.before + least(x.s, a.p1) - a.p0, 0) AS waited
        FROM {source} x ASOF LEFT JOIN waits a ON x.s >= a.p0 ASOF LEFT JOIN waits b ON x.e >= b.p0"""


_HOST_OPS = """
WITH {loader_spans},
loading AS ({loading}),
{waited},
ops AS (
    -- the outermost operators (an op's child ops are part of it), data loading left out: it is input wait
    SELECT o.name, o.start_ns AS s, o.start_ns + o.dur_ns AS e
    FROM spans o LEFT JOIN spans p ON p.run_id = $run AND p.span_id = o.parent_id
        ASOF LEFT JOIN loading l ON o.start_ns >= l.s
    WHERE o.run_id = $run AND o.level = 'op' AND o.dur_ns > 0 AND (p.level IS NULL OR p.level <> 'op')
        AND (l.e IS NULL OR o.start_ns >= l.e)
),
covered AS ({covered})
SELECT name, sum(waited) AS ns, (SELECT coalesce(sum(waited), 0) FROM ({covered_waited}))
FROM ({ops_waited}) WHERE waited > 0 GROUP BY name ORDER BY ns DESC, name LIMIT $top
"""
"""The operators the host ran while the device waited for it, and the time any ran (on any thread)."""

_HOST_CALLS = """
WITH {waited},
calls AS (
    SELECT span_id, name, dur_ns, start_ns AS s, start_ns + dur_ns AS e FROM spans
    WHERE run_id = $run AND level = 'runtime' AND dur_ns > 0
),
inside AS (SELECT * FROM ({calls_waited}) WHERE waited > 0),
grouped AS (
    -- per call name, the union of its calls (calls on several threads overlap)
    SELECT name, s, e, sum(CASE WHEN s > prev THEN 1 ELSE 0 END)
        OVER (PARTITION BY name ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp
    FROM (SELECT name, s, e, coalesce(max(e) OVER (PARTITION BY name ORDER BY s, e
                                                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), s - 1) AS prev
          FROM inside)
),
unions AS (SELECT name, min(s) AS s, max(e) AS e FROM grouped GROUP BY name, grp),
held AS (SELECT name, sum(waited) AS ns FROM ({unions_waited}) GROUP BY name)
SELECT h.name, {cls}, h.ns, count(DISTINCT c.span_id), max(c.dur_ns)
FROM held h JOIN inside c USING (name) GROUP BY ALL ORDER BY h.ns DESC, h.name LIMIT $top
"""
"""The runtime API calls the host was inside while the device waited for it: per call name, the time (ns) in
the waits, the calls and the longest call's whole duration."""

HOST_OPS_TOP = 5
"""Operators named in the facts (``host_wait_ops``)."""


def temporal_breakdown(store: Store, run_id: int) -> Result:
    """Per device, over the run's measured window: busy time, idle time, and the idle time split by cause.

    Times are ns; shares are percent of the window, so busy + the four idle causes add up to 100.

    Notes: the measured window is the union of the run's step spans (``prof.step()`` or ``ProfilerStep#N``),
    each stretched to the end of the device work launched during it; without steps, the extent of all the
    run's spans. A device is busy while any kernel, copy or memset runs on it (the union over all its
    streams). Each idle gap (within the window) gets one cause, following HolisticTraceAnalysis's rule for
    host wait: waiting on a sync when the host was blocked in a synchronising call (``cudaDeviceSynchronize``,
    ``cudaStreamSynchronize``, ``cudaEventSynchronize``, a synchronous ``cudaMemcpy``, their HIP and driver
    forms; implicit syncs such as ``.item()`` show up as these calls) at the moment the device went idle;
    else waiting for the host when the work that ended the gap was launched after the gap began, or nothing
    more was launched in the window; else other (the work was already queued and waited on something
    else: another stream, an event, the device's scheduler; HTA's "kernel wait" falls here). The part of any
    gap that overlaps a data-loading span (``model.kind = 'dataloader'`` or ``enumerate(DataLoader)#...``)
    is waiting for input instead, whatever the rest of the gap's cause. For the main device (the busiest),
    with the op level, the facts also say what the host did while the device waited for it: the outermost
    operators that ran in those waits (on any thread; data loading left out), by the time they ran there
    (``host_wait_ops``), and the wait during which no operator ran at all (``host_wait_outside_ops_ns``:
    Python code between operators, or work the trace does not record); with the runtime level, the API calls
    the host was inside during those waits, by the time (``host_wait_calls``: a ``cudaMalloc`` or a first
    launch that loads a kernel's module can hold the host for milliseconds inside a short operator).
    """
    ctx = run_context(store, run_id)
    missing = None if any(map(ctx.has, DEVICE_LEVELS)) else ctx.require(ID, TITLE, "kernel")
    if missing is not None:
        return missing
    window = measured_window(store, ctx.run_id)
    pieces = f"_tl_idle_{ctx.run_id}"
    rows(store, _PIECES.format(table=pieces, activity=ACTIVITY_CTE, window=window.table, sync_filter=SYNC_FILTER,
                               neg=NEG, pos=POS), ctx.run_id, sync=SYNC_CALLS)  # fmt: skip
    loader_spans = _LOADER.format(loader=DATALOADER)
    sql = _IDLE.format(loader_spans=loader_spans, loading=merged("loader_spans"), pieces=pieces,
                       device_levels=DEVICE_ACTIVITY)  # fmt: skip
    per_device = {str(r[0]): _device_facts(window.length_ns, r) for r in rows(store, sql, ctx.run_id)}
    main = max(per_device, key=lambda d: (per_device[d]["busy_ns"], d)) if per_device else None
    facts: dict[str, Any] = {"devices": per_device, "device": main, "window": window.kind, "steps": window.steps}
    if main is not None:
        facts.update(per_device[main])
        if ctx.has("op"):
            facts.update(_host_ops(store, ctx.run_id, pieces, main, per_device[main]["host_wait_ns"]))
        if ctx.has("runtime"):
            facts["host_wait_calls"] = _host_calls(store, ctx.run_id, pieces, main, per_device[main]["host_wait_ns"])
    return Result(
        id=ID,
        title=TITLE,
        run_id=ctx.run_id,
        columns=COLUMNS,
        rows=[_row(d, f) for d, f in per_device.items()],
        notes=notes_of(temporal_breakdown),
        chart=Chart(
            "stacked",
            x="device",
            y=tuple(c.name for c in COLUMNS if c.unit == "pct" and c.name != "idle share"),
            title="Where each device's time goes (% of the measured window)",
        ),
        facts=facts,
        labels=[] if window.kind == "steps" else ["no step spans: measured over the whole run"],
    )


COLUMNS = [
    Column("device"),
    Column("window", "ns", "length of the measured window"),
    Column("busy", "ns", "a kernel, copy or memset running on any stream"),
    Column("idle", "ns"),
    Column("host wait", "ns", "idle: the host had not yet launched the next work"),
    Column("sync wait", "ns", "idle: the host was blocked in a synchronisation while the queue drained"),
    Column("input wait", "ns", "idle during data loading"),
    Column("other idle", "ns", "idle with the next work already queued"),
    Column("busy share", "pct"),
    Column("idle share", "pct"),
    Column("host wait share", "pct"),
    Column("sync wait share", "pct"),
    Column("input wait share", "pct"),
    Column("other idle share", "pct"),
]


def _device_facts(window: int, r: tuple[Any, ...]) -> dict[str, Any]:
    idle = int(r[1])
    facts: dict[str, Any] = {"window_ns": window, "busy_ns": window - idle, "idle_ns": idle}
    facts.update({f"{cause}_ns": as_int(v) or 0 for cause, v in zip(CAUSES, r[2:6], strict=True)})
    for key in ("busy", "idle", *CAUSES):
        facts[f"{key}_pct"] = pct(facts[f"{key}_ns"], window)
    return facts


def _host_ops(store: Store, run_id: int, pieces: str, device: str, host_wait_ns: int) -> dict[str, Any]:
    """What the host ran while ``device`` waited for it: the top operators by the time they ran in those waits
    (``host_wait_ops``: op, ns, pct of the host wait) and the wait time when no operator ran at all."""
    sql = _HOST_OPS.format(loader_spans=_LOADER.format(loader=DATALOADER), loading=merged("loader_spans"),
                           waited=_WAITED.format(pieces=pieces), covered=merged("ops"),
                           covered_waited=_in_waits("covered"), ops_waited=_in_waits("ops"))  # fmt: skip
    found = rows(store, sql, run_id, device=device, top=HOST_OPS_TOP)
    covered = int(found[0][2]) if found else 0
    return {
        "host_wait_ops": [{"op": str(r[0]), "ns": int(r[1]), "pct": pct(int(r[1]), host_wait_ns)} for r in found],
        "host_wait_outside_ops_ns": max(host_wait_ns - covered, 0),
        "host_wait_outside_ops_pct": pct(max(host_wait_ns - covered, 0), host_wait_ns),
    }


def _host_calls(store: Store, run_id: int, pieces: str, device: str, host_wait_ns: int) -> list[dict[str, Any]]:
    """The runtime API calls the host was inside while ``device`` waited for it, by the time they held it there:
    call, class (``runtime.api``'s), ns and pct of the host wait, calls, the longest call's duration (ns)."""
    sql = _HOST_CALLS.format(waited=_WAITED.format(pieces=pieces), calls_waited=_in_waits("calls"),
                             unions_waited=_in_waits("unions"), cls=class_sql("h.name"))  # fmt: skip
    found = rows(store, sql, run_id, device=device, top=HOST_OPS_TOP, **class_params())
    return [
        {
            "call": str(r[0]),
            "class": str(r[1]),
            "ns": int(r[2]),
            "pct": pct(int(r[2]), host_wait_ns),
            "calls": int(r[3]),
            "longest_ns": int(r[4]),
        }  # fmt: skip
        for r in found
    ]


def _row(device: str, f: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("busy", "idle", *CAUSES)
    return (device, f["window_ns"], *(f[f"{k}_ns"] for k in keys), *(f[f"{k}_pct"] for k in keys))
