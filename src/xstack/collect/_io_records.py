"""Reader of the record files the io level's interposition library writes (``collect/_io/core.c``).

Each recorded process image writes ``<pid>-<start_ns>-<seq>.xio`` into ``$XSTACK_IO_DIR``: a header (pid,
parent, start, mode, executable, argv and the names of the operation and descriptor-kind codes), then blocks
of fixed-size operation records and of status (counters, and how the process ended; the last status block is
the one that counts). A program the preload cannot reach (static binary, setuid, an
environment without ``LD_PRELOAD``, any exec in attach mode) leaves ``notcovered-<pid>-<ns>.xnc``.

Notes: each operation block holds 32-byte slots of one thread's record stream, decoded whole with
``struct.iter_unpack``: start times are relative to the stream's last time-base slot (which carries over
between a thread's blocks in one file), and a call whose values do not fit one slot takes a second, wide one.
A path travels in the stream before the first record that names it: a ``path`` slot with a new id and the
path's bytes in the slots after it. An id means one path within a process image (across its attach
sessions); a fork child's records also name the ids of the descriptors it inherited, which its parent's files
define, so ids are resolved once every file is read. The library does not intern: the reader does, so that
equal paths share one string.
A file cut short (a process killed mid-write) keeps every whole record before the cut and adds a line to
``IoTrace.problems``.
"""

from __future__ import annotations

import operator
import signal
import struct
from array import array
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from xstack.errors import BadInputError
from xstack.trace.io_paths import path_text

MAGIC = b"XSTACKIO"
VERSION = 3
_HEADER = struct.Struct("<8sIIqqqIIIIIIIIq")
_BLOCK = struct.Struct("<IIQ")
_OPS_THREAD = struct.Struct("<iI")
_RECORD = struct.Struct("<IIqIiihBB")
RECORD_BYTES = _RECORD.size
"""The size of a slot of a thread's record stream: most calls take one."""
RAW_FIELDS = 11
"""The values a call keeps from its slots until it is built (``_File.raw``): start, duration, offset, bytes,
requested, thread, descriptor, path id, errno, operation code and descriptor kind."""
_WIDE_VALUES = struct.Struct("<qqqii")
_KIND, _FAILED, _WIDE, _TIME, _THREAD = 0x0F, 0x10, 0x20, 0x40, 0x80
_STATUS = struct.Struct("<IIqQQQQQQQ")
_STATUS_CPU = struct.Struct("<qqqq")
"""After the status's calls dropped by operation (from 2026-11-24, found by the payload's size): the process's CPU
time, its live threads' run-queue wait (ns), how many threads were read (0: not read, in a status that is not
final) and its involuntary context switches, since its image started recording."""
_STATUS_SELF = struct.Struct("<qqqq")
"""After those (from 2026-11-25, found the same way): what recording cost the process since then, as the library
measured it (``struct xio_self``): the ns from the second clock read of 1 recorded call in 64 to the end of its
record, summed, and how many were timed; the CPU ns of its flushes; one clock read's cost in ps."""
_BLOCK_OPS, _BLOCK_STATUS = 2, 3
_ENDS = {0: "running", 1: "exit", 2: "_exit", 3: "exec", 4: "detach"}
_END_SIGNAL = 5
"""The status's end for a process killed by a termination signal it left at the default action: the library
wrote its records and let the signal kill it (the signal's number in bits 8-15)."""
_STDIO = frozenset({"fopen", "fdopen", "fread", "fwrite", "fclose", "fseek", "fflush", "stdio_read", "stdio_write"})

NOT_COVERED_REASONS = {
    "static": "statically linked (no program interpreter): LD_PRELOAD cannot reach it",
    "setuid": "set-user-ID or set-group-ID program: the loader ignores LD_PRELOAD for it",
    "env": "started with an environment that lacks LD_PRELOAD or XSTACK_IO_DIR",
    "attach": "started by exec from a process the io level attached to at run time (only preload follows exec)",
}
"""``NotCovered.reason`` -> what it means."""


class IoOp(NamedTuple):
    """One recorded call (a named tuple: millions are built as a trace is read, and a tuple is built several times
    faster than a frozen dataclass).

    ``offset``: where a read, write or mmap started (bytes), where a seek left the descriptor, -1 when not applicable
    (open, stat, pipes and sockets). ``requested``: bytes asked for (reads, writes, mmap length), the open(2) flags for
    opens (fopen's mode as flags), ``whence`` for seeks, the old descriptor for dup, -1 otherwise. ``bytes``: bytes
    moved (>= 0), -1 on failure or not applicable. A ``readdir`` record is a run of calls on one directory
    (``_io/hooks_dir.c``): ``bytes`` is the entries returned, ``requested`` the calls, ``dur_ns`` the time spent inside
    them; a ``stdio_read`` or ``stdio_write`` record, a run of stdio's character, line and formatted calls (``fgets``,
    ``fprintf``, ...) and freads or fwrites under 1 KiB on one stream, likewise: ``bytes`` is what they moved,
    ``requested`` the calls, ``offset`` the stream's position at the first. A ``rename`` record is on the old path;
    ``target`` is the new one (None: unknown, or excluded). An in-kernel copy (``sendfile``, ``copy_file_range``) is two
    records with the call's times: ``<call>_read`` on the source and, where the call moved anything or failed,
    ``<call>_write`` on the destination.
    """

    pid: int
    tid: int
    op: str
    module: str
    start_ns: int
    dur_ns: int
    fd: int
    path: str | None
    fd_kind: str
    offset: int
    bytes: int
    requested: int
    errno: int
    target: str | None = None


@dataclass
class IoProcess:
    """One recorded process image (a fork child is its own; an exec'd program starts a new one).

    ``end`` says how recording stopped: ``exit`` (normal exit), ``_exit`` (os._exit), ``exec`` (replaced by
    another program), ``detach`` (attach mode ended), the name of a termination signal that killed it after
    its records were written (``SIGTERM``: a terminated pool worker) or ``running`` (killed otherwise, or the
    files were read while it ran); ``clean_exit`` is False only for ``running``. ``records`` counts the calls
    written; ``dropped`` the calls the record cap (``XSTACK_IO_MAX_RECORDS``) left out, by operation, with
    their bytes. ``inherited``: descriptor -> path of what a fork child inherited (None: no path, e.g. a pipe).
    ``clock``: what the library timed the calls with, ``tsc`` (the CPU's time-stamp counter, converted to
    CLOCK_REALTIME ns as it flushed) or ``realtime``. ``cpu_ns``: the CPU time the process used while it recorded
    (user and system, every thread, ended ones too; ``getrusage``); ``run_delay_ns``: the time its threads waited
    in a run queue for a CPU while it recorded (``/proc/self/task/N/schedstat``, read as it ended for the threads
    alive then, and as each ended for the threads that made a recorded call and ended before it; others that ended
    before it left out), None where not read (a process killed without its final
    status, or files from a library before these figures); ``preempted``: its involuntary context switches
    (a CPU taken from it while it could run). All three None where the files predate them. ``self_ns``,
    ``self_samples``, ``flush_ns`` and ``clock_read_ps``: what recording cost it, as the library measured it while
    it ran (``_STATUS_SELF``; ``recording_ns`` estimates the whole from them), None where the files predate them.
    """

    pid: int
    ppid: int
    exe: str
    argv: list[str]
    start_ns: int
    end_ns: int
    mode: str
    forked: bool
    clean_exit: bool
    records: int
    dropped: dict[str, int]
    dropped_bytes_read: int
    dropped_bytes_written: int
    reentrant_skipped: int
    paths_dropped: int
    files: list[Path]
    end: str = "running"
    max_records: int = 0
    write_errors: int = 0
    inherited: dict[int, str | None] = field(default_factory=dict)
    clock: str = "realtime"
    cpu_ns: int | None = None
    run_delay_ns: int | None = None
    preempted: int | None = None
    self_ns: int | None = None
    self_samples: int | None = None
    flush_ns: int | None = None
    clock_read_ps: int | None = None

    @property
    def recording_ns(self) -> int | None:
        """The library's own time on the path of the calls it saw (recorded, or left out by the record cap), as it
        measured it in this process: per call, the mean of the timed calls' time from their second clock read to
        the end of their record, plus one clock read (the first; the third is the timing's own); and its flushes.
        Where no call was timed (a thread's first 63 calls are not), a call counts its clock read only. Not in it:
        the two or three ns of a wrapper's entry and exit, and what the library's memory traffic costs the
        program's own code. None where the files predate these figures."""
        if self.self_ns is None or self.self_samples is None or self.flush_ns is None or self.clock_read_ps is None:
            return None
        calls = self.records + sum(self.dropped.values())
        path = self.self_ns / self.self_samples if self.self_samples else 0.0
        return round(calls * (path + self.clock_read_ps / 1000) + self.flush_ns)


@dataclass
class NotCovered:
    """A program started from a recorded process whose I/O is not recorded; ``reason`` is a key of
    ``NOT_COVERED_REASONS`` (``detail`` says it in words)."""

    pid: int
    path: str
    reason: str
    ts_ns: int

    @property
    def detail(self) -> str:
        return NOT_COVERED_REASONS.get(self.reason, self.reason)


@dataclass
class IoTrace:
    """Everything a directory of record files holds; ``ops`` of all processes sorted by ``start_ns``."""

    processes: list[IoProcess]
    ops: list[IoOp]
    not_covered: list[NotCovered]
    problems: list[str]


class _Header(NamedTuple):
    magic: bytes
    version: int
    header_bytes: int
    pid: int
    ppid: int
    start_ns: int
    mode: int
    flags: int
    seq: int
    record_bytes: int
    exe_len: int
    argv_len: int
    names_len: int
    pad: int
    session_ns: int


@dataclass
class _File:
    """What one record file holds, before files of one process are merged."""

    process: IoProcess
    blocks: _Blocks
    session_ns: int
    seq: int


@dataclass
class IoRecords:
    """Everything a directory of record files holds, its calls still packed (``_Blocks.raw``, 88 bytes a call):
    ``by_process`` builds them one process at a time, so that reading a run back holds one process's calls as
    objects (some 330 bytes each), not every process's."""

    processes: list[IoProcess]
    not_covered: list[NotCovered]
    problems: list[str]
    files: list[_File]

    def by_process(self, *, keep: bool = True) -> Iterator[list[IoOp]]:
        """The calls of each process image (all its sessions' files), in time order, the images in the order
        they started; built anew at each call. ``keep=False`` frees each file's packed calls once built: no
        later call of this method sees them."""
        for image in self._images():
            ops = [op for one in image for op in one.blocks.build_ops(keep=keep)]
            ops.sort(key=_START)
            yield ops

    def distinct_calls(self, every_call: Callable[[str], bool]) -> Iterator[IoOp]:
        """What the classes of the paths need (``PathClasses``), without building every call: of each process image,
        in time order, its calls on descriptors 1 and 2 and on the paths that ``every_call`` is true of, and one
        call of each other (path, descriptor kind, errno) it made; ``every_call`` is asked once per path."""
        for image in self._images():
            ops = [op for one in image for op in one.blocks.build_ops(rows=one.blocks.distinct_rows(every_call))]
            ops.sort(key=_START)
            yield from ops

    def _images(self) -> list[list[_File]]:
        """The files of each process image (all its sessions'), the images in the order they started."""
        images: dict[tuple[int, int], list[_File]] = {}
        for one in self.files:
            images.setdefault((one.process.start_ns, one.process.pid), []).append(one)
        return [images[key] for key in sorted(images)]


_START = operator.attrgetter("start_ns")


def read_records(directory: Path) -> IoRecords:
    """Read every record file and not-covered note in ``directory`` (times in CLOCK_REALTIME ns), the calls left
    packed until ``IoRecords.by_process`` builds them.

    Raises ``BadInputError`` naming the file when one is not an xstack io file (wrong magic or version).
    """
    problems: list[str] = []
    strings: dict[bytes, str] = {}
    parsed = [_read_file(path, problems, strings) for path in sorted(directory.glob("*.xio"))]
    processes = _merge_sessions(parsed)
    _resolve_paths(parsed)
    notes = [_read_note(path, problems) for path in sorted(directory.glob("*.xnc"))]
    return IoRecords(processes, [note for note in notes if note is not None], problems, parsed)


def read_trace(directory: Path) -> IoTrace:
    """Read every record file and not-covered note in ``directory`` (times in CLOCK_REALTIME ns), every call
    built, in time order.

    Raises ``BadInputError`` naming the file when one is not an xstack io file (wrong magic or version).
    """
    records = read_records(directory)
    ops = [op for one in records.by_process(keep=False) for op in one]
    ops.sort(key=_START)
    return IoTrace(records.processes, ops, records.not_covered, records.problems)


def _merge_sessions(files: list[_File]) -> list[IoProcess]:
    """One IoProcess per process image: attach sessions of one image (same pid and start) are summed."""
    merged: dict[tuple[int, int], IoProcess] = {}
    for one in sorted(files, key=lambda f: (f.process.pid, f.process.start_ns, f.seq)):
        key = (one.process.pid, one.process.start_ns)
        first = merged.get(key)
        if first is None:
            merged[key] = one.process
            continue
        later = one.process
        first.files += later.files
        first.records += later.records
        for op, count in later.dropped.items():
            first.dropped[op] = first.dropped.get(op, 0) + count
        first.dropped_bytes_read += later.dropped_bytes_read
        first.dropped_bytes_written += later.dropped_bytes_written
        first.reentrant_skipped += later.reentrant_skipped
        first.paths_dropped += later.paths_dropped
        first.write_errors += later.write_errors
        first.end_ns = max(first.end_ns, later.end_ns)
        first.end, first.clean_exit = later.end, later.clean_exit
        first.cpu_ns = _sum_known(first.cpu_ns, later.cpu_ns)  # each session's since it started
        first.run_delay_ns = _sum_known(first.run_delay_ns, later.run_delay_ns)
        first.preempted = _sum_known(first.preempted, later.preempted)
        first.self_ns = _sum_known(first.self_ns, later.self_ns)
        first.self_samples = _sum_known(first.self_samples, later.self_samples)
        first.flush_ns = _sum_known(first.flush_ns, later.flush_ns)
    return sorted(merged.values(), key=lambda p: (p.start_ns, p.pid))


def _sum_known(a: int | None, b: int | None) -> int | None:
    """``a + b``, None where either is unknown."""
    return None if a is None or b is None else a + b


def _resolve_paths(files: list[_File]) -> None:
    """Gives each file the paths its ids name: those of its process image (all its sessions) and, for a fork
    child, those of the image it was forked from (the parent's files, the grandparent's, ...), its own first."""
    images: dict[tuple[int, int], dict[int, str]] = {}
    for one in sorted(files, key=lambda f: (f.process.pid, f.process.start_ns, f.seq)):
        images.setdefault((one.process.pid, one.process.start_ns), {}).update(one.blocks.paths)
    by_pid: dict[int, list[int]] = {}
    for pid, start in images:
        by_pid.setdefault(pid, []).append(start)
    forked = {(f.process.pid, f.process.start_ns): f.process.ppid for f in files if f.process.forked}

    def parent(image: tuple[int, int]) -> tuple[int, int] | None:
        """The image a fork child was forked from: the latest of its parent's pid to start before it."""
        ppid = forked.get(image)
        starts = [start for start in by_pid.get(ppid, []) if start < image[1]] if ppid is not None else []
        return (ppid, max(starts)) if ppid is not None and starts else None

    for one in files:
        image: tuple[int, int] | None = (one.process.pid, one.process.start_ns)
        maps = []  # the image's own ids, then its parent's, ... (starts fall along the chain: no cycle)
        while image is not None:
            maps.append(images[image])
            image = parent(image)
        one.blocks.paths = maps[0]
        one.blocks.inherited_paths = ChainMap(*maps[1:])  # looked in only for ids the image did not define


def _read_file(path: Path, problems: list[str], strings: dict[bytes, str]) -> _File:
    data = path.read_bytes()
    if len(data) < _HEADER.size or data[:8] != MAGIC:
        raise BadInputError(f"{path}: not an xstack io record file (no XSTACKIO header)")
    h = _Header._make(_HEADER.unpack_from(data))
    if h.version != VERSION or h.record_bytes != _RECORD.size:
        raise BadInputError(f"{path}: io record file version {h.version} (this xstack reads version {VERSION})")
    exe_at = _HEADER.size
    argv_at = exe_at + h.exe_len
    names_at = argv_at + h.argv_len
    op_names, _, kind_names = data[names_at : names_at + h.names_len].decode("ascii").partition(";")
    process = IoProcess(
        pid=h.pid,
        ppid=h.ppid,
        exe=path_text(data[exe_at:argv_at]),
        argv=[path_text(arg) for arg in data[argv_at:names_at].split(b"\0") if arg],
        start_ns=h.start_ns,
        end_ns=h.start_ns,
        mode={1: "preload", 2: "attach"}.get(h.mode, str(h.mode)),
        forked=bool(h.flags & 1),
        clean_exit=False,
        records=0,
        dropped={},
        dropped_bytes_read=0,
        dropped_bytes_written=0,
        reentrant_skipped=0,
        paths_dropped=0,
        files=[path],
        clock="tsc" if h.flags & 2 else "realtime",
    )
    ops = ["none", *op_names.rstrip(",").split(",")]
    decoded = _Blocks(path, process, ops, kind_names.split(","), problems, strings)
    decoded.read(data, h.header_bytes)
    return _File(process, decoded, h.session_ns, h.seq)


class _Blocks:
    """Decodes the blocks after a file's header into ops and the process's status."""

    def __init__(
        self, path: Path, process: IoProcess, ops: list[str], kinds: list[str], problems: list[str],
        strings: dict[bytes, str],
    ):  # fmt: skip
        self.path, self.process, self.op_names, self.kind_names = path, process, ops, kinds
        self.problems, self.strings = problems, strings
        self.paths: dict[int, str] = {}  # the ids this file defines; then (_resolve_paths) its image's
        self.inherited_paths: Mapping[int, str] = {}  # the ids of the images it was forked from
        self.bases: dict[int, int] = {}  # thread -> its stream's time base
        self.raw = array("q")  # RAW_FIELDS values per call, flat: a third of the memory of a tuple per call
        self.path_code = ops.index("path") if "path" in ops else -1

    def read(self, data: bytes, at: int) -> None:
        while at < len(data):
            if at + _BLOCK.size > len(data):
                self._truncated(f"{len(data) - at} bytes of an incomplete block header at the end")
                break
            kind, _count, size = _BLOCK.unpack_from(data, at)
            body = memoryview(data)[at + _BLOCK.size : at + _BLOCK.size + size]
            at += _BLOCK.size + size
            if len(body) < size:
                self._truncated(f"last block cut short ({len(body)} of {size} bytes)")
            if kind == _BLOCK_OPS and len(body) >= _OPS_THREAD.size:
                tid = _OPS_THREAD.unpack_from(body)[0]
                slots = body[_OPS_THREAD.size :]
                self._slots(tid, slots[: len(slots) - len(slots) % _RECORD.size])
            elif kind == _BLOCK_STATUS and len(body) >= _STATUS.size:
                self._status(body)
            elif kind not in (_BLOCK_OPS, _BLOCK_STATUS):
                self.problems.append(f"{self.path}: unknown block kind {kind} at byte {at - size - _BLOCK.size}")
                break
        if self.raw:  # before the sessions of one image merge
            ends = map(operator.add, self.raw[0::RAW_FIELDS], self.raw[1::RAW_FIELDS])
            self.process.end_ns = max(self.process.end_ns, max(ends))

    def _truncated(self, what: str) -> None:
        self.problems.append(f"{self.path}: truncated ({what}): the process was probably killed mid-write")

    def _path(self, body: memoryview, at: int, path_id: int, length: int) -> int:
        """Reads the path that fills the slots from byte ``at``; the number of slots it takes."""
        raw = bytes(body[at : at + length])
        if len(raw) == length:
            text = self.strings.get(raw)
            if text is None:
                text = self.strings[raw] = path_text(raw)
            self.paths[path_id] = text
        return -(-length // _RECORD.size)

    def _slots(self, stream: int, body: memoryview) -> None:
        """One block of a thread's stream (``stream`` 0: the shared one, whose THREAD slots name the thread)."""
        tid, base, raw, path_code = stream, self.bases.get(stream, 0), self.raw, self.path_code
        slots = _RECORD.iter_unpack(body)
        skipped = 0  # slots read past the loop's count (paths' bytes)
        for i, (start, dur, offset, path_id, nbytes, requested, fd, code, flags) in enumerate(slots):
            err = 0
            if code == path_code and not flags:
                n = self._path(body, (i + skipped + 1) * _RECORD.size, path_id, nbytes)
                for _ in range(n):
                    next(slots, None)
                skipped += n
                continue
            if flags & ~_KIND:
                if flags & (_TIME | _THREAD):
                    tid = nbytes if flags & _THREAD else tid
                    base = offset if flags & _TIME else base
                    continue
                if flags & _WIDE:
                    second = next(slots, None)  # its values, read again with the wide layout below
                    if second is None:
                        break  # cut off
                    skipped += 1
                    nbytes, requested, dur, fd, err = _WIDE_VALUES.unpack(_RECORD.pack(*second))
                else:
                    nbytes, err = -1, nbytes
            raw.extend((base + start, dur, offset, nbytes, requested, tid, fd, path_id, err, code, flags & _KIND))
        self.bases[stream] = base

    def _status(self, body: memoryview) -> None:
        end, nops, end_ns, records, max_records, d_read, d_written, reentrant, paths_dropped, write_errors = (
            _STATUS.unpack_from(body)
        )
        dropped = struct.unpack_from(f"<{nops}Q", body, _STATUS.size) if len(body) >= _STATUS.size + 8 * nops else ()
        p = self.process
        p.end = _ENDS.get(end, str(end)) if end & 0xFF != _END_SIGNAL else _signal_name(end >> 8)
        p.clean_exit = end != 0
        p.end_ns = max(p.end_ns, end_ns)
        p.records, p.max_records, p.write_errors = records, max_records, write_errors
        p.dropped_bytes_read, p.dropped_bytes_written = d_read, d_written
        p.reentrant_skipped, p.paths_dropped = reentrant, paths_dropped
        p.dropped = {self._op(code): n for code, n in enumerate(dropped) if n}
        at = _STATUS.size + 8 * nops
        if len(body) >= at + _STATUS_CPU.size:  # each status counts from the image's start: the last one holds
            cpu_ns, run_delay_ns, threads, preempted = _STATUS_CPU.unpack_from(body, at)
            p.cpu_ns, p.preempted = cpu_ns, preempted
            p.run_delay_ns = run_delay_ns if threads > 0 else None
            at += _STATUS_CPU.size
        if len(body) >= at + _STATUS_SELF.size:
            p.self_ns, p.self_samples, p.flush_ns, p.clock_read_ps = _STATUS_SELF.unpack_from(body, at)

    def _op(self, code: int) -> str:
        return self.op_names[code] if code < len(self.op_names) else f"op{code}"

    def distinct_rows(self, every_call: Callable[[str], bool]) -> list[int]:
        """The calls ``IoRecords.distinct_calls`` builds of this file, by their row in ``raw``, in order."""
        raw, n = self.raw, RAW_FIELDS
        fds, path_ids, errs, kinds = raw[6::n], raw[7::n], raw[8::n], raw[10::n]
        keys = zip(path_ids, kinds, errs, strict=True)  # columns, read at C speed
        rows = set(dict(zip(keys, range(len(fds)), strict=True)).values())
        rows.update(i for i, fd in enumerate(fds) if fd == 1 or fd == 2)
        paths, inherited = self.paths, self.inherited_paths
        every = {ref for ref in set(path_ids) if (path := paths.get(ref) or inherited.get(ref)) and every_call(path)}
        if every:
            rows.update(i for i, ref in enumerate(path_ids) if ref in every)
        return sorted(rows)

    def build_ops(self, *, keep: bool = True, rows: list[int] | None = None) -> list[IoOp]:
        """The file's calls, once ``paths`` holds every id they may name (``_resolve_paths``); ``keep=False``
        frees the packed calls once built; ``rows``: only those calls (their rows in ``raw``)."""
        # codes are one byte: tables of 256 entries index without a bounds check per record
        names = [*self.op_names, *(f"op{code}" for code in range(len(self.op_names), 256))]
        modules = ["STDIO" if name in _STDIO else "POSIX" for name in names]
        kinds = [*self.kind_names, *["unknown"] * (256 - len(self.kind_names))]
        inherit = names.index("inherit") if "inherit" in self.op_names else -1
        rename = names.index("rename") if "rename" in self.op_names else -1
        pid, paths, inherited, ops = self.process.pid, self.paths, self.inherited_paths, []
        new = tuple.__new__  # IoOp's fields in order, without its __new__'s call by keyword
        n, raw = RAW_FIELDS, self.raw
        calls = [raw[i * n : i * n + n] for i in rows] if rows is not None else zip(*[iter(raw)] * n, strict=True)
        for start, dur, offset, nbytes, requested, tid, fd, path_id, err, code, kind in calls:
            if code == inherit:
                self.process.inherited[fd] = paths.get(path_id) or inherited.get(path_id)
                continue
            path = paths.get(path_id)
            if path is None and path_id:
                path = inherited.get(path_id)
            target = None
            if code == rename:  # `requested` is the new path's id
                target = (paths.get(requested) or inherited.get(requested)) if requested > 0 else None
                requested = -1
            ops.append(new(IoOp, (pid, tid, names[code], modules[code], start, dur, fd, path, kinds[kind], offset,
                                  nbytes, requested, err, target)))  # fmt: skip
        if not keep:
            self.raw = array("q")
        return ops


def _read_note(path: Path, problems: list[str]) -> NotCovered | None:
    """A not-covered note: ``XSTACKNC 1`` then ``pid``, ``ts_ns``, ``reason`` and ``path`` lines."""
    data = path.read_bytes()
    head, sep, rest = data.partition(b"\npath ")
    lines = dict(line.split(b" ", 1) for line in head.split(b"\n")[1:] if b" " in line)
    if not data.startswith(b"XSTACKNC 1\n") or not sep:
        problems.append(f"{path}: not a complete not-covered note")
        return None
    try:
        return NotCovered(
            int(lines[b"pid"]), path_text(rest.removesuffix(b"\n")), lines[b"reason"].decode(), int(lines[b"ts_ns"])
        )
    except (KeyError, ValueError):
        problems.append(f"{path}: not a complete not-covered note")
        return None


def _signal_name(number: int) -> str:
    """``SIGTERM`` for 15; a number this platform does not name as ``signal 64``."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


__all__ = [
    "NOT_COVERED_REASONS",
    "RECORD_BYTES",
    "IoOp",
    "IoProcess",
    "IoRecords",
    "IoTrace",
    "NotCovered",
    "read_records",
    "read_trace",
]
