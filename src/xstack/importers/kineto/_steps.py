"""The profiler's stop in an imported trace: a last ``ProfilerStep#N`` that holds no work, and a step that
ends after the profiler stopped recording.

The profiler opens a step span at each ``step()`` call and closes the last one when it stops; a program that
calls ``step()`` after its last iteration (the usual loop) leaves a final step that holds no op, runtime call
or device activity, a fraction of an iteration long. Counted as an iteration, it would pull the median and p5
of every per-iteration statistic down, so it is marked as what it is: kind ``tail``, as the stretch after the
last ``step()`` of a live run is, which no per-iteration statistic counts.

The profiler writes when its recording ended (its session span ``PyTorch Profiler (N)``, category ``Trace``,
and the ``Record Window End`` mark). A step span that ends after that moment, and after every other event of
the trace, has an end the profiler cannot have measured (a span written by another process, or a clock error):
taken as it is, it would be the iteration's latency and the run's wall time. Its end is cut to that of the last
activity recorded within it, the recorded duration kept in ``kineto.dur_ns``, and health says so.
"""

from __future__ import annotations

import duckdb

from xstack.text import format_ns
from xstack.trace import attrs as A

PAST_RECORDING_CHECK = "steps_past_recording"
"""The health check (a finding) of a run whose ProfilerStep spans ended after the profiler stopped recording."""

CHECK = "empty_last_step"
"""The informational health check of a run whose last ``ProfilerStep`` was left out of its iterations."""

_FIND = """
WITH steps AS (
    SELECT span_id, name, pid, tid, start_ns, dur_ns,
           row_number() OVER (PARTITION BY pid, tid ORDER BY start_ns DESC, span_id DESC) AS from_end
    FROM _spans
    WHERE run_id = $run AND level = 'model' AND device = 'cpu' AND parent_id IS NULL
      AND regexp_matches(name, '^ProfilerStep#[0-9]+$')),
earlier AS (
    SELECT pid, tid, count(*) AS n, median(dur_ns) AS median_ns FROM steps WHERE from_end > 1 GROUP BY ALL)
SELECT s.span_id, s.name, s.dur_ns, e.n, e.median_ns
FROM steps s JOIN earlier e ON e.pid IS NOT DISTINCT FROM s.pid AND e.tid IS NOT DISTINCT FROM s.tid
WHERE s.from_end = 1
  AND NOT EXISTS (  -- nothing else ran during it, on any thread or device (counter ranges are not timed)
      SELECT 1 FROM _spans w
      WHERE w.run_id = $run AND w.span_id <> s.span_id AND w.level <> 'metrics'
        AND w.start_ns < s.start_ns + s.dur_ns AND w.start_ns + w.dur_ns > s.start_ns)
ORDER BY s.span_id
"""


def mark_stop_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, int, str]:
    """Mark the last ``ProfilerStep#N`` of each thread of run ``run_id`` as kind ``tail`` where earlier steps
    exist and nothing else (no op, runtime call, annotation or device activity) ran during it; returns the
    informational health row saying which steps were left out (count 0 when none)."""
    found = con.execute(_FIND, {"run": run_id}).fetchall()
    if not found:
        return CHECK, 0, ""
    con.executemany(
        "UPDATE _spans SET attrs = json_merge_patch(coalesce(attrs, '{}'), ?) WHERE run_id = ? AND span_id = ?",
        [(f'{{"{A.MODEL_KIND}": "tail"}}', run_id, int(span_id)) for span_id, *_ in found],
    )
    steps = "; ".join(
        f"{name}, {format_ns(dur)} (the median of the {n:,} before it: {format_ns(median)})"
        for _, name, dur, n, median in found
    )
    detail = (
        "a last step that holds no op, runtime call or device activity (the profiler stopping), left out of the "
        f"iterations: {steps}"
    )
    return CHECK, len(found), detail


_PAST_RECORDING = """
WITH marks AS (  -- the profiler's own record of when it stopped: its session span, its window's end
    SELECT CAST((ts + dur) * 1000 AS BIGINT) AS end_ns FROM raw WHERE ph = 'X' AND lower(cat) = 'trace' AND dur >= 0
    UNION ALL
    SELECT CAST(ts * 1000 AS BIGINT) FROM raw WHERE ph = 'i' AND name = 'Record Window End'
), steps AS (
    SELECT span_id, name, pid, start_ns, dur_ns FROM _spans
    WHERE run_id = $run AND level = 'model' AND device = 'cpu' AND regexp_matches(name, '^ProfilerStep#[0-9]+$')
), recorded AS (  -- the last moment anything was recorded: the marks, and every span but the steps
    SELECT greatest((SELECT max(end_ns) FROM marks),
                    (SELECT max(start_ns + dur_ns) FROM _spans WHERE run_id = $run
                     AND span_id NOT IN (SELECT span_id FROM steps))) AS end_ns
    WHERE EXISTS (SELECT 1 FROM marks WHERE end_ns IS NOT NULL)
)
SELECT s.span_id, s.name, s.pid, s.dur_ns, r.end_ns - s.start_ns,
    (SELECT max(o.start_ns + o.dur_ns) - s.start_ns FROM _spans o
     WHERE o.run_id = $run AND o.span_id NOT IN (SELECT span_id FROM steps) AND o.level <> 'metrics'
       AND o.start_ns >= s.start_ns AND o.start_ns < r.end_ns) AS kept_ns,
    NOT EXISTS (SELECT 1 FROM _spans o WHERE o.run_id = $run AND o.pid = s.pid
                AND o.span_id NOT IN (SELECT span_id FROM steps)) AS foreign_pid
FROM steps s, recorded r
WHERE s.start_ns < r.end_ns AND s.start_ns + s.dur_ns > r.end_ns
ORDER BY s.start_ns, s.span_id
"""


def cut_steps_past_recording(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, int, str]:
    """Cut each ``ProfilerStep#N`` of run ``run_id`` that ends after the profiler stopped recording to the end of
    the last activity recorded within it (to the recording's end where none is), keeping the trace's duration in
    ``kineto.dur_ns``; returns the health row saying which steps were cut (count 0 when none).

    Needs the staged events (temp table ``raw``) for the profiler's session span and ``Record Window End``; a
    trace with neither is not checked."""
    found = con.execute(_PAST_RECORDING, {"run": run_id}).fetchall()
    if not found:
        return PAST_RECORDING_CHECK, 0, ""
    con.executemany(
        "UPDATE _spans SET dur_ns = ?, attrs = json_merge_patch(coalesce(attrs, '{}'), ?) "
        "WHERE run_id = ? AND span_id = ?",
        [
            (int(kept if kept is not None else window), f'{{"{A.KINETO_DUR_NS}": {int(dur)}}}', run_id, int(span_id))
            for span_id, _, _, dur, window, kept, _ in found
        ],
    )
    steps = "; ".join(
        f"{name} runs {format_ns(dur)} in the trace, though the profiler stopped {format_ns(window)} after it began"
        + (f" (its pid {pid} has no other event in the trace)" if foreign and pid is not None else "")
        + f": {format_ns(kept if kept is not None else window)} kept"
        for _, name, pid, dur, window, kept, foreign in found
    )
    detail = (
        "ProfilerStep spans that end after the profiler stopped recording (its session span and Record Window "
        "End), so their end was never measured; each is cut to the end of the last activity recorded within it "
        f"(its duration in the trace kept in {A.KINETO_DUR_NS}): {steps}"
    )
    return PAST_RECORDING_CHECK, len(found), detail
