"""Import PyTorch profiler (Kineto) Chrome-trace JSON, plain or gzip, into a trace store.

Notes: events are staged in DuckDB chunk by chunk (see ``_reader``), then mapped and linked in SQL
(``_sql``): kernels, copies, sets and syncs to the runtime call of the same correlation id; host spans to the
innermost span enclosing them on their thread; Python frames by the profiler's frame ids; GPU annotations to
the CPU annotation of the same external id. What cannot be linked is kept and counted in ``health``. A last
``ProfilerStep#N`` that holds no work (the profiler stopping, see ``_steps``) is marked kind ``tail``, not an
iteration; a step that ends after the profiler stopped recording is cut to the activity recorded within it. A
trace without ``ProfilerStep#N`` recorded by the PARAM benchmark harness takes its iterations, warm-up first, from
PARAM's phase annotations (``_param``).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from xstack.errors import BadInputError
from xstack.importers.kineto import _mapping, _param, _sql, _steps
from xstack.importers.kineto._reader import ChunkRejected, TraceReader
from xstack.trace.devices import active_devices, describe_devices
from xstack.trace.schema import LEVELS
from xstack.trace.store import DATA_PER_MEMORY_BYTE, RunInfo, Store

__all__ = ["OTHER_THREADS_CHECK", "ImportedRun", "import_kineto", "merge_live", "other_thread_ops", "trace_name"]

OTHER_THREADS_CHECK = _mapping.OTHER_THREADS_CHECK

DEFAULT_CHUNK_BYTES = 4 << 20
_TEMP_TABLES = (
    "raw",
    "xm",
    "x",
    "host_start",
    "host_parent",
    "host_lost",
    "host_broken",
    "host_round",
    "host_try",
    "other_parent",
)


@dataclass
class ImportedRun:
    """What one imported trace became: its run id and how many spans, counters and health issues."""

    run_id: int
    name: str
    path: Path
    spans: int
    counters: int
    health: list[tuple[str, int, str]]


def trace_name(path: Path) -> str:
    """The run name for a trace file: its name without ``.json`` / ``.json.gz`` / ``.pt.trace.json``."""
    name = path.name
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name or path.name


def import_kineto(
    store: Store, path: str | Path, *, name: str | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> ImportedRun:
    """Import one Kineto trace as a new run of ``store``; raises ``BadInputError`` for unusable input.

    The caller provides atomicity (``Store.create``, or a scratch store for appends): on error, temp tables are
    dropped but rows already inserted for this run are not removed here.
    """
    path = Path(path)
    con = store.con
    run_id = store.next_run_id()
    # Each statement outside a transaction commits, and a commit past checkpoint_threshold checkpoints,
    # compressing the temp tables too: most of the load time for a large trace, for tables dropped at the
    # end. Hold checkpoints back until the import is done (the store's own checkpoint writes the rows).
    threshold = con.execute("SELECT current_setting('checkpoint_threshold')").fetchone()
    con.execute("SET checkpoint_threshold = '1TB'")
    try:
        reader = _stage(con, path, chunk_bytes)
        total = _scalar(con, "SELECT count(*) FROM raw")
        _check_is_trace(con, path, reader, total)
        with store.memory_for(reader.bytes_read):  # sorts and joins of a large trace need more to spill
            con.execute(_sql.stage_spans())
            con.execute(_sql.HOST_PARENTS)
            con.execute(_sql.OTHER_PARENTS)
            con.execute(_sql.insert_spans(run_id))
            con.execute(_sql.layer_paths(run_id))
            con.execute(_sql.copy_sizes(run_id))
            con.execute(_sql.insert_counters(run_id))
        spans = _scalar(con, f"SELECT count(*) FROM _spans WHERE run_id = {run_id}")
        counters = _scalar(con, f"SELECT count(*) FROM _counters WHERE run_id = {run_id}")
        if spans == 0 and counters == 0:
            raise BadInputError(
                f"{path}: not a PyTorch profiler (Kineto) trace: none of its {total} events is an op, runtime "
                "call, kernel, copy, annotation or memory record"
            )
        param, iterations = _param.mark_param_steps(con, run_id)
        health = _with_names(_health(con, run_id), _overlap_names(con))
        health += [_steps.cut_steps_past_recording(con, run_id), _steps.mark_stop_steps(con, run_id), param]
        store.add_health(run_id, health)
        info = _run_info(con, run_id, name or trace_name(path), path, reader.metadata)
        info.config.update(iterations)
        store.add_run(info)
    finally:
        for table in _TEMP_TABLES:
            con.execute(f"DROP TABLE IF EXISTS temp.{table}")
        if threshold:
            con.execute(f"SET checkpoint_threshold = '{threshold[0]}'")
    return ImportedRun(run_id, name or trace_name(path), path, spans, counters, [h for h in health if h[1]])


def merge_live(
    store: Store,
    paths: str | Path | Sequence[str | Path],
    run_id: int,
    *,
    drop_annotations: tuple[str, ...] = (),
) -> list[tuple[str, int, str]]:
    """Add the events of a trace the PyTorch profiler wrote during a live profile to run ``run_id``, whose
    live spans (model, layer) are already in ``store``; returns the health rows of the merge. ``paths``: the
    trace, or the parts it was written in, in order (each from a profiler session of its own).

    The mapping is the importer's, so live and imported traces have the same shape. Times move to the
    recorder's clock (Unix ns: Kineto's ``ts`` plus ``baseTimeNanoseconds``), the new span ids follow the
    run's, and the live host spans of a part's time are staged beside the profiler's so that each op finds the
    layer or model span enclosing it on its thread. User annotations whose name starts with one of
    ``drop_annotations`` (PyTorch's own marks for what the model level records itself) are left out. Each part
    is staged, merged and dropped before the next, so the memory a merge needs is a part's.
    """
    parts = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    con = store.con
    health: dict[tuple[str, str], int] = {}  # the parts' own checks, summed
    overlaps: dict[str, Counter[str]] = {}  # the overlapping spans' names per check, over the parts
    merged = False
    for path in parts:
        # the sorts and joins of a part need room to spill of about 4 times its size: the program has ended
        with store.memory_for(path.stat().st_size * DATA_PER_MEMORY_BYTE * 4):
            try:
                reader = _stage(con, path, DEFAULT_CHUNK_BYTES)
                if _scalar(con, "SELECT count(*) FROM raw WHERE ph IS NOT NULL AND ph <> 'M'") == 0:
                    continue  # the part ran no op: nothing to merge
                _merge_part(con, reader, run_id, drop_annotations)
                merged = True
                for check, count, detail in _health(con, run_id, run_wide=False):
                    health[check, detail] = health.get((check, detail), 0) + count
                for check, names in _overlap_names(con).items():
                    overlaps.setdefault(check, Counter()).update(names)
            finally:
                for table in _TEMP_TABLES:
                    con.execute(f"DROP TABLE IF EXISTS temp.{table}")
    if not merged:
        return []
    return _with_names([(c, n, d) for (c, d), n in health.items()], overlaps) + _health(con, run_id, part=False)


def _merge_part(con: duckdb.DuckDBPyConnection, reader: TraceReader, run_id: int, drop: tuple[str, ...]) -> None:
    """Merge the staged part (``raw``) of a live trace into run ``run_id``: ``merge_live``'s steps."""
    base = reader.metadata.get("baseTimeNanoseconds")
    base_ns = base if isinstance(base, int) else 0  # older traces: ts is already Unix time
    last = _scalar(con, f"SELECT coalesce(max(span_id), 0) FROM _spans WHERE run_id = {run_id}")
    con.execute(_sql.stage_spans())
    con.execute(f"UPDATE x SET span_id = span_id + {last}, start_ns = start_ns + {base_ns}")
    for prefix in drop:
        con.execute("DELETE FROM x WHERE cat = 'user_annotation' AND starts_with(name, ?)", [prefix])
    first, end = con.execute("SELECT min(start_ns), max(start_ns + dur_ns) FROM x").fetchone() or (None, None)
    con.execute(
        "INSERT INTO x BY NAME SELECT span_id, level, 'xstack' AS cat, false AS on_gpu, name, start_ns, dur_ns, "
        f"pid, tid, device FROM _spans WHERE run_id = {run_id} AND level IN ('model', 'layer') "
        "AND start_ns <= $end AND start_ns + dur_ns >= $first",  # the part's time: what can enclose its spans
        {"first": first if first is not None else 0, "end": end if end is not None else 2**63 - 1},
    )
    con.execute(_sql.HOST_PARENTS)
    con.execute(_sql.OTHER_PARENTS)
    con.execute(_sql.insert_spans(run_id, after_span_id=last))
    con.execute(_sql.copy_sizes(run_id))
    con.execute(_sql.insert_counters(run_id, base_ns=base_ns))


def _stage(con: duckdb.DuckDBPyConnection, path: Path, chunk_bytes: int) -> TraceReader:
    con.execute(_sql.CREATE_RAW)
    with tempfile.TemporaryDirectory(prefix="xstack-import-") as tmp, contextlib.ExitStack() as files:
        # Each chunk is written over the last one in a file kept open: reopening with truncation would make
        # the kernel drop the previous chunk's pages every time.
        single = str(Path(tmp) / "chunk.json")
        pair = [str(Path(tmp) / "chunk-a.json"), str(Path(tmp) / "chunk-b.json")]
        handles = {name: files.enter_context(open(name, "w+b")) for name in [single, *pair]}

        def write_chunk(name: str, body: memoryview) -> None:
            out = handles[name]
            out.seek(0)
            out.write(b"[")
            out.write(body)
            out.write(b"]")
            out.truncate()
            out.flush()

        def load(body: memoryview) -> None:
            write_chunk(single, body)
            try:
                con.execute(_sql.LOAD_CHUNK, [single])
            except duckdb.Error as exc:
                raise ChunkRejected(str(exc).splitlines()[0]) from exc

        def load_pair(bodies: list[memoryview]) -> None:
            # DuckDB reads one file per thread: two files in one statement load on two cores
            for name, body in zip(pair, bodies, strict=True):
                write_chunk(name, body)
            try:
                con.execute(_sql.LOAD_CHUNK, [pair])
            except duckdb.Error as exc:
                raise ChunkRejected(str(exc).splitlines()[0]) from exc

        reader = TraceReader(path, load, chunk_bytes, load_pair)
        reader.run()
    return reader


def _check_is_trace(con: duckdb.DuckDBPyConnection, path: Path, reader: TraceReader, total: int) -> None:
    if not reader.has_events_array:
        keys = ", ".join(sorted(reader.metadata)[:5]) or "none"
        raise BadInputError(f"{path}: not a PyTorch profiler trace: no traceEvents array (top-level keys: {keys})")
    if total == 0:
        raise BadInputError(f"{path}: empty trace: traceEvents holds no events")
    if _scalar(con, "SELECT count(*) FROM raw WHERE ph IS NOT NULL") == 0:
        raise BadInputError(f"{path}: not a PyTorch profiler trace: its events have no 'ph' (phase) field")
    if _scalar(con, "SELECT count(*) FROM raw WHERE ph <> 'M'") == 0:
        raise BadInputError(f"{path}: empty trace: only metadata events, no profiler events")


_RUN_WIDE = frozenset({"device_events_without_launch", "launches_without_device_event", "unattributed_ops",
                       _mapping.OTHER_THREADS_CHECK, "unattributed_runtime_calls", "metrics_without_kernel",
                       "duplicate_correlation_ids", "unnamed_kernels", _mapping.RANGE_PROFILER_CHECK})  # fmt: skip
"""The health checks that count the run's spans; the others count the staged trace (``raw``, its nesting)."""


def _health(
    con: duckdb.DuckDBPyConnection, run_id: int, *, run_wide: bool = True, part: bool = True
) -> list[tuple[str, int, str]]:
    """The run's health rows: ``run_wide``, those of ``_RUN_WIDE``; ``part``, those of the trace staged (a part
    of a live trace written in several has its own)."""
    mode = _range_profiler_mode(con, run_id) if part else None
    queries = [
        q for q in _sql.health_queries(run_id, device_traced=mode is None) if (q[0] in _RUN_WIDE and run_wide)
        or (q[0] not in _RUN_WIDE and part)
    ]  # fmt: skip
    rows = [(check, _scalar(con, sql), detail) for check, sql, detail in queries]
    rows = [(c, n, detail + _launch_names(con, run_id) if c == "launches_without_device_event" and n else detail)
            for c, n, detail in rows]  # fmt: skip
    if run_wide:
        loose = _loose_op_names(con, run_id)
        rows += [(c, sum(loose[c].values()), d + names_line(loose[c])) for c, d in _sql.LOOSE_OPS_DETAIL.items()]
    if mode is not None and run_wide:
        rows.append(mode)
    if run_wide:
        rows.append(_unnamed_kernels(con, run_id))
    skipped = con.execute(_sql.SKIPPED).fetchall() if part else []
    for ph, cat, count in skipped:
        rows.append(("skipped_events", int(count), f"ph={ph} cat={cat}: not a span, counter or flow xstack maps"))
    return rows


NAMES_SHOWN = 3
"""The names a health row's detail shows of the spans it counts, the most frequent first."""


def names_line(found: Counter[str]) -> str:
    """``found``'s most frequent names with their counts, for a health row's detail: ``": a (5), b (2) and 3 more
    names"``; empty where none."""
    if not found:
        return ""
    top = sorted(found.items(), key=lambda kv: (-kv[1], kv[0]))
    shown = ", ".join(f"{name} ({n:,})" for name, n in top[:NAMES_SHOWN])
    more = f" and {len(top) - NAMES_SHOWN:,} more names" if len(top) > NAMES_SHOWN else ""
    return f": {shown}{more}"


def _overlap_names(con: duckdb.DuckDBPyConnection) -> dict[str, Counter[str]]:
    """The staged spans whose span found by depth ended before them, by name, per health check:
    nesting_conflicts, those no span encloses; outlasting_spans, those nested in the innermost span that does
    (``_sql.HOST_PARENTS``). torch.compile's marks of its own compile steps, typically."""
    found = con.execute(
        "SELECT h.encloses, x.name, count(*) FROM host_parent h JOIN x USING (span_id) "
        "WHERE h.outlasts AND x.cat <> 'xstack' GROUP BY 1, 2"
    ).fetchall()
    names: dict[str, Counter[str]] = {}
    for nested, name, n in found:
        names.setdefault(_mapping.OUTLASTING_CHECK if nested else "nesting_conflicts", Counter())[str(name)] = int(n)
    return names


def _with_names(rows: list[tuple[str, int, str]], names: dict[str, Counter[str]]) -> list[tuple[str, int, str]]:
    """Health ``rows`` with the names of the spans they count (``names`` per check) added to their details."""
    return [(c, n, d + names_line(names[c]) if n and c in names else d) for c, n, d in rows]


def _loose_op_names(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, Counter[str]]:
    """The ops with no parent by name, per health check: unattributed_ops, ops_other_threads (``_sql.loose_ops``)."""
    names: dict[str, Counter[str]] = {check: Counter() for check in _sql.LOOSE_OPS_DETAIL}
    for framed, name, n in con.execute(_sql.loose_ops(run_id)).fetchall():
        names["unattributed_ops" if framed else _mapping.OTHER_THREADS_CHECK][str(name)] = int(n)
    return names


def other_thread_ops(con: duckdb.DuckDBPyConnection, run_id: int, where: str) -> str:
    """The detail of a health row on the ops the ops_other_threads check counts in run ``run_id``: what they are,
    ``where`` they are kept, and their names (``": aten::randn (72), aten::mul (12)"``)."""
    return f"{_sql.OTHER_THREADS_OPS}, {where}" + names_line(_loose_op_names(con, run_id)[OTHER_THREADS_CHECK])


def _launch_names(con: duckdb.DuckDBPyConnection, run_id: int) -> str:
    """The calls of the launches_without_device_event check by name, for its detail: ": cudaMemsetAsync 22"."""
    found = con.execute(_sql.launches_without_device_event_by_name(run_id)).fetchall()
    return ": " + ", ".join(f"{name} {int(n):,}" for name, n in found)


def _range_profiler_mode(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, int, str] | None:
    """The informational health row of a trace taken with the CUPTI range profiler, which Kineto runs instead of
    tracing device activity: what that mode leaves out, so that it is not read as gaps. None for other traces."""
    row = con.execute(_sql.range_profiler_mode(run_id)).fetchone()
    ranges, device, launches, flows = (int(v or 0) for v in row) if row else (0, 0, 0, 0)
    if not ranges or device:
        return None
    return (
        _mapping.RANGE_PROFILER_CHECK,
        ranges,
        f"not a gap in the trace: taken with the CUPTI range profiler (hardware counters per kernel), and Kineto "
        f"traces no kernels, copies or sets while it runs; so its {ranges:,} counter ranges match no kernel span, "
        f"{launches:,} launch/copy/set calls have no device activity, {flows:,} CPU-to-GPU flow arrows have no GPU "
        "end, and the ranges' times are Kineto's even layout over the session, not the kernels'",
    )


_UNNAMED_SHOWN = 5


def _unnamed_kernels(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[str, int, str]:
    """The health row of kernels recorded without a name, saying where each of the first few was launched."""
    found = con.execute(_sql.UNNAMED_KERNELS, {"run": run_id}).fetchall()
    where = [
        f"counter range {n:,} of {total:,} on {device}" if level == "metrics" else
        f"kernel {n:,} of {total:,} on {device} (correlation id {corr})"
        for level, device, corr, n, total in found[:_UNNAMED_SHOWN]
    ]  # fmt: skip
    more = f"; {len(found) - _UNNAMED_SHOWN:,} more" if len(found) > _UNNAMED_SHOWN else ""
    detail = (
        f"kernels the profiler recorded without a name (CUPTI gave their launch no symbol; Kineto writes "
        f"{_mapping.MISSING_NAME}), shown as {_mapping.UNNAMED_KERNEL}: " + "; ".join(where) + more
    )
    return "unnamed_kernels", len(found), detail


def _run_info(con: duckdb.DuckDBPyConnection, run_id: int, name: str, path: Path, meta: dict[str, Any]) -> RunInfo:
    present = con.execute(f"SELECT DISTINCT level FROM _spans WHERE run_id = {run_id}").fetchall()
    levels_present = {r[0] for r in present}
    first = con.execute(f"SELECT min(start_ns) FROM _spans WHERE run_id = {run_id}").fetchone()
    first_ns = int(first[0]) if first and first[0] is not None else None
    devices = meta.get("deviceProperties") or []
    device = describe_devices(active_devices(con, run_id), devices)  # the GPUs it used, not all of the host's
    processes: dict[str, dict[str, Any]] = {}
    for kind, pid, tid, value in con.execute(_sql.NAMES).fetchall():
        entry = processes.setdefault(str(pid), {"threads": {}})
        if kind == "thread_name":
            entry["threads"][str(tid)] = value
        else:
            entry["name" if kind == "process_name" else "labels"] = value
    hip = _scalar(
        con, f"SELECT count(*) FROM _spans WHERE run_id = {run_id} AND level = 'runtime' AND starts_with(name, 'hip')"
    )
    kineto = {k: v for k, v in meta.items() if k not in ("deviceProperties", "distributedInfo")}
    return RunInfo(
        run_id=run_id,
        name=name,
        started_at_ns=_started_at(meta, first_ns),
        framework="pytorch",
        device=device,
        levels=[lv for lv in LEVELS if lv in levels_present],
        pass_name="import",
        config={
            "source": {"format": "kineto", "path": str(path)},
            "devices": devices,
            "distributed": meta.get("distributedInfo"),
            "gpu_runtime": "hip" if hip else ("cuda" if devices else None),
            "processes": processes,
            "kineto": kineto,
        },
    )


def _started_at(meta: dict[str, Any], first_ns: int | None) -> int | None:
    """Wall-clock start: Kineto's ``baseTimeNanoseconds`` plus the first timestamp, or the timestamp itself
    when it is already Unix time (older traces)."""
    if first_ns is None:
        return None
    base = meta.get("baseTimeNanoseconds")
    if isinstance(base, int):
        return base + first_ns
    return first_ns if first_ns > 10**18 else None


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    row = con.execute(sql).fetchone()
    return int(row[0]) if row and row[0] is not None else 0
