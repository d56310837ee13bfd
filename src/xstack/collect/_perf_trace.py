"""The syscall pass with ``perf`` instead of strace: the kernel's ``raw_syscalls`` tracepoints, recorded by
``perf record`` and read back with ``perf script``.

Why: strace stops the traced thread twice per call (ptrace), which made the io benchmark's DataLoader 25 times
slower; the tracepoints are written into a ring buffer inside the kernel and the program does not stop. What
it gives up: the tracepoints hold the arguments as six raw integers (strace decodes them, strings included),
and events are lost when the buffer fills faster than ``perf`` empties it (counted in health, from
``perf script --show-lost-events``).

Times: ``perf record -k mono`` stamps events with CLOCK_MONOTONIC (this ``perf`` refuses CLOCK_REALTIME); the
parser adds the offset between CLOCK_REALTIME and CLOCK_MONOTONIC read just before the program started, which
only a step of the wall clock during the run would make wrong. Names come from the system call numbers of the
kernel headers (``asm/unistd_64.h``), ``syscall_N`` where they are not installed.
"""

from __future__ import annotations

import errno as errno_names
import functools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from xstack.collect._strace import Call

EVENTS = "raw_syscalls:sys_enter,raw_syscalls:sys_exit"
RECORD_OPTIONS = ("record", "-q", "-e", EVENTS, "-k", "mono", "-m", "1024")
"""Every system call's entry and exit, on CLOCK_MONOTONIC, with a 4 MiB buffer per CPU (1024 pages)."""
SCRIPT_OPTIONS = ("script", "--show-lost-events", "--ns", "-F", "pid,tid,time,event,trace")

_LINE = re.compile(r"^\s*(\d+)/(\d+)\s+(\d+)\.(\d{9}):\s+raw_syscalls:sys_(enter|exit):\s+NR (-?\d+) (.*)$")
_STARTS = frozenset({"execve", "execveat", "clone", "clone3", "fork", "vfork"})
"""Calls whose exit comes without an entry where a new program or thread begins (its entry was the caller's)."""
_LOST = re.compile(r"\bLOST\b\D*(\d+)?")
_HEADERS = (
    "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
    "/usr/include/asm/unistd_64.h",
    "/usr/include/aarch64-linux-gnu/asm/unistd.h",
    "/usr/include/asm-generic/unistd.h",
)


@functools.cache
def syscall_names() -> dict[int, str]:
    """System call number -> name, from the first kernel header installed; empty when none is."""
    for header in _HEADERS:
        try:
            text = Path(header).read_text()
        except OSError:
            continue
        names = {int(nr): name for name, nr in re.findall(r"#define __NR(?:3264)?_(\w+)\s+(\d+)\b", text)}
        if names:
            return names
    return {}


class PerfParser:
    """Parse ``perf script`` lines (``SCRIPT_OPTIONS``) with ``calls(lines)``, the same interface as
    ``StraceParser``: afterwards ``tids``, ``pid_of``, ``skipped``, ``first_skipped``, ``unfinished`` and
    ``lost`` describe the trace. ``offset_ns`` turns CLOCK_MONOTONIC into the run's clock."""

    tool = "perf"

    def __init__(self, offset_ns: int) -> None:
        self.offset_ns = offset_ns
        self.names = syscall_names()
        self.skipped = self.unfinished = self.lost = 0
        self.first_skipped = ""
        self._pid: dict[int, int] = {}
        self._open: dict[int, tuple[int, int, str]] = {}  # tid -> (number, start_ns, args)

    @property
    def tids(self) -> list[int]:
        return list(self._pid)

    def pid_of(self, tid: int) -> int:
        """The process of thread ``tid`` (itself when not seen)."""
        return self._pid.get(tid, tid)

    def calls(self, lines: Iterable[str]) -> Iterator[Call]:
        """The completed calls in the order they ended, then the ones still open at the end, as unfinished."""
        for line in lines:
            m = _LINE.match(line)
            if m is None:
                self._other(line)
                continue
            pid, tid, sec, nsec, kind, nr, rest = m.groups()
            ts_ns = int(sec) * 1_000_000_000 + int(nsec) + self.offset_ns
            tid_i, nr_i = int(tid), int(nr)
            self._pid[tid_i] = int(pid)
            if kind == "enter":
                began = self._open.pop(tid_i, None)
                if began is not None:  # its exit was lost: the call ended before this one began
                    yield self._cut(tid_i, began, ts_ns)
                self._open[tid_i] = (nr_i, ts_ns, rest.strip())
                continue
            began = self._open.pop(tid_i, None)
            if began is None or began[0] != nr_i:  # an exit without its entry (lost, or before recording)
                if self._name(nr_i) not in _STARTS:  # a new program's or thread's first event: expected
                    self._skip(line)
                continue
            ret = int(rest.lstrip("= ").split()[0]) if rest.lstrip("= ") else 0
            err = errno_names.errorcode.get(-ret, f"E{-ret}") if -4096 < ret < 0 else None
            yield Call(tid_i, self._name(nr_i), began[1], max(0, ts_ns - began[1]), began[2],
                       "-1" if err else str(ret), err, False)  # fmt: skip
        for tid, began in self._open.items():  # exit, exit_group, or cut by the end of the recording
            name = self._name(began[0])
            never = name not in ("exit", "exit_group")
            self.unfinished += never
            yield Call(tid, name, began[1], 0, began[2], None, None, never)
        self._open = {}

    def _name(self, nr: int) -> str:
        return self.names.get(nr, f"syscall_{nr}")

    def _cut(self, tid: int, began: tuple[int, int, str], end_ns: int) -> Call:
        self.unfinished += 1
        return Call(tid, self._name(began[0]), began[1], max(0, end_ns - began[1]), began[2], None, None, True)

    def _other(self, line: str) -> None:
        lost = _LOST.search(line)
        if lost is not None:
            self.lost += int(lost.group(1) or 1)
        elif line.strip():
            self._skip(line)

    def _skip(self, line: str) -> None:
        self.skipped += 1
        if not self.first_skipped:
            self.first_skipped = line.rstrip("\n")[:200]
