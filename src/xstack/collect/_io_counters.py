"""Per-file I/O counters with Darshan's meanings, computed from the io level's records of each call.

Darshan keeps its counters in the traced process as the calls happen; the io level records every call and
counts afterwards, with the same rules (``darshan-runtime/lib/darshan-posix.c``, ``darshan-stdio.c``):
- a record per (process, file, module): ``POSIX`` for calls on descriptors, ``STDIO`` for calls on streams;
- failed calls are not counted (Darshan records a call only when it returned >= 0);
- opens include ``dup`` (Darshan's ``OPENS`` counts dups and filenos); an open resets the file's last byte
  read and written, so the first read after an open is neither sequential nor consecutive;
- a read is *sequential* when it starts after the last byte the previous read of the file ended on, and
  *consecutive* when it starts right at the next byte (consecutive reads are also sequential); writes alike;
  the first read after an open that is neither (it starts at the start of the file) is counted apart too
  (``open_reads``), which Darshan leaves among the random reads;
- read, write and metadata times add each call's duration without counting an overlap twice (calls of
  several threads on one file): only the part after the end of the last counted call of that kind is added;
- ``fsync``/``fdatasync`` time counts as write time; open, close, seek, stat, mmap and rename are metadata;
  ``munmap``, which Darshan does not wrap, is a span of its own and counts nowhere;
- an in-kernel copy (``sendfile``, ``copy_file_range``, which Darshan does not wrap) is recorded as a read of its
  source and a write of its destination (``sendfile_read``, ``sendfile_write``, ...), counted as such: a copy
  loop's last call, which finds the end of the source, is a zero-length read;
- a run of stdio's character, line and formatted calls (``fgets``, ``fgetc``, ``fscanf``, ``fprintf``, ``fputs``, ...)
  and small ``fread`` and ``fwrite`` calls (``stdio_read``, ``stdio_write``) counts its calls as reads or writes and its
  bytes as theirs; it is one access of its bytes for the sequential and consecutive counts and the size histogram
  (Darshan's STDIO module keeps neither), its calls each following the one before;
- a rename counts on both paths as Darshan 3.4's ``RENAME_SOURCES`` and ``RENAME_TARGETS``, its time as the
  source's metadata; the target keeps the first path renamed to it (``RENAMED_FROM``, Darshan's record id of it);
- directory streams, which Darshan does not wrap, count as metadata of the directory: ``opendir`` as an open,
  ``readdir`` and ``closedir`` as their time;
- access sizes go into Darshan's buckets by the bytes the call moved (``trace.attrs.IO_SIZE_BUCKETS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from xstack.trace import attrs as A

if TYPE_CHECKING:
    from xstack.collect._io_classes import PathClasses

COPY_READS = frozenset({"sendfile_read", "copy_file_range_read"})
"""The source side of an in-kernel copy: bytes read from a file without passing through the program."""
COPY_WRITES = frozenset({"sendfile_write", "copy_file_range_write"})
RUNS = frozenset({"stdio_read", "stdio_write"})
"""Runs of stdio's character, line and formatted calls, and freads and fwrites under 1 KiB, on one stream
(``_io/hooks_stdio.c``): ``requested`` is the calls, ``bytes`` what they moved."""
READS = frozenset({"read", "pread", "readv", "fread", "stdio_read"}) | COPY_READS
WRITES = frozenset({"write", "pwrite", "writev", "fwrite", "stdio_write"}) | COPY_WRITES
OPENS = frozenset({"open", "openat", "creat", "dup", "fopen", "fdopen", "opendir"})
SEEKS = frozenset({"lseek", "fseek"})
SYNCS = frozenset({"fsync", "fdatasync", "fflush"})
STATS = frozenset({"stat", "lstat", "fstat", "fstatat", "statx"})
DIRS = frozenset({"readdir", "closedir"})
META = OPENS | SEEKS | STATS | DIRS | frozenset({"close", "fclose", "mmap", "rename"})

STREAM_PATHS = {"pipe": "<pipe>", "socket": "<socket>", "chr": "<device>"}
"""What a descriptor with no path is called, by its kind."""


class Op(Protocol):
    """The fields of a recorded call the counters read (``collect._io_records.IoOp``)."""

    @property
    def pid(self) -> int: ...
    @property
    def op(self) -> str: ...
    @property
    def module(self) -> str: ...
    @property
    def start_ns(self) -> int: ...
    @property
    def dur_ns(self) -> int: ...
    @property
    def fd(self) -> int: ...
    @property
    def path(self) -> str | None: ...
    @property
    def fd_kind(self) -> str: ...
    @property
    def offset(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def errno(self) -> int: ...
    @property
    def requested(self) -> int: ...
    @property
    def target(self) -> str | None: ...


def op_path(op: Op) -> str:
    """The file an operation is counted under: its path, else what its descriptor is (``<pipe>``, ``<fd 7>``)."""
    if op.path:
        return op.path
    return STREAM_PATHS.get(op.fd_kind, f"<fd {op.fd}>")


@dataclass(slots=True)  # no __dict__: a run counts a record per (process, file), 100,000s of them
class FileCounters:
    """The counters of one (process, file, module): the ``io_files`` columns and attributes."""

    pid: int
    path: str
    module: str
    fd_kind: str
    path_class: str
    opens: int = 0
    reads: int = 0
    writes: int = 0
    seeks: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    read_time_ns: int = 0
    write_time_ns: int = 0
    meta_time_ns: int = 0
    dups: int = 0
    stats: int = 0
    fsyncs: int = 0
    mmaps: int = 0
    seq_reads: int = 0
    seq_writes: int = 0
    consec_reads: int = 0
    consec_writes: int = 0
    zero_reads: int = 0
    open_reads: int = 0
    rw_switches: int = 0
    rename_sources: int = 0
    rename_targets: int = 0
    renamed_from: str | None = None
    max_byte_read: int = -1
    max_byte_written: int = -1
    first_ns: int | None = None
    last_ns: int = 0
    read_hist: dict[str, int] = field(default_factory=dict)
    write_hist: dict[str, int] = field(default_factory=dict)
    # running state, as Darshan's record reference keeps it
    _last_byte_read: int = 0
    _last_byte_written: int = 0
    _last_io: str = ""
    _opened: bool = False  # an open since the last read: the next read is its first
    _read_end: int = 0  # the end of the last read, write and metadata call counted: the next adds only what follows
    _write_end: int = 0
    _meta_end: int = 0

    def add(self, op: Op) -> None:
        """Count one successful call."""
        start = op.start_ns  # (no min() and max() calls: this runs for every call read back)
        end = start + op.dur_ns
        if self.first_ns is None or start < self.first_ns:
            self.first_ns = start
        if end > self.last_ns:
            self.last_ns = end
        name = op.op
        if name in READS:
            self._read(op)
            if end > (last := self._read_end):
                self.read_time_ns += end - (start if start > last else last)
                self._read_end = end
        elif name in WRITES or name in SYNCS:
            if name in SYNCS:
                self.fsyncs += 1
            else:
                self._write(op)
            if end > (last := self._write_end):
                self.write_time_ns += end - (start if start > last else last)
                self._write_end = end
        elif name in META:
            self._meta(name)
            if end > (last := self._meta_end):
                self.meta_time_ns += end - (start if start > last else last)
                self._meta_end = end

    def _meta(self, name: str) -> None:
        if name in OPENS:
            self.opens += 1
            self.dups += name == "dup"
            if name != "dup":  # a dup shares the descriptor's position; a new open starts over (Darshan)
                self._last_byte_read = self._last_byte_written = 0
                self._opened = True
        elif name in SEEKS:
            self.seeks += 1
        elif name in STATS:
            self.stats += 1
        elif name == "mmap":
            self.mmaps += 1
        elif name == "rename":
            self.rename_sources += 1

    def renamed_to(self, op: Op) -> None:
        """This file is the target of a successful rename (``op``, recorded on the source)."""
        self.first_ns = op.start_ns if self.first_ns is None else min(self.first_ns, op.start_ns)
        self.last_ns = max(self.last_ns, op.start_ns + op.dur_ns)
        self.rename_targets += 1
        if self.renamed_from is None:
            self.renamed_from = op_path(op)

    def _read(self, op: Op) -> None:
        offset, size, last = op.offset, op.bytes, self._last_byte_read
        if offset < 0:
            offset = 0
        sequential = offset > last
        self.seq_reads += sequential
        self.consec_reads += offset == last + 1
        if self._opened:
            self.open_reads += not sequential
            self._opened = False
        self._last_byte_read = last = offset + size - 1
        if last > self.max_byte_read:
            self.max_byte_read = last
        self.bytes_read += size
        calls = max(op.requested, 1) if op.op in RUNS else 1
        self.reads += calls
        self.seq_reads += calls - 1  # a run's calls each continue where the one before ended
        self.consec_reads += calls - 1
        self.zero_reads += size == 0
        bucket = A.size_bucket(size)
        self.read_hist[bucket] = self.read_hist.get(bucket, 0) + 1
        self.rw_switches += self._last_io == "write"
        self._last_io = "read"

    def _write(self, op: Op) -> None:
        offset, size, last = op.offset, op.bytes, self._last_byte_written
        if offset < 0:
            offset = 0
        self.seq_writes += offset > last
        self.consec_writes += offset == last + 1
        self._last_byte_written = last = offset + size - 1
        if last > self.max_byte_written:
            self.max_byte_written = last
        self.bytes_written += size
        calls = max(op.requested, 1) if op.op in RUNS else 1
        self.writes += calls
        self.seq_writes += calls - 1
        self.consec_writes += calls - 1
        bucket = A.size_bucket(size)
        self.write_hist[bucket] = self.write_hist.get(bucket, 0) + 1
        self.rw_switches += self._last_io == "read"
        self._last_io = "write"

    def attrs(self) -> dict[str, Any]:
        """The ``io_files.attrs`` object of this record."""
        return {
            A.IO_FILE_CONSEC_READS: self.consec_reads,
            A.IO_FILE_CONSEC_WRITES: self.consec_writes,
            A.IO_FILE_SEQ_READS: self.seq_reads,
            A.IO_FILE_SEQ_WRITES: self.seq_writes,
            A.IO_FILE_SIZE_READ_HIST: self.read_hist,
            A.IO_FILE_SIZE_WRITE_HIST: self.write_hist,
            A.IO_FILE_ZERO_READS: self.zero_reads,
            A.IO_FILE_OPEN_READS: self.open_reads,
            A.IO_FILE_MAX_BYTE_READ: self.max_byte_read,
            A.IO_FILE_MAX_BYTE_WRITTEN: self.max_byte_written,
            A.IO_FILE_STATS: self.stats,
            A.IO_FILE_FSYNCS: self.fsyncs,
            A.IO_FILE_MMAPS: self.mmaps,
            A.IO_FILE_RW_SWITCHES: self.rw_switches,
            A.IO_FILE_RENAME_SOURCES: self.rename_sources,
            A.IO_FILE_RENAME_TARGETS: self.rename_targets,
            A.IO_FILE_PATH_CLASS: self.path_class,
            A.IO_FILE_FIRST_NS: self.first_ns,
            A.IO_FILE_LAST_NS: self.last_ns,
            A.IO_FILE_SOURCE: "io",
            A.IO_FD_KIND: self.fd_kind,
            "dups": self.dups,
        } | ({A.IO_FILE_RENAMED_FROM: self.renamed_from} if self.renamed_from is not None else {})


def file_counters(ops: Sequence[Op], classes: PathClasses | None = None) -> list[FileCounters]:
    """The counters of every (process, file, module) that ``ops`` touched, ``ops`` taken in time order; each
    file's class from ``classes`` (default: what ``ops`` themselves say)."""
    if classes is None:
        from xstack.collect._io_classes import PathClasses

        classes = PathClasses(ops)
    records: dict[tuple[int, str, str], FileCounters] = {}

    def record_of(op: Op, name: str, path: str | None) -> FileCounters:
        record = records.get((op.pid, name, op.module))
        if record is None:
            record = FileCounters(op.pid, name, op.module, op.fd_kind, classes.of(path, op.fd_kind))
            records[op.pid, name, op.module] = record
        return record

    for op in ops:
        if op.errno or op.op == "close" and op.fd_kind == "unknown" and not op.path:
            continue  # failed calls are not counted; nor closes of descriptors never seen used
        path = op.path
        record = records.get((op.pid, path, op.module)) if path else None  # (record_of, inlined: the common case)
        (record or record_of(op, op_path(op), path)).add(op)
        if op.op == "rename" and op.target:
            record_of(op, op.target, op.target).renamed_to(op)
    return list(records.values())
