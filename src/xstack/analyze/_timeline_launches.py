"""Kernel launch statistics: what each launch cost the host, how long it queued, short kernels, outliers."""

from __future__ import annotations

from typing import Any

from xstack.analyze._timeline_common import as_int, measured_window, notes_of, pct, rows
from xstack.analyze.context import RunContext, run_context
from xstack.analyze.result import Chart, Column, Result, counted, format_ns
from xstack.errors import UsageError
from xstack.trace.store import Store

ID = "timeline.launches"
TITLE = "Kernel launch statistics"
SHORT_NS = 10_000
ROW_LIMIT = 20_000
OUTLIER_IQRS = 3.0
MIN_OUTLIER_CALLS = 5
FEW_INTERVALS = 10
"""Times between launches below which the host's pace (fact ``launch_interval_ns``) is labelled, and quoted in the
recommendations, with how many it is the median of: three launches of one kernel leave a single one once its first
launch is left out, and that is one gap, not a pace."""

_LAUNCHES = """
launches AS (
    SELECT k.name, k.dur_ns, r.span_id AS call_id, r.dur_ns AS launch_ns, k.start_ns - r.start_ns AS delay_ns,
        r.start_ns AS call_start, r.pid AS call_pid, r.tid AS call_tid, coalesce(r.start_ns, k.start_ns) AS at,
        row_number() OVER (PARTITION BY k.name ORDER BY coalesce(r.start_ns, k.start_ns), k.span_id) = 1 AS first
    FROM spans k LEFT JOIN spans r ON r.run_id = $run AND r.span_id = k.parent_id AND r.level = 'runtime'
    WHERE k.run_id = $run AND k.level = 'kernel'
),
placed AS (
    -- a launch is the window's when its call starts in it (a kernel without one: when the kernel starts in it);
    -- the window's intervals are disjoint: the last one starting by then is the only one that can hold it
    SELECT l.*, coalesce(l.at < w.e, false) AS in_steps FROM launches l ASOF LEFT JOIN {window} w ON l.at >= w.s
)"""

_PER_NAME = f"""
WITH {_LAUNCHES},
measured AS (SELECT * FROM placed WHERE in_steps),
q AS (
    SELECT name, count(*) AS n,
        quantile_cont(dur_ns, [0.25, 0.5, 0.75]) AS dq, quantile_cont(delay_ns, [0.25, 0.5, 0.75]) AS yq
    FROM measured GROUP BY name
),
judged AS (
    -- Tukey's far-out fence per kernel name; an IQR under a tenth of the median counts as a tenth, so
    -- that a kernel whose times barely vary does not flag every launch a few ns slower
    SELECT l.*, q.n >= $min_calls AND (
            l.dur_ns > q.dq[3] + $iqrs * greatest(q.dq[3] - q.dq[1], q.dq[2] / 10)
            OR l.delay_ns > q.yq[3] + $iqrs * greatest(q.yq[3] - q.yq[1], q.yq[2] / 10)) AS outlier
    FROM measured l JOIN q USING (name)
)
SELECT name, count(*) AS launches, count(*) FILTER (WHERE dur_ns < $short) AS short,
    count(*) FILTER (WHERE outlier) AS outliers,
    median(launch_ns), quantile_cont(launch_ns, 0.95), median(delay_ns), quantile_cont(delay_ns, 0.95),
    median(dur_ns), sum(dur_ns), sum(launch_ns)
FROM judged GROUP BY name
ORDER BY sum(launch_ns) DESC NULLS LAST, launches DESC, name
"""

_TOTALS = f"""
WITH {_LAUNCHES},
calls AS (SELECT DISTINCT call_id, launch_ns, in_steps FROM placed WHERE call_id IS NOT NULL),
steady AS (
    -- the launch calls in the window, each marked when it made the first launch of a kernel name
    SELECT call_id, launch_ns, call_start, call_pid, call_tid, bool_or(first) AS first
    FROM placed WHERE call_id IS NOT NULL AND in_steps GROUP BY ALL
),
intervals AS (
    SELECT lead(call_start) OVER (PARTITION BY call_pid, call_tid ORDER BY call_start, call_id) - call_start AS gap,
        first
    FROM steady
)
SELECT count(*) FILTER (WHERE in_steps), count(call_id) FILTER (WHERE in_steps),
    median(launch_ns) FILTER (WHERE in_steps), quantile_cont(launch_ns, 0.95) FILTER (WHERE in_steps),
    median(delay_ns) FILTER (WHERE in_steps), quantile_cont(delay_ns, 0.95) FILTER (WHERE in_steps),
    count(*) FILTER (WHERE in_steps AND dur_ns < $short), sum(dur_ns) FILTER (WHERE in_steps),
    (SELECT sum(launch_ns) FROM calls WHERE in_steps),
    median(dur_ns) FILTER (WHERE in_steps),
    (SELECT median(launch_ns) FROM steady WHERE NOT first),
    (SELECT median(gap) FROM intervals WHERE NOT first),
    (SELECT count(*) FROM steady WHERE NOT first),
    (SELECT count(gap) FROM intervals WHERE NOT first),
    count(DISTINCT name) FILTER (WHERE in_steps),
    count(*), (SELECT sum(launch_ns) FROM calls), count(DISTINCT name) - count(DISTINCT name) FILTER (WHERE in_steps)
FROM placed
"""

COLUMNS = [
    Column("kernel"),
    Column("launches", "count"),
    Column("short", "count", "kernels that ran shorter than the short threshold"),
    Column("outliers", "count", "launches whose duration or launch delay is far beyond the kernel's usual"),
    Column("launch median", "ns", "host time in the launch call"),
    Column("launch p95", "ns"),
    Column("delay median", "ns", "kernel start minus launch call start: time queued"),
    Column("delay p95", "ns"),
    Column("duration median", "ns"),
    Column("kernel time", "ns"),
    Column("launch time", "ns", "host time in the launch calls, summed"),
]


def launch_statistics(
    store: Store,
    run_id: int,
    *,
    short_ns: int = SHORT_NS,
    outlier_iqrs: float = OUTLIER_IQRS,
    min_outlier_calls: int = MIN_OUTLIER_CALLS,
    limit: int | None = ROW_LIMIT,
) -> Result:
    """Per kernel name: launches, short kernels, outliers, launch time and launch delay (ns), with the totals, of the
    measured window.

    ``short_ns``: a kernel shorter than this is short (10 us by default). Outliers use ``outlier_iqrs`` and
    ``min_outlier_calls`` (below). Rows: the first ``limit`` kernel names by launch time (None: all), the rest
    counted in ``truncated`` (the facts cover them all).

    Notes: a kernel's launch is the runtime call with its correlation id (``cudaLaunchKernel``,
    ``cuLaunchKernel``, ``hipLaunchKernel``, ...). Launch time is that call's duration, the host's cost;
    launch delay is the kernel's start minus the call's start, the time the launch spent reaching the
    device and waiting in the queue. A launch is an outlier when its kernel's duration or its launch delay
    lies beyond Q3 + 3 x IQR of the launches of the same kernel name (Tukey's far-out fence; the IQR counts
    as at least a tenth of the median), judged only for names launched at least 5 times. Kernels without a
    launch call (unattributed) count in the launches and durations but not in the launch figures. The total
    launch time counts each call once (a graph launch starts several kernels).

    The table and the facts are of the launches in the run's measured window, as the other timeline analyses
    are: its step spans past the warm-up, each stretched to the end of the device work launched in it (without
    steps, the whole run). A launch is in it when its call starts in it (a kernel without one: when it starts in
    it). The set-up, the warm-up iterations and what follows the last step are left out of every row and
    figure, outlier fences included: a first launch there loads the kernel's module, queueing it for as long as
    the load takes. A label counts the launches left out and the kernel names launched only there; facts
    ``launches_in_run`` and ``launch_ns_in_run`` count every launch of the run.

    What one launch costs, in the window (facts ``steady_launch_ns``, ``launch_interval_ns``,
    ``median_kernel_ns``): the median launch call, the median time from a launch call to the next on its
    thread (the host's time per launch, its work between launches included) and the median kernel duration.
    The first launch of each kernel name is left out of the first two: it loads the kernel's module (lazy
    loading), and a single slow one must not make every launch look slow. Facts ``steady_launches`` and
    ``launch_intervals`` count the launch calls and the times between launches those two medians are of: a
    window of few launches, most of them firsts, leaves few (three launches of one kernel leave one interval),
    and a median of a handful describes those launches, not the host's pace.
    """
    if short_ns < 0 or outlier_iqrs < 0 or min_outlier_calls < 1 or (limit is not None and limit < 0):
        raise UsageError(f"{ID}: short_ns, outlier_iqrs and limit must be >= 0 and min_outlier_calls >= 1")
    ctx = run_context(store, run_id)
    missing = ctx.require(ID, TITLE, "kernel", "runtime")
    if missing is not None:
        return missing
    params = {"short": short_ns, "iqrs": outlier_iqrs, "min_calls": min_outlier_calls}
    window = measured_window(store, ctx.run_id)
    per_name = rows(store, _PER_NAME.format(window=window.table), ctx.run_id, **params)
    totals = rows(store, _TOTALS.format(window=window.table), ctx.run_id, short=short_ns)[0]
    facts = _facts(totals, sum(int(r[3]) for r in per_name), window.steps)
    facts["short_threshold_ns"] = short_ns
    return Result(
        id=ID,
        title=TITLE,
        run_id=ctx.run_id,
        columns=COLUMNS,
        rows=[(r[0], int(r[1]), int(r[2]), int(r[3]), *(as_int(v) for v in r[4:])) for r in per_name[:limit]],
        truncated=0 if limit is None else max(0, len(per_name) - limit),
        notes=notes_of(launch_statistics),
        chart=Chart("hbar", x="kernel", y=("launch time",), title="Host time spent launching, per kernel", limit=20),
        facts=facts,
        labels=_outside_labels(ctx, facts, int(totals[17] or 0)) + _pace_labels(facts, int(totals[14] or 0)),
    )


def _outside_labels(ctx: RunContext, f: dict[str, Any], outside_names: int) -> list[str]:
    """What the table leaves out: the launches outside the measured window (set-up, warm-up, after the last
    step), with the kernel names launched only there."""
    outside = f["launches_in_run"] - f["launches"]
    if not outside:
        return []
    only = f", {counted(outside_names, 'kernel name')} launched only there" if outside_names else ""
    warmup = [label] if (label := ctx.warmup_label()) else []
    return warmup + [
        f"{counted(outside, 'launch', 'launches')} outside the measured window (set-up, warm-up, after the last "
        f"step) left out{only}; fact launches_in_run counts every launch"
    ]


def _pace_labels(f: dict[str, Any], names: int) -> list[str]:
    """Says how few times between launches the host's pace is from, when under ``FEW_INTERVALS``."""
    n, launches = f["launch_intervals"], f["window_launches"]
    if n >= FEW_INTERVALS or launches == 0:
        return []
    left = (
        f"{launches:,} launch{'es' if launches != 1 else ''} of {names:,} kernel name{'s' if names != 1 else ''} in "
        "the window, each name's first left out"
    )
    if n == 0:
        return [f"no time between launches to give the host's pace from ({left})"]
    of = "a single time" if n == 1 else f"the median of {n:,} times"
    return [f"the host's pace, a launch every {format_ns(f['launch_interval_ns'])}, is {of} between launches ({left})"]


def _facts(t: tuple[Any, ...], outliers: int, steps: int) -> dict[str, Any]:
    """The window's figures (the table's), then the whole run's (``_in_run``)."""
    launches, attributed, short = int(t[0]), int(t[1]), int(t[6])
    return {
        "launches": launches,
        "attributed_launches": attributed,
        "median_launch_ns": as_int(t[2]),
        "p95_launch_ns": as_int(t[3]),
        "median_delay_ns": as_int(t[4]),
        "p95_delay_ns": as_int(t[5]),
        "short_kernels": short,
        "short_pct": pct(short, launches),
        "outliers": outliers,
        "kernel_ns": as_int(t[7]) or 0,
        "total_launch_ns": as_int(t[8]) or 0,
        "steps": steps,
        "kernels_per_step": launches / steps if steps else None,
        "launch_ns_per_step": (as_int(t[8]) or 0) / steps if steps else None,
        "window_launches": launches,
        "median_kernel_ns": as_int(t[9]),
        "steady_launch_ns": as_int(t[10]),
        "steady_launches": int(t[12] or 0),
        "launch_interval_ns": as_int(t[11]),
        "launch_intervals": int(t[13] or 0),
        "launches_in_run": int(t[15]),
        "launch_ns_in_run": as_int(t[16]) or 0,
    }
