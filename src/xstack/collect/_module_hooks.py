"""One pair of PyTorch global module hooks shared by every collector that watches ``nn.Module`` calls.

Subscribers are called in order before a module runs and in reverse order after it, so spans they open
nest (a model span opened by the first subscriber encloses the layer span of the second). The hooks are
installed while at least one subscriber is present and removed with the last.
"""

from __future__ import annotations

from typing import Any, Protocol


class ModuleSubscriber(Protocol):
    def before(self, module: Any, args: tuple[Any, ...]) -> None: ...

    def after(self, module: Any, output: Any) -> None: ...


_subscribers: list[ModuleSubscriber] = []
_order: dict[int, int] = {}
_handles: list[Any] = []


def subscribe(subscriber: ModuleSubscriber, *, order: int) -> None:
    """Add ``subscriber``; lower ``order`` runs first before a call and last after it."""
    _order[id(subscriber)] = order
    _subscribers.append(subscriber)
    _subscribers.sort(key=lambda s: _order[id(s)])
    if not _handles:
        from torch.nn.modules import module as torch_module

        _handles.append(torch_module.register_module_forward_pre_hook(_before))
        _handles.append(torch_module.register_module_forward_hook(_after, always_call=True))


def unsubscribe(subscriber: ModuleSubscriber) -> None:
    """Remove ``subscriber``; the global hooks go with the last one."""
    if subscriber in _subscribers:
        _subscribers.remove(subscriber)
        _order.pop(id(subscriber), None)
    if not _subscribers:
        while _handles:
            _handles.pop().remove()


def _before(module: Any, args: tuple[Any, ...]) -> None:
    for s in _subscribers:
        s.before(module, args)


def _after(module: Any, args: tuple[Any, ...], output: Any) -> None:
    for s in reversed(_subscribers):
        s.after(module, output)
