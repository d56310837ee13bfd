"""Import Darshan logs (``.darshan``, read with PyDarshan) into a trace store: one run of the ``io`` level per log.

Notes: every record of the POSIX and STDIO modules becomes one ``io_files`` row, with Darshan's counters as
they are (``opens`` is ``POSIX_OPENS``, which counts ``fileno`` and ``dup`` calls too; ``STDIO_OPENS`` counts
``fdopen``); times go from Darshan's seconds to integer ns. Darshan logs carry no process id: a non-MPI log
is written per process and says rank 0, so ``pid`` is the MPI rank, and None for a record Darshan reduced over
all ranks (rank -1). When the log has DXT_POSIX traces, each traced read and write becomes an ``io`` span (no
parent: a log has nothing to hang it from; ``tid`` is the pid, as DXT records no thread). Darshan's timestamps
count seconds from the job start, which the log stores to the second in logs older than format 3.41, so
absolute times of older logs may be early by up to a second. Modules other than POSIX, STDIO and DXT_POSIX,
records lost to Darshan's memory limits and DXT segments missing are counted in ``health``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson

from xstack.importers.darshan._mapping import dxt_spans, io_file_row
from xstack.importers.darshan._reader import DXT, IMPORTED, DarshanLog, DxtRecord, read_log
from xstack.importers.kineto import ImportedRun
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store

__all__ = ["import_darshan", "log_health"]

_IO_FILE_COLUMNS = (
    "pid", "path", "module", "opens", "reads", "writes", "seeks", "bytes_read", "bytes_written", "read_time_ns",
    "write_time_ns", "meta_time_ns", "attrs",
)  # fmt: skip
_NO_RECORDS_MODULES = frozenset({"HEATMAP"})  # a module of summaries, not file records


def import_darshan(store: Store, path: str | Path, *, name: str | None = None) -> ImportedRun:
    """Import one Darshan log as a new run of ``store``: ``io_files`` rows from its POSIX and STDIO records,
    ``io`` spans from its DXT_POSIX segments, job metadata in ``runs.config``, and ``health`` rows.

    Raises ``BadInputError`` for a missing, foreign, truncated or damaged log and ``UsageError`` when PyDarshan is
    not installed, before anything is written; the caller makes the import all-or-nothing (``import_files``).
    """
    path = Path(path)
    log = read_log(path)
    run_id = store.next_run_id()
    start_ns = job_start_ns(log)
    dxt = {(d.record_id, d.rank): d for d in log.dxt}
    rows = [
        io_file_row(module, rec, log.names.get(rec.record_id, f"<record {rec.record_id}>"), start_ns,
                    dxt.get((rec.record_id, rec.rank)), log.names)
        for module in IMPORTED
        for rec in log.records.get(module, [])
    ]  # fmt: skip
    _insert_io_files(store, run_id, rows)
    spans = _insert_spans(store, run_id, log, start_ns)
    health = log_health(log)
    store.add_health(run_id, health)
    run_name = name or path.name.removesuffix(".darshan") or path.name
    store.add_run(_run_info(log, run_id, run_name, start_ns))
    return ImportedRun(run_id, run_name, path, spans, 0, [h for h in health if h[1]])


def job_start_ns(log: DarshanLog) -> int:
    """The job's start, Unix ns: the time Darshan's record timestamps count from."""
    job = log.job
    return int(job.get("start_time_sec", 0)) * 1_000_000_000 + int(job.get("start_time_nsec", 0))


def _insert_io_files(store: Store, run_id: int, rows: list[tuple[Any, ...]]) -> None:
    """Insert rows in bulk through DuckDB's JSON reader: one statement per row would cost about 0.3 ms each."""
    if not rows:
        return
    types = dict(
        store.query(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = '_io_files' "
            "AND database_name = current_database()"
        )
    )
    columns = "{" + ", ".join(f"{c}: '{types[c]}'" for c in _IO_FILE_COLUMNS) + "}"
    with tempfile.TemporaryDirectory(prefix="xstack-darshan-") as tmp:
        batch = Path(tmp) / "io_files.ndjson"
        with open(batch, "wb") as out:
            for row in rows:
                out.write(orjson.dumps(dict(zip(_IO_FILE_COLUMNS, row, strict=True))) + b"\n")
        store.con.execute(
            f"INSERT INTO _io_files BY NAME SELECT {int(run_id)} AS run_id, * FROM "
            f"read_json(?, format = 'newline_delimited', columns = {columns})",
            [str(batch)],
        )


def _insert_spans(store: Store, run_id: int, log: DarshanLog, start_ns: int) -> int:
    sink = Sink(store, run_id=run_id)
    span_id = 0
    try:
        for record in log.dxt:
            path = log.names.get(record.record_id, f"<record {record.record_id}>")
            pid = record.rank if record.rank >= 0 else None
            for name, start, dur, attrs in dxt_spans(record, path, start_ns):
                span_id += 1
                sink.span(span_id, None, "io", name, start, dur, pid, pid, attrs)
    finally:
        sink.close()
    return span_id


def log_health(log: DarshanLog) -> list[tuple[str, int, str]]:
    """Health rows of a log: partial modules (Darshan ran out of record memory or hit its per-module file
    limit), DXT segments and files missing, modules not imported, no records at all, the reader's warnings."""
    partial = sorted(m for m, info in log.modules.items() if info.get("partial_flag"))
    others = [m for m in log.modules if m not in (*IMPORTED, DXT)]
    missing, untraced = _dxt_gaps(log)
    any_records = any(log.records.values()) or log.dxt or any(log.modules[m].get("num_records") for m in others)
    return [
        (
            "darshan_partial_module",
            len(partial),
            f"{', '.join(partial)}: Darshan ran out of memory for records (or hit its limit of files per "
            "module, 1024 by default) and stopped tracking: I/O on the files past it is missing",
        ),
        (
            "darshan_dxt_segments_missing",
            missing,
            "reads and writes POSIX counted on DXT-traced files with no DXT segment (DXT's trace buffer filled "
            "up): no io span for them",
        ),
        (
            "darshan_dxt_files_untraced",
            untraced,
            "files with POSIX reads or writes that DXT did not trace (DXT triggers or its memory limit): no io "
            "spans for them",
        ),
        (
            "darshan_module_not_imported",
            len(others),
            ", ".join(_module_label(m, log.modules[m]) for m in others)
            + f": not imported (xstack imports {', '.join(IMPORTED)} and {DXT})",
        ),
        ("darshan_no_records", 0 if any_records else 1, "the log has no records: Darshan kept no file I/O"),
        ("darshan_reader_warnings", len(log.warnings), "; ".join(log.warnings[:3])),
    ]


def _dxt_gaps(log: DarshanLog) -> tuple[int, int]:
    """(segments missing from traced files, files with reads or writes and no DXT trace), if DXT_POSIX is on."""
    if DXT not in log.modules:
        return 0, 0
    traced: dict[tuple[int, int], DxtRecord] = {(d.record_id, d.rank): d for d in log.dxt}
    missing = untraced = 0
    for rec in log.records.get("POSIX", []):
        calls = rec.counters.get("POSIX_READS", 0) + rec.counters.get("POSIX_WRITES", 0)
        trace = traced.get((rec.record_id, rec.rank))
        if trace is None:
            untraced += calls > 0 and rec.rank >= 0  # DXT keeps no trace of reduced (rank -1) records
        else:
            missing += max(0, calls - len(trace.reads) - len(trace.writes))
    return missing, untraced


def _module_label(module: str, info: dict[str, Any]) -> str:
    count = info.get("num_records")
    return module if count is None or module in _NO_RECORDS_MODULES else f"{module} ({count} records)"


def _run_info(log: DarshanLog, run_id: int, name: str, start_ns: int) -> RunInfo:
    hosts = sorted({d.hostname for d in log.dxt if d.hostname})
    return RunInfo(
        run_id=run_id,
        name=name,
        started_at_ns=start_ns or None,
        command=log.exe or None,
        host=hosts[0] if len(hosts) == 1 else None,
        device="cpu",
        levels=["io"],
        pass_name="import",
        config={"source": {"format": "darshan", "path": str(log.path)}, "darshan": job_config(log, start_ns)},
    )


def job_config(log: DarshanLog, start_ns: int) -> dict[str, Any]:
    """What ``runs.config["darshan"]`` keeps of a log: job id, uid, process count, start and end (Unix ns),
    run time (s), command line, Darshan's versions, the modules present and a summary of the mount table."""
    job = log.job
    end_ns = int(job.get("end_time_sec", 0)) * 1_000_000_000 + int(job.get("end_time_nsec", 0))
    meta = dict(job.get("metadata") or {})
    return {
        "jobid": job.get("jobid"),
        "uid": job.get("uid"),
        "nprocs": job.get("nprocs"),
        "start_time_ns": start_ns,
        "end_time_ns": end_ns,
        "run_time_s": job.get("run_time"),
        "exe": log.exe,
        "log_version": job.get("log_ver"),
        "library_version": meta.pop("lib_ver", None),
        "metadata": meta,
        "pydarshan_version": log.pydarshan_version,
        "modules": {
            m: {"records": info.get("num_records"), "version": info.get("ver"), "partial": info.get("partial_flag")}
            for m, info in log.modules.items()
        },
        "hosts": sorted({d.hostname for d in log.dxt if d.hostname}),
        "mounts": mount_summary(log),
    }


def mount_summary(log: DarshanLog) -> dict[str, Any]:
    """The mount table in brief: how many mounts, how many of each file system type, and the mount point and
    type holding the imported files (longest matching mount point)."""
    types: dict[str, int] = {}
    for _mount, kind in log.mounts:
        types[kind] = types.get(kind, 0) + 1
    by_length = sorted(log.mounts, key=lambda m: len(m[0]), reverse=True)
    used: dict[str, str] = {}
    for module in IMPORTED:
        for rec in log.records.get(module, []):
            path = log.names.get(rec.record_id, "")
            for mount, kind in by_length:
                if path == mount or path.startswith(mount.rstrip("/") + "/"):
                    used[mount] = kind
                    break
    return {"count": len(log.mounts), "types": dict(sorted(types.items())), "holding_files": used}
