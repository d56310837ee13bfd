"""Run a callback once a module has been imported by the program, without importing it first.

A level that only needs PyTorch where the program uses it (the model level's automatic stages) must not import it
for a program that does not: importing ``torch`` takes seconds, starts its thread pools and reads thousands of
files, which the io and system levels would then record as the program's own.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback()`` right after the first import of module ``name`` has run its code, in the importing
    thread, before the ``import`` statement returns; then takes itself off ``sys.meta_path``. An exception in the
    callback goes to ``on_error`` and never to the program's import."""

    def __init__(self, name: str, callback: Callable[[], None], on_error: Callable[[BaseException], None]) -> None:
        self.name = name
        self._callback = callback
        self._on_error = on_error
        self._busy = threading.local()
        self._done = False
        sys.meta_path.insert(0, self)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._done or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:  # the spec the other finders give; this finder declines while they are asked
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.on = False
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module
        # another watcher of the same module may have wrapped this loader first: put back what was there
        wrapped = loader.__dict__.get("exec_module")

        def exec_module(module: ModuleType) -> None:
            if wrapped is None:
                del loader.exec_module  # the loader's own method again
            else:
                loader.exec_module = wrapped  # type: ignore[method-assign]
            original(module)
            self.remove()
            try:
                self._callback()
            except Exception as e:  # the program's import succeeded: the profiler's trouble stays its own
                self._on_error(e)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def remove(self) -> None:
        """Stop watching (idempotent)."""
        self._done = True
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)


class OnImport:
    """What a level hooks where the program imports module ``name``: ``callback()`` then (at once where it has),
    what that failed on (``error``, for the level's health; the program's import goes on), and ``remove()``
    when the level stops (idempotent; ``error`` stays)."""

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.error: str | None = None
        self._watcher = after_import(name, callback, self._failed)

    def _failed(self, error: BaseException) -> None:
        self.error = f"{type(error).__name__}: {error}"

    def remove(self) -> None:
        if self._watcher is not None:
            self._watcher.remove()
            self._watcher = None


def after_import(
    name: str, callback: Callable[[], None], on_error: Callable[[BaseException], None]
) -> AfterImport | None:
    """``callback()`` now when module ``name`` is imported already (None returned), else once the program imports
    it (the watcher returned: ``remove()`` it when no longer wanted)."""
    if name in sys.modules:
        callback()
        return None
    return AfterImport(name, callback, on_error)
