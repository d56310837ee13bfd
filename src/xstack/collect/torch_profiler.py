"""The ``op``, ``runtime`` and ``kernel`` levels, through ``torch.profiler`` (Kineto, with CUPTI on CUDA).

The three levels share one profiler session per profile: the first of their collectors to start configures it
for all the levels the profile asked for (CPU activity for ops; CUDA activity, and so runtime calls and device
activity, for runtime and kernel). When the profile ends, the profiler's trace is merged into the run with
the importer's mapping (``importers.kineto.merge_live``): ops nest under the live layer and model spans that
enclose them on their thread, kernels, copies and sets under the runtime call of the same correlation id.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xstack.collect._after_import import OnImport
from xstack.collect._recorder import Recorder
from xstack.collect._torch_build import cuda_reason, torch_reason
from xstack.text import format_ns
from xstack.trace.store import Store

SCRATCH_PREFIX = "xstack-kineto-"
"""Name prefix of the folder under the temp directory that the profiler's trace is written to as the profile
ends, to be merged (the io level leaves its I/O out: it is xstack's, not the program's)."""

KINETO_LOG_ENV = "KINETO_LOG_LEVEL"
KINETO_QUIET = "6"
"""Kineto's log level above all its messages (it reads the variable at each message)."""

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
        self.trace: Path | None = None
        self.yielded: str | None = None  # why the session stopped early or never started
        self._stopped = False
        # started where the program imports torch (now, where it has): importing it here would cost a program
        # that never does seconds and thousands of file reads, as the model and layer levels' hooks would
        self._on_torch = OnImport("torch", self._begin)

    def _begin(self) -> None:
        import torch
        from torch.autograd import profiler as autograd_profiler
        from torch.profiler import ProfilerActivity, profile

        if self._stopped:
            return
        self._tmp = tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX)
        activities = [ProfilerActivity.CPU]
        if self.recorder.levels & {"runtime", "kernel"} and torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
            self._cpu_only = False
        self.profiler = profile(activities=activities, record_shapes=True, with_flops=True)
        if autograd_profiler._is_profiler_enabled:
            self.yielded = "a torch.profiler session of the program's own was running when the profile started"
            self._stopped = True
            return
        with _kineto_quiet(self._cpu_only):
            _start_without_compiler(self.profiler, torch)
        self._started_ns = time.time_ns()
        _guard(autograd_profiler.profile)

    def yield_to_program(self) -> None:
        """The program prepares a profiler of its own: write what was recorded, before it ends the session."""
        if not self._stopped:
            at = format_ns(time.time_ns() - self._started_ns)
            self.yielded = f"the program started a torch.profiler session of its own {at} into the profile"
            try:
                self._write()
            except Exception as error:  # in the program's call: it must not fail for the profiler's sake
                self.yielded += f" (writing what was recorded before it failed: {type(error).__name__}: {error})"
                self.trace = None

    def _write(self) -> None:
        self._stopped = True
        with _kineto_quiet(self._cpu_only):
            self.profiler.stop()
        assert self._tmp is not None  # made as the profiler started
        trace = Path(self._tmp.name) / "live.pt.trace.json"
        self.profiler.export_chrome_trace(str(trace))
        self.trace = trace

    def stop(self) -> None:
        """Stop profiling and write the trace to a scratch file (once, when the last member stops)."""
        self._on_torch.remove()  # where the program never imported torch
        if self.profiler is None:
            self._stopped = True
        elif not self._stopped:
            self._write()

    def merge(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        """Merge the trace into the run and remove the scratch file."""
        from xstack.importers.kineto import merge_live

        health: list[tuple[str, int, str]] = []
        levels = sorted(self.recorder.levels & {"op", "runtime", "kernel"})
        named = f"the {', '.join(levels)} level{'s' if len(levels) > 1 else ''}"
        if (error := self._on_torch.error) is not None:
            health.append(("op_level_failed", 1, f"starting torch.profiler where the program imported torch "
                           f"failed ({error}): {named} recorded nothing; the program ran on"))  # fmt: skip
        elif self.profiler is None:
            health.append(("op_level_without_torch", 1, f"the program never imported torch: {named} had nothing "
                           "to record, and did not import it"))  # fmt: skip
        if self.yielded is not None:
            what = "recorded nothing" if self.trace is None else "stopped there: what they record ends at that moment"
            health.append(("op_level_yielded", 1, f"{self.yielded}; PyTorch runs one profiler at a time, so "
                           f"{named} {what} (the program's own trace can be imported: xstack import)"))  # fmt: skip
        try:
            if self.trace is None:
                return health
            drop = TORCH_OWN_ANNOTATIONS if "model" in self.recorder.levels else ()
            return health + merge_live(store, self.trace, run_id, drop_annotations=drop)
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()


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
    global _original_prepare
    if _original_prepare is not None and not _sessions:
        from torch.autograd import profiler as autograd_profiler

        autograd_profiler.profile._prepare_trace = _original_prepare
        _original_prepare = None


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
