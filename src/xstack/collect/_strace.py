"""A streaming parser of ``strace -f -ttt -T -qq`` output: one ``Call`` per system call of the traced tree.

The forms it reads (``TID`` is the thread, ``S.U`` the wall-clock time of the line in seconds and microseconds)::

    TID S.U name(args) = RET [ERRNAME] [(text)] <DUR>      a complete call
    TID S.U name(args <unfinished ...>                     a call another thread's line interrupted ...
    TID S.U <... name resumed>rest) = RET ... <DUR>        ... and its end, on the same thread
    TID S.U --- SIGCHLD {...} ---                          a signal: not a call
    TID S.U +++ exited with 0 +++                          the thread's process ended: closes its open call

A call that never returned (``= ?``: a thread killed inside ``futex``), one closed by its thread's exit and
one still open at the end of the file are ``unfinished`` (``exit`` and ``exit_group``, which never return by
design, are not); the last two run to the line that closed them (or to the last time in the file). Arguments
are split from the result outside quoted strings, so ``read(3, "a\\")b", 64)`` parses. A line that fits none
of the forms is counted with its first example and left out, so a truncated last line or a stray message
never stops the parse.

Threads and processes: strace prints thread ids. A thread is its own process (``pid == tid``, true of every
process's first thread) unless a ``clone``/``clone3`` with ``CLONE_THREAD`` in its flags returned it, in which
case it belongs to the caller's process. The clone's result can be printed after the new thread's first
calls, so the map is complete only at the end of the file (``StraceParser.pid_of``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

_PREFIX = re.compile(r"(?:(\d+) +)?(\d+)\.(\d+) (.*)", re.S)
_ARGS = r'((?:"(?:[^"\\]|\\.)*"|[^"])*)'  # quoted strings are skipped whole: their ")" and " = " are text
_RESULT = (
    r"\) += (-?\d+|0x[0-9a-fA-F]+|\?)"  # the value
    r"(?: (E[A-Z0-9_]+))?"  # an error name
    r"(?: \((.*)\))?"  # strace's gloss: the error's text, "Timeout", poll's revents
    r"(?: <(\d+\.\d+|unavailable)>)?$"  # -T: seconds inside the call
)
_CALL = re.compile(r"([\w?]+)\(" + _ARGS + _RESULT, re.S)
_RESUMED = re.compile(r"<\.\.\. ([\w?]*) ?resumed>" + _ARGS + _RESULT, re.S)
_UNFINISHED = re.compile(r"([\w?]+)\((.*) <unfinished \.\.\.>$", re.S)
_SIGNAL = re.compile(r"--- .* ---$", re.S)
_EXIT = re.compile(r"\+\+\+ (?:exited with -?\d+|killed by \w+.*) \+\+\+$", re.S)
_OTHER_END = re.compile(r"\+\+\+ .* \+\+\+$", re.S)  # "superseded by execve": the thread is gone, its call too

_CLONES = {"clone", "clone3"}
_EXITS = {"exit", "exit_group"}


@dataclass(slots=True)
class Call:
    """One system call: ``start_ns`` on the run's clock (CLOCK_REALTIME, microsecond resolution), ``dur_ns``
    as strace timed it. ``ret`` is None when the call did not return (``unfinished``, ``exit``, ``exit_group``)."""

    tid: int
    name: str
    start_ns: int
    dur_ns: int
    args: str
    ret: str | None
    errno: str | None
    unfinished: bool


@dataclass(slots=True)
class _Open:
    name: str
    start_ns: int
    args: str


class StraceParser:
    """Parse strace lines with ``calls(lines)``; afterwards ``pid_of``, ``skipped`` and ``first_skipped``
    describe the file. Memory: constant apart from the calls open at a time and one entry per thread."""

    def __init__(self) -> None:
        self.skipped = 0
        """Lines that fit no form (left out)."""
        self.first_skipped = ""
        self.unfinished = 0
        """Calls that never returned within the trace."""
        self.first_tid: int | None = None
        """The first thread in the file: the traced program's process."""
        self.tids: set[int] = set()
        self.last_ns = 0
        self._open: dict[int, _Open] = {}
        self._thread_of: dict[int, int] = {}  # a CLONE_THREAD thread -> the thread that created it

    def calls(self, lines: Iterable[str]) -> Iterator[Call]:
        """The calls of ``lines`` (strace's output, one line each, newline optional), in the order they end;
        then the calls still open at the end of the input, as unfinished."""
        for line in lines:
            yield from self._line(line.rstrip("\n"))
        for tid, call in sorted(self._open.items(), key=lambda item: item[1].start_ns):
            yield self._cut(tid, call, self.last_ns)
        self._open.clear()

    def pid_of(self, tid: int) -> int:
        """The process of thread ``tid`` (complete once the input is parsed)."""
        seen = 0
        while tid in self._thread_of and seen < 1000:  # a chain of threads creating threads; no cycles
            tid = self._thread_of[tid]
            seen += 1
        return tid

    def _line(self, line: str) -> Iterator[Call]:
        prefix = _PREFIX.fullmatch(line)
        if prefix is None:
            self._skip(line)
            return
        tid_text, seconds, fraction, rest = prefix.groups()
        tid = int(tid_text) if tid_text else (self.first_tid or 0)
        ts_ns = int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0")[:9])
        if self.first_tid is None:
            self.first_tid = tid
        self.tids.add(tid)
        self.last_ns = max(self.last_ns, ts_ns)
        if rest.startswith("<..."):
            yield from self._resumed(tid, ts_ns, rest, line)
        elif (m := _CALL.fullmatch(rest)) is not None:
            name, args, ret, errno, _, dur = m.groups()
            yield self._call(tid, name, ts_ns, args, ret, errno, dur, ts_ns)
        elif (m := _UNFINISHED.fullmatch(rest)) is not None:
            self._open[tid] = _Open(m.group(1), ts_ns, m.group(2))
        elif _EXIT.fullmatch(rest) or _OTHER_END.fullmatch(rest):
            call = self._open.pop(tid, None)
            if call is not None:
                yield self._cut(tid, call, ts_ns)
        elif not _SIGNAL.fullmatch(rest):
            self._skip(line)

    def _resumed(self, tid: int, ts_ns: int, rest: str, line: str) -> Iterator[Call]:
        m = _RESUMED.fullmatch(rest)
        if m is None:
            self._skip(line)
            return
        name, tail, ret, errno, _, dur = m.groups()
        began = self._open.pop(tid, None)
        if began is not None and name in ("", began.name):
            yield self._call(tid, began.name, began.start_ns, began.args + tail, ret, errno, dur, ts_ns)
            return
        if began is not None:  # another call was open: the trace lost its end
            yield self._cut(tid, began, ts_ns)
        if dur is None or dur == "unavailable" or not name:
            self._skip(line)  # its start is unknown
            return
        yield self._call(tid, name, ts_ns - _ns(dur), tail, ret, errno, dur, ts_ns)

    def _call(self, tid: int, name: str, start_ns: int, args: str, ret: str, errno: str | None,
              dur: str | None, end_ns: int) -> Call:  # fmt: skip
        if name in _CLONES and ret.isdigit() and "CLONE_THREAD" in args:
            self._thread_of[int(ret)] = tid
        dur_ns = _ns(dur) if dur is not None and dur != "unavailable" else max(0, end_ns - start_ns)
        # "= ?": the call did not return; exit and exit_group never do, any other was cut by its process's end
        never = ret == "?" and errno is None and name not in _EXITS
        self.unfinished += never
        return Call(tid, name, start_ns, dur_ns, args, None if ret == "?" else ret, errno, never)

    def _cut(self, tid: int, call: _Open, end_ns: int) -> Call:
        self.unfinished += 1
        return Call(tid, call.name, call.start_ns, max(0, end_ns - call.start_ns), call.args, None, None, True)

    def _skip(self, line: str) -> None:
        if not line.strip():
            return
        self.skipped += 1
        if not self.first_skipped:
            self.first_skipped = line[:200]


def _ns(seconds: str) -> int:
    """``"0.000123"`` -> 123000, exactly (no float rounding)."""
    whole, _, fraction = seconds.partition(".")
    return int(whole) * 1_000_000_000 + int(fraction.ljust(9, "0")[:9])
