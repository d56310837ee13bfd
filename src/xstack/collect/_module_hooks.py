"""One pair of PyTorch global module hooks shared by every collector that watches ``nn.Module`` calls.

Subscribers are called in order before a module runs and in reverse order after it, so spans they open
nest (a model span opened by the first subscriber encloses the layer span of the second). The hooks are
installed while at least one subscriber is present and removed with the last.

Under ``torch.compile`` (and ``torch.export``) the hooks do nothing while the model is traced (``compiling``).
The compiled module's call is seen as one call (the modules inside it run as one graph); the op level shows
what it runs.
"""

from __future__ import annotations

import itertools
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol, cast


class ModuleSubscriber(Protocol):
    def before(self, module: Any, args: tuple[Any, ...]) -> None: ...

    def after(self, module: Any, output: Any, kwargs: dict[str, Any]) -> None: ...


_subscribers: list[ModuleSubscriber] = []
_order: dict[int, int] = {}
_handles: list[Any] = []
_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"
"""torch's warning, on calling a ``torch.compile`` wrapper, that global hooks (the profiler's) fire for the
wrapper too: the profiler's own doing, which it handles (the wrapper's call is the one it records), so not shown
to the program while such hooks are installed."""
_quiet = 0
"""Users of global hooks (this module's, the model level's root watcher) that asked for that warning's silence."""


def _not_compiling() -> bool:
    return False


compiling: Any = _not_compiling
"""Once a hook is installed, True only while torch traces a graph: ``torch.compile`` and ``torch.export``
(``torch.compiler.is_compiling``), or ``torch.jit.trace``. Every hook the profiler gives PyTorch returns at once
when it is, so the traced graph holds none of the profiler's code: no graph break, no guard on its state, the
same compiled program as without it. (``torch.jit.trace`` records what the hooks read of the tensors, and
checks that two traces agree: the first call of a model, which reads its parameters, failed that check.)"""


def _no_graph_task() -> int:
    return -1


_graph_task: Any = _no_graph_task


def in_backward() -> bool:
    """Whether this thread runs a backward pass now (autograd's engine): a module called there is a forward
    recomputed for the backward (activation checkpointing, ``torch.utils.checkpoint``), not the model's forward."""
    return bool(_graph_task() != -1)


def _tracing(is_compiling: Any, tracing_state: Any) -> Any:
    """``compiling`` from torch's two tests: dynamo's (which it reads as a constant while it traces) first."""

    def compiling_or_tracing() -> bool:
        return bool(is_compiling() or tracing_state() is not None)

    return compiling_or_tracing


def hooking(on: bool) -> None:
    """Say that a global module hook of the profiler is installed (``on``) or removed: keeps ``compiling`` set
    and torch's warning about global hooks silent while any is."""
    global compiling, _graph_task, _quiet
    _quiet += 1 if on else -1
    if on and _quiet == 1:
        import torch

        compiling = _tracing(torch.compiler.is_compiling, torch._C._get_tracing_state)
        _graph_task = getattr(torch._C, "_current_graph_task_id", _no_graph_task)
        warnings.filterwarnings("ignore", _COMPILE_WARNING, UserWarning)
        _patch_compile(torch.nn.Module)
        _adopt_compiled(torch.nn.Module)
    elif not on and _quiet == 0:
        filters = cast(list[Any], warnings.filters)  # a list, typed as a sequence
        filters[:] = [f for f in filters if not (f[1] and f[1].pattern == _COMPILE_WARNING)]
        _unpatch_compile()


_in_place: list[tuple[Callable[..., None], Callable[..., None]]] = []
"""What a call of a model compiled in place tells, as its hooks would: ``before(module, args)`` and
``after(module, args, kwargs, output)`` of each watcher (the global hooks' subscribers, the model level's root
watcher). The model's own hooks run inside its compiled call, where torch traced them doing nothing."""
_compile_patch: tuple[Any, Any] | None = None
SEEN = "_xstack_seen"
"""Marks the compiled call of a model compiled in place that tells the watchers of its calls (``_seen_call``)."""


def watch_in_place(before: Callable[..., None], after: Callable[..., None]) -> Callable[[], None]:
    """Add a watcher of calls of models compiled in place (see ``_in_place``); returns what removes it."""
    entry = (before, after)
    _in_place.append(entry)

    def remove() -> None:
        if entry in _in_place:
            _in_place.remove(entry)

    return remove


def _patch_compile(module_type: Any) -> None:
    """Make ``Module.compile()`` (which compiles the module's whole call, its hooks included, in place) give
    the module a call the watchers see (``_in_place``), while the profiler watches."""
    global _compile_patch
    original = module_type.compile

    def compile(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: A001 - Module.compile's own name
        original(self, *args, **kwargs)
        _see(self)

    module_type.compile = compile
    _compile_patch = (module_type, original)


def _adopt_compiled(module_type: Any) -> None:
    """Give the models compiled in place before the profiler began watching the call ``Module.compile`` gives
    them while it watches (``_seen_call``). None can exist before torch's compiler is imported; after, the live
    objects are searched once (a tenth of a second for a large program)."""
    if "torch._dynamo" not in sys.modules:
        return
    import gc

    for found in gc.get_objects():
        if issubclass(type(found), module_type):  # type(), not isinstance: some objects warn when asked
            _see(found)


def _see(module: Any) -> None:
    """Give ``module``, where it is compiled in place, a compiled call that tells the watchers (once)."""
    compiled = module.__dict__.get("_compiled_call_impl")
    if compiled is not None and not getattr(compiled, SEEN, False):
        module._compiled_call_impl = _seen_call(module, compiled)


def _unpatch_compile() -> None:
    global _compile_patch
    if _compile_patch is not None:
        module_type, original = _compile_patch
        module_type.compile = original
        _compile_patch = None


def _seen_call(module: Any, compiled: Callable[..., Any]) -> Callable[..., Any]:
    """``compiled`` (the module's compiled call), telling the watchers of ``_in_place`` of each call; the
    program gets what the compiled call returns or raises."""

    def call(*args: Any, **kwargs: Any) -> Any:
        watchers = list(_in_place)
        if not watchers or compiling():  # inside another compiled region: nothing of the profiler's traced
            return compiled(*args, **kwargs)
        for before, _ in watchers:
            before(module, args)
        try:
            output = compiled(*args, **kwargs)
        except BaseException:
            for _, after in reversed(watchers):
                after(module, args, kwargs, None)
            raise
        for _, after in reversed(watchers):
            after(module, args, kwargs, output)
        return output

    setattr(call, SEEN, True)
    return call


def subscribe(subscriber: ModuleSubscriber, *, order: int) -> None:
    """Add ``subscriber``; lower ``order`` runs first before a call and last after it."""
    _order[id(subscriber)] = order
    _subscribers.append(subscriber)
    _subscribers.sort(key=lambda s: _order[id(s)])
    if not _handles:
        from torch.nn.modules import module as torch_module

        hooking(True)
        _handles.append(torch_module.register_module_forward_pre_hook(_before))
        # the post-hook gets the call's keyword arguments (a pre-hook common to all modules cannot)
        _handles.append(torch_module.register_module_forward_hook(_after, always_call=True, with_kwargs=True))
        _handles.append(_InPlace(watch_in_place(_before, _after)))


class _InPlace:
    """A handle that removes an ``_in_place`` watcher, as a hook's handle removes its hook."""

    def __init__(self, remove: Callable[[], None]) -> None:
        self.remove = remove


def unsubscribe(subscriber: ModuleSubscriber) -> None:
    """Remove ``subscriber``; the global hooks go with the last one."""
    if subscriber in _subscribers:
        _subscribers.remove(subscriber)
        _order.pop(id(subscriber), None)
    if not _subscribers and _handles:
        while _handles:
            _handles.pop().remove()
        hooking(False)


def compiled_original(module: Any) -> Any:
    """The module ``torch.compile(model)`` compiled, where ``module`` is the wrapper it returned (an
    ``OptimizedModule``), else None."""
    return getattr(module, "_orig_mod", None) if type(module).__name__ == "OptimizedModule" else None


_SCRIPTED = frozenset({"RecursiveScriptModule", "TopLevelTracedModule", "TracedModule"})
"""Types of ``torch.jit.script`` and ``torch.jit.trace`` results: their calls run inside TorchScript."""


def scripted_name(module: Any) -> str | None:
    """For a TorchScript module (``torch.jit.script``/``trace``), the type name of the model it was made from;
    None for any other module."""
    if type(module).__name__ not in _SCRIPTED:
        return None
    return str(getattr(module, "original_name", None) or type(module).__name__)


_held_as: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
_OWN_FILES = (os.path.dirname(os.path.abspath(__file__)),)
"""Frames of the profiler's hooks, skipped when looking for a model's caller."""


def held_as(module: Any) -> str | None:
    """Where a model called from outside any other module sits in the module whose method called it, when that
    module is not itself being called (a LightningModule whose ``training_step`` calls ``self.encoder``):
    ``encoder``, ``backbone.encoder``; None where no such module holds it (a model called by the program, or by
    one of its own methods, such as ``generate``). Found once per model, from the caller's ``self``; without it
    the encoder and the decoder of such a module were both ``Sequential``, their layers both ``0``, ``1``..."""
    try:
        return _held_as[module]
    except KeyError:
        pass
    except TypeError:  # a module that cannot be weakly referenced: looked for at each call
        return _find_holder(module)
    found = _held_as[module] = _find_holder(module)
    return found


def _caller(module: Any) -> FrameType | None:
    """The frame of the code that called the model ``module``: past the hooks and torch's call machinery, and past
    the model's own methods (``generate`` calling ``self``); None where it is further up than ``_HOLDER_FRAMES``."""
    import torch

    skipped = _OWN_FILES + (os.path.dirname(os.path.abspath(torch.__file__)),)  # the hooks, torch's call machinery
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_HOLDER_FRAMES):
        if frame is None:
            return None
        if not frame.f_code.co_filename.startswith(skipped) and frame.f_locals.get("self") is not module:
            return frame
        frame = frame.f_back
    return None


def _find_holder(module: Any) -> str | None:
    import torch

    frame = _caller(module)
    owner = frame.f_locals.get("self") if frame is not None else None
    if not isinstance(owner, torch.nn.Module):
        return None  # the program, or a method of something else (a trainer)
    return next((name for name, inner in owner.named_modules() if inner is module and name), None)


_roots: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
"""Each model called from outside any other module since the profile began (``reset_roots``) that is alive, and
its alias (``root_alias``)."""
_seen_as: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
"""Each such model's name in the code that first called it (``_named_by_caller``)."""


def reset_roots() -> None:
    """Forget the models seen called: a profile tells apart the models it sees called, not those of an earlier
    one (the collectors of the model and layer levels call it as they start)."""
    _roots.clear()
    _seen_as.clear()


def root_alias(module: Any) -> str | None:
    """The name that tells a model called from outside any other module apart, where its own would not: its path
    in the module that holds it (``held_as``); else, where another live model already has its name (a GAN's
    generator and discriminator, both ``Sequential``), the attribute of the caller's ``self`` that holds it, else
    the caller's variable (``D``), unless another model was called by that name too (a loop's variable), else
    its name numbered (``Sequential#2``). None: the model's own name (the first model of that name keeps it).
    Found once per model; without it two models' layers met at one path (``0``, ``1``) and their calls were
    summed as one's."""
    try:
        return _roots[module]
    except KeyError:
        pass
    except TypeError:  # a module that cannot be weakly referenced: not told apart
        return held_as(module)
    alias = held_as(module)
    if alias is None:
        others = [m for m in list(_roots.keys()) if not _same_model(m, module)]
        taken = {_roots.get(m) or _own_name(m) for m in others}
        found = _seen_as[module] = _named_by_caller(module)
        if (base := _own_name(module)) in taken:
            # a name another model was called by too is a loop's variable (for model in models), not this model's
            if not found or found in taken or found in {_seen_as.get(m) for m in others}:
                found = next(f"{base}#{k}" for k in itertools.count(2) if f"{base}#{k}" not in taken)
            alias = found
    _roots[module] = alias
    return alias


def _same_model(a: Any, b: Any) -> bool:
    """Whether two modules are one model in two forms: the same object, a ``torch.compile`` wrapper and the model
    it compiled, or modules that hold the same parameters (``torch.jit.trace`` and ``script`` keep the model's):
    named alike, as the model is named alike compiled or not."""
    if a is b or compiled_original(a) is b or compiled_original(b) is a:
        return True
    first_a = next(iter(a.parameters()), None) if hasattr(a, "parameters") else None
    return first_a is not None and first_a is (next(iter(b.parameters()), None) if hasattr(b, "parameters") else None)


def _own_name(module: Any) -> str:
    """A model's name by its type: the compiled model's for a ``torch.compile`` wrapper, the scripted model's for
    a TorchScript one."""
    return scripted_name(module) or type(compiled_original(module) or module).__name__


def _named_by_caller(module: Any) -> str | None:
    """The name the calling code holds ``module`` by: an attribute of its ``self`` (a trainer's ``self.D``), else
    one of its variables (``D``); None where it holds it by neither (an item of a list, an expression)."""
    frame = _caller(module)
    if frame is None:
        return None
    owner = frame.f_locals.get("self")
    for name, value in (getattr(owner, "__dict__", None) or {}).items():
        if value is module and name.isidentifier():
            return str(name)
    return next((str(n) for n, v in frame.f_locals.items() if v is module and n != "self" and n.isidentifier()), None)


_HOLDER_FRAMES = 12
"""How far up the stack the caller's frame is looked for (the hooks and torch's call machinery come first)."""


def model_name(module: Any) -> str:
    """The name of a model called from outside any other module: where a module that was not called holds it,
    its path there (``held_as``); where an earlier model has its name, its alias (``root_alias``); else its
    type's, the compiled model's for a ``torch.compile`` wrapper and the
    scripted model's for a TorchScript one, so a model is named alike compiled or not."""
    return root_alias(module) or _own_name(module)


_failures: dict[int, tuple[int, str]] = {}
"""id(subscriber) -> (module calls its hooks failed on, the first error)."""


def failures(subscriber: ModuleSubscriber) -> tuple[int, str] | None:
    """How many module calls ``subscriber`` failed to record, and the first error; forgotten once asked."""
    return _failures.pop(id(subscriber), None)


def _failed(subscriber: ModuleSubscriber, error: Exception) -> None:
    count, first = _failures.get(id(subscriber), (0, f"{type(error).__name__}: {error}"))
    _failures[id(subscriber)] = (count + 1, first)


def _before(module: Any, args: tuple[Any, ...]) -> None:
    if compiling():
        return
    for s in _subscribers:
        try:
            s.before(module, args)
        except Exception as error:  # the program's call goes on: a profiler fault is its health, not the program's
            _failed(s, error)


def _after(module: Any, args: tuple[Any, ...], *rest: Any) -> None:
    # (kwargs, output) as registered; but where ``forward`` raised, PyTorch calls a global always-called hook with
    # (module, args, output) alone, kwargs or not (``Module._call_impl``): activation checkpointing stops every
    # recomputation that way, and a missed end would leave its span open under every later call
    kwargs, output = rest if len(rest) == 2 else ({}, rest[0] if rest else None)
    if compiling():
        return
    for s in reversed(_subscribers):
        try:
            s.after(module, output, kwargs)
        except Exception as error:
            _failed(s, error)
