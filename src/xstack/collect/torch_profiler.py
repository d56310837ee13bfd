"""The ``op``, ``runtime`` and ``kernel`` levels, through ``torch.profiler`` (Kineto, with CUPTI on CUDA).

The three levels share one profiler session per profile: the first of their collectors to start configures it
for all the levels the profile asked for (CPU activity for ops; CUDA activity, and so runtime calls and device
activity, for runtime and kernel). When the profile ends, the profiler's trace is merged into the run with
the importer's mapping (``importers.kineto.merge_live``): ops nest under the live layer and model spans that
enclose them on their thread, kernels, copies and sets under the runtime call of the same correlation id.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xstack.collect._after_import import OnImport
from xstack.collect._recorder import Recorder
from xstack.collect._torch_build import cuda_reason, torch_reason
from xstack.errors import UsageError
from xstack.text import counted, format_ns
from xstack.trace.store import Store

SCRATCH_PREFIX = "xstack-kineto-"
"""Name prefix of the folder under the temp directory that the profiler's trace is written to as the profile
ends, to be merged (the io level leaves its I/O out: it is xstack's, not the program's)."""

KINETO_LOG_ENV = "KINETO_LOG_LEVEL"
KINETO_QUIET = "6"
"""Kineto's log level above all its messages (it reads the variable at each message)."""

PART_ENV = "XSTACK_OP_PART_MB"
PART_BYTES = 32 << 20
"""About how much trace (JSON) a CPU-only session records before it writes it, at the end of an iteration, and
starts afresh (``XSTACK_OP_PART_MB``, default 32): PyTorch's profiler keeps every event until it stops, and
stopping builds about 4 KB per event (a training loop of a few thousand iterations held over 10 GB, its trace
1.5 GB of JSON, in one piece)."""


def part_bytes() -> int:
    """``PART_BYTES``, or ``XSTACK_OP_PART_MB`` where set; ``UsageError`` for a value that is no size."""
    value = os.environ.get(PART_ENV, "").strip()
    if not value:
        return PART_BYTES
    try:
        mib = float(value)
    except ValueError:
        mib = 0.0
    if not mib > 0:
        raise UsageError(f"{PART_ENV}={value!r}: not a size in MiB (a number over 0, such as 32)")
    return int(mib * (1 << 20))


PART_PEAK_BYTES = 512 << 20
"""Growth of the process's peak resident memory over one part after which the part is written at the next
iteration's end, whatever its trace's size. Counting FLOPs, PyTorch's profiler grew a small CNN's training by
about 20 MiB an iteration, some 40 KB per event and more with larger batches: its small allocations among the
program's tensors keep the memory they free from being reused until it stops. 32 MiB of trace holds some
90,000 events."""
PEAK_CHECK_S = 0.1
"""How often, at most, the peak resident memory is read (``getrusage``: a system call, no file read)."""

FIRST_PART_S = 0.25
"""The recording time of a session's first part; each later part's is set from the last one's size."""
PART_S = (0.02, 600.0)
"""The shortest and longest recording time of a part."""

TORCH_OWN_ANNOTATIONS = ("Optimizer.", "enumerate(DataLoader)", "ProfilerStep#")
"""PyTorch's own ``record_function`` marks for what the model level records itself: left out of a merge
when the model level is live, so that an optimizer step is not a model span twice."""


class _Session:
    """One ``torch.profiler.profile`` shared by the profiler-level collectors of one profile.

    PyTorch runs one profiler at a time, and a profiler started while another runs ends that one without a
    trace (stopping it then crashed the process). So a program's own profiler comes first: where one runs
    when the profile starts, this session does not start; where the program starts one later, this session
    stops and writes its trace just before, keeping the operators up to that moment. Either is a health
    finding (``op_level_yielded``).
    """

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.members = 0
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._cpu_only = True
        self.profiler: Any = None
        self.traces: list[Path] = []
        self.yielded: str | None = None  # why the session stopped early or never started
        self._stopped = False
        self._restarting = False
        self._part_s = FIRST_PART_S
        self._part_from = 0.0  # time.monotonic() at the start of the part being recorded
        self.between_ns = 0  # the time written parts took, between iterations
        self.part_error: str | None = None  # why writing a part or starting the next failed
        self.threads_seen: set[str] = set()  # the program's threads that kept a due part from being written
        self.step_clock: Callable[[], None] | None = None  # restarts the iteration just opened, if nothing began
        self._due = False
        self._part_bytes = part_bytes()
        self._recorded: list[tuple[float, int]] = []  # each written part's recording time (s) and size (bytes)
        self._part_peak = 0  # the process's peak RSS (bytes) as the part being recorded started
        self._peak_read = 0.0  # time.monotonic() when it was last read
        self.parts_for_memory = 0  # parts written early, as the process's peak memory grew by PART_PEAK_BYTES
        self._for_memory = False  # the part due is so
        # started where the program imports torch (now, where it has): importing it here would cost a program
        # that never does seconds and thousands of file reads, as the model and layer levels' hooks would
        self._on_torch = OnImport("torch", self._begin)

    def _begin(self) -> None:
        import torch
        from torch.autograd import profiler as autograd_profiler
        from torch.profiler import ProfilerActivity

        if self._stopped:
            return
        self._tmp = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX)
        activities = [ProfilerActivity.CPU]
        if self.recorder.levels & {"runtime", "kernel"} and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            self._cpu_only = False
        self._activities = activities
        self.profiler = _new_profile(activities)
        if autograd_profiler._is_profiler_enabled:
            self.yielded = "a torch.profiler session of the program's own was running when the profile started"
            self._stopped = True
            return
        with _kineto_quiet(self._cpu_only):
            _start_without_compiler(self.profiler, torch)
        self._started_ns = time.time_ns()
        self._part_from = time.monotonic()
        self._part_peak = _peak_rss()
        _guard(autograd_profiler.profile)
        _count_ranges(autograd_profiler.record_function)

    def between_steps(self) -> None:
        """At the end of an iteration: where the part being recorded has lasted its time, write it and record
        the next one (a CPU-only session: a CUDA one would add a device synchronisation to the program). Where
        a ``record_function`` range is open (an optimizer's step ended the iteration, inside its own range),
        that waits for the last one to close (``ranges_closed``); where another thread of the program could be
        running an operator, for a later iteration's end."""
        if self._stopped or self.profiler is None or not self._cpu_only:
            return
        now = time.monotonic()
        self._due = now - self._part_from >= self._part_s or self._due or self._peak_grown(now)
        self._try_part()

    def _peak_grown(self, now: float) -> bool:
        """Whether the process's peak resident memory grew by ``PART_PEAK_BYTES`` since the part began (read
        every ``PEAK_CHECK_S`` at most)."""
        if now - self._peak_read < PEAK_CHECK_S:
            return False
        self._peak_read = now
        self._for_memory = _peak_rss() - self._part_peak >= PART_PEAK_BYTES
        return self._for_memory

    def ranges_closed(self) -> None:
        """The last ``record_function`` range open closed: a part waiting for it is written now, and the
        iteration just opened starts after it (``step_clock``)."""
        if self._due and self._try_part() and self.step_clock is not None:
            self.step_clock()

    def _try_part(self) -> bool:
        """Write the part recorded so far and start the next, where it is due and safe. PyTorch's profiler
        crashes the process where a range (an operator, a ``record_function``) opened under one session closes
        under the next, so there must be none open: none of Python's, and no thread of the program's but the
        caller's (each may be in an operator) other than pool workers waiting for work. In the program's call: a
        failure stops the session, keeping the parts written, and is said in its health."""
        if not self._due or self._stopped or self.profiler is None or _open_ranges:
            return False
        others = [t for t in threading.enumerate() if t is not threading.current_thread()
                  and not t.name.startswith(QUIET_THREADS) and type(t).__name__ not in QUIET_THREAD_TYPES]  # fmt: skip
        frames = sys._current_frames() if others else {}
        busy = [t.name for t in others if not _idle_pool_worker(t, frames)]
        if busy:
            self.threads_seen.update(busy)
            return False
        self._due = False
        if self._for_memory:
            self.parts_for_memory += 1
            self._for_memory = False
        begun = time.perf_counter_ns()
        try:
            self._next_part(time.monotonic() - self._part_from)
        except Exception as error:
            self._stopped = True
            self.profiler = None
            self.part_error = f"{type(error).__name__}: {error}"
        self.between_ns += time.perf_counter_ns() - begun
        return not self._stopped

    def _next_part(self, recorded: float) -> None:
        import torch

        self._write_part()
        self._recorded.append((recorded, self.traces[-1].stat().st_size))
        # the parts' rate, the first left out once there are others: it holds the program's start-up (imports),
        # which records little, so from it alone the next part lasts FIRST_PART_S at most
        seen = self._recorded[1:] or self._recorded
        rate = sum(size for _, size in seen) / max(sum(t for t, _ in seen), 1e-3)
        wanted = self._part_bytes / max(rate, 1.0)
        wanted = wanted if len(self._recorded) > 1 else min(wanted, FIRST_PART_S)
        self._part_s = min(max(wanted, PART_S[0]), PART_S[1])
        self.profiler = _new_profile(self._activities)
        self._restarting = True  # through the guard, which would take it for the program's own profiler
        try:
            with _kineto_quiet(self._cpu_only):
                _start_without_compiler(self.profiler, torch)
        finally:
            self._restarting = False
        self._part_from = time.monotonic()
        self._part_peak = _peak_rss()

    def yield_to_program(self) -> None:
        """The program prepares a profiler of its own: write what was recorded, before it ends the session."""
        if self._restarting:
            return
        if not self._stopped:
            at = format_ns(time.time_ns() - self._started_ns)
            self.yielded = f"the program started a torch.profiler session of its own {at} into the profile"
            try:
                self._write()
            except Exception as error:  # in the program's call: it must not fail for the profiler's sake
                self.yielded += f" (writing what was recorded before it failed: {type(error).__name__}: {error})"

    def _write(self) -> None:
        self._stopped = True
        self._write_part()

    def _write_part(self) -> None:
        """Stop the profiler and write what it recorded since it started as the next part of the trace."""
        with _kineto_quiet(self._cpu_only):
            self.profiler.stop()
        assert self._tmp is not None  # made as the profiler started
        trace = Path(self._tmp.name) / f"live-{len(self.traces):05d}.pt.trace.json"
        self.profiler.export_chrome_trace(str(trace))
        # torch.profiler.profile refers to itself (its map of actions holds its bound methods), so once dropped
        # it waits for the cyclic garbage collector, with the autograd profiler and every event it recorded:
        # that one is let go now, or a part's events would outlive it by however long the collector waits
        self.profiler.profiler = None
        self.profiler = None  # its events, which the next part must not hold too
        self.traces.append(trace)

    def stop(self) -> None:
        """Stop profiling and write the trace to a scratch file (once, when the last member stops)."""
        self._on_torch.remove()  # where the program never imported torch
        if self.profiler is None:
            self._stopped = True
        elif not self._stopped:
            self._write()
        self.profiler = None

    def merge(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        """Merge the trace into the run and remove the scratch file."""
        from xstack.importers.kineto import merge_live

        health: list[tuple[str, int, str]] = []
        levels = sorted(self.recorder.levels & {"op", "runtime", "kernel"})
        named = f"the {', '.join(levels)} level{'s' if len(levels) > 1 else ''}"
        if (error := self._on_torch.error) is not None:
            health.append(("op_level_failed", 1, f"starting torch.profiler where the program imported torch "
                           f"failed ({error}): {named} recorded nothing; the program ran on"))  # fmt: skip
        elif self._tmp is None:
            health.append(("op_level_without_torch", 1, f"the program never imported torch: {named} had nothing "
                           "to record, and did not import it"))  # fmt: skip
        if self.yielded is not None:
            what = "recorded nothing" if not self.traces else "stopped there: what they record ends at that moment"
            health.append(("op_level_yielded", 1, f"{self.yielded}; PyTorch runs one profiler at a time, so "
                           f"{named} {what} (the program's own trace can be imported: xstack import)"))  # fmt: skip
        if self.part_error is not None:
            health.append(("op_level_failed", 1, f"writing a part of the profiler's trace at the end of an "
                           f"iteration, or starting the next, failed ({self.part_error}): {named} stopped there, "
                           f"after {counted(len(self.traces), 'part')}; the program ran on"))  # fmt: skip
        threads = ", ".join(sorted(self.threads_seen)[:3])
        held = (f"parts due were held back while other threads of the program ran ({threads}): each may be in "
                "an operator, which a new session would crash" if threads else "")  # fmt: skip
        why = ("so that its memory stays bounded (PyTorch's profiler holds every event until it stops, and stopping "
               "builds about 4 KB per event)")  # fmt: skip
        early = (f"; {counted(self.parts_for_memory, 'part')} written before {_mib(self._part_bytes)} of trace, "
                 f"as the process's peak memory had grown by {_mib(PART_PEAK_BYTES)} since the part began "
                 "(counting FLOPs, PyTorch's profiler grows the heap far more than its trace)"
                 if self.parts_for_memory else "")  # fmt: skip
        if len(self.traces) > 1:
            health.append(("op_level_parts", len(self.traces), f"the profiler's trace was written in "
                           f"{len(self.traces):,} parts, each at the end of an iteration, {why}: "
                           f"{format_ns(self.between_ns)} in all, between iterations, in none of their times"
                           f"{early}{'; ' + held if held else ''}"))  # fmt: skip
        elif held:
            health.append(("op_level_parts", len(self.traces), f"the profiler's trace was written in one piece, "
                           f"not in parts at the ends of iterations {why}: {held}"))  # fmt: skip
        try:
            if not self.traces:
                return health
            drop = TORCH_OWN_ANNOTATIONS if "model" in self.recorder.levels else ()
            last = store.query("SELECT coalesce(max(span_id), 0) FROM _spans WHERE run_id = ?", [run_id])[0][0]
            try:
                return health + merge_live(store, self.traces, run_id, drop_annotations=drop)
            except BaseException:  # every part or none: no half of a level (one transaction would hold them all)
                store.con.execute("DELETE FROM _spans WHERE run_id = ? AND span_id > ?", [run_id, last])
                raise
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.4g} MiB"


def _peak_rss() -> int:
    """The process's peak resident memory so far, in bytes (Linux gives ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextmanager
def _kineto_quiet(cpu_only: bool) -> Iterator[None]:
    """Kineto's messages silenced for a CPU-only session's start or stop, unless the program set their level.

    Kineto writes a ``USDT: ... profiler_start`` and a ``profiler_stop`` line to the program's stderr at each,
    which a program run with the op level would print for nothing. On CUDA its level is left alone: there the
    same calls report what keeps the device activity from being recorded (CUPTI's permission errors)."""
    if not cpu_only or KINETO_LOG_ENV in os.environ:
        yield
        return
    os.environ[KINETO_LOG_ENV] = KINETO_QUIET
    try:
        yield
    finally:
        os.environ.pop(KINETO_LOG_ENV, None)


def _start_without_compiler(profiler: Any, torch: Any) -> None:
    """``profiler.start()``, without importing torch's compiler into a program that has not imported it.

    ``torch.profiler.profile.prepare_trace`` reads inductor's CUDA-graphs setting behind ``hasattr(torch,
    "_inductor")``, which imports the compiler: about two seconds of the first step, recorded by the io level as
    the program's reads. Not imported yet, the setting is its default, which inductor reads from the environment
    (``TORCHINDUCTOR_CUDAGRAPHS``); that check alone is answered so for the start, exactly as torch would."""
    module = sys.modules[type(profiler).prepare_trace.__module__]
    if "torch._inductor" in sys.modules or not hasattr(module, "torch"):
        profiler.start()
        return

    def imported_only(obj: object, name: str) -> bool:
        return False if obj is torch and name == "_inductor" else hasattr(obj, name)

    profiler.has_cudagraphs = os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1"  # before start_trace reads it
    setattr(module, "hasattr", imported_only)  # noqa: B010  the module's name for it, ahead of the builtin
    try:
        profiler.start()
    finally:
        delattr(module, "hasattr")


def _new_profile(activities: list[Any]) -> Any:
    """A PyTorch profiler session that records the operators of every thread of the program (a loader's thread
    pool, a server's worker threads), not only those of the thread that starts it and of the threads it hands
    work to (autograd's), as PyTorch's default is; PyTorch before 2.7 has only the default."""
    from torch.profiler import profile

    try:
        from torch.profiler import _ExperimentalConfig

        config = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        config = {}
    return profile(activities=activities, record_shapes=True, with_flops=True, **config)


QUIET_THREADS = ("xstack-", "QueueFeederThread")
"""Name prefixes of the threads that never run a PyTorch operator: the profiler's own, and those of
``multiprocessing`` queues (a DataLoader's index queues to its workers)."""
QUIET_THREAD_TYPES = frozenset({"TMonitor", "_AsyncWriterThread"})
"""Class names of threads that never run a PyTorch operator: tqdm's progress-bar monitor, and the thread that
writes the events of a ``SummaryWriter`` (``torch.utils.tensorboard``, serialized by the caller's thread)."""


def _idle_pool_worker(thread: threading.Thread, frames: dict[int, Any]) -> bool:
    """Whether ``thread`` is a ``concurrent.futures`` pool's worker waiting for work that none is queued for
    (torch.compile's compile workers, after compiling; a loader's pool between batches). Where every other thread
    is one, none can queue work while the caller (which holds the GIL to ask) writes a part: they all wait, and
    so none is in an operator, nor can start one, until the caller's thread queues some."""
    from concurrent.futures import thread as pool

    frame = frames.get(thread.ident or -1)
    if frame is None or frame.f_code is not getattr(pool._worker, "__code__", None):
        return False  # running a work item (its frames are deeper) or not a pool's worker
    queue = frame.f_locals.get("work_queue")
    return queue is not None and bool(queue.empty())


_open_ranges = 0
"""The ``record_function`` ranges open in the process while a session runs (``_count_ranges``)."""
_ranges_lock = threading.Lock()
_original_ranges: tuple[Any, Any] | None = None


def _count_ranges(cls: Any) -> None:
    """Count the ``record_function`` ranges (``cls``) open in the process: an optimizer's step, a DataLoader's
    next batch, the program's own; when the last closes, the sessions waiting for it write their parts. Undone
    by ``_unguard`` once no session runs. A range opened before the count began and closed after it counts
    down to 0, no further: opened with no session running, it is safe to close under any."""
    global _original_ranges
    if _original_ranges is not None:
        return
    enter, leave = _original_ranges = (cls.__enter__, cls.__exit__)

    def __enter__(self: Any) -> Any:
        global _open_ranges
        entered = enter(self)
        with _ranges_lock:
            _open_ranges += 1
        return entered

    def __exit__(self: Any, *exc: Any) -> Any:
        global _open_ranges
        try:
            return leave(self, *exc)
        finally:
            with _ranges_lock:
                _open_ranges = max(_open_ranges - 1, 0)
                closed = not _open_ranges
            if closed:
                for session in list(_sessions.values()):
                    session.ranges_closed()

    cls.__enter__, cls.__exit__ = __enter__, __exit__


_sessions: dict[int, _Session] = {}
"""id(recorder) -> its session, while one is running."""

_original_prepare: Any = None
"""``torch.autograd.profiler.profile._prepare_trace`` while ``_guard`` stands in for it."""


def _guard(cls: Any) -> None:
    """Make every start of a profiler (each goes through ``cls._prepare_trace``) stop the running sessions
    first; undone by ``_unguard`` once none runs."""
    global _original_prepare
    if _original_prepare is not None:
        return
    original = _original_prepare = cls._prepare_trace

    def _prepare_trace(prof: Any, *args: Any, **kwargs: Any) -> Any:
        for session in list(_sessions.values()):
            session.yield_to_program()
        return original(prof, *args, **kwargs)

    cls._prepare_trace = _prepare_trace


def _unguard() -> None:
    global _original_prepare, _original_ranges, _open_ranges
    if _sessions:
        return
    if _original_prepare is not None:
        from torch.autograd import profiler as autograd_profiler

        autograd_profiler.profile._prepare_trace = _original_prepare
        _original_prepare = None
    if _original_ranges is not None:
        from torch.autograd import profiler as autograd_profiler

        autograd_profiler.record_function.__enter__, autograd_profiler.record_function.__exit__ = _original_ranges
        _original_ranges = None
        _open_ranges = 0


class TorchProfilerCollector:
    """Collects one of the profiler levels; see the module docstring."""

    def __init__(self, level: str) -> None:
        self.level = level
        self._session: _Session | None = None
        self._finished: _Session | None = None

    def unavailable_reason(self) -> str | None:
        if self.level in ("runtime", "kernel"):
            reason = cuda_reason()
            return (
                f"{reason}: runtime calls and kernels need one" if reason and reason.startswith("no CUDA") else reason
            )
        return torch_reason()  # found, not imported (seconds): ops need no more

    def start(self, recorder: Recorder) -> None:
        session = _sessions.get(id(recorder))
        if session is None:
            session = _sessions[id(recorder)] = _Session(recorder)
        session.members += 1
        self._session = session

    def stop(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        session.members -= 1
        if session.members == 0:
            _sessions.pop(id(session.recorder), None)
            try:
                session.stop()
            finally:
                _unguard()
            self._finished = session

    def between_steps(self) -> None:
        """Between two iterations: the session may write the part of its trace recorded so far."""
        if self._session is not None:
            self._session.between_steps()

    def step_clock(self, restart: Callable[[], None]) -> None:
        """``restart``: moves the start of the iteration just opened to now, where nothing began in it yet
        (a part written as an optimizer's step returns is in no iteration's time)."""
        if self._session is not None:
            self._session.step_clock = restart

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        """After every live span is written: merge the profiler's events into the run."""
        session, self._finished = self._finished, None
        return session.merge(store, run_id) if session is not None else []


class OpCollector(TorchProfilerCollector):
    """``op``: framework operators (``aten::conv2d``) with input shapes."""

    def __init__(self) -> None:
        super().__init__("op")


class RuntimeCollector(TorchProfilerCollector):
    """``runtime``: CUDA/HIP runtime and driver calls."""

    def __init__(self) -> None:
        super().__init__("runtime")


class KernelCollector(TorchProfilerCollector):
    """``kernel``: kernels, copies and sets on the device, each under the runtime call that launched it."""

    def __init__(self) -> None:
        super().__init__("kernel")
