"""The ``layer`` level: every ``nn.Module`` call, through PyTorch's global module hooks (no code change).

A span's name is the module's path in the model that was called (``encoder.layers.1.self_attn``). Paths come
from ``named_modules()`` of the outermost module of the call, computed once per model. A module that is not
part of that model (created on the fly, or another model called inside) gets its parent's path plus its type.
Repeated and shared modules are told apart by ``layer.call_index``, the number of earlier calls of the same
path in the same step.

A model compiled with ``torch.compile(model)`` is one layer span per call, with the model's own path and the
type ``Sequential (compiled)``: the modules inside run as one graph, with no call of their own to hook (the
hooks do nothing while torch traces the model, see ``_module_hooks``). Modules that run eagerly after a graph
break keep the paths they have in the model. A model compiled in place (``model.compile()``) runs its hooks
inside the compiled call too, so its compiled call tells the hooks' subscribers itself
(``_module_hooks.watch_in_place``): one span per call typed ``Sequential (compiled)``, whether it was compiled
before the profile began or while it runs; the op level shows its compiled regions.

With activation checkpointing (``torch.utils.checkpoint``) the backward calls the checkpointed modules again to
recompute their activations, outside any other module call: those calls keep the paths the modules have in the
model they were last seen in (``blocks.0``, not ``Block``) and say ``layer.recomputed``. A call whose
``forward`` raises (a recomputation stopped early raises on purpose) ends its span all the same.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from xstack.collect import _module_hooks
from xstack.collect._after_import import OnImport
from xstack.collect._recorder import OpenSpan, Recorder
from xstack.collect._torch_build import torch_reason
from xstack.trace import attrs as A
from xstack.trace.store import Store


class LayerCollector:
    """Records each module call as a layer span with its path, type, shapes, parameters and memory."""

    level = "layer"

    def __init__(self) -> None:
        self._recorder: Recorder | None = None
        self._local = threading.local()
        # root module -> {id(module in it): (path, type, parameter count)}, computed once per root
        self._models: weakref.WeakKeyDictionary[Any, dict[int, _Info]] = weakref.WeakKeyDictionary()
        # module -> its path in the model it was last seen in; a module a backward recomputes -> its paths
        self._inside: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._recomputing: weakref.WeakKeyDictionary[Any, dict[int, _Info]] = weakref.WeakKeyDictionary()
        self._calls: dict[str, int] = {}
        self._step = 0
        self._torch: Any = None
        self._cuda: Any = None  # torch.cuda, once the program has initialised CUDA
        self._on_torch: OnImport | None = None

    def unavailable_reason(self) -> str | None:
        return torch_reason()  # found, not imported: see start()

    def start(self, recorder: Recorder) -> None:
        self._recorder = recorder
        _module_hooks.reset_roots()
        # module calls are hooked where the program imports PyTorch, as the model level's are: importing it here
        # would cost a program that does not seconds and thousands of file reads, recorded as the program's
        self._on_torch = OnImport("torch", self._start_torch)

    def _start_torch(self) -> None:
        import torch

        global _Tensor
        if self._recorder is None:
            return
        _Tensor = torch.Tensor
        self._torch = torch
        _module_hooks.subscribe(self, order=1)

    def stop(self) -> None:
        if self._on_torch is not None:
            self._on_torch.remove()
        _module_hooks.unsubscribe(self)
        self._recorder = None

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        # every span went through the recorder; what it could not see is the calls its hooks failed on
        health: list[tuple[str, int, str]] = []
        if self._on_torch is not None and self._on_torch.error is not None:
            why = f"hooking them when the program imported torch failed ({self._on_torch.error})"
            health.append(("layer_hooks_failed", 1, f"module calls are not recorded: {why}; the program ran on"))
        if failed := _module_hooks.failures(self):
            health.append(("layer_hook_failed", failed[0], f"module calls whose layer span could not be recorded "
                           f"(the first: {failed[1]}); the program ran on"))  # fmt: skip
        return health

    def before(self, module: Any, args: tuple[Any, ...]) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        local = self._local
        stack: list[_Frame] | None = getattr(local, "stack", None)
        if stack is None:
            stack = local.stack = []
        recomputed = _module_hooks.in_backward()
        if stack:
            info = local.model.get(id(module)) or _Info(f"{stack[-1][1]}.{type(module).__name__}", module)
        else:
            local.model = self._recomputed(module) if recomputed else self._model(module)
            info = local.model[id(module)]
            if self._cuda is None and self._torch.cuda.is_initialized():  # the program's own CUDA, never ours
                self._cuda = self._torch.cuda
        path = info.path
        if recorder.step != self._step:  # call indices count within a step
            self._calls.clear()
            self._step = recorder.step
        index = self._calls.get(path, 0)
        self._calls[path] = index + 1
        attrs = {
            A.LAYER_PATH: path,
            A.LAYER_TYPE: info.type_name,
            A.LAYER_CALL_INDEX: index,
            A.LAYER_PARAMS: info.params,
            A.LAYER_INPUT_SHAPES: _shapes(args),
        }
        if recomputed:
            attrs[A.LAYER_RECOMPUTED] = True
        memory = self._cuda.memory_allocated() if self._cuda is not None else 0
        stack.append((module, path, recorder.begin("layer", path, attrs), memory))

    def after(self, module: Any, output: Any, kwargs: dict[str, Any]) -> None:
        stack: list[_Frame] | None = getattr(self._local, "stack", None)
        if not stack or self._recorder is None:
            return
        if stack[-1][0] is not module:
            # the end of a call nested in this one was not seen: end it here rather than leave it open under
            # every later call
            if not any(frame[0] is module for frame in stack):
                return
            while stack[-1][0] is not module:
                self._recorder.end(stack.pop()[2])
        _, _, opened, memory = stack.pop()
        extra: dict[str, Any] = {A.LAYER_OUTPUT_SHAPES: _shapes(output)}
        if kwargs:  # tensors passed by keyword (model(input_ids=x)) follow the positional ones, in their order
            extra[A.LAYER_INPUT_SHAPES] = opened.attrs[A.LAYER_INPUT_SHAPES] + _shapes(kwargs)
        if self._cuda is not None:
            extra[A.LAYER_MEMORY_ALLOCATED_BYTES] = self._cuda.memory_allocated() - memory
        self._recorder.end(opened, extra)

    def _recomputed(self, root: Any) -> dict[int, _Info]:
        """Paths for a module that a backward calls (activation checkpointing recomputes ``model.blocks.0``
        alone): its modules' paths in the model it was last seen in, else its own (``_model``)."""
        model = self._recomputing.get(root)
        if model is None:
            outer = self._inside.get(root)
            if outer is None:
                return self._model(root)
            model = {id(m): _Info(f"{outer}.{name}" if name else outer, m) for name, m in root.named_modules()}
            self._recomputing[root] = model
        return model

    def _model(self, root: Any) -> dict[int, _Info]:
        """Path, type and parameter count of every module in the model ``root`` (computed once)."""
        model = self._models.get(root)
        if model is None:
            original = _module_hooks.compiled_original(root)
            if (scripted := _module_hooks.scripted_name(root)) is not None:  # its modules run unhooked, inside it
                model = {id(m): _Info(name or scripted, m) for name, m in root.named_modules()}
                model[id(root)].type_name = f"{scripted} (TorchScript)"
            elif original is None:
                model = {id(m): _Info(name or type(root).__name__, m) for name, m in root.named_modules()}
                if getattr(root, "_compiled_call_impl", None) is not None:  # compiled in place: one call, seen whole
                    model[id(root)].type_name = f"{type(root).__name__} (compiled)"
            else:  # torch.compile's wrapper: paths as in the model it compiled
                name_of = type(original).__name__
                model = {id(m): _Info(("" if name == _COMPILED else name.removeprefix(f"{_COMPILED}.")) or name_of, m)
                         for name, m in root.named_modules()}  # fmt: skip
                model[id(root)].type_name = f"{name_of} (compiled)"
            # encoder and decoder, a GAN's generator and discriminator: not both Sequential, their layers not both 0
            if (held := _module_hooks.root_alias(root)) is not None:
                for info in model.values():
                    info.path = held if info is model[id(root)] else f"{held}.{info.path}"
            self._models[root] = model
            for m in root.modules():  # where a backward that recomputes one of them finds its path
                if m is not root:
                    self._inside[m] = model[id(m)].path
        return model


class _Info:
    """What a layer span says of its module that does not change between calls."""

    __slots__ = ("params", "path", "type_name")

    def __init__(self, path: str, module: Any) -> None:
        self.path = path
        self.type_name = type(module).__name__
        self.params = sum(p.numel() for p in module.parameters())


_COMPILED = "_orig_mod"
"""The compiled model's name inside ``torch.compile``'s wrapper, the first part of its modules' paths there."""

_Frame = tuple[Any, str, OpenSpan, int]
"""A module call in progress: the module, its path, its open span and the device memory at its start."""


_Tensor: Any = ()
"""``torch.Tensor`` once a collector has started (PyTorch is imported lazily; ``isinstance(x, ())`` is False)."""


def _shapes(value: Any) -> list[list[int]]:
    """Shapes of the tensors in ``value`` (a tensor, or a tuple/list/dict of them, one level deep). A nested
    tensor (``torch.nested``, the transformer layers' fast path) has no shape: its batch size, then -1 for each
    of its other dimensions."""
    if isinstance(value, _Tensor):
        return [_shape(value)]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return [_shape(v) for v in items if isinstance(v, _Tensor)]


def _shape(tensor: Any) -> list[int]:
    if tensor.is_nested:
        return [tensor.size(0)] + [-1] * (tensor.dim() - 1)
    return list(tensor.shape)
