"""What the I/O analyses share: whether a run has I/O data, its main process, and SQL pieces over ``spans`` (level
``io``) and ``io_files``.

A run has I/O data when it holds ``io`` spans (the io level, or a Darshan log with DXT tracing) or ``io_files``
rows (any Darshan log). The main process is the one that ran the training loop: ``runs.config.pid`` when the
run recorded it, else the process of most model spans; the helpers of ``multiprocessing`` (its resource tracker
and forkserver, which the io level tells by their command lines) and the programs started by exec (``subprocess``)
are neither (``io.process_role``); every other process with I/O is a worker (DataLoader workers are processes of
their own).
"""

from __future__ import annotations

import statistics
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from xstack.analyze._timeline_common import rows
from xstack.analyze.context import RunContext, run_context
from xstack.analyze.result import Result, counted, format_ns, format_value
from xstack.errors import UsageError
from xstack.trace import attrs as A
from xstack.trace.store import Store

COPY_READ_OPS: Final = ("sendfile_read", "copy_file_range_read")
"""Span names of the source side of in-kernel copies (``sendfile``, ``copy_file_range``): bytes read from a file
that never pass through the program (``shutil.copyfile`` copies this way)."""
READ_OPS: Final = ("read", "pread", "pread64", "readv", "preadv", "preadv2", "fread", "stdio_read", *COPY_READ_OPS)
"""Span names of the calls that read a file (their ``io.bytes`` is what they returned)."""
WRITE_OPS: Final = ("write", "pwrite", "pwrite64", "writev", "pwritev", "pwritev2", "fwrite", "stdio_write",
                    "sendfile_write", "copy_file_range_write")  # fmt: skip
"""Span names of the calls that write a file (the destination side of in-kernel copies included)."""
OPEN_OPS: Final = ("open", "openat", "creat", "dup", "fopen", "fdopen", "opendir")
"""Span names of the calls Darshan counts as opens (``dup`` included, as its ``OPENS`` counts dups)."""
COMPRESSED_SUFFIXES: Final = (".gz", ".gzip", ".bz2", ".xz", ".lzma")
"""Files of a compressed stream, which Python's gzip, bz2 and lzma modules seek backwards in by decompressing
again from the start, and which cost their readers a decompression of each byte they read (zlib, bzip2, LZMA:
slow codecs, against zstd's or LZ4's)."""
FILE_OPEN_OPS: Final = ("open", "openat", "creat", "fopen")
"""Span names of the opens of a file by its path: not a descriptor's ``dup`` nor a stream opened on a descriptor
(``fdopen``), which Darshan counts too (``numpy.save`` and ``numpy.load`` open a file, then go through ``fdopen``
of a dup of its descriptor: one open of the file, three to Darshan)."""
CLOSE_OPS: Final = ("close", "fclose")
"""Span names of the calls that close a file (a descriptor, a stdio stream)."""

DATA_CLASSES: Final = ("data", "unknown")
"""Path classes that count as the program's data (``unknown``: a Darshan log that did not classify its paths)."""
SMALL_READ_BYTES: Final = 4096
"""Reads that returned fewer bytes than this (and more than none) are small: under a page, one call each."""

CHECKPOINT_NAME: Final = r"\.(pt|pth|ckpt|safetensors|distcp)$|(checkpoint|ckpt)[^/]*(/[^/]*)?$"
"""Regular expression (on the lower-cased path) of a checkpoint file's name: a state dict saved by ``torch.save``,
safetensors or ``torch.distributed.checkpoint``, or a file whose name or folder's name says so (a Hugging Face
Trainer's ``checkpoint-500/``); the folders above do not count (a project called ``checkpointing``)."""
SPAN_BYTES: Final = f"TRY_CAST(attrs->>'$.\"{A.IO_BYTES}\"' AS BIGINT)"
SPAN_CLASS: Final = f"coalesce(attrs->>'$.\"{A.IO_PATH_CLASS}\"', 'unknown')"
SPAN_PATH: Final = f"attrs->>'$.\"{A.IO_PATH}\"'"
FILE_CLASS: Final = f"coalesce(attrs->>'$.{A.IO_FILE_PATH_CLASS}', 'unknown')"
FILE_STORAGE: Final = f"{FILE_CLASS} NOT IN ('stream', 'ipc')"
SPAN_STORAGE: Final = f"{SPAN_CLASS} NOT IN ('stream', 'ipc')"
"""Conditions leaving out pipes, sockets and shared memory (classes ``stream`` and ``ipc``): they carry batches
between processes (a main process blocks reading them while it waits for a worker), so the analyses of storage
I/O count the other files only."""


def file_int(key: str) -> str:
    """SQL of an integer counter in ``io_files.attrs`` (0 when absent)."""
    return f"coalesce(TRY_CAST(attrs->>'$.{key}' AS BIGINT), 0)"


def hist_count(key: str, bucket: str) -> str:
    """SQL of one bucket of an access-size histogram in ``io_files.attrs`` (0 when absent)."""
    return f"coalesce(TRY_CAST(attrs->'$.{key}'->>'$.\"{bucket}\"' AS BIGINT), 0)"


FILE_OPS: Final = "opens + reads + writes + seeks + " + " + ".join(
    file_int(k) for k in (A.IO_FILE_STATS, A.IO_FILE_FSYNCS, A.IO_FILE_MMAPS)
)
"""SQL of the operations an ``io_files`` row counts: opens, reads, writes, seeks, stats, syncs and mmaps (as
Darshan's reports add them up)."""
FILE_TIME: Final = "read_time_ns + write_time_ns + meta_time_ns"
SYNC_OPS: Final = ("fsync", "fdatasync")
"""The calls that wait for a file's data to reach the disk (their time counts as write time, as Darshan's does)."""


def in_list(names: Sequence[str]) -> str:
    """SQL list literal of fixed names (never user input)."""
    return "(" + ", ".join(f"'{n}'" for n in names) + ")"


DATA_FILE: Final = f"{FILE_CLASS} IN {in_list(DATA_CLASSES)}"
DATA_SPAN: Final = f"{SPAN_CLASS} IN {in_list(DATA_CLASSES)}"
"""Conditions keeping the data files (``DATA_CLASSES``) of ``io_files`` rows and of ``io`` spans."""


IO_SPANS: Final = "_ax_io_spans"
"""Temp table of the io spans of the runs asked for (``typed_io_spans``), their attributes as typed columns: ``run_id,
span_id, pid, name, start_ns, dur_ns, path, cls`` (``SPAN_CLASS``), ``nbytes`` (``SPAN_BYTES``), ``off``, ``fd``,
``requested`` (``io.requested_bytes``), ``failed`` (the call set ``io.errno``) and ``entries`` (``io.dir_entries``).
A query that took each attribute out of every span's JSON parsed the JSON once per attribute, some half a second per
million spans each time; the table holds about 150 bytes per span while the store is open."""
IO_DATA: Final = f"cls IN {in_list(DATA_CLASSES)}"
IO_STORAGE: Final = "cls NOT IN ('stream', 'ipc')"
"""``DATA_SPAN`` and ``SPAN_STORAGE`` on ``IO_SPANS``."""
_TYPED_KEYS: Final = (
    A.IO_PATH,
    A.IO_PATH_CLASS,
    A.IO_BYTES,
    A.IO_OFFSET,
    A.IO_FD,
    A.IO_REQUESTED_BYTES,
    A.IO_ERRNO,
    A.IO_DIR_ENTRIES,
)


def parsed_once(paths: Sequence[str]) -> str:
    """SQL of the values at these JSON ``paths`` of a row's ``attrs`` as a list of strings (NULL where absent),
    the JSON parsed once for them all: each ``attrs->>path`` parses it again."""
    return "json_extract_string(attrs, [" + ", ".join(f"'{p}'" for p in paths) + "])"


_TYPED = f"""
SELECT run_id, span_id, pid, name, start_ns, dur_ns, a[1] AS path, coalesce(a[2], 'unknown') AS cls,
    TRY_CAST(a[3] AS BIGINT) AS nbytes, TRY_CAST(a[4] AS BIGINT) AS off, TRY_CAST(a[5] AS INTEGER) AS fd,
    TRY_CAST(a[6] AS BIGINT) AS requested, a[7] IS NOT NULL AS failed, TRY_CAST(a[8] AS BIGINT) AS entries
FROM (SELECT *, {parsed_once([f'$."{k}"' for k in _TYPED_KEYS])} AS a
      FROM spans WHERE run_id = $run AND level = 'io')
"""


def typed_io_spans(store: Store, run_id: int) -> str:
    """``IO_SPANS`` holding the run's io spans (filled once per open store and run: one parse of each span's
    attributes); its name, for SQL that reads it ``WHERE run_id = $run``."""
    ctx = run_context(store, run_id)
    if "io_spans" not in ctx._tables:
        con = store.con
        con.execute(f"CREATE TEMP TABLE IF NOT EXISTS {IO_SPANS} AS {_TYPED} LIMIT 0", {"run": ctx.run_id})
        con.execute(f"DELETE FROM {IO_SPANS} WHERE run_id = $run", {"run": ctx.run_id})
        con.execute(f"INSERT INTO {IO_SPANS} {_TYPED}", {"run": ctx.run_id})
        ctx._tables["io_spans"] = IO_SPANS
    return IO_SPANS


def span_rows(store: Store, sql: str, run_id: int, **params: Any) -> list[tuple[Any, ...]]:
    """``rows`` of SQL over ``IO_SPANS``, with the run's io spans in it first."""
    typed_io_spans(store, run_id)
    return rows(store, sql, run_id, **params)


def bucket_sql(expr: str) -> str:
    """SQL giving the ``IO_SIZE_BUCKETS`` name of a size in bytes ``expr``."""
    whens = " ".join(f"WHEN {expr} <= {high} THEN '{name}'" for name, _low, high in A.IO_SIZE_BUCKETS)
    return f"CASE {whens} ELSE '{A.IO_SIZE_BUCKETS[-1][0]}' END"


@dataclass(frozen=True)
class IoRun:
    """What the I/O analyses need to know about a run before they query it."""

    ctx: RunContext
    has_spans: bool
    """The run holds ``io`` spans (one per operation)."""
    has_files: bool
    """The run holds ``io_files`` rows (counters per process and file)."""
    main_pid: int | None
    source: str
    """``io`` (the io level), ``darshan`` (an imported log) or ``-`` when the rows do not say."""
    helpers: dict[int, str] = field(default_factory=dict)
    """The processes that are neither main nor workers, by pid, with their role (``io.process_role``: the helpers
    of ``multiprocessing``, ``resource_tracker`` and ``forkserver``, and ``subprocess``)."""
    recorded: bool = False
    """The run recorded the io level (``runs.levels``), whether or not its region did any file I/O."""
    programs: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The programs started by exec that the io level recorded (``runs.config.io_programs``), by pid."""
    cpu: dict[int, dict[str, int]] = field(default_factory=dict)
    """What the processes the io level recorded did with the CPUs (``runs.config.io_process_cpu``), by pid."""

    @property
    def run_id(self) -> int:
        return self.ctx.run_id

    def role(self, pid: int | None) -> str:
        """``main``, ``worker``, another role (``resource tracker``, ``forkserver``, ``subprocess``: not workers) or
        ``-`` (no main process known: a Darshan log has no model spans)."""
        if pid is not None and pid in self.helpers:
            return self.helpers[pid].replace("_", " ")
        if self.main_pid is None or pid is None:
            return "-"
        return "main" if pid == self.main_pid else "worker"

    @property
    def helper_pids(self) -> list[int]:
        """The pids of the helpers, for SQL (``list_contains``)."""
        return sorted(self.helpers)

    def process(self, pid: int | None) -> str:
        """A process as the tables and charts name it: ``main (pid 12)``, ``worker (pid 13)``, ``subprocess cat
        (pid 15)`` (the program it ran, where the run recorded it), ``pid 14``."""
        role = self.role(pid)
        if role == "subprocess" and pid in self.programs:
            role = f"subprocess {self.programs[pid]['program']}"
        return f"pid {pid}" if role == "-" else f"{role} (pid {pid})"

    def lacking(self, id: str, title: str) -> Result | None:
        """A result saying the io level is missing, or None when the run has I/O data or recorded the level (a
        program whose region reads no file: an in-memory dataset)."""
        if self.has_spans or self.has_files or self.recorded:
            return None
        return self.ctx.lacking(id, title, "io")


_RUNS: weakref.WeakKeyDictionary[Store, dict[int, IoRun]] = weakref.WeakKeyDictionary()


def io_run(store: Store, run_id: int | None) -> IoRun:
    """The run's I/O facts (computed once per open store and run)."""
    ctx = run_context(store, run_id)
    per_store = _RUNS.setdefault(store, {})
    if ctx.run_id not in per_store:
        files = store.query(
            f"SELECT count(*), any_value(attrs->>'$.{A.IO_FILE_SOURCE}') FROM io_files WHERE run_id = ?", [ctx.run_id]
        )[0]
        levels = store.query("SELECT levels FROM runs WHERE run_id = ?", [ctx.run_id])[0][0]
        # a live run that recorded the level; an imported log without records has none to analyse
        recorded = "io" in (levels or []) and not isinstance(ctx.config.get("source"), dict)
        source = str(files[1] or ("io" if ctx.has("io") or recorded else "-"))
        per_store[ctx.run_id] = IoRun(ctx, ctx.has("io"), bool(files[0]), _main_pid(store, ctx), source,
                                      _helpers(store, ctx.run_id), recorded, A.io_programs(ctx.config),
                                      A.io_process_cpu(ctx.config))  # fmt: skip
    return per_store[ctx.run_id]


def lived_ns(entry: dict[str, int]) -> int:
    """A process's time from its start to its exit, from its ``runs.config.io_process_cpu`` entry."""
    return max(0, entry.get("end_ns", 0) - entry.get("start_ns", 0))


def cpu_facts(io: IoRun) -> dict[str, Any]:
    """What the main process and the workers did with the CPUs over their lives (``runs.config.io_process_cpu``):
    ``main_cpu_ns``, ``main_run_delay_ns`` (its threads' wait for a CPU), ``main_lived_ns``, ``main_cpus`` (the
    CPUs it kept busy on average: its CPU time over its life); for the workers, summed over them, ``workers_timed``
    (how many), ``worker_cpu_ns``, ``worker_run_delay_ns`` (None unless known for each), ``worker_lived_ns``, and
    ``worker_cpu_pct`` and ``worker_run_delay_pct``, shares of their lives. Empty where the run has no such figures.
    A thread's wait counts in full while others of its process run, so a process of several threads may wait
    longer than it lived."""
    if not io.cpu:
        return {}
    out: dict[str, Any] = {}
    main = io.cpu.get(io.main_pid) if io.main_pid is not None else None
    if main is not None:
        lived = lived_ns(main)
        out |= {"main_cpu_ns": main["cpu_ns"], "main_run_delay_ns": main.get("run_delay_ns"), "main_lived_ns": lived,
                "main_cpus": round(main["cpu_ns"] / lived, 2) if lived else None}  # fmt: skip
    workers = [e for pid, e in io.cpu.items() if io.role(pid) == "worker"]
    if workers:
        lived = sum(lived_ns(e) for e in workers)
        cpu = sum(e["cpu_ns"] for e in workers)
        known = all("run_delay_ns" in e for e in workers)
        delay = sum(e.get("run_delay_ns", 0) for e in workers) if known else None
        out |= {"workers_timed": len(workers), "worker_cpu_ns": cpu, "worker_run_delay_ns": delay,
                "worker_lived_ns": lived, "worker_cpu_pct": 100.0 * cpu / lived if lived else None,
                "worker_run_delay_pct": 100.0 * delay / lived if lived and delay is not None else None}  # fmt: skip
    return out


SHORT_OF_CPUS_PCT: Final = 20.0
"""The share of the time they were ready to run (``ready_wait_pct``) that the workers waited for a CPU from which they
are found short of CPUs, their calls' times holding those waits."""


def ready_wait_pct(facts: dict[str, Any]) -> float | None:
    """The share (%) of the time the workers were ready to run that they waited for a CPU (``cpu_facts``' run-queue
    wait over it and their CPU time; over their lives, which hold their idle waits with batches read ahead, it reads
    far lower: 10% against 61% for 8 persistent workers on 2 CPUs); None where unknown. Calls that return on CPUs the
    workers are short of wait there for one, a time no I/O takes."""
    delay, cpu = facts.get("worker_run_delay_ns"), facts.get("worker_cpu_ns")
    if not isinstance(delay, (int, float)) or not isinstance(cpu, (int, float)) or delay + cpu <= 0:
        return None
    return 100.0 * delay / (delay + cpu)


def io_pass(store: Store, config: dict[str, Any]) -> tuple[int, str] | None:
    """The run and pass name of a merged run's io pass (a pass of its leveled measurement that recorded the model
    and io levels, ``config.merge``), or None."""
    merge = config.get("merge")
    listed = [p for key in ("passes", "counter_passes") for p in (merge or {}).get(key) or [] if isinstance(p, dict)]
    for p in listed:
        run = p.get("run_id")
        if isinstance(run, int) and not isinstance(run, bool):
            levels = store.query("SELECT levels FROM runs WHERE run_id = ?", [run])
            if levels and {"model", "io"} <= set(levels[0][0] or []):
                return run, str(p.get("pass") or run)
    return None


def _helpers(store: Store, run_id: int) -> dict[int, str]:
    rows = store.con.execute(
        f"""SELECT pid, any_value(attrs->>'$.{A.IO_FILE_PROCESS_ROLE}') FROM io_files
        WHERE run_id = $run AND attrs->>'$.{A.IO_FILE_PROCESS_ROLE}' IS NOT NULL GROUP BY pid
        UNION SELECT pid, any_value(attrs->>'$."{A.IO_PROCESS_ROLE}"') FROM spans
        WHERE run_id = $run AND level = 'io' AND attrs->>'$."{A.IO_PROCESS_ROLE}"' IS NOT NULL GROUP BY pid""",
        {"run": run_id},
    ).fetchall()
    return {int(pid): str(role) for pid, role in rows if pid is not None}


def _main_pid(store: Store, ctx: RunContext) -> int | None:
    pid = ctx.config.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        return pid
    if not ctx.has("model"):
        return None
    row = store.query(
        "SELECT pid FROM spans WHERE run_id = ? AND level = 'model' AND pid IS NOT NULL "
        "GROUP BY pid ORDER BY count(*) DESC, pid LIMIT 1",
        [ctx.run_id],
    )
    return int(row[0][0]) if row else None


def class_filter(all_paths: bool, column: str = FILE_CLASS) -> str:
    """SQL condition keeping the data files (every file when ``all_paths``)."""
    return "TRUE" if all_paths else f"{column} IN {in_list(DATA_CLASSES)}"


_MAPPED = f"""
SELECT (SELECT count(DISTINCT path) FROM io_files
        WHERE run_id = $run AND {DATA_FILE} AND {file_int(A.IO_FILE_MMAPS)} > 0), count(*), sum(size)
FROM (SELECT {SPAN_PATH} AS path, max(TRY_CAST(attrs->>'$."{A.IO_REQUESTED_BYTES}"' AS BIGINT)) AS size
      FROM spans WHERE run_id = $run AND level = 'io' AND name = 'mmap' AND {DATA_SPAN} GROUP BY 1)
"""


def recording_totals(cpu: dict[int, dict[str, int]]) -> dict[str, int]:
    """The io level's own cost as it measured it in the processes (``runs.config.io_process_cpu``'s
    ``recording_ns``, summed: ``recording_ns``) and their CPU time (``recording_cpu_ns``), over their lives; empty
    where a process with CPU figures lacks it (files from a library before it measured itself)."""
    if not cpu or any("recording_ns" not in e for e in cpu.values()):
        return {}
    return {"recording_ns": sum(e["recording_ns"] for e in cpu.values()),
            "recording_cpu_ns": sum(e["cpu_ns"] for e in cpu.values())}  # fmt: skip


def recording_text(spent: int, cpu: int) -> str:
    """The io level's own cost, in words: ``12.3 ms of the processes' 4.20 s of CPU time (0.3%)``."""
    share = f" ({100.0 * spent / cpu:.1f}%)" if cpu else ""
    return f"{format_ns(spent)} of the processes' {format_ns(cpu)} of CPU time{share}"


def mapped_files(store: Store, run_id: int) -> tuple[int, int | None]:
    """The data files the run mapped into memory (``mmap``: ``numpy.memmap``, Arrow datasets, ``torch.load``
    with ``mmap=True``), and the bytes mapped, the largest mapping of each file summed (None without io spans:
    a Darshan log counts mmaps only)."""
    files, span_files, size = store.con.execute(_MAPPED, {"run": run_id}).fetchone() or (0, 0, None)
    return max(int(files or 0), int(span_files or 0)), (int(size) if span_files and size is not None else None)


def mapped_label(files: int, size: int | None) -> str:
    """What a run's mapped data files leave out of its I/O figures, in one sentence."""
    mapped = f" ({format_value(size, 'bytes')})" if size else ""
    return (f"{counted(files, 'data file')} mapped into memory{mapped}: what the program reads through a mapping "
            "is page faults, not calls, and is in none of the bytes read or I/O times")  # fmt: skip


def check_options(id: str, **positive: float | None) -> None:
    """Raise ``UsageError`` naming the analysis when an option that must be positive is not."""
    bad = [k for k, v in positive.items() if v is not None and not v > 0]
    if bad:
        raise UsageError(f"{id}: {', '.join(bad)} must be > 0")


def rate(nbytes: float | None, ns: float | None) -> float | None:
    """Bytes per second from bytes and nanoseconds (None when either is 0 or unknown)."""
    return float(nbytes) * 1e9 / float(ns) if nbytes and ns else None


def median(values: Sequence[float]) -> float | None:
    """The median, None for no values."""
    return float(statistics.median(values)) if values else None


def bucket_median(counts: dict[str, int]) -> float | None:
    """The median access size in bytes estimated from a Darshan histogram: the bucket holding the middle access,
    interpolated linearly between its edges (exact only at the edges)."""
    total = sum(counts.values())
    if not total:
        return None
    half, seen = total / 2, 0
    for name, low, high in A.IO_SIZE_BUCKETS:
        n = counts.get(name, 0)
        if n and seen + n >= half:
            return low + (high - low) * (half - seen) / n
        seen += n
    return None


def small_from_hist(counts: dict[str, int], zero_reads: int) -> float:
    """Non-empty reads under ``SMALL_READ_BYTES`` estimated from a histogram: the buckets wholly below it, less
    the zero-length reads, and the part of the 1K-10K bucket below it (accesses taken as spread evenly)."""
    below = counts.get("0_100", 0) + counts.get("100_1K", 0) - zero_reads
    low, high = 1025, 10 * 1024
    return max(below, 0) + counts.get("1K_10K", 0) * (SMALL_READ_BYTES - low) / (high - low + 1)


def as_count(value: Any) -> int:
    """An integer from a SQL aggregate (NULL counts as 0; sums of BIGINT come back as HUGEINT or floats)."""
    return 0 if value is None else int(round(float(value)))
