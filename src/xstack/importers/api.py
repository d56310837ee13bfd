"""Import files into a store as one all-or-nothing step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from xstack.importers.kineto import ImportedRun, import_kineto
from xstack.trace.store import Store


def import_files(
    traces: Sequence[str | Path], out: str | Path, *, force: bool = False, append: bool = False
) -> list[ImportedRun]:
    """Import each trace as a run of the store ``out``; if any file fails, the store is left as it was.

    A new store is only renamed into place when every file imported; with ``append`` the runs are added to
    an existing store in one transaction.
    """
    if append:
        with Store.open(out, read_only=False) as store, store.transaction():
            return [import_kineto(store, t) for t in traces]
    with Store.create(out, overwrite=force) as store:
        return [import_kineto(store, t) for t in traces]
