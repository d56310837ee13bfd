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
from xstack.errors import UsageError

LIBRARY_NAME = "libxstack_sampler.so"
BACKEND_ENV = "XSTACK_SYSTEM_SAMPLER"
"""``native`` (the default where the library is built) or ``python``: which sampler the system level uses."""

_library: ctypes.CDLL | None = None


class _Params(ctypes.Structure):
    _fields_ = [
        ("interval_ns", ctypes.c_int64),
        ("full_period_ns", ctypes.c_int64),
        ("rediscover_ns", ctypes.c_int64),
        ("buffer_cap_bytes", ctypes.c_int64),
        ("root", ctypes.c_int32),
        ("max_errors", ctypes.c_int32),
    ]


class _Stats(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int64) for name in ("samples", "late", "halvings", "errors", "busy_ns", "thread_cpu_ns",
                                              "step", "max_children", "proc_values", "machine_values", "bytes_read")),
        *((name, ctypes.c_int32) for name in ("tid", "children_listed", "stuck", "nseen", "ncpus", "machine_stride",
                                              "io_unreadable", "io_unreadable_pid")),
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
                 max_errors: int) -> None:  # fmt: skip
        lib = _load()
        if lib is None:
            raise RuntimeError("the system level's C sampler is not built")
        self._lib = lib
        self._params = _Params(interval_ns, full_period_ns, rediscover_ns, buffer_cap_bytes, root, max_errors)
        self._handle: int | None = None
        self.stats: dict[str, int] = {}

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
