"""The ``layer`` level: every ``nn.Module`` call, through PyTorch's global module hooks (no code change).

A span's name is the module's path in the model that was called (``encoder.layers.1.self_attn``). Paths come
from ``named_modules()`` of the outermost module of the call, computed once per model. A module that is not
part of that model (created on the fly, or another model called inside) gets its parent's path plus its type.
Repeated and shared modules are told apart by ``layer.call_index``, the number of earlier calls of the same
path in the same step.
"""

from __future__ import annotations

import threading
import weakref
from collections import Counter
from typing import Any

from xstack.collect import _module_hooks
from xstack.collect._recorder import OpenSpan, Recorder
from xstack.trace import attrs as A
from xstack.trace.store import Store


class LayerCollector:
    """Records each module call as a layer span with its path, type, shapes, parameters and memory."""

    level = "layer"

    def __init__(self) -> None:
        self._recorder: Recorder | None = None
        self._local = threading.local()
        self._paths: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()
        self._params: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._calls: Counter[str] = Counter()
        self._step = 0
        self._cuda: Any = None

    def unavailable_reason(self) -> str | None:
        try:
            import torch.nn  # noqa: F401
        except ImportError:
            return "PyTorch is not installed (pip install 'torch==2.13.0')"
        return None

    def start(self, recorder: Recorder) -> None:
        import torch

        self._recorder = recorder
        self._cuda = torch.cuda if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        _module_hooks.subscribe(self, order=1)

    def stop(self) -> None:
        _module_hooks.unsubscribe(self)
        self._recorder = None

    def finish(self, store: Store, run_id: int) -> list[tuple[str, int, str]]:
        return []  # every span went through the recorder

    def before(self, module: Any, args: tuple[Any, ...]) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        stack: list[tuple[Any, str, OpenSpan, int]] = self._stack()
        path = self._path(module, stack)
        if recorder.step != self._step:  # call indices count within a step
            self._calls.clear()
            self._step = recorder.step
        index = self._calls[path]
        self._calls[path] = index + 1
        attrs = {
            A.LAYER_PATH: path,
            A.LAYER_TYPE: type(module).__name__,
            A.LAYER_CALL_INDEX: index,
            A.LAYER_PARAMS: self._param_count(module),
            A.LAYER_INPUT_SHAPES: _shapes(args),
        }
        memory = self._cuda.memory_allocated() if self._cuda is not None else 0
        stack.append((module, path, recorder.begin("layer", path, attrs), memory))

    def after(self, module: Any, output: Any) -> None:
        stack = self._stack()
        if not stack or stack[-1][0] is not module or self._recorder is None:
            return
        _, _, opened, memory = stack.pop()
        extra: dict[str, Any] = {A.LAYER_OUTPUT_SHAPES: _shapes(output)}
        if self._cuda is not None:
            extra[A.LAYER_MEMORY_ALLOCATED_BYTES] = self._cuda.memory_allocated() - memory
        self._recorder.end(opened, extra)

    def _stack(self) -> list[tuple[Any, str, OpenSpan, int]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _path(self, module: Any, stack: list[tuple[Any, str, OpenSpan, int]]) -> str:
        if not stack:
            names = self._paths.get(module)
            if names is None:
                names = self._paths[module] = {id(m): name for name, m in module.named_modules()}
            self._local.root = module
            return type(module).__name__
        root_names = self._paths.get(self._local.root, {})
        name = root_names.get(id(module))
        return name if name else f"{stack[-1][1]}.{type(module).__name__}"

    def _param_count(self, module: Any) -> int:
        count = self._params.get(module)
        if count is None:
            count = self._params[module] = sum(p.numel() for p in module.parameters())
        return count


def _shapes(value: Any) -> list[list[int]]:
    """Shapes of the tensors in ``value`` (a tensor, or a tuple/list/dict of them, one level deep)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return [list(value.shape)]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (tuple, list)) else ()
    return [list(v.shape) for v in items if hasattr(v, "shape") and hasattr(v, "dtype")]
