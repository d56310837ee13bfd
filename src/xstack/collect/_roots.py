"""Top-level module calls, found without slowing the module calls nested in them.

A global module hook puts every ``nn.Module`` call on PyTorch's slow path (about 2 us a call, half the cost
of a tiny layer). The model level needs only the outermost calls, so it watches them like this:

- a *sentinel* global pre-hook is installed only while no watched call is running. Any module call it sees is
  therefore a top-level call. It gives that module (a *root*) hooks of its own, and removes itself, so the
  calls nested in the root run on the fast path;
- a root's own pre-hook opens its span; its post-hook (``always_call``, so it runs when ``forward`` raises)
  closes it and reinstalls the sentinel once no watched call is running on any thread.

PyTorch builds a call's list of pre-hooks before running them, so a root's own pre-hook does not run for
the call in which the sentinel found it: the sentinel begins that call itself. Post-hooks are listed after
``forward``, so the root's own post-hook ends it. A module that is a root and is also called inside another
root (``model.encoder`` called alone, then inside ``model``) opens no span when nested.

Under ``torch.compile`` the hooks do nothing while torch traces (``_module_hooks.compiling``). A model compiled
in place (``model.compile()``) runs its hooks inside its compiled call: its compiled call tells the watcher
itself (``_module_hooks.watch_in_place``), whether it was compiled before the profiler began watching or after.

Limit: while a watched call runs on one thread, the sentinel is away, so a first call of a new root made at
that moment on another thread is not seen (later calls of known roots are).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from xstack.collect import _module_hooks


class RootWatcher:
    """Calls ``begin(module)`` at the start of every top-level module call on every thread, and ``end(opened)``
    at its end with what that ``begin`` returned."""

    def __init__(self, begin: Callable[[Any], Any], end: Callable[[Any], None]) -> None:
        self._begin = begin
        self._end = end
        # module -> its hook handles; weak, as ids of collected modules are reused by new ones
        self._roots: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
        self._sentinel: Any = None
        self._sentinel_id = -1
        self._sentinel_fn: Callable[[Any, tuple[Any, ...]], None] = self._sentinel_hook
        self._running = 0  # watched calls in progress, all threads
        self._lock = threading.RLock()
        self._local = threading.local()
        self._watching = False
        self._hooks: dict[int, Any] = {}
        self._unwatch: Callable[[], None] = lambda: None

    def start(self) -> None:
        from torch.nn.modules import module as torch_module

        if not self._watching:
            _module_hooks.hooking(True)
            # a model compiled in place runs its hooks inside its compiled call: its call tells this directly
            self._unwatch = _module_hooks.watch_in_place(self._pre, lambda m, a, kw, out: self._post(m, a, out))
        self._watching = True
        # One registration for the whole profile; taking the sentinel away and putting it back is then a
        # dict operation on PyTorch's table of global pre-hooks, cheaper than a new handle each time.
        self._sentinel = torch_module.register_module_forward_pre_hook(self._sentinel_fn)
        self._sentinel_id = self._sentinel.id
        self._hooks = torch_module._global_forward_pre_hooks

    def stop(self) -> None:
        if self._watching:
            self._unwatch()
            _module_hooks.hooking(False)
        with self._lock:
            self._watching = False
            if self._sentinel is not None:
                self._sentinel.remove()
                self._sentinel = None
            for handles in list(self._roots.values()):
                for handle in handles:
                    handle.remove()
            self._roots.clear()

    # The three hooks below run on every top-level call: locals instead of repeated attribute lookups.
    def _sentinel_hook(self, module: Any, args: tuple[Any, ...]) -> None:
        if _module_hooks.compiling() or getattr(self._local, "depth", 0):
            return  # another thread put the sentinel back while this one is inside a watched call
        if _module_hooks.in_backward():
            return  # a module a backward recomputes (activation checkpointing) is no top-level call of a model
        with self._lock:
            if self._sentinel is not None:
                self._hooks.pop(self._sentinel_id, None)
            if module not in self._roots:
                self._roots[module] = [
                    module.register_forward_pre_hook(self._pre),
                    module.register_forward_hook(self._post, always_call=True),
                ]
                self._pre(module, args)  # its own pre-hook was not listed for this call

    def _pre(self, module: Any, args: tuple[Any, ...]) -> None:
        if _module_hooks.compiling():
            return
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if depth == 0:
            with self._lock:
                self._running += 1
            local.opened = self._begin(module)

    def _post(self, module: Any, args: tuple[Any, ...], output: Any) -> None:
        if _module_hooks.compiling():
            return
        local = self._local
        depth = getattr(local, "depth", 0) - 1
        if depth < 0:
            return  # the watcher started inside this call
        local.depth = depth
        if depth == 0:
            opened, local.opened = local.opened, None
            self._end(opened)
            with self._lock:
                self._running -= 1
                if self._running == 0 and self._watching and self._sentinel is not None:
                    self._hooks[self._sentinel_id] = self._sentinel_fn
