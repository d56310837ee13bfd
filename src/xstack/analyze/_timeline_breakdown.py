"""Temporal breakdown per device: busy, idle, and the idle time split by what the device waited for."""

from __future__ import annotations

from typing import Any

from xstack.analyze._timeline_common import (
    ACTIVITY_CTE,
    DATALOADER,
    NEG,
    POS,
    SYNC_CALLS,
    SYNC_FILTER,
    as_int,
    measured_window,
    merged,
    notes_of,
    pct,
    rows,
)
from xstack.analyze.context import DEVICE_LEVELS, run_context
from xstack.analyze.result import Chart, Column, Result
from xstack.trace.store import Store

ID = "timeline.breakdown"
TITLE = "Temporal breakdown per device"
CAUSES = ("host_wait", "sync_wait", "input_wait", "other_idle")

_QUERY = """
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
),
classed AS (
    SELECT p.device, p.p0, p.p1,
        CASE WHEN coalesce(sy.reach >= p.p0, false) THEN 'sync_wait'
             WHEN p.trailing OR p.next_launch >= p.p0 THEN 'host_wait'
             ELSE 'other_idle' END AS cause
    FROM pieces p ASOF LEFT JOIN syncs sy ON sy.s <= p.p0
    WHERE p.p1 > p.p0
),
loader_spans AS (SELECT start_ns AS s, start_ns + dur_ns AS e FROM spans WHERE run_id = $run AND {loader}),
loading AS ({loading}),
input AS (
    SELECT c.device, c.p0, sum(least(c.p1, l.e) - greatest(c.p0, l.s)) AS ns
    FROM classed c JOIN loading l ON l.s < c.p1 AND l.e > c.p0 GROUP BY c.device, c.p0
),
idle AS (
    SELECT c.device, sum(c.p1 - c.p0) AS idle_ns, sum(coalesce(i.ns, 0)) AS input_wait,
        sum(c.p1 - c.p0 - coalesce(i.ns, 0)) FILTER (WHERE c.cause = 'host_wait') AS host_wait,
        sum(c.p1 - c.p0 - coalesce(i.ns, 0)) FILTER (WHERE c.cause = 'sync_wait') AS sync_wait,
        sum(c.p1 - c.p0 - coalesce(i.ns, 0)) FILTER (WHERE c.cause = 'other_idle') AS other_idle
    FROM classed c LEFT JOIN input i USING (device, p0) GROUP BY c.device
)
SELECT d.device, coalesce(idle_ns, 0), coalesce(host_wait, 0),
    coalesce(sync_wait, 0), coalesce(input_wait, 0), coalesce(other_idle, 0)
FROM (SELECT DISTINCT device FROM activity) d LEFT JOIN idle USING (device)
ORDER BY d.device
"""


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
    is waiting for input instead, whatever the rest of the gap's cause.
    """
    ctx = run_context(store, run_id)
    missing = None if any(map(ctx.has, DEVICE_LEVELS)) else ctx.require(ID, TITLE, "kernel")
    if missing is not None:
        return missing
    window = measured_window(store, ctx.run_id)
    sql = _QUERY.format(activity=ACTIVITY_CTE, window=window.table, loader=DATALOADER, sync_filter=SYNC_FILTER,
                        loading=merged("loader_spans"), neg=NEG, pos=POS)  # fmt: skip
    per_device = {str(r[0]): _device_facts(window.length_ns, r) for r in rows(store, sql, ctx.run_id, sync=SYNC_CALLS)}
    main = max(per_device, key=lambda d: (per_device[d]["busy_ns"], d)) if per_device else None
    facts: dict[str, Any] = {"devices": per_device, "device": main, "window": window.kind, "steps": window.steps}
    if main is not None:
        facts.update(per_device[main])
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


def _row(device: str, f: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("busy", "idle", *CAUSES)
    return (device, f["window_ns"], *(f[f"{k}_ns"] for k in keys), *(f[f"{k}_pct"] for k in keys))
