"""The SQL that turns staged Kineto events (temp table ``raw``) into spans, counters and health rows.

Everything here runs inside DuckDB, which sorts and joins out of core, so memory stays bounded by its
``memory_limit`` whatever the trace's size.
"""

from __future__ import annotations

from xstack.importers.kineto import _mapping as M
from xstack.trace import attrs as A
from xstack.trace.schema import DEVICE_LEVELS

RAW_COLUMNS = (
    "{ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR', tid: 'VARCHAR', ts: 'DECIMAL(38,3)', "
    "dur: 'DECIMAL(38,3)', id: 'VARCHAR', args: 'JSON'}"
)

CREATE_RAW = """
CREATE OR REPLACE TEMP TABLE raw (ph VARCHAR, cat VARCHAR, name VARCHAR, pid VARCHAR, tid VARCHAR, ts DECIMAL(38,3),
    dur DECIMAL(38,3), id VARCHAR, args JSON)
"""

LOAD_CHUNK = f"""
INSERT INTO raw SELECT ph, cat, name, pid, tid, ts, dur, id, args
FROM read_json(?, format = 'array', columns = {RAW_COLUMNS})
"""


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _path(key: str) -> str:
    """A quoted JSON path selecting one key of ``args`` (keys may hold spaces and dots)."""
    return _q('$."' + key + '"')


def _level_expr() -> str:
    whens = " ".join(f"WHEN {_q(cat)} THEN {_q(level)}" for cat, level in M.CATEGORY_LEVELS.items())
    return (
        f"CASE WHEN lower(cat) = 'python_function' AND starts_with(name, {_q(M.MODULE_PREFIX)}) THEN 'layer' "
        f"ELSE CASE lower(cat) {whens} END END"
    )


def _attrs_expr() -> str:
    """JSON attrs per level: mapped keys renamed, the rest kept under ``kineto.args``; nulls dropped."""
    cases = []
    for level, keys in M.ARG_KEYS.items():
        pairs = keys + M.COMMON_KEYS
        mapped = ", ".join(f"{_q(dst)}, args->{_path(src)}" for src, dst in pairs)
        extra = _extra_attrs(level)
        if extra:
            mapped = f"{mapped}, {extra}" if mapped else extra
        removed = ", ".join(f"{_q(src)}, NULL" for src, _ in pairs) + ", " + ", ".join(
            f"{_q(k)}, NULL" for k in M.COLUMN_KEYS
        )
        rest = f"json_merge_patch(coalesce(args, '{{}}'), json_object({removed}))"
        cases.append(
            f"WHEN {_q(level)} THEN json_merge_patch(json_object({_q(A.KINETO_ARGS)}, "
            f"CASE WHEN {rest} = '{{}}' THEN NULL ELSE {rest} END), json_object({mapped}))"
        )
    return f"CASE level {' '.join(cases)} END"


def _extra_attrs(level: str) -> str:
    if level == "memcpy":
        return (
            f"{_q(A.MEMCPY_KIND)}, nullif(regexp_extract(name, 'Memcpy (\\w+)', 1), ''), "
            f"{_q(A.MEMCPY_SRC_KIND)}, nullif(regexp_extract(name, '\\((\\w+) ->', 1), ''), "
            f"{_q(A.MEMCPY_DST_KIND)}, nullif(regexp_extract(name, '-> (\\w+)\\)', 1), '')"
        )
    if level == "layer":
        return (
            f"{_q(A.LAYER_INSTANCE)}, substr(name, {len(M.MODULE_PREFIX) + 1}), "
            f"{_q(A.LAYER_TYPE)}, regexp_replace(substr(name, {len(M.MODULE_PREFIX) + 1}), '_\\d+$', '')"
        )
    if level == "metrics":
        parts = [f"{_q(A.METRICS_SOURCE)}, 'cupti_range_profiler'"]
        for key, p in M.FLOP_COUNTERS.items():
            c = "smsp__sass_thread_inst_executed_op_{}{}_pred_on.sum"
            terms = [f"TRY_CAST(args->>{_path(c.format(p, op))} AS HUGEINT)" for op in ("add", "mul")]
            fma = f"TRY_CAST(args->>{_path(c.format(p, 'fma'))} AS HUGEINT)"
            parts.append(f"{_q(key)}, {terms[0]} + {terms[1]} + 2 * {fma}")
        return ", ".join(parts)
    return ""


def stage_spans(first_span_id: int) -> str:
    """Create temp table ``x``: one row per kept complete event, with level, ids, columns and attrs."""
    gpu = ", ".join(_q(c) for c in M.GPU_CATEGORIES)
    dev = ", ".join(_q(lv) for lv in DEVICE_LEVELS)
    return f"""
CREATE OR REPLACE TEMP TABLE x AS
WITH lv AS (
    SELECT {_level_expr()} AS level, lower(cat) IN ({gpu}) AS on_gpu, lower(cat) AS cat,
        coalesce(name, '') AS name, CAST(ts * 1000 AS BIGINT) AS start_ns,
        CAST(dur * 1000 AS BIGINT) AS dur_ns, pid, tid, args
    FROM raw WHERE ph = 'X'
), kept AS (
    SELECT * FROM lv
    WHERE level IS NOT NULL AND start_ns IS NOT NULL AND dur_ns BETWEEN 0 AND {M.ABSURD_DURATION_NS}
      AND (on_gpu OR (TRY_CAST(pid AS BIGINT) IS NOT NULL AND TRY_CAST(tid AS BIGINT) IS NOT NULL))
)
SELECT
    {first_span_id - 1} + row_number() OVER (ORDER BY start_ns, dur_ns DESC, level, name) AS span_id,
    level, cat, on_gpu,
    CASE WHEN level = 'layer' THEN substr(name, {len(M.MODULE_PREFIX) + 1}) ELSE name END AS name,
    start_ns, dur_ns,
    CASE WHEN on_gpu THEN NULL ELSE TRY_CAST(pid AS BIGINT) END AS pid,
    CASE WHEN on_gpu THEN NULL ELSE TRY_CAST(tid AS BIGINT) END AS tid,
    CASE WHEN on_gpu THEN 'cuda:' || coalesce(args->>'$.device', pid) ELSE 'cpu' END AS device,
    CASE WHEN NOT on_gpu THEN NULL
         WHEN cat = 'gpu_user_annotation' THEN TRY_CAST(tid AS BIGINT)
         ELSE nullif(greatest(TRY_CAST(args->>'$.stream' AS BIGINT), -1), -1) END AS stream,
    CASE WHEN level = 'runtime' OR level IN ({dev}) THEN TRY_CAST(args->>'$.correlation' AS BIGINT)
         END AS correlation_id,
    TRY_CAST(args->>'$."External id"' AS BIGINT) AS external_id,
    TRY_CAST(args->>'$."Python id"' AS BIGINT) AS python_id,
    TRY_CAST(args->>'$."Python parent id"' AS BIGINT) AS python_parent_id,
    {_attrs_expr()} AS attrs
FROM kept
"""


HOST_PARENTS = """
CREATE OR REPLACE TEMP TABLE host_parent AS
WITH host AS (
    SELECT span_id, pid, tid, start_ns, start_ns + dur_ns AS end_ns, dur_ns
    FROM x WHERE NOT on_gpu AND level IN ('model', 'layer', 'op', 'runtime')
), ev AS (
    SELECT span_id, pid, tid, start_ns AS t, 1 AS kind, end_ns AS e, 0 AS sub, 1 AS delta FROM host
    UNION ALL
    -- an end sorts before the starts at its instant; a zero-length span's end right after its own start,
    -- so that it is a leaf and never encloses another span
    SELECT span_id, pid, tid, end_ns AS t, CASE WHEN dur_ns = 0 THEN 1 ELSE 0 END AS kind, end_ns AS e,
        1 AS sub, -1 AS delta FROM host
), run AS (
    SELECT span_id, pid, tid, delta,
        sum(delta) OVER (PARTITION BY pid, tid ORDER BY t, kind, e DESC, span_id, sub
                         ROWS UNBOUNDED PRECEDING) - 1 AS depth,
        row_number() OVER (PARTITION BY pid, tid ORDER BY t, kind, e DESC, span_id, sub) AS seq
    FROM ev
), starts AS (SELECT span_id, pid, tid, depth, seq FROM run WHERE delta = 1)
SELECT c.span_id, p.span_id AS parent_id
FROM starts c ASOF JOIN starts p
  ON c.pid = p.pid AND c.tid = p.tid AND c.depth - 1 = p.depth AND c.seq > p.seq
"""

OTHER_PARENTS = f"""
CREATE OR REPLACE TEMP TABLE other_parent AS
WITH corr AS (
    SELECT correlation_id, min(span_id) AS span_id FROM x
    WHERE level = 'runtime' AND correlation_id IS NOT NULL GROUP BY correlation_id
), cpu_annot AS (
    SELECT external_id, min(span_id) AS span_id FROM x
    WHERE cat = 'user_annotation' AND external_id IS NOT NULL GROUP BY external_id
), frames AS (
    SELECT pid, python_id, min(span_id) AS span_id FROM x
    WHERE python_id IS NOT NULL GROUP BY pid, python_id
)
SELECT c.span_id, r.span_id AS parent_id FROM x c JOIN corr r USING (correlation_id)
    WHERE c.level IN ({", ".join(_q(lv) for lv in DEVICE_LEVELS)})
UNION ALL
SELECT c.span_id, a.span_id FROM x c JOIN cpu_annot a USING (external_id) WHERE c.cat = 'gpu_user_annotation'
UNION ALL
SELECT c.span_id, f.span_id FROM x c JOIN frames f ON f.pid = c.pid AND f.python_id = c.python_parent_id
    WHERE c.level = 'python'
"""


def insert_spans(run_id: int) -> str:
    """Insert the staged spans with their parents; a host parent that does not enclose its child is dropped."""
    return f"""
INSERT INTO _spans
SELECT {run_id}, x.span_id,
    coalesce(CASE WHEN p.start_ns <= x.start_ns AND p.start_ns + p.dur_ns >= x.start_ns + x.dur_ns
                  THEN h.parent_id END, o.parent_id),
    x.level, x.name, x.start_ns, x.dur_ns, x.pid, x.tid, x.device, x.stream, x.correlation_id, x.attrs
FROM x
LEFT JOIN host_parent h USING (span_id)
LEFT JOIN x p ON p.span_id = h.parent_id
LEFT JOIN other_parent o ON o.span_id = x.span_id
"""


def insert_counters(run_id: int) -> str:
    """``[memory]`` instants -> allocated/reserved series per device; ``ph: C`` events -> one series per arg."""
    return f"""
INSERT INTO _counters
WITH mem AS (
    SELECT CAST(ts * 1000 AS BIGINT) AS ts_ns, TRY_CAST(pid AS BIGINT) AS pid,
        CASE TRY_CAST(args->>'$."Device Type"' AS INTEGER)
            WHEN 0 THEN 'cpu' WHEN 1 THEN 'cuda:' || (args->>'$."Device Id"')
            ELSE 'device_type_' || (args->>'$."Device Type"') || ':' || (args->>'$."Device Id"') END AS device,
        TRY_CAST(args->>'$."Total Allocated"' AS DOUBLE) AS allocated,
        TRY_CAST(args->>'$."Total Reserved"' AS DOUBLE) AS reserved
    FROM raw WHERE ph = 'i' AND name = '[memory]' AND ts IS NOT NULL
), c AS (
    SELECT name, CAST(ts * 1000 AS BIGINT) AS ts_ns, TRY_CAST(pid AS BIGINT) AS pid,
        unnest(json_keys(args)) AS k, args
    FROM raw WHERE ph = 'C' AND ts IS NOT NULL AND json_type(args) = 'OBJECT'
)
SELECT {run_id}, 'memory.allocated_bytes', ts_ns, allocated, pid, device FROM mem
UNION ALL SELECT {run_id}, 'memory.reserved_bytes', ts_ns, reserved, pid, device FROM mem
UNION ALL SELECT {run_id}, name || '.' || k, ts_ns, TRY_CAST(args->>('$."' || k || '"') AS DOUBLE), pid, 'cpu'
    FROM c
"""


def health_queries(run_id: int) -> list[tuple[str, str, str]]:
    """(check, SQL returning one count, detail) for the counted checks of one imported run."""
    dev = ", ".join(_q(lv) for lv in DEVICE_LEVELS)
    launch = _q(M.LAUNCH_PATTERN)
    flows = ", ".join(_q(c) for c in M.FLOW_CATEGORIES)
    s = f"FROM _spans WHERE run_id = {run_id}"
    return [
        ("device_events_without_launch",
         f"SELECT count(*) {s} AND level IN ({dev}) AND parent_id IS NULL",
         "kernel/memcpy/memset/sync records whose correlation id matches no runtime call"),
        ("launches_without_device_event",
         f"""SELECT count(*) {s} AND level = 'runtime' AND regexp_matches(name, {launch})
             AND correlation_id NOT IN (SELECT correlation_id {s} AND level IN ({dev})
                                        AND correlation_id IS NOT NULL)""",
         "launch/copy/set runtime calls with no device activity of the same correlation id"),
        ("unpaired_flows",
         f"""SELECT count(*) FROM (SELECT lower(cat) AS c, id FROM raw
             WHERE ph IN ('s', 'f') AND lower(cat) IN ({flows}) GROUP BY ALL
             HAVING NOT (bool_or(ph = 's') AND bool_or(ph = 'f')))""",
         "flow arrows (ac2g, fwdbwd) with a start and no finish, or a finish and no start"),
        ("negative_duration",
         "SELECT count(*) FROM raw WHERE ph = 'X' AND dur < 0", "complete events with dur < 0: skipped"),
        ("absurd_duration",
         f"SELECT count(*) FROM raw WHERE ph = 'X' AND dur * 1000 > {M.ABSURD_DURATION_NS}",
         "complete events longer than a day (a clock or unit error): skipped"),
        ("missing_fields",
         "SELECT count(*) FROM raw WHERE ph = 'X' AND (ts IS NULL OR dur IS NULL)",
         "complete events without ts or dur: skipped"),
        ("unattributed_ops",
         f"SELECT count(*) {s} AND level = 'op' AND parent_id IS NULL",
         "ops with no enclosing layer, op or annotation on their thread"),
        ("unattributed_runtime_calls",
         f"SELECT count(*) {s} AND level = 'runtime' AND parent_id IS NULL",
         "runtime calls with no enclosing op on their thread"),
        ("metrics_without_kernel",
         f"SELECT count(*) {s} AND level = 'metrics' AND parent_id IS NULL",
         "hardware-counter ranges that name a kernel but match no kernel span in the trace"),
        ("nesting_conflicts",
         """SELECT count(*) FROM host_parent h JOIN x c USING (span_id) JOIN x p ON p.span_id = h.parent_id
            WHERE NOT (p.start_ns <= c.start_ns AND p.start_ns + p.dur_ns >= c.start_ns + c.dur_ns)""",
         "host spans that overlap a neighbour without nesting in it (left without that parent)"),
        ("duplicate_correlation_ids",
         f"""SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n {s} AND level = 'runtime'
             AND correlation_id IS NOT NULL GROUP BY correlation_id HAVING count(*) > 1)""",
         "runtime calls sharing a correlation id (device activity attributed to the first)"),
    ]


SKIPPED = f"""
SELECT ph, lower(cat) AS cat, count(*) FROM raw
WHERE NOT (ph = 'M')
  AND NOT (ph IN ('s', 'f') AND lower(cat) IN ({", ".join(_q(c) for c in M.FLOW_CATEGORIES)}))
  AND NOT (ph = 'i' AND name = '[memory]') AND NOT (ph = 'C')
  AND NOT (ph = 'X' AND ({_level_expr()}) IS NOT NULL)
GROUP BY ALL ORDER BY 3 DESC
"""

NAMES = """
SELECT name, pid, tid, args->>'$.name' AS value FROM raw
WHERE ph = 'M' AND name IN ('process_name', 'thread_name', 'process_labels')
"""
