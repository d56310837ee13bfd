"""The ``system`` level: its collector, which runs the sampler of ``collect._system_sampler`` (CPU, memory,
context switches and I/O of the profiled process tree, the machine's cores and memory, and the GPUs, as counters
on the run's clock; its docstring says how), and the sampling interval asked for.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from xstack.collect._recorder import Recorder
from xstack.collect._system_native import use_native
from xstack.collect._system_sampler import FULL_PERIOD_NS, Sampler
from xstack.errors import UsageError
from xstack.trace import attrs as A
from xstack.trace.sink import Sink
from xstack.trace.store import Store

INTERVAL_ENV = "XSTACK_SYSTEM_INTERVAL_MS"
"""The sampling interval in milliseconds (a float; default ``DEFAULT_INTERVAL_MS``)."""
DEFAULT_INTERVAL_MS = 10.0
MIN_INTERVAL_MS = 0.1
"""Shorter than a sample takes (tens of microseconds): refused."""
MEASURED_FULL_SAMPLES = 10
"""Full samples a sampling pass of ``xstack profile`` lasts at least (the analyses need five inside the
measured steps: ``measured_s``)."""


def interval_ms() -> float:
    """The sampling interval asked for in ``XSTACK_SYSTEM_INTERVAL_MS``, in ms; ``UsageError`` if it is not a
    number of at least ``MIN_INTERVAL_MS``."""
    text = os.environ.get(INTERVAL_ENV, "").strip()
    if not text:
        return DEFAULT_INTERVAL_MS
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{INTERVAL_ENV}={text!r} is not a number of milliseconds (for example 10)") from None
    if not value >= MIN_INTERVAL_MS:  # also refuses nan
        raise UsageError(f"{INTERVAL_ENV}={text!r}: the interval must be at least {MIN_INTERVAL_MS} ms")
    return value


def measured_s() -> float:
    """How long (s) the measured iterations of a pass sampling the system level should last: for
    ``MEASURED_FULL_SAMPLES`` full samples at the interval asked for (``interval_ms``), the rarest kind."""
    return MEASURED_FULL_SAMPLES * max(FULL_PERIOD_NS / 1e9, interval_ms() / 1e3)


class SystemCollector:
    """The ``system`` level's live part: the sampler (see the module docstring)."""

    level = "system"

    def __init__(self) -> None:
        self.sampler: Sampler | None = None
        self._config: dict[str, Any] | None = None
        self._journal: Path | None = None

    def unavailable_reason(self) -> str | None:
        if not sys.platform.startswith("linux"):
            return f"the system level reads /proc, which needs Linux (this is {sys.platform})"
        if not os.access("/proc/self/stat", os.R_OK) or not os.access("/proc/stat", os.R_OK):
            return "/proc is not mounted or not readable here"
        return None

    def describe(self) -> str:
        """How the level will run here: which sampler, and what can trace system calls (``xstack collectors``)."""
        from xstack.collect import syscalls

        sampler = "sampler thread in C" if use_native() else "Python sampler thread"
        tracers = [name for name in syscalls.TOOLS if syscalls._reason(name) is None]
        traced = f"system calls with {' or '.join(tracers)}" if tracers else "no tracer for system calls"
        return f"{sampler}; {traced} (--syscalls)"

    def configure(self, config: dict[str, Any]) -> None:
        """Keep the run's config: ``finish`` adds ``config["system"]`` to it."""
        self._config = config

    def keep_journal(self, folder: Path) -> None:
        """Before ``start``: the profile's journal folder (``xstack.salvage``), where the C sampler keeps its rows
        as it goes, so that a program killed outright keeps them."""
        self._journal = folder

    def start(self, recorder: Recorder) -> None:
        self.sampler = Sampler(int(interval_ms() * 1e6), journal=self._journal)
        self.sampler.start()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        sampler = self.sampler
        if sampler is None:
            return []
        sink = Sink(store, run_id)
        try:
            sampler.write(sink)
        finally:
            sink.close()
        if self._config is not None:
            before = self._config.get(A.CONFIG_SYSTEM)
            self._config[A.CONFIG_SYSTEM] = {"syscalls": False, "syscall_tool": None} | (
                before if isinstance(before, dict) else {}
            ) | sampler.config()  # fmt: skip
        return sampler.health()
