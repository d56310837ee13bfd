"""Import files into a store as one all-or-nothing step."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from xstack.importers.kineto import ImportedRun, import_kineto
from xstack.trace.store import Store, check_new, scratch_path


def import_file(store: Store, path: str | Path) -> ImportedRun:
    """Import one file as a run of ``store``, by its kind: an Nsight Compute CSV (``.csv``), a Darshan log
    (``.darshan``) or a Kineto trace."""
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        from xstack.importers.ncu import import_ncu

        return import_ncu(store, path)
    if suffix == ".darshan":
        from xstack.importers.darshan import import_darshan

        return import_darshan(store, path)
    return import_kineto(store, path)


def import_files(
    traces: Sequence[str | Path], out: str | Path, *, force: bool = False, append: bool = False
) -> list[ImportedRun]:
    """Import each trace as a run of the store ``out``; if any file fails, the store is left as it was.

    A new store is only renamed into place when every file imported. With ``append``, the files are imported
    into a scratch store beside ``out`` first and its runs then copied into ``out`` in one transaction.
    """
    if not append:
        check_new(out, overwrite=force, can_append=True)
        with Store.create(out, overwrite=force) as store:
            return [import_file(store, t) for t in traces]
    target = Store.open(out, read_only=False)  # fails early, and clearly, on a missing or foreign store
    try:
        scratch = scratch_path(out)
        with Store.create(scratch, overwrite=True) as store:
            runs = [import_file(store, t) for t in traces]
        try:
            new_ids = target.append_runs_from(scratch)
        finally:
            scratch.unlink(missing_ok=True)
    finally:
        target.close()
    for run, run_id in zip(runs, new_ids, strict=True):
        run.run_id = run_id
    return runs
