"""Per-file and per-process I/O tables, from the ``io_files`` counters (Darshan's meanings)."""

from __future__ import annotations

from typing import Any

from xstack.analyze._io_common import (
    DATA_FILE,
    FILE_CLASS,
    FILE_OPEN_OPS,
    FILE_OPS,
    FILE_STORAGE,
    FILE_TIME,
    IO_DATA,
    IO_SPANS,
    IO_STORAGE,
    READ_OPS,
    SPAN_PATH,
    WRITE_OPS,
    IoRun,
    as_count,
    check_options,
    cpu_facts,
    file_int,
    in_list,
    io_run,
    lived_ns,
    mapped_files,
    mapped_label,
    rate,
    recording_text,
    recording_totals,
    span_rows,
)
from xstack.analyze._timeline_common import notes_of, pct, rows
from xstack.analyze.result import Chart, Column, Result, format_ns
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

FILES_ID, FILES_TITLE = "io.files", "I/O per file"
PROCESSES_ID, PROCESSES_TITLE = "io.processes", "I/O per process"
ROW_LIMIT = 1000
"""Files listed by default (the most I/O time first); the facts count them all."""
FOLDED = {"python": "(python files)", "profiler": "(profiler files)", "system": "(system files)",
          "ipc": "(shared memory and multiprocessing files)", "directory": "(directories)"}  # fmt: skip
"""Classes of files that are not the program's own, listed as one row each (by that name) unless ``all_paths``."""

REWRITE_TIMES = 4
"""A data file written over this many times its size (its bytes written against the furthest byte written), ..."""
REWRITE_MIN_OPENS = 8
"""... opened at least this many times (one open writing in place, a database, is not a rewrite) ..."""
REWRITE_MIN_BYTES = 1 << 20
"""... with at least this many bytes written beyond its size, is rewritten whole again and again."""

_REWRITTEN = f"""
WITH w AS (
    SELECT path, sum(opens) AS opens, sum(bytes_written) AS written, sum(write_time_ns + meta_time_ns) AS ns,
        max({file_int(A.IO_FILE_MAX_BYTE_WRITTEN)}) + 1 AS size
    FROM io_files WHERE run_id = $run AND {DATA_FILE} GROUP BY path HAVING sum(bytes_written) > 0
)
SELECT path, opens, written, size, ns FROM w
WHERE size > 0 AND opens >= {REWRITE_MIN_OPENS} AND written >= {REWRITE_TIMES} * size
    AND written - size >= {REWRITE_MIN_BYTES}
ORDER BY ns DESC, path LIMIT 1
"""
"""The data file rewritten whole again and again that took the most write and metadata time; its rows of every
module together (``torch.save`` opens with ``fopen``, counted under STDIO, and writes with ``write``, under POSIX)."""

_FILE_OPENS = in_list(FILE_OPEN_OPS)
_PATH_TIME = f"""
SELECT coalesce(sum(dur_ns), 0), coalesce(sum(dur_ns) FILTER (WHERE {{warm}}), 0),
    count(*) FILTER (WHERE name IN {_FILE_OPENS} AND TRY_CAST(attrs->>'$."{A.IO_REQUESTED_BYTES}"' AS BIGINT) & 3 <> 0),
    count(*) FILTER (WHERE name IN {_FILE_OPENS})
FROM spans
WHERE run_id = $run AND level = 'io' AND {SPAN_PATH} = $path AND NOT json_exists(attrs, '$."{A.IO_ERRNO}"')
"""
"""The time of the run's successful calls on one path, and of those in its warm-up iterations (``{warm}``); its
opens for writing (an open's flags, ``O_WRONLY`` or ``O_RDWR``, are its ``io.requested_bytes``) and all its opens:
opens of the file by its path, neither a descriptor's ``dup`` nor a stream opened on a descriptor (``numpy.save``
opens a file, then writes it through ``fdopen`` of a dup: one save, where Darshan's counters count three opens)."""

_FOLD = " ".join(f"WHEN '{cls}' THEN '{name}'" for cls, name in FOLDED.items())
_FILES = f"""
WITH f AS (
    SELECT *, {FILE_CLASS} AS class, {FILE_TIME} AS time_ns,
        CASE WHEN $all_paths THEN path ELSE CASE {FILE_CLASS} {_FOLD} ELSE path END END AS name
    FROM io_files WHERE run_id = $run
)
SELECT name, module, any_value(class), count(DISTINCT path), count(DISTINCT pid), sum(opens), sum(reads),
    sum(writes), sum(bytes_read), sum(bytes_written), sum(time_ns), sum(read_time_ns + write_time_ns),
    sum({file_int(A.IO_FILE_SEQ_READS)}), sum({file_int(A.IO_FILE_CONSEC_READS)}),
    sum({file_int(A.IO_FILE_ZERO_READS)})
FROM f GROUP BY name, module ORDER BY sum(time_ns) DESC, name, module
"""

_FILE_TOTALS = f"""
SELECT count(DISTINCT path) FILTER (WHERE {FILE_STORAGE}), count(DISTINCT path) FILTER (WHERE {DATA_FILE}),
    count(DISTINCT pid), sum(opens), sum(reads), sum(writes), sum(bytes_read), sum(bytes_written), sum(read_time_ns),
    sum(write_time_ns), sum(meta_time_ns), count(DISTINCT path) FILTER (WHERE NOT ({FILE_STORAGE})),
    string_agg(DISTINCT path, ', ' ORDER BY path) FILTER (WHERE NOT ({FILE_STORAGE}))
FROM io_files WHERE run_id = $run
"""

_PROCESSES_FROM_FILES = f"""
SELECT pid, sum({FILE_OPS}), sum(reads), sum(writes), sum(bytes_read), sum(bytes_written),
    sum(bytes_read) FILTER (WHERE {DATA_FILE}), sum({FILE_TIME}), sum(read_time_ns + write_time_ns),
    count(DISTINCT path)
FROM io_files WHERE run_id = $run AND {FILE_STORAGE} GROUP BY pid
"""

_PROCESSES_FROM_SPANS = f"""
SELECT pid, count(*), count(*) FILTER (WHERE name IN {in_list(READ_OPS)}),
    count(*) FILTER (WHERE name IN {in_list(WRITE_OPS)}),
    sum(nbytes) FILTER (WHERE name IN {in_list(READ_OPS)}), sum(nbytes) FILTER (WHERE name IN {in_list(WRITE_OPS)}),
    sum(nbytes) FILTER (WHERE name IN {in_list(READ_OPS)} AND {IO_DATA}), sum(dur_ns),
    sum(dur_ns) FILTER (WHERE name IN {in_list(READ_OPS + WRITE_OPS)}), count(DISTINCT path)
FROM {IO_SPANS} WHERE run_id = $run AND {IO_STORAGE} GROUP BY pid
"""

FILE_COLUMNS = [
    Column(
        "path",
        help="the file; Python, profiler and system files and directories are one row per class unless all_paths=True",
    ),
    Column("module", help="POSIX (descriptors) or STDIO (streams)"),
    Column("class", help="data, directory, python, profiler, system, stream or unknown"),
    Column("files", "count"),
    Column("processes", "count"),
    Column("opens", "count"),
    Column("reads", "count"),
    Column("writes", "count"),
    Column("bytes read", "bytes"),
    Column("bytes written", "bytes"),
    Column("time", "ns", "read + write + metadata time"),
    Column("bandwidth", "bytes/s", "bytes read and written / read and write time"),
    Column("sequential share", "pct", "reads that started after the previous read's end"),
    Column("consecutive share", "pct", "reads that started right at the previous read's end"),
    Column("zero reads", "count", "reads that returned no bytes (end of file)"),
]


def file_table(store: Store, run_id: int, *, all_paths: bool = False, limit: int | None = ROW_LIMIT) -> Result:
    """Per file and module: files, processes, opens, reads, writes, bytes read and written, time (ns), bandwidth
    (bytes/s), sequential and consecutive read shares (%) and zero-length reads; the most I/O time first.

    Notes: one row per (path, module) of ``io_files``, its counters summed over the processes that used the
    file (Darshan keeps one record per process). Python's files, the profiler's, the system's, the files processes
    share (shared memory, multiprocessing's) and directories are folded into one row per class (``all_paths=True``
    lists them). Standard streams, pipes and sockets keep rows of their own (class stream) but are not counted
    among the files (fact ``streams``), as ``io.processes`` and the summary leave them out. Time is read + write +
    metadata time (open, close, seek, stat); bandwidth divides the bytes by the read and write time only. The
    shares are of the file's reads (Darshan: consecutive reads are sequential too). ``limit`` rows at most (1,000
    by default; None: all), the most I/O time first; the label says how many were left out, and the store's
    ``io_files`` view holds every file, a row per process (``SELECT * FROM io_files WHERE run_id = N`` in DuckDB).
    """
    check_options(FILES_ID, limit=limit)
    io = io_run(store, run_id)
    if (lacking := io.lacking(FILES_ID, FILES_TITLE)) is not None:
        return lacking
    found = rows(store, _FILES, io.run_id, all_paths=all_paths)
    table = [_file_row(r) for r in found[:limit]]
    total = rows(store, _FILE_TOTALS, io.run_id)[0]
    keys = ("files", "data_files", "processes", "opens", "reads", "writes", "bytes_read", "bytes_written",
            "read_time_ns", "write_time_ns", "meta_time_ns", "streams")  # fmt: skip
    facts: dict[str, Any] = {k: as_count(v) for k, v in zip(keys, total[: len(keys)], strict=True)}
    facts["time_ns"] = facts["read_time_ns"] + facts["write_time_ns"] + facts["meta_time_ns"]
    facts["top_path"] = table[0][0] if table else None
    facts["rows"] = len(found)
    facts["mapped_files"], facts["mapped_bytes"] = mapped_files(store, io.run_id)
    facts |= _rewritten(store, io)
    return Result(
        FILES_ID,
        FILES_TITLE,
        FILE_COLUMNS,
        table,
        notes=notes_of(file_table) if io.has_files else "the run has io spans but no per-file counters (io_files)",
        run_id=io.run_id,
        chart=Chart(
            "hbar",
            x="path",
            y=("time",),
            title="I/O time per file (log scale)",
            limit=30,
            log_y=True,
            extra={"tell_apart": "module"},
        ),
        facts=facts,
        truncated=len(found) - len(table),
        labels=[_counted(facts["files"], facts["streams"], total[-1], found, len(table), (str(store.path), io.run_id))]
        + _mapped(facts),
    )


def _rewritten(store: Store, io: IoRun) -> dict[str, Any]:
    """Facts on the data file written whole over and over that took the most time: ``rewrite_path``,
    ``rewrite_opens``, ``rewrite_size`` (its furthest byte written, + 1), ``rewrite_bytes`` (written beyond that
    size), ``rewrite_times`` (bytes written / size), and ``rewrite_ns`` and ``rewrite_warmup_ns``: the time of
    its calls (those in the warm-up iterations), in the share of its bytes written beyond its size, from the io
    spans where the run has them (a merged run's: its one iteration's), else its write and metadata time
    (counters: a Darshan log); ``rewrite_write_opens``, its opens for writing, from the io spans of a run that is
    not merged (None otherwise: the counters do not tell an open's mode), whose opens of the file by its path are
    then ``rewrite_opens`` too (the counters' opens count a descriptor's dups and the streams opened on one). All
    None where no file is."""
    found = rows(store, _REWRITTEN, io.run_id)
    if not found:
        return dict.fromkeys(("rewrite_path", "rewrite_opens", "rewrite_size", "rewrite_bytes", "rewrite_times",
                              "rewrite_ns", "rewrite_warmup_ns", "rewrite_write_opens"))  # fmt: skip
    path, opens, written, size, ns = found[0]
    warm, write_opens = 0, None
    if io.has_spans:
        ns, warm, write_opens, path_opens = rows(store, _PATH_TIME.format(warm=io.ctx.in_warmup()), io.run_id,
                                                 path=path)[0]  # fmt: skip
        if io.ctx.pass_name == "merged":  # its spans are one iteration's, its counters the io pass's whole
            write_opens = None
        else:
            opens = path_opens
    share = 1 - int(size) / int(written)
    return {
        "rewrite_path": str(path), "rewrite_opens": as_count(opens), "rewrite_size": as_count(size),
        "rewrite_bytes": as_count(written) - as_count(size), "rewrite_times": round(int(written) / int(size), 1),
        "rewrite_ns": round(as_count(ns) * share), "rewrite_warmup_ns": round(as_count(warm) * share),
        "rewrite_write_opens": None if write_opens is None else as_count(write_opens),
    }  # fmt: skip


def _counted(files: int, streams: int, stream_names: str | None, found: list[tuple[Any, ...]], listed: int,
             where: tuple[str, int]) -> str:  # fmt: skip
    """How the rows stand for the files: how many files (and streams, which the other I/O analyses leave out) in
    how many rows, which classes are folded, and how many rows the limit left out, with where to read them all
    (``where``: the store's path and the run): the reports are read by users of the CLI."""
    names = {r[0] for r in found}
    folded = [cls for cls, name in FOLDED.items() if name in names]
    line = counted(files, "file")
    if streams:
        which = stream_names if streams <= _STREAMS_NAMED and stream_names else "standard streams, pipes, sockets"
        line += f", and {streams:,} stream{'s' if streams != 1 else ''} ({which}) that io.processes, the other I/O "
        line += "analyses and the summary leave out,"
    line += f" in {counted(len(found), 'row')}: one per path and module"
    if folded:
        line += f", and one per folded class ({', '.join(folded)})"
    if listed < len(found):
        store, run_id = where
        are = "is" if listed == 1 else "are"
        line += (f"; the {counted(listed, 'row')} with the most I/O time {are} listed, {len(found) - listed:,} left "
                 "out by the row limit: the store's io_files view has every file, a row per process (duckdb -readonly "
                 f"{store} \"SELECT * FROM io_files WHERE run_id = {run_id}\"; in Python, file_table(store, {run_id}, "
                 "limit=None) lists every row)")  # fmt: skip
    return line


_STREAMS_NAMED = 5
"""Streams named in the label of ``io.files`` where there are at most this many."""


def _file_row(r: tuple[Any, ...]) -> tuple[Any, ...]:
    name, module, cls, files, pids = r[:5]
    opens, reads, writes, nread, nwritten, time, rw_time, seq, consec, zero = (as_count(v) for v in r[5:])
    return (str(name), str(module), str(cls), int(files), int(pids), opens, reads, writes, nread, nwritten, time,
            rate(nread + nwritten, rw_time), pct(seq, reads), pct(consec, reads), zero)  # fmt: skip


PROCESS_COLUMNS = [
    Column(
        "process",
        help="main: the process of the training loop; resource tracker, forkserver: helpers of "
        "multiprocessing; subprocess: a program started by exec (subprocess.run, os.system), or a process started "
        "under one; worker: any other (DataLoader workers)",
    ),  # fmt: skip
    Column("pid"),
    Column("role"),
    Column("ops", "count", "opens, reads, writes, seeks, stats, syncs and mmaps"),
    Column("reads", "count"),
    Column("writes", "count"),
    Column("bytes read", "bytes"),
    Column("bytes written", "bytes"),
    Column("data bytes read", "bytes", "bytes read from data files (path class data, or unknown)"),
    Column("io time", "ns", "time in file operations"),
    Column("bandwidth", "bytes/s", "bytes read and written / read and write time"),
    Column("files", "count", "files touched (standard streams, pipes and sockets left out)"),
    Column("lived", "ns", "from the process's start (its fork) to its exit, while the io level recorded it"),
    Column(
        "cpu time",
        "ns",
        "CPU time it used over its life (user and system, all its threads), not only in the measured region",
    ),  # fmt: skip
    Column(
        "cpu wait",
        "ns",
        "time its threads waited in a run queue for a CPU over its life (those alive as it "
        "ended, and those that did file I/O and ended before it): a process that could run but found every CPU it "
        "may use taken",
    ),  # fmt: skip
    Column(
        "recording",
        "ns",
        "the io level's own time on the path of the calls it saw in the process over its life, part of its cpu "
        "time, as the io level measured it there: 1 call in 64 timed from its end to the end of its record, a "
        "clock read per call, and the writes of the records; not in it: what the io level's memory traffic costs "
        "the program's own code",
    ),  # fmt: skip
]


def process_table(store: Store, run_id: int) -> Result:
    """Per process: its role, operations, reads, writes, bytes read and written, data bytes read, I/O time (ns),
    bandwidth (bytes/s) and files touched; the most I/O time first.

    Notes: counted from ``io_files`` (from the ``io`` spans when the run has no per-file counters); pipes and
    sockets are left out (they carry batches between processes). The main process is ``runs.config.pid``,
    else the process of most model spans; the helpers of multiprocessing (its resource tracker and forkserver)
    and the programs started by exec (``subprocess``; ``io.process_role`` says which) are named as such; the
    others are workers (DataLoader workers are processes of their own). A program started by exec is named by
    the program it ran (``runs.config.io_programs``: ``subprocess cat (pid 15)``), and the label counts the programs
    started during the run, by name, with their time from start to exit (facts ``programs``, ``program_names``,
    ``programs_ns``). I/O time is read + write + metadata time; bandwidth divides the bytes by the read and write
    time. ``lived``, ``cpu time`` and ``cpu wait``: what the process did with the CPUs over its whole life while
    recorded (``runs.config.io_process_cpu``; empty in runs recorded before it, and in imported logs), its CPU time
    and its threads' wait in a run queue for a CPU; the label gives the workers' shares of their lives on a CPU and
    waiting for one, and the facts the figures of the main process and of the workers together (``cpu_facts``).
    ``recording``: the io level's own cost in the process, as the library measured it there (the column's help);
    facts ``recording_ns`` and ``recording_cpu_ns`` (the processes' CPU time beside it) and ``recording_pct``, and
    a label, where every process with CPU figures has it.
    """
    io = io_run(store, run_id)
    if (lacking := io.lacking(PROCESSES_ID, PROCESSES_TITLE)) is not None:
        return lacking
    if io.has_files:
        found = rows(store, _PROCESSES_FROM_FILES, io.run_id)
    else:
        found = span_rows(store, _PROCESSES_FROM_SPANS, io.run_id)
    table = sorted((_process_row(io.process(r[0]), io.role(r[0]), r, io.cpu.get(r[0])) for r in found),
                   key=lambda r: (-r[9], r[1]))  # fmt: skip
    workers = [r for r in table if r[2] == "worker"]
    main = next((r for r in table if r[2] == "main"), None)
    total_time = sum(r[9] for r in table)
    facts: dict[str, Any] = {
        "processes": len(table),
        "workers": len(workers),
        "main_pid": io.main_pid,
        "main_io_ns": main[9] if main else None,
        "worker_io_ns": sum(r[9] for r in workers) if io.main_pid is not None else None,
        "worker_io_pct": pct(sum(r[9] for r in workers), total_time) if io.main_pid is not None else None,
        "bytes_read": sum(r[6] for r in table),
        "bytes_written": sum(r[7] for r in table),
        "io_ns": total_time,
    }
    facts |= _run_programs(io) | cpu_facts(io) | _recording_facts(io)
    return Result(
        PROCESSES_ID,
        PROCESSES_TITLE,
        PROCESS_COLUMNS,
        table,
        notes=notes_of(process_table),
        run_id=io.run_id,
        chart=Chart("hbar", x="process", y=("io time",), title="I/O time per process", limit=40),
        facts=facts,
        labels=_programs_label(facts) + _cpu_label(facts) + _recording_label(facts),
    )


def _recording_facts(io: IoRun) -> dict[str, Any]:
    """``recording_ns`` (the io level's own cost, summed over the processes), ``recording_cpu_ns`` (their CPU time)
    and ``recording_pct`` (``recording_totals``; None where not known for every process)."""
    found = recording_totals(io.cpu)
    spent, cpu = found.get("recording_ns"), found.get("recording_cpu_ns")
    return {"recording_ns": spent, "recording_cpu_ns": cpu,
            "recording_pct": pct(spent, cpu) if spent is not None and cpu else None}  # fmt: skip


def _recording_label(facts: dict[str, Any]) -> list[str]:
    """``the io level's own time on the calls' path: 12.3 ms of the processes' 4.20 s of CPU time (0.3%), ...``."""
    spent, cpu = facts.get("recording_ns"), facts.get("recording_cpu_ns")
    if spent is None or not cpu:
        return []
    return [f"the io level's own time on the calls' path: {recording_text(spent, cpu)}, as it measured it in them "
            "(recording); what its memory traffic costs the program's own code is not in it"]  # fmt: skip


_PROGRAMS_NAMED = 4
"""Programs named in the label of ``io.processes``, the most started first."""


def _run_programs(io: IoRun) -> dict[str, Any]:
    """Facts on the programs started by exec during the run (``runs.config.io_programs``): ``programs`` (how many,
    those below another one included), ``program_names`` (program -> times started) and ``programs_ns`` (their
    lifetimes, from fork or exec to exit, summed)."""
    entries = list(io.programs.values())
    names: dict[str, int] = {}
    for e in sorted(entries, key=lambda e: str(e["program"])):
        names[str(e["program"])] = names.get(str(e["program"]), 0) + 1
    more = io.ctx.config.get(A.CONFIG_IO_PROGRAMS_MORE)
    lived = sum(max(0, int(e["end_ns"]) - int(e["start_ns"])) for e in entries
                if isinstance(e.get("start_ns"), int) and isinstance(e.get("end_ns"), int))  # fmt: skip
    return {"programs": len(entries) + (more if isinstance(more, int) else 0),
            "program_names": dict(sorted(names.items(), key=lambda kv: -kv[1])), "programs_ns": lived}  # fmt: skip


def _programs_label(facts: dict[str, Any]) -> list[str]:
    """``12 programs started by exec during the run (cat 10 times, sh 2), 24.0 ms from their start to their exit,
    2.00 ms each on average``; none where there were none."""
    n, names = int(facts["programs"]), facts["program_names"]
    if not n:
        return []
    named = ", ".join(f"{name} {counted(k, 'time')}" if i == 0 else f"{name} {k:,}"
                      for i, (name, k) in enumerate(list(names.items())[:_PROGRAMS_NAMED]))  # fmt: skip
    if len(names) > _PROGRAMS_NAMED:
        named += f", {counted(len(names) - _PROGRAMS_NAMED, 'other')}"
    kept = sum(names.values())
    lived = int(facts["programs_ns"])
    each = f", {format_ns(lived / kept)} each on average" if kept > 1 else ""
    return [f"{counted(n, 'program')} started by exec during the run ({named}): {format_ns(lived)} from their "
            f"start to their exit{each}"]  # fmt: skip


def _process_row(name: str, role: str, r: tuple[Any, ...], cpu: dict[str, int] | None) -> tuple[Any, ...]:
    pid = None if r[0] is None else int(r[0])
    ops, reads, writes, nread, nwritten, data_read, time, rw_time, files = (as_count(v) for v in r[1:])
    lived = lived_ns(cpu) if cpu else None
    return (name, pid, role, ops, reads, writes, nread, nwritten, data_read, time, rate(nread + nwritten, rw_time),
            files, lived, cpu["cpu_ns"] if cpu else None, cpu.get("run_delay_ns") if cpu else None,
            cpu.get("recording_ns") if cpu else None)  # fmt: skip


def _cpu_label(facts: dict[str, Any]) -> list[str]:
    """``the 2 worker processes were on a CPU 61% of their lives and waited for one 35%`` where known."""
    n, on, wait = facts.get("workers_timed"), facts.get("worker_cpu_pct"), facts.get("worker_run_delay_pct")
    if not n or on is None:
        return []
    them = "the worker process was" if n == 1 else f"the {n:,} worker processes were"
    waited = f" and waited for one {wait:.0f}%" if wait is not None else ""
    return [f"{them} on a CPU {on:.0f}% of {'its life' if n == 1 else 'their lives'}{waited} (cpu time, cpu wait)"]


def _mapped(facts: dict[str, Any]) -> list[str]:
    return [mapped_label(facts["mapped_files"], facts["mapped_bytes"])] if facts["mapped_files"] else []
