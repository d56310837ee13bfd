"""Darshan records and DXT segments -> ``io_files`` rows and ``io`` spans, with Darshan's counter meanings."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from xstack.importers.darshan._reader import DxtRecord, Record, Segment
from xstack.trace import attrs as A
from xstack.trace.io_paths import path_class

NS_PER_S: Final = 1_000_000_000

COLUMNS: Final = ("opens", "reads", "writes", "seeks", "bytes_read", "bytes_written")
"""The integer ``io_files`` columns, in the view's order, each one Darshan counter (``COUNTER_OF``)."""
COUNTER_OF: Final = {
    "POSIX": {
        "opens": "POSIX_OPENS",  # Darshan counts fileno() and dup() calls in it as well (POSIX_FILENOS, _DUPS)
        "reads": "POSIX_READS",
        "writes": "POSIX_WRITES",
        "seeks": "POSIX_SEEKS",
        "bytes_read": "POSIX_BYTES_READ",
        "bytes_written": "POSIX_BYTES_WRITTEN",
    },
    "STDIO": {
        "opens": "STDIO_OPENS",  # fdopen() calls included (STDIO_FDOPENS)
        "reads": "STDIO_READS",
        "writes": "STDIO_WRITES",
        "seeks": "STDIO_SEEKS",
        "bytes_read": "STDIO_BYTES_READ",
        "bytes_written": "STDIO_BYTES_WRITTEN",
    },
}
TIMES: Final = ("read_time_ns", "write_time_ns", "meta_time_ns")
"""The time columns, from ``<MODULE>_F_READ_TIME``, ``_F_WRITE_TIME`` and ``_F_META_TIME`` (seconds)."""
_TIME_COUNTER: Final = dict(zip(TIMES, ("F_READ_TIME", "F_WRITE_TIME", "F_META_TIME"), strict=True))

_SAME: Final = {
    A.IO_FILE_CONSEC_READS: "CONSEC_READS",
    A.IO_FILE_CONSEC_WRITES: "CONSEC_WRITES",
    A.IO_FILE_SEQ_READS: "SEQ_READS",
    A.IO_FILE_SEQ_WRITES: "SEQ_WRITES",
    A.IO_FILE_MAX_BYTE_READ: "MAX_BYTE_READ",
    A.IO_FILE_MAX_BYTE_WRITTEN: "MAX_BYTE_WRITTEN",
    A.IO_FILE_STATS: "STATS",
    A.IO_FILE_RW_SWITCHES: "RW_SWITCHES",
    A.IO_FILE_MMAPS: "MMAPS",
    A.IO_FILE_RENAME_SOURCES: "RENAME_SOURCES",
    A.IO_FILE_RENAME_TARGETS: "RENAME_TARGETS",
}
"""Attribute -> the counter (without its module prefix) it copies, where the module has it. A negative value
is Darshan's "not recorded" (POSIX_MMAPS is -1 when mmap was not instrumented): the attribute is left out."""
_FSYNCS: Final = {"POSIX": ("POSIX_FSYNCS", "POSIX_FDSYNCS"), "STDIO": ("STDIO_FLUSHES",)}


def io_file_row(
    module: str, record: Record, path: str, start_ns: int, dxt: DxtRecord | None, paths: Mapping[int, str]
) -> tuple[Any, ...]:
    """The ``_io_files`` row of one record, less ``run_id``: (pid, path, module, the counter and time columns,
    attrs). ``pid`` is the record's rank, or None for a record Darshan reduced over all ranks (rank -1);
    ``start_ns`` is the job's start (Unix ns) that Darshan's timestamps count from; ``paths`` the log's paths
    by record id (``POSIX_RENAMED_FROM`` holds one: the attribute is the path it names, the id stays under
    ``darshan`` where the log does not name it)."""
    c, f = record.counters, record.fcounters
    used = {COUNTER_OF[module][col] for col in COLUMNS} | {f"{module}_{name}" for name in _TIME_COUNTER.values()}
    attrs: dict[str, Any] = {A.IO_FILE_SOURCE: "darshan", A.IO_FILE_PATH_CLASS: path_class(path)}
    for key, counter in _SAME.items():
        value = c.get(f"{module}_{counter}")
        if value is not None and value >= 0:
            attrs[key] = value
            used.add(f"{module}_{counter}")
    attrs[A.IO_FILE_FSYNCS] = sum(c.get(name, 0) for name in _FSYNCS[module])
    if module == "STDIO":  # one counter, one attribute; POSIX's two stay apart under "darshan"
        used.add("STDIO_FLUSHES")
    for key, kind in ((A.IO_FILE_SIZE_READ_HIST, "READ"), (A.IO_FILE_SIZE_WRITE_HIST, "WRITE")):
        names = {bucket: f"{module}_SIZE_{kind}_{bucket}" for bucket, _low, _high in A.IO_SIZE_BUCKETS}
        if all(n in c for n in names.values()):
            attrs[key] = {bucket: c[n] for bucket, n in names.items()}
            used.update(names.values())
    renamed_from = c.get(f"{module}_RENAMED_FROM", 0) % 2**64  # a record id, kept in a signed counter
    if renamed_from and renamed_from in paths:
        attrs[A.IO_FILE_RENAMED_FROM] = paths[renamed_from]
        used.add(f"{module}_RENAMED_FROM")
    attrs.update(_first_last(f, start_ns))
    if dxt is not None:
        attrs[A.IO_FILE_ZERO_READS] = sum(1 for s in dxt.reads if s.length == 0)
    raw: dict[str, Any] = {"rank": record.rank}
    raw.update((k, v) for k, v in c.items() if k not in used)
    raw.update((k, v) for k, v in f.items() if k not in used)
    attrs[A.IO_FILE_DARSHAN] = raw
    counts = [c[COUNTER_OF[module][col]] for col in COLUMNS]
    times = [round(f[f"{module}_{_TIME_COUNTER[col]}"] * NS_PER_S) for col in TIMES]
    pid = record.rank if record.rank >= 0 else None
    return (pid, path, module, *counts, *times, attrs)


def _first_last(f: dict[str, float], start_ns: int) -> dict[str, int]:
    """First start and last end of any operation on the file (Unix ns); Darshan leaves a timestamp 0 when the
    operation never happened."""
    starts = [v for k, v in f.items() if k.endswith("_START_TIMESTAMP") and v > 0]
    ends = [v for k, v in f.items() if k.endswith("_END_TIMESTAMP") and v > 0]
    out = {}
    if starts:
        out[A.IO_FILE_FIRST_NS] = start_ns + round(min(starts) * NS_PER_S)
    if ends:
        out[A.IO_FILE_LAST_NS] = start_ns + round(max(ends) * NS_PER_S)
    return out


def dxt_spans(dxt: DxtRecord, path: str, start_ns: int) -> Iterator[tuple[str, int, int, dict[str, Any]]]:
    """One ``(name, start_ns, dur_ns, attrs)`` per segment of a DXT record, reads and writes merged in start
    order; ``io.bytes`` is the bytes the call moved (Darshan traces the return value, 0 at end of file)."""
    klass = path_class(path)
    ops: list[tuple[str, Segment]] = [("read", s) for s in dxt.reads] + [("write", s) for s in dxt.writes]
    ops.sort(key=lambda op: op[1].start_s)
    for name, seg in ops:
        start = round(seg.start_s * NS_PER_S)
        attrs = {
            A.IO_PATH: path,
            A.IO_OFFSET: seg.offset,
            A.IO_BYTES: seg.length,
            A.IO_MODULE: "POSIX",
            A.IO_PATH_CLASS: klass,
        }
        yield name, start_ns + start, max(0, round(seg.end_s * NS_PER_S) - start), attrs
