"""The profiling API: ``with xstack.profile(levels=..., path=...) as prof:`` around a region, ``prof.step()``
between iterations, then ``prof.summary()`` or ``prof.open()`` for the store.

The store is written as the program runs (in batches) and completed when the region ends, also when it ends
with an exception: what was traced is kept, and the run's ``config.status`` says ``cut_short``.
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

from xstack import collect, salvage
from xstack.collect._cpus import usable_cpus
from xstack.collect._recorder import OpenSpan, Recorder
from xstack.errors import UsageError
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.schema import LEVELS
from xstack.trace.sink import Sink
from xstack.trace.store import RunInfo, Store, append_store, final_path, scratch_path

DEFAULT_LEVELS = ("model", "layer")
DEFAULT_WARMUP = 1
"""Warm-up iterations of a profile that is not a measured pass: the first, which also pays for start-up."""
MAX_MEASURED_STEPS = 10_000
"""The most measured iterations a pass that must last a while (``config.measure.min_measured_s``) goes on to."""
_KIND, _STEP = A.MODEL_KIND, A.MODEL_STEP


class Profile:
    """One profiled region; see the module docstring."""

    def __init__(
        self,
        levels: str | tuple[str, ...] | list[str] | None = None,
        path: str | os.PathLike[str] | None = None,
        name: str | None = None,
        *,
        store: Store | None = None,
        pass_name: str = "live",
        config: dict[str, Any] | None = None,
        steps: int | None = None,
        warmup: int | None = None,
        optimizer_steps: bool = False,
    ) -> None:
        """``store``: write into this open store as its next run instead of creating ``path`` (the passes of
        ``xstack.measure`` share one store); ``pass_name`` and ``config`` go into the run's row. ``steps``:
        record that many iterations; the ``prof.step()`` that ends the last one opens no other and sets
        ``done`` (``xstack.step()`` then stops the program: see ``PassComplete``). With ``steps``, each
        ``prof.step()`` first waits for the GPU (``torch.cuda.synchronize()``, where CUDA is in use), so that
        an iteration's span includes its device work, as a latency measurement needs. A pass whose
        ``config.measure.min_measured_s`` is set goes on past ``steps`` until its measured iterations have lasted
        that long (at most ``MAX_MEASURED_STEPS`` of them), and its run's ``config.measure.iterations`` then
        says how many it measured.

        ``warmup``: how many of the first iterations are warm-up, left out of per-iteration statistics
        (``config.warmup_steps``); default: a measured pass's ``config.measure.warmup``, else 1, since the first
        iteration also pays for start-up (lazy initialisation, the first CUDA calls, DataLoader workers).

        ``optimizer_steps``: a program that never calls ``step()`` has its iterations ended by an optimizer's
        ``step()`` (``_OptimizerSteps``), as ``xstack run`` and ``xstack profile`` do."""
        if warmup is not None and warmup < 0:
            raise UsageError(f"warmup must be >= 0 iterations (got {warmup})")
        if levels is None:
            levels, said = default_levels()
            if said:
                print(said, file=sys.stderr)
        self.levels = parse_levels(levels)
        self.name = name or "profile"
        # absolute: the program may change its working folder while the store is written (hydra does)
        self.path = (Path(path) if path is not None else Path("xstack-out") / f"{self.name}.duckdb").absolute()
        self.pass_name = pass_name
        self.config = config or {}
        measure = self.config.get("measure")
        if warmup is None:
            warmup = int(measure.get("warmup", 0)) if isinstance(measure, dict) else DEFAULT_WARMUP
        self.warmup = warmup
        self.run_id = 1
        self.steps = steps
        self._min_measured_ns = _min_measured_ns(measure) if steps is not None else 0
        self._measured_from_ns: int | None = None
        self.done = False
        self.on_step: Callable[[int], None] | None = None
        """Called with the number of iterations ended, after each ``step()`` (progress bars)."""
        self.shortfall: str | None = None
        """After the region, when it ended normally before recording its ``steps``: what was asked and what was
        measured (also in the run's health, ``iterations_short``)."""
        self._completed = 0
        self._given_store = store
        self.command: str | None = None
        """The program's command line where ``sys.argv`` does not hold it (``python -c``): ``runs.command``."""
        self._exit = ExitStack()
        self._collectors: list[collect.Collector] = []
        self._recorder: Recorder | None = None
        self._sink: Sink | None = None
        self._store: Store | None = None
        self._step_span: OpenSpan | None = None
        self._step_usage: tuple[int, int, int, int] | None = None
        """``_usage()`` as the open iteration began."""
        self._step_thread: tuple[int, int] | None = None
        """``_thread_usage()`` as the open iteration began."""
        self._step_begins: list[Callable[[int], None]] = []
        self._step_ends: list[Callable[[int], None]] = []
        self._between_steps: list[Callable[[], None]] = []
        self._journal: Path | None = None
        self._journal_configs: list[Callable[[], dict[str, Any]]] = []
        self._journaled: dict[str, Any] | None = None  # the config last added to the journal's header
        self._marked = False
        """Whether the program ended an iteration itself (``step()``)."""
        self._auto = _OptimizerSteps(self) if optimizer_steps else None

    def __enter__(self) -> Profile:
        collectors = [collect.load(level) for level in self.levels]
        for level, collector in zip(self.levels, collectors, strict=True):
            reason = collector.unavailable_reason()
            if reason:
                raise UsageError(f"level {level!r} cannot run here: {reason}")
        if self._given_store is not None:
            self._store = self._given_store
        else:
            self._store = self._exit.enter_context(Store.create(self.path, overwrite=True))
        self.run_id = self._store.next_run_id()
        # the program's, as the region starts (runpy rewrites argv[0]); python -c's code is in no argv
        self._command = self.command or " ".join(sys.argv) or None
        try:
            if self._given_store is None:  # a store of its own: a killed process leaves what it recorded to salvage
                self._journal = salvage.new_journal(self.path)
            self._sink = Sink(self._store, run_id=self.run_id, journal=self._journal)
            self._recorder = Recorder(self._sink, frozenset(self.levels))
            self._started_ns = self._recorder.now_ns()
            if not self.warmup:
                self._measured_from_ns = self._started_ns
            if self._journal is not None:
                salvage.write_json(self._journal, salvage.HEADER, self._header())
            self._open_step()
            # the system sampler first: it then sees the other levels start too (starting torch's profiler takes
            # a tenth of a second of the warm-up step), and, stopped last, everything up to the end
            for collector in sorted(collectors, key=lambda c: c.level != "system"):
                keep_journal = getattr(collector, "keep_journal", None)
                if keep_journal is not None and self._journal is not None:  # collectors with rows of their own
                    keep_journal(self._journal)
                configure = getattr(collector, "configure", None)
                if configure is not None:  # collectors that act on the pass's settings (warm-up count)
                    configure(self.config)
                collector.start(self._recorder)
                self._collectors.append(collector)
            # ``step_begin``/``step_end`` of the collectors that mark iterations (NVTX ranges for ncu), looked up
            # once rather than at every ``step()``
            self._step_begins = [h for c in self._collectors if (h := getattr(c, "step_begin", None)) is not None]
            self._step_ends = [h for c in self._collectors if (h := getattr(c, "step_end", None)) is not None]
            # and ``between_steps`` of those with work to do in no iteration (the op level writing its trace)
            self._between_steps = [h for c in self._collectors if (h := getattr(c, "between_steps", None)) is not None]
            # and ``journal_config`` of those that learn the run's config as it goes (the model level's DataLoaders)
            self._journal_configs = [h for c in self._collectors if (h := getattr(c, "journal_config", None))]
            for collector in self._collectors:
                if (clock := getattr(collector, "step_clock", None)) is not None:
                    clock(self._restart_step)
            if self._auto is not None:  # after the collectors: the model level's optimizer span ends first
                self._auto.start()
            global _current
            _current = self
        except BaseException as exc:
            if self._auto is not None:
                self._auto.stop()
            for collector in reversed(self._collectors):
                collector.stop()
            self._collectors.clear()
            self._recorder = None
            try:
                if self._sink is not None:
                    self._sink.close()
                self._exit.__exit__(type(exc), exc, exc.__traceback__)  # removes the partial store
            finally:
                salvage.remove_journal(self._journal)
            raise
        return self

    def step(self) -> None:
        """Mark the end of one iteration and the start of the next."""
        if self._recorder is None:
            raise UsageError("prof.step() called outside the profiled region")
        self._marked = True  # the program marks its iterations: no optimizer step ends one from now on
        self._advance()

    @property
    def completed(self) -> int:
        """The iterations ended so far."""
        return self._completed

    @property
    def ended_by(self) -> str | None:
        """The optimizer step whose calls ended the run's iterations (``"SGD.step()"``), where one did."""
        return self._auto.name if self._auto is not None and self._auto.ended else None

    def _advance(self) -> None:
        """End the iteration in progress and, unless it was the last of ``steps``, open the next."""
        recorder = self._recorder
        if recorder is None:
            return
        usage = thread = None
        if self._step_span is not None:
            if self.steps is not None:  # a measured pass: an iteration ends when its GPU work does
                _synchronize_cuda()
            for hook in self._step_ends:
                hook(recorder.step)
            if self._step_usage is not None:
                usage = _usage()  # read once: the next iteration begins where this one ends
                spent = (b - a for a, b in zip(self._step_usage, usage, strict=True))
                self._step_span.attrs.update(zip(A.STEP_USAGE, spent, strict=True))
            thread = _thread_usage()
            if self._step_thread is not None and self._step_thread[0] == thread[0]:
                self._step_span.attrs[A.MODEL_THREAD_CPU_NS] = thread[1] - self._step_thread[1]
            recorder.end(self._step_span)
            if recorder.checkpoint():  # what the journal holds reaches the disk: the config it has learnt too
                self._journal_header()
            self._step_span = None
            for between in self._between_steps:
                between()
                usage = thread = None  # its work is in no iteration: the next begins after it
            self._completed += 1
            if self._completed == self.warmup:
                self._measured_from_ns = recorder.now_ns()
            if self.on_step is not None:
                self.on_step(self._completed)
        if self.steps is not None and self._completed >= self.steps and not self._measuring_on(recorder):
            self.done = True
            return
        recorder.step += 1
        self._open_step(usage, thread)
        for hook in self._step_begins:
            hook(recorder.step)

    def _measuring_on(self, recorder: Recorder) -> bool:
        """Whether a pass that has recorded its ``steps`` goes on: its measured iterations have not yet lasted
        ``config.measure.min_measured_s`` (a sampling pass needs that long for enough samples), and it has not
        measured ``MAX_MEASURED_STEPS``."""
        if not self._min_measured_ns or self._measured_from_ns is None:
            return False
        if self._completed - self.warmup >= MAX_MEASURED_STEPS:
            return False
        return recorder.now_ns() - self._measured_from_ns < self._min_measured_ns

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        recorder, sink, store = self._recorder, self._sink, self._store
        if recorder is None or sink is None or store is None:
            return
        collectors, self._collectors = self._collectors, []
        health: list[tuple[str, int, str]] = []
        if self._auto is not None:
            self._auto.stop()
            health += self._auto.health()
        try:
            # The region ends where the program left it: stopping the collectors (the PyTorch profiler takes a
            # few hundred milliseconds to stop and write its trace) is the profiler's time, not the program's
            # after its last step() or in its region.
            open_step, self._step_span = self._step_span, None
            if open_step is not None:  # no step() ended it: not an iteration, but what came after the last one
                _as_tail(open_step, self._completed)
                if self._completed and not self._marked and self._auto is not None and self._auto.ended:
                    open_step.attrs[A.MODEL_AFTER] = self._auto.name
                recorder.end(open_step)  # counts spans the region left open inside it
            recorder.close_all()
            for collector in reversed(collectors):
                try:  # one collector failing to stop must not leave the others' hooks installed
                    collector.stop()
                except Exception as err:
                    health.append(("collector_failed", 1, f"{collector.level}: stop: {type(err).__name__}: {err}"))
            sink.close()
            health.append(
                ("unclosed_spans", recorder.unclosed, "spans still open when their parent or the profile ended")
            )
            if sink.journal_error is not None:
                health.append(("journal_failed", 1, f"the journal beside the store stopped at {sink.journal_error}: "
                               "had the program been killed outright, what it recorded after that would have been "
                               "lost (the profile itself is complete)"))  # fmt: skip
            if exc_type is None and self.steps is not None and self._completed < self.steps:
                self.shortfall = self._shortfall()
                health.append(("iterations_short", self.steps - self._completed, self.shortfall))
            for collector in collectors:
                try:
                    health += collector.finish(store, self.run_id)
                except Exception as err:  # keep the live spans; say what is missing and why
                    health.append(("collector_failed", 1, f"{collector.level}: {type(err).__name__}: {err}"))
            store.add_run(self._run_info(exc_type, exc, store))
            store.add_health(self.run_id, health)
        finally:
            global _current
            _current = None
            self._recorder = None
            try:
                self._exit.close()  # completes the store even when the region raised: keep what was traced
            finally:
                salvage.remove_journal(self._journal)

    def _shortfall(self) -> str:
        """Says that the region ended after fewer iterations than its ``steps``, and how many were measured."""
        measure = self.config.get("measure")
        warmup = int(measure.get("warmup", 0)) if isinstance(measure, dict) else 0
        warmup = min(warmup, self.steps or 0)
        measured = max(self._completed - warmup, 0)
        got = f"{measured} measured" if measured else "none measured: every one was a warm-up iteration"
        return (f"pass {self.pass_name}: the program's loop ended after {self._completed} iterations, fewer than the "
                f"{self.steps} asked ({warmup} warm-up + {(self.steps or 0) - warmup} measured): {got}")  # fmt: skip

    def summary(self, top: int = 10) -> Any:
        """Print the run's summary, model stages and recommendations to the terminal, and return the summary."""
        from xstack.analyze.pipeline import analyze
        from xstack.analyze.recommend import RULE_ANALYSES
        from xstack.report.terminal import print_analysis

        with self.open() as store:
            analysis = analyze(store, ids=RULE_ANALYSES, top=top)
        print_analysis(analysis, str(self.path), top=top)
        return analysis.summary

    def recording_busy(self) -> bool:
        """Whether the recorder is writing a span right now (``Recorder.busy``)."""
        recorder = self._recorder
        return recorder is not None and recorder.busy()

    def open(self) -> Store:
        """The finished profile, opened read-only."""
        if self._recorder is not None:
            raise UsageError("the profile is still running: open it after the with-block")
        return Store.open(self.path)

    def _restart_step(self) -> None:
        """Start the iteration just opened now, where nothing began in it yet on this thread: what came between
        (a collector's work between iterations) is in no iteration's time."""
        recorder, span = self._recorder, self._step_span
        if recorder is not None and span is not None and (stack := recorder.stack()) and stack[-1] is span:
            span.start_ns = recorder.now_ns()

    def _open_step(self, usage: tuple[int, int, int, int] | None = None, thread: tuple[int, int] | None = None) -> None:
        if self._recorder is None:
            raise UsageError("the profile is not running")
        step = self._recorder.step
        self._step_usage = usage or _usage()
        self._step_thread = thread or _thread_usage()
        self._step_span = self._recorder.begin("model", f"step#{step}", {_KIND: "step", _STEP: step}, floating=True)

    def _journal_header(self) -> None:
        """Keep in the journal's header what the run's config has gained since it was last written: the
        DataLoaders iterated so far (``journal_config``) and whether CUDA is initialised, so that a run salvaged
        after a kill has them (its input-bound advice reads them)."""
        if self._journal is None:
            return
        extra: dict[str, Any] = {A.CONFIG_CUDA: _cuda_initialised()}
        for journal_config in self._journal_configs:
            extra |= journal_config()
        if extra == self._journaled:
            return
        self._journaled = extra
        header = self._header()
        with contextlib.suppress(OSError):  # a journal that cannot be written loses this, not the program
            salvage.write_json(self._journal, salvage.HEADER, header | {"config": header["config"] | extra})

    def _header(self) -> dict[str, Any]:
        """What the run's row holds that is known as it starts (kept in the journal for ``xstack.salvage``)."""
        import importlib.metadata as md

        try:
            torch_version: str | None = md.version("torch")
        except md.PackageNotFoundError:
            torch_version = None
        return {
            "run_id": self.run_id,
            "name": self.name,
            "started_at_ns": self._started_ns,
            "command": self._command,
            "host": socket.gethostname(),
            "levels": [lv for lv in LEVELS if lv in self.levels],
            "pass_name": self.pass_name,
            "config": self.config
            | {
                A.CONFIG_WARMUP_STEPS: self.warmup,
                "torch": torch_version,
                "python": platform.python_version(),
                "pid": os.getpid(),
                A.CONFIG_CPU_COUNT: usable_cpus(),
            }
            | _distributed(),
        }

    def _run_info(self, exc_type: type[BaseException] | None, exc: BaseException | None, store: Store) -> RunInfo:
        header = self._header()
        header["config"] |= {A.CONFIG_TORCH_THREADS: _torch_threads(), A.CONFIG_CUDA: _cuda_initialised()}
        header["config"][A.CONFIG_PAGE_BYTES] = resource.getpagesize()
        if (allocator := _allocator()) is not None:
            header["config"][A.CONFIG_ALLOCATOR] = allocator
        header["config"][A.CONFIG_MALLOC_FIXED] = malloc_fixed(os.environ)
        measure = header["config"].get("measure")
        if self._min_measured_ns and isinstance(measure, dict) and self._completed > (self.steps or 0):
            # went on past its iterations to last long enough: the merge reads the iterations measured
            header["config"]["measure"] = measure | {"iterations": self._completed - self.warmup}
        return run_info(header, store, error=describe_failure(exc_type, exc), completed=self._completed,
                        cut_short=exc_type is not None)  # fmt: skip


def _min_measured_ns(measure: object) -> int:
    """A measured pass's ``min_measured_s`` in ns (0 where its ``config.measure`` sets none)."""
    value = measure.get("min_measured_s") if isinstance(measure, dict) else None
    return round(value * 1e9) if isinstance(value, (int, float)) and value > 0 else 0


def ranked() -> tuple[int, int] | None:
    """``(rank, world size)`` of a process that a launcher of one process per rank started (torchrun sets
    ``RANK`` and ``WORLD_SIZE``), None for a job of one process."""
    rank, world = os.environ.get("RANK", "").strip(), os.environ.get("WORLD_SIZE", "").strip()
    return (int(rank), int(world)) if rank.isdigit() and world.isdigit() and int(world) > 1 else None


def _distributed() -> dict[str, Any]:
    """``{"distributed": {"rank", "world_size", "local_rank", "local_world_size"}}`` for a process that a launcher of
    one process per rank started (torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``, the
    ranks on this machine), as an imported trace's ``distributedInfo``; empty for a job of one process."""
    job = ranked()
    if job is None:
        return {}
    local, size = os.environ.get("LOCAL_RANK", "").strip(), os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    return {"distributed": {"rank": job[0], "world_size": job[1]}
            | ({"local_rank": int(local)} if local.isdigit() else {})
            | ({"local_world_size": int(size)} if size.isdigit() else {})}  # fmt: skip


def run_info(header: dict[str, Any], store: Store, *, error: str | None, completed: int, cut_short: bool) -> RunInfo:
    """The run's row from its ``header`` (``Profile._header``) and how it ended: ``cut_short`` or complete,
    ``error`` (``config.error``), ``completed`` iterations; its devices are read from its spans in ``store``."""
    run_id = int(header["run_id"])
    device = _devices(store, run_id)
    torch_version = header["config"].get("torch")
    # installed is not used: torch's thread count is known only where the program imported it (a salvaged run's
    # header, written as the run began, lacks it: installed is all it can say)
    used = header["config"].get(A.CONFIG_TORCH_THREADS, torch_version) is not None
    config = header["config"] | {
        "status": "cut_short" if cut_short else "complete",
        "error": error,
        "steps": completed,
        "steps_completed": completed,
    }
    return RunInfo(
        run_id=run_id,
        name=header["name"],
        started_at_ns=header["started_at_ns"],
        command=header["command"],
        host=header["host"],
        framework="pytorch" if torch_version and used else None,
        device=device,
        levels=list(header["levels"]),
        pass_name=header["pass_name"],
        config=config | _peaks(device, config),
    )


def describe_failure(exc_type: type[BaseException] | None, exc: BaseException | None) -> str | None:
    """What ended a profile early, for ``config.error``: the exception's type and the first line of its message
    (``ValueError: boom``), or a failed program's own description (``reason``: ``exit code 3``)."""
    if exc_type is None:
        return None
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str):
        return reason
    text = str(exc).strip().splitlines()[0] if exc is not None and str(exc).strip() else ""
    return f"{exc_type.__name__}: {text}" if text else exc_type.__name__


def _as_tail(span: OpenSpan, completed: int) -> None:
    """Turn the step span still open when the region ends into what it is: the stretch after the last
    ``step()`` (``after-last-step``, kind ``tail``), or the whole region when no ``step()`` was called
    (``region``, kind ``region``). Neither is an iteration, so no per-iteration statistic counts it."""
    span.name, kind = ("after-last-step", "tail") if completed else ("region", "region")
    span.attrs.pop(A.MODEL_STEP, None)
    span.attrs[A.MODEL_KIND] = kind


class _OptimizerSteps:
    """Iterations of a measured run (``Profile.steps``) whose program never calls ``step()``: one optimizer's
    ``step()`` ends each. Which optimizer, and that the program marks none itself, is known at the second call
    of one optimizer's ``step()`` with no ``step()`` of the program's before it: that call ends the first
    iteration (which holds two of the loop's, and the start-up), and each later call of that optimizer ends one
    more. A ``step()`` of the program's ends this for good."""

    def __init__(self, profile: Profile) -> None:
        self._profile = profile
        self._seen: set[int] = set()
        self._chosen: int | None = None
        self.name = ""
        self.ended = 0
        self._on_torch: Any = None  # an OnImport
        self._handle: Any = None
        self._compiling: Callable[[], bool] = lambda: False

    def start(self) -> None:
        from xstack.collect._after_import import OnImport

        self._on_torch = OnImport("torch", self._hook)

    def _hook(self) -> None:
        if self._profile._recorder is None:
            return
        try:
            import torch
            import torch.optim.optimizer as optim
        except ImportError:
            return
        self._compiling = torch.compiler.is_compiling  # whatever levels run (the model level's hooks may not)
        self._handle = optim.register_optimizer_step_post_hook(self._stepped)

    def stop(self) -> None:
        if self._on_torch is not None:
            self._on_torch.remove()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        profile = self._profile
        if profile._marked or profile.done or profile._recorder is None:
            return
        if self._compiling():  # a compiled optimizer step: nothing of the profiler in its graph
            return
        key = id(optimizer)
        if self._chosen is None:
            if key not in self._seen:
                self._seen.add(key)
                return
            self._chosen, self.name = key, f"{type(optimizer).__name__}.step()"
        elif key != self._chosen:
            return
        self.ended += 1
        profile._advance()
        if profile.done:  # stops the program there, as ``xstack.step()`` does
            _complete(profile)

    def health(self) -> list[tuple[str, int, str]]:
        """The informational row that says where the run's iterations came from, when an optimizer ended any;
        a finding where hooking the optimizers failed."""
        rows: list[tuple[str, int, str]] = []
        if self.ended:
            then = ("; then the program called xstack.step(), which ended the others" if self._profile._marked
                    else "")  # fmt: skip
            rows.append(("steps_from_optimizer", self.ended,
                         f"iterations ended by {self.name}: the program never called xstack.step(), so each call "
                         f"of {self.name} ended one, from its second call on (the first iteration holds the "
                         f"start-up and two of the loop's){then}"))  # fmt: skip
        if (error := self._on_torch.error if self._on_torch is not None else None) is not None:
            rows.append(("steps_from_optimizer_failed", 1, f"optimizer steps could not end iterations: hooking "
                         f"them when the program imported torch failed ({error})"))  # fmt: skip
        return rows


_current: Profile | None = None

_NOT_IN_RANKS = frozenset({"io", "system", "metrics"})
"""Levels a process started by the profiled program does not record itself: the io and system levels of the
profile in progress already cover the whole process tree, and the metrics level replays the program under ncu."""


class RankProfile:
    """``fn`` of a process that the profiled program starts with ``torch.multiprocessing`` (one per rank: the
    DDP tutorial's ``mp.spawn(train, nprocs=N)``), profiled into a store of its own, ``STORE.rankI.duckdb`` beside
    the profile's (``for_ranks``). Picklable, as such a process gets its function by pickle.

    ``optimizer_steps``: as the profile's (``Profile``): under ``xstack run``, a process whose function never
    calls ``xstack.step()`` has an optimizer's steps end its iterations.

    ``append``: add the process's run to its store where one is there (the profile appends to its own store, or
    the program started processes before in this run) rather than replace it; the run is written to a scratch
    store first and copied in once complete, as ``xstack run --append`` does."""

    def __init__(
        self,
        fn: Callable[..., Any],
        levels: tuple[str, ...],
        path: str,
        name: str,
        warmup: int,
        world: int,
        *,
        append: bool = False,
        optimizer_steps: bool = False,
    ) -> None:
        self.fn, self.levels, self.path, self.name, self.warmup, self.world = fn, levels, path, name, warmup, world
        self.append, self.optimizer_steps = append, optimizer_steps

    def store(self, rank: int) -> Path:
        path = Path(self.path)
        return path.with_name(f"{path.stem}.rank{rank}{path.suffix}")

    def stores(self) -> list[Path]:
        return [self.store(rank) for rank in range(self.world)]

    def __call__(self, rank: int, *args: Any) -> Any:
        job = {"distributed": {"rank": rank, "world_size": self.world}} if self.world > 1 else {}
        store = self.store(rank)
        written = scratch_path(store) if self.append and store.exists() else store
        try:
            with Profile(self.levels, written, self.name, warmup=self.warmup, config=job,
                         optimizer_steps=self.optimizer_steps):  # fmt: skip
                return self.fn(rank, *args)
        finally:
            if written != store and written.exists():
                append_store(store, written)


def for_ranks(fn: Callable[..., Any], nprocs: int, start_method: str, *, again: bool = False) -> RankProfile | None:
    """``fn`` profiled in each of the ``nprocs`` processes that ``torch.multiprocessing`` starts with it (each
    run's ``config.distributed`` says which of them, as under torchrun), where the profile in
    progress writes a store of its own for as long as the program runs (``xstack run``, ``xstack.profile``; not
    the passes of ``xstack.measure`` or ``xstack profile``, which run the program again, nor ``xstack run
    --iters``, which stops it after iterations this process would count) and records a level such a process
    can; None otherwise, and for a forked process, which inherits this one's profile as it stands.

    Their runs are added to stores already there when the profile appends to its own (``xstack run --append``)
    or ``again`` (the program started processes so before in this run); otherwise they replace them."""
    current = _current
    if current is None or current._given_store is not None or current.steps is not None or start_method == "fork":
        return None
    levels = tuple(lv for lv in current.levels if lv not in _NOT_IN_RANKS)
    if not levels:
        return None
    # beside the store the run ends up in (``xstack run --append`` writes a scratch store first)
    final = final_path(current.path)
    append = again or final != current.path
    optimizer_steps = current._auto is not None  # xstack run's processes alike
    return RankProfile(fn, levels, str(final), current.name, current.warmup, nprocs, append=append,
                       optimizer_steps=optimizer_steps)  # fmt: skip


class PassComplete(BaseException):
    """Raised by ``xstack.step()`` once the profile in progress has recorded all its ``steps``: ends a program
    run by ``xstack run --iters`` / ``xstack profile`` there (a ``BaseException``, so that the program's own
    ``except Exception`` handlers let it through, as they do ``SystemExit``)."""


def step() -> None:
    """Mark the end of an iteration in the profile in progress (scripts run by ``xstack run`` or ``xstack
    profile``); nothing outside one. Raises ``PassComplete`` when the profile wanted no more iterations."""
    if _current is not None and _current._recorder is not None:
        _current.step()
        if _current.done:
            _complete(_current)


_stopped_from: str | None = None
"""The thread whose ``step()`` ended the pass, where that was not the main thread (``stopped_from``)."""
_main_in_program = False
"""Whether the main thread runs the program (``running_program``), so that a pass ended on another thread may
interrupt it; not once the program has returned and the profile is being completed."""
_on_sigint: Any = None
"""The profile's SIGINT handler while ``running_program`` has it in place."""
_interrupted = False
"""Whether that handler has ended the pass in the main thread."""
RESEND_S = 0.05
"""How often the main thread is interrupted again until it is: a signal that arrives just before it blocks (on a
lock: a queue's ``get``) is handled only once it wakes."""


@contextmanager
def running_program() -> Iterator[None]:
    """Around the program's run in the main thread: a pass (a profile with ``steps``) that its other threads end
    interrupts it there only. Where SIGINT has Python's handler or is ignored (a job started in the background by
    a shell without job control), a handler of the profile's own takes its place meanwhile: it ends the pass
    where another thread did, once, and otherwise does what the one it replaced did. A run without ``steps``
    leaves the program's signals as they are."""
    global _main_in_program, _on_sigint
    if _current is None or _current.steps is None:
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        global _interrupted
        if _stopped_from is not None:
            if not _interrupted:
                _interrupted = True
                raise PassComplete(f"ended on thread {_stopped_from}")
        elif previous is signal.default_int_handler:
            signal.default_int_handler(signum, frame)

    if previous in (signal.default_int_handler, signal.SIG_IGN):
        try:
            signal.signal(signal.SIGINT, on_sigint)
            _on_sigint = on_sigint
        except ValueError:  # not the main thread: nothing to interrupt there
            pass
    _main_in_program = True
    try:
        yield
    finally:
        _main_in_program = False
        if _on_sigint is not None and signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, previous)
        _on_sigint = None


def _complete(profile: Profile) -> NoReturn:
    """End the program: its pass has recorded its iterations. Marked on another thread (a server's worker),
    the iterations end that thread, and the main thread, which may be waiting for it, is interrupted too (a
    SIGINT sent to it alone, which ``xstack run`` tells from a Ctrl-C by ``stopped_from``)."""
    global _stopped_from
    if threading.current_thread() is not threading.main_thread() and _stopped_from is None and _main_in_program:
        _stopped_from = threading.current_thread().name
        threading.Thread(target=_interrupt_main, name="xstack-stop", daemon=True).start()
    raise PassComplete(f"{counted(profile.completed, 'iteration')} recorded")


def _interrupt_main() -> None:
    """Send SIGINT to the main thread until the profile's handler has ended the pass there (once only, where the
    program put a handler of its own in place, which may not be called twice)."""
    main = threading.main_thread().ident
    while main is not None and _main_in_program and not _interrupted:
        signal.pthread_kill(main, signal.SIGINT)
        if _on_sigint is None or signal.getsignal(signal.SIGINT) is not _on_sigint:
            return
        time.sleep(RESEND_S)


def stopped_from() -> str | None:
    """The thread that ended the pass where it was not the main thread (its ``step()`` interrupted the main
    thread); None otherwise."""
    return _stopped_from


def profile(
    levels: str | tuple[str, ...] | list[str] | None = None,
    path: str | os.PathLike[str] | None = None,
    name: str | None = None,
    *,
    warmup: int = DEFAULT_WARMUP,
) -> Profile:
    """Profile the region of a with-block at ``levels`` (``"model,layer"`` or a sequence; default:
    ``default_levels()``) into ``path``; the first ``warmup`` iterations (ended by ``prof.step()``) are left out of
    per-iteration statistics."""
    return Profile(levels, path, name, warmup=warmup)


def default_levels() -> tuple[tuple[str, ...], str | None]:
    """The levels where none are given, and what to say of them: ``DEFAULT_LEVELS``, less the layer level where it
    cannot run (PyTorch not installed), so that a program that does not use PyTorch is profiled on a machine without
    it as on one with it (where the layer level records nothing); the line to print on stderr then, else None."""
    reason = collect.load("layer").unavailable_reason()
    if reason is None:
        return DEFAULT_LEVELS, None
    said = f"xstack: recording the model level alone; the layer level cannot run here: {reason}"
    return tuple(level for level in DEFAULT_LEVELS if level != "layer"), said


def parse_levels(levels: str | Sequence[str]) -> tuple[str, ...]:
    """Level names from ``"model,layer"`` or a sequence, checked, with the levels they imply
    (``collect.IMPLIED``), in the store's order (outermost first), which is the order collectors start in."""
    names = [s.strip() for s in (levels.split(",") if isinstance(levels, str) else levels) if s.strip()]
    if not names:
        raise UsageError("no levels given (for example: model,layer)")
    for name in names:
        if name not in collect.BUILTIN:
            collect.load(name)  # raises the clear error
    wanted = set(names)
    while implied := {i for n in wanted for i in collect.IMPLIED.get(n, ())} - wanted:
        wanted |= implied
    return tuple(lv for lv in LEVELS if lv in wanted)


ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
"""Caching mallocs that keep freed memory for reuse, by the name their libraries carry."""


def _allocator() -> str | None:
    """The malloc of this process (``A.CONFIG_ALLOCATOR``): the first of ``ALLOCATORS`` whose library is mapped
    in it, else ``glibc``; None where ``/proc/self/maps`` cannot be read."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            text = maps.read()
    except OSError:
        return None
    return next((name for name in ALLOCATORS if f"lib{name}" in text), "glibc")


MALLOC_FIXING = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")
"""glibc's malloc settings that turn off its dynamic mmap threshold (``mallopt``'s M_MMAP_THRESHOLD, M_TRIM_THRESHOLD,
M_TOP_PAD and M_MMAP_MAX), by their environment variables; ``GLIBC_TUNABLES`` names them ``glibc.malloc.`` and the
name in lower case, less ``MALLOC_`` and the trailing underscore."""


def malloc_fixed(environ: Mapping[str, str]) -> list[str]:
    """The settings of ``MALLOC_FIXING`` that ``environ`` sets (``A.CONFIG_MALLOC_FIXED``), by their variable's name
    or their name in ``GLIBC_TUNABLES``."""
    found = [name for name in MALLOC_FIXING if environ.get(name, "").strip()]
    tunables = {item.split("=", 1)[0].strip() for item in environ.get("GLIBC_TUNABLES", "").split(":") if "=" in item}
    found += [t for name in MALLOC_FIXING if (t := f"glibc.malloc.{name[7:-1].lower()}") in tunables]
    return found


def _usage() -> tuple[int, int, int, int]:
    """This process's minor and major page faults and user and system CPU time (ns) so far, every thread of it
    (``A.STEP_USAGE``)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_majflt, round(r.ru_utime * 1e9), round(r.ru_stime * 1e9)


def _thread_usage() -> tuple[int, int]:
    """The calling thread and its CPU time so far, ns (``A.MODEL_THREAD_CPU_NS``)."""
    return threading.get_ident(), time.thread_time_ns()


def _synchronize_cuda() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _torch_threads() -> int | None:
    """torch's intra-op threads, where the program imported torch (None otherwise: nothing is imported here)."""
    torch = sys.modules.get("torch")
    try:
        return int(torch.get_num_threads()) if torch is not None else None
    except Exception:  # a half-imported or stubbed torch must never fail a profile
        return None


def _cuda_initialised() -> bool:
    """Whether the program had CUDA initialised (``config.cuda``); False where it did not import torch."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())  # asks nothing of the driver
    except Exception:  # a half-imported or stubbed torch must never fail a profile
        return False


def _peaks(device: str, config: dict[str, Any]) -> dict[str, Any]:
    """``{"peaks": ...}``: the peaks of the run's main device (its first CUDA device, else the CPU), calibrated or
    read off the device; empty where the caller gave peaks, none are known, the run used GPUs of different
    models, or reading them fails (which must never fail a profile)."""
    if "peaks" in config:
        return {}
    try:
        from xstack.device.calibrate import peaks_for

        peaks = peaks_for(device)
    except Exception:
        return {}
    return {"peaks": peaks} if peaks else {}


def _devices(store: Store, run_id: int) -> str:
    """``cpu``, or the devices the run's spans ran on with their names (``cuda:0 NVIDIA H100``)."""
    rows = store.query("SELECT DISTINCT device FROM _spans WHERE run_id = ? AND device <> 'cpu' ORDER BY 1", [run_id])
    torch = sys.modules.get("torch")
    names = []
    for (device,) in rows:
        kind, _, index = str(device).partition(":")
        try:
            names.append(f"{device} {torch.cuda.get_device_name(int(index))}" if torch and kind == "cuda" else device)
        except (RuntimeError, ValueError, AssertionError):
            names.append(device)
    return ", ".join(names) or "cpu"
