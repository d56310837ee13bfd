"""The system level's sampler thread in C (``collect/_sampler/sampler.c``), driven through ctypes.

It samples the profiled process tree and the machine exactly as the Python sampler does (same schedule, same
rows: ``_system_proc.PROC_STRIDE`` values per process row, ``MACHINE_HEAD`` + 2 per core per machine row), but
never takes the interpreter lock: Python reads its rows once it has stopped. ``XSTACK_SYSTEM_SAMPLER=python``
chooses the Python sampler instead; without the library (no C compiler when xstack was installed) that one is
used anyway.
"""

from __future__ import annotations

import ctypes
import os
import sys
from array import array
from pathlib import Path
from typing import Any

from xstack.collect._process_roles import Record
from xstack.collect._system_proc import PROC_STRIDE
from xstack.errors import UsageError

LIBRARY_NAME = "libxstack_sampler.so"
BACKEND_ENV = "XSTACK_SYSTEM_SAMPLER"
"""``native`` (the default where the library is built) or ``python``: which sampler the system level uses."""
JOURNAL_META = "system.json"
"""In a profile's journal folder (``xstack.salvage``): what reading the sampler's rows back needs."""
JOURNAL_ROWS = ("system.0.rows", "system.1.rows")
"""The two files the C thread appends its rows to, one after the other (``sampler.c``)."""
JOURNAL_PERIOD_S = 0.25
"""The C thread appends its rows at most this often (``JOURNAL_PERIOD_NS`` in ``sampler.c``)."""
JOURNAL_FILE_MIB = 8
"""Past this size the C thread goes on in the other file, emptied first (``JOURNAL_FILE_CAP``)."""
_PROC_BLOCK, _MACHINE_BLOCK = 1, 2

_library: ctypes.CDLL | None = None


class _Params(ctypes.Structure):
    _fields_ = [
        ("interval_ns", ctypes.c_int64),
        ("full_period_ns", ctypes.c_int64),
        ("rediscover_ns", ctypes.c_int64),
        ("buffer_cap_bytes", ctypes.c_int64),
        ("root", ctypes.c_int32),
        ("max_errors", ctypes.c_int32),
        ("journal_fd", ctypes.c_int32 * 2),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int64) for name in ("samples", "late", "halvings", "errors", "busy_ns", "thread_cpu_ns",
                                              "step", "max_children", "proc_values", "machine_values", "bytes_read",
                                              "journal_appends")),
        *((name, ctypes.c_int32) for name in ("journal_failed", "tid", "children_listed", "stuck", "nseen", "ncpus",
                                              "machine_stride", "io_unreadable", "io_unreadable_pid")),
    ]  # fmt: skip


def library_path() -> Path | None:
    """The built library, or None when the package was installed without building it."""
    path = Path(__file__).resolve().parent / "_sampler" / LIBRARY_NAME
    return path if path.is_file() else None


def _load() -> ctypes.CDLL | None:
    global _library
    if _library is None:
        path = library_path()
        if path is None or not sys.platform.startswith("linux"):
            return None
        lib = ctypes.CDLL(str(path))
        lib.xs_start.restype = ctypes.c_void_p
        lib.xs_start.argtypes = [ctypes.POINTER(_Params), ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_int]
        for name in ("xs_stop", "xs_free"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = None
        lib.xs_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Stats)]
        lib.xs_stats.restype = None
        for name in ("xs_proc_rows", "xs_machine_rows"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.POINTER(ctypes.c_int64)
        lib.xs_seen.argtypes = [ctypes.c_void_p]
        lib.xs_seen.restype = ctypes.POINTER(ctypes.c_int32)
        lib.xs_ncmds.argtypes = [ctypes.c_void_p]
        lib.xs_ncmds.restype = ctypes.c_int
        out = ctypes.POINTER(ctypes.c_int32)
        lib.xs_cmd.argtypes = [ctypes.c_void_p, ctypes.c_int, out, out, out, out]
        lib.xs_cmd.restype = ctypes.c_void_p  # bytes with NULs: read with string_at and the length
        for name in ("xs_cpu_names", "xs_first_error", "xs_io_unreadable_reason"):
            getattr(lib, name).argtypes = [ctypes.c_void_p]
            getattr(lib, name).restype = ctypes.c_char_p
        _library = lib
    return _library


def use_native() -> bool:
    """Whether the system level samples with the C thread (``BACKEND_ENV``; the default where it is built)."""
    choice = os.environ.get(BACKEND_ENV, "").strip().lower()
    if choice not in ("", "native", "python"):
        raise UsageError(f"{BACKEND_ENV}={choice!r}: must be 'native' or 'python'")
    if choice == "python":
        return False
    try:
        return _load() is not None
    except OSError:
        return False


class NativeSampler:
    """One run of the C sampler thread: ``start``, ``stop``, then read its rows and counts; ``close`` frees it."""

    def __init__(self, root: int, interval_ns: int, full_period_ns: int, rediscover_ns: int, buffer_cap_bytes: int,
                 max_errors: int, journal_fds: tuple[int, int] = (-1, -1)) -> None:  # fmt: skip
        """``journal_fds``: two files open for appending, where the thread keeps the rows it takes as it goes
        (``sampler.c``, read back by ``read_journal``), or -1."""
        lib = _load()
        if lib is None:
            raise RuntimeError("the system level's C sampler is not built")
        self._lib = lib
        self._params = _Params(interval_ns, full_period_ns, rediscover_ns, buffer_cap_bytes, root, max_errors,
                               (ctypes.c_int32 * 2)(*journal_fds))  # fmt: skip
        self._handle: int | None = None
        self.stats: dict[str, int] = {}

    def set_journal(self, fds: tuple[int, int]) -> None:
        """Before ``start``: the two files (``JOURNAL_ROWS``, open for appending) the thread appends its rows to."""
        self._params.journal_fd[0], self._params.journal_fd[1] = fds

    def start(self) -> None:
        """Start the thread; returns once it has opened its files and taken the first sample. Raises
        ``OSError`` naming the file it could not open."""
        err_no, err = ctypes.c_int(0), ctypes.create_string_buffer(512)
        handle = self._lib.xs_start(ctypes.byref(self._params), ctypes.byref(err_no), err, len(err))
        if not handle:
            raise OSError(err_no.value, os.strerror(err_no.value), err.value.decode(errors="replace"))
        self._handle = handle
        self._read_stats()

    @property
    def running(self) -> bool:
        """Started and not yet closed."""
        return self._handle is not None

    def stop(self) -> None:
        """Wake the thread, which takes the last sample and ends; wait for it (``stats["stuck"]`` if it did not)."""
        if self._handle is not None:
            self._lib.xs_stop(self._handle)
            self._read_stats()

    def _read_stats(self) -> None:
        st = _Stats()
        self._lib.xs_stats(self._handle, ctypes.byref(st))
        self.stats = {field[0]: int(getattr(st, field[0])) for field in _Stats._fields_}

    def proc_rows(self) -> array[int]:
        """Every process row, flat (``PROC_STRIDE`` values each)."""
        return self._rows(self._lib.xs_proc_rows, self.stats["proc_values"])

    def machine_rows(self) -> array[int]:
        """Every machine row, flat (``machine_stride`` values each)."""
        return self._rows(self._lib.xs_machine_rows, self.stats["machine_values"])

    def _rows(self, getter: Any, n: int) -> array[int]:
        out = array("q")
        if n and self._handle is not None:
            out.frombytes(ctypes.string_at(getter(self._handle), 8 * n))
        return out

    def cpus(self) -> list[str]:
        """The ``/proc/stat`` cpu line names, ``cpu`` first: the order of a machine row's (total, idle) pairs."""
        return self._text(self._lib.xs_cpu_names).split()

    def seen(self) -> set[int]:
        """Every pid sampled at least once."""
        n = self.stats["nseen"]
        return set(self._lib.xs_seen(self._handle)[:n]) if n and self._handle is not None else set()

    def command_lines(self) -> list[Record]:
        """Each descendant's ``(pid, parent pid, command line, inherited)``, read when the thread first saw it
        (``inherited``: forked from that parent and not exec'd since, as ``ProcessTree._note_cmdline`` tells)."""
        if self._handle is None:
            return []
        out: list[Record] = []
        pid, ppid, inherited, n = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int32()
        for i in range(self._lib.xs_ncmds(self._handle)):
            raw = self._lib.xs_cmd(self._handle, i, ctypes.byref(pid), ctypes.byref(ppid), ctypes.byref(inherited),
                                   ctypes.byref(n))  # fmt: skip
            argv = ctypes.string_at(raw, n.value).decode(errors="replace").split("\0")[:-1] if raw else []
            out.append((pid.value, ppid.value, argv, bool(inherited.value)))
        return out

    def first_error(self) -> str | None:
        return self._text(self._lib.xs_first_error) or None

    def io_unreadable(self) -> dict[int, str]:
        """pid -> why its ``/proc/PID/io`` could not be read (the first such process)."""
        if not self.stats["io_unreadable"]:
            return {}
        return {self.stats["io_unreadable_pid"]: self._text(self._lib.xs_io_unreadable_reason)}

    def _text(self, getter: Any) -> str:
        if self._handle is None:
            return ""
        raw = getter(self._handle)
        return raw.decode(errors="replace") if raw else ""

    def close(self) -> None:
        """Free the C side (a thread that never ended keeps its memory)."""
        if self._handle is not None:
            self._lib.xs_free(self._handle)
            self._handle = None


def open_journal(folder: Path) -> tuple[int, int]:
    """The two ``JOURNAL_ROWS`` files in ``folder``, empty and open for appending (``OSError`` if they cannot be
    made)."""
    fds: list[int] = []
    try:
        for name in JOURNAL_ROWS:
            fds.append(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
                               0o644))  # fmt: skip
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds[0], fds[1]


def read_journal_rows(folder: Path, machine_stride: int) -> tuple[array[int], array[int]]:
    """The process and machine rows the C thread appended to the ``JOURNAL_ROWS`` in ``folder``, in time order.
    A file ends at its first block that is not whole (the process was killed while appending to it)."""
    parts: list[tuple[int, array[int], array[int]]] = []
    for name in JOURNAL_ROWS:
        try:
            data = (folder / name).read_bytes()  # at most JOURNAL_FILE_MIB
        except FileNotFoundError:
            continue
        values = array("q")
        values.frombytes(data[: len(data) - len(data) % 8])
        procs, machine = array("q"), array("q")
        at = 0
        while at + 2 <= len(values):
            kind, n = values[at], values[at + 1]
            stride = PROC_STRIDE if kind == _PROC_BLOCK else machine_stride if kind == _MACHINE_BLOCK else 0
            if not stride or n <= 0 or n % stride or at + 2 + n > len(values):
                break
            (procs if kind == _PROC_BLOCK else machine).extend(values[at + 2 : at + 2 + n])
            at += 2 + n
        first = procs[1] if procs else machine[1] if machine else None
        if first is not None:
            parts.append((first, procs, machine))
    procs, machine = array("q"), array("q")
    for _, p, m in sorted(parts, key=lambda part: part[0]):
        procs.extend(p)
        machine.extend(m)
    return procs, machine
