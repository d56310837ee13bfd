"""The live recording state shared by collectors: one clock, per-thread span stacks, ids and the sink.

Collectors open and close spans through a ``Recorder`` so that every span's parent is the innermost span
open on its thread at the moment it starts, whichever collector opened that one.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from xstack.trace.sink import Sink


@dataclass(slots=True, eq=False)
class OpenSpan:
    """A span that has started and not yet ended (equal to itself only: stacks are searched by identity)."""

    span_id: int
    parent_id: int | None
    level: str
    name: str
    start_ns: int
    tid: int
    attrs: dict[str, Any] = field(default_factory=dict)
    floating: bool = False
    """An iteration (step span): top-level, and it outlives the spans around it (see ``Recorder.end``)."""


_time_ns = time.time_ns

_PRUNE_STACKS = 256
"""Threads known to a recorder past which the empty stacks of threads that have ended are let go."""

_recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _disable_in_child() -> None:
    # A forked child (DataLoader worker) inherits the recorder and the store's connection: recording there
    # would write into the parent's store from another process. Children record nothing.
    for recorder in list(_recorders):
        recorder.disabled = True


os.register_at_fork(after_in_child=_disable_in_child)


class Recorder:
    """Hands out span ids, timestamps and parents, and writes finished spans to the sink.

    Times are nanoseconds since the Unix epoch, read from the system (real-time) clock: the clock the PyTorch
    profiler converts its timestamps to, so live spans and profiler events line up to within a microsecond.
    (The monotonic clock plus an offset taken at start was measured several microseconds away from the
    profiler's, enough to put an op outside the layer that called it.) A step of the system clock during a
    run (an NTP correction) would show as a jump; runs are short enough that this is accepted.
    """

    def __init__(self, sink: Sink, levels: frozenset[str] = frozenset()) -> None:
        self.sink = sink
        self._sink_span = sink.span
        self.levels = levels
        """Every level of the profile, so that collectors sharing one mechanism can configure it once."""
        self.pid = os.getpid()
        self.step = 0
        self.unclosed = 0
        self._ids = itertools.count(1)
        self._local = threading.local()
        self._stacks: dict[int, list[OpenSpan]] = {}
        """Each thread's stack by native id: an iteration opened on one thread may end on another."""
        self._lock = threading.Lock()
        self.disabled = False
        _recorders.add(self)

    def busy(self) -> bool:
        """Whether a span is being written (its lock is held): a signal handler of the thread writing it would find
        the sink in the middle of an update."""
        return self._lock.locked()

    def now_ns(self) -> int:
        """The run's clock, in nanoseconds since the Unix epoch."""
        return _time_ns()

    def stack(self) -> list[OpenSpan]:
        """The spans open on the calling thread, outermost first."""
        stack: list[OpenSpan] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
            tid = self._local.tid = threading.get_native_id()
            if len(self._stacks) >= _PRUNE_STACKS:  # a server starting a thread per request: forget ended ones
                live = {t.native_id for t in threading.enumerate()}
                self._stacks = {k: v for k, v in self._stacks.items() if v or k in live}
            self._stacks[tid] = stack  # a thread that ended before may have left its id to this one
        return stack

    def begin(self, level: str, name: str, attrs: dict[str, Any] | None = None, *, floating: bool = False) -> OpenSpan:
        """Open a span on the calling thread, a child of the innermost open one (``floating``: an iteration,
        top-level whatever is open)."""
        # On the path of every recorded call: one attribute read for the stack, one clock read.
        local = self._local
        try:
            stack: list[OpenSpan] = local.stack
        except AttributeError:
            stack = self.stack()
        span = OpenSpan(
            next(self._ids),
            stack[-1].span_id if stack and not floating else None,
            level,
            name,
            _time_ns(),
            local.tid,
            attrs or {},
            floating,
        )
        stack.append(span)
        return span

    def end(self, span: OpenSpan, attrs: dict[str, Any] | None = None) -> None:
        """Close ``span`` and write it. Spans opened inside it and still open are closed with it (counted as
        unclosed), except where an iteration and the user's spans cross: an iteration (``floating``) open inside
        the span ending stays open, with what was opened in it (an ``epoch`` span around several steps); a span
        open inside an iteration that ends stays open too, moved up to the iteration's parent (a span around a
        ``step()`` call). A span no longer open is not written again."""
        if self.disabled:
            return
        end_ns = _time_ns()
        try:
            stack: list[OpenSpan] = self._local.stack
        except AttributeError:
            stack = self.stack()
        if stack and stack[-1] is span:
            stack.pop()  # the usual case: the innermost open span ends
        else:
            if not any(open_span is span for open_span in stack):
                if span.floating:
                    self._end_elsewhere(span, end_ns, attrs)
                return
            inside = []
            while (top := stack.pop()) is not span:
                inside.append(top)
            kept, keep_rest = [], span.floating
            for open_span in reversed(inside):  # outermost first
                keep_rest = keep_rest or open_span.floating
                if not keep_rest:
                    self.unclosed += 1
                    self._write(open_span, end_ns)
                    continue
                if open_span.parent_id == span.span_id:
                    open_span.parent_id = span.parent_id
                kept.append(open_span)
            stack.extend(kept)
        if attrs:
            span.attrs.update(attrs)
        self._write(span, end_ns)

    def _end_elsewhere(self, span: OpenSpan, end_ns: int, attrs: dict[str, Any] | None) -> None:
        """End an iteration open on another thread: the program marks its iterations on a thread other than the
        one the profile began on (a server's worker thread, a training loop run in a thread). The spans that
        thread opened inside it stay open, moved up to its parent, for that thread to end. Identity-only list
        operations, each atomic, so that the owner may push and pop meanwhile."""
        owner = self._stacks.get(span.tid)
        if owner is None:
            return
        try:
            owner.remove(span)
        except ValueError:
            return  # no longer open
        for open_span in list(owner):
            if open_span.parent_id == span.span_id:
                open_span.parent_id = span.parent_id
        if attrs:
            span.attrs.update(attrs)
        self._write(span, end_ns)

    def checkpoint(self) -> bool:
        """Let the sink put what it holds where it outlives the process (``Sink.checkpoint``), between
        iterations; whether it did (at most every ``CHECKPOINT_INTERVAL_S``)."""
        if self.disabled:
            return False
        with self._lock:
            return self.sink.checkpoint()

    def close_all(self) -> None:
        """At stop: close what the calling thread left open (counted as unclosed)."""
        end_ns = self.now_ns()
        stack = self.stack()
        while stack:
            self.unclosed += 1
            self._write(stack.pop(), end_ns)

    def _write(self, span: OpenSpan, end_ns: int) -> None:
        if self.disabled:
            return
        with self._lock:
            self._sink_span(
                span.span_id,
                span.parent_id,
                span.level,
                span.name,
                span.start_ns,
                end_ns - span.start_ns,
                self.pid,
                span.tid,
                span.attrs,
            )
