"""Per-span statistics across the measured iterations of the pass that times the span's level.

Notes: the median, the 5th and 95th percentiles are DuckDB's ``quantile_cont`` (linear interpolation); the
20% trimmed mean drops the ``floor(0.2 n)`` shortest and longest observations and averages the rest (SciPy's
``trim_mean(a, 0.2)``); the standard deviation is the sample one (n - 1), 0 for one observation. A span is
``noisy`` when its middle 90% spreads wider than half its median: ``(p95 - p5) > NOISY_SPREAD * median``.
"""

from __future__ import annotations

from typing import Final

import duckdb

from xstack.trace import attrs as A

TRIM: Final = 0.2
"""Share of the observations dropped at each end for the trimmed mean."""
NOISY_SPREAD: Final = 0.5
"""A span is noisy when ``p95 - p5`` exceeds this share of its median."""

_STATS: Final = f"""
CREATE TEMP TABLE _lm_stats AS
WITH obs AS (
    SELECT t.key, t.parent_key, t.level, t.pos, t.iter, t.run_id, t.span_id, t.dur_ns,
        t.start_ns - p.start_ns AS offset_ns, p.dur_ns AS parent_dur_ns
    FROM _lm_tree t
    JOIN _lm_ok USING (run_id, span_id)
    JOIN _lm_own o ON o.level = t.level AND o.run_id = t.run_id
    LEFT JOIN _lm_tree p ON p.run_id = t.run_id AND p.span_id = t.parent_id
),
ranked AS (
    SELECT *, row_number() OVER (PARTITION BY key ORDER BY dur_ns) AS rank, count(*) OVER (PARTITION BY key) AS n
    FROM obs
)
SELECT key, any_value(parent_key) AS parent_key, any_value(level) AS level, any_value(pos) AS pos, count(*) AS n,
    quantile_cont(dur_ns, 0.5) AS median_ns,
    avg(dur_ns) FILTER (WHERE rank > floor({TRIM} * n) AND rank <= n - floor({TRIM} * n)) AS trimmed_mean_ns,
    min(dur_ns) AS min_ns,
    quantile_cont(dur_ns, 0.05) AS p5_ns,
    quantile_cont(dur_ns, 0.95) AS p95_ns,
    coalesce(stddev_samp(dur_ns), 0) AS std_ns,
    quantile_cont(offset_ns, 0.5) AS offset_ns,
    quantile_cont(parent_dur_ns, 0.5) AS parent_dur_ns,
    arg_min(run_id, iter) AS rep_run,
    arg_min(span_id, iter) AS rep_span
FROM ranked
GROUP BY key;
"""


def compute(con: duckdb.DuckDBPyConnection) -> None:
    """Build ``_lm_stats`` (one row per matched key) from the ``_lm_*`` tables of ``_match.match``."""
    con.execute("DROP TABLE IF EXISTS _lm_stats")
    con.execute(_STATS)


def attrs_sql(alias: str) -> str:
    """A JSON object of the statistics attributes of the ``_lm_stats`` row ``alias``."""
    a = alias
    return (
        f"json_object('{A.STATS_N}', {a}.n, '{A.STATS_MEDIAN_NS}', round({a}.median_ns)::BIGINT, "
        f"'{A.STATS_TRIMMED_MEAN_NS}', round({a}.trimmed_mean_ns)::BIGINT, '{A.STATS_MIN_NS}', {a}.min_ns, "
        f"'{A.STATS_P5_NS}', round({a}.p5_ns)::BIGINT, '{A.STATS_P95_NS}', round({a}.p95_ns)::BIGINT, "
        f"'{A.STATS_STD_NS}', round({a}.std_ns)::BIGINT, "
        f"'{A.STATS_NOISY}', ({a}.p95_ns - {a}.p5_ns) > {NOISY_SPREAD} * {a}.median_ns)"
    )
