"""The profiler's stop in an imported trace: a last ``ProfilerStep#N`` that holds no work.

The profiler opens a step span at each ``step()`` call and closes the last one when it stops; a program that
calls ``step()`` after its last iteration (the usual loop) leaves a final step that holds no op, runtime call
or device activity, a fraction of an iteration long. Counted as an iteration, it would pull the median and p5
of every per-iteration statistic down, so it is marked as what it is: kind ``tail``, as the stretch after the
last ``step()`` of a live run is, which no per-iteration statistic counts.
"""

from __future__ import annotations

import duckdb

from xstack.trace import attrs as A

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
        f"{name}, {dur / 1e6:.3g} ms (the median of the {n:,} before it: {median / 1e6:.3g} ms)"
        for _, name, dur, n, median in found
    )
    detail = (
        "a last step that holds no op, runtime call or device activity (the profiler stopping), left out of the "
        f"iterations: {steps}"
    )
    return CHECK, len(found), detail
