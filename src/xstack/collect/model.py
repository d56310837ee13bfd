"""The ``model`` level: pipeline stages.

Users mark stages with ``xstack.span("preprocess")`` (a context manager and a decorator). Where no stage is
marked, each top-level model call, each backward pass and each optimizer step becomes a model span of its own: a
marked stage stands for them. Each wait for a DataLoader's next batch becomes one everywhere, nested in the
marked stage it runs in (a validation loop in ``xstack.span("validate")``): a wait is what the input-bound
analyses measure, and a mark names the work around it, not the wait. The configuration of each DataLoader the
program iterates goes into the run's ``config.dataloaders``, and each wait names its DataLoader
(``collect._dataloaders``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import types
from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, NamedTuple, cast

from xstack.collect import _module_hooks
from xstack.collect._after_import import OnImport
from xstack.collect._dataloaders import DataLoaders
from xstack.collect._recorder import OpenSpan, Recorder
from xstack.collect._roots import RootWatcher
from xstack.text import counted
from xstack.trace import attrs as A
from xstack.trace.store import Store

_KIND = A.MODEL_KIND

_active: Recorder | None = None
"""The recorder of the profile in progress, if any: ``span`` records nothing without one."""

_unprofiled = 0
"""How many processes the program started with ``torch.multiprocessing`` that no profile follows, in the last
profile with the model level (``unprofiled_processes``)."""


def unprofiled_processes() -> int:
    """How many processes the program started with ``torch.multiprocessing`` and no profile follows, in the
    profile in progress or the last one (where its iterations went, when it recorded none)."""
    return _unprofiled


class span(contextlib.ContextDecorator):  # noqa: N801 - used like a function: xstack.span("load")
    """Mark a pipeline stage: ``with xstack.span("load"):`` or ``@xstack.span("load")``.

    Outside a profile it does nothing, so marks can stay in production code. Inside code that ``torch.compile``
    traces it does nothing either: the compiled graph runs as one, with no code of the profiler's in it (the
    clock read it would add there made torch give up compiling the whole function); mark the stage around the
    compiled call instead.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._open: OpenSpan | None = None
        self._recorder: Recorder | None = None

    def _recreate_cm(self) -> span:
        return span(self.name)  # each decorated call gets its own span

    def __enter__(self) -> span:
        compiler = sys.modules.get("torch.compiler")  # torch is never imported for this
        if compiler is not None and compiler.is_compiling():  # a constant for torch's tracer: nothing is traced
            self._recorder = None
            return self
        self._recorder = _active
        if self._recorder is not None:
            self._open = self._recorder.begin("model", self.name, {A.MODEL_KIND: "user"})
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._recorder is not None and self._open is not None:
            self._recorder.end(self._open, {"model.error": exc_type.__name__} if exc_type else None)
        self._open = None


CLIP_FUNCTIONS: Final = ("clip_grad_norm_", "clip_grad_value_")
"""The functions of ``torch.nn.utils`` whose calls are stages of kind ``clip`` (``ModelCollector._patch_clip``)."""


class ModelCollector:
    """Records marked stages, batch waits and, where no marked stage is open, top-level model calls, backward
    passes and optimizer steps."""

    level = "model"

    def __init__(self) -> None:
        self._recorder: Recorder | None = None
        self._local = threading.local()
        self._handles: list[Any] = []
        self._patched: tuple[Any, Any] | None = None
        self._roots: RootWatcher | None = None
        self._loaders = DataLoaders()
        self._config: dict[str, Any] | None = None
        self._on_torch: OnImport | None = None
        self._started: list[_Started] = []
        self._unpatch: list[Callable[[], None]] = []

    def unavailable_reason(self) -> str | None:
        return None  # stage marks need nothing; automatic stages need PyTorch and are skipped without it

    def configure(self, config: dict[str, Any]) -> None:
        """Keep the run's config: ``finish`` adds ``config["dataloaders"]`` to it."""
        self._config = config

    def start(self, recorder: Recorder) -> None:
        global _active, _unprofiled
        self._recorder = _active = recorder
        _unprofiled = 0
        _module_hooks.reset_roots()
        # PyTorch is hooked where the program uses it: importing it here would cost a program that does not
        # seconds and thousands of file reads, which the io and system levels would record as the program's
        self._on_torch = OnImport("torch", self._start_torch)

    def _start_torch(self) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        try:
            import torch
            import torch.optim.optimizer as optim
        except ImportError:
            return
        if "layer" in recorder.levels:
            _module_hooks.subscribe(self, order=0)  # every call is hooked anyway; keeps model spans outermost
        else:
            self._roots = RootWatcher(self._root_begin, self._root_end)
            self._roots.start()
        self._handles = [
            optim.register_optimizer_step_pre_hook(self._optimizer_before),
            optim.register_optimizer_step_post_hook(self._optimizer_after),
        ]
        self._patch_dataloader(torch)
        self._patch_backward(torch)
        self._patch_clip(torch)
        self._patch_start_processes()
        # Hugging Face's generate, where the program imports transformers: its loop between the model's calls
        # (logits processing, the tokens gathered) is no stage else, and reads as the program's own work
        self._unpatch.append(OnImport("transformers.generation.utils", self._patch_generate).remove)

    def _patch_start_processes(self) -> None:
        """Count the processes the program starts with ``torch.multiprocessing.spawn`` or ``start_processes``
        (the DDP tutorial's way: one process per rank): what they run is not profiled, which ``finish`` says."""
        module: Any = sys.modules.get("torch.multiprocessing.spawn")
        package: Any = sys.modules.get("torch.multiprocessing")
        original = getattr(module, "start_processes", None)
        if module is None or original is None:
            return
        started = self._started

        @functools.wraps(original)
        def start_processes(*args: Any, **kwargs: Any) -> Any:
            from xstack.profile import for_ranks

            try:
                bound = inspect.signature(original).bind(*args, **kwargs)
                bound.apply_defaults()
                fn, method = bound.arguments["fn"], str(bound.arguments["start_method"])
                nprocs = int(bound.arguments["nprocs"])
            except (TypeError, ValueError, KeyError):  # the call fails as the program made it
                return original(*args, **kwargs)
            ranks = for_ranks(fn, nprocs, method, again=any(s.ranks is not None for s in started))
            name = getattr(fn, "__qualname__", None) or type(fn).__name__
            started.append(_Started(name, nprocs, method, ranks))
            if ranks is None:
                global _unprofiled
                _unprofiled += nprocs
                return original(*args, **kwargs)
            bound.arguments["fn"] = ranks
            return original(*bound.args, **bound.kwargs)

        module.start_processes = start_processes  # spawn() calls it by this name
        if package is not None and getattr(package, "start_processes", None) is original:
            package.start_processes = start_processes
        self._unpatch.append(lambda: _restore(module, package, original, start_processes))

    def stop(self) -> None:
        global _active
        if self._on_torch is not None:
            self._on_torch.remove()
        _module_hooks.unsubscribe(self)
        if self._roots is not None:
            self._roots.stop()
            self._roots = None
        while self._handles:
            self._handles.pop().remove()
        if self._patched is not None:
            cls, original = self._patched
            cls.__next__ = original
            self._patched = None
        self._loaders.stop()
        while self._unpatch:
            self._unpatch.pop()()
        _active = None

    def journal_config(self) -> dict[str, Any]:
        """The config the run's row will hold that this level learns as the run goes: the DataLoaders iterated so
        far (kept in the journal, for a run salvaged after a kill)."""
        return {A.CONFIG_DATALOADERS: self._loaders.config()}

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        if self._config is not None:
            self._config[A.CONFIG_DATALOADERS] = self._loaders.config()
            if self._started:
                self._config[A.CONFIG_PROCESSES] = [s.config() for s in self._started]
        health: list[tuple[str, int, str]] = []
        if failed := _module_hooks.failures(self):
            health.append(("model_hook_failed", failed[0], f"model calls whose span could not be recorded (the "
                           f"first: {failed[1]}); the program ran on"))  # fmt: skip
        if lost := [s for s in self._started if s.ranks is None]:
            health.append(("processes_not_profiled", sum(s.nprocs for s in lost), _lost_text(lost)))
        if profiled := [s for s in self._started if s.ranks is not None]:
            health.append(("processes_profiled", sum(s.nprocs for s in profiled), _profiled_text(profiled)))
        if self._on_torch is not None and self._on_torch.error is not None:  # what was not hooked
            why = f"hooking them when the program imported torch failed ({self._on_torch.error})"
            health.append(("model_hooks_failed", 1, "PyTorch's model calls, backward passes, optimizer steps and "
                           f"DataLoader waits are not recorded: {why}"))  # fmt: skip
        return health

    # -- top-level model calls ----------------------------------------------------------------------------
    # With the layer level, every module call goes through the shared dispatcher (``before``/``after``);
    # without it, a ``RootWatcher`` reports only the top-level calls, so nested calls stay on the fast path.
    def before(self, module: Any, args: tuple[Any, ...]) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.forward = self._root_begin(module)

    def after(self, module: Any, output: Any, kwargs: dict[str, Any]) -> None:
        self._local.depth -= 1
        if self._local.depth == 0:
            self._root_end(getattr(self._local, "forward", None))
            self._local.forward = None

    def _root_begin(self, module: Any) -> OpenSpan | None:
        """``_begin_auto("forward", ...)`` without its layers: this runs on every top-level call."""
        recorder = self._recorder
        if recorder is None or _module_hooks.in_backward():  # a forward recomputed for the backward: not a stage
            return None
        for s in recorder.stack():
            if s.attrs.get(_KIND) == "user":
                return None
        return recorder.begin("model", _module_hooks.model_name(module), {_KIND: "forward"})

    def _root_end(self, opened: OpenSpan | None) -> None:
        if opened is not None and self._recorder is not None:
            self._recorder.end(opened)

    # -- optimizer steps ----------------------------------------------------------------------------------
    def _optimizer_before(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if _module_hooks.compiling():  # a compiled optimizer step: nothing of the profiler in its graph
            return None
        name = f"{type(optimizer).__name__}.step"
        self._local.optimizer = opened = self._begin_auto("optimizer", name)
        if opened is None:
            return None
        # A closure (Lightning's automatic optimisation, LBFGS) runs the forward and backward inside the step:
        # its calls are a stage of their own, so that the step's own work is told from them. The optimizer
        # calls it as it would the program's, and gets what it returns.
        if kwargs.get("closure") is not None:
            return args, {**kwargs, "closure": self._closure(kwargs["closure"], name)}
        if len(args) > 1 and callable(args[1]):  # args[0] is the optimizer
            return (args[0], self._closure(args[1], name), *args[2:]), kwargs
        return None

    def _closure(self, closure: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``closure`` recorded as a stage (kind ``closure``) each time the optimizer calls it."""

        def closure_in_a_stage(*args: Any, **kwargs: Any) -> Any:
            opened = self._begin_auto("closure", f"{name} closure")
            try:
                return closure(*args, **kwargs)
            finally:
                self._end_auto(opened)

        return closure_in_a_stage

    def _optimizer_after(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if _module_hooks.compiling():
            return
        self._end_auto(getattr(self._local, "optimizer", None))
        self._local.optimizer = None

    # -- backward passes ---------------------------------------------------------------------------------
    def _patch_backward(self, torch: Any) -> None:
        """Each backward pass the program starts (``loss.backward()``, ``torch.autograd.backward``, which
        ``Tensor.backward`` calls by that name, and ``torch.autograd.grad``) is a stage of kind ``backward``:
        with the forward calls and the optimizer's step, where an unmarked training step's time goes. One
        started inside another (a reentrant checkpoint's recomputation) is part of it."""
        autograd, codes = torch.autograd, set()
        for attr, name in (("backward", "backward"), ("grad", "autograd.grad")):
            original = getattr(autograd, attr, None)
            if original is None:
                continue
            wrapper = self._backward(original, name)
            codes.add(wrapper.__code__)
            patched = functools.update_wrapper(wrapper, original)
            setattr(autograd, attr, patched)
            self._unpatch.append(functools.partial(_put_back, autograd, attr, original, patched))
        # torch's compiler compiles the frames a compiled function calls after its graph break at the backward:
        # told to skip the wrapper as it skips PyTorch's own files, it meets the same graph breaks as without it
        self._unpatch.append(OnImport("torch._dynamo", functools.partial(_skipped_by_dynamo, codes)).remove)

    def _backward(self, original: Callable[..., Any], name: str) -> types.FunctionType:
        return self._stage(original, "backward", lambda *args, **kwargs: name)

    def _stage(self, original: Callable[..., Any], kind: str, name: Callable[..., str]) -> types.FunctionType:
        """``original`` wrapped so that each call is a stage of ``kind``, named by ``name(*args, **kwargs)``; one
        called inside another of its kind on the same thread (a re-entrant backward, an assisted generation) is
        part of it, and under torch's compiler it runs as it is (a constant to dynamo)."""
        local, flag = self._local, f"in_{kind}"

        def staged(*args: Any, **kwargs: Any) -> Any:
            if _module_hooks.compiling() or getattr(local, flag, False):
                return original(*args, **kwargs)
            setattr(local, flag, True)
            opened = self._begin_auto(kind, name(*args, **kwargs))
            try:
                return original(*args, **kwargs)
            finally:
                self._end_auto(opened)
                setattr(local, flag, False)

        return cast(types.FunctionType, staged)

    # -- gradient clipping ---------------------------------------------------------------------------------
    def _patch_clip(self, torch: Any) -> None:
        """Each call of ``torch.nn.utils.clip_grad_norm_`` or ``clip_grad_value_`` (a Hugging Face Trainer's and
        Accelerate's too, which call it by that name) is a stage of kind ``clip``, named after the function:
        training work between the backward and the optimizer's step, not the loop's own. A program that imported
        the function by name before the profile started keeps the function unwrapped."""
        modules = [m for m in (getattr(torch.nn, "utils", None), sys.modules.get("torch.nn.utils.clip_grad")) if m]
        for attr in CLIP_FUNCTIONS:
            original = getattr(modules[0], attr, None) if modules else None
            if original is None:
                continue
            patched = functools.update_wrapper(self._stage(original, "clip", lambda *a, _n=attr, **k: _n), original)
            for module in modules:
                if getattr(module, attr, None) is original:
                    setattr(module, attr, patched)
                    self._unpatch.append(functools.partial(_put_back, module, attr, original, patched))

    # -- Hugging Face generation ---------------------------------------------------------------------------
    def _patch_generate(self) -> None:
        """Each call of a Hugging Face model's ``generate`` (``GenerationMixin.generate``, which every generating
        model inherits and most call through ``super()``) is a stage of kind ``generate``, ``GPT2LMHeadModel.
        generate``, holding the model's forward calls: the time between them (the tokens chosen, the stopping
        criteria) is the generation's, not work the loop does outside every stage. One started inside another
        (assisted generation) is part of it."""
        module = sys.modules.get("transformers.generation.utils")
        cls: Any = getattr(module, "GenerationMixin", None)
        original = getattr(cls, "generate", None)
        if original is None:
            return
        generate = self._stage(
            original, "generate", lambda model, *a, **k: f"{_module_hooks.model_name(model)}.generate"
        )
        patched = functools.update_wrapper(generate, original)
        cls.generate = patched
        self._unpatch.append(functools.partial(_put_back, cls, "generate", original, patched))

    # -- DataLoader waits ---------------------------------------------------------------------------------
    def _patch_dataloader(self, torch: Any) -> None:
        cls: Any = torch.utils.data.dataloader._BaseDataLoaderIter
        original = cls.__next__
        collector, loaders = self, self._loaders

        def __next__(it: Any) -> Any:  # noqa: N807 - replaces the iterator's __next__
            index = loaders.index_of(it)
            extra: dict[str, Any] | None = {A.MODEL_DATALOADER: index} if index is not None else None
            if loaders.first_next(it):  # an epoch's first batch: where workers that do not persist start
                extra = (extra or {}) | {A.MODEL_DATALOADER_FIRST: True}
            opened = collector._begin_auto("dataloader", "dataloader.next", extra, in_marked=True)
            try:
                return original(it)
            except StopIteration:  # the epoch's end: workers that do not persist are shut down in this wait
                if opened is not None:
                    opened.attrs[A.MODEL_DATALOADER_LAST] = True
                raise
            finally:
                collector._end_auto(opened)

        cls.__next__ = __next__
        self._patched = (cls, original)
        self._loaders.start(torch, _IterStage(self))

    # -- shared -------------------------------------------------------------------------------------------
    def _begin_auto(
        self, kind: str, name: str, extra: dict[str, Any] | None = None, *, in_marked: bool = False
    ) -> OpenSpan | None:
        """Open an automatic stage unless the user marked one that is open on this thread (``in_marked``: even
        then, nested in it)."""
        recorder = self._recorder
        if recorder is None:
            return None
        if not in_marked and any(s.attrs.get(A.MODEL_KIND) == "user" for s in recorder.stack()):
            return None
        return recorder.begin("model", name, {A.MODEL_KIND: kind, **(extra or {})})

    def _end_auto(self, opened: OpenSpan | None) -> None:
        if opened is not None and self._recorder is not None:
            self._recorder.end(opened)


class _IterStage:
    """``iter(DataLoader)`` as a ``dataloader`` stage, ``dataloader.iter``: the loop waits in it while a loader
    whose workers do not persist starts them, at each epoch (an iterator it made is its epoch's first wait,
    ``model.dataloader_first``, as that iterator's first batch is)."""

    def __init__(self, collector: ModelCollector) -> None:
        self.collector = collector

    def begin(self, index: int | None) -> OpenSpan | None:
        extra = {A.MODEL_DATALOADER: index} if index is not None else None
        return self.collector._begin_auto("dataloader", "dataloader.iter", extra, in_marked=True)

    def end(self, opened: OpenSpan | None, new: bool) -> None:
        if opened is not None and new:
            opened.attrs[A.MODEL_DATALOADER_FIRST] = True
        self.collector._end_auto(opened)


def _skipped_by_dynamo(codes: set[types.CodeType]) -> None:
    """Mark the backward stages' wrappers (their ``codes``) as frames ``torch._dynamo`` skips (a private function
    of PyTorch's: where it is missing, the compiler meets one more graph break, in a wrapper, and compiles the
    same graphs)."""
    try:
        from torch._dynamo.eval_frame import skip_code  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return
    for code in codes:
        skip_code(code)


def _put_back(owner: Any, attr: str, original: Any, patched: Any) -> None:
    """``owner.attr`` back to ``original``, where the profiler's ``patched`` still stands."""
    if getattr(owner, attr, None) is patched:
        setattr(owner, attr, original)


def _restore(module: Any, package: Any, original: Any, patched: Any) -> None:
    """Put ``torch.multiprocessing``'s ``start_processes`` back where the profiler's stands."""
    _put_back(module, "start_processes", original, patched)
    if package is not None:
        _put_back(package, "start_processes", original, patched)


class _Started(NamedTuple):
    """A call of ``torch.multiprocessing.start_processes``: the function its processes run, how many, how they
    were started, and where each is profiled (``profile.RankProfile``; None: not profiled)."""

    fn: str
    nprocs: int
    method: str
    ranks: Any

    def config(self) -> dict[str, Any]:
        """Its entry in ``runs.config.processes`` (``trace.attrs.CONFIG_PROCESSES``)."""
        stores = None if self.ranks is None else [str(p) for p in self.ranks.stores()]
        return {"function": self.fn, "nprocs": self.nprocs, "start_method": self.method, "stores": stores}


def _what(started: list[_Started]) -> str:
    return "; ".join(f"{counted(s.nprocs, 'process', 'processes')} running {s.fn} ({s.method})" for s in started)


def _lost_text(started: list[_Started]) -> str:
    """The health row ``processes_not_profiled``: what the program started and how to profile it."""
    forked = (
        " (a forked process inherits this one's profile as it stands)"
        if any(s.method == "fork" for s in started)
        else ""
    )
    return (
        f"the program started processes with torch.multiprocessing (spawn, start_processes): {_what(started)}. "
        f"What they ran is not profiled, only this process{forked}. Profile each from the function it runs (with "
        "xstack.profile(path=f'prof-{rank}.duckdb'): around its loop), start them with start_method='spawn' under "
        "xstack run (without --iters), or start one process per rank with torchrun: torchrun --nproc-per-node N -m "
        "xstack run -o prof-{rank}.duckdb -- train.py"
    )


def _profiled_text(started: list[_Started]) -> str:
    """The health row ``processes_profiled``: where the processes the program started are profiled."""
    first = started[0]
    stores = ", ".join(str(first.ranks.store(i)) for i in range(min(first.nprocs, 2)))
    more = ", ..." if first.nprocs > 2 else ""
    return (
        f"the program started processes with torch.multiprocessing: {_what(started)}; each is profiled into a "
        f"store of its own, at the levels {','.join(first.ranks.levels)}: {stores}{more} (xstack summary STORE; "
        "this run's io and system levels cover them too)"
    )
