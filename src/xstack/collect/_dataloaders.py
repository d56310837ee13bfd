"""The DataLoaders a profiled program iterates: each one's configuration (``runs.config.dataloaders``), and which
of them an iterator belongs to, so that each wait for a batch names its DataLoader (``model.dataloader``).

``DataLoader.__iter__`` is wrapped for the region: it is where a loader and its iterator meet (with
``persistent_workers`` one iterator serves every epoch). Recording must never break the program: a loader
whose attributes cannot be read is recorded with what could be, and the wrapper returns the iterator as it was.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from typing import Any, Protocol


class DataLoaders:
    """Watches ``torch.utils.data.DataLoader`` between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self._loaders: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._iterators: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._started: weakref.WeakSet[Any] = weakref.WeakSet()  # iterators that gave a batch (or tried)
        self._lock = threading.Lock()
        self._patched: tuple[Any, Any] | None = None

    def start(self, torch: Any, stage: Stage | None = None) -> None:
        """Watch DataLoaders from now on; with ``stage``, each ``iter()`` of one that starts workers
        (``_starts_workers``: forked or spawned, each importing and pickling the dataset) is a stage of its own,
        without which that time would be in no stage. ``stage.begin`` gets the loader's index and returns what
        ``stage.end`` takes, with whether the call made a new iterator."""
        cls: Any = torch.utils.data.DataLoader
        original = cls.__iter__
        watch = self

        def __iter__(loader: Any) -> Any:  # noqa: N807 - replaces DataLoader.__iter__
            index, opened, iterator = None, None, None
            with contextlib.suppress(Exception):  # an odd loader must not fail the program: it goes unrecorded
                index = watch._loader(loader)
            starts = _starts_workers(loader)
            if stage is not None and starts:
                opened = stage.begin(index)
            try:
                iterator = original(loader)
            finally:
                if stage is not None and starts:
                    stage.end(opened, watch._new(iterator))
            with contextlib.suppress(Exception):
                if index is not None:
                    watch._iterators[iterator] = index
            return iterator

        cls.__iter__ = __iter__
        self._patched = (cls, original)

    def stop(self) -> None:
        if self._patched is not None:
            cls, original = self._patched
            cls.__iter__ = original
            self._patched = None

    def index_of(self, iterator: Any) -> int | None:
        """The index of the DataLoader that made ``iterator`` (None: made before the region, or not watched)."""
        try:
            return self._iterators.get(iterator)
        except TypeError:  # not weakly referenceable
            return None

    def first_next(self, iterator: Any) -> bool:
        """Whether this is the first ``next()`` of ``iterator`` since ``iter()`` made it (with persistent workers,
        one iterator serves every epoch: only its first ever)."""
        try:
            if iterator in self._started:
                return False
            self._started.add(iterator)
        except TypeError:  # not weakly referenceable: not told
            return False
        return True

    def config(self) -> list[dict[str, Any]]:
        """``runs.config.dataloaders`` (``trace.attrs.CONFIG_DATALOADERS``), as it stands at the end of the run."""
        torch = sys.modules.get("torch")
        cuda = bool(torch is not None and torch.cuda.is_initialized())  # asks nothing of the driver
        return [entry | {"cuda": cuda} for entry in self.entries]

    def _loader(self, loader: Any) -> int:
        """The index of ``loader``, described on its first ``iter()``; each counts in its ``iterated``."""
        with self._lock:
            index = self._loaders.get(loader)
            if index is None:
                index = self._loaders[loader] = len(self.entries)
                self.entries.append(describe(loader, index))
            self.entries[index]["iterated"] += 1
            return index

    def _new(self, iterator: Any) -> bool:
        """Whether ``iterator`` has given no batch yet (an ``iter()`` that made it, not one that reused a
        persistent loader's); False where it cannot be told."""
        try:
            return iterator is not None and iterator not in self._started
        except TypeError:
            return False


def _starts_workers(loader: Any) -> bool:
    """Whether ``iter(loader)`` starts worker processes: it has some, and they do not persist or have not started
    yet (its iterator, kept with ``persistent_workers``, is made by its first ``iter()``)."""
    try:
        workers = loader.num_workers
        return (
            isinstance(workers, int)
            and workers > 0
            and (not loader.persistent_workers or getattr(loader, "_iterator", None) is None)
        )
    except Exception:  # an odd loader: no stage, the program goes on
        return False


class Stage(Protocol):
    """What ``DataLoaders.start`` opens around each ``iter()`` of a DataLoader."""

    def begin(self, index: int | None) -> Any: ...

    def end(self, opened: Any, new: bool) -> None: ...


def describe(loader: Any, index: int) -> dict[str, Any]:
    """One entry of ``runs.config.dataloaders`` for ``loader`` (``trace.attrs.CONFIG_DATALOADERS`` says what each
    key is)."""
    batch_size = getattr(loader, "batch_size", None)
    if batch_size is None:  # batches from a batch sampler of the user's
        batch_size = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    whole = False  # the sampler yields a batch's indices, which the dataset takes at once (batch_size=None)
    if batch_size is None and getattr(loader, "batch_sampler", None) is None:
        batch_size = getattr(getattr(loader, "sampler", None), "batch_size", None)
        whole = isinstance(batch_size, int)
    workers = getattr(loader, "num_workers", 0)
    prefetch = getattr(loader, "prefetch_factor", None)
    iterable = _iterable(getattr(loader, "dataset", None))
    return {
        "index": index,
        "dataset": type(getattr(loader, "dataset", None)).__qualname__,
        "iterable": iterable,
        "batched": callable(getattr(getattr(loader, "dataset", None), "__getitems__", None)),
        "sampler_batches": whole,
        "batch_size": batch_size if isinstance(batch_size, int) else None,
        "num_workers": workers if isinstance(workers, int) else 0,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "prefetch_factor": prefetch if isinstance(prefetch, int) and workers else None,
        "iterated": 0,
        "start_method": _start_method(loader) if isinstance(workers, int) and workers > 0 else None,
        "items": _items(getattr(loader, "dataset", None)),
        "batches": None if iterable else _batches(loader),
        "sampler": None if iterable else _sampler(loader),
    }


def _batches(loader: Any) -> int | None:
    """``len(loader)``, the batches an epoch of a map-style dataset's DataLoader takes (its batch sampler's, which
    a distributed job's ``DistributedSampler`` makes this rank's share); None where it has none. Not asked of an
    ``IterableDataset``'s, whose length is the dataset's own word."""
    try:
        n = len(loader)
    except Exception:  # a batch sampler without __len__
        return None
    return n if isinstance(n, int) else None


def _sampler(loader: Any) -> str | None:
    """The class of what picks a map-style DataLoader's items: the sampler inside its batch sampler where that is
    PyTorch's ``BatchSampler`` (``batch_sampler=BatchSampler(DistributedSampler(dataset), ...)`` leaves the
    DataLoader's own ``sampler`` a ``SequentialSampler`` it does not use), another batch sampler's own class (one a
    library put in, as Accelerate's ``BatchSamplerShard``), else its sampler's (``batch_size=None``; the one inside it
    where that is a ``BatchSampler``)."""
    from torch.utils.data import BatchSampler

    picks = getattr(loader, "batch_sampler", None)
    if picks is None:  # batch_size=None: the sampler's picks are the batches (a BatchSampler's, sampler_batches)
        picks = getattr(loader, "sampler", None)
    if type(picks) is BatchSampler:
        picks = getattr(picks, "sampler", None)
    return None if picks is None else type(picks).__qualname__


def _items(dataset: Any) -> int | None:
    """``len(dataset)``, where it has one (an ``IterableDataset`` may not; an odd ``__len__`` may raise)."""
    try:
        n = len(dataset)
    except Exception:
        return None
    return n if isinstance(n, int) else None


def _iterable(dataset: Any) -> bool:
    """Whether ``dataset`` is an ``IterableDataset``: its items come from ``__iter__``, not ``__getitem__``."""
    from torch.utils.data import IterableDataset  # a DataLoader was iterated: torch is imported

    return isinstance(dataset, IterableDataset)


def _start_method(loader: Any) -> str | None:
    """How ``loader``'s workers start: its own ``multiprocessing_context``, else the process's default method."""
    import multiprocessing

    with contextlib.suppress(Exception):
        context = getattr(loader, "multiprocessing_context", None)
        if context is not None:
            return str(context.get_start_method())
        # not get_context(), which would fix the default for the program; the first listed is the default
        return str(multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0])
    return None
