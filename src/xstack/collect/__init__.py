"""Live collectors: each records one level of a running program into the store through a ``Recorder``.

A collector has three methods (``style.md``): ``unavailable_reason()`` says why it cannot run here (never
raises, imports heavy packages lazily), ``start(recorder)`` installs its hooks and ``stop()`` removes them;
and ``finish(store, run_id)``, called once every live span is written, for collectors that gather events
outside the recorder (the PyTorch profiler) and merge them into the run then. Built-ins are listed in
``BUILTIN``, by lazy dotted path.
"""

from __future__ import annotations

import importlib
from typing import Protocol

from xstack.collect._recorder import Recorder
from xstack.errors import UsageError
from xstack.trace.store import Store


class Collector(Protocol):
    """What every collector provides."""

    level: str

    def unavailable_reason(self) -> str | None:
        """Why this collector cannot run here, or None when it can."""

    def start(self, recorder: Recorder) -> None:
        """Install hooks; spans go to ``recorder``."""

    def stop(self) -> None:
        """Remove every hook ``start`` installed."""

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        """Merge what was gathered outside the recorder into the run; returns health rows."""


BUILTIN: dict[str, str] = {
    "model": "xstack.collect.model:ModelCollector",
    "layer": "xstack.collect.layer:LayerCollector",
    "op": "xstack.collect.torch_profiler:OpCollector",
    "runtime": "xstack.collect.torch_profiler:RuntimeCollector",
    "kernel": "xstack.collect.torch_profiler:KernelCollector",
    "metrics": "xstack.collect.metrics:MetricsCollector",
    "io": "xstack.collect.io:IoCollector",
    "system": "xstack.collect.system:SystemCollector",
}
"""Level -> ``module:Class`` of its live collector."""

PLANNED: tuple[str, ...] = ()
"""Levels the store knows that have no live collector yet."""

IMPLIED = {"kernel": ("runtime",), "runtime": ("op",), "io": ("model",)}
"""Levels that bring the levels their spans hang from: a kernel's parent is its runtime call, a runtime
call's parent the op that made it, a file operation's the model span open on its thread (and the model level's
DataLoader waits are what the io level's input-bound check weighs the workers' reads against)."""


def load(level: str) -> Collector:
    """A new collector for ``level``; ``UsageError`` for a level with none."""
    path = BUILTIN.get(level)
    if path is None:
        if level in PLANNED:
            raise UsageError(f"level {level!r} has no live collector yet (available: {', '.join(BUILTIN)})")
        raise UsageError(f"unknown level {level!r} (available: {', '.join(BUILTIN)})")
    module, _, name = path.partition(":")
    collector: Collector = getattr(importlib.import_module(module), name)()
    return collector


def status() -> list[tuple[str, str, str | None]]:
    """(level, dotted path, why it cannot run here or None) for every built-in collector."""
    return [(level, path, load(level).unavailable_reason()) for level, path in BUILTIN.items()]
