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
        f"WHEN lower(cat) = 'user_annotation' AND regexp_matches(name, {_q(M.TORCH_COMPILE_MARKS)}) THEN 'op' "
        f"ELSE CASE lower(cat) {whens} END END"
    )


# Reading many keys of a row's ``args`` with ``args->'$.key'`` parses that JSON once per key, and every such
# expression keeps string vectors of its own per thread (memory counted against DuckDB's limit). The
# mapping instead extracts lists of values in one call: ``aj``, the JSON values of the keys mapped for the
# row's level (in ``ARG_KEYS`` order), and ``av``, the text of the keys that become columns.
_COLUMN_ARGS = ("device", "stream", "correlation", "External id", "Python id", "Python parent id")


def _av(key: str) -> str:
    """``args->>'$."key"'`` for one of ``_COLUMN_ARGS``."""
    return f"av[{_COLUMN_ARGS.index(key) + 1}]"


def _extract_expr() -> str:
    """Columns ``aj`` (per level, the JSON values of its mapped keys) and ``av`` (see above)."""
    cases = " ".join(
        f"WHEN {_q(level)} THEN json_extract(args, [{', '.join(_path(src) for src, _ in keys + M.COMMON_KEYS)}])"
        for level, keys in M.ARG_KEYS.items()
    )
    columns = ", ".join(_path(k) for k in _COLUMN_ARGS)
    return f"CASE level {cases} END AS aj, json_extract_string(args, [{columns}]) AS av"


def _rest_expr() -> str:
    """``args`` without the keys that are mapped or become columns, for the row's level."""
    cases = []
    for level, keys in M.ARG_KEYS.items():
        pairs = keys + M.COMMON_KEYS
        removed = (
            ", ".join(f"{_q(src)}, NULL" for src, _ in pairs)
            + ", "
            + ", ".join(f"{_q(k)}, NULL" for k in M.COLUMN_KEYS)
        )
        cases.append(f"WHEN {_q(level)} THEN json_object({removed})")
    return f"json_merge_patch(coalesce(args, '{{}}'), CASE level {' '.join(cases)} END)"


def _attrs_expr() -> str:
    """JSON attrs per level: mapped keys renamed, the rest kept under ``kineto.args``; nulls dropped.

    ``rest`` is computed once per row (``_rest_expr``); one object per level holds every key, and merging it
    as a patch into ``{}`` drops the keys whose value is null (RFC 7386)."""
    rest = f"{_q(A.KINETO_ARGS)}, CASE WHEN rest = '{{}}' THEN NULL ELSE rest END"
    cases = []
    for level, keys in M.ARG_KEYS.items():
        mapped = [f"{_q(dst)}, aj[{i + 1}]" for i, (_, dst) in enumerate(keys + M.COMMON_KEYS)]
        mapped += [*_extra_attrs(level), rest]
        cases.append(f"WHEN {_q(level)} THEN json_object({', '.join(mapped)})")
    return f"json_merge_patch('{{}}', CASE level {' '.join(cases)} END)"


def _extra_attrs(level: str) -> list[str]:
    if level == "memcpy":
        return [
            f"{_q(A.MEMCPY_KIND)}, nullif(regexp_extract(name, 'Memcpy (\\w+)', 1), '')",
            f"{_q(A.MEMCPY_SRC_KIND)}, nullif(regexp_extract(name, '\\((\\w+) ->', 1), '')",
            f"{_q(A.MEMCPY_DST_KIND)}, nullif(regexp_extract(name, '-> (\\w+)\\)', 1), '')",
        ]
    if level == "layer":
        return [
            f"{_q(A.LAYER_INSTANCE)}, substr(name, {len(M.MODULE_PREFIX) + 1})",
            f"{_q(A.LAYER_TYPE)}, regexp_replace(substr(name, {len(M.MODULE_PREFIX) + 1}), '_\\d+$', '')",
        ]
    if level == "metrics":
        parts = [f"{_q(A.METRICS_SOURCE)}, 'cupti_range_profiler'"]
        for key, p in M.FLOP_COUNTERS.items():
            c = "smsp__sass_thread_inst_executed_op_{}{}_pred_on.sum"
            terms = [f"TRY_CAST(args->>{_path(c.format(p, op))} AS HUGEINT)" for op in ("add", "mul")]
            fma = f"TRY_CAST(args->>{_path(c.format(p, 'fma'))} AS HUGEINT)"
            parts.append(f"{_q(key)}, {terms[0]} + {terms[1]} + 2 * {fma}")
        for metric, (key, kind) in M.RANGE_METRICS.items():
            parts.append(f"{_q(key)}, TRY_CAST(round(TRY_CAST(args->>{_path(metric)} AS DOUBLE)) AS {kind})"
                         if kind == "BIGINT" else f"{_q(key)}, TRY_CAST(args->>{_path(metric)} AS {kind})")  # fmt: skip
        return parts
    return []


def stage_spans() -> str:
    """Create temp table ``x``: one row per kept complete event, with level, ids, columns and attrs (a script
    of several statements, through the temp table ``xm``).

    Span ids number a run's spans from 1 in time order; they are unique within a run."""
    gpu = ", ".join(_q(c) for c in M.GPU_CATEGORIES)
    dev = ", ".join(_q(lv) for lv in DEVICE_LEVELS)
    return f"""
CREATE OR REPLACE TEMP TABLE xm AS
WITH lv AS (
    SELECT {_level_expr()} AS level, lower(cat) IN ({gpu}) AS on_gpu, lower(cat) AS cat,
        coalesce(name, '') AS name, CAST(ts * 1000 AS BIGINT) AS start_ns,
        CAST(dur * 1000 AS BIGINT) AS dur_ns, pid, tid, args
    FROM raw WHERE ph = 'X'
), kept AS (
    SELECT * FROM lv
    WHERE level IS NOT NULL AND start_ns IS NOT NULL AND dur_ns BETWEEN 0 AND {M.ABSURD_DURATION_NS}
      AND (on_gpu OR (TRY_CAST(pid AS BIGINT) IS NOT NULL AND TRY_CAST(tid AS BIGINT) IS NOT NULL))
), ex AS (
    SELECT *, {_extract_expr()}, {_rest_expr()} AS rest FROM kept
)
SELECT
    level, cat, on_gpu,
    CASE WHEN level = 'layer' THEN substr(name, {len(M.MODULE_PREFIX) + 1})
         WHEN level IN ('kernel', 'metrics') AND name = {_q(M.MISSING_NAME)} THEN {_q(M.UNNAMED_KERNEL)}
         ELSE name END AS name,
    start_ns, dur_ns,
    CASE WHEN on_gpu THEN NULL ELSE TRY_CAST(pid AS BIGINT) END AS pid,
    CASE WHEN on_gpu THEN NULL ELSE TRY_CAST(tid AS BIGINT) END AS tid,
    CASE WHEN on_gpu THEN 'cuda:' || coalesce({_av("device")}, pid) ELSE 'cpu' END AS device,
    CASE WHEN NOT on_gpu THEN NULL
         WHEN cat = 'gpu_user_annotation' THEN TRY_CAST(tid AS BIGINT)
         -- CUPTI writes "no stream" as -1, or as its unsigned 32-bit form
         WHEN TRY_CAST({_av("stream")} AS BIGINT) BETWEEN 0 AND 4294967294
         THEN TRY_CAST({_av("stream")} AS BIGINT) END AS stream,
    CASE WHEN level = 'runtime' OR level IN ({dev}) THEN TRY_CAST({_av("correlation")} AS BIGINT)
         END AS correlation_id,
    TRY_CAST({_av("External id")} AS BIGINT) AS external_id,
    TRY_CAST({_av("Python id")} AS BIGINT) AS python_id,
    TRY_CAST({_av("Python parent id")} AS BIGINT) AS python_parent_id,
    {_attrs_expr()} AS attrs
FROM ex;
-- Numbered in a second statement, so that the sort carries finished rows rather than args, and does not
-- compete for memory with the JSON work of the mapping (within a level, ordering by the name without the
-- layer prefix is ordering by the name). An ORDER BY feeding a streaming row_number() sorts out of core.
CREATE OR REPLACE TEMP TABLE x AS
SELECT row_number() OVER () AS span_id, *
FROM (SELECT * FROM xm ORDER BY start_ns, dur_ns DESC, level, name, pid, tid, device, stream, correlation_id,
      external_id, python_id);
DROP TABLE xm;
"""


def _starts(table: str, host: str) -> str:
    """SQL: the table ``table`` of the starts of the host spans ``host`` (a query of span_id, pid, tid, start_ns,
    end_ns, dur_ns) with their depth (the spans open on their thread as they start) and their order there."""
    return f"""
CREATE OR REPLACE TEMP TABLE {table} AS
WITH host AS ({host}), ev AS (
    SELECT span_id, pid, tid, start_ns AS t, 1 AS kind, start_ns AS s, end_ns AS e, 0 AS sub, 1 AS delta
    FROM host
    UNION ALL
    -- an end sorts before the starts at its instant; a zero-length span's end right after its own start,
    -- so that it is a leaf and never encloses another span
    SELECT span_id, pid, tid, end_ns AS t, CASE WHEN dur_ns = 0 THEN 1 ELSE 0 END AS kind, start_ns AS s,
        end_ns AS e, 1 AS sub, -1 AS delta FROM host
), run AS (
    SELECT span_id, pid, tid, delta, s, e,
        sum(delta) OVER (PARTITION BY pid, tid ORDER BY t, kind, e DESC, span_id, sub
                         ROWS UNBOUNDED PRECEDING) - 1 AS depth,
        row_number() OVER (PARTITION BY pid, tid ORDER BY t, kind, e DESC, span_id, sub) AS seq
    FROM ev
)
SELECT span_id, pid, tid, depth, seq, s, e FROM run WHERE delta = 1;
"""


def _parent_by_depth(starts: str, children: str = "") -> str:
    """SQL: for each start of ``starts`` (of ``children``, a condition on ``c``), the span found by depth: the last
    to start, before it, one level up (the innermost one open at its start, where spans end in order)."""
    return f"""SELECT c.span_id, p.span_id AS parent_id, p.s <= c.s AND p.e >= c.e AS encloses
FROM {starts} c ASOF JOIN {starts} p
  ON c.pid = p.pid AND c.tid = p.tid AND c.depth - 1 = p.depth AND c.seq > p.seq {children}"""


_LOST_ROUNDS = 3
"""How many times the spans left without a parent look for one again, each time with the spans that ended
before them set aside."""


def _lost_round() -> str:
    """SQL: one round for the host spans still without a parent (``host_lost``). The span depth gave each ended
    before it (out of order: a ``record_function`` left after the dispatch mode's call it started in, an
    iteration ended while a span of the program crossed it); set those aside, the depths of the spans of those
    threads are counted again, and a span now found within its parent takes it."""
    return (
        "INSERT INTO host_broken SELECT DISTINCT tried FROM host_lost "
        "WHERE tried NOT IN (SELECT span_id FROM host_broken);\n"
        + _starts(
            "host_round",
            "SELECT span_id, pid, tid, s AS start_ns, e AS end_ns, e - s AS dur_ns FROM host_start h "
            "SEMI JOIN (SELECT DISTINCT pid, tid FROM host_lost JOIN host_start USING (span_id)) USING (pid, tid) "
            "WHERE span_id NOT IN (SELECT span_id FROM host_broken)",
        )
        + f"""CREATE OR REPLACE TEMP TABLE host_try AS
{_parent_by_depth("host_round", "WHERE c.span_id IN (SELECT span_id FROM host_lost)")};
UPDATE host_parent SET parent_id = t.parent_id, encloses = true FROM host_try t
WHERE t.encloses AND host_parent.span_id = t.span_id;
DELETE FROM host_lost WHERE span_id NOT IN (SELECT span_id FROM host_try WHERE NOT encloses);
UPDATE host_lost SET tried = t.parent_id FROM host_try t WHERE host_lost.span_id = t.span_id;
"""
    )


HOST_PARENTS = (
    _starts(
        "host_start",
        "SELECT span_id, pid, tid, start_ns, start_ns + dur_ns AS end_ns, dur_ns FROM x "
        "WHERE NOT on_gpu AND level IN ('model', 'layer', 'op', 'runtime')",
    )
    + f"""-- The starts are a table, not a CTE, so that their windows are computed once for both sides of the join.
-- outlasts is true where the span found by depth (the innermost one open at the child's start) ends before
-- the child does: PyTorch's record_function entered in a dispatch mode's call and left after it, as
-- torch.compile's marks of its compile steps are. Carrying the bounds here saves a join with x.
CREATE OR REPLACE TEMP TABLE host_parent AS
SELECT *, NOT encloses AS outlasts FROM ({_parent_by_depth("host_start")});
-- Such a child nests in the innermost span that encloses it, found in rounds (_lost_round); the live spans a
-- merge stages (cat 'xstack') have their parents from the recorder. One that finds none keeps no host parent
-- (a nesting conflict).
CREATE OR REPLACE TEMP TABLE host_lost AS
SELECT h.span_id, h.parent_id AS tried FROM host_parent h JOIN x USING (span_id) WHERE h.outlasts AND x.cat <> 'xstack';
CREATE OR REPLACE TEMP TABLE host_broken (span_id BIGINT);
"""
    + _lost_round() * _LOST_ROUNDS
    + """DROP TABLE IF EXISTS host_round;
DROP TABLE IF EXISTS host_try;
DROP TABLE host_lost;
DROP TABLE host_broken;
DROP TABLE host_start;
"""
)

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


def insert_spans(run_id: int, *, after_span_id: int = 0) -> str:
    """Insert the staged spans with their parents; a host parent that does not enclose its child is dropped.

    Staged rows with ids up to ``after_span_id`` are spans already in the run (live spans staged only so that
    host nesting sees them) and are not inserted again.

    Host and other parents are for disjoint sets of spans (host levels on a CPU thread; device activity,
    GPU annotations and Python frames), at most one each: one join with their union is the same as a join
    with each, and holds one hash table instead of two."""
    return f"""
INSERT INTO _spans
WITH parent AS (
    SELECT span_id, parent_id FROM host_parent WHERE encloses
    UNION ALL
    SELECT span_id, parent_id FROM other_parent
)
SELECT {run_id}, x.span_id, p.parent_id,
    x.level, x.name, x.start_ns, x.dur_ns, x.pid, x.tid, x.device, x.stream, x.correlation_id, x.attrs
FROM x
LEFT JOIN parent p USING (span_id)
WHERE x.span_id > {after_span_id}
"""


def insert_counters(run_id: int, *, base_ns: int = 0) -> str:
    """``[memory]`` instants -> allocated/reserved series per device; ``ph: C`` events -> one series per arg.
    ``base_ns`` is added to every timestamp."""
    return f"""
INSERT INTO _counters
WITH mem AS (
    SELECT CAST(ts * 1000 AS BIGINT) + {base_ns} AS ts_ns, TRY_CAST(pid AS BIGINT) AS pid,
        CASE TRY_CAST(args->>'$."Device Type"' AS INTEGER)
            WHEN 0 THEN 'cpu' WHEN 1 THEN 'cuda:' || (args->>'$."Device Id"')
            ELSE 'device_type_' || (args->>'$."Device Type"') || ':' || (args->>'$."Device Id"') END AS device,
        TRY_CAST(args->>'$."Total Allocated"' AS DOUBLE) AS allocated,
        TRY_CAST(args->>'$."Total Reserved"' AS DOUBLE) AS reserved
    FROM raw WHERE ph = 'i' AND name = '[memory]' AND ts IS NOT NULL
), c AS (
    SELECT name, CAST(ts * 1000 AS BIGINT) + {base_ns} AS ts_ns, TRY_CAST(pid AS BIGINT) AS pid,
        unnest(json_keys(args)) AS k, args
    FROM raw WHERE ph = 'C' AND ts IS NOT NULL AND json_type(args) = 'OBJECT'
)
SELECT {run_id}, 'memory.allocated_bytes', ts_ns, allocated, pid, device FROM mem
UNION ALL SELECT {run_id}, 'memory.reserved_bytes', ts_ns, reserved, pid, device FROM mem
UNION ALL SELECT {run_id}, name || '.' || k, ts_ns, TRY_CAST(args->>('$."' || k || '"') AS DOUBLE), pid, 'cpu'
    FROM c
"""


def _launches_without_device_event(run_id: int, select: str = "count(*)") -> str:
    dev = ", ".join(_q(lv) for lv in DEVICE_LEVELS)
    s = f"FROM _spans WHERE run_id = {run_id}"
    return f"""SELECT {select} {s} AND level = 'runtime' AND regexp_matches(name, {_q(M.LAUNCH_PATTERN)})
             AND correlation_id NOT IN (SELECT correlation_id {s} AND level IN ({dev})
                                        AND correlation_id IS NOT NULL)"""


def launches_without_device_event_by_name(run_id: int) -> str:
    """SQL: the launch/copy/set calls with no device activity, ``(name, count)`` per call name, most first."""
    return _launches_without_device_event(run_id, "name, count(*)") + " GROUP BY name ORDER BY 2 DESC, 1"


def _unpaired_flows(categories: tuple[str, ...]) -> str:
    return f"""SELECT count(*) FROM (SELECT lower(cat) AS c, id FROM raw
             WHERE ph IN ('s', 'f') AND lower(cat) IN ({", ".join(_q(c) for c in categories)}) GROUP BY ALL
             HAVING NOT (bool_or(ph = 's') AND bool_or(ph = 'f')))"""


def range_profiler_mode(run_id: int) -> str:
    """SQL of one row: the run's CUPTI range-profiler ranges, its kernel/copy/set spans, its launch/copy/set calls
    without device activity and its unpaired CPU-to-GPU flow arrows. Kineto traces no device activity while the
    range profiler runs: a run with ranges and no device activity was taken in that mode, and the last two
    counts are what the mode implies, not gaps."""
    s = f"FROM _spans WHERE run_id = {run_id}"
    return f"""SELECT
        (SELECT count(*) {s} AND level = 'metrics'
            AND attrs->>'$."{A.METRICS_SOURCE}"' = 'cupti_range_profiler'),
        (SELECT count(*) {s} AND level IN ('kernel', 'memcpy', 'memset')),
        ({_launches_without_device_event(run_id)}),
        ({_unpaired_flows(M.CPU_TO_GPU_FLOWS)})"""


OTHER_THREADS_OPS = (
    "operators run outside every span of their thread on threads other than the one that runs the iterations (a "
    "thread pool's, a loader's or a server's threads)"
)
"""What the ops of the ops_other_threads check are, for its details (the import's, a merged run's)."""
LOOSE_OPS_DETAIL = {
    "unattributed_ops": "ops with no enclosing layer, op or annotation on their thread",
    M.OTHER_THREADS_CHECK: f"not a gap in the trace: {OTHER_THREADS_OPS}, charged to their thread",
}
"""The health checks of the ops with no parent (``loose_ops``), with their details."""


def loose_ops(run_id: int) -> str:
    """SQL: the ops of run ``run_id`` with no parent, counted by name and by whether each is on the thread of its
    process that runs the iterations (``framed``: the thread that holds the most of its steps, ``ProfilerStep#N``,
    a live run's region or what followed its last step; every such op of a process with none) or on another
    (a thread pool's, a server's client thread), which no span of the program's loop holds."""
    run = int(run_id)
    kind = f"attrs->>'$.\"{A.MODEL_KIND}\"'"
    loops = f"""(SELECT pid, tid FROM (
        SELECT pid, tid, count(*) AS n, max(count(*)) OVER (PARTITION BY pid) AS most FROM _spans
        WHERE run_id = {run} AND level = 'model' AND parent_id IS NULL AND ({kind} IN ('step', 'region', 'tail')
            OR ({kind} IS NULL AND regexp_matches(name, '^ProfilerStep#[0-9]+$')))
        GROUP BY pid, tid) WHERE n = most)"""
    on_loop = f"EXISTS (SELECT 1 FROM {loops} l WHERE l.pid = o.pid AND l.tid = o.tid)"
    looping = f"EXISTS (SELECT 1 FROM {loops} l WHERE l.pid = o.pid)"
    return (
        f"SELECT {on_loop} OR NOT {looping} AS framed, name, count(*) FROM _spans o "
        f"WHERE o.run_id = {run} AND o.level = 'op' AND o.parent_id IS NULL GROUP BY 1, 2"
    )


def health_queries(run_id: int, *, device_traced: bool = True) -> list[tuple[str, str, str]]:
    """(check, SQL returning one count, detail) for the counted checks of one imported run. A run whose device
    activity was not traced (``device_traced`` False: taken with the CUPTI range profiler) is not checked for
    launches without device activity, counter ranges without a kernel or CPU-to-GPU flows without a GPU end."""
    dev = ", ".join(_q(lv) for lv in DEVICE_LEVELS)
    s = f"FROM _spans WHERE run_id = {run_id}"
    flows = M.FLOW_CATEGORIES if device_traced else tuple(c for c in M.FLOW_CATEGORIES if c not in M.CPU_TO_GPU_FLOWS)
    named = ", ".join(dict.fromkeys(c if c not in M.CPU_TO_GPU_FLOWS else "ac2g" for c in flows))
    untraced = ("launches_without_device_event", "metrics_without_kernel")
    rows = [
        (
            "device_events_without_launch",
            f"SELECT count(*) {s} AND level IN ({dev}) AND parent_id IS NULL",
            "kernel/memcpy/memset/sync records whose correlation id matches no runtime call",
        ),
        (
            "launches_without_device_event",
            _launches_without_device_event(run_id),
            "launch/copy/set runtime calls with no device activity of the same correlation id",
        ),
        (
            "unpaired_flows",
            _unpaired_flows(flows),
            f"flow arrows ({named}) with a start and no finish, or a finish and no start",
        ),
        (
            "negative_duration",
            "SELECT count(*) FROM raw WHERE ph = 'X' AND dur < 0",
            "complete events with dur < 0: skipped",
        ),
        (
            "absurd_duration",
            f"SELECT count(*) FROM raw WHERE ph = 'X' AND dur * 1000 > {M.ABSURD_DURATION_NS}",
            "complete events longer than a day (a clock or unit error): skipped",
        ),
        (
            "missing_fields",
            "SELECT count(*) FROM raw WHERE ph = 'X' AND (ts IS NULL OR dur IS NULL)",
            "complete events without ts or dur: skipped",
        ),
        (
            "unattributed_runtime_calls",
            f"SELECT count(*) {s} AND level = 'runtime' AND parent_id IS NULL",
            "runtime calls with no enclosing op on their thread",
        ),
        (
            "metrics_without_kernel",
            f"SELECT count(*) {s} AND level = 'metrics' AND parent_id IS NULL",
            "hardware-counter ranges that name a kernel but match no kernel span in the trace",
        ),
        (
            "nesting_conflicts",
            "SELECT count(*) FROM host_parent h JOIN x USING (span_id) WHERE NOT h.encloses AND x.cat <> 'xstack'",
            "host spans that overlap a neighbour without nesting in it (left without that parent)",
        ),
        (
            M.OUTLASTING_CHECK,
            "SELECT count(*) FROM host_parent h JOIN x USING (span_id) WHERE h.outlasts AND h.encloses "
            "AND x.cat <> 'xstack'",
            "not a gap in the trace: host spans that spans around them ended before (PyTorch's record_function "
            "entered within a dispatch mode's call and left after it, as torch.compile's marks of its compile steps "
            "are; an iteration ended on another thread while a span of the program ran across its end), each "
            "nested in the innermost span that encloses it",
        ),
        (
            "duplicate_correlation_ids",
            f"""SELECT coalesce(sum(n - 1), 0) FROM (SELECT count(*) AS n {s} AND level = 'runtime'
             AND correlation_id IS NOT NULL GROUP BY correlation_id HAVING count(*) > 1)""",
            "runtime calls sharing a correlation id (device activity attributed to the first)",
        ),
    ]
    return [r for r in rows if device_traced or r[0] not in untraced]


UNNAMED_KERNELS = f"""
WITH k AS (
    SELECT name, level, device, correlation_id,
        row_number() OVER (PARTITION BY level, device ORDER BY start_ns, span_id) AS n,
        count(*) OVER (PARTITION BY level, device) AS total
    FROM _spans WHERE run_id = $run AND level IN ('kernel', 'metrics')
)
SELECT level, device, correlation_id, n, total FROM k WHERE name = {_q(M.UNNAMED_KERNEL)}
ORDER BY level, device, n
"""
"""Where each unnamed kernel is: its level, device, correlation id and position among its device's kernels (or
counter ranges, which the range profiler lays out in launch order)."""


SKIPPED = f"""
SELECT ph, lower(cat) AS cat, count(*) FROM raw
WHERE NOT (ph = 'M')
  AND NOT (ph IN ('s', 'f') AND lower(cat) IN ({", ".join(_q(c) for c in M.FLOW_CATEGORIES)}))
  AND NOT (ph = 'i' AND name = '[memory]') AND NOT (ph = 'C')
  AND NOT (ph = 'X' AND ({_level_expr()}) IS NOT NULL)
  -- the profiler's own bookkeeping: its session span and the markers of its recording window
  AND NOT (ph = 'X' AND lower(cat) = 'trace')
  AND NOT (ph = 'i' AND cat IS NULL AND (name = 'Record Window End' OR starts_with(name, 'Iteration Start: ')))
GROUP BY ALL ORDER BY 3 DESC
"""

NAMES = """
SELECT name, pid, tid, args->>'$.name' AS value FROM raw
WHERE ph = 'M' AND name IN ('process_name', 'thread_name', 'process_labels')
"""


def layer_paths(run_id: int) -> str:
    """Set ``layer.path`` of each layer span: the instance names of the layers enclosing it, outermost first,
    joined by dots (``BertModel_0.BertEncoder_0.BertLayer_0``); Kineto records no module paths."""
    return f"""
UPDATE _spans SET attrs = json_merge_patch(attrs, json_object('{A.LAYER_PATH}', lp.path))
FROM (
    WITH RECURSIVE chain(span_id, ancestor, path) AS (
        SELECT span_id, parent_id, name FROM _spans WHERE run_id = {run_id} AND level = 'layer'
        UNION ALL
        SELECT c.span_id, p.parent_id, CASE WHEN p.level = 'layer' THEN p.name || '.' || c.path ELSE c.path END
        FROM chain c JOIN _spans p ON p.run_id = {run_id} AND p.span_id = c.ancestor
    )
    SELECT span_id, path FROM chain WHERE ancestor IS NULL
) lp
WHERE _spans.run_id = {run_id} AND _spans.span_id = lp.span_id
"""


def copy_sizes(run_id: int) -> str:
    """Set ``memcpy.bytes`` of each copy whose record has no ``bytes`` from its launching call's ``size`` (a
    ROCm trace records the size on the ``hipMemcpy*`` call, not on the copy)."""
    size = f"TRY_CAST(r.attrs->'$.\"{A.KINETO_ARGS}\"'->>'size' AS BIGINT)"
    return f"""
UPDATE _spans SET attrs = json_merge_patch(_spans.attrs, json_object('{A.MEMCPY_BYTES}', {size}))
FROM _spans r
WHERE _spans.run_id = {run_id} AND _spans.level = 'memcpy' AND NOT json_exists(_spans.attrs, '$."{A.MEMCPY_BYTES}"')
  AND r.run_id = {run_id} AND r.span_id = _spans.parent_id AND r.level = 'runtime' AND {size} >= 0
"""
