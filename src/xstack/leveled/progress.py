"""The progress bar of a leveled measurement, on stderr when it is a terminal: pass, iteration, time left."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any


class PassProgress:
    """One bar over the iterations of ``passes`` (names); ``first`` numbers them when a process runs only some
    of a measurement's passes (``xstack profile`` runs each in its own process): ``first=2, count=4`` shows
    "pass 2/4"."""

    def __init__(
        self,
        passes: Sequence[str],
        warmup: int,
        iters: int,
        *,
        enabled: bool = True,
        first: int = 1,
        count: int | None = None,
    ) -> None:
        self._enabled = enabled and sys.stderr.isatty()
        self._passes = list(passes)
        self._warmup = warmup
        self._per_pass = warmup + iters
        self._first = first
        self._count = count or len(self._passes)
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> PassProgress:
        if self._enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.__enter__()
            self._task = self._progress.add_task(self._describe(0, 0), total=len(self._passes) * self._per_pass)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)

    def advance(self, index: int, done: int) -> None:
        """Iteration ``done`` (counted from 1) of pass ``index`` (of ``passes``, from 0) has ended; past the
        pass's iterations (a sampling pass goes on until it has lasted long enough), the bar grows with it."""
        if self._progress is not None:
            task = self._progress.tasks[0]
            if task.total is not None and task.completed + 1 > task.total:
                self._progress.update(self._task, total=task.completed + 1)
            self._progress.update(self._task, advance=1, description=self._describe(index, done))

    def _describe(self, index: int, done: int) -> str:
        phase = (
            "warm-up"
            if done < self._warmup
            else "measured"
            if done <= self._per_pass
            else "measured, until enough samples"
        )
        return f"pass {self._first + index}/{self._count} {self._passes[index]} ({phase})"
